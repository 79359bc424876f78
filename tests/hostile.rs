//! Hostile or careless clients cannot exhaust the appliance. One real `edgevirt serve
//! --role controller --tls` (no libvirt needed) gets every case of `testkit/src/hostile.rs`:
//!
//! 1. as the administrator: the expected 4xx with a Kubernetes `Status` and a message (the
//!    field or "YAML" named where the case says so); bombs and deep nesting refused within
//!    2 s;
//! 2. with no credentials (401 on every API path) and as a viewer (403 on every write; reads
//!    answer as for the administrator); `/join` and the login form are unauthenticated by
//!    design and are sent once, in step 1;
//! 3. a login flood: 100 concurrent wrong passwords for admin from 127.0.0.1, then the right
//!    password refused there (locked) but accepted from 127.0.0.2, the lockout listed and
//!    cleared by the administrator (a viewer may do neither), and 100 sequential wrong
//!    passwords of which all after the 5th are refused without a password check;
//! 4. a `/join` flood: 1,000 wrong-secret tries from one address, mostly 429, logged in a
//!    few aggregated lines.
//!
//! Throughout, for every case and flood: `/healthz` (every 50 ms) answers within 1 s, serve's
//! peak RSS stays under its idle RSS + 200 MiB, and the stored VMs, VMIs, migrations,
//! namespaces and join tokens are unchanged. A problem does not stop the run: all of them
//! are listed at the end, each naming its case, with the answer it got. A serve that died,
//! passed 2 GiB (killed, to protect the host) or stopped answering is restarted so the
//! later cases still run.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::Appliance;
use testkit::hostile::*;

