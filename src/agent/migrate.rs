//! Live migration, the agents' part (the controller's is in `controller::migration`).
//!
//! Target node: when a migration to this node is `Scheduled`, prepare the instance as for a
//! start (images, overlays, NoCloud disk, domain XML with this node's paths), publish the
//! XML in the migration's status and set `TargetReady`; then listen for the source's
//! direct connections ([`direct`]), keep a tunnel side waiting at the controller, and join
//! each connection, direct or paired, to the local libvirtd socket.
//!
//! Source node: at `TargetReady`, set `Running`, learn the target's direct path through the
//! relay, listen on a unix socket whose every connection goes to the target (directly, or
//! tunnelled through the relay when that fails), and have the launcher migrate the domain
//! peer to peer, tunnelled, to `qemu+unix:///system?socket=THAT` with the target's XML.
//! A block migration (local disks copied) cannot be tunnelled by libvirt: the launcher
//! migrates peer to peer without the tunnel, sending QEMU's memory and disk streams to unix
//! sockets the source agent listens on; each connection there goes to the target the same
//! way, and the target agent joins it to the socket of the same path on which the target's
//! QEMU listens.
//! Only when libvirt reports success does the VMI's `nodeName` change; any failure or an
//! abort (the migration was deleted) leaves the VM running here.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::Message;

use super::Agent;
use super::direct;
use super::ports::Stored;
use super::prepare::{domain_name, prepare};
use super::relay::{Ws, pipe};
use crate::launcher::protocol::Request;
use crate::types::kubevirt::{MigrationMethod, MigrationPhase as Mp, MigrationState};
use crate::types::{Meta, VirtualMachineInstance, VirtualMachineInstanceMigration, now};

/// The local libvirtd's socket, which paired tunnels reach on the target.
pub fn libvirt_socket() -> String {
    std::env::var("EDGEVIRT_LIBVIRT_SOCKET").unwrap_or_else(|_| "/run/libvirt/libvirt-sock".into())
}

/// Where a block migration's unix sockets live. The path must be the same on both hosts (libvirt
/// hands the source's socket URIs to the target, whose QEMU listens under them), so it is
/// not under the agent's data directory; it is under /run/libvirt because QEMU, which
/// libvirtd starts, creates the target's sockets.
pub fn migration_socket_dir() -> std::path::PathBuf {
    std::env::var_os("EDGEVIRT_MIGRATION_SOCKET_DIR")
        .map(Into::into)
        .unwrap_or_else(|| "/run/libvirt/edgevirt-migration".into())
}

/// The socket of one of a block migration's QEMU streams (`memory` or `disks`), in `dir`
/// ([`migration_socket_dir`] outside tests).
fn stream_socket(dir: &std::path::Path, migration_uid: &str, stream: &str) -> std::path::PathBuf {
    dir.join(format!("{migration_uid}-{stream}.sock"))
}

/// A migration this agent takes part in.
pub struct Task {
    source: bool,
    handle: tokio::task::JoinHandle<()>,
    abort_sent: bool,
    vmi_uid: String,
}

/// Move a migration to `phase`, adding to KubeVirt's transition list, with `change` made
/// to its `migrationState` (and `target_domain` when given). The whole status is sent as a
/// merge patch, as it always was; fields this release does not know are kept.
async fn set_phase(
    agent: &Agent,
    ns: &str,
    name: &str,
    phase: Mp,
    target_domain: Option<String>,
    change: impl FnOnce(&mut MigrationState),
) -> anyhow::Result<()> {
    let cur = agent.cp.get_migration(ns, name).await?;
    let before = cur.obj.status.clone();
    let mut st = before.clone().unwrap_or_default();
    crate::rules::migration::set_phase(&mut st, phase);
    if target_domain.is_some() {
        st.target_domain = target_domain;
    }
    let mut ms = st.migration_state.clone().unwrap_or_default();
    change(&mut ms);
    if ms != MigrationState::default() || st.migration_state.is_some() {
        st.migration_state = Some(ms);
    }
    let status = cur.status_change(&before, &Some(st));
    agent
        .cp
        .patch_migration_status(ns, name, json!({ "status": status }))
        .await
}

/// A failed migration's state.
fn failed(reason: String) -> impl FnOnce(&mut MigrationState) {
    move |ms| {
        ms.failed = true;
        ms.end_timestamp = Some(now());
        ms.failure_reason = Some(reason);
    }
}

