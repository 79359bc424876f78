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
    #[serde(default)]
    image: String,
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
    image: String,
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
            image: f.image,
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
    images: Vec<String>,
    /// The site networks (`namespace/name`) a NIC may join.
    networks: Vec<String>,
    yaml: String,
}

async fn network_names(st: &AppState) -> Vec<String> {
    all::<crate::types::cni::NetworkAttachmentDefinition>(st)
        .await
        .unwrap_or_default()
        .iter()
        .map(|n| format!("{}/{}", n.namespace(), n.name()))
        .collect()
}

async fn image_names(st: &AppState) -> Vec<String> {
    all::<Image>(st)
        .await
        .unwrap_or_default()
        .iter()
        .map(|i| i.name().to_string())
        .collect()
}

pub async fn new_vm(State(st): S, Extension(u): Extension<WebUser>) -> Response {
    if let Some(r) = super::viewer_refused(&u, "create VMs") {
        return r;
    }
    let blank = VmForm {
        start: Some("yes".into()),
        ..Default::default()
    };
    render(&NewVmTpl {
        c: Chrome::new(&u, "New VM"),
        f: blank.into(),
        images: image_names(&st).await,
        networks: network_names(&st).await,
        yaml: String::new(),
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

/// A KubeVirt VirtualMachine from the form's fields.
fn vm_from_form(f: &FormValues) -> Result<VirtualMachine, String> {
    let cpus: u32 = f
        .cpus
        .trim()
        .parse()
        .map_err(|_| format!("CPUs must be a whole number, not {:?}", f.cpus))?;
    let mut labels = parse_labels(&f.labels)?;
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
    let (disks, volumes) = (&mut spec.domain.devices.disks, &mut spec.volumes);
    if !f.image.is_empty() {
        disks.push(Disk {
            name: "rootdisk".into(),
            disk: virtio(),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "rootdisk".into(),
            // Persistent, as a dashboard user expects of a VM's root disk: a containerDisk
            // would forget every write at the next restart.
            data_volume: Some(DataVolumeSource {
                name: f.image.clone(),
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
    } else if f.image.is_empty() {
        return Err("choose a boot disk image or a kernel to boot".into());
    }
    let mut vm = VirtualMachine::new(
        f.name.trim(),
        VirtualMachineSpec {
            data_volume_templates: Vec::new(),
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
    let attempt = match vm_from_form(&f) {
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
            (code, api_message(&v))
        }
        Err(m) => (StatusCode::UNPROCESSABLE_ENTITY, m),
    };
    let mut c = Chrome::new(&u, "New VM");
    c.error = Some(attempt.1);
    render_status(
        attempt.0,
        &NewVmTpl {
            c,
            f,
            images: image_names(&st).await,
            networks: network_names(&st).await,
            yaml: String::new(),
        },
    )
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
    render_status(
        code,
        &NewVmTpl {
            c,
            f: blank,
            images: image_names(&st).await,
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
            "choose a boot disk image or a kernel to boot"
        );
        f.image = "debian".into();
        f.labels = "nolabel".into();
        assert!(vm_from_form(&f).unwrap_err().contains("not key=value"));
        f.cpus = "1.5".into();
        assert!(vm_from_form(&f).unwrap_err().starts_with("CPUs must be"));
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
