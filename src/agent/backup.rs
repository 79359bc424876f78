//! Backups, the node's part: copy a VM's disks into a backup target while the guest runs,
//! fully the first time and then only the blocks changed since the last backup.
//!
//! A target folder holds `NAMESPACE/VM/FOLDER/` per backup, `FOLDER` being
//! `<UTC time>-<backup uid>`: the disk files (`0.qcow2`, ...) and a `manifest.json` (the VM
//! and its DataVolumes as they were, each file's BLAKE3, the parent). A backup is written
//! into `.part-<uid>` and renamed once its files and manifest are on disk, so a folder
//! without a dot is whole, and only whole folders (with a manifest) are ever built on or
//! restored from.
//!
//! Incrementals: each live backup starts a libvirt checkpoint (`edgevirt-<backup uid>`, a
//! dirty bitmap in each disk), and the next backup copies only the blocks that bitmap marks.
//! Its disk files are qcow2 images whose backing file is the parent's (a path relative to
//! the folder), so the chain reads as whole disks wherever the target is mounted. Before a
//! backup, every checkpoint of the domain but the one of the last whole backup is deleted
//! (a leftover of a failed or killed backup merges into it), so no stray bitmap is ever
//! trusted; after a guest restart, libvirt forgets checkpoints, and the one of the last
//! backup is defined again from the manifest when its bitmaps are still whole in the disks,
//! else the backup is full.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Agent;
use super::backup_files::{
    folder_of, read_manifest, seal, subdirs, verify, virtual_size, vm_dir, whole_backups,
};
use super::ports::{Stored, decode_items};
use crate::hypervisor::DomainState;
use crate::types::backup::{
    FILES_FINALIZER, MANIFEST, Manifest, ManifestDisk, NODE_ANNOTATION, VERIFY_ANNOTATION,
    VirtualMachineBackup, VirtualMachineBackupStatus, backup_type, checkpoint_name, failed,
    folder_name, set as set_condition,
};
use crate::types::{Kind, Meta, now};

/// How often the targets are searched for half-written folders (and at the start).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Back up, every few seconds, until cancelled.
pub async fn run(agent: Arc<Agent>, cancel: CancellationToken) {
    let mut swept: Option<Instant> = None;
    let verifying = Arc::new(std::sync::Mutex::new(HashSet::new()));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
        let sweep_now = swept.is_none_or(|t| t.elapsed() >= SWEEP_EVERY);
        match round(&agent, sweep_now, &verifying).await {
            Ok(()) if sweep_now => swept = Some(Instant::now()),
            Ok(()) => {}
            Err(e) => tracing::debug!(error = %e, "backup round failed; trying again"),
        }
    }
}

/// The verifications (backup uid, the request's value) started, each in a task of its own:
/// one running or answered is not started again by a round that listed the backup before
/// the answer was written. One that failed to answer leaves, to be tried again; the others
/// leave with their backup.
type Verifying = Arc<std::sync::Mutex<HashSet<(String, String)>>>;

async fn round(agent: &Arc<Agent>, sweep_now: bool, verifying: &Verifying) -> anyhow::Result<()> {
    if agent.cfg.backup_targets.is_empty() {
        return Ok(());
    }
    let here = agent.cfg.node_name.as_str();
    let all: Vec<Stored<VirtualMachineBackup>> =
        decode_items(agent.cp.list_of(Kind::VirtualMachineBackup).await?);
    if sweep_now {
        sweep(agent, &all).await;
    }
    verifying
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(uid, _)| all.iter().any(|b| b.obj.uid() == uid));
    for b in &all {
        let o = &b.obj;
        if o.annotation(NODE_ANNOTATION) != Some(here) {
            continue;
        }
        if o.deleting() {
            if o.has_finalizer(FILES_FINALIZER) {
                remove_backup(agent, o).await?;
            }
            continue;
        }
        if o.finished() {
            if o.succeeded()
                && let Some(asked) = o.annotation(VERIFY_ANNOTATION)
                && o.status.as_ref().and_then(|s| s.verify_request.as_deref()) != Some(asked)
            {
                verify_aside(agent, o, asked, verifying);
            }
            continue;
        }
        back_up(agent, o).await?;
    }
    Ok(())
}

