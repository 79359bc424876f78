//! The KubeVirt API benchmark (a benchmark, not a test: it prints figures and only fails when
//! something could not be measured at all).
//!
//!   CARGO_TARGET_DIR=/work/target-bench-api cargo bench --bench api
//!
//! It starts the real `edgevirt serve --role controller` (the optimized build of this
//! workspace: the bench profile has the release settings; no libvirt needed in that role) on
//! a fresh data dir, fills the store with `BENCH_VMS` VMs (runStrategy Halted, so nothing
//! boots) through the API, and measures in one run:
//!
//! 1. The create rate, and the serve process's CPU while idle with the store full (per
//!    second, so the controller's 10 s resync of every VM shows).
//! 2. LIST of the namespace's VMs over loopback HTTP, as JSON (`Accept: application/json`)
//!    and as a `meta.k8s.io/v1` Table (what `kubectl get` asks for), request sent → whole
//!    body read, against the in-process floor: this process opens the same SQLite file
//!    (WAL, so safe while the server runs) with `edgevirt::store::Store` and times
//!    `Store::list` + `serde_json::to_vec` of the same list object built the same way, i.e.
//!    the handler's work minus HTTP. The Table builder (`api::table`) is private, so the
//!    Table LIST is compared to the same JSON floor. For reference, also one 500-item page
//!    (`?limit=500`, kubectl's chunk size), the stored JSON text spliced into a list without
//!    parsing (a raw SELECT), and the floor again with the server paused (SIGSTOP). All but
//!    the last are interleaved (order rotated each iteration) so background work in the
//!    server hits them alike. p50 and p99.
//! 3. Watch fan-out: `BENCH_WATCHERS` concurrent `?watch=true&resourceVersion=<rv>` streams,
//!    then `BENCH_CHANGES` merge patches of one VM's labels, one at a time; per change, the
//!    time from sending the PATCH until the first and the last watcher has read the event,
//!    against the PATCH itself (sent → response read, the write) as the baseline; events
//!    delivered must be watchers × changes.
//! 4. Memory: VmRSS of the serve process empty, after the fill, with the watches open.
//!
//! Target (DESIGN.md "Targets"): LIST of 10,000 VMs ≤ 1.5× an in-process SELECT + serialize.
//! Printed next to the figures, not asserted.
//!
//! Environment: BENCH_VMS (10000), BENCH_CREATE_CONCURRENCY (16), BENCH_LIST_ITERS (30, after
//! BENCH_LIST_WARMUP = 3), BENCH_WATCHERS (100), BENCH_CHANGES (50), BENCH_IDLE_SECS (20: the
//! idle-CPU window, two controller resyncs), BENCH_TMPDIR (/var/tmp, where the data dir
//! goes), BENCH_KEEP_LOGS (a directory to copy serve.log into).
//!
//! `cargo test --all-targets` also runs this binary, without `--bench`: it then does nothing.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use futures::StreamExt;
use reqwest::Method;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde_json::{Value, json};

use edgevirt::store::{FieldSelector, LabelSelector, Store};
use edgevirt::types::Kind;

const NS: &str = "default";
const VMS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";
const JSON_ACCEPT: &str = "application/json";
const TABLE_ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
const PATCHED_VM: &str = "vm-00001";
/// kubectl's default `--chunk-size`: `kubectl get` pages a list in LISTs of this many.
const PAGE: usize = 500;
const REQ_TIMEOUT: Duration = Duration::from_secs(120);
/// How long one change may take to reach every watcher before it counts as missing.
const FANOUT_TIMEOUT: Duration = Duration::from_secs(10);

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<()> {
    // cargo bench passes --bench; cargo test (all targets, in CI) does not: do nothing then.
    if !std::env::args().skip(1).any(|a| a == "--bench") {
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run())
}

// ------------------------------------------------------------------------- the server

/// `edgevirt serve --role controller` on a fresh data dir; stopped (by pid) on drop.
struct Serve {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
    token: String,
}

