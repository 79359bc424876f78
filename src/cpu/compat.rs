//! Can a node run a guest CPU? The pure check the scheduler and the migration path call
//! ([`check_node`], [`check_target`]), the libvirt-backed one run on a target host
//! ([`check_target_libvirt`]), and the cluster baseline ([`baseline_model`]). Refusals name the
//! missing features.

use std::collections::BTreeSet;
use std::fmt;

use super::model::{GuestCpu, Mode, check_cpu_name};
use crate::hypervisor::{CpuCompare, Hypervisor};
use crate::types::edgevirt::CpuFacts;

/// Why a node cannot run a guest CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incompatible {
    /// What does not match, e.g. `target host lacks CPU features the guest uses`.
    pub reason: String,
    /// The missing features (or model) by name, sorted; empty when the mismatch is not about
    /// features (vendor, family, domain type).
    pub missing: Vec<String>,
}

impl fmt::Display for Incompatible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.missing.is_empty() {
            write!(f, "{}", self.reason)
        } else {
            write!(f, "{}: {}", self.reason, self.missing.join(", "))
        }
    }
}

impl std::error::Error for Incompatible {}

fn refuse(reason: impl Into<String>, missing: Vec<String>) -> Result<(), Incompatible> {
    Err(Incompatible {
        reason: reason.into(),
        missing,
    })
}

/// A feature name in one spelling for libvirt's and the kernel's names: lower case without
/// `_`, `-` and `.` (`sse4.2` and `sse4_2`, `sha-ni` and `sha_ni`), and the few names that
/// differ entirely mapped onto the kernel's.
fn norm(name: &str) -> String {
    let n: String = name
        .chars()
        .filter(|c| !"_-.".contains(*c))
        .collect::<String>()
        .to_ascii_lowercase();
    match n.as_str() {
        "pclmuldq" => "pclmulqdq".into(),
        "tscdeadline" => "tscdeadlinetimer".into(),
        "invtsc" => "nonstoptsc".into(),
        "osxsave" => "xsave".into(),
        "amdssbd" | "virtssbd" => "ssbd".into(),
        "amdstibp" => "stibp".into(),
        _ => n,
    }
}

/// Every feature name a host is known to have: its kernel flags and libvirt's host-model
/// features (required or forced).
fn host_features(h: &CpuFacts) -> BTreeSet<String> {
    let mut s: BTreeSet<String> = h.flags.iter().map(|f| norm(f)).collect();
    if let Some(m) = &h.host_model {
        s.extend(
            m.features
                .iter()
                .filter(|f| f.policy == "require" || f.policy == "force")
                .map(|f| norm(&f.name)),
        );
    }
    s
}

/// The guest's own feature requests against a node: `require`d ones present, `forbid`den ones
/// absent (libvirt's rules for those policies).
fn check_requested(guest: &GuestCpu, node: &CpuFacts, who: &str) -> Result<(), Incompatible> {
    let have = host_features(node);
    let missing: Vec<String> = guest
        .features_with(&["require"])
        .filter(|f| !have.contains(&norm(f)))
        .map(str::to_string)
        .collect();
    if !missing.is_empty() {
        return refuse(
            format!("{who} lacks CPU features the VM requires (spec.domain.cpu.features)"),
            missing,
        );
    }
    let present: Vec<String> = guest
        .features_with(&["forbid"])
        .filter(|f| have.contains(&norm(f)))
        .map(str::to_string)
        .collect();
    if !present.is_empty() {
        return refuse(
            format!("{who} has CPU features the VM forbids (spec.domain.cpu.features)"),
            present,
        );
    }
    Ok(())
}

fn check_model_usable(
    model: &str,
    guest: &GuestCpu,
    node: &CpuFacts,
    who: &str,
) -> Result<(), Incompatible> {
    // Under TCG a model the host does not list is still started with check='none'.
    if node.usable_models.iter().any(|m| m == model)
        || (node.virt_type == "qemu" && guest.check.as_deref() == Some("none"))
    {
        return Ok(());
    }
    refuse(
        format!(
            "{who} cannot run the VM's CPU model (not usable in its libvirt domain capabilities)"
        ),
        vec![model.to_string()],
    )
}

/// Can `node` start a guest with this CPU (resolved for that node)? Used by the scheduler.
pub fn check_node(guest: &GuestCpu, node: &CpuFacts) -> Result<(), Incompatible> {
    if !node.virt_type.is_empty()
        && !guest.virt_type.is_empty()
        && node.virt_type != guest.virt_type
    {
        return refuse(
            format!(
                "the node runs guests under {}, the VM's CPU was chosen for {}",
                node.virt_type, guest.virt_type
            ),
            vec![],
        );
    }
    if guest.mode == Mode::Custom
        && let Some(m) = &guest.model
    {
        check_model_usable(m, guest, node, "the node")?;
    }
    check_requested(guest, node, "the node")
}

