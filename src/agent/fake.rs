//! In-memory fakes of the agent's two seams, for unit tests: a control plane holding objects
//! as JSON (as the store would) and launchers backed by the in-memory hypervisor. Both record
//! every call so tests assert on what the agent asked.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::ports::{
    ControlPlane, LauncherStatus, Launchers, Listed, R, Stored, decode_items, decode_list,
};
use super::relay::Ws;
use crate::hypervisor::fake::Fake as FakeHv;
use crate::hypervisor::{GuestAddress, Hypervisor};
use crate::launcher::client::LauncherError;
use crate::launcher::protocol::{Request, Status};
use crate::types::edgevirt::Image;
use crate::types::{Kind, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration};

/// One write the agent sent: what (`put_vmi_status`, ...), to which object, with what body.
#[derive(Clone, Debug)]
pub struct Call {
    pub op: &'static str,
    pub key: String,
    pub body: Value,
}

/// The controller's objects by kind and `namespace/name` (`name` for nodes).
#[derive(Default)]
pub struct FakeControlPlane {
    pub objects: Mutex<BTreeMap<(&'static str, String), Value>>,
    pub calls: Mutex<Vec<Call>>,
}

/// Set the value at a JSON pointer, making the objects on the way.
pub fn set(v: &mut Value, ptr: &str, val: Value) {
    let mut cur = v;
    for k in ptr.trim_start_matches('/').split('/') {
        if !cur.is_object() {
            *cur = json!({});
        }
        cur = cur
            .as_object_mut()
            .expect("an object")
            .entry(k)
            .or_insert(Value::Null);
    }
    *cur = val;
}

pub const VMI: &str = "vmi";
pub const VM: &str = "vm";
pub const VMIM: &str = "vmim";
pub const NODE: &str = "node";
pub const DV: &str = "dv";
pub const NAD: &str = "nad";

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

impl FakeControlPlane {
    pub fn insert(&self, kind: &'static str, obj: Value) {
        let field = |f: &str| {
            obj.pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let k = match kind {
            NODE => field("name"),
            _ => key(&field("namespace"), &field("name")),
        };
        self.objects.lock().unwrap().insert((kind, k), obj);
    }

    pub fn get(&self, kind: &'static str, k: &str) -> Option<Value> {
        self.objects
            .lock()
            .unwrap()
            .get(&(kind, k.to_string()))
            .cloned()
    }

    /// Change a stored object in place (what the controller or a user would do).
    pub fn edit(&self, kind: &'static str, k: &str, f: impl FnOnce(&mut Value)) {
        let mut objs = self.objects.lock().unwrap();
        f(objs.get_mut(&(kind, k.to_string())).expect("object exists"));
    }

    pub fn calls(&self, op: &str) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.op == op)
            .cloned()
            .collect()
    }

    fn record(&self, op: &'static str, key: String, body: &Value) {
        self.calls.lock().unwrap().push(Call {
            op,
            key,
            body: body.clone(),
        });
    }

    fn list(&self, kind: &'static str) -> Value {
        let items: Vec<Value> = self
            .objects
            .lock()
            .unwrap()
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|(_, v)| v.clone())
            .collect();
        json!({ "items": items })
    }

    /// A JSON merge patch, as the API applies it; a deleted object whose last finalizer
    /// went is removed.
    fn merge(&self, kind: &'static str, k: String, patch: &Value) -> anyhow::Result<()> {
        let mut objs = self.objects.lock().unwrap();
        let Some(obj) = objs.get_mut(&(kind, k.clone())) else {
            anyhow::bail!("{kind} {k} not found");
        };
        json_patch::merge(obj, patch);
        let gone = obj.pointer("/metadata/deletionTimestamp").is_some()
            && obj
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty);
        if gone {
            objs.remove(&(kind, k));
        }
        Ok(())
    }
}

