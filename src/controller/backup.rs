//! Backups (`backup.kubevirt.io/v1alpha1` `VirtualMachineBackup`), the controller's part: it
//! picks the node that holds the VM's disks, checks that the node mounts the backup target
//! the backup names, and hands the backup to it (`edgevirt.io/backup-node`). That node's
//! agent copies the disks into the target and reports how far it is and how it ended; a
//! backup that cannot start fails at once with the reason.

use std::time::Duration;

use super::snapshot::{update_if_there, volume_backups};
use super::vm::read;
use super::{Action, Context};
use crate::store::Error;
use crate::types::annotations::VOLUMES_NODE_ANNOTATION;
use crate::types::backup::{BackupVolumeInfo, NODE_ANNOTATION, VirtualMachineBackup};
use crate::types::backup::{failed, set};
use crate::types::kubevirt::Phase;
use crate::types::{Meta, Node, VirtualMachine, VirtualMachineInstance};

async fn fail(ctx: &Context, ns: &str, name: &str, why: String) -> Result<Action, Error> {
    tracing::warn!(namespace = %ns, backup = %name, reason = %why, "backup failed");
    update_if_there(ctx, ns, name, |b: &mut VirtualMachineBackup| {
        failed(b.status.get_or_insert_with(Default::default), &why);
    })
    .await?;
    Ok(Action::Done)
}

pub async fn reconcile_backup(ctx: &Context, ns: &str, name: &str) -> Result<Action, Error> {
    let Some(b) = read::<VirtualMachineBackup>(ctx, ns, name).await? else {
        return Ok(Action::Done);
    };
    if b.deleting() || b.finished() || b.annotation(NODE_ANNOTATION).is_some() {
        // Finished, or the node's agent has it.
        return Ok(Action::Done);
    }
    let vm_name = &b.spec.source.name;
    let Some(vm) = read::<VirtualMachine>(ctx, ns, vm_name).await? else {
        return fail(
            ctx,
            ns,
            name,
            format!("VirtualMachine {ns}/{vm_name} does not exist"),
        )
        .await;
    };
    let vmi = read::<VirtualMachineInstance>(ctx, ns, vm_name)
        .await?
        .filter(|v| !v.deleting());
    if let Some(v) = &vmi
        && (v.migrating() || (v.phase() != Phase::Running && v.node_name().is_some()))
    {
        // Migrating, starting or stopping: the disks are about to change hands.
        return Ok(Action::RequeueAfter(Duration::from_secs(2)));
    }
    let (volumes, _, dv_node) = volume_backups(ctx, &vm, b.uid()).await?;
    if volumes.is_empty() {
        return fail(
            ctx,
            ns,
            name,
            format!(
                "VirtualMachine {ns}/{vm_name} has no persistent volumes (DataVolumes or \
                 claims) to back up"
            ),
        )
        .await;
    }
    let Some(node) = vmi
        .as_ref()
        .and_then(|v| v.node_name().map(str::to_string))
        .or_else(|| vm.annotation(VOLUMES_NODE_ANNOTATION).map(str::to_string))
        .or(dv_node)
    else {
        return fail(
            ctx,
            ns,
            name,
            format!(
                "VirtualMachine {ns}/{vm_name} never ran, so its disks do not exist yet: start \
                 it once, then back it up"
            ),
        )
        .await;
    };
    let target = b.spec.pvc_name.clone().unwrap_or_default();
    let mounts = ctx
        .store
        .get_typed::<Node>("", &node)
        .await?
        .and_then(|n| n.status)
        .is_some_and(|s| s.backup_targets.iter().any(|t| t.name == target));
    if !mounts {
        return fail(
            ctx,
            ns,
            name,
            format!(
                "node {node}, which holds the disks of {ns}/{vm_name}, does not mount backup \
                 target {target:?} (serve --backup-target {target}=PATH)"
            ),
        )
        .await;
    }
    let included: Vec<BackupVolumeInfo> = volumes
        .iter()
        .map(|v| BackupVolumeInfo {
            volume_name: v.volume_name.clone(),
        })
        .collect();
    tracing::info!(namespace = %ns, backup = %name, node = %node, target = %target, "backup handed to its node");
    update_if_there(ctx, ns, name, |b: &mut VirtualMachineBackup| {
        b.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(NODE_ANNOTATION.into(), node.clone());
        let st = b.status.get_or_insert_with(Default::default);
        st.included_volumes = included;
        set(
            &mut st.conditions,
            "Progressing",
            true,
            "Scheduled",
            &format!("waiting for node {node} to copy the disks"),
        );
        set(&mut st.conditions, "Done", false, "InProgress", "");
    })
    .await?;
    Ok(Action::Done)
}

/// The backups the resync looks at again: those not yet handed to a node.
pub async fn pending(store: &crate::store::Store) -> Vec<super::Key> {
    let Ok(all) = store.all::<VirtualMachineBackup>().await else {
        return vec![];
    };
    all.iter()
        .filter(|b| !b.finished() && b.annotation(NODE_ANNOTATION).is_none())
        .map(|b| {
            (
                crate::types::Kind::VirtualMachineBackup,
                b.namespace().to_string(),
                b.name().to_string(),
            )
        })
        .collect()
}
