//! The agent's sync loop: for each VMI bound to this node, start, adopt, observe, pause,
//! reboot or stop its domain, and report status; then clean up what nothing owns.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::json;

use super::Agent;
use super::guest::LIVENESS_FAILED;
use super::launchers::START_TIMEOUT;
use super::ports::{LauncherStatus, Stored};
use super::prepare::{domain_name, prepare};
use crate::hypervisor::DomainState;
use crate::launcher::client::LauncherError;
use crate::launcher::protocol::{Request, Status};
use crate::types::annotations::{
    LAUNCHER_FINALIZER, PAUSED_ANNOTATION, SOFTREBOOT_ANNOTATION, SOFTREBOOT_DONE_ANNOTATION,
    VOLUMES_FINALIZER, VOLUMES_NODE_ANNOTATION,
};
use crate::types::kubevirt::{
    Condition, ConditionType, CpuTopologyStatus, InterfaceStatus, Phase,
    VirtualMachineInstanceStatus, set_condition,
};
use crate::types::{Meta, VirtualMachineInstance};

pub async fn sync_all(agent: &Agent, housekeeping: bool) -> anyhow::Result<()> {
    let vmis = agent.cp.vmis_of(&agent.cfg.node_name).await?;
    let mut known: HashSet<String> = agent.incoming.lock().await.clone();
    // An instance that does not decode is not served, but its domain is not an orphan.
    known.extend(vmis.undecodable.iter().cloned());
    for vmi in &vmis.items {
        let uid = vmi.obj.uid().to_string();
        known.insert(uid.clone());
        if agent.migrating.lock().await.contains(&uid) {
            continue;
        }
        if let Err(e) = sync_vmi(agent, vmi).await {
            tracing::warn!(vmi = %vmi.obj.name(), error = %e, "syncing VMI failed");
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
        agent.launchers.forget(&d.vmi_uid).await;
    }
    if housekeeping {
        cleanup_deleted_vms(agent).await?;
    }
    Ok(())
}

/// Ask a VMI's launcher for its status. `Ok(None)`: no launcher; `Err`: a launcher runs but
/// shares no protocol version with this agent.
async fn launcher_status(
    agent: &Agent,
    uid: &str,
) -> Result<Option<LauncherStatus>, LauncherError> {
    match agent.launchers.status(uid).await {
        Ok(Some(s)) => {
            agent.starting.lock().await.remove(uid);
            Ok(Some(s))
        }
        Ok(None) => Ok(None),
        Err(e @ LauncherError::Incompatible(_)) => Err(e),
        Err(e) => {
            tracing::debug!(vmi = %uid, error = %e, "no launcher status");
            Ok(None)
        }
    }
}

pub(super) async fn sync_vmi(
    agent: &Agent,
    stored: &Stored<VirtualMachineInstance>,
) -> anyhow::Result<()> {
    let vmi = &stored.obj;
    let uid = vmi.uid().to_string();
    let (ns, name) = (vmi.namespace(), vmi.name());
    let dom = domain_name(ns, name, &uid);
    let cur_phase = vmi
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let Ok(status) = launcher_status(agent, &uid).await else {
        // A launcher this agent cannot talk to: leave the VM, its launcher and the VMI alone.
        return Ok(());
    };

    if vmi.deleting() {
        return finish_deletion(agent, vmi, &uid, &dom, status.is_some()).await;
    }
    if cur_phase.is_final() {
        return Ok(());
    }
    let Some(status) = status else {
        // No launcher. Is the domain still there (launcher crashed or agent restarted)?
        let hv = agent.hv.clone();
        let d2 = dom.clone();
        let state = tokio::task::spawn_blocking(move || hv.state(&d2)).await??;
        let started = agent.starting.lock().await.get(&uid).copied();
        if let Some(msg) = agent.launchers.take_failure(&uid).await {
            return set_final(agent, stored, Phase::Failed, "LauncherFailed", &msg).await;
        }
        if started.is_some_and(|t| t.elapsed() < START_TIMEOUT) {
            return Ok(());
        }
        match (state, &cur_phase) {
            (Some(_), _) => {
                tracing::info!(%dom, "domain runs without a launcher; starting one to adopt it");
                start_launcher(agent, &uid, &dom, &agent.run_dir(&uid).join("domain.xml")).await;
            }
            (None, Phase::Scheduled) if started.is_none() => {
                if let Some(at) = agent.prepare_retry.lock().await.get(&uid)
                    && Instant::now() < at.0
                {
                    return Ok(());
                }
                match prepare(agent, stored).await {
                    Ok(xml) => {
                        agent.prepare_retry.lock().await.remove(&uid);
                        start_paused(agent, vmi, &xml).await?;
                        start_launcher(agent, &uid, &dom, &xml).await;
                    }
                    Err(e) => return prepare_failed(agent, stored, &uid, e).await,
                }
            }
            (None, Phase::Scheduled) => {
                return set_final(
                    agent,
                    stored,
                    Phase::Failed,
                    "LauncherFailed",
                    "the launcher did not start in time",
                )
                .await;
            }
            (None, _) => {
                // Stopped by this agent for a failed liveness probe (its launcher may have
                // exited before answering the destroy), or ended on its own.
                if let Some(why) = super::guest::killed(agent, &uid).await {
                    return set_final(agent, stored, Phase::Failed, LIVENESS_FAILED, &why).await;
                }
                return set_final(
                    agent,
                    stored,
                    Phase::Succeeded,
                    "DomainGone",
                    "the domain has stopped",
                )
                .await;
            }
        }
        return Ok(());
    };
    let Some(state) = status.status.state else {
        if let Some(why) = super::guest::killed(agent, &uid).await {
            return set_final(agent, stored, Phase::Failed, LIVENESS_FAILED, &why).await;
        }
        return set_final(
            agent,
            stored,
            Phase::Succeeded,
            "GuestShutdown",
            "the guest powered off",
        )
        .await;
    };

    // Desired pause state and soft-reboot requests.
    let want_paused = vmi.annotation(PAUSED_ANNOTATION) == Some("true");
    if want_paused && state == DomainState::Running {
        agent.launchers.call(&uid, Request::Pause).await?;
    } else if !want_paused && state == DomainState::Paused {
        agent.launchers.call(&uid, Request::Unpause).await?;
    }
    let asked = vmi.annotation(SOFTREBOOT_ANNOTATION).unwrap_or("");
    let done = vmi.annotation(SOFTREBOOT_DONE_ANNOTATION).unwrap_or("");
    if !asked.is_empty() && asked != done && state == DomainState::Running {
        agent.launchers.call(&uid, Request::SoftReboot).await?;
        agent
            .cp
            .patch_vmi(
                ns,
                name,
                json!({"metadata": {"annotations": {SOFTREBOOT_DONE_ANNOTATION: asked}}}),
            )
            .await?;
        tracing::info!(%dom, "soft reboot");
    }

    let now_status = launcher_status(agent, &uid)
        .await
        .ok()
        .flatten()
        .unwrap_or(status);
    // Probes and guest-agent credentials, on a running guest.
    let guest = if now_status.status.state == Some(DomainState::Running) {
        super::guest::tick(agent, vmi, &now_status).await
    } else {
        Default::default()
    };
    if let Some(why) = &guest.dead {
        tracing::warn!(%dom, %why, "stopping the instance: its liveness probe failed");
        super::guest::mark_killed(agent, &uid, why).await;
        if let Err(e) = agent.launchers.call(&uid, Request::Destroy).await {
            // The launcher often exits with its domain before it answers; the next pass
            // finds the domain gone and fails the instance for the probe all the same.
            tracing::warn!(%dom, error = %e, "destroying the domain did not answer");
            return Ok(());
        }
        return set_final(agent, stored, Phase::Failed, LIVENESS_FAILED, why).await;
    }
    // migrationState is not the sync loop's: left out, the server keeps the stored one.
    let mut before = vmi.status.clone().unwrap_or_default();
    before.migration_state = None;
    let mut after = running_status(agent, vmi, &before, &now_status, &guest);
    // Hotplugged disks, while no migration moves the domain.
    if !vmi.migrating()
        && matches!(
            now_status.status.state,
            Some(DomainState::Running | DomainState::Paused)
        )
        && let Some(hp) = super::hotplug::sync(agent, vmi, &dom).await
    {
        super::hotplug::merge(&mut after.volume_status, hp);
    }
    if after != before {
        let mut body = stored.status_change(&Some(before), &Some(after));
        if let Some(o) = body.as_object_mut() {
            o.remove("migrationState");
        }
        agent.cp.put_vmi_status(ns, name, body).await?;
    }
    Ok(())
}

/// `startStrategy: Paused`: the launcher creates the domain paused (a file beside its XML
/// says so), and the VMI wants it paused until someone unpauses it, so the sync loop does not
/// resume it. Each start of the VM starts paused again, as in KubeVirt.
async fn start_paused(
    agent: &Agent,
    vmi: &VirtualMachineInstance,
    xml: &std::path::Path,
) -> anyhow::Result<()> {
    if vmi.spec.start_strategy != Some(crate::types::kubevirt::StartStrategy::Paused) {
        return Ok(());
    }
    if vmi.annotation(PAUSED_ANNOTATION) != Some("true") {
        agent
            .cp
            .patch_vmi(
                vmi.namespace(),
                vmi.name(),
                json!({"metadata": {"annotations": {PAUSED_ANNOTATION: "true"}}}),
            )
            .await?;
    }
    tokio::fs::write(xml.with_file_name(crate::launcher::START_PAUSED_FILE), b"").await?;
    Ok(())
}

async fn start_launcher(agent: &Agent, uid: &str, dom: &str, xml: &std::path::Path) {
    match agent.launchers.start(uid, dom, xml.to_path_buf()).await {
        Ok(()) => {
            agent
                .starting
                .lock()
                .await
                .insert(uid.to_string(), Instant::now());
        }
        Err(e) => tracing::error!(error = %e, "cannot start launcher"),
    }
}

/// Every NIC of the spec, in device order, with its MAC and the addresses its source (the
/// guest agent, else libvirt's DHCP leases) reports for that MAC; then the guest's other
/// interfaces that have addresses (a bridge or VLAN made inside the guest), as KubeVirt
/// lists them.
fn interface_statuses(vmi: &VirtualMachineInstance, s: &Status) -> Vec<InterfaceStatus> {
    let source = s.address_source.as_deref().unwrap_or_default();
    let mut out: Vec<InterfaceStatus> =
        crate::virt::convert::nics(&vmi.spec, &super::prepare::owner_uid(vmi))
            .into_iter()
            .map(|nic| InterfaceStatus {
                name: Some(nic.name),
                mac: Some(nic.mac),
                info_source: Some("domain".into()),
                ..Default::default()
            })
            .collect();
    for a in &s.addresses {
        let mac = a.mac.as_deref().map(crate::virt::convert::normal_mac);
        let i = match out.iter().position(|x| mac.is_some() && x.mac == mac) {
            Some(i) => i,
            None => {
                out.push(InterfaceStatus {
                    mac: mac.clone(),
                    info_source: Some(source.to_string()),
                    ..Default::default()
                });
                out.len() - 1
            }
        };
        let x = &mut out[i];
        if x.ip_addresses.is_empty() {
            x.interface_name = Some(a.interface.clone());
            if x.name.is_some() {
                x.info_source = Some(format!("domain, {source}"));
            }
        }
        if !x.ip_addresses.contains(&a.ip) {
            x.ip_addresses.push(a.ip.clone());
        }
        x.ip_address = x.ip_addresses.first().cloned();
    }
    out
}

/// The status of a VMI whose launcher reports its domain.
fn running_status(
    agent: &Agent,
    vmi: &VirtualMachineInstance,
    old: &VirtualMachineInstanceStatus,
    ls: &LauncherStatus,
    guest: &super::guest::Outcome,
) -> VirtualMachineInstanceStatus {
    let s: &Status = &ls.status;
    let mut st = old.clone();
    let paused = s.state == Some(DomainState::Paused);
    st.enter_phase(Phase::Running, true);
    st.reason = None;
    st.node_name = Some(agent.cfg.node_name.clone());
    st.domain_name = Some(domain_name(vmi.namespace(), vmi.name(), vmi.uid()));
    st.interfaces = interface_statuses(vmi, s);
    if let Some(g) = &s.guest {
        st.guest_os_info = Some(g.os.clone());
        st.guest_agent_info = Some(g.clone());
    }
    let conds = &mut st.conditions;
    // Ready: running, not paused, and the readiness probe (if any) passing.
    let (ready, reason, message) = match &guest.ready {
        _ if paused => (false, "Paused", ""),
        Some((false, why)) => (false, "GuestNotReady", why.as_str()),
        _ => (true, "", ""),
    };
    set_condition(
        conds,
        Condition::new(ConditionType::Ready, ready, reason, message),
    );
    if let Some((ok, why)) = &guest.credentials {
        let reason = if *ok {
            super::guest::CREDENTIALS_SYNCED
        } else {
            super::guest::CREDENTIALS_FAILED
        };
        set_condition(
            conds,
            Condition::new(
                ConditionType::AccessCredentialsSynchronized,
                *ok,
                reason,
                why,
            ),
        );
    }
    set_condition(
        conds,
        Condition::new(
            ConditionType::AgentConnected,
            s.agent_connected,
            if s.agent_connected {
                ""
            } else {
                "GuestAgentNotConnected"
            },
            "",
        ),
    );
    set_condition(
        conds,
        Condition::new(
            ConditionType::Paused,
            paused,
            if paused { "PausedByUser" } else { "" },
            "",
        ),
    );
    conds.retain(|c| c.type_ != ConditionType::Synchronized);
    let m = crate::rules::migration::live_migratable(vmi);
    set_condition(
        conds,
        Condition::new(ConditionType::LiveMigratable, m.ok, &m.reason, &m.message),
    );
    st.migration_method = Some(m.method);
    if !ls.launcher_version.is_empty() {
        st.launcher_version = Some(ls.launcher_version.clone());
    }
    if let Some(t) = s.cpu.as_ref().and_then(|c| c.topology.as_ref()) {
        st.current_cpu_topology = Some(CpuTopologyStatus {
            sockets: t.sockets,
            cores: t.cores,
            threads: t.threads,
        });
    }
    st
}

/// A VMI whose disks could not be prepared (an image that did not pull, most often) stays
/// Scheduled, says why in its `Synchronized` condition (reason `ErrImagePull` for a pull, as
/// KubeVirt's), and is tried again after a back-off that doubles up to five minutes.
async fn prepare_failed(
    agent: &Agent,
    stored: &Stored<VirtualMachineInstance>,
    uid: &str,
    e: anyhow::Error,
) -> anyhow::Result<()> {
    let vmi = &stored.obj;
    let waiting = e.downcast_ref::<super::datavolume::NotFilled>().is_some();
    let tries = if waiting {
        // Waiting for a DataVolume's disk is no failure: no back-off, tried every pass.
        agent.prepare_retry.lock().await.remove(uid);
        0
    } else {
        let mut retry = agent.prepare_retry.lock().await;
        let n = retry.get(uid).map_or(0, |r| r.1) + 1;
        let wait = Duration::from_secs(5 << n.min(6)).min(Duration::from_secs(300));
        retry.insert(uid.to_string(), (Instant::now() + wait, n));
        n
    };
    let pull = e.downcast_ref::<crate::registry::PullError>().is_some();
    let reason = if waiting {
        "DataVolumeNotReady"
    } else if pull {
        crate::types::kubevirt::ERR_IMAGE_PULL
    } else {
        "FailedPrepare"
    };
    let msg = format!("{e:#}");
    if !waiting {
        tracing::warn!(namespace = %vmi.namespace(), name = %vmi.name(), %reason, tries, error = %msg,
            "cannot prepare the VMI's disks; trying again later");
    }
    let before = vmi.status.clone();
    let mut st = before.clone().unwrap_or_default();
    set_condition(
        &mut st.conditions,
        Condition::new(ConditionType::Synchronized, false, reason, &msg),
    );
    if Some(&st) == before.as_ref() {
        return Ok(());
    }
    let body = stored.status_change(&before, &Some(st));
    agent
        .cp
        .put_vmi_status(vmi.namespace(), vmi.name(), body)
        .await
}

/// Move a VMI to a final phase.
async fn set_final(
    agent: &Agent,
    stored: &Stored<VirtualMachineInstance>,
    p: Phase,
    reason: &str,
    msg: &str,
) -> anyhow::Result<()> {
    let vmi = &stored.obj;
    super::guest::forget(agent, vmi.uid()).await;
    let before = vmi.status.clone();
    let mut st = before.clone().unwrap_or_default();
    st.enter_phase(p.clone(), false);
    st.reason = Some(reason.to_string());
    set_condition(
        &mut st.conditions,
        Condition::new(ConditionType::Ready, false, reason, ""),
    );
    set_condition(
        &mut st.conditions,
        Condition::new(
            ConditionType::AgentConnected,
            false,
            "GuestAgentNotConnected",
            "",
        ),
    );
    let (ns, name) = (vmi.namespace(), vmi.name());
    tracing::info!(namespace = %ns, %name, phase = %p, %reason, %msg, "VMI finished");
    let body = stored.status_change(&before, &Some(st));
    agent.cp.put_vmi_status(ns, name, body).await
}

/// Stop a deleted VMI's domain gracefully, then let the VMI go.
async fn finish_deletion(
    agent: &Agent,
    vmi: &VirtualMachineInstance,
    uid: &str,
    dom: &str,
    has_launcher: bool,
) -> anyhow::Result<()> {
    let grace = vmi
        .spec
        .termination_grace_period_seconds
        .and_then(|g| u64::try_from(g).ok())
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
                if has_launcher {
                    agent
                        .launchers
                        .call(uid, Request::Shutdown { grace_secs: grace })
                        .await?;
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
    agent.launchers.forget(uid).await;
    agent.starting.lock().await.remove(uid);
    agent.prepare_retry.lock().await.remove(uid);
    super::guest::forget(agent, uid).await;
    super::prepare::unlink_swtpm_state(vmi).await;
    let _ = tokio::fs::remove_dir_all(agent.run_dir(uid)).await;
    let _ = tokio::fs::remove_file(crate::launcher::socket_path(&agent.launchers_dir(), uid)).await;
    collect_container_disks(agent).await;
    agent
        .cp
        .patch_vmi(
            vmi.namespace(),
            vmi.name(),
            json!({"metadata": {"finalizers": without(vmi, LAUNCHER_FINALIZER)}}),
        )
        .await?;
    tracing::info!(domain = %dom, "VMI released");
    Ok(())
}

/// Remove the cached container disks no instance on this node uses and none has pulled
/// for the grace period (so a VM restarted soon finds its image still here).
pub async fn collect_container_disks(agent: &Agent) {
    let mut in_use = std::collections::BTreeSet::new();
    let vmi_dirs = crate::rules::paths::vmi_run_dir(&agent.cfg.data_dir, "");
    if let Ok(mut dirs) = tokio::fs::read_dir(&vmi_dirs).await {
        while let Ok(Some(e)) = dirs.next_entry().await {
            let list = e.path().join(super::prepare::CONTAINER_DISKS_FILE);
            if let Ok(text) = tokio::fs::read_to_string(list).await {
                in_use.extend(text.lines().filter(|l| !l.is_empty()).map(String::from));
            }
        }
    }
    agent.disks.gc(&in_use, agent.cfg.image_gc_grace).await;
}

/// An object's finalizers without `f`.
fn without<T: kube::Resource>(o: &T, f: &str) -> Vec<String> {
    o.meta()
        .finalizers
        .iter()
        .flatten()
        .filter(|x| *x != f)
        .cloned()
        .collect()
}

/// Remove the volumes of deleted VMs whose disks live on this node.
async fn cleanup_deleted_vms(agent: &Agent) -> anyhow::Result<()> {
    for vm in agent.cp.vms().await? {
        let vm = &vm.obj;
        if !vm.deleting()
            || vm.annotation(VOLUMES_NODE_ANNOTATION) != Some(agent.cfg.node_name.as_str())
        {
            continue;
        }
        let (ns, name) = (vm.namespace(), vm.name());
        if agent.cp.get_vmi(ns, name).await?.is_some() {
            continue;
        }
        let uid = vm.uid();
        if !uid.is_empty() {
            let _ = tokio::fs::remove_dir_all(agent.volumes_dir(uid)).await;
        }
        agent
            .cp
            .patch_vm(
                ns,
                name,
                json!({"metadata": {"finalizers": without(vm, VOLUMES_FINALIZER)}}),
            )
            .await?;
        tracing::info!(namespace = %ns, %name, "removed the volumes of a deleted VM");
    }
    Ok(())
}
