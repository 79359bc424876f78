//! Multus' `k8s.cni.cncf.io/v1` `NetworkAttachmentDefinition`: a network a VM joins through a
//! `multus` network and a `bridge` interface binding, as KubeVirt users write it.
//!
//! Its `spec.config` is the CNI JSON a Multus cluster would hand the `bridge` plugin. edgevirt
//! honours what that plugin does for a VM on a site's LAN: `bridge` (the host bridge the
//! operator made, `cni0` when unset, as the plugin's default), `vlan` (the tag the VM's port
//! gets on a VLAN-filtering bridge), `mtu` and `macspoofchk`. Addresses come from the site's
//! own DHCP server or a static one inside the guest, so `ipam` must be empty. Any other plugin
//! or key is refused naming it, so a config never silently means less here than on a cluster.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of NetworkAttachmentDefinitions.
pub const GROUP: &str = "k8s.cni.cncf.io";

/// The bridge the `bridge` plugin uses when the config names none.
pub const DEFAULT_BRIDGE: &str = "cni0";

/// A network VMs attach to: the CNI configuration of Multus, as JSON text.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "k8s.cni.cncf.io",
    version = "v1",
    kind = "NetworkAttachmentDefinition",
    plural = "network-attachment-definitions",
    singular = "network-attachment-definition",
    shortname = "net-attach-def",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct NetworkAttachmentDefinitionSpec {
    /// The CNI configuration (JSON): a `bridge` plugin with `bridge`, `vlan`, `mtu`,
    /// `macspoofchk` and an empty `ipam`.
    #[serde(default)]
    pub config: String,
}

/// What a `bridge` CNI config asks of a node, once checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bridge {
    /// The host bridge the VM's tap joins.
    pub bridge: String,
    /// The VLAN the tap is an untagged member of (its PVID), on a VLAN-filtering bridge.
    pub vlan: Option<u16>,
    pub mtu: Option<u32>,
    /// Drop frames whose source MAC is not the interface's own.
    pub mac_spoof_check: bool,
}

/// The keys a `bridge` config may carry here.
const KEYS: [&str; 8] = [
    "cniVersion",
    "name",
    "type",
    "bridge",
    "vlan",
    "mtu",
    "macspoofchk",
    "ipam",
];

