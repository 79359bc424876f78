//! The agent ⇄ launcher wire protocol: newline-delimited JSON over a unix socket.
//!
//! Every request carries the protocol version the agent chose; `Info` works in every version
//! and lists what the launcher speaks, so an agent picks the highest common one. Every field
//! is decoded tolerantly (defaults for missing fields, unknown fields ignored), so launchers
//! and agents one release apart understand each other. Golden files of each released format
//! live in `tests/wire/`.

use serde::{Deserialize, Serialize};

use crate::hypervisor::{DomainState, GuestAddress};
use crate::types::kubevirt::GuestAgentInfo;

/// Protocol versions this build speaks, oldest first. Version 2 added the guest CPU to
/// [`Status`], with its `model` an object ([`CpuModel`]); on a version-1 connection the model
/// is sent as a plain string, the form release-1 peers decode.
pub const VERSIONS: &[u32] = &[1, 2];

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
        /// For `block`: the unix socket URIs QEMU's memory and disk streams go to (the
        /// agent forwards them). Absent from older agents, which never asked for `block`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        memory_uri: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disks_uri: Option<String>,
        /// Writable disks live on a storage pool the operator declared shared: libvirt is
        /// told to trust that (it cannot see that a filesystem is shared unless it is NFS,
        /// GlusterFS, ... and refuses otherwise). A launcher that ignores this leaves it to
        /// libvirt's own check, which refuses: the VM stays where it is.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        shared_storage: bool,
    },
    /// Abort a running migration; the `Migrate` call then fails.
    AbortMigration,
    /// One guest agent command (`{"execute": ..., "arguments": {...}}`), answered with what
    /// it returned; for probes and access credentials. A launcher of a release before this
    /// request answers "bad request" (`LauncherError::Unsupported`).
    GuestAgent {
        command: serde_json::Value,
        #[serde(default)]
        timeout_secs: u32,
    },
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
    /// The guest CPU of the domain, as libvirt runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<GuestCpu>,
}

impl Status {
    /// This status in the form a peer speaking protocol `version` decodes.
    pub fn for_version(&self, version: u32) -> Status {
        let mut s = self.clone();
        if version < 2
            && let Some(cpu) = &mut s.cpu
        {
            cpu.model = cpu.model.take().map(CpuModelField::downgrade);
        }
        s
    }
}

/// The guest CPU: libvirt's `<cpu>` element.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GuestCpu {
    /// `host-model`, `host-passthrough`, `custom`, `maximum`; empty when libvirt says none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<CpuModelField>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<CpuFeature>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<CpuTopology>,
}

impl GuestCpu {
    /// The model, whichever form it came in.
    pub fn model(&self) -> CpuModel {
        self.model
            .clone()
            .map(CpuModelField::into_model)
            .unwrap_or_default()
    }
}

/// The CPU `model` in either wire form. Release 1 sent a plain string (a model name, or
/// `host-model` / `host-passthrough`); release 2 sends an object with `fallback` and
/// `vendorId`. Both decode, so a newer agent reads a launcher that was not restarted
/// (the case of `seeds/000_65e79c6f5a592135.txt`), and [`Status::for_version`] sends the
/// string to a peer that only knows version 1.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum CpuModelField {
    Name(String),
    Model(CpuModel),
}

impl CpuModelField {
    pub fn into_model(self) -> CpuModel {
        match self {
            CpuModelField::Name(name) => CpuModel {
                name,
                ..Default::default()
            },
            CpuModelField::Model(m) => m,
        }
    }

