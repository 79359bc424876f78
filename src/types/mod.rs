//! Resource types and the checks every write goes through before it reaches the store:
//! names, the KubeVirt fields edgevirt does not support yet, quantities.

pub mod backup;
pub mod cdi;
pub mod cni;
pub mod edgevirt;
pub mod instancetype;
pub mod object;
mod open_enum;
pub mod snapshot;

/// Annotations and finalizers edgevirt uses to record intent on objects.
pub mod annotations {
    /// Keeps a VM until its volumes are removed.
    pub const VOLUMES_FINALIZER: &str = "edgevirt.io/volumes";
    /// Keeps a VMI until its domain is gone.
    pub const LAUNCHER_FINALIZER: &str = "edgevirt.io/launcher";
    /// On a VM: the node that holds its volumes.
    pub const VOLUMES_NODE_ANNOTATION: &str = "edgevirt.io/volumes-node";
    /// On a VMI: the desired pause state (`"true"` when paused).
    pub const PAUSED_ANNOTATION: &str = "edgevirt.io/paused";
    /// The host CPUs the scheduler gave an instance with dedicated CPUs
    /// (`vcpus=2,3;emulator=1`).
    pub const DEDICATED_CPUS_ANNOTATION: &str = "edgevirt.io/dedicated-cpus";
    /// On a VMI: the latest soft-reboot request (a counter).
    pub const SOFTREBOOT_ANNOTATION: &str = "edgevirt.io/softreboot-requested";
    /// On a VMI: the last soft-reboot request the agent carried out.
    pub const SOFTREBOOT_DONE_ANNOTATION: &str = "edgevirt.io/softreboot-done";
    /// Keeps a migration until its agents are done with it (an abort, when it is deleted
    /// while running).
    pub const MIGRATION_FINALIZER: &str = "edgevirt.io/migration";
    /// `"true"` on a migration: copy the instance's local disks (block migration). On a
    /// VMI (or a VM's template): its local disks may always be copied, so it counts as
    /// live-migratable, by block migration.
    pub const BLOCK_MIGRATION_ANNOTATION: &str = "edgevirt.io/block-migration";
    /// On a VMI: its filesystems are to stay frozen (the `freeze` subresource) until this
    /// time (RFC 3339), when the node thaws them unless `unfreeze` came first.
    pub const FREEZE_ANNOTATION: &str = "edgevirt.io/frozen-until";
}
pub mod kubevirt;
pub mod schema;

use serde::de::DeserializeOwned;
use serde_json::Value;

pub use edgevirt::{Image, Node};
pub use kubevirt::{VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration};
pub use object::{Meta, Typed};

/// The current time as RFC 3339 with second precision, as Kubernetes writes timestamps.
/// Kubernetes-style age of an RFC 3339 timestamp, as `kubectl get` prints it.
pub fn age(ts: &str) -> String {
    let Ok(t) = chrono::DateTime::parse_from_rfc3339(ts) else {
        return "<unknown>".into();
    };
    human_duration((chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds())
}

/// The rounding of Kubernetes' `duration.HumanDuration`: 45s, 3m20s, 2h5m, 4d, 2y3d.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    if s < 120 {
        return format!("{s}s");
    }
    let (m, h) = (s / 60, s / 3600);
    let with = |big: i64, unit: &str, small: i64, sunit: &str| {
        if small == 0 {
            format!("{big}{unit}")
        } else {
            format!("{big}{unit}{small}{sunit}")
        }
    };
    if m < 10 {
        with(m, "m", s % 60, "s")
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        with(h, "h", m % 60, "m")
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        with(h / 24, "d", h % 24, "h")
    } else if h < 24 * 365 * 2 {
        format!("{}d", h / 24)
    } else if h < 24 * 365 * 8 {
        with(h / 24 / 365, "y", (h / 24) % 365, "d")
    } else {
        format!("{}y", h / 24 / 365)
    }
}