const SETTLE: Duration = Duration::from_millis(100);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const KILL_ABOVE_KIB: u64 = 2 * 1024 * 1024;

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_cannot_exhaust_the_appliance() {
    let t0 = Instant::now();
    let mut a = Appliance::start(&["--role", "controller", "--tls"]).await;
    assert!(a.url.starts_with("https://"), "{}", a.url);
    let clients = Clients::new(&a, REQUEST_TIMEOUT);
    let (setup, problems) = testkit::hostile::setup(&a, &clients).await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let viewer_token = a.add_token("v", "viewer").await;
    // Warm up the paths the cases take, then take serve's idle RSS.
    for _ in 0..3 {
        let c = clients.default();
        let _ = snapshot(&c, &a.url, &a.token).await;
        let _ = healthz_once(&c, &a.url).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = idle_rss_kib(a.pid()).await;
    let cases = cases(&setup);
    let mut r = Runner {
        a: &mut a,
        clients,
        viewer_token,
        setup,
        idle_rss_kib: idle,
        kill_above_kib: KILL_ABOVE_KIB,
        settle: SETTLE,
        check_store: true,
        restarts: 0,
    };
    let mut results = Vec::new();
    let mut timings = Vec::new();
    for who in [Identity::Admin, Identity::Anonymous, Identity::Viewer] {
        let t = Instant::now();
        for case in &cases {
            if let Some(res) = r.run(case, who).await {
                results.push(res);
            }
        }
        timings.push(format!(
            "cases as {who}: {:.1} s",
            t.elapsed().as_secs_f64()
        ));
    }
    let mut problems: Vec<String> = results.iter().flat_map(|r| r.problems.clone()).collect();
    let mut lines = Vec::new();

    let t = Instant::now();
    login_flood(&mut r, &mut problems, &mut lines).await;
    timings.push(format!("login flood: {:.1} s", t.elapsed().as_secs_f64()));
    let t = Instant::now();
    join_flood(&mut r, &mut problems, &mut lines).await;
    timings.push(format!("join flood: {:.1} s", t.elapsed().as_secs_f64()));
    timings.push(format!("total: {:.1} s", t0.elapsed().as_secs_f64()));

    println!(
        "serve idle RSS {} MiB; VmHWM peaks: {}",
        idle / 1024,
        if results.iter().all(|r| r.sample.hwm) {
            "yes"
        } else {
            "no (VmRSS samples every 20 ms)"
        }
    );
    println!(
        "{:<10} {:<42} {:<22} {:>8} {:>9} {:>8}  ok",
        "as", "case", "answers", "slowest", "healthz", "RSS+MiB"
    );
    for res in &results {
        println!(
            "{:<10} {:<42} {:<22} {:>6}ms {:>7}ms {:>8}  {}",
            res.identity.to_string(),
            format!(
                "{}{}",
                res.name,
                if cases.iter().any(|c| c.name == res.name && c.extra) {
                    " (+)"
                } else {
                    ""
                }
            ),
            res.codes(),
            res.slowest().as_millis(),
            res.sample.health.worst.as_millis(),
            res.rss_over_idle_kib / 1024,
            if res.problems.is_empty() {
                "ok"
            } else {
                "FAIL"
            }
        );
    }
    println!("(+): a case beyond the issue's list");
    for l in &lines {
        println!("{l}");
    }
    for t in &timings {
        println!("{t}");
    }
    println!("serve restarts: {}", r.restarts);
    assert!(
        problems.is_empty(),
        "{} problems (serve.log in {}):\n{}",
        problems.len(),
        r.a.dir.display(),
        problems.join("\n")
    );
}

/// After a flood: the store as it was before it (`before`), and serve still alive (else
/// restarted for what follows).
async fn end_of_flood(
    r: &mut Runner<'_>,
    tag: &str,
    before: Option<std::collections::BTreeMap<String, String>>,
) -> Vec<String> {
    let mut p = Vec::new();
    if let (Some(b), Ok(after)) = (before, r.snapshot().await)
        && let Some(d) = store_diff(&b, &after)
    {
        p.push(format!("{tag}: the store changed: {d}"));
    }
    if let Some(why) = r.revive().await {
        p.push(format!("{tag}: {why}; restarted it"));
    }
    p
}

/// The administrator clears every lockout: a problem unless that answers 200.
async fn clear_lockouts(
    admin: &reqwest::Client,
    url: &str,
    token: &str,
    when: &str,
) -> Option<String> {
    let ans = send(admin.delete(format!("{url}{LOCKOUTS}")).bearer_auth(token)).await;
    (ans.code != Some(200)).then(|| {
        format!(
            "[login] DELETE {LOCKOUTS}{when}: expected 200, got {}",
            ans.describe()
        )
    })
}

fn lines_with(a: &Appliance, needles: &[&str]) -> usize {
    std::fs::read_to_string(a.dir.join("serve.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| needles.iter().any(|n| l.contains(n)))
        .count()
}

async fn login_flood(r: &mut Runner<'_>, problems: &mut Vec<String>, lines: &mut Vec<String>) {
    let url = r.a.url.clone();
    let pw = admin_password(r.a);
    let (c1, c2, c3) = (
        r.clients.from(ip("127.0.0.1")),
        r.clients.from(ip("127.0.0.2")),
        r.clients.from(ip("127.0.0.3")),
    );
    let admin = r.clients.default();
    let mut p = Vec::new();
    let form = match prelogin(&c1, &url).await {
        Ok(f) => f,
        Err(e) => {
            problems.push(format!("[login] {e}"));
            return;
        }
    };
    let before = r.snapshot().await.ok();

    // 100 concurrent wrong passwords from 127.0.0.1.
    let tag = "[login] 100 concurrent wrong passwords for admin";
    let m = r.monitor();
    let answers = concurrent_logins(&c1, &url, &form, "admin", "wrong-password", 100).await;
    let s = m.finish(SETTLE).await;
    p.extend(r.judge(tag, &s));
    for ans in &answers {
        match ans.code {
            Some(401) => {}
            Some(429) if ans.retry_after.is_some() => {}
            Some(429) => p.push(format!("{tag}: 429 without Retry-After")),
            _ => p.push(format!(
                "{tag}: expected 401 or 429, got {}",
                ans.describe()
            )),
        }
    }
    // Tries under way count towards the lockout: a hundred at once get five guesses.
    let checked = answers.iter().filter(|a| a.code == Some(401)).count();
    if !(1..=5).contains(&checked) {
        p.push(format!(
            "{tag}: {checked} passwords were checked (401); expected 1 to 5, the rest 429"
        ));
    }
    lines.push(format!(
        "{tag}: {} in {} ms max; healthz worst {} ms; peak RSS +{} MiB over idle; RSS after {} MiB",
        code_counts(&answers),
        answers
            .iter()
            .map(|a| a.elapsed)
            .max()
            .unwrap_or_default()
            .as_millis(),
        s.health.worst.as_millis(),
        (s.peak_rss_kib as i64 - r.idle_rss_kib as i64) / 1024,
        proc_kib(r.a.pid(), "VmRSS").unwrap_or(0) / 1024
    ));

    // Locked from 127.0.0.1 even with the right password; not from 127.0.0.2.
    let ans = login(&c1, &url, &form, "admin", &pw).await;
    if ans.code != Some(429)
        || ans.retry_after.is_none()
        || !ans.body.contains("too many failed logins")
    {
        p.push(format!(
            "[login] the right password from 127.0.0.1 after the flood: expected 429 with \
             Retry-After and \"too many failed logins\", got {} (Retry-After {:?})",
            ans.describe(),
            ans.retry_after
        ));
    }
    let ans = login(&c2, &url, &form, "admin", &pw).await;
    if !logged_in(&ans) {
        p.push(format!(
            "[login] the right password from 127.0.0.2 during the lockout of 127.0.0.1: \
             expected 303 with a session, got {}",
            ans.describe()
        ));
    }

    // Lockouts: a viewer may neither see nor clear them; the administrator may.
    for (m, what) in [
        (reqwest::Method::GET, "list"),
        (reqwest::Method::DELETE, "clear"),
    ] {
        let ans = send(
            admin
                .request(m, format!("{url}{LOCKOUTS}"))
                .bearer_auth(&r.viewer_token),
        )
        .await;
        if ans.code != Some(403) {
            p.push(format!(
                "[login] a viewer may not {what} lockouts: expected 403, got {}",
                ans.describe()
            ));
        } else if let Some(e) = status_problem(403, &ans.body) {
            p.push(format!("[login] viewer {what} lockouts: {e}"));
        }
    }
    let ans = send(
        admin
            .get(format!("{url}{LOCKOUTS}"))
            .bearer_auth(&r.a.token),
    )
    .await;
    let listed = serde_json::from_str::<Value>(&ans.body).ok().and_then(|v| {
        v["items"].as_array().map(|items| {
            items.iter().any(|i| {
                i["user"] == "admin"
                    && i["address"] == "127.0.0.1"
                    && i["lockedUntil"].as_str().is_some_and(|t| t.contains('T'))
            })
        })
    });
    if ans.code != Some(200) || listed != Some(true) {
        p.push(format!(
            "[login] GET {LOCKOUTS}: expected 200 listing admin from 127.0.0.1 with a \
             lockedUntil, got {}",
            ans.describe()
        ));
    }
    p.extend(clear_lockouts(&admin, &url, &r.a.token, "").await);
    let ans = login(&c1, &url, &form, "admin", &pw).await;
    if !logged_in(&ans) {
        p.push(format!(
            "[login] the right password from 127.0.0.1 after the administrator cleared the \
             lockouts: expected 303 with a session, got {}",
            ans.describe()
        ));
    }

    // 100 sequential wrong passwords (from an address with no history): after the 5th,
    // refused without a password check.
    let tag = "[login] 100 sequential wrong passwords for admin";
    let m = r.monitor();
    let mut seq = Vec::new();
    for _ in 0..100 {
        seq.push(login(&c3, &url, &form, "admin", "wrong-password").await);
    }
    let s = m.finish(SETTLE).await;
    p.extend(r.judge(tag, &s));
    for (i, ans) in seq.iter().enumerate() {
        let want = if i < 5 { 401 } else { 429 };
        if ans.code != Some(want) {
            p.push(format!(
                "{tag}: try {}: expected {want}, got {}",
                i + 1,
                ans.describe()
            ));
            break;
        }
        if want == 429 && ans.retry_after.is_none() {
            p.push(format!("{tag}: try {}: 429 without Retry-After", i + 1));
            break;
        }
    }
    let mean = |v: &[Answer]| v.iter().map(|a| a.elapsed).sum::<Duration>() / v.len().max(1) as u32;
    let (checked, refused) = (mean(&seq[..5]), mean(&seq[5..]));
    if refused > Duration::from_millis(100) {
        p.push(format!(
            "{tag}: the refused tries took {} ms on average (the checked ones {} ms): \
             expected no password check",
            refused.as_millis(),
            checked.as_millis()
        ));
    }
    lines.push(format!(
        "{tag}: {}; mean {} ms for the first 5, {} ms after; healthz worst {} ms; peak RSS +{} MiB over idle; RSS after {} MiB",
        code_counts(&seq),
        checked.as_millis(),
        refused.as_millis(),
        s.health.worst.as_millis(),
        (s.peak_rss_kib as i64 - r.idle_rss_kib as i64) / 1024,
        proc_kib(r.a.pid(), "VmRSS").unwrap_or(0) / 1024
    ));
    p.extend(clear_lockouts(&admin, &url, &r.a.token, " (after)").await);

    // Failed logins are logged in aggregate, not a line per try (but not silently).
    let n = lines_with(r.a, &["login failed", "login refused"]);
    if !(1..50).contains(&n) {
        p.push(format!(
            "[login] serve.log has {n} lines with \"login failed\"/\"login refused\" after ~300 \
             refused logins: expected between 1 and 49 (aggregated)"
        ));
    }
    lines.push(format!(
        "[login] serve.log lines about failed/refused logins: {n}"
    ));
    p.extend(end_of_flood(r, "[login]", before).await);
    problems.extend(p);
}

async fn join_flood(r: &mut Runner<'_>, problems: &mut Vec<String>, lines: &mut Vec<String>) {
    let url = r.a.url.clone();
    let tag = "[join] 1000 wrong-secret tries from 127.0.0.1";
    let before = r.snapshot().await.ok();
    let m = r.monitor();
    let answers = join_tries(&r.clients.from(ip("127.0.0.1")), &url, 1000, 20).await;
    let s = m.finish(SETTLE).await;
    let mut p = r.judge(tag, &s);
    let mut limited = 0;
    for ans in &answers {
        match ans.code {
            Some(429) => {
                limited += 1;
                if ans.retry_after.is_none() {
                    p.push(format!("{tag}: 429 without Retry-After"));
                    break;
                }
                if let Some(e) = status_problem(429, &ans.body) {
                    p.push(format!("{tag}: 429: {e}"));
                    break;
                }
            }
            Some(401) => {
                if let Some(e) = status_problem(401, &ans.body) {
                    p.push(format!("{tag}: 401: {e}"));
                    break;
                }
            }
            _ => {
                p.push(format!(
                    "{tag}: expected 401 or 429, got {}",
                    ans.describe()
                ));
                break;
            }
        }
    }
    if limited < 900 {
        p.push(format!(
            "{tag}: only {limited} answers were 429 ({}): expected the vast majority (≥ 900)",
            code_counts(&answers)
        ));
    }
    let n = lines_with(r.a, &["join refused"]);
    if !(1..50).contains(&n) {
        p.push(format!(
            "{tag}: serve.log has {n} lines with \"join refused\": expected between 1 and 49 \
             (aggregated, never silent)"
        ));
    }
    lines.push(format!(
        "{tag}: {}; slowest {} ms; healthz worst {} ms; peak RSS +{} MiB over idle; RSS after {} MiB; serve.log \"join refused\" lines: {n}",
        code_counts(&answers),
        answers.iter().map(|a| a.elapsed).max().unwrap_or_default().as_millis(),
        s.health.worst.as_millis(),
        (s.peak_rss_kib as i64 - r.idle_rss_kib as i64) / 1024,
        proc_kib(r.a.pid(), "VmRSS").unwrap_or(0) / 1024
    ));
    p.extend(end_of_flood(r, tag, before).await);
    problems.extend(p);
}

// ------------------------------------------------------------------------------ connections

/// What the probes of [`Probe`] saw.
#[derive(Debug, Default)]
struct Probed {
    rounds: usize,
    /// Per probe: the worst latency, how many failed, and the first failure.
    worst: [Duration; 3],
    failures: [usize; 3],
    first_failure: [Option<String>; 3],
    peak_files: usize,
}

const PROBES: [&str; 3] = [
    "/healthz",
    "the API as a logged-in user",
    "an agent's heartbeat",
];

/// While an attack runs, from 127.0.0.1 and on a new connection each time (the hard case:
/// a kept-alive connection would hide a full accept queue): `/healthz`, a LIST with the
/// administrator's token, and a node heartbeat (the agent's status PATCH) with an agent's
/// token, every 100 ms; and serve's open files.
struct Probe {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Probed>,
}

impl Probe {
    fn start(a: &Appliance, agent_token: &str) -> Probe {
        let mut b = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(5))
            .local_address(ip("127.0.0.1"));
        if let Ok(pem) = std::fs::read(a.dir.join("tls/server.crt")) {
            b = b.add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap());
        }
        let c = b.build().unwrap();
        let (url, token, agent, pid) = (
            a.url.clone(),
            a.token.clone(),
            agent_token.to_string(),
            a.pid(),
        );
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut p = Probed::default();
            loop {
                let reqs = [
                    c.get(format!("{url}/healthz")),
                    c.get(format!("{url}{}", testkit::VMS)).bearer_auth(&token),
                    c.patch(format!("{url}/apis/edgevirt.io/v1/nodes/hb/status"))
                        .bearer_auth(&agent)
                        .header("content-type", "application/merge-patch+json")
                        .body(
                            serde_json::json!({"status": {"memoryBytes": p.rounds + 1}})
                                .to_string(),
                        ),
                ];
                for (i, r) in reqs.into_iter().enumerate() {
                    let t = Instant::now();
                    let ans = send(r).await;
                    p.worst[i] = p.worst[i].max(t.elapsed());
                    if ans.code != Some(200) {
                        p.failures[i] += 1;
                        p.first_failure[i].get_or_insert_with(|| ans.describe());
                    }
                }
                p.peak_files = p.peak_files.max(open_files(pid));
                p.rounds += 1;
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
            p
        });
        Probe { stop, task }
    }

    async fn finish(self) -> Probed {
        let _ = self.stop.send(());
        self.task.await.unwrap()
    }
}