/// The phase of a migration (Pending when it has none yet).
fn phase_of(m: &VirtualMachineInstanceMigration) -> Mp {
    m.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

fn state_of(m: &VirtualMachineInstanceMigration) -> MigrationState {
    m.status
        .as_ref()
        .and_then(|s| s.migration_state.clone())
        .unwrap_or_default()
}

/// One pass over the migrations that involve this node.
pub async fn sync(agent: &Arc<Agent>) -> anyhow::Result<()> {
    let list = agent.cp.migrations().await?;
    let me = agent.cfg.node_name.as_str();
    // A migration that does not decode is not followed, but its task is not stopped either.
    let mut seen = list.undecodable.clone();
    for stored in &list.items {
        let m = &stored.obj;
        let st = state_of(m);
        let uid = m.uid().to_string();
        let phase = phase_of(m);
        let (source, target) = (
            st.source_node.as_deref() == Some(me),
            st.target_node.as_deref() == Some(me),
        );
        if !source && !target {
            continue;
        }
        seen.push(uid.clone());
        let mut tasks = agent.migrations.lock().await;
        let running = tasks.get(&uid).is_some_and(|t| !t.handle.is_finished());
        let starts = (target && phase == Mp::Scheduled) || (source && phase == Mp::TargetReady);
        if starts && !tasks.contains_key(&uid) {
            let vmi = agent
                .cp
                .get_vmi(m.namespace(), &m.spec.vmi_name)
                .await?
                .ok_or_else(|| anyhow::anyhow!("VMI {} not found", m.spec.vmi_name))?;
            let t = if target {
                spawn_target(agent.clone(), m.clone(), vmi)
            } else {
                spawn_source(agent.clone(), m.clone(), vmi.obj)
            };
            tasks.insert(uid.clone(), t);
        } else if source && phase == Mp::Running {
            match tasks.get_mut(&uid) {
                Some(t) if running && st.abort_requested && !t.abort_sent => {
                    t.abort_sent = true;
                    tracing::info!(migration = %uid, "aborting the migration");
                    if let Err(e) = agent.launchers.abort_migration(&t.vmi_uid).await {
                        tracing::warn!(error = %e, code = e.code(), "aborting the migration failed");
                    }
                }
                Some(_) => {}
                None => {
                    // This agent restarted while its launcher migrated: it cannot follow
                    // the outcome, so it fails the migration (the controller's checks and
                    // the next sync show where the guest really runs).
                    let _ = set_phase(
                        agent,
                        m.namespace(),
                        m.name(),
                        Mp::Failed,
                        None,
                        failed("the source agent restarted during the migration".into()),
                    )
                    .await;
                }
            }
        }
        if phase.is_final()
            && let Some(t) = tasks.get(&uid)
            && !t.source
        {
            // The target stops waiting for tunnels; a successful one leaves a running
            // domain that the sync loop adopts now that the VMI names this node.
            t.handle.abort();
            let vmi_uid = t.vmi_uid.clone();
            tasks.remove(&uid);
            drop(tasks);
            finish_target(agent, m, &vmi_uid, phase == Mp::Succeeded).await;
            continue;
        }
        if phase.is_final() && tasks.get(&uid).is_some_and(|t| t.handle.is_finished()) {
            tasks.remove(&uid);
        }
    }
    // Migrations deleted outright: stop their tasks.
    let mut tasks = agent.migrations.lock().await;
    let gone: Vec<String> = tasks
        .keys()
        .filter(|k| !seen.contains(k))
        .cloned()
        .collect();
    for k in gone {
        if let Some(t) = tasks.remove(&k)
            && !t.source
        {
            t.handle.abort();
            agent.incoming.lock().await.remove(&t.vmi_uid);
        }
    }
    Ok(())
}

fn spawn_target(
    agent: Arc<Agent>,
    m: VirtualMachineInstanceMigration,
    vmi: Stored<VirtualMachineInstance>,
) -> Task {
    let vmi_uid = vmi.obj.uid().to_string();
    let a2 = agent.clone();
    let handle = tokio::spawn(async move {
        let (ns, name) = (m.namespace(), m.name());
        if let Err(e) = run_target(&a2, ns, name, m.uid(), &vmi).await {
            tracing::warn!(migration = %name, error = %format!("{e:#}"), "preparing the migration target failed");
            let _ = set_phase(
                &a2,
                ns,
                name,
                Mp::Failed,
                None,
                failed(format!("preparing the target failed: {e:#}")),
            )
            .await;
        }
    });
    Task {
        source: false,
        handle,
        abort_sent: false,
        vmi_uid,
    }
}

async fn run_target(
    agent: &Arc<Agent>,
    ns: &str,
    name: &str,
    mig_uid: &str,
    vmi: &Stored<VirtualMachineInstance>,
) -> anyhow::Result<()> {
    let uid = vmi.obj.uid().to_string();
    let vmi_name = vmi.obj.name();
    // The incoming domain must survive the sync loop's sweep of domains no VMI here owns.
    agent.incoming.lock().await.insert(uid.clone());
    set_phase(agent, ns, name, Mp::PreparingTarget, None, |_| {}).await?;
    let xml_path = prepare(agent, vmi).await?;
    let xml = tokio::fs::read_to_string(&xml_path).await?;
    // For a block migration, QEMU listens here under the paths the source names.
    tokio::fs::create_dir_all(&agent.migration_dir).await?;
    // Taps on a VLAN get it the moment the incoming QEMU makes them, long before the
    // guest runs here.
    let mut taps = crate::hostnet::read_tap_vlans(&agent.run_dir(&uid))?;
    let vlans = async move {
        while !taps.is_empty() {
            taps = tokio::task::spawn_blocking(move || crate::hostnet::set_present(taps))
                .await
                .unwrap_or_default();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    // The direct path, when this node has an address for it; the relay always stays open.
    let ip = direct::migration_ip(
        agent.cfg.migration_address.as_deref(),
        &agent.cfg.controller_url,
    )
    .await;
    let listener = match ip {
        Some(ip) => direct::Listener::bind(ip)
            .await
            .inspect_err(|e| tracing::warn!(%ip, error = %format!("{e:#}"), "no direct migration path; the relay carries it"))
            .ok(),
        None => None,
    };
    let offer = listener.as_ref().map(|l| l.offer().clone());
    set_phase(agent, ns, name, Mp::TargetReady, Some(xml), |ms| {
        if let Some(o) = &offer {
            ms.target_node_address = Some(o.address.ip().to_string());
            ms.target_direct_migration_node_ports =
                Some([(o.address.port().to_string(), 0)].into_iter().collect());
        }
    })
    .await?;
    tracing::info!(migration = %name, vmi = %vmi_name, direct = ?offer.as_ref().map(|o| o.address), "migration target ready");
    let serve = async {
        match listener {
            Some(l) => {
                let (dir, mig_uid) = (agent.migration_dir.clone(), mig_uid.to_string());
                l.serve(move |stream| local_socket(&dir, &mig_uid, stream))
                    .await
            }
            None => std::future::pending().await,
        }
    };
    // The relay keeps serving whatever happens to the direct listener.
    let relay = async {
        let tunnels = tunnels(agent, ns, name, mig_uid, offer.as_ref());
        tokio::pin!(tunnels);
        tokio::select! {
            r = &mut tunnels => r,
            _ = serve => tunnels.await,
        }
    };
    let (_, r) = tokio::join!(vlans, relay);
    r
}

/// The local socket a migration stream goes to on the target: libvirtd's own for
/// `libvirt`, the incoming QEMU's for a block migration's `memory` and `disks`.
fn local_socket(dir: &std::path::Path, mig_uid: &str, stream: &str) -> Option<std::path::PathBuf> {
    match stream {
        "libvirt" => Some(libvirt_socket().into()),
        "memory" | "disks" => Some(stream_socket(dir, mig_uid, stream)),
        _ => None,
    }
}

/// Keep one tunnel side waiting; each paired one goes to the local libvirtd (or, for a
/// block migration, to the socket of the QEMU stream it names).
async fn tunnels(
    agent: &Arc<Agent>,
    ns: &str,
    name: &str,
    mig_uid: &str,
    offer: Option<&direct::Offer>,
) -> anyhow::Result<()> {
    for n in 0u32.. {
        let path = format!("/migration-tunnel/{ns}/{name}/{n}?side=target");
        let mut ws = agent.cp.tunnel(&path).await?;
        let stream = wait_paired(&mut ws).await?;
        if stream == direct::OFFER_STREAM {
            // The source asks how to come directly; the relay is the only channel both
            // agents trust, so the key travels there and nowhere else.
            let text = match offer {
                Some(o) => serde_json::to_string(o)?,
                None => "{}".into(),
            };
            tokio::spawn(async move {
                let _ = ws.send(Message::Text(text.into())).await;
                let _ = ws.close(None).await;
            });
            continue;
        }
        let Some(local) = local_socket(&agent.migration_dir, mig_uid, &stream) else {
            anyhow::bail!("the tunnel names an unknown stream {stream:?}");
        };
        tokio::spawn(async move {
            let r = async {
                let sock = tokio::net::UnixStream::connect(&local)
                    .await
                    .map_err(|e| anyhow::anyhow!("connecting to {}: {e}", local.display()))?;
                pipe(ws, sock).await
            }
            .await;
            if let Err(e) = r {
                tracing::debug!(%stream, error = %format!("{e:#}"), "target tunnel ended");
            }
        });
    }
    Ok(())
}

async fn finish_target(
    agent: &Arc<Agent>,
    m: &VirtualMachineInstanceMigration,
    vmi_uid: &str,
    ok: bool,
) {
    let (ns, name, vmi_name) = (m.namespace(), m.name(), m.spec.vmi_name.as_str());
    let dom = domain_name(ns, vmi_name, vmi_uid);
    if ok {
        let hv = agent.hv.clone();
        let d2 = dom.clone();
        if let Ok(Ok(Some(ms))) =
            tokio::task::spawn_blocking(move || hv.completed_migration_downtime_ms(&d2)).await
        {
            let patch = json!({"status": {"migrationState": {"downtimeMs": ms}}});
            let _ = agent
                .cp
                .patch_migration_status(ns, name, patch.clone())
                .await;
            let _ = agent.cp.patch_vmi_status(ns, vmi_name, patch).await;
            tracing::info!(migration = %name, downtime_ms = ms, "incoming migration completed");
        }
        // The VM's folder here (its EFI variables, its vTPM) is now the one it uses.
        if let Ok(Some(vmi)) = agent.cp.get_vmi(ns, vmi_name).await
            && agent
                .volumes_dir(&super::prepare::owner_uid(&vmi.obj))
                .is_dir()
        {
            let patch = json!({"metadata": {"annotations": {
                crate::types::annotations::VOLUMES_NODE_ANNOTATION: agent.cfg.node_name}}});
            if let Err(e) = agent.cp.patch_vm(ns, vmi_name, patch).await {
                tracing::warn!(migration = %name, error = %e, "could not note the VM's folder on this node");
            }
        }
    } else {
        // libvirt removes a failed incoming domain, or leaves it paused: clear that away. A
        // domain that *runs* here did arrive (the source lost track of the outcome): libvirt
        // is the truth, so the instance is this node's.
        let hv = agent.hv.clone();
        let d2 = dom.clone();
        let state = tokio::task::spawn_blocking({
            let hv = hv.clone();
            let d2 = d2.clone();
            move || hv.state(&d2)
        })
        .await;
        match state {
            Ok(Ok(Some(crate::hypervisor::DomainState::Running))) => {
                tracing::warn!(domain = %dom, "the migration was reported failed but the guest runs here; taking the instance");
                let _ = agent
                    .cp
                    .patch_vmi_status(
                        ns,
                        vmi_name,
                        json!({"status": {"nodeName": agent.cfg.node_name,
                            "migrationState": {"completed": true, "failed": false}}}),
                    )
                    .await;
            }
            Ok(Ok(Some(_))) => {
                tracing::warn!(domain = %dom, "destroying what a failed incoming migration left");
                let _ = tokio::task::spawn_blocking(move || hv.destroy(&d2)).await;
            }
            _ => {}
        }
    }
    agent.incoming.lock().await.remove(vmi_uid);
    // An instance that once migrated away from here and has now come back is ours again.
    agent.migrating.lock().await.remove(vmi_uid);
}

fn spawn_source(
    agent: Arc<Agent>,
    m: VirtualMachineInstanceMigration,
    vmi: VirtualMachineInstance,
) -> Task {
    let a2 = agent.clone();
    let vmi_uid = vmi.uid().to_string();
    let block =
        crate::rules::migration::migration_method(&vmi, &m) == Ok(MigrationMethod::BlockMigration);
    let handle = tokio::spawn(async move {
        let (ns, name, vmi_name) = (m.namespace(), m.name(), m.spec.vmi_name.as_str());
        let st = m.status.clone().unwrap_or_default();
        let target = state_of(&m).target_node.unwrap_or_default();
        let xml = st.target_domain.unwrap_or_default();
        let mig_uid = m.uid();
        let uid = vmi.uid();
        let r = run_source(&a2, &m, block, &vmi, &target, &xml).await;
        for stream in ["libvirt", "memory", "disks"] {
            let _ = std::fs::remove_file(stream_socket(&a2.migration_dir, mig_uid, stream));
        }
        if let Err(e) = r {
            let msg = format!("{e:#}");
            let aborted = a2
                .cp
                .get_migration(ns, name)
                .await
                .is_ok_and(|cur| state_of(&cur.obj).abort_requested);
            tracing::warn!(migration = %name, aborted, error = %msg, "migration failed; the VM stays here");
            let end = now();
            let reason = if aborted {
                format!("aborted: {msg}")
            } else {
                msg
            };
            let mut patch = json!({"failed": true, "endTimestamp": end, "failureReason": reason});
            if aborted {
                patch["abortStatus"] = json!("Succeeded");
            }
            // The VMI first: once the migration is final, the controller may remove it.
            let _ = a2
                .cp
                .patch_vmi_status(ns, vmi_name, json!({"status": {"migrationState": patch}}))
                .await;
            a2.migrating.lock().await.remove(uid);
            let _ = set_phase(&a2, ns, name, Mp::Failed, None, |ms| {
                ms.failed = true;
                ms.end_timestamp = Some(end);
                ms.failure_reason = Some(reason);
                if aborted {
                    ms.abort_status = Some("Succeeded".into());
                }
            })
            .await;
        }
    });
    Task {
        source: true,
        handle,
        abort_sent: false,
        vmi_uid,
    }
}

/// How long a migration waits for the launcher of an instance that just arrived.
const LAUNCHER_WAIT: Duration = Duration::from_secs(30);

async fn run_source(
    agent: &Arc<Agent>,
    m: &VirtualMachineInstanceMigration,
    block: bool,
    vmi: &VirtualMachineInstance,
    target: &str,
    xml: &str,
) -> anyhow::Result<()> {
    let (ns, name, mig_uid) = (m.namespace(), m.name(), m.uid());
    anyhow::ensure!(!xml.is_empty(), "the target published no domain XML");
    let uid = vmi.uid().to_string();
    let vmi_name = vmi.name();
    // An instance that just arrived here (a migration right after another, as a drain of
    // its new node does) may not have its launcher yet: the sync loop starts it, but not
    // once the instance is ours below. Wait for it, within reason.
    let waiting = std::time::Instant::now();
    while !matches!(agent.launchers.status(&uid).await, Ok(Some(_)))
        && waiting.elapsed() < LAUNCHER_WAIT
    {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // From here on the sync loop leaves this instance alone: its status is ours to write.
    agent.migrating.lock().await.insert(uid.clone());
    let started = now();
    set_phase(agent, ns, name, Mp::Running, None, |ms| {
        ms.start_timestamp = Some(started.clone())
    })
    .await?;
    agent
        .cp
        .patch_vmi_status(
            ns,
            vmi_name,
            json!({"status": {"migrationState": {"startTimestamp": started}}}),
        )
        .await?;
    // Every connection to these listeners goes to the target: libvirtd's own and, for a
    // block migration, QEMU's memory and disk streams (all unix sockets). A target that
    // offers the direct path (it published its address) says through the relay how to take
    // it; the relay carries whatever cannot go directly. Relay connection numbers are
    // shared by all streams, so each pairs with the target's next one.
    let n = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let offer = match state_of(m).target_node_address {
        Some(_) => fetch_offer(agent, ns, name, &n)
            .await
            .inspect_err(|e| tracing::warn!(migration = %name, error = %format!("{e:#}"), "the target's direct migration path is unknown; the controller relays the migration"))
            .ok()
            .flatten(),
        None => None,
    };
    let route = Arc::new(Route {
        offer,
        used: Default::default(),
        failed: Default::default(),
    });
    // libvirtd reaches the target's through a unix socket, not loopback TCP: its side of
    // a TCP connection waits on Nagle's algorithm, and the migration's last round trips
    // (while the guest is paused) would wait with it.
    tokio::fs::create_dir_all(&agent.migration_dir).await?;
    let libvirt_path = stream_socket(&agent.migration_dir, mig_uid, "libvirt");
    let _ = std::fs::remove_file(&libvirt_path);
    let listener = tokio::net::UnixListener::bind(&libvirt_path)
        .map_err(|e| anyhow::anyhow!("listening on {}: {e}", libvirt_path.display()))?;
    let dest_uri = format!("qemu+unix:///system?socket={}", libvirt_path.display());
    let mut tunnels = vec![{
        let (agent, n, route) = (agent.clone(), n.clone(), route.clone());
        let (ns, name) = (ns.to_string(), name.to_string());
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                carry(&agent, &route, &ns, &name, &n, "libvirt", sock);
            }
        })
    }];
    let copy = if block {
        for stream in ["memory", "disks"] {
            let path = stream_socket(&agent.migration_dir, mig_uid, stream);
            let _ = std::fs::remove_file(&path);
            let listener = tokio::net::UnixListener::bind(&path)
                .map_err(|e| anyhow::anyhow!("listening on {}: {e}", path.display()))?;
            let (agent, n, route) = (agent.clone(), n.clone(), route.clone());
            let (ns, name) = (ns.to_string(), name.to_string());
            tunnels.push(tokio::spawn(async move {
                while let Ok((sock, _)) = listener.accept().await {
                    carry(&agent, &route, &ns, &name, &n, stream, sock);
                }
            }));
        }
        let uri = |s| {
            format!(
                "unix://{}",
                stream_socket(&agent.migration_dir, mig_uid, s).display()
            )
        };
        Some((uri("memory"), uri("disks")))
    } else {
        None
    };
    // The guest keeps the CPU it booted with: libvirt expanded host-model into a concrete
    // model at start, and the target must define exactly that (libvirt checks it).
    let dom = domain_name(ns, vmi_name, &uid);
    let hv = agent.hv.clone();
    let d2 = dom.clone();
    let live = tokio::task::spawn_blocking(move || hv.xml(&d2)).await??;
    // Before anything moves, libvirt on the target judges that CPU (the controller's
    // check used the nodes' facts). host-passthrough and maximum guests have no CPU
    // definition libvirt can compare; the facts decided for them.
    if let Some(cpu) = crate::cpu::compat::cpu_element(&live).filter(|c| {
        c.contains("<model") && !c.contains("host-passthrough") && !c.contains("maximum")
    }) {
        let uri = dest_uri.clone();
        let virt_type = agent.accel.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let target = crate::virt::libvirt::Libvirt::open(&uri)?;
            crate::cpu::compat::check_target_libvirt(&target, &virt_type, &cpu)
                .map_err(|e| anyhow::anyhow!("the target cannot run the guest's CPU: {}", e.reason))
        })
        .await??;
    }
    let xml = match (
        crate::cpu::compat::cpu_element(&live),
        crate::cpu::compat::cpu_element(xml),
    ) {
        (Some(live_cpu), Some(planned)) => xml.replacen(&planned, &live_cpu, 1),
        _ => xml.to_string(),
    };
    let xml = with_live_firmware(&xml, &live);
    // A domain an earlier edgevirt started has no controller for hotplugged disks; the
    // target must define the same devices.
    let xml = if live.contains("model='virtio-scsi'") {
        xml
    } else {
        xml.replacen(crate::virt::convert::HOTPLUG_CONTROLLER, "", 1)
    };
    // Writable disks on the shared pool stay where they are: the target opens the same
    // files. (A block migration of such an instance is refused before it gets here: the copy
    // would write each shared disk onto itself.)
    let shared_storage = agent.cfg.shared_pool.as_ref().is_some_and(|(_, pool)| {
        crate::hypervisor::domain_disks(&live)
            .iter()
            .any(|d| !d.readonly && std::path::Path::new(&d.file).starts_with(pool))
    });
    tracing::info!(migration = %name, vmi = %vmi_name, %target, block, shared_storage, "migrating");
    let r = agent
        .launchers
        .migrate(
            &uid,
            Request::Migrate {
                dest_uri,
                dest_xml: xml,
                block,
                memory_uri: copy.as_ref().map(|c| c.0.clone()),
                disks_uri: copy.as_ref().map(|c| c.1.clone()),
                shared_storage,
            },
        )
        .await;
    for t in tunnels {
        t.abort();
    }
    r?;
    // libvirt says the guest runs on the target: the instance is the target's now.
    let done = now();
    agent
        .cp
        .patch_vmi_status(
            ns,
            vmi_name,
            json!({"status": {"nodeName": target, "migrationState": {"completed": true, "endTimestamp": done}}}),
        )
        .await?;
    agent.launchers.forget(&uid).await;
    set_phase(agent, ns, name, Mp::Succeeded, None, |ms| {
        ms.completed = true;
        ms.end_timestamp = Some(done);
    })
    .await?;
    tracing::info!(migration = %name, vmi = %vmi_name, %target, "migration succeeded");
    Ok(())
}

