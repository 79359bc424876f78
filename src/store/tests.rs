use serde_json::json;

use super::*;

async fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("edgevirt.db")).await.unwrap();
    (dir, s)
}

fn vm(name: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": name}}, "spec": {"x": 1}})
}

#[tokio::test]
async fn create_get_conflict_delete() {
    let (_d, s) = store().await;
    let a = s
        .create(Kind::VirtualMachine, vm("a"), false)
        .await
        .unwrap();
    let rv = rv_of(&a).unwrap();
    assert!(matches!(
        s.create(Kind::VirtualMachine, vm("a"), false).await,
        Err(Error::AlreadyExists { .. })
    ));
    let mut changed = a.clone();
    changed["spec"]["x"] = json!(2);
    let b = s
        .replace(Kind::VirtualMachine, changed.clone(), Some(rv))
        .await
        .unwrap();
    assert!(rv_of(&b).unwrap() > rv);
    assert_eq!(b["metadata"]["generation"], json!(2));
    assert!(matches!(
        s.replace(Kind::VirtualMachine, changed, Some(rv)).await,
        Err(Error::Conflict)
    ));
    s.delete(Kind::VirtualMachine, "default", "a", None)
        .await
        .unwrap();
    assert!(
        s.get(Kind::VirtualMachine, "default", "a")
            .await
            .unwrap()
            .is_none()
    );
    let evs = s.events_since(0).await.unwrap();
    let types: Vec<_> = evs.iter().map(|e| e.event_type).collect();
    assert_eq!(types, ["ADDED", "MODIFIED", "DELETED"]);
}

#[tokio::test]
async fn finalizers_hold_deletion() {
    let (_d, s) = store().await;
    let mut o = vm("f");
    o["metadata"]["finalizers"] = json!(["edgevirt.io/test"]);
    s.create(Kind::VirtualMachine, o, false).await.unwrap();
    let d = s
        .delete(Kind::VirtualMachine, "default", "f", None)
        .await
        .unwrap();
    assert!(d["metadata"]["deletionTimestamp"].is_string());
    assert!(
        s.get(Kind::VirtualMachine, "default", "f")
            .await
            .unwrap()
            .is_some()
    );
    s.update(Kind::VirtualMachine, "default", "f", |o| {
        o["metadata"]["finalizers"] = json!([]);
        Ok(())
    })
    .await
    .unwrap();
    assert!(
        s.get(Kind::VirtualMachine, "default", "f")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn list_with_selectors_and_rename() {
    let (_d, s) = store().await;
    for n in ["a", "b", "c"] {
        s.create(Kind::VirtualMachine, vm(n), false).await.unwrap();
    }
    let sel = LabelSelector::parse("app in (a,c)").unwrap();
    let (l, rv) = s
        .list(
            Kind::VirtualMachine,
            Some("default"),
            &sel,
            &FieldSelector::default(),
        )
        .await
        .unwrap();
    assert_eq!(l.len(), 2);
    assert_eq!(rv, 3);
    let uid = l[0]["metadata"]["uid"].clone();
    let r = s
        .rename(Kind::VirtualMachine, "default", "a", "z")
        .await
        .unwrap();
    assert_eq!(r["metadata"]["uid"], uid);
    assert!(
        s.get(Kind::VirtualMachine, "default", "a")
            .await
            .unwrap()
            .is_none()
    );
    assert!(matches!(
        s.rename(Kind::VirtualMachine, "default", "b", "c").await,
        Err(Error::AlreadyExists { .. })
    ));
}

#[tokio::test]
async fn concurrent_writers_all_succeed() {
    let (_d, s) = store().await;
    let mut tasks = Vec::new();
    for i in 0..64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.create(Kind::VirtualMachine, vm(&format!("vm-{i}")), false)
                .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(s.current_rv().await.unwrap(), 64);
}

/// Every file in a folder with the SHA-256 of its bytes. The WAL index (`-shm`) is shared
/// memory every reader may update, not data: only its presence is compared.
fn snapshot(dir: &std::path::Path) -> Vec<(String, String)> {
    use sha2::{Digest, Sha256};
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let sum = if name.ends_with("-shm") {
                String::new()
            } else {
                hex::encode(Sha256::digest(std::fs::read(e.path()).unwrap()))
            };
            (name, sum)
        })
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn refuses_newer_schema_and_leaves_the_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edgevirt.db");
    let s = Store::open(&path).await.unwrap();
    s.create(Kind::VirtualMachine, vm("keep-me"), false)
        .await
        .unwrap();
    sqlx::query("INSERT INTO _sqlx_migrations (version, description, installed_on, success, checksum, execution_time) VALUES (9999, 'future', CURRENT_TIMESTAMP, 1, x'00', 0)")
        .execute(&s.writer)
        .await
        .unwrap();
    s.writer.close().await;
    s.reader.close().await;
    let before = snapshot(dir.path());
    assert!(before.iter().any(|(n, _)| n == "edgevirt.db"));
    for _ in 0..2 {
        match Store::open(&path).await {
            Err(e @ Error::TooNew { .. }) => {
                let m = e.to_string();
                assert!(m.contains("newer than this edgevirt"), "{m}");
                assert!(
                    m.contains("9999") && m.contains(&Store::known_schema().to_string()),
                    "{m}"
                );
            }
            Err(e) => panic!("wrong error {e}"),
            Ok(_) => panic!("opened a newer database"),
        }
        assert_eq!(snapshot(dir.path()), before, "the refused database changed");
    }
}