pub fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A kind edgevirt stores, with the names the API uses for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    VirtualMachine,
    VirtualMachineInstance,
    VirtualMachineInstanceMigration,
    Node,
    Image,
    /// Core `v1` namespaces: a name scope, as in Kubernetes; `default` always exists.
    Namespace,
    /// Core `v1` secrets: registry credentials a containerDisk's `imagePullSecret` names.
    /// Only operators, administrators and agents read them.
    Secret,
    /// Core `v1` config maps: files a VM's `configMap` volume presents to the guest.
    ConfigMap,
    /// `instancetype.kubevirt.io/v1beta1`: a VM size in a namespace.
    VirtualMachineInstancetype,
    /// A VM size for every namespace; edgevirt ships KubeVirt's common set.
    VirtualMachineClusterInstancetype,
    /// What a guest OS prefers, in a namespace.
    VirtualMachinePreference,
    /// What a guest OS prefers, for every namespace; edgevirt ships a common set.
    VirtualMachineClusterPreference,
    /// `apps/v1`: the copy of an instancetype or preference a VM keeps using.
    ControllerRevision,
    /// `cdi.kubevirt.io/v1beta1`: a persistent disk filled once from a source.
    DataVolume,
    /// `storage.k8s.io/v1`: where DataVolumes' disks live; edgevirt keeps `local`.
    StorageClass,
    /// Core `v1` events: what happened to an object, recorded by the controller as KubeVirt
    /// records them, deduplicated with a count and pruned by age.
    Event,
    /// Multus' `k8s.cni.cncf.io/v1`: a host bridge (and VLAN) VMs join with a `multus`
    /// network and a `bridge` interface.
    NetworkAttachmentDefinition,
    /// `snapshot.kubevirt.io/v1beta1`: a point-in-time copy of a VM, asked for.
    VirtualMachineSnapshot,
    /// What a snapshot holds: the VM's spec and its disk copies.
    VirtualMachineSnapshotContent,
    /// Put a VM back to a snapshot.
    VirtualMachineRestore,
    /// `backup.kubevirt.io/v1alpha1`: a VM's spec and disks copied to a backup target.
    VirtualMachineBackup,
    /// `edgevirt.io/v1`: back up VMs on a schedule and prune old backups.
    BackupSchedule,
}

