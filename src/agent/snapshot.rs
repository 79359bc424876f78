//! Snapshots and restores, the node's part: copying a VM's disks into a snapshot content,
//! removing them when the content goes, and putting them back for a restore.
//!
//! A content's copies live in `DATA/snapshots/<content uid>/<n>.qcow2` (`n`: the volume's
//! place in the content's `volumeBackups`), so no path comes from a name a user typed. A
//! copy is written under `DATA/snapshots/.part-<content uid>/` and renamed into place when
//! every disk is whole: a crash leaves only a `.part-` folder, which the next round removes
//! and nothing ever reads.
//!
//! - A running guest: its filesystems are frozen through the guest agent (when it answers),
//!   libvirt starts a push-mode backup of the volumes' disks (QEMU copies each disk as it was
//!   at that instant, copying blocks aside before the guest overwrites them), and the guest
//!   is thawed as soon as the backup has started, a few milliseconds later; the copy runs on
//!   while the guest does. The guest is thawed on every path out, errors included.
//! - A stopped VM: `qemu-img convert` of each disk.
//! - A restore (its VM stopped): each copy is converted into a temporary file beside the
//!   DataVolume's disk and renamed over it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::Agent;
use super::ports::{Stored, decode_items};
use crate::hypervisor::{DomainState, Job};
use crate::types::snapshot::{
    COPY_MS_ANNOTATION, FILES_FINALIZER, FROZEN_MS_ANNOTATION, INDICATIONS_ANNOTATION,
    NODE_ANNOTATION, RESTORE_ERROR_ANNOTATION, RESTORED_ANNOTATION, SnapshotError,
    VirtualMachineRestore, VirtualMachineSnapshot, VirtualMachineSnapshotContent,
    VirtualMachineSnapshotContentStatus, VolumeSnapshotStatus, indication,
};
use crate::types::{Kind, Meta, now};

/// Where this node keeps snapshot copies.
pub fn snapshots_dir(agent: &Agent) -> PathBuf {
    agent.cfg.data_dir.join("snapshots")
}

/// Copy, remove and restore, every few seconds, until cancelled.
pub async fn run(agent: Arc<Agent>, cancel: CancellationToken) {
    let mut thawed_at_start = false;
    let mut frozen = HashSet::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
        if !thawed_at_start {
            thawed_at_start = thaw_leftovers(&agent).await;
        }
        if let Err(e) = freezes(&agent, &mut frozen).await {
            tracing::debug!(error = %e, "freeze round failed; trying again");
        }
        if let Err(e) = round(&agent).await {
            tracing::debug!(error = %e, "snapshot round failed; trying again");
        }
    }
}

async fn round(agent: &Agent) -> anyhow::Result<()> {
    let here = agent.cfg.node_name.as_str();
    let contents: Vec<Stored<VirtualMachineSnapshotContent>> = decode_items(
        agent
            .cp
            .list_of(Kind::VirtualMachineSnapshotContent)
            .await?,
    );
    let mine: Vec<&Stored<VirtualMachineSnapshotContent>> = contents
        .iter()
        .filter(|c| c.obj.annotation(NODE_ANNOTATION) == Some(here))
        .collect();
    sweep(agent, &mine).await;
    for c in &mine {
        let o = &c.obj;
        if o.deleting() {
            if o.has_finalizer(FILES_FINALIZER) {
                remove_copies(agent, o).await?;
            }
            continue;
        }
        let st = o.status.clone().unwrap_or_default();
        if st.ready_to_use == Some(true) || st.error.is_some() {
            continue;
        }
        capture_content(agent, o).await?;
    }
    let restores: Vec<Stored<VirtualMachineRestore>> =
        decode_items(agent.cp.list_of(Kind::VirtualMachineRestore).await?);
    for r in &restores {
        let o = &r.obj;
        if o.annotation(NODE_ANNOTATION) != Some(here)
            || o.deleting()
            || o.annotation(RESTORE_ERROR_ANNOTATION).is_some()
            || o.status.as_ref().is_some_and(|s| {
                s.complete == Some(true)
                    || s.conditions
                        .iter()
                        .any(|c| c.type_ == "Failure" && c.status == "True")
            })
        {
            continue;
        }
        let Some(content) = content_of_restore(agent, o, &contents).await? else {
            continue;
        };
        if o.annotation(RESTORED_ANNOTATION) == Some(content.uid()) {
            continue;
        }
        let (ns, name) = (o.namespace(), o.name());
        let outcome = restore_disks(agent, o, content).await;
        let patch = match &outcome {
            Ok(()) => {
                tracing::info!(namespace = %ns, restore = %name, "put the snapshot's disks back");
                json!({"metadata": {"annotations": {RESTORED_ANNOTATION: content.uid()}}})
            }
            Err(e) => {
                tracing::warn!(namespace = %ns, restore = %name, error = %format!("{e:#}"), "restoring the disks failed");
                json!({"metadata": {"annotations": {RESTORE_ERROR_ANNOTATION: format!("{e:#}")}}})
            }
        };
        agent
            .cp
            .patch_of(Kind::VirtualMachineRestore, ns, name, patch, false)
            .await?;
    }
    Ok(())
}

