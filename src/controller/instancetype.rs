//! A VM's instancetype and preference: finding them, keeping the copy the VM uses (a
//! `ControllerRevision` its status points at, as KubeVirt does), and expanding them into the
//! spec of the VM's next instance. Admission uses the same finding and expansion to refuse a
//! VM whose fields conflict with its instancetype before it is stored.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::{Value, json};

use crate::store::{Error, FieldSelector, LabelSelector, Store};
use crate::types::instancetype::{
    InstancetypeSpec, Matcher, PreferenceSpec, RevisionRef, Scope, StatusRef, expand,
};
use crate::types::kubevirt::VirtualMachineInstanceSpec;
use crate::types::{FieldError, Kind, Meta, Typed, VirtualMachine};

/// Labels KubeVirt puts on a revision, naming the object it copies.
const OBJECT_NAME: &str = "instancetype.kubevirt.io/object-name";
const OBJECT_KIND: &str = "instancetype.kubevirt.io/object-kind";
const OBJECT_UID: &str = "instancetype.kubevirt.io/object-uid";
const OBJECT_GENERATION: &str = "instancetype.kubevirt.io/object-generation";
const OBJECT_VERSION: &str = "instancetype.kubevirt.io/object-version";

/// Why a VM's instancetype or preference could not be used.
#[derive(Debug)]
pub enum Unusable {
    /// It does not exist (KubeVirt's `FailedFindInstancetype` / `FailedFindPreference`).
    Missing {
        reason: &'static str,
        message: String,
    },
    Store(Error),
}

impl From<Error> for Unusable {
    fn from(e: Error) -> Self {
        Unusable::Store(e)
    }
}

/// One of the two matchers: which kinds it names and how KubeVirt words a miss.
#[derive(Clone, Copy)]
struct Side {
    preference: bool,
}

impl Side {
    const INSTANCETYPE: Side = Side { preference: false };
    const PREFERENCE: Side = Side { preference: true };

    fn kind(self, scope: Scope) -> Kind {
        match (self.preference, scope) {
            (false, Scope::Namespaced) => Kind::VirtualMachineInstancetype,
            (false, Scope::Cluster) => Kind::VirtualMachineClusterInstancetype,
            (true, Scope::Namespaced) => Kind::VirtualMachinePreference,
            (true, Scope::Cluster) => Kind::VirtualMachineClusterPreference,
        }
    }

    fn reason(self) -> &'static str {
        if self.preference {
            "FailedFindPreference"
        } else {
            "FailedFindInstancetype"
        }
    }

    fn matcher(self, vm: &VirtualMachine) -> Option<&Matcher> {
        if self.preference {
            vm.spec.preference.as_ref()
        } else {
            vm.spec.instancetype.as_ref()
        }
    }

    fn status_ref(self, vm: &VirtualMachine) -> Option<&StatusRef> {
        let st = vm.status.as_ref()?;
        if self.preference {
            st.preference_ref.as_ref()
        } else {
            st.instancetype_ref.as_ref()
        }
    }

    fn missing(self, kind: Kind, name: &str) -> Unusable {
        Unusable::Missing {
            reason: self.reason(),
            message: format!(
                "{}.{} {name:?} not found",
                kind.plural(),
                crate::types::instancetype::GROUP
            ),
        }
    }
}

/// The object a matcher names, from the store, as stored (`None` when it does not exist).
async fn live(
    store: &Store,
    ns: &str,
    side: Side,
    m: &Matcher,
) -> Result<(Kind, Option<Value>), Unusable> {
    let scope = m
        .scope(side.preference)
        .map_err(|message| Unusable::Missing {
            reason: side.reason(),
            message,
        })?;
    let kind = side.kind(scope);
    let ns = if kind.namespaced() { ns } else { "" };
    Ok((kind, store.get(kind, ns, &m.name).await?))
}

