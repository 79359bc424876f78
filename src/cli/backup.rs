//! `edgevirt backup ...`: KubeVirt's `VirtualMachineBackup` from the command line (create,
//! list, delete, with a progress line while the copy runs), and the two commands that need
//! only a backup folder: `verify` re-reads every file of a backup and its parents against
//! their manifests; `restore` brings a VM back from a folder as a new VM, on this appliance
//! or any other (a fresh install included), through the API's DataVolume uploads.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::ClientOpts;
use super::output::{Format, created_age, items, print_value, table};
use crate::types::Meta;
use crate::types::backup::{GROUP, VirtualMachineBackup};

#[derive(Args, Debug)]
pub struct BackupArgs {
    #[command(subcommand)]
    cmd: BackupCmd,
    #[command(flatten)]
    client: ClientOpts,
    /// Namespace.
    #[arg(short, long, global = true, default_value = "default")]
    namespace: String,
}

#[derive(Subcommand, Debug)]
enum BackupCmd {
    /// Back up a VM to a backup target while it runs: full the first time, then only the
    /// blocks changed since its last backup there. Waits, showing the copy's progress,
    /// unless --no-wait.
    Create {
        /// The VM.
        vm: String,
        /// The backup target (a node's `serve --backup-target NAME=PATH`).
        #[arg(long)]
        target: String,
        /// The backup's name [default: VM-backup-TIMESTAMP].
        #[arg(long)]
        name: Option<String>,
        /// Copy every block, even when an incremental backup could be taken.
        #[arg(long)]
        full: bool,
        #[arg(long)]
        no_wait: bool,
    },
    /// List the namespace's backups.
    List {
        /// Only this VM's.
        #[arg(long)]
        vm: Option<String>,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    /// Delete a backup and its folder on the target (the backups built on it take in the
    /// blocks they need from it first).
    Delete { name: String },
    /// Re-read a backup folder (TARGET/NAMESPACE/VM/FOLDER) and every parent it builds on,
    /// and check each file against the checksum in its manifest. Needs only the folder.
    Verify { folder: PathBuf },
    /// Restore a VM from a backup folder as a new VM: its disks (the whole chain read as
    /// one) become DataVolumes NEW-VOLUME uploaded through the API, then the VM is created
    /// under the new name. Needs only the folder and any edgevirt appliance.
    Restore {
        folder: PathBuf,
        /// The new VM's name.
        #[arg(long = "as")]
        new_name: String,
        /// Run it on this node (a nodeSelector on kubernetes.io/hostname).
        #[arg(long)]
        node: Option<String>,
        /// Create it stopped, whatever its run strategy was.
        #[arg(long)]
        stopped: bool,
        /// Where to write the disks read from the chain before they are sent
        /// [default: the system's temporary folder].
        #[arg(long)]
        scratch: Option<PathBuf>,
    },
}

impl BackupArgs {
    /// Whether the command streams a file to the server.
    pub fn uploads(&self) -> bool {
        matches!(self.cmd, BackupCmd::Restore { .. })
    }
}

fn path(ns: &str) -> String {
    format!("/apis/{GROUP}/v1alpha1/namespaces/{ns}/virtualmachinebackups")
}

fn condition<'a>(o: &'a Value, t: &str) -> Option<&'a Value> {
    o["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
}

pub async fn run(a: BackupArgs) -> anyhow::Result<()> {
    let ns = a.namespace.as_str();
    match a.cmd {
        BackupCmd::Create {
            vm,
            target,
            name,
            full,
            no_wait,
        } => {
            let c = a.client.client()?;
            let name = name.unwrap_or_else(|| {
                format!("{vm}-backup-{}", chrono::Utc::now().format("%Y%m%d%H%M%S"))
            });
            let mut body = json!({
                "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "VirtualMachineBackup",
                "metadata": {"name": name},
                "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": vm},
                         "pvcName": target, "mode": "Push"},
            });
            if full {
                body["spec"]["forceFullBackup"] = json!(true);
            }
            c.post(&path(ns), &body).await?;
            if no_wait {
                println!("virtualmachinebackup {name} created");
                return Ok(());
            }
            let url = format!("{}/{name}", path(ns));
            let said = super::snapshot::wait(&c, &url, |o| {
                let done = condition(o, "Done").filter(|c| c["status"] == "True")?;
                let msg = done["message"].as_str().unwrap_or_default().to_string();
                if condition(o, "Failure").is_some_and(|c| c["status"] == "True") {
                    Some(Err(msg))
                } else {
                    Some(Ok(msg))
                }
            })
            .await?;
            println!("virtualmachinebackup {name} done: {said}");
        }
        BackupCmd::List { vm, output } => {
            let c = a.client.client()?;
            let list = c.get(&path(ns)).await?;
            if matches!(output, Format::Json | Format::Yaml) {
                return print_value(&list, output);
            }
            let backups: Vec<VirtualMachineBackup> = items(&list)?;
            let rows: Vec<Vec<String>> = backups
                .iter()
                .filter(|b| vm.as_ref().is_none_or(|v| *v == b.spec.source.name))
                .map(|b| {
                    let st = b.status.clone().unwrap_or_default();
                    let state = if b.succeeded() {
                        "Done"
                    } else if b.finished() {
                        "Failed"
                    } else {
                        "Running"
                    };
                    vec![
                        b.name().to_string(),
                        b.spec.source.name.clone(),
                        b.spec.pvc_name.clone().unwrap_or_default(),
                        st.type_.unwrap_or_default(),
                        state.to_string(),
                        st.size_bytes.map(|s| s.to_string()).unwrap_or_default(),
                        st.path.unwrap_or_default(),
                        created_age(b),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        "NAME", "VM", "TARGET", "TYPE", "STATE", "BYTES", "PATH", "AGE"
                    ],
                    &rows
                )
            );
        }
        BackupCmd::Delete { name } => {
            let c = a.client.client()?;
            c.delete(&format!("{}/{name}", path(ns))).await?;
            println!("virtualmachinebackup {name} deleted");
        }
        BackupCmd::Verify { folder } => {
            let (m, chain, problems) = crate::agent::backup_files::verify(&folder).await?;
            if !problems.is_empty() {
                for p in &problems {
                    eprintln!("{p}");
                }
                bail!(
                    "backup {} does not verify: {} problem(s)",
                    m.name,
                    problems.len()
                );
            }
            println!(
                "backup {} verified: {} disk(s), {} backup(s) in its chain",
                m.name,
                m.disks.len(),
                chain
            );
        }
        BackupCmd::Restore {
            folder,
            new_name,
            node,
            stopped,
            scratch,
        } => {
            let c = a.client.client()?;
            restore(&c, ns, &folder, &new_name, node, stopped, scratch).await?;
        }
    }
    Ok(())
}

