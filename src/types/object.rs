//! Typed objects past admission. The controller, agent, dashboard and CLI read stored
//! objects as the kinds of [`crate::types`] ([`Typed`]), change them as Rust values, and
//! write back only what they changed ([`apply_change`]): a field this release does not know
//! (written by a newer peer) stays in the stored object as it was, as
//! `docs/compatibility.md` asks.

use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::edgevirt::{Image, Node};
use super::kubevirt::{VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration};
use super::{Invalid, Kind};

/// A kind with a Rust type. Decoding is tolerant: unknown fields are ignored (and kept by
/// [`apply_change`] when the object is written back).
pub trait Typed:
    Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Send + Sync + 'static
{
    const KIND: Kind;

    /// Decode a stored object, naming the field that does not fit.
    fn from_value(v: Value) -> Result<Self, Invalid> {
        serde_path_to_error::deserialize::<_, Self>(v).map_err(|e| {
            Invalid(format!(
                "stored {} does not decode: {}: {}",
                Self::KIND.name(),
                e.path(),
                e.inner()
            ))
        })
    }

    fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("typed objects serialize")
    }
}

impl Typed for VirtualMachine {
    const KIND: Kind = Kind::VirtualMachine;
}
impl Typed for VirtualMachineInstance {
    const KIND: Kind = Kind::VirtualMachineInstance;
}
impl Typed for VirtualMachineInstanceMigration {
    const KIND: Kind = Kind::VirtualMachineInstanceMigration;
}
impl Typed for Node {
    const KIND: Kind = Kind::Node;
}
impl Typed for Image {
    const KIND: Kind = Kind::Image;
}
impl Typed for super::instancetype::VirtualMachineInstancetype {
    const KIND: Kind = Kind::VirtualMachineInstancetype;
}
impl Typed for super::instancetype::VirtualMachineClusterInstancetype {
    const KIND: Kind = Kind::VirtualMachineClusterInstancetype;
}
impl Typed for super::instancetype::VirtualMachinePreference {
    const KIND: Kind = Kind::VirtualMachinePreference;
}
impl Typed for super::instancetype::VirtualMachineClusterPreference {
    const KIND: Kind = Kind::VirtualMachineClusterPreference;
}
impl Typed for k8s_openapi::api::storage::v1::StorageClass {
    const KIND: Kind = Kind::StorageClass;
}
impl Typed for super::cdi::DataVolume {
    const KIND: Kind = Kind::DataVolume;
}
impl Typed for k8s_openapi::api::apps::v1::ControllerRevision {
    const KIND: Kind = Kind::ControllerRevision;
}
impl Typed for k8s_openapi::api::core::v1::Event {
    const KIND: Kind = Kind::Event;
}
impl Typed for super::cni::NetworkAttachmentDefinition {
    const KIND: Kind = Kind::NetworkAttachmentDefinition;
}
impl Typed for super::snapshot::VirtualMachineSnapshot {
    const KIND: Kind = Kind::VirtualMachineSnapshot;
}
impl Typed for super::snapshot::VirtualMachineSnapshotContent {
    const KIND: Kind = Kind::VirtualMachineSnapshotContent;
}
impl Typed for super::snapshot::VirtualMachineRestore {
    const KIND: Kind = Kind::VirtualMachineRestore;
}
impl Typed for super::backup::VirtualMachineBackup {
    const KIND: Kind = Kind::VirtualMachineBackup;
}
impl Typed for super::backup::BackupSchedule {
    const KIND: Kind = Kind::BackupSchedule;
}

