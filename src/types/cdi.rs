//! CDI's `cdi.kubevirt.io/v1beta1` `DataVolume`: a persistent disk filled once from a source
//! (blank, an HTTP download, a registry image, another DataVolume), which VMs name in a
//! `dataVolume` volume or create from `spec.dataVolumeTemplates`.
//!
//! Its `storageClassName` says where the disk lives. On `local` (the default) edgevirt binds
//! it the way CDI binds local storage with `WaitForFirstConsumer`: a DataVolume no VM uses
//! waits; the node that first runs a VM using it fills it there, and every later start of
//! any VM using it goes to that node. Every shared storage pool the nodes mount is a class
//! of its own, named after the pool, bound at once (`Immediate`): one node mounting the
//! pool fills the disk at `POOL/NAMESPACE/NAME.qcow2` (where a `persistentVolumeClaim` of
//! that name is looked for too), any node mounting it runs the VM, and the VM live-migrates
//! without a copy (the disk is ReadWriteMany). [`DataVolumeSpec::check`] holds the rules a
//! spec must pass (every problem at once, as KubeVirt's webhooks report them).

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{FieldError, parse_quantity};

/// The API group of DataVolumes.
pub const GROUP: &str = "cdi.kubevirt.io";

/// The storage class of a node's own disks, the default one.
pub const LOCAL_CLASS: &str = "local";

/// The provisioner of the storage classes of shared pools (one class per pool, named after it).
pub const SHARED_PROVISIONER: &str = "edgevirt.io/shared-pool";

/// The annotation naming the node a DataVolume's disk lives on (set when a VM using it is
/// first scheduled: CDI's `WaitForFirstConsumer`); for a DataVolume on a shared pool, the
/// node that fills it (any node mounting the pool uses it).
pub const NODE_ANNOTATION: &str = "edgevirt.io/datavolume-node";

/// The annotation naming the image (`edgevirt.io/v1` Image, kept by the controller) that
/// holds what `edgevirt image upload` sent for an `upload` DataVolume.
pub const UPLOAD_IMAGE_ANNOTATION: &str = "edgevirt.io/upload-image";

/// The annotation on such an image naming its DataVolume (`namespace/name`).
pub const IMAGE_OWNER_ANNOTATION: &str = "edgevirt.io/datavolume";

/// The largest disk a DataVolume may ask for (64 TiB).
pub const MAX_BYTES: u64 = 64 << 40;

/// CDI's phases, as `status.phase` spells them.
pub mod phase {
    pub const PENDING: &str = "Pending";
    pub const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";
    pub const UPLOAD_READY: &str = "UploadReady";
    pub const IMPORT_IN_PROGRESS: &str = "ImportInProgress";
    pub const CLONE_IN_PROGRESS: &str = "CloneInProgress";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const FAILED: &str = "Failed";
}

/// What a DataVolume holds: where its disk's contents come from, and the disk's size and
/// storage class.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "DataVolume",
    namespaced,
    status = "DataVolumeStatus",
    shortname = "dv",
    shortname = "dvs",
    category = "all",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"The phase the DataVolume is in"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress","description":"Transfer progress in percentage if known, N/A otherwise"}"#,
    printcolumn = r#"{"name":"Restarts","type":"integer","jsonPath":".status.restartCount","description":"The number of times the transfer has been restarted."}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct DataVolumeSpec {
    /// Where the disk's contents come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<DataVolumeSource>,
    /// The claim's size and class, as a `PersistentVolumeClaimSpec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<StorageSpec>,
    /// The same, in CDI's newer form (`storage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,
    /// `kubevirt` (a disk image; the default) or `archive` (a tar of files: refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Allocate the whole disk up front.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preallocation: Option<bool>,
    /// Accepted without effect: imports run on the node as they come.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

/// One source; exactly one must be set.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct DataVolumeSource {
    /// An empty disk of the requested size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blank: Option<Blank>,
    /// A disk image (qcow2 or raw) downloaded over HTTP or HTTPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSource>,
    /// The disk inside a containerDisk image (`docker://registry/repository:tag`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistrySource>,
    /// A copy of another DataVolume's disk (CDI's clone of its PVC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PvcSource>,
    /// A disk image sent by `edgevirt image upload` (CDI's `virtctl image-upload`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<Blank>,
    /// edgevirt's: a volume's disk out of a `VirtualMachineBackup` of the same namespace,
    /// read from its backup chain (verified first) by a node that mounts its target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSource>,
}

