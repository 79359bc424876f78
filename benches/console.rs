//! The console proxy and dashboard benchmark (a benchmark, not a test: it prints figures and
//! only fails when something could not be measured at all).
//!
//!   CARGO_TARGET_DIR=/work/target-bench cargo bench --bench console
//!
//! It measures, in one run, against the real `edgevirt serve` (the optimized build of this
//! workspace, bench profile = release settings) on the local libvirt with the test guest:
//!
//! 1. Memory per idle console connection: VmRSS of the serve process before and after opening
//!    `BENCH_IDLE_CONNS` websocket consoles through edgevirt (each with its own ticket and a
//!    completed RFB handshake, so they are real viewers that then sit idle).
//! 2. VNC throughput and round-trip latency over three paths to the same QEMU VNC server:
//!    - "direct socket": the RFB client on the VM's VNC unix socket (QEMU listens on a unix
//!      socket, not TCP, so that is the direct baseline);
//!    - "edgevirt": the websocket `/console/ws/vnc/...` with a ticket;
//!    - "websockify": Debian's `websockify --unix-target=<vnc.sock>` on loopback.
//!
//!    Same RFB client for all: RFB 3.8, security None, SetPixelFormat 32 bpp true colour,
//!    SetEncodings [Raw]. Throughput: non-incremental full-screen FramebufferUpdateRequest,
//!    read the whole Raw reply, repeat for `BENCH_TPUT_SECS`. Latency: non-incremental 1x1
//!    FramebufferUpdateRequest until its FramebufferUpdate has arrived. `BENCH_ROUNDS` rounds,
//!    the order of the paths rotated each round; figures pool all rounds.
//! 3. Dashboard pages with `BENCH_PAGE_VMS` VMs in the store (runStrategy Halted, created
//!    through the API 16 at a time): GET /ui/, /ui/vms, /ui/vms/rows, a VM's detail page and
//!    its status fragment, `BENCH_PAGE_REQS` times each after a warm-up, timed client-side
//!    over loopback HTTP (includes the HTTP round trip; edgevirt logs no server-side timing).
//!
//! Targets (DESIGN.md): throughput >= 0.8x direct and >= 2x websockify, added p50 <= 20 us,
//! each page < 50 ms with 1,000 VMs. They are printed next to the figures, not asserted.
//!
//! Environment: BENCH_PAGE_VMS (1000), BENCH_ROUNDS (3), BENCH_TPUT_SECS (2, per path and
//! round), BENCH_LAT_ITERS (2000 per path, split over the rounds), BENCH_IDLE_CONNS (30; QEMU
//! 7.2 accepts at most 32 VNC clients per display), BENCH_PAGE_REQS (20), BENCH_KEEP_LOGS (a
//! directory to copy serve.log and websockify.log into), EDGEVIRT_TEST_GUEST (the test guest).
//! Needs root, libvirtd, the test guest and `websockify` (Debian package).

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use common::*;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const BOOT: Duration = Duration::from_secs(180);
const IO_TIMEOUT: Duration = Duration::from_secs(30);
const VM: &str = "bench-con";

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

// ------------------------------------------------------------------------- RFB client

enum Transport {
    Unix(UnixStream),
    Ws(Box<Ws>),
}

/// One RFB client connection over either transport. Received bytes are kept in `buf` from
/// `pos` on; pixel data is skipped without copying where the transport allows.
struct Rfb {
    t: Transport,
    buf: Vec<u8>,
    pos: usize,
    /// Bytes received from the server (RFB payload, not websocket framing).
    received: u64,
}

#[derive(Clone, Copy, Debug)]
struct Screen {
    w: u16,
    h: u16,
}

impl Rfb {
    fn new(t: Transport) -> Self {
        Rfb {
            t,
            buf: Vec::with_capacity(512 << 10),
            pos: 0,
            received: 0,
        }
    }

