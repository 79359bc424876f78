//! Creating a VM from the form or from pasted YAML.

use std::collections::BTreeMap;

use askama::Template;
use axum::Form;
use axum::extract::{Extension, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::{
    Chrome, YamlForm, all, detail_url, parse_pasted_yaml, render, render_status, url_encode,
};
use crate::http::AppState;
use crate::http::auth::Principal;
use crate::types::edgevirt::Image;
use crate::types::kubevirt::{
    CloudInitNoCloud, Cpu, DataVolumeSource, Disk, DiskTarget, DomainSpec, Empty, Firmware,
    Interface, KernelBoot, KernelBootContainer, Memory, Network, RunStrategy, TemplateMeta,
    VirtualMachine, VirtualMachineInstanceSpec, VirtualMachineInstanceTemplateSpec,
    VirtualMachineSpec, Volume,
};
use crate::types::{Meta, Typed};
use crate::web::{Api, S, WebUser, api_message};

#[derive(Deserialize, Clone, Default)]
pub struct VmForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    cpus: String,
    #[serde(default)]
    memory: String,
    /// `linux` (or empty) or `windows`: the settings that OS wants.
    #[serde(default)]
    os: String,
    #[serde(default)]
    image: String,
    /// An installer ISO to boot first (a SATA cdrom), with a blank disk to install onto.
    #[serde(default)]
    iso: String,
    /// A second ISO, such as the virtio drivers for a Windows install.
    #[serde(default)]
    drivers_iso: String,
    /// The blank install disk's size in GiB.
    #[serde(default)]
    disk_gib: String,
    #[serde(default)]
    kernel: String,
    #[serde(default)]
    initrd: String,
    #[serde(default)]
    kernel_args: String,
    #[serde(default)]
    user_data: String,
    #[serde(default)]
    network: String,
    /// Up to two site networks (`namespace/name` of a NetworkAttachmentDefinition), each a
    /// bridged NIC after the NAT one.
    #[serde(default)]
    lan1: String,
    #[serde(default)]
    lan2: String,
    #[serde(default)]
    labels: String,
    #[serde(default)]
    start: Option<String>,
}

/// The form as the template fills it back in.
pub struct FormValues {
    name: String,
    namespace: String,
    cpus: String,
    memory: String,
    os: String,
    image: String,
    iso: String,
    drivers_iso: String,
    disk_gib: String,
    kernel: String,
    initrd: String,
    kernel_args: String,
    user_data: String,
    network: String,
    lan1: String,
    lan2: String,
    labels: String,
    start: bool,
}

impl From<VmForm> for FormValues {
    fn from(f: VmForm) -> Self {
        FormValues {
            name: f.name,
            namespace: if f.namespace.is_empty() {
                "default".into()
            } else {
                f.namespace
            },
            cpus: if f.cpus.is_empty() {
                "1".into()
            } else {
                f.cpus
            },
            memory: if f.memory.is_empty() {
                "512Mi".into()
            } else {
                f.memory
            },
            os: if f.os.is_empty() {
                "linux".into()
            } else {
                f.os
            },
            image: f.image,
            iso: f.iso,
            drivers_iso: f.drivers_iso,
            disk_gib: if f.disk_gib.is_empty() {
                "20".into()
            } else {
                f.disk_gib
            },
            kernel: f.kernel,
            initrd: f.initrd,
            kernel_args: f.kernel_args,
            user_data: f.user_data,
            network: if f.network.is_empty() {
                "nat".into()
            } else {
                f.network
            },
            lan1: f.lan1,
            lan2: f.lan2,
            labels: f.labels,
            start: f.start.is_some(),
        }
    }
}

#[derive(Template)]
#[template(path = "vm_new.html")]
struct NewVmTpl {
    c: Chrome,
    f: FormValues,
    /// Problems by form field, shown next to each.
    errors: FieldErrors,
    /// Disk images, kernels and initrds.
    images: Vec<String>,
    /// ISO images.
    isos: Vec<String>,
    /// The site networks (`namespace/name`) a NIC may join.
    networks: Vec<String>,
    yaml: String,
}