/// A database made by the previous schema (migration 0001 only, with data in it) opens with
/// the current code: migrated, data intact, a backup of the old file beside it.
#[tokio::test]
async fn migrates_from_the_previous_schema_with_a_backup() {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edgevirt.db");
    let only_first = dir.path().join("migrations-0001");
    std::fs::create_dir(&only_first).unwrap();
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/0001_init.sql"),
        only_first.join("0001_init.sql"),
    )
    .unwrap();
    let old = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal),
        )
        .await
        .unwrap();
    sqlx::migrate::Migrator::new(only_first.as_path())
        .await
        .unwrap()
        .run(&old)
        .await
        .unwrap();
    // Data as release 1 wrote it: an object with its event, the counter, a user and a token.
    let body = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "old-vm", "namespace": "default", "uid": "u-old", "resourceVersion": "7"},
        "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}});
    for q in [
        format!("INSERT INTO objects (kind, namespace, name, uid, resource_version, body) VALUES ('VirtualMachine', 'default', 'old-vm', 'u-old', 7, '{body}')"),
        format!("INSERT INTO events (rv, kind, namespace, name, type, body) VALUES (7, 'VirtualMachine', 'default', 'old-vm', 'ADDED', '{body}')"),
        "UPDATE counters SET value = 7 WHERE name = 'resourceVersion'".into(),
        "INSERT INTO users (name, password_hash, role, created) VALUES ('olduser', 'x', 'operator', '2026-01-01T00:00:00Z')".into(),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(q)).execute(&old).await.unwrap();
    }
    // WAL left in place (as after a crash or a live upgrade): the backup must still hold it.
    old.close().await;
    let s = Store::open(&path).await.unwrap();
    let got = s
        .get(Kind::VirtualMachine, "default", "old-vm")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got["spec"]["runStrategy"], "Halted");
    assert_eq!(got["metadata"]["uid"], "u-old");
    assert_eq!(s.current_rv().await.unwrap(), 7);
    // The new schema works on the old data: a write moves the counter on.
    s.create(Kind::VirtualMachine, vm("new-vm"), false)
        .await
        .unwrap();
    assert_eq!(s.current_rv().await.unwrap(), 8);
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM sessions")
        .fetch_one(&s.reader)
        .await
        .unwrap();
    assert_eq!(n, 0, "migration 0002 applied");
    // Opening again has nothing to migrate and takes no second backup.
    let again = Store::open(&path).await.unwrap();
    assert!(
        again
            .get(Kind::VirtualMachine, "default", "new-vm")
            .await
            .unwrap()
            .is_some()
    );
    // Exactly one backup, at schema 1, with the data.
    let backups: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("edgevirt.db.bak-1-"))
        .collect();
    assert_eq!(backups.len(), 1, "{backups:?}");
    let bak = SqlitePoolOptions::new()
        .connect_with(
            SqliteConnectOptions::new()
                .filename(dir.path().join(&backups[0]))
                .read_only(true),
        )
        .await
        .unwrap();
    let (v,): (i64,) = sqlx::query_as("SELECT MAX(version) FROM _sqlx_migrations")
        .fetch_one(&bak)
        .await
        .unwrap();
    assert_eq!(v, 1);
    let (name,): (String,) = sqlx::query_as("SELECT name FROM objects WHERE uid = 'u-old'")
        .fetch_one(&bak)
        .await
        .unwrap();
    assert_eq!(name, "old-vm");
    let (u,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM users WHERE name = 'olduser'")
        .fetch_one(&bak)
        .await
        .unwrap();
    assert_eq!(u, 1);
}

