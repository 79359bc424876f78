//! A VM's detail page and its polled status.

use askama::Template;
use axum::extract::{Extension, Path, Query, State};
use axum::response::Response;
use serde_json::{Value, json};

use super::{
    BackupRow, Chrome, backup_rows, condition_status, labels_text, load_vm, or_dash,
    printable_status, render, vmi_ip, vmi_status,
};
use crate::types::kubevirt::{
    self, ConditionType, Phase, VirtualMachine, VirtualMachineInstance, Volume,
};
use crate::types::{Kind, Meta, age};
use crate::vnc::VncState;
use crate::web::{S, WebUser};

pub struct StatusView {
    status: String,
    phase: String,
    node: String,
    ip: String,
    ready: String,
    live_migratable: String,
    guest_os: String,
    /// Users logged in to the guest, as its agent reports them.
    users: String,
    /// The guest's filesystems: `mount (type, device): used of total`.
    filesystems: Vec<String>,
    /// Each NIC: `name (network): MAC, addresses`.
    nics: Vec<String>,
    viewers: String,
    /// Why the VM cannot start, when the scheduler said (its Unschedulable message).
    why_not: Option<String>,
    /// The migration in flight or the last one, in words.
    migration: Option<String>,
    conditions: Vec<(String, String, String, String)>,
    /// The actions this state allows ([`crate::rules::actions::allowed`]): the page shows
    /// only those buttons, and updates them with each poll.
    actions: &'static [&'static str],
}

impl StatusView {
    /// Whether this state allows `action` (a button's value, or `console`).
    pub fn allows(&self, action: &str) -> bool {
        self.actions.contains(&action)
    }
}

pub struct SpecView {
    run_strategy: String,
    cpus: String,
    memory: String,
    /// BIOS, UEFI (with or without Secure Boot) or a kernel booted directly.
    firmware: String,
    /// "TPM 2.0" and how long its state lives, or "-".
    tpm: String,
    disks: Vec<DiskRow>,
    networks: String,
    labels: String,
}

/// One of the VM's disks (or CD drives) on its hardware list.
pub struct DiskRow {
    name: String,
    /// `disk` or `cdrom` (`CD drive`).
    device: &'static str,
    bus: String,
    boot_order: String,
    /// Where its data comes from: `image NAME`, `DataVolume NAME`, `cloud-init`, ...
    source: String,
    /// A CD drive, which the page lets an operator take out (the ISO with it).
    removable: bool,
    /// Its DataVolume's name and size in whole GiB, when it has one: the page offers to
    /// grow it.
    grows: Option<(String, u64)>,
    /// Added to the running guest (`addvolume`): the page offers to detach it.
    hotplugged: bool,
}

#[derive(Template)]
#[template(path = "vm_detail.html")]
struct DetailTpl {
    c: Chrome,
    ns: String,
    name: String,
    st: StatusView,
    spec: SpecView,
    changes: Vec<super::history::HistoryRow>,
    events: Vec<super::monitoring::EventView>,
    graphs_url: String,
    yaml: String,
    /// Where the VM could move: ready nodes that take VMs, other than its own.
    targets: Vec<String>,
    snapshots: Vec<SnapshotRow>,
    backups: Vec<BackupRow>,
    /// The backup targets the nodes mount, for "Back up now".
    backup_targets: Vec<String>,
}

/// One of the VM's snapshots, as its section lists it.
pub struct SnapshotRow {
    name: String,
    /// When the copy was taken (RFC 3339), empty until then.
    taken: String,
    /// `Ready`, `In progress (...)`, `Failed: why`.
    state: String,
    /// The indications in words.
    how: String,
    ready: bool,
}

