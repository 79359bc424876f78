//! What happens to a node's instances when an administrator deletes the node.

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
