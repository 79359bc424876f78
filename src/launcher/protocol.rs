//! The agent ⇄ launcher wire protocol: newline-delimited JSON over a unix socket.
//!
//! Every request carries the protocol version the agent chose; `Info` works in every version
//! and lists what the launcher speaks, so an agent picks the highest common one. Every field
//! is decoded tolerantly (defaults for missing fields, unknown fields ignored), so launchers
//! and agents one release apart understand each other. Golden files of each released format
//! live in `tests/wire/`.

use serde::{Deserialize, Serialize};

use crate::types::kubevirt::GuestAgentInfo;
use crate::virt::{DomainState, GuestAddress};

/// Protocol versions this build speaks, oldest first.
pub const VERSIONS: &[u32] = &[1];

/// One request from the agent.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op")]
pub enum Request {
    Info,
    Status,
    /// ACPI shutdown, then destroy once `grace_secs` have passed.
    Shutdown {
        #[serde(default)]
        grace_secs: u64,
    },
    Destroy,
    Pause,
    Unpause,
    /// Reboot through the guest agent if connected, else ACPI.
    SoftReboot,
    /// Live-migrate the domain (peer to peer, tunnelled) to the libvirtd at `dest_uri`, as
    /// `dest_xml` there; `block` copies local disks. Answers when libvirt has the outcome.
    Migrate {
        dest_uri: String,
        dest_xml: String,
        #[serde(default)]
        block: bool,
    },
    /// Abort a running migration; the `Migrate` call then fails.
    AbortMigration,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Envelope {
    #[serde(default = "one")]
    pub version: u32,
    #[serde(flatten)]
    pub request: Request,
}

fn one() -> u32 {
    1
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Response {
    #[serde(default)]
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub result: serde_json::Value,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Info {
    #[serde(default)]
    pub versions: Vec<u32>,
    #[serde(default)]
    pub launcher_version: String,
    #[serde(default)]
    pub domain_name: String,
    #[serde(default)]
    pub vmi_uid: String,
    #[serde(default)]
    pub pid: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// `None` once the domain is gone.
    #[serde(default)]
    pub state: Option<DomainState>,
    #[serde(default)]
    pub agent_connected: bool,
    #[serde(default)]
    pub addresses: Vec<GuestAddress>,
    /// Where `addresses` came from: `guest-agent` or `dhcp-lease`.
    #[serde(default)]
    pub address_source: Option<String>,
    #[serde(default)]
    pub guest: Option<GuestAgentInfo>,
    /// Set when the guest asked to power off (as opposed to a crash).
    #[serde(default)]
    pub shutdown_by_guest: bool,
}

/// Pick the highest version both sides speak.
pub fn negotiate(theirs: &[u32]) -> Option<u32> {
    VERSIONS.iter().rev().find(|v| theirs.contains(v)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerant_decoding() {
        // An older launcher's status without the newer fields, with an extra unknown one.
        let s: Status = serde_json::from_str(r#"{"state":"Running","legacy":1}"#).unwrap();
        assert_eq!(s.state, Some(DomainState::Running));
        assert!(!s.agent_connected);
        let e: Envelope = serde_json::from_str(r#"{"op":"Shutdown"}"#).unwrap();
        assert_eq!(e.request, Request::Shutdown { grace_secs: 0 });
        assert_eq!(negotiate(&[1, 2]), Some(1));
        assert_eq!(negotiate(&[7]), None);
    }

    fn round_trip<T>(text: &str)
    where
        T: serde::de::DeserializeOwned + Serialize + PartialEq + std::fmt::Debug,
    {
        let v: T = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let again: T = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
        assert_eq!(v, again);
    }

    /// Every released wire format in `tests/wire/` still decodes and round-trips.
    #[test]
    fn golden_wire_files_decode() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/wire");
        let mut seen = 0;
        for version in std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
        {
            let p = version.path();
            let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap();
            round_trip::<Info>(&read("info.json"));
            let st: Status = serde_json::from_str(&read("status.json")).unwrap();
            assert!(st.state.is_some() && !st.addresses.is_empty());
            round_trip::<Status>(&read("status.json"));
            round_trip::<Response>(&read("response-error.json"));
            for line in read("requests.jsonl")
                .lines()
                .filter(|l| !l.trim().is_empty())
            {
                round_trip::<Envelope>(line);
            }
            seen += 1;
        }
        assert!(seen >= 1, "no golden wire folders found");
    }
}