/// The content a restore puts back (through its snapshot), if it is ready.
async fn content_of_restore<'a>(
    agent: &Agent,
    r: &VirtualMachineRestore,
    contents: &'a [Stored<VirtualMachineSnapshotContent>],
) -> anyhow::Result<Option<&'a VirtualMachineSnapshotContent>> {
    let snaps: Vec<Stored<VirtualMachineSnapshot>> =
        decode_items(agent.cp.list_of(Kind::VirtualMachineSnapshot).await?);
    let Some(cname) = snaps
        .iter()
        .find(|s| {
            s.obj.namespace() == r.namespace()
                && s.obj.name() == r.spec.virtual_machine_snapshot_name
        })
        .and_then(|s| s.obj.status.as_ref())
        .and_then(|s| s.virtual_machine_snapshot_content_name.clone())
    else {
        return Ok(None);
    };
    Ok(contents
        .iter()
        .map(|c| &c.obj)
        .find(|c| c.namespace() == r.namespace() && c.name() == cname)
        .filter(|c| c.status.as_ref().and_then(|s| s.ready_to_use) == Some(true)))
}

/// Remove the copies of a deleted content, then its finalizer.
async fn remove_copies(agent: &Agent, c: &VirtualMachineSnapshotContent) -> anyhow::Result<()> {
    let dir = snapshots_dir(agent).join(c.uid());
    match tokio::fs::remove_dir_all(&dir).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context(format!("removing {}", dir.display())),
    }
    let _ = tokio::fs::remove_dir_all(part_dir(agent, c.uid())).await;
    let rest: Vec<&String> = c
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != FILES_FINALIZER)
        .collect();
    tracing::info!(namespace = %c.namespace(), content = %c.name(), "removed the copies of a deleted snapshot");
    agent
        .cp
        .patch_of(
            Kind::VirtualMachineSnapshotContent,
            c.namespace(),
            c.name(),
            json!({"metadata": {"finalizers": rest}}),
            false,
        )
        .await?;
    Ok(())
}

/// Remove half-written copies (this task copies one content at a time, so any `.part-`
/// folder seen between copies is a crash's) and the folders of contents that are gone.
async fn sweep(agent: &Agent, mine: &[&Stored<VirtualMachineSnapshotContent>]) {
    let Ok(mut entries) = tokio::fs::read_dir(snapshots_dir(agent)).await else {
        return;
    };
    while let Ok(Some(e)) = entries.next_entry().await {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(".part-") || !mine.iter().any(|c| c.obj.uid() == name) {
            tracing::info!(folder = %name, "removing a stale snapshot folder");
            let _ = tokio::fs::remove_dir_all(e.path()).await;
        }
    }
}

fn part_dir(agent: &Agent, uid: &str) -> PathBuf {
    snapshots_dir(agent).join(format!(".part-{uid}"))
}

/// The disk of a claim on this node: a DataVolume's, or an operator's disk on the shared
/// pool; with its format.
pub(super) async fn disk_of(
    agent: &Agent,
    ns: &str,
    claim: &str,
) -> anyhow::Result<(PathBuf, String)> {
    if let Some((path, _)) = super::datavolume::disk(agent, ns, claim).await? {
        return Ok((path, "qcow2".into()));
    }
    super::prepare::claim_disk(agent, ns, claim).await
}

