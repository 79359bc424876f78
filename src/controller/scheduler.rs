//! The scheduler binds a pending VMI to a Ready, schedulable node with enough free memory
//! and vCPUs (capacity minus the instances already placed), honouring `nodeSelector` and
//! cordons; it spreads by picking the node with the most free memory. vCPUs are
//! overcommitted as KubeVirt does by default (`cpuAllocationRatio` 10: each vCPU asks for a
//! tenth of a host CPU), but one VM never gets more vCPUs than its node has CPUs. Node
//! leases mark silent nodes NotReady and their instances Unknown, never deleting them.
//! Instances with `persistentVolumeClaim` volumes go only to nodes that mount a shared
//! storage pool, and migrate only between nodes that mount the same one. Instances on
//! `multus` networks go only to nodes that have each network's bridge (VLAN-filtering for a
//! VLAN), and migrate only among them.

use std::collections::{BTreeMap, BTreeSet};

use super::Context;
use super::datavolume::Place;
use crate::cpu::GuestCpu;
use crate::rules::cpus::{DEDICATED_CPUS_ANNOTATION, Pins};
use crate::rules::migration::shared_disks;
use crate::rules::node::node_ready;
use crate::store::{Error, FieldSelector, LabelSelector};
use crate::types::kubevirt::{
    Condition, ConditionStatus, ConditionType, Phase, condition_true, set_condition,
};
use crate::types::{Meta, Node, VirtualMachineInstance};
use crate::virt::convert::guest_memory;

/// KubeVirt's default `cpuAllocationRatio`: placed vCPUs may be ten times the host's CPUs.
pub const CPU_ALLOCATION_RATIO: u64 = 10;

fn vcpus_of(vmi: &VirtualMachineInstance) -> u64 {
    let (so, co, th) = crate::virt::convert::topology(&vmi.spec);
    u64::from(so) * u64::from(co) * u64::from(th)
}

fn memory_of(vmi: &VirtualMachineInstance) -> u64 {
    guest_memory(&vmi.spec).unwrap_or(0)
}

/// The host CPUs an instance that wants dedicated CPUs gets on `node` (with `count` CPUs),
/// given the instances `placed` there: `Err` with why when they do not fit, `Ok(None)` when
/// it does not want any.
pub fn dedicated_pins(
    placed: &[VirtualMachineInstance],
    node: &str,
    count: u32,
    vmi: &VirtualMachineInstance,
) -> Result<Option<Pins>, String> {
    let Some((n, emulator)) = crate::rules::cpus::wants(vmi, vcpus_of(vmi) as u32) else {
        return Ok(None);
    };
    let taken: BTreeSet<u32> = placed
        .iter()
        .filter(|v| v.node_name() == Some(node) && !v.phase().is_final() && v.uid() != vmi.uid())
        .filter_map(Pins::of)
        .flat_map(|p| p.all().collect::<Vec<_>>())
        .collect();
    crate::rules::cpus::pick(count, &taken, n, emulator)
        .map(Some)
        .ok_or_else(|| {
            format!(
                "{node}: not enough free CPUs for dedicated placement ({} wanted; {} of its {count} \
                 held by other dedicated instances)",
                n + u32::from(emulator),
                taken.len()
            )
        })
}