impl Kind {
    pub const ALL: [Kind; 22] = [
        Kind::VirtualMachine,
        Kind::VirtualMachineInstance,
        Kind::VirtualMachineInstanceMigration,
        Kind::Node,
        Kind::Image,
        Kind::Namespace,
        Kind::Secret,
        Kind::ConfigMap,
        Kind::VirtualMachineInstancetype,
        Kind::VirtualMachineClusterInstancetype,
        Kind::VirtualMachinePreference,
        Kind::VirtualMachineClusterPreference,
        Kind::ControllerRevision,
        Kind::DataVolume,
        Kind::StorageClass,
        Kind::Event,
        Kind::NetworkAttachmentDefinition,
        Kind::VirtualMachineSnapshot,
        Kind::VirtualMachineSnapshotContent,
        Kind::VirtualMachineRestore,
        Kind::VirtualMachineBackup,
        Kind::BackupSchedule,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::VirtualMachine => "VirtualMachine",
            Kind::VirtualMachineInstance => "VirtualMachineInstance",
            Kind::VirtualMachineInstanceMigration => "VirtualMachineInstanceMigration",
            Kind::Node => "Node",
            Kind::Image => "Image",
            Kind::Namespace => "Namespace",
            Kind::Secret => "Secret",
            Kind::ConfigMap => "ConfigMap",
            Kind::VirtualMachineInstancetype => "VirtualMachineInstancetype",
            Kind::VirtualMachineClusterInstancetype => "VirtualMachineClusterInstancetype",
            Kind::VirtualMachinePreference => "VirtualMachinePreference",
            Kind::VirtualMachineClusterPreference => "VirtualMachineClusterPreference",
            Kind::ControllerRevision => "ControllerRevision",
            Kind::DataVolume => "DataVolume",
            Kind::StorageClass => "StorageClass",
            Kind::Event => "Event",
            Kind::NetworkAttachmentDefinition => "NetworkAttachmentDefinition",
            Kind::VirtualMachineSnapshot => "VirtualMachineSnapshot",
            Kind::VirtualMachineSnapshotContent => "VirtualMachineSnapshotContent",
            Kind::VirtualMachineRestore => "VirtualMachineRestore",
            Kind::VirtualMachineBackup => "VirtualMachineBackup",
            Kind::BackupSchedule => "BackupSchedule",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            Kind::VirtualMachine => "virtualmachines",
            Kind::VirtualMachineInstance => "virtualmachineinstances",
            Kind::VirtualMachineInstanceMigration => "virtualmachineinstancemigrations",
            Kind::Node => "nodes",
            Kind::Image => "images",
            Kind::Namespace => "namespaces",
            Kind::Secret => "secrets",
            Kind::ConfigMap => "configmaps",
            Kind::VirtualMachineInstancetype => "virtualmachineinstancetypes",
            Kind::VirtualMachineClusterInstancetype => "virtualmachineclusterinstancetypes",
            Kind::VirtualMachinePreference => "virtualmachinepreferences",
            Kind::VirtualMachineClusterPreference => "virtualmachineclusterpreferences",
            Kind::ControllerRevision => "controllerrevisions",
            Kind::DataVolume => "datavolumes",
            Kind::StorageClass => "storageclasses",
            Kind::Event => "events",
            Kind::NetworkAttachmentDefinition => "network-attachment-definitions",
            Kind::VirtualMachineSnapshot => "virtualmachinesnapshots",
            Kind::VirtualMachineSnapshotContent => "virtualmachinesnapshotcontents",
            Kind::VirtualMachineRestore => "virtualmachinerestores",
            Kind::VirtualMachineBackup => "virtualmachinebackups",
            Kind::BackupSchedule => "backupschedules",
        }
    }

    pub fn group(self) -> &'static str {
        match self {
            Kind::VirtualMachine
            | Kind::VirtualMachineInstance
            | Kind::VirtualMachineInstanceMigration => "kubevirt.io",
            Kind::Node | Kind::Image | Kind::BackupSchedule => "edgevirt.io",
            Kind::Namespace | Kind::Secret | Kind::ConfigMap | Kind::Event => "",
            Kind::VirtualMachineInstancetype
            | Kind::VirtualMachineClusterInstancetype
            | Kind::VirtualMachinePreference
            | Kind::VirtualMachineClusterPreference => instancetype::GROUP,
            Kind::ControllerRevision => "apps",
            Kind::DataVolume => cdi::GROUP,
            Kind::StorageClass => "storage.k8s.io",
            Kind::NetworkAttachmentDefinition => cni::GROUP,
            Kind::VirtualMachineSnapshot
            | Kind::VirtualMachineSnapshotContent
            | Kind::VirtualMachineRestore => snapshot::GROUP,
            Kind::VirtualMachineBackup => backup::GROUP,
        }
    }

    /// The version it is served at (one per group).
    pub fn version(self) -> &'static str {
        version_of(self.group())
    }

    pub fn api_version(self) -> String {
        match self.group() {
            "" => "v1".to_string(),
            g => format!("{g}/{}", self.version()),
        }
    }

    /// The path prefix of its group and version: `/apis/<group>/<version>`, or `/api/v1`
    /// for core.
    pub fn path_prefix(self) -> String {
        match self.group() {
            "" => "/api/v1".to_string(),
            g => format!("/apis/{g}/{}", self.version()),
        }
    }

    pub fn namespaced(self) -> bool {
        matches!(
            self,
            Kind::VirtualMachine
                | Kind::VirtualMachineInstance
                | Kind::VirtualMachineInstanceMigration
                | Kind::Secret
                | Kind::ConfigMap
                | Kind::VirtualMachineInstancetype
                | Kind::VirtualMachinePreference
                | Kind::ControllerRevision
                | Kind::DataVolume
                | Kind::Event
                | Kind::NetworkAttachmentDefinition
                | Kind::VirtualMachineSnapshot
                | Kind::VirtualMachineSnapshotContent
                | Kind::VirtualMachineRestore
                | Kind::VirtualMachineBackup
                | Kind::BackupSchedule
        )
    }

    /// The CRD its Rust type derives (names, short names, schema, printer columns); `None`
    /// for the core and `apps` kinds, which are Kubernetes' own.
    pub fn crd(
        self,
    ) -> Option<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
    {
        use kube::CustomResourceExt;
        Some(match self {
            Kind::VirtualMachine => kubevirt::VirtualMachine::crd(),
            Kind::VirtualMachineInstance => kubevirt::VirtualMachineInstance::crd(),
            Kind::VirtualMachineInstanceMigration => {
                kubevirt::VirtualMachineInstanceMigration::crd()
            }
            Kind::Node => edgevirt::Node::crd(),
            Kind::Image => edgevirt::Image::crd(),
            Kind::VirtualMachineInstancetype => instancetype::VirtualMachineInstancetype::crd(),
            Kind::VirtualMachineClusterInstancetype => {
                instancetype::VirtualMachineClusterInstancetype::crd()
            }
            Kind::VirtualMachinePreference => instancetype::VirtualMachinePreference::crd(),
            Kind::VirtualMachineClusterPreference => {
                instancetype::VirtualMachineClusterPreference::crd()
            }
            Kind::DataVolume => cdi::DataVolume::crd(),
            Kind::NetworkAttachmentDefinition => cni::NetworkAttachmentDefinition::crd(),
            Kind::VirtualMachineSnapshot => snapshot::VirtualMachineSnapshot::crd(),
            Kind::VirtualMachineSnapshotContent => snapshot::VirtualMachineSnapshotContent::crd(),
            Kind::VirtualMachineRestore => snapshot::VirtualMachineRestore::crd(),
            Kind::VirtualMachineBackup => backup::VirtualMachineBackup::crd(),
            Kind::BackupSchedule => backup::BackupSchedule::crd(),
            Kind::Namespace
            | Kind::Secret
            | Kind::ConfigMap
            | Kind::ControllerRevision
            | Kind::StorageClass
            | Kind::Event => {
                return None;
            }
        })
    }

    pub fn from_plural(group: &str, plural: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.group() == group && k.plural() == plural)
    }

    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// The version a group is served at: `v1beta1` for instancetypes, DataVolumes and snapshots,
