//! The files of backups on a target, what every part that reads them shares: where a VM's
//! backups are (`TARGET/NAMESPACE/VM/FOLDER`), their manifests, their checksums (BLAKE3),
//! and the verification of a backup and the chain of parents it builds on. The backup task
//! writes these folders; a DataVolume with a `backup` source and `edgevirt backup
//! verify|restore` read them.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail};
use serde_json::Value;

use super::Agent;
use super::ports::{Stored, decode_items};
use crate::types::backup::{MANIFEST, Manifest, VirtualMachineBackup, is_folder_name};
use crate::types::{Kind, Meta};

/// Where a backup's folder is on this node: the VM's folder in the target and the backup's
/// folder name; `None` before the backup wrote one. Its recorded path must be its own.
pub(super) fn folder_of(
    agent: &Agent,
    b: &VirtualMachineBackup,
) -> anyhow::Result<Option<(PathBuf, String)>> {
    let (ns, name) = (b.namespace(), b.name());
    let Some(path) = b.status.as_ref().and_then(|s| s.path.as_deref()) else {
        return Ok(None);
    };
    let parts: Vec<&str> = path.split('/').collect();
    let ok = matches!(parts.as_slice(), [n, vm, f]
        if *n == ns && *vm == b.spec.source.name && is_folder_name(f));
    if !ok {
        bail!("backup {ns}/{name} names a folder {path:?} that is not its own");
    }
    let target = b.spec.pvc_name.clone().unwrap_or_default();
    let dir = vm_dir(agent, &target, ns, &b.spec.source.name)?;
    Ok(Some((dir, parts[2].to_string())))
}

/// The file a DataVolume restores a volume of the backup `ns/name` from (the top of its
/// chain, which reads as the whole disk), once the chain verifies. The backup must be done
/// and its target mounted on this node.
pub async fn restore_source(
    agent: &Agent,
    ns: &str,
    name: &str,
    volume: &str,
) -> anyhow::Result<(PathBuf, u64)> {
    let all: Vec<Stored<VirtualMachineBackup>> =
        decode_items(agent.cp.list_of(Kind::VirtualMachineBackup).await?);
    let b = all
        .into_iter()
        .map(|s| s.obj)
        .find(|b| b.namespace() == ns && b.name() == name)
        .ok_or_else(|| anyhow!("VirtualMachineBackup {ns}/{name} does not exist"))?;
    if !b.succeeded() {
        bail!("backup {ns}/{name} has not completed: there is nothing to restore yet");
    }
    let (dir, folder) =
        folder_of(agent, &b)?.ok_or_else(|| anyhow!("backup {ns}/{name} records no folder"))?;
    let folder = dir.join(folder);
    let (m, _, problems) = verify(&folder).await?;
    if !problems.is_empty() {
        bail!(
            "backup {ns}/{name} does not verify, not restoring from it: {}",
            problems.join("; ")
        );
    }
    let d = m.disks.iter().find(|d| d.volume == volume).ok_or_else(|| {
        let held: Vec<&str> = m.disks.iter().map(|d| d.volume.as_str()).collect();
        anyhow!(
            "backup {ns}/{name} holds no volume {volume:?} (it holds {})",
            held.join(", ")
        )
    })?;
    Ok((folder.join(&d.file), d.virtual_size))
}

/// Where a backup of `ns/vm` goes in its target: `TARGET/NS/VM`.
pub(super) fn vm_dir(agent: &Agent, target: &str, ns: &str, vm: &str) -> anyhow::Result<PathBuf> {
    let (_, root) = agent
        .cfg
        .backup_targets
        .iter()
        .find(|(n, _)| n == target)
        .ok_or_else(|| {
            anyhow!(
                "node {} does not mount backup target {target:?}",
                agent.cfg.node_name
            )
        })?;
    crate::types::check_name("namespace", ns)?;
    crate::types::check_name("name", vm)?;
    if !root.is_dir() {
        bail!(
            "backup target {target}: {} is not a folder (is it mounted?)",
            root.display()
        );
    }
    Ok(root.join(ns).join(vm))
}