    fn avail(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn compact(&mut self) {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > (256 << 10) {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }

    /// Receive more bytes into `buf`.
    async fn fill(&mut self) -> Result<()> {
        self.compact();
        match &mut self.t {
            Transport::Unix(s) => {
                self.buf.reserve(256 << 10);
                let n = tokio::time::timeout(IO_TIMEOUT, s.read_buf(&mut self.buf))
                    .await
                    .context("no data from the VNC server within 30 s")??;
                if n == 0 {
                    bail!("the VNC socket closed");
                }
                self.received += n as u64;
            }
            Transport::Ws(ws) => {
                let b = next_binary(ws).await?;
                self.received += b.len() as u64;
                self.buf.extend_from_slice(&b);
            }
        }
        Ok(())
    }

    async fn read(&mut self, n: usize) -> Result<&[u8]> {
        while self.avail() < n {
            self.fill().await?;
        }
        let start = self.pos;
        self.pos += n;
        Ok(&self.buf[start..start + n])
    }

    /// Consume `n` bytes without looking at them.
    async fn skip(&mut self, mut n: usize) -> Result<()> {
        loop {
            let a = self.avail().min(n);
            self.pos += a;
            n -= a;
            if n == 0 {
                return Ok(());
            }
            // Nothing buffered: whole websocket messages inside the skipped range are dropped
            // as they come, without copying them.
            if let Transport::Ws(ws) = &mut self.t {
                let b = next_binary(ws).await?;
                self.received += b.len() as u64;
                if b.len() <= n {
                    n -= b.len();
                    continue;
                }
                self.compact();
                self.buf.extend_from_slice(&b);
            } else {
                self.fill().await?;
            }
        }
    }

    async fn write(&mut self, b: &[u8]) -> Result<()> {
        match &mut self.t {
            Transport::Unix(s) => s.write_all(b).await?,
            Transport::Ws(ws) => ws.send(Message::Binary(b.to_vec().into())).await?,
        }
        Ok(())
    }

    /// RFB 3.8, security None, shared; then 32 bpp true colour and Raw only.
    async fn handshake(&mut self) -> Result<Screen> {
        let v = self.read(12).await?.to_vec();
        if !v.starts_with(b"RFB 003.") {
            bail!("not an RFB server: {v:?}");
        }
        self.write(b"RFB 003.008\n").await?;
        let n = self.read(1).await?[0] as usize;
        if n == 0 {
            let l = be32(self.read(4).await?) as usize;
            let why = String::from_utf8_lossy(self.read(l).await?).into_owned();
            bail!("the VNC server refused the connection: {why}");
        }
        let types = self.read(n).await?.to_vec();
        if !types.contains(&1) {
            bail!("security type None not offered: {types:?}");
        }
        self.write(&[1]).await?;
        let r = self.read(4).await?.to_vec();
        if r != [0, 0, 0, 0] {
            bail!("SecurityResult {r:?}");
        }
        self.write(&[1]).await?; // ClientInit, shared
        let init = self.read(24).await?.to_vec();
        let (w, h) = (be16(&init[0..2]), be16(&init[2..4]));
        let name_len = be32(&init[20..24]) as usize;
        self.skip(name_len).await?;
        // SetPixelFormat: 32 bpp, depth 24, little endian, true colour, 8 bits each.
        let mut pf = vec![0u8, 0, 0, 0, 32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0];
        pf.extend_from_slice(&[0, 0, 0]);
        self.write(&pf).await?;
        self.write(&[2, 0, 0, 1, 0, 0, 0, 0]).await?; // SetEncodings: Raw
        Ok(Screen { w, h })
    }

    /// Send a non-incremental FramebufferUpdateRequest and read the whole update; returns the
    /// RFB bytes of the update message.
    async fn update(&mut self, x: u16, y: u16, w: u16, h: u16) -> Result<u64> {
        let mut req = [3u8, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        req[2..4].copy_from_slice(&x.to_be_bytes());
        req[4..6].copy_from_slice(&y.to_be_bytes());
        req[6..8].copy_from_slice(&w.to_be_bytes());
        req[8..10].copy_from_slice(&h.to_be_bytes());
        self.write(&req).await?;
        loop {
            let t = self.read(1).await?[0];
            match t {
                0 => break,
                1 => {
                    // SetColourMapEntries
                    let h = self.read(5).await?.to_vec();
                    self.skip(6 * be16(&h[3..5]) as usize).await?;
                }
                2 => {} // Bell
                3 => {
                    let l = self.read(7).await?.to_vec();
                    self.skip(be32(&l[3..7]) as usize).await?;
                }
                t => bail!("unexpected server message type {t}"),
            }
        }
        let rects = be16(&self.read(3).await?[1..3]);
        let mut bytes = 4u64;
        for _ in 0..rects {
            let r = self.read(12).await?.to_vec();
            let (rw, rh) = (be16(&r[4..6]) as usize, be16(&r[6..8]) as usize);
            let enc = be32(&r[8..12]) as i32;
            bytes += 12;
            match enc {
                0 => {
                    self.skip(rw * rh * 4).await?;
                    bytes += (rw * rh * 4) as u64;
                }
                -223 => {} // DesktopSize
                e => bail!("asked for Raw only, got encoding {e}"),
            }
        }
        Ok(bytes)
    }
}

async fn next_binary(ws: &mut Ws) -> Result<tokio_tungstenite::tungstenite::Bytes> {
    loop {
        let m = tokio::time::timeout(IO_TIMEOUT, ws.next())
            .await
            .context("no data from the websocket within 30 s")?
            .ok_or_else(|| anyhow!("the websocket closed"))??;
        match m {
            Message::Binary(b) => return Ok(b),
            Message::Close(c) => bail!("the websocket closed: {c:?}"),
            _ => continue,
        }
    }
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

// ------------------------------------------------------------------------- the three paths

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path3 {
    Direct,
    Edgevirt,
    Websockify,
}

impl Path3 {
    fn label(self) -> &'static str {
        match self {
            Path3::Direct => "direct socket",
            Path3::Edgevirt => "edgevirt",
            Path3::Websockify => "websockify",
        }
    }
}

async fn ws_connect(url: &str) -> Result<Ws> {
    let mut req = url.into_client_request()?;
    // noVNC offers "binary"; both proxies accept it.
    req.headers_mut()
        .insert("sec-websocket-protocol", "binary".parse()?);
    let (ws, _) = tokio_tungstenite::connect_async_with_config(req, None, true)
        .await
        .with_context(|| format!("websocket to {url}"))?;
    Ok(ws)
}

async fn ticket(a: &Appliance, name: &str) -> Result<String> {
    let r = a
        .http
        .post(format!("{}/console/tickets", a.url))
        .bearer_auth(&a.token)
        .json(&json!({"namespace": "default", "name": name, "kind": "vnc"}))
        .send()
        .await?;
    let code = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    if code != 201 {
        bail!("console ticket: HTTP {code}: {v}");
    }
    Ok(v["path"].as_str().context("ticket path")?.to_string())
}

struct Ctx<'a> {
    a: &'a Appliance,
    vnc_sock: PathBuf,
    websockify_port: u16,
}

impl Ctx<'_> {
    async fn connect(&self, p: Path3) -> Result<Rfb> {
        let t = match p {
            Path3::Direct => Transport::Unix(UnixStream::connect(&self.vnc_sock).await?),
            Path3::Edgevirt => {
                let path = ticket(self.a, VM).await?;
                let url = format!("{}{}", self.a.url.replacen("http", "ws", 1), path);
                Transport::Ws(Box::new(ws_connect(&url).await?))
            }
            Path3::Websockify => Transport::Ws(Box::new(
                ws_connect(&format!("ws://127.0.0.1:{}/", self.websockify_port)).await?,
            )),
        };
        Ok(Rfb::new(t))
    }
}

#[derive(Default)]
struct PathStats {
    bytes: u64,
    updates: u64,
    secs: f64,
    lat_us: Vec<f64>,
}

impl PathStats {
    fn mb_s(&self) -> f64 {
        self.bytes as f64 / self.secs / 1e6
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One round on one path: a fresh connection, warm-up, throughput, then latency.
async fn measure(
    ctx: &Ctx<'_>,
    p: Path3,
    tput: Duration,
    lat_iters: usize,
    stats: &mut PathStats,
) -> Result<Screen> {
    let mut c = ctx.connect(p).await?;
    let s = c.handshake().await?;
    for _ in 0..3 {
        c.update(0, 0, s.w, s.h).await?;
    }
    let start = Instant::now();
    let mut bytes = 0;
    let mut n = 0;
    while start.elapsed() < tput {
        bytes += c.update(0, 0, s.w, s.h).await?;
        n += 1;
    }
    stats.secs += start.elapsed().as_secs_f64();
    stats.bytes += bytes;
    stats.updates += n;
    for _ in 0..lat_iters.min(200) {
        c.update(0, 0, 1, 1).await?;
    }
    for _ in 0..lat_iters {
        let t = Instant::now();
        c.update(0, 0, 1, 1).await?;
        stats.lat_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(s)
}

// ------------------------------------------------------------------------- processes

fn rss_kib(pid: u32) -> Result<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("RssAnon:")?))
}

/// User + system CPU seconds of a process.
fn cpu_secs(pid: u32) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some(after) = s.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = after.split_whitespace().collect();
    // after ')': state is field 3, utime 14, stime 15 (1-based in proc(5))
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

/// Wait until `pid` uses less than 5% of a CPU over a second (at most `max`).
async fn wait_quiet(pid: u32, max: Duration) -> f64 {
    let start = Instant::now();
    loop {
        let c0 = cpu_secs(pid);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let used = cpu_secs(pid) - c0;
        if used < 0.05 || start.elapsed() > max {
            return used;
        }
    }
}

fn children_of(pid: u32) -> Vec<u32> {
    let mut out = vec![];
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{p}/status"))
            && s.lines()
                .find_map(|l| l.strip_prefix("PPid:"))
                .map(|v| v.trim() == pid.to_string())
                .unwrap_or(false)
        {
            out.push(p);
        }
    }
    out
}