impl Serve {
    fn start(parent: &Path) -> Result<Serve> {
        let dir = tempfile::Builder::new()
            .prefix("edgevirt-bench-api.")
            .tempdir_in(parent)
            .with_context(|| format!("creating a data dir under {}", parent.display()))?;
        let log = std::fs::File::create(dir.path().join("serve.log"))?;
        let mut child = Command::new(env!("CARGO_BIN_EXE_edgevirt"))
            .args([
                "serve",
                "--role",
                "controller",
                "--listen",
                "127.0.0.1:0",
                "--node-name",
                "bench",
            ])
            .arg("--data-dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting edgevirt serve")?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Keep draining stdout after the URL so the server never blocks on the pipe.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(u) = line.split("serving the API on ").nth(1) {
                    let _ = tx.send(u.trim().to_string());
                }
            }
        });
        let mut serve = Serve {
            child,
            url: String::new(),
            dir,
            token: String::new(),
        };
        serve.url = rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| anyhow!("edgevirt serve printed no URL within 60 s (see serve.log)"))?;
        let file = serve.dir.path().join("initial-admin");
        let deadline = Instant::now() + Duration::from_secs(30);
        serve.token = loop {
            let token = std::fs::read_to_string(&file).ok().and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("token=").map(|t| t.trim().to_string()))
            });
            match token {
                Some(t) if !t.is_empty() => break t,
                _ if Instant::now() > deadline => bail!("no token= line in {}", file.display()),
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        Ok(serve)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid() as i32), sig);
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("edgevirt.db")
    }

    /// VmRSS in KiB.
    fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// User + system CPU time of the whole process (all threads), in seconds.
    fn cpu_secs(&self) -> f64 {
        stat_cpu_secs(
            &std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default(),
        )
    }

    /// CPU seconds per thread: tid -> (thread name, seconds).
    fn thread_cpu(&self) -> HashMap<u32, (String, f64)> {
        let mut out = HashMap::new();
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.pid())) else {
            return out;
        };
        for e in dir.flatten() {
            let Ok(tid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            let name = stat
                .split_once('(')
                .and_then(|(_, r)| r.rsplit_once(')'))
                .map(|(n, _)| n.to_string())
                .unwrap_or_default();
            out.insert(tid, (name, stat_cpu_secs(&stat)));
        }
        out
    }

    fn keep_log(&self) {
        if let Ok(dest) = std::env::var("BENCH_KEEP_LOGS") {
            let _ = std::fs::create_dir_all(&dest);
            let to = Path::new(&dest).join("serve.log");
            match std::fs::copy(self.dir.path().join("serve.log"), &to) {
                Ok(_) => eprintln!("[bench] kept {}", to.display()),
                Err(e) => eprintln!("[bench] could not keep serve.log: {e}"),
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.keep_log();
        // SIGTERM first (graceful; SIGCONT in case it was left paused), SIGKILL if it is
        // still there after 10 s.
        self.signal(nix::sys::signal::Signal::SIGCONT);
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// utime + stime of a `/proc/.../stat` line, in seconds.
fn stat_cpu_secs(stat: &str) -> f64 {
    // Fields after the parenthesised command: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(14) + ticks(15)) as f64 / hz
}

/// CPU share (of one core) per thread name between two [`Serve::thread_cpu`] samples.
fn thread_delta(
    before: &HashMap<u32, (String, f64)>,
    after: &HashMap<u32, (String, f64)>,
    wall: f64,
) -> Vec<(String, f64)> {
    let mut by_name: HashMap<String, f64> = HashMap::new();
    for (tid, (name, secs)) in after {
        let was = before.get(tid).map(|b| b.1).unwrap_or(0.0);
        *by_name.entry(name.clone()).or_default() += (secs - was) / wall;
    }
    let mut v: Vec<_> = by_name.into_iter().filter(|(_, f)| *f >= 0.005).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v
}

// ------------------------------------------------------------------------- the client

#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Api {
    fn req(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{}", self.url, path))
            .bearer_auth(&self.token)
    }
}

/// Send, read the whole body, fail on a non-2xx status.
async fn call(rb: reqwest::RequestBuilder) -> Result<Bytes> {
    let r = rb.send().await?;
    let status = r.status();
    let body = r.bytes().await?;
    if !status.is_success() {
        bail!("{status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(body)
}

fn vm_body(name: &str) -> String {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {
            "memory": {"guest": "64Mi"},
            "firmware": {"kernelBoot": {"container": {"image": "k", "kernelPath": "k"}}},
        }}}},
    })
    .to_string()
}