/// The whole backups in a VM's folder, oldest first.
pub async fn whole_backups(dir: &Path) -> Vec<Manifest> {
    let mut out = vec![];
    for d in subdirs(dir).await {
        let name = d.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !is_folder_name(name) {
            continue;
        }
        if let Ok(m) = read_manifest(&d).await
            && m.name == name
        {
            out.push(m);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

pub async fn read_manifest(folder: &Path) -> anyhow::Result<Manifest> {
    let raw = tokio::fs::read(folder.join(MANIFEST))
        .await
        .with_context(|| format!("reading {}", folder.join(MANIFEST).display()))?;
    serde_json::from_slice(&raw).with_context(|| format!("{} is no manifest", folder.display()))
}

/// A backup file's backing file as its qcow2 header names it; an error when it is not a
/// qcow2 image or uses an external data file.
pub(super) async fn backing_of(path: &Path) -> anyhow::Result<Option<String>> {
    let v = qemu_img_info(path).await?;
    if v["format-specific"]["data"].get("data-file").is_some() {
        bail!("{} uses an external data file", path.display());
    }
    Ok(v["backing-filename"].as_str().map(str::to_string))
}

/// `qemu-img info` of a backup file (always qcow2), the error naming the file.
async fn qemu_img_info(path: &Path) -> anyhow::Result<Value> {
    crate::virt::image::info(path, Some("qcow2"))
        .await
        .map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// A disk image's size as the guest sees it.
pub(super) async fn virtual_size(path: &Path) -> anyhow::Result<u64> {
    qemu_img_info(path).await?["virtual-size"]
        .as_u64()
        .ok_or_else(|| anyhow!("qemu-img info gave no size for {}", path.display()))
}

/// BLAKE3 of a file, hex. BLAKE3 rather than SHA-256: it hashes several of a file's 1 KiB
/// chunks at once with the CPU's vector units and, being a tree, on every core (rayon), so
/// it runs several times faster than SHA-256 even with SHA extensions; a full backup's time
/// is the copy plus this second read.
pub async fn checksum_file(path: &Path) -> anyhow::Result<String> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut f =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let mut h = blake3::Hasher::new();
        let mut buf = vec![0u8; 16 << 20];
        loop {
            // Fill the buffer (a read may return less), then hash it on all cores.
            let mut n = 0;
            while n < buf.len() {
                match f
                    .read(&mut buf[n..])
                    .with_context(|| format!("reading {}", path.display()))?
                {
                    0 => break,
                    k => n += k,
                }
            }
            if n == 0 {
                break;
            }
            h.update_rayon(&buf[..n]);
            if n < buf.len() {
                break;
            }
        }
        Ok(h.finalize().to_hex().to_string())
    })
    .await?
}

/// The checksum of a file this node just wrote into a backup folder, mapped rather than
/// read: its pages are hashed straight from the page cache on every core, without a copy.
pub(super) async fn checksum_own_file(path: &Path) -> anyhow::Result<String> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let f =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let mut h = blake3::Hasher::new();
        if f.metadata()?.len() > 0 {
            // SAFETY: the file is this node's own, in a backup folder it is sealing
            // (`.part-<uid>`) or rebasing; nothing else writes or truncates it while it is
            // mapped. Files of folders others may touch (verify) are read, not mapped.
            // Not pre-faulted (`populate`): that maps every page on one core before hashing
            // starts (~80 of ~200 ms for a GiB here); faulted as the threads hash, ~165 ms.
            let map = unsafe { memmap2::MmapOptions::new().map(&f) }
                .with_context(|| format!("mapping {}", path.display()))?;
            h.update_rayon(&map);
        }
        Ok(h.finalize().to_hex().to_string())
    })
    .await?
}

/// Flush a file written into a backup folder and hash it, both at once: its size and its
/// checksum.
pub(super) async fn seal(path: &Path) -> anyhow::Result<(u64, String)> {
    let f = tokio::fs::File::open(path)
        .await
        .with_context(|| format!("opening {}", path.display()))?;
    let (synced, sum) = tokio::join!(f.sync_all(), checksum_own_file(path));
    synced.with_context(|| format!("flushing {}", path.display()))?;
    Ok((f.metadata().await?.len(), sum?))
}

