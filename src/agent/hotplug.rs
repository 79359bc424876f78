//! Disks added to and taken from a running guest (KubeVirt's `addvolume` and
//! `removevolume`). The API puts a `hotpluggable` volume and its `scsi` disk into the
//! instance's spec (or takes them out); each sync round this node makes the domain's disks
//! match, and records each hotplugged volume's device in the instance's `volumeStatus`, so
//! that a migration's target renders the disk under the same name.

use std::collections::{BTreeMap, BTreeSet};

use crate::hypervisor::{DomainDisk, all_domain_disks};
use crate::types::kubevirt::{HotplugVolumeStatus, PersistentVolumeClaimInfo, VolumeStatus};
use crate::types::{Meta, VirtualMachineInstance};
use crate::virt::convert;

use super::Agent;

/// KubeVirt's phases and reasons for a hotplugged volume.
const READY: &str = "Ready";
const PENDING: &str = "Pending";
const DETACHING: &str = "Detaching";

/// Bring the domain `dom`'s hotplugged disks in line with the instance's spec; the volume
/// statuses of its hotplugged volumes afterwards, or `None` when the domain could not be
/// read (the statuses stay as they are).
pub async fn sync(
    agent: &Agent,
    vmi: &VirtualMachineInstance,
    dom: &str,
) -> Option<Vec<VolumeStatus>> {
    let spec = &vmi.spec;
    let wanted: Vec<_> = spec
        .volumes
        .iter()
        .filter(|v| v.hotpluggable() && spec.domain.devices.disks.iter().any(|d| d.name == v.name))
        .collect();
    let prior: BTreeMap<&str, &VolumeStatus> = vmi
        .status
        .iter()
        .flat_map(|s| &s.volume_status)
        .filter(|v| v.hotplug_volume.is_some())
        .map(|v| (v.name.as_str(), v))
        .collect();
    if wanted.is_empty() && prior.is_empty() {
        // Nothing hotplugged, nothing to add: the domain is not read every round.
        return Some(Vec::new());
    }
    let hv = agent.hv.clone();
    let d2 = dom.to_string();
    let live = match tokio::task::spawn_blocking(move || hv.xml(&d2)).await {
        Ok(Ok(xml)) => xml,
        _ => return None,
    };
    let disks = all_domain_disks(&live);
    let by_alias = |name: &str| {
        disks
            .iter()
            .find(|d| d.alias.strip_prefix("ua-") == Some(name))
    };
    let mut out = Vec::new();

    // Taken out of the spec: out of the domain.
    for (name, st) in &prior {
        if wanted.iter().any(|v| v.name == *name) {
            continue;
        }
        let Some(d) = by_alias(name) else { continue };
        match detach(agent, dom, d).await {
            Ok(()) => {
                tracing::info!(%dom, volume = %name, target = %d.target, "hotplugged disk removed")
            }
            Err(e) => {
                let message = format!("removing the disk failed: {e}");
                if st.message.as_deref() != Some(message.as_str()) {
                    tracing::warn!(%dom, volume = %name, %message);
                }
                out.push(status(name, &d.target, DETACHING, "DetachFailed", message));
            }
        }
    }

    // Put into the spec: into the domain.
    let mut used: BTreeSet<String> = disks.iter().map(|d| d.target.clone()).collect();
    let has_controller = live.contains("model='virtio-scsi'");
    let ns = match vmi.namespace() {
        "" => "default",
        ns => ns,
    };
    // Where each disk lives, which the migration rules read: a disk on the shared pool
    // needs no copy.
    let pool = agent.cfg.shared_pool.as_ref().map(|(_, p)| p.clone());
    let claim = |v: &crate::types::kubevirt::Volume, d: &DomainDisk| {
        let name = v.data_volume.as_ref().map(|d| d.name.clone()).or(v
            .persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.clone()))?;
        let shared = pool
            .as_ref()
            .is_some_and(|p| std::path::Path::new(&d.file).starts_with(p));
        Some(PersistentVolumeClaimInfo {
            claim_name: Some(name),
            access_modes: vec![
                if shared {
                    "ReadWriteMany"
                } else {
                    "ReadWriteOnce"
                }
                .into(),
            ],
        })
    };
    for v in wanted {
        if let Some(d) = by_alias(&v.name) {
            let msg = format!("attached as {}", d.target);
            out.push(VolumeStatus {
                persistent_volume_claim_info: claim(v, d),
                ..status(&v.name, &d.target, READY, "VolumeReady", msg)
            });
            continue;
        }
        let attached = if has_controller {
            attach(agent, dom, vmi, ns, &v.name, &mut used).await
        } else {
            Err(anyhow::anyhow!(
                "the domain has no virtio-scsi controller to add disks to (it was started by an \
                 earlier edgevirt, or with disableHotplug); restart the VM once"
            ))
        };
        match attached {
            Ok((target, file)) => {
                tracing::info!(%dom, volume = %v.name, %target, "disk hotplugged");
                let msg = format!("attached as {target}");
                let d = DomainDisk {
                    file,
                    ..Default::default()
                };
                out.push(VolumeStatus {
                    persistent_volume_claim_info: claim(v, &d),
                    ..status(&v.name, &target, READY, "VolumeReady", msg)
                });
            }
            Err(e) => {
                let message = format!("{e:#}");
                if prior
                    .get(v.name.as_str())
                    .and_then(|s| s.message.as_deref())
                    != Some(&message)
                {
                    tracing::warn!(%dom, volume = %v.name, %message, "hotplugging a disk failed");
                }
                out.push(status(&v.name, "", PENDING, "AttachFailed", message));
            }
        }
    }
    Some(out)
}

