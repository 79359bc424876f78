//! `edgevirt network ...`: the site networks VMs join (Multus NetworkAttachmentDefinitions:
//! a host bridge, maybe a VLAN), with the nodes that have the bridge and the VMs on each.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::ClientOpts;
use super::output::{Format, created_age, decode, items, print_value, table};
use crate::types::Meta;
use crate::types::cni::{GROUP, NetworkAttachmentDefinition, parse_config};
use crate::types::edgevirt::Node;
use crate::types::kubevirt::VirtualMachine;

#[derive(Args, Debug)]
pub struct NetworkArgs {
    #[command(subcommand)]
    cmd: NetworkCmd,
    #[command(flatten)]
    client: ClientOpts,
    /// Namespace.
    #[arg(short, long, global = true, default_value = "default")]
    namespace: String,
}

#[derive(Subcommand, Debug)]
enum NetworkCmd {
    /// List the namespace's networks: bridge, VLAN, the nodes that have the bridge (VLAN
    /// filtering on, for a VLAN) and the VMs on each.
    List {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    /// Show one network.
    Get {
        name: String,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    /// Create or update networks from a YAML file of NetworkAttachmentDefinitions (as for
    /// Multus: `spec.config` is a `bridge` plugin's CNI JSON); `-` reads stdin.
    Apply {
        #[arg(short, long)]
        file: PathBuf,
    },
    /// Delete a network; refused while running VMs use it.
    Delete { name: String },
}

fn path(ns: &str) -> String {
    format!("/apis/{GROUP}/v1/namespaces/{ns}/network-attachment-definitions")
}

fn rows(
    nets: &[NetworkAttachmentDefinition],
    nodes: &[Node],
    vms: &[VirtualMachine],
) -> Vec<Vec<String>> {
    nets.iter()
        .map(|n| {
            let (bridge, vlan, hosts) = match parse_config(&n.spec.config) {
                Ok(b) => {
                    let hosts: Vec<&str> = nodes
                        .iter()
                        .filter(|node| crate::rules::network::node_carries(&b, node).is_ok())
                        .map(|node| node.name())
                        .collect();
                    let vlan = b.vlan.map_or("-".to_string(), |v| v.to_string());
                    (b.bridge, vlan, hosts.join(","))
                }
                Err(e) => (format!("(invalid: {e})"), "-".into(), String::new()),
            };
            let users: Vec<&str> = vms
                .iter()
                .filter(|vm| {
                    let nets = &vm.spec.template.spec.networks;
                    crate::rules::network::uses(vm.namespace(), nets, n.namespace(), n.name())
                })
                .map(|vm| vm.name())
                .collect();
            vec![
                n.name().to_string(),
                bridge,
                vlan,
                if hosts.is_empty() {
                    "<none>".into()
                } else {
                    hosts
                },
                if users.is_empty() {
                    "<none>".into()
                } else {
                    users.join(",")
                },
                created_age(n),
            ]
        })
        .collect()
}

const HEADERS: [&str; 6] = ["NAME", "BRIDGE", "VLAN", "NODES", "VMS", "AGE"];

pub async fn run(a: NetworkArgs) -> anyhow::Result<()> {
    let c = a.client.client()?;
    let ns = a.namespace.as_str();
    let c = &c;
    let show = |list: Vec<NetworkAttachmentDefinition>| async move {
        let nodes: Vec<Node> = items(&c.get("/apis/edgevirt.io/v1/nodes").await?)?;
        let vms: Vec<VirtualMachine> =
            items(&c.get("/apis/kubevirt.io/v1/virtualmachines").await?)?;
        print!("{}", table(&HEADERS, &rows(&list, &nodes, &vms)));
        anyhow::Ok(())
    };
    match a.cmd {
        NetworkCmd::List { output } => {
            let list = c.get(&path(ns)).await?;
            match output {
                Format::Json | Format::Yaml => print_value(&list, output)?,
                _ => show(items(&list)?).await?,
            }
        }
        NetworkCmd::Get { name, output } => {
            let n: Value = c.get(&format!("{}/{name}", path(ns))).await?;
            match output {
                Format::Json | Format::Yaml => print_value(&n, output)?,
                _ => show(vec![decode(n)?]).await?,
            }
        }
        NetworkCmd::Apply { file } => super::vm::apply(c, ns, &file).await?,
        NetworkCmd::Delete { name } => {
            c.delete(&format!("{}/{name}", path(ns))).await?;
            println!("networkattachmentdefinition/{name} deleted");
        }
    }
    Ok(())
}