/// The node a VMI fits best, or why none fits: ("0/N nodes are available: ...").
/// `exclude` leaves out one node (a migration's source); `extra_selector` adds labels the
/// node must carry.
pub async fn pick_node(
    ctx: &Context,
    vmi: &VirtualMachineInstance,
    exclude: Option<&str>,
    extra_selector: &BTreeMap<String, String>,
) -> Result<Result<(String, GuestCpu), String>, Error> {
    let nodes: Vec<Node> = ctx.store.all().await?;
    let placed: Vec<VirtualMachineInstance> = ctx.store.all().await?;
    let need = memory_of(vmi);
    let need_vcpus = vcpus_of(vmi);
    let mut selector = vmi.spec.node_selector.clone();
    selector.extend(extra_selector.clone());
    let mut reasons = Vec::new();
    let mut best: Option<((i64, u64), String, GuestCpu)> = None;
    let ready: Vec<&Node> = nodes.iter().filter(|n| node_ready(n)).collect();
    let cpu_default = crate::cpu::policy::scheduling_default(&ready);
    let source_node = exclude.and_then(|x| nodes.iter().find(|n| n.name() == x));
    let pool_of = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.shared_pool.as_ref())
            .map(|p| p.name.clone())
    };
    // Claims live on the shared pool: only nodes that mount it can open them, and a
    // migration stays among nodes that mount the same one.
    let mut claims = shared_disks(vmi);
    for v in crate::rules::migration::pool_volumes(vmi) {
        if !claims.contains(&v) {
            claims.push(v);
        }
    }
    let needs_pool = !claims.is_empty();
    let source_pool = source_node.and_then(pool_of);
    // DataVolumes on local storage live on the node that first ran a VM using them; those
    // on a shared pool on every node mounting it.
    let places = super::datavolume::used_by(&ctx.store, vmi).await?;
    let bound: Vec<(&String, &String)> = places
        .iter()
        .filter_map(|(dv, p)| match p {
            Place::Node(Some(n)) => Some((dv, n)),
            _ => None,
        })
        .collect();
    let in_pools: Vec<(&String, &String)> = places
        .iter()
        .filter_map(|(dv, p)| match p {
            Place::Pool(pool) => Some((dv, pool)),
            _ => None,
        })
        .collect();
    // The bridges its multus networks name; a NetworkAttachmentDefinition gone since
    // admission leaves it unschedulable, saying which.
    let mut bridges = Vec::new();
    for n in &vmi.spec.networks {
        let Some(m) = &n.multus else { continue };
        let (ns, name) = crate::types::cni::reference(vmi.namespace(), &m.network_name);
        let def = ctx
            .store
            .get_typed::<crate::types::cni::NetworkAttachmentDefinition>(ns, name)
            .await?;
        match crate::rules::network::bridge_of(&n.name, (ns, name), def.as_ref()) {
            Ok(b) => bridges.push((n.name.clone(), b)),
            Err(why) => return Ok(Err(why)),
        }
    }
    let running_cpu: Option<GuestCpu> = vmi
        .annotation(crate::cpu::policy::GUEST_CPU_ANNOTATION)
        .and_then(|s| serde_json::from_str(s).ok());
    // What pod (anti-)affinity reads: every node's labels, and the other instances placed.
    let no_labels = BTreeMap::new();
    let node_views: Vec<crate::rules::placement::NodeView> = nodes
        .iter()
        .map(|n| crate::rules::placement::NodeView {
            name: n.name(),
            labels: n.metadata.labels.as_ref().unwrap_or(&no_labels),
        })
        .collect();
    let others: Vec<crate::rules::placement::PlacedView> = placed
        .iter()
        .filter(|v| v.uid() != vmi.uid() && !v.phase().is_final())
        .filter_map(|v| {
            Some(crate::rules::placement::PlacedView {
                namespace: v.namespace(),
                name: v.name(),
                labels: v.metadata.labels.as_ref().unwrap_or(&no_labels),
                node: v.node_name()?,
                affinity: v.spec.affinity.as_ref(),
            })
        })
        .collect();
    let own_labels = vmi.metadata.labels.as_ref().unwrap_or(&no_labels);
    for n in &nodes {
        let name = n.name().to_string();
        if exclude == Some(name.as_str()) {
            reasons.push(format!("{name}: the instance runs there"));
            continue;
        }
        if !node_ready(n) {
            reasons.push(format!("{name}: not ready"));
            continue;
        }
        if n.spec.unschedulable {
            reasons.push(format!("{name}: cordoned"));
            continue;
        }
        let view = crate::rules::placement::NodeView {
            name: &name,
            labels: n.metadata.labels.as_ref().unwrap_or(&no_labels),
        };
        // `kubernetes.io/hostname` is the node's name unless a label says otherwise, as on
        // every Kubernetes node: a migration to one chosen node selects it so.
        if !selector
            .iter()
            .all(|(k, v)| crate::rules::placement::topology(&view, k) == Some(v.as_str()))
        {
            reasons.push(format!("{name}: does not match nodeSelector"));
            continue;
        }
        if !crate::rules::placement::required(&vmi.spec.affinity, &view) {
            reasons.push(format!(
                "{name}: does not match the instance's node affinity"
            ));
            continue;
        }
        if let Err(why) = crate::rules::placement::pod_required(
            &vmi.spec.affinity,
            vmi.namespace(),
            own_labels,
            &view,
            &others,
            &node_views,
        ) {
            reasons.push(format!("{name}: {why}"));
            continue;
        }
        let taints = &n.spec.taints;
        let blocking: Vec<String> = ["NoSchedule", "NoExecute"]
            .iter()
            .flat_map(|e| crate::rules::placement::untolerated(taints, &vmi.spec.tolerations, e))
            .map(crate::rules::placement::taint_text)
            .collect();
        if !blocking.is_empty() {
            reasons.push(format!(
                "{name}: has taints the instance does not tolerate: {}",
                blocking.join(", ")
            ));
            continue;
        }
        // Each PreferNoSchedule taint not tolerated weighs as much as the strongest
        // preferred affinity term.
        let preferred_against =
            crate::rules::placement::untolerated(taints, &vmi.spec.tolerations, "PreferNoSchedule")
                .len() as i64;
        let spread = match crate::rules::placement::spread(
            &vmi.spec.topology_spread_constraints,
            vmi.namespace(),
            own_labels,
            &view,
            &others,
            &node_views,
        ) {
            Ok(s) => s,
            Err(why) => {
                reasons.push(format!("{name}: {why}"));
                continue;
            }
        };
        let score = spread
            + crate::rules::placement::score(&vmi.spec.affinity, &view)
            + crate::rules::placement::pod_score(
                &vmi.spec.affinity,
                vmi.namespace(),
                &view,
                &others,
                &node_views,
            )
            - 100 * preferred_against;
        if let Some((dv, there)) = bound.iter().find(|(_, there)| **there != name) {
            reasons.push(format!(
                "{name}: DataVolume {dv} lives on node {there} (local storage)"
            ));
            continue;
        }
        if let Some(why) = bridges.iter().find_map(|(net, b)| {
            crate::rules::network::node_carries(b, n)
                .err()
                .map(|why| format!("{why} (network {net})"))
        }) {
            reasons.push(format!("{name}: {why}"));
            continue;
        }
        let host_disk_dir = n.status.as_ref().and_then(|s| s.host_disk_dir.as_deref());
        if !crate::rules::migration::host_disks_allowed(vmi, host_disk_dir) {
            reasons.push(format!(
                "{name}: its host disk folder ({}) does not hold the instance's hostDisk paths",
                host_disk_dir.unwrap_or("none: serve --host-disk-dir")
            ));
            continue;
        }
        let mounted = pool_of(n);
        if let Some((dv, pool)) = in_pools
            .iter()
            .find(|(_, pool)| mounted.as_deref() != Some(pool.as_str()))
        {
            reasons.push(format!(
                "{name}: does not mount shared pool {pool} (DataVolume {dv} lives there)"
            ));
            continue;
        }
        if needs_pool {
            match (pool_of(n), source_pool.as_deref()) {
                (None, _) => {
                    reasons.push(format!(
                        "{name}: mounts no shared storage pool (persistentVolumeClaim volumes {} \
                         live there)",
                        claims.join(", ")
                    ));
                    continue;
                }
                (Some(p), Some(sp)) if p != sp => {
                    reasons.push(format!(
                        "{name}: mounts shared pool {p}, not {sp} where the instance's disks are"
                    ));
                    continue;
                }
                _ => {}
            }
        }
        let here: Vec<&VirtualMachineInstance> = placed
            .iter()
            .filter(|v| v.node_name() == Some(name.as_str()))
            .filter(|v| !v.phase().is_final())
            .collect();
        let used: u64 = here.iter().map(|v| memory_of(v)).sum();
        let status = n.status.clone().unwrap_or_default();
        let free = status.memory_bytes.saturating_sub(used);
        if free < need {
            reasons.push(format!(
                "{name}: insufficient memory ({} MiB free, {} MiB requested)",
                free >> 20,
                need >> 20
            ));
            continue;
        }
        let cpus = u64::from(status.cpu.count);
        if cpus > 0 {
            let used_vcpus: u64 = here.iter().map(|v| vcpus_of(v)).sum();
            if need_vcpus > cpus {
                reasons.push(format!(
                    "{name}: insufficient cpu ({need_vcpus} vCPUs requested, the host has {cpus})"
                ));
                continue;
            }
            if used_vcpus + need_vcpus > cpus * CPU_ALLOCATION_RATIO {
                reasons.push(format!(
                    "{name}: insufficient cpu ({used_vcpus} vCPUs placed of {} allowed, {need_vcpus} requested)",
                    cpus * CPU_ALLOCATION_RATIO
                ));
                continue;
            }
        }
        if let Err(why) = dedicated_pins(&placed, &name, status.cpu.count, vmi) {
            reasons.push(why);
            continue;
        }
        // A migration keeps the guest CPU the instance runs with: the target must be able
        // to run that one (and everything it needs from the source's CPU).
        if let (Some(src), Some(running)) = (source_node, &running_cpu) {
            let (sf, tf) = (
                crate::cpu::policy::facts_of(src),
                crate::cpu::policy::facts_of(n),
            );
            if let Err(e) = crate::cpu::check_target(running, &sf, &tf) {
                reasons.push(format!("{name}: {e}"));
                continue;
            }
            if best.as_ref().is_none_or(|(b, _, _)| (score, free) > *b) {
                best = Some(((score, free), name, running.clone()));
            }
            continue;
        }
        // The guest CPU it would get there, and whether that node can run it.
        let guest_cpu = match crate::cpu::policy::place_on(vmi, n, &cpu_default) {
            Ok(g) => g,
            Err(e) => {
                reasons.push(format!("{name}: {e}"));
                continue;
            }
        };
        // The preferred node affinity first, then the most free memory.
        if best.as_ref().is_none_or(|(b, _, _)| (score, free) > *b) {
            best = Some(((score, free), name, guest_cpu));
        }
    }
    Ok(match best {
        Some((_, node, guest_cpu)) => Ok((node, guest_cpu)),
        None if nodes.is_empty() => Err("0/0 nodes are available: no node has registered".into()),
        None => Err(format!(
            "0/{} nodes are available: {}",
            nodes.len(),
            reasons.join("; ")
        )),
    })
}