/// A deleted backup: merge its folder into the backups that build on it, remove it, then
/// let the object go.
async fn remove_backup(agent: &Agent, b: &VirtualMachineBackup) -> anyhow::Result<()> {
    let (ns, name) = (b.namespace(), b.name());
    if let Some((dir, folder)) = folder_of(agent, b)? {
        let _merging = agent.backup_chains.write().await;
        merge_away(&dir, &folder).await?;
        tracing::info!(namespace = %ns, backup = %name, folder = %folder, "removed a deleted backup's folder");
    }
    let rest: Vec<&String> = b
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != FILES_FINALIZER)
        .collect();
    agent
        .cp
        .patch_of(
            Kind::VirtualMachineBackup,
            ns,
            name,
            json!({"metadata": {"finalizers": rest}}),
            false,
        )
        .await?;
    Ok(())
}

/// Verify a backup in a task of its own (a chain of large disks takes minutes to re-read,
/// and backups go on meanwhile), unless its verification already runs.
fn verify_aside(agent: &Arc<Agent>, b: &VirtualMachineBackup, asked: &str, verifying: &Verifying) {
    let key = (b.uid().to_string(), asked.to_string());
    if !verifying
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key.clone())
    {
        return;
    }
    let (agent, b, verifying) = (agent.clone(), b.clone(), verifying.clone());
    tokio::spawn(async move {
        let r = {
            let _reading = agent.backup_chains.read().await;
            verify_on_request(&agent, &b).await
        };
        if let Err(e) = r {
            tracing::warn!(namespace = %b.namespace(), backup = %b.name(), error = %e, "answering a verification failed; trying again");
            verifying
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
        }
    });
}

/// A backup asked to be verified (its `edgevirt.io/verify` changed): re-read it and its
/// parents, and answer with the `Verified` condition.
async fn verify_on_request(agent: &Agent, b: &VirtualMachineBackup) -> anyhow::Result<()> {
    let (ns, name) = (b.namespace(), b.name());
    let asked = b
        .annotation(VERIFY_ANNOTATION)
        .unwrap_or_default()
        .to_string();
    let mut st = b.status.clone().unwrap_or_default();
    tracing::info!(namespace = %ns, backup = %name, "verifying a backup on request");
    let r = async {
        let (dir, folder) =
            folder_of(agent, b)?.ok_or_else(|| anyhow!("the backup records no folder"))?;
        verify(&dir.join(folder)).await
    }
    .await;
    // Whole, damaged (the problems found), or not checked at all (why).
    let (ok, reason, msg) = match r {
        Ok((m, chain, problems)) if problems.is_empty() => (
            true,
            "Verified",
            format!(
                "whole: the {} disk file(s) of this backup and of every parent in its chain \
                 of {chain} backup(s) match their manifests",
                m.disks.len()
            ),
        ),
        Ok((_, _, problems)) => (false, "Damaged", problems.join("; ")),
        Err(e) => (false, "VerifyFailed", format!("could not verify: {e:#}")),
    };
    tracing::info!(namespace = %ns, backup = %name, ok, result = %msg, "backup verified");
    set_condition(&mut st.conditions, "Verified", ok, reason, &msg);
    if let Some(c) = st.conditions.iter_mut().find(|c| c.type_ == "Verified") {
        c.last_probe_time = Some(now());
    }
    st.verify_request = Some(asked);
    set_status(agent, b, &st).await
}

