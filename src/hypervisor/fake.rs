//! An in-memory [`Hypervisor`] for unit tests: domains are entries in a map, and each call is
//! recorded so tests can assert on what was asked.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{
    CpuCompare, DomainState, Error, GuestAddress, HostFacts, Hypervisor, OwnedDomain, Result,
};

#[derive(Default)]
pub struct Fake {
    pub domains: Mutex<BTreeMap<String, (DomainState, String)>>,
    pub calls: Mutex<Vec<String>>,
    /// What `domain_capabilities` returns (a minimal document when unset).
    pub domcaps: Mutex<Option<String>>,
}

fn dom_name(xml: &str) -> Option<String> {
    let start = xml.find("<name>")? + 6;
    let end = xml[start..].find("</name>")? + start;
    Some(xml[start..end].to_string())
}

impl Fake {
    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn set(&self, name: &str, f: impl FnOnce(&mut DomainState)) -> Result<()> {
        let mut d = self.domains.lock().unwrap();
        let e = d
            .get_mut(name)
            .ok_or_else(|| Error::NoDomain(name.into()))?;
        f(&mut e.0);
        Ok(())
    }

    /// The domain is gone (shut down or destroyed: the fake's guests stop at once).
    fn remove(&self, name: &str) -> Result<()> {
        self.domains
            .lock()
            .unwrap()
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| Error::NoDomain(name.into()))
    }
}

impl Hypervisor for Fake {
    fn create(&self, xml: &str) -> Result<()> {
        let name = dom_name(xml).ok_or_else(|| Error::Libvirt("no <name>".into()))?;
        self.record(format!("create {name}"));
        let mut d = self.domains.lock().unwrap();
        if d.contains_key(&name) {
            return Err(Error::Libvirt(format!("domain {name} already exists")));
        }
        d.insert(name, (DomainState::Running, xml.to_string()));
        Ok(())
    }
    fn create_paused(&self, xml: &str) -> Result<()> {
        self.create(xml)?;
        let name = dom_name(xml).unwrap_or_default();
        if let Some(d) = self.domains.lock().unwrap().get_mut(&name) {
            d.0 = DomainState::Paused;
        }
        Ok(())
    }
    fn state(&self, name: &str) -> Result<Option<DomainState>> {
        Ok(self.domains.lock().unwrap().get(name).map(|d| d.0))
    }
    fn owned_domains(&self) -> Result<Vec<OwnedDomain>> {
        Ok(self
            .domains
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(n, (_, xml))| super::parse_metadata(n, xml))
            .collect())
    }
    fn shutdown(&self, name: &str) -> Result<()> {
        self.record(format!("shutdown {name}"));
        self.remove(name)
    }
    fn destroy(&self, name: &str) -> Result<()> {
        self.record(format!("destroy {name}"));
        self.remove(name)
    }
    fn suspend(&self, name: &str) -> Result<()> {
        self.record(format!("suspend {name}"));
        self.set(name, |s| *s = DomainState::Paused)
    }
    fn resume(&self, name: &str) -> Result<()> {
        self.record(format!("resume {name}"));
        self.set(name, |s| *s = DomainState::Running)
    }
    fn reboot(&self, name: &str, agent: bool) -> Result<()> {
        self.record(format!("reboot {name} agent={agent}"));
        self.set(name, |_| {})
    }
    fn agent_command(&self, name: &str, _cmd: &str, _t: i32) -> Result<String> {
        self.set(name, |_| {})?;
        Err(Error::AgentUnavailable("fake has no guest agent".into()))
    }
    fn lease_addresses(&self, _name: &str) -> Result<Vec<GuestAddress>> {
        Ok(vec![])
    }
    fn ensure_network(&self, name: &str, _xml: &str) -> Result<()> {
        self.record(format!("network {name}"));
        Ok(())
    }
    fn host_facts(&self) -> Result<HostFacts> {
        Ok(HostFacts {
            memory_bytes: 8 << 30,
            cpus: 2,
            libvirt_version: "0.0.0".into(),
            domain_types: vec!["qemu".into()],
        })
    }
    fn xml(&self, name: &str) -> Result<String> {
        self.domains
            .lock()
            .unwrap()
            .get(name)
            .map(|d| d.1.clone())
            .ok_or_else(|| Error::NoDomain(name.into()))
    }
    fn domain_capabilities(&self, virt_type: &str) -> Result<String> {
        self.record(format!("domcaps {virt_type}"));
        Ok(self.domcaps.lock().unwrap().clone().unwrap_or_else(|| {
            "<domainCapabilities><cpu><mode name='host-model' supported='yes'>\
             <model fallback='forbid'>qemu64</model><vendor>AMD</vendor></mode>\
             <mode name='custom' supported='yes'><model usable='yes' vendor='unknown'>qemu64</model>\
             </mode></cpu></domainCapabilities>"
                .to_string()
        }))
    }
    fn compare_cpu(&self, virt_type: &str, cpu_xml: &str) -> Result<CpuCompare> {
        self.record(format!("compare-cpu {virt_type}"));
        // The fake's host runs only what its domain capabilities list as usable.
        let caps = self.domain_capabilities(virt_type)?;
        let model = cpu_xml
            .split("<model")
            .nth(1)
            .and_then(|s| s.split('>').nth(1))
            .and_then(|s| s.split('<').next())
            .unwrap_or_default();
        Ok(if usable_models(&caps).any(|m| m == model) {
            CpuCompare::Identical
        } else {
            CpuCompare::Incompatible(format!("the fake host cannot run model {model}"))
        })
    }
    fn baseline_cpu(&self, virt_type: &str, _cpu_xmls: &[String]) -> Result<String> {
        self.record(format!("baseline-cpu {virt_type}"));
        Ok("<cpu mode='custom' match='exact'><model fallback='forbid'>qemu64</model></cpu>".into())
    }
}

/// The models a domain-capabilities document marks `usable='yes'` (enough for the fake's
/// own documents; the real parser is `crate::cpu::facts::parse_domcaps`).
fn usable_models(domcaps: &str) -> impl Iterator<Item = &str> {
    domcaps
        .split("<model ")
        .skip(1)
        .filter(|m| {
            m.split('>')
                .next()
                .is_some_and(|a| a.contains("usable='yes'"))
        })
        .filter_map(|m| m.split('>').nth(1)?.split('<').next())
}