/// `v1` for the rest.
pub fn version_of(group: &str) -> &'static str {
    if group == instancetype::GROUP || group == cdi::GROUP || group == snapshot::GROUP {
        "v1beta1"
    } else if group == backup::GROUP {
        "v1alpha1"
    } else {
        "v1"
    }
}

/// An older group/version served as the current one: KubeVirt's `kubevirt.io/v1alpha3`
/// (the same schema as `v1`, which KubeVirt still serves).
pub fn is_alias(api_version: &str) -> bool {
    api_version == "kubevirt.io/v1alpha3"
}

/// A Kubernetes (Go) duration such as `5m`, `1h30m`, `90s`, `250ms` or `1.5h`.
pub fn parse_duration(s: &str) -> Option<std::time::Duration> {
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    if rest == "0" {
        return Some(std::time::Duration::ZERO);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|n| *n > 0)?;
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            _ => return None,
        };
        total += value * unit;
        rest = &rest[u..];
    }
    (total.is_finite() && total < 1e12).then(|| std::time::Duration::from_secs_f64(total))
}

/// A check of user input failed; the message names the field and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// One plain file name, as Kubernetes allows ConfigMap and Secret keys: letters, digits,
/// '-', '_' and '.', at most 253 bytes, and not `.` or `..`. Data keys and downward API path
/// parts become file names in the guest, so this is never a path.
pub fn is_file_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
}

/// DNS-1123 label: lowercase alphanumerics and '-', starting and ending alphanumeric, ≤ 63.
pub fn check_name(what: &str, name: &str) -> Result<(), Invalid> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(Invalid(format!(
            "{what} {name:?} is invalid: a lowercase RFC 1123 label must consist of lower case \
             alphanumeric characters or '-', start and end with an alphanumeric character, \
             and be at most 63 characters"
        )))
    }
}

/// A DNS-1123 subdomain name (lowercase labels joined by dots, ≤ 253), as Kubernetes allows
/// for most kinds (`u1.medium`).
pub fn check_subdomain_name(what: &str, name: &str) -> Result<(), Invalid> {
    if !name.is_empty() && dns_subdomain(name) {
        Ok(())
    } else {
        Err(Invalid(format!(
            "{what} {name:?} is invalid: a lowercase RFC 1123 subdomain must consist of lower \
             case alphanumeric characters, '-' or '.', start and end with an alphanumeric \
             character, and be at most 253 characters"
        )))
    }
}

