//! `edgevirt vm|vmi|image ...`: client commands over the API.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::ClientOpts;
use super::output::{Format, created_age, decode, items, print_value, table};
use crate::client::is_status;
use crate::types::Meta;
use crate::types::edgevirt::Image;
use crate::types::kubevirt::{
    ConditionType, MigrationPhase, VirtualMachine, VirtualMachineInstance,
    VirtualMachineInstanceMigration, condition,
};

#[derive(Args, Debug)]
pub struct VmArgs {
    #[command(subcommand)]
    cmd: VmCmd,
    #[command(flatten)]
    client: ClientOpts,
    /// Namespace.
    #[arg(short, long, global = true, default_value = "default")]
    namespace: String,
}

#[derive(Subcommand, Debug)]
enum VmCmd {
    /// List VMs.
    List {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
        /// Label selector, e.g. app=web.
        #[arg(short = 'l', long)]
        selector: Option<String>,
    },
    /// Show one VM.
    Get {
        name: String,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    /// Create or update VMs from a KubeVirt YAML (or JSON) file, and the
    /// NetworkAttachmentDefinitions in it (`edgevirt export` output applies); `-` reads stdin.
    Apply {
        #[arg(short, long)]
        file: PathBuf,
    },
    Start {
        name: String,
    },
    Stop {
        name: String,
    },
    Restart {
        name: String,
    },
    /// Live-migrate the VM's instance to another node (a VirtualMachineInstanceMigration).
    Migrate {
        name: String,
        /// Wait until it succeeds or fails, showing its phases.
        #[arg(long)]
        wait: bool,
        /// Copy the VM's local disks to the target while it runs (block migration), for
        /// VMs whose disks are not on shared storage.
        #[arg(long)]
        block: bool,
    },
    Pause {
        name: String,
    },
    Unpause {
        name: String,
    },
    /// Reboot the guest (through its guest agent, else ACPI).
    Softreboot {
        name: String,
    },
    /// Rename a stopped VM; its disks stay.
    Rename {
        name: String,
        new_name: String,
    },
    /// Delete a VM, its instance, and its volumes.
    Delete {
        name: String,
    },
    /// Attach this terminal to the VM's serial console (Ctrl-] leaves).
    Console {
        name: String,
    },
    /// Serve the VM's screen on a local port for a desktop VNC viewer (Ctrl-C stops).
    Vnc {
        name: String,
        /// Local address to listen on.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
    },
}

#[derive(Args, Debug)]
pub struct VmiArgs {
    #[command(subcommand)]
    cmd: VmiCmd,
    #[command(flatten)]
    client: ClientOpts,
    #[arg(short, long, global = true, default_value = "default")]
    namespace: String,
}

#[derive(Subcommand, Debug)]
enum VmiCmd {
    List {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    Get {
        name: String,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    /// What the guest agent reports (OS, hostname, timezone).
    Guestosinfo { name: String },
}

#[derive(Args, Debug)]
pub struct ImageArgs {
    #[command(subcommand)]
    cmd: ImageCmd,
    #[command(flatten)]
    client: ClientOpts,
}

#[derive(Subcommand, Debug)]
enum ImageCmd {
    /// Upload an image file under NAME: a disk (qcow2 or raw), a kernel, an initrd, or a CD
    /// or DVD image (an OS installer or a driver ISO) for a VM's `cdrom` disks.
    Import {
        name: String,
        file: PathBuf,
        /// The file is an ISO image: the server refuses it if it is not one (ISO 9660 or
        /// UDF), instead of taking it as a raw disk.
        #[arg(long)]
        iso: bool,
    },
    /// Send a disk image (qcow2 or raw) to the DataVolume NAME, whose source is `upload: {}`
    /// (as `virtctl image-upload dv NAME`). The node that first runs a VM using the
    /// DataVolume fills its disk from it.
    Upload {
        /// The DataVolume.
        name: String,
        file: PathBuf,
        #[arg(short, long, default_value = "default")]
        namespace: String,
    },
    List {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    Delete {
        name: String,
    },
}

impl ImageArgs {
    /// Whether the command streams a file to the server.
    pub fn uploads(&self) -> bool {
        matches!(self.cmd, ImageCmd::Import { .. } | ImageCmd::Upload { .. })
    }
}

fn vm_path(ns: &str) -> String {
    format!("/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines")
}
fn vmi_path(ns: &str) -> String {
    format!("/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances")
}

/// The first address of an instance, as KubeVirt's IP column.
fn first_ip(v: &VirtualMachineInstance) -> String {
    v.status
        .as_ref()
        .and_then(|s| s.interfaces.first())
        .and_then(|i| i.ip_address.clone())
        .unwrap_or_default()
}

fn vm_rows(
    vms: &[VirtualMachine],
    vmis: &[VirtualMachineInstance],
    wide: bool,
) -> Vec<Vec<String>> {
    vms.iter()
        .map(|vm| {
            let name = vm.name();
            let status = vm.status.clone().unwrap_or_default();
            let mut row = vec![
                name.to_string(),
                created_age(vm),
                status.printable_status.unwrap_or_default(),
                if status.ready { "True" } else { "False" }.to_string(),
            ];
            if wide {
                let vmi = vmis.iter().find(|v| v.name() == name);
                row.push(
                    vmi.and_then(|v| v.status.as_ref()?.node_name.clone())
                        .unwrap_or_default(),
                );
                row.push(vmi.map(first_ip).unwrap_or_default());
            }
            row
        })
        .collect()
}

fn vmi_rows(vmis: &[VirtualMachineInstance]) -> Vec<Vec<String>> {
    vmis.iter()
        .map(|v| {
            let status = v.status.clone().unwrap_or_default();
            let ready = condition(&status.conditions, &ConditionType::Ready)
                .map_or("False".to_string(), |c| c.status.to_string());
            vec![
                v.name().to_string(),
                created_age(v),
                status.phase.map(|p| p.to_string()).unwrap_or_default(),
                first_ip(v),
                status.node_name.unwrap_or_default(),
                ready,
            ]
        })
        .collect()
}

/// The metadata of a document or of an object the API answered with.
fn meta_of(v: &Value) -> anyhow::Result<ObjectMeta> {
    match v.get("metadata") {
        None | Some(Value::Null) => Ok(ObjectMeta::default()),
        Some(m) => serde_json::from_value(m.clone()).context("metadata"),
    }
}

/// The spec of a document or of an object as written: what `apply` compares, so that a
/// field the server would refuse is sent to it, not judged here.
fn spec_of(v: &Value) -> &Value {
    v.get("spec").unwrap_or(&Value::Null)
}

/// Parse a file of one or more YAML (or JSON) documents.
fn read_docs(file: &PathBuf) -> anyhow::Result<Vec<Value>> {
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = serde_json::to_value(
            <serde_yaml_ng::Value as serde::Deserialize>::deserialize(doc)
                .with_context(|| format!("{} is not valid YAML", file.display()))?,
        )?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

pub async fn run_vm(a: VmArgs) -> anyhow::Result<()> {
    let c = a.client.client()?;
    let ns = &a.namespace;
    let sub = |name: &str, action: &str| {
        format!("/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}/{action}")
    };
    match a.cmd {
        VmCmd::List { output, selector } => {
            let mut path = vm_path(ns);
            if let Some(sel) = selector {
                path = format!("{path}?labelSelector={}", urlencode(&sel));
            }
            let list = c.get(&path).await?;
            match output {
                Format::Json | Format::Yaml => print_value(&list, output)?,
                f => {
                    let vmis = c.get(&vmi_path(ns)).await?;
                    let vms: Vec<VirtualMachine> = items(&list)?;
                    let vmis: Vec<VirtualMachineInstance> = items(&vmis)?;
                    let wide = f == Format::Wide;
                    let mut h = vec!["NAME", "AGE", "STATUS", "READY"];
                    if wide {
                        h.extend(["NODE", "IP"]);
                    }
                    print!("{}", table(&h, &vm_rows(&vms, &vmis, wide)));
                }
            }
        }
        VmCmd::Get { name, output } => {
            let vm = c.get(&format!("{}/{name}", vm_path(ns))).await?;
            match output {
                Format::Json | Format::Yaml => print_value(&vm, output)?,
                f => {
                    let vmi = c.get_opt(&format!("{}/{name}", vmi_path(ns))).await?;
                    let vmis = vmi
                        .map(decode)
                        .into_iter()
                        .collect::<anyhow::Result<Vec<_>>>()?;
                    let wide = f == Format::Wide;
                    let mut h = vec!["NAME", "AGE", "STATUS", "READY"];
                    if wide {
                        h.extend(["NODE", "IP"]);
                    }
                    print!("{}", table(&h, &vm_rows(&[decode(vm)?], &vmis, wide)));
                }
            }
        }
        VmCmd::Apply { file } => apply(&c, ns, &file).await?,
        VmCmd::Start { name } => act(&c, &sub(&name, "start"), &name, "start").await?,
        VmCmd::Stop { name } => act(&c, &sub(&name, "stop"), &name, "stop").await?,
        VmCmd::Restart { name } => act(&c, &sub(&name, "restart"), &name, "restart").await?,
        VmCmd::Migrate { name, wait, block } => {
            let opts = if block {
                json!({"blockMigration": true})
            } else {
                json!({})
            };
            let m: VirtualMachineInstanceMigration =
                decode(c.put(&sub(&name, "migrate"), &opts).await?)?;
            let mname = m.name().to_string();
            println!("virtualmachineinstancemigration/{mname} created");
            if wait {
                let done = super::node::wait_migration(&c, ns, &mname, true).await?;
                let status = done.status.unwrap_or_default();
                if status.phase != Some(MigrationPhase::Succeeded) {
                    bail!(
                        "migration {mname} failed: {}",
                        status
                            .migration_state
                            .and_then(|s| s.failure_reason)
                            .as_deref()
                            .unwrap_or("no reason given")
                    );
                }
            }
        }
        VmCmd::Pause { name } => act(&c, &sub(&name, "pause"), &name, "pause").await?,
        VmCmd::Unpause { name } => act(&c, &sub(&name, "unpause"), &name, "unpause").await?,
        VmCmd::Softreboot { name } => {
            act(&c, &sub(&name, "softreboot"), &name, "soft reboot").await?
        }
        VmCmd::Rename { name, new_name } => {
            c.put(&sub(&name, "rename"), &json!({"newName": new_name}))
                .await?;
            println!("VM {name} was renamed to {new_name}");
        }
        VmCmd::Delete { name } => {
            c.delete(&format!("{}/{name}", vm_path(ns))).await?;
            println!("virtualmachine/{name} deleted");
        }
        VmCmd::Console { name } => super::console::serial(&c, ns, &name).await?,
        VmCmd::Vnc { name, listen } => super::console::vnc(&c, ns, &name, listen).await?,
    }
    Ok(())
}

/// Create or update each document of `file` (`-`: stdin): VMs, VMIs and the
/// NetworkAttachmentDefinitions they name, as `edgevirt export` prints them. A document goes
/// to the server as written (the server checks it, and a spec is compared as written); its
/// metadata is read typed.
pub async fn apply(c: &crate::client::Client, ns: &str, file: &PathBuf) -> anyhow::Result<()> {
    use crate::types::Kind;
    const KINDS: [Kind; 3] = [
        Kind::NetworkAttachmentDefinition,
        Kind::VirtualMachine,
        Kind::VirtualMachineInstance,
    ];
    for mut doc in read_docs(file)? {
        let kind_name = doc["kind"].as_str().unwrap_or("").to_string();
        let Some(kind) = KINDS.into_iter().find(|k| k.name() == kind_name) else {
            bail!(
                "{}: kind {kind_name:?} cannot be applied here ({})",
                file.display(),
                KINDS.map(Kind::name).join(", ")
            );
        };
        let what = kind.name().to_ascii_lowercase();
        let meta = meta_of(&doc).with_context(|| format!("{}", file.display()))?;
        let name = meta.name.clone().context("metadata.name is missing")?;
        let dns = meta.namespace.clone().unwrap_or(ns.to_string());
        let base = format!("{}/namespaces/{dns}/{}", kind.path_prefix(), kind.plural());
        match c.get_opt(&format!("{base}/{name}")).await? {
            None => {
                c.post(&base, &doc).await?;
                println!("{what}/{name} created");
            }
            Some(cur) => {
                let cur_meta = meta_of(&cur)?;
                if spec_of(&cur) == spec_of(&doc) && cur_meta.labels == meta.labels {
                    println!("{what}/{name} unchanged");
                    continue;
                }
                let rv = cur_meta.resource_version.clone();
                if let Some(m) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.insert("resourceVersion".into(), json!(rv));
                }
                let after = meta_of(&c.put(&format!("{base}/{name}"), &doc).await?)?;
                let changed = after.resource_version != rv;
                println!(
                    "{what}/{name} {}",
                    if changed { "configured" } else { "unchanged" }
                );
            }
        }
    }
    Ok(())
}

async fn act(c: &crate::client::Client, path: &str, name: &str, what: &str) -> anyhow::Result<()> {
    c.put(path, &json!({})).await?;
    println!("VM {name} was scheduled to {what}");
    Ok(())
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub async fn run_vmi(a: VmiArgs) -> anyhow::Result<()> {
    let c = a.client.client()?;
    let ns = &a.namespace;
    let h = ["NAME", "AGE", "PHASE", "IP", "NODENAME", "READY"];
    match a.cmd {
        VmiCmd::List { output } => {
            let list = c.get(&vmi_path(ns)).await?;
            match output {
                Format::Json | Format::Yaml => print_value(&list, output)?,
                _ => print!("{}", table(&h, &vmi_rows(&items(&list)?))),
            }
        }
        VmiCmd::Get { name, output } => {
            let v = c.get(&format!("{}/{name}", vmi_path(ns))).await?;
            match output {
                Format::Json | Format::Yaml => print_value(&v, output)?,
                _ => print!("{}", table(&h, &vmi_rows(&[decode(v)?]))),
            }
        }
        VmiCmd::Guestosinfo { name } => {
            let v = c
                .get(&format!("/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}/guestosinfo"))
                .await?;
            print_value(&v, Format::Json)?;
        }
    }
    Ok(())
}

/// PUT a file as a streamed body, with a progress bar labelled `what`.
pub(super) async fn put_file(
    c: &crate::client::Client,
    path: &str,
    file: &std::path::Path,
    what: &str,
) -> anyhow::Result<serde_json::Value> {
    let f = tokio::fs::File::open(file)
        .await
        .with_context(|| format!("opening {}", file.display()))?;
    let len = f.metadata().await?.len();
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_message(format!("uploading {what}"));
    let b2 = bar.clone();
    // Read a MiB at a time (the default of 4 KiB makes as many HTTP chunks).
    let stream = tokio_util::io::ReaderStream::with_capacity(f, 1 << 20).inspect(move |chunk| {
        if let Ok(c) = chunk {
            b2.inc(c.len() as u64);
        }
    });
    let req = c
        .request(reqwest::Method::PUT, path)
        .header("content-type", "application/octet-stream")
        .header("content-length", len)
        .body(reqwest::Body::wrap_stream(stream));
    let r = c.send(req).await;
    bar.finish_and_clear();
    r
}

pub async fn run_image(a: ImageArgs) -> anyhow::Result<()> {
    let c = a.client.client()?;
    match a.cmd {
        ImageCmd::Import { name, file, iso } => {
            let query = if iso { "?type=iso" } else { "" };
            let path = format!("/apis/edgevirt.io/v1/images/{name}/upload{query}");
            let img: Image = decode(put_file(&c, &path, &file, &name).await?)?;
            let status = img.status.unwrap_or_default();
            println!(
                "image/{name} imported: {}{} format, {} bytes, sha256 {}",
                if status.iso { "ISO, " } else { "" },
                status.format,
                status.size_bytes,
                status.sha256.unwrap_or_default()
            );
        }
        ImageCmd::Upload {
            name,
            file,
            namespace,
        } => {
            // Refusals that do not need the data come first, before any byte is sent.
            let dv = c
                .get(&format!(
                    "/apis/cdi.kubevirt.io/v1beta1/namespaces/{namespace}/datavolumes/{name}"
                ))
                .await?;
            if dv["spec"]["source"].get("upload").is_none() {
                anyhow::bail!(
                    "DataVolume {namespace}/{name} does not take an upload: its source is not \
                     `upload`"
                );
            }
            if dv["metadata"]["annotations"]
                .get(crate::types::cdi::UPLOAD_IMAGE_ANNOTATION)
                .is_some()
            {
                anyhow::bail!(
                    "DataVolume {namespace}/{name} already has its data; create another \
                     DataVolume to upload another image"
                );
            }
            let path = format!(
                "/apis/cdi.kubevirt.io/v1beta1/namespaces/{namespace}/datavolumes/{name}/upload"
            );
            let img: Image = decode(put_file(&c, &path, &file, &name).await?)?;
            let status = img.status.unwrap_or_default();
            println!(
                "datavolume/{name} uploaded: {} format, {} bytes, sha256 {}; filled on the node \
                 of the first VM that uses it",
                status.format,
                status.size_bytes,
                status.sha256.unwrap_or_default()
            );
        }
        ImageCmd::List { output } => {
            let list = c.get("/apis/edgevirt.io/v1/images").await?;
            match output {
                Format::Json | Format::Yaml => print_value(&list, output)?,
                _ => {
                    let rows: Vec<Vec<String>> = items::<Image>(&list)?
                        .iter()
                        .map(|i| {
                            let status = i.status.clone().unwrap_or_default();
                            vec![
                                i.name().to_string(),
                                if status.iso { "iso" } else { "disk" }.to_string(),
                                status.format,
                                status.size_bytes.to_string(),
                                created_age(i),
                            ]
                        })
                        .collect();
                    print!(
                        "{}",
                        table(&["NAME", "TYPE", "FORMAT", "SIZE", "AGE"], &rows)
                    );
                }
            }
        }
        ImageCmd::Delete { name } => {
            match c
                .delete(&format!("/apis/edgevirt.io/v1/images/{name}"))
                .await
            {
                Err(e) if is_status(&e, reqwest::StatusCode::NOT_FOUND) => {
                    bail!("image {name:?} does not exist")
                }
                r => {
                    r?;
                }
            }
            println!("image/{name} deleted");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn vm_and_vmi_rows_read_typed_objects() {
        let vms: Vec<VirtualMachine> = items(&json!({"items": [
            {"metadata": {"name": "a"}, "spec": {"template": {"spec": {"domain": {}}}},
             "status": {"printableStatus": "Running", "ready": true}},
            {"metadata": {"name": "b"}, "spec": {"template": {"spec": {"domain": {}}}}},
        ]}))
        .unwrap();
        let vmis: Vec<VirtualMachineInstance> = items(&json!({"items": [
            {"metadata": {"name": "a"}, "spec": {"domain": {}},
             "status": {"phase": "Running", "nodeName": "n1",
                        "interfaces": [{"ipAddress": "10.0.0.5"}, {"ipAddress": "10.0.0.6"}],
                        "conditions": [{"type": "Ready", "status": "True"}]}},
            {"metadata": {"name": "c"}, "spec": {"domain": {}}, "status": {"phase": "Pending"}},
        ]}))
        .unwrap();
        let r = vm_rows(&vms, &vmis, true);
        assert_eq!(
            r[0],
            ["a", "<unknown>", "Running", "True", "n1", "10.0.0.5"]
        );
        assert_eq!(r[1], ["b", "<unknown>", "", "False", "", ""]);
        let r = vmi_rows(&vmis);
        assert_eq!(
            r[0],
            ["a", "<unknown>", "Running", "10.0.0.5", "n1", "True"]
        );
        assert_eq!(r[1], ["c", "<unknown>", "Pending", "", "", "False"]);
    }

    #[test]
    fn apply_reads_metadata_typed_and_keeps_the_spec_as_written() {
        let doc = json!({"metadata": {"name": "a", "labels": {"x": "1"}},
                         "spec": {"running": true, "unknownToThisRelease": 1}});
        let m = meta_of(&doc).unwrap();
        assert_eq!(m.name.as_deref(), Some("a"));
        assert_eq!(m.namespace, None);
        assert_eq!(
            spec_of(&doc),
            &json!({"running": true, "unknownToThisRelease": 1})
        );
        assert!(meta_of(&json!({"metadata": {"labels": {"x": 1}}})).is_err());
        assert_eq!(spec_of(&json!({})), &Value::Null);
    }
}
