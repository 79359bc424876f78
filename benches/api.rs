//! The KubeVirt API benchmark (a benchmark, not a test: it prints figures and only fails when
//! something could not be measured at all).
//!
//!   CARGO_TARGET_DIR=/work/target-bench-api cargo bench --bench api
//!
//! It starts the real `edgevirt serve --role controller` (the build of this workspace the
//! bench target was built with; no libvirt needed in that role) on a fresh data dir, fills the
//! store with `BENCH_VMS` VMs in `default` and `BENCH_WATCH_VMS` in `fan` (runStrategy Halted,
//! so nothing boots) through the API, and measures in one run:
//!
//! 1. The create rate; the serve process's CPU while idle with the store full; and the
//!    controller's periodic resync (`controller::resync_keys`) run in this process against
//!    the same store: objects queued and write transactions (`Store::writes`).
//! 2. LIST of `default`'s VMs over loopback HTTP, as JSON and as a Table, request sent →
//!    whole body read, against the floor: a raw SQLite `SELECT body` of the same rows spliced
//!    into a list (no parse). Also one 500-item page (`?limit=500`, kubectl's chunk size)
//!    and the old path in-process (`Store::list` + `json!` + `to_vec`, what the handler did
//!    before the stored JSON was passed through). All interleaved, order rotated each
//!    iteration. With `EDGEVIRT_BASELINE_BIN`, the baseline build is started on a copy of the
//!    database first and its JSON LIST and page are timed the same way ("before").
//! 3. LIST storm: `BENCH_STORM` concurrent JSON LISTs of `default`; statuses, serve's peak
//!    RSS, and its RSS `BENCH_SETTLE_SECS` later against before.
//! 4. Watch fan-out: `BENCH_WATCHERS` concurrent `?watch=true` streams of `fan` without a
//!    resourceVersion (each starts from a full listing), opened together: time until every
//!    response head and every whole listing arrived, statuses; then `BENCH_CHANGES` merge
//!    patches of one VM's labels, one at a time; per change, PATCH sent → the first and the
//!    last watcher read the event, against the PATCH itself; events delivered must be
//!    watchers × changes; serve's peak RSS against its idle RSS.
//! 5. Memory: VmRSS of the serve process along the way.
//!
//! Targets (DESIGN.md "Targets", issue 16): JSON LIST ≤ 1.5× the floor and ≤ 0.3× before; a
//! page ≤ 0.1× a full LIST; an idle resync makes zero writes; RSS a minute after the storm
//! ≤ 2× before it; every watch connected and listed within 10 s, no 5xx, every event to every
//! watcher, RSS ≤ 4× idle. Printed next to the figures, never asserted.
//!
//! Environment: BENCH_VMS (10000), BENCH_WATCH_VMS (2000), BENCH_CREATE_CONCURRENCY (16),
//! BENCH_LIST_ITERS (30, after BENCH_LIST_WARMUP = 3), BENCH_STORM (100), BENCH_SETTLE_SECS
//! (60), BENCH_WATCHERS (200), BENCH_CHANGES (50), BENCH_IDLE_SECS (20), BENCH_TMPDIR
//! (/var/tmp, where the data dirs go), BENCH_KEEP_LOGS (a directory to copy serve.log into),
//! EDGEVIRT_BASELINE_BIN (a build of the baseline, for "before").
//!
//! `cargo test --all-targets` also runs this binary, without `--bench`: it then does nothing.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
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
/// The namespace the watchers list and follow.
const WATCH_NS: &str = "fan";
const WATCH_VMS: &str = "/apis/kubevirt.io/v1/namespaces/fan/virtualmachines";
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
        Serve::start_in(testkit::exe(), dir, None)
    }

    /// `bin` on the data dir `dir` (which may hold a database already: then `token`, an
    /// administrator's token in it, since no initial-admin file is written). The test kit
    /// starts it and waits for /healthz; the bench keeps the process.
    fn start_in(bin: &Path, dir: tempfile::TempDir, token: Option<String>) -> Result<Serve> {
        let mut cmd = testkit::serve::command(bin, dir.path());
        cmd.args(["--role", "controller", "--listen", "127.0.0.1:0"])
            .args(["--node-name", "bench"]);
        let mut started = testkit::serve::start(cmd, dir.path());
        let token = token.unwrap_or_else(|| started.initial("token"));
        Ok(Serve {
            child: started.child.take().expect("serve runs"),
            url: started.url.clone(),
            dir,
            token,
        })
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
        self.status_kib("VmRSS:")
    }

    /// The peak RSS since [`Serve::reset_peak`] (VmHWM), in KiB.
    fn peak_kib(&self) -> u64 {
        self.status_kib("VmHWM:")
    }

    /// Start a new peak RSS window (`/proc/PID/clear_refs`, 5).
    fn reset_peak(&self) {
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.pid()), "5");
    }

    fn status_kib(&self, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix(field))
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
    testkit::Vm::halted(name, "k").label("app", "bench").body()
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