/// Kubernetes' limit on all annotations of one object together (keys and values).
pub const ANNOTATIONS_MAX_BYTES: usize = 256 << 10;

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63: a label value or a key's name part.
fn qualified_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A DNS-1123 subdomain: dot-separated lowercase labels, at most 253.
fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// A label or annotation key: `[prefix/]name`, the prefix a DNS subdomain (≤ 253), the name
/// at most 63 of `[A-Za-z0-9_.-]`, starting and ending alphanumeric.
pub fn check_label_key(what: &str, key: &str) -> Result<(), Invalid> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let shown: String = key.chars().take(80).collect();
    if let Some(p) = prefix
        && !dns_subdomain(p)
    {
        return Err(Invalid(format!(
            "{what} {shown:?} is invalid: the prefix before '/' must be a DNS subdomain \
             (lowercase letters, digits, '-' and '.', at most 253 characters)"
        )));
    }
    if !qualified_part(name) {
        return Err(Invalid(format!(
            "{what} {shown:?} is invalid: the name must be at most 63 characters of letters, \
             digits, '-', '_' and '.', starting and ending with a letter or digit"
        )));
    }
    Ok(())
}

/// A label value: empty, or at most 63 of `[A-Za-z0-9_.-]`, starting and ending alphanumeric.
pub fn check_label_value(what: &str, v: &str) -> Result<(), Invalid> {
    if v.is_empty() || qualified_part(v) {
        return Ok(());
    }
    let shown: String = v.chars().take(80).collect();
    Err(Invalid(format!(
        "{what} {shown:?} is invalid: a label value must be empty or at most 63 characters of \
         letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    )))
}

/// Labels and annotations as Kubernetes checks them: maps of strings, key syntax, label value
/// syntax, annotations at most 256 KiB together.
pub fn check_labels_and_annotations(meta: &Value) -> Result<(), Invalid> {
    for key in ["labels", "annotations"] {
        let Some(m) = meta.get(key).filter(|m| !m.is_null()) else {
            continue;
        };
        let Some(m) = m.as_object() else {
            return Err(Invalid(format!(
                "metadata.{key} must map strings to strings"
            )));
        };
        let mut total = 0usize;
        for (k, v) in m {
            let Some(v) = v.as_str() else {
                return Err(Invalid(format!(
                    "metadata.{key} must map strings to strings"
                )));
            };
            check_label_key(&format!("metadata.{key}: key"), k)?;
            if key == "labels" {
                check_label_value(&format!("metadata.labels[{k}]: value"), v)?;
            }
            total += k.len() + v.len();
        }
        if key == "annotations" && total > ANNOTATIONS_MAX_BYTES {
            return Err(Invalid(format!(
                "metadata.annotations: too long: {total} bytes, at most {ANNOTATIONS_MAX_BYTES} \
                 (256 KiB) for all annotations together"
            )));
        }
    }
    Ok(())
}

/// One problem with one field of an object a client wrote (Kubernetes' `StatusCause`).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// The field from the object's root, e.g. `spec.template.spec.domain.devices.gpus`.
    pub field: String,
    /// Kubernetes' cause type: `FieldValueInvalid`, `FieldValueTypeInvalid`,
    /// `FieldValueForbidden`.
    pub reason: &'static str,
    /// What is wrong, without the field (kubectl prints `field: message`).
    pub message: String,
}

/// Why a KubeVirt field edgevirt lacks is refused.
const NOT_SUPPORTED: &str =
    "a KubeVirt field that edgevirt does not support yet; remove it to create this object here";

impl FieldError {
    /// The problem as the one-line message of the refusal says it, with the field from
    /// the spec (`.` for the spec itself).
    fn line(&self) -> String {
        let at = self.field.strip_prefix("spec.").unwrap_or(".");
        match self.reason {
            // The message names the field itself (KubeVirt's instancetype conflicts).
            _ if self.message.contains(&self.field) => self.message.clone(),
            "FieldValueForbidden" => format!("field {at} is {}", self.message),
            "FieldValueInvalid" if self.message.starts_with("unknown field") => {
                format!("unknown field {at}")
            }
            _ => format!("{at}: {}", self.message),
        }
    }
}

/// Every problem found in one object's spec, so that one refusal names them all.
#[derive(Debug)]
pub struct FieldErrors {
    pub kind: String,
    pub errors: Vec<FieldError>,
}

impl std::fmt::Display for FieldErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lines: Vec<String> = self.errors.iter().map(FieldError::line).collect();
        write!(f, "{}: {}", self.kind, lines.join("; "))
    }
}

impl From<FieldErrors> for Invalid {
    fn from(e: FieldErrors) -> Invalid {
        Invalid(e.to_string())
    }
}

