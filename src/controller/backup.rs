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
use crate::types::backup::{
    BackupSchedule, BackupVolumeInfo, FILES_FINALIZER, NODE_ANNOTATION, SCHEDULE_LABEL, VM_LABEL,
    VirtualMachineBackup, retained,
};
use crate::types::backup::{failed, set};
use crate::types::kubevirt::Phase;
use crate::types::{Meta, Node, Typed, VirtualMachine, VirtualMachineInstance};

async fn fail(ctx: &Context, ns: &str, name: &str, why: String) -> Result<Action, Error> {
    tracing::warn!(namespace = %ns, backup = %name, reason = %why, "backup failed");
    update_if_there(ctx, ns, name, |b: &mut VirtualMachineBackup| {
        failed(b.status.get_or_insert_with(Default::default), &why);
    })
    .await?;
    Ok(Action::Done)
}

/// A deleted backup waits for its node to remove its folder (its finalizer). When that node
/// is gone (its Node deleted), nothing ever will: the object goes, its folder stays on the
/// target, and the log says where. While the node exists, look again now and then.
async fn release_if_node_gone(ctx: &Context, b: &VirtualMachineBackup) -> Result<Action, Error> {
    if !b.has_finalizer(FILES_FINALIZER) {
        return Ok(Action::Done);
    }
    if let Some(node) = b.annotation(NODE_ANNOTATION)
        && ctx.store.get_typed::<Node>("", node).await?.is_some()
    {
        return Ok(Action::RequeueAfter(Duration::from_secs(30)));
    }
    let (ns, name) = (b.namespace(), b.name());
    tracing::warn!(namespace = %ns, backup = %name, node = ?b.annotation(NODE_ANNOTATION),
        target = ?b.spec.pvc_name, folder = ?b.status.as_ref().and_then(|s| s.path.as_deref()),
        "the node that holds a deleted backup is gone: its folder stays on the target (remove it by hand)");
    update_if_there(ctx, ns, name, |b: &mut VirtualMachineBackup| {
        if let Some(f) = b.metadata.finalizers.as_mut() {
            f.retain(|x| x != FILES_FINALIZER);
        }
    })
    .await?;
    Ok(Action::Done)
}

