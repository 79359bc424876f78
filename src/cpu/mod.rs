//! Host CPU facts and the guest CPU policy.
//!
//! - [`facts`]: what a host's CPU is (vendor `GenuineIntel`, `AuthenticAMD`, `HygonGenuine`,
//!   family/model/stepping, flags, from `/proc/cpuinfo`) and what libvirt can give guests on it
//!   (host-model CPU, usable named models, from domain capabilities XML).
//! - [`model`]: the guest CPU as libvirt takes it (mode, model, features).
//! - [`policy`]: the guest CPU a VMI gets on a node (KubeVirt's `spec.domain.cpu`, the cluster
//!   default, the Windows-on-Hygon preset, the TCG mapping), with the reason for each choice.
//! - [`compat`]: whether a node can run a guest CPU (scheduling, live migration), naming the
//!   missing features, and the cluster baseline model.
//!
//! Pure functions over text and values: this module reads `/proc/cpuinfo` and talks to libvirt
//! only through the [`crate::hypervisor::Hypervisor`] trait; it never imports `virt` itself. The
//! reasons behind each rule are in `docs/cpu-policy.md`.

pub mod compat;
pub mod facts;
pub mod model;
pub mod policy;

pub use compat::{
    Incompatible, baseline_model, check_migration, check_node, check_target, check_target_libvirt,
};
pub use facts::{host_cpu, node_facts, parse_cpuinfo};
pub use model::{GuestCpu, Mode};
pub use policy::GuestOs;

#[cfg(test)]
mod tests;
