//! Container disks from OCI registries, as KubeVirt's `containerDisk` volumes name them
//! (`quay.io/org/name:tag`, `registry:5000/name@sha256:...`): the node that runs the VM pulls
//! the image with `oci-client` (the ORAS project's distribution client), every blob verified
//! against its digest, and keeps the disk it carries (`/disk/*`, qcow2 or raw, as KubeVirt's
//! containerDisk images hold it) once per manifest digest, shared by every VM that uses it.
//!
//! - [`Source::of`] tells an image edgevirt imported (a plain name, `edgevirt image import`)
//!   from a registry reference, for admission and the agent alike.
//! - [`Mirrors`] maps a registry host to the endpoints tried before it, as containerd's
//!   `hosts.toml` does, for sites without internet.
//! - [`Cache::pull`] honours `imagePullPolicy` with KubeVirt's defaults; [`Cache::gc`] removes
//!   disks no VM uses.
//!
//! Pulls go through the proxy of the node's environment (`HTTPS_PROXY`, `HTTP_PROXY`,
//! `NO_PROXY`), which reqwest reads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest as _, Sha256};

mod secret;
#[cfg(test)]
mod tests;

pub use secret::{DockerConfig, credentials_for};

/// What a `containerDisk.image` (or a kernel boot container's image) names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// An image imported into edgevirt: a plain name such as `debian`.
    Imported(String),
    /// An OCI image in a registry, as written (`registry:5000/kubevirt/cirros:devel`).
    Registry(String),
}

impl Source {
    /// A name with a registry host, a repository path, a tag or a digest is a registry
    /// reference; a plain DNS-1123 name is an imported image (as before registries existed,
    /// so those names keep working). `docker.io/library/debian:12` names Docker Hub's.
    pub fn of(image: &str) -> Source {
        if crate::types::kubevirt::names_registry_image(image) {
            Source::Registry(image.to_string())
        } else {
            Source::Imported(image.to_string())
        }
    }
}

/// Check a registry reference's syntax (admission): the message says what is wrong.
pub fn check_reference(image: &str) -> Result<(), String> {
    if image.starts_with(['/', '.']) || image.contains("..") {
        return Err(format!(
            "{image:?} is a path; an image is an OCI reference (registry/repository:tag) or \
             the name of an image imported with `edgevirt image import`, never to paths"
        ));
    }
    image
        .parse::<Reference>()
        .map(|_| ())
        .map_err(|e| format!("{image:?} is not a valid image reference: {e}"))
}

/// KubeVirt's `imagePullPolicy`, defaulted as KubeVirt (and the kubelet) default it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// The policy a container disk gets: the one written, else `Always` for a `:latest` (or
    /// untagged) image without a digest, `IfNotPresent` otherwise.
    pub fn resolve(written: Option<&str>, image: &str) -> Result<PullPolicy, String> {
        match written {
            Some("Always") => Ok(PullPolicy::Always),
            Some("IfNotPresent") => Ok(PullPolicy::IfNotPresent),
            Some("Never") => Ok(PullPolicy::Never),
            Some(other) => Err(format!(
                "imagePullPolicy {other:?} is not one of Always, IfNotPresent, Never"
            )),
            None => {
                let r: Reference = image.parse().map_err(|e| format!("{e}"))?;
                Ok(
                    if r.digest().is_none() && r.tag().is_none_or(|t| t == "latest") {
                        PullPolicy::Always
                    } else {
                        PullPolicy::IfNotPresent
                    },
                )
            }
        }
    }
}

/// Registry mirrors: for a registry host, the endpoints (`http://127.0.0.1:5000`,
/// `https://mirror.local`) tried in order before the registry itself. An `http://` endpoint
/// is spoken to without TLS, as containerd's mirror configuration allows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mirrors {
    by_host: BTreeMap<String, Vec<String>>,
}

impl Mirrors {
    /// Parse `HOST=URL` settings (`--registry-mirror quay.io=http://10.0.0.5:5000`).
    pub fn parse<S: AsRef<str>>(settings: &[S]) -> Result<Mirrors, String> {
        let mut by_host: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for s in settings {
            let s = s.as_ref();
            let (host, url) = s
                .split_once('=')
                .ok_or_else(|| format!("registry mirror {s:?}: write HOST=URL"))?;
            let (scheme, rest) = url.split_once("://").ok_or_else(|| {
                format!("registry mirror {s:?}: the URL must start with http:// or https://")
            })?;
            if !matches!(scheme, "http" | "https") || rest.is_empty() || rest.contains('/') {
                return Err(format!(
                    "registry mirror {s:?}: the URL must be http:// or https:// and a host[:port], \
                     without a path"
                ));
            }
            if host.is_empty() || host.contains(['/', '@']) {
                return Err(format!(
                    "registry mirror {s:?}: {host:?} is not a registry host"
                ));
            }
            by_host
                .entry(host.to_string())
                .or_default()
                .push(url.to_string());
        }
        Ok(Mirrors { by_host })
    }

