//! The scheduler binds a pending VMI to a Ready, schedulable node with enough free memory
//! (capacity minus the instances already placed), honouring `nodeSelector`; it spreads by
//! picking the node with the most free memory. Node leases mark silent nodes NotReady and
//! their instances Unknown, never deleting them.

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

fn memory_of(vmi: &Value) -> u64 {
    serde_json::from_value::<VirtualMachineInstanceSpec>(vmi["spec"].clone())
        .ok()
        .and_then(|s| guest_memory(&s).ok())
        .unwrap_or(0)
}

/// Try to place a VMI; false (with an explaining condition) if no node fits.
pub async fn schedule(ctx: &Context, vmi: &Value) -> Result<bool, Error> {
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
    let selector = vmi["spec"]["nodeSelector"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut reasons = Vec::new();
    let mut best: Option<(u64, String, crate::cpu::GuestCpu)> = None;
    let ready: Vec<&Value> = nodes.iter().filter(|n| node_ready(n)).collect();
    let cpu_default = crate::cpu::policy::scheduling_default(&ready);
    for n in &nodes {
        let name = n["metadata"]["name"].as_str().unwrap_or("").to_string();
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
        let used: u64 = placed
            .iter()
            .filter(|v| v["status"]["nodeName"].as_str() == Some(name.as_str()))
            .filter(|v| !phase::is_final(v["status"]["phase"].as_str().unwrap_or("")))
            .map(memory_of)
            .sum();
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
    let (ns, name) = (
        vmi["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        vmi["metadata"]["name"].as_str().unwrap_or("").to_string(),
    );
    match best {
        Some((_, node, guest_cpu)) => {
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
        None => {
            let msg = if nodes.is_empty() {
                "0/0 nodes are available: no node has registered".to_string()
            } else {
                format!(
                    "0/{} nodes are available: {}",
                    nodes.len(),
                    reasons.join("; ")
                )
            };
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

fn set_cond(o: &mut Value, t: &str, status: &str, reason: &str, message: &str) {
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