/// Copy a content's disks, then record the outcome in its status.
async fn capture_content(agent: &Agent, c: &VirtualMachineSnapshotContent) -> anyhow::Result<()> {
    let (ns, name, uid) = (c.namespace(), c.name(), c.uid().to_string());
    let t0 = Instant::now();
    let outcome = capture(agent, c).await;
    let copy_ms = t0.elapsed().as_millis();
    let mut status = VirtualMachineSnapshotContentStatus::default();
    match outcome {
        Ok((indications, frozen_ms)) => {
            let mut annotations = json!({
                INDICATIONS_ANNOTATION: indications.join(","),
                COPY_MS_ANNOTATION: copy_ms.to_string(),
            });
            if let Some(ms) = frozen_ms {
                annotations[FROZEN_MS_ANNOTATION] = json!(ms.to_string());
            }
            agent
                .cp
                .patch_of(
                    Kind::VirtualMachineSnapshotContent,
                    ns,
                    name,
                    json!({"metadata": {"annotations": annotations}}),
                    false,
                )
                .await?;
            let t = now();
            status.ready_to_use = Some(true);
            status.creation_time = Some(t.clone());
            status.volume_snapshot_status = c
                .spec
                .volume_backups
                .iter()
                .map(|b| VolumeSnapshotStatus {
                    volume_snapshot_name: b.volume_snapshot_name.clone().unwrap_or_default(),
                    creation_time: Some(t.clone()),
                    ready_to_use: Some(true),
                    error: None,
                })
                .collect();
            tracing::info!(namespace = %ns, content = %name, indications = ?indications, frozen_ms = ?frozen_ms, copy_ms, "snapshot copies taken");
        }
        Err(e) => {
            let _ = tokio::fs::remove_dir_all(part_dir(agent, &uid)).await;
            tracing::warn!(namespace = %ns, content = %name, error = %format!("{e:#}"), "snapshot failed");
            status.ready_to_use = Some(false);
            status.error = Some(SnapshotError::now(format!("{e:#}")));
        }
    }
    agent
        .cp
        .patch_of(
            Kind::VirtualMachineSnapshotContent,
            ns,
            name,
            json!({"status": status}),
            true,
        )
        .await?;
    Ok(())
}

/// Copy the disks into the content's folder: the indications and, when the guest agent
/// froze the filesystems, for how long (ms).
async fn capture(
    agent: &Agent,
    c: &VirtualMachineSnapshotContent,
) -> anyhow::Result<(Vec<String>, Option<u128>)> {
    let vm = c
        .spec
        .source
        .virtual_machine
        .as_ref()
        .ok_or_else(|| anyhow!("the content names no VirtualMachine"))?;
    let ns = c.namespace();
    let vm_name = vm["metadata"]["name"].as_str().unwrap_or_default();
    let part = part_dir(agent, c.uid());
    let _ = tokio::fs::remove_dir_all(&part).await;
    tokio::fs::create_dir_all(&part)
        .await
        .with_context(|| format!("creating {}", part.display()))?;
    let result = match live_domain(agent, ns, vm_name).await? {
        Some((dom, state)) => capture_live(agent, c, &dom, state, &part).await?,
        _ => {
            for (i, b) in c.spec.volume_backups.iter().enumerate() {
                let (src, format) = disk_of(agent, ns, b.claim()).await?;
                convert(&src, &format, &part.join(format!("{i}.qcow2")), "qcow2").await?;
            }
            (vec![], None)
        }
    };
    sync_dir(&part).await?;
    let dir = snapshots_dir(agent).join(c.uid());
    tokio::fs::rename(&part, &dir)
        .await
        .with_context(|| format!("renaming {} to {}", part.display(), dir.display()))?;
    Ok(result)
}

/// The VM's running (or paused) domain on this node, with its state: `None` when the VM
/// does not run here.
pub(super) async fn live_domain(
    agent: &Agent,
    ns: &str,
    vm: &str,
) -> anyhow::Result<Option<(String, DomainState)>> {
    let here = agent.cfg.node_name.as_str();
    let Some(dom) = agent
        .cp
        .get_vmi(ns, vm)
        .await?
        .map(|v| v.obj)
        .filter(|v| v.node_name() == Some(here) && !v.deleting())
        .and_then(|v| v.status.and_then(|s| s.domain_name))
    else {
        return Ok(None);
    };
    let (hv, d) = (agent.hv.clone(), dom.clone());
    let state = tokio::task::spawn_blocking(move || hv.state(&d)).await??;
    Ok(state
        .filter(|s| matches!(s, DomainState::Running | DomainState::Paused))
        .map(|s| (dom, s)))
}

