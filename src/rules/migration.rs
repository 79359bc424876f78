//! Live-migratability and the migration's phase list: what the controller checks before it
//! schedules a migration, what the agent reports as the VMI's LiveMigratable condition, and
//! how both sides move a migration's phase.

use crate::types::Meta;
use crate::types::annotations::BLOCK_MIGRATION_ANNOTATION;
use crate::types::kubevirt::{
    MigrationMethod, MigrationPhase, PhaseTransition, VirtualMachineInstance,
    VirtualMachineInstanceMigration, VirtualMachineInstanceMigrationStatus, Volume,
};
use crate::types::now;

/// Whether an instance can live-migrate, as KubeVirt's `calculateLiveMigrationCondition`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migratability {
    pub ok: bool,
    /// KubeVirt's reason: `DisksNotLiveMigratable`, `InterfaceNotLiveMigratable`, ...
    pub reason: String,
    pub message: String,
    /// `LiveMigration` (nothing to copy) or `BlockMigration` (local disks are copied).
    pub method: MigrationMethod,
}

/// Compute the LiveMigratable condition from the instance's spec, as KubeVirt's
/// `calculateLiveMigrationCondition`. `persistentVolumeClaim` disks, and DataVolumes whose
/// `volumeStatus` the scheduler wrote as ReadWriteMany, live on the shared storage pool:
/// the target opens the same files. Disks built from images (`containerDisk`, DataVolumes
/// on the `local` class) are copies on the node's local disk: they
/// move only by block migration, which copies them while the guest runs. KubeVirt
/// block-migrates such disks unasked; edgevirt copies them only when asked (the copy takes
/// as long as the disk is big, and the link may be a branch office's): the annotation
/// `edgevirt.io/block-migration: "true"` on the VMI makes it LiveMigratable with method
/// BlockMigration, and the same annotation on one migration asks for it once (see
/// [`migration_method`]). An instance with both kinds cannot be block-migrated: libvirt
/// would copy its shared disks onto themselves. NoCloud disks are made anew on the target.
/// edgevirt has no disk hotplug yet, so HotplugNotLiveMigratable does not arise.
pub fn live_migratable(vmi: &VirtualMachineInstance) -> Migratability {
    let block = vmi.annotation(BLOCK_MIGRATION_ANNOTATION) == Some("true");
    // As KubeVirt: a bridge on the pod network cannot move; one on a multus network's host
    // bridge can (the target has the same bridge, which the scheduler checks).
    let on_pod = |name: &str| {
        vmi.spec
            .networks
            .iter()
            .any(|n| n.name == name && n.pod.is_some())
    };
    for i in &vmi.spec.domain.devices.interfaces {
        if i.bridge.is_some() && on_pod(&i.name) {
            return Migratability {
                ok: false,
                reason: "InterfaceNotLiveMigratable".into(),
                message: format!(
                    "cannot migrate VMI which does not use masquerade to connect to the pod \
                     network (interface {})",
                    i.name
                ),
                method: MigrationMethod::LiveMigration,
            };
        }
    }
    if vmi
        .spec
        .domain
        .cpu
        .as_ref()
        .is_some_and(|c| c.dedicated_cpu_placement == Some(true))
    {
        return Migratability {
            ok: false,
            reason: "DedicatedCPUsNotLiveMigratable".into(),
            message: "cannot migrate VMI with dedicated CPUs: they are held on this node \
                      (not supported yet)"
                .into(),
            method: MigrationMethod::LiveMigration,
        };
    }
    if let Some(f) = vmi.spec.domain.devices.filesystems.first() {
        return Migratability {
            ok: false,
            reason: "VirtIOFSNotLiveMigratable".into(),
            message: format!(
                "cannot migrate VMI: filesystem {} is shared over virtiofs, whose state \
                 libvirt cannot move (not supported yet)",
                f.name
            ),
            method: MigrationMethod::LiveMigration,
        };
    }
    let (local, shared) = (local_disks(vmi), shared_disks(vmi));
    if local.is_empty() {
        return Migratability {
            ok: true,
            reason: String::new(),
            message: String::new(),
            method: MigrationMethod::LiveMigration,
        };
    }
    if !shared.is_empty() {
        return Migratability {
            ok: false,
            reason: "DisksNotLiveMigratable".into(),
            message: format!(
                "cannot migrate VMI: disks {} are on this node's local storage and disks {} on \
                 the shared pool; a block migration would copy the shared ones onto \
                 themselves, so move the local disks to the shared pool \
                 (persistentVolumeClaim) first",
                local.join(", "),
                shared.join(", ")
            ),
            method: MigrationMethod::LiveMigration,
        };
    }
    if block {
        return Migratability {
            ok: true,
            reason: String::new(),
            message: format!(
                "local disks {} are copied (block migration)",
                local.join(", ")
            ),
            method: MigrationMethod::BlockMigration,
        };
    }
    Migratability {
        ok: false,
        reason: "DisksNotLiveMigratable".into(),
        message: format!(
            "cannot migrate VMI: disks {} are on this node's local storage, not shared; \
             ask for block migration to copy them (edgevirt vm migrate --block, or the \
             annotation {BLOCK_MIGRATION_ANNOTATION}: \"true\" on the migration), or put \
             them on the shared pool (persistentVolumeClaim)",
            local.join(", ")
        ),
        method: MigrationMethod::LiveMigration,
    }
}

