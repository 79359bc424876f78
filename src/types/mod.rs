//! Resource types and the checks every write goes through before it reaches the store:
//! names, the KubeVirt fields edgevirt does not support yet, quantities.

pub mod edgevirt;

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
}
pub mod kubevirt;

use serde::de::DeserializeOwned;
use serde_json::Value;

pub use edgevirt::{Image, Node};
pub use kubevirt::{VirtualMachine, VirtualMachineInstance};

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
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::VirtualMachine,
        Kind::VirtualMachineInstance,
        Kind::VirtualMachineInstanceMigration,
        Kind::Node,
        Kind::Image,
        Kind::Namespace,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::VirtualMachine => "VirtualMachine",
            Kind::VirtualMachineInstance => "VirtualMachineInstance",
            Kind::VirtualMachineInstanceMigration => "VirtualMachineInstanceMigration",
            Kind::Node => "Node",
            Kind::Image => "Image",
            Kind::Namespace => "Namespace",
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
        }
    }

    pub fn group(self) -> &'static str {
        match self {
            Kind::VirtualMachine
            | Kind::VirtualMachineInstance
            | Kind::VirtualMachineInstanceMigration => "kubevirt.io",
            Kind::Node | Kind::Image => "edgevirt.io",
            Kind::Namespace => "",
        }
    }

    pub fn api_version(self) -> String {
        match self.group() {
            "" => "v1".to_string(),
            g => format!("{g}/v1"),
        }
    }

    /// The path prefix of its group and version: `/apis/<group>/v1`, or `/api/v1` for core.
    pub fn path_prefix(self) -> String {
        match self.group() {
            "" => "/api/v1".to_string(),
            g => format!("/apis/{g}/v1"),
        }
    }

    pub fn namespaced(self) -> bool {
        matches!(
            self,
            Kind::VirtualMachine
                | Kind::VirtualMachineInstance
                | Kind::VirtualMachineInstanceMigration
        )
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

/// A check of user input failed; the message names the field and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

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

/// KubeVirt fields that edgevirt knows of but does not implement yet, so a refusal can say so.
const KUBEVIRT_UNSUPPORTED: &[&str] = &[
    "dataVolumeTemplates",
    "instancetype",
    "preference",
    "liveUpdateFeatures",
    "updateVolumesStrategy",
    "affinity",
    "tolerations",
    "topologySpreadConstraints",
    "evictionStrategy",
    "livenessProbe",
    "readinessProbe",
    "accessCredentials",
    "dnsConfig",
    "dnsPolicy",
    "priorityClassName",
    "schedulerName",
    "startStrategy",
    "subdomain",
    "architecture",
    "gpus",
    "hostDevices",
    "filesystems",
    "watchdog",
    "inputs",
    "sound",
    "tpm",
    "rng",
    "blockMultiQueue",
    "networkInterfaceMultiqueue",
    "useVirtioTransitional",
    "clientPassthrough",
    "downwardMetrics",
    "features",
    "clock",
    "ioThreadsPolicy",
    "chassis",
    "launchSecurity",
    "hugepages",
    "hostDisk",
    "cloudInitConfigDrive",
    "configMap",
    "secret",
    "serviceAccount",
    "sysprep",
    "emptyDisk",
    "ephemeral",
    "memoryDump",
    "downwardAPI",
    "multus",
    "sriov",
    "macvtap",
    "passt",
    "slirp",
    "lun",
    "dedicatedCpuPlacement",
    "isolateEmulatorThread",
    "numa",
    "realtime",
    "maxSockets",
    "cache",
    "io",
    "dedicatedIOThread",
    "shareable",
    "errorPolicy",
    "blockSize",
    "tag",
    "ports",
    "pciAddress",
    "dhcpOptions",
    "binding",
    "acpiTable",
    "hostname",
    "uuid",
    "serial",
    "vmNetworkCIDR",
    "limits",
];

/// Decode a kind's spec from JSON, naming the offending field on failure.
pub fn decode<T: DeserializeOwned>(kind: &str, value: Value) -> Result<T, Invalid> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.inner().to_string();
        if let Some(field) = inner
            .strip_prefix("unknown field `")
            .and_then(|s| s.split('`').next())
        {
            let at = if path == "." || path.is_empty() {
                field.to_string()
            } else {
                // serde_path_to_error reports the path including the unknown field itself.
                path.clone()
            };
            if KUBEVIRT_UNSUPPORTED.contains(&field) {
                return Invalid(format!(
                    "{kind}: field {at} is a KubeVirt field that edgevirt does not support yet; \
                     remove it to create this object here"
                ));
            }
            return Invalid(format!("{kind}: unknown field {at}"));
        }
        Invalid(format!("{kind}: {path}: {inner}"))
    })
}

/// Parse a Kubernetes quantity (`512Mi`, `2G`, `1`, `500m`) into a number of base units
/// (bytes for memory; for CPU use [`parse_cpu_millis`]).
pub fn parse_quantity(q: &str) -> Result<u64, Invalid> {
    let q = q.trim();
    let bad = || {
        Invalid(format!(
            "invalid quantity {q:?}: expected e.g. 512Mi, 2Gi or 1G"
        ))
    };
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        _ => return Err(bad()),
    };
    Ok((n * mult).round() as u64)
}

/// Parse a CPU quantity (`2`, `500m`) into millicores.
pub fn parse_cpu_millis(q: &str) -> Result<u64, Invalid> {
    let q = q.trim();
    if let Some(m) = q.strip_suffix('m') {
        m.parse()
            .map_err(|_| Invalid(format!("invalid CPU quantity {q:?}")))
    } else {
        q.parse::<f64>()
            .map(|c| (c * 1000.0).round() as u64)
            .map_err(|_| Invalid(format!("invalid CPU quantity {q:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_dns1123() {
        assert!(check_name("name", "web-1").is_ok());
        for bad in ["", "Web", "-a", "a-", "a_b", "a.b", &"x".repeat(64)] {
            assert!(check_name("name", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("512Mi").unwrap(), 512 << 20);
        assert_eq!(parse_quantity("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_quantity("1.5Gi").unwrap(), 3 << 29);
        assert!(parse_quantity("12XB").is_err());
        assert_eq!(parse_cpu_millis("500m").unwrap(), 500);
        assert_eq!(parse_cpu_millis("2").unwrap(), 2000);
    }

    #[test]
    fn unknown_and_unsupported_fields_are_named() {
        let spec = serde_json::json!({"template": {"spec": {"domain": {"devices": {"gpus": []}}}}});
        let e = decode::<kubevirt::VirtualMachineSpec>("VirtualMachine", spec).unwrap_err();
        assert!(
            e.0.contains("gpus") && e.0.contains("does not support"),
            "{e}"
        );
        let spec = serde_json::json!({"template": {"spec": {"domain": {"bogus": 1}}}});
        let e = decode::<kubevirt::VirtualMachineSpec>("VirtualMachine", spec).unwrap_err();
        assert!(
            e.0.contains("unknown field") && e.0.contains("bogus"),
            "{e}"
        );
    }
}