impl ControlPlane for FakeControlPlane {
    fn list_of(&self, kind: Kind) -> R<'_, Value> {
        Box::pin(async move { Ok(self.list(kind.name())) })
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
            self.record(
                if status { "patch_status" } else { "patch" },
                key(ns, name),
                &patch,
            );
            Ok(self.merge(kind.name(), key(ns, name), &patch).is_ok())
        })
    }
    fn get_node<'a>(&'a self, name: &'a str) -> R<'a, Option<Value>> {
        Box::pin(async move { Ok(self.get(NODE, name)) })
    }
    fn put_node<'a>(&'a self, name: &'a str, node: Value) -> R<'a, ()> {
        Box::pin(async move {
            self.record("put_node", name.into(), &node);
            self.objects
                .lock()
                .unwrap()
                .insert((NODE, name.into()), node);
            Ok(())
        })
    }
    fn patch_node_status<'a>(&'a self, name: &'a str, patch: Value) -> R<'a, ()> {
        Box::pin(async move {
            self.record("patch_node_status", name.into(), &patch);
            self.merge(NODE, name.into(), &patch)
        })
    }
    fn vmis_of<'a>(&'a self, node: &'a str) -> R<'a, Listed<VirtualMachineInstance>> {
        Box::pin(async move {
            let mut list = self.list(VMI);
            if let Some(items) = list.get_mut("items").and_then(Value::as_array_mut) {
                items.retain(|v| {
                    v.pointer("/status/nodeName").and_then(Value::as_str) == Some(node)
                });
            }
            Ok(decode_list(list))
        })
    }
    fn get_vmi<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Option<Stored<VirtualMachineInstance>>> {
        Box::pin(async move {
            match self.get(VMI, &key(ns, name)) {
                Some(v) => Ok(Some(Stored::decode(v)?)),
                None => Ok(None),
            }
        })
    }
    fn put_vmi_status<'a>(&'a self, ns: &'a str, name: &'a str, status: Value) -> R<'a, ()> {
        Box::pin(async move {
            self.record("put_vmi_status", key(ns, name), &status);
            let mut objs = self.objects.lock().unwrap();
            let obj = objs
                .get_mut(&(VMI, key(ns, name)))
                .ok_or_else(|| anyhow::anyhow!("VMI {ns}/{name} not found"))?;
            // As the API does: a status without migrationState keeps the stored one.
            let mut status = status;
            if status.get("migrationState").is_none()
                && let Some(ms) = obj.pointer("/status/migrationState").cloned()
            {
                status
                    .as_object_mut()
                    .expect("a status is an object")
                    .insert("migrationState".into(), ms);
            }
            obj.as_object_mut()
                .expect("an object")
                .insert("status".into(), status);
            Ok(())
        })
    }
    fn patch_vmi_status<'a>(&'a self, ns: &'a str, name: &'a str, patch: Value) -> R<'a, ()> {
        Box::pin(async move {
            self.record("patch_vmi_status", key(ns, name), &patch);
            self.merge(VMI, key(ns, name), &patch)
        })
    }
    fn patch_vmi<'a>(&'a self, ns: &'a str, name: &'a str, patch: Value) -> R<'a, ()> {
        Box::pin(async move {
            self.record("patch_vmi", key(ns, name), &patch);
            self.merge(VMI, key(ns, name), &patch)
        })
    }
    fn vms<'a>(&'a self) -> R<'a, Vec<Stored<VirtualMachine>>> {
        Box::pin(async move { Ok(decode_items(self.list(VM))) })
    }
    fn patch_vm<'a>(&'a self, ns: &'a str, name: &'a str, patch: Value) -> R<'a, bool> {
        Box::pin(async move {
            self.record("patch_vm", key(ns, name), &patch);
            Ok(self.merge(VM, key(ns, name), &patch).is_ok())
        })
    }
    fn migrations<'a>(&'a self) -> R<'a, Listed<VirtualMachineInstanceMigration>> {
        Box::pin(async move { Ok(decode_list(self.list(VMIM))) })
    }
    fn get_migration<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Stored<VirtualMachineInstanceMigration>> {
        Box::pin(async move {
            let v = self
                .get(VMIM, &key(ns, name))
                .ok_or_else(|| anyhow::anyhow!("migration {ns}/{name} not found"))?;
            Ok(Stored::decode(v)?)
        })
    }
    fn patch_migration_status<'a>(&'a self, ns: &'a str, name: &'a str, patch: Value) -> R<'a, ()> {
        Box::pin(async move {
            self.record("patch_migration_status", key(ns, name), &patch);
            self.merge(VMIM, key(ns, name), &patch)
        })
    }
    fn get_image<'a>(&'a self, name: &'a str) -> R<'a, Image> {
        Box::pin(async move { anyhow::bail!("no image {name} in the fake") })
    }
    fn pull_secret<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, crate::registry::DockerConfig> {
        Box::pin(async move { anyhow::bail!("no secret {ns}/{name} in the fake") })
    }
    fn data_of<'a>(
        &'a self,
        _kind: crate::types::Kind,
        _ns: &'a str,
        _name: &'a str,
    ) -> R<'a, Option<std::collections::BTreeMap<String, Vec<u8>>>> {
        Box::pin(async move { Ok(None) })
    }
    fn get_data_volume<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Option<Stored<crate::types::cdi::DataVolume>>> {
        Box::pin(async move {
            match self.get(DV, &key(ns, name)) {
                Some(v) => Ok(Some(Stored::decode(v)?)),
                None => Ok(None),
            }
        })
    }
    fn network<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> R<'a, Option<crate::types::cni::NetworkAttachmentDefinition>> {
        Box::pin(async move {
            use crate::types::Typed;
            match self.get(NAD, &key(ns, name)) {
                Some(v) => Ok(Some(Typed::from_value(v)?)),
                None => Ok(None),
            }
        })
    }
    fn data_volumes<'a>(&'a self) -> R<'a, Vec<Stored<crate::types::cdi::DataVolume>>> {
        Box::pin(async move { Ok(decode_items(self.list(DV))) })
    }
    fn patch_data_volume_status<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
        patch: Value,
    ) -> R<'a, ()> {
        Box::pin(async move {
            self.record("patch_data_volume_status", key(ns, name), &patch);
            self.merge(DV, key(ns, name), &patch)
        })
    }
    fn tunnel<'a>(&'a self, path: &'a str) -> R<'a, Ws> {
        // No peer ever pairs: the tunnel side waits until its task is stopped.
        Box::pin(async move {
            self.record("tunnel", path.into(), &Value::Null);
            futures::future::pending().await
        })
    }
}