pub async fn reconcile_backup(ctx: &Context, ns: &str, name: &str) -> Result<Action, Error> {
    let Some(b) = read::<VirtualMachineBackup>(ctx, ns, name).await? else {
        return Ok(Action::Done);
    };
    if b.deleting() {
        return release_if_node_gone(ctx, &b).await;
    }
    if b.finished() || b.annotation(NODE_ANNOTATION).is_some() {
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
            virtual_size: None,
        })
        .collect();
    tracing::info!(namespace = %ns, backup = %name, node = %node, target = %target, "backup handed to its node");
    update_if_there(ctx, ns, name, |b: &mut VirtualMachineBackup| {
        b.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(NODE_ANNOTATION.into(), node.clone());
        // Its folder goes with it: the node removes it on deletion.
        let fins = b.metadata.finalizers.get_or_insert_with(Default::default);
        if !fins.iter().any(|f| f == FILES_FINALIZER) {
            fins.push(FILES_FINALIZER.into());
        }
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

/// The backups the resync looks at again (those not yet handed to a node), and every
/// schedule (a restarted controller learns when each runs next).
pub async fn pending(store: &crate::store::Store) -> Vec<super::Key> {
    let mut keys: Vec<super::Key> = vec![];
    if let Ok(all) = store.all::<VirtualMachineBackup>().await {
        keys.extend(
            all.iter()
                .filter(|b| !b.finished() && b.annotation(NODE_ANNOTATION).is_none())
                .map(|b| {
                    (
                        crate::types::Kind::VirtualMachineBackup,
                        b.namespace().to_string(),
                        b.name().to_string(),
                    )
                }),
        );
    }
    if let Ok(all) = store.all::<BackupSchedule>().await {
        keys.extend(all.iter().map(|s| {
            (
                crate::types::Kind::BackupSchedule,
                s.namespace().to_string(),
                s.name().to_string(),
            )
        }));
    }
    keys
}

/// The schedule that made a backup, from its labels.
pub fn schedule_of(obj: &serde_json::Value) -> Option<String> {
    obj["metadata"]["labels"][SCHEDULE_LABEL]
        .as_str()
        .map(str::to_string)
}

fn parse_time(t: Option<&str>) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(t?)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// Run a schedule at `now`: prune the backups it made by its rule (each VM's on their own),
/// then, when it is due, back up its VMs.
pub async fn reconcile_schedule(
    ctx: &Context,
    ns: &str,
    name: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Action, Error> {
    let Some(sched) = read::<BackupSchedule>(ctx, ns, name).await? else {
        return Ok(Action::Done);
    };
    if sched.deleting() {
        return Ok(Action::Done);
    }
    let every = crate::types::parse_duration(&sched.spec.every)
        .unwrap_or(Duration::from_secs(86_400))
        .max(Duration::from_secs(1));
    let mine: Vec<VirtualMachineBackup> = ctx
        .store
        .all::<VirtualMachineBackup>()
        .await?
        .into_iter()
        .filter(|b| {
            b.namespace() == ns
                && !b.deleting()
                && b.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SCHEDULE_LABEL))
                    .is_some_and(|s| s == name)
        })
        .collect();
    let vm_of = |b: &VirtualMachineBackup| b.spec.source.name.clone();
    // Prune, VM by VM.
    let mut doomed = vec![];
    let mut vms_seen: Vec<String> = mine.iter().map(vm_of).collect();
    vms_seen.sort();
    vms_seen.dedup();
    for vm in &vms_seen {
        let of_vm: Vec<&VirtualMachineBackup> = mine.iter().filter(|b| vm_of(b) == *vm).collect();
        let done: Vec<(String, chrono::DateTime<chrono::Utc>)> = of_vm
            .iter()
            .filter(|b| b.succeeded())
            .filter_map(|b| {
                let t = b.status.as_ref()?.completion_time.as_deref();
                Some((b.name().to_string(), parse_time(t)?))
            })
            .collect();
        let keep = retained(&sched.spec.keep, &done);
        doomed.extend(
            done.iter()
                .filter(|(n, _)| !keep.contains(n))
                .map(|(n, _)| n.clone()),
        );
        // A failed backup goes once a later one of the same VM exists.
        let newest = of_vm.iter().map(|b| b.name().to_string()).max();
        doomed.extend(
            of_vm
                .iter()
                .filter(|b| b.finished() && !b.succeeded())
                .map(|b| b.name().to_string())
                .filter(|n| Some(n) != newest.as_ref()),
        );
    }
    for d in &doomed {
        tracing::info!(namespace = %ns, schedule = %name, backup = %d, "pruning a backup by the schedule's rule");
        match ctx
            .store
            .delete(VirtualMachineBackup::KIND, ns, d, None)
            .await
        {
            Ok(_) | Err(Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let st = sched.status.clone().unwrap_or_default();
    let last = parse_time(st.last_run.as_deref());
    let next = last.map(|t| t + chrono::Duration::from_std(every).unwrap_or_default());
    let due = sched.spec.suspend != Some(true) && next.is_none_or(|n| now >= n);
    let mut made = vec![];
    let mut message = None;
    if due {
        let mut vms = sched.spec.vms.clone();
        if let Some(labels) = sched.spec.match_labels.as_ref().filter(|m| !m.is_empty()) {
            for vm in ctx.store.all::<VirtualMachine>().await? {
                let l = vm.metadata.labels.clone().unwrap_or_default();
                if vm.namespace() == ns && labels.iter().all(|(k, v)| l.get(k) == Some(v)) {
                    vms.push(vm.name().to_string());
                }
            }
        }
        vms.sort();
        vms.dedup();
        let full = sched
            .spec
            .full_every
            .is_some_and(|n| n > 0 && st.runs % u64::from(n) == 0);
        let mut skipped = vec![];
        for vm in &vms {
            if mine.iter().any(|b| vm_of(b) == *vm && !b.finished()) {
                // Its last backup still runs: this run leaves it out.
                skipped.push(vm.clone());
                continue;
            }
            let bname = format!("{name}-{vm}-{}", now.format("%Y%m%d%H%M%S"));
            let mut body = serde_json::json!({
                "apiVersion": "backup.kubevirt.io/v1alpha1", "kind": "VirtualMachineBackup",
                "metadata": {"name": bname, "namespace": ns,
                             "labels": {SCHEDULE_LABEL: name, VM_LABEL: vm}},
                "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": vm},
                         "pvcName": sched.spec.target, "mode": "Push"},
            });
            if full {
                body["spec"]["forceFullBackup"] = serde_json::json!(true);
            }
            match ctx
                .store
                .create(VirtualMachineBackup::KIND, body, false)
                .await
            {
                Ok(_) | Err(Error::AlreadyExists { .. }) => made.push(bname),
                Err(e) => return Err(e),
            }
        }
        if !skipped.is_empty() {
            message = Some(format!(
                "left out {} this run: the last backup still runs",
                skipped.join(", ")
            ));
        }
        tracing::info!(namespace = %ns, schedule = %name, backups = ?made, "scheduled backups started");
    }
    let pruned = doomed.len() as u64;
    let next_run = if due {
        now + chrono::Duration::from_std(every).unwrap_or_default()
    } else {
        next.unwrap_or(now)
    };
    if due || pruned > 0 {
        update_if_there(ctx, ns, name, |s: &mut BackupSchedule| {
            let st = s.status.get_or_insert_with(Default::default);
            if due {
                st.last_run = Some(now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
                st.runs += 1;
                st.last_backups = made.clone();
                st.message = message.clone();
            }
            st.next_run = Some(next_run.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
            st.pruned += pruned;
        })
        .await?;
    }
    let wait = (next_run - now).to_std().unwrap_or_default();
    Ok(Action::RequeueAfter(wait.max(Duration::from_millis(500))))
}
