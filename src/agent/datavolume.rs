//! DataVolumes, the node's part. A DataVolume the scheduler bound to this node (its first
//! consumer was placed here) is filled by a task of its own ([`run`]), so that a long
//! download never holds up the sync loop: blank (`qemu-img create`), a registry image (the
//! node's image cache, then converted), an HTTP download (streamed, with its progress in the
//! DataVolume's status), or a clone of another DataVolume on this node. The disk is written
//! under a temporary name and renamed when whole, so a crash leaves no half disk under the
//! real name; a failed fill removes what it wrote, says why in the status, and is tried
//! again later (`restartCount`), as CDI's importer pods are.
//!
//! An instance using a DataVolume waits (it stays `Scheduled`) until its disk is there,
//! then uses that file directly: the disk is the DataVolume's, kept across restarts, and
//! goes only when the DataVolume is deleted.
//!
//! A DataVolume on a shared pool has its disk at `POOL/NAMESPACE/NAME.qcow2`, where the
//! operator's own claim disks live too. So that edgevirt never overwrites or removes one of
//! those, each disk it makes has a marker beside it, `.NAME.UID.edgevirt-dv`, written before
//! the fill: a fill refuses a disk without a marker, replaces one whose markers are all
//! stale (their DataVolumes are gone), and the sweep removes a disk only when all its
//! markers are stale.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use super::Agent;
use super::ports::Stored;
use crate::registry::{DockerConfig, PullPolicy};
use crate::types::Meta;
use crate::types::cdi::{
    DataVolume, DataVolumeCondition, DataVolumeStatus, Fill, MAX_BYTES, NODE_ANNOTATION,
    UPLOAD_IMAGE_ANNOTATION, phase,
};

/// Why an instance cannot start yet: its DataVolume is still being filled (not a failure).
#[derive(Debug, thiserror::Error)]
#[error("DataVolume {0} is not filled yet ({1})")]
pub struct NotFilled(pub String, pub String);

/// Where the disk of the DataVolume with `uid` lives on this node.
pub fn disk_path(agent: &Agent, uid: &str) -> PathBuf {
    agent
        .cfg
        .data_dir
        .join("datavolumes")
        .join(format!("{uid}.qcow2"))
}

/// The suffix of the markers beside the disks edgevirt made on a shared pool.
const MARKER_SUFFIX: &str = ".edgevirt-dv";

/// Where a DataVolume's files are, as seen from this node.
#[derive(Debug)]
enum Location {
    /// The node's own disk (`DATA/datavolumes/UID.qcow2`).
    Local { disk: PathBuf, dir: PathBuf },
    /// The shared pool (`POOL/NS/NAME.qcow2`, its marker beside it).
    Pool {
        disk: PathBuf,
        dir: PathBuf,
        marker: PathBuf,
    },
}

impl Location {
    fn of(agent: &Agent, dv: &DataVolume) -> anyhow::Result<Location> {
        let Some(pool) = dv.spec.shared_pool() else {
            return Ok(Location::Local {
                disk: disk_path(agent, dv.uid()),
                dir: agent.cfg.data_dir.join("datavolumes"),
            });
        };
        let (ns, name) = (dv.namespace(), dv.name());
        match &agent.cfg.shared_pool {
            Some((p, root)) if p == pool => {
                crate::types::check_name("namespace", ns)?;
                crate::types::check_name("name", name)?;
                let dir = root.join(ns);
                Ok(Location::Pool {
                    disk: dir.join(format!("{name}.qcow2")),
                    marker: dir.join(format!(".{name}.{}{MARKER_SUFFIX}", dv.uid())),
                    dir,
                })
            }
            other => bail!(
                "DataVolume {ns}/{name} lives on shared pool {pool:?}; node {} mounts {}",
                agent.cfg.node_name,
                other
                    .as_ref()
                    .map_or("no shared pool".to_string(), |(p, _)| format!("pool {p:?}"))
            ),
        }
    }

    fn disk(&self) -> &Path {
        match self {
            Location::Local { disk, .. } | Location::Pool { disk, .. } => disk,
        }
    }

    fn dir(&self) -> &Path {
        match self {
            Location::Local { dir, .. } | Location::Pool { dir, .. } => dir,
        }
    }

    fn shared(&self) -> bool {
        matches!(self, Location::Pool { .. })
    }

    /// Whether the disk is whole: renamed into place (and, on the pool, made for this
    /// DataVolume, not a stale one of the same name).
    fn filled(&self) -> bool {
        match self {
            Location::Local { disk, .. } => disk.is_file(),
            Location::Pool { disk, marker, .. } => marker.is_file() && disk.is_file(),
        }
    }
}

/// A marker's DataVolume name and uid, from its file name.
fn parse_marker(file: &str) -> Option<(&str, &str)> {
    file.strip_prefix('.')?
        .strip_suffix(MARKER_SUFFIX)?
        .rsplit_once('.')
}