/// A volume of a backup.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct BackupSource {
    /// The `VirtualMachineBackup` (it must be done).
    pub name: String,
    /// The backed-up VM's volume.
    pub volume: String,
}

/// CDI's `DataVolumeBlankImage`: no fields.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Blank {}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct HttpSource {
    /// The image's http:// or https:// URL, at most 2048 characters.
    pub url: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct RegistrySource {
    /// The image reference with a `docker://` prefix (`docker://registry/repository:tag`);
    /// other schemes are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `pod` or `node`: edgevirt always pulls on the node, through its image cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_method: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct PvcSource {
    /// The DataVolume whose disk is copied.
    pub name: String,
    /// Its namespace: only the DataVolume's own is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// The parts of a claim spec a DataVolume's disk uses.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct StorageSpec {
    /// ReadWriteOnce, ReadOnlyMany, ReadWriteMany or ReadWriteOncePod: checked and kept; the
    /// storage class decides which nodes can use the disk.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_modes: Vec<String>,
    /// The disk's size, as `requests.storage`; no other resource may be named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<StorageResources>,
    /// `local` (the node's own disk; the default) or the class of a shared pool a node
    /// mounts, named after the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// `Filesystem` or `Block`: either way the disk is a file on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct StorageResources {
    /// `storage`: the disk's size, a quantity more than 0 and at most 64Ti (required).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, String>,
    /// Only `storage` may be named; it has no effect.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
}

/// How filling the DataVolume's disk goes, as the controller and the node filling it report
/// it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeStatus {
    /// CDI's phase: Pending, WaitForFirstConsumer, UploadReady, ImportInProgress,
    /// CloneInProgress, Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `"42.17%"` while it fills, `"100.0%"` once done, `"N/A"` when the size is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// How many times filling the disk was restarted after a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_count: Option<i32>,
    /// The claim it stands for (edgevirt's disk has the DataVolume's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// The DataVolume's conditions: `Bound`, `Ready` and `Running`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<DataVolumeCondition>,
}

/// CDI's conditions: `Bound`, `Ready`, `Running`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeCondition {
    /// `Bound`, `Ready` or `Running`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A one-word reason for the status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable explanation of the status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// When the condition was last updated (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<String>,
}

/// What a DataVolume's source is, once checked.
#[derive(Clone, Debug, PartialEq)]
pub enum Fill {
    Blank,
    Http(String),
    /// An image reference without `docker://`.
    Registry(String),
    /// Another DataVolume: namespace and name.
    Clone(String, String),
    /// What `edgevirt image upload` sent.
    Upload,
    /// A volume of a backup in the same namespace: the backup's name and the volume.
    Backup(String, String),
}

impl DataVolumeSpec {
    /// The claim spec in use: `storage`, else `pvc`.
    pub fn claim(&self) -> Option<&StorageSpec> {
        self.storage.as_ref().or(self.pvc.as_ref())
    }

    /// Whether `new` differs from this spec only by a larger size (the one change a
    /// DataVolume takes, as a PVC's expansion): `Ok(true)` when it grows, `Ok(false)` when
    /// nothing changed, `Err` with the reason otherwise.
    pub fn check_update(&self, new: &DataVolumeSpec) -> Result<bool, String> {
        let field = if new.storage.is_some() {
            "spec.storage.resources.requests.storage"
        } else {
            "spec.pvc.resources.requests.storage"
        };
        let (old_size, new_size) = (self.size(), new.size());
        let mut same = new.clone();
        if let (Some(c), Some(old_q)) = (
            same.storage.as_mut().or(same.pvc.as_mut()),
            self.claim()
                .and_then(|c| c.resources.as_ref())
                .and_then(|r| r.requests.get("storage")),
        ) && let Some(r) = c.resources.as_mut()
        {
            r.requests.insert("storage".into(), old_q.clone());
        }
        if &same != self {
            return Err(
                "the spec of a DataVolume cannot be changed once created (as in CDI), except \
                 to grow its size; create another one"
                    .into(),
            );
        }
        match (old_size, new_size) {
            (Some(o), Some(n)) if n < o => Err(format!(
                "{field}: a DataVolume can only grow, not shrink from {o} to {n} bytes (the \
                 guest's data past the new end would be lost)"
            )),
            (Some(o), Some(n)) => Ok(n > o),
            _ => Ok(false),
        }
    }

