//! The agent's two seams: the control plane (the controller's API, as the agent uses it) and
//! its launchers (one per VMI, over a unix socket). The agent's sync and migration code only
//! reaches the outside through these traits, so unit tests drive it against in-memory fakes
//! (`agent::fake`) without root, libvirtd or a controller.
//!
//! Reads are typed ([`Stored`] keeps the JSON as read beside the typed value, so a write
//! changes only what the typed code changed and keeps fields a newer peer wrote); writes use
//! the HTTP calls and payload shapes the controller has always accepted: status `PUT`s of
//! `{"status": ...}` and JSON merge patches.
//!
//! The traits return boxed futures so that the agent holds them as `Arc<dyn ...>` (its
//! tasks are spawned and share one `Agent`).

use std::path::PathBuf;

use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::{Value, json};

use super::relay::Ws;
use crate::client::Client;
use crate::launcher::client::LauncherError;
use crate::launcher::protocol::{Request, Status};
use crate::registry::DockerConfig;
use crate::types::cdi::DataVolume;
use crate::types::cni::NetworkAttachmentDefinition;
use crate::types::object::data_files;
use crate::types::object::{apply_change, empty};
use crate::types::{Invalid, Kind, Typed, VirtualMachine, VirtualMachineInstance};
use crate::types::{VirtualMachineInstanceMigration, edgevirt::Image};

/// A typed object with the JSON it was read from.
#[derive(Clone, Debug)]
pub struct Stored<T> {
    pub obj: T,
    pub raw: Value,
}

impl<T: Typed> Stored<T> {
    pub fn decode(raw: Value) -> Result<Self, Invalid> {
        Ok(Stored {
            obj: T::from_value(raw.clone())?,
            raw,
        })
    }

    /// The stored object with the change from `self.obj` to `after` applied.
    pub fn changed(&self, after: &T) -> Value {
        let mut raw = self.raw.clone();
        apply_change(&mut raw, &self.obj.to_value(), &after.to_value());
        raw
    }

    /// The stored `status` (or `{}`) with the change from `before` to `after` applied: what
    /// a status write sends, keeping the status fields this release does not know.
    pub fn status_change<S: Serialize>(&self, before: &Option<S>, after: &Option<S>) -> Value {
        let enc = |s: &Option<S>| s.as_ref().map_or_else(empty, |s| json!(s));
        let mut st = self
            .raw
            .get("status")
            .filter(|s| s.is_object())
            .cloned()
            .unwrap_or_else(empty);
        apply_change(&mut st, &enc(before), &enc(after));
        st
    }
}

pub type R<'a, T> = BoxFuture<'a, anyhow::Result<T>>;