/// `websockify`, a child of this process, stopped (with the per-connection processes it
/// forked) by pid when dropped.
struct Websockify {
    child: Child,
    port: u16,
}

impl Websockify {
    async fn start(target: &Path, log: &Path) -> Result<Websockify> {
        let bin = which("websockify").context(
            "websockify is not installed: apt-get install websockify (the Debian package)",
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::File::create(log)?;
        let child = Command::new(bin)
            .arg(format!("--unix-target={}", target.display()))
            .arg(format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting websockify")?;
        let w = Websockify { child, port };
        let start = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if start.elapsed() > Duration::from_secs(15) {
                bail!("websockify did not listen on 127.0.0.1:{port} within 15 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(w)
    }
}

impl Drop for Websockify {
    fn drop(&mut self) {
        let pid = self.child.id();
        let kids = children_of(pid);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        for k in kids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(k as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

// ------------------------------------------------------------------------- dashboard

struct Page {
    path: String,
    label: String,
    ms: Vec<f64>,
    bytes: usize,
}

fn set_cookie(h: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    h.get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split(';').next())
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, v)| k.trim() == name && !v.is_empty())
        .map(|(_, v)| v.to_string())
}

/// Log in to the dashboard as admin; returns the session cookie's value.
async fn login(a: &Appliance, http: &reqwest::Client) -> Result<String> {
    let r = http.get(format!("{}/ui/login", a.url)).send().await?;
    let pre = set_cookie(r.headers(), "edgevirt_prelogin").context("no prelogin cookie")?;
    let creds = std::fs::read_to_string(a.dir.join("initial-admin"))?;
    let password = creds
        .lines()
        .find_map(|l| l.strip_prefix("password="))
        .context("password= in initial-admin")?;
    let r = http
        .post(format!("{}/ui/login", a.url))
        .header("cookie", format!("edgevirt_prelogin={pre}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string([
            ("csrf", pre.as_str()),
            ("next", "/ui/"),
            ("username", "admin"),
            ("password", password),
        ])?)
        .send()
        .await?;
    if r.status().as_u16() != 303 {
        bail!("login: HTTP {} (303 expected)", r.status());
    }
    set_cookie(r.headers(), "edgevirt_session").context("no session cookie after login")
}

async fn create_halted(a: &Appliance, n: usize) -> Result<(Duration, usize)> {
    let start = Instant::now();
    let results: Vec<(u16, Value)> = futures::stream::iter(0..n)
        .map(|i| async move {
            a.post_yaml(VMS, &vm_yaml(&format!("page-{i:05}"), "Halted", false))
                .await
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let failed: Vec<_> = results.iter().filter(|(c, _)| *c != 201).collect();
    if let Some((c, v)) = failed.first() {
        eprintln!(
            "[bench] {} of {n} creations failed, first: HTTP {c}: {v}",
            failed.len()
        );
    }
    Ok((start.elapsed(), n - failed.len()))
}

async fn time_pages(a: &Appliance, pages: &mut [Page], reqs: usize) -> Result<()> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let session = login(a, &http).await?;
    let cookie = format!("edgevirt_session={session}");
    for p in pages.iter_mut() {
        for i in 0..reqs + 2 {
            let t = Instant::now();
            let r = http
                .get(format!("{}{}", a.url, p.path))
                .header("cookie", &cookie)
                .send()
                .await?;
            let code = r.status().as_u16();
            let body = r.bytes().await?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if code != 200 {
                bail!(
                    "GET {}: HTTP {code}: {}",
                    p.path,
                    String::from_utf8_lossy(&body[..body.len().min(300)])
                );
            }
            if i >= 2 {
                p.ms.push(ms);
            }
            p.bytes = body.len();
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------- main

fn main() -> Result<()> {
    // `cargo test --all-targets` runs bench targets too (without `--bench`): nothing to do.
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

fn flag(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

async fn run() -> Result<()> {
    let page_vms: usize = env_num("BENCH_PAGE_VMS", 1000);
    let rounds: usize = env_num("BENCH_ROUNDS", 3).max(1);
    let tput = Duration::from_secs_f64(env_num("BENCH_TPUT_SECS", 2.0));
    let lat_total: usize = env_num("BENCH_LAT_ITERS", 2000);
    let lat_iters = lat_total.div_ceil(rounds);
    let idle_conns: usize = env_num("BENCH_IDLE_CONNS", 30);
    let page_reqs: usize = env_num("BENCH_PAGE_REQS", 20).max(1);

    let exe = std::fs::canonicalize(exe())?;
    let optimized = exe.components().any(|c| c.as_os_str() == "release");
    eprintln!("[bench] edgevirt binary: {}", exe.display());
    if !optimized {
        eprintln!("[bench] WARNING: this is not a release/bench build; run with `cargo bench`");
    }

    let a = Appliance::start(&[]).await;
    let pid = a.pid();
    eprintln!(
        "[bench] edgevirt serve pid {pid}, data dir {}",
        a.dir.display()
    );
    a.import_guest().await;
    let (code, v) = a.post_yaml(VMS, &vm_yaml(VM, "Always", false)).await;
    if code != 201 {
        bail!("creating {VM}: HTTP {code}: {v}");
    }
    let vmi = a.wait_running(VM, None, BOOT).await;
    let uid = vmi["metadata"]["uid"]
        .as_str()
        .context("VMI uid")?
        .to_string();
    let dom = vmi["status"]["domainName"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let vnc_sock = a.dir.join("run/vmi").join(&uid).join("vnc.sock");
    if !vnc_sock.exists() {
        bail!("no VNC socket at {}", vnc_sock.display());
    }
    // Let the TCG guest finish booting so that its CPU use does not disturb the figures.
    eprintln!("[bench] {VM} is Running; waiting for its guest agent (end of boot)");
    let t = Instant::now();
    let mut agent = false;
    while t.elapsed() < BOOT {
        let (ok, _) = virsh(&["qemu-agent-command", &dom, r#"{"execute":"guest-ping"}"#]);
        if ok {
            agent = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if !agent {
        eprintln!("[bench] WARNING: the guest agent did not answer; measuring anyway");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_quiet(pid, Duration::from_secs(30)).await;

    // ---- 1. memory per idle console connection (first, before big transfers have grown
    // the allocator's free lists, which later connections would reuse unseen).
    eprintln!("[bench] memory: {idle_conns} idle consoles through edgevirt");
    let ws_log = a.dir.join("websockify.log");
    let ctx_tmp = Ctx {
        a: &a,
        vnc_sock: vnc_sock.clone(),
        websockify_port: 0,
    };
    {
        // one connection first: one-time allocations (tracing, route caches) are not per viewer
        let mut c = ctx_tmp.connect(Path3::Edgevirt).await?;
        c.handshake().await?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss0, anon0) = rss_kib(pid)?;
    let mut idle = Vec::new();
    for _ in 0..idle_conns {
        let mut c = ctx_tmp.connect(Path3::Edgevirt).await?;
        c.handshake().await?;
        idle.push(c);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // all still alive? (QEMU disconnects clients beyond its limit)
    let (code, st) = a.get(&format!("/console/state/default/{VM}")).await;
    let open_now = st["viewers"].as_array().map(Vec::len).unwrap_or(0);
    if code != 200 || open_now != idle_conns {
        eprintln!(
            "[bench] WARNING: {open_now} of {idle_conns} idle consoles are open (HTTP {code})"
        );
    }
    let (rss1, anon1) = rss_kib(pid)?;
    drop(idle);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rss2, _) = rss_kib(pid)?;
    let per_conn = (rss1 as f64 - rss0 as f64) / idle_conns as f64;
    let per_conn_anon = (anon1 as f64 - anon0 as f64) / idle_conns as f64;

    // ---- 2. VNC: direct socket, edgevirt, websockify
    let wsfy = Websockify::start(&vnc_sock, &ws_log).await?;
    let ctx = Ctx {
        a: &a,
        vnc_sock: vnc_sock.clone(),
        websockify_port: wsfy.port,
    };
    let order = [Path3::Direct, Path3::Edgevirt, Path3::Websockify];
    let mut stats: Vec<PathStats> = order.iter().map(|_| PathStats::default()).collect();
    let mut screen = None;
    let mut serve_cpu = 0.0;
    let mut serve_secs = 0.0;
    for r in 0..rounds {
        for k in 0..order.len() {
            let i = (k + r) % order.len();
            let p = order[i];
            eprintln!("[bench] round {}/{rounds}: {}", r + 1, p.label());
            let (c0, t0) = (cpu_secs(pid), Instant::now());
            let s = measure(&ctx, p, tput, lat_iters, &mut stats[i])
                .await
                .with_context(|| format!("measuring {}", p.label()))?;
            if p == Path3::Edgevirt {
                serve_cpu += cpu_secs(pid) - c0;
                serve_secs += t0.elapsed().as_secs_f64();
            }
            screen = Some(s);
        }
    }
    drop(wsfy);
    for s in &mut stats {
        s.lat_us.sort_by(f64::total_cmp);
    }
    let screen = screen.unwrap();

    // ---- 3. dashboard pages with many VMs
    eprintln!("[bench] pages: creating {page_vms} Halted VMs, 16 at a time");
    let (took, created) = create_halted(&a, page_vms).await?;
    eprintln!(
        "[bench] created {created} VMs in {:.1} s ({:.0}/s); waiting for the controller",
        took.as_secs_f64(),
        created as f64 / took.as_secs_f64()
    );
    let t = Instant::now();
    let mut stopped = 0;
    while t.elapsed() < Duration::from_secs(300) {
        let (_, list) = a.get(VMS).await;
        stopped = list["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|v| v["status"]["printableStatus"] == "Stopped")
                    .count()
            })
            .unwrap_or(0);
        if stopped >= created {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let settle = t.elapsed();
    wait_quiet(pid, Duration::from_secs(60)).await;
    let (rss_pages, _) = rss_kib(pid)?;
    let halted = format!("page-{:05}", page_vms / 2);
    let mut pages: Vec<Page> = [
        ("/ui/", "overview"),
        ("/ui/vms", "VM list"),
        ("/ui/vms/rows", "VM list rows (polled)"),
        (&*format!("/ui/vms/default/{VM}"), "VM detail (running)"),
        (&*format!("/ui/vms/default/{halted}"), "VM detail (halted)"),
        (
            &*format!("/ui/vms/default/{VM}/status"),
            "VM status (polled)",
        ),
    ]
    .iter()
    .map(|(p, l)| Page {
        path: p.to_string(),
        label: l.to_string(),
        ms: vec![],
        bytes: 0,
    })
    .collect();
    time_pages(&a, &mut pages, page_reqs).await?;
    for p in &mut pages {
        p.ms.sort_by(f64::total_cmp);
    }
    let vm_count = a.get(VMS).await.1["items"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0);

    if let Some(dir) = std::env::var_os("BENCH_KEEP_LOGS") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir)?;
        for f in ["serve.log", "websockify.log"] {
            let _ = std::fs::copy(a.dir.join(f), dir.join(f));
        }
    }

    // ---- results
    let [d, e, w] = [&stats[0], &stats[1], &stats[2]];
    let p50 = |s: &PathStats| percentile(&s.lat_us, 50.0);
    let p99 = |s: &PathStats| percentile(&s.lat_us, 99.0);
    let frame = screen.w as u64 * screen.h as u64 * 4;
    let r_direct = e.mb_s() / d.mb_s();
    let r_wsfy = e.mb_s() / w.mb_s();
    let added50 = p50(e) - p50(d);
    let added99 = p99(e) - p99(d);
    let qemu = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_default();

    println!();
    println!("edgevirt console benchmark");
    println!("==========================");
    println!(
        "edgevirt binary  {}{}",
        exe.display(),
        if optimized {
            " (optimized: bench profile = release settings)"
        } else {
            " (NOT optimized)"
        }
    );
    println!(
        "VNC server       {qemu}, VM {VM} (TCG, idle), display {}x{}",
        screen.w, screen.h
    );
    println!("                 on the unix socket {}", vnc_sock.display());
    println!(
        "paths            direct socket = RFB client on that unix socket (QEMU's VNC listens on a"
    );
    println!("                                 unix socket, not TCP: this is the direct baseline)");
    println!(
        "                 edgevirt      = ws://127.0.0.1 websocket /console/ws/vnc/default/{VM}?ticket=..."
    );
    println!(
        "                 websockify    = Debian websockify {} --unix-target, ws://127.0.0.1:<port>/",
        websockify_version()
    );
    println!(
        "client           one RFB client for all paths (Rust, current-thread tokio, same process), 2 cores shared by all"
    );
    println!(
        "method           {rounds} rounds, path order rotated; per path and round: one connection, {:.1} s of",
        tput.as_secs_f64()
    );
    println!(
        "                 non-incremental full-screen Raw updates ({frame} B of pixels each) then {lat_iters}"
    );
    println!(
        "                 1x1 non-incremental update round trips (after {} warm-up)",
        lat_iters.min(200)
    );
    println!();
    println!(
        "VNC proxy                  throughput     updates/s   round trip p50   round trip p99   samples"
    );
    for (s, p) in [
        (d, Path3::Direct),
        (e, Path3::Edgevirt),
        (w, Path3::Websockify),
    ] {
        println!(
            "  {:<22} {:>9.1} MB/s  {:>9.1}   {:>11.1} µs   {:>11.1} µs   {:>7}",
            p.label(),
            s.mb_s(),
            s.updates as f64 / s.secs,
            p50(s),
            p99(s),
            s.lat_us.len()
        );
    }
    println!();
    println!("Ratios (same run)                             measured        target");
    println!(
        "  throughput edgevirt / direct socket      {:>10.2}×     ≥ 0.80×   {}",
        r_direct,
        flag(r_direct >= 0.8)
    );
    println!(
        "  throughput edgevirt / websockify         {:>10.2}×     ≥ 2.00×   {}",
        r_wsfy,
        flag(r_wsfy >= 2.0)
    );
    println!(
        "  added p50 (edgevirt − direct socket)     {:>9.1} µs     ≤ 20 µs   {}",
        added50,
        flag(added50 <= 20.0)
    );
    println!(
        "  added p99 (edgevirt − direct socket)     {:>9.1} µs     (info)",
        added99
    );
    println!(
        "  p50 edgevirt / websockify                {:>10.2}×     (info)",
        p50(e) / p50(w)
    );
    println!(
        "  edgevirt serve CPU while proxying        {:>9.0} %      (info: of one core, over its rounds)",
        100.0 * serve_cpu / serve_secs.max(1e-9)
    );
    println!();
    println!(
        "Memory per idle console connection (edgevirt serve VmRSS, {idle_conns} consoles after RFB handshake)"
    );
    println!(
        "  VmRSS {rss0} KiB -> {rss1} KiB with {idle_conns} open -> {rss2} KiB after closing them"
    );
    println!(
        "  per connection: {per_conn:.1} KiB VmRSS ({per_conn_anon:.1} KiB RssAnon)   (no target)"
    );
    println!();
    println!(
        "Dashboard pages, {vm_count} VMs in the store ({created} Halted created in {:.1} s = {:.0}/s, all Stopped after {:.1} s more; serve VmRSS {rss_pages} KiB)",
        took.as_secs_f64(),
        created as f64 / took.as_secs_f64(),
        settle.as_secs_f64()
    );
    println!(
        "  time = client-side on loopback HTTP/1.1 (request sent -> whole body read), {page_reqs} requests each after 2 warm-up"
    );
    println!(
        "  page                                          p50 ms    max ms       bytes   target < 50 ms"
    );
    for p in &pages {
        let (m50, max) = (percentile(&p.ms, 50.0), *p.ms.last().unwrap());
        println!(
            "  {:<44} {:>7.2}   {:>7.2}  {:>10}   {}",
            format!("{} {}", p.label, short(&p.path)),
            m50,
            max,
            p.bytes,
            if max < 50.0 {
                "met (max)"
            } else if m50 < 50.0 {
                "p50 met, max MISSED"
            } else {
                "MISSED"
            }
        );
    }
    if stopped < created {
        println!(
            "  (WARNING: only {stopped} of {created} VMs had reached Stopped when the pages were timed)"
        );
    }
    println!();
    drop(a);
    Ok(())
}

fn short(p: &str) -> String {
    p.replace("/ui/vms/default/", "…/")
}

/// websockify's Debian package version.
fn websockify_version() -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", "websockify"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|| "?".into())
}