/// A condition the scheduler and the lease check set; a message change is a change.
fn condition(t: ConditionType, status: ConditionStatus, reason: &str, message: &str) -> Condition {
    Condition {
        status,
        ..Condition::new(t, false, reason, message)
    }
}

/// Try to place a VMI; false (with an explaining condition) if no node fits.
pub async fn schedule(ctx: &Context, vmi: &VirtualMachineInstance) -> Result<bool, Error> {
    let mut picked = pick_node(ctx, vmi, None, &BTreeMap::new()).await?;
    // Its dedicated CPUs on that node, picked against what is placed there now.
    let mut pins = None;
    if let Ok((node, _)) = &picked
        && let Some(n) = ctx.store.get_typed::<Node>("", node).await?
    {
        let placed: Vec<VirtualMachineInstance> = ctx.store.all().await?;
        let count = n.status.map(|s| s.cpu.count).unwrap_or(0);
        match dedicated_pins(&placed, node, count, vmi) {
            Ok(p) => pins = p,
            Err(why) => picked = Err(format!("0/1 nodes are available: {why}")),
        }
    }
    let (ns, name) = (vmi.namespace(), vmi.name());
    match picked {
        Ok((node, guest_cpu)) => {
            // Its DataVolumes first: the agent fills only those bound to its node.
            super::datavolume::bind(&ctx.store, vmi, &node).await?;
            let places = super::datavolume::used_by(&ctx.store, vmi).await?;
            let volumes = super::datavolume::volume_status(vmi, &places);
            let cpu_json = serde_json::to_string(&guest_cpu).unwrap_or_default();

            ctx.store
                .update_typed(ns, name, |o: &mut VirtualMachineInstance| {
                    if o.node_name().is_some() {
                        return Ok(());
                    }
                    let annotations = o.metadata.annotations.get_or_insert_default();
                    annotations.insert(
                        crate::cpu::policy::GUEST_CPU_ANNOTATION.to_string(),
                        cpu_json,
                    );
                    if let Some(p) = &pins {
                        annotations
                            .insert(DEDICATED_CPUS_ANNOTATION.to_string(), p.to_annotation());
                    }
                    let st = o.status.get_or_insert_default();
                    st.node_name = Some(node.clone());
                    st.volume_status = volumes.clone();
                    st.enter_phase(Phase::Scheduled, false);
                    set_condition(
                        &mut st.conditions,
                        condition(ConditionType::PodScheduled, ConditionStatus::True, "", ""),
                    );
                    Ok(())
                })
                .await?;
            tracing::info!(namespace = %ns, %name, %node, "scheduled");
            Ok(true)
        }
        Err(msg) => {
            ctx.store
                .update_typed(ns, name, |o: &mut VirtualMachineInstance| {
                    set_condition(
                        &mut o.status.get_or_insert_default().conditions,
                        condition(
                            ConditionType::PodScheduled,
                            ConditionStatus::False,
                            "Unschedulable",
                            &msg,
                        ),
                    );
                    Ok(())
                })
                .await?;
            Ok(false)
        }
    }
}