/// What the LIST handler did for JSON before the stored JSON was passed through, minus HTTP:
/// read and parse the rows, build the list, serialize.
/// Also returns the time spent in `Store::list`, and in that plus building the list `Value`
/// (`json!` copies the items through `serde_json::to_value`, as the handler's does).
async fn old_path_list(store: &Store) -> Result<(Duration, [Duration; 2], Vec<u8>)> {
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

/// The floor: the rows' stored JSON text from a raw SELECT spliced into a list, no parse and
/// no re-serialization.
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

/// The LIST figures of the baseline build.
struct Before {
    bin: PathBuf,
    list: Series,
    page: Series,
    items: usize,
}

/// Start the baseline build on a copy of serve's database (`VACUUM INTO`, consistent while
/// serve runs) and time its JSON LIST and one page; it is stopped before returning.
async fn measure_before(
    bin: &Path,
    serve: &Serve,
    parent: &Path,
    warmup: usize,
    iters: usize,
) -> Result<Before> {
    let dir = tempfile::Builder::new()
        .prefix("edgevirt-bench-api-before.")
        .tempdir_in(parent)?;
    let copy = dir.path().join("edgevirt.db");
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(sqlx::sqlite::SqliteConnectOptions::new().filename(serve.db()))
        .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "VACUUM INTO '{}'",
        copy.display().to_string().replace('\'', "''")
    )))
    .execute(&pool)
    .await?;
    pool.close().await;
    eprintln!(
        "[bench] before: {} on a copy of the database",
        bin.display()
    );
    let old = Serve::start_in(bin, dir, Some(serve.token.clone()))?;
    let api = Api {
        http: reqwest::Client::builder().build()?,
        url: old.url.clone(),
        token: old.token.clone(),
    };
    call(api.req(Method::GET, "/readyz")).await?;
    let page_path = format!("{VMS}?limit={PAGE}");
    let (mut list, mut page, mut items) = (Series::default(), Series::default(), 0);
    for i in 0..warmup + iters {
        let (d, body) = http_list(&api, VMS, JSON_ACCEPT).await?;
        let (dp, _) = http_list(&api, &page_path, JSON_ACCEPT).await?;
        if i == 0 {
            items = count_in(&body, "items");
        }
        if i >= warmup {
            list.times.push(d);
            page.times.push(dp);
        }
    }
    drop(old);
    Ok(Before {
        bin: bin.to_path_buf(),
        list,
        page,
        items,
    })
}

fn count_in(body: &[u8], field: &str) -> usize {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v[field].as_array().map(Vec::len))
        .unwrap_or(0)
}

// ------------------------------------------------------------------------- watch

enum WatchMsg {
    /// Watcher read its `added`th ADDED event (of the initial listing).
    Added { added: usize },
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
    let watchers: usize = env_num("BENCH_WATCHERS", 200).max(1);
    let watch_vms: usize = env_num("BENCH_WATCH_VMS", 2000).max(1);
    let storm: usize = env_num("BENCH_STORM", 100).max(1);
    let settle_secs: f64 = env_num("BENCH_SETTLE_SECS", 60.0);
    let baseline_bin = std::env::var_os("EDGEVIRT_BASELINE_BIN").map(PathBuf::from);
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