/// One attack: `per_address` half-open connections from each of `from`, held past the
/// header-read timeout. Problems, and a line for the report.
async fn attack(
    a: &Appliance,
    agent_token: &str,
    tag: &str,
    from: &[IpAddr],
    per_address: usize,
    payload: &'static [u8],
    files_allowed: usize,
) -> (Vec<String>, String) {
    let to: std::net::SocketAddr = a.url.split("://").nth(1).unwrap().parse().unwrap();
    let pid = a.pid();
    let log = |a: &Appliance| lines_with(a, &["connection refused", "connection evicted"]);
    let (files_before, log_before) = (open_files(pid), log(a));
    let probe = Probe::start(a, agent_token);
    let t = Instant::now();
    let opened = futures::future::join_all(from.iter().map(|&ip| {
        half_open(
            to,
            ip,
            per_address,
            payload,
            (512 / from.len()).max(4),
            Duration::from_secs(5),
        )
    }))
    .await;
    let opening = t.elapsed();
    let failed: usize = opened.iter().map(|h| h.failed).sum();
    let early: usize = opened.iter().map(|h| h.closed_early).sum();
    let first_error = opened.iter().find_map(|h| h.first_error.clone());
    let mut held: Vec<_> = opened.into_iter().flat_map(|h| h.held).collect();
    // Every connection the server kept must be gone a header-read timeout (10 s) after
    // it was accepted; the last was accepted by the end of `opening`.
    let closed = closed_by_server(&mut held, Duration::from_secs(13)).await;
    let p = probe.finish().await;
    let mut problems = Vec::new();
    for (i, what) in PROBES.iter().enumerate() {
        if let Some(first) = &p.first_failure[i] {
            problems.push(format!(
                "{tag}: {} failed {} of {} times: {first}",
                what, p.failures[i], p.rounds
            ));
        }
        if p.worst[i] >= HEALTHZ_BUDGET {
            problems.push(format!(
                "{tag}: {} took {} ms (budget {} ms)",
                what,
                p.worst[i].as_millis(),
                HEALTHZ_BUDGET.as_millis()
            ));
        }
    }
    if p.rounds < 20 {
        problems.push(format!(
            "{tag}: only {} probe rounds ran during the attack",
            p.rounds
        ));
    }
    if p.peak_files > files_before + files_allowed {
        problems.push(format!(
            "{tag}: serve held {} open files at the peak, {} before the attack: more than the \
             {files_allowed} the caps allow",
            p.peak_files, files_before
        ));
    }
    if closed < held.len() {
        problems.push(format!(
            "{tag}: {} of {} connections were still open past the header-read timeout",
            held.len() - closed,
            held.len()
        ));
    }
    let total = from.len() * per_address;
    if failed > total / 10 {
        problems.push(format!(
            "{tag}: {failed} of {total} connects failed (first: {}): the attack did not happen \
             as meant",
            first_error.as_deref().unwrap_or("?")
        ));
    }
    let kept = held.len();
    drop(held);
    let logged = log(a) - log_before;
    if !(1..50).contains(&logged) {
        problems.push(format!(
            "{tag}: serve.log has {logged} new lines about refused or evicted connections: \
             expected between 1 and 49 (aggregated, never silent)"
        ));
    }
    // The descriptors come back.
    let back = testkit::wait_for(
        "serve's open files back to idle",
        Duration::from_secs(10),
        || async { (open_files(pid) <= files_before + 16).then_some(()) },
    );
    back.await;
    let line = format!(
        "{tag}: {} connections opened in {:.1} s ({failed} connects failed); {early} closed by \
         serve (refused or evicted) while the attack went on, the {} it kept all closed by the \
         header-read timeout: {}; probes: {} rounds, worst /healthz {} ms, API {} ms, \
         heartbeat {} ms; serve's open files {} before, {} at the peak; {logged} log lines",
        total - failed,
        opening.as_secs_f64(),
        kept,
        closed == kept,
        p.rounds,
        p.worst[0].as_millis(),
        p.worst[1].as_millis(),
        p.worst[2].as_millis(),
        files_before,
        p.peak_files,
    );
    (problems, line)
}

