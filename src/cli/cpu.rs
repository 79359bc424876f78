//! `edgevirt cpu`: the nodes' CPU facts (`show`), the model every node can run
//! (`baseline`), and whether a node can run a VM's CPU (`check`). Reads Node and VM objects
//! through the API; `baseline --libvirt-uri` also asks a local libvirt for its baseline of the
//! nodes' host-model CPUs.

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::ClientOpts;
use super::output::{Format, decode, items, print_value, table};
use crate::cpu::compat::{baseline_model, guest_cpu_xml};
use crate::cpu::policy::{self, GuestCpu};
use crate::types::Meta;
use crate::types::edgevirt::{CpuFacts, Node};
use crate::types::kubevirt::VirtualMachine;

#[derive(Args, Debug)]
pub struct CpuArgs {
    #[command(subcommand)]
    cmd: CpuCmd,
    #[command(flatten)]
    client: ClientOpts,
}

#[derive(Subcommand, Debug)]
enum CpuCmd {
    /// The CPU of every node, or of one: vendor, family/model/stepping, libvirt's host-model
    /// and the named models it can run.
    Show {
        node: Option<String>,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    /// The most capable named CPU model every node can run (the `migratable` default).
    Baseline {
        /// Also ask this libvirt for its baseline of the nodes' host-model CPUs.
        #[arg(long)]
        libvirt_uri: Option<String>,
    },
    /// Whether NODE can run the CPU of VM (in NAMESPACE), and the CPU it would get there.
    Check {
        vm: String,
        node: String,
        #[arg(short, long, default_value = "default")]
        namespace: String,
    },
}

async fn nodes(c: &crate::client::Client) -> anyhow::Result<Vec<Node>> {
    items(&c.get("/apis/edgevirt.io/v1/nodes").await?)
}

fn name(n: &Node) -> String {
    n.name().to_string()
}

fn describe(node: &str, f: &CpuFacts) -> String {
    let hm = f
        .host_model
        .as_ref()
        .map(|m| format!("{} ({}), {} features", m.model, m.vendor, m.features.len()))
        .unwrap_or_else(|| "unknown".into());
    format!(
        "Node:             {node}\nVendor:           {}\nModel name:       {}\n\
         Family/model/stepping: {}/{}/{}\nLogical CPUs:     {}\nGuests run under: {}\n\
         host-passthrough: {}\nHost-model:       {hm}\nUsable models:    {}\nFlags:            {}\n",
        f.vendor,
        f.model,
        f.family,
        f.model_number,
        f.stepping,
        f.count,
        f.virt_type,
        if f.host_passthrough {
            "supported"
        } else {
            "not supported"
        },
        f.usable_models.join(" "),
        f.flags.join(" "),
    )
}

/// The guest CPU a VM's instance would get on a node, if the node can run it: its template
/// judged as the scheduler judges an instance ([`policy::place_spec`]).
fn place(vm: &VirtualMachine, node: &Node, default: &str) -> Result<GuestCpu, String> {
    let template = &vm.spec.template;
    let meta = template.metadata.clone().unwrap_or_default();
    policy::place_spec(
        template.spec.domain.cpu.as_ref(),
        &meta.labels,
        &meta.annotations,
        node,
        default,
    )
}

pub async fn run(a: CpuArgs) -> anyhow::Result<()> {
    let c = a.client.client()?;
    match a.cmd {
        CpuCmd::Show { node, output } => {
            let all = nodes(&c).await?;
            let picked: Vec<&Node> = all
                .iter()
                .filter(|n| node.as_deref().is_none_or(|w| name(n) == w))
                .collect();
            if let Some(w) = &node
                && picked.is_empty()
            {
                anyhow::bail!("node {w:?} not found");
            }
            match output {
                Format::Json | Format::Yaml => {
                    let v: Vec<Value> = picked
                        .iter()
                        .map(|n| json!({"node": name(n), "cpu": policy::facts_of(n)}))
                        .collect();
                    print_value(&json!(v), output)?;
                }
                Format::Wide => {
                    for n in picked {
                        print!("{}", describe(&name(n), &policy::facts_of(n)));
                    }
                }
                Format::Table => {
                    let rows: Vec<Vec<String>> = picked
                        .iter()
                        .map(|n| {
                            let f = policy::facts_of(n);
                            vec![
                                name(n),
                                f.vendor.clone(),
                                format!("{}/{}/{}", f.family, f.model_number, f.stepping),
                                f.host_model.map(|m| m.model).unwrap_or_default(),
                                f.virt_type.clone(),
                                f.usable_models.len().to_string(),
                                f.model.clone(),
                            ]
                        })
                        .collect();
                    print!(
                        "{}",
                        table(
                            &[
                                "NODE",
                                "VENDOR",
                                "FAM/MOD/STEP",
                                "HOST-MODEL",
                                "VIRT",
                                "USABLE",
                                "MODEL NAME"
                            ],
                            &rows
                        )
                    );
                }
            }
        }
        CpuCmd::Baseline { libvirt_uri } => {
            let all = nodes(&c).await?;
            if all.is_empty() {
                anyhow::bail!("no node has registered");
            }
            let facts: Vec<CpuFacts> = all.iter().map(policy::facts_of).collect();
            let refs: Vec<&CpuFacts> = facts.iter().collect();
            match baseline_model(&refs) {
                Some(m) => println!("{m}"),
                None => anyhow::bail!(
                    "the nodes share no named CPU model ({} nodes); VMs can only use host-model",
                    all.len()
                ),
            }
            if let Some(uri) = libvirt_uri {
                let virt_type = facts[0].virt_type.clone();
                let host_model = GuestCpu {
                    mode: crate::cpu::Mode::HostModel,
                    model: None,
                    fallback: None,
                    vendor_id: None,
                    check: None,
                    features: vec![],
                    hyperv: false,
                    virt_type: virt_type.clone(),
                    reason: String::new(),
                };
                let xmls: Vec<String> = facts
                    .iter()
                    .filter_map(|f| guest_cpu_xml(&host_model, f))
                    .collect();
                let out = tokio::task::spawn_blocking(move || -> anyhow::Result<String> {
                    use crate::hypervisor::Hypervisor;
                    let hv = crate::virt::libvirt::Libvirt::open(&uri)?;
                    Ok(hv.baseline_cpu(&virt_type, &xmls)?)
                })
                .await??;
                print!("libvirt baseline of the nodes' host-model CPUs:\n{out}");
            }
        }
        CpuCmd::Check {
            vm,
            node,
            namespace,
        } => {
            let v: VirtualMachine = decode(
                c.get(&format!(
                    "/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{vm}"
                ))
                .await?,
            )?;
            let n: Node = decode(c.get(&format!("/apis/edgevirt.io/v1/nodes/{node}")).await?)?;
            let all = nodes(&c).await?;
            let info = c.get("/apis/edgevirt.io/v1/info").await?;
            let facts: Vec<CpuFacts> = all.iter().map(policy::facts_of).collect();
            let refs: Vec<&CpuFacts> = facts.iter().collect();
            let default = policy::effective_default(
                info["cpuModel"]
                    .as_str()
                    .unwrap_or(policy::DEFAULT_CPU_MODEL),
                &refs,
            );
            match place(&v, &n, &default) {
                Ok(g) => println!(
                    "{node} can run {vm}: mode {}{}{}\n{}",
                    g.mode.as_str(),
                    g.model.map(|m| format!(", model {m}")).unwrap_or_default(),
                    g.vendor_id
                        .map(|v| format!(", vendor_id {v}"))
                        .unwrap_or_default(),
                    g.reason
                ),
                Err(e) => anyhow::bail!("{node} cannot run {vm}: {e}"),
            }
        }
    }
    Ok(())
}