    // The watched namespace: BENCH_WATCH_VMS more VMs, which the watchers list and follow.
    call(
        api.req(Method::POST, "/api/v1/namespaces")
            .header(CONTENT_TYPE, "application/json")
            .body(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WATCH_NS}})
                    .to_string(),
            ),
    )
    .await
    .context("creating the watched namespace")?;
    eprintln!("[bench] creating {watch_vms} VMs in namespace {WATCH_NS}");
    let watch_failed = futures::stream::iter(1..=watch_vms)
        .map(|i| {
            let api = api.clone();
            async move {
                call(
                    api.req(Method::POST, WATCH_VMS)
                        .header(CONTENT_TYPE, "application/json")
                        .body(vm_body(&vm_name(i)))
                        .timeout(REQ_TIMEOUT),
                )
                .await
            }
        })
        .buffer_unordered(conc)
        .filter(|r| std::future::ready(r.is_err()))
        .count()
        .await;
    let watch_created = watch_vms - watch_failed;

    // The in-process store: the same file, opened while the server runs (WAL).
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
                None,
                &LabelSelector::default(),
                &FieldSelector::default(),
            )
            .await?;
        let stopped = items
            .iter()
            .filter(|o| o["status"]["printableStatus"] == "Stopped")
            .count();
        drop(items);
        if (stopped >= created + watch_created && rv == last_rv)
            || t_settle.elapsed() > Duration::from_secs(600)
        {
            break stopped;
        }
        last_rv = rv;
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let settle_took = t_settle.elapsed();
    if stopped < created + watch_created {
        eprintln!(
            "[bench] WARNING: only {stopped} of {} VMs reached Stopped",
            created + watch_created
        );
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
    // The controller's periodic resync, run in this process against the same (idle) store:
    // which objects it would reconcile and how many writes it makes (the store counts every
    // use of its writer connection, empty transactions included).
    let w0 = store.writes();
    let t_resync = Instant::now();
    let resync_queued = edgevirt::controller::resync_keys(&store).await.len();
    let resync_took = t_resync.elapsed();
    let resync_writes = store.writes() - w0;

    // The LIST before this change, measured now: the baseline build serving a copy of the
    // same database (then stopped, so its own resync does not disturb what follows).
    let before = match &baseline_bin {
        Some(bin) => Some(measure_before(bin, &serve, &parent, warmup, iters).await?),
        None => None,
    };

    // ---- LIST
    eprintln!(
        "[bench] LIST: {warmup} warm-up + {iters} timed, old path / JSON / Table / one page / raw floor interleaved"
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
    let (mut old_read, mut old_built) = (Series::default(), Series::default());
    let mut counts = [0usize; 5];
    let mut cpu_lists = 0.0;
    for i in 0..warmup + iters {
        for step in 0..5 {
            let which = (i + step) % 5;
            let cpu_before = serve.cpu_secs();
            let (d, body) = match which {
                0 => {
                    let (d, [read, built], b) = old_path_list(&store).await?;
                    if i >= warmup {
                        old_read.times.push(read);
                        old_built.times.push(built - read);
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
    let [old, js, table, page, raw] = series;
    let [old_items, json_items, table_rows, page_items, raw_items] = counts;
    // Server CPU per HTTP LIST (the in-process rows run in this process, not in serve);
    // includes the controller's resync running meanwhile.
    let serve_cpu_per_list_ms = cpu_lists * 1e3 / (3 * iters) as f64;

    // ---- LIST storm: concurrent full LISTs, then serve's RSS a while later
    eprintln!("[bench] {storm} concurrent LISTs of {created} VMs");
    let rss_before_storm = serve.rss_kib();
    serve.reset_peak();
    let t_storm = Instant::now();
    let storm_results = futures::future::join_all((0..storm).map(|_| {
        let api = api.clone();
        async move {
            let t = Instant::now();
            match api
                .req(Method::GET, VMS)
                .header(ACCEPT, JSON_ACCEPT)
                .timeout(Duration::from_secs(300))
                .send()
                .await
            {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let items = r.bytes().await.map(|b| count_in(&b, "items")).unwrap_or(0);
                    (status, items, t.elapsed())
                }
                Err(_) => (0, 0, t.elapsed()),
            }
        }
    }))
    .await;
    let storm_took = t_storm.elapsed();
    let storm_peak = serve.peak_kib();
    let storm_full = storm_results
        .iter()
        .filter(|(s, n, _)| *s == 200 && *n == created)
        .count();
    let storm_429 = storm_results.iter().filter(|(s, _, _)| *s == 429).count();
    let storm_5xx = storm_results.iter().filter(|(s, _, _)| *s >= 500).count();
    let storm_failed = storm_results.iter().filter(|(s, _, _)| *s == 0).count();
    let storm_times = Series {
        times: storm_results.iter().map(|r| r.2).collect(),
        ..Default::default()
    };
    eprintln!("[bench] waiting {settle_secs:.0} s after the storm");
    tokio::time::sleep(Duration::from_secs_f64(settle_secs)).await;
    let rss_after_storm = serve.rss_kib();

    // ---- watch fan-out from a full listing
    eprintln!("[bench] opening {watchers} watches from a full listing of {WATCH_NS}");
    let rss_before_watch = serve.rss_kib();
    serve.reset_peak();
    let path = format!("{WATCH_VMS}?watch=true&timeoutSeconds=900");
    let t_open = Instant::now();
    let responses = futures::future::join_all((0..watchers).map(|_| {
        api.req(Method::GET, &path)
            .header(ACCEPT, JSON_ACCEPT)
            .send()
    }))
    .await;
    let headers_took = t_open.elapsed();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<WatchMsg>();
    let mut tasks = Vec::new();
    let (mut watch_5xx, mut watch_429, mut watch_other) = (0usize, 0usize, 0usize);
    let mut open = 0usize;
    for (w, r) in responses.into_iter().enumerate() {
        let r = match r {
            Ok(r) if r.status().is_success() => r,
            Ok(r) if r.status().as_u16() == 429 => {
                watch_429 += 1;
                continue;
            }
            Ok(r) if r.status().is_server_error() => {
                watch_5xx += 1;
                continue;
            }
            _ => {
                watch_other += 1;
                continue;
            }
        };
        open += 1;
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = r.bytes_stream();
            let mut buf: Vec<u8> = Vec::new();
            let mut added = 0usize;
            while let Some(Ok(chunk)) = stream.next().await {
                buf.extend_from_slice(&chunk);
                let mut from = 0;
                while let Some(pos) = buf[from..].iter().position(|b| *b == b'\n') {
                    let line = &buf[from..from + pos];
                    from += pos + 1;
                    if line.ends_with(b"\"type\":\"ADDED\"}") {
                        added += 1;
                        let _ = tx.send(WatchMsg::Added { added });
                        continue;
                    }
                    let at = Instant::now();
                    let change = change_of(line);
                    let _ = tx.send(WatchMsg::Line { w, change, at });
                }
                buf.drain(..from);
            }
            let _ = tx.send(WatchMsg::Closed);
        }));
    }
    drop(tx);
    let mut delivered: HashSet<(usize, u32)> = HashSet::new();
    let (mut other_lines, mut closed, mut incomplete) = (0usize, 0usize, 0u32);
    let handle = |m: WatchMsg,
                  delivered: &mut HashSet<(usize, u32)>,
                  other: &mut usize,
                  closed: &mut usize,
                  listed: &mut usize|
     -> Option<(u32, Instant)> {
        match m {
            WatchMsg::Added { added } => {
                if added == watch_created {
                    *listed += 1;
                }
                None
            }
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
    // Every watcher has its whole initial listing.
    let mut listed = 0usize;
    let deadline = tokio::time::Instant::from_std(t_open + Duration::from_secs(300));
    while listed < open {
        let Ok(Some(m)) = tokio::time::timeout_at(deadline, rx.recv()).await else {
            break;
        };
        handle(
            m,
            &mut delivered,
            &mut other_lines,
            &mut closed,
            &mut listed,
        );
    }
    let listed_took = t_open.elapsed();
    let rss_watch_open = serve.rss_kib();

    eprintln!("[bench] {changes} merge patches of {WATCH_NS}/{PATCHED_VM}, one at a time");
    let mut write = Series::default();
    let mut first = Series::default();
    let mut last = Series::default();
    let cpu_watch0 = serve.cpu_secs();
    for c in 1..=changes {
        let t0 = Instant::now();
        call(
            api.req(Method::PATCH, &format!("{WATCH_VMS}/{PATCHED_VM}"))
                .header(CONTENT_TYPE, "application/merge-patch+json")
                .body(json!({"metadata": {"labels": {"n": c.to_string()}}}).to_string())
                .timeout(REQ_TIMEOUT),
        )
        .await
        .with_context(|| format!("PATCH {c}"))?;
        write.times.push(t0.elapsed());
        let (mut got, mut t_first, mut t_last) = (0usize, None, None);
        let deadline = tokio::time::Instant::from_std(t0 + FANOUT_TIMEOUT);
        while got < open {
            let Ok(Some(m)) = tokio::time::timeout_at(deadline, rx.recv()).await else {
                break;
            };
            if let Some((mc, at)) = handle(
                m,
                &mut delivered,
                &mut other_lines,
                &mut closed,
                &mut listed,
            ) && mc == c
            {
                got += 1;
                t_first.get_or_insert(at);
                t_last = Some(at);
            }
        }
        match (t_first, t_last) {
            (Some(f), Some(l)) if got == open => {
                first.times.push(f - t0);
                last.times.push(l - t0);
            }
            _ => incomplete += 1,
        }
    }
    let serve_cpu_per_change_ms = (serve.cpu_secs() - cpu_watch0) * 1e3 / changes as f64;
    // Late arrivals still count as delivered.
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
        handle(
            m,
            &mut delivered,
            &mut other_lines,
            &mut closed,
            &mut listed,
        );
    }
    let rss_watch_after = serve.rss_kib();
    let watch_peak = serve.peak_kib();
    for t in &tasks {
        t.abort();
    }
    let expected = watchers * changes as usize;
    let got_events = delivered.len();

    let total = started.elapsed();

    // ---- results
    let r50 = |s: &Series| s.p50() / raw.p50();
    let r99 = |s: &Series| s.p99() / raw.p99();
    println!();
    println!("== edgevirt API benchmark ==");
    println!(
        "serve: {} ({}), role controller, pid {}; data dir under {} (SQLite WAL, synchronous=FULL)",
        exe.display(),
        if optimized {
            "optimized"
        } else {
            "NOT optimized: a debug build; ratios between paths of the same build are what count"
        },
        serve.pid(),
        parent.display()
    );
    println!(
        "store: {created} VMs in namespace {NS} (runStrategy Halted), created through the API in {:.1} s = {:.0}/s ({conc} concurrent POSTs, {failed} failed), and {watch_created} in namespace {WATCH_NS}; controller set all statuses {:.1} s later ({stopped} Stopped) and was quiet {:.1} s after that",
        fill_took.as_secs_f64(),
        created as f64 / fill_took.as_secs_f64(),
        settle_took.as_secs_f64(),
        quiet_took.as_secs_f64()
    );
    println!(
        "serve idle with {} VMs: {:.0}% of one core over {:.0} s, {idle_writes} resourceVersions written; by thread: {}",
        created + watch_created,
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
    println!(
        "  idle resync (controller::resync_keys, in-process on the same store, {} VMs): {resync_queued} objects queued, {resync_writes} write transactions, {:.0} ms   target 0 writes: {}",
        created + watch_created,
        resync_took.as_secs_f64() * 1e3,
        if resync_writes == 0 { "met" } else { "MISSED" }
    );
    println!();
    println!(
        "LIST {VMS} ({iters} timed each after {warmup} warm-up, interleaved; client-side, loopback HTTP/1.1, request sent -> whole body read)"
    );
    println!(
        "  {:<48} {:>9} {:>9} {:>11} {:>7}  {:>6} {:>6}   target",
        "", "p50 ms", "p99 ms", "bytes", "items", "x p50", "x p99"
    );
    println!(
        "  {:<48} {:>9.2} {:>9.2} {:>11} {:>7}  {:>6} {:>6}   (the floor)",
        "raw SELECT body + splice, no JSON parse",
        raw.p50(),
        raw.p99(),
        raw.bytes,
        raw_items,
        "1.00",
        "1.00"
    );
    for (label, s, n, target) in [
        ("HTTP LIST as JSON", &js, json_items, Some(1.5)),
        (
            "HTTP LIST as Table (parses; vs the JSON floor)",
            &table,
            table_rows,
            None,
        ),
        (
            "HTTP LIST ?limit=500, one kubectl page",
            &page,
            page_items,
            None,
        ),
        (
            "old path in-process: Store::list+json!+to_vec",
            &old,
            old_items,
            None,
        ),
    ] {
        println!(
            "  {:<48} {:>9.2} {:>9.2} {:>11} {:>7}  {:>6.2} {:>6.2}   {}",
            label,
            s.p50(),
            s.p99(),
            s.bytes,
            n,
            r50(s),
            r99(s),
            match target {
                Some(t) => format!("<= {t}x floor: {}", verdict(r50(s), r99(s), t)),
                None => String::new(),
            }
        );
    }
    println!(
        "  one page of {PAGE} / the full JSON LIST: {:.3}x p50, {:.3}x p99   target <= 0.1x: {}",
        page.p50() / js.p50(),
        page.p99() / js.p99(),
        verdict(page.p50() / js.p50(), page.p99() / js.p99(), 0.1)
    );
    match &before {
        Some(b) => {
            println!(
                "  before (baseline build {}, same database copied, measured in this run):",
                b.bin.display()
            );
            println!(
                "    HTTP LIST as JSON {:.2} / {:.2} ms p50/p99 ({} items); one page {:.2} / {:.2} ms",
                b.list.p50(),
                b.list.p99(),
                b.items,
                b.page.p50(),
                b.page.p99()
            );
            println!(
                "    JSON LIST now / before: {:.3}x p50, {:.3}x p99   target <= 0.3x: {}; page now / before: {:.3}x p50",
                js.p50() / b.list.p50(),
                js.p99() / b.list.p99(),
                verdict(js.p50() / b.list.p50(), js.p99() / b.list.p99(), 0.3),
                page.p50() / b.page.p50()
            );
            println!(
                "    the baseline's JSON LIST / the floor: {:.2}x p50",
                b.list.p50() / raw.p50()
            );
        }
        None => println!(
            "  before: not measured (set EDGEVIRT_BASELINE_BIN to a build of the baseline); the old path in-process, now / that: {:.3}x p50",
            js.p50() / old.p50()
        ),
    }
    println!(
        "  old path breakdown, p50: Store::list (SELECT + parse every body) {:.2} ms; json! (a deep copy) {:.2} ms; to_vec + drop {:.2} ms",
        old_read.p50(),
        old_built.p50(),
        old.p50() - old_read.p50() - old_built.p50()
    );
    println!(
        "  serve CPU per HTTP LIST: {serve_cpu_per_list_ms:.1} ms (average of the three HTTP rows)"
    );
    println!(
        "  p99 = nearest rank of {iters} samples (the max below 100); a full `kubectl get` pages {} LISTs of {PAGE}",
        created.div_ceil(PAGE)
    );
    if old_items != created
        || json_items != created
        || table_rows != created
        || page_items != PAGE.min(created)
        || raw_items != created
    {
        println!(
            "  WARNING: unexpected item counts (old {old_items}, JSON {json_items}, Table {table_rows}, raw {raw_items} of {created}; page {page_items} of {PAGE})"
        );
    }
    println!();
    println!(
        "LIST storm: {storm} concurrent JSON LISTs of {created} VMs: {storm_full} complete, {storm_429} x 429, {storm_5xx} x 5xx, {storm_failed} failed; all done in {:.1} s (each: p50 {:.0} ms, max {:.0} ms)",
        storm_took.as_secs_f64(),
        storm_times.p50(),
        storm_times
            .sorted()
            .last()
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    );
    println!(
        "  serve RSS before {:.1} MiB, peak during {:.1} MiB, {settle_secs:.0} s after {:.1} MiB: {:.2}x before   target <= 2x: {}",
        mib(rss_before_storm),
        mib(storm_peak),
        mib(rss_after_storm),
        rss_after_storm as f64 / rss_before_storm.max(1) as f64,
        if rss_after_storm <= 2 * rss_before_storm {
            "met"
        } else {
            "MISSED"
        }
    );
    println!();
    println!(
        "Watch fan-out: {watchers} watches from a full listing (?watch=true, no resourceVersion) of {WATCH_NS}'s {watch_created} VMs, opened together, then {changes} merge patches of {WATCH_NS}/{PATCHED_VM}'s labels one at a time"
    );
    let connect_ok = open == watchers
        && watch_5xx == 0
        && listed == open
        && listed_took <= Duration::from_secs(10);
    println!(
        "  connected: {open} of {watchers} ({watch_5xx} x 5xx, {watch_429} x 429, {watch_other} other); all response heads in {:.2} s; {listed} had their whole listing after {:.2} s   target all within 10 s, no 5xx: {}",
        headers_took.as_secs_f64(),
        listed_took.as_secs_f64(),
        if connect_ok { "met" } else { "MISSED" }
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
        "  events delivered: {got_events} of {expected} ({} missing)   target every event to every watcher: {}; changes not at every watcher within {} s: {incomplete}; other lines: {other_lines}; streams closed early: {closed}",
        expected.saturating_sub(got_events),
        if got_events == expected {
            "met"
        } else {
            "MISSED"
        },
        FANOUT_TIMEOUT.as_secs()
    );
    println!(
        "  serve RSS: idle {:.1} MiB, peak while the watches listed and followed {:.1} MiB = {:.2}x idle   target <= 4x: {}",
        mib(rss_idle),
        mib(watch_peak),
        watch_peak as f64 / rss_idle.max(1) as f64,
        if watch_peak <= 4 * rss_idle {
            "met"
        } else {
            "MISSED"
        }
    );
    println!("  serve CPU per change (write + {open} deliveries): {serve_cpu_per_change_ms:.1} ms");
    println!();
    println!("Memory (serve VmRSS)");
    let per_vm = rss_filled.saturating_sub(rss_empty) as f64 / (created + watch_created) as f64;
    for (label, kib, note) in [
        ("started, empty store".to_string(), rss_empty, String::new()),
        (
            format!("after {} VMs, statuses set", created + watch_created),
            rss_filled,
            format!("  (+{per_vm:.1} KiB per VM)"),
        ),
        (
            format!("after {idle_secs:.0} s idle"),
            rss_idle,
            String::new(),
        ),
        (
            "before the LIST storm".to_string(),
            rss_before_storm,
            String::new(),
        ),
        (
            format!("{settle_secs:.0} s after the storm"),
            rss_after_storm,
            String::new(),
        ),
        (
            "before the watches".to_string(),
            rss_before_watch,
            String::new(),
        ),
        (
            format!("{open} watches open, listed"),
            rss_watch_open,
            String::new(),
        ),
        (
            format!("{open} watches, after the {changes} changes"),
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
