//! The `kubevirt.io/v1` VirtualMachine fixtures of the tests and benchmarks, built in one
//! typed way: [`Vm::guest`] boots the test guest, [`Vm::halted`] is the smallest VM edgevirt
//! accepts; setters change one field each, [`Vm::with`] anything else (for bodies edgevirt
//! must refuse).

use serde_json::{Value, json};

/// A VirtualMachine under construction. [`Vm::json`], [`Vm::yaml`] or [`Vm::body`] give it.
#[derive(Clone, Debug)]
pub struct Vm {
    v: Value,
}

impl Vm {
    /// The test guest (`tests/guest/`, imported by [`crate::Appliance::import_guest`] as
    /// `test-kernel` and `test-initrd`): direct kernel boot with a serial console, 1 core,
    /// 192 MiB, a masquerade interface on the pod network, run strategy `Always`, a 10 s
    /// grace period, and the label `app: <name>` on the VM and its instances.
    pub fn guest(name: &str) -> Vm {
        Vm {
            v: json!({
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachine",
                "metadata": {"name": name, "labels": {"app": name}},
                "spec": {
                    "runStrategy": "Always",
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {
                            "terminationGracePeriodSeconds": 10,
                            "domain": {
                                "cpu": {"cores": 1},
                                "memory": {"guest": "192Mi"},
                                "devices": {
                                    "interfaces": [{"name": "default", "masquerade": {}}],
                                },
                                "firmware": {"kernelBoot": {
                                    "kernelArgs": format!("console=ttyS0 edgevirt.hostname={name}"),
                                    "container": {
                                        "image": "test-guest",
                                        "kernelPath": "test-kernel",
                                        "initrdPath": "test-initrd",
                                    },
                                }},
                            },
                            "networks": [{"name": "default", "pod": {}}],
                        },
                    },
                },
            }),
        }
    }

    /// The smallest VM edgevirt accepts and never boots: `Halted`, 64 MiB, kernel boot from
    /// the image `image` (which need not exist until it starts), no devices.
    pub fn halted(name: &str, image: &str) -> Vm {
        Vm {
            v: json!({
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachine",
                "metadata": {"name": name},
                "spec": {
                    "runStrategy": "Halted",
                    "template": {"spec": {"domain": {
                        "memory": {"guest": "64Mi"},
                        "firmware": {"kernelBoot": {"container": {"image": image, "kernelPath": image}}},
                    }}},
                },
            }),
        }
    }

    pub fn namespace(mut self, ns: &str) -> Vm {
        self.v["metadata"]["namespace"] = json!(ns);
        self
    }

    /// A label on the VM (not its instances).
    pub fn label(mut self, key: &str, value: &str) -> Vm {
        self.v["metadata"]["labels"][key] = json!(value);
        self
    }

    /// An annotation on the instance template.
    pub fn template_annotation(mut self, key: &str, value: &str) -> Vm {
        self.v["spec"]["template"]["metadata"]["annotations"][key] = json!(value);
        self
    }

    /// `Always`, `Halted`, `Manual`, `RerunOnFailure`, `Once`.
    pub fn run_strategy(mut self, s: &str) -> Vm {
        self.v["spec"]["runStrategy"] = json!(s);
        self
    }

    /// Guest memory, a Kubernetes quantity (`128Mi`).
    pub fn memory(mut self, q: &str) -> Vm {
        self.domain()["memory"]["guest"] = json!(q);
        self
    }

    /// The whole `domain.cpu` (cores, model, features…).
    pub fn cpu(mut self, cpu: Value) -> Vm {
        self.domain()["cpu"] = cpu;
        self
    }

    pub fn grace_period(mut self, secs: u64) -> Vm {
        self.v["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(secs);
        self
    }

    /// The kernel image a kernel boot names (an image name; a path must be refused).
    pub fn kernel_path(mut self, image: &str) -> Vm {
        self.domain()["firmware"]["kernelBoot"]["container"]["kernelPath"] = json!(image);
        self
    }

    /// A virtio disk `name` from `volume` (a KubeVirt volume source, for instance
    /// `{"containerDisk": {"image": "test-disk"}}`).
    pub fn disk(mut self, name: &str, source: Value) -> Vm {
        let d = self.domain();
        let disks = d["devices"]["disks"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        d["devices"]["disks"] = json!(
            [
                disks,
                vec![json!({"name": name, "disk": {"bus": "virtio"}})]
            ]
            .concat()
        );
        self.volume(name, source)
    }

    /// The guest's root filesystem on its first disk, `name` from `source` (the test guest's
    /// `edgevirt.diskroot=/dev/vda`: it copies itself there at the first boot and runs from
    /// it, so its writes land on that disk). Call it before any other `disk`.
    pub fn disk_root(mut self, name: &str, source: Value) -> Vm {
        let args = &mut self.domain()["firmware"]["kernelBoot"]["kernelArgs"];
        *args = json!(format!(
            "{} edgevirt.diskroot=/dev/vda",
            args.as_str().unwrap_or_default()
        ));
        self.disk(name, source)
    }

    /// A volume `name` from `source` without a disk entry (edgevirt attaches it as the next
    /// virtio disk).
    pub fn volume(mut self, name: &str, source: Value) -> Vm {
        let spec = &mut self.v["spec"]["template"]["spec"];
        let mut vol = json!({"name": name});
        if let (Some(o), Some(src)) = (vol.as_object_mut(), source.as_object()) {
            o.extend(src.clone());
        }
        let vols = spec["volumes"].as_array().cloned().unwrap_or_default();
        spec["volumes"] = json!([vols, vec![vol]].concat());
        self
    }

    /// A cloud-init NoCloud volume `cloudinit` with this user data (no disk entry).
    pub fn cloud_init(self, user_data: &str) -> Vm {
        self.volume(
            "cloudinit",
            json!({"cloudInitNoCloud": {"userData": user_data}}),
        )
    }

    /// A disk `data` from the image `image` (containerDisk: a copy for this instance).
    pub fn container_disk(self, image: &str) -> Vm {
        self.disk("data", json!({"containerDisk": {"image": image}}))
    }

    /// Any other change, on the JSON object.
    pub fn with(mut self, f: impl FnOnce(&mut Value)) -> Vm {
        f(&mut self.v);
        self
    }

    /// `spec.template.spec.domain`, to change in [`Vm::with`].
    pub fn domain_of(v: &mut Value) -> &mut Value {
        &mut v["spec"]["template"]["spec"]["domain"]
    }

    fn domain(&mut self) -> &mut Value {
        Self::domain_of(&mut self.v)
    }

    pub fn json(&self) -> Value {
        self.v.clone()
    }

    /// The JSON text.
    pub fn body(&self) -> String {
        self.v.to_string()
    }

    /// As YAML (what `kubectl apply -f` and `post_yaml` take).
    pub fn yaml(&self) -> String {
        serde_yaml_ng::to_string(&self.v).unwrap()
    }
}

impl From<Vm> for Value {
    fn from(vm: Vm) -> Value {
        vm.v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_with_a_disk_and_changes() {
        let v = Vm::guest("a")
            .memory("128Mi")
            .run_strategy("Halted")
            .container_disk("test-disk")
            .template_annotation("vm.kubevirt.io/os", "windows2k22")
            .json();
        let spec = &v["spec"]["template"]["spec"];
        assert_eq!(spec["domain"]["memory"]["guest"], "128Mi");
        assert_eq!(v["spec"]["runStrategy"], "Halted");
        assert_eq!(spec["domain"]["devices"]["disks"][0]["name"], "data");
        assert_eq!(
            spec["domain"]["devices"]["interfaces"][0]["name"],
            "default"
        );
        assert_eq!(
            spec["volumes"][0],
            json!({"name": "data", "containerDisk": {"image": "test-disk"}})
        );
        assert_eq!(
            v["spec"]["template"]["metadata"]["annotations"]["vm.kubevirt.io/os"],
            "windows2k22"
        );
        let back: Value = serde_yaml_ng::from_str(&Vm::guest("a").yaml()).unwrap();
        assert_eq!(back, Vm::guest("a").json());
    }
}