    /// The release-1 form: the name alone.
    pub fn downgrade(self) -> CpuModelField {
        CpuModelField::Name(self.into_model().name)
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuModel {
    /// The model name, e.g. `EPYC`, `Dhyana`, `host-model`.
    #[serde(default)]
    pub name: String,
    /// `allow` or `forbid`: whether libvirt may fall back to a close model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// The vendor the guest sees, e.g. `AuthenticAMD` on a Hygon host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor_id: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuFeature {
    #[serde(default)]
    pub name: String,
    /// `require`, `disable`, `optional`, `force`, `forbid`.
    #[serde(default)]
    pub policy: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuTopology {
    #[serde(default)]
    pub sockets: u32,
    #[serde(default)]
    pub cores: u32,
    #[serde(default)]
    pub threads: u32,
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
        assert_eq!(negotiate(&[1]), Some(1));
        assert_eq!(negotiate(&[1, 2, 3]), VERSIONS.last().copied());
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

    fn wire_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/wire")
    }

    fn read(rel: &str) -> String {
        std::fs::read_to_string(wire_dir().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// Every released wire format in `tests/wire/v*` still decodes and round-trips.
    #[test]
    fn golden_wire_files_decode() {
        let mut seen = 0;
        for version in std::fs::read_dir(wire_dir())
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir() && e.file_name().to_string_lossy().starts_with('v'))
        {
            let p = version.path();
            let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap();
            round_trip::<Info>(&read("info.json"));
            for f in std::fs::read_dir(&p).unwrap().flatten() {
                let name = f.file_name().to_string_lossy().to_string();
                if name.starts_with("status") {
                    let text = read(&name);
                    let st: Status = serde_json::from_str(&text).unwrap();
                    assert!(st.state.is_some() && !st.addresses.is_empty(), "{name}");
                    round_trip::<Status>(&text);
                }
            }
            round_trip::<Response>(&read("response-error.json"));
            for line in read("requests.jsonl")
                .lines()
                .filter(|l| !l.trim().is_empty())
            {
                round_trip::<Envelope>(line);
            }
            seen += 1;
        }
        assert!(seen >= 2, "golden wire folders v1 and v2 expected");
    }

    /// The CPU `model` decodes as an object (release 2) and as a plain string (release 1).
    #[test]
    fn cpu_model_both_forms() {
        let new: Status = serde_json::from_str(&read("v2/status.json")).unwrap();
        let m = new.cpu.as_ref().unwrap().model();
        assert_eq!(m.name, "EPYC");
        assert_eq!(m.fallback.as_deref(), Some("allow"));
        assert_eq!(m.vendor_id.as_deref(), Some("AuthenticAMD"));
        let old: Status = serde_json::from_str(&read("v2/status-as-v1.json")).unwrap();
        let c = old.cpu.as_ref().unwrap();
        assert_eq!(c.model, Some(CpuModelField::Name("EPYC".into())));
        assert_eq!(c.model().name, "EPYC");
        assert_eq!(c.model().vendor_id, None);
        assert_eq!(c.topology.as_ref().unwrap().cores, 2);
        let hm: Status = serde_json::from_str(&read("v2/status-host-model-string.json")).unwrap();
        assert_eq!(hm.cpu.as_ref().unwrap().mode, "host-model");
        assert_eq!(hm.cpu.unwrap().model().name, "host-model");
        // The seed's failure, in its own words: a string where an object is expected.
        let seed: Status = serde_json::from_str(
            r#"{"state":"Running","cpu":{"mode":"host-model","model":"host-model"}}"#,
        )
        .unwrap();
        assert_eq!(seed.cpu.unwrap().model().name, "host-model");
    }

    /// What this build sends, byte for byte the golden files: the object form to version-2
    /// peers, the string form to version-1 peers.
    #[test]
    fn encodes_each_version_as_its_golden_file() {
        let v: serde_json::Value = serde_json::from_str(&read("v2/status.json")).unwrap();
        let st: Status = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(st.for_version(2)).unwrap(), v);
        let v1: serde_json::Value = serde_json::from_str(&read("v2/status-as-v1.json")).unwrap();
        assert_eq!(serde_json::to_value(st.for_version(1)).unwrap(), v1);
    }

    /// Frozen copies of older decoders: what release 1 decoded (no CPU at all), and a strict
    /// protocol-1 peer that knows the CPU `model` only as a string. Never change them.
    mod frozen {
        use serde::Deserialize;

        pub mod release1 {
            use super::Deserialize;
            #[derive(Debug, Deserialize)]
            #[serde(tag = "op")]
            #[allow(dead_code)]
            pub enum Request {
                Info,
                Status,
                Shutdown {
                    #[serde(default)]
                    grace_secs: u64,
                },
                Destroy,
                Pause,
                Unpause,
                SoftReboot,
            }
            #[derive(Debug, Deserialize)]
            #[allow(dead_code)]
            pub struct Envelope {
                #[serde(default)]
                pub version: u32,
                #[serde(flatten)]
                pub request: Request,
            }
            #[derive(Debug, Deserialize)]
            #[serde(rename_all = "camelCase")]
            pub struct Info {
                #[serde(default)]
                pub versions: Vec<u32>,
                #[serde(default)]
                pub launcher_version: String,
            }
            #[derive(Debug, Deserialize)]
            pub struct Response {
                #[serde(default)]
                pub ok: bool,
                #[serde(default)]
                pub error: Option<String>,
            }
            #[derive(Debug, Deserialize)]
            #[serde(rename_all = "camelCase")]
            pub struct Address {
                pub interface: String,
                pub mac: Option<String>,
                pub ip: String,
            }
            #[derive(Debug, Deserialize)]
            #[serde(rename_all = "camelCase")]
            pub struct Status {
                #[serde(default)]
                pub state: Option<String>,
                #[serde(default)]
                pub agent_connected: bool,
                #[serde(default)]
                pub addresses: Vec<Address>,
            }
        }

        pub mod strict_v1 {
            use super::Deserialize;
            #[derive(Debug, Deserialize)]
            pub struct Cpu {
                #[serde(default)]
                pub mode: String,
                pub model: String,
            }
            #[derive(Debug, Deserialize)]
            pub struct Status {
                pub cpu: Cpu,
            }
        }
    }

    /// An older peer decodes what this build sends on the calls it knows.
    #[test]
    fn older_decoders_read_what_this_build_sends() {
        use frozen::{release1, strict_v1};
        let st: Status = serde_json::from_str(&read("v2/status.json")).unwrap();
        let sent_v1 = serde_json::to_string(&st.for_version(1)).unwrap();
        let r1: release1::Status = serde_json::from_str(&sent_v1).unwrap();
        assert_eq!(r1.state.as_deref(), Some("Running"));
        assert!(r1.agent_connected);
        assert_eq!(r1.addresses[0].ip, "10.213.50.78");
        assert_eq!(r1.addresses[0].mac.as_deref(), Some("52:54:00:81:cf:21"));
        assert_eq!(r1.addresses[0].interface, "eth0");
        let s1: strict_v1::Status = serde_json::from_str(&sent_v1).unwrap();
        assert_eq!(
            (s1.cpu.mode.as_str(), s1.cpu.model.as_str()),
            ("custom", "EPYC")
        );
        // The version-2 form is exactly what a string-only decoder cannot read: the reason
        // version-1 peers get the string.
        let sent_v2 = serde_json::to_string(&st.for_version(2)).unwrap();
        let err = serde_json::from_str::<strict_v1::Status>(&sent_v2).unwrap_err();
        assert!(err.to_string().contains("expected a string"), "{err}");

        // Info and errors as this build sends them; requests on the calls release 1 knows.
        let info = Info {
            versions: VERSIONS.to_vec(),
            launcher_version: crate::version::RELEASE.into(),
            ..Default::default()
        };
        let i1: release1::Info =
            serde_json::from_value(serde_json::to_value(&info).unwrap()).unwrap();
        assert_eq!(i1.versions, VERSIONS);
        assert!(
            i1.versions.contains(&1),
            "release-1 agents must find a common version"
        );
        assert!(!i1.launcher_version.is_empty());
        let e1: release1::Response = serde_json::from_str(&read("v2/response-error.json")).unwrap();
        assert!(!e1.ok && e1.error.unwrap().contains("[1, 2]"));
        for line in read("v2/requests.jsonl")
            .lines()
            .filter(|l| !l.trim().is_empty())
        {
            let new: Envelope = serde_json::from_str(line).unwrap();
            let as_v1 = serde_json::to_string(&Envelope { version: 1, ..new }).unwrap();
            let old: release1::Envelope =
                serde_json::from_str(&as_v1).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(old.version, 1);
        }
    }

    /// The released version-1 files decode with the current code and mean the same.
    #[test]
    fn release1_files_mean_the_same() {
        let st: Status = serde_json::from_str(&read("v1/status.json")).unwrap();
        assert_eq!(st.state, Some(DomainState::Running));
        assert!(st.cpu.is_none(), "release 1 reported no CPU");
        let info: Info = serde_json::from_str(&read("v1/info.json")).unwrap();
        assert_eq!(negotiate(&info.versions), Some(1));
    }
}