/// A marker in a pool folder: its DataVolume's name and uid (from the file name), and the
/// install id of the appliance that wrote it (from its content, `NS/NAME UID INSTALL`;
/// markers written before the install id was recorded have none and count as this one's).
#[derive(Debug, PartialEq)]
struct Marker {
    name: String,
    uid: String,
    install: Option<String>,
}

impl Marker {
    /// Whether this appliance wrote it: a marker of another appliance sharing the pool
    /// folder is never acted on.
    fn ours(&self, install: &str) -> bool {
        self.install.as_deref().is_none_or(|i| i == install)
    }
}

/// The markers in the pool folder `dir` (none when it does not exist). A marker removed
/// while the folder is read is left out.
async fn markers_in(dir: &Path) -> anyhow::Result<Vec<Marker>> {
    let mut out = Vec::new();
    let mut entries = match tokio::fs::read_dir(dir).await {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e.into()),
    };
    while let Some(e) = entries.next_entry().await? {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some((name, uid)) = parse_marker(&file) else {
            continue;
        };
        let Ok(content) = tokio::fs::read_to_string(e.path()).await else {
            continue;
        };
        out.push(Marker {
            name: name.to_string(),
            uid: uid.to_string(),
            install: content.split_whitespace().nth(2).map(str::to_string),
        });
    }
    Ok(out)
}

/// Before a fill on the pool: make the DataVolume the owner of `NAME.qcow2` by writing its
/// marker, which names this appliance (`install`). A disk there without any marker is the
/// operator's and is refused, as is one another appliance sharing the folder made; one
/// whose markers all belong to DataVolumes of this appliance that are gone is removed
/// first.
async fn take_pool_disk(dv: &DataVolume, loc: &Location, install: &str) -> anyhow::Result<()> {
    let Location::Pool { disk, dir, marker } = loc else {
        return Ok(());
    };
    let (ns, name) = (dv.namespace(), dv.name());
    tokio::fs::create_dir_all(dir).await?;
    let raw = dir.join(format!("{name}.raw"));
    if raw.exists() {
        bail!(
            "{} is there and edgevirt did not make it (a claim disk the operator put on the \
             shared pool?): it is never overwritten; remove it or give the DataVolume another name",
            raw.display()
        );
    }
    if disk.exists() && !marker.exists() {
        let others: Vec<Marker> = markers_in(dir)
            .await?
            .into_iter()
            .filter(|m| m.name == name)
            .collect();
        if let Some(m) = others.iter().find(|m| !m.ours(install)) {
            bail!(
                "{} was made by another edgevirt appliance (install {}) that shares this pool \
                 folder: it is never overwritten; give the DataVolume another name",
                disk.display(),
                m.install.as_deref().unwrap_or_default()
            );
        }
        if others.is_empty() {
            bail!(
                "{} is there and edgevirt did not make it (a claim disk the operator put on \
                 the shared pool?): it is never overwritten; remove it or give the DataVolume \
                 another name",
                disk.display()
            );
        }
        // Another uid under the same name: a DataVolume deleted and made again (only one
        // of that name exists at a time), whose disk the sweep has not removed yet.
        tokio::fs::remove_file(disk).await?;
        for m in others {
            let _ =
                tokio::fs::remove_file(dir.join(format!(".{name}.{}{MARKER_SUFFIX}", m.uid))).await;
        }
        tracing::info!(namespace = %ns, datavolume = %name, "replaced the stale disk of an earlier DataVolume of the same name on the shared pool");
    }
    tokio::fs::write(marker, format!("{ns}/{name} {} {install}\n", dv.uid())).await?;
    Ok(())
}

/// The disk of the DataVolume `name` in `ns` for an instance on this node, and whether it
/// is on the shared pool: `Ok(None)` when no DataVolume has that name (it names an
/// imported image), [`NotFilled`] while it fills.
pub async fn disk(agent: &Agent, ns: &str, name: &str) -> anyhow::Result<Option<(PathBuf, bool)>> {
    let Some(dv) = agent.cp.get_data_volume(ns, name).await? else {
        return Ok(None);
    };
    let dv = dv.obj;
    let here = agent.cfg.node_name.as_str();
    match dv.annotation(NODE_ANNOTATION) {
        // On the pool the node only fills it; any node mounting the pool uses it.
        Some(_) if dv.spec.shared_pool().is_some() => {}
        Some(n) if n == here => {}
        Some(other) => bail!("DataVolume {ns}/{name} lives on node {other}, not on {here}"),
        None => return Err(NotFilled(format!("{ns}/{name}"), "not bound yet".into()).into()),
    }
    let loc = Location::of(agent, &dv)?;
    if loc.filled() {
        return Ok(Some((loc.disk().to_path_buf(), loc.shared())));
    }
    agent.wake_fills.notify_one();
    let st = dv.status.unwrap_or_default();
    let said = match st.phase.as_deref() {
        Some(phase::FAILED) => format!(
            "failed: {}",
            running_message(&st).unwrap_or_else(|| "see its status".into())
        ),
        Some(p) => p.to_string(),
        None => "pending".into(),
    };
    Err(NotFilled(format!("{ns}/{name}"), said.trim().to_string()).into())
}