/// Re-read a backup folder and its parents and check every file against its manifest: the
/// manifest, how many backups the chain holds, and the problems found (none: the backup
/// is whole).
pub async fn verify(folder: &Path) -> anyhow::Result<(Manifest, usize, Vec<String>)> {
    let top = read_manifest(folder).await?;
    let mut problems = vec![];
    let mut cur = Some((folder.to_path_buf(), top.clone()));
    let mut seen = 0;
    while let Some((dir, m)) = cur.take() {
        seen += 1;
        if seen > 10_000 {
            problems.push("the chain of parents loops".into());
            break;
        }
        for d in &m.disks {
            if !d.file_name_ok() {
                problems.push(format!(
                    "{}: a disk file name {:?} is not allowed",
                    m.name, d.file
                ));
                continue;
            }
            let path = dir.join(&d.file);
            // The chain is the manifest's: the file's backing file is the parent's file of
            // the same name (none for a full backup), and it has no external data file.
            let backing = m.parent.as_ref().map(|p| format!("../{p}/{}", d.file));
            match backing_of(&path).await {
                Ok(b) if b == backing => {}
                Ok(b) => problems.push(format!(
                    "{}: {} has backing file {b:?}, the manifest says {backing:?}",
                    m.name, d.file
                )),
                Err(e) => problems.push(format!("{}: {e:#}", m.name)),
            }
            match checksum_file(&path).await {
                Ok(sum) if sum == d.blake3 => {}
                Ok(sum) => problems.push(format!(
                    "{}: {} has checksum {sum}, the manifest says {}",
                    m.name, d.file, d.blake3
                )),
                Err(e) => problems.push(format!("{}: {e:#}", m.name)),
            }
        }
        if let Some(p) = &m.parent {
            if !is_folder_name(p) {
                problems.push(format!("{}: parent {p:?} is no backup folder name", m.name));
                break;
            }
            let pdir = dir.parent().map(|d| d.join(p)).unwrap_or_default();
            match read_manifest(&pdir).await {
                Ok(pm) => cur = Some((pdir, pm)),
                Err(e) => problems.push(format!("{}: its parent is missing: {e:#}", m.name)),
            }
        }
    }
    Ok((top, seen, problems))
}

/// The folders in `dir` (none when it cannot be read).
pub(super) async fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    if let Ok(mut rd) = tokio::fs::read_dir(dir).await {
        while let Ok(Some(e)) = rd.next_entry().await {
            if e.file_type().await.is_ok_and(|t| t.is_dir()) {
                out.push(e.path());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn checksums_are_blake3_as_b3sum_prints_them() {
        let dir = tempfile::tempdir().unwrap();
        let (empty, abc) = (dir.path().join("empty"), dir.path().join("abc"));
        std::fs::write(&empty, b"").unwrap();
        std::fs::write(&abc, b"abc").unwrap();
        // The published BLAKE3 test values.
        assert_eq!(
            checksum_file(&empty).await.unwrap(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        assert_eq!(
            checksum_file(&abc).await.unwrap(),
            "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
        // A file bigger than one read: the same as hashing it whole.
        let big = dir.path().join("big");
        let data: Vec<u8> = (0..(33u32 << 20) + 7).map(|i| (i % 251) as u8).collect();
        std::fs::write(&big, &data).unwrap();
        let (bytes, sum) = seal(&big).await.unwrap();
        assert_eq!(bytes, data.len() as u64);
        assert_eq!(sum, blake3::hash(&data).to_hex().to_string());
        assert_eq!(
            checksum_file(&big).await.unwrap(),
            sum,
            "read and mapped agree"
        );
        assert_eq!(
            seal(&empty).await.unwrap().1,
            checksum_file(&empty).await.unwrap()
        );
        assert!(checksum_file(&dir.path().join("missing")).await.is_err());
    }
}