/// The controller, as the agent uses it.
pub trait ControlPlane: Send + Sync {
    fn get_node<'a>(&'a self, name: &'a str) -> R<'a, Option<Value>>;
    fn put_node<'a>(&'a self, name: &'a str, node: Value) -> R<'a, ()>;
    /// Merge-patch a node's status (`{"status": {...}}`).
    fn patch_node_status<'a>(&'a self, name: &'a str, patch: Value) -> R<'a, ()>;
    /// The VMIs whose `status.nodeName` is `node`.
    fn vmis_of<'a>(&'a self, node: &'a str) -> R<'a, Listed<VirtualMachineInstance>>;
    fn get_vmi<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Option<Stored<VirtualMachineInstance>>>;
    /// Replace a VMI's status (`PUT .../status` with `{"status": ...}`); a status without
    /// `migrationState` keeps the stored one.
    fn put_vmi_status<'a>(&'a self, ns: &'a str, name: &'a str, status: Value) -> R<'a, ()>;
    /// Merge-patch a VMI's status (`{"status": {...}}`).
    fn patch_vmi_status<'a>(&'a self, ns: &'a str, name: &'a str, patch: Value) -> R<'a, ()>;
    /// Merge-patch a VMI's metadata (`{"metadata": {...}}`).
    fn patch_vmi<'a>(&'a self, ns: &'a str, name: &'a str, patch: Value) -> R<'a, ()>;
    fn vms<'a>(&'a self) -> R<'a, Vec<Stored<VirtualMachine>>>;
    /// Merge-patch a VM's metadata; `Ok(false)` when there is no such VM.
    fn patch_vm<'a>(&'a self, ns: &'a str, name: &'a str, patch: Value) -> R<'a, bool>;
    fn migrations<'a>(&'a self) -> R<'a, Listed<VirtualMachineInstanceMigration>>;
    fn get_migration<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Stored<VirtualMachineInstanceMigration>>;
    /// Merge-patch a migration's status (`{"status": {...}}`).
    fn patch_migration_status<'a>(&'a self, ns: &'a str, name: &'a str, patch: Value) -> R<'a, ()>;
    fn get_image<'a>(&'a self, name: &'a str) -> R<'a, Image>;
    /// The registry credentials of a `kubernetes.io/dockerconfigjson` Secret.
    fn pull_secret<'a>(&'a self, ns: &'a str, name: &'a str) -> R<'a, DockerConfig>;
    /// A Secret's or ConfigMap's data (decoded): the files of a `secret` or `configMap`
    /// volume; `None` when it does not exist.
    fn data_of<'a>(
        &'a self,
        kind: Kind,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Option<std::collections::BTreeMap<String, Vec<u8>>>>;
    /// A Secret's data (decoded), for access credentials; an error names what is missing.
    fn secret_data<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, std::collections::BTreeMap<String, Vec<u8>>> {
        Box::pin(async move {
            self.data_of(Kind::Secret, ns, name)
                .await?
                .ok_or_else(|| anyhow::anyhow!("Secret {ns}/{name} does not exist"))
        })
    }
    /// A DataVolume, if it exists.
    fn get_data_volume<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Option<Stored<DataVolume>>>;
    /// Every DataVolume (to remove the disks of those that are gone).
    fn data_volumes<'a>(&'a self) -> R<'a, Vec<Stored<DataVolume>>>;
    /// A NetworkAttachmentDefinition, if it exists.
    fn network<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Option<NetworkAttachmentDefinition>>;
    /// Merge-patch a DataVolume's status (`{"status": {...}}`).
    fn patch_data_volume_status<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        patch: Value,
    ) -> R<'a, ()>;
    /// One side of a migration tunnel through the controller's relay.
    fn tunnel<'a>(&'a self, path: &'a str) -> R<'a, Ws>;
    /// The list of every object of a namespaced kind (the snapshot kinds: few objects, read
    /// whole), for [`decode_items`].
    fn list_of(&self, kind: Kind) -> R<'_, Value>;
    /// Merge-patch an object (`status`: through its status subresource); `Ok(false)` when
    /// it is gone.
    fn patch_of<'a>(
        &'a self,
        kind: Kind,
        ns: &'a str,
        name: &'a str,
        patch: Value,
        status: bool,
    ) -> R<'a, bool>;
}

fn dv_path(ns: &str, name: &str) -> String {
    format!("/apis/cdi.kubevirt.io/v1beta1/namespaces/{ns}/datavolumes/{name}")
}

/// What a launcher reports about its domain.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LauncherStatus {
    pub status: Status,
    /// The release of the launcher (it keeps running an older one until the VM restarts).
    pub launcher_version: String,
}

type L<'a, T> = BoxFuture<'a, Result<T, LauncherError>>;

/// This node's launchers, one per VMI.
pub trait Launchers: Send + Sync {
    /// Start a launcher for a VMI's domain from its XML. It runs detached; a launcher that
    /// exits with an error before it serves is reported once by [`Launchers::take_failure`].
    fn start<'a>(&'a self, uid: &'a str, domain: &'a str, xml: PathBuf) -> L<'a, ()>;
    /// Why a started launcher exited with an error, once.
    fn take_failure<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Option<String>>;
    /// Connect to every launcher that runs (after an agent restart); their VMI uids.
    fn adopt_all(&self) -> BoxFuture<'_, Vec<String>>;
    /// A VMI's launcher status, (re)connecting if needed. `Ok(None)`: no launcher runs;
    /// `Err(Incompatible)`: one runs but shares no protocol version with this agent.
    fn status<'a>(&'a self, uid: &'a str) -> L<'a, Option<LauncherStatus>>;
    /// Pause, Unpause, SoftReboot, Shutdown, ... on the connected launcher.
    fn call<'a>(&'a self, uid: &'a str, req: Request) -> L<'a, ()>;
    /// A `Migrate` request, answered when libvirt has the outcome (on its own connection).
    fn migrate<'a>(&'a self, uid: &'a str, req: Request) -> L<'a, ()>;
    /// Abort the running migration of a VMI (on its own connection: `migrate` holds one).
    fn abort_migration<'a>(&'a self, uid: &'a str) -> L<'a, ()>;
    /// A guest agent command through the VMI's launcher (on its own connection, as it may
    /// wait up to `timeout`), answered with what the command returned.
    fn guest_agent<'a>(
        &'a self,
        uid: &'a str,
        command: Value,
        timeout: std::time::Duration,
    ) -> L<'a, Value>;
    /// Drop what is known of a VMI's launcher (its domain left or is gone).
    fn forget<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, ()>;
    /// The connected launchers by the protocol version they speak (`incompatible`: those
    /// sharing none with this agent).
    fn protocol_versions(&self) -> BoxFuture<'_, std::collections::BTreeMap<String, u64>> {
        Box::pin(async { Default::default() })
    }
}

