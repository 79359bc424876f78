//! Graphs and activity: the graph data of VMs and nodes (JSON for the charts
//! in `web/static/graphs.js`), and the site's activity (its Kubernetes events, newest
//! first, filterable by VM and node).

use askama::Template;
use axum::Json;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Event;
use serde::Deserialize;

use super::{Chrome, all, error_page, load_vm, or_dash, render};
use crate::controller::recorder::last_seen;
use crate::metrics::graphs::{ARCHIVES, node_key, unix_now, vm_key};
use crate::types::edgevirt::Node;
use crate::types::{Meta, age};
use crate::web::{S, WebUser};

#[derive(Deserialize)]
pub struct RangeQuery {
    range: Option<String>,
}

/// One graph's points for the charts; a range the archives do not have is a 400.
fn graph_json(st: &crate::vnc::VncState, key: &str, q: &RangeQuery) -> Response {
    let range = q.range.as_deref().unwrap_or("hour");
    if !ARCHIVES.iter().any(|(n, _, _)| *n == range) {
        return (
            StatusCode::BAD_REQUEST,
            "range must be one of hour, day, week, month",
        )
            .into_response();
    }
    match st.graphs.points(key, range, unix_now()) {
        Some(p) => Json(p).into_response(),
        // Nothing recorded yet: an empty graph, not an error.
        None => Json(serde_json::json!({"step": 0, "times": [], "series": []})).into_response(),
    }
}

/// `GET /ui/vms/{ns}/{name}/graphs?range=hour|day|week|month`
pub async fn vm_graphs(
    State(st): S,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<RangeQuery>,
) -> Response {
    match load_vm(&st, &ns, &name).await {
        Ok((_, vm, _)) => graph_json(&st, &vm_key(vm.uid()), &q),
        Err(r) => r,
    }
}

/// `GET /ui/nodes/{name}/graphs?range=...`
pub async fn node_graphs(
    State(st): S,
    Path(name): Path<String>,
    Query(q): Query<RangeQuery>,
) -> Response {
    match st.store.get_typed::<Node>("", &name).await {
        Ok(Some(n)) => graph_json(&st, &node_key(n.name()), &q),
        Ok(None) => error_page(StatusCode::NOT_FOUND, &format!("no node {name:?}")),
        Err(e) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

pub struct EventView {
    pub last_seen: String,
    pub type_: String,
    pub reason: String,
    pub object: String,
    /// The VM page the object belongs to, if it is a VM or its instance.
    pub link: Option<String>,
    pub message: String,
    pub source: String,
    pub count: i32,
}

/// Events newest first, as the pages show them.
fn event_views(
    mut events: Vec<Event>,
    keep: impl Fn(&Event) -> bool,
    max: usize,
) -> Vec<EventView> {
    events.retain(|e| keep(e));
    events.sort_by_key(|e| std::cmp::Reverse(last_seen(e)));
    events.truncate(max);
    events
        .into_iter()
        .map(|e| {
            let o = &e.involved_object;
            let kind = o.kind.clone().unwrap_or_default();
            let name = o.name.clone().unwrap_or_default();
            let ns = o.namespace.clone().unwrap_or_default();
            let link =
                matches!(kind.as_str(), "VirtualMachine" | "VirtualMachineInstance").then(|| {
                    format!(
                        "/ui/vms/{}/{}",
                        super::url_encode(&ns),
                        super::url_encode(&name)
                    )
                });
            let source = e.source.as_ref().map(|s| {
                [s.component.as_deref(), s.host.as_deref()]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(", ")
            });
            EventView {
                last_seen: last_seen(&e)
                    .map(|t| age(&t.to_string()))
                    .unwrap_or_else(|| "-".into()),
                type_: e.type_.clone().unwrap_or_default(),
                reason: e.reason.clone().unwrap_or_default(),
                object: format!("{}/{}", kind.to_ascii_lowercase(), name),
                link,
                message: e.message.clone().unwrap_or_default(),
                source: or_dash(source.as_deref().unwrap_or_default()),
                count: e.count.unwrap_or(1),
            }
        })
        .collect()
}

/// Is an event about this VM (the VM or its instance)?
fn about_vm(e: &Event, ns: &str, name: &str) -> bool {
    let o = &e.involved_object;
    o.namespace.as_deref() == Some(ns)
        && o.name.as_deref() == Some(name)
        && matches!(
            o.kind.as_deref(),
            Some("VirtualMachine" | "VirtualMachineInstance")
        )
}

/// Is an event about this node, or seen by its agent?
fn about_node(e: &Event, node: &str) -> bool {
    let o = &e.involved_object;
    (o.kind.as_deref() == Some("Node") && o.name.as_deref() == Some(node))
        || e.source.as_ref().and_then(|s| s.host.as_deref()) == Some(node)
}

/// The events of one node, newest first (for its page).
pub async fn node_events(st: &crate::http::AppState, node: &str) -> Vec<EventView> {
    let events: Vec<Event> = st.store.all().await.unwrap_or_default();
    event_views(events, |e| about_node(e, node), 20)
}

/// The events of one VM, newest first (for its page).
pub async fn vm_events(st: &crate::http::AppState, ns: &str, name: &str) -> Vec<EventView> {
    let events: Vec<Event> = st.store.all().await.unwrap_or_default();
    event_views(events, |e| about_vm(e, ns, name), 20)
}

#[derive(Deserialize)]
pub struct ActivityQuery {
    /// `NAMESPACE/NAME`
    vm: Option<String>,
    node: Option<String>,
}

#[derive(Template)]
#[template(path = "activity.html")]
struct ActivityTpl {
    c: Chrome,
    vm: String,
    node: String,
    vms: Vec<String>,
    nodes: Vec<String>,
    events: Vec<EventView>,
}

/// `GET /ui/activity?vm=NS/NAME&node=NODE`: what happened on the site, newest first.
pub async fn activity(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Query(q): Query<ActivityQuery>,
) -> Response {
    let (events, nodes, vms) = match tokio::try_join!(
        all::<Event>(&st),
        all::<Node>(&st),
        all::<crate::types::VirtualMachine>(&st)
    ) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let vm = q.vm.unwrap_or_default();
    let node = q.node.unwrap_or_default();
    let (vm_ns, vm_name) = vm.split_once('/').unwrap_or(("", ""));
    let events = event_views(
        events,
        |e| {
            (vm.is_empty() || about_vm(e, vm_ns, vm_name))
                && (node.is_empty() || about_node(e, &node))
        },
        500,
    );
    render(&ActivityTpl {
        c: Chrome::new(&u, "Activity"),
        vms: vms
            .iter()
            .map(|v| format!("{}/{}", v.namespace(), v.name()))
            .collect(),
        nodes: nodes.iter().map(|n| n.name().to_string()).collect(),
        vm,
        node,
        events,
    })
}
