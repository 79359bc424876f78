//! A real OCI registry for the tests: Debian's `docker-registry` (the CNCF distribution
//! registry) on loopback, on a port the kernel picks, storing into a temporary folder, with
//! optional htpasswd authentication. Images are written here as an OCI layout in KubeVirt's
//! containerDisk shape (the disk under `/disk/`) and pushed with Debian's `skopeo`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest as _, Sha256};

/// A running registry; stopped (by its pid) and its storage removed when dropped.
pub struct Registry {
    child: Child,
    dir: tempfile::TempDir,
    /// `127.0.0.1:PORT`.
    pub host: String,
    /// The user and password it requires, if any.
    pub creds: Option<(String, String)>,
}

/// What a push produced: the manifest digest and the digest of the one layer.
#[derive(Clone, Debug)]
pub struct Pushed {
    pub manifest: String,
    pub layer: String,
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Registry {
    /// Start a registry; with `creds`, every request needs them (htpasswd, bcrypt).
    pub fn start(creds: Option<(&str, &str)>) -> Registry {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let host = format!("127.0.0.1:{port}");
        let mut auth = String::new();
        if let Some((user, password)) = creds {
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, password])
                .output()
                .expect("htpasswd (apache2-utils; scripts/setup-host.sh installs it)");
            assert!(out.status.success(), "htpasswd failed");
            std::fs::write(dir.path().join("htpasswd"), out.stdout).unwrap();
            auth = format!(
                "auth:\n  htpasswd:\n    realm: edgevirt-test\n    path: {}\n",
                dir.path().join("htpasswd").display()
            );
        }
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
             delete:\n    enabled: true\nhttp:\n  addr: {host}\n{auth}",
            dir.path().join("storage").display()
        );
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("docker-registry (scripts/setup-host.sh installs it)");
        let r = Registry {
            child,
            dir,
            host,
            creds: creds.map(|(u, p)| (u.to_string(), p.to_string())),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&r.host).is_err() {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen on {}: {}",
                r.host,
                std::fs::read_to_string(r.dir.path().join("registry.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    /// Push an image holding `disk` (a file) as `/disk/<disk_name>` to `repo:tag`
    /// (`kubevirt/cirros-container-disk-demo:devel`), as an OCI image with one gzip layer.
    pub fn push_disk(&self, repo_tag: &str, disk: &Path, disk_name: &str) -> Pushed {
        self.push_files(repo_tag, &[(&format!("disk/{disk_name}"), disk)])
    }

    /// Push an image holding each file at its path (`boot/vmlinuz-virt`; the folders are
    /// written first, owned by KubeVirt's qemu user 107 as its images have them), as an OCI
    /// image with one gzip layer.
    pub fn push_files(&self, repo_tag: &str, files: &[(&str, &Path)]) -> Pushed {
        let layout = tempfile::tempdir().unwrap();
        let blobs = layout.path().join("blobs/sha256");
        std::fs::create_dir_all(&blobs).unwrap();
        let put = |data: &[u8]| -> (String, usize) {
            let d = sha256(data);
            std::fs::write(blobs.join(&d[7..]), data).unwrap();
            (d, data.len())
        };
        let mut tar = tar::Builder::new(Vec::new());
        let mut dirs: Vec<String> = Vec::new();
        for (at, _) in files {
            let mut parts: Vec<&str> = at.split('/').collect();
            parts.pop();
            for i in 1..=parts.len() {
                let d = format!("{}/", parts[..i].join("/"));
                if !dirs.contains(&d) {
                    dirs.push(d);
                }
            }
        }
        for d in &dirs {
            let mut dir = tar::Header::new_gnu();
            dir.set_entry_type(tar::EntryType::Directory);
            dir.set_size(0);
            dir.set_mode(0o555);
            dir.set_uid(107);
            dir.set_cksum();
            tar.append_data(&mut dir, d, std::io::empty()).unwrap();
        }
        for (at, file) in files {
            let mut f = std::fs::File::open(file).unwrap();
            let mut h = tar::Header::new_gnu();
            h.set_size(f.metadata().unwrap().len());
            h.set_mode(0o440);
            h.set_uid(107);
            h.set_cksum();
            tar.append_data(&mut h, at, &mut f).unwrap();
        }
        let raw = tar.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &raw).unwrap();
        let layer = gz.finish().unwrap();
        let (layer_digest, layer_size) = put(&layer);
        let config = serde_json::to_vec(&json!({
            "architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [sha256(&raw)]},
            "config": {},
        }))
        .unwrap();
        let (config_digest, config_size) = put(&config);
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": layer_digest, "size": layer_size}],
        }))
        .unwrap();
        let (manifest_digest, manifest_size) = put(&manifest);
        std::fs::write(
            layout.path().join("oci-layout"),
            br#"{"imageLayoutVersion": "1.0.0"}"#,
        )
        .unwrap();
        std::fs::write(
            layout.path().join("index.json"),
            serde_json::to_vec(&json!({
                "schemaVersion": 2,
                "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "digest": manifest_digest, "size": manifest_size,
                               "annotations": {"org.opencontainers.image.ref.name": "disk"}}],
            }))
            .unwrap(),
        )
        .unwrap();
        let mut cmd = Command::new("skopeo");
        cmd.args([
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            "--preserve-digests",
        ]);
        if let Some((u, p)) = &self.creds {
            cmd.arg(format!("--dest-creds={u}:{p}"));
        }
        let out = cmd
            .arg(format!("oci:{}:disk", layout.path().display()))
            .arg(format!("docker://{}/{repo_tag}", self.host))
            .output()
            .expect("skopeo (scripts/setup-host.sh installs it)");
        assert!(
            out.status.success(),
            "skopeo copy failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Pushed {
            manifest: manifest_digest,
            layer: layer_digest,
        }
    }

    /// The file the registry serves a blob from (to corrupt it in a test).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Stop the registry (it is gone until the next [`Registry::start`]).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}
