//! Hostile clients, before and after the hardening (a benchmark, not a test: it prints
//! figures and fails only when something could not be measured at all).
//!
//!   EDGEVIRT_BIN=target/debug/edgevirt \
//!   EDGEVIRT_BASELINE_BIN=target-before/debug/edgevirt cargo bench --bench hostile
//!
//! For each binary (the baseline first, if given) it starts `edgevirt serve --role
//! controller --tls` on a fresh data dir (no libvirt needed), makes what the cases refer to
//! (`testkit/src/hostile.rs`: image, namespace, VM, join token, a dashboard session), and:
//!
//! 1. Sends a representative subset of the hostile cases of `tests/hostile.rs` as the
//!    administrator, one at a time, and reports per case: the worst `/healthz` latency while
//!    it ran (GET every 50 ms), serve's peak RSS over its idle RSS (`VmHWM` after
//!    `clear_refs`), and the answers. Every request has 30 s; serve is killed if its RSS
//!    passes `BENCH_KILL_MIB` (6 GiB), and restarted when it died, stopped answering
//!    `/healthz` or left a request unanswered (it may still be busy with it), so one case
//!    cannot spoil the next.
//! 2. On a fresh serve: 100 concurrent wrong-password dashboard logins, and 200 wrong-secret
//!    `/join` tries (20 at a time) from one address, with the same figures.
//! 3. Login throughput of a legitimate user: the right password for admin from 127.0.0.2,
//!    one login at a time for `BENCH_LOGIN_SECS` (10 s), with no other load and then during a
//!    flood of wrong passwords (20 concurrent, from 127.0.0.1) for admin and for another
//!    user; the ratio flood / no flood. serve is restarted before each (lockouts are in
//!    memory).
//!
//! Sizes are those of the test, which keep a vulnerable build from taking a 24 GiB host
//! down (with the RSS guard): alias bombs of the 30 KB / 6,000×6,000 shape, 240 KB of
//! nesting. Use binaries of the same profile: `cargo bench` alone measures its optimized
//! build, and a debug baseline next to it would compare the compilers as much as the code.
//!
//! Environment: EDGEVIRT_BIN (the "after" binary; default: this workspace's bench build),
//! EDGEVIRT_BASELINE_BIN (the "before" binary; none: only "after" is measured),
//! BENCH_CASES (comma-separated case names, or `all`; default: the subset below),
//! BENCH_LOGIN_SECS (10), BENCH_KILL_MIB (6144).
//!
//! `cargo test --all-targets` also runs this binary, without `--bench`: it then does nothing.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use testkit::Appliance;
use testkit::hostile::*;

/// The cases measured unless BENCH_CASES says otherwise.
const SUBSET: &[&str] = &[
    "vm-8MiB-annotation",
    "vm-2.9MiB-name-x16-parallel",
    "yaml-billion-laughs",
    "yaml-6000x6000-aliases",
    "yaml-block-key-laughs",
    "yaml-1MiB-scalar-x1000-aliases",
    "yaml-flow-nesting-240KB",
    "yaml-block-map-nesting-700",
    "json-array-nesting-100000",
    "json-object-nesting-100000",
    "annotations-300KiB",
    "cpu-65536-sockets-x-65536-cores",
    "memory-guest-99999999Ei",
    "labelSelector ((((!!==",
    "patch-vm-json-patch-copy-doubling-18",
    "join-420KB-nested-x2-parallel",
    "join-yaml-6000x6000-aliases",
    "login-20KiB-form",
    "dashboard-yaml-6000x6000-aliases",
];

const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

