//! The end-to-end harness: runs the real `edgevirt` binary against the real libvirtd
//! (`qemu:///system`) with the test guest built by `tests/guest/build-guest.sh`. Every
//! appliance gets its own data dir (so its own installation id) and cleans up the domains
//! and launchers it created when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::serve::{self, Server};

/// The libvirt NAT network the appliances' `pod` networks use. Created by the first serve
/// that needs it; scripts/test.sh removes it after a run that created it.
pub const NAT_NETWORK: &str = "evtest";
pub const NAT_PREFIX: &str = "10.213.50";

pub const VMS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";

/// The test guest's folder: `EDGEVIRT_TEST_GUEST` or `target/test-guest`.
pub fn guest_dir() -> PathBuf {
    let d = std::env::var_os("EDGEVIRT_TEST_GUEST")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("target/test-guest"));
    assert!(
        d.join("vmlinuz").exists() && d.join("initrd.img").exists(),
        "the test guest is missing in {}: run tests/guest/build-guest.sh {} (scripts/test.sh does)",
        d.display(),
        d.display()
    );
    d
}

pub fn virsh(args: &[&str]) -> (bool, String) {
    let out = Command::new("virsh")
        .arg("-c")
        .arg("qemu:///system")
        .args(args)
        .output()
        .expect("running virsh");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

pub fn domstate(dom: &str) -> Option<String> {
    let (ok, out) = virsh(&["domstate", dom]);
    ok.then_some(out)
}

/// The libvirt domain id (it changes whenever a domain is started again).
pub fn domid(dom: &str) -> Option<String> {
    let (ok, out) = virsh(&["domid", dom]);
    ok.then_some(out)
}

/// Run a program in a guest through its guest agent, with `virsh` (this host's, or a test
/// host's in its namespace); its stdout, once it exited.
pub fn guest_exec_with(
    virsh: impl Fn(&[&str]) -> (bool, String),
    dom: &str,
    path: &str,
    args: &[&str],
) -> Option<String> {
    let cmd = json!({"execute": "guest-exec", "arguments": {"path": path, "arg": args, "capture-output": true}}).to_string();
    let (ok, out) = virsh(&["qemu-agent-command", dom, &cmd]);
    if !ok {
        return None;
    }
    let pid = serde_json::from_str::<Value>(&out).ok()?["return"]["pid"].as_i64()?;
    for _ in 0..100 {
        let status = format!(r#"{{"execute":"guest-exec-status","arguments":{{"pid":{pid}}}}}"#);
        let (ok, out) = virsh(&["qemu-agent-command", dom, &status]);
        if !ok {
            return None;
        }
        let v: Value = serde_json::from_str(&out).ok()?;
        if v["return"]["exited"] == true {
            use base64::Engine;
            let data = base64::engine::general_purpose::STANDARD
                .decode(v["return"]["out-data"].as_str().unwrap_or(""))
                .ok()?;
            return String::from_utf8(data).ok();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// [`guest_exec_with`] this host's libvirtd.
pub fn guest_exec(dom: &str, path: &str, args: &[&str]) -> Option<String> {
    guest_exec_with(virsh, dom, path, args)
}

/// Seconds since the guest booted, read through the guest agent (`cat /proc/uptime`).
pub fn guest_uptime(dom: &str) -> Option<f64> {
    guest_exec(dom, "/bin/cat", &["/proc/uptime"])?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Poll `f` until it returns `Some`, or panic with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// On a serial console's websocket: type `echo {tag}-$((6*7))` until `{tag}-42` comes back;
/// everything the console said. The guest may still be starting its shell and characters
/// typed before the prompt are lost, so the command is typed again every 3 s.
pub async fn serial_echo<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>, tag: &str) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let (want, command) = (format!("{tag}-42"), format!("\necho {tag}-$((6*7))\n"));
    let (mut seen, start) = (String::new(), Instant::now());
    let mut typed: Option<Instant> = None;
    while !seen.contains(&want) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "serial said: {seen:?}"
        );
        if typed.is_none_or(|t| t.elapsed() > Duration::from_secs(3)) {
            ws.send(Message::Binary(command.clone().into_bytes().into()))
                .await
                .unwrap();
            typed = Some(Instant::now());
        }
        if let Ok(Some(Ok(Message::Binary(b)))) =
            tokio::time::timeout(Duration::from_millis(500), ws.next()).await
        {
            seen.push_str(&String::from_utf8_lossy(&b));
        }
    }
    seen
}

pub struct Appliance {
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    /// The serve process, while it runs.
    pub server: Option<Server>,
    pub url: String,
    pub token: String,
    pub http: reqwest::Client,
    pub install_id: String,
    extra: Vec<String>,
    /// Extra environment for the serve process.
    env: Vec<(String, String)>,
    /// The `edgevirt` executable `serve` runs from (and the agent starts launchers from).
    pub exe: PathBuf,
}

impl Appliance {
    /// Start `edgevirt serve` (all roles unless `extra` says otherwise) in a fresh data dir.
    pub async fn start(extra: &[&str]) -> Appliance {
        Self::start_full(crate::exe().to_path_buf(), extra, &[]).await
    }

    /// Like [`Appliance::start`], with extra environment variables for the serve process.
    pub async fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Appliance {
        Self::start_full(crate::exe().to_path_buf(), extra, env).await
    }

    /// Like [`Appliance::start`], running another `edgevirt` executable.
    pub async fn start_with_exe(exe: PathBuf, extra: &[&str]) -> Appliance {
        Self::start_full(exe, extra, &[]).await
    }

    async fn start_full(exe: PathBuf, extra: &[&str], env: &[(&str, &str)]) -> Appliance {
        edgevirt::tls::install_crypto_provider();
        let tmp = tempfile::Builder::new()
            .prefix("evtest-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let dir = tmp.path().to_path_buf();
        let mut a = Appliance {
            dir,
            _tmp: Some(tmp),
            server: None,
            url: String::new(),
            token: String::new(),
            http: reqwest::Client::new(),
            install_id: String::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            exe,
        };
        a.spawn().await;
        a
    }

    /// (Re)start the serve process on the same data dir.
    pub async fn spawn(&mut self) {
        let mut cmd = serve::command(&self.exe, &self.dir);
        if !self.extra.iter().any(|a| a == "--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        if !self.extra.iter().any(|a| a == "--accel") {
            cmd.args(["--accel", "qemu"]);
        }
        cmd.args(["--nat-network", NAT_NETWORK, "--nat-prefix", NAT_PREFIX])
            .args(["--node-name", "testnode"])
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env(
                "EDGEVIRT_LOG",
                "info,edgevirt=debug,tower_http=warn,sqlx=warn",
            );
        let server = serve::start(cmd, &self.dir);
        self.url = server.url.clone();
        self.http = server.http.clone();
        self.token = server.initial("token");
        self.server = Some(server);
        let (_, info) = self.get("/apis/edgevirt.io/v1/info").await;
        self.install_id = info["installId"].as_str().unwrap().to_string();
    }

    /// A user with `role` and an API token for it, written straight into the appliance's
    /// database (the store is safe to share between processes).
    pub async fn add_token(&self, user: &str, role: &str) -> String {
        let store = edgevirt::store::Store::open(&self.dir.join("edgevirt.db"))
            .await
            .unwrap();
        store
            .create_user(
                user,
                &edgevirt::http::auth::hash_password("password1"),
                role,
            )
            .await
            .unwrap();
        let token = edgevirt::http::auth::random_secret(24);
        store
            .add_token(
                &edgevirt::http::auth::token_hash(&token),
                user,
                role,
                "test",
            )
            .await
            .unwrap();
        token
    }

    pub fn pid(&self) -> u32 {
        self.server.as_ref().expect("serve runs").pid()
    }

    /// Stop the serve process as systemd does (SIGTERM) and wait for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.stop();
        }
    }

    /// `kill -9` the serve process.
    pub fn kill9(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.kill9();
        }
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{}", self.url, path))
            .bearer_auth(&self.token);
        if let Some((ct, b)) = body {
            req = req.header("content-type", ct).body(b);
        }
        let resp = req.send().await.expect("request");
        let code = resp.status().as_u16();
        let bytes = resp.bytes().await.unwrap();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    pub async fn post_yaml(&self, path: &str, yaml: &str) -> (u16, Value) {
        self.call(
            reqwest::Method::POST,
            path,
            Some(("application/yaml", yaml.as_bytes().to_vec())),
        )
        .await
    }

    pub async fn put_json(&self, path: &str, v: &Value) -> (u16, Value) {
        self.call(
            reqwest::Method::PUT,
            path,
            Some(("application/json", serde_json::to_vec(v).unwrap())),
        )
        .await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::DELETE, path, None).await
    }

    pub async fn import(&self, name: &str, file: &Path) {
        let data = std::fs::read(file).unwrap();
        let (code, v) = self
            .call(
                reqwest::Method::PUT,
                &format!("/apis/edgevirt.io/v1/images/{name}/upload"),
                Some(("application/octet-stream", data)),
            )
            .await;
        assert_eq!(code, 201, "importing {name}: {v}");
    }

    /// Import the test guest's kernel and initrd as `test-kernel` and `test-initrd`.
    pub async fn import_guest(&self) {
        let g = guest_dir();
        self.import("test-kernel", &g.join("vmlinuz")).await;
        self.import("test-initrd", &g.join("initrd.img")).await;
    }

    pub async fn vm(&self, name: &str) -> Option<Value> {
        let (c, v) = self
            .get(&format!(
                "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/{name}"
            ))
            .await;
        (c == 200).then_some(v)
    }

    pub async fn vmi(&self, name: &str) -> Option<Value> {
        let (c, v) = self
            .get(&format!(
                "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/{name}"
            ))
            .await;
        (c == 200).then_some(v)
    }

    pub async fn action(&self, name: &str, action: &str) -> u16 {
        let path = format!(
            "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/{name}/{action}"
        );
        self.put_json(&path, &json!({})).await.0
    }

    /// Wait until the VM's instance is Running (optionally with a different uid).
    pub async fn wait_running(
        &self,
        name: &str,
        not_uid: Option<&str>,
        timeout: Duration,
    ) -> Value {
        wait_for(&format!("VMI {name} Running"), timeout, || async {
            self.vmi(name).await.filter(|v| {
                v["status"]["phase"] == "Running"
                    && v["metadata"].get("deletionTimestamp").is_none()
                    && not_uid.is_none_or(|u| v["metadata"]["uid"] != u)
            })
        })
        .await
    }

    /// Names of libvirt domains this installation created, with their VMI uids.
    pub fn our_domains(&self) -> Vec<(String, String)> {
        let (_, names) = virsh(&["list", "--all", "--name"]);
        let mut out = Vec::new();
        for n in names.lines().map(str::trim).filter(|n| !n.is_empty()) {
            let (ok, xml) = virsh(&["dumpxml", n]);
            // libvirt may rewrite the metadata's quotes; accept both.
            let xml = xml.replace('"', "'");
            if ok && xml.contains(&format!("install='{}'", self.install_id)) {
                let uid = xml
                    .split("vmi-uid='")
                    .nth(1)
                    .and_then(|s| s.split('\'').next())
                    .unwrap_or("")
                    .to_string();
                out.push((n.to_string(), uid));
            }
        }
        out
    }
}

