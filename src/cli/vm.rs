//! `edgevirt vm|vmi|image ...`: client commands over the API.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use futures::StreamExt;
use serde_json::{Value, json};

use super::ClientOpts;
use super::output::{Format, age, print_value, s, table};
use crate::client::is_status;

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
    /// Create or update VMs from a KubeVirt YAML (or JSON) file; `-` reads stdin.
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
    /// Upload an image file (qcow2 or raw: a disk, a kernel or an initrd) under NAME.
    Import {
        name: String,
        file: PathBuf,
    },
    List {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    Delete {
        name: String,
    },
}

fn vm_path(ns: &str) -> String {
    format!("/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines")
}
fn vmi_path(ns: &str) -> String {
    format!("/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances")
}

fn vm_rows(vms: &[Value], vmis: &[Value], wide: bool) -> Vec<Vec<String>> {
    vms.iter()
        .map(|vm| {
            let name = s(vm, &["metadata", "name"]);
            let mut row = vec![
                name.to_string(),
                age(s(vm, &["metadata", "creationTimestamp"])),
                s(vm, &["status", "printableStatus"]).to_string(),
                if vm["status"]["ready"] == true {
                    "True"
                } else {
                    "False"
                }
                .to_string(),
            ];
            if wide {
                let vmi = vmis.iter().find(|v| s(v, &["metadata", "name"]) == name);
                row.push(
                    vmi.map(|v| s(v, &["status", "nodeName"]).to_string())
                        .unwrap_or_default(),
                );
                row.push(
                    vmi.map(|v| {
                        v["status"]["interfaces"][0]["ipAddress"]
                            .as_str()
                            .unwrap_or("")
                            .to_string()
                    })
                    .unwrap_or_default(),
                );
            }
            row
        })
        .collect()
}