/// How the source's connections reach the target.
struct Route {
    /// The target's direct path, if it offered one.
    offer: Option<direct::Offer>,
    /// A connection went directly (logged once).
    used: std::sync::atomic::AtomicBool,
    /// A direct connection failed: this and every later one go through the relay.
    failed: std::sync::atomic::AtomicBool,
}

/// How long a direct connection to the target may take before the relay carries it.
const DIRECT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Ask the target, through the relay, how to reach it directly. The connection number is
/// used up only once the relay took the request (it paired it with the target's waiting
/// side); a relay that refuses the stream (an older controller) leaves it to the next.
async fn fetch_offer(
    agent: &Arc<Agent>,
    ns: &str,
    name: &str,
    n: &std::sync::atomic::AtomicU32,
) -> anyhow::Result<Option<direct::Offer>> {
    let k = n.load(std::sync::atomic::Ordering::SeqCst);
    let path = format!(
        "/migration-tunnel/{ns}/{name}/{k}?side=source&stream={}",
        direct::OFFER_STREAM
    );
    let mut ws = agent.cp.tunnel(&path).await?;
    n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(10), async {
        wait_paired(&mut ws).await?;
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    return Ok(serde_json::from_str::<direct::Offer>(t.as_str()).ok());
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(m)) => anyhow::bail!("unexpected message instead of the offer: {m:?}"),
                Some(Err(e)) => return Err(e.into()),
                None => anyhow::bail!("the relay closed before the target answered"),
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("the target did not answer within 10s"))?
}