/// The controller over HTTP, with the agent's token.
pub struct Http(pub Client);

const VMIS: &str = "/apis/kubevirt.io/v1/virtualmachineinstances";

fn vmi_path(ns: &str, name: &str) -> String {
    format!("/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}")
}

fn vmim_path(ns: &str, name: &str) -> String {
    format!("/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstancemigrations/{name}")
}

fn node_path(name: &str) -> String {
    format!("/apis/edgevirt.io/v1/nodes/{name}")
}

/// A list's objects that decode, and the uids of those that do not: the agent leaves those
/// alone (it neither serves them nor takes their domains for orphans).
#[derive(Debug)]
pub struct Listed<T> {
    pub items: Vec<Stored<T>>,
    pub undecodable: Vec<String>,
}

/// Decode a list's items, setting aside those that do not decode.
pub fn decode_list<T: Typed>(list: Value) -> Listed<T> {
    let items = match list {
        Value::Object(mut o) => o.remove("items"),
        _ => None,
    };
    let mut out = Listed {
        items: Vec::new(),
        undecodable: Vec::new(),
    };
    let Some(Value::Array(items)) = items else {
        return out;
    };
    for v in items {
        let uid = v
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        match Stored::decode(v) {
            Ok(s) => out.items.push(s),
            Err(e) => {
                tracing::warn!(%uid, error = %e, "leaving alone an object that does not decode");
                out.undecodable.push(uid);
            }
        }
    }
    out
}

/// Decode a list's items; an item that does not decode is skipped and said (one bad object
/// must not stop the agent from serving the others).
pub fn decode_items<T: Typed>(list: Value) -> Vec<Stored<T>> {
    decode_list(list).items
}