impl NewVmTpl {
    /// The problem with one form field, if any.
    fn err(&self, field: &str) -> Option<&str> {
        self.errors
            .iter()
            .find(|(f, _)| *f == field)
            .map(|(_, m)| m.as_str())
    }
}

async fn network_names(st: &AppState) -> Vec<String> {
    all::<crate::types::cni::NetworkAttachmentDefinition>(st)
        .await
        .unwrap_or_default()
        .iter()
        .map(|n| format!("{}/{}", n.namespace(), n.name()))
        .collect()
}

/// The names of the site's images: disks (with kernels and initrds), then ISOs.
async fn image_names(st: &AppState) -> (Vec<String>, Vec<String>) {
    let (isos, disks): (Vec<Image>, Vec<Image>) = all::<Image>(st)
        .await
        .unwrap_or_default()
        .into_iter()
        .partition(|i| i.status.as_ref().is_some_and(|s| s.iso));
    let names = |l: Vec<Image>| l.iter().map(|i| i.name().to_string()).collect();
    (names(disks), names(isos))
}

pub async fn new_vm(State(st): S, Extension(u): Extension<WebUser>) -> Response {
    if let Some(r) = super::viewer_refused(&u, "create VMs") {
        return r;
    }
    let blank = VmForm {
        start: Some("yes".into()),
        ..Default::default()
    };
    let (images, isos) = image_names(&st).await;
    render(&NewVmTpl {
        c: Chrome::new(&u, "New VM"),
        f: blank.into(),
        errors: FieldErrors::new(),
        images,
        isos,
        networks: network_names(&st).await,
        yaml: example_yaml(&st).await,
    })
}

fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut m = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("label {part:?} is not key=value"))?;
        m.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(m)
}

