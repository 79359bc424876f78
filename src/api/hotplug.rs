//! KubeVirt's `addvolume` and `removevolume` subresources: a disk added to a running guest
//! or taken from it. On a VirtualMachine the change is persistent (the VM's template gets
//! it too, so the next start has the disk); on a VirtualMachineInstance it lasts as long as
//! the instance. Either way the instance's spec changes here and its node attaches or
//! detaches the disk (`agent::hotplug`), reporting it in the instance's `volumeStatus`.

use serde::Deserialize;
use serde_json::Value;

use crate::http::error::{ApiError, ApiResult};
use crate::store::Store;
use crate::types::cdi::{DataVolume, NODE_ANNOTATION};
use crate::types::kubevirt::{
    DataVolumeSource, Disk, PersistentVolumeClaimSource, Phase, VirtualMachineInstanceSpec, Volume,
};
use crate::types::{Meta, VirtualMachine, VirtualMachineInstance, check_name, decode};
use crate::virt::convert;

/// KubeVirt's `AddVolumeOptions`.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddVolumeOptions {
    name: String,
    /// Checked field by field when the request runs (a `Disk`).
    #[serde(default)]
    disk: Option<Value>,
    volume_source: HotplugVolumeSource,
    #[serde(default)]
    dry_run: Vec<String>,
}

/// KubeVirt's `HotplugVolumeSource`: a DataVolume or a claim.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HotplugVolumeSource {
    #[serde(default)]
    data_volume: Option<DataVolumeSource>,
    #[serde(default)]
    persistent_volume_claim: Option<PersistentVolumeClaimSource>,
}

/// KubeVirt's `RemoveVolumeOptions`.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemoveVolumeOptions {
    name: String,
    #[serde(default)]
    dry_run: Vec<String>,
}

fn parse<T: for<'de> Deserialize<'de>>(what: &str, body: &[u8]) -> ApiResult<T> {
    if body.is_empty() {
        return Err(ApiError::bad_request(format!(
            "{what} needs a body (KubeVirt's {what})"
        )));
    }
    let o: T = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid {what}: {e}")))?;
    Ok(o)
}

pub fn parse_add(body: &[u8]) -> ApiResult<AddVolumeOptions> {
    let o: AddVolumeOptions = parse("AddVolumeOptions", body)?;
    check_name("name", &o.name)?;
    Ok(o)
}

pub fn parse_remove(body: &[u8]) -> ApiResult<RemoveVolumeOptions> {
    let o: RemoveVolumeOptions = parse("RemoveVolumeOptions", body)?;
    check_name("name", &o.name)?;
    Ok(o)
}

/// The disk and volume an `addvolume` request adds: a `scsi` disk (the bus virtio-scsi
/// hotplugs on) presenting a `hotpluggable` volume.
fn disk_and_volume(o: &AddVolumeOptions) -> ApiResult<(Disk, Volume)> {
    let name = &o.name;
    let mut disk: Disk = match &o.disk {
        None => Disk::default(),
        Some(v) => {
            let mut v = v.clone();
            if let Some(m) = v.as_object_mut() {
                m.entry("name")
                    .or_insert_with(|| Value::String(name.clone()));
            }
            decode("Disk", v).map_err(|mut e| {
                for f in &mut e.errors {
                    f.field = f.field.replacen("spec", "spec.disk", 1);
                }
                e.kind = "AddVolumeOptions".into();
                ApiError::invalid(e.to_string())
            })?
        }
    };
    if disk.name.is_empty() {
        disk.name = name.clone();
    } else if &disk.name != name {
        return Err(ApiError::invalid(format!(
            "disk.name {:?} must be the volume's name {name:?}",
            disk.name
        )));
    }
    if disk.cdrom.is_some() {
        return Err(ApiError::invalid(
            "only a disk can be hotplugged (not a cdrom): use disk: {bus: scsi}",
        ));
    }
    let mut target = disk.disk.clone().unwrap_or_default();
    match target.bus.as_deref() {
        None | Some("scsi") => target.bus = Some("scsi".into()),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "disk.disk.bus {other:?}: a hotplugged disk goes on the scsi bus (virtio-scsi)"
            )));
        }
    }
    disk.disk = Some(target);
    if disk.boot_order.is_some() {
        return Err(ApiError::invalid(
            "disk.bootOrder: a hotplugged disk cannot be booted from",
        ));
    }
    let src = &o.volume_source;
    let volume = match (&src.data_volume, &src.persistent_volume_claim) {
        (Some(dv), None) => {
            check_name("volumeSource.dataVolume.name", &dv.name)?;
            Volume {
                name: name.clone(),
                data_volume: Some(DataVolumeSource {
                    name: dv.name.clone(),
                    hotpluggable: Some(true),
                }),
                ..Default::default()
            }
        }
        (None, Some(c)) => {
            check_name(
                "volumeSource.persistentVolumeClaim.claimName",
                &c.claim_name,
            )?;
            Volume {
                name: name.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimSource {
                    hotpluggable: Some(true),
                    ..c.clone()
                }),
                ..Default::default()
            }
        }
        _ => {
            return Err(ApiError::invalid(
                "volumeSource needs exactly one of dataVolume and persistentVolumeClaim",
            ));
        }
    };
    Ok((disk, volume))
}