    /// Where to pull `r` from, in order: each mirror of its registry, then the registry.
    fn endpoints(&self, r: &Reference) -> Vec<Endpoint> {
        let mut out: Vec<Endpoint> = self
            .by_host
            .get(r.registry())
            .into_iter()
            .flatten()
            .map(|url| {
                let (scheme, host) = url.split_once("://").expect("checked in parse");
                Endpoint {
                    host: host.to_string(),
                    plain_http: scheme == "http",
                }
            })
            .collect();
        out.push(Endpoint {
            host: r.registry().to_string(),
            plain_http: false,
        });
        out
    }
}

#[derive(Clone, Debug)]
struct Endpoint {
    host: String,
    plain_http: bool,
}

/// A container disk on this node: the file QEMU opens (read-only, under an overlay), its
/// format, and the manifest digest it came from. While a `Disk` lives, garbage collection
/// leaves its file alone (the instance that pulled it has not recorded it yet).
#[derive(Clone, Debug)]
pub struct Disk {
    pub path: PathBuf,
    pub format: String,
    pub digest: String,
    _pin: Arc<Pin>,
}

impl PartialEq for Disk {
    fn eq(&self, o: &Disk) -> bool {
        (&self.path, &self.format, &self.digest) == (&o.path, &o.format, &o.digest)
    }
}

/// Digests pulled and not yet recorded by their instance, with how many holders.
type Pins = Arc<std::sync::Mutex<BTreeMap<String, usize>>>;

#[derive(Debug)]
struct Pin {
    pins: Pins,
    digest: String,
}

impl Pin {
    fn new(pins: &Pins, digest: &str) -> Arc<Pin> {
        *pins
            .lock()
            .expect("pins lock")
            .entry(digest.to_string())
            .or_default() += 1;
        Arc::new(Pin {
            pins: pins.clone(),
            digest: digest.to_string(),
        })
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut pins = self.pins.lock().expect("pins lock");
        if let Some(n) = pins.get_mut(&self.digest) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&self.digest);
            }
        }
    }
}

/// Why a pull failed, in words for the VMI's status.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{0}")]
    Invalid(String),
    #[error("image {image} is not on this node and imagePullPolicy is Never")]
    NotPresent { image: String },
    #[error("pulling {image}: {message}")]
    Registry { image: String, message: String },
    #[error("image {image}: {message}")]
    Content { image: String, message: String },
    #[error("image {0}: {1}")]
    Io(String, #[source] std::io::Error),
}

/// The node's container-disk cache: `DIR/<hex>.<format>` per manifest digest and
/// `DIR/refs/<hash of the reference>` with the digest a tag last resolved to.
pub struct Cache {
    dir: PathBuf,
    mirrors: Mirrors,
    /// One pull at a time per reference: a second VM of the same image waits and reuses it.
    locks: tokio::sync::Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pins: Pins,
}

/// The media types of layers a container disk can carry.
const TAR: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.docker.image.rootfs.diff.tar",
];
const TAR_GZIP: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
];

impl Cache {
    pub fn new(dir: PathBuf, mirrors: Mirrors) -> Cache {
        Cache {
            dir,
            mirrors,
            locks: Default::default(),
            pins: Default::default(),
        }
    }

    fn ref_file(&self, image: &str) -> PathBuf {
        self.dir
            .join("refs")
            .join(hex::encode(Sha256::digest(image.as_bytes())))
    }

    /// The cached disk of a manifest digest, if there is one.
    fn cached(&self, digest: &str) -> Option<Disk> {
        let hex = digest.strip_prefix("sha256:")?;
        ["qcow2", "raw"].into_iter().find_map(|format| {
            let path = self.dir.join(format!("{hex}.{format}"));
            path.is_file().then(|| Disk {
                path,
                format: format.to_string(),
                digest: digest.to_string(),
                _pin: Pin::new(&self.pins, digest),
            })
        })
    }

    /// The disk of `image` on this node, pulled if the policy says so. `auths` are the
    /// credentials of the VM's `imagePullSecret` (registry host → user, password).
    pub async fn pull(
        &self,
        image: &str,
        policy: PullPolicy,
        auths: &DockerConfig,
    ) -> Result<Disk, PullError> {
        let reference: Reference = image
            .parse()
            .map_err(|e| PullError::Invalid(format!("{image:?}: {e}")))?;
        let lock = self
            .locks
            .lock()
            .await
            .entry(image.to_string())
            .or_default()
            .clone();
        let _one_at_a_time = lock.lock().await;
        let known = tokio::fs::read_to_string(self.ref_file(image))
            .await
            .ok()
            .map(|d| d.trim().to_string())
            .or_else(|| reference.digest().map(str::to_string))
            .and_then(|d| self.cached(&d));
        match (policy, known) {
            (PullPolicy::Never | PullPolicy::IfNotPresent, Some(disk)) => {
                touch(&disk.path);
                return Ok(disk);
            }
            (PullPolicy::Never, None) => {
                return Err(PullError::NotPresent {
                    image: image.to_string(),
                });
            }
            _ => {}
        }
        let disk = self.pull_from_registry(image, &reference, auths).await?;
        touch(&disk.path);
        Ok(disk)
    }

