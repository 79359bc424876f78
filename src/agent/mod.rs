//! The agent role: one per host. Registers the node with its facts and heartbeats, syncs the
//! VMIs bound to it, prepares their disks, starts one detached launcher per VMI (so VMs
//! outlive the agent), re-adopts running launchers at start-up by scanning their sockets,
//! turns launcher status into VMI status, and removes domains of this installation that no
//! VMI owns any more. It talks to the controller only over the API, with its own token.

pub mod accel;
pub mod backup;
pub mod backup_files;
mod console;
mod datavolume;
mod direct;
#[cfg(test)]
mod fake;
mod guest;
mod hotplug;
pub mod join;
mod launchers;
mod migrate;
pub mod ports;
mod prepare;
mod relay;
mod snapshot;
mod stats;
mod sync;
#[cfg(test)]
mod transitions;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::json;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use self::ports::{ControlPlane, Launchers, Stored};
use crate::client::Client;
use crate::hypervisor::Hypervisor;
use crate::types::edgevirt::{NodeSpec, NodeStatus, SharedPool};
use crate::types::kubevirt::{Condition, ConditionType, condition_true};
use crate::types::{Node, Typed, now};

/// The agent's settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub node_name: String,
    pub data_dir: PathBuf,
    pub libvirt_uri: String,
    /// `auto`, `kvm` or `qemu`.
    pub accel: String,
    pub controller_url: String,
    pub token: String,
    pub ca_file: Option<PathBuf>,
    /// SHA-256 of the controller's certificate, pinned at join time (separate agents).
    pub cert_pin: Option<String>,
    /// This executable, started again as `edgevirt launcher`.
    pub exe: PathBuf,
    pub nat_network: String,
    /// The NAT network's /24, written as its first three octets, e.g. `10.77.0`.
    pub nat_prefix: String,
    /// The shared storage pool this host mounts: name and path.
    pub shared_pool: Option<(String, PathBuf)>,
    /// The backup targets this node mounts (name, folder).
    pub backup_targets: Vec<(String, PathBuf)>,
    /// The one folder hostDisk volumes may live in; none: hostDisk is refused here.
    pub host_disk_dir: Option<PathBuf>,
    /// Registry mirrors for container disks (`HOST=URL`, containerd's mirror idea).
    pub registry_mirrors: crate::registry::Mirrors,
    /// How long a container disk no VM uses stays in the node's cache.
    pub image_gc_grace: Duration,
    /// How often the node's figures (domain stats, host) go to the controller.
    pub stats_interval: Duration,
    /// `--migration-address`: an IP address, `tunnel`, or none (the route to the controller).
    pub migration_address: Option<String>,
}

/// State the sync loop keeps between ticks (all of it can be rebuilt after a restart).
pub struct Agent {
    pub cfg: Config,
    /// The controller's API for what is not an object: the VMI watch, consoles, image data.
    pub api: Client,
    /// The controller's objects, typed.
    pub cp: Arc<dyn ControlPlane>,
    pub hv: Arc<dyn Hypervisor>,
    pub accel: String,
    /// Why `accel` was chosen (the node's `acceleratorReason`).
    pub accel_reason: String,
    pub install_id: String,
    /// This node's launchers.
    pub launchers: Arc<dyn Launchers>,
    /// Launchers started recently and not connected yet: uid → start time.
    pub starting: Mutex<HashMap<String, Instant>>,
    /// VMIs whose deletion shutdown was asked: uid → when.
    pub stopping: Mutex<HashMap<String, Instant>>,
    /// Wakes the sync loop early: a VMI of this node changed, or a launcher came up.
    pub wake: Arc<tokio::sync::Notify>,
    /// Instances (VMI uids) migrating away: the migration task writes their status, the
    /// sync loop leaves them alone. Kept after success: they are no longer this node's.
    pub migrating: Mutex<std::collections::HashSet<String>>,
    /// Instances (VMI uids) migrating here: their incoming domain is not swept away.
    pub incoming: Mutex<std::collections::HashSet<String>>,
    /// Migrations this node takes part in, by migration uid.
    pub migrations: Mutex<migrate::Tasks>,
    /// Where a block migration's unix sockets live ([`migrate::migration_socket_dir`]).
    pub migration_dir: PathBuf,
    /// Container disks pulled from registries, one per manifest digest.
    pub disks: crate::registry::Cache,
    /// Instances whose disks failed to prepare: uid → (next try, tries so far).
    pub prepare_retry: Mutex<HashMap<String, (Instant, u32)>>,
    /// Probes and guest-agent credentials of running instances, by VMI uid.
    pub guest: Mutex<guest::GuestWorks>,
    /// Wakes the DataVolume filler: an instance waits for a disk.
    pub wake_fills: tokio::sync::Notify,
    /// Held while a push backup (a snapshot's copy or a backup's) starts and runs: each
    /// first aborts a job an earlier life of this agent left on the domain, which must
    /// never be the other task's.
    pub push_jobs: tokio::sync::Mutex<()>,
    /// Backup folders being read (a verification, a restore) against one being merged away
    /// (a deleted backup, whose children are rebased meanwhile): readers share it, a merge
    /// waits for them and holds it alone.
    pub backup_chains: tokio::sync::RwLock<()>,
}