/// Check a status written through a `status` subresource against its kind's typed status,
/// naming the field that does not fit (`status.phase: invalid type: integer `3`, ...`).
/// Unknown fields pass (a newer agent may report more); Namespaces have no status to check.
pub fn check_status(kind: Kind, status: &Value) -> Result<(), Invalid> {
    fn fits<T: DeserializeOwned>(status: &Value) -> Result<(), Invalid> {
        if status.is_null() {
            return Ok(());
        }
        serde_path_to_error::deserialize::<_, T>(status.clone())
            .map(|_| ())
            .map_err(|e| {
                let path = e.path().to_string();
                let at = if path == "." {
                    "status".to_string()
                } else {
                    format!("status.{path}")
                };
                Invalid(format!("{at}: {}", e.inner()))
            })
    }
    use super::{edgevirt, kubevirt};
    match kind {
        Kind::VirtualMachine => fits::<kubevirt::VirtualMachineStatus>(status),
        Kind::VirtualMachineInstance => fits::<kubevirt::VirtualMachineInstanceStatus>(status),
        Kind::VirtualMachineInstanceMigration => {
            fits::<kubevirt::VirtualMachineInstanceMigrationStatus>(status)
        }
        Kind::Node => fits::<edgevirt::NodeStatus>(status),
        Kind::Image => fits::<edgevirt::ImageStatus>(status),
        Kind::DataVolume => fits::<super::cdi::DataVolumeStatus>(status),
        Kind::VirtualMachineSnapshot => {
            fits::<super::snapshot::VirtualMachineSnapshotStatus>(status)
        }
        Kind::VirtualMachineSnapshotContent => {
            fits::<super::snapshot::VirtualMachineSnapshotContentStatus>(status)
        }
        Kind::VirtualMachineRestore => fits::<super::snapshot::VirtualMachineRestoreStatus>(status),
        Kind::VirtualMachineBackup => fits::<super::backup::VirtualMachineBackupStatus>(status),
        Kind::BackupSchedule => fits::<super::backup::BackupScheduleStatus>(status),
        Kind::Namespace
        | Kind::Secret
        | Kind::ConfigMap
        | Kind::VirtualMachineInstancetype
        | Kind::VirtualMachineClusterInstancetype
        | Kind::VirtualMachinePreference
        | Kind::VirtualMachineClusterPreference
        | Kind::ControllerRevision
        | Kind::StorageClass
        | Kind::Event
        | Kind::NetworkAttachmentDefinition => Ok(()),
    }
}

/// What every stored object's metadata answers, without defaults that hide a missing field:
/// a stored object always has a name and a uid (the store fills them), a namespaced one a
/// namespace.
pub trait Meta {
    fn name(&self) -> &str;
    /// The namespace, empty for cluster-scoped kinds.
    fn namespace(&self) -> &str;
    fn uid(&self) -> &str;
    /// Has a deletionTimestamp: going away, finalizers still to run.
    fn deleting(&self) -> bool;
    fn annotation(&self, key: &str) -> Option<&str>;
    fn label(&self, key: &str) -> Option<&str>;
    fn has_finalizer(&self, f: &str) -> bool;
    /// The uid of the owner of a kind (`ownerReferences`), if any.
    fn owner_uid(&self, kind: &str) -> Option<&str>;
}

impl<T: Resource> Meta for T {
    fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }
    fn namespace(&self) -> &str {
        self.meta().namespace.as_deref().unwrap_or_default()
    }
    fn uid(&self) -> &str {
        self.meta().uid.as_deref().unwrap_or_default()
    }
    fn deleting(&self) -> bool {
        self.meta().deletion_timestamp.is_some()
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        self.meta()
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }
    fn label(&self, key: &str) -> Option<&str> {
        self.meta().labels.as_ref()?.get(key).map(String::as_str)
    }
    fn has_finalizer(&self, f: &str) -> bool {
        self.meta()
            .finalizers
            .as_ref()
            .is_some_and(|fs| fs.iter().any(|x| x == f))
    }
    fn owner_uid(&self, kind: &str) -> Option<&str> {
        self.meta()
            .owner_references
            .as_ref()?
            .iter()
            .find(|r| r.kind == kind)
            .map(|r| r.uid.as_str())
    }
}

