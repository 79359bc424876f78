//! Snapshots and restores (`snapshot.kubevirt.io/v1beta1`), the controller's part.
//!
//! A `VirtualMachineSnapshot` of a VM gets a `VirtualMachineSnapshotContent`
//! (`vmsnapshot-content-<uid>`, owned by the snapshot) holding the VM as it is now and the
//! list of its persistent volumes (DataVolumes and claims; containerDisks, cloud-init and
//! the like are left out, as KubeVirt leaves out what has no claim). The content names the
//! node holding the VM's disks; that node's agent copies them and marks the content ready,
//! which the snapshot then shows (`Succeeded`, `readyToUse`, the `Ready` condition, the
//! indications). A snapshot that is not done within its `failureDeadline` fails. Deleting a
//! snapshot deletes its content (unless `deletionPolicy: Retain`), whose finalizer the agent
//! removes once the copies are gone.
//!
//! A `VirtualMachineRestore` waits for its snapshot, then for the VM to be stopped (stopping
//! it with `targetReadinessPolicy: StopTarget`), has the node put the disks back into the
//! VM's DataVolumes, and finally writes the snapshot's VM spec back. Its `Progressing`
//! condition says beforehand what it will do when the VM's volumes changed since.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::vm::read;
use super::{Action, Context};
use crate::store::Error;
use crate::types::annotations::VOLUMES_NODE_ANNOTATION;
use crate::types::cdi::{self, DataVolume};
use crate::types::kubevirt::{Phase, RunStrategy, VirtualMachineSpec};
use crate::types::snapshot::{
    ContentSource, FILES_FINALIZER, FROZEN_MS_ANNOTATION, INDICATIONS_ANNOTATION, NODE_ANNOTATION,
    RESTORE_ERROR_ANNOTATION, RESTORED_ANNOTATION, STOPPED_ANNOTATION, SnapshotError,
    SnapshotVolumesLists, SourceIndication, VirtualMachineRestore, VirtualMachineSnapshot,
    VirtualMachineSnapshotContent, VirtualMachineSnapshotContentSpec, VirtualMachineSnapshotStatus,
    VolumeBackup, VolumeRestore, content_name, indication, phase, set_condition,
    volume_snapshot_name,
};
use crate::types::{Meta, Typed, VirtualMachine, VirtualMachineInstance, now, parse_duration};

/// How long a snapshot may take by default (KubeVirt's `failureDeadline` default).
const DEFAULT_DEADLINE: Duration = Duration::from_secs(300);
/// How long a restore waits for its VM to be stopped under `WaitGracePeriod`.
const GRACE: Duration = Duration::from_secs(300);