/// Decode a kind's spec from JSON for admission, naming every offending field.
/// The types themselves decode tolerantly (a peer of another release may send fields this
/// one does not know); here, where a user's object is checked, every field the types do
/// not know is refused, all of them at once: as "not supported yet" when KubeVirt's schema
/// has the field at that place ([`schema`]), as "unknown" when it does not. A value of the
/// wrong type is named too, with the fields found unknown before it.
pub fn decode<T: DeserializeOwned>(kind: &str, value: Value) -> Result<T, FieldErrors> {
    let mut unknown: Vec<String> = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(value, &mut track);
    // serde_ignored writes a step through an `Option` as `?`: the field's path has none.
    let decoded: Result<T, _> = serde_ignored::deserialize(de, |path| {
        let path = path.to_string();
        let steps: Vec<&str> = path.split('.').filter(|s| *s != "?").collect();
        unknown.push(steps.join("."));
    });
    let root = schema::spec_definition(kind);
    let mut errors: Vec<FieldError> = unknown
        .iter()
        .map(|at| {
            let (reason, message) = if root.is_some_and(|r| schema::has_field(r, at)) {
                ("FieldValueForbidden", NOT_SUPPORTED.to_string())
            } else {
                (
                    "FieldValueInvalid",
                    "unknown field: KubeVirt's schema has no such field here".to_string(),
                )
            };
            FieldError {
                field: format!("spec.{at}"),
                reason,
                message,
            }
        })
        .collect();
    if let Err(e) = &decoded {
        errors.push(FieldError {
            field: match track.path().to_string().as_str() {
                "" | "." => "spec".to_string(),
                p => format!("spec.{p}"),
            },
            reason: "FieldValueTypeInvalid",
            message: e.to_string(),
        });
    }
    match decoded {
        Ok(t) if errors.is_empty() => Ok(t),
        _ => Err(FieldErrors {
            kind: kind.to_string(),
            errors,
        }),
    }
}

/// Parse a Kubernetes quantity (`512Mi`, `2G`, `1`, `1.5Gi`, `1e9`, `500m`) into a whole
/// number of base units (bytes for memory), rounding a fraction up as Kubernetes does. The
/// grammar is Kubernetes' own; negative numbers and anything past `u64` are refused.
pub fn parse_quantity(q: &str) -> Result<u64, Invalid> {
    parse_scaled(q, 0)
}

/// Parse a CPU quantity (`2`, `500m`, `0.5`) into millicores.
pub fn parse_cpu_millis(q: &str) -> Result<u64, Invalid> {
    parse_scaled(q, 3)
}

