//! The host's network, as far as edgevirt touches it: which Linux bridges a node has (for its
//! facts and the scheduler), and the VLAN of a VM's tap on a VLAN-filtering bridge. The bridge
//! itself is the operator's (made with ifupdown or systemd-networkd, as on Proxmox): nothing
//! here creates or changes one. libvirt makes the tap and joins it to the bridge; this module
//! only sets which VLAN the tap is an untagged member of, with iproute2's `bridge` tool.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::types::edgevirt::HostBridge;

/// The file beside a VMI's domain XML listing the taps that need a VLAN ([`TapVlan`]).
pub const TAP_VLANS_FILE: &str = "tap-vlans.json";

/// A VM's tap and the VLAN it carries untagged (its PVID) on its bridge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TapVlan {
    pub dev: String,
    pub bridge: String,
    pub vlan: u16,
}

fn sys_net() -> PathBuf {
    std::env::var_os("EDGEVIRT_SYS_CLASS_NET")
        .map(Into::into)
        .unwrap_or_else(|| "/sys/class/net".into())
}

/// The Linux bridges in `/sys/class/net` (or `dir`), sorted by name.
pub fn bridges_in(dir: &Path) -> Vec<HostBridge> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut out: Vec<HostBridge> = entries
        .flatten()
        .filter(|e| e.path().join("bridge").is_dir())
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let flag = std::fs::read_to_string(e.path().join("bridge/vlan_filtering"))
                .map(|s| s.trim() == "1")
                .unwrap_or(false);
            HostBridge {
                name,
                vlan_filtering: flag,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// This host's Linux bridges.
pub fn bridges() -> Vec<HostBridge> {
    bridges_in(&sys_net())
}

fn run_bridge(args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new("bridge")
        .args(args)
        .output()
        .map_err(|e| anyhow::anyhow!("running `bridge` (iproute2): {e}"))?;
    if !out.status.success() {
        anyhow::bail!(
            "bridge {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Make `t.vlan` the tap's only VLAN, untagged (frames from the guest enter that VLAN and
/// frames of that VLAN leave untagged): add it as PVID, then drop the bridge's default VLAN
/// the port got when it joined.
pub fn set_vlan(t: &TapVlan) -> anyhow::Result<()> {
    let vid = t.vlan.to_string();
    run_bridge(&[
        "vlan", "add", "dev", &t.dev, "vid", &vid, "pvid", "untagged",
    ])?;
    let default = std::fs::read_to_string(sys_net().join(&t.bridge).join("bridge/default_pvid"))
        .ok()
        .and_then(|s| s.trim().parse::<u16>().ok())
        .unwrap_or(1);
    if default != 0 && default != t.vlan {
        // Absent already when the bridge's default PVID changed since: nothing to drop.
        let _ = run_bridge(&["vlan", "del", "dev", &t.dev, "vid", &default.to_string()]);
    }
    tracing::info!(tap = %t.dev, bridge = %t.bridge, vlan = t.vlan, "tap VLAN set");
    Ok(())
}

/// The taps listed beside a domain XML (none when the file is absent).
pub fn read_tap_vlans(dir: &Path) -> anyhow::Result<Vec<TapVlan>> {
    match std::fs::read(dir.join(TAP_VLANS_FILE)) {
        Ok(b) => Ok(serde_json::from_slice(&b)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
        Err(e) => Err(e.into()),
    }
}

/// Whether the tap exists on this host.
pub fn exists(dev: &str) -> bool {
    sys_net().join(dev).exists()
}

/// One pass over taps waiting for their VLAN (an incoming migration's QEMU makes them):
/// set it on those that exist now, and return those still missing.
pub fn set_present(taps: Vec<TapVlan>) -> Vec<TapVlan> {
    taps.into_iter()
        .filter(|t| {
            if !exists(&t.dev) {
                return true;
            }
            if let Err(e) = set_vlan(t) {
                tracing::warn!(tap = %t.dev, error = %e, "setting the tap's VLAN failed");
            }
            false
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridges_are_the_interfaces_with_a_bridge_folder() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("br0/bridge")).unwrap();
        std::fs::write(d.path().join("br0/bridge/vlan_filtering"), "1\n").unwrap();
        std::fs::create_dir_all(d.path().join("lan/bridge")).unwrap();
        std::fs::write(d.path().join("lan/bridge/vlan_filtering"), "0\n").unwrap();
        std::fs::create_dir_all(d.path().join("eth0")).unwrap();
        let b = bridges_in(d.path());
        assert_eq!(
            b,
            vec![
                HostBridge {
                    name: "br0".into(),
                    vlan_filtering: true
                },
                HostBridge {
                    name: "lan".into(),
                    vlan_filtering: false
                }
            ]
        );
        assert!(bridges_in(&d.path().join("missing")).is_empty());
    }
}
