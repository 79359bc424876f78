//! Container disks from a real registry (Debian's `docker-registry` on loopback, images
//! pushed with `skopeo`), pulled by edgevirt's node-side cache: through a mirror, verified by
//! digest, cached per digest, with `imagePullPolicy` and `imagePullSecret` credentials.
//! Needs no libvirt and no root: runs in the plain `cargo test`.

use std::path::Path;

use edgevirt::registry::{Cache, DockerConfig, Mirrors, PullPolicy};
use testkit::registry::Registry;

/// The name KubeVirt's examples use, served by `reg` through the mirror setting.
const CIRROS: &str = "registry:5000/kubevirt/cirros-container-disk-demo:devel";

fn mirrors_to(reg: &Registry) -> Mirrors {
    Mirrors::parse(&[
        // A mirror that is down is skipped, as containerd skips it.
        "registry:5000=http://127.0.0.1:1".to_string(),
        format!("registry:5000=http://{}", reg.host),
    ])
    .unwrap()
}

/// A small qcow2 disk whose first bytes are `marker`.
fn disk(dir: &Path, marker: &str) -> std::path::PathBuf {
    let raw = dir.join("disk.raw");
    let mut bytes = vec![0u8; 1 << 20];
    bytes[..marker.len()].copy_from_slice(marker.as_bytes());
    std::fs::write(&raw, bytes).unwrap();
    let qcow2 = dir.join("disk.qcow2");
    let st = std::process::Command::new("qemu-img")
        .args(["convert", "-q", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow2)
        .status()
        .unwrap();
    assert!(st.success());
    qcow2
}

fn tools_present() -> bool {
    ["docker-registry", "skopeo", "htpasswd"].iter().all(|t| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Files a failed pull may leave: anything but `refs/` and finished `<hex>.<format>` disks.
fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != "refs" && !(n.len() > 65 && n.as_bytes()[64] == b'.'))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_container_disk_is_pulled_through_the_mirror_and_then_served_from_the_cache() {
    if !tools_present() {
        panic!(
            "docker-registry, skopeo and htpasswd are needed: run scripts/setup-host.sh with EDGEVIRT_TEST_PACKAGES=1"
        );
    }
    let work = tempfile::tempdir().unwrap();
    let src = disk(work.path(), "CIRROS-DISK");
    let mut reg = Registry::start(None);
    let pushed = reg.push_disk(
        "kubevirt/cirros-container-disk-demo:devel",
        &src,
        "cirros.qcow2",
    );
    let cache_dir = work.path().join("cache");
    let cache = Cache::new(cache_dir.clone(), mirrors_to(&reg));
    let none = DockerConfig::default();
    let d = cache
        .pull(CIRROS, PullPolicy::IfNotPresent, &none)
        .await
        .unwrap();
    assert_eq!(d.digest, pushed.manifest);
    assert_eq!(d.format, "qcow2");
    assert_eq!(
        std::fs::read(&d.path).unwrap(),
        std::fs::read(&src).unwrap()
    );
    assert!(d.path.starts_with(&cache_dir));
    assert_eq!(leftovers(&cache_dir), Vec::<String>::new());

    // With the registry gone, IfNotPresent (and Never) use the cache; Always must ask the
    // registry and says it could not.
    reg.stop();
    for policy in [PullPolicy::IfNotPresent, PullPolicy::Never] {
        let again = cache.pull(CIRROS, policy, &none).await.unwrap();
        assert_eq!(again, d, "{policy:?}");
    }
    let by_digest = format!(
        "registry:5000/kubevirt/cirros-container-disk-demo@{}",
        pushed.manifest
    );
    assert_eq!(
        cache
            .pull(&by_digest, PullPolicy::IfNotPresent, &none)
            .await
            .unwrap()
            .path,
        d.path
    );
    let e = cache
        .pull(CIRROS, PullPolicy::Always, &none)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains(&reg.host) && e.contains("127.0.0.1:1"), "{e}");
}

#[tokio::test]
async fn a_registry_with_credentials_needs_the_pull_secret() {
    if !tools_present() {
        panic!(
            "docker-registry, skopeo and htpasswd are needed: run scripts/setup-host.sh with EDGEVIRT_TEST_PACKAGES=1"
        );
    }
    let work = tempfile::tempdir().unwrap();
    let src = disk(work.path(), "PRIVATE");
    let reg = Registry::start(Some(("site", "s3cret")));
    let pushed = reg.push_disk("kubevirt/cirros-container-disk-demo:devel", &src, "d.qcow2");
    let cache = Cache::new(work.path().join("cache"), mirrors_to(&reg));
    let e = cache
        .pull(CIRROS, PullPolicy::Always, &DockerConfig::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("{}: Not authorized", reg.host)), "{e}");
    let wrong = DockerConfig::parse(
        format!(
            r#"{{"auths": {{"{}": {{"username": "site", "password": "nope"}}}}}}"#,
            reg.host
        )
        .as_bytes(),
    )
    .unwrap();
    assert!(
        cache
            .pull(CIRROS, PullPolicy::Always, &wrong)
            .await
            .is_err()
    );
    // The secret names the registry as the manifest writes it; the mirror gets the same.
    let secret =
        DockerConfig::parse(br#"{"auths": {"registry:5000": {"auth": "c2l0ZTpzM2NyZXQ="}}}"#)
            .unwrap();
    let d = cache
        .pull(CIRROS, PullPolicy::Always, &secret)
        .await
        .unwrap();
    assert_eq!(d.digest, pushed.manifest);
    assert_eq!(
        std::fs::read(&d.path).unwrap(),
        std::fs::read(&src).unwrap()
    );
}

#[tokio::test]
async fn content_that_does_not_match_its_digest_is_refused_and_nothing_is_kept() {
    if !tools_present() {
        panic!(
            "docker-registry, skopeo and htpasswd are needed: run scripts/setup-host.sh with EDGEVIRT_TEST_PACKAGES=1"
        );
    }
    let work = tempfile::tempdir().unwrap();
    let src = disk(work.path(), "TAMPERED");
    let reg = Registry::start(None);
    let pushed = reg.push_disk("kubevirt/cirros-container-disk-demo:devel", &src, "d.qcow2");
    // Someone changed the layer on the registry's disk: same size, other bytes.
    let blob = reg.blob_file(&pushed.layer);
    let mut bytes = std::fs::read(&blob).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    let cache_dir = work.path().join("cache");
    let cache = Cache::new(cache_dir.clone(), mirrors_to(&reg));
    let none = DockerConfig::default();
    let e = cache
        .pull(CIRROS, PullPolicy::Always, &none)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("digest") && e.contains(&pushed.layer), "{e}");
    assert_eq!(leftovers(&cache_dir), Vec::<String>::new());
    assert!(
        std::fs::read_dir(cache_dir.join("refs"))
            .map(|d| d.count() == 0)
            .unwrap_or(true)
    );
    // A reference pinned to a digest the registry does not have is refused too.
    let pinned = format!(
        "registry:5000/kubevirt/cirros-container-disk-demo@sha256:{}",
        "0".repeat(64)
    );
    assert!(
        cache
            .pull(&pinned, PullPolicy::IfNotPresent, &none)
            .await
            .is_err()
    );
}