/// Remove the backup folder `name` of a VM's folder `dir`. The backups built on it first
/// take in the blocks they read from it (`qemu-img rebase` onto its parent, or onto nothing
/// when it was full), and their manifests follow; so every other backup stays whole. Safe
/// to run again after a crash at any point.
pub async fn merge_away(dir: &Path, name: &str) -> anyhow::Result<()> {
    let folder = dir.join(name);
    if !folder.exists() {
        return Ok(());
    }
    let gone = read_manifest(&folder).await?;
    for mut child in whole_backups(dir)
        .await
        .into_iter()
        .filter(|c| c.parent.as_deref() == Some(name))
    {
        let cdir = dir.join(&child.name);
        for d in child.disks.iter_mut() {
            if !d.file_name_ok() {
                bail!(
                    "{}: a disk file name {:?} is not allowed",
                    child.name,
                    d.file
                );
            }
            let path = cdir.join(&d.file);
            let path_s = path.to_string_lossy().into_owned();
            let mut args = vec!["rebase", "-q", "-f", "qcow2"];
            let backing = gone.parent.as_ref().map(|p| format!("../{p}/{}", d.file));
            match &backing {
                Some(b) => args.extend(["-F", "qcow2", "-b", b.as_str()]),
                None => args.extend(["-b", ""]),
            }
            args.push(&path_s);
            super::run_tool("qemu-img", &args).await?;
            (d.bytes, d.blake3) = seal(&path).await?;
        }
        child.parent = gone.parent.clone();
        if child.parent.is_none() {
            child.type_ = backup_type::FULL.into();
        }
        let tmp = cdir.join(format!(".{MANIFEST}.new"));
        tokio::fs::write(&tmp, serde_json::to_vec_pretty(&child)?).await?;
        tokio::fs::File::open(&tmp).await?.sync_all().await?;
        tokio::fs::rename(&tmp, cdir.join(MANIFEST)).await?;
        tracing::info!(backup = %child.name, removed = %name, "merged a removed backup into the one built on it");
    }
    let doomed = dir.join(format!(".deleting-{name}"));
    tokio::fs::rename(&folder, &doomed).await?;
    tokio::fs::File::open(dir).await?.sync_all().await?;
    tokio::fs::remove_dir_all(&doomed).await?;
    Ok(())
}

/// Remove the half-written folders (`.part-<uid>`) of backups that no longer run: left by
/// a failure this agent could not clean up, or by a kill.
async fn sweep(agent: &Agent, all: &[Stored<VirtualMachineBackup>]) {
    let running = |uid: &str| all.iter().any(|b| b.obj.uid() == uid && !b.obj.finished());
    for (_, root) in &agent.cfg.backup_targets {
        for ns in subdirs(root).await {
            for vm_dir in subdirs(&ns).await {
                for d in subdirs(&vm_dir).await {
                    let name = d.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                    if let Some(uid) = name.strip_prefix(".part-")
                        && !running(uid)
                    {
                        tracing::info!(folder = %d.display(), "removing a half-written backup");
                        let _ = tokio::fs::remove_dir_all(&d).await;
                    }
                    if name.starts_with(".deleting-") {
                        let _ = tokio::fs::remove_dir_all(&d).await;
                    }
                }
            }
        }
    }
}

/// Write the backup's status (a merge of `f`'s changes over what it is now).
async fn set_status(
    agent: &Agent,
    b: &VirtualMachineBackup,
    st: &VirtualMachineBackupStatus,
) -> anyhow::Result<()> {
    agent
        .cp
        .patch_of(
            Kind::VirtualMachineBackup,
            b.namespace(),
            b.name(),
            json!({ "status": st }),
            true,
        )
        .await?;
    Ok(())
}

/// Take one backup and record how it ended.
async fn back_up(agent: &Agent, b: &VirtualMachineBackup) -> anyhow::Result<()> {
    let (ns, name) = (b.namespace(), b.name());
    let mut st = b.status.clone().unwrap_or_default();
    set_condition(
        &mut st.conditions,
        "Progressing",
        true,
        "InProgress",
        "starting the copy",
    );
    set_status(agent, b, &st).await?;
    let t0 = Instant::now();
    tracing::info!(namespace = %ns, backup = %name, "backup starting");
    let outcome = take(agent, b, &mut st).await;
    st.copy_ms = Some(t0.elapsed().as_millis() as u64);
    let mut stale = None;
    match outcome {
        Ok(older) => {
            stale = older;
            st.completion_time = Some(now());
            let msg = format!(
                "{} backup of {} written to {}",
                st.type_.as_deref().unwrap_or("a"),
                human(st.size_bytes.unwrap_or(0)),
                st.path.as_deref().unwrap_or("the target")
            );
            set_condition(&mut st.conditions, "Progressing", false, "Completed", &msg);
            set_condition(&mut st.conditions, "Done", true, "Completed", &msg);
            tracing::info!(namespace = %ns, backup = %name, kind = ?st.type_, bytes = ?st.size_bytes, ms = ?st.copy_ms, path = ?st.path, "backup done");
        }
        Err(e) => {
            let why = format!("{e:#}");
            tracing::warn!(namespace = %ns, backup = %name, error = %why, "backup failed");
            failed(&mut st, &why);
        }
    }
    set_status(agent, b, &st).await?;
    // Only the newest checkpoint is kept: the next backup counts from it. Deleted once the
    // backup is recorded, which does not need it; one a crash leaves here is a leftover the
    // next backup deletes.
    if let Some((dom, ck)) = stale {
        forget_checkpoint(agent, &dom, &ck).await;
    }
    Ok(())
}

