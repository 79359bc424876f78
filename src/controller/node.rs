//! What happens to a node's instances when an administrator deletes the node, and when it
//! gets a `NoExecute` taint they do not tolerate.

use crate::store::{Error, FieldSelector, LabelSelector, Store};
use crate::types::annotations::LAUNCHER_FINALIZER;
use crate::types::kubevirt::Phase;
use crate::types::{Meta, Typed, VirtualMachineInstance};

/// Why a node may not be released.
#[derive(Debug)]
pub enum Release {
    /// Instances are still placed on it (the message names them and what to do).
    Busy(String),
    Store(Error),
}

impl From<Error> for Release {
    fn from(e: Error) -> Self {
        Release::Store(e)
    }
}

/// Before a node is deleted: refuse while instances are placed on it, unless `force` (the
/// administrator confirms the host is down), which fails them so that their VMs start again
/// elsewhere. This is the only way an instance leaves a node that stopped reporting.
pub async fn release_node(
    store: &Store,
    node: &str,
    force: bool,
    dry_run: bool,
) -> Result<(), Release> {
    let vmis: Vec<VirtualMachineInstance> = store
        .list_typed(None, &LabelSelector::default(), &FieldSelector::node(node))
        .await?;
    if vmis.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = vmis
        .iter()
        .map(|v| format!("{}/{}", v.namespace(), v.name()))
        .collect();
    if !force {
        return Err(Release::Busy(format!(
            "node {node:?} still holds {} instance(s): {}; drain it first (edgevirt node drain \
             {node}), or, if the host is down for good, delete it with --force so they start \
             elsewhere",
            names.len(),
            names.join(", ")
        )));
    }
    if dry_run {
        return Ok(());
    }
    for v in &vmis {
        let (ns, name) = (v.namespace(), v.name());
        store
            .update_typed(ns, name, |o: &mut VirtualMachineInstance| {
                let st = o.status.get_or_insert_default();
                st.phase = Some(Phase::Failed);
                st.reason = Some("NodeDeleted".into());
                if let Some(f) = o.metadata.finalizers.as_mut() {
                    f.retain(|f| f != LAUNCHER_FINALIZER);
                }
                Ok(())
            })
            .await?;
        match store
            .delete(VirtualMachineInstance::KIND, ns, name, None)
            .await
        {
            Ok(_) | Err(Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::warn!(%node, namespace = %ns, %name, "instance of a node deleted as down: failed and removed");
    }
    Ok(())
}

/// The instances placed on a node with a `NoExecute` taint: each is reconciled to see
/// whether it must go (none are listed for a node without one, so heartbeats stay cheap).
pub async fn no_execute_candidates(
    store: &Store,
    node: &crate::types::Node,
) -> Result<Vec<(String, String)>, Error> {
    if !node.spec.taints.iter().any(|t| t.effect == "NoExecute") {
        return Ok(Vec::new());
    }
    let (items, _) = store
        .list(
            VirtualMachineInstance::KIND,
            None,
            &LabelSelector::default(),
            &FieldSelector::node(node.name()),
        )
        .await?;
    Ok(items.iter().map(super::key_of).collect())
}

/// A placed instance on a node whose `NoExecute` taints it does not tolerate (or no longer:
/// its `tolerationSeconds` ran out) is deleted, as Kubernetes' taint manager deletes the
/// pod: its VM's run strategy then starts another where the scheduler finds room. Until
/// then, the time left.
pub async fn evict_for_taints(
    store: &Store,
    vmi: &VirtualMachineInstance,
    node: &str,
) -> Result<Option<std::time::Duration>, Error> {
    let Some(n) = store.get_typed::<crate::types::Node>("", node).await? else {
        return Ok(None);
    };
    let now = chrono::Utc::now();
    let Some((deadline, taint)) =
        crate::rules::placement::no_execute_deadline(&n.spec.taints, &vmi.spec.tolerations, now)
    else {
        return Ok(None);
    };
    if deadline > now {
        return Ok(Some((deadline - now).to_std().unwrap_or_default()));
    }
    tracing::info!(
        namespace = %vmi.namespace(),
        name = %vmi.name(),
        node,
        taint = %crate::rules::placement::taint_text(taint),
        "evicting VirtualMachineInstance: its node has a NoExecute taint it does not tolerate"
    );
    store
        .delete(
            VirtualMachineInstance::KIND,
            vmi.namespace(),
            vmi.name(),
            None,
        )
        .await?;
    Ok(None)
}