/// A launcher of the fake: serves one domain of the fake hypervisor.
#[derive(Clone, Debug)]
pub struct FakeLauncher {
    pub domain: String,
    pub version: String,
}

/// How the fake answers `Migrate`.
#[derive(Clone, Debug)]
pub enum MigrateOutcome {
    /// The guest arrived: the domain leaves this host.
    Success,
    /// libvirt refused or failed.
    Fail(LauncherError),
    /// Runs until aborted, then fails as libvirt does when a job is cancelled.
    UntilAborted,
}

pub struct FakeLaunchers {
    pub hv: Arc<FakeHv>,
    /// Running launchers by VMI uid.
    pub running: Mutex<HashMap<String, FakeLauncher>>,
    /// Launchers that exited with an error, by VMI uid, not yet reported.
    pub failures: Mutex<HashMap<String, String>>,
    /// The next `start` of these uids fails (the launcher exits with this message).
    pub fail_start: Mutex<HashMap<String, String>>,
    pub migrate_outcome: Mutex<MigrateOutcome>,
    aborted: tokio::sync::Notify,
    pub calls: Mutex<Vec<String>>,
}

impl FakeLaunchers {
    pub fn new(hv: Arc<FakeHv>) -> FakeLaunchers {
        FakeLaunchers {
            hv,
            running: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            fail_start: Mutex::new(HashMap::new()),
            migrate_outcome: Mutex::new(MigrateOutcome::Success),
            aborted: tokio::sync::Notify::new(),
            calls: Mutex::new(Vec::new()),
        }
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn record(&self, c: String) {
        self.calls.lock().unwrap().push(c);
    }

    fn launcher(&self, uid: &str) -> Result<FakeLauncher, LauncherError> {
        self.running
            .lock()
            .unwrap()
            .get(uid)
            .cloned()
            .ok_or_else(|| LauncherError::NoLauncher(uid.into()))
    }
}

fn hv_err(e: crate::hypervisor::Error) -> LauncherError {
    LauncherError::from_reply(&e.to_string())
}

impl Launchers for FakeLaunchers {
    fn start<'a>(
        &'a self,
        uid: &'a str,
        domain: &'a str,
        xml: PathBuf,
    ) -> BoxFuture<'a, Result<(), LauncherError>> {
        Box::pin(async move {
            self.record(format!("start {uid}"));
            if let Some(msg) = self.fail_start.lock().unwrap().remove(uid) {
                self.failures.lock().unwrap().insert(uid.into(), msg);
                return Ok(());
            }
            // A launcher defines its domain from the XML unless the domain already runs.
            if self.hv.state(domain).map_err(hv_err)?.is_none() {
                let xml = std::fs::read_to_string(&xml)
                    .map_err(|e| LauncherError::Other(format!("{}: {e}", xml.display())))?;
                self.hv.create(&xml).map_err(hv_err)?;
            }
            self.running.lock().unwrap().insert(
                uid.into(),
                FakeLauncher {
                    domain: domain.into(),
                    version: "test-release".into(),
                },
            );
            Ok(())
        })
    }

    fn take_failure<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move { self.failures.lock().unwrap().remove(uid) })
    }

    fn adopt_all(&self) -> BoxFuture<'_, Vec<String>> {
        Box::pin(async move {
            self.record("adopt".into());
            let mut uids: Vec<String> = self.running.lock().unwrap().keys().cloned().collect();
            uids.sort();
            uids
        })
    }

    fn status<'a>(
        &'a self,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<LauncherStatus>, LauncherError>> {
        Box::pin(async move {
            let Ok(l) = self.launcher(uid) else {
                return Ok(None);
            };
            let state = self.hv.state(&l.domain).map_err(hv_err)?;
            // The guest's eth0 is the domain's first NIC.
            let mac = self.hv.xml(&l.domain).ok().and_then(|x| {
                let rest = x.split("<mac address='").nth(1)?;
                rest.split('\'').next().map(str::to_string)
            });
            Ok(Some(LauncherStatus {
                status: Status {
                    state,
                    agent_connected: state.is_some(),
                    addresses: state
                        .map(|_| GuestAddress {
                            interface: "eth0".into(),
                            mac: mac.clone(),
                            ip: "10.77.0.10".into(),
                        })
                        .into_iter()
                        .collect(),
                    address_source: Some("guest-agent".into()),
                    ..Default::default()
                },
                launcher_version: l.version,
            }))
        })
    }

    fn call<'a>(&'a self, uid: &'a str, req: Request) -> BoxFuture<'a, Result<(), LauncherError>> {
        Box::pin(async move {
            self.record(format!("call {uid} {req:?}"));
            let l = self.launcher(uid)?;
            match req {
                Request::Pause => self.hv.suspend(&l.domain).map_err(hv_err),
                Request::Unpause => self.hv.resume(&l.domain).map_err(hv_err),
                // The guest powers off at once.
                Request::Shutdown { .. } | Request::Destroy => {
                    self.hv.destroy(&l.domain).map_err(hv_err)
                }
                Request::SoftReboot => Ok(()),
                _ => Err(LauncherError::Unsupported(format!("{req:?}"))),
            }
        })
    }

    fn migrate<'a>(
        &'a self,
        uid: &'a str,
        req: Request,
    ) -> BoxFuture<'a, Result<(), LauncherError>> {
        Box::pin(async move {
            let Request::Migrate {
                dest_xml, block, ..
            } = &req
            else {
                return Err(LauncherError::Unsupported(format!("{req:?}")));
            };
            self.record(format!(
                "migrate {uid} block={block} xml={}",
                dest_xml.len()
            ));
            let l = self.launcher(uid)?;
            let outcome = self.migrate_outcome.lock().unwrap().clone();
            match outcome {
                MigrateOutcome::Success => {
                    self.hv.destroy(&l.domain).map_err(hv_err)?;
                    self.running.lock().unwrap().remove(uid);
                    Ok(())
                }
                MigrateOutcome::Fail(e) => Err(e),
                MigrateOutcome::UntilAborted => {
                    self.aborted.notified().await;
                    Err(LauncherError::Libvirt(
                        "operation aborted: migration out job: canceled by client".into(),
                    ))
                }
            }
        })
    }

    fn abort_migration<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Result<(), LauncherError>> {
        Box::pin(async move {
            self.record(format!("abort {uid}"));
            self.launcher(uid)?;
            self.aborted.notify_one();
            Ok(())
        })
    }

    fn guest_agent<'a>(
        &'a self,
        uid: &'a str,
        command: Value,
        _timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<Value, LauncherError>> {
        Box::pin(async move {
            self.record(format!("guest-agent {uid} {}", command["execute"]));
            self.launcher(uid)?;
            Err(LauncherError::AgentUnavailable(
                "fake has no guest agent".into(),
            ))
        })
    }

    fn forget<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.record(format!("forget {uid}")) })
    }
}