/// Can a guest that runs on `source` with CPU `guest` move to `target`?
///
/// - host-passthrough: same vendor, family and model number, and the target has every flag of
///   the source;
/// - host-model: the guest's CPU is the source's host-model, so the target must list that model
///   usable and have every feature the source's host-model requires;
/// - a named model: the target lists it usable;
/// - maximum (TCG): the target runs TCG guests too;
///
/// and in every mode the VM's own `require`/`forbid` features hold on the target. The refusal
/// names what is missing.
pub fn check_target(
    guest: &GuestCpu,
    source: &CpuFacts,
    target: &CpuFacts,
) -> Result<(), Incompatible> {
    if !target.virt_type.is_empty()
        && !guest.virt_type.is_empty()
        && target.virt_type != guest.virt_type
    {
        return refuse(
            format!(
                "the guest runs under {} but the target host runs guests under {}",
                guest.virt_type, target.virt_type
            ),
            vec![],
        );
    }
    match guest.mode {
        Mode::HostPassthrough => {
            if source.vendor != target.vendor
                || source.family != target.family
                || source.model_number != target.model_number
            {
                return refuse(
                    format!(
                        "host-passthrough needs the same CPU: the guest sees {} family {} model {} \
                         but the target is {} family {} model {}",
                        source.vendor,
                        source.family,
                        source.model_number,
                        target.vendor,
                        target.family,
                        target.model_number
                    ),
                    vec![],
                );
            }
            let have = host_features(target);
            let missing: Vec<String> = source
                .flags
                .iter()
                .filter(|f| !have.contains(&norm(f)))
                .cloned()
                .collect();
            if !missing.is_empty() {
                return refuse("the target host lacks CPU features the guest sees", missing);
            }
        }
        Mode::HostModel => {
            let Some(hm) = &source.host_model else {
                return refuse(
                    "the source host reported no host-model CPU to compare with",
                    vec![],
                );
            };
            // A target whose own host-model is the same base model runs it, whether or not
            // its domain capabilities list that model as usable on its own (TCG does not).
            if target.host_model.as_ref().map(|t| &t.model) != Some(&hm.model) {
                check_model_usable(&hm.model, guest, target, "the target host")?;
            }
            let have = host_features(target);
            let missing: Vec<String> = hm
                .features
                .iter()
                .filter(|f| f.policy == "require" || f.policy == "force")
                .filter(|f| !have.contains(&norm(&f.name)))
                .map(|f| f.name.clone())
                .collect();
            if !missing.is_empty() {
                return refuse(
                    format!(
                        "the target host lacks CPU features of the guest's host-model CPU ({} + features)",
                        hm.model
                    ),
                    missing,
                );
            }
        }
        Mode::Custom => {
            if let Some(m) = &guest.model {
                check_model_usable(m, guest, target, "the target host")?;
            }
        }
        Mode::Maximum => {
            if target.virt_type != "qemu" {
                return refuse(
                    "mode maximum (TCG) can only move to another TCG host",
                    vec![],
                );
            }
        }
    }
    check_requested(guest, target, "the target host")
}

/// libvirt's verdict on the target host: compare the guest's `<cpu>` XML (from the running
/// domain's XML, see [`cpu_element`]) with what the target's hypervisor can provide for
/// `virt_type`. Blocks; call it on the target host, before migrating.
pub fn check_target_libvirt(
    target: &dyn Hypervisor,
    virt_type: &str,
    guest_cpu_xml: &str,
) -> Result<(), Incompatible> {
    match target.compare_cpu(virt_type, guest_cpu_xml) {
        Ok(CpuCompare::Identical | CpuCompare::Superset) => Ok(()),
        Ok(CpuCompare::Incompatible(msg)) => Err(Incompatible {
            missing: features_in_message(&msg),
            reason: format!("libvirt on the target host: {msg}"),
        }),
        Err(e) => Err(Incompatible {
            reason: format!("comparing the guest CPU on the target host failed: {e}"),
            missing: vec![],
        }),
    }
}

/// The whole pre-migration CPU check, for the migration path: the pure check on the Node
/// objects' facts, then (when the guest has a comparable CPU) libvirt's verdict on the target
/// host for the `<cpu>` of the running domain's XML on the source. Blocks (one libvirt call
/// on `target`). host-passthrough and maximum guests have no CPU definition libvirt can
/// compare, so the pure check decides for them.
pub fn check_migration(
    guest: &GuestCpu,
    source: &CpuFacts,
    target: &CpuFacts,
    source_domain_xml: &str,
    target_hv: &dyn Hypervisor,
) -> Result<(), Incompatible> {
    check_target(guest, source, target)?;
    if matches!(guest.mode, Mode::HostPassthrough | Mode::Maximum) {
        return Ok(());
    }
    let cpu = cpu_element(source_domain_xml)
        .filter(|c| c.contains("<model"))
        .or_else(|| guest_cpu_xml(guest, source));
    match cpu {
        Some(xml) => check_target_libvirt(target_hv, &guest.virt_type, &xml),
        None => Ok(()),
    }
}

