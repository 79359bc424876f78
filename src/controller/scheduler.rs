//! The scheduler binds a pending VMI to a Ready, schedulable node with enough free memory
//! and vCPUs (capacity minus the instances already placed), honouring `nodeSelector` and
//! cordons; it spreads by picking the node with the most free memory. vCPUs are
//! overcommitted as KubeVirt does by default (`cpuAllocationRatio` 10: each vCPU asks for a
//! tenth of a host CPU), but one VM never gets more vCPUs than its node has CPUs. Node
//! leases mark silent nodes NotReady and their instances Unknown, never deleting them.
//! Instances with `persistentVolumeClaim` volumes go only to nodes that mount a shared
//! storage pool, and migrate only between nodes that mount the same one.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::{Context, NODE_LEASE};
use crate::store::{Error, FieldSelector, LabelSelector};
use crate::types::kubevirt::{VirtualMachineInstanceSpec, phase};
use crate::types::{Kind, now};
use crate::virt::convert::guest_memory;

pub fn node_ready(node: &Value) -> bool {
    let fresh = node["status"]["lastHeartbeatTime"]
        .as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .is_some_and(|t| {
            (Utc::now() - t.with_timezone(&Utc))
                .to_std()
                .map(|d| d < NODE_LEASE)
                .unwrap_or(true)
        });
    fresh
        && node["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// KubeVirt's default `cpuAllocationRatio`: placed vCPUs may be ten times the host's CPUs.
pub const CPU_ALLOCATION_RATIO: u64 = 10;

fn vcpus_of(vmi: &Value) -> u64 {
    serde_json::from_value::<VirtualMachineInstanceSpec>(vmi["spec"].clone())
        .map(|s| {
            let (so, co, th) = crate::virt::convert::topology(&s);
            u64::from(so) * u64::from(co) * u64::from(th)
        })
        .unwrap_or(1)
}

fn memory_of(vmi: &Value) -> u64 {
    serde_json::from_value::<VirtualMachineInstanceSpec>(vmi["spec"].clone())
        .ok()
        .and_then(|s| guest_memory(&s).ok())
        .unwrap_or(0)
}

/// The node a VMI fits best, or why none fits: ("0/N nodes are available: ...").
/// `exclude` leaves out one node (a migration's source); `extra_selector` adds labels the
/// node must carry.
pub async fn pick_node(
    ctx: &Context,
    vmi: &Value,
    exclude: Option<&str>,
    extra_selector: &serde_json::Map<String, Value>,
) -> Result<Result<(String, crate::cpu::GuestCpu), String>, Error> {
    let (nodes, _) = ctx
        .store
        .list(
            Kind::Node,
            None,
            &LabelSelector::default(),
            &FieldSelector::default(),
        )
        .await?;
    let (placed, _) = ctx
        .store
        .list(
            Kind::VirtualMachineInstance,
            None,
            &LabelSelector::default(),
            &FieldSelector::default(),
        )
        .await?;
    let need = memory_of(vmi);
    let need_vcpus = vcpus_of(vmi);
    let mut selector = vmi["spec"]["nodeSelector"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    selector.extend(extra_selector.clone());
    let mut reasons = Vec::new();
    let mut best: Option<(u64, String, crate::cpu::GuestCpu)> = None;
    let ready: Vec<&Value> = nodes.iter().filter(|n| node_ready(n)).collect();
    let cpu_default = crate::cpu::policy::scheduling_default(&ready);
    let source_node = exclude.and_then(|x| nodes.iter().find(|n| n["metadata"]["name"] == x));
    // Claims live on the shared pool: only nodes that mount it can open them, and a
    // migration stays among nodes that mount the same one.
    let claims = super::migration::shared_disks(vmi);
    let needs_pool = !claims.is_empty();
    let source_pool = source_node.and_then(|n| n["status"]["sharedPool"]["name"].as_str());
    let running_cpu: Option<crate::cpu::GuestCpu> = vmi["metadata"]["annotations"]
        [crate::cpu::policy::GUEST_CPU_ANNOTATION]
        .as_str()
        .and_then(|s| serde_json::from_str(s).ok());
    for n in &nodes {
        let name = n["metadata"]["name"].as_str().unwrap_or("").to_string();
        if exclude == Some(name.as_str()) {
            reasons.push(format!("{name}: the instance runs there"));
            continue;
        }
        if !node_ready(n) {
            reasons.push(format!("{name}: not ready"));
            continue;
        }
        if n["spec"]["unschedulable"] == true {
            reasons.push(format!("{name}: cordoned"));
            continue;
        }
        if !selector
            .iter()
            .all(|(k, v)| n["metadata"]["labels"].get(k) == Some(v))
        {
            reasons.push(format!("{name}: does not match nodeSelector"));
            continue;
        }
        if needs_pool {
            match (n["status"]["sharedPool"]["name"].as_str(), source_pool) {
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
        let here: Vec<&Value> = placed
            .iter()
            .filter(|v| v["status"]["nodeName"].as_str() == Some(name.as_str()))
            .filter(|v| !phase::is_final(v["status"]["phase"].as_str().unwrap_or("")))
            .collect();
        let used: u64 = here.iter().map(|v| memory_of(v)).sum();
        let cap = n["status"]["memoryBytes"].as_u64().unwrap_or(0);
        let free = cap.saturating_sub(used);
        if free < need {
            reasons.push(format!(
                "{name}: insufficient memory ({} MiB free, {} MiB requested)",
                free >> 20,
                need >> 20
            ));
            continue;
        }
        let cpus = n["status"]["cpu"]["count"].as_u64().unwrap_or(0);
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
        // A migration keeps the guest CPU the instance runs with: the target must be able
        // to run that one (and everything it needs from the source's CPU).
        if let (Some(src), Some(running)) = (source_node, &running_cpu) {
            let (sf, tf) = (
                crate::cpu::policy::node_object_facts(src),
                crate::cpu::policy::node_object_facts(n),
            );
            if let Err(e) = crate::cpu::check_target(running, &sf, &tf) {
                reasons.push(format!("{name}: {e}"));
                continue;
            }
            if best.as_ref().is_none_or(|(f, _, _)| free > *f) {
                best = Some((free, name, running.clone()));
            }
            continue;
        }
        // The guest CPU it would get there, and whether that node can run it.
        let guest_cpu = match crate::cpu::policy::place(vmi, n, &cpu_default) {
            Ok(g) => g,
            Err(e) => {
                reasons.push(format!("{name}: {e}"));
                continue;
            }
        };
        if best.as_ref().is_none_or(|(f, _, _)| free > *f) {
            best = Some((free, name, guest_cpu));
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

/// Try to place a VMI; false (with an explaining condition) if no node fits.
pub async fn schedule(ctx: &Context, vmi: &Value) -> Result<bool, Error> {
    let picked = pick_node(ctx, vmi, None, &Default::default()).await?;
    let (ns, name) = (
        vmi["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        vmi["metadata"]["name"].as_str().unwrap_or("").to_string(),
    );
    match picked {
        Ok((node, guest_cpu)) => {
            let node2 = node.clone();
            let cpu_json = serde_json::to_string(&guest_cpu).unwrap_or_default();
            ctx.store
                .update(Kind::VirtualMachineInstance, &ns, &name, move |o| {
                    if o["status"]["nodeName"]
                        .as_str()
                        .is_some_and(|n| !n.is_empty())
                    {
                        return Ok(());
                    }
                    o["status"]["nodeName"] = json!(node2);
                    o["metadata"]["annotations"][crate::cpu::policy::GUEST_CPU_ANNOTATION] =
                        json!(cpu_json);
                    o["status"]["phase"] = json!(phase::SCHEDULED);
                    o["status"]["phaseTransitionTimestampsMap"][phase::SCHEDULED] = json!(now());
                    set_cond(o, "PodScheduled", "True", "", "");
                    Ok(())
                })
                .await?;
            tracing::info!(namespace = %ns, %name, %node, "scheduled");
            Ok(true)
        }
        Err(msg) => {
            ctx.store
                .update(Kind::VirtualMachineInstance, &ns, &name, move |o| {
                    set_cond(o, "PodScheduled", "False", "Unschedulable", &msg);
                    Ok(())
                })
                .await?;
            Ok(false)
        }
    }
}

pub(super) fn set_cond(o: &mut Value, t: &str, status: &str, reason: &str, message: &str) {
    if !o["status"]["conditions"].is_array() {
        o["status"]["conditions"] = json!([]);
    }
    let list = o["status"]["conditions"].as_array_mut().expect("array");
    let new = json!({"type": t, "status": status, "reason": reason, "message": message, "lastTransitionTime": now()});
    match list.iter_mut().find(|c| c["type"] == t) {
        Some(c) if c["status"] == status && c["message"] == message => {}
        Some(c) => *c = new,
        None => list.push(new),
    }
}

/// Mark nodes that missed their heartbeats NotReady and their instances Unknown.
pub async fn check_leases(ctx: &Context) -> Result<(), Error> {
    let (nodes, _) = ctx
        .store
        .list(
            Kind::Node,
            None,
            &LabelSelector::default(),
            &FieldSelector::default(),
        )
        .await?;
    for n in nodes {
        let name = n["metadata"]["name"].as_str().unwrap_or("").to_string();
        let was_ready = n["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if !was_ready || node_ready(&n) {
            continue;
        }
        tracing::warn!(node = %name, "node missed its heartbeats; marking NotReady");
        ctx.store
            .update(Kind::Node, "", &name, |o| {
                set_cond(
                    o,
                    "Ready",
                    "False",
                    "NodeStatusUnknown",
                    "the agent stopped sending heartbeats",
                );
                Ok(())
            })
            .await?;
        let (vmis, _) = ctx
            .store
            .list(
                Kind::VirtualMachineInstance,
                None,
                &LabelSelector::default(),
                &FieldSelector::node(&name),
            )
            .await?;
        for v in vmis {
            if phase::is_final(v["status"]["phase"].as_str().unwrap_or("")) {
                continue;
            }
            let (ns, vname) = (
                v["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                v["metadata"]["name"].as_str().unwrap_or("").to_string(),
            );
            ctx.store
                .update(Kind::VirtualMachineInstance, &ns, &vname, |o| {
                    o["status"]["phase"] = json!(phase::UNKNOWN);
                    o["status"]["reason"] = json!("NodeUnresponsive");
                    set_cond(
                        o,
                        "Ready",
                        "False",
                        "NodeUnresponsive",
                        "the node's agent is not reporting",
                    );
                    Ok(())
                })
                .await?;
        }
    }
    Ok(())
}