/// Carry one local connection of the source to the target: directly when the target
/// offered a path and it has not failed, through the relay otherwise.
fn carry<S>(
    agent: &Arc<Agent>,
    route: &Arc<Route>,
    ns: &str,
    name: &str,
    n: &Arc<std::sync::atomic::AtomicU32>,
    stream: &'static str,
    mut conn: S,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use std::sync::atomic::Ordering::SeqCst;
    let Some(offer) = route.offer.clone().filter(|_| !route.failed.load(SeqCst)) else {
        return tunnel_out(agent, ns, name, n, stream, conn);
    };
    let (agent, route, n) = (agent.clone(), route.clone(), n.clone());
    let (ns, name) = (ns.to_string(), name.to_string());
    tokio::spawn(async move {
        match tokio::time::timeout(DIRECT_CONNECT_TIMEOUT, direct::connect(&offer, stream)).await {
            Ok(Ok(mut remote)) => {
                if !route.used.swap(true, SeqCst) {
                    tracing::info!(migration = %name, address = %offer.address, "migration streams go directly to the target");
                }
                if let Err(e) = direct::join(&mut conn, &mut remote).await {
                    tracing::debug!(%stream, error = %format!("{e:#}"), "direct migration stream ended");
                }
            }
            r => {
                let error = match r {
                    Ok(Err(e)) => format!("{e:#}"),
                    _ => format!("no connection within {DIRECT_CONNECT_TIMEOUT:?}"),
                };
                if !route.failed.swap(true, SeqCst) {
                    tracing::warn!(migration = %name, address = %offer.address, %error, "the target's direct migration path cannot be reached; the controller relays the migration");
                }
                tunnel_out(&agent, &ns, &name, &n, stream, conn);
            }
        }
    });
}