/// Scope 1 of the faults issue: connections that send half a request (or half a TLS
/// ClientHello) and then nothing, 20,000 from one address and 5,000 from 50 addresses,
/// against the plain-HTTP (loopback) and the TLS listener with their default limits.
/// Throughout: `/healthz`, a logged-in LIST and an agent's heartbeat, each on a new
/// connection, answer 200 within 1 s; serve never holds more descriptors than its caps
/// allow (before the caps it took one per connection until `accept` failed with
/// EMFILE); every connection it kept is closed by the header-read timeout; the refusals
/// and evictions are logged in aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connections_cannot_take_the_appliance_down() {
    // The attacker lets go of the sockets serve closed, so it needs a few thousand files
    // at most; against a serve that kept them all it would run out and fail the test.
    edgevirt::server::raise_file_limit();
    let one: Vec<IpAddr> = vec![ip("127.0.0.2").unwrap()];
    let fifty: Vec<IpAddr> = (0..50)
        .map(|i| format!("127.0.1.{}", i + 1).parse().unwrap())
        .collect();
    let mut problems = Vec::new();
    let mut lines = Vec::new();
    for tls in [false, true] {
        let flags: &[&str] = if tls {
            &["--role", "controller", "--tls"]
        } else {
            &["--role", "controller"]
        };
        let a = Appliance::start(flags).await;
        assert_eq!(a.url.starts_with("https://"), tls, "{}", a.url);
        let agent_token = a.add_token("node:hb", "agent").await;
        let (code, _) = a
            .put_json(
                "/apis/edgevirt.io/v1/nodes/hb",
                &serde_json::json!({"apiVersion": "edgevirt.io/v1", "kind": "Node",
                    "metadata": {"name": "hb"}, "spec": {}}),
            )
            .await;
        assert!(code == 200 || code == 201, "registering node hb: {code}");
        let (payload, listener) = if tls {
            (HALF_CLIENT_HELLO, "TLS")
        } else {
            (HALF_REQUEST_LINE, "plain HTTP")
        };
        // The default caps: 128 per address, 1,024 in all. An evicted connection leaves
        // the caps at once but its socket closes only when its task next runs, which under
        // a one-address flood (an eviction per connect, 10,000 a second) on two busy cores
        // lags: peaks of 220 to 351 files were seen, so up to 4 × the cap is allowed there.
        // With 50 addresses the total cap binds (peaks 1,046 to 1,052): 2 × the cap. Slack
        // for the probes' own connections and SQLite. Without the caps serve held one file
        // per connection: 19,993 of 20,000, and 5,026 of 5,000.
        let (p, l) = attack(
            &a,
            &agent_token,
            &format!("[{listener}] 20,000 from 127.0.0.2"),
            &one,
            20_000,
            payload,
            4 * 128 + 64,
        )
        .await;
        problems.extend(p);
        lines.push(l);
        let (p, l) = attack(
            &a,
            &agent_token,
            &format!("[{listener}] 5,000 from 50 addresses"),
            &fifty,
            100,
            payload,
            2 * 1024 + 64,
        )
        .await;
        problems.extend(p);
        lines.push(l);
        let c = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .unwrap();
        let (_, err) = healthz_once(&c, &a.url).await;
        assert!(err.is_none(), "/healthz after the attacks: {err:?}");
    }
    for l in &lines {
        println!("{l}");
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
