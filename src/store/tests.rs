use serde_json::json;

use super::*;
use crate::types::Kind;
use serde_json::Value;
use std::sync::Arc;

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

/// Pages read with keyset paging put together are the full listing, in order, without a
/// duplicate or a gap, even while objects are added between the pages (only keys after the
/// page's end can appear, and they do).
#[tokio::test]
async fn keyset_pages_concatenate_to_the_full_list() {
    let (_d, s) = store().await;
    for i in 0..57 {
        s.create(Kind::VirtualMachine, vm(&format!("vm-{i:03}")), false)
            .await
            .unwrap();
    }
    let mut o = vm("other");
    o["metadata"]["namespace"] = json!("zz");
    s.create(Kind::VirtualMachine, o, false).await.unwrap();
    for ns in [None, Some("default")] {
        let full = s
            .list_raw(
                Kind::VirtualMachine,
                &ListQuery {
                    namespace: ns,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let mut pages = Vec::new();
        let mut after: Option<(String, String)> = None;
        let mut added = 0;
        loop {
            let page = s
                .list_raw(
                    Kind::VirtualMachine,
                    &ListQuery {
                        namespace: ns,
                        after: after.as_ref().map(|(a, b)| (a.as_str(), b.as_str())),
                        limit: Some(10),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            assert!(page.len() <= 10);
            pages.extend(page.iter().map(str::to_string));
            match page.more {
                Some(k) => after = Some(k),
                None => break,
            }
            // Objects added before the cursor between pages do not show up twice or shift
            // the pages.
            s.create(
                Kind::VirtualMachine,
                vm(&format!("a-{}-{added}", ns.is_some())),
                false,
            )
            .await
            .unwrap();
            added += 1;
        }
        let names: Vec<String> = pages
            .iter()
            .map(|b| {
                let v: Value = serde_json::from_str(b).unwrap();
                format!(
                    "{}/{}",
                    v["metadata"]["namespace"].as_str().unwrap(),
                    v["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        let mut sorted = names.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "no duplicates");
        let full: Vec<&str> = full.iter().collect();
        assert_eq!(pages, full, "pages == full listing (namespace {ns:?})");
    }
    // A limit with a label selector counts matching items only.
    let sel = LabelSelector::parse("app in (vm-001, vm-002, vm-003)").unwrap();
    let page = s
        .list_raw(
            Kind::VirtualMachine,
            &ListQuery {
                labels: Some(&sel),
                limit: Some(2),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(page.len(), 2);
    assert_eq!(page.more, Some(("default".into(), "vm-002".into())));
}

/// A listing's stored JSON, put in a list as is, is byte for byte what parsing each object
/// and serializing the list gave before.
#[tokio::test]
async fn raw_listing_equals_parse_and_serialize() {
    let (_d, s) = store().await;
    for i in 0..5 {
        let mut o = vm(&format!("r{i}"));
        o["spec"]["f"] = json!(1.5e300);
        o["metadata"]["annotations"] = json!({"u": "é \" \\ \u{1F600}", "z": null});
        s.create(Kind::VirtualMachine, o, false).await.unwrap();
    }
    let (items, _) = s
        .list(
            Kind::VirtualMachine,
            None,
            &LabelSelector::default(),
            &FieldSelector::default(),
        )
        .await
        .unwrap();
    let raw = s
        .list_raw(Kind::VirtualMachine, &ListQuery::default())
        .await
        .unwrap();
    let old = serde_json::to_string(&items).unwrap();
    assert_eq!(format!("[{}]", raw.items_json()), old);
    assert_eq!(raw.len(), 5);
}

#[test]
fn continue_tokens_round_trip_and_old_ones_are_read() {
    use base64::Engine;
    let c = Continue {
        rv: 42,
        namespace: "default".into(),
        name: "vm-1".into(),
    };
    assert_eq!(Continue::decode(&c.encode()), Some(c));
    let old = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("ns/a");
    assert_eq!(
        Continue::decode(&old),
        Some(Continue {
            rv: 0,
            namespace: "ns".into(),
            name: "a".into()
        })
    );
    assert_eq!(Continue::decode("!!!"), None);
    assert_eq!(Continue::decode("bm9zbGFzaA"), None);
}

/// The watch line encoded once from the stored text is what `json!` and serde_json made of
/// the event before.
#[tokio::test]
async fn watch_lines_equal_serialized_events() {
    let (_d, s) = store().await;
    let mut rx = s.subscribe();
    s.create(Kind::VirtualMachine, vm("w"), false)
        .await
        .unwrap();
    let ev = rx.recv().await.unwrap();
    let mut old = serde_json::to_vec(&json!({"type": ev.event_type, "object": ev.object})).unwrap();
    old.push(b'\n');
    assert_eq!(&ev.watch_line()[..], &old[..]);
    // The same bytes for every watcher: one encoding.
    assert_eq!(ev.watch_line().as_ptr(), ev.watch_line().as_ptr());
}

/// Watchers that start together share one listing; one that subscribed after a listing was
/// made does not get that (older) listing.
#[tokio::test]
async fn watchers_share_one_listing() {
    let (_d, s) = store().await;
    s.create(Kind::VirtualMachine, vm("a"), false)
        .await
        .unwrap();
    let seen = s.published_rv();
    let (c1, l1) = s
        .shared_listing(Kind::VirtualMachine, Some("default"), seen)
        .await
        .unwrap();
    let (_c2, l2) = s
        .shared_listing(Kind::VirtualMachine, Some("default"), seen)
        .await
        .unwrap();
    assert!(Arc::ptr_eq(&l1, &l2));
    s.create(Kind::VirtualMachine, vm("b"), false)
        .await
        .unwrap();
    let (_c3, l3) = s
        .shared_listing(Kind::VirtualMachine, Some("default"), s.published_rv())
        .await
        .unwrap();
    assert!(!Arc::ptr_eq(&l1, &l3));
    assert_eq!(l3.len(), 2);
    drop((c1, l1, l2));
}

/// Rows written out of key order (and some rewritten, which moves them in the table), with
/// multi-byte text in them: listings without a selector (built by SQLite's `group_concat`)
/// hand them out in key order, each item whole, and pages of every size join up to the
/// full listing; a listing through a selector (read row by row) agrees.
/// Every VM in `ns` (all namespaces when None) that `labels` selects.
async fn vms_in(s: &Store, ns: Option<&str>, labels: &LabelSelector) -> RawList {
    let q = ListQuery {
        namespace: ns,
        labels: Some(labels),
        ..Default::default()
    };
    s.list_raw(Kind::VirtualMachine, &q).await.unwrap()
}

#[tokio::test]
async fn listings_keep_key_order() {
    let (_d, s) = store().await;
    let names: Vec<String> = (0..40)
        .map(|i| format!("vm-{:02}", (i * 17) % 40))
        .collect();
    for (i, n) in names.iter().enumerate() {
        let mut o = vm(n);
        o["metadata"]["annotations"] = json!({"note": "é€😀".repeat(i % 5)});
        o["metadata"]["namespace"] = json!(if i % 3 == 0 { "b-ns" } else { "a-ns" });
        s.create(Kind::VirtualMachine, o, false).await.unwrap();
    }
    for n in names.iter().step_by(7) {
        for ns in ["a-ns", "b-ns"] {
            if s.get(Kind::VirtualMachine, ns, n).await.unwrap().is_some() {
                s.update(Kind::VirtualMachine, ns, n, |o| {
                    o["spec"]["x"] = json!("ü".repeat(300));
                    Ok(())
                })
                .await
                .unwrap();
            }
        }
    }
    let key = |item: &str| {
        let v: Value = serde_json::from_str(item).expect("each item is whole JSON");
        (
            v["metadata"]["namespace"].as_str().unwrap().to_string(),
            v["metadata"]["name"].as_str().unwrap().to_string(),
        )
    };
    let everything = LabelSelector::parse("").unwrap();
    let any_app = LabelSelector::parse("app").unwrap();
    for ns in [None, Some("a-ns")] {
        let whole = vms_in(&s, ns, &everything).await;
        let keys: Vec<_> = whole.iter().map(key).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted, "a listing in key order");
        assert_eq!(keys.len(), if ns.is_none() { 40 } else { 26 });
        assert_eq!(
            format!("[{}]", whole.items_json()).len(),
            whole.items_json().len() + 2
        );
        let row_by_row = vms_in(&s, ns, &any_app).await;
        assert_eq!(row_by_row.items_json(), whole.items_json());
        for limit in [1, 3, 25, 40, 41] {
            let (mut joined, mut after) = (Vec::new(), None::<(String, String)>);
            loop {
                let page = s
                    .list_raw(
                        Kind::VirtualMachine,
                        &ListQuery {
                            namespace: ns,
                            after: after.as_ref().map(|(a, b)| (a.as_str(), b.as_str())),
                            limit: Some(limit),
                            ..Default::default()
                        },
                    )
                    .await
                    .unwrap();
                assert!(page.len() <= limit);
                joined.extend(page.iter().map(str::to_string));
                match page.more.clone() {
                    Some(k) => {
                        assert_eq!(
                            k,
                            key(page.iter().last().unwrap()),
                            "a page ends on its last key"
                        );
                        after = Some(k);
                    }
                    None => break,
                }
            }
            assert_eq!(
                joined,
                whole.iter().map(str::to_string).collect::<Vec<_>>(),
                "limit {limit}"
            );
        }
    }
}

/// SQLITE_DBSTATUS_CACHE_MISS of one connection: the pages it has read from the file.
async fn cache_misses(conn: &mut sqlx::SqliteConnection) -> i32 {
    use libsqlite3_sys::{SQLITE_DBSTATUS_CACHE_MISS, sqlite3_db_status};
    let mut handle = conn.lock_handle().await.unwrap();
    let (mut now, mut high) = (0, 0);
    // SAFETY: the connection is locked for this call and both out-pointers are valid.
    let rc = unsafe {
        sqlite3_db_status(
            handle.as_raw_handle().as_ptr(),
            SQLITE_DBSTATUS_CACHE_MISS,
            &mut now,
            &mut high,
            0,
        )
    };
    assert_eq!(rc, 0);
    now
}

/// The connections' page caches share one pool (see `schema::CACHE_KIB`). After a write
/// that touches every page of a store larger than SQLite's default caches (it left the
/// writer holding the whole pool), a reader must still keep the pages it reads: a 500-item
/// page read twice reads the file once. With the default cache size the second read missed
/// as often as the first.
#[tokio::test]
async fn a_reader_keeps_its_pages_after_a_large_write() {
    let (_d, s) = store().await;
    // ~12 MB of rows in one transaction: more than five connections' default 2 MiB.
    let filler = "x".repeat(1500);
    let mut tx = s.writer.begin().await.unwrap();
    for i in 0..8000 {
        let name = format!("vm-{i:05}");
        let body =
            json!({"metadata": {"name": name, "namespace": "default"}, "spec": {"f": filler}});
        sqlx::query(
            "INSERT INTO objects (kind, namespace, name, uid, resource_version, body) \
             VALUES ('VirtualMachine', 'default', ?, ?, 1, ?)",
        )
        .bind(&name)
        .bind(format!("uid-{i}"))
        .bind(body.to_string())
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    // Every reader has read everything; then one write touches every row.
    let mut readers = Vec::new();
    for _ in 0..super::schema::READERS {
        readers.push(s.reader.acquire().await.unwrap());
    }
    let all = "SELECT count(*), sum(length(body)) FROM objects";
    for r in readers.iter_mut() {
        sqlx::query(all).fetch_one(&mut **r).await.unwrap();
    }
    sqlx::query("UPDATE objects SET phase = 'Stopped'")
        .execute(&s.writer)
        .await
        .unwrap();
    let page = "SELECT length(group_concat(body, ',')) FROM (SELECT body FROM objects \
                WHERE kind = 'VirtualMachine' AND namespace = 'default' ORDER BY namespace, name LIMIT 500)";
    let r = &mut *readers[0];
    let m0 = cache_misses(r).await;
    sqlx::query(page).fetch_one(&mut *r).await.unwrap();
    let m1 = cache_misses(r).await;
    sqlx::query(page).fetch_one(&mut *r).await.unwrap();
    let m2 = cache_misses(r).await;
    assert!(
        m1 - m0 > 100,
        "the first read of the page reads the file ({} misses)",
        m1 - m0
    );
    assert_eq!(
        m2 - m1,
        0,
        "the second read of the page missed the cache {} times",
        m2 - m1
    );
}

/// An expired token is no token; a use is written once a minute, not once per request.
#[tokio::test]
async fn tokens_expire_and_record_their_last_use() {
    let (_d, s) = store().await;
    let now = chrono::Utc::now().timestamp();
    s.add_expiring_token("h-old", "u", "viewer", "", Some(now - 1))
        .await
        .unwrap();
    s.add_expiring_token("h-new", "u", "viewer", "", Some(now + 60))
        .await
        .unwrap();
    s.add_token("h-ever", "u", "viewer", "").await.unwrap();
    assert_eq!(s.token("h-old").await.unwrap(), None);
    assert!(s.token("h-new").await.unwrap().is_some());
    assert!(s.token("h-ever").await.unwrap().is_some());
    let last = |h: &'static str| {
        let s = s.clone();
        async move {
            s.tokens()
                .await
                .unwrap()
                .into_iter()
                .find(|t| match h {
                    "h-new" => t.expires == Some(now + 60),
                    _ => t.expires.is_none(),
                })
                .unwrap()
                .last_used
        }
    };
    assert_eq!(last("h-ever").await, None);
    let writes = s.writes();
    for _ in 0..5 {
        s.touch_token("h-ever").await.unwrap();
    }
    assert!(last("h-ever").await.is_some());
    assert_eq!(s.writes() - writes, 1, "five uses in a minute: one write");
}

/// Each change records when it was made and, inside a request's scope, by whom; the
/// controller's own changes name nobody.
#[tokio::test]
async fn changes_record_their_time_and_actor() {
    let (_d, s) = store().await;
    let o = super::events::ACTOR
        .scope(
            "alice".to_string(),
            s.create(Kind::VirtualMachine, vm("a"), false),
        )
        .await
        .unwrap();
    let uid = o["metadata"]["uid"].as_str().unwrap().to_string();
    s.update(Kind::VirtualMachine, "default", "a", |v| {
        v["metadata"]["labels"] = json!({"x": "y"});
        Ok(())
    })
    .await
    .unwrap();
    let h = s
        .object_history(Kind::VirtualMachine, "default", "a", &uid, 10)
        .await
        .unwrap();
    let who: Vec<Option<&str>> = h.iter().map(|c| c.actor.as_deref()).collect();
    assert_eq!(who, [None, Some("alice")]);
    for c in &h {
        let at = c.at.as_deref().expect("a time");
        assert!(chrono::DateTime::parse_from_rfc3339(at).is_ok(), "{at}");
    }
}

#[tokio::test]
async fn an_objects_history_is_its_own_not_that_of_an_older_namesake() {
    let (_d, s) = store().await;
    let old = s
        .create(Kind::VirtualMachine, vm("a"), false)
        .await
        .unwrap();
    let old_uid = old["metadata"]["uid"].as_str().unwrap().to_string();
    let mut inst = vm("a");
    inst["metadata"]["ownerReferences"] =
        json!([{"kind": "VirtualMachine", "name": "a", "uid": old_uid}]);
    s.create(Kind::VirtualMachineInstance, inst, false)
        .await
        .unwrap();
    s.delete(Kind::VirtualMachineInstance, "default", "a", None)
        .await
        .unwrap();
    s.delete(Kind::VirtualMachine, "default", "a", None)
        .await
        .unwrap();
    let new = s
        .create(Kind::VirtualMachine, vm("a"), false)
        .await
        .unwrap();
    let new_uid = new["metadata"]["uid"].as_str().unwrap().to_string();
    assert_ne!(old_uid, new_uid);
    let mut inst = vm("a");
    inst["metadata"]["ownerReferences"] =
        json!([{"kind": "VirtualMachine", "name": "a", "uid": new_uid}]);
    s.create(Kind::VirtualMachineInstance, inst, false)
        .await
        .unwrap();

    let vm_h = s
        .object_history(Kind::VirtualMachine, "default", "a", &new_uid, 50)
        .await
        .unwrap();
    let types: Vec<_> = vm_h.iter().map(|c| c.change_type.as_str()).collect();
    assert_eq!(types, ["ADDED"], "only the new VM's creation");
    let vmi_h = s
        .object_history(Kind::VirtualMachineInstance, "default", "a", &new_uid, 50)
        .await
        .unwrap();
    let types: Vec<_> = vmi_h.iter().map(|c| c.change_type.as_str()).collect();
    assert_eq!(types, ["ADDED"], "only the new VM's instance");
    // The old VM's history is still there, under its own uid.
    let old_h = s
        .object_history(Kind::VirtualMachine, "default", "a", &old_uid, 50)
        .await
        .unwrap();
    let types: Vec<_> = old_h.iter().map(|c| c.change_type.as_str()).collect();
    assert_eq!(types, ["DELETED", "ADDED"]);
}