fn age(meta: &ObjectMeta) -> Duration {
    meta.creation_timestamp
        .as_ref()
        .and_then(|t| serde_json::to_value(t).ok())
        .and_then(|v| chrono::DateTime::parse_from_rfc3339(v.as_str()?).ok())
        .map(|t| {
            (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
                .to_std()
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

/// Change an object in place; one that is gone meanwhile is left gone.
pub(super) async fn update_if_there<T: Typed>(
    ctx: &Context,
    ns: &str,
    name: &str,
    f: impl FnOnce(&mut T),
) -> Result<(), Error> {
    match ctx
        .store
        .update_typed(ns, name, |o: &mut T| {
            f(o);
            Ok(())
        })
        .await
    {
        Ok(_) | Err(Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

async fn set_snapshot_status(
    ctx: &Context,
    ns: &str,
    name: &str,
    f: impl FnOnce(&mut VirtualMachineSnapshotStatus),
) -> Result<(), Error> {
    update_if_there(ctx, ns, name, |s: &mut VirtualMachineSnapshot| {
        f(s.status.get_or_insert_with(Default::default))
    })
    .await
}

async fn fail_snapshot(ctx: &Context, ns: &str, name: &str, why: String) -> Result<(), Error> {
    tracing::warn!(namespace = %ns, snapshot = %name, reason = %why, "snapshot failed");
    set_snapshot_status(ctx, ns, name, |st| {
        st.phase = Some(phase::FAILED.into());
        st.ready_to_use = Some(false);
        st.error = Some(SnapshotError::now(why.clone()));
        set_condition(&mut st.conditions, "Progressing", false, "Failed");
        set_condition(&mut st.conditions, "Ready", false, "Failed");
        set_condition(&mut st.conditions, "Failure", true, &why);
    })
    .await
}

/// The volumes of a VM a snapshot copies (DataVolumes and claims), as content entries, and
/// the names of those it leaves out; the node holding a DataVolume's disk, if any says.
pub(super) async fn volume_backups(
    ctx: &Context,
    vm: &VirtualMachine,
    snapshot_uid: &str,
) -> Result<(Vec<VolumeBackup>, Vec<String>, Option<String>), Error> {
    let ns = vm.namespace();
    let (mut backups, mut excluded, mut node) = (vec![], vec![], None);
    for v in &vm.spec.template.spec.volumes {
        let claim = match (&v.data_volume, &v.persistent_volume_claim) {
            (Some(d), _) => d.name.clone(),
            (None, Some(c)) => c.claim_name.clone(),
            _ => {
                excluded.push(v.name.clone());
                continue;
            }
        };
        let mut pvc = json!({"metadata": {"name": claim}, "spec": {}});
        if let Some(dv) = ctx.store.get_typed::<DataVolume>(ns, &claim).await? {
            if let Some(size) = dv.spec.size() {
                pvc["spec"]["resources"] = json!({"requests": {"storage": size.to_string()}});
            }
            pvc["spec"]["storageClassName"] = json!(dv.spec.storage_class());
            if node.is_none() {
                node = dv.annotation(cdi::NODE_ANNOTATION).map(str::to_string);
            }
        }
        backups.push(VolumeBackup {
            volume_name: v.name.clone(),
            persistent_volume_claim: pvc,
            volume_snapshot_name: Some(volume_snapshot_name(snapshot_uid, &v.name)),
        });
    }
    Ok((backups, excluded, node))
}

pub async fn reconcile_snapshot(ctx: &Context, ns: &str, name: &str) -> Result<Action, Error> {
    let Some(snap) = read::<VirtualMachineSnapshot>(ctx, ns, name).await? else {
        return Ok(Action::Done);
    };
    let st = snap.status.clone().unwrap_or_default();
    if snap.deleting()
        || matches!(
            st.phase.as_deref(),
            Some(phase::SUCCEEDED) | Some(phase::FAILED)
        )
    {
        return Ok(Action::Done);
    }
    let deadline = snap
        .spec
        .failure_deadline
        .as_deref()
        .and_then(parse_duration)
        .unwrap_or(DEFAULT_DEADLINE);
    let Some(content_name) = st.virtual_machine_snapshot_content_name.clone() else {
        return start_snapshot(ctx, &snap).await;
    };
    let Some(content) = read::<VirtualMachineSnapshotContent>(ctx, ns, &content_name).await? else {
        fail_snapshot(
            ctx,
            ns,
            name,
            format!("its content {content_name} was deleted"),
        )
        .await?;
        return Ok(Action::Done);
    };
    let cst = content.status.clone().unwrap_or_default();
    if let Some(e) = cst.error.as_ref().and_then(|e| e.message.clone()) {
        fail_snapshot(ctx, ns, name, e).await?;
        return Ok(Action::Done);
    }
    if cst.ready_to_use != Some(true) {
        if age(&snap.metadata) > deadline {
            fail_snapshot(
                ctx,
                ns,
                name,
                format!(
                    "the snapshot did not finish within its failureDeadline ({}s)",
                    deadline.as_secs()
                ),
            )
            .await?;
            return Ok(Action::Done);
        }
        return Ok(Action::RequeueAfter(Duration::from_secs(5)));
    }
    let indications: Vec<String> = content
        .annotation(INDICATIONS_ANNOTATION)
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let frozen_ms = content.annotation(FROZEN_MS_ANNOTATION).map(str::to_string);
    let source_indications = indications
        .iter()
        .map(|i| SourceIndication {
            indication: i.clone(),
            message: Some(match i.as_str() {
                indication::ONLINE => "the VM was running when the snapshot was taken".into(),
                indication::GUEST_AGENT => format!(
                    "the guest agent froze the guest's filesystems for {} ms while the copy \
                     started",
                    frozen_ms.as_deref().unwrap_or("?")
                ),
                indication::NO_GUEST_AGENT => "no guest agent answered: the copy is \
                                               crash-consistent, as after a power cut"
                    .into(),
                indication::PAUSED => "the VM was paused when the snapshot was taken".into(),
                other => other.to_string(),
            }),
        })
        .collect();
    tracing::info!(namespace = %ns, snapshot = %name, indications = ?indications, frozen_ms = ?frozen_ms, "snapshot ready");
    set_snapshot_status(ctx, ns, name, |st| {
        st.phase = Some(phase::SUCCEEDED.into());
        st.ready_to_use = Some(true);
        st.creation_time = cst.creation_time.clone();
        st.indications = indications;
        st.source_indications = source_indications;
        set_condition(
            &mut st.conditions,
            "Progressing",
            false,
            "Operation complete",
        );
        set_condition(&mut st.conditions, "Ready", true, "Operation complete");
    })
    .await?;
    Ok(Action::Done)
}

/// Record the VM and its volumes in a new content, naming the node that copies the disks.
async fn start_snapshot(ctx: &Context, snap: &VirtualMachineSnapshot) -> Result<Action, Error> {
    let (ns, name) = (snap.namespace(), snap.name());
    let vm_name = &snap.spec.source.name;
    let Some(vm) = read::<VirtualMachine>(ctx, ns, vm_name).await? else {
        fail_snapshot(
            ctx,
            ns,
            name,
            format!("VirtualMachine {ns}/{vm_name} does not exist"),
        )
        .await?;
        return Ok(Action::Done);
    };
    let vmi = read::<VirtualMachineInstance>(ctx, ns, vm_name)
        .await?
        .filter(|v| !v.deleting());
    if let Some(v) = &vmi {
        if v.migrating() {
            set_snapshot_status(ctx, ns, name, |st| {
                st.phase = Some(phase::IN_PROGRESS.into());
                set_condition(
                    &mut st.conditions,
                    "Progressing",
                    false,
                    "Waiting for the VM's migration to finish",
                );
            })
            .await?;
            return Ok(Action::RequeueAfter(Duration::from_secs(2)));
        }
        if v.phase() != Phase::Running && v.node_name().is_some() {
            // Starting or stopping: the disks are about to change hands.
            return Ok(Action::RequeueAfter(Duration::from_secs(2)));
        }
    }
    let (backups, excluded, dv_node) = volume_backups(ctx, &vm, snap.uid()).await?;
    let node = vmi
        .as_ref()
        .and_then(|v| v.node_name().map(str::to_string))
        .or_else(|| vm.annotation(VOLUMES_NODE_ANNOTATION).map(str::to_string))
        .or(dv_node);
    if !backups.is_empty() && node.is_none() {
        fail_snapshot(
            ctx,
            ns,
            name,
            format!(
                "VirtualMachine {ns}/{vm_name} never ran, so its disks do not exist yet: start \
                 it once, then take the snapshot"
            ),
        )
        .await?;
        return Ok(Action::Done);
    }
    let cname = content_name(snap.uid());
    let included: Vec<String> = backups.iter().map(|b| b.volume_name.clone()).collect();
    let mut meta = ObjectMeta {
        name: Some(cname.clone()),
        namespace: Some(ns.to_string()),
        ..Default::default()
    };
    if let Some(node) = &node {
        meta.annotations = Some([(NODE_ANNOTATION.to_string(), node.clone())].into());
    }
    if !backups.is_empty() {
        meta.finalizers = Some(vec![FILES_FINALIZER.to_string()]);
    }
    if snap.spec.deletion_policy.as_deref() != Some("Retain") {
        meta.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: VirtualMachineSnapshot::KIND.api_version(),
                kind: VirtualMachineSnapshot::KIND.name().into(),
                name: name.to_string(),
                uid: snap.uid().to_string(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        ]);
    }
    let vm_copy = json!({
        "metadata": {
            "name": vm.name(),
            "namespace": ns,
            "uid": vm.uid(),
            "labels": vm.metadata.labels,
            "annotations": vm.metadata.annotations,
        },
        "spec": vm.spec,
    });
    let content = VirtualMachineSnapshotContent {
        metadata: meta,
        spec: VirtualMachineSnapshotContentSpec {
            source: ContentSource {
                virtual_machine: Some(vm_copy),
            },
            virtual_machine_snapshot_name: Some(name.to_string()),
            volume_backups: backups,
        },
        status: None,
    };
    match ctx.store.create_typed(&content).await {
        Ok(_) | Err(Error::AlreadyExists { .. }) => {}
        Err(e) => return Err(e),
    }
    if included.is_empty() {
        // Nothing to copy: the VM's spec is the whole snapshot.
        ctx.store
            .update_typed(ns, &cname, |c: &mut VirtualMachineSnapshotContent| {
                let st = c.status.get_or_insert_with(Default::default);
                st.ready_to_use = Some(true);
                st.creation_time = Some(now());
                Ok(())
            })
            .await?;
    }
    let online = vmi.is_some();
    tracing::info!(namespace = %ns, snapshot = %name, vm = %vm_name, node = ?node, volumes = ?included, online, "snapshot started");
    set_snapshot_status(ctx, ns, name, |st| {
        st.phase = Some(phase::IN_PROGRESS.into());
        st.ready_to_use = Some(false);
        st.source_uid = Some(vm.uid().to_string());
        st.virtual_machine_snapshot_content_name = Some(cname);
        st.snapshot_volumes = Some(SnapshotVolumesLists {
            included_volumes: included,
            excluded_volumes: excluded,
        });
        if online {
            st.indications = vec![indication::ONLINE.into()];
        }
        set_condition(
            &mut st.conditions,
            "Progressing",
            true,
            "Operation in progress",
        );
        set_condition(&mut st.conditions, "Ready", false, "Not ready");
    })
    .await?;
    Ok(Action::RequeueAfter(Duration::from_secs(5)))
}

/// A content whose snapshot is gone goes too (its finalizer waits for the node to remove
/// the copies).
pub async fn reconcile_content(ctx: &Context, ns: &str, name: &str) -> Result<Action, Error> {
    let Some(c) = read::<VirtualMachineSnapshotContent>(ctx, ns, name).await? else {
        return Ok(Action::Done);
    };
    if c.deleting() {
        return Ok(Action::Done);
    }
    let Some(owner) = c.owner_uid(VirtualMachineSnapshot::KIND.name()) else {
        return Ok(Action::Done);
    };
    let snap = c
        .spec
        .virtual_machine_snapshot_name
        .as_deref()
        .unwrap_or_default();
    let alive = ctx
        .store
        .get_typed::<VirtualMachineSnapshot>(ns, snap)
        .await?
        .is_some_and(|s| s.uid() == owner && !s.deleting());
    if !alive {
        tracing::info!(namespace = %ns, content = %name, "snapshot deleted: deleting its content");
        ctx.store
            .delete(VirtualMachineSnapshotContent::KIND, ns, name, None)
            .await?;
    }
    Ok(Action::Done)
}

async fn set_restore(
    ctx: &Context,
    ns: &str,
    name: &str,
    f: impl FnOnce(&mut VirtualMachineRestore),
) -> Result<(), Error> {
    update_if_there(ctx, ns, name, f).await
}

/// Say where a restore stands: `Progressing` (with what it does or waits for) and `Ready`.
async fn restore_progress(
    ctx: &Context,
    ns: &str,
    name: &str,
    progressing: bool,
    message: String,
) -> Result<(), Error> {
    set_restore(ctx, ns, name, |r| {
        let st = r.status.get_or_insert_with(Default::default);
        st.complete = Some(false);
        set_condition(&mut st.conditions, "Progressing", progressing, &message);
        set_condition(&mut st.conditions, "Ready", false, &message);
        for c in st.conditions.iter_mut() {
            c.message = Some(message.clone());
        }
    })
    .await
}

/// A restore that cannot go on: `Failure` is set, and it is never taken up again (as
/// KubeVirt's, a failed restore is done; create another).
async fn fail_restore(ctx: &Context, ns: &str, name: &str, message: String) -> Result<(), Error> {
    tracing::warn!(namespace = %ns, restore = %name, reason = %message, "restore failed");
    restore_progress(ctx, ns, name, false, message.clone()).await?;
    set_restore(ctx, ns, name, |r| {
        let st = r.status.get_or_insert_with(Default::default);
        set_condition(&mut st.conditions, "Failure", true, "Failed");
        if let Some(c) = st.conditions.iter_mut().find(|c| c.type_ == "Failure") {
            c.message = Some(message);
        }
    })
    .await
}

fn annotate(r: &mut VirtualMachineRestore, key: &str, value: &str) {
    r.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.to_string(), value.to_string());
}

pub async fn reconcile_restore(ctx: &Context, ns: &str, name: &str) -> Result<Action, Error> {
    let Some(r) = read::<VirtualMachineRestore>(ctx, ns, name).await? else {
        return Ok(Action::Done);
    };
    let st = r.status.clone().unwrap_or_default();
    let failed = st
        .conditions
        .iter()
        .any(|c| c.type_ == "Failure" && c.status == "True");
    if r.deleting() || st.complete == Some(true) || failed {
        return Ok(Action::Done);
    }
    let wait = Action::RequeueAfter(Duration::from_secs(2));
    let snap_name = &r.spec.virtual_machine_snapshot_name;
    let snap = read::<VirtualMachineSnapshot>(ctx, ns, snap_name).await?;
    let Some(snap) = snap.filter(|s| s.status.as_ref().and_then(|s| s.ready_to_use) == Some(true))
    else {
        restore_progress(
            ctx,
            ns,
            name,
            false,
            format!("waiting for VirtualMachineSnapshot {snap_name} to be ready"),
        )
        .await?;
        return Ok(Action::RequeueAfter(Duration::from_secs(5)));
    };
    let target = &r.spec.target.name;
    if &snap.spec.source.name != target {
        fail_restore(
            ctx,
            ns,
            name,
            format!(
                "VirtualMachineSnapshot {snap_name} is of VirtualMachine {}; edgevirt restores \
                 a snapshot onto its own VirtualMachine only",
                snap.spec.source.name
            ),
        )
        .await?;
        return Ok(Action::Done);
    }
    let cname = snap
        .status
        .as_ref()
        .and_then(|s| s.virtual_machine_snapshot_content_name.clone())
        .unwrap_or_default();
    let Some(content) = read::<VirtualMachineSnapshotContent>(ctx, ns, &cname).await? else {
        fail_restore(ctx, ns, name, format!("its content {cname} is gone")).await?;
        return Ok(Action::Done);
    };
    let Some(vm) = read::<VirtualMachine>(ctx, ns, target).await? else {
        fail_restore(
            ctx,
            ns,
            name,
            format!(
                "VirtualMachine {ns}/{target} does not exist; edgevirt restores onto the \
                 snapshot's VM as it exists (create it again from the snapshot's spec first)"
            ),
        )
        .await?;
        return Ok(Action::Done);
    };
    let Some(spec) = content
        .spec
        .source
        .virtual_machine
        .as_ref()
        .and_then(|v| serde_json::from_value::<VirtualMachineSpec>(v["spec"].clone()).ok())
    else {
        fail_restore(
            ctx,
            ns,
            name,
            format!("content {cname} holds no VirtualMachine spec"),
        )
        .await?;
        return Ok(Action::Done);
    };
    // What the restore does, when the VM's volumes changed since the snapshot.
    let now_claims: Vec<(String, String)> = vm
        .spec
        .template
        .spec
        .volumes
        .iter()
        .filter_map(|v| {
            let c = v.data_volume.as_ref().map(|d| d.name.clone()).or_else(|| {
                v.persistent_volume_claim
                    .as_ref()
                    .map(|c| c.claim_name.clone())
            })?;
            Some((v.name.clone(), c))
        })
        .collect();
    let mut plan = vec![];
    for b in &content.spec.volume_backups {
        if ctx
            .store
            .get(crate::types::Kind::DataVolume, ns, b.claim())
            .await?
            .is_none()
            && !now_claims.iter().any(|(_, c)| c == b.claim())
        {
            restore_progress(
                ctx,
                ns,
                name,
                false,
                format!(
                    "volume {:?}: its DataVolume {:?} no longer exists, so its disk cannot be \
                     put back; create a blank DataVolume of that name (at least {}) and restore \
                     again",
                    b.volume_name,
                    b.claim(),
                    b.persistent_volume_claim["spec"]["resources"]["requests"]["storage"]
                        .as_str()
                        .unwrap_or("the snapshot's size")
                ),
            )
            .await?;
            return Ok(Action::RequeueAfter(Duration::from_secs(10)));
        }
        plan.push(format!("puts back the disk of volume {:?}", b.volume_name));
    }
    for (vol, claim) in &now_claims {
        if !content
            .spec
            .volume_backups
            .iter()
            .any(|b| b.claim() == claim)
        {
            plan.push(format!(
                "drops volume {vol:?} (added since the snapshot) from the VM; its DataVolume \
                 {claim:?} is kept"
            ));
        }
    }
    let plan = if plan.is_empty() {
        "restores the VM's spec".to_string()
    } else {
        format!("restores the VM's spec and {}", plan.join(", "))
    };
    // The VM must be stopped.
    let vmi = read::<VirtualMachineInstance>(ctx, ns, target).await?;
    if vmi.is_some() {
        let policy = r
            .spec
            .target_readiness_policy
            .as_deref()
            .unwrap_or("WaitGracePeriod");
        match policy {
            "StopTarget" => {
                if r.annotation(STOPPED_ANNOTATION).is_none() {
                    tracing::info!(namespace = %ns, restore = %name, vm = %target, "stopping the VM to restore it");
                    ctx.store
                        .update_typed(ns, target, |o: &mut VirtualMachine| {
                            if o.spec.running.is_some() {
                                o.spec.running = Some(false);
                            } else {
                                o.spec.run_strategy = Some(RunStrategy::Halted);
                            }
                            Ok(())
                        })
                        .await?;
                    set_restore(ctx, ns, name, |r| annotate(r, STOPPED_ANNOTATION, "true")).await?;
                }
                restore_progress(
                    ctx,
                    ns,
                    name,
                    true,
                    format!("stopping VirtualMachine {target}; then it {plan}"),
                )
                .await?;
                return Ok(wait);
            }
            "FailImmediate" => {
                fail_restore(
                    ctx,
                    ns,
                    name,
                    format!(
                        "VirtualMachine {target} is running: stop it and restore again, or use \
                         targetReadinessPolicy StopTarget"
                    ),
                )
                .await?;
                return Ok(Action::Done);
            }
            "WaitGracePeriod" if age(&r.metadata) > GRACE => {
                fail_restore(
                    ctx,
                    ns,
                    name,
                    format!(
                        "VirtualMachine {target} was not stopped within 5 minutes: stop it and \
                         restore again, or use targetReadinessPolicy StopTarget"
                    ),
                )
                .await?;
                return Ok(Action::Done);
            }
            _ => {
                restore_progress(
                    ctx,
                    ns,
                    name,
                    true,
                    format!(
                        "waiting for VirtualMachine {target} to be stopped (or set \
                         targetReadinessPolicy StopTarget); then it {plan}"
                    ),
                )
                .await?;
                return Ok(wait);
            }
        }
    }
    if let Some(e) = r.annotation(RESTORE_ERROR_ANNOTATION) {
        fail_restore(ctx, ns, name, format!("restoring the disks failed: {e}")).await?;
        return Ok(Action::Done);
    }
    if !content.spec.volume_backups.is_empty()
        && r.annotation(RESTORED_ANNOTATION) != Some(content.uid())
    {
        let node = content.annotation(NODE_ANNOTATION).unwrap_or_default();
        if r.annotation(NODE_ANNOTATION) != Some(node) {
            set_restore(ctx, ns, name, |r| annotate(r, NODE_ANNOTATION, node)).await?;
        }
        restore_progress(
            ctx,
            ns,
            name,
            true,
            format!("node {node} is putting the disks back; then it {plan}"),
        )
        .await?;
        return Ok(wait);
    }
    // The disks are back: the spec follows, and the VM runs as it did at the snapshot.
    ctx.store
        .update_typed(ns, target, |o: &mut VirtualMachine| {
            o.spec = spec.clone();
            Ok(())
        })
        .await?;
    let restores: Vec<VolumeRestore> = content
        .spec
        .volume_backups
        .iter()
        .map(|b| VolumeRestore {
            volume_name: b.volume_name.clone(),
            persistent_volume_claim: b.claim().to_string(),
            volume_snapshot_name: b.volume_snapshot_name.clone().unwrap_or_default(),
            data_volume_name: Some(b.claim().to_string()),
        })
        .collect();
    tracing::info!(namespace = %ns, restore = %name, vm = %target, snapshot = %snap_name, "restore complete");
    set_restore(ctx, ns, name, |r| {
        let st = r.status.get_or_insert_with(Default::default);
        st.complete = Some(true);
        st.restore_time = Some(now());
        st.restores = restores;
        set_condition(
            &mut st.conditions,
            "Progressing",
            false,
            "Operation complete",
        );
        set_condition(&mut st.conditions, "Ready", true, "Operation complete");
        for c in st.conditions.iter_mut() {
            c.message = Some(format!("the VM {plan}"));
        }
    })
    .await?;
    Ok(Action::Done)
}

/// Snapshots and restores that are not done yet, and contents whose snapshot is gone (or
/// going), for the periodic resync: one listing of each kind, no point reads.
pub async fn pending(ctx_store: &crate::store::Store) -> Vec<super::Key> {
    let mut keys = vec![];
    let key = |k: crate::types::Kind, o: &dyn Meta| (k, o.namespace().into(), o.name().into());
    let Ok(snaps) = ctx_store.all::<VirtualMachineSnapshot>().await else {
        return keys;
    };
    keys.extend(
        snaps
            .iter()
            .filter(|s| {
                !matches!(
                    s.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some(phase::SUCCEEDED) | Some(phase::FAILED)
                )
            })
            .map(|s| key(VirtualMachineSnapshot::KIND, s)),
    );
    if let Ok(all) = ctx_store.all::<VirtualMachineSnapshotContent>().await {
        let alive = |uid: &str| snaps.iter().any(|s| s.uid() == uid && !s.deleting());
        keys.extend(
            all.iter()
                .filter(|c| {
                    !c.deleting()
                        && c.owner_uid(VirtualMachineSnapshot::KIND.name())
                            .is_some_and(|u| !alive(u))
                })
                .map(|c| key(VirtualMachineSnapshotContent::KIND, c)),
        );
    }
    if let Ok(all) = ctx_store.all::<VirtualMachineRestore>().await {
        keys.extend(
            all.iter()
                .filter(|r| r.status.as_ref().and_then(|s| s.complete) != Some(true))
                .map(|r| key(VirtualMachineRestore::KIND, r)),
        );
    }
    keys
}

/// The content of the snapshot an event concerns (named after the snapshot's uid), so that
/// deleting a snapshot deletes its content at once, not at the next resync.
pub fn content_of_snapshot(snapshot: &Value) -> Option<String> {
    snapshot["metadata"]["uid"].as_str().map(content_name)
}

/// The snapshot a content event concerns.
pub fn snapshot_of_content(content: &Value) -> Option<String> {
    content["spec"]["virtualMachineSnapshotName"]
        .as_str()
        .map(str::to_string)
}
