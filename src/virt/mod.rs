//! The libvirt side of the hypervisor boundary: the [`libvirt`] implementation of
//! [`crate::hypervisor::Hypervisor`] (the only module that imports the `virt` crate), the
//! pure converter from a VMI spec to libvirt domain XML, and disk image inspection.

pub mod convert;
pub mod image;
pub mod libvirt;
pub mod probe;
