//! The compatibility checks on guest CPUs the policy resolves: the two together, as the
//! scheduler and migrations use them.

use super::compat::*;
use super::model::GuestCpu;
use crate::cpu::facts::tests::fixture_facts;
use crate::cpu::policy::{GuestOs, resolve};
use crate::types::edgevirt::CpuFacts;
use crate::types::kubevirt::Cpu;

fn guest(model: &str, host: &CpuFacts) -> GuestCpu {
    let c = Cpu {
        model: Some(model.into()),
        ..Default::default()
    };
    resolve(Some(&c), GuestOs::Other, "host-model", host, "kvm").unwrap()
}

#[test]
fn hygon_to_hygon_is_allowed_in_every_mode() {
    let a = fixture_facts("hygon-c86-7285", "kvm");
    let b = fixture_facts("hygon-c86-7285", "kvm");
    for m in ["host-passthrough", "host-model", "Dhyana", "EPYC"] {
        check_target(&guest(m, &a), &a, &b).unwrap_or_else(|e| panic!("{m}: {e}"));
    }
}

/// Under TCG this machine's host-model (EPYC) is not listed usable on its own, yet two
/// hosts with the same host-model run each other's guests (found by the multi-host test).
#[test]
fn tcg_host_model_moves_between_identical_hosts() {
    let a = fixture_facts("this-machine", "qemu");
    let b = fixture_facts("this-machine", "qemu");
    let c = Cpu::default();
    let g = resolve(Some(&c), GuestOs::Other, "host-model", &a, "qemu").unwrap();
    assert_eq!(g.mode, crate::cpu::Mode::HostModel);
    check_target(&g, &a, &b).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn hygon_to_intel() {
    let hygon = fixture_facts("hygon-c86-7285", "kvm");
    let intel = fixture_facts("intel-xeon-e5-2660v3", "kvm");
    let e = check_target(&guest("host-passthrough", &hygon), &hygon, &intel).unwrap_err();
    assert!(e.to_string().contains("HygonGenuine family 24"), "{e}");
    let e = check_target(&guest("host-model", &hygon), &hygon, &intel).unwrap_err();
    assert_eq!(e.missing, vec!["Dhyana"]);
    let e = check_target(&guest("Dhyana", &hygon), &hygon, &intel).unwrap_err();
    assert!(e.to_string().ends_with(": Dhyana"), "{e}");
    // The baseline both run is allowed.
    let base = baseline_model(&[&hygon, &intel]).unwrap();
    assert_eq!(base, "SandyBridge");
    check_target(&guest(&base, &hygon), &hygon, &intel).unwrap();
}

#[test]
fn missing_flags_are_named() {
    let a = fixture_facts("amd-epyc-7502p", "kvm");
    let mut b = a.clone();
    b.flags.retain(|f| f != "clwb" && f != "wbnoinvd");
    let e = check_target(&guest("host-passthrough", &a), &a, &b).unwrap_err();
    assert_eq!(e.missing, vec!["clwb", "wbnoinvd"]);
    assert!(
        e.to_string()
            .contains("lacks CPU features the guest sees: clwb, wbnoinvd")
    );
    // host-model: a target whose host-model lacks a required feature.
    let mut c = a.clone();
    c.flags.retain(|f| f != "xsaves");
    if let Some(hm) = &mut c.host_model {
        hm.features.retain(|f| f.name != "xsaves");
    }
    let e = check_target(&guest("host-model", &a), &a, &c).unwrap_err();
    assert_eq!(e.missing, vec!["xsaves"]);
    // The VM's own required features.
    let mut g = guest("EPYC", &a);
    g.features.push(crate::types::edgevirt::CpuFeaturePolicy {
        policy: "require".into(),
        name: "avx512f".into(),
    });
    let e = check_node(&g, &a).unwrap_err();
    assert_eq!(e.missing, vec!["avx512f"]);
    g.features[0].name = "sse4.2".into();
    check_node(&g, &a).unwrap();
}

#[test]
fn migration_check_asks_the_target_hypervisor() {
    let hygon = fixture_facts("hygon-c86-7285", "kvm");
    let g = guest("EPYC", &hygon);
    let xml = "<domain><cpu mode='custom' match='exact' check='partial'>\
               <model fallback='forbid'>EPYC</model></cpu></domain>";
    // The fake target runs only what its domain capabilities list as usable.
    let target = crate::hypervisor::fake::Fake::default();
    *target.domcaps.lock().unwrap() = Some(crate::cpu::facts::tests::fixture(
        "hygon-c86-7285",
        "domcapabilities-kvm.xml",
    ));
    check_migration(&g, &hygon, &hygon, xml, &target).unwrap();
    assert!(
        target
            .calls
            .lock()
            .unwrap()
            .iter()
            .any(|c| c == "compare-cpu kvm")
    );
    *target.domcaps.lock().unwrap() = Some(crate::cpu::facts::tests::fixture(
        "intel-xeon-e5-2660v3",
        "domcapabilities-kvm.xml",
    ));
    // The pure check refuses first (the Intel facts do not list EPYC) ...
    let intel = fixture_facts("intel-xeon-e5-2660v3", "kvm");
    assert_eq!(
        check_migration(&g, &hygon, &intel, xml, &target)
            .unwrap_err()
            .missing,
        vec!["EPYC"]
    );
    // ... and libvirt's verdict counts even when the facts look fine.
    let e = check_migration(&g, &hygon, &hygon, xml, &target).unwrap_err();
    assert!(e.reason.contains("libvirt on the target host"), "{e}");
}

#[test]
fn tcg_and_libvirt_messages() {
    let t = fixture_facts("this-machine", "qemu");
    let k = fixture_facts("amd-epyc-7502p", "kvm");
    let g = guest("host-passthrough", &t);
    assert!(check_target(&g, &t, &k).is_err());
    let c = Cpu {
        model: Some("host-passthrough".into()),
        ..Default::default()
    };
    let g = resolve(Some(&c), GuestOs::Other, "host-model", &t, "qemu").unwrap();
    check_target(&g, &t, &t).unwrap();
    assert_eq!(
        features_in_message(
            "the CPU is incompatible with host CPU: Host CPU does not provide required features: vme, rdseed, ibpb"
        ),
        vec!["ibpb", "rdseed", "vme"]
    );
    let x = "<domain><cpu mode='custom' match='exact'><model>EPYC</model></cpu><clock/></domain>";
    assert_eq!(
        cpu_element(x).unwrap(),
        "<cpu mode='custom' match='exact'><model>EPYC</model></cpu>"
    );
    let xml = guest_cpu_xml(&guest("host-model", &k), &k).unwrap();
    assert!(
        xml.contains("<model fallback='forbid'>EPYC-Rome</model>")
            && xml.contains("<vendor>AMD</vendor>")
    );
}