/// What is wrong with the form, field by field (the form's field name, the problem): all of
/// it at once, shown next to each field.
pub type FieldErrors = Vec<(&'static str, String)>;

/// A KubeVirt VirtualMachine from the form's fields, or every field at fault.
fn vm_from_form(f: &FormValues) -> Result<VirtualMachine, FieldErrors> {
    let mut errors: FieldErrors = Vec::new();
    let name = f.name.trim();
    if name.is_empty() {
        errors.push(("name", "a name is needed".into()));
    } else if let Err(e) = crate::types::check_name("name", name) {
        errors.push(("name", e.0));
    }
    if let Err(e) = crate::types::check_name("namespace", f.namespace.trim()) {
        errors.push(("namespace", e.0));
    }
    let cpus: u32 = match f.cpus.trim().parse() {
        Ok(n) if (1..=64).contains(&n) => n,
        _ => {
            errors.push((
                "cpus",
                format!("CPUs must be a whole number from 1 to 64, not {:?}", f.cpus),
            ));
            1
        }
    };
    match crate::types::parse_quantity(f.memory.trim()) {
        Ok(b) if b >= 1 << 20 => {}
        Ok(_) => errors.push(("memory", "at least 1Mi of memory".into())),
        Err(_) => errors.push((
            "memory",
            format!(
                "memory is a size such as 512Mi or 2Gi, not {:?}",
                f.memory.trim()
            ),
        )),
    }
    let mut labels = parse_labels(&f.labels).unwrap_or_else(|e| {
        errors.push(("labels", e));
        BTreeMap::new()
    });
    labels
        .entry("app".to_string())
        .or_insert_with(|| f.name.clone());
    let virtio = || {
        Some(DiskTarget {
            bus: Some("virtio".into()),
            ..Default::default()
        })
    };
    let mut spec = VirtualMachineInstanceSpec {
        domain: DomainSpec {
            cpu: Some(Cpu {
                cores: Some(cpus),
                ..Default::default()
            }),
            memory: Some(Memory {
                guest: Some(f.memory.trim().to_string()),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let windows = match f.os.as_str() {
        "linux" => false,
        "windows" => true,
        other => {
            errors.push(("os", format!("OS type {other:?} is not linux or windows")));
            false
        }
    };
    // Windows has no virtio drivers of its own: without the drivers ISO its disk is SATA
    // and its NIC an e1000e, as Proxmox's Windows defaults.
    let plain_devices = windows && f.drivers_iso.is_empty();
    let root_target = || {
        if plain_devices {
            Some(DiskTarget {
                bus: Some("sata".into()),
                ..Default::default()
            })
        } else {
            virtio()
        }
    };
    let mut templates = Vec::new();
    let install = !f.iso.is_empty();
    if install && !f.image.is_empty() {
        errors.push((
            "iso",
            "boot from a disk image or install from an ISO, not both".into(),
        ));
    }
    let (disks, volumes) = (&mut spec.domain.devices.disks, &mut spec.volumes);
    if install {
        let gib: u32 = match f.disk_gib.trim().parse() {
            Ok(n) if (1..=65536).contains(&n) => n,
            _ => {
                errors.push((
                    "disk_gib",
                    format!(
                        "the disk size is a whole number of GiB from 1 to 65536, not {:?}",
                        f.disk_gib
                    ),
                ));
                1
            }
        };
        // The installer boots first; once the install is done the disk boots (the ISO can
        // then be removed on the VM page). The drivers ISO, if any, rides along.
        for (name, image, boot_order) in [
            ("installer", &f.iso, Some(1)),
            ("drivers", &f.drivers_iso, None),
        ] {
            if image.is_empty() {
                continue;
            }
            disks.push(Disk {
                name: name.into(),
                cdrom: Some(DiskTarget {
                    bus: Some("sata".into()),
                    ..Default::default()
                }),
                boot_order,
                ..Default::default()
            });
            volumes.push(Volume {
                name: name.into(),
                container_disk: Some(crate::types::kubevirt::ContainerDisk {
                    image: image.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        // A blank DataVolume the VM owns, as KubeVirt's `blank` source makes it.
        let dv_name = format!("{}-rootdisk", f.name.trim());
        match serde_json::from_value(serde_json::json!({
            "metadata": {"name": dv_name},
            "spec": {"source": {"blank": {}},
                     "storage": {"resources": {"requests": {"storage": format!("{gib}Gi")}}}},
        })) {
            Ok(t) => templates.push(t),
            Err(e) => errors.push(("disk_gib", e.to_string())),
        }
        disks.push(Disk {
            name: "rootdisk".into(),
            disk: root_target(),
            boot_order: Some(2),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "rootdisk".into(),
            data_volume: Some(DataVolumeSource {
                name: dv_name,
                hotpluggable: None,
            }),
            ..Default::default()
        });
    } else if !f.drivers_iso.is_empty() {
        errors.push((
            "drivers_iso",
            "a drivers ISO goes with an installer ISO".into(),
        ));
    }
    if !f.image.is_empty() {
        disks.push(Disk {
            name: "rootdisk".into(),
            disk: root_target(),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "rootdisk".into(),
            // Persistent, as a dashboard user expects of a VM's root disk: a containerDisk
            // would forget every write at the next restart.
            data_volume: Some(DataVolumeSource {
                name: f.image.clone(),
                hotpluggable: None,
            }),
            ..Default::default()
        });
    }
    if !f.user_data.trim().is_empty() {
        disks.push(Disk {
            name: "cloudinitdisk".into(),
            disk: virtio(),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "cloudinitdisk".into(),
            cloud_init_no_cloud: Some(CloudInitNoCloud {
                user_data: Some(f.user_data.clone()),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    if f.network == "nat" {
        spec.domain.devices.interfaces = vec![Interface {
            name: "default".into(),
            masquerade: Some(Empty {}),
            model: plain_devices.then(|| "e1000e".to_string()),
            ..Default::default()
        }];
        spec.networks = vec![Network {
            name: "default".into(),
            pod: Some(Empty {}),
            ..Default::default()
        }];
    }
    // Site networks: a bridged NIC each, named lan1 and lan2.
    for (nic, chosen) in [("lan1", &f.lan1), ("lan2", &f.lan2)] {
        if chosen.is_empty() {
            continue;
        }
        // In the VM's own namespace the plain name, as KubeVirt users write it.
        let network_name = match chosen.split_once('/') {
            Some((ns, name)) if ns == f.namespace.trim() => name.to_string(),
            _ => chosen.clone(),
        };
        spec.domain.devices.interfaces.push(Interface {
            name: nic.into(),
            bridge: Some(Empty {}),
            model: plain_devices.then(|| "e1000e".to_string()),
            ..Default::default()
        });
        spec.networks.push(Network {
            name: nic.into(),
            multus: Some(crate::types::kubevirt::MultusNetwork {
                network_name,
                default: None,
            }),
            ..Default::default()
        });
    }
    if !f.kernel.is_empty() {
        let args = f.kernel_args.trim();
        spec.domain.firmware = Some(Firmware {
            kernel_boot: Some(KernelBoot {
                kernel_args: (!args.is_empty()).then(|| args.to_string()),
                container: Some(KernelBootContainer {
                    image: f.kernel.clone(),
                    kernel_path: Some(f.kernel.clone()),
                    initrd_path: (!f.initrd.is_empty()).then(|| f.initrd.clone()),
                    image_pull_policy: None,
                    image_pull_secret: None,
                }),
            }),
            ..Default::default()
        });
    } else if f.image.is_empty() && !install {
        errors.push((
            "image",
            "choose a boot disk image, an installer ISO or a kernel to boot".into(),
        ));
    }
    let mut annotations = BTreeMap::new();
    if windows {
        // What Windows 11 and Server 2022 want: UEFI with Secure Boot (and SMM), a TPM
        // 2.0 whose keys survive restarts (BitLocker, Windows Hello), Hyper-V enlightenments
        // and its clock; the annotation KubeVirt's Windows
        // templates set, which also picks the CPU policy's Windows preset (Hygon's too).
        if f.kernel.is_empty() {
            spec.domain.firmware = Some(Firmware {
                bootloader: Some(crate::types::kubevirt::Bootloader {
                    // Its boot entries and keys outlive a restart, as Windows expects.
                    efi: Some(crate::types::kubevirt::Efi {
                        secure_boot: None,
                        persistent: Some(true),
                    }),
                    bios: None,
                }),
                ..Default::default()
            });
        }
        let windows_domain = serde_json::json!({
            "features": {"acpi": {}, "apic": {}, "smm": {}, "hyperv": {
                "relaxed": {}, "vapic": {}, "spinlocks": {"spinlocks": 8191},
                "vpindex": {}, "synic": {}, "synictimer": {"direct": {}}, "frequencies": {},
                "reset": {}, "runtime": {}, "tlbflush": {}, "ipi": {},
            }},
            "clock": {"utc": {}, "timer": {"hpet": {"present": false}, "pit": {"tickPolicy": "delay"},
                      "rtc": {"tickPolicy": "catchup"}, "hyperv": {}}},
            "devices": {"tpm": {"persistent": true}},
        });
        match (
            serde_json::from_value(windows_domain["features"].clone()),
            serde_json::from_value(windows_domain["clock"].clone()),
            serde_json::from_value(windows_domain["devices"]["tpm"].clone()),
        ) {
            (Ok(features), Ok(clock), Ok(tpm)) => {
                spec.domain.features = Some(features);
                spec.domain.clock = Some(clock);
                spec.domain.devices.tpm = Some(tpm);
            }
            _ => errors.push(("os", "the Windows settings do not parse".into())),
        }
        annotations.insert("vm.kubevirt.io/os".to_string(), "windows11".to_string());
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut vm = VirtualMachine::new(
        f.name.trim(),
        VirtualMachineSpec {
            data_volume_templates: templates,
            running: None,
            run_strategy: Some(if f.start {
                RunStrategy::Always
            } else {
                RunStrategy::Halted
            }),
            instancetype: None,
            preference: None,
            update_volumes_strategy: None,
            template: VirtualMachineInstanceTemplateSpec {
                metadata: Some(TemplateMeta {
                    labels: labels.clone(),
                    annotations,
                    ..Default::default()
                }),
                spec,
            },
        },
    );
    vm.metadata.namespace = Some(f.namespace.trim().to_string());
    vm.metadata.labels = Some(labels);
    Ok(vm)
}

pub async fn create_from_form(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Form(form): Form<VmForm>,
) -> Response {
    let f: FormValues = form.into();
    let (code, general, fields) = match vm_from_form(&f) {
        Ok(vm) => {
            let uri = format!(
                "/apis/kubevirt.io/v1/namespaces/{}/virtualmachines",
                url_encode(&f.namespace)
            );
            let (code, v) = api
                .call(
                    &p,
                    Method::POST,
                    &uri,
                    "application/json",
                    vm.to_value().to_string(),
                )
                .await;
            if code.is_success() {
                return Redirect::to(&detail_url(&f.namespace, &f.name)).into_response();
            }
            // The API's causes go next to the fields they are about; the rest above the form.
            let (mut fields, mut general) = (FieldErrors::new(), Vec::new());
            for (path, message) in causes(&v) {
                match path.as_deref().and_then(form_field) {
                    Some(field) => fields.push((field, message)),
                    None => general.push(message),
                }
            }
            let general = if general.is_empty() {
                "The VM was not created: see the fields marked below.".to_string()
            } else {
                general.join("; ")
            };
            (code, general, fields)
        }
        Err(fields) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "The VM was not created: see the fields marked below.".to_string(),
            fields,
        ),
    };
    let mut c = Chrome::new(&u, "New VM");
    c.error = Some(general);
    let (images, isos) = image_names(&st).await;
    render_status(
        code,
        &NewVmTpl {
            c,
            f,
            errors: fields,
            images,
            isos,
            networks: network_names(&st).await,
            yaml: example_yaml(&st).await,
        },
    )
}

/// The causes of an API refusal as (field path, message): its `details.causes`, or else
/// its message when that starts with the path of the field at fault (`spec.x: ...`).
fn causes(v: &serde_json::Value) -> Vec<(Option<String>, String)> {
    let listed: Vec<(Option<String>, String)> = v["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["field"].as_str().map(str::to_string),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    if !listed.is_empty() {
        return listed;
    }
    let message = api_message(v);
    let path = message
        .split_once(": ")
        .map(|(p, _)| p)
        .filter(|p| p.contains('.') && !p.contains(' '))
        .map(str::to_string);
    vec![(path, message)]
}

/// The form field a cause of the API's 422 is about (its `field`, a path in the VM).
fn form_field(path: &str) -> Option<&'static str> {
    let p = path.to_ascii_lowercase();
    Some(match () {
        _ if p == "metadata.name" => "name",
        _ if p == "metadata.namespace" => "namespace",
        _ if p.contains("labels") => "labels",
        _ if p.contains("datavolumetemplates") => "disk_gib",
        _ if p.contains("memory") || p.contains("resources.requests") => "memory",
        _ if p.contains("cpu") => "cpus",
        _ if p.contains("kernelboot") => "kernel",
        _ if p.contains("cloudinit") || p.contains("userdata") => "user_data",
        _ if p.contains("multus") => "lan1",
        _ if p.contains("networks") || p.contains("interfaces") => "network",
        _ if p.contains("cdrom") => "iso",
        _ if p.contains("volumes") || p.contains("disks") => "image",
        _ if p.contains("tpm") || p.contains("features") || p.contains("firmware") => "os",
        _ => return None,
    })
}

/// The YAML box's starting point: what the blank form makes, with the first image as its
/// disk (or a placeholder name when there is no image yet). Pasted back unchanged, it
/// creates a VM.
async fn example_yaml(st: &AppState) -> String {
    let (images, _) = image_names(st).await;
    let mut f: FormValues = VmForm {
        name: "example".into(),
        ..Default::default()
    }
    .into();
    f.image = images
        .first()
        .cloned()
        .unwrap_or_else(|| "IMAGE-NAME".into());
    match vm_from_form(&f) {
        Ok(vm) => serde_yaml_ng::to_string(&vm.to_value()).unwrap_or_default(),
        Err(_) => String::new(),
    }
}

pub async fn create_from_yaml(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Form(form): Form<YamlForm>,
) -> Response {
    let parsed = parse_pasted_yaml(form.yaml.clone()).await;
    let (code, msg) = match parsed {
        Ok(v) if v["kind"] == "VirtualMachine" => {
            // Where to go once it exists: the pasted metadata (the API checks the rest).
            let meta: ObjectMeta = v
                .get("metadata")
                .and_then(|m| serde_json::from_value(m.clone()).ok())
                .unwrap_or_default();
            let ns = meta.namespace.unwrap_or_else(|| "default".into());
            let name = meta.name.unwrap_or_default();
            let uri = format!(
                "/apis/kubevirt.io/v1/namespaces/{}/virtualmachines",
                url_encode(&ns)
            );
            let (code, r) = api
                .call(&p, Method::POST, &uri, "application/json", v.to_string())
                .await;
            if code.is_success() {
                return Redirect::to(&detail_url(&ns, &name)).into_response();
            }
            (code, api_message(&r))
        }
        Ok(_) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "the YAML must be one object of kind VirtualMachine".to_string(),
        ),
        Err(m) => (StatusCode::BAD_REQUEST, m),
    };
    let mut c = Chrome::new(&u, "New VM");
    c.error = Some(msg);
    let blank: FormValues = VmForm {
        start: Some("yes".into()),
        ..Default::default()
    }
    .into();
    let (images, isos) = image_names(&st).await;
    render_status(
        code,
        &NewVmTpl {
            c,
            f: blank,
            errors: FieldErrors::new(),
            images,
            isos,
            networks: network_names(&st).await,
            yaml: form.yaml,
        },
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn form(image: &str, kernel: &str) -> FormValues {
        VmForm {
            name: "web".into(),
            namespace: "prod ".into(),
            cpus: "2".into(),
            memory: " 1Gi".into(),
            image: image.into(),
            kernel: kernel.into(),
            initrd: if kernel.is_empty() { "" } else { "initrd" }.into(),
            kernel_args: " console=ttyS0 ".into(),
            user_data: "#cloud-config\n".into(),
            labels: "tier=front, app=shop".into(),
            start: None,
            ..Default::default()
        }
        .into()
    }

    fn install(os: &str, drivers: &str) -> FormValues {
        VmForm {
            name: "win".into(),
            cpus: "4".into(),
            memory: "8Gi".into(),
            os: os.into(),
            iso: "win11".into(),
            drivers_iso: drivers.into(),
            disk_gib: "64".into(),
            start: Some("yes".into()),
            ..Default::default()
        }
        .into()
    }

    /// The wizard's Windows 11 install: the installer and the drivers on SATA cdroms, the
    /// installer first, a blank 64Gi DataVolume after it, UEFI Secure Boot with SMM, a TPM,
    /// Hyper-V, and the annotation that picks the CPU policy's Windows preset. Its template
    /// is `tests/golden/wizard-windows11.yaml`, which the domain XML golden test renders on
    /// the Hygon fixture.
    #[test]
    fn a_windows_install_from_isos() {
        let vm = vm_from_form(&install("windows", "virtio-win")).unwrap();
        let v = vm.to_value();
        assert_eq!(
            v["spec"]["dataVolumeTemplates"],
            json!([{"metadata": {"name": "win-rootdisk"}, "spec": {"source": {"blank": {}},
                "storage": {"resources": {"requests": {"storage": "64Gi"}}}}}])
        );
        let t = &v["spec"]["template"];
        assert_eq!(
            t["spec"]["domain"]["devices"]["disks"],
            json!([
                {"name": "installer", "cdrom": {"bus": "sata"}, "bootOrder": 1},
                {"name": "drivers", "cdrom": {"bus": "sata"}},
                {"name": "rootdisk", "disk": {"bus": "virtio"}, "bootOrder": 2},
            ])
        );
        assert_eq!(
            t["spec"]["volumes"],
            json!([
                {"name": "installer", "containerDisk": {"image": "win11"}},
                {"name": "drivers", "containerDisk": {"image": "virtio-win"}},
                {"name": "rootdisk", "dataVolume": {"name": "win-rootdisk"}},
            ])
        );
        let d = &t["spec"]["domain"];
        assert_eq!(
            d["firmware"],
            json!({"bootloader": {"efi": {"persistent": true}}})
        );
        assert_eq!(d["devices"]["tpm"], json!({"persistent": true}));
        assert!(d["features"]["smm"].is_object() && d["features"]["hyperv"]["relaxed"].is_object());
        assert_eq!(
            d["devices"]["interfaces"],
            json!([{"name": "default", "masquerade": {}}])
        );
        let annotations: BTreeMap<String, String> =
            serde_json::from_value(t["metadata"]["annotations"].clone()).unwrap();
        assert_eq!(
            crate::cpu::policy::GuestOs::detect(&BTreeMap::new(), &annotations),
            crate::cpu::policy::GuestOs::Windows
        );
        // The API takes it as it is.
        let spec: VirtualMachineInstanceSpec = serde_json::from_value(t["spec"].clone()).unwrap();
        assert_eq!(spec.volumes.len(), 3);
        let golden = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden/wizard-windows11.yaml");
        let yaml = serde_yaml_ng::to_string(&t["spec"]).unwrap();
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&golden, &yaml).unwrap();
        }
        assert_eq!(
            yaml,
            std::fs::read_to_string(&golden).unwrap_or_default(),
            "{} differs (UPDATE_GOLDEN=1 to rewrite)",
            golden.display()
        );

        // Without the drivers ISO, Windows gets devices it has drivers for.
        let v = vm_from_form(&install("windows", "")).unwrap().to_value();
        let d = &v["spec"]["template"]["spec"]["domain"];
        assert_eq!(d["devices"]["disks"][1]["disk"]["bus"], "sata");
        assert_eq!(d["devices"]["interfaces"][0]["model"], "e1000e");
        // Linux from an ISO: BIOS (the default), virtio, no TPM, no annotation.
        let v = vm_from_form(&install("linux", "")).unwrap().to_value();
        let t = &v["spec"]["template"];
        assert!(t["spec"]["domain"].get("firmware").is_none(), "{t}");
        assert!(t["spec"]["domain"]["devices"].get("tpm").is_none(), "{t}");
        assert_eq!(
            t["spec"]["domain"]["devices"]["disks"][1]["disk"]["bus"],
            "virtio"
        );
        assert!(t["metadata"].get("annotations").is_none(), "{t}");
    }

    #[test]
    fn install_choices_that_do_not_fit_are_marked_on_their_fields() {
        let at = |f: FormValues| -> Vec<&'static str> {
            vm_from_form(&f)
                .unwrap_err()
                .into_iter()
                .map(|(f, _)| f)
                .collect()
        };
        let mut f = install("windows", "");
        f.image = "debian".into();
        assert_eq!(at(f), ["iso"]);
        let mut f = install("linux", "");
        f.disk_gib = "0".into();
        assert_eq!(at(f), ["disk_gib"]);
        let mut f = install("linux", "virtio-win");
        f.iso = String::new();
        assert_eq!(at(f), ["drivers_iso", "image"]);
        assert_eq!(at(install("beos", "")), ["os"]);
    }

    #[test]
    fn the_form_makes_the_vm_it_made_as_json() {
        let vm = vm_from_form(&form("debian", "vmlinuz")).unwrap().to_value();
        let labels = json!({"app": "shop", "tier": "front"});
        assert_eq!(
            vm,
            json!({
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachine",
                "metadata": {"name": "web", "namespace": "prod", "labels": labels},
                "spec": {
                    "runStrategy": "Halted",
                    "template": {"metadata": {"labels": labels}, "spec": {
                        "domain": {
                            "cpu": {"cores": 2},
                            "memory": {"guest": "1Gi"},
                            "devices": {
                                "disks": [
                                    {"name": "rootdisk", "disk": {"bus": "virtio"}},
                                    {"name": "cloudinitdisk", "disk": {"bus": "virtio"}},
                                ],
                                "interfaces": [{"name": "default", "masquerade": {}}],
                            },
                            "firmware": {"kernelBoot": {
                                "kernelArgs": "console=ttyS0",
                                "container": {"image": "vmlinuz", "kernelPath": "vmlinuz",
                                              "initrdPath": "initrd"},
                            }},
                        },
                        "volumes": [
                            {"name": "rootdisk", "dataVolume": {"name": "debian"}},
                            {"name": "cloudinitdisk",
                             "cloudInitNoCloud": {"userData": "#cloud-config\n"}},
                        ],
                        "networks": [{"name": "default", "pod": {}}],
                    }},
                },
            })
        );
    }

    #[test]
    fn the_apis_causes_find_their_form_fields() {
        let listed = json!({"message": "x", "details": {"causes": [
            {"field": "metadata.name", "message": "bad name"},
            {"field": "spec.template.spec.domain.memory.guest", "message": "too big"},
            {"field": "spec.somethingElse", "message": "odd"}]}});
        let got: Vec<(Option<&str>, String)> = causes(&listed)
            .into_iter()
            .map(|(p, m)| (p.as_deref().and_then(form_field), m))
            .collect();
        assert_eq!(
            got,
            [
                (Some("name"), "bad name".to_string()),
                (Some("memory"), "too big".to_string()),
                (None, "odd".to_string()),
            ]
        );
        let plain = json!({"message": "metadata.labels[tier]: value \"x y\" is invalid"});
        let c = causes(&plain);
        assert_eq!(c[0].0.as_deref().and_then(form_field), Some("labels"));
        let prose = json!({"message": "the server is busy: try again"});
        assert_eq!(causes(&prose)[0].0, None);
        assert_eq!(
            form_field("spec.template.spec.domain.firmware.kernelBoot.container.image"),
            Some("kernel")
        );
    }

    #[test]
    fn site_networks_become_bridged_nics_after_the_nat_one() {
        let mut f = form("debian", "");
        f.lan1 = "prod/site-lan".into();
        f.lan2 = "shared/cameras".into();
        let vm = vm_from_form(&f).unwrap().to_value();
        let spec = &vm["spec"]["template"]["spec"];
        assert_eq!(
            spec["domain"]["devices"]["interfaces"],
            json!([{"name": "default", "masquerade": {}},
                   {"name": "lan1", "bridge": {}}, {"name": "lan2", "bridge": {}}])
        );
        assert_eq!(
            spec["networks"],
            json!([{"name": "default", "pod": {}},
                   {"name": "lan1", "multus": {"networkName": "site-lan"}},
                   {"name": "lan2", "multus": {"networkName": "shared/cameras"}}])
        );
    }

    #[test]
    fn the_form_needs_a_disk_or_a_kernel_and_whole_cpus() {
        let mut f = form("", "");
        assert_eq!(
            vm_from_form(&f).unwrap_err(),
            [(
                "image",
                "choose a boot disk image, an installer ISO or a kernel to boot".to_string()
            )]
        );
        // Every field at fault at once, each named.
        f.name = "Web_1".into();
        f.labels = "nolabel".into();
        f.cpus = "1.5".into();
        f.memory = "lots".into();
        let errs = vm_from_form(&f).unwrap_err();
        let fields: Vec<&str> = errs.iter().map(|e| e.0).collect();
        assert_eq!(fields, ["name", "cpus", "memory", "labels", "image"]);
        assert!(errs[1].1.starts_with("CPUs must be"), "{errs:?}");
        assert!(errs[3].1.contains("not key=value"), "{errs:?}");
        f.name = "web".into();
        f.memory = "1Gi".into();
        f.image = "debian".into();
        f.labels = String::new();
        f.cpus = "1".into();
        f.labels = String::new();
        f.network = "none".into();
        f.start = true;
        let vm = vm_from_form(&f).unwrap();
        assert_eq!(vm.label("app"), Some("web"));
        assert_eq!(vm.spec.run_strategy, Some(RunStrategy::Always));
        assert!(vm.spec.template.spec.networks.is_empty());
    }
}