/// The revision a VM uses for one matcher, if it has one: `spec.*.revisionName` first, then
/// the status' revision when it copies the object the matcher names now.
fn revision_name(vm: &VirtualMachine, side: Side) -> Option<String> {
    let m = side.matcher(vm)?;
    if let Some(r) = &m.revision_name {
        return Some(r.clone());
    }
    let r = side.status_ref(vm)?;
    (r.name == m.name)
        .then(|| r.controller_revision_ref.as_ref().map(|c| c.name.clone()))
        .flatten()
}

/// The object (as JSON) one matcher of a VM stands for: the VM's revision of it when it has
/// one, else the live object.
async fn object_for(
    store: &Store,
    vm: &VirtualMachine,
    side: Side,
) -> Result<Option<Value>, Unusable> {
    let Some(m) = side.matcher(vm) else {
        return Ok(None);
    };
    if let Some(rev) = revision_name(vm, side) {
        let stored = store
            .get(Kind::ControllerRevision, vm.namespace(), &rev)
            .await?;
        let data = stored.and_then(|r| r.get("data").cloned());
        return match data {
            Some(d) => Ok(Some(d)),
            None => Err(Unusable::Missing {
                reason: side.reason(),
                message: format!("controllerrevisions.apps {rev:?} not found"),
            }),
        };
    }
    match live(store, vm.namespace(), side, m).await? {
        (_, Some(obj)) => Ok(Some(obj)),
        (kind, None) => Err(side.missing(kind, &m.name)),
    }
}

fn spec_of<T: serde::de::DeserializeOwned>(obj: &Value, side: Side) -> Result<T, Unusable> {
    serde_json::from_value(obj.get("spec").cloned().unwrap_or(Value::Null)).map_err(|e| {
        Unusable::Missing {
            reason: side.reason(),
            message: format!("the stored object does not decode: {e}"),
        }
    })
}

/// What a VM's matchers stand for now (its revisions, else the live objects).
pub struct Resolved {
    pub instancetype: Option<InstancetypeSpec>,
    pub preference: Option<PreferenceSpec>,
}

impl Resolved {
    pub async fn of(store: &Store, vm: &VirtualMachine) -> Result<Resolved, Unusable> {
        let it = object_for(store, vm, Side::INSTANCETYPE).await?;
        let pref = object_for(store, vm, Side::PREFERENCE).await?;
        Ok(Resolved {
            instancetype: it.map(|o| spec_of(&o, Side::INSTANCETYPE)).transpose()?,
            preference: pref.map(|o| spec_of(&o, Side::PREFERENCE)).transpose()?,
        })
    }

    /// What exists of the two (for admission): a missing one is `None`, and the names of
    /// the missing ones are returned beside.
    pub async fn existing(
        store: &Store,
        vm: &VirtualMachine,
    ) -> Result<(Resolved, Vec<String>), Error> {
        let mut missing = Vec::new();
        let mut found = |r: Result<Option<Value>, Unusable>| match r {
            Ok(o) => Ok(o),
            Err(Unusable::Store(e)) => Err(e),
            Err(Unusable::Missing { message, .. }) => {
                missing.push(message);
                Ok(None)
            }
        };
        let it = found(object_for(store, vm, Side::INSTANCETYPE).await)?;
        let pref = found(object_for(store, vm, Side::PREFERENCE).await)?;
        let decoded = (|| {
            Ok::<_, Unusable>(Resolved {
                instancetype: it.map(|o| spec_of(&o, Side::INSTANCETYPE)).transpose()?,
                preference: pref.map(|o| spec_of(&o, Side::PREFERENCE)).transpose()?,
            })
        })();
        match decoded {
            Ok(r) => Ok((r, missing)),
            Err(Unusable::Store(e)) => Err(e),
            Err(Unusable::Missing { message, .. }) => {
                missing.push(message);
                Ok((
                    Resolved {
                        instancetype: None,
                        preference: None,
                    },
                    missing,
                ))
            }
        }
    }