/// A guest-agent command; `Err` when no agent answers.
pub(super) async fn guest_agent(agent: &Agent, dom: &str, cmd: &str) -> Result<String, String> {
    let (hv, dom, cmd) = (agent.hv.clone(), dom.to_string(), cmd.to_string());
    match tokio::task::spawn_blocking(move || hv.agent_command(&dom, &cmd, 10)).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

pub(super) async fn thaw(agent: &Agent, dom: &str) {
    if let Err(e) = guest_agent(agent, dom, r#"{"execute":"guest-fsfreeze-thaw"}"#).await {
        tracing::warn!(domain = %dom, error = %e, "thawing the guest's filesystems failed");
    }
}

/// The push-mode backup of a running (or paused) guest's volumes.
async fn capture_live(
    agent: &Agent,
    c: &VirtualMachineSnapshotContent,
    dom: &str,
    state: DomainState,
    part: &Path,
) -> anyhow::Result<(Vec<String>, Option<u128>)> {
    let xml = {
        let (hv, d) = (agent.hv.clone(), dom.to_string());
        tokio::task::spawn_blocking(move || hv.xml(&d)).await??
    };
    let disks = crate::hypervisor::all_domain_disks(&xml);
    let mut wanted = vec![];
    for (i, b) in c.spec.volume_backups.iter().enumerate() {
        let alias = format!("ua-{}", b.volume_name);
        let d = disks.iter().find(|d| d.alias == alias).ok_or_else(|| {
            anyhow!(
                "volume {:?} is not a disk of the running guest",
                b.volume_name
            )
        })?;
        wanted.push((d.target.clone(), part.join(format!("{i}.qcow2"))));
    }
    let mut backup = String::from("<domainbackup mode='push'><disks>");
    for d in &disks {
        match wanted.iter().find(|(t, _)| *t == d.target) {
            Some((t, file)) => backup.push_str(&format!(
                "<disk name='{}' backup='yes' type='file'><target file='{}'/><driver type='qcow2'/></disk>",
                quick_xml::escape::escape(t.as_str()),
                quick_xml::escape::escape(file.to_string_lossy().as_ref())
            )),
            None if !d.file.is_empty() && !d.readonly => {
                backup.push_str(&format!(
                    "<disk name='{}' backup='no'/>",
                    quick_xml::escape::escape(d.target.as_str())
                ))
            }
            None => {}
        }
    }
    backup.push_str("</disks></domainbackup>");
    let _one_job = agent.push_jobs.lock().await;
    abort_leftover_job(agent, dom).await;
    let mut indications = vec![indication::ONLINE.to_string()];
    let mut frozen = None;
    if state == DomainState::Paused {
        indications.push(indication::PAUSED.into());
    } else {
        let t0 = Instant::now();
        match guest_agent(agent, dom, r#"{"execute":"guest-fsfreeze-freeze"}"#).await {
            Ok(_) => frozen = Some(t0),
            Err(e) => {
                tracing::info!(domain = %dom, reason = %e, "no guest agent froze the filesystems: the snapshot is crash-consistent");
                indications.push(indication::NO_GUEST_AGENT.into());
            }
        }
    }
    let begun = {
        let (hv, d, x) = (agent.hv.clone(), dom.to_string(), backup.clone());
        tokio::task::spawn_blocking(move || hv.backup_begin(&d, &x, None, false)).await
    };
    let mut frozen_ms = None;
    if let Some(t0) = frozen {
        thaw(agent, dom).await;
        frozen_ms = Some(t0.elapsed().as_millis());
        indications.push(indication::GUEST_AGENT.into());
    }
    begun?.map_err(|e| anyhow!("starting the backup: {e}"))?;
    let files: Vec<&Path> = wanted.iter().map(|(_, f)| f.as_path()).collect();
    while poll_backup(agent, dom, &files).await?.is_some() {}
    Ok((indications, frozen_ms))
}

/// Abort a push backup left running on the domain by an earlier life of this agent (it
/// holds the domain's job), and wait up to 5 s for it to end.
pub(super) async fn abort_leftover_job(agent: &Agent, dom: &str) {
    if let Ok(Job::Running { .. }) = job(agent, dom).await {
        let (hv, d) = (agent.hv.clone(), dom.to_string());
        let _ = tokio::task::spawn_blocking(move || hv.abort_job(&d)).await;
        for _ in 0..50 {
            if !matches!(job(agent, dom).await, Ok(Job::Running { .. })) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Wait 20 ms, then read the domain's push backup: `Some((bytes copied, total))` while it
/// runs, `None` once it ended well. When libvirt keeps no record of how it ended, it ended
/// well only if every one of `files` was written.
pub(super) async fn poll_backup(
    agent: &Agent,
    dom: &str,
    files: &[&Path],
) -> anyhow::Result<Option<(u64, u64)>> {
    // A local libvirt call: polling often costs little and ends the copy sooner.
    tokio::join!(
        tokio::time::sleep(Duration::from_millis(10)),
        start_writeback(files)
    );
    match job(agent, dom).await? {
        Job::Running { processed, total } => Ok(Some((processed, total))),
        Job::Completed => Ok(None),
        Job::Failed(why) => bail!("copying the disks failed: {why}"),
        Job::None => {
            for file in files {
                if !file.is_file() {
                    bail!("the backup ended without writing {}", file.display());
                }
            }
            Ok(None)
        }
    }
}

/// Start writing to disk what QEMU has copied into `files` so far, without waiting for it.
/// The host would otherwise hold all of it in its page cache (a GiB is far below the
/// kernel's background threshold) until the flush at the end, which then writes it all
/// while the backup waits; this way the disk writes while QEMU copies.
async fn start_writeback(files: &[&Path]) {
    let files: Vec<PathBuf> = files.iter().map(|f| f.to_path_buf()).collect();
    let _ = tokio::task::spawn_blocking(move || {
        for f in files {
            let Ok(file) = std::fs::File::open(&f) else {
                continue;
            };
            // SAFETY: a plain system call on a descriptor that `file` keeps open; offset 0
            // and length 0 mean the whole file, and WRITE only starts the writes.
            unsafe {
                libc::sync_file_range(
                    std::os::fd::AsRawFd::as_raw_fd(&file),
                    0,
                    0,
                    libc::SYNC_FILE_RANGE_WRITE,
                )
            };
        }
    })
    .await;
}

async fn job(agent: &Agent, dom: &str) -> anyhow::Result<Job> {
    let (hv, d) = (agent.hv.clone(), dom.to_string());
    Ok(tokio::task::spawn_blocking(move || hv.job(&d)).await??)
}

/// `qemu-img convert` from `src` to `dst`, flushed to disk.
pub(super) async fn convert(
    src: &Path,
    src_format: &str,
    dst: &Path,
    dst_format: &str,
) -> anyhow::Result<()> {
    let out = tokio::process::Command::new("qemu-img")
        .args(["convert", "-q", "-f", src_format, "-O", dst_format])
        .arg(src)
        .arg(dst)
        .output()
        .await
        .context("running qemu-img")?;
    if !out.status.success() {
        bail!(
            "qemu-img convert {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let f = tokio::fs::File::open(dst).await?;
    f.sync_all().await?;
    Ok(())
}

async fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    let mut entries = tokio::fs::read_dir(dir).await?;
    while let Some(e) = entries.next_entry().await? {
        tokio::fs::File::open(e.path()).await?.sync_all().await?;
    }
    Ok(())
}

/// Put a content's copies back into the restore's VM's disks (the VM is stopped).
async fn restore_disks(
    agent: &Agent,
    r: &VirtualMachineRestore,
    c: &VirtualMachineSnapshotContent,
) -> anyhow::Result<()> {
    let ns = r.namespace();
    if agent.cp.get_vmi(ns, &r.spec.target.name).await?.is_some() {
        bail!("VirtualMachine {ns}/{} runs again", r.spec.target.name);
    }
    let dir = snapshots_dir(agent).join(c.uid());
    for (i, b) in c.spec.volume_backups.iter().enumerate() {
        let src = dir.join(format!("{i}.qcow2"));
        if !src.is_file() {
            bail!(
                "the copy of volume {:?} is missing on node {} ({})",
                b.volume_name,
                agent.cfg.node_name,
                src.display()
            );
        }
        let (dst, format) = disk_of(agent, ns, b.claim()).await?;
        let file = dst
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dst.with_file_name(format!(".restore-{file}"));
        convert(&src, "qcow2", &tmp, &format).await?;
        tokio::fs::rename(&tmp, &dst)
            .await
            .with_context(|| format!("renaming {} to {}", tmp.display(), dst.display()))?;
    }
    Ok(())
}

/// The `freeze` and `unfreeze` subresources: freeze the guests whose VMI asks for it (until
/// its time), thaw those that no longer do, and say so in `status.fsFreezeStatus`.
/// `frozen`: the VMI uids this agent froze.
async fn freezes(agent: &Agent, frozen: &mut HashSet<String>) -> anyhow::Result<()> {
    use crate::types::annotations::FREEZE_ANNOTATION;
    let vmis = agent.cp.vmis_of(&agent.cfg.node_name).await?.items;
    frozen.retain(|uid| vmis.iter().any(|v| v.obj.uid() == uid));
    for v in &vmis {
        let v = &v.obj;
        let (ns, name, uid) = (v.namespace(), v.name(), v.uid());
        let Some(dom) = v.status.as_ref().and_then(|s| s.domain_name.clone()) else {
            continue;
        };
        let until = v.annotation(FREEZE_ANNOTATION);
        let expired = until.is_some_and(|u| {
            chrono::DateTime::parse_from_rfc3339(u).is_ok_and(|t| t < chrono::Utc::now())
        });
        let want = until.is_some() && !expired;
        let shown = v
            .status
            .as_ref()
            .and_then(|s| s.fs_freeze_status.as_deref())
            == Some("frozen");
        if want && !frozen.contains(uid) && shown {
            // Frozen before this agent (re)started.
            frozen.insert(uid.to_string());
        } else if want && !frozen.contains(uid) {
            match guest_agent(agent, &dom, r#"{"execute":"guest-fsfreeze-freeze"}"#).await {
                Ok(_) => {
                    tracing::info!(namespace = %ns, vmi = %name, until = ?until, "froze the guest's filesystems");
                    frozen.insert(uid.to_string());
                }
                Err(e) => {
                    tracing::warn!(namespace = %ns, vmi = %name, error = %e, "cannot freeze the guest's filesystems");
                    continue;
                }
            }
        } else if !want && (frozen.remove(uid) || shown) {
            thaw(agent, &dom).await;
            tracing::info!(namespace = %ns, vmi = %name, timed_out = expired, "thawed the guest's filesystems");
        }
        if expired {
            agent
                .cp
                .patch_vmi(
                    ns,
                    name,
                    json!({"metadata": {"annotations": {FREEZE_ANNOTATION: null}}}),
                )
                .await?;
        }
        let now_frozen = frozen.contains(uid);
        if now_frozen != shown {
            let st = if now_frozen {
                json!("frozen")
            } else {
                Value::Null
            };
            agent
                .cp
                .patch_vmi_status(ns, name, json!({"status": {"fsFreezeStatus": st}}))
                .await?;
        }
    }
    Ok(())
}

/// After an agent restart: thaw the guests of this node whose filesystems are frozen (a
/// snapshot interrupted between freeze and thaw), unless a user froze them through the
/// `freeze` subresource. `true` once the node's guests were looked at.
async fn thaw_leftovers(agent: &Agent) -> bool {
    let Ok(vmis) = agent.cp.vmis_of(&agent.cfg.node_name).await else {
        return false;
    };
    for v in vmis.items {
        let v = v.obj;
        if v.annotation(crate::types::annotations::FREEZE_ANNOTATION)
            .is_some()
        {
            continue;
        }
        let Some(dom) = v.status.as_ref().and_then(|s| s.domain_name.clone()) else {
            continue;
        };
        if let Ok(s) = guest_agent(agent, &dom, r#"{"execute":"guest-fsfreeze-status"}"#).await
            && s.contains("\"frozen\"")
        {
            tracing::warn!(namespace = %v.namespace(), vmi = %v.name(), "a guest was left frozen (an interrupted snapshot): thawing it");
            thaw(agent, &dom).await;
        }
    }
    true
}
