//! What draining a node does with each VMI running on it, as `kubectl drain` does with a
//! KubeVirt VMI's `evictionStrategy`: live-migrate it, leave it running (and say why), or
//! stop it when the operator forces the drain. The CLI and the dashboard both drain; this is
//! the one place that decides.

use crate::types::kubevirt::{ConditionType, EvictionStrategy, VirtualMachineInstance};

/// One VMI's fate in a drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// Start a live migration (with its disks when the drain copies them).
    Migrate,
    /// Leave it running: the drain is not forced, and this is why it cannot move.
    Stays(&'static str),
    /// Stop it (a forced drain): this is why it could not move.
    Stop(&'static str),
}

/// The fate of `vmi` in a drain; `block` copies local disks along, `force` stops what cannot
/// move. Instances that are not running are not asked about.
pub fn eviction(vmi: &VirtualMachineInstance, block: bool, force: bool) -> Eviction {
    let migratable = vmi.status.as_ref().is_some_and(|s| {
        crate::types::kubevirt::condition_true(&s.conditions, &ConditionType::LiveMigratable)
    });
    let why = match vmi.spec.eviction_strategy {
        Some(EvictionStrategy::None) => "evictionStrategy None",
        Some(EvictionStrategy::LiveMigrateIfPossible) if !migratable && !block => {
            "evictionStrategy LiveMigrateIfPossible, and it is not live-migratable"
        }
        _ => return Eviction::Migrate,
    };
    if force {
        Eviction::Stop(why)
    } else {
        Eviction::Stays(why)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::Typed;

    fn vmi(strategy: Option<&str>, migratable: bool) -> VirtualMachineInstance {
        let mut spec = json!({"domain": {}});
        if let Some(s) = strategy {
            spec["evictionStrategy"] = json!(s);
        }
        VirtualMachineInstance::from_value(json!({
            "metadata": {"name": "v", "namespace": "default"},
            "spec": spec,
            "status": {"phase": "Running", "conditions": [
                {"type": "LiveMigratable", "status": if migratable { "True" } else { "False" }}]},
        }))
        .unwrap()
    }

    #[test]
    fn each_strategy_moves_stays_or_stops() {
        assert_eq!(eviction(&vmi(None, true), false, false), Eviction::Migrate);
        assert_eq!(
            eviction(&vmi(Some("LiveMigrate"), false), false, false),
            Eviction::Migrate
        );
        assert!(matches!(
            eviction(&vmi(Some("None"), true), true, false),
            Eviction::Stays(w) if w.contains("None")
        ));
        assert!(matches!(
            eviction(&vmi(Some("None"), true), false, true),
            Eviction::Stop(_)
        ));
        let unmovable = vmi(Some("LiveMigrateIfPossible"), false);
        assert!(matches!(
            eviction(&unmovable, false, false),
            Eviction::Stays(w) if w.contains("not live-migratable")
        ));
        // Copying its disks along makes it movable.
        assert_eq!(eviction(&unmovable, true, false), Eviction::Migrate);
        assert_eq!(
            eviction(&vmi(Some("LiveMigrateIfPossible"), true), false, false),
            Eviction::Migrate
        );
    }
}
