//! Work inside a running guest for its VMI: KubeVirt's readiness and liveness probes, and
//! access credentials propagated through the guest agent. The sync loop calls [`tick`] for
//! each running VMI; what to do and when is decided in [`crate::rules::guest`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::Digest;

use super::Agent;
use super::ports::LauncherStatus;
use crate::launcher::client::LauncherError;
use crate::rules::guest::{ProbeAction, ProbeState, ProbeTiming, authorized_keys};
use crate::types::Meta;
use crate::types::kubevirt::{Probe, VirtualMachineInstance};

/// KubeVirt's reasons of the `AccessCredentialsSynchronized` condition.
pub const CREDENTIALS_SYNCED: &str = "AccessCredentialsSyncSuccess";
pub const CREDENTIALS_FAILED: &str = "AccessCredentialsSyncFailed";
/// The reason of a VMI its liveness probe failed (as KubeVirt's).
pub const LIVENESS_FAILED: &str = "LivenessProbeFailed";

/// How often credentials are read again from their Secrets (and written when they changed).
const CREDENTIALS_EVERY: Duration = Duration::from_secs(10);

/// What the agent keeps per running instance (rebuilt after an agent restart: probes start
/// over with their initial delay, credentials are written once more).
#[derive(Default)]
pub struct GuestWork {
    readiness: Option<ProbeState>,
    liveness: Option<ProbeState>,
    /// Fingerprint of the credentials last written, and when they were last looked at.
    credentials: Option<String>,
    credentials_at: Option<Instant>,
    credentials_status: Option<(bool, String)>,
    /// The liveness probe failed and the agent stopped the domain: why. A domain found
    /// gone afterwards ended for this reason, not by a shutdown of its own.
    killed: Option<String>,
}

pub type GuestWorks = HashMap<String, GuestWork>;

/// What a tick found.
#[derive(Debug, Default, PartialEq)]
pub struct Outcome {
    /// With a readiness probe: whether it passes, and why not.
    pub ready: Option<(bool, String)>,
    /// The liveness probe failed: why.
    pub dead: Option<String>,
    /// With guest-agent credentials: whether they are written, and why not.
    pub credentials: Option<(bool, String)>,
}

/// Run what is due for a running VMI.
pub async fn tick(agent: &Agent, vmi: &VirtualMachineInstance, ls: &LauncherStatus) -> Outcome {
    let uid = vmi.uid().to_string();
    let now = Instant::now();
    let mut works = agent.guest.lock().await;
    let w = works.entry(uid.clone()).or_default();
    let mut out = Outcome::default();
    for (probe, liveness) in [
        (&vmi.spec.readiness_probe, false),
        (&vmi.spec.liveness_probe, true),
    ] {
        let Some(probe) = probe else { continue };
        let at = if liveness {
            "spec.livenessProbe"
        } else {
            "spec.readinessProbe"
        };
        let (Ok(action), Ok(timing)) = (
            ProbeAction::of(probe, at),
            ProbeTiming::of(probe, at, liveness),
        ) else {
            continue; // admission refuses these; an older stored spec is left alone
        };
        let slot = if liveness {
            &mut w.liveness
        } else {
            &mut w.readiness
        };
        let state = slot.get_or_insert_with(|| ProbeState::new(timing, now));
        if state.due(now) {
            match run(agent, &uid, &action, timing.timeout, ls).await {
                Some((ok, msg)) => {
                    if !ok {
                        tracing::debug!(vmi = %vmi.name(), probe = at, kind = probe_kind(probe), %msg, "probe failed");
                    }
                    state.record(ok, msg, now);
                }
                None => state.record(true, String::new(), now),
            }
        }
        if liveness {
            if state.passing == Some(false) {
                out.dead = Some(format!("liveness probe failed: {}", state.message));
            }
        } else {
            out.ready = Some(match state.passing {
                Some(true) => (true, String::new()),
                Some(false) => (false, format!("readiness probe failed: {}", state.message)),
                None => (false, "readiness probe has not passed yet".into()),
            });
        }
    }
    if wants_agent_credentials(vmi) {
        let due = w
            .credentials_at
            .is_none_or(|t| now >= t + CREDENTIALS_EVERY);
        if due && ls.status.agent_connected {
            w.credentials_at = Some(now);
            let r = sync_credentials(agent, vmi, &uid, w.credentials.as_deref()).await;
            w.credentials_status = Some(match r {
                Ok(Some(fp)) => {
                    tracing::info!(vmi = %vmi.name(), "access credentials written by the guest agent");
                    w.credentials = Some(fp);
                    (true, String::new())
                }
                Ok(None) => (true, String::new()),
                Err(e) => {
                    tracing::warn!(vmi = %vmi.name(), error = %e, "access credentials not written");
                    (false, e)
                }
            });
        }
        out.credentials = w.credentials_status.clone();
    }
    out
}