/// Attach volume `name` of the instance's spec as the first free `sd` device; that device
/// and the disk's file.
async fn attach(
    agent: &Agent,
    dom: &str,
    vmi: &VirtualMachineInstance,
    ns: &str,
    name: &str,
    used: &mut BTreeSet<String>,
) -> anyhow::Result<(String, String)> {
    let v = vmi
        .spec
        .volumes
        .iter()
        .find(|v| v.name == name)
        .ok_or_else(|| anyhow::anyhow!("volume {name:?} is not in the spec"))?;
    let resolved = super::prepare::hotplug_disk(agent, ns, v).await?;
    // Taken only once attached: a failed attach leaves the name to the next disk.
    let target =
        convert::next_target("sd", &mut used.clone()).map_err(|e| anyhow::anyhow!("{}", e.0))?;
    let xml = convert::hotplug_disk_xml(&vmi.spec, name, &resolved, &target)
        .map_err(|e| anyhow::anyhow!("{}", e.0))?;
    let (hv, d2) = (agent.hv.clone(), dom.to_string());
    tokio::task::spawn_blocking(move || hv.attach_device(&d2, &xml)).await??;
    used.insert(target.clone());
    Ok((target, resolved.path))
}

/// Detach one disk of the domain, named by its target.
async fn detach(agent: &Agent, dom: &str, d: &DomainDisk) -> anyhow::Result<()> {
    let xml = format!(
        "<disk type='file' device='disk'><source file='{}'/><target dev='{}' bus='scsi'/></disk>",
        quick_xml::escape::escape(d.file.as_str()),
        quick_xml::escape::escape(d.target.as_str()),
    );
    let (hv, d2) = (agent.hv.clone(), dom.to_string());
    tokio::task::spawn_blocking(move || hv.detach_device(&d2, &xml)).await??;
    Ok(())
}

fn status(name: &str, target: &str, phase: &str, reason: &str, message: String) -> VolumeStatus {
    VolumeStatus {
        name: name.to_string(),
        target: target.to_string(),
        phase: Some(phase.to_string()),
        reason: Some(reason.to_string()),
        message: Some(message),
        hotplug_volume: Some(HotplugVolumeStatus {}),
        ..Default::default()
    }
}

/// The instance's volume statuses with its hotplugged ones replaced by `hotplugged`: an
/// entry of the same name (the scheduler's, with its claim) takes the hotplug fields.
pub fn merge(list: &mut Vec<VolumeStatus>, hotplugged: Vec<VolumeStatus>) {
    list.retain(|v| v.hotplug_volume.is_none() || hotplugged.iter().any(|h| h.name == v.name));
    for h in hotplugged {
        match list.iter_mut().find(|v| v.name == h.name) {
            Some(v) => {
                v.target = h.target;
                v.phase = h.phase;
                v.reason = h.reason;
                v.message = h.message;
                v.hotplug_volume = h.hotplug_volume;
                if h.persistent_volume_claim_info.is_some() {
                    v.persistent_volume_claim_info = h.persistent_volume_claim_info;
                }
            }
            None => list.push(h),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hotplug_statuses_merge_into_the_schedulers_and_go_when_removed() {
        let claim = VolumeStatus {
            name: "data".into(),
            persistent_volume_claim_info: Some(Default::default()),
            ..Default::default()
        };
        let gone = status("old", "sdc", READY, "VolumeReady", "attached as sdc".into());
        let mut list = vec![claim, gone];
        merge(
            &mut list,
            vec![
                status(
                    "data",
                    "sdb",
                    READY,
                    "VolumeReady",
                    "attached as sdb".into(),
                ),
                status("new", "", PENDING, "AttachFailed", "no".into()),
            ],
        );
        let names: Vec<_> = list.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["data", "new"]);
        assert_eq!(list[0].target, "sdb");
        assert!(list[0].persistent_volume_claim_info.is_some());
        assert!(list[0].hotplug_volume.is_some());
        assert_eq!(list[1].phase.as_deref(), Some(PENDING));
    }
}
