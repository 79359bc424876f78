use serde_json::json;

use super::*;
use crate::types::decode;

fn vmi(spec: serde_json::Value) -> VirtualMachineInstanceSpec {
    serde_json::from_value(spec).unwrap()
}

fn instancetype(cpu: u32, mem: &str) -> InstancetypeSpec {
    decode(
        "VirtualMachineInstancetype",
        json!({"cpu": {"guest": cpu}, "memory": {"guest": mem}}),
    )
    .unwrap()
}

#[test]
fn an_instancetype_sets_vcpus_and_memory() {
    let mut spec = vmi(json!({"domain": {"devices": {}}}));
    let mut ann = BTreeMap::new();
    expand(
        &mut spec,
        &mut ann,
        Some(&instancetype(4, "2Gi")),
        None,
        "spec",
    )
    .unwrap();
    let cpu = spec.domain.cpu.unwrap();
    assert_eq!(
        (cpu.sockets, cpu.cores, cpu.threads),
        (Some(4), Some(1), Some(1))
    );
    assert_eq!(spec.domain.memory.unwrap().guest.as_deref(), Some("2Gi"));
}

#[test]
fn every_conflict_is_named_at_once() {
    let mut spec = vmi(
        json!({"domain": {"devices": {}, "cpu": {"cores": 2, "sockets": 1},
        "memory": {"guest": "128Mi"}, "resources": {"requests": {"memory": "1Gi"}}}}),
    );
    let mut ann = BTreeMap::new();
    let e = expand(
        &mut spec,
        &mut ann,
        Some(&instancetype(1, "1Gi")),
        None,
        "spec.template.spec",
    )
    .unwrap_err();
    let fields: Vec<&str> = e.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.template.spec.domain.cpu.sockets",
            "spec.template.spec.domain.cpu.cores",
            "spec.template.spec.domain.memory.guest",
            "spec.template.spec.domain.resources.requests.memory",
        ]
    );
    assert_eq!(
        e[2].message,
        "VM field(s) spec.template.spec.domain.memory.guest conflicts with selected instance type"
    );
}

#[test]
fn a_preference_fills_only_what_is_unset() {
    let pref: PreferenceSpec = decode(
        "VirtualMachinePreference",
        json!({"devices": {"preferredDiskBus": "sata", "preferredInterfaceModel": "e1000",
                "preferredRng": {}},
               "cpu": {"preferredCPUTopology": "cores"},
               "firmware": {"preferredUseEfi": true, "preferredUseSecureBoot": true},
               "features": {"preferredSmm": {}, "preferredHyperv": {"relaxed": {}}},
               "clock": {"preferredClockOffset": {"utc": {}}, "preferredTimer": {"hpet": {"present": false}}},
               "preferredTerminationGracePeriodSeconds": 3600}),
    )
    .unwrap();
    let mut spec = vmi(json!({"domain": {"devices": {
        "disks": [{"name": "a", "disk": {}}, {"name": "b", "disk": {"bus": "virtio"}}, {"name": "c"}],
        "interfaces": [{"name": "default", "masquerade": {}}]}},
        "terminationGracePeriodSeconds": 0}));
    let mut ann = BTreeMap::new();
    expand(
        &mut spec,
        &mut ann,
        Some(&instancetype(2, "1Gi")),
        Some(&pref),
        "spec",
    )
    .unwrap();
    let d = &spec.domain;
    let buses: Vec<Option<&str>> = d
        .devices
        .disks
        .iter()
        .map(|x| x.disk.as_ref().unwrap().bus.as_deref())
        .collect();
    assert_eq!(buses, [Some("sata"), Some("virtio"), Some("sata")]);
    assert_eq!(d.devices.interfaces[0].model.as_deref(), Some("e1000"));
    assert!(d.devices.rng.is_some());
    let cpu = d.cpu.as_ref().unwrap();
    assert_eq!((cpu.sockets, cpu.cores), (Some(1), Some(2)));
    let efi = d
        .firmware
        .as_ref()
        .unwrap()
        .bootloader
        .as_ref()
        .unwrap()
        .efi
        .as_ref();
    assert_eq!(efi.unwrap().secure_boot, Some(true));
    assert!(d.features.as_ref().unwrap().smm.is_some());
    assert!(d.clock.as_ref().unwrap().utc.is_some());
    assert_eq!(
        spec.termination_grace_period_seconds,
        Some(0),
        "the VM's own value stays"
    );
}