/// The copy itself; fills in `st` as it goes. Gives back the checkpoint (domain, name)
/// that the new one replaces.
async fn take(
    agent: &Agent,
    b: &VirtualMachineBackup,
    st: &mut VirtualMachineBackupStatus,
) -> anyhow::Result<Option<(String, String)>> {
    let ns = b.namespace();
    let vm_name = b.spec.source.name.as_str();
    let target = b.spec.pvc_name.clone().unwrap_or_default();
    let t_prepare = Instant::now();
    let dir = vm_dir(agent, &target, ns, vm_name)?;
    tokio::fs::create_dir_all(&dir)
        .await
        .with_context(|| format!("creating {}", dir.display()))?;
    let vm = agent
        .cp
        .vms()
        .await?
        .into_iter()
        .map(|v| v.obj)
        .find(|v| v.namespace() == ns && v.name() == vm_name)
        .ok_or_else(|| anyhow!("VirtualMachine {ns}/{vm_name} does not exist"))?;
    // The volumes, their claims and DataVolumes.
    let mut volumes = vec![];
    let mut data_volumes = vec![];
    for v in &st.included_volumes {
        let vol = vm
            .spec
            .template
            .spec
            .volumes
            .iter()
            .find(|x| x.name == v.volume_name)
            .ok_or_else(|| anyhow!("volume {:?} is no longer in the VM", v.volume_name))?;
        let claim = match (&vol.data_volume, &vol.persistent_volume_claim) {
            (Some(d), _) => d.name.clone(),
            (None, Some(c)) => c.claim_name.clone(),
            _ => bail!("volume {:?} has no disk of its own", v.volume_name),
        };
        if let Some(dv) = agent.cp.get_data_volume(ns, &claim).await? {
            let dv = dv.obj;
            data_volumes.push(json!({
                "metadata": {"name": dv.name(), "labels": dv.metadata.labels, "annotations": dv.metadata.annotations},
                "spec": dv.spec,
            }));
        }
        volumes.push((v.volume_name.clone(), claim));
    }
    let here = agent.cfg.node_name.as_str();
    let live = super::snapshot::live_domain(agent, ns, vm_name).await?;
    // The backup this one builds on: the last whole one of this VM (same uid, same volumes).
    let vm_uid = vm.uid().to_string();
    let earlier = whole_backups(&dir).await;
    let parent = earlier.iter().rev().find(|m| {
        m.virtual_machine["metadata"]["uid"].as_str() == Some(vm_uid.as_str())
            && m.disks.len() == volumes.len()
            && m.disks
                .iter()
                .zip(&volumes)
                .all(|(d, (v, _))| d.volume == *v)
    });
    let created = chrono::Utc::now();
    let folder = folder_name(&created.format("%Y%m%dT%H%M%SZ").to_string(), b.uid());
    let part = dir.join(format!(".part-{}", b.uid()));
    let _ = tokio::fs::remove_dir_all(&part).await;
    tokio::fs::create_dir_all(&part)
        .await
        .with_context(|| format!("creating {}", part.display()))?;
    let (t_copy, prepare_ms) = (Instant::now(), t_prepare.elapsed().as_millis());
    let r = copy(agent, b, st, &live, parent, &volumes, &part).await;
    let copy_ms = t_copy.elapsed().as_millis();
    let (kind, checkpoint, checkpoint_xml, frozen_ms) = match r {
        Ok(x) => x,
        Err(e) => {
            let _ = tokio::fs::remove_dir_all(&part).await;
            if let Some((dom, _)) = &live {
                forget_checkpoint(agent, dom, &checkpoint_name(b.uid())).await;
            }
            return Err(with_space(e, &dir));
        }
    };
    let parent_name = (kind == backup_type::INCREMENTAL)
        .then(|| parent.map(|p| p.name.clone()))
        .flatten();
    let finish = async {
        // Each disk's file is flushed and hashed at once, and the disks side by side. (An
        // incremental's files already name their parents' files: made so by `copy`.)
        let disks = futures::future::try_join_all(volumes.iter().enumerate().map(
            |(i, (volume, claim))| {
                let part = &part;
                async move {
                    let file = format!("{i}.qcow2");
                    let path = part.join(&file);
                    let ((bytes, blake3), virtual_size) =
                        tokio::try_join!(seal(&path), virtual_size(&path))?;
                    anyhow::Ok(ManifestDisk {
                        volume: volume.clone(),
                        claim: claim.clone(),
                        file,
                        virtual_size,
                        bytes,
                        blake3,
                    })
                }
            },
        ))
        .await?;
        let mut vm_copy = serde_json::to_value(&vm)?;
        if let Some(m) = vm_copy["metadata"].as_object_mut() {
            m.retain(|k, _| {
                ["name", "namespace", "uid", "labels", "annotations"].contains(&k.as_str())
            });
        }
        if let Some(o) = vm_copy.as_object_mut() {
            o.remove("status");
        }
        let manifest = Manifest {
            format: 1,
            type_: kind.to_string(),
            name: folder.clone(),
            parent: parent_name.clone(),
            created: created.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            node: here.to_string(),
            backup: format!("{ns}/{}", b.name()),
            checkpoint: checkpoint.clone(),
            checkpoint_xml,
            virtual_machine: vm_copy,
            data_volumes,
            disks,
        };
        let raw = serde_json::to_vec_pretty(&manifest)?;
        let mf = part.join(MANIFEST);
        tokio::fs::write(&mf, &raw)
            .await
            .with_context(|| format!("writing {}", mf.display()))?;
        tokio::fs::File::open(&mf).await?.sync_all().await?;
        tokio::fs::File::open(&part).await?.sync_all().await?;
        let whole = dir.join(&folder);
        tokio::fs::rename(&part, &whole)
            .await
            .with_context(|| format!("renaming {} to {}", part.display(), whole.display()))?;
        tokio::fs::File::open(&dir).await?.sync_all().await?;
        anyhow::Ok(manifest)
    };
    let t_finish = Instant::now();
    let finished = finish.await;
    tracing::info!(namespace = %ns, vm = %vm_name, prepare_ms, copy_ms, finish_ms = t_finish.elapsed().as_millis(), "backup phases");
    let manifest = match finished {
        Ok(m) => m,
        Err(e) => {
            let _ = tokio::fs::remove_dir_all(&part).await;
            if let Some((dom, _)) = &live {
                forget_checkpoint(agent, dom, &checkpoint_name(b.uid())).await;
            }
            return Err(with_space(e, &dir));
        }
    };
    let stale = match (&live, parent) {
        (Some((dom, _)), Some(p)) => p.checkpoint.clone().map(|ck| (dom.clone(), ck)),
        _ => None,
    };
    st.type_ = Some(kind.to_string());
    st.checkpoint_name = checkpoint;
    st.parent = parent_name;
    st.path = Some(format!("{ns}/{vm_name}/{folder}"));
    st.size_bytes = Some(manifest.disks.iter().map(|d| d.bytes).sum());
    st.frozen_ms = frozen_ms;
    for v in st.included_volumes.iter_mut() {
        v.virtual_size = manifest
            .disks
            .iter()
            .find(|d| d.volume == v.volume_name)
            .map(|d| d.virtual_size);
    }
    st.virtual_machine = Some(manifest.virtual_machine.clone());
    Ok(stale)
}