/// KubeVirt's `kernelBoot.container`: the kernel and initrd are files inside the image, at
/// the absolute paths the VM names; they are pulled once per digest and kept beside the
/// disks, and a path the image does not have is an error that leaves nothing behind.
#[tokio::test]
async fn kernel_boot_files_come_out_of_the_image() {
    assert!(
        tools_present(),
        "docker-registry, skopeo and htpasswd are needed (scripts/setup-host.sh)"
    );
    let reg = Registry::start(None);
    let work = tempfile::tempdir().unwrap();
    let (k, i) = (work.path().join("k"), work.path().join("i"));
    std::fs::write(&k, b"KERNEL BYTES").unwrap();
    std::fs::write(&i, b"INITRD BYTES").unwrap();
    let image = "registry:5000/kubevirt/alpine-ext-kernel-boot-demo:devel";
    reg.push_files(
        "kubevirt/alpine-ext-kernel-boot-demo:devel",
        &[("boot/vmlinuz-virt", &k), ("boot/initramfs-virt", &i)],
    );
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = Cache::new(cache_dir.path().to_path_buf(), mirrors_to(&reg));
    let none = DockerConfig::default();
    let files = cache
        .pull_boot(
            image,
            PullPolicy::IfNotPresent,
            &none,
            "/boot/vmlinuz-virt",
            Some("/boot/initramfs-virt"),
        )
        .await
        .unwrap();
    assert_eq!(std::fs::read(&files.kernel).unwrap(), b"KERNEL BYTES");
    assert_eq!(
        std::fs::read(files.initrd.as_ref().unwrap()).unwrap(),
        b"INITRD BYTES"
    );
    // Served from the cache with the registry gone.
    let mut reg = reg;
    reg.stop();
    let again = cache
        .pull_boot(
            image,
            PullPolicy::Never,
            &none,
            "/boot/vmlinuz-virt",
            Some("/boot/initramfs-virt"),
        )
        .await
        .unwrap();
    assert_eq!(again.kernel, files.kernel);
    let reg = Registry::start(None);
    reg.push_files("kubevirt/other:1", &[("boot/vmlinuz-virt", &k)]);
    let cache = Cache::new(cache_dir.path().to_path_buf(), mirrors_to(&reg));
    let e = cache
        .pull_boot(
            "registry:5000/kubevirt/other:1",
            PullPolicy::IfNotPresent,
            &none,
            "/boot/vmlinuz-virt",
            Some("/boot/initrd-absent"),
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("no layer holds /boot/initrd-absent"),
        "{e}"
    );
    // Only the finished boot folder of the first image remains; no half-written one.
    let boot_dirs: Vec<String> = std::fs::read_dir(cache_dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".boot"))
        .collect();
    assert_eq!(
        boot_dirs.len(),
        1,
        "the failed pull left a folder: {boot_dirs:?}"
    );
    for d in &boot_dirs {
        for e in std::fs::read_dir(cache_dir.path().join(d))
            .unwrap()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(
                !name.starts_with('.'),
                "a staging folder was left: {d}/{name}"
            );
        }
    }
}