/// The instance a hotplug request acts on, which must run and not be migrating.
async fn running_instance(
    store: &Store,
    ns: &str,
    name: &str,
    vmi_only: bool,
) -> ApiResult<VirtualMachineInstance> {
    let what = if vmi_only {
        "VirtualMachineInstance"
    } else {
        "VM"
    };
    let Some(vmi) = store.get_typed::<VirtualMachineInstance>(ns, name).await? else {
        return Err(if vmi_only {
            ApiError::not_found(format!("VirtualMachineInstance {name:?} does not exist"))
        } else {
            ApiError::conflict(format!(
                "VM {name:?} is not running: a disk is hotplugged into a running guest; add it \
                 to spec.template.spec (disks and volumes) instead"
            ))
        });
    };
    if vmi.phase() != Phase::Running {
        return Err(ApiError::conflict(format!(
            "{what} {name:?} is not running (phase {}): a disk is hotplugged into a running \
             guest",
            vmi.status
                .as_ref()
                .and_then(|s| s.phase.as_ref())
                .map_or("unknown", |p| p.as_str())
        )));
    }
    if vmi.migrating() {
        return Err(ApiError::conflict(format!(
            "{what} {name:?} is migrating; try again when the migration is over"
        )));
    }
    Ok(vmi)
}