fn vm_name(i: usize) -> String {
    format!("vm-{i:05}")
}

// ------------------------------------------------------------------------- figures

/// Nearest-rank percentile of a sorted slice, in ms.
fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1].as_secs_f64() * 1e3
}

#[derive(Default)]
struct Series {
    times: Vec<Duration>,
    bytes: usize,
}

impl Series {
    fn sorted(&self) -> Vec<Duration> {
        let mut v = self.times.clone();
        v.sort();
        v
    }
    fn p50(&self) -> f64 {
        pct(&self.sorted(), 50.0)
    }
    fn p99(&self) -> f64 {
        pct(&self.sorted(), 99.0)
    }
}

/// The 1, 5 and 15 minute load averages of the host.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn verdict(r50: f64, r99: f64, target: f64) -> &'static str {
    match (r50 <= target, r99 <= target) {
        (true, true) => "met",
        (true, false) => "p50 met, p99 MISSED",
        (false, true) => "p50 MISSED, p99 met",
        (false, false) => "MISSED",
    }
}

// ------------------------------------------------------------------------- LIST

async fn http_list(api: &Api, path: &str, accept: &str) -> Result<(Duration, Bytes)> {
    let t = Instant::now();
    let body = call(
        api.req(Method::GET, path)
            .header(ACCEPT, accept)
            .timeout(REQ_TIMEOUT),
    )
    .await?;
    Ok((t.elapsed(), body))
}

/// What the LIST handler does for JSON, minus HTTP: read the rows, build the list, serialize.
/// Also returns the time spent in `Store::list`, and in that plus building the list `Value`
/// (`json!` copies the items through `serde_json::to_value`, as the handler's does).
async fn floor_list(store: &Store) -> Result<(Duration, [Duration; 2], Vec<u8>)> {
    let t = Instant::now();
    let (items, rv) = store
        .list(
            Kind::VirtualMachine,
            Some(NS),
            &LabelSelector::default(),
            &FieldSelector::default(),
        )
        .await?;
    let read = t.elapsed();
    let list = json!({
        "apiVersion": Kind::VirtualMachine.api_version(),
        "kind": format!("{}List", Kind::VirtualMachine.name()),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    });
    let built = t.elapsed();
    let body = serde_json::to_vec(&list)?;
    drop((list, items));
    Ok((t.elapsed(), [read, built], body))
}

/// For reference: the rows' stored JSON text spliced into a list, no parse and no
/// re-serialization (what a store returning raw bodies could do).
async fn raw_list(pool: &sqlx::SqlitePool) -> Result<(Duration, Vec<u8>)> {
    let t = Instant::now();
    let mut tx = pool.begin().await?;
    let rv: i64 = sqlx::query_scalar("SELECT value FROM counters WHERE name = 'resourceVersion'")
        .fetch_one(&mut *tx)
        .await?;
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT body FROM objects WHERE kind = 'VirtualMachine' AND namespace = 'default' ORDER BY name",
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let mut body = Vec::with_capacity(rows.iter().map(|r| r.len() + 1).sum::<usize>() + 200);
    body.extend_from_slice(
        format!(
            r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineList","metadata":{{"resourceVersion":"{rv}"}},"items":["#
        )
        .as_bytes(),
    );
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(r.as_bytes());
    }
    body.extend_from_slice(b"]}");
    Ok((t.elapsed(), body))
}

fn count_in(body: &[u8], field: &str) -> usize {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v[field].as_array().map(Vec::len))
        .unwrap_or(0)
}

// ------------------------------------------------------------------------- watch

enum WatchMsg {
    /// A line read by watcher `w`: the change number it carries (label `n`), if any.
    Line {
        w: usize,
        change: Option<u32>,
        at: Instant,
    },
    /// Watcher's stream ended.
    Closed,
}

/// The value of label `n` in a MODIFIED event line, without parsing the whole object.
fn change_of(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?;
    if !s.contains("\"MODIFIED\"") {
        return None;
    }
    let at = s.find("\"n\":\"")? + 5;
    let end = s[at..].find('"')?;
    s[at..at + end].parse().ok()
}