#[tokio::test]
async fn a_new_database_needs_no_backup() {
    let dir = tempfile::tempdir().unwrap();
    let _s = Store::open(&dir.path().join("edgevirt.db")).await.unwrap();
    assert!(
        !snapshot(dir.path())
            .iter()
            .any(|(n, _)| n.contains(".bak-")),
        "a backup of an empty database"
    );
}

#[tokio::test]
async fn the_event_log_is_pruned_by_size() {
    let (_d, s) = store().await;
    let mut big = vm("big");
    big["metadata"]["annotations"] = json!({"a": "x".repeat(100 << 10)});
    s.create(Kind::VirtualMachine, big, false).await.unwrap();
    for i in 0..5 {
        s.create(Kind::VirtualMachine, vm(&format!("small{i}")), false)
            .await
            .unwrap();
    }
    // 64 KiB keeps the five small events and drops the 100 KiB one before them.
    let dropped = s.prune_events_bytes(64 << 10).await.unwrap();
    assert_eq!(dropped, 1);
    let left = s.events_since(0).await;
    assert!(
        matches!(left, Err(Error::Gone(_))),
        "a watch from the start is told it is gone"
    );
    let (min,): (Option<i64>,) = sqlx::query_as("SELECT MIN(rv) FROM events")
        .fetch_one(&s.reader)
        .await
        .unwrap();
    assert_eq!(
        sqlx::query_as::<_, (i64,)>("SELECT COUNT(*) FROM events")
            .fetch_one(&s.reader)
            .await
            .unwrap()
            .0,
        5
    );
    assert!(min.unwrap() > 1);
    // Under the cap nothing goes.
    assert_eq!(s.prune_events_bytes(64 << 10).await.unwrap(), 0);
}

#[tokio::test]
async fn no_object_over_one_and_a_half_mib_is_stored() {
    let (_d, s) = store().await;
    let a = s
        .create(Kind::VirtualMachine, vm("a"), false)
        .await
        .unwrap();
    let mut big = vm("big");
    big["spec"]["x"] = json!("x".repeat(OBJECT_MAX_BYTES));
    assert!(matches!(
        s.create(Kind::VirtualMachine, big, false).await,
        Err(Error::Invalid(m)) if m.contains("1.5 MiB")
    ));
    // A status write (agents, controllers) is held to it too, and leaves the object as it was.
    let r = s
        .update(Kind::VirtualMachine, "default", "a", |o| {
            o["status"] = json!({"note": "y".repeat(OBJECT_MAX_BYTES)});
            Ok(())
        })
        .await;
    assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
    let now = s
        .get(Kind::VirtualMachine, "default", "a")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rv_of(&now), rv_of(&a));
    assert!(
        s.get(Kind::VirtualMachine, "default", "big")
            .await
            .unwrap()
            .is_none()
    );
}
