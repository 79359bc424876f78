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

#[tokio::test]
async fn refuses_newer_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edgevirt.db");
    let s = Store::open(&path).await.unwrap();
    sqlx::query("INSERT INTO _sqlx_migrations (version, description, installed_on, success, checksum, execution_time) VALUES (9999, 'future', CURRENT_TIMESTAMP, 1, x'00', 0)")
        .execute(&s.writer)
        .await
        .unwrap();
    drop(s);
    match Store::open(&path).await {
        Err(e @ Error::TooNew { .. }) => {
            assert!(e.to_string().contains("newer than this edgevirt"))
        }
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("opened a newer database"),
    }
}