/// The feature names in a libvirt incompatibility message ("... required features: a, b").
pub fn features_in_message(msg: &str) -> Vec<String> {
    let Some((_, list)) = msg.rsplit_once("features:") else {
        return vec![];
    };
    let mut v: Vec<String> = list
        .split(',')
        .map(|s| s.trim().trim_end_matches('.').to_string())
        .filter(|s| !s.is_empty() && check_cpu_name("", s).is_ok())
        .collect();
    v.sort();
    v
}

/// The `<cpu>...</cpu>` element of a domain XML (a running domain's XML has host-model
/// expanded into a model and features, which is what a target must provide).
pub fn cpu_element(domain_xml: &str) -> Option<String> {
    let start = domain_xml.find("<cpu")?;
    let rest = &domain_xml[start..];
    let open_end = rest.find('>')?;
    if rest[..open_end].ends_with('/') {
        return Some(rest[..=open_end].to_string());
    }
    let end = rest.find("</cpu>")? + "</cpu>".len();
    Some(rest[..end].to_string())
}

/// The guest CPU as a `<cpu>` element libvirt's comparison and baseline APIs take, for
/// guests whose domain XML is not at hand: the named model, or the source's host-model.
pub fn guest_cpu_xml(guest: &GuestCpu, source: &CpuFacts) -> Option<String> {
    let esc = |s: &str| quick_xml::escape::escape(s).into_owned();
    let (model, vendor, mut feats) = match guest.mode {
        Mode::Custom => (guest.model.clone()?, None, vec![]),
        _ => {
            let hm = source.host_model.as_ref()?;
            (
                hm.model.clone(),
                Some(hm.vendor.clone()).filter(|v| !v.is_empty()),
                hm.features.clone(),
            )
        }
    };
    feats.extend(guest.features.iter().cloned());
    let mut x = format!(
        "<cpu mode='custom' match='exact'>\n  <model fallback='forbid'>{}</model>\n",
        esc(&model)
    );
    if let Some(v) = vendor {
        x.push_str(&format!("  <vendor>{}</vendor>\n", esc(&v)));
    }
    for f in feats {
        x.push_str(&format!(
            "  <feature policy='{}' name='{}'/>\n",
            esc(&f.policy),
            esc(&f.name)
        ));
    }
    x.push_str("</cpu>\n");
    Some(x)
}

/// Named x86 models from newest to oldest within each vendor line, so the baseline picks the
/// most capable model every node can run.
const MODEL_RANK: &[&str] = &[
    "EPYC-Genoa",
    "EPYC-Milan",
    "EPYC-Rome",
    "EPYC-IBPB",
    "EPYC",
    "Dhyana",
    "SapphireRapids",
    "Icelake-Server",
    "Icelake-Server-noTSX",
    "Cooperlake",
    "Cascadelake-Server",
    "Cascadelake-Server-noTSX",
    "Skylake-Server-IBRS",
    "Skylake-Server-noTSX-IBRS",
    "Skylake-Server",
    "Skylake-Client-IBRS",
    "Skylake-Client-noTSX-IBRS",
    "Skylake-Client",
    "Broadwell-IBRS",
    "Broadwell-noTSX-IBRS",
    "Broadwell",
    "Broadwell-noTSX",
    "Haswell-IBRS",
    "Haswell-noTSX-IBRS",
    "Haswell",
    "Haswell-noTSX",
    "IvyBridge-IBRS",
    "IvyBridge",
    "SandyBridge-IBRS",
    "SandyBridge",
    "Westmere-IBRS",
    "Westmere",
    "Nehalem-IBRS",
    "Nehalem",
    "Opteron_G5",
    "Opteron_G4",
    "Opteron_G3",
    "Opteron_G2",
    "Penryn",
    "Opteron_G1",
    "Conroe",
    "qemu64",
    "kvm64",
];

/// The most capable named model every node lists usable, or `None` when they share none.
pub fn baseline_model(nodes: &[&CpuFacts]) -> Option<String> {
    let (first, rest) = nodes.split_first()?;
    let common: Vec<&String> = first
        .usable_models
        .iter()
        .filter(|m| rest.iter().all(|n| n.usable_models.contains(m)))
        .collect();
    let rank = |m: &str| {
        MODEL_RANK
            .iter()
            .position(|r| *r == m)
            .unwrap_or(usize::MAX)
    };
    common
        .into_iter()
        .filter(|m| rank(m) != usize::MAX)
        .min_by_key(|m| rank(m))
        .cloned()
}