    async fn pull_from_registry(
        &self,
        image: &str,
        reference: &Reference,
        auths: &DockerConfig,
    ) -> Result<Disk, PullError> {
        let io = |e| PullError::Io(image.to_string(), e);
        let mut failures = Vec::new();
        for ep in self.mirrors.endpoints(reference) {
            let at = reference_at(reference, &ep.host);
            let auth = match credentials_for(auths, &ep.host)
                .or_else(|| credentials_for(auths, reference.registry()))
            {
                Some((user, password)) => RegistryAuth::Basic(user, password),
                None => RegistryAuth::Anonymous,
            };
            let client = client_for(&ep);
            let started = std::time::Instant::now();
            match client.pull_image_manifest(&at, &auth).await {
                Ok((manifest, digest)) => {
                    tokio::fs::create_dir_all(self.dir.join("refs"))
                        .await
                        .map_err(io)?;
                    let disk = match self.cached(&digest) {
                        Some(d) => d,
                        None => {
                            self.fetch_disk(image, &client, &at, &manifest.layers, &digest)
                                .await?
                        }
                    };
                    write_atomic(&self.ref_file(image), digest.as_bytes())
                        .await
                        .map_err(io)?;
                    tracing::info!(
                        %image, from = %ep.host, %digest, ms = started.elapsed().as_millis() as u64,
                        "container disk ready"
                    );
                    return Ok(disk);
                }
                Err(e) => {
                    tracing::warn!(%image, from = %ep.host, error = %e, "pull failed");
                    failures.push(format!("{}: {}", ep.host, describe(&e)));
                }
            }
        }
        Err(PullError::Registry {
            image: image.to_string(),
            message: failures.join("; "),
        })
    }

    /// Download the layers (each verified against its digest by the client), last first,
    /// until one holds a disk under `disk/`; keep that disk as `<hex>.<format>`.
    async fn fetch_disk(
        &self,
        image: &str,
        client: &Client,
        at: &Reference,
        layers: &[OciDescriptor],
        digest: &str,
    ) -> Result<Disk, PullError> {
        let io = |e| PullError::Io(image.to_string(), e);
        let content = |message: String| PullError::Content {
            image: image.to_string(),
            message,
        };
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| content(format!("unsupported manifest digest {digest:?}")))?;
        for layer in layers.iter().rev() {
            let gzip = if TAR_GZIP.contains(&layer.media_type.as_str()) {
                true
            } else if TAR.contains(&layer.media_type.as_str()) {
                false
            } else {
                return Err(content(format!(
                    "layer media type {:?} is not supported (tar or tar+gzip)",
                    layer.media_type
                )));
            };
            let blob = self.dir.join(format!(".layer-{hex}"));
            let file = tokio::fs::File::create(&blob).await.map_err(io)?;
            let pulled = client
                .pull_blob(at, layer, tokio::io::BufWriter::new(file))
                .await;
            if let Err(e) = pulled {
                let _ = tokio::fs::remove_file(&blob).await;
                return Err(PullError::Registry {
                    image: image.to_string(),
                    message: format!("layer {}: {}", layer.digest, describe(&e)),
                });
            }
            let out = self.dir.join(format!(".disk-{hex}"));
            let (b2, o2) = (blob.clone(), out.clone());
            let found = tokio::task::spawn_blocking(move || extract_disk(&b2, gzip, &o2))
                .await
                .map_err(|e| content(format!("extracting: {e}")))?;
            let _ = tokio::fs::remove_file(&blob).await;
            let found = match found {
                Ok(f) => f,
                Err(e) => {
                    let _ = tokio::fs::remove_file(&out).await;
                    return Err(content(format!("layer {}: {e}", layer.digest)));
                }
            };
            if found.is_none() {
                continue;
            }
            // The format is read from the file's header: it came from the registry, not
            // from a guest. A backing or external data file is refused as on import.
            let format = match crate::virt::image::inspect(&out, None).await {
                Ok((format, _size)) => format,
                Err(e) => {
                    let _ = tokio::fs::remove_file(&out).await;
                    return Err(content(format!("the disk in the image: {e}")));
                }
            };
            let path = self.dir.join(format!("{hex}.{format}"));
            tokio::fs::rename(&out, &path).await.map_err(io)?;
            return Ok(Disk {
                path,
                format,
                digest: digest.to_string(),
                _pin: Pin::new(&self.pins, digest),
            });
        }
        Err(content(
            "no layer holds a disk under /disk/ (KubeVirt's containerDisk layout)".into(),
        ))
    }

    /// Remove cached disks whose digest is not in `in_use` and that were last used more than
    /// `grace` ago, with the references that point at them. Returns the digests removed.
    pub async fn gc(&self, in_use: &BTreeSet<String>, grace: Duration) -> Vec<String> {
        let mut removed = Vec::new();
        let Ok(mut dir) = tokio::fs::read_dir(&self.dir).await else {
            return removed;
        };
        while let Ok(Some(e)) = dir.next_entry().await {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((hex, _format)) = name.split_once('.') else {
                continue;
            };
            if hex.len() != 64 {
                continue;
            }
            let digest = format!("sha256:{hex}");
            let idle = e
                .metadata()
                .await
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .unwrap_or_default();
            let pinned = self.pins.lock().expect("pins lock").contains_key(&digest);
            if in_use.contains(&digest) || pinned || idle < grace {
                continue;
            }
            if tokio::fs::remove_file(e.path()).await.is_ok() {
                tracing::info!(%digest, "removed an unused container disk");
                removed.push(digest);
            }
        }
        if let Ok(mut refs) = tokio::fs::read_dir(self.dir.join("refs")).await {
            while let Ok(Some(e)) = refs.next_entry().await {
                let points_at = tokio::fs::read_to_string(e.path())
                    .await
                    .unwrap_or_default();
                if removed.iter().any(|d| *d == points_at.trim()) {
                    let _ = tokio::fs::remove_file(e.path()).await;
                }
            }
        }
        removed
    }
}

