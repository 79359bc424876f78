//! What a node's agent may change. A joined agent's credential is bound to its node (user
//! `node:<name>`): it may register and update that Node, write the status and metadata of
//! the instances placed on it, the metadata of their VMs, the status of the DataVolumes
//! bound to it and of the snapshot contents and restores whose disks it copies; nothing
//! else. The spec of its Node (cordon) belongs to administrators.

use serde_json::Value;

use crate::http::auth::{Principal, Role};
use crate::http::error::{ApiError, ApiResult};
use crate::store::Store;
use crate::types::Kind;
use crate::types::annotations::VOLUMES_NODE_ANNOTATION;

impl Principal {
    /// The node a joined agent's credential is bound to.
    pub fn node(&self) -> Option<&str> {
        if self.role == Role::Agent {
            self.user.strip_prefix("node:")
        } else {
            None
        }
    }
}

fn refuse(p: &Principal, what: String) -> ApiError {
    ApiError::forbidden(format!(
        "the agent of node {:?} may not change {what}",
        p.node().unwrap_or_default()
    ))
}

/// Check that `p` (if a node's agent) may write `kind` `ns/name`, stored as `existing`.
pub async fn check(
    store: &Store,
    p: &Principal,
    kind: Kind,
    ns: &str,
    name: &str,
    existing: Option<&Value>,
) -> ApiResult<()> {
    let Some(node) = p.node() else {
        return Ok(());
    };
    let placed_here = |o: Option<&Value>| {
        o.and_then(|o| o["status"]["nodeName"].as_str()) == Some(node)
            || o.and_then(|o| o["status"]["migrationState"]["targetNode"].as_str()) == Some(node)
    };
    let ok = match kind {
        Kind::Node => name == node,
        Kind::VirtualMachineInstance => placed_here(existing),
        Kind::VirtualMachineInstanceMigration => existing.is_some_and(|m| {
            let s = &m["status"]["migrationState"];
            s["sourceNode"].as_str() == Some(node) || s["targetNode"].as_str() == Some(node)
        }),
        // The status of a DataVolume bound to its node: the agent there fills it.
        Kind::DataVolume => {
            existing.and_then(|o| {
                o["metadata"]["annotations"][crate::types::cdi::NODE_ANNOTATION].as_str()
            }) == Some(node)
        }
        // The contents and restores whose disks this node copies.
        Kind::VirtualMachineSnapshotContent | Kind::VirtualMachineRestore => {
            existing.and_then(|o| {
                o["metadata"]["annotations"][crate::types::snapshot::NODE_ANNOTATION].as_str()
            }) == Some(node)
        }
        // The backups this node copies.
        Kind::VirtualMachineBackup => {
            existing.and_then(|o| {
                o["metadata"]["annotations"][crate::types::backup::NODE_ANNOTATION].as_str()
            }) == Some(node)
        }
        Kind::VirtualMachine => {
            existing.and_then(|o| o["metadata"]["annotations"][VOLUMES_NODE_ANNOTATION].as_str())
                == Some(node)
                || placed_here(
                    store
                        .get(Kind::VirtualMachineInstance, ns, name)
                        .await?
                        .as_ref(),
                )
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(refuse(p, format!("{} {ns}/{name}", kind.name())))
    }
}

/// An agent's write of its Node keeps the stored spec: cordoning is for administrators.
pub fn keep_node_spec(p: &Principal, kind: Kind, existing: Option<&Value>, obj: &mut Value) {
    if p.role == Role::Agent && kind == Kind::Node {
        obj["spec"] = existing
            .map(|e| e["spec"].clone())
            .filter(|s| !s.is_null())
            .unwrap_or_else(|| serde_json::json!({}));
    }
}
