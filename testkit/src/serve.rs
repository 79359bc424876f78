//! Starting `edgevirt serve` and knowing when it is ready, without reading its output.
//!
//! The caller builds the command (any flags, settings file or environment; `--listen` with
//! port 0 lets the kernel pick a free port, so parallel tests never race for one). [`start`]
//! sends serve's output to files in the data dir, waits for the process to listen on a TCP
//! socket (read from `/proc/<pid>/net/tcp{,6}` and the socket inodes in `/proc/<pid>/fd`),
//! then polls `GET /healthz` on it until it answers 200. HTTPS when serve generated or was
//! given a certificate (`<data-dir>/tls/server.crt`), which the returned client trusts.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long serve may take to answer `/healthz` (debug builds, 2 shared cores).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// `edgevirt serve --data-dir DIR` of `exe`; add flags before [`start`].
pub fn command(exe: &Path, data_dir: &Path) -> Command {
    let mut c = Command::new(exe);
    c.arg("serve").arg("--data-dir").arg(data_dir);
    c
}

/// A started serve process. Killed (`kill -9`) when dropped unless [`Server::stop`]ped.
pub struct Server {
    pub child: Option<Child>,
    /// `http://` or `https://` with the address serve listens on (loopback when it listens
    /// on every address).
    pub url: String,
    /// A client that trusts serve's certificate when it serves HTTPS.
    pub http: reqwest::Client,
    pub data_dir: PathBuf,
}

/// Start `cmd` (an `edgevirt serve` whose data dir is `data_dir`) and wait until it answers
/// `/healthz`. Its stdout goes to `<data-dir>/serve.out`; its stderr to `<data-dir>/serve.log`
/// unless the command already sends it elsewhere. Panics, naming the log, if serve exits or
/// does not answer within [`START_TIMEOUT`].
pub fn start(mut cmd: Command, data_dir: &Path) -> Server {
    edgevirt::tls::install_crypto_provider();
    std::fs::create_dir_all(data_dir).unwrap();
    let append = |name: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data_dir.join(name))
            .unwrap()
    };
    cmd.stdin(Stdio::null()).stdout(append("serve.out"));
    // Everything that could panic before the process is owned by a `Server` (whose drop
    // kills it) comes first.
    let (http, data_dir) = (reqwest::Client::new(), data_dir.to_path_buf());
    let child = cmd.stderr(append("serve.log")).spawn().unwrap_or_else(|e| {
        panic!("starting {:?}: {e}", cmd.get_program());
    });
    let mut server = Server {
        child: Some(child),
        url: String::new(),
        http,
        data_dir,
    };
    let (url, http) = server.wait_ready();
    server.url = url;
    server.http = http;
    server
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("serve runs").id()
    }

    /// A line `key=value` of `<data-dir>/initial-admin` (the first admin's credentials).
    pub fn initial(&self, key: &str) -> String {
        initial_admin(&self.data_dir, key)
    }

    /// Stop serve as systemd does (SIGTERM) and wait up to 30 s, then kill it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) with a pid this process started and has not reaped yet.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `kill -9` serve.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn wait_ready(&mut self) -> (String, reqwest::Client) {
        let start = Instant::now();
        let log = self.data_dir.join("serve.log");
        let fail = |why: String| -> ! {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "edgevirt serve {why}; {} ends with:\n{}",
                log.display(),
                tail.join("\n")
            )
        };
        let child = self.child.as_mut().unwrap();
        let pid = child.id();
        // The listening socket first (it exists from bind(2) on), then a health answer.
        let addr = loop {
            if let Ok(Some(status)) = child.try_wait() {
                fail(format!("exited ({status}) before listening"));
            }
            if let Some(a) = listening_addr(pid) {
                break a;
            }
            if start.elapsed() > START_TIMEOUT {
                fail(format!("did not listen within {START_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let host = match addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let cert = self.data_dir.join("tls/server.crt");
        let scheme = if cert.exists() { "https" } else { "http" };
        let url = format!("{scheme}://{}", SocketAddr::new(host, addr.port()));
        let mut http = reqwest::Client::builder();
        if scheme == "https" {
            let pem = std::fs::read(&cert).unwrap();
            http = http.add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap());
        }
        let http = http.build().unwrap();
        // Polled on a thread of its own: callers may be inside a runtime or not.
        let (probe, health) = (http.clone(), format!("{url}/healthz"));
        let answered = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                while start.elapsed() < START_TIMEOUT {
                    let r = probe
                        .get(&health)
                        .timeout(Duration::from_secs(5))
                        .send()
                        .await;
                    if r.is_ok_and(|r| r.status().is_success()) {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                false
            })
        })
        .join()
        .unwrap();
        if !answered {
            fail(format!(
                "did not answer {url}/healthz within {START_TIMEOUT:?}"
            ));
        }
        (url, http)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A `key=value` line of `<data-dir>/initial-admin`.
pub fn initial_admin(data_dir: &Path, key: &str) -> String {
    let path = data_dir.join("initial-admin");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('=').map(str::to_string))
        .unwrap_or_else(|| panic!("no {key}= in {}", path.display()))
}

/// The address process `pid` listens on over TCP (the first, if several), from procfs.
pub fn listening_addr(pid: u32) -> Option<SocketAddr> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).ok()?;
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                return parse_proc_addr(f[1]);
            }
        }
    }
    None
}

/// `0100007F:1F90` (IPv4) or 32 hex digits then `:port` (IPv6): each 32-bit word in host
/// byte order, the port in network order.
fn parse_proc_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| {
        u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16)
            .ok()
            .map(u32::to_ne_bytes)
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_addresses() {
        assert_eq!(
            parse_proc_addr("0100007F:1F90"),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            parse_proc_addr("00000000000000000000000001000000:0050"),
            Some("[::1]:80".parse().unwrap())
        );
    }

    #[test]
    fn finds_a_listening_socket_of_this_process() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(
            listening_addr(std::process::id()),
            Some(l.local_addr().unwrap())
        );
    }
}