/// A checkpoint's XML as it was recorded, without its parent and its domain: a domain
/// started again (a restart, a migration) knows no checkpoint and has a uuid of its own,
/// and libvirt refuses to define a checkpoint again whose parent it does not know or whose
/// domain has another uuid. The checkpoint's bitmap, in the disk, counts the writes since
/// its own moment, which is all the next backup needs.
fn root_checkpoint(xml: &str) -> String {
    let mut xml = xml.to_string();
    for (open, close) in [("<parent>", "</parent>"), ("<domain ", "</domain>")] {
        if let (Some(a), Some(b)) = (xml.find(open), xml.rfind(close))
            && a < b
        {
            xml.replace_range(a..b + close.len(), "");
        }
    }
    xml
}

/// A failure on a target that filled up says so.
fn with_space(e: anyhow::Error, dir: &Path) -> anyhow::Error {
    match nix::sys::statvfs::statvfs(dir) {
        Ok(fs) if fs.blocks_available() == 0 => {
            e.context(format!("the backup target is full ({})", dir.display()))
        }
        _ => e,
    }
}

async fn forget_checkpoint(agent: &Agent, dom: &str, ck: &str) {
    let (hv, d, c) = (agent.hv.clone(), dom.to_string(), ck.to_string());
    let r = tokio::task::spawn_blocking(move || {
        if hv.checkpoints(&d)?.contains(&c) {
            hv.checkpoint_delete(&d, &c)?;
        }
        Ok::<_, crate::hypervisor::Error>(())
    })
    .await;
    if let Ok(Err(e)) = r {
        tracing::warn!(domain = %dom, checkpoint = %ck, error = %e, "deleting a checkpoint failed");
    }
}