/// Names of the volumes of a VMI that `is` picks.
fn volumes_with(vmi: &VirtualMachineInstance, is: fn(&Volume) -> bool) -> Vec<String> {
    vmi.spec
        .volumes
        .iter()
        .filter(|v| is(v))
        .map(|v| v.name.clone())
        .collect()
}

/// Whether the volume `name` is a claim the scheduler found ReadWriteMany (a DataVolume on
/// the shared pool), as its `volumeStatus` says.
fn read_write_many(vmi: &VirtualMachineInstance, name: &str) -> bool {
    vmi.status.as_ref().is_some_and(|st| {
        st.volume_status.iter().any(|s| {
            s.name == name
                && s.persistent_volume_claim_info
                    .as_ref()
                    .is_some_and(|c| c.access_modes.iter().any(|m| m == "ReadWriteMany"))
        })
    })
}

/// Volumes copied onto the node's local disk from images, and DataVolumes on local storage.
fn local_disks(vmi: &VirtualMachineInstance) -> Vec<String> {
    let mut out = volumes_with(vmi, |v| {
        v.container_disk.is_some()
            || v.empty_disk.is_some()
            || v.ephemeral.is_some()
            || v.host_disk.as_ref().is_some_and(|h| h.shared != Some(true))
    });
    out.extend(
        volumes_with(vmi, |v| v.data_volume.is_some())
            .into_iter()
            .filter(|n| !read_write_many(vmi, n)),
    );
    out
}

/// Whether a node whose host disk folder is `dir` (none: it allows no host disks) may open
/// every `hostDisk` of an instance.
pub fn host_disks_allowed(vmi: &VirtualMachineInstance, dir: Option<&str>) -> bool {
    vmi.spec
        .volumes
        .iter()
        .filter_map(|v| v.host_disk.as_ref())
        .all(|h| dir.is_some_and(|d| std::path::Path::new(&h.path).starts_with(d)))
}

/// Volumes that need the shared pool on the node: claims, and the claims under `ephemeral`
/// overlays.
pub fn pool_volumes(vmi: &VirtualMachineInstance) -> Vec<String> {
    let mut out = volumes_with(vmi, |v| v.persistent_volume_claim.is_some());
    out.extend(volumes_with(vmi, |v| v.ephemeral.is_some()));
    out
}

/// Volumes on the shared storage pool.
pub fn shared_disks(vmi: &VirtualMachineInstance) -> Vec<String> {
    let mut out = volumes_with(vmi, |v| {
        v.persistent_volume_claim.is_some()
            || v.host_disk.as_ref().is_some_and(|h| h.shared == Some(true))
    });
    out.extend(
        volumes_with(vmi, |v| v.data_volume.is_some())
            .into_iter()
            .filter(|n| read_write_many(vmi, n)),
    );
    out
}