fn running_message(st: &DataVolumeStatus) -> Option<String> {
    st.conditions
        .iter()
        .find(|c| c.type_ == "Running")
        .and_then(|c| c.message.clone())
}

/// Fill the DataVolumes bound to this node whose disks are missing, one at a time, and
/// remove the disks of DataVolumes that are gone.
pub async fn run(agent: Arc<Agent>, cancel: CancellationToken) {
    let mut next_try: HashMap<String, Instant> = HashMap::new();
    let mut sizes: HashMap<String, u64> = HashMap::new();
    let mut last_collect = Instant::now();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = agent.wake_fills.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        let Ok(dvs) = agent.cp.data_volumes().await else {
            continue;
        };
        let here = agent.cfg.node_name.clone();
        for dv in &dvs {
            let d = &dv.obj;
            if d.annotation(NODE_ANNOTATION) != Some(here.as_str())
                || d.deleting()
                || Location::of(&agent, d).is_ok_and(|l| l.filled())
                || next_try.get(d.uid()).is_some_and(|t| Instant::now() < *t)
                || (d.spec.fill(d.namespace()) == Some(Fill::Upload)
                    && d.annotation(UPLOAD_IMAGE_ANNOTATION).is_none())
            {
                continue;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = fill(&agent, dv) => if r.is_err() {
                    let restarts = d.status.as_ref().and_then(|s| s.restart_count).unwrap_or(0);
                    let wait = Duration::from_secs(10 << restarts.clamp(0, 5));
                    next_try.insert(d.uid().to_string(), Instant::now() + wait);
                } else {
                    agent.wake.notify_one();
                },
            }
        }
        grow(&agent, &dvs, &mut sizes).await;
        if last_collect.elapsed() > Duration::from_secs(30) {
            last_collect = Instant::now();
            collect(&agent, &dvs).await;
        }
    }
}