    /// The VM's template spec with both applied, and the annotations they add; `at` is
    /// where the template's spec sits, for the fields of refusals.
    pub fn expand(
        &self,
        vm: &VirtualMachine,
        at: &str,
    ) -> Result<(VirtualMachineInstanceSpec, BTreeMap<String, String>), Vec<FieldError>> {
        let mut spec = vm.spec.template.spec.clone();
        let mut annotations = BTreeMap::new();
        expand(
            &mut spec,
            &mut annotations,
            self.instancetype.as_ref(),
            self.preference.as_ref(),
            at,
        )?;
        Ok((spec, annotations))
    }
}

/// Whether the VM still needs a revision recorded for one of its matchers.
pub fn needs_revisions(vm: &VirtualMachine) -> bool {
    [Side::INSTANCETYPE, Side::PREFERENCE]
        .into_iter()
        .any(|side| side.matcher(vm).is_some() && revision_name(vm, side).is_none())
}

/// Copy each object a VM's matchers name into a `ControllerRevision` owned by the VM and
/// record it in the VM's status, so that later changes to the object do not reach the VM.
/// A matcher whose object does not exist is an [`Unusable::Missing`].
pub async fn keep_revisions(store: &Store, vm: &VirtualMachine) -> Result<(), Unusable> {
    let mut refs = Vec::new();
    for side in [Side::INSTANCETYPE, Side::PREFERENCE] {
        let Some(m) = side.matcher(vm) else {
            continue;
        };
        if revision_name(vm, side).is_some() {
            continue;
        }
        let (kind, obj) = live(store, vm.namespace(), side, m).await?;
        let obj = obj.ok_or_else(|| side.missing(kind, &m.name))?;
        let rev = revision(vm, kind, &obj);
        let name = rev.metadata.name.clone().unwrap_or_default();
        match store.create_typed(&rev).await {
            Ok(_) | Err(Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(namespace = %vm.namespace(), vm = %vm.name(), revision = %name, "kept a revision of {} {:?}", kind.name(), m.name);
        refs.push((
            side,
            StatusRef {
                name: m.name.clone(),
                kind: kind.name().to_string(),
                controller_revision_ref: Some(RevisionRef { name }),
            },
        ));
    }
    if refs.is_empty() {
        return Ok(());
    }
    store
        .update_typed(vm.namespace(), vm.name(), |o: &mut VirtualMachine| {
            let st = o.status.get_or_insert_default();
            for (side, r) in refs {
                if side.preference {
                    st.preference_ref = Some(r);
                } else {
                    st.instancetype_ref = Some(r);
                }
            }
            Ok(())
        })
        .await?;
    Ok(())
}

/// A revision of `obj` (of `kind`) for `vm`: named as KubeVirt names them
/// (`<vm>-<object>-<version>-<uid>-<generation>`), owned by the VM, holding the object
/// without its labels, annotations and bookkeeping.
fn revision(vm: &VirtualMachine, kind: Kind, obj: &Value) -> ControllerRevision {
    let meta = &obj["metadata"];
    let s = |k: &str| meta[k].as_str().unwrap_or_default().to_string();
    let (name, uid) = (s("name"), s("uid"));
    let generation = meta["generation"].as_i64().unwrap_or(1);
    let version = kind.version();
    let mut data = json!({
        "apiVersion": kind.api_version(),
        "kind": kind.name(),
        "metadata": {"name": name, "uid": uid, "generation": generation},
        "spec": obj["spec"],
    });
    if kind.namespaced() {
        data["metadata"]["namespace"] = json!(vm.namespace());
    }
    let labels = BTreeMap::from([
        (OBJECT_NAME.to_string(), name.clone()),
        (OBJECT_KIND.to_string(), kind.name().to_string()),
        (OBJECT_UID.to_string(), uid.clone()),
        (OBJECT_GENERATION.to_string(), generation.to_string()),
        (OBJECT_VERSION.to_string(), version.to_string()),
    ]);
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(format!("{}-{name}-{version}-{uid}-{generation}", vm.name())),
            namespace: Some(vm.namespace().to_string()),
            labels: Some(labels),
            owner_references: Some(vec![vm.owner_reference()]),
            ..Default::default()
        },
        data: Some(RawExtension(data)),
        revision: 1,
    }
}