/// The VM's snapshots, newest first.
fn snapshot_rows(
    all: &[crate::types::snapshot::VirtualMachineSnapshot],
    ns: &str,
    vm: &str,
) -> Vec<SnapshotRow> {
    let mut rows: Vec<SnapshotRow> = all
        .iter()
        .filter(|s| s.namespace() == ns && s.spec.source.name == vm)
        .map(|s| {
            let st = s.status.clone().unwrap_or_default();
            let ready = st.ready_to_use == Some(true);
            let state = match st.phase.as_deref() {
                _ if ready => "Ready".to_string(),
                Some("Failed") => format!(
                    "Failed: {}",
                    st.error.and_then(|e| e.message).unwrap_or_default()
                ),
                _ => "In progress".to_string(),
            };
            let how = if st.indications.is_empty() && ready {
                "VM stopped".to_string()
            } else {
                st.indications
                    .iter()
                    .map(|i| match i.as_str() {
                        "Online" => "running",
                        "GuestAgent" => "filesystems frozen",
                        "NoGuestAgent" => "no guest agent (crash-consistent)",
                        "Paused" => "paused",
                        other => other,
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            SnapshotRow {
                name: s.name().to_string(),
                taken: st.creation_time.unwrap_or_default(),
                state,
                how,
                ready,
            }
        })
        .collect();
    rows.sort_by(|a, b| b.taken.cmp(&a.taken));
    rows
}

#[derive(Template)]
#[template(path = "vm_status.html")]
struct StatusTpl {
    st: StatusView,
}

/// An instance's `migrationState` as a person reads it.
fn migration_words(m: &kubevirt::MigrationState) -> String {
    let from = m.source_node.as_deref().unwrap_or("?");
    let to = m.target_node.as_deref().filter(|t| !t.is_empty());
    let to = to.unwrap_or("a node the scheduler picks");
    if m.failed {
        let why = m.failure_reason.as_deref().filter(|r| !r.is_empty());
        format!(
            "the move from {from} to {to} failed: {}",
            why.unwrap_or("no reason given")
        )
    } else if m.completed {
        let when = m.end_timestamp.as_deref().map(age);
        match when {
            Some(w) => format!("moved from {from} to {to} {w} ago"),
            None => format!("moved from {from} to {to}"),
        }
    } else if m.abort_requested {
        format!("cancelling the move from {from} to {to}")
    } else {
        format!("moving from {from} to {to}")
    }
}

/// The instance's NICs in words: which network each is on, its MAC and its addresses.
fn nic_lines(vmi: &VirtualMachineInstance) -> Vec<String> {
    vmi_status(vmi)
        .interfaces
        .iter()
        .map(|i| {
            let name = i.name.as_deref().unwrap_or("(in the guest)");
            let net = vmi
                .spec
                .networks
                .iter()
                .find(|n| Some(n.name.as_str()) == i.name.as_deref());
            let on = match net {
                Some(n) if n.pod.is_some() => "NAT".to_string(),
                Some(n) => n
                    .multus
                    .as_ref()
                    .map_or(String::new(), |m| format!("network {}", m.network_name)),
                None => String::new(),
            };
            let addrs = if i.ip_addresses.is_empty() {
                "no address yet".to_string()
            } else {
                i.ip_addresses.join(", ")
            };
            let mac = i.mac.as_deref().unwrap_or("?");
            if on.is_empty() {
                format!("{name}: {mac}, {addrs}")
            } else {
                format!("{name} ({on}): {mac}, {addrs}")
            }
        })
        .collect()
}

fn status_view(
    st: &VncState,
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
) -> StatusView {
    let key = (vm.namespace().to_string(), vm.name().to_string());
    let viewers = st.consoles.state(&key);
    let viewers = viewers["viewers"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| {
                    format!(
                        "{} ({}{})",
                        v["user"].as_str().unwrap_or(""),
                        v["kind"].as_str().unwrap_or(""),
                        if v["control"] == json!(true) && v["kind"] == "vnc" {
                            ", in control"
                        } else {
                            ""
                        }
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let status = vmi.map(vmi_status);
    let why_not = status.and_then(|s| {
        kubevirt::condition(&s.conditions, &ConditionType::PodScheduled)
            .filter(|c| c.reason.as_deref() == Some("Unschedulable"))
            .and_then(|c| c.message.clone())
    });
    StatusView {
        why_not,
        migration: status
            .and_then(|s| s.migration_state.as_ref())
            .map(migration_words),
        actions: crate::rules::actions::allowed(&or_dash(printable_status(vm))),
        status: or_dash(printable_status(vm)),
        phase: status
            .map(|s| or_dash(s.phase.as_ref().map_or("", Phase::as_str)))
            .unwrap_or("-".into()),
        node: status
            .map(|s| or_dash(s.node_name.as_deref().unwrap_or_default()))
            .unwrap_or("-".into()),
        ip: vmi.map(vmi_ip).map(|x| or_dash(&x)).unwrap_or("-".into()),
        nics: vmi.map(nic_lines).unwrap_or_default(),
        ready: status
            .and_then(|s| condition_status(&s.conditions, ConditionType::Ready))
            .unwrap_or("-".into()),
        live_migratable: status
            .and_then(|s| kubevirt::condition(&s.conditions, &ConditionType::LiveMigratable))
            .map(|c| match c.reason.as_deref() {
                Some(r) if !r.is_empty() => format!("{} ({r})", c.status),
                _ => c.status.to_string(),
            })
            .unwrap_or("-".into()),
        guest_os: status
            .map(|s| {
                let g = s.guest_os_info.clone().unwrap_or_default();
                let pretty = g.pretty_name.or(g.name).unwrap_or_default();
                let kernel = g.kernel_release.unwrap_or_default();
                or_dash(format!("{pretty} {kernel}").trim())
            })
            .unwrap_or("-".into()),
        users: or_dash(
            &status
                .and_then(|s| s.guest_agent_info.as_ref())
                .map(|g| {
                    g.user_list
                        .iter()
                        .map(|u| match &u.domain {
                            Some(d) if !d.is_empty() => format!("{d}\\{}", u.user_name),
                            _ => u.user_name.clone(),
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default(),
        ),
        filesystems: status
            .and_then(|s| s.guest_agent_info.as_ref()?.fs_info.as_ref())
            .map(|fs| {
                fs.disks
                    .iter()
                    .map(|d| {
                        format!(
                            "{} ({}, {}): {} of {}",
                            d.mount_point,
                            d.file_system_type,
                            d.disk_name,
                            super::human_bytes(d.used_bytes),
                            super::human_bytes(d.total_bytes)
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        viewers: or_dash(&viewers),
        conditions: status
            .map(|s| {
                s.conditions
                    .iter()
                    .map(|c| {
                        (
                            c.type_.to_string(),
                            c.status.to_string(),
                            c.reason.clone().unwrap_or_default(),
                            c.message.clone().unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The kind of a volume's source, as its field is named (`containerDisk`, ...).
fn volume_source(v: &Volume) -> &'static str {
    // In the order of the field names, as the page listed them when it read JSON.
    if v.cloud_init_no_cloud.is_some() {
        "cloudInitNoCloud"
    } else if v.container_disk.is_some() {
        "containerDisk"
    } else if v.data_volume.is_some() {
        "dataVolume"
    } else if v.persistent_volume_claim.is_some() {
        "persistentVolumeClaim"
    } else if v.empty_disk.is_some() {
        "emptyDisk"
    } else {
        ""
    }
}

fn spec_view(vm: &VirtualMachine) -> SpecView {
    let t = &vm.spec.template.spec;
    let cpu = t.domain.cpu.clone().unwrap_or_default();
    let n = |x: Option<u32>| u64::from(x.unwrap_or(1));
    let memory = t.domain.memory.as_ref().and_then(|m| m.guest.as_deref());
    let requested = t
        .domain
        .resources
        .as_ref()
        .and_then(|r| r.requests.get("memory"))
        .map(String::as_str);
    SpecView {
        run_strategy: match (vm.spec.run_strategy, vm.spec.running) {
            // The variants are named as the API spells them.
            (Some(s), _) => format!("{s:?}"),
            (None, Some(r)) => format!("running: {r}"),
            (None, None) => "-".into(),
        },
        cpus: (n(cpu.cores) * n(cpu.sockets) * n(cpu.threads)).to_string(),
        // In units a reader takes in at once (512 MiB, 1.5 GiB), not Kubernetes' 512Mi.
        memory: match memory.or(requested) {
            Some(q) => crate::types::parse_quantity(q)
                .map(super::human_bytes)
                .unwrap_or_else(|_| q.to_string()),
            None => "-".into(),
        },
        firmware: {
            let fw = t.domain.firmware.clone().unwrap_or_default();
            let efi = fw.bootloader.as_ref().and_then(|b| b.efi.as_ref());
            match (&fw.kernel_boot, efi) {
                (Some(_), _) => "direct kernel boot".into(),
                (None, Some(e)) if e.secure() => "UEFI, Secure Boot".into(),
                (None, Some(_)) => "UEFI".into(),
                (None, None) => "BIOS".into(),
            }
        },
        tpm: match &t.domain.devices.tpm {
            Some(tpm) if kubevirt::TpmDevice::on(&t.domain.devices.tpm) => {
                if tpm.persistent == Some(true) {
                    "TPM 2.0, state kept".into()
                } else {
                    "TPM 2.0".into()
                }
            }
            _ => "-".into(),
        },
        disks: disk_rows(t),
        networks: or_dash(
            &t.networks
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        labels: or_dash(&labels_text(vm)),
    }
}

/// The VM's disks and CD drives as the hardware list shows them, in the order of its
/// `disks`, then volumes without a disk entry (KubeVirt gives each a virtio disk).
fn disk_rows(t: &kubevirt::VirtualMachineInstanceSpec) -> Vec<DiskRow> {
    let source = |v: Option<&Volume>| -> String {
        let Some(v) = v else { return "-".into() };
        if let Some(c) = &v.container_disk {
            format!("image {}", c.image)
        } else if let Some(d) = &v.data_volume {
            format!("DataVolume {}", d.name)
        } else if let Some(c) = &v.persistent_volume_claim {
            format!("claim {}", c.claim_name)
        } else if v.cloud_init_no_cloud.is_some() || v.cloud_init_config_drive.is_some() {
            "cloud-init".into()
        } else {
            volume_source(v).to_string()
        }
    };
    let mut rows: Vec<DiskRow> = t
        .domain
        .devices
        .disks
        .iter()
        .map(|d| {
            let (device, target) = match (&d.disk, &d.cdrom) {
                (_, Some(c)) => ("cdrom", Some(c)),
                (t, None) => ("disk", t.as_ref()),
            };
            let bus = target
                .and_then(|t| t.bus.clone())
                .unwrap_or_else(|| if device == "cdrom" { "sata" } else { "virtio" }.into());
            DiskRow {
                name: d.name.clone(),
                device,
                bus,
                boot_order: d.boot_order.map(|b| b.to_string()).unwrap_or("-".into()),
                source: source(t.volumes.iter().find(|v| v.name == d.name)),
                removable: device == "cdrom",
                grows: None,
                hotplugged: t
                    .volumes
                    .iter()
                    .any(|v| v.name == d.name && v.hotpluggable()),
            }
        })
        .collect();
    for v in &t.volumes {
        if !rows.iter().any(|r| r.name == v.name) && !t.domain.devices.is_filesystem(&v.name) {
            rows.push(DiskRow {
                name: v.name.clone(),
                device: "disk",
                bus: "virtio".into(),
                boot_order: "-".into(),
                source: source(Some(v)),
                removable: false,
                grows: None,
                hotplugged: false,
            });
        }
    }
    rows
}

/// Each disk on a DataVolume (in the VM's namespace), with the DataVolume's size in the
/// source column and the size the page offers to grow from.
fn with_sizes(
    spec: &mut SpecView,
    vm: &VirtualMachine,
    ns: &str,
    dvs: &[crate::types::cdi::DataVolume],
) {
    let volumes = &vm.spec.template.spec.volumes;
    for row in &mut spec.disks {
        let Some(name) = volumes
            .iter()
            .find(|v| v.name == row.name)
            .and_then(|v| v.data_volume.as_ref())
            .map(|d| d.name.as_str())
        else {
            continue;
        };
        let Some(size) = dvs
            .iter()
            .find(|d| d.namespace() == ns && d.name() == name)
            .and_then(|d| d.spec.size())
        else {
            continue;
        };
        row.source = format!("{}, {}", row.source, super::human_bytes(size));
        if row.device == "disk" {
            row.grows = Some((name.to_string(), size.div_ceil(1 << 30)));
        }
    }
}

/// `?done=ACTION` after an action the API accepted.
#[derive(serde::Deserialize)]
pub struct DoneQuery {
    #[serde(default)]
    done: Option<String>,
}

/// What the VM page says after an action was accepted (none for an unknown one: nothing
/// from the query string is echoed).
fn done_notice(action: &str, name: &str) -> Option<String> {
    let what = match action {
        "start" => "Start",
        "stop" => "Stop",
        "restart" => "Restart",
        "pause" => "Pause",
        "unpause" => "Unpause",
        "softreboot" => "Soft reboot",
        "migrate" => "Migration",
        "eject" => {
            return Some(format!(
                "The CD drive was taken out of {name}; a running VM keeps it until it restarts."
            ));
        }
        "adddisk" => {
            return Some(format!(
                "A new disk was added to {name}; the running guest sees it within seconds, \
                 and the VM keeps it."
            ));
        }
        "detach" => {
            return Some(format!("The disk was taken out of {name} and its guest."));
        }
        "snapshot" => {
            return Some(format!(
                "A snapshot of {name} is being taken; it is listed under Snapshots."
            ));
        }
        "restore" => {
            return Some(format!(
                "{name} is being put back to the snapshot: stopped if it ran, its disks \
                 restored, then started as it was."
            ));
        }
        "deletesnapshot" => {
            return Some("The snapshot is deleted; its copies go within seconds.".to_string());
        }
        "backup" => {
            return Some(format!(
                "A backup of {name} is being taken; it is listed under Backups with its progress."
            ));
        }
        "verifybackup" => {
            return Some(
                "The node that holds the backup re-reads it and its parents against their \
                 manifests; the answer shows under Backups (reload)."
                    .to_string(),
            );
        }
        "restored" => {
            return Some(format!(
                "{name} is being restored from a backup: the node that holds it verifies the \
                 backup and reads its disks out (the DataVolumes show the progress), then {name} \
                 starts."
            ));
        }
        "deletebackup" => {
            return Some(
                "The backup is deleted; its folder goes within seconds (the backups built on it \
                 keep what they need)."
                    .to_string(),
            );
        }
        "grow" => {
            return Some(format!(
                "The disk of {name} grows; a running guest sees the new size within seconds \
                 (then grow its partition and filesystem)."
            ));
        }
        _ => return None,
    };
    Some(format!(
        "{what} of {name} accepted; the status below follows it."
    ))
}

pub async fn vm_detail(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<DoneQuery>,
) -> Response {
    let (raw, vm, vmi) = match load_vm(&st, &ns, &name).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut changes = vec![];
    let uid = raw["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for kind in [Kind::VirtualMachine, Kind::VirtualMachineInstance] {
        // One more than shown: the oldest shown change is compared with it.
        if let Ok(h) = st.store.object_history(kind, &ns, &name, &uid, 16).await {
            let mut rows = super::history::rows(kind, &h);
            rows.truncate(15);
            changes.extend(rows);
        }
    }
    changes.sort_by_key(|e| std::cmp::Reverse(e.rv));
    changes.truncate(20);
    let events = super::monitoring::vm_events(&st, &ns, &name).await;
    // The YAML is the VM as stored, fields this release does not model included.
    let mut clean = raw;
    if let Some(m) = clean.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    let here = vmi.as_ref().and_then(|i| i.node_name()).unwrap_or_default();
    let targets = st
        .store
        .all::<crate::types::edgevirt::Node>()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|n| crate::rules::node::node_ready(n) && !n.spec.unschedulable && n.name() != here)
        .map(|n| n.name().to_string())
        .collect();
    let snapshots = snapshot_rows(
        &st.store
            .all::<crate::types::snapshot::VirtualMachineSnapshot>()
            .await
            .unwrap_or_default(),
        &ns,
        &name,
    );
    let backups = backup_rows(
        &st.store
            .all::<crate::types::backup::VirtualMachineBackup>()
            .await
            .unwrap_or_default(),
        |b: &crate::types::backup::VirtualMachineBackup| {
            b.namespace() == ns && b.spec.source.name == name
        },
    );
    let mut backup_targets: Vec<String> = st
        .store
        .all::<crate::types::edgevirt::Node>()
        .await
        .unwrap_or_default()
        .into_iter()
        .flat_map(|n| n.status.map(|s| s.backup_targets).unwrap_or_default())
        .map(|t| t.name)
        .collect();
    backup_targets.sort();
    backup_targets.dedup();
    render(&DetailTpl {
        targets,
        snapshots,
        backups,
        backup_targets,
        c: Chrome {
            notice: q.done.as_deref().and_then(|a| done_notice(a, &name)),
            ..Chrome::new(&u, name.clone())
        },
        st: status_view(&st, &vm, vmi.as_ref()),
        spec: {
            let mut spec = spec_view(&vm);
            let dvs = st
                .store
                .all::<crate::types::cdi::DataVolume>()
                .await
                .unwrap_or_default();
            with_sizes(&mut spec, &vm, &ns, &dvs);
            spec
        },
        changes,
        events,
        graphs_url: format!(
            "/ui/vms/{}/{}/graphs",
            super::url_encode(&ns),
            super::url_encode(&name)
        ),
        yaml: serde_yaml_ng::to_string(&clean).unwrap_or_default(),
        ns,
        name,
    })
}

pub async fn vm_status(State(st): S, Path((ns, name)): Path<(String, String)>) -> Response {
    match load_vm(&st, &ns, &name).await {
        Ok((_, vm, vmi)) => render(&StatusTpl {
            st: status_view(&st, &vm, vmi.as_ref()),
        }),
        Err(r) => r,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::Typed;

    fn vm(spec: Value) -> VirtualMachine {
        VirtualMachine::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "a", "namespace": "ns", "labels": {"b": "2", "a": "1"}},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn the_spec_shows_as_it_did_from_json() {
        let v = vm(json!({
            "runStrategy": "RerunOnFailure",
            "aFieldOfANewerRelease": true,
            "template": {"spec": {
                "domain": {"cpu": {"cores": 2, "threads": 2}, "devices": {},
                           "resources": {"requests": {"memory": "1Gi"}}},
                "volumes": [{"name": "root", "containerDisk": {"image": "img"}},
                            {"name": "ci", "cloudInitNoCloud": {"userData": "x"}},
                            {"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
                "networks": [{"name": "default", "pod": {}}, {"name": "second"}],
            }},
        }));
        let s = spec_view(&v);
        assert_eq!(s.run_strategy, "RerunOnFailure");
        assert_eq!(s.cpus, "4");
        assert_eq!(s.memory, "1 GiB", "in units a reader takes in");
        let disks: Vec<String> = s
            .disks
            .iter()
            .map(|d| format!("{} {} {} {}", d.name, d.device, d.bus, d.source))
            .collect();
        assert_eq!(
            disks,
            [
                "root disk virtio image img",
                "ci disk virtio cloud-init",
                "data disk virtio claim d"
            ]
        );
        assert_eq!((s.firmware.as_str(), s.tpm.as_str()), ("BIOS", "-"));
        assert_eq!(s.networks, "default, second");
        assert_eq!(s.labels, "a=1, b=2");

        let bare = spec_view(&vm(json!({"running": false, "template": {"spec": {
            "domain": {"memory": {"guest": "512Mi"}, "devices": {}}}}})));
        assert_eq!(bare.run_strategy, "running: false");
        assert_eq!(bare.cpus, "1");
        assert_eq!(bare.memory, "512 MiB");
        assert!(bare.disks.is_empty());
        assert_eq!(bare.networks, "-");
    }

    /// An install from ISOs: CD drives first, each removable, the disk after them; UEFI
    /// with Secure Boot and a TPM.
    #[test]
    fn the_hardware_list_shows_cd_drives_firmware_and_tpm() {
        let v = vm(json!({"runStrategy": "Always", "template": {"spec": {
            "domain": {"devices": {
                "disks": [{"name": "installer", "cdrom": {}, "bootOrder": 1},
                          {"name": "rootdisk", "disk": {"bus": "sata"}, "bootOrder": 2}],
                "tpm": {"persistent": true}},
                "firmware": {"bootloader": {"efi": {}}}},
            "volumes": [{"name": "installer", "containerDisk": {"image": "win11"}},
                        {"name": "rootdisk", "dataVolume": {"name": "win-rootdisk"}}],
        }}}));
        let s = spec_view(&v);
        let disks: Vec<_> = s
            .disks
            .iter()
            .map(|d| {
                (
                    d.device,
                    d.bus.as_str(),
                    d.boot_order.as_str(),
                    d.source.as_str(),
                    d.removable,
                )
            })
            .collect();
        assert_eq!(
            disks,
            [
                ("cdrom", "sata", "1", "image win11", true),
                ("disk", "sata", "2", "DataVolume win-rootdisk", false)
            ]
        );
        assert_eq!(s.firmware, "UEFI, Secure Boot");
        assert_eq!(s.tpm, "TPM 2.0, state kept");
    }
}