type Copied = (&'static str, Option<String>, Option<String>, Option<u64>);

/// Copy the disks into `part`: (type, checkpoint, its XML, ms frozen).
async fn copy(
    agent: &Agent,
    b: &VirtualMachineBackup,
    st: &mut VirtualMachineBackupStatus,
    live: &Option<(String, DomainState)>,
    parent: Option<&Manifest>,
    volumes: &[(String, String)],
    part: &Path,
) -> anyhow::Result<Copied> {
    let Some((dom, state)) = live else {
        // A stopped VM: a full copy of each disk.
        for (i, (_, claim)) in volumes.iter().enumerate() {
            let (src, format) = super::snapshot::disk_of(agent, b.namespace(), claim).await?;
            super::snapshot::convert(&src, &format, &part.join(format!("{i}.qcow2")), "qcow2")
                .await?;
        }
        return Ok((backup_type::FULL, None, None, None));
    };
    let hv = agent.hv.clone();
    let xml = {
        let (hv, d) = (hv.clone(), dom.clone());
        tokio::task::spawn_blocking(move || hv.xml(&d)).await??
    };
    let disks = crate::hypervisor::all_domain_disks(&xml);
    let mut wanted = vec![];
    for (i, (volume, _)) in volumes.iter().enumerate() {
        let alias = format!("ua-{volume}");
        let d = disks
            .iter()
            .find(|d| d.alias == alias)
            .ok_or_else(|| anyhow!("volume {volume:?} is not a disk of the running guest"))?;
        wanted.push((d.target.clone(), part.join(format!("{i}.qcow2"))));
    }
    let _one_job = agent.push_jobs.lock().await;
    super::snapshot::abort_leftover_job(agent, dom).await;
    // The checkpoint to count from: the parent's, known to libvirt or defined again.
    let parent_ck = match parent.filter(|_| b.spec.force_full_backup != Some(true)) {
        Some(p) => match (&p.checkpoint, &p.checkpoint_xml) {
            (Some(ck), Some(ck_xml)) => {
                let (hv, d, ck, x) = (hv.clone(), dom.clone(), ck.clone(), ck_xml.clone());
                tokio::task::spawn_blocking(move || {
                    if hv.checkpoints(&d)?.contains(&ck) {
                        return Ok(Some(ck));
                    }
                    match hv.checkpoint_redefine(&d, &root_checkpoint(&x)) {
                        Ok(()) => Ok(Some(ck)),
                        Err(e) => {
                            tracing::info!(domain = %d, checkpoint = %ck, error = %e, "the last backup's checkpoint is gone: this backup is full");
                            Ok::<_, crate::hypervisor::Error>(None)
                        }
                    }
                })
                .await??
            }
            _ => None,
        },
        None => None,
    };
    // Every other checkpoint of edgevirt's is a leftover: deleting it merges its bitmap
    // into its parent's, so nothing a later backup counts on is lost.
    {
        let (hv2, d, keep) = (hv.clone(), dom.clone(), parent_ck.clone());
        tokio::task::spawn_blocking(move || {
            for c in hv2.checkpoints(&d)? {
                if c.starts_with("edgevirt-") && Some(&c) != keep.as_ref() {
                    tracing::info!(domain = %d, checkpoint = %c, "deleting a leftover checkpoint");
                    hv2.checkpoint_delete(&d, &c)?;
                }
            }
            Ok::<_, crate::hypervisor::Error>(())
        })
        .await??;
    }
    let esc = |s: &str| quick_xml::escape::escape(s).into_owned();
    let mut backup = String::from("<domainbackup mode='push'>");
    if let Some(ck) = &parent_ck {
        backup.push_str(&format!("<incremental>{}</incremental>", esc(ck)));
    }
    backup.push_str("<disks>");
    let new_ck = checkpoint_name(b.uid());
    let mut ck_xml = format!("<domaincheckpoint><name>{}</name><disks>", esc(&new_ck));
    for d in &disks {
        match wanted.iter().find(|(t, _)| *t == d.target) {
            Some((t, file)) => {
                backup.push_str(&format!(
                    "<disk name='{}' backup='yes' type='file'><target file='{}'/><driver type='qcow2'/></disk>",
                    esc(t),
                    esc(&file.to_string_lossy())
                ));
                ck_xml.push_str(&format!("<disk name='{}' checkpoint='bitmap'/>", esc(t)));
            }
            None if !d.file.is_empty() && !d.readonly => {
                backup.push_str(&format!("<disk name='{}' backup='no'/>", esc(&d.target)));
                ck_xml.push_str(&format!(
                    "<disk name='{}' checkpoint='no'/>",
                    esc(&d.target)
                ));
            }
            None => {}
        }
    }
    backup.push_str("</disks></domainbackup>");
    ck_xml.push_str("</disks></domaincheckpoint>");
    // The target files are made while the guest freezes: libvirt would make them after, with
    // QEMU jobs of its own, while the guest waits. An incremental's file names the parent's
    // file of its disk as its backing file (relative: the folder moves as a whole). libvirt
    // attaches a target with a backing of its own choosing, so that header is never opened
    // or rewritten (verify checks it; the e2e test restores through it).
    let parent_folder = parent_ck.as_ref().and(parent).map(|p| p.name.clone());
    let creating = async {
        for (target, file) in &wanted {
            let (hv, d, t) = (hv.clone(), dom.clone(), target.clone());
            let size = tokio::task::spawn_blocking(move || hv.disk_capacity(&d, &t)).await??;
            let mut args: Vec<String> =
                vec!["create".into(), "-q".into(), "-f".into(), "qcow2".into()];
            if let (Some(p), Some(name)) = (&parent_folder, file.file_name()) {
                let backing = format!("../{p}/{}", name.to_string_lossy());
                args.extend([
                    "-u".into(),
                    "-F".into(),
                    "qcow2".into(),
                    "-b".into(),
                    backing,
                ]);
            }
            args.extend([file.to_string_lossy().into_owned(), size.to_string()]);
            super::run_tool("qemu-img", &args).await?;
        }
        anyhow::Ok(())
    };
    let t_freeze = Instant::now();
    let freezing = async {
        if *state != DomainState::Running || b.spec.skip_quiesce == Some(true) {
            return None;
        }
        let t0 = Instant::now();
        match super::snapshot::guest_agent(agent, dom, r#"{"execute":"guest-fsfreeze-freeze"}"#)
            .await
        {
            Ok(_) => Some(t0),
            Err(e) => {
                tracing::info!(domain = %dom, reason = %e, "no guest agent froze the filesystems: the backup is crash-consistent");
                None
            }
        }
    };
    let (created, frozen) = tokio::join!(creating, freezing);
    if let Err(e) = created {
        if frozen.is_some() {
            super::snapshot::thaw(agent, dom).await;
        }
        return Err(e.context("making the backup's files"));
    }
    let (t_begin, freeze_ms) = (Instant::now(), t_freeze.elapsed().as_millis());
    let begun = {
        let (hv, d, x, c) = (hv.clone(), dom.clone(), backup, ck_xml);
        tokio::task::spawn_blocking(move || hv.backup_begin(&d, &x, Some(&c), true)).await
    };
    let begin_ms = t_begin.elapsed().as_millis();
    let kind = if parent_ck.is_some() {
        backup_type::INCREMENTAL
    } else {
        backup_type::FULL
    };
    // The guest thaws while QEMU copies: the point in time is already fixed.
    let thawing = async {
        let t0 = frozen?;
        super::snapshot::thaw(agent, dom).await;
        Some(t0.elapsed().as_millis() as u64)
    };
    let copying = async {
        begun?.map_err(|e| anyhow!("starting the backup: {e}"))?;
        st.type_ = Some(kind.into());
        let mut last_report = Instant::now();
        let files: Vec<&Path> = wanted.iter().map(|(_, f)| f.as_path()).collect();
        while let Some((processed, total)) =
            super::snapshot::poll_backup(agent, dom, &files).await?
        {
            if last_report.elapsed() > Duration::from_secs(1) && total > 0 {
                last_report = Instant::now();
                let msg = format!(
                    "{kind}: copied {} of {} ({:.0}%)",
                    human(processed),
                    human(total),
                    processed as f64 * 100.0 / total as f64
                );
                set_condition(&mut st.conditions, "Progressing", true, "InProgress", &msg);
                let _ = set_status(agent, b, st).await;
            }
        }
        anyhow::Ok(())
    };
    let (frozen_ms, copied) = tokio::join!(thawing, copying);
    tracing::info!(domain = %dom, freeze_ms, begin_ms, frozen_ms, copy_ms = t_begin.elapsed().as_millis(), "backup copied");
    copied?;
    let xml = {
        let (hv, d, c) = (hv.clone(), dom.clone(), new_ck.clone());
        tokio::task::spawn_blocking(move || hv.checkpoint_xml(&d, &c))
            .await?
            .ok()
    };
    Ok((kind, Some(new_ck), xml, frozen_ms))
}

fn human(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if bytes as f64 >= 1024.0 * MIB {
        format!("{:.1} GiB", bytes as f64 / (1024.0 * MIB))
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_defined_again_without_its_parent() {
        let xml = "<domaincheckpoint>\n  <name>edgevirt-b</name>\n  <parent>\n    \
                   <name>edgevirt-a</name>\n  </parent>\n  <creationTime>1</creationTime>\n\
                   <disks><disk name='vda' checkpoint='bitmap' bitmap='edgevirt-b'/></disks>\n\
                   <domain type='kvm'><uuid>u</uuid><devices><disk/></devices></domain>\n\
                   </domaincheckpoint>";
        let root = root_checkpoint(xml);
        assert!(
            !root.contains("parent") && !root.contains("edgevirt-a"),
            "{root}"
        );
        assert!(
            !root.contains("<domain ") && !root.contains("<uuid>"),
            "{root}"
        );
        assert!(root.contains("<name>edgevirt-b</name>") && root.contains("<creationTime>1"));
        assert!(root.contains("bitmap='edgevirt-b'/></disks>"), "{root}");
        assert!(root.ends_with("</domaincheckpoint>"), "{root}");
        // One without a parent, or a malformed one, is left as it is.
        for same in [
            "<domaincheckpoint><name>x</name></domaincheckpoint>",
            "</parent><parent>",
        ] {
            assert_eq!(root_checkpoint(same), same);
        }
    }
}
