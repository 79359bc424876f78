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

pub use secret::{DOCKER_CONFIG_SECRET, DockerConfig, credentials_for};

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

/// A kernel (and initrd) taken out of an image for KubeVirt's `kernelBoot.container`: the
/// files QEMU reads, and the manifest digest they came from. Pinned against garbage
/// collection while it lives, as [`Disk`].
#[derive(Clone, Debug)]
pub struct BootFiles {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub digest: String,
    _pin: Arc<Pin>,
}

/// What a pull takes out of an image.
#[derive(Clone, Debug)]
enum Want {
    /// The disk under `/disk/` (KubeVirt's containerDisk layout).
    Disk,
    /// These absolute paths: a kernel and maybe an initrd.
    Boot {
        kernel: String,
        initrd: Option<String>,
    },
}

enum Pulled {
    Disk(Disk),
    Boot(BootFiles),
}

impl Pulled {
    fn touch_path(&self) -> &Path {
        match self {
            Pulled::Disk(d) => &d.path,
            Pulled::Boot(b) => b
                .kernel
                .parent()
                .and_then(Path::parent)
                .unwrap_or(&b.kernel),
        }
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
        remove_temp_files(&dir);
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

    /// The cached content of a manifest digest that `want` asks for, if it is here.
    fn cached_want(&self, digest: &str, want: &Want) -> Option<Pulled> {
        match want {
            Want::Disk => self.cached(digest).map(Pulled::Disk),
            Want::Boot { kernel, initrd } => {
                let hex = digest.strip_prefix("sha256:")?;
                let dir = self
                    .dir
                    .join(format!("{hex}.boot"))
                    .join(boot_key(kernel, initrd));
                let k = dir.join("kernel");
                let i = initrd.as_ref().map(|_| dir.join("initrd"));
                (k.is_file() && i.as_ref().is_none_or(|i| i.is_file())).then(|| {
                    Pulled::Boot(BootFiles {
                        kernel: k,
                        initrd: i,
                        digest: digest.to_string(),
                        _pin: Pin::new(&self.pins, digest),
                    })
                })
            }
        }
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
        match self.pull_want(image, policy, auths, Want::Disk).await? {
            Pulled::Disk(d) => Ok(d),
            Pulled::Boot(_) => unreachable!("a disk was asked for"),
        }
    }

    /// The kernel at `kernel` (and the initrd at `initrd`) inside `image`, pulled as
    /// [`Cache::pull`] pulls a disk; KubeVirt's `kernelBoot.container`.
    pub async fn pull_boot(
        &self,
        image: &str,
        policy: PullPolicy,
        auths: &DockerConfig,
        kernel: &str,
        initrd: Option<&str>,
    ) -> Result<BootFiles, PullError> {
        let want = Want::Boot {
            kernel: kernel.to_string(),
            initrd: initrd.map(str::to_string),
        };
        match self.pull_want(image, policy, auths, want).await? {
            Pulled::Boot(b) => Ok(b),
            Pulled::Disk(_) => unreachable!("boot files were asked for"),
        }
    }

    async fn pull_want(
        &self,
        image: &str,
        policy: PullPolicy,
        auths: &DockerConfig,
        want: Want,
    ) -> Result<Pulled, PullError> {
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
            .and_then(|d| self.cached_want(&d, &want));
        match (policy, known) {
            (PullPolicy::Never | PullPolicy::IfNotPresent, Some(found)) => {
                touch(found.touch_path());
                return Ok(found);
            }
            (PullPolicy::Never, None) => {
                return Err(PullError::NotPresent {
                    image: image.to_string(),
                });
            }
            _ => {}
        }
        let found = self
            .pull_from_registry(image, &reference, auths, &want)
            .await?;
        touch(found.touch_path());
        Ok(found)
    }

    async fn pull_from_registry(
        &self,
        image: &str,
        reference: &Reference,
        auths: &DockerConfig,
        want: &Want,
    ) -> Result<Pulled, PullError> {
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
                    let found = match (self.cached_want(&digest, want), want) {
                        (Some(found), _) => found,
                        (None, Want::Disk) => Pulled::Disk(
                            self.fetch_disk(image, &client, &at, &manifest.layers, &digest)
                                .await?,
                        ),
                        (None, Want::Boot { kernel, initrd }) => {
                            self.fetch_boot(
                                image,
                                &client,
                                &at,
                                &manifest.layers,
                                &digest,
                                (kernel, initrd.as_deref()),
                            )
                            .await?;
                            self.cached_want(&digest, want)
                                .ok_or_else(|| PullError::Content {
                                    image: image.to_string(),
                                    message: "the boot files vanished after their pull".into(),
                                })?
                        }
                    };
                    write_atomic(&self.ref_file(image), digest.as_bytes())
                        .await
                        .map_err(io)?;
                    tracing::info!(
                        %image, from = %ep.host, %digest, ms = started.elapsed().as_millis() as u64,
                        "container disk ready"
                    );
                    return Ok(found);
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
        let hex = manifest_hex(digest)
            .ok_or_else(|| content(format!("unsupported manifest digest {digest:?}")))?;
        for layer in layers.iter().rev() {
            let gzip = layer_is_gzip(layer).map_err(content)?;
            let n = temp_seq();
            let blob = self.dir.join(format!(".layer-{hex}-{n}"));
            download_layer(image, client, at, layer, &blob).await?;
            let out = self.dir.join(format!(".disk-{hex}-{n}"));
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

    /// Download the layers, last first, until `kernel` and `initrd` were found in one (a
    /// later layer's file wins, as in a container's filesystem); keep them as
    /// `<hex>.boot/<key>/kernel` and `initrd`.
    async fn fetch_boot(
        &self,
        image: &str,
        client: &Client,
        at: &Reference,
        layers: &[OciDescriptor],
        digest: &str,
        (kernel, initrd): (&str, Option<&str>),
    ) -> Result<(), PullError> {
        let io = |e| PullError::Io(image.to_string(), e);
        let content = |message: String| PullError::Content {
            image: image.to_string(),
            message,
        };
        let hex = manifest_hex(digest)
            .ok_or_else(|| content(format!("unsupported manifest digest {digest:?}")))?;
        let key = boot_key(kernel, &initrd.map(str::to_string));
        let base = self.dir.join(format!("{hex}.boot"));
        let stage = base.join(format!(".{key}-{}.tmp", temp_seq()));
        tokio::fs::create_dir_all(&stage).await.map_err(io)?;
        // (path in the image, file name here)
        let mut todo: Vec<(String, &'static str)> = vec![(kernel.to_string(), "kernel")];
        if let Some(i) = initrd {
            todo.push((i.to_string(), "initrd"));
        }
        for layer in layers.iter().rev() {
            if todo.is_empty() {
                break;
            }
            let blob = stage.join(".layer");
            let pulled = match layer_is_gzip(layer) {
                Ok(gzip) => download_layer(image, client, at, layer, &blob)
                    .await
                    .map(|()| gzip),
                Err(e) => Err(content(e)),
            };
            let gzip = match pulled {
                Ok(gzip) => gzip,
                Err(e) => {
                    give_up(&stage).await;
                    return Err(e);
                }
            };
            let (b2, s2, want) = (blob.clone(), stage.clone(), todo.clone());
            let found = tokio::task::spawn_blocking(move || extract_files(&b2, gzip, &want, &s2))
                .await
                .map_err(|e| content(format!("extracting: {e}")))?;
            let _ = tokio::fs::remove_file(&blob).await;
            match found {
                Ok(found) => todo.retain(|(p, _)| !found.contains(p)),
                Err(e) => {
                    give_up(&stage).await;
                    return Err(content(format!("layer {}: {e}", layer.digest)));
                }
            }
        }
        if !todo.is_empty() {
            give_up(&stage).await;
            let missing: Vec<&str> = todo.iter().map(|(p, _)| p.as_str()).collect();
            return Err(content(format!(
                "no layer holds {} (kernelBoot.container)",
                missing.join(" or ")
            )));
        }
        let done = base.join(&key);
        let _ = tokio::fs::remove_dir_all(&done).await;
        tokio::fs::rename(&stage, &done).await.map_err(io)?;
        Ok(())
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
            let gone = if e.path().is_dir() {
                tokio::fs::remove_dir_all(e.path()).await
            } else {
                tokio::fs::remove_file(e.path()).await
            };
            if gone.is_ok() {
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
    let opened = if path.is_dir() {
        std::fs::File::open(path)
    } else {
        std::fs::File::options().append(true).open(path)
    };
    if let Ok(f) = opened {
        let _ = f.set_modified(SystemTime::now());
    }
}

async fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    tokio::fs::write(&tmp, data).await?;
    tokio::fs::rename(&tmp, path).await
}

/// The hex of a `sha256:` manifest digest, if it is one.
fn manifest_hex(digest: &str) -> Option<&str> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether a layer is gzip-compressed: the media types a container disk can carry are tar
/// and tar+gzip, OCI's or Docker's.
fn layer_is_gzip(layer: &OciDescriptor) -> Result<bool, String> {
    let t = layer.media_type.as_str();
    if TAR_GZIP.contains(&t) {
        Ok(true)
    } else if TAR.contains(&t) {
        Ok(false)
    } else {
        Err(format!(
            "layer media type {t:?} is not supported (tar or tar+gzip)"
        ))
    }
}

/// Download one layer to `blob` (the client checks its digest while streaming); a failed
/// download leaves no file.
async fn download_layer(
    image: &str,
    client: &Client,
    at: &Reference,
    layer: &OciDescriptor,
    blob: &Path,
) -> Result<(), PullError> {
    let file = tokio::fs::File::create(blob)
        .await
        .map_err(|e| PullError::Io(image.to_string(), e))?;
    if let Err(e) = client
        .pull_blob(at, layer, tokio::io::BufWriter::new(file))
        .await
    {
        let _ = tokio::fs::remove_file(blob).await;
        return Err(PullError::Registry {
            image: image.to_string(),
            message: format!("layer {}: {}", layer.digest, describe(&e)),
        });
    }
    Ok(())
}

/// A layer tarball, gunzipped as it is read when `gzip`.
fn open_layer(blob: &Path, gzip: bool) -> Result<tar::Archive<Box<dyn std::io::Read>>, String> {
    let f = std::fs::File::open(blob).map_err(|e| e.to_string())?;
    let reader: Box<dyn std::io::Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(std::io::BufReader::new(f)))
    } else {
        Box::new(std::io::BufReader::new(f))
    };
    Ok(tar::Archive::new(reader))
}

/// Remove what pulls cut short (the agent killed mid-pull) left: the dot-named temporary
/// files and staging folders. Run when the cache opens, before any pull of this process.
fn remove_temp_files(dir: &Path) {
    let rm = |p: &Path| {
        let _ = if p.is_dir() {
            std::fs::remove_dir_all(p)
        } else {
            std::fs::remove_file(p)
        };
    };
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            rm(&e.path());
        } else if name.ends_with(".boot") {
            for b in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                if b.file_name().to_string_lossy().starts_with('.') {
                    rm(&b.path());
                }
            }
        }
    }
}