/// Mark nodes that missed their heartbeats NotReady and their instances Unknown.
pub async fn check_leases(ctx: &Context) -> Result<(), Error> {
    let nodes: Vec<Node> = ctx.store.all().await?;
    for n in nodes {
        let was_ready = n
            .status
            .as_ref()
            .is_some_and(|s| condition_true(&s.conditions, &ConditionType::Ready));
        if !was_ready || node_ready(&n) {
            continue;
        }
        let name = n.name();
        tracing::warn!(node = %name, "node missed its heartbeats; marking NotReady");
        ctx.store
            .update_typed("", name, |o: &mut Node| {
                set_condition(
                    &mut o.status.get_or_insert_default().conditions,
                    condition(
                        ConditionType::Ready,
                        ConditionStatus::False,
                        "NodeStatusUnknown",
                        "the agent stopped sending heartbeats",
                    ),
                );
                Ok(())
            })
            .await?;
        let vmis: Vec<VirtualMachineInstance> = ctx
            .store
            .list_typed(None, &LabelSelector::default(), &FieldSelector::node(name))
            .await?;
        for v in vmis.iter().filter(|v| !v.phase().is_final()) {
            ctx.store
                .update_typed(v.namespace(), v.name(), |o: &mut VirtualMachineInstance| {
                    let st = o.status.get_or_insert_default();
                    st.phase = Some(Phase::Unknown);
                    st.reason = Some("NodeUnresponsive".into());
                    set_condition(
                        &mut st.conditions,
                        condition(
                            ConditionType::Ready,
                            ConditionStatus::False,
                            "NodeUnresponsive",
                            "the node's agent is not reporting",
                        ),
                    );
                    Ok(())
                })
                .await?;
        }
    }
    Ok(())
}
