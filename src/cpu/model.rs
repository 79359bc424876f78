//! The guest CPU as libvirt takes it: its `<cpu mode=...>`, named model, feature policies and
//! enlightenments. [`super::policy`] decides it for a VMI on a node; [`super::compat`]
//! compares it against hosts; the converter renders it.

use serde::{Deserialize, Serialize};

use crate::types::Invalid;
use crate::types::edgevirt::CpuFeaturePolicy;

/// Check a CPU model or feature name: what libvirt names look like, nothing that could
/// change the XML around it.
pub fn check_cpu_name(what: &str, name: &str) -> Result<(), Invalid> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Invalid(format!(
            "{what} {name:?} is not a valid libvirt CPU name (letters, digits, '-', '_', '.'; at most 64)"
        )))
    }
}

/// libvirt's `<cpu mode=...>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    HostModel,
    HostPassthrough,
    /// TCG's counterpart of host-passthrough: every feature QEMU can emulate.
    Maximum,
    /// A named model.
    Custom,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::HostModel => "host-model",
            Mode::HostPassthrough => "host-passthrough",
            Mode::Maximum => "maximum",
            Mode::Custom => "custom",
        }
    }
}

/// The CPU a guest gets on one node: everything the converter renders, and what the
/// compatibility check compares against other nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestCpu {
    pub mode: Mode,
    /// The named model (custom mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `<model fallback=...>`: `forbid` or `allow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// `<model vendor_id=...>`: the vendor string the guest sees instead of the model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor_id: Option<String>,
    /// `<cpu check=...>`: `none`, `partial` or `full`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<CpuFeaturePolicy>,
    /// Hyper-V enlightenments and the Hyper-V clock, for Windows guests.
    #[serde(default)]
    pub hyperv: bool,
    /// The domain type this was resolved for (`kvm` or `qemu`).
    #[serde(default)]
    pub virt_type: String,
    /// Why this CPU, in a sentence or two.
    #[serde(default)]
    pub reason: String,
}

impl GuestCpu {
    /// Features with a given policy.
    pub fn features_with(&self, policies: &[&str]) -> impl Iterator<Item = &str> {
        self.features
            .iter()
            .filter(move |f| policies.contains(&f.policy.as_str()))
            .map(|f| f.name.as_str())
    }
}