async fn restore(
    c: &crate::client::Client,
    ns: &str,
    folder: &Path,
    new_name: &str,
    node: Option<String>,
    stopped: bool,
    scratch: Option<PathBuf>,
) -> anyhow::Result<()> {
    crate::types::check_name("the new VM's name", new_name)?;
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar.set_message(format!("verifying {}", folder.display()));
    let (m, _, problems) = crate::agent::backup_files::verify(folder).await?;
    bar.finish_and_clear();
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("{p}");
        }
        bail!(
            "backup {} does not verify ({} problem(s)): not restoring from it",
            m.name,
            problems.len()
        );
    }
    // The VM must not exist yet: a restore never overwrites.
    let vm_url = format!("/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines/{new_name}");
    if c.get(&vm_url).await.is_ok() {
        bail!("VirtualMachine {ns}/{new_name} exists already: choose another name with --as");
    }
    let scratch = scratch.unwrap_or_else(std::env::temp_dir);
    let mut dvs = vec![];
    for d in &m.disks {
        if !d.file_name_ok() {
            bail!(
                "the manifest names a disk file {:?}, which is not allowed",
                d.file
            );
        }
        let dv_name = format!("{new_name}-{}", d.volume);
        crate::types::check_name("DataVolume name", &dv_name)?;
        // The original DataVolume's size, else the disk's own.
        let size = m
            .data_volumes
            .iter()
            .find(|v| v["metadata"]["name"] == d.claim.as_str())
            .and_then(|v| {
                v["spec"]["storage"]["resources"]["requests"]["storage"]
                    .as_str()
                    .or(v["spec"]["pvc"]["resources"]["requests"]["storage"].as_str())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| d.virtual_size.to_string());
        let flat = scratch.join(format!(".edgevirt-restore-{new_name}-{}.qcow2", d.volume));
        let bar = indicatif::ProgressBar::new_spinner();
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar.set_message(format!("reading volume {} from the backup chain", d.volume));
        let out = tokio::process::Command::new("qemu-img")
            .args(["convert", "-q", "-f", "qcow2", "-O", "qcow2"])
            .arg(folder.join(&d.file))
            .arg(&flat)
            .output()
            .await
            .context("running qemu-img (install qemu-utils)")?;
        bar.finish_and_clear();
        if !out.status.success() {
            let _ = tokio::fs::remove_file(&flat).await;
            bail!(
                "reading volume {} from the backup: {}",
                d.volume,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let dv = json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": dv_name, "namespace": ns},
            "spec": {"source": {"upload": {}},
                     "storage": {"resources": {"requests": {"storage": size}}}},
        });
        let r = async {
            c.post(
                &format!("/apis/cdi.kubevirt.io/v1beta1/namespaces/{ns}/datavolumes"),
                &dv,
            )
            .await?;
            super::vm::put_file(
                c,
                &format!(
                    "/apis/cdi.kubevirt.io/v1beta1/namespaces/{ns}/datavolumes/{dv_name}/upload"
                ),
                &flat,
                &dv_name,
            )
            .await
        }
        .await;
        let _ = tokio::fs::remove_file(&flat).await;
        r?;
        println!("datavolume/{dv_name} uploaded (volume {})", d.volume);
        dvs.push((d.volume.clone(), dv_name));
    }
    let vm = crate::types::backup::restored_vm(
        &m.virtual_machine,
        ns,
        new_name,
        &dvs,
        node.as_deref(),
        stopped,
    );
    c.post(
        &format!("/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines"),
        &vm,
    )
    .await?;
    println!(
        "virtualmachine/{new_name} created from backup {} ({} of {})",
        m.name,
        m.type_,
        m.virtual_machine["metadata"]["name"]
            .as_str()
            .unwrap_or("?")
    );
    Ok(())
}