/// `r` as served by another host (a mirror), same repository, tag and digest.
fn reference_at(r: &Reference, host: &str) -> Reference {
    match (r.tag(), r.digest()) {
        (Some(tag), Some(digest)) => Reference::with_tag_and_digest(
            host.to_string(),
            r.repository().to_string(),
            tag.to_string(),
            digest.to_string(),
        ),
        (None, Some(digest)) => Reference::with_digest(
            host.to_string(),
            r.repository().to_string(),
            digest.to_string(),
        ),
        (tag, None) => Reference::with_tag(
            host.to_string(),
            r.repository().to_string(),
            tag.unwrap_or("latest").to_string(),
        ),
    }
}

fn client_for(ep: &Endpoint) -> Client {
    crate::tls::install_crypto_provider();
    let protocol = if ep.plain_http {
        ClientProtocol::HttpsExcept(vec![ep.host.clone()])
    } else {
        ClientProtocol::Https
    };
    Client::new(ClientConfig {
        protocol,
        connect_timeout: Some(Duration::from_secs(10)),
        read_timeout: Some(Duration::from_secs(60)),
        // A container disk is an amd64 image; an index picks its linux/amd64 entry.
        platform_resolver: Some(Box::new(oci_client::client::linux_amd64_resolver)),
        ..Default::default()
    })
}

/// An error of the client, with its causes, on one line.
fn describe(e: &oci_client::errors::OciDistributionError) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Mark a cached disk as just used (its age for [`Cache::gc`]).
fn touch(path: &Path) {
    if let Ok(f) = std::fs::File::options().append(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

async fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    tokio::fs::write(&tmp, data).await?;
    tokio::fs::rename(&tmp, path).await
}

/// Copy the first regular file under `disk/` of a layer tarball to `out`: `Some(name)`, or
/// `None` when the layer has no disk. Symbolic links, devices and paths with `..` are never
/// followed or written: only the bytes of the entry go to `out`.
fn extract_disk(blob: &Path, gzip: bool, out: &Path) -> Result<Option<String>, String> {
    let f = std::fs::File::open(blob).map_err(|e| e.to_string())?;
    let reader: Box<dyn std::io::Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(std::io::BufReader::new(f)))
    } else {
        Box::new(std::io::BufReader::new(f))
    };
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path().map_err(|e| e.to_string())?.into_owned();
        let parts: Vec<_> = path
            .components()
            .filter(|c| {
                !matches!(
                    c,
                    std::path::Component::CurDir | std::path::Component::RootDir
                )
            })
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.len() != 2 || parts[0] != "disk" {
            continue;
        }
        let mut dst = std::fs::File::create(out).map_err(|e| e.to_string())?;
        std::io::copy(&mut entry, &mut dst).map_err(|e| e.to_string())?;
        dst.sync_all().map_err(|e| e.to_string())?;
        return Ok(Some(parts[1].clone()));
    }
    Ok(None)
}