/// How one migration moves its instance: `Ok("LiveMigration" | "BlockMigration")`, or why
/// it cannot. A migration annotated `edgevirt.io/block-migration: "true"` copies local
/// disks even when the instance itself does not ask for it (unless it has shared ones).
pub fn migration_method(
    vmi: &VirtualMachineInstance,
    migration: &VirtualMachineInstanceMigration,
) -> Result<MigrationMethod, Migratability> {
    let m = live_migratable(vmi);
    if m.ok {
        return Ok(m.method);
    }
    let asked = migration.annotation(BLOCK_MIGRATION_ANNOTATION) == Some("true");
    if asked && m.reason == "DisksNotLiveMigratable" && shared_disks(vmi).is_empty() {
        return Ok(MigrationMethod::BlockMigration);
    }
    Err(m)
}

/// Set a migration's phase, adding it to KubeVirt's phase transition list; a phase it is
/// already in changes nothing.
pub fn set_phase(st: &mut VirtualMachineInstanceMigrationStatus, p: MigrationPhase) {
    if st.phase.as_ref() == Some(&p) {
        return;
    }
    st.phase = Some(p.clone());
    st.phase_transition_timestamps.push(PhaseTransition {
        phase: p,
        phase_transition_timestamp: now(),
    });
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::types::Typed;

    fn vmi_of(v: &Value) -> VirtualMachineInstance {
        VirtualMachineInstance::from_value(v.clone()).unwrap()
    }

    fn migration_of(m: &Value) -> VirtualMachineInstanceMigration {
        let mut m = m.clone();
        m["spec"] = json!({"vmiName": "x"});
        VirtualMachineInstanceMigration::from_value(m).unwrap()
    }

    #[test]
    fn local_disks_move_only_by_block_migration_when_asked() {
        let vmi = |annotations: Value, volume: Value| {
            json!({"metadata": {"annotations": annotations}, "spec": {
                "domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {}}]}},
                "volumes": [volume]}})
        };
        let live_migratable = |v: &Value| live_migratable(&vmi_of(v));
        let migration_method =
            |v: &Value, m: &Value| migration_method(&vmi_of(v), &migration_of(m));
        let local = json!({"name": "data", "containerDisk": {"image": "img"}});
        let cloud = json!({"name": "ci", "cloudInitNoCloud": {"userData": "#cloud-config"}});
        let plain = json!({"metadata": {}});
        let asked = json!({"metadata": {"annotations": {"edgevirt.io/block-migration": "true"}}});

        // A local disk: not live-migratable, and the message says how to ask for the copy.
        let m = live_migratable(&vmi(json!({}), local.clone()));
        assert!(!m.ok);
        assert_eq!(m.reason, "DisksNotLiveMigratable");
        assert!(
            m.message.contains("data") && m.message.contains("--block"),
            "{m:?}"
        );
        assert_eq!(
            migration_method(&vmi(json!({}), local.clone()), &plain)
                .unwrap_err()
                .reason,
            "DisksNotLiveMigratable"
        );
        // Asked on the migration: copied, this once.
        assert_eq!(
            migration_method(&vmi(json!({}), local.clone()), &asked),
            Ok(MigrationMethod::BlockMigration)
        );
        // Asked on the instance: live-migratable by block migration.
        let annotated = vmi(json!({"edgevirt.io/block-migration": "true"}), local);
        let m = live_migratable(&annotated);
        assert!(m.ok, "{m:?}");
        assert_eq!(m.method, MigrationMethod::BlockMigration);
        assert_eq!(
            migration_method(&annotated, &plain),
            Ok(MigrationMethod::BlockMigration)
        );
        // Nothing local: a plain live migration whatever was asked.
        assert_eq!(
            migration_method(&vmi(json!({}), cloud.clone()), &asked),
            Ok(MigrationMethod::LiveMigration)
        );
        // Asking for block migration does not move a bridge interface.
        let mut bridged = vmi(json!({}), cloud);
        bridged["spec"]["domain"]["devices"]["interfaces"] = json!([{"name": "br", "bridge": {}}]);
        bridged["spec"]["networks"] = json!([{"name": "br", "pod": {}}]);
        assert_eq!(
            migration_method(&bridged, &asked).unwrap_err().reason,
            "InterfaceNotLiveMigratable"
        );
        // A bridge on a multus network's host bridge moves, as in KubeVirt.
        bridged["spec"]["networks"] = json!([{"name": "br", "multus": {"networkName": "lan"}}]);
        assert!(migration_method(&bridged, &plain).is_ok());
    }

    #[test]
    fn shared_pool_disks_migrate_without_a_copy() {
        let vmi =
            |volumes: Value| json!({"metadata": {}, "spec": {"domain": {}, "volumes": volumes}});
        let live_migratable = |v: &Value| live_migratable(&vmi_of(v));
        let migration_method =
            |v: &Value, m: &Value| migration_method(&vmi_of(v), &migration_of(m));
        let claim = json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}});
        let local = json!({"name": "root", "containerDisk": {"image": "img"}});
        let asked = json!({"metadata": {"annotations": {"edgevirt.io/block-migration": "true"}}});

        let m = live_migratable(&vmi(json!([claim.clone()])));
        assert!(m.ok, "{m:?}");
        assert_eq!(m.method, MigrationMethod::LiveMigration);
        // A claim next to a local disk: a block migration would copy the claim onto itself, so
        // it is refused even when asked, and the message names both kinds.
        let mixed = vmi(json!([claim, local]));
        let m = live_migratable(&mixed);
        assert_eq!((m.ok, m.reason.as_str()), (false, "DisksNotLiveMigratable"));
        assert!(
            m.message.contains("root") && m.message.contains("data"),
            "{m:?}"
        );
        assert_eq!(
            migration_method(&mixed, &asked).unwrap_err().reason,
            "DisksNotLiveMigratable"
        );
    }

    /// A claim shared over virtiofs pins the instance: virtiofsd's state does not move.
    #[test]
    fn virtiofs_filesystems_do_not_migrate() {
        let claim = json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}});
        let shared = vmi_of(&json!({"metadata": {}, "spec": {
            "domain": {"devices": {"filesystems": [{"name": "data", "virtiofs": {}}]}},
            "volumes": [claim.clone()]}}));
        let m = live_migratable(&shared);
        assert_eq!(
            (m.ok, m.reason.as_str()),
            (false, "VirtIOFSNotLiveMigratable")
        );
        assert!(m.message.contains("data"), "{m:?}");
        let disk = vmi_of(&json!({"metadata": {}, "spec": {"domain": {}, "volumes": [claim]}}));
        assert!(live_migratable(&disk).ok);
    }

    #[test]
    fn datavolumes_migrate_by_where_the_scheduler_found_them() {
        let dv = json!({"name": "disk", "dataVolume": {"name": "disk"}});
        let vmi = |mode: &str| {
            vmi_of(
                &json!({"metadata": {}, "spec": {"domain": {}, "volumes": [dv.clone()]},
                "status": {"volumeStatus": [{"name": "disk", "target": "",
                    "persistentVolumeClaimInfo": {"claimName": "disk", "accessModes": [mode]}}]}}),
            )
        };
        // On the shared pool (ReadWriteMany): live, nothing copied.
        let m = live_migratable(&vmi("ReadWriteMany"));
        assert!(m.ok, "{m:?}");
        assert_eq!(m.method, MigrationMethod::LiveMigration);
        assert_eq!(
            shared_disks(&vmi("ReadWriteMany")),
            vec!["disk".to_string()]
        );
        // On a node's own disk, or not scheduled yet: local.
        for v in [
            vmi("ReadWriteOnce"),
            vmi_of(&json!({"metadata": {}, "spec": {"domain": {}, "volumes": [dv.clone()]}})),
        ] {
            let m = live_migratable(&v);
            assert_eq!((m.ok, m.reason.as_str()), (false, "DisksNotLiveMigratable"));
            assert!(shared_disks(&v).is_empty());
        }
    }
}
