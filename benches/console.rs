//! The console proxy and dashboard benchmark (a benchmark, not a test: it prints figures and
//! only fails when something could not be measured at all).
//!
//!   CARGO_TARGET_DIR=/work/target-bench cargo bench --bench console
//!
//! It measures, in one run, against the real `edgevirt serve` (the optimized build of this
//! workspace, bench profile = release settings) on the local libvirt with the test guest:
//!
//! 1. Memory per idle console connection: VmRSS of the serve process while
//!    `BENCH_IDLE_CONNS` websocket consoles are opened through edgevirt in `BENCH_IDLE_STEPS`
//!    steps (each with its own ticket and a completed RFB handshake, so they are real viewers
//!    that then sit idle); the figure is the slope after the first step, since the first
//!    connections also reuse memory the allocator had freed earlier. They go to the synthetic
//!    server below, because QEMU 7.2 takes at most 32 VNC clients per display.
//! 2. VNC throughput and round-trip latency over three paths to the same VNC server:
//!    - "direct socket": the RFB client on the VM's VNC unix socket (QEMU listens on a unix
//!      socket, not TCP, so that is the direct baseline);
//!    - "edgevirt": the websocket `/console/ws/vnc/...` with a ticket;
//!    - "websockify": Debian's `websockify --unix-target=<vnc.sock>` on loopback.
//!
//!    Same RFB client for all: RFB 3.8, security None, SetPixelFormat 32 bpp true colour,
//!    SetEncodings [Raw]. Throughput: non-incremental full-screen FramebufferUpdateRequest,
//!    read the whole Raw reply, repeat for `BENCH_TPUT_SECS`. Latency: non-incremental 1x1
//!    FramebufferUpdateRequest until the FramebufferUpdate answering it. `BENCH_ROUNDS`
//!    rounds, the order of the paths rotated each round; figures pool all rounds.
//!    Two servers, one after the other:
//!    - A, QEMU, the VM's own VNC server. QEMU sends pixels only at its display refresh tick
//!      (30 ms or more; about 150 ms for an idle text console), so A's throughput is paced by
//!      that timer on every path, and a 1x1 pixel round trip would time the timer. The round
//!      trip is timed to the ExtendedDesktopSize update QEMU writes at once from its socket
//!      read handler when the client has advertised that pseudo-encoding.
//!    - B, a synthetic RFB server in this process ([`Synthetic`]) that answers every request
//!      at once, bound on the VM's `vnc.sock` path while it runs (QEMU's socket is moved
//!      aside and put back): here the paths set the pace. It also listens on loopback TCP,
//!      which adds a fourth path, "direct TCP", the baseline the acceptance text names.
//! 3. Dashboard pages with `BENCH_PAGE_VMS` VMs in the store (runStrategy Halted, created
//!    through the API 16 at a time): GET /ui/, /ui/vms, /ui/vms/rows, VM detail pages and a
//!    status fragment, `BENCH_PAGE_REQS` times each after a warm-up, timed client-side over
//!    loopback HTTP (includes the HTTP round trip; edgevirt logs no server-side timing).
//!
//! Targets (DESIGN.md): throughput >= 0.8x direct and >= 2x websockify, added p50 <= 20 us,
//! each page < 50 ms with 1,000 VMs. They are printed next to the figures, not asserted.
//!
//! Environment: BENCH_PAGE_VMS (1000), BENCH_ROUNDS (5), BENCH_TPUT_SECS (1.5, per path and
//! round), BENCH_LAT_ITERS (2000 per path, split over the rounds), BENCH_IDLE_CONNS (400) in
//! BENCH_IDLE_STEPS (4), BENCH_PAGE_REQS (20), BENCH_SPIN (1: a SCHED_IDLE busy thread per
//! CPU during the VNC part, see [`Spinners`]; 0: none), BENCH_KEEP_LOGS (a directory to copy
//! serve.log and websockify.log into), EDGEVIRT_TEST_GUEST (the test guest).
//! BENCH_PAGE_VMS=0 skips creating VMs (the pages are then timed with the one running VM).
//! Needs root, libvirtd, the test guest and `websockify` (Debian package).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use testkit::*;
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
    Tcp(tokio::net::TcpStream),
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
            Transport::Tcp(s) => {
                self.buf.reserve(256 << 10);
                let n = tokio::time::timeout(IO_TIMEOUT, s.read_buf(&mut self.buf))
                    .await
                    .context("no data from the VNC server within 30 s")??;
                if n == 0 {
                    bail!("the VNC connection closed");
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
            Transport::Tcp(s) => s.write_all(b).await?,
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
        self.set_encodings(&[0]).await?; // Raw only
        Ok(Screen { w, h })
    }

    /// Send a non-incremental FramebufferUpdateRequest.
    async fn request(&mut self, x: u16, y: u16, w: u16, h: u16) -> Result<()> {
        let mut req = [3u8, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        req[2..4].copy_from_slice(&x.to_be_bytes());
        req[4..6].copy_from_slice(&y.to_be_bytes());
        req[6..8].copy_from_slice(&w.to_be_bytes());
        req[8..10].copy_from_slice(&h.to_be_bytes());
        self.write(&req).await
    }

    /// Read server messages up to and including the next FramebufferUpdate, whole.
    async fn read_update(&mut self) -> Result<Update> {
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
        let mut u = Update {
            bytes: 4,
            pixels: 0,
            ext_desktop_size: false,
        };
        for _ in 0..rects {
            let r = self.read(12).await?.to_vec();
            let (rw, rh) = (be16(&r[4..6]) as usize, be16(&r[6..8]) as usize);
            let enc = be32(&r[8..12]) as i32;
            u.bytes += 12;
            match enc {
                0 => {
                    self.skip(rw * rh * 4).await?;
                    u.bytes += (rw * rh * 4) as u64;
                    u.pixels += (rw * rh) as u64;
                }
                -223 => {} // DesktopSize
                ENC_EXT_DESKTOP_SIZE => {
                    let screens = self.read(4).await?[0] as usize;
                    self.skip(16 * screens).await?;
                    u.bytes += 4 + 16 * screens as u64;
                    u.ext_desktop_size = true;
                }
                e => bail!("asked for Raw only, got encoding {e}"),
            }
        }
        Ok(u)
    }

    /// Throughput unit: a non-incremental full-screen request and its whole Raw update.
    async fn full_update(&mut self, s: Screen) -> Result<u64> {
        self.request(0, 0, s.w, s.h).await?;
        loop {
            let u = self.read_update().await?;
            if u.pixels > 0 {
                return Ok(u.bytes);
            }
        }
    }

    /// Latency unit: a non-incremental 1x1 request until the update that answers it. With QEMU
    /// that is the ExtendedDesktopSize update it writes at once from its socket read handler
    /// (its pixels follow at the next refresh tick; those updates are skipped here); with the
    /// synthetic server, the 1x1 Raw update.
    async fn probe(&mut self, server: Server) -> Result<()> {
        self.request(0, 0, 1, 1).await?;
        loop {
            let u = self.read_update().await?;
            match server {
                Server::Qemu if u.ext_desktop_size => return Ok(()),
                Server::Synthetic if u.pixels > 0 => return Ok(()),
                _ => continue,
            }
        }
    }

    async fn set_encodings(&mut self, encs: &[i32]) -> Result<()> {
        let mut m = vec![2u8, 0];
        m.extend_from_slice(&(encs.len() as u16).to_be_bytes());
        for e in encs {
            m.extend_from_slice(&e.to_be_bytes());
        }
        self.write(&m).await
    }
}

const ENC_EXT_DESKTOP_SIZE: i32 = -308;

struct Update {
    bytes: u64,
    pixels: u64,
    ext_desktop_size: bool,
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
enum Via {
    Direct,
    /// Part B only: the synthetic server's loopback TCP port (QEMU's VNC has no TCP here).
    DirectTcp,
    Edgevirt,
    Websockify,
}

impl Via {
    fn label(self) -> &'static str {
        match self {
            Via::Direct => "direct socket",
            Via::DirectTcp => "direct TCP",
            Via::Edgevirt => "edgevirt",
            Via::Websockify => "websockify",
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

#[derive(Clone)]
struct Ctx<'a> {
    a: &'a Appliance,
    vnc_sock: PathBuf,
    websockify_port: u16,
    /// The synthetic server's TCP port, while it runs.
    direct_tcp_port: Option<u16>,
}

impl Ctx<'_> {
    async fn connect(&self, p: Via) -> Result<Rfb> {
        let t = match p {
            Via::Direct => Transport::Unix(UnixStream::connect(&self.vnc_sock).await?),
            Via::DirectTcp => {
                let port = self.direct_tcp_port.context("no direct TCP server")?;
                let t = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                t.set_nodelay(true)?;
                Transport::Tcp(t)
            }
            Via::Edgevirt => {
                let path = ticket(self.a, VM).await?;
                let url = format!("{}{}", self.a.url.replacen("http", "ws", 1), path);
                Transport::Ws(Box::new(ws_connect(&url).await?))
            }
            Via::Websockify => Transport::Ws(Box::new(
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
    server: Server,
    p: Via,
    tput: Duration,
    lat_iters: usize,
    stats: &mut PathStats,
) -> Result<Screen> {
    let mut c = ctx.connect(p).await?;
    let s = c.handshake().await?;
    for _ in 0..3 {
        c.full_update(s).await?;
    }
    let start = Instant::now();
    let mut bytes = 0;
    let mut n = 0;
    while start.elapsed() < tput {
        bytes += c.full_update(s).await?;
        n += 1;
    }
    stats.secs += start.elapsed().as_secs_f64();
    stats.bytes += bytes;
    stats.updates += n;
    if server == Server::Qemu {
        c.set_encodings(&[0, ENC_EXT_DESKTOP_SIZE]).await?;
    }
    for _ in 0..lat_iters.min(200) {
        c.probe(server).await?;
    }
    for _ in 0..lat_iters {
        let t = Instant::now();
        c.probe(server).await?;
        stats.lat_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(s)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Server {
    /// QEMU's VNC server of the running VM.
    Qemu,
    /// [`Synthetic`], bound in place of QEMU's socket.
    Synthetic,
}

/// A minimal RFB 3.8 server (security None, 32 bpp true colour) that answers every
/// FramebufferUpdateRequest at once with Raw pixels of the requested area: unlike QEMU, whose
/// updates wait for its display refresh timer, it lets a proxy be the bottleneck. One OS
/// thread per connection, blocking I/O, in this process. It takes the VM's `vnc.sock` path for
/// the time it lives (QEMU's socket is renamed aside and put back on drop), so edgevirt, whose
/// target path cannot be chosen by a client, relays to it like to QEMU.
struct Synthetic {
    path: PathBuf,
    aside: PathBuf,
    /// The same server on loopback TCP (TCP_NODELAY), for the "direct TCP" baseline.
    tcp_port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Synthetic {
    fn start(path: &Path, s: Screen) -> Result<Synthetic> {
        let aside = path.with_file_name("vnc.sock.bench-qemu");
        std::fs::rename(path, &aside).context("moving QEMU's VNC socket aside")?;
        let tcp = std::net::TcpListener::bind("127.0.0.1:0")?;
        let me = Synthetic {
            path: path.to_path_buf(),
            aside,
            tcp_port: tcp.local_addr()?.port(),
            stop: Default::default(),
        };
        let l = std::os::unix::net::UnixListener::bind(path)?;
        // A pattern, so that nothing could compress or skip zeros.
        let frame: std::sync::Arc<Vec<u8>> = std::sync::Arc::new(
            (0..s.w as usize * s.h as usize * 4)
                .map(|i| (i * 7 + i / 4096) as u8)
                .collect(),
        );
        let (stop, f) = (me.stop.clone(), frame.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let Ok(c) = c else { continue };
                let frame = f.clone();
                std::thread::spawn(move || {
                    if let Ok(w) = c.try_clone() {
                        let _ = synthetic_conn(c, w, s, &frame);
                    }
                });
            }
        });
        let stop = me.stop.clone();
        std::thread::spawn(move || {
            for c in tcp.incoming() {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let Ok(c) = c else { continue };
                let _ = c.set_nodelay(true);
                let frame = frame.clone();
                std::thread::spawn(move || {
                    if let Ok(w) = c.try_clone() {
                        let _ = synthetic_conn(c, w, s, &frame);
                    }
                });
            }
        });
        Ok(me)
    }
}

impl Drop for Synthetic {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // wake the accept loops
        let _ = std::os::unix::net::UnixStream::connect(&self.path);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.tcp_port));
        let _ = std::fs::remove_file(&self.path);
        if let Err(e) = std::fs::rename(&self.aside, &self.path) {
            eprintln!("[bench] WARNING: could not put QEMU's VNC socket back: {e}");
        }
    }
}

fn synthetic_conn(
    r: impl std::io::Read,
    mut w: impl std::io::Write,
    s: Screen,
    frame: &[u8],
) -> Result<()> {
    use std::io::{BufReader, Read};
    let mut r = BufReader::with_capacity(64 << 10, r);
    let mut buf = [0u8; 64];
    w.write_all(b"RFB 003.008\n")?;
    r.read_exact(&mut buf[..12])?;
    w.write_all(&[1, 1])?; // one security type: None
    r.read_exact(&mut buf[..1])?;
    w.write_all(&[0, 0, 0, 0])?;
    r.read_exact(&mut buf[..1])?; // ClientInit
    let mut init = Vec::new();
    init.extend_from_slice(&s.w.to_be_bytes());
    init.extend_from_slice(&s.h.to_be_bytes());
    init.extend_from_slice(&[32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0]);
    init.extend_from_slice(&5u32.to_be_bytes());
    init.extend_from_slice(b"bench");
    w.write_all(&init)?;
    fn skip(r: &mut impl Read, n: u64) -> std::io::Result<u64> {
        std::io::copy(&mut r.by_ref().take(n), &mut std::io::sink())
    }
    let mut out = Vec::with_capacity(64 << 10);
    loop {
        if r.read(&mut buf[..1])? == 0 {
            return Ok(());
        }
        match buf[0] {
            0 => {
                skip(&mut r, 19)?;
            }
            2 => {
                r.read_exact(&mut buf[..3])?;
                skip(&mut r, 4 * be16(&buf[1..3]) as u64)?;
            }
            3 => {
                r.read_exact(&mut buf[..9])?;
                let x = be16(&buf[1..3]).min(s.w);
                let y = be16(&buf[3..5]).min(s.h);
                let rw = be16(&buf[5..7]).min(s.w - x);
                let rh = be16(&buf[7..9]).min(s.h - y);
                out.clear();
                out.extend_from_slice(&[0, 0, 0, 1]);
                for v in [x, y, rw, rh] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
                out.extend_from_slice(&0i32.to_be_bytes());
                let n = rw as usize * rh as usize * 4;
                if n <= 32 << 10 {
                    out.extend_from_slice(&frame[..n]);
                    w.write_all(&out)?;
                } else {
                    w.write_all(&out)?;
                    w.write_all(&frame[..n])?;
                }
            }
            4 => {
                skip(&mut r, 7)?;
            }
            5 => {
                skip(&mut r, 5)?;
            }
            6 => {
                r.read_exact(&mut buf[..7])?;
                skip(&mut r, be32(&buf[3..7]) as u64)?;
            }
            t => bail!("synthetic server: unexpected client message {t}"),
        }
    }
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
    // SAFETY: sysconf reads a constant of the system; no pointers are involved.
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
            a.post_yaml(
                VMS,
                &Vm::guest(&format!("page-{i:05}"))
                    .run_strategy("Halted")
                    .yaml(),
            )
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

struct SetResult {
    screen: Screen,
    stats: Vec<(Via, PathStats)>,
    /// edgevirt serve's CPU use while its path was measured, % of one core.
    serve_cpu_pct: f64,
    /// Most `rustc` processes seen after a path's round (other work on the host).
    compilers: usize,
}

impl SetResult {
    fn get(&self, v: Via) -> Option<&PathStats> {
        self.stats.iter().find(|(p, _)| *p == v).map(|(_, s)| s)
    }
}

/// All rounds of one server over the three paths, the order rotated each round.
async fn run_set(
    ctx: &Ctx<'_>,
    server: Server,
    pid: u32,
    rounds: usize,
    tput: Duration,
    lat_iters: usize,
) -> Result<SetResult> {
    let order: &[Via] = match server {
        Server::Qemu => &[Via::Direct, Via::Edgevirt, Via::Websockify],
        Server::Synthetic => &[Via::Direct, Via::DirectTcp, Via::Edgevirt, Via::Websockify],
    };
    let mut stats: Vec<(Via, PathStats)> =
        order.iter().map(|p| (*p, PathStats::default())).collect();
    let mut screen = None;
    let (mut cpu, mut secs) = (0.0, 0.0);
    let mut compilers = 0;
    for r in 0..rounds {
        for k in 0..order.len() {
            let i = (k + r) % order.len();
            let p = order[i];
            eprintln!(
                "[bench] {server:?} server, round {}/{rounds}: {}",
                r + 1,
                p.label()
            );
            let (c0, t0) = (cpu_secs(pid), Instant::now());
            let s = measure(ctx, server, p, tput, lat_iters, &mut stats[i].1)
                .await
                .with_context(|| format!("measuring {} ({server:?} server)", p.label()))?;
            if p == Via::Edgevirt {
                cpu += cpu_secs(pid) - c0;
                secs += t0.elapsed().as_secs_f64();
            }
            compilers = compilers.max(running("rustc"));
            screen = Some(s);
        }
    }
    for (_, s) in &mut stats {
        s.lat_us.sort_by(f64::total_cmp);
    }
    Ok(SetResult {
        screen: screen.context("no round ran")?,
        stats,
        serve_cpu_pct: 100.0 * cpu / secs.max(1e-9),
        compilers,
    })
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

/// The knobs, from the environment (the header lists them).
#[derive(Clone, Copy)]
struct Settings {
    page_vms: usize,
    rounds: usize,
    tput: Duration,
    lat_iters: usize,
    idle_conns: usize,
    idle_steps: usize,
    spin: bool,
    page_reqs: usize,
}

impl Settings {
    fn from_env() -> Settings {
        let rounds: usize = env_num("BENCH_ROUNDS", 5).max(1);
        let lat_total: usize = env_num("BENCH_LAT_ITERS", 2000);
        Settings {
            page_vms: env_num("BENCH_PAGE_VMS", 1000),
            rounds,
            tput: Duration::from_secs_f64(env_num("BENCH_TPUT_SECS", 1.5)),
            lat_iters: lat_total.div_ceil(rounds),
            idle_conns: env_num("BENCH_IDLE_CONNS", 400).max(1),
            idle_steps: env_num("BENCH_IDLE_STEPS", 4),
            spin: env_num("BENCH_SPIN", 1u8) != 0,
            page_reqs: env_num("BENCH_PAGE_REQS", 20).max(1),
        }
    }
}

async fn run() -> Result<()> {
    let set = Settings::from_env();
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
    let vnc_sock = boot_vm(&a, pid).await?;
    let memory = idle_console_memory(&a, &vnc_sock, pid, &set).await?;
    let vnc = vnc_sets(&a, &vnc_sock, pid, &set).await?;
    let pages = dashboard_pages(&a, pid, &set).await?;
    keep_logs(&a)?;

    print_setup(&exe, optimized, &set, &vnc);
    print_ratios(&vnc.qemu_set, &vnc.synth_set);
    print_memory(&memory);
    print_pages(&pages, set.page_reqs);
    println!();
    drop(a);
    Ok(())
}

/// Create the benchmark's VM, wait until it runs and has booted; its VNC socket.
async fn boot_vm(a: &Appliance, pid: u32) -> Result<PathBuf> {
    a.import_guest().await;
    let (code, v) = a.post_yaml(VMS, &Vm::guest(VM).yaml()).await;
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

    Ok(vnc_sock)
}

/// Part 1: serve's VmRSS with idle consoles open, in steps.
struct MemoryResult {
    /// (open consoles, VmRSS KiB)
    rss_trace: Vec<(usize, u64)>,
    rss_closed: u64,
    per_conn_slope: f64,
    per_conn_all: f64,
    n_first: usize,
    n_last: usize,
}

async fn idle_console_memory(
    a: &Appliance,
    vnc_sock: &Path,
    pid: u32,
    set: &Settings,
) -> Result<MemoryResult> {
    let Settings {
        idle_conns,
        idle_steps,
        ..
    } = *set;
    let vnc_sock = vnc_sock.to_path_buf();
    let ctx_tmp = Ctx {
        a,
        vnc_sock: vnc_sock.clone(),
        websockify_port: 0,
        direct_tcp_port: None,
    };
    let screen0 = {
        let mut c = ctx_tmp.connect(Via::Direct).await?;
        c.handshake().await?
    };
    let idle_steps = idle_steps.clamp(1, idle_conns.max(1));
    eprintln!("[bench] memory: {idle_conns} idle consoles through edgevirt, {idle_steps} steps");
    let mut rss_trace: Vec<(usize, u64)> = vec![];
    let rss_closed = {
        let _synth = Synthetic::start(&vnc_sock, screen0)?;
        {
            // one connection first: one-time allocations are not per viewer
            let mut c = ctx_tmp.connect(Via::Edgevirt).await?;
            c.handshake().await?;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        rss_trace.push((0, rss_kib(pid)?.0));
        let mut idle = Vec::new();
        for step in 1..=idle_steps {
            while idle.len() < idle_conns * step / idle_steps {
                let mut c = ctx_tmp.connect(Via::Edgevirt).await?;
                c.handshake().await?;
                idle.push(c);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            rss_trace.push((idle.len(), rss_kib(pid)?.0));
        }
        let (code, st) = a.get(&format!("/console/state/default/{VM}")).await;
        let open_now = st["viewers"].as_array().map(Vec::len).unwrap_or(0);
        if code != 200 || open_now != idle_conns {
            eprintln!(
                "[bench] WARNING: {open_now} of {idle_conns} idle consoles are open (HTTP {code})"
            );
        }
        drop(idle);
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss_kib(pid)?.0
    };
    let (n_first, rss_first) = rss_trace[rss_trace.len().min(2) - 1];
    let (n_last, rss_last) = *rss_trace.last().unwrap();
    let per_conn_slope = if n_last > n_first {
        (rss_last as f64 - rss_first as f64) / (n_last - n_first) as f64
    } else {
        f64::NAN
    };
    let per_conn_all = (rss_last as f64 - rss_trace[0].1 as f64) / n_last.max(1) as f64;

    Ok(MemoryResult {
        rss_trace,
        rss_closed,
        per_conn_slope,
        per_conn_all,
        n_first,
        n_last,
    })
}

/// Part 2: the VNC paths against QEMU's server, then the synthetic one.
struct VncResult {
    qemu_set: SetResult,
    synth_set: SetResult,
    load_before: String,
    load_after: String,
}

async fn vnc_sets(a: &Appliance, vnc_sock: &Path, pid: u32, set: &Settings) -> Result<VncResult> {
    let Settings {
        rounds,
        tput,
        lat_iters,
        spin,
        ..
    } = *set;
    let vnc_sock = vnc_sock.to_path_buf();
    let ws_log = a.dir.join("websockify.log");
    let wsfy = Websockify::start(&vnc_sock, &ws_log).await?;
    let ctx = Ctx {
        a,
        vnc_sock: vnc_sock.clone(),
        websockify_port: wsfy.port,
        direct_tcp_port: None,
    };
    let load_before = loadavg();
    let spinners = spin.then(Spinners::start);
    let qemu_set = run_set(&ctx, Server::Qemu, pid, rounds, tput, lat_iters).await?;
    let synth_set = {
        let synth = Synthetic::start(&vnc_sock, qemu_set.screen)?;
        let ctx = Ctx {
            direct_tcp_port: Some(synth.tcp_port),
            ..ctx.clone()
        };
        run_set(&ctx, Server::Synthetic, pid, rounds, tput, lat_iters).await?
    };
    let load_after = loadavg();
    drop(spinners);
    drop(wsfy);
    // QEMU's socket is back in place: the VM's console still works.
    {
        let mut c = ctx.connect(Via::Edgevirt).await?;
        c.handshake()
            .await
            .context("the VM's console after the synthetic server")?;
    }

    Ok(VncResult {
        qemu_set,
        synth_set,
        load_before,
        load_after,
    })
}

/// What the VM list's 2-second poll transfers (bodies, bytes).
struct PollBytes {
    /// A poll that names no rows: the whole table (what every poll sent before).
    full: usize,
    /// Nothing changed since the last poll: HTTP 304.
    unchanged: usize,
    unchanged_status: u16,
    /// One VM's labels changed since the last poll.
    one_changed: usize,
    one_changed_mode: String,
}

async fn poll_bytes(a: &Appliance, vm: &str) -> Result<PollBytes> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let cookie = format!("edgevirt_session={}", login(a, &http).await?);
    let get = |have: Option<String>| {
        let mut r = http
            .get(format!("{}/ui/vms/rows?q=&label=", a.url))
            .header("cookie", &cookie);
        if let Some(h) = have {
            r = r.header("x-rows-have", h);
        }
        async move {
            let r = r.send().await?;
            let code = r.status().as_u16();
            let mode = r
                .headers()
                .get("x-rows")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let digest = r
                .headers()
                .get("x-rows-digest")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            anyhow::Ok((code, mode, digest, r.bytes().await?.len()))
        }
    };
    let (_, _, digest, full) = get(None).await?;
    let (unchanged_status, _, _, unchanged) = get(Some(digest.clone())).await?;
    let (code, _) = a
        .call(
            reqwest::Method::PATCH,
            &format!("{VMS}/{vm}"),
            Some((
                "application/merge-patch+json",
                json!({"metadata": {"labels": {"bench-poll": "changed"}}})
                    .to_string()
                    .into_bytes(),
            )),
        )
        .await;
    if code != 200 {
        bail!("labelling {vm}: HTTP {code}");
    }
    let (_, one_changed_mode, _, one_changed) = get(Some(digest)).await?;
    Ok(PollBytes {
        full,
        unchanged,
        unchanged_status,
        one_changed,
        one_changed_mode,
    })
}

/// One page's weight: its HTML and the CSS and JS it loads (noVNC and xterm.js left out),
/// as sent and gzip-compressed.
struct Weight {
    path: String,
    raw: usize,
    gzip: usize,
    files: usize,
}

fn gzip_len(b: &[u8]) -> usize {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(b).expect("gzip to memory");
    e.finish().expect("gzip to memory").len()
}

async fn page_weights(a: &Appliance, halted: &str) -> Result<Vec<Weight>> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let cookie = format!("edgevirt_session={}", login(a, &http).await?);
    let mut out = Vec::new();
    for path in [
        "/ui/".to_string(),
        "/ui/vms".into(),
        format!("/ui/vms/default/{VM}"),
        format!("/ui/vms/default/{halted}"),
        "/ui/vms/new".into(),
        "/ui/images".into(),
        "/ui/networks".into(),
        "/ui/activity".into(),
        "/ui/admin".into(),
    ] {
        let get = |p: String| {
            let r = http.get(format!("{}{p}", a.url)).header("cookie", &cookie);
            async move { anyhow::Ok(r.send().await?.bytes().await?) }
        };
        let html = get(path.clone()).await?;
        let text = String::from_utf8_lossy(&html).to_string();
        let (mut raw, mut gz, mut files) = (html.len(), gzip_len(&html), 1);
        // The page's own scripts and stylesheets (src="/ui/..." and href="/ui/...css").
        let mut assets: Vec<String> = Vec::new();
        for attr in ["src=\"", "href=\""] {
            for part in text.split(attr).skip(1) {
                let url = part.split('"').next().unwrap_or_default();
                if url.starts_with("/ui/")
                    && (url.ends_with(".js") || url.ends_with(".css"))
                    && !url.contains("/vendor/novnc/")
                    && !url.contains("/vendor/xterm/")
                    && !assets.iter().any(|x| x == url)
                {
                    assets.push(url.to_string());
                }
            }
        }
        for u in assets {
            let b = get(u).await?;
            raw += b.len();
            gz += gzip_len(&b);
            files += 1;
        }
        out.push(Weight {
            path,
            raw,
            gzip: gz,
            files,
        });
    }
    Ok(out)
}

/// Part 3: the dashboard's pages with many VMs in the store.
struct PagesResult {
    pages: Vec<Page>,
    polls: Option<PollBytes>,
    weights: Vec<Weight>,
    created: usize,
    took: Duration,
    settle: Duration,
    stopped: usize,
    rss_pages: u64,
    vm_count: usize,
}

async fn dashboard_pages(a: &Appliance, pid: u32, set: &Settings) -> Result<PagesResult> {
    let Settings {
        page_vms,
        page_reqs,
        ..
    } = *set;
    eprintln!("[bench] pages: creating {page_vms} Halted VMs, 16 at a time");
    let (took, created) = create_halted(a, page_vms).await?;
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
    .filter(|(_, l)| created > 0 || !l.contains("halted"))
    .map(|(p, l)| Page {
        path: p.to_string(),
        label: l.to_string(),
        ms: vec![],
        bytes: 0,
    })
    .collect();
    time_pages(a, &mut pages, page_reqs).await?;
    for p in &mut pages {
        p.ms.sort_by(f64::total_cmp);
    }
    let vm_count = a.get(VMS).await.1["items"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0);

    let polls = if created > 0 {
        Some(poll_bytes(a, &format!("page-{:05}", page_vms / 3)).await?)
    } else {
        None
    };
    let weights = page_weights(a, &halted).await?;
    Ok(PagesResult {
        pages,
        polls,
        weights,
        created,
        took,
        settle,
        stopped,
        rss_pages,
        vm_count,
    })
}

/// BENCH_KEEP_LOGS: a directory to copy serve's and websockify's logs into.
fn keep_logs(a: &Appliance) -> Result<()> {
    if let Some(dir) = std::env::var_os("BENCH_KEEP_LOGS") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir)?;
        for f in ["serve.log", "websockify.log"] {
            let _ = std::fs::copy(a.dir.join(f), dir.join(f));
        }
    }

    Ok(())
}

/// What was measured how, and the VNC figures of both servers.
fn print_setup(exe: &Path, optimized: bool, set: &Settings, vnc: &VncResult) {
    let Settings {
        rounds,
        tput,
        lat_iters,
        spin,
        ..
    } = *set;
    let VncResult {
        qemu_set,
        synth_set,
        load_before,
        load_after,
    } = vnc;
    let screen = qemu_set.screen;
    let frame = screen.w as u64 * screen.h as u64 * 4;
    let qemu = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_default();
    let p50 = |s: &PathStats| percentile(&s.lat_us, 50.0);
    let p99 = |s: &PathStats| percentile(&s.lat_us, 99.0);

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
        "VM               {VM}: TCG guest, booted and idle, VGA text display {}x{}",
        screen.w, screen.h
    );
    println!("paths            direct socket = the RFB client on the VM's VNC unix socket");
    println!("                                 (the VNC server listens on a unix socket, not TCP)");
    println!(
        "                 edgevirt      = websocket ws://127.0.0.1:<port>/console/ws/vnc/default/{VM}?ticket=..."
    );
    println!(
        "                 websockify    = Debian websockify {} --unix-target=<vnc.sock>, ws://127.0.0.1:<port>/",
        websockify_version()
    );
    println!("servers          A. QEMU: {qemu}, the VM's own VNC server");
    println!(
        "                 B. synthetic: an RFB 3.8 server in the benchmark process, bound on the VM's"
    );
    println!(
        "                    vnc.sock path for part B (QEMU's socket moved aside and put back after);"
    );
    println!(
        "                    it answers each request at once, so the paths, not QEMU, set the pace; it also"
    );
    println!(
        "                    listens on 127.0.0.1 TCP (TCP_NODELAY): path \"direct TCP\", part B only"
    );
    println!(
        "client           one RFB client for all paths (Rust, tokio current-thread; TCP_NODELAY; tokio-tungstenite"
    );
    println!(
        "                 offering subprotocol \"binary\"); 32 bpp true colour, Raw; the CPUs are shared by everything"
    );
    println!(
        "method           {rounds} rounds per server, path order rotated; per path and round one connection:"
    );
    println!(
        "                 throughput = {:.1} s of non-incremental full-screen updates ({frame} B of pixels each),",
        tput.as_secs_f64()
    );
    println!(
        "                 request -> whole Raw reply -> next request; then {lat_iters} round trips after {} warm-up:",
        lat_iters.min(200)
    );
    println!(
        "                 non-incremental 1x1 FramebufferUpdateRequest -> the FramebufferUpdate answering it"
    );
    println!(
        "                 A: QEMU answers at once with an ExtendedDesktopSize update (advertised for this part)"
    );
    println!(
        "                    and sends the pixels only at its next display refresh tick (30 ms or more), so the"
    );
    println!(
        "                    round trip is timed to that immediate update; A's throughput is paced by that timer"
    );
    println!("                 B: the 1x1 Raw update");
    let compilers = qemu_set.compilers.max(synth_set.compilers);
    println!(
        "host             {} CPUs; load average {load_before} before the VNC part, {load_after} after (with the busy",
        ncpus()
    );
    println!(
        "                 threads below, if on); rustc seen running during the VNC part: {}",
        if compilers == 0 {
            "none".to_string()
        } else {
            format!("up to {compilers} at once: other work disturbed the figures")
        }
    );
    if spin {
        println!(
            "                 during the VNC part one SCHED_IDLE busy thread per CPU keeps idle CPUs from sleeping, so"
        );
        println!(
            "                 that wake-up latency of idle (virtual) CPUs stays out of the round trips (BENCH_SPIN=0: off)"
        );
    } else {
        println!(
            "                 no busy threads (BENCH_SPIN=0): round trips include wake-up latency of idle CPUs"
        );
    }
    for (set, title) in [
        (
            &qemu_set,
            "A. QEMU VNC server (paced by QEMU's refresh timer)",
        ),
        (
            &synth_set,
            "B. synthetic RFB server (answers at once: the paths set the pace)",
        ),
    ] {
        println!();
        println!("{title}");
        println!(
            "  path             throughput    updates/s   round trip p50   round trip p99   samples"
        );
        for (p, s) in &set.stats {
            println!(
                "  {:<14} {:>8.1} MB/s  {:>10.1}   {:>11.1} µs   {:>11.1} µs   {:>7}",
                p.label(),
                s.mb_s(),
                s.updates as f64 / s.secs,
                p50(s),
                p99(s),
                s.lat_us.len()
            );
        }
        println!(
            "  edgevirt serve used {:.0}% of one core while its path was measured",
            set.serve_cpu_pct
        );
    }
}

/// The ratios against the targets (DESIGN.md "Targets").
fn print_ratios(qemu_set: &SetResult, synth_set: &SetResult) {
    let p50 = |s: &PathStats| percentile(&s.lat_us, 50.0);
    println!();
    println!("Ratios, measured in this run                  A. QEMU   B. synthetic   target");
    let ratio_row = |label: &str,
                     f: &dyn Fn(&SetResult) -> Option<f64>,
                     unit: &str,
                     target: &str,
                     ok: &dyn Fn(f64) -> bool| {
        let (a, b) = (f(qemu_set), f(synth_set));
        let show = |v: Option<f64>| match v {
            Some(v) => format!("{v:.2}{unit}"),
            None => "n/a".to_string(),
        };
        let verdict = if target.is_empty() {
            String::new()
        } else {
            let parts: Vec<String> = [("A", a), ("B", b)]
                .iter()
                .filter_map(|(n, v)| v.map(|v| format!("{n} {}", flag(ok(v)))))
                .collect();
            format!("{target:<8}  {}", parts.join(", "))
        };
        println!("  {label:<42} {:>10} {:>13}   {verdict}", show(a), show(b));
    };
    let tput = |s: &SetResult, num: Via, den: Via| Some(s.get(num)?.mb_s() / s.get(den)?.mb_s());
    let added = |s: &SetResult, q: f64, num: Via, den: Via| {
        Some(percentile(&s.get(num)?.lat_us, q) - percentile(&s.get(den)?.lat_us, q))
    };
    ratio_row(
        "throughput edgevirt / direct TCP",
        &|s| tput(s, Via::Edgevirt, Via::DirectTcp),
        "×",
        "≥ 0.80×",
        &|v| v >= 0.8,
    );
    ratio_row(
        "throughput edgevirt / direct socket",
        &|s| tput(s, Via::Edgevirt, Via::Direct),
        "×",
        "≥ 0.80×",
        &|v| v >= 0.8,
    );
    ratio_row(
        "throughput edgevirt / websockify",
        &|s| tput(s, Via::Edgevirt, Via::Websockify),
        "×",
        "≥ 2.00×",
        &|v| v >= 2.0,
    );
    ratio_row(
        "throughput websockify / direct socket",
        &|s| tput(s, Via::Websockify, Via::Direct),
        "×",
        "",
        &|_| true,
    );
    ratio_row(
        "added p50, edgevirt − direct TCP",
        &|s| added(s, 50.0, Via::Edgevirt, Via::DirectTcp),
        " µs",
        "≤ 20 µs",
        &|v| v <= 20.0,
    );
    ratio_row(
        "added p50, edgevirt − direct socket",
        &|s| added(s, 50.0, Via::Edgevirt, Via::Direct),
        " µs",
        "≤ 20 µs",
        &|v| v <= 20.0,
    );
    ratio_row(
        "added p99, edgevirt − direct socket",
        &|s| added(s, 99.0, Via::Edgevirt, Via::Direct),
        " µs",
        "",
        &|_| true,
    );
    ratio_row(
        "added p50, websockify − direct socket",
        &|s| added(s, 50.0, Via::Websockify, Via::Direct),
        " µs",
        "",
        &|_| true,
    );
    ratio_row(
        "round trip p50 edgevirt / websockify",
        &|s| Some(p50(s.get(Via::Edgevirt)?) / p50(s.get(Via::Websockify)?)),
        "×",
        "",
        &|_| true,
    );
}

fn print_memory(m: &MemoryResult) {
    let MemoryResult {
        rss_trace,
        rss_closed,
        per_conn_slope,
        per_conn_all,
        n_first,
        n_last,
    } = m;
    println!();
    println!(
        "Memory per idle console connection: edgevirt serve VmRSS with consoles open through edgevirt"
    );
    println!(
        "  (own ticket each, RFB handshake done, then idle; to the synthetic server, as QEMU takes 32 clients)"
    );
    let head: Vec<String> = rss_trace.iter().map(|(n, _)| format!("{n:>8}")).collect();
    let vals: Vec<String> = rss_trace.iter().map(|(_, r)| format!("{r:>8}")).collect();
    println!("  open consoles  {}    closed", head.join(""));
    println!("  VmRSS KiB      {} {rss_closed:>8}", vals.join(""));
    println!(
        "  per connection {per_conn_slope:>8.1} KiB  (slope from {n_first} to {n_last} open; from 0: {per_conn_all:.1} KiB)   (no target)"
    );
}

fn print_pages(p: &PagesResult, page_reqs: usize) {
    let PagesResult {
        pages,
        polls,
        weights,
        created,
        took,
        settle,
        stopped,
        rss_pages,
        vm_count,
    } = p;
    let (created, took, settle, stopped) = (*created, *took, *settle, *stopped);
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
    for p in pages {
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
    if let Some(pb) = polls {
        let ratio = |b: usize| b as f64 / pb.full.max(1) as f64;
        println!(
            "  VM list poll (every 2 s), body bytes; baseline = the whole table, as every poll sent before:"
        );
        println!(
            "    whole table (no rows named)          {:>9}   1.000x",
            pb.full
        );
        println!(
            "    nothing changed (HTTP {})            {:>9}   {:.3}x",
            pb.unchanged_status,
            pb.unchanged,
            ratio(pb.unchanged)
        );
        println!(
            "    one VM's labels changed ({:<5})       {:>9}   {:.3}x",
            pb.one_changed_mode,
            pb.one_changed,
            ratio(pb.one_changed)
        );
    }
    println!(
        "  page weight: HTML + its CSS and JS (noVNC, xterm.js excluded)    target gzip <= 150 KB"
    );
    for w in weights {
        println!(
            "    {:<40} {:>2} files {:>8.1} KB raw {:>7.1} KB gzip   {}",
            short(&w.path),
            w.files,
            w.raw as f64 / 1024.0,
            w.gzip as f64 / 1024.0,
            if w.gzip <= 150 * 1024 {
                "met"
            } else {
                "MISSED"
            }
        );
    }
}

/// One busy thread per CPU at the SCHED_IDLE policy, which runs only when nothing else wants
/// the CPU and yields to any waking thread at once: no CPU goes idle, so no round trip pays for
/// waking one (tens of microseconds for the idle virtual CPUs of a VM host), yet the measured
/// processes keep the CPUs they ask for.
struct Spinners {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Spinners {
    fn start() -> Spinners {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..ncpus())
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let p = libc::sched_param { sched_priority: 0 };
                    // SAFETY: plain syscall on the calling thread with a valid sched_param.
                    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &p) } != 0 {
                        return; // never compete with the measured processes
                    }
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Spinners { stop, threads }
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn ncpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// How many processes named `comm` run now.
fn running(comm: &str) -> usize {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == comm))
        .count()
}

/// The 1-minute load average, as text.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
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