impl Drop for Appliance {
    fn drop(&mut self) {
        self.kill9();
        // Launchers of this data dir, then the domains of this installation.
        kill_launchers(&self.dir);
        if !self.install_id.is_empty() {
            for (d, _) in self.our_domains() {
                virsh(&["destroy", &d]);
            }
        }
        if std::thread::panicking() {
            // Keep the data dir (logs) of a failed test for inspection.
            if let Some(t) = self._tmp.take() {
                eprintln!("keeping {} for inspection", t.keep().display());
            }
        }
    }
}

/// The launchers whose socket is under `dir` (`edgevirt launcher --socket DIR/...`), by pid.
pub fn launcher_pids(dir: &Path) -> Vec<libc::pid_t> {
    let prefix = format!("{}/", dir.display());
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| {
            let pid: libc::pid_t = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let ours = args.iter().any(|a| *a == b"launcher")
                && args
                    .windows(2)
                    .any(|w| w[0] == b"--socket" && w[1].starts_with(prefix.as_bytes()));
            ours.then_some(pid)
        })
        .collect()
}

/// `kill -9` the launchers whose socket is under `dir`, by pid.
pub fn kill_launchers(dir: &Path) {
    for pid in launcher_pids(dir) {
        // SAFETY: kill(2) on a pid whose command line names a socket under `dir`.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}