// ------------------------------------------------------------------------- the run

async fn run() -> Result<()> {
    let started = Instant::now();
    let load_start = loadavg();
    let n_vms: usize = env_num("BENCH_VMS", 10_000).max(1);
    let conc: usize = env_num("BENCH_CREATE_CONCURRENCY", 16).max(1);
    let iters: usize = env_num("BENCH_LIST_ITERS", 30).max(1);
    let warmup: usize = env_num("BENCH_LIST_WARMUP", 3);
    let watchers: usize = env_num("BENCH_WATCHERS", 100).max(1);
    let changes: u32 = env_num("BENCH_CHANGES", 50).max(1);
    let idle_secs: f64 = env_num("BENCH_IDLE_SECS", 20.0);
    let parent = PathBuf::from(std::env::var("BENCH_TMPDIR").unwrap_or("/var/tmp".into()));

    let exe = std::fs::canonicalize(env!("CARGO_BIN_EXE_edgevirt"))?;
    let optimized = exe.components().any(|c| c.as_os_str() == "release");
    eprintln!("[bench] edgevirt binary: {}", exe.display());
    if !optimized {
        eprintln!("[bench] WARNING: not a release/bench build; run with `cargo bench`");
    }

    edgevirt::tls::install_crypto_provider();
    let serve = Serve::start(&parent)?;
    eprintln!(
        "[bench] serve pid {} on {} (data dir {})",
        serve.pid(),
        serve.url,
        serve.dir.path().display()
    );
    let api = Api {
        http: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()?,
        url: serve.url.clone(),
        token: serve.token.clone(),
    };
    // Let the server finish starting (namespaces, controller) before the first figure.
    call(api.req(Method::GET, "/readyz")).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_empty = serve.rss_kib();

    // ---- fill
    call(
        api.req(Method::PUT, "/apis/edgevirt.io/v1/images/k/upload")
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(vec![0u8; 4096]),
    )
    .await
    .context("uploading image k")?;
    eprintln!("[bench] creating {n_vms} Halted VMs, {conc} requests at a time");
    let t_fill = Instant::now();
    let mut failed = 0usize;
    let mut first_error = None;
    let mut done = 0usize;
    let mut results = futures::stream::iter(1..=n_vms)
        .map(|i| {
            let api = api.clone();
            async move {
                call(
                    api.req(Method::POST, VMS)
                        .header(CONTENT_TYPE, "application/json")
                        .body(vm_body(&vm_name(i)))
                        .timeout(REQ_TIMEOUT),
                )
                .await
            }
        })
        .buffer_unordered(conc);
    while let Some(r) = results.next().await {
        done += 1;
        if let Err(e) = r {
            failed += 1;
            first_error.get_or_insert_with(|| e.to_string());
        }
        if done.is_multiple_of(1000) {
            eprintln!(
                "[bench]   {done} sent, {:.0}/s",
                done as f64 / t_fill.elapsed().as_secs_f64()
            );
        }
    }
    let fill_took = t_fill.elapsed();
    let created = n_vms - failed;
    if let Some(e) = &first_error {
        eprintln!("[bench] {failed} creates failed; the first: {e}");
    }
    if created == 0 {
        bail!(
            "no VM could be created: {}",
            first_error.unwrap_or_default()
        );
    }

    // The in-process floor's store: the same file, opened while the server runs (WAL).
    let store = Store::open(&serve.db())
        .await
        .context("opening the server's database in-process")?;

    // ---- settle: the controller writes each VM's status (printableStatus Stopped)
    eprintln!("[bench] waiting for the controller to set every VM's status");
    let t_settle = Instant::now();
    let mut last_rv = 0;
    let stopped = loop {
        let (items, rv) = store
            .list(
                Kind::VirtualMachine,
                Some(NS),
                &LabelSelector::default(),
                &FieldSelector::default(),
            )
            .await?;
        let stopped = items
            .iter()
            .filter(|o| o["status"]["printableStatus"] == "Stopped")
            .count();
        if (stopped >= created && rv == last_rv) || t_settle.elapsed() > Duration::from_secs(600) {
            break stopped;
        }
        last_rv = rv;
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let settle_took = t_settle.elapsed();
    if stopped < created {
        eprintln!("[bench] WARNING: only {stopped} of {created} VMs reached Stopped");
    }
    // The controller still reconciles the backlog of creation events after the last status
    // write (without writing): wait for a quiet second so the idle window shows the steady
    // state (at most 120 s).
    let t_quiet = Instant::now();
    let mut cpu_prev = serve.cpu_secs();
    while t_quiet.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = serve.cpu_secs();
        if now - cpu_prev < 0.1 {
            break;
        }
        cpu_prev = now;
    }
    let quiet_took = t_quiet.elapsed();
    let rss_filled = serve.rss_kib();

    // ---- idle CPU with the store full (the controller resyncs every 10 s)
    eprintln!("[bench] idle CPU over {idle_secs:.0} s");
    let rv0 = store.current_rv().await?;
    let cpu0 = serve.cpu_secs();
    let threads0 = serve.thread_cpu();
    let t_idle = Instant::now();
    let mut idle_per_sec = Vec::new();
    let mut prev = cpu0;
    while t_idle.elapsed().as_secs_f64() + 1.0 <= idle_secs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = serve.cpu_secs();
        idle_per_sec.push(now - prev);
        prev = now;
    }
    let rest = idle_secs - t_idle.elapsed().as_secs_f64();
    if rest > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(rest)).await;
    }
    let idle_wall = t_idle.elapsed().as_secs_f64();
    let idle_cpu = (serve.cpu_secs() - cpu0) / idle_wall;
    let idle_threads = thread_delta(&threads0, &serve.thread_cpu(), idle_wall);
    let idle_writes = store.current_rv().await? - rv0;
    let rss_idle = serve.rss_kib();

    // ---- LIST
    eprintln!(
        "[bench] LIST: {warmup} warm-up + {iters} timed, floor / JSON / Table / one page / raw interleaved"
    );
    let page_path = format!("{VMS}?limit={PAGE}");
    let raw_pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(serve.db())
                .read_only(true),
        )
        .await?;
    let mut series: [Series; 5] = Default::default();
    let (mut floor_read, mut floor_built) = (Series::default(), Series::default());
    let mut counts = [0usize; 5];
    let mut cpu_lists = 0.0;
    for i in 0..warmup + iters {
        for step in 0..5 {
            let which = (i + step) % 5;
            let cpu_before = serve.cpu_secs();
            let (d, body) = match which {
                0 => {
                    let (d, [read, built], b) = floor_list(&store).await?;
                    if i >= warmup {
                        floor_read.times.push(read);
                        floor_built.times.push(built - read);
                    }
                    (d, Bytes::from(b))
                }
                1 => http_list(&api, VMS, JSON_ACCEPT).await?,
                2 => http_list(&api, VMS, TABLE_ACCEPT).await?,
                3 => http_list(&api, &page_path, JSON_ACCEPT).await?,
                _ => raw_list(&raw_pool)
                    .await
                    .map(|(d, b)| (d, Bytes::from(b)))?,
            };
            if i < warmup {
                if i == 0 {
                    counts[which] = count_in(&body, if which == 2 { "rows" } else { "items" });
                }
                continue;
            }
            if (1..=3).contains(&which) {
                cpu_lists += serve.cpu_secs() - cpu_before;
            }
            series[which].times.push(d);
            series[which].bytes = body.len();
        }
    }
    raw_pool.close().await;
    let [floor, js, table, page, raw] = series;
    let [floor_items, json_items, table_rows, page_items, raw_items] = counts;
    // Server CPU per HTTP LIST (the floor runs in this process, not in serve); includes the
    // controller's resync running meanwhile.
    let serve_cpu_per_list_ms = cpu_lists * 1e3 / (3 * iters) as f64;

    // For reference only: the floor with the server paused (SIGSTOP), i.e. without the
    // controller's background work competing for the cores.
    eprintln!("[bench] floor with serve paused: {iters} timed");
    let mut quiet = Series::default();
    serve.signal(nix::sys::signal::Signal::SIGSTOP);
    let quiet_result: Result<()> = async {
        floor_list(&store).await?;
        for _ in 0..iters {
            let (d, _, b) = floor_list(&store).await?;
            quiet.times.push(d);
            quiet.bytes = b.len();
        }
        Ok(())
    }
    .await;
    serve.signal(nix::sys::signal::Signal::SIGCONT);
    quiet_result?;

    // ---- watch fan-out
    eprintln!("[bench] opening {watchers} watches");
    let rss_before_watch = serve.rss_kib();
    let listed = call(api.req(Method::GET, &format!("{VMS}?limit=1"))).await?;
    let rv: String = serde_json::from_slice::<Value>(&listed)?["metadata"]["resourceVersion"]
        .as_str()
        .ok_or_else(|| anyhow!("the list has no metadata.resourceVersion"))?
        .to_string();
    let path = format!("{VMS}?watch=true&resourceVersion={rv}&timeoutSeconds=900");
    let t_open = Instant::now();
    let responses = futures::future::join_all((0..watchers).map(|_| {
        api.req(Method::GET, &path)
            .header(ACCEPT, JSON_ACCEPT)
            .send()
    }))
    .await;
    let open_took = t_open.elapsed();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<WatchMsg>();
    let mut tasks = Vec::new();
    for (w, r) in responses.into_iter().enumerate() {
        let r = r.with_context(|| format!("opening watch {w}"))?;
        if !r.status().is_success() {
            bail!("watch {w}: {}", r.status());
        }
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = r.bytes_stream();
            let mut buf: Vec<u8> = Vec::new();
            while let Some(Ok(chunk)) = stream.next().await {
                buf.extend_from_slice(&chunk);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let at = Instant::now();
                    let change = change_of(&buf[..pos]);
                    buf.drain(..=pos);
                    let _ = tx.send(WatchMsg::Line { w, change, at });
                }
            }
            let _ = tx.send(WatchMsg::Closed);
        }));
    }
    drop(tx);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_watch_open = serve.rss_kib();

    eprintln!("[bench] {changes} merge patches of {PATCHED_VM}, one at a time");
    let mut write = Series::default();
    let mut first = Series::default();
    let mut last = Series::default();
    let mut delivered: HashSet<(usize, u32)> = HashSet::new();
    let (mut other_lines, mut closed, mut incomplete) = (0usize, 0usize, 0u32);
    let cpu_watch0 = serve.cpu_secs();
    let handle = |m: WatchMsg,
                  delivered: &mut HashSet<(usize, u32)>,
                  other: &mut usize,
                  closed: &mut usize|
     -> Option<(u32, Instant)> {
        match m {
            WatchMsg::Line {
                w,
                change: Some(c),
                at,
            } => delivered.insert((w, c)).then_some((c, at)),
            WatchMsg::Line { change: None, .. } => {
                *other += 1;
                None
            }
            WatchMsg::Closed => {
                *closed += 1;
                None
            }
        }
    };
    for c in 1..=changes {
        let t0 = Instant::now();
        call(
            api.req(Method::PATCH, &format!("{VMS}/{PATCHED_VM}"))
                .header(CONTENT_TYPE, "application/merge-patch+json")
                .body(json!({"metadata": {"labels": {"n": c.to_string()}}}).to_string())
                .timeout(REQ_TIMEOUT),
        )
        .await
        .with_context(|| format!("PATCH {c}"))?;
        write.times.push(t0.elapsed());
        let (mut got, mut t_first, mut t_last) = (0usize, None, None);
        let deadline = tokio::time::Instant::from_std(t0 + FANOUT_TIMEOUT);
        while got < watchers {
            let Ok(Some(m)) = tokio::time::timeout_at(deadline, rx.recv()).await else {
                break;
            };
            if let Some((mc, at)) = handle(m, &mut delivered, &mut other_lines, &mut closed)
                && mc == c
            {
                got += 1;
                t_first.get_or_insert(at);
                t_last = Some(at);
            }
        }
        match (t_first, t_last) {
            (Some(f), Some(l)) if got == watchers => {
                first.times.push(f - t0);
                last.times.push(l - t0);
            }
            _ => incomplete += 1,
        }
    }
    let serve_cpu_per_change_ms = (serve.cpu_secs() - cpu_watch0) * 1e3 / changes as f64;
    // Late arrivals still count as delivered.
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
        handle(m, &mut delivered, &mut other_lines, &mut closed);
    }
    let rss_watch_after = serve.rss_kib();
    for t in &tasks {
        t.abort();
    }
    let expected = watchers * changes as usize;
    let got_events = delivered.len();

    let total = started.elapsed();

    // ---- results
    let r50 = |s: &Series| s.p50() / floor.p50();
    let r99 = |s: &Series| s.p99() / floor.p99();
    println!();
    println!("== edgevirt API benchmark ==");
    println!(
        "serve: {} ({}), role controller, pid {}; data dir under {} (SQLite WAL, synchronous=FULL)",
        exe.display(),
        if optimized {
            "optimized"
        } else {
            "NOT optimized"
        },
        serve.pid(),
        parent.display()
    );
    println!(
        "store: {created} VMs in namespace {NS} (runStrategy Halted), created through the API in {:.1} s = {:.0}/s ({conc} concurrent POSTs, {failed} failed); controller set all statuses {:.1} s later ({stopped} Stopped) and was quiet {:.1} s after that",
        fill_took.as_secs_f64(),
        created as f64 / fill_took.as_secs_f64(),
        settle_took.as_secs_f64(),
        quiet_took.as_secs_f64()
    );
    println!(
        "serve idle with {created} VMs: {:.0}% of one core over {:.0} s, {idle_writes} writes (the controller resyncs every VM every 10 s); by thread: {}",
        idle_cpu * 100.0,
        idle_wall,
        idle_threads
            .iter()
            .map(|(n, f)| format!("{n} {:.0}%", f * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
            + if idle_threads.is_empty() {
                "(none)"
            } else {
                ""
            }
    );
    println!(
        "  serve CPU each second of that window, % of one core: {}",
        idle_per_sec
            .iter()
            .map(|c| format!("{:.0}", c * 100.0))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!();
    println!(
        "LIST {VMS} ({iters} timed each after {warmup} warm-up, interleaved; client-side, loopback HTTP/1.1, request sent -> whole body read)"
    );
    println!(
        "  {:<44} {:>9} {:>9} {:>11} {:>7}  {:>6} {:>6}   target",
        "", "p50 ms", "p99 ms", "bytes", "items", "x p50", "x p99"
    );
    println!(
        "  {:<44} {:>9.2} {:>9.2} {:>11} {:>7}  {:>6} {:>6}   (baseline)",
        "in-process floor: Store::list + to_vec",
        floor.p50(),
        floor.p99(),
        floor.bytes,
        floor_items,
        "1.00",
        "1.00"
    );
    for (label, s, n, target) in [
        ("HTTP LIST as JSON", &js, json_items, true),
        (
            "HTTP LIST as Table (vs the JSON floor*)",
            &table,
            table_rows,
            true,
        ),
        (
            "HTTP LIST ?limit=500, one kubectl page",
            &page,
            page_items,
            false,
        ),
    ] {
        println!(
            "  {:<44} {:>9.2} {:>9.2} {:>11} {:>7}  {:>6.2} {:>6.2}   {}",
            label,
            s.p50(),
            s.p99(),
            s.bytes,
            n,
            r50(s),
            r99(s),
            if target {
                format!("<= 1.5x floor: {}", verdict(r50(s), r99(s), 1.5))
            } else {
                "(no target; x the full-list floor)".to_string()
            }
        );
    }
    println!(
        "  {:<44} {:>9.2} {:>9.2} {:>11} {:>7}  {:>6.2} {:>6.2}   (reference: HTTP JSON LIST is {:.2}x / {:.2}x this)",
        "raw SELECT body + splice, no JSON parse",
        raw.p50(),
        raw.p99(),
        raw.bytes,
        raw_items,
        raw.p50() / floor.p50(),
        raw.p99() / floor.p99(),
        js.p50() / raw.p50(),
        js.p99() / raw.p99()
    );
    println!(
        "  {:<44} {:>9.2} {:>9.2} {:>11} {:>7}  {:>6.2} {:>6.2}   (reference: the floor without serve's background work)",
        "floor again, serve paused (SIGSTOP)",
        quiet.p50(),
        quiet.p99(),
        quiet.bytes,
        floor_items,
        quiet.p50() / floor.p50(),
        quiet.p99() / floor.p99()
    );
    println!(
        "  floor breakdown, p50: Store::list (SELECT + parse every body into a Value) {:.2} ms; json!{{.., \"items\": items}} (a deep copy via to_value) {:.2} ms; to_vec + drop, the rest, {:.2} ms",
        floor_read.p50(),
        floor_built.p50(),
        floor.p50() - floor_read.p50() - floor_built.p50()
    );
    println!(
        "  serve CPU per HTTP LIST: {serve_cpu_per_list_ms:.1} ms (average of the three HTTP rows; includes the controller's resync running meanwhile)"
    );
    println!(
        "  p99 = nearest rank of {iters} samples (the max below 100); a full `kubectl get` pages {} LISTs of {PAGE}",
        created.div_ceil(PAGE)
    );
    println!(
        "  * api::table is private, so there is no in-process Table floor; the Table LIST is compared to the JSON floor."
    );
    if floor_items != created
        || json_items != created
        || table_rows != created
        || page_items != PAGE.min(created)
        || raw_items != created
    {
        println!(
            "  WARNING: unexpected item counts (floor {floor_items}, JSON {json_items}, Table {table_rows}, raw {raw_items} of {created}; page {page_items} of {PAGE})"
        );
    }
    println!();
    println!(
        "Watch fan-out: {watchers} watches (?watch=true&resourceVersion=<rv>, opened together in {:.0} ms), {changes} merge patches of {PATCHED_VM}'s labels one at a time",
        open_took.as_secs_f64() * 1e3
    );
    println!(
        "  {:<52} {:>9} {:>9}  {:>6} {:>6}",
        "", "p50 ms", "p99 ms", "x p50", "x p99"
    );
    println!(
        "  {:<52} {:>9.2} {:>9.2}  {:>6} {:>6}",
        "write: PATCH sent -> response read (baseline)",
        write.p50(),
        write.p99(),
        "1.00",
        "1.00"
    );
    for (label, s) in [
        ("PATCH sent -> first watcher read the event", &first),
        ("PATCH sent -> all watchers read the event", &last),
    ] {
        println!(
            "  {:<52} {:>9.2} {:>9.2}  {:>6.2} {:>6.2}",
            label,
            s.p50(),
            s.p99(),
            s.p50() / write.p50(),
            s.p99() / write.p99()
        );
    }
    println!(
        "  events delivered: {got_events} of {expected} ({} missing); changes not at every watcher within {} s: {incomplete}; other lines: {other_lines}; streams closed early: {closed}",
        expected.saturating_sub(got_events),
        FANOUT_TIMEOUT.as_secs()
    );
    println!(
        "  serve CPU per change (write + {watchers} deliveries): {serve_cpu_per_change_ms:.1} ms   (no target stated for fan-out)"
    );
    println!();
    println!("Memory (serve VmRSS)");
    let per_vm = rss_filled.saturating_sub(rss_empty) as f64 / created as f64;
    let per_watch = (rss_watch_open as f64 - rss_before_watch as f64) / watchers as f64;
    for (label, kib, note) in [
        ("started, empty store".to_string(), rss_empty, String::new()),
        (
            format!("after {created} VMs, statuses set"),
            rss_filled,
            format!("  (+{per_vm:.1} KiB per VM)"),
        ),
        (
            format!("after {idle_secs:.0} s idle"),
            rss_idle,
            String::new(),
        ),
        (
            "after the LISTs".to_string(),
            rss_before_watch,
            String::new(),
        ),
        (
            format!("{watchers} watches open"),
            rss_watch_open,
            if per_watch >= 0.0 {
                format!("  (+{per_watch:.1} KiB per watch)")
            } else {
                "  (less than before: the allocator returned freed LIST memory meanwhile)".into()
            },
        ),
        (
            format!("{watchers} watches, after the {changes} changes"),
            rss_watch_after,
            String::new(),
        ),
    ] {
        println!("  {label:<40} {:>8.1} MiB{note}", mib(kib));
    }
    println!();
    println!(
        "whole run: {:.1} s; host load average at start {load_start}, at end {}",
        total.as_secs_f64(),
        loadavg()
    );

    drop(store);
    drop(serve);
    Ok(())
}