/// `addvolume`: checks, then the instance (and, for a VM, its template) gets the disk.
pub async fn add(
    store: &Store,
    ns: &str,
    name: &str,
    vmi_only: bool,
    o: AddVolumeOptions,
) -> ApiResult<()> {
    let vm = if vmi_only {
        None
    } else {
        Some(
            store
                .get_typed::<VirtualMachine>(ns, name)
                .await?
                .ok_or_else(|| ApiError::not_found(format!("VM {name:?} does not exist")))?,
        )
    };
    let vmi = running_instance(store, ns, name, vmi_only).await?;
    if vmi.spec.domain.devices.disable_hotplug == Some(true) {
        return Err(ApiError::conflict(format!(
            "{name:?} has devices.disableHotplug: nothing can be hotplugged into it"
        )));
    }
    let (disk, volume) = disk_and_volume(&o)?;
    let taken = |spec: &VirtualMachineInstanceSpec| {
        spec.volumes.iter().any(|v| v.name == o.name)
            || spec.domain.devices.disks.iter().any(|d| d.name == o.name)
    };
    if taken(&vmi.spec) || vm.as_ref().is_some_and(|vm| taken(&vm.spec.template.spec)) {
        return Err(ApiError::conflict(format!(
            "{name:?} already has a volume or disk named {:?}",
            o.name
        )));
    }
    let node = vmi.node_name().unwrap_or_default().to_string();
    if let Some(dv) = &volume.data_volume {
        let Some(found) = store.get_typed::<DataVolume>(ns, &dv.name).await? else {
            return Err(ApiError::invalid(format!(
                "volumeSource.dataVolume: DataVolume {:?} does not exist in {ns:?}",
                dv.name
            )));
        };
        // A disk on another node's own storage cannot reach this guest.
        if found.spec.shared_pool().is_none()
            && let Some(other) = found.annotation(NODE_ANNOTATION)
            && other != node
        {
            return Err(ApiError::conflict(format!(
                "DataVolume {:?} lives on node {other}, and {name:?} runs on {node}",
                dv.name
            )));
        }
        if vmi
            .spec
            .volumes
            .iter()
            .any(|v| v.data_volume.as_ref().is_some_and(|d| d.name == dv.name))
        {
            return Err(ApiError::conflict(format!(
                "{name:?} already uses DataVolume {:?}",
                dv.name
            )));
        }
    }
    if let Some(c) = &volume.persistent_volume_claim
        && vmi.spec.volumes.iter().any(|v| {
            v.persistent_volume_claim
                .as_ref()
                .is_some_and(|p| p.claim_name == c.claim_name)
        })
    {
        return Err(ApiError::conflict(format!(
            "{name:?} already uses claim {:?}",
            c.claim_name
        )));
    }
    let mut probe = vmi.spec.clone();
    probe.domain.devices.disks.push(disk.clone());
    probe.volumes.push(volume.clone());
    convert::validate(&probe).map_err(|e| ApiError::invalid(e.0))?;
    if !o.dry_run.is_empty() {
        return Ok(());
    }
    // Where its disk lives, as the scheduler records it for the others: the migration
    // rules read it (a disk on the shared pool needs no copy).
    let probe_vmi = VirtualMachineInstance {
        spec: probe,
        ..vmi.clone()
    };
    let places = crate::controller::datavolume::used_by(store, &probe_vmi).await?;
    let claim = crate::controller::datavolume::volume_status(&probe_vmi, &places)
        .into_iter()
        .find(|s| s.name == o.name);
    let (d2, v2) = (disk.clone(), volume.clone());
    let updated = store
        .update_typed(ns, name, move |i: &mut VirtualMachineInstance| {
            if taken(&i.spec) {
                // Another addvolume of the same name won the race.
                return Err(crate::store::Error::Conflict);
            }
            i.spec.domain.devices.disks.push(d2.clone());
            i.spec.volumes.push(v2.clone());
            let st = i.status.get_or_insert_default();
            st.volume_status.retain(|s| s.name != v2.name);
            st.volume_status.extend(claim.clone());
            Ok(())
        })
        .await?;
    // A DataVolume no instance used yet goes to this guest's node, as its first consumer.
    crate::controller::datavolume::bind(store, &updated, &node).await?;
    if vm.is_some() {
        store
            .update_typed(ns, name, move |vm: &mut VirtualMachine| {
                let t = &mut vm.spec.template.spec;
                if !taken(t) {
                    t.domain.devices.disks.push(disk.clone());
                    t.volumes.push(volume.clone());
                }
                Ok(())
            })
            .await?;
    }
    tracing::info!(namespace = %ns, vm = %name, volume = %o.name, persistent = !vmi_only, "volume added");
    Ok(())
}

