//! Choosing the accelerator. `--accel auto` used to pick KVM whenever `/dev/kvm` opened; in
//! some nested set-ups (these test machines among them) KVM runs a BIOS but hangs a Linux
//! kernel before its first line, so every guest hung. Now `auto` boots a probe guest under
//! KVM first: this host's kernel with nothing else, its console to a file
//! ([`crate::virt::probe`]). If it prints its first line in time KVM is used, otherwise
//! qemu (TCG), and the node's `acceleratorReason` says why either way.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::hypervisor::Hypervisor;
use crate::virt::probe::{FIRST_LINE, probe_xml};

/// How long KVM gets to print a kernel's first line (it takes milliseconds where it works).
const KVM_PROBE_TIME: Duration = Duration::from_secs(5);

/// The accelerator chosen, and why (shown on the node).
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub accel: String,
    pub reason: String,
}

/// The kernel the probe boots: `EDGEVIRT_ACCEL_PROBE_KERNEL`, else the newest
/// `/boot/vmlinuz-*` (Debian always has one).
pub fn probe_kernel() -> Option<PathBuf> {
    if let Some(k) = std::env::var_os("EDGEVIRT_ACCEL_PROBE_KERNEL") {
        return Some(k.into());
    }
    let mut ks: Vec<PathBuf> = std::fs::read_dir("/boot")
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("vmlinuz-"))
        .map(|e| e.path())
        .collect();
    ks.sort();
    ks.pop()
}

/// Pick the accelerator for `wanted` (`auto`, `kvm`, `qemu`). `dir` holds the probe's
/// console file while it runs.
pub async fn choose(
    wanted: &str,
    domain_types: &[String],
    hv: Arc<dyn Hypervisor>,
    dir: &Path,
) -> anyhow::Result<Choice> {
    let kvm_dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm");
    let kvm_offered = domain_types.iter().any(|t| t == "kvm");
    let why_not = match (&kvm_dev, kvm_offered) {
        (Err(e), _) => Some(format!("/dev/kvm is not usable ({e})")),
        (Ok(_), false) => Some("libvirt offers no kvm domains".to_string()),
        _ => None,
    };
    let choice = |accel: &str, reason: String| Choice {
        accel: accel.into(),
        reason,
    };
    match (wanted, why_not) {
        ("qemu", _) => Ok(choice("qemu", "asked for (--accel qemu)".into())),
        ("kvm", Some(why)) => anyhow::bail!("--accel kvm was asked but {why}"),
        ("kvm", None) => Ok(choice("kvm", "asked for (--accel kvm)".into())),
        ("auto", Some(why)) => Ok(choice("qemu", format!("{why}: using qemu (TCG)"))),
        ("auto", None) => {
            let Some(kernel) = probe_kernel() else {
                return Ok(choice(
                    "kvm",
                    "/dev/kvm opens; no kernel in /boot to try it with".into(),
                ));
            };
            Ok(match probe(hv, "kvm", &kernel, dir, KVM_PROBE_TIME).await {
                Ok(t) => choice(
                    "kvm",
                    format!(
                        "a probe guest booted under KVM ({} printed its first line in {} ms)",
                        kernel.display(),
                        t.as_millis()
                    ),
                ),
                Err(why) => choice(
                    "qemu",
                    format!(
                        "/dev/kvm opens but KVM cannot run a Linux guest here (probe kernel \
                         {}: {why}): using qemu (TCG), which is slower",
                        kernel.display()
                    ),
                ),
            })
        }
        (other, _) => anyhow::bail!("unknown accelerator {other:?}: use auto, kvm or qemu"),
    }
}

/// Boot `kernel` under `virt_type` and wait up to `within` for its first line: how long that
/// took, or why it did not come. The probe domain is gone afterwards either way.
pub async fn probe(
    hv: Arc<dyn Hypervisor>,
    virt_type: &str,
    kernel: &Path,
    dir: &Path,
    within: Duration,
) -> Result<Duration, String> {
    let tag = hex::encode(rand::random::<[u8; 4]>());
    let name = format!("edgevirt-accel-probe-{tag}");
    let log = dir.join(format!("accel-probe-{tag}.log"));
    let xml = probe_xml(
        virt_type,
        &name,
        &kernel.to_string_lossy(),
        &log.to_string_lossy(),
    );
    let started = Instant::now();
    let created = {
        let hv = hv.clone();
        tokio::task::spawn_blocking(move || hv.create(&xml))
            .await
            .map_err(|e| e.to_string())?
    };
    let outcome = match created {
        Err(e) => Err(format!("libvirt could not start the probe guest: {e}")),
        Ok(()) => loop {
            let text = std::fs::read(&log).unwrap_or_default();
            if String::from_utf8_lossy(&text).contains(FIRST_LINE) {
                break Ok(started.elapsed());
            }
            if started.elapsed() > within {
                break Err(format!(
                    "{} printed nothing within {} s",
                    kernel.display(),
                    within.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        },
    };
    let n2 = name.clone();
    let _ = tokio::task::spawn_blocking(move || hv.destroy(&n2)).await;
    let _ = std::fs::remove_file(&log);
    tracing::debug!(%name, virt_type, kernel = %kernel.display(), ?outcome, "accelerator probe");
    outcome
}