#[test]
fn spread_topologies_divide_or_are_refused() {
    let spread = |across: &str, ratio: u32| -> PreferenceSpec {
        decode(
            "VirtualMachinePreference",
            json!({"cpu": {"preferredCPUTopology": "spread",
                   "spreadOptions": {"across": across, "ratio": ratio}}}),
        )
        .unwrap()
    };
    let lay = |guest, p: &PreferenceSpec| {
        topology(guest, Some(p)).map(|c| (c.sockets.unwrap(), c.cores.unwrap(), c.threads.unwrap()))
    };
    assert_eq!(lay(8, &spread("SocketsCores", 2)), Ok((4, 2, 1)));
    assert_eq!(lay(8, &spread("SocketsCoresThreads", 2)), Ok((2, 2, 2)));
    assert_eq!(lay(8, &spread("CoresThreads", 2)), Ok((1, 4, 2)));
    assert!(lay(6, &spread("SocketsCores", 4)).is_err());
    assert_eq!(lay(1, &spread("SocketsCores", 4)), Ok((1, 1, 1)));
}

#[test]
fn requirements_are_checked_against_the_result() {
    let pref: PreferenceSpec = decode(
        "VirtualMachinePreference",
        json!({"requirements": {"cpu": {"guest": 2}, "memory": {"guest": "4Gi"}}}),
    )
    .unwrap();
    let mut spec = vmi(json!({"domain": {"devices": {}}}));
    let mut ann = BTreeMap::new();
    let e = expand(
        &mut spec,
        &mut ann,
        Some(&instancetype(1, "2Gi")),
        Some(&pref),
        "spec",
    )
    .unwrap_err();
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(e[0].message.contains("insufficient CPU resources of 1 vCPU provided by instance type, preference requires 2 vCPU"), "{}", e[0].message);
    assert!(
        e[1].message
            .contains("insufficient Memory resources of 2Gi"),
        "{}",
        e[1].message
    );
}

#[test]
fn features_edgevirt_lacks_are_refused_by_name_at_use() {
    let it: InstancetypeSpec = decode(
        "VirtualMachineClusterInstancetype",
        json!({"cpu": {"guest": 1, "dedicatedCPUPlacement": true},
               "memory": {"guest": "2Gi", "hugepages": {"pageSize": "2Mi"}}}),
    )
    .unwrap();
    let mut spec = vmi(json!({"domain": {"devices": {}}}));
    let mut ann = BTreeMap::new();
    let e = expand(&mut spec, &mut ann, Some(&it), None, "spec").unwrap_err();
    let fields: Vec<&str> = e.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(fields, ["spec.domain.memory.hugepages"]);
    // Dedicated CPUs alone are taken: the instance asks for them.
    let it: InstancetypeSpec = decode(
        "VirtualMachineClusterInstancetype",
        json!({"cpu": {"guest": 2, "dedicatedCPUPlacement": true, "isolateEmulatorThread": true},
               "memory": {"guest": "2Gi"}}),
    )
    .unwrap();
    let mut spec = vmi(json!({"domain": {"devices": {}}}));
    expand(&mut spec, &mut ann, Some(&it), None, "spec").unwrap();
    let cpu = spec.domain.cpu.unwrap();
    assert_eq!(
        (cpu.dedicated_cpu_placement, cpu.isolate_emulator_thread),
        (Some(true), Some(true))
    );
}

#[test]
fn overcommit_lowers_the_request() {
    let it: InstancetypeSpec = decode(
        "VirtualMachineClusterInstancetype",
        json!({"cpu": {"guest": 1}, "memory": {"guest": "4Gi", "overcommitPercent": 50}}),
    )
    .unwrap();
    let mut spec = vmi(json!({"domain": {"devices": {}}}));
    let mut ann = BTreeMap::new();
    expand(&mut spec, &mut ann, Some(&it), None, "spec").unwrap();
    let req = &spec.domain.resources.unwrap().requests["memory"];
    assert_eq!(req, &(2u64 << 30).to_string());
}

#[test]
fn matcher_kinds_as_kubevirt_spells_them() {
    let m = |k: Option<&str>| Matcher {
        name: "x".into(),
        kind: k.map(str::to_string),
        ..Default::default()
    };
    assert_eq!(m(None).scope(false), Ok(Scope::Cluster));
    assert_eq!(
        m(Some("VirtualMachineInstancetype")).scope(false),
        Ok(Scope::Namespaced)
    );
    assert_eq!(
        m(Some("virtualmachineclusterpreferences")).scope(true),
        Ok(Scope::Cluster)
    );
    assert!(m(Some("VirtualMachinePreference")).scope(false).is_err());
}
