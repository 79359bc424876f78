use std::collections::BTreeSet;
use std::time::Duration;

use super::*;

#[test]
fn plain_names_are_imported_images_and_the_rest_registry_references() {
    assert_eq!(Source::of("debian"), Source::Imported("debian".into()));
    for r in [
        "quay.io/kubevirt/cirros-container-disk-demo:devel",
        "registry:5000/kubevirt/alpine-container-disk-demo:devel",
        "library/debian",
        "debian:12",
        "localhost/x@sha256:0000000000000000000000000000000000000000000000000000000000000000",
    ] {
        assert_eq!(Source::of(r), Source::Registry(r.into()), "{r}");
        assert_eq!(check_reference(r), Ok(()), "{r}");
    }
    let e = check_reference("quay.io/UPPER/x:tag").unwrap_err();
    assert!(e.contains("not a valid image reference"), "{e}");
    for path in ["/etc/shadow", "./disk.qcow2", "../x", "quay.io/../../etc"] {
        let e = check_reference(path).unwrap_err();
        assert!(e.contains("never to paths"), "{path}: {e}");
    }
}

#[test]
fn pull_policy_defaults_as_kubevirt() {
    let p = |w: Option<&str>, i: &str| PullPolicy::resolve(w, i).unwrap();
    assert_eq!(p(None, "quay.io/a/b"), PullPolicy::Always);
    assert_eq!(p(None, "quay.io/a/b:latest"), PullPolicy::Always);
    assert_eq!(p(None, "quay.io/a/b:devel"), PullPolicy::IfNotPresent);
    let pinned = format!("quay.io/a/b@sha256:{}", "a".repeat(64));
    assert_eq!(p(None, &pinned), PullPolicy::IfNotPresent);
    assert_eq!(p(Some("Never"), "quay.io/a/b"), PullPolicy::Never);
    assert_eq!(p(Some("Always"), "quay.io/a/b:1"), PullPolicy::Always);
    let e = PullPolicy::resolve(Some("Sometimes"), "a/b").unwrap_err();
    assert!(e.contains("Always, IfNotPresent, Never"), "{e}");
}

#[test]
fn mirrors_come_before_the_registry_itself() {
    let m = Mirrors::parse(&[
        "registry:5000=http://127.0.0.1:5000",
        "registry:5000=https://mirror.example",
    ])
    .unwrap();
    let r: Reference = "registry:5000/kubevirt/cirros:devel".parse().unwrap();
    let eps: Vec<_> = m
        .endpoints(&r)
        .into_iter()
        .map(|e| (e.host, e.plain_http))
        .collect();
    assert_eq!(
        eps,
        [
            ("127.0.0.1:5000".to_string(), true),
            ("mirror.example".to_string(), false),
            ("registry:5000".to_string(), false),
        ]
    );
    let other: Reference = "quay.io/a/b:1".parse().unwrap();
    assert_eq!(m.endpoints(&other).len(), 1);
    let moved = reference_at(&r, "127.0.0.1:5000");
    assert_eq!(moved.whole(), "127.0.0.1:5000/kubevirt/cirros:devel");
    for bad in [
        "quay.io",
        "quay.io=ftp://x",
        "quay.io=http://x/path",
        "=http://x",
    ] {
        assert!(Mirrors::parse(&[bad]).is_err(), "{bad}");
    }
}

#[test]
fn credentials_are_found_by_registry_host() {
    let c = DockerConfig::parse(
        br#"{"auths": {
            "registry:5000": {"auth": "dXNlcjpwYXNz"},
            "https://index.docker.io/v1/": {"username": "hub", "password": "pw"}
        }}"#,
    )
    .unwrap();
    assert_eq!(
        credentials_for(&c, "registry:5000"),
        Some(("user".into(), "pass".into()))
    );
    assert_eq!(
        credentials_for(&c, "docker.io"),
        Some(("hub".into(), "pw".into()))
    );
    assert_eq!(credentials_for(&c, "quay.io"), None);
    let e = DockerConfig::parse(br#"{"auths": {"x": {}}}"#).unwrap_err();
    assert!(e.contains("auths[\"x\"]"), "{e}");
    assert!(DockerConfig::parse(b"not json").is_err());
}

/// A layer tarball with the given (path, bytes) regular files and one symlink.
fn layer(files: &[(&str, &[u8])], gzip: bool) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    b.append_link(&mut h, "disk/link.img", "/etc/shadow")
        .unwrap();
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, path, *data).unwrap();
    }
    let raw = b.into_inner().unwrap();
    if !gzip {
        return raw;
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &raw).unwrap();
    gz.finish().unwrap()
}

