//! The overview page: nodes, VM counts, the launcher rollout.

use askama::Template;
use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use std::collections::BTreeMap;

use super::{Chrome, all, error_page, human_bytes, or_dash, printable_status, render, vmi_status};
use crate::types::edgevirt::Node;
use crate::types::kubevirt::{self, ConditionType, VirtualMachine, VirtualMachineInstance};
use crate::types::{Meta, age};
use crate::web::{S, WebUser};

pub struct NodeRow {
    name: String,
    status: String,
    cordoned: bool,
    vendor: String,
    model: String,
    /// CPUID family/model/stepping, e.g. `24/1/1`.
    signature: String,
    /// libvirt's host-model CPU, e.g. `Dhyana`.
    host_model: String,
    cpus: u64,
    accel: String,
    memory: String,
    vms: usize,
    version: String,
    heartbeat: String,
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewTpl {
    c: Chrome,
    nodes: Vec<NodeRow>,
    total: usize,
    by_status: Vec<(String, usize)>,
    rollout: crate::controller::strategy::Rollout,
}

#[derive(serde::Deserialize)]
pub struct OverviewQuery {
    /// A node the dashboard just deleted.
    #[serde(default)]
    deleted_node: Option<String>,
}

pub async fn overview(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Query(q): Query<OverviewQuery>,
) -> Response {
    let (nodes, vms, vmis) = match tokio::try_join!(
        all::<Node>(&st),
        all::<VirtualMachine>(&st),
        all::<VirtualMachineInstance>(&st)
    ) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for i in &vmis {
        let node = vmi_status(i).node_name.as_deref().unwrap_or_default();
        *per_node.entry(node).or_default() += 1;
    }
    let nodes: Vec<NodeRow> = nodes
        .iter()
        .map(|n| {
            let name = n.name().to_string();
            let status = n.status.clone().unwrap_or_default();
            let cpu = &status.cpu;
            NodeRow {
                vms: per_node.get(name.as_str()).copied().unwrap_or(0),
                status: match kubevirt::condition(&status.conditions, &ConditionType::Ready) {
                    Some(c) if c.is_true() => "Ready".into(),
                    Some(_) => "NotReady".into(),
                    None => "Unknown".into(),
                },
                cordoned: n.spec.unschedulable,
                vendor: or_dash(&cpu.vendor),
                model: or_dash(&cpu.model),
                // The agent leaves the CPUID signature out when it does not know it.
                signature: match cpu.family {
                    0 => "-".into(),
                    f => format!("{f}/{}/{}", cpu.model_number, cpu.stepping),
                },
                host_model: or_dash(cpu.host_model.as_ref().map_or("", |m| m.model.as_str())),
                cpus: cpu.count.into(),
                accel: or_dash(&status.accelerator),
                memory: human_bytes(status.memory_bytes),
                version: or_dash(&status.version),
                heartbeat: match status.last_heartbeat_time.as_deref() {
                    None | Some("") => "-".into(),
                    Some(t) => format!("{} ago", age(t)),
                },
                name,
            }
        })
        .collect();
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    for vm in &vms {
        *by_status.entry(or_dash(printable_status(vm))).or_default() += 1;
    }
    let rollout = match crate::controller::strategy::current_rollout(&st.store).await {
        Ok(r) => r,
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    // Confirmed only when no node of that name is left.
    let notice = q
        .deleted_node
        .filter(|d| !nodes.iter().any(|n| n.name == *d))
        .map(|d| format!("Node {d} deleted; its agent must join again to come back."));
    render(&OverviewTpl {
        c: Chrome {
            notice,
            ..Chrome::new(&u, "Overview")
        },
        nodes,
        total: vms.len(),
        by_status: by_status.into_iter().collect(),
        rollout,
    })
}