/// Remove the revisions a VM named `name` in `ns` owned, once it is gone.
pub async fn forget_revisions(store: &Store, ns: &str, name: &str) -> Result<(), Error> {
    let revisions: Vec<ControllerRevision> = store
        .list_typed(
            Some(ns),
            &LabelSelector::default(),
            &FieldSelector::default(),
        )
        .await?;
    for r in revisions {
        let owned = r
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "VirtualMachine" && o.name == name);
        if owned {
            match store
                .delete(ControllerRevision::KIND, ns, r.name(), None)
                .await
            {
                Ok(_) | Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// KubeVirt's common instancetypes and preferences, as edgevirt keeps them
/// (`src/types/instancetype/common.yaml`).
const COMMON: &str = include_str!("../types/instancetype/common.yaml");

/// The common set as objects: each with its kind.
pub fn common_set() -> Vec<(Kind, Value)> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(COMMON)
        .map(|doc| {
            let obj = Value::deserialize(doc).expect("common.yaml parses");
            let kind = obj["kind"]
                .as_str()
                .and_then(Kind::from_name)
                .expect("common.yaml names served kinds");
            (kind, obj)
        })
        .collect()
}

/// Create what is missing of the common set and bring edgevirt's own copies up to this
/// release's values (as virt-operator deploys them); objects an administrator made with the
/// same names are left alone.
pub async fn keep_common_set(store: &Store) -> Result<(), Error> {
    const MANAGED: &str = "app.kubernetes.io/managed-by";
    for (kind, obj) in common_set() {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        match store.get(kind, "", name).await? {
            None => match store.create(kind, obj, false).await {
                Ok(_) | Err(Error::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            },
            Some(have) => {
                let ours = have["metadata"]["labels"][MANAGED] == "edgevirt";
                if ours
                    && (have["spec"] != obj["spec"]
                        || have["metadata"]["labels"] != obj["metadata"]["labels"])
                {
                    let mut next = have.clone();
                    next["spec"] = obj["spec"].clone();
                    next["metadata"]["labels"] = obj["metadata"]["labels"].clone();
                    next["metadata"]["annotations"] = obj["metadata"]["annotations"].clone();
                    store.replace(kind, next, None).await?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::decode;

    /// Every object of the common set passes the checks a client's would, and the sizes
    /// are KubeVirt's.
    #[test]
    fn the_common_set_is_valid() {
        let set = common_set();
        let mut names = std::collections::BTreeSet::new();
        for (kind, obj) in &set {
            let name = obj["metadata"]["name"].as_str().unwrap();
            crate::types::check_subdomain_name("name", name).unwrap();
            assert!(names.insert(name.to_string()), "{name} twice");
            match kind {
                Kind::VirtualMachineClusterInstancetype => {
                    decode::<InstancetypeSpec>(kind.name(), obj["spec"].clone()).unwrap();
                }
                Kind::VirtualMachineClusterPreference => {
                    decode::<PreferenceSpec>(kind.name(), obj["spec"].clone()).unwrap();
                }
                k => panic!("{k:?} in the common set"),
            }
        }
        let find = |n: &str| {
            &set.iter()
                .find(|(_, o)| o["metadata"]["name"] == n)
                .unwrap()
                .1
        };
        assert_eq!(find("u1.medium")["spec"]["cpu"]["guest"], 1);
        assert_eq!(find("u1.medium")["spec"]["memory"]["guest"], "4Gi");
        assert_eq!(find("o1.large")["spec"]["memory"]["overcommitPercent"], 50);
        assert!(names.contains("windows.11") && names.contains("fedora"));
    }
}
