//! The agent's sync loop: for each VMI bound to this node, start, adopt, observe, pause,
//! reboot or stop its domain, and report status; then clean up what nothing owns.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Agent;
use super::prepare::{domain_name, prepare, spawn_launcher};
use crate::launcher::client::{Incompatible, LauncherClient};
use crate::launcher::protocol::{Request, Status};
use crate::types::annotations::{
    LAUNCHER_FINALIZER, PAUSED_ANNOTATION, SOFTREBOOT_ANNOTATION, SOFTREBOOT_DONE_ANNOTATION,
    VOLUMES_FINALIZER, VOLUMES_NODE_ANNOTATION,
};
use crate::types::kubevirt::phase;
use crate::types::now;
use crate::virt::DomainState;

/// How long a started launcher may take to open its socket.
const START_TIMEOUT: Duration = Duration::from_secs(60);

fn vmi_path(ns: &str, name: &str) -> String {
    format!("/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}")
}

/// Connect to every launcher socket found on disk (after an agent restart).
pub async fn adopt_launchers(agent: &Agent) {
    let Ok(mut dir) = tokio::fs::read_dir(agent.launchers_dir()).await else {
        return;
    };
    while let Ok(Some(e)) = dir.next_entry().await {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "sock") {
            continue;
        }
        match LauncherClient::connect(&path).await {
            Ok(c) => {
                tracing::info!(vmi = %c.info.vmi_uid, domain = %c.info.domain_name, pid = c.info.pid, version = c.version, "adopted launcher");
                agent
                    .launchers
                    .lock()
                    .await
                    .insert(c.info.vmi_uid.clone(), c);
            }
            Err(err) => match err.downcast::<Incompatible>() {
                // Its launcher still runs: keep the socket, leave the VM alone.
                Ok(inc) => note_incompatible(agent, &inc).await,
                Err(err) => {
                    tracing::info!(socket = %path.display(), error = %err, "removing stale launcher socket");
                    let _ = tokio::fs::remove_file(&path).await;
                }
            },
        }
    }
}

/// Remember (and say once) that a launcher shares no protocol version with this agent.
async fn note_incompatible(agent: &Agent, e: &Incompatible) {
    let mut map = agent.incompatible.lock().await;
    if map.insert(e.vmi_uid.clone(), e.to_string()).is_none() {
        tracing::error!(vmi = %e.vmi_uid, error = %e, "refusing an incompatible launcher");
    }
}

/// Ask a VMI's launcher for its status, (re)connecting if needed. `Ok(None)`: no launcher;
/// `Err`: a launcher runs but shares no protocol version with this agent.
async fn launcher_status(agent: &Agent, uid: &str) -> Result<Option<Status>, Incompatible> {
    let mut map = agent.launchers.lock().await;
    if let Some(c) = map.get_mut(uid) {
        match c.status().await {
            Ok(s) => return Ok(Some(s)),
            Err(_) => {
                map.remove(uid);
            }
        }
    }
    let sock = crate::launcher::socket_path(&agent.launchers_dir(), uid);
    if !sock.exists() {
        agent.incompatible.lock().await.remove(uid);
        return Ok(None);
    }
    match LauncherClient::connect(&sock).await {
        Ok(mut c) => {
            let s = c.status().await.ok();
            map.insert(uid.to_string(), c);
            agent.starting.lock().await.remove(uid);
            agent.incompatible.lock().await.remove(uid);
            Ok(s)
        }
        Err(e) => match e.downcast::<Incompatible>() {
            Ok(inc) => {
                note_incompatible(agent, &inc).await;
                Err(inc)
            }
            Err(_) => Ok(None),
        },
    }
}

async fn launcher_call(agent: &Agent, uid: &str, req: Request) -> anyhow::Result<()> {
    let mut map = agent.launchers.lock().await;
    let c = map
        .get_mut(uid)
        .ok_or_else(|| anyhow::anyhow!("no launcher connected for {uid}"))?;
    c.call(req).await.map(|_| ())
}

