//! Host CPU facts: identity and flags from `/proc/cpuinfo`, and libvirt's view of what guests
//! can get on this host from its domain capabilities XML (`virsh domcapabilities`): the
//! host-model CPU, the named models marked `usable='yes'`, and whether `host-passthrough` is
//! supported. Parsing is pure; [`node_facts`] gathers both for the agent.

use quick_xml::events::{BytesStart, Event};

use crate::hypervisor::Hypervisor;
use crate::types::edgevirt::{CpuFacts, CpuFeaturePolicy, HostModelCpu};

/// Environment variable naming a file read instead of `/proc/cpuinfo`. For tests that simulate
/// another host (a Hygon node on an Intel machine); not a setting for production.
pub const CPUINFO_ENV: &str = "EDGEVIRT_CPUINFO";

/// Parse the text of `/proc/cpuinfo` (the first processor block gives the identity; every
/// block counts as one logical CPU).
pub fn parse_cpuinfo(text: &str) -> CpuFacts {
    let mut f = CpuFacts::default();
    let mut first = true;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        if k == "processor" {
            f.count += 1;
            first = f.count == 1;
            continue;
        }
        if !first {
            continue;
        }
        match k {
            "vendor_id" => f.vendor = v.to_string(),
            "model name" => f.model = v.to_string(),
            "cpu family" => f.family = v.parse().unwrap_or(0),
            "model" => f.model_number = v.parse().unwrap_or(0),
            "stepping" => f.stepping = v.parse().unwrap_or(0),
            "flags" => f.flags = v.split_whitespace().map(str::to_string).collect(),
            _ => {}
        }
    }
    f
}

/// This host's CPU identity and flags, from `/proc/cpuinfo` (or the file in
/// [`CPUINFO_ENV`]).
pub fn host_cpu() -> CpuFacts {
    let path = std::env::var(CPUINFO_ENV).unwrap_or_else(|_| "/proc/cpuinfo".into());
    parse_cpuinfo(&std::fs::read_to_string(path).unwrap_or_default())
}

/// What libvirt's domain capabilities say about guest CPUs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DomainCpuCaps {
    pub host_passthrough: bool,
    pub maximum: bool,
    pub host_model: Option<HostModelCpu>,
    pub usable_models: Vec<String>,
    /// Hyper-V enlightenments listed under `<features><hyperv>`.
    pub hyperv: Vec<String>,
}

fn attr(e: &BytesStart, name: &[u8]) -> Option<String> {
    e.attributes()
        .flatten()
        .find(|a| a.key.as_ref() == name)
        .and_then(|a| a.unescape_value().ok().map(|v| v.into_owned()))
}

/// Parse `virsh domcapabilities` XML. Unknown elements are skipped; a document without a
/// `<cpu>` section gives empty caps.
pub fn parse_domcaps(xml: &str) -> DomainCpuCaps {
    let mut caps = DomainCpuCaps::default();
    let mut reader = quick_xml::Reader::from_str(xml);
    // Where we are: the current <mode name=...> inside <cpu>, and the element whose text we
    // want next.
    let mut mode: Option<String> = None;
    let mut in_hyperv = false;
    let mut text_for: Option<(String, Option<String>)> = None;
    let mut host_model = HostModelCpu::default();
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) => match e.name().as_ref() {
                b"mode" => {
                    let name = attr(&e, b"name").unwrap_or_default();
                    let supported = attr(&e, b"supported").as_deref() == Some("yes");
                    match name.as_str() {
                        "host-passthrough" => caps.host_passthrough = supported,
                        "maximum" => caps.maximum = supported,
                        _ => {}
                    }
                    mode = supported.then_some(name);
                }
                b"model" => {
                    text_for = Some(("model".into(), attr(&e, b"usable")));
                }
                b"vendor" => text_for = Some(("vendor".into(), None)),
                b"hyperv" => in_hyperv = attr(&e, b"supported").as_deref() == Some("yes"),
                b"value" if in_hyperv => text_for = Some(("hyperv".into(), None)),
                _ => {}
            },
            Ok(Event::Empty(e)) if e.name().as_ref() == b"mode" => {
                let name = attr(&e, b"name").unwrap_or_default();
                let supported = attr(&e, b"supported").as_deref() == Some("yes");
                match name.as_str() {
                    "host-passthrough" => caps.host_passthrough = supported,
                    "maximum" => caps.maximum = supported,
                    _ => {}
                }
            }
            Ok(Event::Empty(e))
                if e.name().as_ref() == b"feature" && mode.as_deref() == Some("host-model") =>
            {
                host_model.features.push(CpuFeaturePolicy {
                    policy: attr(&e, b"policy").unwrap_or_else(|| "require".into()),
                    name: attr(&e, b"name").unwrap_or_default(),
                });
            }
            Ok(Event::Text(t)) => {
                if let Some((what, usable)) = text_for.take() {
                    let v = t.decode().map(|s| s.trim().to_string()).unwrap_or_default();
                    match (what.as_str(), mode.as_deref()) {
                        ("model", Some("host-model")) => host_model.model = v,
                        ("vendor", Some("host-model")) => host_model.vendor = v,
                        ("model", Some("custom")) if usable.as_deref() == Some("yes") => {
                            caps.usable_models.push(v)
                        }
                        ("hyperv", _) => caps.hyperv.push(v),
                        _ => {}
                    }
                }
            }
            Ok(Event::End(e)) => match e.name().as_ref() {
                b"mode" => mode = None,
                b"hyperv" => in_hyperv = false,
                _ => text_for = None,
            },
            Ok(Event::Eof) | Err(_) => break,
            _ => {}
        }
    }
    if !host_model.model.is_empty() {
        caps.host_model = Some(host_model);
    }
    caps
}