    /// The storage class it asks for: `local` unless it names a shared pool.
    pub fn storage_class(&self) -> &str {
        self.claim()
            .and_then(|c| c.storage_class_name.as_deref())
            .unwrap_or(LOCAL_CLASS)
    }

    /// The shared pool its disk lives on, when its class names one.
    pub fn shared_pool(&self) -> Option<&str> {
        Some(self.storage_class()).filter(|c| *c != LOCAL_CLASS)
    }

    /// The requested size in bytes (checked by [`DataVolumeSpec::check`]).
    pub fn size(&self) -> Option<u64> {
        self.claim()
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.requests.get("storage"))
            .and_then(|q| parse_quantity(q).ok())
    }

    /// The source, checked (the DataVolume lives in `ns`).
    pub fn fill(&self, ns: &str) -> Option<Fill> {
        let s = self.source.as_ref()?;
        if s.blank.is_some() {
            Some(Fill::Blank)
        } else if let Some(h) = &s.http {
            Some(Fill::Http(h.url.clone()))
        } else if let Some(r) = &s.registry {
            let url = r.url.as_deref()?;
            Some(Fill::Registry(url.strip_prefix("docker://")?.to_string()))
        } else if s.upload.is_some() {
            Some(Fill::Upload)
        } else if let Some(b) = &s.backup {
            Some(Fill::Backup(b.name.clone(), b.volume.clone()))
        } else {
            s.pvc.as_ref().map(|p| {
                Fill::Clone(
                    p.namespace.clone().unwrap_or_else(|| ns.to_string()),
                    p.name.clone(),
                )
            })
        }
    }

    /// Its storage class, unless it is one of `classes` (the storage classes that exist:
    /// `local` and one per shared pool).
    pub fn check_class(&self, classes: &[String], at: &str) -> Option<FieldError> {
        let class = self.storage_class();
        if class == LOCAL_CLASS || classes.iter().any(|c| c == class) {
            return None;
        }
        let field = if self.storage.is_some() {
            "storage"
        } else {
            "pvc"
        };
        let mut offered = vec![format!("{LOCAL_CLASS:?} (the node's own disk)")];
        offered.extend(
            classes
                .iter()
                .filter(|c| *c != LOCAL_CLASS)
                .map(|c| format!("{c:?} (shared pool)")),
        );
        Some(FieldError {
            field: format!("{at}.{field}.storageClassName"),
            reason: "FieldValueNotFound",
            message: format!(
                "storage class {class:?} does not exist: edgevirt offers {}; a shared pool's \
                 class appears once a node mounts it (serve --shared-pool NAME=PATH)",
                offered.join(", ")
            ),
        })
    }

    /// Every problem of the spec (at `at`, e.g. `spec` or `spec.dataVolumeTemplates[0].spec`)
    /// for a DataVolume in `ns`.
    pub fn check(&self, ns: &str, at: &str) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let mut bad = |field: String, message: String| {
            errs.push(FieldError {
                field,
                reason: "FieldValueInvalid",
                message,
            })
        };
        match &self.source {
            None => bad(
                format!("{at}.source"),
                "required: one of blank, http, registry, pvc, upload or backup (sourceRef \
                 is not supported yet)"
                    .into(),
            ),
            Some(s) => {
                let n = [
                    s.blank.is_some(),
                    s.http.is_some(),
                    s.registry.is_some(),
                    s.pvc.is_some(),
                    s.upload.is_some(),
                    s.backup.is_some(),
                ]
                .iter()
                .filter(|b| **b)
                .count();
                if n != 1 {
                    bad(
                        format!("{at}.source"),
                        format!("exactly one source must be set, not {n}"),
                    );
                }
                if let Some(h) = &s.http {
                    let f = format!("{at}.source.http.url");
                    match reqwest::Url::parse(&h.url) {
                        _ if h.url.len() > 2048 => bad(f, "longer than 2048 characters".into()),
                        Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => {}
                        _ => bad(f, format!("{:?} is not an http:// or https:// URL", h.url)),
                    }
                }
                if let Some(r) = &s.registry {
                    let f = format!("{at}.source.registry");
                    match r.url.as_deref().map(|u| (u, u.strip_prefix("docker://"))) {
                        None => bad(
                            format!("{f}.url"),
                            "required (imageStream is not supported: it needs OpenShift)".into(),
                        ),
                        Some((u, None)) => bad(
                            format!("{f}.url"),
                            format!("{u:?}: only docker:// image references are supported"),
                        ),
                        // The reference's syntax is the registry layer's to check
                        // (admission does).
                        Some(_) => {}
                    }
                    if let Some(m) = r.pull_method.as_deref()
                        && !matches!(m, "pod" | "node")
                    {
                        bad(
                            format!("{f}.pullMethod"),
                            format!("{m:?}: must be pod or node"),
                        );
                    }
                }
                if let Some(b) = &s.backup {
                    let f = format!("{at}.source.backup");
                    if let Err(e) = super::check_name("name", &b.name) {
                        bad(format!("{f}.name"), e.0);
                    }
                    if let Err(e) = super::check_name("volume", &b.volume) {
                        bad(format!("{f}.volume"), e.0);
                    }
                }
                if let Some(p) = &s.pvc {
                    let f = format!("{at}.source.pvc");
                    if let Err(e) = super::check_name("name", &p.name) {
                        bad(format!("{f}.name"), e.0);
                    }
                    if let Some(other) = p.namespace.as_deref()
                        && other != ns
                    {
                        bad(
                            format!("{f}.namespace"),
                            format!(
                                "{other:?}: cloning from another namespace is not supported \
                                 yet; clone within {ns:?}"
                            ),
                        );
                    }
                }
            }
        }
        match (&self.pvc, &self.storage) {
            (None, None) => bad(
                format!("{at}.storage"),
                "required: storage (or pvc) with resources.requests.storage".into(),
            ),
            (Some(_), Some(_)) => bad(
                format!("{at}.pvc"),
                "pvc and storage are mutually exclusive; set only storage".into(),
            ),
            _ => {}
        }
        if let Some(c) = self.claim() {
            let f = if self.storage.is_some() {
                format!("{at}.storage")
            } else {
                format!("{at}.pvc")
            };
            let req = c.resources.as_ref().and_then(|r| r.requests.get("storage"));
            match req.map(|q| (q, parse_quantity(q))) {
                None => bad(
                    format!("{f}.resources.requests.storage"),
                    "required: the disk's size (e.g. 10Gi)".into(),
                ),
                Some((q, Err(e))) => bad(
                    format!("{f}.resources.requests.storage"),
                    format!("{q:?}: {e}"),
                ),
                Some((q, Ok(b))) if b == 0 || b > MAX_BYTES => bad(
                    format!("{f}.resources.requests.storage"),
                    format!("{q:?}: must be more than 0 and at most 64Ti"),
                ),
                Some(_) => {}
            }
            if let Some(r) = &c.resources {
                for k in r.requests.keys().chain(r.limits.keys()) {
                    if k != "storage" {
                        bad(
                            format!("{f}.resources"),
                            format!("{k:?}: only storage can be requested for a disk"),
                        );
                    }
                }
            }
            for m in &c.access_modes {
                if !matches!(
                    m.as_str(),
                    "ReadWriteOnce" | "ReadOnlyMany" | "ReadWriteMany" | "ReadWriteOncePod"
                ) {
                    bad(
                        format!("{f}.accessModes"),
                        format!(
                            "{m:?}: must be ReadWriteOnce, ReadOnlyMany, ReadWriteMany or \
                             ReadWriteOncePod"
                        ),
                    );
                }
            }
            if let Some(m) = c.volume_mode.as_deref()
                && !matches!(m, "Filesystem" | "Block")
            {
                bad(
                    format!("{f}.volumeMode"),
                    format!("{m:?}: must be Filesystem or Block"),
                );
            }
        }
        if let Some(t) = self.content_type.as_deref()
            && t != "kubevirt"
        {
            bad(
                format!("{at}.contentType"),
                format!("{t:?}: only kubevirt (a disk image) is supported"),
            );
        }
        errs
    }
}