fn main() {
    // cargo bench passes --bench; cargo test (all targets, in CI) does not: do nothing then.
    if !std::env::args().skip(1).any(|a| a == "--bench") {
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}

/// One row: a case (or flood) against one binary.
#[derive(Clone, Debug, Default)]
struct Row {
    case: String,
    healthz_ms: u128,
    healthz_failures: usize,
    rss_over_idle_mib: i64,
    /// Peak RSS over the RSS when the case started (what the case itself took).
    rss_in_case_mib: i64,
    secs: f64,
    answers: String,
    note: String,
}

#[derive(Clone, Debug, Default)]
struct LoginRate {
    what: String,
    ok: usize,
    tries: usize,
    per_sec: f64,
    flood: String,
}

#[derive(Debug, Default)]
struct Column {
    label: String,
    exe: PathBuf,
    idle_mib: u64,
    rows: Vec<Row>,
    logins: Vec<LoginRate>,
    restarts: u32,
    setup_problems: Vec<String>,
}

async fn run() {
    let after = std::env::var_os("EDGEVIRT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(testkit::exe()));
    let before = std::env::var_os("EDGEVIRT_BASELINE_BIN").map(PathBuf::from);
    let mut bins = Vec::new();
    if let Some(b) = before {
        bins.push(("before", b));
    }
    bins.push(("after", after));
    for (label, exe) in &bins {
        assert!(exe.exists(), "{label}: {} does not exist", exe.display());
        eprintln!("[bench] {label}: {}", exe.display());
    }
    if bins.len() == 2 {
        let debug = |p: &PathBuf| p.to_string_lossy().contains("/debug/");
        if debug(&bins[0].1) != debug(&bins[1].1) {
            eprintln!(
                "[bench] warning: one binary is a debug build and the other is not; the \
                 figures compare the builds as much as the code"
            );
        }
    }
    let mut cols = Vec::new();
    for (label, exe) in bins {
        cols.push(measure(label, exe).await);
    }
    report(&cols);
}

fn selected(all: Vec<Case>) -> Vec<Case> {
    let want = std::env::var("BENCH_CASES").unwrap_or_default();
    let names: Vec<String> = if want.trim().is_empty() {
        SUBSET.iter().map(|s| s.to_string()).collect()
    } else if want.trim() == "all" {
        return all;
    } else {
        want.split(',').map(|s| s.trim().to_string()).collect()
    };
    let picked: Vec<Case> = names
        .iter()
        .filter_map(|n| all.iter().find(|c| &c.name == n).cloned())
        .collect();
    for n in &names {
        if !all.iter().any(|c| &c.name == n) {
            eprintln!("[bench] no case named {n:?}");
        }
    }
    picked
}

async fn restart(r: &mut Runner<'_>) {
    r.a.kill9();
    r.a.spawn().await;
    r.restarts += 1;
    tokio::time::sleep(Duration::from_millis(500)).await;
}

async fn measure(label: &str, exe: PathBuf) -> Column {
    let mut a = Appliance::start_with_exe(exe.clone(), &["--role", "controller", "--tls"]).await;
    let clients = Clients::new(&a, REQUEST_TIMEOUT);
    let (setup, setup_problems) = testkit::hostile::setup(&a, &clients).await;
    for p in &setup_problems {
        eprintln!("[bench] {label}: {p}");
    }
    let other_user = "v";
    let viewer_token = a.add_token(other_user, "viewer").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = idle_rss_kib(a.pid()).await;
    let mut col = Column {
        label: label.into(),
        exe,
        idle_mib: idle / 1024,
        setup_problems,
        ..Default::default()
    };
    let mut r = Runner {
        a: &mut a,
        clients,
        viewer_token,
        setup: setup.clone(),
        idle_rss_kib: idle,
        kill_above_kib: env_num("BENCH_KILL_MIB", 6144u64) * 1024,
        settle: Duration::from_millis(200),
        check_store: false,
        restarts: 0,
    };

    // 1. The cases.
    for case in selected(cases(&setup)) {
        eprintln!("[bench] {label}: {}", case.name);
        let t = Instant::now();
        let res = r
            .run(&case, Identity::Admin)
            .await
            .expect("admin gets every case");
        let mut note = Vec::new();
        if res.sample.killed {
            note.push(format!("killed at {} MiB", r.kill_above_kib / 1024));
        }
        if res.restarted {
            note.push("restarted".to_string());
        } else if res.answers.iter().any(|a| a.code.is_none()) {
            // serve may still be busy with what it was not able to answer: start afresh.
            restart(&mut r).await;
            note.push("unanswered: restarted".to_string());
        }
        if !res.sample.hwm {
            note.push("RSS sampled".into());
        }
        col.rows.push(Row {
            case: case.name.clone(),
            healthz_ms: res.sample.health.worst.as_millis(),
            healthz_failures: res.sample.health.failures.len(),
            rss_over_idle_mib: res.rss_over_idle_kib / 1024,
            rss_in_case_mib: (res.sample.peak_rss_kib as i64 - res.sample.start_rss_kib as i64)
                / 1024,
            secs: t.elapsed().as_secs_f64(),
            answers: res.codes(),
            note: note.join(", "),
        });
    }

    // 2. Floods, on a fresh serve.
    restart(&mut r).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    r.idle_rss_kib = idle_rss_kib(r.a.pid()).await;
    let url = r.a.url.clone();
    let flooder = r.clients.from(ip("127.0.0.1"));
    match prelogin(&flooder, &url).await {
        Ok(form) => {
            let t = Instant::now();
            let m = r.monitor();
            let answers =
                concurrent_logins(&flooder, &url, &form, "admin", "wrong-password", 100).await;
            let s = m.finish(Duration::from_millis(200)).await;
            col.rows.push(flood_row(
                "login: 100 concurrent wrong passwords",
                &r,
                &s,
                &answers,
                t,
            ));
        }
        Err(e) => eprintln!("[bench] {label}: {e}"),
    }
    if r.revive().await.is_some() {
        col.rows.last_mut().unwrap().note.push_str("restarted");
    }
    let t = Instant::now();
    let m = r.monitor();
    let answers = join_tries(&r.clients.from(ip("127.0.0.4")), &url, 200, 20).await;
    let s = m.finish(Duration::from_millis(200)).await;
    col.rows.push(flood_row(
        "join: 200 wrong-secret tries",
        &r,
        &s,
        &answers,
        t,
    ));

    // 3. Login throughput of the legitimate admin, alone and during floods.
    let secs = env_num("BENCH_LOGIN_SECS", 10u64);
    let pw = admin_password(r.a);
    for flood_user in [None, Some("admin"), Some(other_user)] {
        restart(&mut r).await;
        let what = match flood_user {
            None => "no flood".to_string(),
            Some(u) => format!("flood of wrong passwords for {u}"),
        };
        eprintln!("[bench] {label}: legitimate logins, {what}");
        col.logins
            .push(login_rate(&r, &pw, Duration::from_secs(secs), flood_user, &what).await);
    }
    col.restarts = r.restarts;
    col
}

fn flood_row(case: &str, r: &Runner<'_>, s: &Sample, answers: &[Answer], t: Instant) -> Row {
    let slowest = answers.iter().map(|a| a.elapsed).max().unwrap_or_default();
    Row {
        case: case.into(),
        healthz_ms: s.health.worst.as_millis(),
        healthz_failures: s.health.failures.len(),
        rss_over_idle_mib: (s.peak_rss_kib as i64 - r.idle_rss_kib as i64) / 1024,
        rss_in_case_mib: (s.peak_rss_kib as i64 - s.start_rss_kib as i64) / 1024,
        secs: t.elapsed().as_secs_f64(),
        answers: code_counts(answers),
        note: format!(
            "slowest answer {:.2} s{}",
            slowest.as_secs_f64(),
            if s.killed { ", killed" } else { "" }
        ),
    }
}

/// Right-password logins for admin from 127.0.0.2, one at a time for `dur`, while 20 tasks
/// from 127.0.0.1 send wrong passwords for `flood_user` (if any).
async fn login_rate(
    r: &Runner<'_>,
    pw: &str,
    dur: Duration,
    flood_user: Option<&str>,
    what: &str,
) -> LoginRate {
    let url = r.a.url.clone();
    let legit = r.clients.from(ip("127.0.0.2"));
    let flooder = r.clients.from(ip("127.0.0.1"));
    let (form, fform) = match (prelogin(&legit, &url).await, prelogin(&flooder, &url).await) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("[bench] {e}");
            return LoginRate {
                what: what.into(),
                ..Default::default()
            };
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut flood = Vec::new();
    if let Some(user) = flood_user {
        for _ in 0..20 {
            let (c, url, f, user, stop) = (
                flooder.clone(),
                url.clone(),
                fform.clone(),
                user.to_string(),
                stop.clone(),
            );
            flood.push(tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let a = login(&c, &url, &f, &user, "wrong-password").await;
                    // Keep only what the table needs.
                    answers.push(Answer {
                        code: a.code,
                        ..Default::default()
                    });
                }
                answers
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (start, mut ok, mut tries) = (Instant::now(), 0, 0);
    while start.elapsed() < dur {
        tries += 1;
        if logged_in(&login(&legit, &url, &form, "admin", pw).await) {
            ok += 1;
        }
    }
    let elapsed = start.elapsed();
    stop.store(true, Ordering::SeqCst);
    let mut flood_answers = Vec::new();
    for t in flood {
        flood_answers.extend(t.await.unwrap_or_default());
    }
    LoginRate {
        what: what.into(),
        ok,
        tries,
        per_sec: ok as f64 / elapsed.as_secs_f64(),
        flood: if flood_user.is_some() {
            code_counts(&flood_answers)
        } else {
            String::new()
        },
    }
}

fn report(cols: &[Column]) {
    println!();
    println!("== hostile clients: worst /healthz latency, serve's peak RSS over idle, answers ==");
    for c in cols {
        println!(
            "{:>6}: {} (idle RSS {} MiB, serve restarts {})",
            c.label,
            c.exe.display(),
            c.idle_mib,
            c.restarts
        );
        for p in &c.setup_problems {
            println!("        {p}");
        }
    }
    println!();
    let names: Vec<String> = {
        let mut v: Vec<String> = Vec::new();
        for c in cols {
            for r in &c.rows {
                if !v.contains(&r.case) {
                    v.push(r.case.clone());
                }
            }
        }
        v
    };
    print!("{:<38}", "");
    for c in cols {
        print!(" | {:<58}", c.label);
    }
    println!();
    print!("{:<38}", "case");
    for _ in cols {
        print!(
            " | {:>9} {:>7} {:>7} {:>6} {:<25}",
            "healthz", "RSS+idl", "RSS+run", "time", "answers"
        );
    }
    println!();
    for n in &names {
        print!("{n:<38}");
        for c in cols {
            match c.rows.iter().find(|r| &r.case == n) {
                Some(r) => {
                    let h = if r.healthz_failures > 0 {
                        format!("{}ms!{}", r.healthz_ms, r.healthz_failures)
                    } else {
                        format!("{}ms", r.healthz_ms)
                    };
                    print!(
                        " | {:>9} {:>7} {:>7} {:>5.1}s {:<25}",
                        h, r.rss_over_idle_mib, r.rss_in_case_mib, r.secs, r.answers
                    );
                }
                None => print!(" | {:>9} {:>7} {:>7} {:>6} {:<25}", "-", "-", "-", "-", "-"),
            }
        }
        println!();
        for c in cols {
            if let Some(r) = c.rows.iter().find(|r| &r.case == n)
                && !r.note.is_empty()
            {
                println!("{:<38}   {}: {}", "", c.label, r.note);
            }
        }
    }
    println!(
        "(healthz: worst latency while the case ran, \"!N\": N checks failed or took over 5 s; \
         RSS+idl: serve's peak RSS over its idle RSS, MiB, memory kept from earlier cases \
         included; RSS+run: peak over the RSS when the case started; time: the case with its \
         answers and 200 ms of settling)"
    );
    println!();
    println!("== legitimate logins (admin, right password, from 127.0.0.2, one at a time) ==");
    for c in cols {
        let base = c
            .logins
            .iter()
            .find(|l| l.what == "no flood")
            .map(|l| l.per_sec)
            .unwrap_or(0.0);
        for l in &c.logins {
            let ratio = if base > 0.0 {
                format!("{:.2}×", l.per_sec / base)
            } else {
                "-".into()
            };
            println!(
                "{:>6}  {:<40} {:>7.2}/s ({} of {} ok) {:>7}  {}",
                c.label,
                l.what,
                l.per_sec,
                l.ok,
                l.tries,
                ratio,
                if l.flood.is_empty() {
                    String::new()
                } else {
                    format!("flood answers: {}", l.flood)
                }
            );
        }
    }
    println!("(flood: 20 concurrent wrong-password logins from 127.0.0.1; ratio against no flood)");
}
