//! This build's release string and the agent ⇄ controller protocol version, with the skew
//! window both sides enforce (`docs/compatibility.md`). The launcher protocol's versions
//! live in [`crate::launcher::protocol::VERSIONS`].

/// The release this binary reports (nodes, launchers, the install strategy).
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// The agent ⇄ controller protocol: `major.minor`. Release 1 agents sent no version and
/// count as `1.0`.
pub const AGENT_PROTOCOL: Protocol = Protocol { major: 1, minor: 1 };

/// The header an agent sends its protocol in, and the controller answers with its own.
pub const AGENT_PROTOCOL_HEADER: &str = "x-edgevirt-agent-protocol";
/// The header an agent sends its release string in.
pub const RELEASE_HEADER: &str = "x-edgevirt-release";

/// A `major.minor` protocol version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Protocol {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("bad protocol version {s:?}: expected MAJOR.MINOR");
        let (a, b) = s.trim().split_once('.').ok_or_else(bad)?;
        Ok(Protocol {
            major: a.parse().map_err(|_| bad())?,
            minor: b.parse().map_err(|_| bad())?,
        })
    }
}

impl Protocol {
    /// Whether a peer speaking `theirs` may talk to us: the same major version and at most
    /// one minor version apart, in either direction (N-1 ⇄ N during a rollout).
    pub fn accepts(self, theirs: Protocol) -> bool {
        self.major == theirs.major && self.minor.abs_diff(theirs.minor) <= 1
    }

    /// `Ok` when `theirs` is inside the window, else a message naming both versions.
    pub fn check(self, peer: &str, theirs: Protocol) -> Result<(), String> {
        if self.accepts(theirs) {
            Ok(())
        } else {
            Err(format!(
                "{peer} speaks agent protocol {theirs}, this side {self}: only the same major \
                 version and one minor version apart work together; upgrade the older side"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Protocol {
        s.parse().unwrap()
    }

    #[test]
    fn skew_window() {
        let n = p("1.5");
        assert!(n.accepts(p("1.4")), "N-1 agent");
        assert!(n.accepts(p("1.5")));
        assert!(
            n.accepts(p("1.6")),
            "N+1 agent with an N controller (the reverse)"
        );
        assert!(!n.accepts(p("1.3")));
        assert!(!n.accepts(p("2.5")), "another major never");
        let e = n.check("the agent", p("1.3")).unwrap_err();
        assert!(e.contains("1.3") && e.contains("1.5"), "{e}");
        assert!("1".parse::<Protocol>().is_err());
        assert!("a.b".parse::<Protocol>().is_err());
        assert_eq!(p(" 2.10 ").to_string(), "2.10");
    }
}

/// Agent ⇄ controller objects as each agent protocol writes them (`tests/wire/controller/`).
#[cfg(test)]
mod golden {
    use crate::types::edgevirt::Node;
    use crate::types::kubevirt::VirtualMachineInstanceStatus;

    fn read(rel: &str) -> serde_json::Value {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/wire/controller")
            .join(rel);
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
    }

    /// Frozen release-1 (1.0) reader of a VMI status: what an older controller keeps.
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Release1VmiStatus {
        phase: Option<String>,
        node_name: Option<String>,
        #[serde(default)]
        interfaces: Vec<serde_json::Value>,
    }

    #[test]
    fn each_agent_protocol_decodes_both_ways() {
        for v in ["1.0", "1.1"] {
            let node: Node = serde_json::from_value(read(&format!("{v}/node.json"))).unwrap();
            let st = node.status.unwrap();
            assert_eq!(st.cpu.vendor, "HygonGenuine");
            assert!(!st.version.is_empty());
            let raw = read(&format!("{v}/vmi-status.json"));
            let vmi: VirtualMachineInstanceStatus = serde_json::from_value(raw.clone()).unwrap();
            assert_eq!(vmi.phase, Some(crate::types::kubevirt::Phase::Running));
            // Re-encoded by this build, a release-1 reader still gets what it knew.
            let again = serde_json::to_value(&vmi).unwrap();
            let old: Release1VmiStatus = serde_json::from_value(again.clone()).unwrap();
            assert_eq!(old.phase.as_deref(), Some("Running"));
            assert_eq!(old.node_name.as_deref(), Some("edge-1"));
            assert_eq!(old.interfaces.len(), 1);
            // Nothing this build knows is lost on the way through.
            for (k, val) in raw.as_object().unwrap() {
                assert_eq!(&again[k], val, "{v}: {k}");
            }
        }
        let new: VirtualMachineInstanceStatus =
            serde_json::from_value(read("1.1/vmi-status.json")).unwrap();
        assert_eq!(new.launcher_version.as_deref(), Some("0.1.0"));
        assert_eq!(new.current_cpu_topology.map(|t| t.cores), Some(2));
        let old: VirtualMachineInstanceStatus =
            serde_json::from_value(read("1.0/vmi-status.json")).unwrap();
        assert!(old.launcher_version.is_none());
    }
}
