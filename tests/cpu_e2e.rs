//! End-to-end tests of the guest CPU policy on the real libvirtd with real TCG guests: a VM
//! started with each mode reaches Running and the CPU its kernel reports (`/proc/cpuinfo`,
//! read through the guest agent) is the one the policy chose. Needs root, libvirtd and the
//! test guest (`#[ignore]`; `scripts/test.sh` runs it with `--include-ignored`).

use std::time::Duration;

use serde_json::{Value, json};
use testkit::*;

const BOOT: Duration = Duration::from_secs(120);

/// Run a program in the guest through the guest agent and return its stdout.
fn guest_run(dom: &str, path: &str, args: &[&str]) -> Option<String> {
    let cmd = json!({"execute": "guest-exec", "arguments": {"path": path, "arg": args, "capture-output": true}});
    let (ok, out) = virsh(&["qemu-agent-command", dom, &cmd.to_string()]);
    if !ok {
        return None;
    }
    let pid = serde_json::from_str::<Value>(&out).ok()?["return"]["pid"].as_i64()?;
    for _ in 0..50 {
        let status = json!({"execute": "guest-exec-status", "arguments": {"pid": pid}});
        let (ok, out) = virsh(&["qemu-agent-command", dom, &status.to_string()]);
        if !ok {
            return None;
        }
        let v: Value = serde_json::from_str(&out).ok()?;
        if v["return"]["exited"] == true {
            use base64::Engine;
            let data = base64::engine::general_purpose::STANDARD
                .decode(v["return"]["out-data"].as_str().unwrap_or(""))
                .ok()?;
            return String::from_utf8(data).ok();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// `vendor_id`, `model name` and `cpu family` of the guest's first CPU.
fn cpuinfo_of(text: &str) -> (String, String, String) {
    let f = edgevirt::cpu::parse_cpuinfo(text);
    (f.vendor, f.model, f.family.to_string())
}

struct Seen {
    vendor: String,
    model_name: String,
    family: String,
    domain_xml: String,
    guest_cpu: Value,
}

/// Start the VM, wait for Running and the guest agent, read the guest's CPU, delete the VM.
async fn run_vm(a: &Appliance, name: &str, yaml: &str) -> Seen {
    let (code, v) = a.post_yaml(VMS, yaml).await;
    assert_eq!(code, 201, "{v}");
    let vmi = a.wait_running(name, None, BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    let (ok, domain_xml) = virsh(&["dumpxml", &dom]);
    assert!(ok, "dumpxml {dom}");
    let text = wait_for(
        &format!("{name}: /proc/cpuinfo through the guest agent"),
        BOOT,
        || async {
            guest_run(&dom, "/bin/cat", &["/proc/cpuinfo"]).filter(|t| t.contains("vendor_id"))
        },
    )
    .await;
    let (vendor, model_name, family) = cpuinfo_of(&text);
    eprintln!("{name}: the guest sees {vendor} {model_name:?} family {family}");
    let guest_cpu: Value = serde_json::from_str(
        vmi["metadata"]["annotations"]["edgevirt.io/guest-cpu"]
            .as_str()
            .expect("the scheduler records the guest CPU on the VMI"),
    )
    .unwrap();
    let (code, _) = a.delete(&format!("{VMS}/{name}")).await;
    assert_eq!(code, 200);
    wait_for(&format!("{name}: domain gone"), BOOT, || async {
        domstate(&dom).is_none().then_some(())
    })
    .await;
    Seen {
        vendor,
        model_name,
        family,
        domain_xml,
        guest_cpu,
    }
}

/// libvirt's vendor names as CPUID spells them.
fn cpuid_vendor(libvirt_vendor: &str) -> &'static str {
    match libvirt_vendor {
        "AMD" => "AuthenticAMD",
        "Intel" => "GenuineIntel",
        "Hygon" => "HygonGenuine",
        _ => "unknown",
    }
}

#[tokio::test]
#[ignore = "needs root, libvirtd and the test guest: run scripts/test.sh"]
async fn each_cpu_mode_shows_in_the_guest() {
    // What libvirt offers TCG guests here, read independently of edgevirt.
    let (ok, dc) = virsh(&["domcapabilities", "--virttype", "qemu"]);
    assert!(ok);
    let caps = edgevirt::cpu::facts::parse_domcaps(&dc);
    let hm = caps.host_model.clone().expect("TCG host-model");
    let named = ["Westmere", "Nehalem", "Penryn"]
        .into_iter()
        .find(|m| caps.usable_models.iter().any(|u| u == m))
        .expect("an Intel model usable under TCG");

    let a = Appliance::start(&[]).await;
    a.import_guest().await;

    // The node reports this host's CPU and libvirt's TCG view of it.
    let (_, node) = a.get("/apis/edgevirt.io/v1/nodes/testnode").await;
    let host = edgevirt::cpu::parse_cpuinfo(&std::fs::read_to_string("/proc/cpuinfo").unwrap());
    let cpu = &node["status"]["cpu"];
    assert_eq!(cpu["vendor"], host.vendor.as_str());
    assert_eq!(cpu["family"], host.family);
    assert_eq!(cpu["modelNumber"], host.model_number);
    assert_eq!(cpu["virtType"], "qemu");
    assert_eq!(cpu["hostModel"]["model"], hm.model.as_str());
    assert!(cpu["flags"].as_array().unwrap().len() > 10);
    assert!(
        cpu["usableModels"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m == named)
    );

    // The CLI shows the same facts, the baseline (one node: its best usable model) and a check.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(exe())
            .args(args)
            .args(["--server", &a.url, "--token", &a.token])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, out, err) = cli(&["cpu", "show", "testnode", "-o", "json"]);
    assert!(ok, "{err}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown[0]["cpu"]["hostModel"]["model"], hm.model.as_str());
    let (ok, out, _) = cli(&["cpu", "show"]);
    assert!(
        ok && out.contains("testnode") && out.contains(&hm.model),
        "{out}"
    );
    let (ok, out, err) = cli(&["cpu", "baseline"]);
    assert!(ok, "{err}");
    assert!(
        caps.usable_models.iter().any(|m| m == out.trim()),
        "baseline {out:?} is a model this node can run"
    );
    let (ok, _, err) = cli(&["cpu", "show", "nosuchnode"]);
    assert!(!ok && err.contains("not found"), "{err}");

    // host-model (the cluster default): libvirt's TCG host-model, its vendor in the guest.
    let s = run_vm(&a, "cpu-hm", &Vm::guest("cpu-hm").yaml()).await;
    assert_eq!(s.guest_cpu["mode"], "host-model");
    assert!(
        s.domain_xml.contains(&format!(">{}</model>", hm.model)),
        "host-model expanded to {}: {}",
        hm.model,
        s.domain_xml
    );
    assert_eq!(
        s.vendor,
        cpuid_vendor(&hm.vendor),
        "host-model guest vendor"
    );
    let host_model_name = s.model_name.clone();

    // host-passthrough under TCG: mode maximum, QEMU's own TCG CPU.
    let s = run_vm(
        &a,
        "cpu-hp",
        &Vm::guest("cpu-hp")
            .cpu(json!({"cores": 1, "model": "host-passthrough"}))
            .yaml(),
    )
    .await;
    assert_eq!(s.guest_cpu["mode"], "maximum");
    assert!(s.domain_xml.contains("mode='maximum'"), "{}", s.domain_xml);
    assert_ne!(
        s.model_name, host_model_name,
        "maximum must differ from host-model in the guest"
    );

    // A named model: the guest sees that model and its vendor.
    let s = run_vm(
        &a,
        "cpu-named",
        &Vm::guest("cpu-named")
            .cpu(json!({"cores": 1, "model": named, "features": [{"name": "aes", "policy": "require"}]}))
            .yaml(),
    )
    .await;
    assert_eq!(s.guest_cpu["model"], named);
    assert_eq!(s.vendor, "GenuineIntel");
    assert!(
        s.domain_xml
            .contains("<feature policy='require' name='aes'/>"),
        "{}",
        s.domain_xml
    );
    drop(a);

    // The Windows-on-Hygon preset on a simulated Hygon node (the agent reads a Hygon
    // /proc/cpuinfo from the fixtures): a named model with the AMD vendor string.
    let hygon = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/cpu/hygon-c86-7285/cpuinfo"
    );
    let a = Appliance::start_with_env(&[], &[("EDGEVIRT_CPUINFO", hygon)]).await;
    a.import_guest().await;
    let (_, node) = a.get("/apis/edgevirt.io/v1/nodes/testnode").await;
    assert_eq!(node["status"]["cpu"]["vendor"], "HygonGenuine");
    let s = run_vm(
        &a,
        "cpu-win",
        &Vm::guest("cpu-win")
            .template_annotation("vm.kubevirt.io/os", "windows2k22")
            .yaml(),
    )
    .await;
    assert_eq!(s.guest_cpu["vendorId"], "AuthenticAMD", "{}", s.guest_cpu);
    assert_eq!(s.guest_cpu["model"], "Dhyana");
    assert!(
        s.guest_cpu["reason"]
            .as_str()
            .unwrap()
            .contains("HygonGenuine")
    );
    assert!(
        s.domain_xml.contains("vendor_id='AuthenticAMD'") && s.domain_xml.contains("<spinlocks"),
        "{}",
        s.domain_xml
    );
    // The model is Hygon's Dhyana (family 24), the vendor the guest sees is AMD's.
    assert_eq!(s.vendor, "AuthenticAMD");
    assert_eq!(s.family, "24");
    assert!(s.model_name.contains("Dhyana"), "{}", s.model_name);
    // A Linux guest on the same Hygon node keeps host-model and gets no Hyper-V.
    let s = run_vm(&a, "cpu-lin", &Vm::guest("cpu-lin").yaml()).await;
    assert_eq!(s.guest_cpu["mode"], "host-model");
    assert!(!s.domain_xml.contains("<hyperv"), "{}", s.domain_xml);
    assert_eq!(s.vendor, cpuid_vendor(&hm.vendor));
}

/// The libvirt-backed check the migration path runs on a target host, against this host's
/// real libvirtd: a CPU it can run passes, one that needs a feature TCG lacks is refused with
/// that feature named; the baseline of two CPUs is a CPU both can run.
#[tokio::test]
#[ignore = "needs root and libvirtd: run scripts/test.sh"]
async fn libvirt_cpu_comparison_and_baseline() {
    use edgevirt::hypervisor::Hypervisor;
    let hv = tokio::task::spawn_blocking(|| {
        edgevirt::virt::libvirt::Libvirt::open("qemu:///system").unwrap()
    })
    .await
    .unwrap();
    let hv = std::sync::Arc::new(hv);
    let h = hv.clone();
    let facts = tokio::task::spawn_blocking(move || edgevirt::cpu::node_facts(&*h, "qemu"))
        .await
        .unwrap();
    assert!(facts.usable_models.iter().any(|m| m == "Westmere"));
    let ok = "<cpu mode='custom' match='exact'><model fallback='forbid'>Westmere</model></cpu>";
    let bad = "<cpu mode='custom' match='exact'><model fallback='forbid'>Westmere</model>\
               <feature policy='require' name='avx512f'/><feature policy='require' name='vmx'/></cpu>";
    let h = hv.clone();
    let (r_ok, r_bad, base) = tokio::task::spawn_blocking(move || {
        (
            edgevirt::cpu::check_target_libvirt(&*h, "qemu", ok),
            edgevirt::cpu::check_target_libvirt(&*h, "qemu", bad),
            h.baseline_cpu(
                "qemu",
                &[
                    ok.to_string(),
                    "<cpu mode='custom' match='exact'><model fallback='forbid'>Nehalem</model></cpu>"
                        .to_string(),
                ],
            ),
        )
    })
    .await
    .unwrap();
    r_ok.unwrap();
    let e = r_bad.unwrap_err();
    assert!(e.missing.contains(&"avx512f".to_string()), "{e}");
    assert!(e.to_string().contains("avx512f"), "{e}");
    let base = base.unwrap();
    assert!(
        base.contains("<model") && base.contains("Nehalem"),
        "{base}"
    );
    // The guest CPU of a running domain, as the migration path would take it.
    let x = edgevirt::cpu::compat::cpu_element(
        "<domain><name>x</name><cpu mode='custom' match='exact'><model>Westmere</model></cpu></domain>",
    )
    .unwrap();
    let h = hv.clone();
    tokio::task::spawn_blocking(move || edgevirt::cpu::check_target_libvirt(&*h, "qemu", &x))
        .await
        .unwrap()
        .unwrap();
}