/// The DataVolumes a VM's `dataVolumeTemplates` entry describes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct DataVolumeTemplateSpec {
    /// Kept as written; the template always makes a `cdi.kubevirt.io/v1beta1` DataVolume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kept as written; the template always makes a DataVolume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub metadata: DataVolumeTemplateMeta,
    /// The spec of the DataVolume made from this template.
    pub spec: DataVolumeSpec,
    /// KubeVirt's placeholder; ignored.
    #[serde(default, skip_serializing)]
    pub status: Option<serde_json::Value>,
}

/// The part of `ObjectMeta` a DataVolume template carries.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeTemplateMeta {
    /// The DataVolume's name, which the VM's `dataVolume` volumes use; unique among the VM's
    /// templates.
    #[serde(default)]
    pub name: String,
    /// Labels the DataVolume gets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations the DataVolume gets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// KubeVirt's generated templates often carry `creationTimestamp: null`; ignored.
    #[serde(default, skip_serializing)]
    pub creation_timestamp: Option<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> DataVolumeSpec {
        serde_json::from_value(v).unwrap()
    }

    /// A DataVolume may only grow: a larger size is taken, a smaller one or any other
    /// change refused, each with its reason.
    #[test]
    fn a_datavolume_only_grows() {
        let of = |size: &str, class: Option<&str>| {
            let mut storage = serde_json::json!({"resources": {"requests": {"storage": size}}});
            if let Some(c) = class {
                storage["storageClassName"] = c.into();
            }
            spec(serde_json::json!({"source": {"blank": {}}, "storage": storage}))
        };
        let two = of("2Gi", None);
        assert_eq!(two.check_update(&of("4Gi", None)), Ok(true));
        assert_eq!(two.check_update(&of("2048Mi", None)), Ok(false));
        let e = two.check_update(&of("1Gi", None)).unwrap_err();
        assert!(
            e.starts_with("spec.storage.resources.requests.storage: a DataVolume can only grow"),
            "{e}"
        );
        let e = two.check_update(&of("4Gi", Some("site"))).unwrap_err();
        assert!(e.contains("except to grow its size"), "{e}");
        let pvc = spec(serde_json::json!({"source": {"blank": {}},
            "pvc": {"resources": {"requests": {"storage": "1Gi"}}}}));
        let bigger = spec(serde_json::json!({"source": {"blank": {}},
            "pvc": {"resources": {"requests": {"storage": "3Gi"}}}}));
        assert_eq!(pvc.check_update(&bigger), Ok(true));
        assert!(
            bigger
                .check_update(&pvc)
                .unwrap_err()
                .starts_with("spec.pvc.")
        );
    }

    fn problems(v: serde_json::Value) -> Vec<String> {
        spec(v)
            .check("default", "spec")
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    #[test]
    fn a_backup_source_names_a_backup_and_a_volume_of_this_namespace() {
        let storage = serde_json::json!({"resources": {"requests": {"storage": "67108864"}}});
        let s = spec(serde_json::json!({
            "source": {"backup": {"name": "b2", "volume": "data"}}, "storage": storage
        }));
        assert!(s.check("default", "spec").is_empty());
        assert_eq!(s.size(), Some(64 << 20));
        assert_eq!(
            s.fill("default"),
            Some(Fill::Backup("b2".into(), "data".into()))
        );
        let p = problems(serde_json::json!({
            "source": {"backup": {"name": "../../etc", "volume": "a/b"}}, "storage": storage
        }));
        assert!(
            p.iter().any(|m| m.starts_with("spec.source.backup.name:"))
                && p.iter()
                    .any(|m| m.starts_with("spec.source.backup.volume:")),
            "{p:?}"
        );
        let p = problems(serde_json::json!({
            "source": {"backup": {"name": "b2", "volume": "data"}, "blank": {}}, "storage": storage
        }));
        assert!(p.iter().any(|m| m.contains("exactly one source")), "{p:?}");
    }

    #[test]
    fn kubevirts_example_passes_and_fills_from_the_registry() {
        let s = spec(serde_json::json!({
            "pvc": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}},
                    "storageClassName": "local"},
            "source": {"registry": {"url": "docker://registry:5000/kubevirt/alpine-container-disk-demo:devel"}}
        }));
        assert!(s.check("default", "spec").is_empty());
        assert_eq!(s.size(), Some(2 << 30));
        assert_eq!(
            s.fill("default"),
            Some(Fill::Registry(
                "registry:5000/kubevirt/alpine-container-disk-demo:devel".into()
            ))
        );
    }

    #[test]
    fn every_problem_is_named_at_once() {
        let p = problems(serde_json::json!({
            "source": {"blank": {}, "http": {"url": "file:///etc/shadow"}},
            "storage": {"resources": {"requests": {"storage": "lots", "cpu": "1"}},
                        "storageClassName": "ceph", "accessModes": ["Sometimes"], "volumeMode": "Tape"},
            "contentType": "archive"
        }));
        let joined = p.join("\n");
        for needle in [
            "spec.source: exactly one source",
            "spec.source.http.url: \"file:///etc/shadow\"",
            "spec.storage.resources.requests.storage: \"lots\"",
            "spec.storage.resources: \"cpu\"",
            "spec.storage.accessModes: \"Sometimes\"",
            "spec.storage.volumeMode: \"Tape\"",
            "spec.contentType: \"archive\"",
        ] {
            assert!(joined.contains(needle), "{needle} in:\n{joined}");
        }
        let p = problems(serde_json::json!({}));
        assert_eq!(p.len(), 2, "{p:?}");
        let ceph = spec(serde_json::json!({"storage": {"storageClassName": "ceph"}}));
        let e = ceph
            .check_class(&["local".into(), "site".into()], "spec")
            .expect("an unknown class is refused");
        assert_eq!(e.field, "spec.storage.storageClassName");
        assert!(
            e.message.contains("\"site\" (shared pool)"),
            "{}",
            e.message
        );
        let site = spec(serde_json::json!({"pvc": {"storageClassName": "site"}}));
        assert_eq!(site.check_class(&["site".into()], "spec"), None);
        assert_eq!(site.shared_pool(), Some("site"));
        assert_eq!(spec(serde_json::json!({})).shared_pool(), None);
        let p = problems(serde_json::json!({
            "source": {"registry": {"url": "https://quay.io/x"}, },
            "pvc": {"resources": {"requests": {"storage": "1Gi"}}},
            "storage": {"resources": {"requests": {"storage": "0"}}}
        }));
        assert!(p.iter().any(|m| m.contains("only docker://")), "{p:?}");
        assert!(p.iter().any(|m| m.contains("mutually exclusive")), "{p:?}");
        assert!(p.iter().any(|m| m.contains("more than 0")), "{p:?}");
        let p = problems(serde_json::json!({
            "source": {"pvc": {"name": "../x", "namespace": "other"}},
            "storage": {"resources": {"requests": {"storage": "65Ti"}}}
        }));
        assert_eq!(p.len(), 3, "{p:?}");
    }

    #[test]
    fn sources_resolve() {
        let s = spec(serde_json::json!({"source": {"pvc": {"name": "golden"}},
            "storage": {"resources": {"requests": {"storage": "1Gi"}}}}));
        assert_eq!(
            s.fill("team"),
            Some(Fill::Clone("team".into(), "golden".into()))
        );
        let s = spec(
            serde_json::json!({"source": {"http": {"url": "https://example.com/d.qcow2"}},
            "storage": {"resources": {"requests": {"storage": "1Gi"}}}}),
        );
        assert!(s.check("team", "spec").is_empty());
        assert_eq!(
            s.fill("team"),
            Some(Fill::Http("https://example.com/d.qcow2".into()))
        );
    }
}