/// The name of a probe's action, for logs.
fn probe_kind(p: &Probe) -> &'static str {
    if p.exec.is_some() {
        "exec"
    } else if p.tcp_socket.is_some() {
        "tcpSocket"
    } else if p.http_get.is_some() {
        "httpGet"
    } else {
        "guestAgentPing"
    }
}

/// Remember that the agent stops this instance because its liveness probe failed.
pub async fn mark_killed(agent: &Agent, uid: &str, why: &str) {
    let mut works = agent.guest.lock().await;
    works.entry(uid.to_string()).or_default().killed = Some(why.to_string());
}

/// Why the agent stopped this instance, if it did (its liveness probe failed).
pub async fn killed(agent: &Agent, uid: &str) -> Option<String> {
    agent
        .guest
        .lock()
        .await
        .get(uid)
        .and_then(|w| w.killed.clone())
}

/// Forget an instance that stopped or left the node.
pub async fn forget(agent: &Agent, uid: &str) {
    agent.guest.lock().await.remove(uid);
}

/// Run one probe: `Some((passed, why))`, or `None` when it cannot run here at all (a
/// launcher of an older release), which counts as neither.
async fn run(
    agent: &Agent,
    uid: &str,
    action: &ProbeAction,
    timeout: Duration,
    ls: &LauncherStatus,
) -> Option<(bool, String)> {
    let guest_ip = || ls.status.addresses.first().map(|a| a.ip.clone());
    match action {
        ProbeAction::GuestAgentPing => {
            match agent
                .launchers
                .guest_agent(uid, json!({"execute": "guest-ping"}), timeout)
                .await
            {
                Ok(_) => Some((true, String::new())),
                // An older launcher: its own pings (every 2 s) say whether the agent answers.
                Err(LauncherError::Unsupported(_)) => Some((
                    ls.status.agent_connected,
                    "the guest agent does not answer".into(),
                )),
                Err(e) => Some((false, format!("the guest agent does not answer: {e}"))),
            }
        }
        ProbeAction::Exec(cmd) => match exec(agent, uid, cmd, timeout).await {
            Ok(r) => Some(r),
            Err(LauncherError::Unsupported(_)) => None,
            Err(e) => Some((false, format!("{cmd:?}: {e}"))),
        },
        ProbeAction::Tcp { host, port } => {
            let Some(ip) = host.clone().or_else(guest_ip) else {
                return Some((false, "the guest has no address yet".into()));
            };
            let r = tokio::time::timeout(
                timeout,
                tokio::net::TcpStream::connect((ip.as_str(), *port)),
            )
            .await;
            Some(match r {
                Ok(Ok(_)) => (true, String::new()),
                Ok(Err(e)) => (false, format!("{ip}:{port}: {e}")),
                Err(_) => (false, format!("{ip}:{port}: no answer in {timeout:?}")),
            })
        }
        ProbeAction::Http {
            host,
            port,
            path,
            https,
            headers,
        } => {
            let Some(ip) = host.clone().or_else(guest_ip) else {
                return Some((false, "the guest has no address yet".into()));
            };
            Some(http(&ip, *port, path, *https, headers, timeout).await)
        }
    }
}

