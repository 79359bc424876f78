//! Whether a node can carry a VM's `multus` networks: the bridge each one names must exist
//! there, and be VLAN-filtering when the network has a VLAN. The scheduler places by this
//! rule and the agent checks it again against its own host before a start.

use crate::types::cni::Bridge;
use crate::types::edgevirt::HostBridge;
use crate::types::kubevirt::Network;

/// Whether an instance in `ns` with these `networks` joins the NetworkAttachmentDefinition
/// `nad_ns/nad_name`.
pub fn uses(ns: &str, networks: &[Network], nad_ns: &str, nad_name: &str) -> bool {
    networks.iter().any(|n| {
        n.multus.as_ref().is_some_and(|m| {
            crate::types::cni::reference(ns, &m.network_name) == (nad_ns, nad_name)
        })
    })
}

/// `Ok` when `host` (a node's bridges) can carry `b`, or why not.
pub fn bridge_fits(b: &Bridge, host: &[HostBridge]) -> Result<(), String> {
    match host.iter().find(|h| h.name == b.bridge) {
        None => Err(format!("no bridge {}", b.bridge)),
        Some(h) if b.vlan.is_some() && !h.vlan_filtering => Err(format!(
            "bridge {} has VLAN filtering off (VLAN {} needs `vlan_filtering 1`)",
            b.bridge,
            b.vlan.unwrap_or_default()
        )),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_name_is_in_the_instances_namespace_unless_it_names_one() {
        let nets: Vec<Network> = serde_json::from_value(serde_json::json!([
            {"name": "a", "pod": {}},
            {"name": "b", "multus": {"networkName": "lan"}},
            {"name": "c", "multus": {"networkName": "site/cameras"}}]))
        .unwrap();
        assert!(uses("prod", &nets, "prod", "lan"));
        assert!(!uses("prod", &nets, "default", "lan"));
        assert!(uses("prod", &nets, "site", "cameras"));
        assert!(!uses("prod", &nets, "prod", "cameras"));
    }

    #[test]
    fn a_bridge_must_exist_and_filter_vlans_for_a_vlan() {
        let host = [
            HostBridge {
                name: "br0".into(),
                vlan_filtering: false,
            },
            HostBridge {
                name: "trunk".into(),
                vlan_filtering: true,
            },
        ];
        let b = |bridge: &str, vlan| Bridge {
            bridge: bridge.into(),
            vlan,
            ..Default::default()
        };
        assert_eq!(bridge_fits(&b("br0", None), &host), Ok(()));
        assert_eq!(bridge_fits(&b("trunk", Some(100)), &host), Ok(()));
        assert_eq!(
            bridge_fits(&b("lan", None), &host),
            Err("no bridge lan".into())
        );
        assert!(
            bridge_fits(&b("br0", Some(100)), &host)
                .unwrap_err()
                .contains("VLAN filtering off")
        );
    }
}