/// Grow the disks of this node's DataVolumes whose size was raised (the API lets a
/// DataVolume's size only grow): a disk that a guest running here uses through libvirt,
/// which tells the guest at once; any other with `qemu-img resize`. `sizes` remembers
/// each disk's size, so a disk is inspected once, not every round.
async fn grow(agent: &Agent, dvs: &[Stored<DataVolume>], sizes: &mut HashMap<String, u64>) {
    let here = agent.cfg.node_name.as_str();
    sizes.retain(|uid, _| dvs.iter().any(|d| d.obj.uid() == uid));
    let mut running: Option<Vec<Stored<crate::types::VirtualMachineInstance>>> = None;
    for dv in dvs {
        let d = &dv.obj;
        let Some(want) = d.spec.size() else { continue };
        if d.annotation(NODE_ANNOTATION) != Some(here)
            || d.deleting()
            || sizes.get(d.uid()).is_some_and(|s| *s >= want)
        {
            continue;
        }
        let Ok(loc) = Location::of(agent, d) else {
            continue;
        };
        if !loc.filled() {
            continue;
        }
        let path = loc.disk().to_path_buf();
        let have = match crate::virt::image::inspect(&path, Some("qcow2")).await {
            Ok((_, v)) => v,
            Err(e) => {
                tracing::warn!(datavolume = %d.name(), error = %e, "cannot read the DataVolume's disk size");
                continue;
            }
        };
        if have >= want {
            sizes.insert(d.uid().to_string(), have);
            continue;
        }
        // A guest here using it: its domain grows the disk.
        if running.is_none() {
            running = agent.cp.vmis_of(here).await.ok().map(|l| l.items);
        }
        let user = running.iter().flatten().find_map(|vmi| {
            let v = &vmi.obj;
            let uses = v.namespace() == d.namespace()
                && v.spec
                    .volumes
                    .iter()
                    .any(|vol| vol.data_volume.as_ref().is_some_and(|s| s.name == d.name()));
            let dom = v.status.as_ref().and_then(|s| s.domain_name.clone());
            uses.then_some(dom).flatten()
        });
        let how = match &user {
            Some(dom) => {
                let (hv, dom, p) = (
                    agent.hv.clone(),
                    dom.clone(),
                    path.to_string_lossy().into_owned(),
                );
                match tokio::task::spawn_blocking(move || hv.block_resize(&dom, &p, want)).await {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
            None => tokio::process::Command::new("qemu-img")
                .args(["resize", "-f", "qcow2"])
                .arg(&path)
                .arg(want.to_string())
                .output()
                .await
                .map_err(|e| e.to_string())
                .and_then(|o| {
                    if o.status.success() {
                        Ok(())
                    } else {
                        Err(String::from_utf8_lossy(&o.stderr).trim().to_string())
                    }
                }),
        };
        match how {
            Ok(()) => {
                tracing::info!(namespace = %d.namespace(), datavolume = %d.name(), from = have, to = want, domain = ?user, "grew the DataVolume's disk");
                sizes.insert(d.uid().to_string(), want);
            }
            // Tried again next round (a domain that just stopped, say).
            Err(e) => {
                tracing::warn!(namespace = %d.namespace(), datavolume = %d.name(), error = %e, "cannot grow the DataVolume's disk")
            }
        }
    }
}

/// Remove the disks (and half-written files) of DataVolumes that no longer exist.
async fn collect(agent: &Agent, dvs: &[Stored<DataVolume>]) {
    let live: HashSet<&str> = dvs.iter().map(|d| d.obj.uid()).collect();
    if let Some((_, root)) = &agent.cfg.shared_pool {
        sweep_pool(agent, root, &live).await;
    }
    let dir = agent.cfg.data_dir.join("datavolumes");
    let Ok(mut entries) = tokio::fs::read_dir(&dir).await else {
        return;
    };
    while let Ok(Some(e)) = entries.next_entry().await {
        let name = e.file_name().to_string_lossy().into_owned();
        let uid = name.trim_start_matches('.').split('.').next().unwrap_or("");
        if !uid.is_empty() && !live.contains(uid) {
            match tokio::fs::remove_file(e.path()).await {
                Ok(()) => {
                    tracing::info!(file = %e.path().display(), "removed the disk of a deleted DataVolume")
                }
                Err(err) => {
                    tracing::warn!(file = %e.path().display(), error = %err, "cannot remove the disk of a deleted DataVolume")
                }
            }
        }
    }
}

/// On the shared pool: remove the disks whose markers all belong to DataVolumes of this
/// appliance that are gone, with those markers and half-written files. A disk without a
/// marker is never touched, nor a marker another appliance sharing the folder wrote. Every
/// node mounting the pool sweeps; a file another one removed first is fine.
async fn sweep_pool(agent: &Agent, root: &Path, live: &HashSet<&str>) {
    let Ok(mut namespaces) = tokio::fs::read_dir(root).await else {
        return;
    };
    while let Ok(Some(n)) = namespaces.next_entry().await {
        let ns = n.file_name().to_string_lossy().into_owned();
        let dir = n.path();
        if crate::types::check_name("namespace", &ns).is_err() || !dir.is_dir() {
            continue;
        }
        let Ok(markers) = markers_in(&dir).await else {
            continue;
        };
        let install = agent.install_id.as_str();
        for Marker { name, uid, .. } in markers.iter().filter(|m| m.ours(install)) {
            if live.contains(uid.as_str()) {
                continue;
            }
            // Listed before the folder was read: look again, in case it was made since.
            match agent.cp.get_data_volume(&ns, name).await {
                Ok(Some(d)) if d.obj.uid() == uid => continue,
                Ok(_) => {}
                Err(_) => continue,
            }
            // The disk stays while a live DataVolume, or another appliance, marks it too.
            let shared_with_live = markers
                .iter()
                .any(|m| &m.name == name && (live.contains(m.uid.as_str()) || !m.ours(install)));
            let mut gone = vec![
                dir.join(format!(".{name}.{uid}.filling")),
                dir.join(format!(".{name}.{uid}.download")),
            ];
            if !shared_with_live {
                gone.push(dir.join(format!("{name}.qcow2")));
            }
            gone.push(dir.join(format!(".{name}.{uid}{MARKER_SUFFIX}")));
            for f in gone {
                match tokio::fs::remove_file(&f).await {
                    Ok(()) => {
                        tracing::info!(file = %f.display(), "removed a file of a deleted DataVolume from the shared pool")
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        tracing::warn!(file = %f.display(), error = %e, "cannot remove a file of a deleted DataVolume from the shared pool")
                    }
                }
            }
        }
    }
}

fn condition(t: &str, ok: bool, reason: &str, message: &str) -> DataVolumeCondition {
    DataVolumeCondition {
        type_: t.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: Some(reason.into()),
        message: (!message.is_empty()).then(|| message.to_string()),
        last_transition_time: Some(crate::types::now()),
        last_heartbeat_time: Some(crate::types::now()),
    }
}

/// Write a DataVolume's status; a failure to write is logged, never fatal to the fill.
async fn set_status(agent: &Agent, dv: &DataVolume, st: &DataVolumeStatus) {
    let patch = json!({ "status": st });
    if let Err(e) = agent
        .cp
        .patch_data_volume_status(dv.namespace(), dv.name(), patch)
        .await
    {
        tracing::warn!(datavolume = %dv.name(), error = %e, "cannot write the DataVolume's status");
    }
}

/// Fill one DataVolume's disk.
async fn fill(agent: &Agent, stored: &Stored<DataVolume>) -> anyhow::Result<()> {
    let dv = &stored.obj;
    let (ns, name) = (dv.namespace(), dv.name());
    let restarts = dv
        .status
        .as_ref()
        .and_then(|s| s.restart_count)
        .unwrap_or(0);
    let how = dv
        .spec
        .fill(ns)
        .context("the DataVolume has no usable source")?;
    let running_phase = match how {
        Fill::Clone(..) => phase::CLONE_IN_PROGRESS,
        _ => phase::IMPORT_IN_PROGRESS,
    };
    let base = DataVolumeStatus {
        phase: Some(running_phase.into()),
        progress: Some("0.00%".into()),
        restart_count: Some(restarts),
        claim_name: Some(name.to_string()),
        conditions: vec![
            condition("Bound", true, "Bound", ""),
            condition("Ready", false, "TransferRunning", ""),
            condition("Running", true, "Pod is running", ""),
        ],
    };
    set_status(agent, dv, &base).await;
    tracing::info!(namespace = %ns, datavolume = %name, source = ?how, "filling DataVolume");
    let started = Instant::now();
    let r = match Location::of(agent, dv) {
        Ok(loc) => match take_pool_disk(dv, &loc, &agent.install_id).await {
            Ok(()) => Ok(loc),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    let loc = match r {
        Ok(loc) => loc,
        Err(e) => return failed(agent, dv, &base, restarts, e).await,
    };
    let dir = loc.dir().to_path_buf();
    tokio::fs::create_dir_all(&dir).await?;
    let path = loc.disk().to_path_buf();
    // Temporary names the sweep of either kind of storage recognises.
    let stem = match &loc {
        Location::Local { .. } => dv.uid().to_string(),
        Location::Pool { .. } => format!("{name}.{}", dv.uid()),
    };
    let tmp = dir.join(format!(".{stem}.filling"));
    let download = dir.join(format!(".{stem}.download"));
    // A conversion's percentage goes into the status every few seconds.
    let (progress, mut seen) = tokio::sync::watch::channel(0.0);
    let r = tokio::select! {
        r = write_disk(agent, dv, &how, &tmp, &download, &base, &progress) => r,
        () = report_progress(agent, dv, &base, &mut seen) => unreachable!("it reports until the fill ends"),
    };
    let _ = tokio::fs::remove_file(&download).await;
    let r = match r {
        Ok(()) => tokio::fs::rename(&tmp, &path).await.map_err(Into::into),
        Err(e) => Err(e),
    };
    match r {
        Ok(()) => {
            tracing::info!(namespace = %ns, datavolume = %name, secs = started.elapsed().as_secs_f64(), "DataVolume filled");
            let st = DataVolumeStatus {
                phase: Some(phase::SUCCEEDED.into()),
                progress: Some("100.0%".into()),
                conditions: vec![
                    condition("Bound", true, "Bound", ""),
                    condition("Ready", true, "", ""),
                    condition("Running", false, "Completed", ""),
                ],
                ..base
            };
            set_status(agent, dv, &st).await;
            Ok(())
        }
        Err(e) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            failed(agent, dv, &base, restarts, e).await
        }
    }
}

/// A fill failed: say why in the status, count the try, and hand the error back.
async fn failed(
    agent: &Agent,
    dv: &DataVolume,
    base: &DataVolumeStatus,
    restarts: i32,
    e: anyhow::Error,
) -> anyhow::Result<()> {
    let msg = format!("{e:#}");
    tracing::warn!(namespace = %dv.namespace(), datavolume = %dv.name(), error = %msg, "filling DataVolume failed; trying again later");
    let st = DataVolumeStatus {
        phase: Some(phase::FAILED.into()),
        progress: Some("N/A".into()),
        restart_count: Some(restarts.saturating_add(1)),
        conditions: vec![
            condition("Bound", true, "Bound", ""),
            condition("Ready", false, "Error", ""),
            condition("Running", false, "Error", &msg),
        ],
        ..base.clone()
    };
    set_status(agent, dv, &st).await;
    Err(e)
}

async fn write_disk(
    agent: &Agent,
    dv: &DataVolume,
    how: &Fill,
    tmp: &Path,
    download: &Path,
    base: &DataVolumeStatus,
    progress: &Progress,
) -> anyhow::Result<()> {
    let size = dv
        .spec
        .size()
        .context("the DataVolume asks for no storage size")?;
    let prealloc = dv.spec.preallocation == Some(true);
    let _ = tokio::fs::remove_file(tmp).await;
    match how {
        Fill::Blank => {
            let mut args = vec![
                "create".to_string(),
                "-q".into(),
                "-f".into(),
                "qcow2".into(),
            ];
            if prealloc {
                args.extend(["-o".into(), "preallocation=falloc".into()]);
            }
            args.extend([tmp.to_string_lossy().into_owned(), size.to_string()]);
            super::run_tool("qemu-img", &args).await
        }
        Fill::Registry(image) => {
            let disk = agent
                .disks
                .pull(image, PullPolicy::IfNotPresent, &DockerConfig::default())
                .await?;
            convert(
                &disk.path,
                &disk.format,
                tmp,
                size,
                prealloc,
                Some(progress),
            )
            .await
        }
        Fill::Http(url) => {
            http_download(agent, dv, url, download, size, base).await?;
            let format = sniff(download).await?;
            // The download reported its own progress.
            convert(download, format, tmp, size, prealloc, None).await
        }
        Fill::Upload => {
            let image = dv.annotation(UPLOAD_IMAGE_ANNOTATION).context(
                "nothing uploaded yet: send the disk image with `edgevirt image upload`",
            )?;
            // Fetched from the controller once (on an all-in-one host it is the
            // controller's own file: never removed here).
            let (path, format) = super::local_image(agent, image).await?;
            convert(&path, &format, tmp, size, prealloc, Some(progress)).await
        }
        Fill::Backup(backup, volume) => {
            // A chain of qcow2 files whose backing files the verification checked against
            // the manifest: read whole, as the guest saw the disk, while no deleted backup
            // of it is merged away.
            let _reading = agent.backup_chains.read().await;
            let (top, virtual_size) =
                super::backup_files::restore_source(agent, dv.namespace(), backup, volume).await?;
            write_image(
                &top,
                "qcow2",
                virtual_size,
                tmp,
                size,
                prealloc,
                Some(progress),
            )
            .await
        }
        Fill::Clone(sns, sname) => {
            let src = agent
                .cp
                .get_data_volume(sns, sname)
                .await?
                .with_context(|| format!("the source DataVolume {sns}/{sname} does not exist"))?
                .obj;
            let here = agent.cfg.node_name.as_str();
            match src.annotation(NODE_ANNOTATION) {
                Some(_) if src.spec.shared_pool().is_some() => {}
                Some(n) if n == here => {}
                Some(n) => bail!(
                    "the source DataVolume {sns}/{sname} lives on node {n}; cloning across \
                     nodes is not supported yet"
                ),
                None => bail!("the source DataVolume {sns}/{sname} has not been filled yet"),
            }
            let from = Location::of(agent, &src)?;
            if !from.filled() {
                bail!("the source DataVolume {sns}/{sname} has not been filled yet");
            }
            convert(from.disk(), "qcow2", tmp, size, prealloc, Some(progress)).await
        }
    }
}

/// A disk file's format by its first bytes: qcow2's magic, else raw. Compressed files are
/// refused by name; nothing else is ever probed.
async fn sniff(path: &Path) -> anyhow::Result<&'static str> {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 6];
    let mut f = tokio::fs::File::open(path).await?;
    let n = f.read(&mut head).await?;
    let head = &head[..n];
    if head.starts_with(b"QFI\xfb") {
        Ok("qcow2")
    } else if head.starts_with(&[0x1f, 0x8b]) || head.starts_with(b"\xfd7zXZ\x00") {
        bail!("the download is compressed (gzip or xz); serve the disk image uncompressed")
    } else {
        Ok("raw")
    }
}

/// `qemu-img convert` of a checked image into a qcow2 of `size` bytes: refused when the
/// image is larger than that, grown to it when smaller.
async fn convert(
    from: &Path,
    format: &str,
    tmp: &Path,
    size: u64,
    prealloc: bool,
    progress: Option<&Progress>,
) -> anyhow::Result<()> {
    let (format, virtual_size) = crate::virt::image::inspect(from, Some(format))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    write_image(from, &format, virtual_size, tmp, size, prealloc, progress).await
}

/// Write the image `from` (of `virtual_size` bytes) into `tmp` as qcow2 of `size` bytes.
async fn write_image(
    from: &Path,
    format: &str,
    virtual_size: u64,
    tmp: &Path,
    size: u64,
    prealloc: bool,
    progress: Option<&Progress>,
) -> anyhow::Result<()> {
    if virtual_size > size {
        bail!(
            "the image's virtual size ({virtual_size} bytes) is larger than the storage the \
             DataVolume asks for ({size} bytes)"
        );
    }
    let mut args: Vec<String> = vec!["convert".into(), "-p".into(), "-f".into(), format.into()];
    args.extend(["-O".into(), "qcow2".into()]);
    if prealloc {
        args.extend(["-o".into(), "preallocation=falloc".into()]);
    }
    args.push(from.to_string_lossy().into_owned());
    args.push(tmp.to_string_lossy().into_owned());
    convert_with_progress(&args, progress).await?;
    if virtual_size < size {
        super::run_tool(
            "qemu-img",
            &[
                "resize".into(),
                "-q".into(),
                "-f".into(),
                "qcow2".into(),
                tmp.to_string_lossy().into_owned(),
                size.to_string(),
            ],
        )
        .await?;
    }
    Ok(())
}

/// The percentage of a conversion under way.
type Progress = tokio::sync::watch::Sender<f64>;

/// Write each new percentage into the DataVolume's status, at most every two seconds;
/// never returns (the fill it reports on ends it).
async fn report_progress(
    agent: &Agent,
    dv: &DataVolume,
    base: &DataVolumeStatus,
    seen: &mut tokio::sync::watch::Receiver<f64>,
) {
    while seen.changed().await.is_ok() {
        let pct = *seen.borrow_and_update();
        let st = DataVolumeStatus {
            progress: Some(format!("{pct:.2}%")),
            ..base.clone()
        };
        set_status(agent, dv, &st).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    std::future::pending().await
}

/// Run `qemu-img` with `args` (a `convert -p`), handing each percentage it prints to
/// `progress`.
async fn convert_with_progress(args: &[String], progress: Option<&Progress>) -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt;
    let mut child = tokio::process::Command::new("qemu-img")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("running qemu-img")?;
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let read_out = async {
        let Some(out) = out.as_mut() else { return };
        let (mut buf, mut pending) = ([0u8; 512], String::new());
        while let Ok(n @ 1..) = out.read(&mut buf).await {
            pending.push_str(&String::from_utf8_lossy(&buf[..n]));
            if let Some(end) = pending.rfind('\r') {
                if let (Some(p), Some(tx)) = (last_percentage(&pending[..end]), progress) {
                    tx.send_replace(p);
                }
                pending.drain(..=end);
            }
        }
    };
    let read_err = async {
        let mut s = String::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_string(&mut s).await;
        }
        s
    };
    let ((), stderr, status) = tokio::join!(read_out, read_err, child.wait());
    if !status.context("running qemu-img")?.success() {
        bail!("qemu-img convert failed: {}", stderr.trim());
    }
    if let Some(tx) = progress {
        tx.send_replace(100.0);
    }
    Ok(())
}

/// The last percentage in what `qemu-img convert -p` printed: `    (12.34/100%)` parts,
/// each ended by a carriage return.
fn last_percentage(printed: &str) -> Option<f64> {
    printed.rsplit('\r').find_map(|part| {
        let p = part.trim().strip_prefix('(')?.strip_suffix("/100%)")?;
        p.parse().ok().filter(|p: &f64| (0.0..=100.0).contains(p))
    })
}

/// Download `url` into `to`, writing the progress into the DataVolume's status every few
/// seconds. The download may be at most the requested size plus a little (a qcow2's
/// metadata): a server cannot fill the node's disk.
async fn http_download(
    agent: &Agent,
    dv: &DataVolume,
    url: &str,
    to: &Path,
    size: u64,
    base: &DataVolumeStatus,
) -> anyhow::Result<()> {
    let limit = size
        .saturating_add(size / 10)
        .saturating_add(64 << 20)
        .min(MAX_BYTES);
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(60))
        .build()?;
    let resp = client
        .get(url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    if !resp.status().is_success() {
        bail!("GET {url}: the server answered {}", resp.status());
    }
    let total = resp.content_length();
    if total.is_some_and(|t| t > limit) {
        bail!(
            "GET {url}: {} bytes is more than the DataVolume's storage ({size} bytes) can hold",
            total.unwrap_or(0)
        );
    }
    let mut file = tokio::fs::File::create(to).await?;
    let mut body = resp.bytes_stream();
    let mut got: u64 = 0;
    let mut reported = Instant::now();
    while let Some(chunk) = futures::StreamExt::next(&mut body).await {
        let chunk = chunk.with_context(|| format!("GET {url}"))?;
        got += chunk.len() as u64;
        if got > limit {
            bail!("GET {url}: the download is larger than the DataVolume's storage ({size} bytes)");
        }
        file.write_all(&chunk).await?;
        if let Some(t) = total.filter(|t| *t > 0)
            && reported.elapsed() > Duration::from_secs(2)
        {
            reported = Instant::now();
            let st = DataVolumeStatus {
                progress: Some(format!("{:.2}%", got as f64 * 100.0 / t as f64)),
                ..base.clone()
            };
            set_status(agent, dv, &st).await;
        }
    }
    file.sync_all().await?;
    if let Some(t) = total
        && got != t
    {
        bail!("GET {url}: the download ended after {got} of {t} bytes");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversions_percentage_is_read_from_what_qemu_img_prints() {
        assert_eq!(last_percentage("    (0.00/100%)"), Some(0.0));
        assert_eq!(
            last_percentage("    (0.00/100%)\r    (1.01/100%)\r    (37.50/100%)"),
            Some(37.5)
        );
        // A part cut off by the read is not a percentage; the one before it is.
        assert_eq!(last_percentage("    (12.00/100%)\r    (13."), Some(12.0));
        for not in [
            "",
            "\r",
            "    (abc/100%)",
            "    (150.00/100%)",
            "qemu-img: error",
        ] {
            assert_eq!(last_percentage(not), None, "{not:?}");
        }
    }

    /// A real `qemu-img convert -p`: the percentages reach 100 and the copy is whole.
    #[tokio::test]
    async fn a_conversion_reports_its_progress() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("a.raw"), dir.path().join("b.qcow2"));
        let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
        std::fs::write(&src, &data).unwrap();
        let (tx, mut rx) = tokio::sync::watch::channel(-1.0);
        write_image(&src, "raw", 4 << 20, &dst, 8 << 20, false, Some(&tx))
            .await
            .unwrap();
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), 100.0);
        let back = dir.path().join("c.raw");
        super::super::run_tool(
            "qemu-img",
            &[
                "convert",
                "-O",
                "raw",
                &dst.to_string_lossy(),
                &back.to_string_lossy(),
            ],
        )
        .await
        .unwrap();
        let back = std::fs::read(&back).unwrap();
        assert_eq!(back.len(), 8 << 20, "grown to the DataVolume's size");
        assert_eq!(&back[..4 << 20], &data[..]);
        // A source qemu-img cannot read: its message, and no 100%.
        let (tx, rx) = tokio::sync::watch::channel(-1.0);
        let e = write_image(
            &dir.path().join("none"),
            "raw",
            1,
            &dst,
            8 << 20,
            false,
            Some(&tx),
        )
        .await
        .unwrap_err();
        assert!(
            format!("{e:#}").contains("qemu-img convert failed"),
            "{e:#}"
        );
        assert!(*rx.borrow() < 100.0);
    }

    #[test]
    fn markers_name_their_datavolume_and_uid() {
        let uid = "0b7c2f1e-9a65-4c1d-8a5e-3f1b2c4d5e6f";
        assert_eq!(
            parse_marker(&format!(".a.b.{uid}{MARKER_SUFFIX}")),
            Some(("a.b", uid))
        );
        for not in [
            format!("a.{uid}{MARKER_SUFFIX}"),
            format!(".a.{uid}.filling"),
            "a.qcow2".to_string(),
            format!(".{uid}{MARKER_SUFFIX}"),
        ] {
            assert_eq!(parse_marker(&not), None, "{not}");
        }
    }

    /// Markers are read with the appliance that wrote them; one of another appliance is
    /// not this one's, a marker without an install id (an older release's) is.
    #[tokio::test]
    async fn markers_name_the_appliance_that_wrote_them() {
        let d = tempfile::tempdir().unwrap();
        for (f, content) in [
            (format!(".disk.u1{MARKER_SUFFIX}"), "default/disk u1 me\n"),
            (
                format!(".disk.u2{MARKER_SUFFIX}"),
                "default/disk u2 other\n",
            ),
            (format!(".old.u3{MARKER_SUFFIX}"), "default/old u3\n"),
            ("disk.qcow2".into(), ""),
            (".disk.u1.filling".into(), ""),
        ] {
            std::fs::write(d.path().join(f), content).unwrap();
        }
        let mut got = markers_in(d.path()).await.unwrap();
        got.sort_by(|a, b| a.uid.cmp(&b.uid));
        let seen: Vec<(&str, &str, bool)> = got
            .iter()
            .map(|m| (m.name.as_str(), m.uid.as_str(), m.ours("me")))
            .collect();
        assert_eq!(
            seen,
            [
                ("disk", "u1", true),
                ("disk", "u2", false),
                ("old", "u3", true)
            ]
        );
        assert!(markers_in(&d.path().join("none")).await.unwrap().is_empty());
    }

    /// A disk another appliance made on a shared pool folder is never taken over.
    #[tokio::test]
    async fn a_disk_of_another_appliance_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("default");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("disk.qcow2"), b"theirs").unwrap();
        std::fs::write(
            dir.join(format!(".disk.u9{MARKER_SUFFIX}")),
            "default/disk u9 other\n",
        )
        .unwrap();
        let dv: DataVolume = serde_json::from_value(serde_json::json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "disk", "namespace": "default", "uid": "u1"},
            "spec": {"source": {"blank": {}}}}))
        .unwrap();
        let loc = Location::Pool {
            disk: dir.join("disk.qcow2"),
            dir: dir.clone(),
            marker: dir.join(format!(".disk.u1{MARKER_SUFFIX}")),
        };
        let e = take_pool_disk(&dv, &loc, "me").await.unwrap_err();
        assert!(e.to_string().contains("another edgevirt appliance"), "{e}");
        assert_eq!(std::fs::read(dir.join("disk.qcow2")).unwrap(), b"theirs");
        // One of this appliance's own, from a DataVolume since deleted, is replaced.
        std::fs::write(
            dir.join(format!(".disk.u9{MARKER_SUFFIX}")),
            "default/disk u9 me\n",
        )
        .unwrap();
        take_pool_disk(&dv, &loc, "me").await.unwrap();
        assert!(!dir.join("disk.qcow2").exists());
        assert_eq!(
            std::fs::read_to_string(dir.join(format!(".disk.u1{MARKER_SUFFIX}"))).unwrap(),
            "default/disk u1 me\n"
        );
    }
}