impl ControlPlane for Http {
    fn list_of(&self, kind: Kind) -> R<'_, Value> {
        Box::pin(async move {
            self.0
                .get(&format!("{}/{}", kind.path_prefix(), kind.plural()))
                .await
        })
    }
    fn patch_of<'a>(
        &'a self,
        kind: Kind,
        ns: &'a str,
        name: &'a str,
        patch: Value,
        status: bool,
    ) -> R<'a, bool> {
        Box::pin(async move {
            let mut path = format!(
                "{}/namespaces/{ns}/{}/{name}",
                kind.path_prefix(),
                kind.plural()
            );
            if status {
                path.push_str("/status");
            }
            match self.0.merge_patch(&path, &patch).await {
                Ok(_) => Ok(true),
                Err(e) if crate::client::is_status(&e, reqwest::StatusCode::NOT_FOUND) => Ok(false),
                Err(e) => Err(e),
            }
        })
    }
    fn get_node<'a>(&'a self, name: &'a str) -> R<'a, Option<Value>> {
        Box::pin(async move { self.0.get_opt(&node_path(name)).await })
    }
    fn put_node<'a>(&'a self, name: &'a str, node: Value) -> R<'a, ()> {
        Box::pin(async move { self.0.put(&node_path(name), &node).await.map(drop) })
    }
    fn patch_node_status<'a>(&'a self, name: &'a str, patch: Value) -> R<'a, ()> {
        Box::pin(async move {
            let path = format!("{}/status", node_path(name));
            self.0.merge_patch(&path, &patch).await.map(drop)
        })
    }
    fn vmis_of<'a>(&'a self, node: &'a str) -> R<'a, Listed<VirtualMachineInstance>> {
        Box::pin(async move {
            let path = format!("{VMIS}?fieldSelector=status.nodeName%3D{node}");
            Ok(decode_list(self.0.get(&path).await?))
        })
    }
    fn get_vmi<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Option<Stored<VirtualMachineInstance>>> {
        Box::pin(async move {
            match self.0.get_opt(&vmi_path(ns, name)).await? {
                Some(v) => Ok(Some(Stored::decode(v)?)),
                None => Ok(None),
            }
        })
    }
    fn put_vmi_status<'a>(&'a self, ns: &'a str, name: &'a str, status: Value) -> R<'a, ()> {
        Box::pin(async move {
            let path = format!("{}/status", vmi_path(ns, name));
            self.0
                .put(&path, &json!({ "status": status }))
                .await
                .map(drop)
        })
    }
    fn patch_vmi_status<'a>(&'a self, ns: &'a str, name: &'a str, patch: Value) -> R<'a, ()> {
        Box::pin(async move {
            let path = format!("{}/status", vmi_path(ns, name));
            self.0.merge_patch(&path, &patch).await.map(drop)
        })
    }
    fn patch_vmi<'a>(&'a self, ns: &'a str, name: &'a str, patch: Value) -> R<'a, ()> {
        Box::pin(async move {
            self.0
                .merge_patch(&vmi_path(ns, name), &patch)
                .await
                .map(drop)
        })
    }
    fn vms<'a>(&'a self) -> R<'a, Vec<Stored<VirtualMachine>>> {
        Box::pin(async move {
            Ok(decode_items(
                self.0.get("/apis/kubevirt.io/v1/virtualmachines").await?,
            ))
        })
    }
    fn patch_vm<'a>(&'a self, ns: &'a str, name: &'a str, patch: Value) -> R<'a, bool> {
        self.patch_of(Kind::VirtualMachine, ns, name, patch, false)
    }
    fn migrations<'a>(&'a self) -> R<'a, Listed<VirtualMachineInstanceMigration>> {
        Box::pin(async move {
            Ok(decode_list(
                self.0
                    .get("/apis/kubevirt.io/v1/virtualmachineinstancemigrations")
                    .await?,
            ))
        })
    }
    fn get_migration<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Stored<VirtualMachineInstanceMigration>> {
        Box::pin(async move { Ok(Stored::decode(self.0.get(&vmim_path(ns, name)).await?)?) })
    }
    fn patch_migration_status<'a>(&'a self, ns: &'a str, name: &'a str, patch: Value) -> R<'a, ()> {
        Box::pin(async move {
            let path = format!("{}/status", vmim_path(ns, name));
            self.0.merge_patch(&path, &patch).await.map(drop)
        })
    }
    fn get_image<'a>(&'a self, name: &'a str) -> R<'a, Image> {
        Box::pin(async move {
            let v = self
                .0
                .get(&format!("/apis/edgevirt.io/v1/images/{name}"))
                .await?;
            Ok(serde_json::from_value(v)?)
        })
    }
    fn get_data_volume<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Option<Stored<DataVolume>>> {
        Box::pin(async move {
            match self.0.get_opt(&dv_path(ns, name)).await? {
                Some(v) => Ok(Some(Stored::decode(v)?)),
                None => Ok(None),
            }
        })
    }
    fn network<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Option<NetworkAttachmentDefinition>> {
        Box::pin(async move {
            let path = format!(
                "/apis/{}/v1/namespaces/{ns}/network-attachment-definitions/{name}",
                crate::types::cni::GROUP
            );
            match self.0.get_opt(&path).await? {
                Some(v) => Ok(Some(NetworkAttachmentDefinition::from_value(v)?)),
                None => Ok(None),
            }
        })
    }
    fn data_volumes<'a>(&'a self) -> R<'a, Vec<Stored<DataVolume>>> {
        Box::pin(async move {
            Ok(decode_items(
                self.0
                    .get("/apis/cdi.kubevirt.io/v1beta1/datavolumes")
                    .await?,
            ))
        })
    }
    fn patch_data_volume_status<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        patch: Value,
    ) -> R<'a, ()> {
        Box::pin(async move {
            let path = format!("{}/status", dv_path(ns, name));
            self.0.merge_patch(&path, &patch).await.map(drop)
        })
    }
    fn pull_secret<'a>(&'a self, ns: &'a str, name: &'a str) -> R<'a, DockerConfig> {
        Box::pin(async move {
            let path = format!("/api/v1/namespaces/{ns}/secrets/{name}");
            let Some(s) = self.0.get_opt(&path).await? else {
                anyhow::bail!("imagePullSecret {ns}/{name} does not exist");
            };
            DockerConfig::from_secret(&s)
                .map_err(|e| anyhow::anyhow!("imagePullSecret {ns}/{name}: {e}"))
        })
    }
    fn data_of<'a>(
        &'a self,
        kind: Kind,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Option<std::collections::BTreeMap<String, Vec<u8>>>> {
        Box::pin(async move {
            let path = format!("/api/v1/namespaces/{ns}/{}/{name}", kind.plural());
            let Some(o) = self.0.get_opt(&path).await? else {
                return Ok(None);
            };
            data_files(kind, &o)
                .map(Some)
                .map_err(|e| anyhow::anyhow!("{} {ns}/{name}: {}", kind.name(), e.0))
        })
    }
    fn tunnel<'a>(&'a self, path: &'a str) -> R<'a, Ws> {
        Box::pin(self.0.websocket(path))
    }
}