/// `removevolume`: only a hotplugged volume goes (never one the VM was defined with, such as
/// the disk it booted from).
pub async fn remove(
    store: &Store,
    ns: &str,
    name: &str,
    vmi_only: bool,
    o: RemoveVolumeOptions,
) -> ApiResult<()> {
    if !vmi_only && store.get_typed::<VirtualMachine>(ns, name).await?.is_none() {
        return Err(ApiError::not_found(format!("VM {name:?} does not exist")));
    }
    let vmi = running_instance(store, ns, name, vmi_only).await?;
    let Some(v) = vmi.spec.volumes.iter().find(|v| v.name == o.name) else {
        return Err(ApiError::not_found(format!(
            "{name:?} has no volume {:?}",
            o.name
        )));
    };
    if !v.hotpluggable() {
        return Err(ApiError::invalid(format!(
            "volume {:?} was not hotplugged: it is part of the VM's definition (the disk it \
             may boot from); take it out of the VM's spec and restart instead",
            o.name
        )));
    }
    if !o.dry_run.is_empty() {
        return Ok(());
    }
    let gone = o.name.clone();
    let drop_it = move |spec: &mut VirtualMachineInstanceSpec| {
        spec.domain.devices.disks.retain(|d| d.name != gone);
        spec.volumes.retain(|v| v.name != gone || !v.hotpluggable());
    };
    let d2 = drop_it.clone();
    let gone = o.name.clone();
    store
        .update_typed(ns, name, move |i: &mut VirtualMachineInstance| {
            d2(&mut i.spec);
            // Its entry goes with it once the node detached it; one it never marked, now.
            if let Some(st) = i.status.as_mut() {
                st.volume_status
                    .retain(|s| s.name != gone || s.hotplug_volume.is_some());
            }
            Ok(())
        })
        .await?;
    if !vmi_only {
        store
            .update_typed(ns, name, move |vm: &mut VirtualMachine| {
                let t = &mut vm.spec.template.spec;
                if t.volumes
                    .iter()
                    .any(|v| v.name == o.name && v.hotpluggable())
                {
                    drop_it(t);
                }
                Ok(())
            })
            .await?;
    }
    tracing::info!(namespace = %ns, vm = %name, persistent = !vmi_only, "volume removed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(body: &str) -> ApiResult<(Disk, Volume)> {
        disk_and_volume(&parse_add(body.as_bytes())?)
    }

    #[test]
    fn an_added_volume_is_a_hotpluggable_scsi_disk() {
        let (d, v) =
            add(r#"{"name":"data","volumeSource":{"dataVolume":{"name":"dv1"}}}"#).unwrap();
        assert_eq!(d.name, "data");
        assert_eq!(d.disk.unwrap().bus.as_deref(), Some("scsi"));
        assert!(v.hotpluggable());
        assert_eq!(v.data_volume.unwrap().name, "dv1");
        let (_, v) = add(
            r#"{"name":"c","disk":{"name":"c","disk":{"bus":"scsi"},"serial":"x1"},
                "volumeSource":{"persistentVolumeClaim":{"claimName":"pvc","readOnly":true}}}"#,
        )
        .unwrap();
        assert!(v.hotpluggable());
        assert_eq!(v.persistent_volume_claim.unwrap().read_only, Some(true));
    }

    #[test]
    fn bad_hotplug_requests_say_what_is_wrong() {
        let cases = [
            (r#"{"volumeSource":{}}"#, "missing field `name`"),
            (r#"{"name":"Bad_Name","volumeSource":{}}"#, "name"),
            (
                r#"{"name":"a","volumeSource":{},"extra":1}"#,
                "unknown field `extra`",
            ),
            (r#"{"name":"a","volumeSource":{}}"#, "exactly one"),
            (
                r#"{"name":"a","volumeSource":{"dataVolume":{"name":"x"},"persistentVolumeClaim":{"claimName":"y"}}}"#,
                "exactly one",
            ),
            (
                r#"{"name":"a","disk":{"disk":{"bus":"virtio"}},"volumeSource":{"dataVolume":{"name":"x"}}}"#,
                "scsi bus",
            ),
            (
                r#"{"name":"a","disk":{"cdrom":{}},"volumeSource":{"dataVolume":{"name":"x"}}}"#,
                "only a disk",
            ),
            (
                r#"{"name":"a","disk":{"name":"b"},"volumeSource":{"dataVolume":{"name":"x"}}}"#,
                "must be the volume's name",
            ),
            (
                r#"{"name":"a","disk":{"bootOrder":1},"volumeSource":{"dataVolume":{"name":"x"}}}"#,
                "booted from",
            ),
            (
                r#"{"name":"a","disk":{"bogus":1},"volumeSource":{"dataVolume":{"name":"x"}}}"#,
                "disk.bogus",
            ),
        ];
        for (body, want) in cases {
            let e = add(body).expect_err(body);
            assert!(e.message.contains(want), "{body}: {}", e.message);
        }
        assert!(parse_remove(b"").is_err());
        assert!(parse_remove(br#"{"name":"x","dryRun":["All"]}"#).is_ok());
    }
}
