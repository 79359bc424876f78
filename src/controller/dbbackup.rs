//! The controller's own database, copied to each backup target the controller's host mounts
//! on a schedule: `TARGET/_controller/edgevirt-<UTC time>.db` (`_` cannot start a namespace,
//! so it never meets a VM's folder), with the TLS certificate and key the agents trust
//! beside it in `tls/`. Each copy is one consistent view of the database (SQLite's `VACUUM
//! INTO`), written under a `.part` name and renamed when whole; the newest `keep` copies
//! stay. docs/guide/snapshots-and-backups.md says how to rebuild a controller from one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::store::Store;

/// The folder in a target that holds the controller's copies.
pub const FOLDER: &str = "_controller";

/// Copy the database to every target every `every`, keeping the newest `keep` copies in
/// each, until cancelled.
pub async fn run(
    store: Store,
    data_dir: PathBuf,
    targets: Vec<(String, PathBuf)>,
    every: Duration,
    keep: usize,
    cancel: CancellationToken,
) {
    if targets.is_empty() {
        return;
    }
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        for (name, root) in &targets {
            match copy_once(&store, &data_dir, root, keep).await {
                Ok(file) => {
                    tracing::info!(target = %name, file = %file.display(), "database backed up")
                }
                Err(e) => {
                    tracing::warn!(target = %name, error = %format!("{e:#}"), "backing up the database failed")
                }
            }
        }
    }
}

/// One copy into `root`; its path.
pub async fn copy_once(
    store: &Store,
    data_dir: &Path,
    root: &Path,
    keep: usize,
) -> anyhow::Result<PathBuf> {
    let dir = root.join(FOLDER);
    tokio::fs::create_dir_all(&dir)
        .await
        .with_context(|| format!("creating {}", dir.display()))?;
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ");
    let file = dir.join(format!("edgevirt-{stamp}.db"));
    let part = dir.join(format!(".edgevirt-{stamp}.db.part"));
    let _ = tokio::fs::remove_file(&part).await;
    let r = async {
        store.copy_to(&part).await?;
        tokio::fs::File::open(&part).await?.sync_all().await?;
        tokio::fs::rename(&part, &file).await?;
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = r {
        let _ = tokio::fs::remove_file(&part).await;
        return Err(e);
    }
    // The certificate and key the agents pin, so that a rebuilt controller is the same one.
    let tls = data_dir.join("tls");
    if tls.is_dir() {
        let dest = dir.join("tls");
        tokio::fs::create_dir_all(&dest).await?;
        let mut rd = tokio::fs::read_dir(&tls).await?;
        while let Some(e) = rd.next_entry().await? {
            if e.file_type().await?.is_file() {
                tokio::fs::copy(e.path(), dest.join(e.file_name())).await?;
            }
        }
    }
    tokio::fs::File::open(&dir).await?.sync_all().await?;
    prune(&dir, keep).await;
    Ok(file)
}

/// Keep the newest `keep` copies (their names sort by time).
async fn prune(dir: &Path, keep: usize) {
    let mut copies = vec![];
    if let Ok(mut rd) = tokio::fs::read_dir(dir).await {
        while let Ok(Some(e)) = rd.next_entry().await {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("edgevirt-") && n.ends_with(".db") {
                copies.push(n);
            }
        }
    }
    copies.sort();
    let drop = copies.len().saturating_sub(keep.max(1));
    for n in &copies[..drop] {
        let _ = tokio::fs::remove_file(dir.join(n)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_copy_opens_as_a_store_with_the_same_objects_and_old_copies_go() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(&d.path().join("edgevirt.db")).await.unwrap();
        store
            .create(
                crate::types::Kind::ConfigMap,
                serde_json::json!({"metadata": {"name": "site", "namespace": "default"},
                                   "data": {"k": "v"}}),
                false,
            )
            .await
            .unwrap();
        let target = d.path().join("nas");
        std::fs::create_dir_all(&target).unwrap();
        let mut files = vec![];
        for _ in 0..3 {
            files.push(copy_once(&store, d.path(), &target, 2).await.unwrap());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!files[0].exists(), "the oldest copy beyond 2 is pruned");
        assert!(files[1].exists() && files[2].exists());
        let copy = d.path().join("rebuilt.db");
        std::fs::copy(&files[2], &copy).unwrap();
        let rebuilt = Store::open(&copy).await.unwrap();
        let cm = rebuilt
            .get(crate::types::Kind::ConfigMap, "default", "site")
            .await
            .unwrap()
            .expect("the object is in the copy");
        assert_eq!(cm["data"]["k"], "v");
    }
}