/// A host interface name as Linux allows it (at most 15 bytes, no '/', ':' or space); the
/// stricter set here also keeps it plain in XML and logs.
pub fn is_interface_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Check a NetworkAttachmentDefinition's `spec.config`; the error names the key at fault.
pub fn parse_config(config: &str) -> Result<Bridge, String> {
    if config.trim().is_empty() {
        return Err(
            "spec.config: required: the CNI configuration of a `bridge` plugin (JSON), \
             e.g. {\"cniVersion\": \"0.3.1\", \"type\": \"bridge\", \"bridge\": \"br0\"}"
                .into(),
        );
    }
    let v: serde_json::Value =
        serde_json::from_str(config).map_err(|e| format!("spec.config: not JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or("spec.config: must be a JSON object (one CNI plugin's configuration)")?;
    let at = |k: &str| format!("spec.config.{k}");
    if obj.contains_key("plugins") {
        return Err(format!(
            "{}: a plugin list is not supported; give one `bridge` plugin's configuration",
            at("plugins")
        ));
    }
    match obj.get("type") {
        Some(serde_json::Value::String(t)) if t == "bridge" => {}
        Some(t) => {
            return Err(format!(
                "{}: {t}: only the `bridge` plugin is supported (a VM on a host bridge the \
                 operator made)",
                at("type")
            ));
        }
        None => return Err(format!("{}: required: \"bridge\"", at("type"))),
    }
    if let Some(k) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(format!(
            "{}: not supported; edgevirt honours {}",
            at(k),
            KEYS.join(", ")
        ));
    }
    for k in ["cniVersion", "name"] {
        if obj.get(k).is_some_and(|x| !x.is_string()) {
            return Err(format!("{}: must be a string", at(k)));
        }
    }
    match obj.get("ipam") {
        None => {}
        Some(serde_json::Value::Object(m)) if m.is_empty() => {}
        Some(serde_json::Value::Object(m)) => {
            let k = m.keys().next().map(String::as_str).unwrap_or("");
            return Err(format!(
                "{}: not supported: edgevirt runs no IPAM; leave ipam empty ({{}}) and let the \
                 site's DHCP server or the guest's own settings give the address",
                at(&format!("ipam.{k}"))
            ));
        }
        Some(_) => return Err(format!("{}: must be an object (empty)", at("ipam"))),
    }
    let bridge = match obj.get("bridge") {
        None => DEFAULT_BRIDGE.to_string(),
        Some(serde_json::Value::String(b)) if is_interface_name(b) => b.clone(),
        Some(b) => {
            return Err(format!(
                "{}: {b}: a host interface name (1 to 15 letters, digits, '-', '_' or '.')",
                at("bridge")
            ));
        }
    };
    let vlan = match obj.get("vlan") {
        None => None,
        Some(x) => match x.as_u64() {
            Some(0) => None,
            Some(n @ 1..=4094) => Some(n as u16),
            _ => return Err(format!("{}: {x}: a VLAN id from 1 to 4094", at("vlan"))),
        },
    };
    let mtu = match obj.get("mtu") {
        None => None,
        Some(x) => match x.as_u64() {
            Some(n @ 68..=65535) => Some(n as u32),
            _ => return Err(format!("{}: {x}: from 68 to 65535", at("mtu"))),
        },
    };
    let mac_spoof_check = match obj.get("macspoofchk") {
        None => false,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(x) => return Err(format!("{}: {x}: true or false", at("macspoofchk"))),
    };
    Ok(Bridge {
        bridge,
        vlan,
        mtu,
        mac_spoof_check,
    })
}

/// A `multus.networkName` (`name` or `namespace/name`) as the namespace and name of its
/// NetworkAttachmentDefinition, for an instance in `ns`.
pub fn reference<'a>(ns: &'a str, network_name: &'a str) -> (&'a str, &'a str) {
    match network_name.split_once('/') {
        Some((n, name)) => (n, name),
        None => (ns, network_name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bridge_config_is_read_with_the_plugins_defaults() {
        let b = parse_config(r#"{"cniVersion":"0.3.1","name":"lan","type":"bridge","bridge":"br0","vlan":100,"mtu":1400,"macspoofchk":true,"ipam":{}}"#).unwrap();
        assert_eq!(
            b,
            Bridge {
                bridge: "br0".into(),
                vlan: Some(100),
                mtu: Some(1400),
                mac_spoof_check: true
            }
        );
        let b = parse_config(r#"{"type":"bridge"}"#).unwrap();
        assert_eq!((b.bridge.as_str(), b.vlan, b.mtu), ("cni0", None, None));
    }

    #[test]
    fn what_edgevirt_cannot_honour_is_refused_naming_the_key() {
        for (config, key) in [
            (r#"{"type":"macvlan","master":"eth0"}"#, "spec.config.type"),
            (
                r#"{"type":"bridge","ipam":{"type":"host-local"}}"#,
                "spec.config.ipam.type",
            ),
            (r#"{"type":"bridge","ipMasq":true}"#, "spec.config.ipMasq"),
            (r#"{"type":"bridge","vlan":4095}"#, "spec.config.vlan"),
            (
                r#"{"type":"bridge","bridge":"br0/../x"}"#,
                "spec.config.bridge",
            ),
            (
                r#"{"type":"bridge","bridge":"a-very-long-bridge"}"#,
                "spec.config.bridge",
            ),
            (r#"{"type":"bridge","mtu":10}"#, "spec.config.mtu"),
            (r#"{"plugins":[]}"#, "spec.config.plugins"),
            (r#"{"bridge":"br0"}"#, "spec.config.type"),
            ("[1]", "spec.config"),
            ("", "spec.config"),
        ] {
            let e = parse_config(config).unwrap_err();
            assert!(e.starts_with(key), "{config}: {e}");
        }
    }

    #[test]
    fn network_names_may_name_another_namespace() {
        assert_eq!(reference("default", "lan"), ("default", "lan"));
        assert_eq!(reference("default", "site/lan"), ("site", "lan"));
    }
}