/// A number for this process's temporary names in the cache: two references that resolve
/// to the same digest may be pulled at once (locks are per reference), and must not write
/// the same file.
fn temp_seq() -> u64 {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Remove a boot pull's staging folder, and the image's boot folder if that leaves it empty:
/// a failed pull keeps nothing.
async fn give_up(stage: &Path) {
    let _ = tokio::fs::remove_dir_all(stage).await;
    if let Some(base) = stage.parent() {
        let _ = tokio::fs::remove_dir(base).await;
    }
}

/// The folder of one kernel/initrd choice inside an image's boot cache.
fn boot_key(kernel: &str, initrd: &Option<String>) -> String {
    let mut h = Sha256::new();
    h.update(kernel.as_bytes());
    h.update([0]);
    h.update(initrd.as_deref().unwrap_or("").as_bytes());
    hex::encode(&h.finalize()[..8])
}

/// The components of a path in a layer or in a spec, without `.` and the root: `None` when
/// it has `..`.
fn path_parts(p: &Path) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for c in p.components() {
        match c {
            std::path::Component::Normal(s) => out.push(s.to_string_lossy().into_owned()),
            std::path::Component::CurDir | std::path::Component::RootDir => {}
            _ => return None,
        }
    }
    Some(out)
}

/// Copy the regular files of a layer tarball at the paths `want` names (image path, file
/// name in `dir`) into `dir`; the image paths found. As for disks, only entry bytes are
/// written, never links or devices, and names come from `want`, not from the layer.
fn extract_files(
    blob: &Path,
    gzip: bool,
    want: &[(String, &'static str)],
    dir: &Path,
) -> Result<Vec<String>, String> {
    let wanted: Vec<(Vec<String>, &String, &str)> = want
        .iter()
        .filter_map(|(p, name)| Some((path_parts(Path::new(p))?, p, *name)))
        .collect();
    let mut found: Vec<String> = Vec::new();
    each_file(blob, gzip, |parts, entry| {
        if let Some((_, p, name)) = wanted
            .iter()
            .find(|(w, p, _)| *w == parts && !found.contains(*p))
        {
            copy_entry(entry, &dir.join(name))?;
            found.push((*p).clone());
        }
        Ok(false)
    })?;
    Ok(found)
}

/// Copy the first regular file under `disk/` of a layer tarball to `out`: `Some(name)`, or
/// `None` when the layer has no disk. Symbolic links, devices and paths with `..` are never
/// followed or written: only the bytes of the entry go to `out`.
fn extract_disk(blob: &Path, gzip: bool, out: &Path) -> Result<Option<String>, String> {
    let mut name = None;
    each_file(blob, gzip, |parts, entry| {
        if parts.len() != 2 || parts[0] != "disk" {
            return Ok(false);
        }
        copy_entry(entry, out)?;
        name = Some(parts[1].clone());
        Ok(true)
    })?;
    Ok(name)
}

/// Visit the regular files of a layer tarball, in order, with their path's parts (entries
/// whose path has `..` are skipped) until `visit` says it is done.
fn each_file(
    blob: &Path,
    gzip: bool,
    mut visit: impl FnMut(Vec<String>, &mut dyn std::io::Read) -> Result<bool, String>,
) -> Result<(), String> {
    let mut archive = open_layer(blob, gzip)?;
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path().map_err(|e| e.to_string())?.into_owned();
        let Some(parts) = path_parts(&path) else {
            continue;
        };
        if visit(parts, &mut entry)? {
            break;
        }
    }
    Ok(())
}

/// Write an entry's bytes (nothing else of it) to `out`, synced.
fn copy_entry(entry: &mut dyn std::io::Read, out: &Path) -> Result<(), String> {
    let mut dst = std::fs::File::create(out).map_err(|e| e.to_string())?;
    std::io::copy(entry, &mut dst).map_err(|e| e.to_string())?;
    dst.sync_all().map_err(|e| e.to_string())
}