/// Carry one local connection of the source to the target through the relay.
fn tunnel_out<S>(
    agent: &Arc<Agent>,
    ns: &str,
    name: &str,
    n: &std::sync::atomic::AtomicU32,
    stream: &'static str,
    conn: S,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let n = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let path = format!("/migration-tunnel/{ns}/{name}/{n}?side=source&stream={stream}");
    let agent = agent.clone();
    tokio::spawn(async move {
        let r = async {
            let mut ws = agent.cp.tunnel(&path).await?;
            wait_paired(&mut ws).await?;
            pipe(ws, conn).await
        }
        .await;
        if let Err(e) = r {
            tracing::debug!(%stream, error = %e, "source tunnel ended");
        }
    });
}

/// Wait for the relay's "paired" message; the stream the tunnel carries (`libvirt` when
/// the message names none).
async fn wait_paired(ws: &mut Ws) -> anyhow::Result<String> {
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) if t.as_str() == "paired" => return Ok("libvirt".into()),
            Some(Ok(Message::Text(t))) if t.as_str().starts_with("paired ") => {
                return Ok(t.as_str()["paired ".len()..].to_string());
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            Some(Ok(m)) => anyhow::bail!("unexpected tunnel message before pairing: {m:?}"),
            Some(Err(e)) => return Err(e.into()),
            None => anyhow::bail!("the tunnel closed before it was paired"),
        }
    }
}