fn vmi_rows(vmis: &[Value]) -> Vec<Vec<String>> {
    vmis.iter()
        .map(|v| {
            let ready = v["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .and_then(|c| c["status"].as_str())
                .unwrap_or("False");
            vec![
                s(v, &["metadata", "name"]).to_string(),
                age(s(v, &["metadata", "creationTimestamp"])),
                s(v, &["status", "phase"]).to_string(),
                v["status"]["interfaces"][0]["ipAddress"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                s(v, &["status", "nodeName"]).to_string(),
                ready.to_string(),
            ]
        })
        .collect()
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
                    let items = list["items"].as_array().cloned().unwrap_or_default();
                    let vmis = vmis["items"].as_array().cloned().unwrap_or_default();
                    let wide = f == Format::Wide;
                    let mut h = vec!["NAME", "AGE", "STATUS", "READY"];
                    if wide {
                        h.extend(["NODE", "IP"]);
                    }
                    print!("{}", table(&h, &vm_rows(&items, &vmis, wide)));
                }
            }
        }
        VmCmd::Get { name, output } => {
            let vm = c.get(&format!("{}/{name}", vm_path(ns))).await?;
            match output {
                Format::Json | Format::Yaml => print_value(&vm, output)?,
                f => {
                    let vmi = c.get_opt(&format!("{}/{name}", vmi_path(ns))).await?;
                    let wide = f == Format::Wide;
                    let mut h = vec!["NAME", "AGE", "STATUS", "READY"];
                    if wide {
                        h.extend(["NODE", "IP"]);
                    }
                    print!(
                        "{}",
                        table(
                            &h,
                            &vm_rows(&[vm], &vmi.into_iter().collect::<Vec<_>>(), wide)
                        )
                    );
                }
            }
        }
        VmCmd::Apply { file } => {
            for mut doc in read_docs(&file)? {
                let kind = doc["kind"].as_str().unwrap_or("").to_string();
                let plural = match kind.as_str() {
                    "VirtualMachine" => "virtualmachines",
                    "VirtualMachineInstance" => "virtualmachineinstances",
                    other => bail!(
                        "{}: kind {other:?} cannot be applied here (VirtualMachine or VirtualMachineInstance)",
                        file.display()
                    ),
                };
                let name = doc["metadata"]["name"]
                    .as_str()
                    .context("metadata.name is missing")?
                    .to_string();
                let dns = doc["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or(ns)
                    .to_string();
                let base = format!("/apis/kubevirt.io/v1/namespaces/{dns}/{plural}");
                match c.get_opt(&format!("{base}/{name}")).await? {
                    None => {
                        c.post(&base, &doc).await?;
                        println!("{}/{name} created", plural.trim_end_matches('s'));
                    }
                    Some(cur) => {
                        if cur["spec"] == serde_json::to_value(&doc["spec"])?
                            && cur["metadata"]["labels"] == doc["metadata"]["labels"]
                        {
                            println!("{}/{name} unchanged", plural.trim_end_matches('s'));
                            continue;
                        }
                        doc["metadata"]["resourceVersion"] =
                            cur["metadata"]["resourceVersion"].clone();
                        let after = c.put(&format!("{base}/{name}"), &doc).await?;
                        let changed = after["metadata"]["resourceVersion"]
                            != cur["metadata"]["resourceVersion"];
                        println!(
                            "{}/{name} {}",
                            plural.trim_end_matches('s'),
                            if changed { "configured" } else { "unchanged" }
                        );
                    }
                }
            }
        }
        VmCmd::Start { name } => act(&c, &sub(&name, "start"), &name, "start").await?,
        VmCmd::Stop { name } => act(&c, &sub(&name, "stop"), &name, "stop").await?,
        VmCmd::Restart { name } => act(&c, &sub(&name, "restart"), &name, "restart").await?,
        VmCmd::Migrate { name, wait, block } => {
            let opts = if block {
                json!({"blockMigration": true})
            } else {
                json!({})
            };
            let m = c.put(&sub(&name, "migrate"), &opts).await?;
            let mname = m["metadata"]["name"].as_str().unwrap_or("").to_string();
            println!("virtualmachineinstancemigration/{mname} created");
            if wait {
                let done = super::node::wait_migration(&c, ns, &mname, true).await?;
                if done["status"]["phase"] != "Succeeded" {
                    bail!(
                        "migration {mname} failed: {}",
                        done["status"]["migrationState"]["failureReason"]
                            .as_str()
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
                _ => print!(
                    "{}",
                    table(
                        &h,
                        &vmi_rows(list["items"].as_array().map(Vec::as_slice).unwrap_or(&[]))
                    )
                ),
            }
        }
        VmiCmd::Get { name, output } => {
            let v = c.get(&format!("{}/{name}", vmi_path(ns))).await?;
            match output {
                Format::Json | Format::Yaml => print_value(&v, output)?,
                _ => print!("{}", table(&h, &vmi_rows(&[v]))),
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

pub async fn run_image(a: ImageArgs) -> anyhow::Result<()> {
    let c = a.client.client()?;
    match a.cmd {
        ImageCmd::Import { name, file } => {
            let f = tokio::fs::File::open(&file)
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
            bar.set_message(format!("uploading {name}"));
            let b2 = bar.clone();
            let stream = tokio_util::io::ReaderStream::new(f).inspect(move |chunk| {
                if let Ok(c) = chunk {
                    b2.inc(c.len() as u64);
                }
            });
            let req = c
                .request(
                    reqwest::Method::PUT,
                    &format!("/apis/edgevirt.io/v1/images/{name}/upload"),
                )
                .header("content-type", "application/octet-stream")
                .header("content-length", len)
                .body(reqwest::Body::wrap_stream(stream));
            let r = c.send(req).await;
            bar.finish_and_clear();
            let img = r?;
            println!(
                "image/{name} imported: {} format, {} bytes, sha256 {}",
                s(&img, &["status", "format"]),
                img["status"]["sizeBytes"],
                s(&img, &["status", "sha256"])
            );
        }
        ImageCmd::List { output } => {
            let list = c.get("/apis/edgevirt.io/v1/images").await?;
            match output {
                Format::Json | Format::Yaml => print_value(&list, output)?,
                _ => {
                    let rows: Vec<Vec<String>> = list["items"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|i| {
                            vec![
                                s(i, &["metadata", "name"]).to_string(),
                                s(i, &["status", "format"]).to_string(),
                                i["status"]["sizeBytes"].to_string(),
                                age(s(i, &["metadata", "creationTimestamp"])),
                            ]
                        })
                        .collect();
                    print!("{}", table(&["NAME", "FORMAT", "SIZE", "AGE"], &rows));
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
