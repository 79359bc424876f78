//! The guest CPU policy: from KubeVirt's `spec.domain.cpu` (model, features), the guest's
//! operating system (labels and annotations KubeVirt and its templates set), edgevirt's
//! cluster default and the node's CPU facts, to the CPU a guest gets on that node
//! ([`GuestCpu`], rendered into `<cpu>`, `<hyperv>` and `<clock>` by the converter), with a
//! reason a person can read. Every rule and its source is in `docs/cpu-policy.md`.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::model::check_cpu_name;
pub use super::model::{GuestCpu, Mode};
use crate::types::Invalid;
use crate::types::Node;
use crate::types::edgevirt::{CpuFacts, CpuFeaturePolicy};
use crate::types::kubevirt::Cpu;
use crate::types::kubevirt::VirtualMachineInstance;

/// The VMI annotation in which the scheduler records the guest CPU it chose (JSON of
/// [`GuestCpu`]); the agent renders exactly that, and migrations check it against targets.
pub const GUEST_CPU_ANNOTATION: &str = "edgevirt.io/guest-cpu";

/// The cluster default when `spec.domain.cpu.model` is unset: `host-model` unless configured.
pub const DEFAULT_CPU_MODEL: &str = "host-model";
/// The cluster default value that asks for the cluster's baseline model.
pub const MIGRATABLE: &str = "migratable";

/// Vendors as `/proc/cpuinfo` and CPUID spell them.
pub const HYGON: &str = "HygonGenuine";
pub const AMD: &str = "AuthenticAMD";

/// Models the Windows-on-Hygon preset tries, in order: QEMU's model of the host's own core
/// first (closest to the hardware), then the Zen 1 EPYC models Windows knows.
pub const HYGON_WINDOWS_MODELS: &[&str] = &["Dhyana", "EPYC-IBPB", "EPYC"];

static CLUSTER_DEFAULT: OnceLock<String> = OnceLock::new();

/// Set the cluster default (`cpu_model` setting) once at start-up; later calls are ignored.
pub fn set_cluster_default(model: &str) {
    let _ = CLUSTER_DEFAULT.set(model.to_string());
}

/// The cluster default CPU model (`host-model` unless set).
pub fn cluster_default() -> &'static str {
    CLUSTER_DEFAULT
        .get()
        .map(String::as_str)
        .unwrap_or(DEFAULT_CPU_MODEL)
}

/// The feature policies libvirt and KubeVirt know.
pub const FEATURE_POLICIES: &[&str] = &["force", "require", "optional", "disable", "forbid"];

/// Check the cluster default setting's value.
pub fn check_default(model: &str) -> Result<(), Invalid> {
    check_cpu_name("cpu_model", model)
}

/// Check `spec.domain.cpu` before anything is stored.
pub fn validate(cpu: Option<&Cpu>) -> Result<(), Invalid> {
    let Some(c) = cpu else { return Ok(()) };
    if let Some(m) = &c.model {
        check_cpu_name("spec.domain.cpu.model", m)?;
        if m == MIGRATABLE {
            return Err(Invalid(
                "spec.domain.cpu.model: \"migratable\" is a cluster default (cpu_model setting), \
                 not a model; leave the model unset to use it"
                    .into(),
            ));
        }
    }
    for f in &c.features {
        check_cpu_name("spec.domain.cpu.features[].name", &f.name)?;
        if let Some(p) = &f.policy
            && !FEATURE_POLICIES.contains(&p.as_str())
        {
            return Err(Invalid(format!(
                "spec.domain.cpu.features[{}].policy {p:?} is not one of {}",
                f.name,
                FEATURE_POLICIES.join(", ")
            )));
        }
    }
    Ok(())
}

/// The guest operating system, as far as the CPU policy cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GuestOs {
    Windows,
    Other,
}