/// Put libvirt's guest-CPU facts for `virt_type` onto cpuinfo facts.
pub fn with_domcaps(mut f: CpuFacts, virt_type: &str, domcaps_xml: &str) -> CpuFacts {
    let caps = parse_domcaps(domcaps_xml);
    f.virt_type = virt_type.to_string();
    f.host_model = caps.host_model;
    f.usable_models = caps.usable_models;
    f.host_passthrough = caps.host_passthrough;
    f
}

/// This node's CPU facts for guests of domain type `virt_type` (`kvm` or `qemu`). Blocks (one
/// libvirt call); when libvirt cannot answer, the cpuinfo facts alone.
pub fn node_facts(hv: &dyn Hypervisor, virt_type: &str) -> CpuFacts {
    let f = host_cpu();
    match hv.domain_capabilities(virt_type) {
        Ok(xml) => with_domcaps(f, virt_type, &xml),
        Err(e) => {
            tracing::warn!(error = %e, "libvirt domain capabilities unavailable; CPU facts from /proc/cpuinfo only");
            CpuFacts {
                virt_type: virt_type.to_string(),
                ..f
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fixture file under `tests/fixtures/cpu/`.
    pub fn fixture(host: &str, file: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/cpu")
            .join(host)
            .join(file);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// A fixture host's facts as its agent would report them for `virt_type`.
    pub fn fixture_facts(host: &str, virt_type: &str) -> CpuFacts {
        let dc = if virt_type == "qemu" {
            fixture("this-machine", "domcapabilities-qemu.xml")
        } else {
            fixture(host, "domcapabilities-kvm.xml")
        };
        with_domcaps(parse_cpuinfo(&fixture(host, "cpuinfo")), virt_type, &dc)
    }

    #[test]
    fn cpuinfo_of_each_fixture_host() {
        let h = parse_cpuinfo(&fixture("hygon-c86-7285", "cpuinfo"));
        assert_eq!(
            (
                h.vendor.as_str(),
                h.family,
                h.model_number,
                h.stepping,
                h.count
            ),
            ("HygonGenuine", 24, 1, 1, 2)
        );
        assert!(h.model.starts_with("Hygon C86 7285"));
        assert!(h.flags.iter().any(|f| f == "sha_ni"));
        assert!(!h.flags.iter().any(|f| f == "clwb"));
        let a = parse_cpuinfo(&fixture("amd-epyc-7502p", "cpuinfo"));
        assert_eq!(
            (a.vendor.as_str(), a.family, a.model_number),
            ("AuthenticAMD", 23, 49)
        );
        let i = parse_cpuinfo(&fixture("intel-xeon-e5-2660v3", "cpuinfo"));
        assert_eq!(
            (i.vendor.as_str(), i.family, i.model_number),
            ("GenuineIntel", 6, 63)
        );
        let m = parse_cpuinfo(&fixture("this-machine", "cpuinfo"));
        assert!(!m.vendor.is_empty() && m.family > 0 && m.flags.len() > 20);
    }

    #[test]
    fn domain_capabilities_of_the_fixture_hosts() {
        let h = parse_domcaps(&fixture("hygon-c86-7285", "domcapabilities-kvm.xml"));
        let hm = h.host_model.clone().unwrap();
        assert_eq!((hm.model.as_str(), hm.vendor.as_str()), ("Dhyana", "Hygon"));
        assert!(
            hm.features
                .iter()
                .any(|f| f.name == "topoext" && f.policy == "require")
        );
        assert!(h.host_passthrough);
        assert!(h.usable_models.iter().any(|m| m == "Dhyana"));
        assert!(h.usable_models.iter().any(|m| m == "EPYC"));
        assert!(!h.usable_models.iter().any(|m| m == "EPYC-Rome"));
        // TCG on this machine: no host-passthrough, QEMU's EPYC as host-model, maximum.
        let t = parse_domcaps(&fixture("this-machine", "domcapabilities-qemu.xml"));
        assert!(!t.host_passthrough && t.maximum);
        let thm = t.host_model.unwrap();
        assert_eq!((thm.model.as_str(), thm.vendor.as_str()), ("EPYC", "AMD"));
        assert!(thm.features.iter().any(|f| f.policy == "disable"));
        assert!(t.usable_models.iter().any(|m| m == "Westmere"));
        assert!(!t.usable_models.iter().any(|m| m == "Dhyana"));
        assert_eq!(t.hyperv, vec!["spinlocks", "vendor_id"]);
    }
}