/// Apply to `stored` the change from `before` to `after` (two encodings of typed values, the
/// first decoded from `stored`). Objects are merged key by key, so keys the types do not
/// know stay as they are; a key that `after` dropped is removed; arrays of the same length
/// are merged element by element, others replaced; any other change replaces the value.
pub fn apply_change(stored: &mut Value, before: &Value, after: &Value) {
    if before == after {
        return;
    }
    match (stored, before, after) {
        (Value::Object(s), Value::Object(b), Value::Object(a)) => {
            for (k, av) in a {
                match (b.get(k), s.get_mut(k)) {
                    (Some(bv), Some(sv)) => apply_change(sv, bv, av),
                    _ => {
                        s.insert(k.clone(), av.clone());
                    }
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                s.remove(k);
            }
        }
        (Value::Array(s), Value::Array(b), Value::Array(a))
            if s.len() == b.len() && b.len() == a.len() =>
        {
            for ((sv, bv), av) in s.iter_mut().zip(b).zip(a) {
                apply_change(sv, bv, av);
            }
        }
        (s, _, a) => *s = a.clone(),
    }
}

/// An empty JSON object, for `apply_change` callers that start from nothing.
/// The data of a stored Secret (`data`, base64) or ConfigMap (`data` as text, `binaryData`
/// as base64), decoded: what a `secret` or `configMap` volume presents as files.
pub fn data_files(
    kind: Kind,
    obj: &Value,
) -> Result<std::collections::BTreeMap<String, Vec<u8>>, Invalid> {
    use base64::Engine as _;
    let b64 = |k: &str, v: &Value| {
        v.as_str()
            .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
            .ok_or_else(|| Invalid(format!("data[{k:?}] is not base64")))
    };
    let entries = |field: &str| obj[field].as_object().into_iter().flatten();
    let mut out = std::collections::BTreeMap::new();
    match kind {
        Kind::Secret => {
            for (k, v) in entries("data") {
                out.insert(k.clone(), b64(k, v)?);
            }
        }
        Kind::ConfigMap => {
            for (k, v) in entries("data") {
                let text = v
                    .as_str()
                    .ok_or_else(|| Invalid(format!("data[{k:?}] is not a string")))?;
                out.insert(k.clone(), text.as_bytes().to_vec());
            }
            for (k, v) in entries("binaryData") {
                out.insert(k.clone(), b64(k, v)?);
            }
        }
        _ => return Err(Invalid(format!("a {} holds no data files", kind.name()))),
    }
    Ok(out)
}

pub fn empty() -> Value {
    Value::Object(Map::new())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::kubevirt::{Condition, ConditionType, Phase, set_condition};

    fn stored_vmi() -> Value {
        json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "a", "namespace": "default", "uid": "u1",
                         "annotations": {"x": "1", "gone": "2"}, "futureMeta": true},
            "spec": {"domain": {"devices": {}, "futureDevice": {"k": 1}}},
            "status": {"phase": "Scheduled", "nodeName": "n1", "futureStatus": [1, 2],
                       "conditions": [{"type": "Ready", "status": "False", "futureKey": "k"}]},
            "futureTop": "t"
        })
    }

    #[test]
    fn a_typed_change_keeps_what_the_types_do_not_know() {
        let mut stored = stored_vmi();
        let before = VirtualMachineInstance::from_value(stored.clone()).unwrap();
        assert_eq!(before.name(), "a");
        assert_eq!(before.annotation("x"), Some("1"));
        let mut after = before.clone();
        let st = after.status.get_or_insert_default();
        st.phase = Some(Phase::Running);
        set_condition(
            &mut st.conditions,
            Condition::new(ConditionType::Ready, true, "", ""),
        );
        after.metadata.annotations.as_mut().unwrap().remove("gone");
        apply_change(&mut stored, &before.to_value(), &after.to_value());
        assert_eq!(stored["status"]["phase"], "Running");
        assert_eq!(stored["status"]["conditions"][0]["status"], "True");
        // Unknown fields at every level survive, inside arrays too.
        assert_eq!(stored["status"]["conditions"][0]["futureKey"], "k");
        assert_eq!(stored["status"]["futureStatus"], json!([1, 2]));
        assert_eq!(stored["spec"]["domain"]["futureDevice"]["k"], 1);
        assert_eq!(stored["metadata"]["futureMeta"], true);
        assert_eq!(stored["futureTop"], "t");
        // What the typed code removed is removed.
        assert_eq!(stored["metadata"]["annotations"], json!({"x": "1"}));
    }

    #[test]
    fn status_writes_are_checked_against_the_typed_status() {
        let e = check_status(Kind::VirtualMachineInstance, &json!({"phase": 3})).unwrap_err();
        assert!(
            e.0.starts_with("status.phase: invalid type: integer `3`"),
            "{e}"
        );
        let e = check_status(
            Kind::VirtualMachineInstanceMigration,
            &json!({"migrationState": {"completed": "yes"}}),
        )
        .unwrap_err();
        assert!(e.0.starts_with("status.migrationState.completed:"), "{e}");
        let e = check_status(Kind::Node, &json!("up")).unwrap_err();
        assert!(e.0.starts_with("status: invalid type: string"), "{e}");
        check_status(
            Kind::VirtualMachineInstance,
            &json!({"phase": "Running", "new": 1}),
        )
        .unwrap();
    }

    #[test]
    fn a_status_that_does_not_fit_is_named() {
        let mut v = stored_vmi();
        v["status"]["phase"] = json!(3);
        let e = VirtualMachineInstance::from_value(v).unwrap_err();
        assert!(e.0.contains("status.phase"), "{e}");
    }

    /// Secrets hold base64; ConfigMaps hold text in `data` and base64 in `binaryData`.
    #[test]
    fn data_files_decode_secrets_and_config_maps() {
        let secret = json!({"data": {"k": "aGk="}});
        assert_eq!(data_files(Kind::Secret, &secret).unwrap()["k"], b"hi");
        let cm = json!({"data": {"t": "text"}, "binaryData": {"b": "AAE="}});
        let files = data_files(Kind::ConfigMap, &cm).unwrap();
        assert_eq!(
            (files["t"].as_slice(), files["b"].as_slice()),
            (&b"text"[..], &[0u8, 1][..])
        );
        assert!(data_files(Kind::Secret, &json!({"data": {"k": "!"}})).is_err());
        assert!(data_files(Kind::Node, &json!({})).is_err());
    }
}