impl GuestOs {
    /// Detect Windows from the labels and annotations KubeVirt's ecosystem sets: the
    /// `vm.kubevirt.io/os` annotation of the common templates (`windows2k22`, ...), the
    /// `os.template.kubevirt.io/<os>` labels, and the preference name labels
    /// (`kubevirt.io/preference-name`, `instancetype.kubevirt.io/preference`) with the
    /// common-instancetypes names (`windows.11`, `windows.2k22`, ...).
    pub fn detect(
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> GuestOs {
        let win = |v: &str| v.to_ascii_lowercase().starts_with("win");
        let by_annotation = annotations.get("vm.kubevirt.io/os").is_some_and(|v| win(v));
        let by_template = labels.iter().any(|(k, v)| {
            k.strip_prefix("os.template.kubevirt.io/")
                .is_some_and(|os| win(os) && v == "true")
        });
        let by_preference = [
            "kubevirt.io/preference-name",
            "kubevirt.io/cluster-preference-name",
            "instancetype.kubevirt.io/preference",
            "instancetype.kubevirt.io/cluster-preference",
        ]
        .iter()
        .any(|k| {
            labels.get(*k).is_some_and(|v| win(v)) || annotations.get(*k).is_some_and(|v| win(v))
        });
        if by_annotation || by_template || by_preference {
            GuestOs::Windows
        } else {
            GuestOs::Other
        }
    }
}

/// Resolve the guest CPU for a VMI on a node.
///
/// - `cpu`: the VMI's `spec.domain.cpu`;
/// - `os`: from its labels and annotations ([`GuestOs::detect`]);
/// - `default`: the cluster default, already resolved to a model (`host-model`,
///   `host-passthrough` or a named model; the caller turns `migratable` into the baseline);
/// - `host`: the node's facts (for `virt_type`, the domain type the node runs guests with).
pub fn resolve(
    cpu: Option<&Cpu>,
    os: GuestOs,
    default: &str,
    host: &CpuFacts,
    virt_type: &str,
) -> Result<GuestCpu, Invalid> {
    validate(cpu)?;
    let (asked, from) = match cpu.and_then(|c| c.model.as_deref()) {
        Some(m) => (m.to_string(), "spec.domain.cpu.model"),
        None => (default.to_string(), "the cluster default (cpu_model)"),
    };
    check_cpu_name("CPU model", &asked)?;
    let features: Vec<CpuFeaturePolicy> = cpu
        .map(|c| {
            c.features
                .iter()
                .map(|f| CpuFeaturePolicy {
                    policy: f.policy.clone().unwrap_or_else(|| "require".into()),
                    name: f.name.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    let tcg = virt_type == "qemu";
    let windows = os == GuestOs::Windows;
    let mut g = GuestCpu {
        mode: Mode::HostModel,
        model: None,
        fallback: None,
        vendor_id: None,
        check: None,
        features,
        hyperv: windows,
        virt_type: virt_type.to_string(),
        reason: String::new(),
    };
    let host_mode = asked == "host-model" || asked == "host-passthrough";
    if windows && host.vendor == HYGON && host_mode {
        // Windows does not know the HygonGenuine vendor: give it a named model with the AMD
        // vendor string instead of the host's CPU.
        let usable = HYGON_WINDOWS_MODELS
            .iter()
            .find(|m| host.usable_models.iter().any(|u| u == *m));
        let model = usable.copied().unwrap_or(HYGON_WINDOWS_MODELS[0]);
        g.mode = Mode::Custom;
        g.model = Some(model.to_string());
        g.vendor_id = Some(AMD.to_string());
        let (fallback, check) = custom_checks(usable.is_some(), tcg);
        g.fallback = Some(fallback.into());
        g.check = Some(check.into());
        g.reason = format!(
            "Windows guest on a Hygon host: {asked} (from {from}) would show the HygonGenuine \
             vendor, which Windows does not know; named model {model}{} with \
             vendor_id='AuthenticAMD' instead, plus Hyper-V enlightenments",
            if usable.is_some() {
                " (usable on this host)"
            } else {
                " (not listed usable here; QEMU runs what it can emulate)"
            }
        );
        return Ok(g);
    }
    match asked.as_str() {
        "host-model" => {
            g.mode = Mode::HostModel;
            g.check = Some("partial".into());
            g.reason = format!(
                "host-model from {from}: libvirt's closest named model of this host plus its \
                 extra features ({}), migratable to hosts that can run that model",
                host.host_model
                    .as_ref()
                    .map(|m| format!("{} {}", m.vendor, m.model))
                    .unwrap_or_else(|| "unknown here".into())
            );
        }
        "host-passthrough" if !tcg || host.host_passthrough => {
            g.mode = Mode::HostPassthrough;
            g.check = Some("none".into());
            g.reason = format!(
                "host-passthrough from {from}: the host CPU as it is; migratable only to an \
                 identical CPU"
            );
        }
        "host-passthrough" => {
            g.mode = Mode::Maximum;
            g.reason = format!(
                "host-passthrough from {from}, under TCG where libvirt does not support it: \
                 mode maximum instead, every CPU feature QEMU can emulate"
            );
        }
        named => {
            let usable = host.usable_models.iter().any(|u| u == named);
            let (fallback, check) = custom_checks(usable, tcg);
            g.mode = Mode::Custom;
            g.model = Some(named.to_string());
            g.fallback = Some(fallback.into());
            g.check = Some(check.into());
            g.reason = format!(
                "named model {named} from {from}{}",
                match (usable, tcg) {
                    (true, _) => " (usable on this host)",
                    (false, true) =>
                        " (not usable under TCG here: features QEMU cannot emulate are dropped)",
                    (false, false) => " (not usable on this host: libvirt will refuse to start it)",
                }
            );
        }
    }
    if windows {
        g.reason.push_str("; Windows guest: Hyper-V enlightenments");
    }
    Ok(g)
}

/// `fallback` and `check` for a named model: strict where the host can run the model, and
/// under TCG lenient for models it lists as not usable (QEMU then leaves out what it cannot
/// emulate, and libvirt's pre-start check would refuse the model outright).
fn custom_checks(usable: bool, tcg: bool) -> (&'static str, &'static str) {
    match (usable, tcg) {
        (false, true) => ("allow", "none"),
        _ => ("forbid", "partial"),
    }
}

/// The cluster default as a model for one VMI: `migratable` becomes the baseline model of the
/// cluster's nodes (`host-model` if they share none).
pub fn effective_default(default: &str, nodes: &[&CpuFacts]) -> String {
    if default != MIGRATABLE {
        return default.to_string();
    }
    super::compat::baseline_model(nodes).unwrap_or_else(|| DEFAULT_CPU_MODEL.to_string())
}

/// The guest CPU for a VMI object on a node: the one the scheduler recorded in
/// [`GUEST_CPU_ANNOTATION`] when it is there and for the same domain type, else resolved
/// here with the cluster default.
pub fn for_vmi(
    vmi: &VirtualMachineInstance,
    host: &CpuFacts,
    virt_type: &str,
) -> Result<GuestCpu, Invalid> {
    if let Some(g) = vmi
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(GUEST_CPU_ANNOTATION))
        .and_then(|s| serde_json::from_str::<GuestCpu>(s).ok())
        && g.virt_type == virt_type
    {
        return Ok(g);
    }
    let empty = BTreeMap::new();
    let default = effective_default(cluster_default(), &[host]);
    resolve(
        vmi.spec.domain.cpu.as_ref(),
        GuestOs::detect(
            vmi.metadata.labels.as_ref().unwrap_or(&empty),
            vmi.metadata.annotations.as_ref().unwrap_or(&empty),
        ),
        &default,
        host,
        virt_type,
    )
}

/// A Node's CPU facts, with the domain type it runs guests with (`kvm` when it reports none).
pub fn facts_of(node: &Node) -> CpuFacts {
    let st = node.status.clone().unwrap_or_default();
    let mut f = st.cpu;
    if f.virt_type.is_empty() {
        f.virt_type = if st.accelerator.is_empty() {
            "kvm".to_string()
        } else {
            st.accelerator
        };
    }
    f
}

/// The cluster default for scheduling, over the candidate nodes (`migratable` → their baseline).
pub fn scheduling_default(nodes: &[&Node]) -> String {
    let facts: Vec<CpuFacts> = nodes.iter().map(|n| facts_of(n)).collect();
    let refs: Vec<&CpuFacts> = facts.iter().collect();
    effective_default(cluster_default(), &refs)
}

/// The guest CPU a VMI would get on a node, if that node can run it; the error says why not,
/// naming the missing features.
pub fn place_on(
    vmi: &VirtualMachineInstance,
    node: &Node,
    default: &str,
) -> Result<GuestCpu, String> {
    let empty = BTreeMap::new();
    place_spec(
        vmi.spec.domain.cpu.as_ref(),
        vmi.metadata.labels.as_ref().unwrap_or(&empty),
        vmi.metadata.annotations.as_ref().unwrap_or(&empty),
        node,
        default,
    )
}

/// [`place_on`] from the parts of an instance that matter: its `domain.cpu` and the labels
/// and annotations that tell its operating system (a VM's template has them too).
pub fn place_spec(
    cpu: Option<&Cpu>,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    node: &Node,
    default: &str,
) -> Result<GuestCpu, String> {
    let facts = facts_of(node);
    let g = resolve(
        cpu,
        GuestOs::detect(labels, annotations),
        default,
        &facts,
        &facts.virt_type.clone(),
    )
    .map_err(|e| e.0)?;
    super::compat::check_node(&g, &facts).map_err(|e| e.to_string())?;
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::facts::tests::fixture_facts;

    fn cpu(model: Option<&str>) -> Cpu {
        Cpu {
            model: model.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn windows_detection() {
        let mut a = BTreeMap::new();
        let l = BTreeMap::new();
        assert_eq!(GuestOs::detect(&l, &a), GuestOs::Other);
        a.insert("vm.kubevirt.io/os".to_string(), "windows2k22".to_string());
        assert_eq!(GuestOs::detect(&l, &a), GuestOs::Windows);
        a.insert("vm.kubevirt.io/os".to_string(), "rhel9".to_string());
        assert_eq!(GuestOs::detect(&l, &a), GuestOs::Other);
        let mut l = BTreeMap::new();
        l.insert(
            "kubevirt.io/preference-name".to_string(),
            "windows.2k22".to_string(),
        );
        assert_eq!(GuestOs::detect(&l, &a), GuestOs::Windows);
        let mut l = BTreeMap::new();
        l.insert(
            "os.template.kubevirt.io/win10".to_string(),
            "true".to_string(),
        );
        assert_eq!(GuestOs::detect(&l, &a), GuestOs::Windows);
    }

    #[test]
    fn windows_on_hygon_gets_a_named_amd_model() {
        let hygon = fixture_facts("hygon-c86-7285", "kvm");
        let g = resolve(None, GuestOs::Windows, "host-model", &hygon, "kvm").unwrap();
        assert_eq!(g.mode, Mode::Custom);
        assert_eq!(g.model.as_deref(), Some("Dhyana"));
        assert_eq!(g.vendor_id.as_deref(), Some("AuthenticAMD"));
        assert_eq!(
            (g.fallback.as_deref(), g.check.as_deref()),
            (Some("forbid"), Some("partial"))
        );
        assert!(g.hyperv && g.reason.contains("HygonGenuine"));
        // host-passthrough would show the Hygon vendor too.
        let g = resolve(
            Some(&cpu(Some("host-passthrough"))),
            GuestOs::Windows,
            "host-model",
            &hygon,
            "kvm",
        )
        .unwrap();
        assert_eq!(g.vendor_id.as_deref(), Some("AuthenticAMD"));
        // A host without Dhyana usable falls to EPYC-IBPB.
        let mut old = hygon.clone();
        old.usable_models.retain(|m| m != "Dhyana");
        let g = resolve(None, GuestOs::Windows, "host-model", &old, "kvm").unwrap();
        assert_eq!(g.model.as_deref(), Some("EPYC-IBPB"));
        // Linux on Hygon keeps host-model; Windows elsewhere keeps it too, with Hyper-V.
        let g = resolve(None, GuestOs::Other, "host-model", &hygon, "kvm").unwrap();
        assert_eq!(
            (g.mode, g.vendor_id.as_deref(), g.hyperv),
            (Mode::HostModel, None, false)
        );
        let intel = fixture_facts("intel-xeon-e5-2660v3", "kvm");
        let g = resolve(None, GuestOs::Windows, "host-model", &intel, "kvm").unwrap();
        assert_eq!(
            (g.mode, g.vendor_id.as_deref(), g.hyperv),
            (Mode::HostModel, None, true)
        );
        // An explicit named model is respected.
        let g = resolve(
            Some(&cpu(Some("EPYC"))),
            GuestOs::Windows,
            "host-model",
            &hygon,
            "kvm",
        )
        .unwrap();
        assert_eq!(
            (g.model.as_deref(), g.vendor_id.as_deref()),
            (Some("EPYC"), None)
        );
    }

    #[test]
    fn tcg_mapping() {
        let t = fixture_facts("this-machine", "qemu");
        let g = resolve(
            Some(&cpu(Some("host-passthrough"))),
            GuestOs::Other,
            "host-model",
            &t,
            "qemu",
        )
        .unwrap();
        assert_eq!(g.mode, Mode::Maximum);
        let g = resolve(
            Some(&cpu(Some("Dhyana"))),
            GuestOs::Other,
            "host-model",
            &t,
            "qemu",
        )
        .unwrap();
        assert_eq!(
            (g.mode, g.check.as_deref(), g.fallback.as_deref()),
            (Mode::Custom, Some("none"), Some("allow"))
        );
        let g = resolve(
            Some(&cpu(Some("Westmere"))),
            GuestOs::Other,
            "host-model",
            &t,
            "qemu",
        )
        .unwrap();
        assert_eq!(g.check.as_deref(), Some("partial"));
        let g = resolve(None, GuestOs::Other, "host-model", &t, "qemu").unwrap();
        assert_eq!(g.mode, Mode::HostModel);
    }

    #[test]
    fn bad_input_is_refused() {
        let mut c = cpu(Some("EPYC'/><evil"));
        assert!(validate(Some(&c)).unwrap_err().0.contains("not a valid"));
        c.model = Some("EPYC".into());
        c.features.push(crate::types::kubevirt::CpuFeature {
            name: "avx2".into(),
            policy: Some("maybe".into()),
        });
        assert!(validate(Some(&c)).unwrap_err().0.contains("force, require"));
        assert!(validate(Some(&cpu(Some("migratable")))).is_err());
    }
}
