//! A node's page and what an administrator does with a node from it: cordon (no new VMs),
//! uncordon, drain (every running VM moved off, each VM's fate shown as it happens) and
//! delete. The node's VMs and the migrations off it are a live region the page polls.

use askama::Template;
use axum::extract::{Extension, Form, Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::json;

use super::{Chrome, all, error_page, human_bytes, or_dash, render, url_encode};
use crate::http::auth::{Principal, Role};
use crate::rules::drain::{Eviction, eviction};
use crate::types::edgevirt::Node;
use crate::types::kubevirt::{
    MigrationPhase, Phase, VirtualMachineInstance, VirtualMachineInstanceMigration,
};
use crate::types::{Meta, age};
use crate::web::{Api, S, WebUser, api_message};

/// One VM running on the node, and what a drain would do with it.
pub struct NodeVm {
    link: String,
    name: String,
    phase: String,
    on_drain: String,
}

/// One migration off the node (or of a VM on it), newest first.
pub struct Move {
    link: String,
    vm: String,
    outcome: String,
    failed: bool,
    started: String,
}

pub struct NodeVms {
    cordoned: bool,
    vms: Vec<NodeVm>,
    moves: Vec<Move>,
}

#[derive(Template)]
#[template(path = "node.html")]
struct NodeTpl {
    c: Chrome,
    name: String,
    facts: Vec<(&'static str, String)>,
    live: NodeVms,
    report: Vec<String>,
    events: Vec<super::monitoring::EventView>,
    graphs_url: String,
}

#[derive(Template)]
#[template(path = "node_vms.html")]
struct NodeVmsTpl {
    live: NodeVms,
}

/// What a migration's phase means to a person watching a node empty.
fn outcome(m: &VirtualMachineInstanceMigration) -> (String, bool) {
    let s = m.status.clone().unwrap_or_default();
    let state = s.migration_state.unwrap_or_default();
    let to = state.target_node.unwrap_or_default();
    match s.phase.unwrap_or_default() {
        MigrationPhase::Succeeded => (format!("moved to {to}"), false),
        MigrationPhase::Failed => {
            let why = state
                .failure_reason
                .filter(|r| !r.is_empty())
                .or_else(|| s.conditions.iter().rev().find_map(|c| c.message.clone()))
                .unwrap_or_else(|| "no reason given".into());
            (format!("failed: {why}"), true)
        }
        p if to.is_empty() => (format!("migrating ({})", p.as_str()), false),
        p => (format!("migrating to {to} ({})", p.as_str()), false),
    }
}

async fn node_vms(st: &crate::http::AppState, node: &Node) -> Result<NodeVms, Response> {
    let name = node.name();
    let (vmis, migrations) = tokio::try_join!(
        all::<VirtualMachineInstance>(st),
        all::<VirtualMachineInstanceMigration>(st)
    )?;
    let here: Vec<&VirtualMachineInstance> = vmis
        .iter()
        .filter(|v| v.node_name() == Some(name))
        .collect();
    let vms = here
        .iter()
        .map(|v| {
            let phase = v
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let on_drain = if phase != Phase::Running {
                "nothing to move".to_string()
            } else {
                match eviction(v, false, false) {
                    Eviction::Migrate => "live-migrates".to_string(),
                    Eviction::Stays(why) | Eviction::Stop(why) => format!(
                        "stays ({why}); moves with \"copy disks\" if it only lacks shared \
                         storage, stops with \"stop what cannot move\""
                    ),
                }
            };
            NodeVm {
                link: super::detail_url(v.namespace(), v.name()),
                name: format!("{}/{}", v.namespace(), v.name()),
                phase: phase.to_string(),
                on_drain,
            }
        })
        .collect();
    let mut moves: Vec<&VirtualMachineInstanceMigration> = migrations
        .iter()
        .filter(|m| {
            let source = m
                .status
                .as_ref()
                .and_then(|s| s.migration_state.as_ref())
                .and_then(|s| s.source_node.as_deref());
            match source {
                Some(s) => s == name,
                // Not started yet: its VM is still here.
                None => here
                    .iter()
                    .any(|v| v.namespace() == m.namespace() && v.name() == m.spec.vmi_name),
            }
        })
        .collect();
    moves.sort_by_key(|m| std::cmp::Reverse(super::created(*m)));
    moves.truncate(20);
    Ok(NodeVms {
        cordoned: node.spec.unschedulable,
        vms,
        moves: moves
            .into_iter()
            .map(|m| {
                let (outcome, failed) = outcome(m);
                let created = super::created(m);
                Move {
                    link: super::detail_url(m.namespace(), &m.spec.vmi_name),
                    vm: format!("{}/{}", m.namespace(), m.spec.vmi_name),
                    outcome,
                    failed,
                    started: if created.is_empty() {
                        "-".into()
                    } else {
                        age(&created)
                    },
                }
            })
            .collect(),
    })
}

async fn load_node(st: &crate::http::AppState, name: &str) -> Result<Node, Response> {
    match st.store.get_typed::<Node>("", name).await {
        Ok(Some(n)) => Ok(n),
        Ok(None) => Err(error_page(
            StatusCode::NOT_FOUND,
            &format!("no node {name:?}"),
        )),
        Err(e) => Err(error_page(
            StatusCode::INTERNAL_SERVER_ERROR,
            &e.to_string(),
        )),
    }
}

fn facts(node: &Node) -> Vec<(&'static str, String)> {
    let s = node.status.clone().unwrap_or_default();
    let ready = crate::rules::node::node_ready(node);
    vec![
        (
            "Status",
            match (ready, node.spec.unschedulable) {
                (true, false) => "Ready",
                (true, true) => "Ready, cordoned (no new VMs)",
                (false, false) => "Not ready",
                (false, true) => "Not ready, cordoned",
            }
            .to_string(),
        ),
        (
            "CPU",
            or_dash(format!("{} {}", s.cpu.vendor, s.cpu.model).trim()),
        ),
        ("CPUs", s.cpu.count.to_string()),
        ("Memory", human_bytes(s.memory_bytes)),
        (
            "Accelerator",
            match &s.accelerator_reason {
                Some(why) if !s.accelerator.is_empty() => format!("{}: {why}", s.accelerator),
                _ => or_dash(&s.accelerator),
            },
        ),
        (
            "Bridges",
            or_dash(
                &s.bridges
                    .iter()
                    .map(|b| {
                        if b.vlan_filtering {
                            format!("{} (VLAN filtering)", b.name)
                        } else {
                            b.name.clone()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        ),
        ("Version", or_dash(&s.version)),
    ]
}

#[derive(Deserialize)]
pub struct NodeQuery {
    #[serde(default)]
    done: Option<String>,
}

async fn page(
    st: &crate::http::AppState,
    u: &WebUser,
    node: Node,
    notice: Option<String>,
    report: Vec<String>,
) -> Response {
    let name = node.name().to_string();
    let live = match node_vms(st, &node).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    render(&NodeTpl {
        c: Chrome {
            notice,
            ..Chrome::new(u, name.clone())
        },
        facts: facts(&node),
        live,
        report,
        events: super::monitoring::node_events(st, &name).await,
        graphs_url: format!("/ui/nodes/{}/graphs", url_encode(&name)),
        name,
    })
}

/// `GET /ui/nodes/{name}`: a node's facts, its VMs and migrations, graphs and recent events;
/// an administrator's actions.
pub async fn node_page(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Path(name): Path<String>,
    Query(q): Query<NodeQuery>,
) -> Response {
    let node = match load_node(&st, &name).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    // Only known actions are named back: nothing from the query string is echoed.
    let notice = match q.done.as_deref() {
        Some("cordon") => Some(format!("{name} is cordoned: no new VM starts on it.")),
        Some("uncordon") => Some(format!("{name} takes new VMs again.")),
        _ => None,
    };
    page(&st, &u, node, notice, vec![]).await
}

/// `GET /ui/nodes/{name}/vms`: the live region of the node's VMs and migrations.
pub async fn node_vms_fragment(State(st): S, Path(name): Path<String>) -> Response {
    let node = match load_node(&st, &name).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    match node_vms(&st, &node).await {
        Ok(live) => render(&NodeVmsTpl { live }),
        Err(r) => r,
    }
}

#[derive(Deserialize)]
pub struct NodeActionForm {
    action: String,
    /// Drain: copy local disks along (block migration).
    #[serde(default)]
    block: Option<String>,
    /// Drain: stop the VMs that cannot move.
    #[serde(default)]
    force: Option<String>,
}

/// `POST /ui/nodes/{name}/action`: cordon, uncordon, drain or delete, as the administrator
/// (the API judges each call as for the CLI).
pub async fn node_action(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path(name): Path<String>,
    Form(f): Form<NodeActionForm>,
) -> Response {
    if u.role != Role::Admin {
        return error_page(
            StatusCode::FORBIDDEN,
            "only an administrator cordons, drains or deletes nodes",
        );
    }
    let path = format!("/apis/edgevirt.io/v1/nodes/{}", url_encode(&name));
    let cordon = |on: bool| {
        let (api, p, path) = (api.clone(), p.clone(), path.clone());
        async move {
            api.call(
                &p,
                Method::PATCH,
                &path,
                "application/merge-patch+json",
                json!({"spec": {"unschedulable": on}}).to_string(),
            )
            .await
        }
    };
    let (code, v) = match f.action.as_str() {
        a @ ("cordon" | "uncordon") => {
            let (code, v) = cordon(a == "cordon").await;
            if code.is_success() {
                return Redirect::to(&format!("/ui/nodes/{}?done={a}", url_encode(&name)))
                    .into_response();
            }
            (code, v)
        }
        "delete" => {
            let (code, v) = api
                .call(&p, Method::DELETE, &path, "application/json", "{}")
                .await;
            if code.is_success() {
                return Redirect::to(&format!("/ui/?deleted_node={}", url_encode(&name)))
                    .into_response();
            }
            (code, v)
        }
        "drain" => {
            let (code, v) = cordon(true).await;
            if !code.is_success() {
                return error_page(code, &api_message(&v));
            }
            let report = drain(&st, &api, &p, &name, f.block.is_some(), f.force.is_some()).await;
            let node = match load_node(&st, &name).await {
                Ok(n) => n,
                Err(r) => return r,
            };
            let notice = Some(format!(
                "{name} is cordoned and draining; each VM's migration below follows it to its end."
            ));
            return page(&st, &u, node, notice, report).await;
        }
        other => return error_page(StatusCode::BAD_REQUEST, &format!("no action {other:?}")),
    };
    error_page(code, &api_message(&v))
}

/// Start moving every running VM off `node` (or stop those that cannot move, when forced);
/// one line per VM saying what was done.
async fn drain(
    st: &crate::http::AppState,
    api: &Api,
    p: &Principal,
    node: &str,
    block: bool,
    force: bool,
) -> Vec<String> {
    let vmis = match st.store.all::<VirtualMachineInstance>().await {
        Ok(v) => v,
        Err(e) => return vec![format!("listing the node's VMs failed: {e}")],
    };
    let mut report = Vec::new();
    for v in vmis.iter().filter(|v| v.node_name() == Some(node)) {
        let running = v.status.as_ref().and_then(|s| s.phase.as_ref()) == Some(&Phase::Running);
        if !running {
            continue;
        }
        let (ns, name) = (v.namespace(), v.name());
        let vmi_path = |sub: &str| {
            format!(
                "/apis/{}/v1/namespaces/{}/virtualmachineinstances/{}{sub}",
                if sub.is_empty() {
                    "kubevirt.io"
                } else {
                    "subresources.kubevirt.io"
                },
                url_encode(ns),
                url_encode(name)
            )
        };
        let line = match eviction(v, block, force) {
            Eviction::Stays(why) => format!("{ns}/{name}: left running: {why}"),
            Eviction::Stop(why) => {
                let (code, r) = api
                    .call(p, Method::DELETE, &vmi_path(""), "application/json", "{}")
                    .await;
                if code.is_success() {
                    format!("{ns}/{name}: stopping ({why})")
                } else {
                    format!("{ns}/{name}: cannot stop: {}", api_message(&r))
                }
            }
            Eviction::Migrate => {
                let body = if block {
                    json!({"blockMigration": true})
                } else {
                    json!({})
                };
                let (code, r) = api
                    .call(
                        p,
                        Method::PUT,
                        &vmi_path("/migrate"),
                        "application/json",
                        body.to_string(),
                    )
                    .await;
                if code.is_success() {
                    format!("{ns}/{name}: migrating")
                } else {
                    format!("{ns}/{name}: cannot migrate: {}", api_message(&r))
                }
            }
        };
        report.push(line);
    }
    if report.is_empty() {
        report.push("No running VM was on the node.".into());
    }
    report
}
