//! edgevirt's test kit, shared by the integration tests (`tests/`) and the benchmarks
//! (`benches/`) as a dev-dependency, so neither includes the other's files by path.
//!
//! - [`serve`]: one way to start `edgevirt serve` and know it is ready: the kernel picks the
//!   port (`--listen …:0`), the kit reads the bound address of the process's listening socket
//!   from `/proc` and polls `/healthz` until it answers. Nothing is read from serve's output,
//!   and it works for any release of the binary (the upgrade test starts an old one).
//! - [`Appliance`]: serve on a fresh data dir against the real libvirtd, with the test
//!   guest; removes the launchers and domains it created when dropped.
//! - [`Vm`]: the typed `kubevirt.io/v1` VirtualMachine builder every fixture comes from.
//! - [`hostile`]: the hostile-request cases of the hardening test and benchmark.
//! - [`registry`]: a real OCI registry on loopback and containerDisk images pushed to it.
//! - [`Kubectl`]: a kubectl binary with a kubeconfig for an appliance.
//! - [`FileServer`]: plain HTTP downloads from a folder, on loopback.
//! - [`prometheus`]: Debian's Prometheus scraping an appliance with the shipped config.
//! - [`tpm`]: raw TPM 2.0 NV commands for a guest's `/dev/tpm0`.
//! - host helpers: [`virsh`], [`domstate`], [`domid`], [`guest_uptime`], [`wait_for`],
//!   [`serial_echo`].

mod appliance;
mod files;
pub mod hostile;
mod kubectl;
pub mod prometheus;
pub mod registry;
pub mod serve;
pub mod tpm;
mod vm;

pub use appliance::*;
pub use files::FileServer;
pub use kubectl::{Kubectl, Out, kubeconfig, kubeconfig_yaml};
pub use registry::Registry;
pub use vm::Vm;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The `edgevirt` binary cargo built next to the running test or benchmark
/// (`target/<profile>/edgevirt`; tests and benches run from `target/<profile>/deps/`).
pub fn exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let me = std::env::current_exe().expect("the running executable");
        let exe = me
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join("edgevirt"))
            .expect("tests and benches run from target/<profile>/deps");
        assert!(
            exe.exists(),
            "no edgevirt binary at {} (cargo builds it for tests and benches of this package)",
            exe.display()
        );
        exe
    })
}

/// The repository's root.
pub fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[cfg(test)]
mod tests {
    /// The repository's copy of KubeVirt's OpenAPI document (which `src/types/schema.rs`
    /// reads) is the reference the project keeps beside the repository, when that is there
    /// (CI lays it out; a bare clone has none, and then the copy alone is used).
    #[test]
    fn the_kubevirt_schema_copy_is_the_reference() {
        let copy = super::repo_root().join("tests/fixtures/kubevirt/swagger.json");
        let reference = super::repo_root().join("../shared/kubevirt/swagger.json");
        let have = std::fs::read(&copy).unwrap_or_else(|e| panic!("{}: {e}", copy.display()));
        let Ok(want) = std::fs::read(&reference) else {
            println!(
                "no {}: the repository's copy alone is used",
                reference.display()
            );
            return;
        };
        assert!(
            have == want,
            "{} differs from {}: copy it over, update the commit in \
             tests/fixtures/kubevirt/README.md and rewrite src/types/kubevirt-fields.txt \
             (EDGEVIRT_WRITE_KUBEVIRT_FIELDS=1 cargo test --lib types::schema)",
            copy.display(),
            reference.display()
        );
    }
}
