//! The accelerator probe's guest: a Linux kernel booted with nothing else, its serial console
//! written to a file. `/dev/kvm` opening says little: in some nested set-ups KVM runs a BIOS
//! but a Linux kernel hangs before its first line. Whether the kernel prints under a
//! virtualisation type is what tells if that type can run guests.

use askama::Template;

#[derive(Template)]
#[template(path = "probe.xml")]
struct ProbeXml<'a> {
    virt_type: &'a str,
    name: &'a str,
    kernel: &'a str,
    serial_log: &'a str,
}

/// The probe domain: `kernel` booted under `virt_type` (`kvm`, `qemu`) as `name`, its
/// console going to `serial_log`. It destroys itself when the kernel panics (no root
/// filesystem: `panic=-1` reboots, and a reboot ends it).
pub fn probe_xml(virt_type: &str, name: &str, kernel: &str, serial_log: &str) -> String {
    ProbeXml {
        virt_type,
        name,
        kernel,
        serial_log,
    }
    .render()
    .expect("the probe template renders")
}

/// What a kernel prints first, and so what the probe waits for.
pub const FIRST_LINE: &str = "Linux version";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_boots_only_the_kernel_and_writes_its_console_to_a_file() {
        let x = probe_xml("kvm", "edgevirt-probe", "/boot/vmlinuz-6.1", "/tmp/a&b.log");
        assert!(x.starts_with("<domain type='kvm'>"), "{x}");
        assert!(x.contains("<kernel>/boot/vmlinuz-6.1</kernel>"), "{x}");
        assert!(x.contains("<source path='/tmp/a&#38;b.log'/>"), "{x}");
        assert!(!x.contains("<disk"), "{x}");
        assert!(x.contains("<on_reboot>destroy</on_reboot>"), "{x}");
    }
}
