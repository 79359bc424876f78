//! `edgevirt snapshot ...` and `edgevirt restore ...`: KubeVirt's `VirtualMachineSnapshot`
//! and `VirtualMachineRestore` from the command line, waiting with a spinner that shows
//! what the server says it is doing.

use std::time::Duration;

use anyhow::bail;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::ClientOpts;
use super::output::{Format, created_age, items, print_value, table};
use crate::types::Meta;
use crate::types::snapshot::{GROUP, VirtualMachineSnapshot};

#[derive(Args, Debug)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    cmd: SnapshotCmd,
    #[command(flatten)]
    client: ClientOpts,
    /// Namespace.
    #[arg(short, long, global = true, default_value = "default")]
    namespace: String,
}

#[derive(Subcommand, Debug)]
enum SnapshotCmd {
    /// Snapshot a VM: its spec and every persistent disk, while it runs (its filesystems
    /// frozen through the guest agent for the few milliseconds the copy takes to start).
    /// Waits until the snapshot is ready unless --no-wait.
    Create {
        /// The VM.
        vm: String,
        /// The snapshot's name [default: VM-snapshot-TIMESTAMP].
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        no_wait: bool,
    },
    /// List the namespace's snapshots.
    List {
        /// Only this VM's.
        #[arg(long)]
        vm: Option<String>,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    /// Delete a snapshot and its copies (the VM and its disks are not touched).
    Delete { name: String },
}

/// `edgevirt restore SNAPSHOT`: put a VM back to a snapshot.
#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The snapshot.
    snapshot: String,
    /// Stop the VM if it runs (else the restore waits up to 5 minutes for it to be stopped).
    #[arg(long)]
    stop: bool,
    #[arg(long)]
    no_wait: bool,
    #[command(flatten)]
    client: ClientOpts,
    /// Namespace.
    #[arg(short, long, default_value = "default")]
    namespace: String,
}

fn path(ns: &str, plural: &str) -> String {
    format!("/apis/{GROUP}/v1beta1/namespaces/{ns}/{plural}")
}

/// Poll `url` until `done` says it finished (`Ok`) or failed (`Err`), showing the Ready
/// condition's message (or the phase) on a spinner.
pub(super) async fn wait(
    c: &crate::client::Client,
    url: &str,
    done: impl Fn(&Value) -> Option<Result<String, String>>,
) -> anyhow::Result<String> {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(120));
    loop {
        let o = c.get(url).await?;
        if let Some(r) = done(&o) {
            bar.finish_and_clear();
            return r.map_err(anyhow::Error::msg);
        }
        let said = o["status"]["conditions"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["type"] == "Progressing"))
            .and_then(|c| c["message"].as_str().or(c["reason"].as_str()))
            .or(o["status"]["phase"].as_str())
            .unwrap_or("waiting")
            .to_string();
        bar.set_message(said);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn run(a: SnapshotArgs) -> anyhow::Result<()> {
    let c = a.client.client()?;
    let ns = a.namespace.as_str();
    match a.cmd {
        SnapshotCmd::Create { vm, name, no_wait } => {
            let name = name.unwrap_or_else(|| {
                format!(
                    "{vm}-snapshot-{}",
                    chrono::Utc::now().format("%Y%m%d%H%M%S")
                )
            });
            let body = json!({
                "apiVersion": format!("{GROUP}/v1beta1"), "kind": "VirtualMachineSnapshot",
                "metadata": {"name": name},
                "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": vm}},
            });
            c.post(&path(ns, "virtualmachinesnapshots"), &body).await?;
            if no_wait {
                println!("virtualmachinesnapshot {name} created");
                return Ok(());
            }
            let url = format!("{}/{name}", path(ns, "virtualmachinesnapshots"));
            let said = wait(&c, &url, |o| {
                let st = &o["status"];
                match st["phase"].as_str() {
                    Some("Succeeded") => Some(Ok(st["indications"]
                        .as_array()
                        .map(|l| {
                            l.iter()
                                .filter_map(Value::as_str)
                                .collect::<Vec<_>>()
                                .join(", ")
                        })
                        .unwrap_or_default())),
                    Some("Failed") => Some(Err(st["error"]["message"]
                        .as_str()
                        .unwrap_or("failed")
                        .to_string())),
                    _ => None,
                }
            })
            .await?;
            let shown = if said.is_empty() {
                "offline".into()
            } else {
                said
            };
            println!("virtualmachinesnapshot {name} ready ({shown})");
        }
        SnapshotCmd::List { vm, output } => {
            let list = c.get(&path(ns, "virtualmachinesnapshots")).await?;
            if matches!(output, Format::Json | Format::Yaml) {
                return print_value(&list, output);
            }
            let snaps: Vec<VirtualMachineSnapshot> = items(&list)?;
            let rows: Vec<Vec<String>> = snaps
                .iter()
                .filter(|s| vm.as_ref().is_none_or(|v| *v == s.spec.source.name))
                .map(|s| {
                    let st = s.status.clone().unwrap_or_default();
                    vec![
                        s.name().to_string(),
                        s.spec.source.name.clone(),
                        st.phase.unwrap_or_default(),
                        st.ready_to_use.unwrap_or(false).to_string(),
                        st.indications.join(","),
                        created_age(s),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &["NAME", "VM", "PHASE", "READY", "INDICATIONS", "AGE"],
                    &rows
                )
            );
        }
        SnapshotCmd::Delete { name } => {
            c.delete(&format!("{}/{name}", path(ns, "virtualmachinesnapshots")))
                .await?;
            println!("virtualmachinesnapshot {name} deleted");
        }
    }
    Ok(())
}

pub async fn restore(a: RestoreArgs) -> anyhow::Result<()> {
    let c = a.client.client()?;
    let ns = a.namespace.as_str();
    let snap = c
        .get(&format!(
            "{}/{}",
            path(ns, "virtualmachinesnapshots"),
            a.snapshot
        ))
        .await?;
    let Some(vm) = snap["spec"]["source"]["name"].as_str() else {
        bail!("snapshot {} names no VM", a.snapshot);
    };
    let name = format!(
        "{}-restore-{}",
        a.snapshot,
        chrono::Utc::now().format("%Y%m%d%H%M%S")
    );
    let mut body = json!({
        "apiVersion": format!("{GROUP}/v1beta1"), "kind": "VirtualMachineRestore",
        "metadata": {"name": name},
        "spec": {"target": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": vm},
                 "virtualMachineSnapshotName": a.snapshot},
    });
    if a.stop {
        body["spec"]["targetReadinessPolicy"] = json!("StopTarget");
    }
    c.post(&path(ns, "virtualmachinerestores"), &body).await?;
    if a.no_wait {
        println!("virtualmachinerestore {name} created");
        return Ok(());
    }
    let url = format!("{}/{name}", path(ns, "virtualmachinerestores"));
    let said = wait(&c, &url, |o| {
        let st = &o["status"];
        let ready = st["conditions"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["type"] == "Ready"))?;
        if st["complete"] == true {
            return Some(Ok(ready["message"]
                .as_str()
                .unwrap_or_default()
                .to_string()));
        }
        // Not progressing and not complete: stuck for a reason it says.
        let progressing = st["conditions"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["type"] == "Progressing"))?;
        (progressing["status"] == "False")
            .then(|| Err(ready["message"].as_str().unwrap_or("failed").to_string()))
    })
    .await?;
    println!("virtualmachinerestore {name} complete: {said}");
    Ok(())
}