pub async fn sync_all(agent: &Agent, housekeeping: bool) -> anyhow::Result<()> {
    let list = agent
        .api
        .get(&format!(
            "/apis/kubevirt.io/v1/virtualmachineinstances?fieldSelector=status.nodeName%3D{}",
            agent.cfg.node_name
        ))
        .await?;
    let vmis = list["items"].as_array().cloned().unwrap_or_default();
    let mut known: HashSet<String> = agent.incoming.lock().await.clone();
    for vmi in &vmis {
        let uid = vmi["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        known.insert(uid.clone());
        if agent.migrating.lock().await.contains(&uid) {
            continue;
        }
        if let Err(e) = sync_vmi(agent, vmi).await {
            tracing::warn!(vmi = %vmi["metadata"]["name"].as_str().unwrap_or(""), error = %e, "syncing VMI failed");
        }
    }
    // Domains of this installation that no VMI on this node owns are destroyed.
    let hv = agent.hv.clone();
    let owned = tokio::task::spawn_blocking(move || hv.owned_domains()).await??;
    for d in owned {
        // Only this node's domains of this installation: another agent sharing the libvirtd
        // (or another installation) owns the rest.
        let other_node = !d.node.is_empty() && d.node != agent.cfg.node_name;
        if d.install_id != agent.install_id || other_node || known.contains(&d.vmi_uid) {
            continue;
        }
        tracing::warn!(domain = %d.name, vmi = %d.vmi_uid, "destroying a domain no VMI owns");
        let hv = agent.hv.clone();
        let name = d.name.clone();
        let _ = tokio::task::spawn_blocking(move || hv.destroy(&name)).await;
        agent.launchers.lock().await.remove(&d.vmi_uid);
    }
    if housekeeping {
        cleanup_deleted_vms(agent).await?;
    }
    Ok(())
}

async fn sync_vmi(agent: &Agent, vmi: &Value) -> anyhow::Result<()> {
    let meta = &vmi["metadata"];
    let uid = meta["uid"].as_str().unwrap_or_default().to_string();
    let ns = meta["namespace"].as_str().unwrap_or_default().to_string();
    let name = meta["name"].as_str().unwrap_or_default().to_string();
    let dom = domain_name(&ns, &name, &uid);
    let cur_phase = vmi["status"]["phase"]
        .as_str()
        .unwrap_or(phase::PENDING)
        .to_string();
    let Ok(status) = launcher_status(agent, &uid).await else {
        // A launcher this agent cannot talk to: leave the VM, its launcher and the VMI alone.
        return Ok(());
    };

    if meta.get("deletionTimestamp").is_some() {
        return finish_deletion(agent, vmi, &uid, &dom, status).await;
    }
    if phase::is_final(&cur_phase) {
        return Ok(());
    }
    let Some(status) = status else {
        // No launcher. Is the domain still there (launcher crashed or agent restarted)?
        let hv = agent.hv.clone();
        let d2 = dom.clone();
        let state = tokio::task::spawn_blocking(move || hv.state(&d2)).await??;
        let started = agent.starting.lock().await.get(&uid).copied();
        if let Some(msg) = agent.failed_starts.lock().await.remove(&uid) {
            return set_final(
                agent,
                &ns,
                &name,
                vmi,
                phase::FAILED,
                "LauncherFailed",
                &msg,
            )
            .await;
        }
        if started.is_some_and(|t| t.elapsed() < START_TIMEOUT) {
            return Ok(());
        }
        match (state, cur_phase.as_str()) {
            (Some(_), _) => {
                tracing::info!(%dom, "domain runs without a launcher; starting one to adopt it");
                start_launcher(agent, &uid, &dom, &agent.run_dir(&uid).join("domain.xml")).await;
            }
            (None, phase::SCHEDULED) if started.is_none() => {
                let xml = prepare(agent, vmi).await?;
                start_launcher(agent, &uid, &dom, &xml).await;
            }
            (None, phase::SCHEDULED) => {
                return set_final(
                    agent,
                    &ns,
                    &name,
                    vmi,
                    phase::FAILED,
                    "LauncherFailed",
                    "the launcher did not start in time",
                )
                .await;
            }
            (None, _) => {
                return set_final(
                    agent,
                    &ns,
                    &name,
                    vmi,
                    phase::SUCCEEDED,
                    "DomainGone",
                    "the domain has stopped",
                )
                .await;
            }
        }
        return Ok(());
    };
    let Some(state) = status.state else {
        return set_final(
            agent,
            &ns,
            &name,
            vmi,
            phase::SUCCEEDED,
            "GuestShutdown",
            "the guest powered off",
        )
        .await;
    };

    // Desired pause state and soft-reboot requests.
    let annotations = &meta["annotations"];
    let want_paused = annotations[PAUSED_ANNOTATION] == "true";
    if want_paused && state == DomainState::Running {
        launcher_call(agent, &uid, Request::Pause).await?;
    } else if !want_paused && state == DomainState::Paused {
        launcher_call(agent, &uid, Request::Unpause).await?;
    }
    let asked = annotations[SOFTREBOOT_ANNOTATION].as_str().unwrap_or("");
    let done = annotations[SOFTREBOOT_DONE_ANNOTATION]
        .as_str()
        .unwrap_or("");
    if !asked.is_empty() && asked != done && state == DomainState::Running {
        launcher_call(agent, &uid, Request::SoftReboot).await?;
        agent
            .api
            .merge_patch(
                &vmi_path(&ns, &name),
                &json!({"metadata": {"annotations": {SOFTREBOOT_DONE_ANNOTATION: asked}}}),
            )
            .await?;
        tracing::info!(%dom, "soft reboot");
    }

    let status_now = launcher_status(agent, &uid)
        .await
        .ok()
        .flatten()
        .unwrap_or(status);
    let launcher_version = agent
        .launchers
        .lock()
        .await
        .get(&uid)
        .map(|c| c.info.launcher_version.clone());
    let mut new = running_status(agent, vmi, &status_now);
    if let Some(v) = launcher_version.filter(|v| !v.is_empty()) {
        new["launcherVersion"] = json!(v);
    }
    if let Some(t) = status_now.cpu.as_ref().and_then(|c| c.topology.as_ref()) {
        new["currentCPUTopology"] =
            json!({"sockets": t.sockets, "cores": t.cores, "threads": t.threads});
    }
    // migrationState is not the sync loop's: left out, the server keeps the stored one.
    let mut old = vmi["status"].clone();
    if let Some(o) = old.as_object_mut() {
        o.remove("migrationState");
    }
    if new != old {
        agent
            .api
            .put(
                &format!("{}/status", vmi_path(&ns, &name)),
                &json!({"status": new}),
            )
            .await?;
    }
    Ok(())
}

async fn start_launcher(agent: &Agent, uid: &str, dom: &str, xml: &std::path::Path) {
    match spawn_launcher(agent, uid, dom, xml) {
        Ok(mut child) => {
            agent
                .starting
                .lock()
                .await
                .insert(uid.to_string(), Instant::now());
            // Wake the sync loop as soon as the launcher's socket appears (its domain runs).
            let sock = crate::launcher::socket_path(&agent.launchers_dir(), uid);
            let wake = agent.wake.clone();
            tokio::spawn(async move {
                let deadline = Instant::now() + START_TIMEOUT;
                while Instant::now() < deadline {
                    if sock.exists() {
                        wake.notify_one();
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            let uid = uid.to_string();
            let log = agent.log_dir().join(format!("launcher-{uid}.log"));
            let fails = agent.failed_starts.clone();
            tokio::spawn(async move {
                // Reap the launcher; remember why it failed if it did.
                if let Ok(st) = child.wait().await
                    && !st.success()
                {
                    let tail = std::fs::read_to_string(&log)
                        .ok()
                        .and_then(|t| {
                            t.lines()
                                .rev()
                                .find(|l| !l.trim().is_empty())
                                .map(str::to_string)
                        })
                        .unwrap_or_else(|| format!("launcher exited with {st}"));
                    fails.lock().await.insert(uid, tail);
                }
            });
        }
        Err(e) => tracing::error!(error = %e, "cannot start launcher"),
    }
}

fn running_status(agent: &Agent, vmi: &Value, s: &Status) -> Value {
    let mut st = vmi["status"].clone();
    if let Some(o) = st.as_object_mut() {
        o.remove("migrationState");
    }
    let paused = s.state == Some(DomainState::Paused);
    st["phase"] = json!(phase::RUNNING);
    if st["phaseTransitionTimestampsMap"][phase::RUNNING].is_null() {
        st["phaseTransitionTimestampsMap"][phase::RUNNING] = json!(now());
    }
    if let Some(o) = st.as_object_mut() {
        o.remove("reason");
    }
    st["nodeName"] = json!(agent.cfg.node_name);
    st["domainName"] = json!(domain_name(
        vmi["metadata"]["namespace"].as_str().unwrap_or(""),
        vmi["metadata"]["name"].as_str().unwrap_or(""),
        vmi["metadata"]["uid"].as_str().unwrap_or("")
    ));
    let ifaces: Vec<Value> = {
        let mut by_mac: Vec<(Option<String>, String, Vec<String>)> = Vec::new();
        for a in &s.addresses {
            match by_mac.iter_mut().find(|(m, _, _)| *m == a.mac) {
                Some(e) => e.2.push(a.ip.clone()),
                None => by_mac.push((a.mac.clone(), a.interface.clone(), vec![a.ip.clone()])),
            }
        }
        let spec_ifaces = vmi["spec"]["domain"]["devices"]["interfaces"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        by_mac
            .into_iter()
            .enumerate()
            .map(|(i, (mac, iname, ips))| {
                json!({
                    "name": spec_ifaces.get(i).and_then(|x| x["name"].as_str()).unwrap_or("default"),
                    "ipAddress": ips[0],
                    "ipAddresses": ips,
                    "mac": mac,
                    "interfaceName": iname,
                    "infoSource": s.address_source.clone().unwrap_or_default(),
                })
            })
            .collect()
    };
    if !ifaces.is_empty() || st["interfaces"].is_null() {
        st["interfaces"] = json!(ifaces);
    }
    if let Some(g) = &s.guest {
        st["guestOSInfo"] = serde_json::to_value(&g.os).unwrap_or_default();
        st["guestAgentInfo"] = serde_json::to_value(g).unwrap_or_default();
    }
    let mut conds: Vec<Value> = st["conditions"].as_array().cloned().unwrap_or_default();
    set(
        &mut conds,
        "Ready",
        !paused,
        if paused { "Paused" } else { "" },
    );
    set(
        &mut conds,
        "AgentConnected",
        s.agent_connected,
        if s.agent_connected {
            ""
        } else {
            "GuestAgentNotConnected"
        },
    );
    set(
        &mut conds,
        "Paused",
        paused,
        if paused { "PausedByUser" } else { "" },
    );
    let m = crate::controller::live_migratable(vmi);
    let new = json!({"type": "LiveMigratable", "status": if m.ok { "True" } else { "False" },
        "reason": m.reason, "message": m.message, "lastTransitionTime": now()});
    match conds.iter_mut().find(|c| c["type"] == "LiveMigratable") {
        Some(c) if c["status"] == new["status"] && c["message"] == new["message"] => {}
        Some(c) => *c = new,
        None => conds.push(new),
    }
    st["conditions"] = json!(conds);
    st["migrationMethod"] = json!(m.method);
    st
}

fn set(conds: &mut Vec<Value>, t: &str, ok: bool, reason: &str) {
    let status = if ok { "True" } else { "False" };
    match conds.iter_mut().find(|c| c["type"] == t) {
        Some(c) if c["status"] == status => {}
        Some(c) => {
            *c = json!({"type": t, "status": status, "reason": reason, "lastTransitionTime": now()})
        }
        None => conds.push(
            json!({"type": t, "status": status, "reason": reason, "lastTransitionTime": now()}),
        ),
    }
}

async fn set_final(
    agent: &Agent,
    ns: &str,
    name: &str,
    vmi: &Value,
    p: &str,
    reason: &str,
    msg: &str,
) -> anyhow::Result<()> {
    let mut st = vmi["status"].clone();
    st["phase"] = json!(p);
    st["reason"] = json!(reason);
    st["phaseTransitionTimestampsMap"][p] = json!(now());
    let mut conds: Vec<Value> = st["conditions"].as_array().cloned().unwrap_or_default();
    set(&mut conds, "Ready", false, reason);
    set(
        &mut conds,
        "AgentConnected",
        false,
        "GuestAgentNotConnected",
    );
    st["conditions"] = json!(conds);
    tracing::info!(namespace = %ns, %name, phase = %p, %reason, %msg, "VMI finished");
    agent
        .api
        .put(
            &format!("{}/status", vmi_path(ns, name)),
            &json!({"status": st}),
        )
        .await?;
    Ok(())
}

/// Stop a deleted VMI's domain gracefully, then let the VMI go.
async fn finish_deletion(
    agent: &Agent,
    vmi: &Value,
    uid: &str,
    dom: &str,
    status: Option<Status>,
) -> anyhow::Result<()> {
    let grace = vmi["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or(30);
    let hv = agent.hv.clone();
    let d2 = dom.to_string();
    let exists = tokio::task::spawn_blocking(move || hv.state(&d2))
        .await??
        .is_some();
    if exists {
        let mut stopping = agent.stopping.lock().await;
        match stopping.get(uid) {
            None => {
                stopping.insert(uid.to_string(), Instant::now());
                drop(stopping);
                if status.is_some() {
                    launcher_call(agent, uid, Request::Shutdown { grace_secs: grace }).await?;
                } else {
                    let hv = agent.hv.clone();
                    let d2 = dom.to_string();
                    let _ = tokio::task::spawn_blocking(move || hv.shutdown(&d2)).await;
                }
                tracing::info!(domain = %dom, grace, "shutting down");
            }
            Some(t) if t.elapsed() > Duration::from_secs(grace + 5) => {
                let hv = agent.hv.clone();
                let d2 = dom.to_string();
                let _ = tokio::task::spawn_blocking(move || hv.destroy(&d2)).await;
            }
            Some(_) => {}
        }
        return Ok(());
    }
    agent.stopping.lock().await.remove(uid);
    agent.launchers.lock().await.remove(uid);
    agent.starting.lock().await.remove(uid);
    let _ = tokio::fs::remove_dir_all(agent.run_dir(uid)).await;
    let _ = tokio::fs::remove_file(crate::launcher::socket_path(&agent.launchers_dir(), uid)).await;
    let finalizers: Vec<Value> = vmi["metadata"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f != LAUNCHER_FINALIZER)
        .collect();
    let ns = vmi["metadata"]["namespace"].as_str().unwrap_or_default();
    let name = vmi["metadata"]["name"].as_str().unwrap_or_default();
    agent
        .api
        .merge_patch(
            &vmi_path(ns, name),
            &json!({"metadata": {"finalizers": finalizers}}),
        )
        .await?;
    tracing::info!(domain = %dom, "VMI released");
    Ok(())
}

/// Remove the volumes of deleted VMs whose disks live on this node.
async fn cleanup_deleted_vms(agent: &Agent) -> anyhow::Result<()> {
    let list = agent
        .api
        .get("/apis/kubevirt.io/v1/virtualmachines")
        .await?;
    for vm in list["items"].as_array().into_iter().flatten() {
        let meta = &vm["metadata"];
        if meta.get("deletionTimestamp").is_none()
            || meta["annotations"][VOLUMES_NODE_ANNOTATION].as_str()
                != Some(agent.cfg.node_name.as_str())
        {
            continue;
        }
        let (ns, name) = (
            meta["namespace"].as_str().unwrap_or(""),
            meta["name"].as_str().unwrap_or(""),
        );
        if agent.api.get_opt(&vmi_path(ns, name)).await?.is_some() {
            continue;
        }
        let uid = meta["uid"].as_str().unwrap_or_default();
        if !uid.is_empty() {
            let _ = tokio::fs::remove_dir_all(agent.volumes_dir(uid)).await;
        }
        let finalizers: Vec<Value> = meta["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != VOLUMES_FINALIZER)
            .collect();
        agent
            .api
            .merge_patch(
                &format!("/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}"),
                &json!({"metadata": {"finalizers": finalizers}}),
            )
            .await?;
        tracing::info!(namespace = %ns, %name, "removed the volumes of a deleted VM");
    }
    Ok(())
}