/// A quantity times 10^`extra`, as an integer.
fn parse_scaled(q: &str, extra: i32) -> Result<u64, Invalid> {
    let shown: String = q.chars().take(40).collect();
    let bad = |why: &str| Invalid(format!("invalid quantity {shown:?}: {why}"));
    let q = q.trim();
    let q = q.strip_prefix('+').unwrap_or(q);
    if q.starts_with('-') {
        return Err(bad("it must not be negative"));
    }
    let digits_end = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(digits_end);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(bad("expected a number such as 512Mi, 2Gi or 1G"));
    }
    // Leading zeros carry nothing; more digits than u128 holds carry too much.
    let int = int.trim_start_matches('0');
    if int.len() + frac.len() > 36 {
        return Err(bad("the number is too large"));
    }
    let mantissa: u128 = format!("{int}{frac}0")
        .parse::<u128>()
        .map_err(|_| bad("not a number"))?
        / 10;
    // value = mantissa * 10^-frac.len() * 2^bin * 10^dec
    let (bin, dec): (u32, i32) = match suffix {
        "" => (0, 0),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        s if s.starts_with(['e', 'E']) => {
            let e: i32 = s[1..]
                .parse()
                .ok()
                .filter(|e: &i32| e.abs() <= 64)
                .ok_or_else(|| bad("invalid or out-of-range exponent"))?;
            (0, e)
        }
        _ => {
            return Err(bad(
                "unknown suffix; use Ki, Mi, Gi, Ti, Pi, Ei, m, k, M, G, T, P, E or eN",
            ));
        }
    };
    let too_large = || bad("the value is too large");
    let mut v = mantissa.checked_mul(1u128 << bin).ok_or_else(too_large)?;
    let exp = dec + extra - frac.len() as i32;
    if exp >= 0 {
        let p = 10u128.checked_pow(exp as u32).ok_or_else(too_large)?;
        v = v.checked_mul(p).ok_or_else(too_large)?;
    } else {
        match 10u128.checked_pow((-exp) as u32) {
            Some(p) => v = v.div_ceil(p),
            // Smaller than one unit: rounds up to one unless it is zero.
            None => v = u128::from(v > 0),
        }
    }
    u64::try_from(v).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_read_as_kubernetes_writes_them() {
        let d = |s: &str| parse_duration(s).map(|d| d.as_millis());
        assert_eq!(d("5m"), Some(300_000));
        assert_eq!(d("1h30m"), Some(5_400_000));
        assert_eq!(d("2m0s"), Some(120_000));
        assert_eq!(d("250ms"), Some(250));
        assert_eq!(d("1.5h"), Some(5_400_000));
        assert_eq!(d("0"), Some(0));
        for bad in ["", "5", "m", "5x", "-5m", "5m3", "1e9h"] {
            assert_eq!(d(bad), None, "{bad:?}");
        }
    }

    /// Downward API files as the kubelet writes them: maps as sorted `key="value"` lines,
    /// one key's value alone (empty when missing); other fields and bad paths refused.
    #[test]
    fn downward_api_files_hold_the_instances_metadata() {
        use kubevirt::{DownwardApiVolumeFile, DownwardMeta, ObjectFieldSelector};
        let labels = std::collections::BTreeMap::from([
            ("b".to_string(), "2".to_string()),
            ("a".to_string(), "say \"hi\"".to_string()),
        ]);
        let none = std::collections::BTreeMap::new();
        let m = DownwardMeta {
            name: "vm1",
            namespace: "default",
            uid: "u-1",
            labels: &labels,
            annotations: &none,
        };
        let value = |path: &str| {
            ObjectFieldSelector {
                api_version: None,
                field_path: path.into(),
            }
            .value(&m)
        };
        assert_eq!(value("metadata.name").unwrap(), "vm1");
        assert_eq!(value("metadata.uid").unwrap(), "u-1");
        assert_eq!(
            value("metadata.labels").unwrap(),
            "a=\"say \\\"hi\\\"\"\nb=\"2\""
        );
        assert_eq!(value("metadata.labels['b']").unwrap(), "2");
        assert_eq!(value("metadata.annotations['x']").unwrap(), "");
        for bad in ["spec.nodeName", "metadata.labels[b]", "metadata.labels['']"] {
            assert!(value(bad).is_err(), "{bad}");
        }
        for (path, ok) in [
            ("a/b.txt", true),
            ("../x", false),
            ("/etc/x", false),
            ("a//b", false),
        ] {
            let f = DownwardApiVolumeFile {
                path: path.into(),
                ..Default::default()
            };
            assert_eq!(f.check_path().is_ok(), ok, "{path}");
        }
    }

    #[test]
    fn names_follow_dns1123() {
        assert!(check_name("name", "web-1").is_ok());
        for bad in ["", "Web", "-a", "a-", "a_b", "a.b", &"x".repeat(64)] {
            assert!(check_name("name", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn labels_and_annotations_follow_kubernetes() {
        use serde_json::json;
        for good in ["app", "example.com/app", "a.b_c-d", "A9", &"k".repeat(63)] {
            assert!(check_label_key("key", good).is_ok(), "{good:?}");
        }
        let long_prefix = format!("{}/a", "p".repeat(254));
        for bad in [
            "",
            "-a",
            "a-",
            "a b",
            "/a",
            "a/",
            "Ex.com/a",
            &"k".repeat(64),
            &long_prefix,
        ] {
            assert!(check_label_key("key", bad).is_err(), "{bad:?}");
        }
        assert!(check_label_value("v", "").is_ok());
        assert!(check_label_value("v", &"v".repeat(64)).is_err());
        assert!(check_labels_and_annotations(&json!({"labels": {"a": "b"}})).is_ok());
        assert!(check_labels_and_annotations(&json!({"labels": {"a": 1}})).is_err());
        let big = "x".repeat(ANNOTATIONS_MAX_BYTES);
        let e = check_labels_and_annotations(&json!({"annotations": {"a": big}})).unwrap_err();
        assert!(e.0.contains("metadata.annotations"), "{e}");
        let e = check_labels_and_annotations(&json!({"labels": {"a": "x y"}})).unwrap_err();
        assert!(e.0.contains("metadata.labels"), "{e}");
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("512Mi").unwrap(), 512 << 20);
        assert_eq!(parse_quantity("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_quantity("1.5Gi").unwrap(), 3 << 29);
        assert!(parse_quantity("12XB").is_err());
        assert_eq!(parse_cpu_millis("500m").unwrap(), 500);
        assert_eq!(parse_cpu_millis("2").unwrap(), 2000);
        assert_eq!(parse_cpu_millis("0.5").unwrap(), 500);
        assert_eq!(parse_quantity("1e9").unwrap(), 1_000_000_000);
        assert_eq!(parse_quantity("1E3").unwrap(), 1000);
        assert_eq!(parse_quantity(".5Ki").unwrap(), 512);
        assert_eq!(parse_quantity("2.").unwrap(), 2);
        assert_eq!(parse_quantity("1500m").unwrap(), 2, "a fraction rounds up");
        assert_eq!(parse_quantity("+3").unwrap(), 3);
        assert_eq!(parse_quantity("15Ei").unwrap(), 15 << 60);
        assert_eq!(parse_quantity("0001Mi").unwrap(), 1 << 20);
        for bad in [
            "18446744073709551616",
            "16Ei",
            "1e400",
            "1e20",
            "99999999Ei",
            "-1Gi",
            "1.5.5Gi",
            ".",
            "Gi",
            "1 Gi",
            "1gi",
            "NaN",
            "inf",
            "1e",
            &"9".repeat(40),
        ] {
            assert!(parse_quantity(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn unknown_and_unsupported_fields_are_named() {
        let spec = serde_json::json!({"template": {"spec": {"domain": {"devices": {"gpus": []}}}}});
        let e = decode::<kubevirt::VirtualMachineSpec>("VirtualMachine", spec).unwrap_err();
        assert!(
            e.to_string().contains("gpus") && e.to_string().contains("does not support"),
            "{e}"
        );
        let spec = serde_json::json!({"template": {"spec": {"domain": {"bogus": 1}}}});
        let e = decode::<kubevirt::VirtualMachineSpec>("VirtualMachine", spec).unwrap_err();
        assert_eq!(
            e.to_string(),
            "VirtualMachine: unknown field template.spec.domain.bogus"
        );
        // A KubeVirt field at a place where KubeVirt does not have it is unknown too.
        let spec = serde_json::json!({"template": {"spec": {"rng": {}, "domain": {}}}});
        let e = decode::<kubevirt::VirtualMachineSpec>("VirtualMachine", spec).unwrap_err();
        assert_eq!(e.errors[0].reason, "FieldValueInvalid", "{e}");
        // Every problem at once, not one per try, each with its field from the root.
        let spec = serde_json::json!({"template": {"spec": {"dnsPolicy": "None",
            "domain": {"devices": {"gpus": [], "disks": [{"name": "d", "bogus": 1}]}}}}});
        let e = decode::<kubevirt::VirtualMachineSpec>("VirtualMachine", spec).unwrap_err();
        let fields: Vec<(&str, &str)> = e
            .errors
            .iter()
            .map(|c| (c.field.as_str(), c.reason))
            .collect();
        for want in [
            ("spec.template.spec.dnsPolicy", "FieldValueForbidden"),
            (
                "spec.template.spec.domain.devices.gpus",
                "FieldValueForbidden",
            ),
            (
                "spec.template.spec.domain.devices.disks.0.bogus",
                "FieldValueInvalid",
            ),
        ] {
            assert!(fields.contains(&want), "{want:?} not in {fields:?}");
        }
        // A value of the wrong type is named with the unknown fields seen before it.
        let spec = serde_json::json!({"template": {"spec": {"bogus": 1, "domain": {"cpu": {"cores": "two"}}}}});
        let e = decode::<kubevirt::VirtualMachineSpec>("VirtualMachine", spec).unwrap_err();
        let reasons: Vec<&str> = e.errors.iter().map(|c| c.reason).collect();
        assert_eq!(
            reasons,
            ["FieldValueInvalid", "FieldValueTypeInvalid"],
            "{e}"
        );
        assert_eq!(e.errors[1].field, "spec.template.spec.domain.cpu.cores");
        // The types themselves decode what a newer peer sends.
        let spec = serde_json::json!({"template": {"spec": {"newField": 1, "domain": {}}}});
        assert!(serde_json::from_value::<kubevirt::VirtualMachineSpec>(spec).is_ok());
    }
}