/// `guest-exec`, then `guest-exec-status` until the command exits or `timeout` passes.
async fn exec(
    agent: &Agent,
    uid: &str,
    cmd: &[String],
    timeout: Duration,
) -> Result<(bool, String), LauncherError> {
    let started = agent
        .launchers
        .guest_agent(
            uid,
            json!({"execute": "guest-exec", "arguments": {
                "path": cmd[0], "arg": &cmd[1..], "capture-output": true}}),
            timeout,
        )
        .await?;
    let Some(pid) = started["pid"].as_i64() else {
        return Ok((false, "the guest agent started no process".into()));
    };
    let deadline = Instant::now() + timeout;
    loop {
        let st = agent
            .launchers
            .guest_agent(
                uid,
                json!({"execute": "guest-exec-status", "arguments": {"pid": pid}}),
                timeout,
            )
            .await?;
        if st["exited"] == true {
            let code = st["exitcode"].as_i64().unwrap_or(-1);
            if code == 0 {
                return Ok((true, String::new()));
            }
            use base64::Engine as _;
            let text = |k: &str| {
                st[k]
                    .as_str()
                    .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
                    .map(|b| {
                        String::from_utf8_lossy(&b)
                            .trim()
                            .chars()
                            .take(200)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let said: String = [text("err-data"), text("out-data")]
                .into_iter()
                .find(|s: &String| !s.is_empty())
                .unwrap_or_default();
            return Ok((false, format!("{cmd:?} exited with status {code} {said}")));
        }
        if Instant::now() >= deadline {
            return Ok((false, format!("{cmd:?} did not finish in {timeout:?}")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn http(
    ip: &str,
    port: u16,
    path: &str,
    https: bool,
    headers: &[(String, String)],
    timeout: Duration,
) -> (bool, String) {
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    let url = format!(
        "{}://{host}:{port}{path}",
        if https { "https" } else { "http" }
    );
    // As Kubernetes' HTTPS probes: the guest's certificate is not checked.
    crate::tls::install_crypto_provider();
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .danger_accept_invalid_certs(true)
        .build();
    let client = match client {
        Ok(c) => c,
        Err(e) => return (false, format!("{url}: {e}")),
    };
    let mut req = client.get(&url).header("User-Agent", "edgevirt-probe");
    for (k, v) in headers {
        req = req.header(k, v);
    }
    match req.send().await {
        Ok(r) if (200..400).contains(&r.status().as_u16()) => (true, String::new()),
        Ok(r) => (false, format!("{url}: HTTP {}", r.status())),
        Err(e) => (false, format!("{url}: {e}")),
    }
}

fn wants_agent_credentials(vmi: &VirtualMachineInstance) -> bool {
    vmi.spec.access_credentials.iter().any(|c| {
        c.user_password.is_some()
            || c.ssh_public_key
                .as_ref()
                .is_some_and(|k| k.propagation_method.qemu_guest_agent.is_some())
    })
}

/// Write the guest-agent credentials when they differ from `applied` (a fingerprint):
/// `Ok(Some(new fingerprint))` when written, `Ok(None)` when unchanged.
async fn sync_credentials(
    agent: &Agent,
    vmi: &VirtualMachineInstance,
    uid: &str,
    applied: Option<&str>,
) -> Result<Option<String>, String> {
    use base64::Engine as _;
    let ns = vmi.namespace();
    let secret = |name: &str| {
        let name = name.to_string();
        async move {
            agent
                .cp
                .secret_data(ns, &name)
                .await
                .map_err(|e| format!("{e:#}"))
        }
    };
    let mut commands: Vec<Value> = Vec::new();
    for c in &vmi.spec.access_credentials {
        if let Some(k) = &c.ssh_public_key
            && let Some(g) = &k.propagation_method.qemu_guest_agent
            && let Some(s) = &k.source.secret
        {
            let data = secret(&s.secret_name).await?;
            let keys = authorized_keys(&data);
            for user in &g.users {
                commands.push(json!({"execute": "guest-ssh-add-authorized-keys",
                    "arguments": {"username": user, "keys": keys, "reset": true}}));
            }
        }
        if let Some(p) = &c.user_password
            && let Some(s) = &p.source.secret
        {
            let data = secret(&s.secret_name).await?;
            for (user, password) in &data {
                crate::rules::guest::check_user(user, "user")
                    .map_err(|e| format!("Secret {}: {}", s.secret_name, e.0))?;
                commands.push(json!({"execute": "guest-set-user-password",
                    "arguments": {"username": user, "crypted": false,
                        "password": base64::engine::general_purpose::STANDARD.encode(password)}}));
            }
        }
    }
    let fp = hex::encode(sha2::Sha256::digest(
        serde_json::to_vec(&commands).unwrap_or_default(),
    ));
    if applied == Some(fp.as_str()) {
        return Ok(None);
    }
    for c in commands {
        let what = format!(
            "{} for {}",
            c["execute"].as_str().unwrap_or(""),
            c["arguments"]["username"].as_str().unwrap_or("")
        );
        agent
            .launchers
            .guest_agent(uid, c, Duration::from_secs(10))
            .await
            .map_err(|e| format!("{what}: {e}"))?;
    }
    Ok(Some(fp))
}
