//! DataVolumes (`cdi.kubevirt.io/v1beta1`), the controller's part: a VM's
//! `dataVolumeTemplates` become DataVolumes it owns (and go with it). A new DataVolume on
//! `local` storage waits for its first consumer, as CDI's local storage does: the scheduler
//! binds it to the node it places that consumer on ([`bind`]) and the agent there fills
//! it. One on a shared pool is bound at once to a ready node mounting the pool, which
//! fills it; any node mounting the pool runs its VMs. Each shared pool a node reports is a
//! storage class named after it ([`keep_pool_class`]).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Action, Context};
use crate::store::{Error, FieldSelector, LabelSelector, Store};
use crate::types::cdi::{
    DataVolume, DataVolumeCondition, DataVolumeSpec, DataVolumeStatus, Fill,
    IMAGE_OWNER_ANNOTATION, NODE_ANNOTATION, phase,
};
use crate::types::{Meta, Typed, VirtualMachine, VirtualMachineInstance, now};

/// Keep the storage class DataVolumes name, `local`, as Kubernetes lists classes.
pub async fn keep_storage_class(store: &Store) -> Result<(), Error> {
    use crate::types::Kind;
    if store
        .get(Kind::StorageClass, "", crate::types::cdi::LOCAL_CLASS)
        .await?
        .is_some()
    {
        return Ok(());
    }
    let sc = serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": crate::types::cdi::LOCAL_CLASS,
                     "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "edgevirt.io/local",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": false,
    });
    match store.create(Kind::StorageClass, sc, false).await {
        Ok(_) | Err(Error::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Keep the storage class of the shared pool `pool`, which a node reports it mounts:
/// bound at once (any node mounting the pool reaches the disk), ReadWriteMany.
pub async fn keep_pool_class(store: &Store, pool: &str) -> Result<(), Error> {
    use crate::types::Kind;
    if pool == crate::types::cdi::LOCAL_CLASS
        || store.get(Kind::StorageClass, "", pool).await?.is_some()
    {
        return Ok(());
    }
    let sc = serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": pool},
        "provisioner": crate::types::cdi::SHARED_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": false,
    });
    match store.create(Kind::StorageClass, sc, false).await {
        Ok(_) => {
            tracing::info!(%pool, "a node mounts shared pool; its storage class now exists");
            Ok(())
        }
        Err(Error::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A node reported its status: keep the class of the pool it mounts. (DataVolumes waiting
/// for a node on that pool look again by themselves: [`reconcile_dv`].)
pub async fn on_node(store: &Store, node: &crate::types::Node) -> Result<(), Error> {
    match node.status.as_ref().and_then(|s| s.shared_pool.as_ref()) {
        Some(pool) => keep_pool_class(store, &pool.name).await,
        None => Ok(()),
    }
}

/// Whether a reconcile would leave a DataVolume as it is: it has a status, and is not on a
/// shared pool waiting for a node to fill it (the periodic resync skips idle ones).
pub fn dv_idle(dv: &DataVolume) -> bool {
    dv.deleting()
        || (dv.status.as_ref().is_some_and(|s| s.phase.is_some())
            && (dv.spec.shared_pool().is_none() || dv.annotation(NODE_ANNOTATION).is_some()))
}

/// The status of a new DataVolume: an upload waits for its data, one on a shared pool for
/// a node to fill it, the rest for a consumer.
fn waiting(name: &str, spec: &DataVolumeSpec) -> DataVolumeStatus {
    let (ph, reason) = if spec.fill("") == Some(Fill::Upload) {
        (phase::UPLOAD_READY, "UploadReady")
    } else if spec.shared_pool().is_some() {
        (phase::PENDING, "Pending")
    } else {
        (phase::WAIT_FOR_FIRST_CONSUMER, "WaitForFirstConsumer")
    };
    let cond = |t: &str, reason: &str| DataVolumeCondition {
        type_: t.into(),
        status: "False".into(),
        reason: Some(reason.into()),
        message: None,
        last_transition_time: Some(now()),
        last_heartbeat_time: Some(now()),
    };
    DataVolumeStatus {
        phase: Some(ph.into()),
        progress: Some("N/A".into()),
        restart_count: Some(0),
        claim_name: Some(name.into()),
        conditions: vec![
            cond("Bound", reason),
            cond("Ready", reason),
            cond("Running", reason),
        ],
    }
}

/// A new DataVolume gets its first status, and one on a shared pool its node; a deleted
/// one's uploaded image goes.
pub async fn reconcile_dv(ctx: &Context, ns: &str, name: &str) -> Result<Action, Error> {
    let Some(dv) = ctx.store.get_typed::<DataVolume>(ns, name).await? else {
        return forget_upload(&ctx.store, ns, name)
            .await
            .map(|()| Action::Done);
    };
    if dv.deleting() {
        return Ok(Action::Done);
    }
    if dv.status.as_ref().is_none_or(|s| s.phase.is_none()) {
        ctx.store
            .update_typed(ns, name, |o: &mut DataVolume| {
                if o.status.as_ref().is_none_or(|s| s.phase.is_none()) {
                    o.status = Some(waiting(name, &o.spec));
                }
                Ok(())
            })
            .await?;
    }
    if let Some(pool) = dv.spec.shared_pool()
        && dv.annotation(NODE_ANNOTATION).is_none()
        && !bind_in_pool(&ctx.store, &dv, pool).await?
    {
        // No node mounts the pool yet: look again soon (nothing is written meanwhile).
        return Ok(Action::RequeueAfter(std::time::Duration::from_secs(5)));
    }
    Ok(Action::Done)
}

/// Bind a DataVolume on the shared pool `pool` to a ready, schedulable node mounting it
/// (the first by name), which fills it; whether one was found. With none, it stays
/// Pending and says why.
async fn bind_in_pool(store: &Store, dv: &DataVolume, pool: &str) -> Result<bool, Error> {
    let nodes: Vec<crate::types::Node> = store.all().await?;
    let node = nodes
        .iter()
        .filter(|n| crate::rules::node::node_ready(n) && !n.spec.unschedulable)
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.shared_pool.as_ref())
                .is_some_and(|p| p.name == pool)
        })
        .map(|n| n.name().to_string())
        .min();
    let (ns, name) = (dv.namespace(), dv.name());
    store
        .update_typed(ns, name, |o: &mut DataVolume| {
            if o.annotation(NODE_ANNOTATION).is_some() {
                return Ok(());
            }
            match &node {
                Some(n) => {
                    o.metadata
                        .annotations
                        .get_or_insert_default()
                        .insert(NODE_ANNOTATION.to_string(), n.clone());
                }
                None => {
                    let st = o.status.get_or_insert_default();
                    let msg = format!("no ready node mounts shared pool {pool:?}");
                    for c in st.conditions.iter_mut().filter(|c| c.type_ == "Bound") {
                        c.message = Some(msg.clone());
                    }
                }
            }
            Ok(())
        })
        .await?;
    match &node {
        Some(n) => {
            tracing::info!(namespace = %ns, datavolume = %name, node = %n, %pool, "bound DataVolume on the shared pool to a node that fills it")
        }
        None => {
            tracing::debug!(namespace = %ns, datavolume = %name, %pool, "no ready node mounts the DataVolume's shared pool yet")
        }
    }
    Ok(node.is_some())
}

/// Create the DataVolumes of a VM's templates that do not exist yet, owned by the VM.
/// One that exists already (created by hand, or by an earlier pass) is left as it is.
pub async fn ensure_templates(store: &Store, vm: &VirtualMachine) -> Result<(), Error> {
    for t in &vm.spec.data_volume_templates {
        let name = &t.metadata.name;
        if store
            .get(DataVolume::KIND, vm.namespace(), name)
            .await?
            .is_some()
        {
            continue;
        }
        let dv = DataVolume {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(vm.namespace().to_string()),
                labels: (!t.metadata.labels.is_empty()).then(|| t.metadata.labels.clone()),
                annotations: (!t.metadata.annotations.is_empty())
                    .then(|| t.metadata.annotations.clone()),
                owner_references: Some(vec![vm.owner_reference()]),
                ..Default::default()
            },
            spec: t.spec.clone(),
            status: Some(waiting(name, &t.spec)),
        };
        match store.create_typed(&dv).await {
            Ok(_) | Err(Error::AlreadyExists { .. }) => {
                tracing::info!(namespace = %vm.namespace(), vm = %vm.name(), datavolume = %name, "created DataVolume from the VM's template");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The image holding what was uploaded for the DataVolume `ns/name`, which is gone.
async fn forget_upload(store: &Store, ns: &str, name: &str) -> Result<(), Error> {
    use crate::types::Kind;
    let owner = format!("{ns}/{name}");
    let images: Vec<crate::types::edgevirt::Image> = store.all().await?;
    for img in images {
        if img.annotation(IMAGE_OWNER_ANNOTATION) == Some(owner.as_str()) {
            match store.delete(Kind::Image, "", img.name(), None).await {
                Ok(_) | Err(Error::NotFound { .. }) => {
                    tracing::info!(datavolume = %owner, image = %img.name(), "deleted the uploaded image of a deleted DataVolume");
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// The VM named `vm` is gone: the DataVolumes it owned go too.
pub async fn forget_owned(store: &Store, ns: &str, vm: &str) -> Result<(), Error> {
    let dvs: Vec<DataVolume> = store
        .list_typed(
            Some(ns),
            &LabelSelector::default(),
            &FieldSelector::default(),
        )
        .await?;
    for dv in dvs {
        let owned = dv
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "VirtualMachine" && o.name == vm && o.controller == Some(true));
        if owned && !dv.deleting() {
            match store.delete(DataVolume::KIND, ns, dv.name(), None).await {
                Ok(_) | Err(Error::NotFound { .. }) => {
                    tracing::info!(namespace = %ns, %vm, datavolume = %dv.name(), "deleted the DataVolume of a deleted VM");
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Where a DataVolume's disk is, for the scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// On a node's own disk: that node's, once bound.
    Node(Option<String>),
    /// On the shared pool of that name: any node mounting it.
    Pool(String),
}

/// The DataVolumes (by name) an instance's `dataVolume` volumes name that exist, with where
/// each lives. A local clone that is not bound yet goes where its source is.
pub async fn used_by(
    store: &Store,
    vmi: &VirtualMachineInstance,
) -> Result<BTreeMap<String, Place>, Error> {
    let mut out = BTreeMap::new();
    for v in &vmi.spec.volumes {
        let Some(d) = &v.data_volume else { continue };
        let Some(dv) = store
            .get_typed::<DataVolume>(vmi.namespace(), &d.name)
            .await?
        else {
            continue;
        };
        if let Some(pool) = dv.spec.shared_pool() {
            out.insert(d.name.clone(), Place::Pool(pool.to_string()));
            continue;
        }
        let mut node = dv.annotation(NODE_ANNOTATION).map(str::to_string);
        if node.is_none()
            && let Some(crate::types::cdi::Fill::Clone(sns, sname)) = dv.spec.fill(vmi.namespace())
            && let Some(src) = store.get_typed::<DataVolume>(&sns, &sname).await?
        {
            node = src.annotation(NODE_ANNOTATION).map(str::to_string);
        }
        out.insert(d.name.clone(), Place::Node(node));
    }
    Ok(out)
}

/// Bind the unbound DataVolumes an instance uses to the node it was placed on.
pub async fn bind(store: &Store, vmi: &VirtualMachineInstance, node: &str) -> Result<(), Error> {
    for v in &vmi.spec.volumes {
        let Some(d) = &v.data_volume else { continue };
        let ns = vmi.namespace();
        let Some(dv) = store.get_typed::<DataVolume>(ns, &d.name).await? else {
            continue;
        };
        if dv.annotation(NODE_ANNOTATION).is_some() {
            continue;
        }
        store
            .update_typed(ns, &d.name, |o: &mut DataVolume| {
                o.metadata
                    .annotations
                    .get_or_insert_default()
                    .entry(NODE_ANNOTATION.to_string())
                    .or_insert_with(|| node.to_string());
                Ok(())
            })
            .await?;
        tracing::info!(namespace = %ns, datavolume = %d.name, %node, "bound DataVolume to the node of its first consumer");
    }
    Ok(())
}

/// The volume statuses of an instance's claim and DataVolume volumes (with `places`, what
/// [`used_by`] found): a claim or a DataVolume on a shared pool is ReadWriteMany, one on a
/// node's own disk ReadWriteOnce. The migration rules read them.
pub fn volume_status(
    vmi: &VirtualMachineInstance,
    places: &BTreeMap<String, Place>,
) -> Vec<crate::types::kubevirt::VolumeStatus> {
    use crate::types::kubevirt::{PersistentVolumeClaimInfo, VolumeStatus};
    let mut out = Vec::new();
    for v in &vmi.spec.volumes {
        let (claim, shared) = if let Some(c) = &v.persistent_volume_claim {
            (c.claim_name.clone(), true)
        } else if let Some(d) = &v.data_volume
            && let Some(p) = places.get(&d.name)
        {
            (d.name.clone(), matches!(p, Place::Pool(_)))
        } else {
            continue;
        };
        let mode = if shared {
            "ReadWriteMany"
        } else {
            "ReadWriteOnce"
        };
        out.push(VolumeStatus {
            name: v.name.clone(),
            target: String::new(),
            persistent_volume_claim_info: Some(PersistentVolumeClaimInfo {
                claim_name: Some(claim),
                access_modes: vec![mode.to_string()],
            }),
            ..Default::default()
        });
    }
    out
}