#[test]
fn the_disk_is_read_from_under_disk_and_nothing_else_is_written() {
    let dir = tempfile::tempdir().unwrap();
    for gzip in [false, true] {
        let blob = dir.path().join("blob");
        std::fs::write(
            &blob,
            layer(
                &[
                    ("etc/passwd", b"root"),
                    ("./disk/cirros.img", b"DISK BYTES"),
                    ("disk/second.img", b"other"),
                ],
                gzip,
            ),
        )
        .unwrap();
        let out = dir.path().join("out");
        assert_eq!(
            extract_disk(&blob, gzip, &out).unwrap(),
            Some("cirros.img".to_string())
        );
        assert_eq!(std::fs::read(&out).unwrap(), b"DISK BYTES");
        std::fs::write(&blob, layer(&[("disk/nested/x.img", b"x")], gzip)).unwrap();
        assert_eq!(
            extract_disk(&blob, gzip, &dir.path().join("none")).unwrap(),
            None
        );
        assert!(!dir.path().join("none").exists());
    }
    std::fs::write(
        dir.path().join("blob"),
        b"not a tarball at all, 512 bytes? no",
    )
    .unwrap();
    assert!(extract_disk(&dir.path().join("blob"), true, &dir.path().join("o")).is_err());
}

#[tokio::test]
async fn never_means_the_cache_or_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::new(dir.path().to_path_buf(), Mirrors::default());
    let e = cache
        .pull(
            "registry:5000/a/b:1",
            PullPolicy::Never,
            &DockerConfig::default(),
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("not on this node and imagePullPolicy is Never"),
        "{e}"
    );
    // A digest reference finds its cached disk without any registry.
    let hex = "b".repeat(64);
    std::fs::write(dir.path().join(format!("{hex}.qcow2")), b"x").unwrap();
    let d = cache
        .pull(
            &format!("registry:5000/a/b@sha256:{hex}"),
            PullPolicy::Never,
            &DockerConfig::default(),
        )
        .await
        .unwrap();
    assert_eq!(d.format, "qcow2");
    assert_eq!(d.digest, format!("sha256:{hex}"));
}

#[tokio::test]
async fn gc_keeps_disks_in_use_or_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::new(dir.path().to_path_buf(), Mirrors::default());
    std::fs::create_dir_all(dir.path().join("refs")).unwrap();
    let (a, b) = ("a".repeat(64), "c".repeat(64));
    for h in [&a, &b] {
        std::fs::write(dir.path().join(format!("{h}.raw")), b"x").unwrap();
        std::fs::write(dir.path().join("refs").join(h), format!("sha256:{h}")).unwrap();
    }
    let in_use = BTreeSet::from([format!("sha256:{a}")]);
    assert!(
        cache
            .gc(&in_use, Duration::from_secs(3600))
            .await
            .is_empty()
    );
    assert_eq!(
        cache.gc(&in_use, Duration::ZERO).await,
        [format!("sha256:{b}")]
    );
    assert!(dir.path().join(format!("{a}.raw")).exists());
    assert!(dir.path().join("refs").join(&a).exists());
    assert!(!dir.path().join(format!("{b}.raw")).exists());
    assert!(!dir.path().join("refs").join(&b).exists());
}

#[tokio::test]
async fn gc_leaves_a_disk_alone_while_its_pull_is_not_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::new(dir.path().to_path_buf(), Mirrors::default());
    let hex = "d".repeat(64);
    std::fs::write(dir.path().join(format!("{hex}.qcow2")), b"x").unwrap();
    let image = format!("registry:5000/a/b@sha256:{hex}");
    let none = DockerConfig::default();
    let disk = cache.pull(&image, PullPolicy::Never, &none).await.unwrap();
    let copy = disk.clone();
    drop(disk);
    // Held (a copy counts): nothing uses it on record, yet it stays.
    assert!(cache.gc(&BTreeSet::new(), Duration::ZERO).await.is_empty());
    drop(copy);
    assert_eq!(
        cache.gc(&BTreeSet::new(), Duration::ZERO).await,
        [format!("sha256:{hex}")]
    );
}

#[test]
fn opening_the_cache_removes_what_cut_short_pulls_left() {
    let dir = tempfile::tempdir().unwrap();
    let hex = "e".repeat(64);
    let kept = dir.path().join(format!("{hex}.raw"));
    std::fs::write(&kept, b"x").unwrap();
    std::fs::write(dir.path().join(format!(".layer-{hex}-3")), b"half").unwrap();
    std::fs::create_dir_all(dir.path().join(format!("{hex}.boot/.k-1.tmp"))).unwrap();
    std::fs::create_dir_all(dir.path().join(format!("{hex}.boot/k"))).unwrap();
    let _cache = Cache::new(dir.path().to_path_buf(), Mirrors::default());
    assert!(kept.exists());
    assert!(!dir.path().join(format!(".layer-{hex}-3")).exists());
    assert!(!dir.path().join(format!("{hex}.boot/.k-1.tmp")).exists());
    assert!(dir.path().join(format!("{hex}.boot/k")).exists());
}