/// For the agent's state: tasks by migration uid.
pub type Tasks = HashMap<String, Task>;

/// The target's XML with the firmware libvirt chose for the running guest: libvirt picks a
/// UEFI loader (`firmware='efi'`) only when a domain starts, so an incoming domain without
/// the `<loader>` gets no flash and QEMU refuses the guest's ("Unknown ramblock
/// system.flash0"). The variables store keeps the target's own path, with the template.
fn with_live_firmware(dest: &str, live: &str) -> String {
    let element = |xml: &str, open: &str, close: &str| -> Option<String> {
        let start = xml.find(open)?;
        let end = start + xml[start..].find(close)? + close.len();
        Some(xml[start..end].to_string())
    };
    let Some(loader) = element(live, "<loader", "</loader>") else {
        return dest.to_string();
    };
    if dest.contains("<loader") {
        return dest.to_string();
    }
    // A loader named outright: no autoselection, so neither its attribute nor its wishes.
    let mut dest = dest.replacen("<os firmware='efi'>", "<os>", 1);
    if let Some(wishes) = element(&dest, "\n    <firmware>", "</firmware>") {
        dest = dest.replacen(&wishes, "", 1);
    }
    let dest = dest.as_str();
    let template = element(live, "<nvram", ">").and_then(|open| {
        let at = open.find("template='")? + "template='".len();
        let len = open[at..].find('\'')?;
        Some(open[at..at + len].to_string())
    });
    match (dest.find("<nvram>"), dest.find("</type>")) {
        (Some(at), _) => {
            let nvram = match template {
                Some(t) => format!("<nvram template='{t}'>"),
                None => "<nvram>".to_string(),
            };
            format!(
                "{}{loader}\n    {nvram}{}",
                &dest[..at],
                &dest[at + "<nvram>".len()..]
            )
        }
        (None, Some(at)) => {
            let at = at + "</type>".len();
            format!("{}\n    {loader}{}", &dest[..at], &dest[at..])
        }
        _ => dest.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::with_live_firmware;

    #[test]
    fn the_target_gets_the_loader_libvirt_chose_and_keeps_its_own_store() {
        let live = "<os firmware='efi'>\n    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>\n    \
                    <loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.fd</loader>\n    \
                    <nvram template='/usr/share/OVMF/OVMF_VARS_4M.fd'>/a/efi-vars.fd</nvram>\n  </os>";
        let dest = "<os firmware='efi'>\n    <type arch='x86_64' machine='q35'>hvm</type>\n    \
                    <firmware>\n      <feature enabled='no' name='secure-boot'/>\n    </firmware>\n    \
                    <nvram>/b/efi-vars.fd</nvram>\n  </os>";
        let out = with_live_firmware(dest, live);
        assert!(out.contains(
            "<loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.fd</loader>\n    \
             <nvram template='/usr/share/OVMF/OVMF_VARS_4M.fd'>/b/efi-vars.fd</nvram>"
        ), "{out}");
        assert!(
            out.starts_with("<os>\n") && !out.contains("<firmware>"),
            "{out}"
        );
        let bios = "<os>\n    <type arch='x86_64' machine='q35'>hvm</type>\n  </os>";
        assert_eq!(with_live_firmware(bios, bios), bios);
        let no_store =
            "<os firmware='efi'>\n    <type arch='x86_64' machine='q35'>hvm</type>\n  </os>";
        let out = with_live_firmware(no_store, live);
        assert!(out.contains("</type>\n    <loader readonly='yes'"), "{out}");
        assert!(!out.contains("/a/efi-vars.fd"), "{out}");
    }
}
