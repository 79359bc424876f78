//! The site networks page: each NetworkAttachmentDefinition with its bridge and VLAN, the
//! nodes that have the bridge (VLAN-filtering for a VLAN), and the VMs on it.

use askama::Template;
use axum::extract::{Extension, State};
use axum::response::Response;

use super::{Chrome, all, render};
use crate::types::Meta;
use crate::types::cni::{NetworkAttachmentDefinition, parse_config};
use crate::types::edgevirt::Node;
use crate::types::kubevirt::VirtualMachine;
use crate::web::{S, WebUser};

struct NetworkRow {
    namespace: String,
    name: String,
    bridge: String,
    vlan: String,
    /// Why the config cannot be used, when it cannot.
    problem: String,
    nodes: Vec<String>,
    /// Nodes without the bridge, with why.
    missing: Vec<String>,
    vms: Vec<(String, String)>,
}

#[derive(Template)]
#[template(path = "networks.html")]
struct NetworksTpl {
    c: Chrome,
    networks: Vec<NetworkRow>,
}

/// `GET /ui/networks`: the site networks VMs join.
pub async fn networks(State(st): S, Extension(u): Extension<WebUser>) -> Response {
    let (nads, nodes, vms) = match tokio::try_join!(
        all::<NetworkAttachmentDefinition>(&st),
        all::<Node>(&st),
        all::<VirtualMachine>(&st)
    ) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let networks = nads
        .iter()
        .map(|n| {
            let mut row = NetworkRow {
                namespace: n.namespace().to_string(),
                name: n.name().to_string(),
                bridge: String::new(),
                vlan: "none".into(),
                problem: String::new(),
                nodes: vec![],
                missing: vec![],
                vms: vms
                    .iter()
                    .filter(|vm| {
                        let nets = &vm.spec.template.spec.networks;
                        crate::rules::network::uses(vm.namespace(), nets, n.namespace(), n.name())
                    })
                    .map(|vm| (vm.namespace().to_string(), vm.name().to_string()))
                    .collect(),
            };
            match parse_config(&n.spec.config) {
                Ok(b) => {
                    for node in &nodes {
                        match crate::rules::network::node_carries(&b, node) {
                            Ok(()) => row.nodes.push(node.name().to_string()),
                            Err(why) => row.missing.push(format!("{}: {why}", node.name())),
                        }
                    }
                    row.bridge = b.bridge;
                    if let Some(v) = b.vlan {
                        row.vlan = v.to_string();
                    }
                }
                Err(e) => row.problem = e,
            }
            row
        })
        .collect();
    render(&NetworksTpl {
        c: Chrome::new(&u, "Networks"),
        networks,
    })
}
