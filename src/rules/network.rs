//! Whether a node can carry a VM's `multus` networks: the bridge each one names must exist
//! there, and be VLAN-filtering when the network has a VLAN. The scheduler places by this
//! rule and the agent checks it again against its own host before a start.

use crate::types::cni::{Bridge, NetworkAttachmentDefinition};
use crate::types::edgevirt::{HostBridge, Node};
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

/// The bridge the NetworkAttachmentDefinition `nad` (`ns/name`, as fetched: `None` when it
/// does not exist) gives network `network`, or why there is none; the scheduler and the
/// agent say it in these words.
pub fn bridge_of(
    network: &str,
    (ns, name): (&str, &str),
    nad: Option<&NetworkAttachmentDefinition>,
) -> Result<Bridge, String> {
    let nad = nad.ok_or_else(|| {
        format!("network {network}: NetworkAttachmentDefinition {ns}/{name} does not exist")
    })?;
    crate::types::cni::parse_config(&nad.spec.config)
        .map_err(|e| format!("network {network}: NetworkAttachmentDefinition {ns}/{name}: {e}"))
}

/// `Ok` when `node` has the bridge `b` names (VLAN-filtering for a VLAN), or why not: the
/// scheduler's rule, which the CLI and dashboard show too.
pub fn node_carries(b: &Bridge, node: &Node) -> Result<(), String> {
    bridge_fits(b, node.status.as_ref().map_or(&[][..], |s| &s.bridges[..]))
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
    fn a_missing_or_unusable_definition_is_named() {
        let nad = |config: &str| {
            NetworkAttachmentDefinition::new(
                "lan",
                crate::types::cni::NetworkAttachmentDefinitionSpec {
                    config: config.into(),
                },
            )
        };
        assert_eq!(
            bridge_of("office", ("site", "lan"), None),
            Err("network office: NetworkAttachmentDefinition site/lan does not exist".into())
        );
        let e = bridge_of(
            "office",
            ("site", "lan"),
            Some(&nad(r#"{"type":"macvlan"}"#)),
        );
        assert!(
            e.unwrap_err().starts_with(
                "network office: NetworkAttachmentDefinition site/lan: spec.config.type"
            )
        );
        let b = bridge_of(
            "office",
            ("site", "lan"),
            Some(&nad(r#"{"type":"bridge","bridge":"br0"}"#)),
        );
        assert_eq!(b.unwrap().bridge, "br0");
        // A node without status has no bridges.
        let node = Node::new("n", Default::default());
        assert_eq!(
            node_carries(&b_of("br0"), &node),
            Err("no bridge br0".into())
        );
    }

    fn b_of(bridge: &str) -> Bridge {
        Bridge {
            bridge: bridge.into(),
            ..Default::default()
        }
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