impl Agent {
    pub fn launchers_dir(&self) -> PathBuf {
        self.cfg.data_dir.join("run/launchers")
    }
    pub fn run_dir(&self, vmi_uid: &str) -> PathBuf {
        vmi_run_dir(&self.cfg.data_dir, vmi_uid)
    }
    pub fn images_dir(&self) -> PathBuf {
        self.cfg.data_dir.join("images")
    }
    pub fn volumes_dir(&self, owner_uid: &str) -> PathBuf {
        self.cfg.data_dir.join("volumes").join(owner_uid)
    }
    pub fn log_dir(&self) -> PathBuf {
        self.cfg.data_dir.join("log")
    }
}

pub use crate::rules::paths::vmi_run_dir;

fn container_disks_dir(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("images/registry")
}

/// Run the agent until cancelled. Never stops a VM on the way out.
pub async fn run(cfg: Config, cancel: CancellationToken) -> anyhow::Result<()> {
    let uri = cfg.libvirt_uri.clone();
    let hv: Arc<dyn Hypervisor> = Arc::new(
        tokio::task::spawn_blocking(move || crate::virt::libvirt::Libvirt::open(&uri))
            .await?
            .with_context(|| format!("connecting to libvirt at {}", cfg.libvirt_uri))?,
    );
    let api = match &cfg.cert_pin {
        Some(pin) => Client::pinned(&cfg.controller_url, &cfg.token, pin)?.for_agent(),
        None => Client::new(
            &cfg.controller_url,
            &cfg.token,
            cfg.ca_file.as_deref(),
            false,
        )?
        .for_agent(),
    };
    let info = loop {
        match api.get("/apis/edgevirt.io/v1/info").await {
            Ok(v) => break v,
            Err(e) if crate::client::is_status(&e, reqwest::StatusCode::UNAUTHORIZED) => {
                anyhow::bail!(
                    "the controller at {} does not accept this node's credential (was the node \
                     deleted?): remove {} and join again with a new token",
                    cfg.controller_url,
                    join::credential_path(&cfg.data_dir).display()
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "controller not reachable yet; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        }
    };
    check_controller(&info)?;
    let install_id = info["installId"].as_str().unwrap_or_default().to_string();
    // The cluster's default guest CPU, for VMIs the scheduler did not annotate.
    if let Some(m) = info["cpuModel"].as_str() {
        crate::cpu::policy::set_cluster_default(m);
    }
    let hv2 = hv.clone();
    let facts = tokio::task::spawn_blocking(move || hv2.host_facts()).await??;
    for d in [
        "run/launchers",
        "run/vmi",
        "images",
        "volumes",
        "datavolumes",
        "log",
    ] {
        std::fs::create_dir_all(cfg.data_dir.join(d))?;
    }
    let choice = accel::choose(
        &cfg.accel,
        &facts.domain_types,
        hv.clone(),
        &cfg.data_dir.join("run"),
    )
    .await?;
    tracing::info!(accel = %choice.accel, reason = %choice.reason, "accelerator chosen");
    let accel = choice.accel.clone();
    if let Some((name, path)) = &cfg.shared_pool {
        anyhow::ensure!(
            path.is_dir(),
            "shared pool {name}: {} is not a folder (is the shared filesystem mounted?)",
            path.display()
        );
    }
    let wake = Arc::new(tokio::sync::Notify::new());
    let agent = Arc::new(Agent {
        cfg: cfg.clone(),
        cp: Arc::new(ports::Http(api.clone())),
        api,
        hv,
        accel: accel.clone(),
        accel_reason: choice.reason.clone(),
        install_id,
        launchers: Arc::new(launchers::Sockets::new(cfg.clone(), wake.clone())),
        starting: Mutex::new(HashMap::new()),
        stopping: Mutex::new(HashMap::new()),
        wake,
        migrating: Mutex::new(Default::default()),
        incoming: Mutex::new(Default::default()),
        migrations: Mutex::new(Default::default()),
        migration_dir: migrate::migration_socket_dir(),
        disks: crate::registry::Cache::new(
            container_disks_dir(&cfg.data_dir),
            cfg.registry_mirrors.clone(),
        ),
        prepare_retry: Default::default(),
        guest: Default::default(),
        wake_fills: Default::default(),
        push_jobs: Default::default(),
        backup_chains: Default::default(),
    });
    prepare::ensure_network(&agent).await?;
    register(&agent, &facts).await?;
    agent.launchers.adopt_all().await;
    // This node's VMIs, and every migration (few; each names its nodes in its status).
    let vmis = format!(
        "/apis/kubevirt.io/v1/virtualmachineinstances?watch=true&timeoutSeconds=600&fieldSelector=status.nodeName%3D{}",
        cfg.node_name
    );
    tokio::spawn(watch(agent.clone(), cancel.clone(), vmis));
    tokio::spawn(watch(
        agent.clone(),
        cancel.clone(),
        "/apis/kubevirt.io/v1/virtualmachineinstancemigrations?watch=true&timeoutSeconds=600"
            .into(),
    ));
    tokio::spawn(console::run(agent.clone(), cancel.clone()));
    tokio::spawn(datavolume::run(agent.clone(), cancel.clone()));
    tokio::spawn(snapshot::run(agent.clone(), cancel.clone()));
    tokio::spawn(backup::run(agent.clone(), cancel.clone()));
    tokio::spawn(stats::run(agent.clone(), cancel.clone()));
    tracing::info!(node = %cfg.node_name, %accel, "agent started");
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_beat = Instant::now();
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => {
                tracing::info!("agent stopping; running VMs and their launchers stay up");
                return Ok(());
            }
            _ = tick.tick() => {}
            _ = agent.wake.notified() => {}
        }
        n += 1;
        if last_beat.elapsed() >= Duration::from_secs(10) {
            last_beat = Instant::now();
            match heartbeat(&agent).await {
                Err(e) if crate::client::is_status(&e, reqwest::StatusCode::UNAUTHORIZED) => {
                    anyhow::bail!(
                        "the controller no longer accepts this node's credential (the node was \
                         deleted?); the agent stops, running VMs stay up"
                    );
                }
                Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
                Ok(()) => {}
            }
        }
        if n.is_multiple_of(60) {
            sync::collect_container_disks(&agent).await;
        }
        if let Err(e) = sync::sync_all(&agent, n.is_multiple_of(5)).await {
            tracing::warn!(error = %e, "sync failed");
        }
        if let Err(e) = migrate::sync(&agent).await {
            tracing::warn!(error = %e, "syncing migrations failed");
        }
    }
}

/// Make sure an imported image is present in this node's images folder; its local path.
pub async fn local_image(agent: &Agent, name: &str) -> anyhow::Result<(PathBuf, String)> {
    let img = agent
        .cp
        .get_image(name)
        .await
        .with_context(|| format!("looking up image {name:?}"))?;
    let st = img.status.context("image has no file")?;
    let file = st.file.as_str();
    if file.is_empty() {
        anyhow::bail!("image has no file");
    }
    if file.contains('/') || file.starts_with('.') {
        anyhow::bail!("image {name:?} has an invalid file name");
    }
    let format = if st.format.is_empty() {
        "raw".to_string()
    } else {
        st.format.clone()
    };
    let path = agent.images_dir().join(file);
    if !path.exists() {
        let tmp = agent.images_dir().join(format!(".download-{file}"));
        let resp = agent
            .api
            .request(
                reqwest::Method::GET,
                &format!("/apis/edgevirt.io/v1/images/{name}/data"),
            )
            .send()
            .await?
            .error_for_status()?;
        // Stream to disk: images can be far larger than memory.
        let mut file = tokio::fs::File::create(&tmp).await?;
        let mut body = resp.bytes_stream();
        while let Some(chunk) = futures::StreamExt::next(&mut body).await {
            tokio::io::AsyncWriteExt::write_all(&mut file, &chunk?).await?;
        }
        file.sync_all().await?;
        tokio::fs::rename(&tmp, &path).await?;
        tracing::info!(image = %name, "fetched image from the controller");
    }
    Ok((path, format))
}

/// Run a host tool (`qemu-img`, `genisoimage`); its error output when it fails.
pub async fn run_tool<S: AsRef<std::ffi::OsStr>>(cmd: &str, args: &[S]) -> anyhow::Result<()> {
    let out = tokio::process::Command::new(cmd)
        .args(args)
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("running {cmd}: {e}"))?;
    if !out.status.success() {
        let what = args
            .first()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .unwrap_or_default();
        anyhow::bail!(
            "{cmd} {what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Follow one of the controller's watches and wake the sync loop on each change, so new
/// instances start and migrations move on without waiting for the next tick. Reconnects
/// when it ends.
async fn watch(agent: Arc<Agent>, cancel: CancellationToken, path: String) {
    use futures::StreamExt;
    loop {
        if let Ok(resp) = agent.api.request(reqwest::Method::GET, &path).send().await
            && resp.status().is_success()
        {
            let mut body = resp.bytes_stream();
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    chunk = body.next() => match chunk {
                        Some(Ok(_)) => agent.wake.notify_one(),
                        _ => break,
                    },
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Refuse a controller outside the agent protocol window (release-1 controllers did not say
/// theirs: they speak 1.0).
pub fn check_controller(info: &serde_json::Value) -> anyhow::Result<()> {
    use crate::version::{AGENT_PROTOCOL, Protocol};
    let theirs: Protocol = info["agentProtocol"]
        .as_str()
        .unwrap_or("1.0")
        .parse()
        .map_err(|e: String| anyhow::anyhow!("the controller's info: {e}"))?;
    AGENT_PROTOCOL
        .check(
            &format!(
                "the controller ({})",
                info["version"].as_str().unwrap_or("unknown release")
            ),
            theirs,
        )
        .map_err(|e| anyhow::anyhow!("{e} (this agent is {})", crate::version::RELEASE))
}

fn agent_ready() -> Condition {
    Condition::new(ConditionType::Ready, true, "AgentReady", "")
}

async fn register(agent: &Agent, facts: &crate::hypervisor::HostFacts) -> anyhow::Result<()> {
    let cfg = &agent.cfg;
    let stored = match agent.cp.get_node(&cfg.node_name).await? {
        Some(v) => match Stored::<Node>::decode(v.clone()) {
            Ok(s) => s,
            Err(e) => {
                // Registration rewrites the status anyway: keep the metadata as stored.
                tracing::warn!(error = %e, "the stored node does not decode; registering anew");
                let mut raw = v;
                if let Some(m) = raw.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                    m.remove("resourceVersion");
                }
                if let Some(o) = raw.as_object_mut() {
                    o.remove("status");
                }
                Stored {
                    raw,
                    obj: Node::new(&cfg.node_name, NodeSpec::default()),
                }
            }
        },
        None => {
            let obj = Node::new(&cfg.node_name, NodeSpec::default());
            Stored {
                raw: obj.to_value(),
                obj,
            }
        }
    };
    let mut node = stored.obj.clone();
    node.metadata.resource_version = None;
    let (hv, accel) = (agent.hv.clone(), agent.accel.clone());
    let cpu = tokio::task::spawn_blocking(move || crate::cpu::node_facts(&*hv, &accel)).await?;
    node.status = Some(NodeStatus {
        cpu,
        memory_bytes: facts.memory_bytes,
        accelerator: agent.accel.clone(),
        accelerator_reason: Some(agent.accel_reason.clone()),
        version: crate::version::RELEASE.into(),
        libvirt_version: Some(facts.libvirt_version.clone()),
        shared_pool: cfg.shared_pool.as_ref().map(|(name, path)| SharedPool {
            name: name.clone(),
            path: path.to_string_lossy().into_owned(),
        }),
        backup_targets: cfg
            .backup_targets
            .iter()
            .map(|(name, path)| SharedPool {
                name: name.clone(),
                path: path.to_string_lossy().into_owned(),
            })
            .collect(),
        host_disk_dir: cfg
            .host_disk_dir
            .as_ref()
            .map(|d| d.to_string_lossy().into_owned()),
        bridges: crate::hostnet::bridges(),
        storage: storage_facts(cfg),
        last_heartbeat_time: Some(now()),
        conditions: vec![agent_ready()],
    });
    let body = stored.changed(&node);
    agent.cp.put_node(&cfg.node_name, body).await
}

async fn heartbeat(agent: &Agent) -> anyhow::Result<()> {
    let name = &agent.cfg.node_name;
    let cur = agent
        .cp
        .get_node(name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("node {name} is gone"))?;
    let node = Node::from_value(cur)?;
    let ready = node
        .status
        .as_ref()
        .is_some_and(|st| condition_true(&st.conditions, &ConditionType::Ready));
    let mut status = serde_json::Map::new();
    status.insert("lastHeartbeatTime".into(), json!(now()));
    // A bridge the operator made or removed since registration shows at the next beat.
    let bridges = crate::hostnet::bridges();
    if node.status.as_ref().map(|s| &s.bridges) != Some(&bridges) {
        status.insert("bridges".into(), json!(bridges));
    }
    if !ready {
        status.insert("conditions".into(), json!([agent_ready()]));
    }
    status.insert("storage".into(), json!(storage_facts(&agent.cfg)));
    agent
        .cp
        .patch_node_status(name, json!({ "status": status }))
        .await
}

/// The size and free space of the data folder and of the shared pool, if any.
fn storage_facts(cfg: &Config) -> Vec<crate::types::edgevirt::StorageFacts> {
    let mut places = vec![("local".to_string(), cfg.data_dir.clone())];
    if let Some((name, path)) = &cfg.shared_pool {
        places.push((name.clone(), path.clone()));
    }
    for (name, path) in &cfg.backup_targets {
        places.push((format!("backup:{name}"), path.clone()));
    }
    places
        .into_iter()
        .filter_map(|(name, path)| {
            let fs = nix::sys::statvfs::statvfs(&path).ok()?;
            let block = fs.fragment_size();
            Some(crate::types::edgevirt::StorageFacts {
                name,
                path: path.to_string_lossy().into_owned(),
                capacity_bytes: fs.blocks() * block,
                free_bytes: fs.blocks_available() * block,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn controller_skew_window() {
        use crate::version::AGENT_PROTOCOL as P;
        // A release-1 controller says no protocol: 1.0.
        let r1 = super::check_controller(&json!({"version": "0.1.0"}));
        assert_eq!(r1.is_ok(), P.major == 1 && P.minor <= 1);
        let ok = json!({"version": "x", "agentProtocol": format!("{}.{}", P.major, P.minor + 1)});
        assert!(super::check_controller(&ok).is_ok());
        let far =
            json!({"version": "7.0.0", "agentProtocol": format!("{}.{}", P.major + 1, P.minor)});
        let e = super::check_controller(&far).unwrap_err().to_string();
        assert!(
            e.contains("7.0.0")
                && e.contains(&P.to_string())
                && e.contains(crate::version::RELEASE),
            "{e}"
        );
    }
}
