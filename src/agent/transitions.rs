//! Each transition of the agent, driven step by step against the fakes of its two seams
//! (`agent::fake`) and the in-memory hypervisor: no root, libvirtd or controller.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::fake::{FakeControlPlane, FakeLauncher, FakeLaunchers, MigrateOutcome, VMI, VMIM, set};
use super::prepare::domain_name;
use super::{Agent, Config, migrate, sync};
use crate::hypervisor::Hypervisor;
use crate::hypervisor::fake::Fake as FakeHv;
use crate::launcher::client::LauncherError;
use crate::types::annotations::LAUNCHER_FINALIZER;
use crate::types::kubevirt::{
    ConditionStatus, ConditionType, MigrationMethod, MigrationPhase, Phase, condition,
    condition_true,
};
use crate::types::{Typed, VirtualMachineInstance, VirtualMachineInstanceMigration};

const ME: &str = "n1";

struct World {
    agent: Arc<Agent>,
    cp: Arc<FakeControlPlane>,
    ls: Arc<FakeLaunchers>,
    hv: Arc<FakeHv>,
    _dir: tempfile::TempDir,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    for d in ["run/launchers", "run/vmi", "images", "volumes", "log"] {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    let hv = Arc::new(FakeHv::default());
    let cp = Arc::new(FakeControlPlane::default());
    let ls = Arc::new(FakeLaunchers::new(hv.clone()));
    let cfg = Config {
        node_name: ME.into(),
        data_dir: dir.path().to_path_buf(),
        libvirt_uri: "test:///default".into(),
        accel: "qemu".into(),
        controller_url: "http://127.0.0.1:9".into(),
        token: "t".into(),
        ca_file: None,
        cert_pin: None,
        exe: "/bin/false".into(),
        nat_network: "evnet".into(),
        nat_prefix: "10.77.0".into(),
        shared_pool: None,
        backup_targets: vec![],
        host_disk_dir: None,
        registry_mirrors: Default::default(),
        image_gc_grace: std::time::Duration::ZERO,
        stats_interval: std::time::Duration::from_secs(15),
        migration_address: None,
    };
    let agent = Arc::new(Agent {
        api: crate::client::Client::new(&cfg.controller_url, "t", None, false).unwrap(),
        cfg,
        cp: cp.clone(),
        hv: hv.clone(),
        accel: "qemu".into(),
        accel_reason: "asked for (--accel qemu)".into(),
        install_id: "install-1".into(),
        launchers: ls.clone(),
        starting: Mutex::new(HashMap::new()),
        stopping: Mutex::new(HashMap::new()),
        wake: Arc::new(tokio::sync::Notify::new()),
        migrating: Mutex::new(Default::default()),
        incoming: Mutex::new(Default::default()),
        migrations: Mutex::new(Default::default()),
        migration_dir: dir.path().join("migration"),
        disks: crate::registry::Cache::new(dir.path().join("images/registry"), Default::default()),
        prepare_retry: Default::default(),
        wake_fills: Default::default(),
        push_jobs: Default::default(),
        backup_chains: Default::default(),
        guest: Default::default(),
    });
    World {
        agent,
        cp,
        ls,
        hv,
        _dir: dir,
    }
}

/// A VMI as the controller stores it, with fields of some future release at every level.
fn vmi_json(uid: &str, phase: &str, node: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "a", "namespace": "default", "uid": uid,
                     "finalizers": [LAUNCHER_FINALIZER], "futureMeta": 1},
        "spec": {"domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {}}]},
                            "resources": {"requests": {"memory": "64Mi"}}},
                 "networks": [{"name": "default", "pod": {}}],
                 "terminationGracePeriodSeconds": 5},
        "status": {"phase": phase, "nodeName": node, "futureStatus": {"k": 1}}
    })
}

fn dom(uid: &str) -> String {
    domain_name("default", "a", uid)
}

fn vmi(w: &World) -> VirtualMachineInstance {
    VirtualMachineInstance::from_value(w.cp.get(VMI, "default/a").expect("the VMI exists")).unwrap()
}

fn vmi_status(w: &World) -> crate::types::kubevirt::VirtualMachineInstanceStatus {
    vmi(w).status.unwrap_or_default()
}

fn migration(w: &World) -> VirtualMachineInstanceMigration {
    VirtualMachineInstanceMigration::from_value(w.cp.get(VMIM, "default/m1").unwrap()).unwrap()
}

fn migration_phase(w: &World) -> Option<MigrationPhase> {
    migration(w).status.and_then(|s| s.phase)
}

/// A VMI running here: its domain in the hypervisor, its launcher serving it.
fn running(w: &World, uid: &str) {
    w.cp.insert(VMI, vmi_json(uid, "Running", ME));
    w.hv.create(&format!("<domain><name>{}</name></domain>", dom(uid)))
        .unwrap();
    w.ls.running.lock().unwrap().insert(
        uid.into(),
        FakeLauncher {
            domain: dom(uid),
            version: "test-release".into(),
        },
    );
}

/// Poll until `f` answers (the tasks under test run on the same runtime meanwhile).
async fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..2000 {
        if let Some(t) = f() {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

fn starts(w: &World) -> usize {
    w.ls.calls()
        .iter()
        .filter(|c| c.starts_with("start "))
        .count()
}

#[tokio::test]
async fn a_new_vmi_gets_a_launcher_then_reports_running() {
    let w = world();
    let uid = "u-new-0001";
    w.cp.insert(VMI, vmi_json(uid, "Scheduled", ME));

    sync::sync_all(&w.agent, false).await.unwrap();
    assert_eq!(w.ls.calls(), vec![format!("start {uid}")]);
    assert!(w.agent.starting.lock().await.contains_key(uid));
    assert!(w.hv.state(&dom(uid)).unwrap().is_some(), "the domain runs");
    let xml = std::fs::read_to_string(w.agent.run_dir(uid).join("domain.xml")).unwrap();
    assert!(xml.contains(&dom(uid)), "{xml}");
    assert!(w.cp.calls("put_vmi_status").is_empty());

    sync::sync_all(&w.agent, false).await.unwrap();
    assert_eq!(starts(&w), 1, "one launcher");
    assert!(!w.agent.starting.lock().await.contains_key(uid));
    let st = vmi_status(&w);
    assert_eq!(st.phase, Some(Phase::Running));
    assert_eq!(st.node_name.as_deref(), Some(ME));
    assert_eq!(st.domain_name, Some(dom(uid)));
    assert_eq!(st.launcher_version.as_deref(), Some("test-release"));
    assert_eq!(st.migration_method, Some(MigrationMethod::LiveMigration));
    assert!(st.phase_transition_timestamps_map.contains_key("Running"));
    // KubeVirt's array, in order, one entry per phase entered.
    let phases: Vec<String> = st
        .phase_transition_timestamps
        .iter()
        .map(|t| t.phase.to_string())
        .collect();
    assert_eq!(
        phases.last().map(String::as_str),
        Some("Running"),
        "{phases:?}"
    );
    assert_eq!(
        phases.iter().filter(|p| *p == "Running").count(),
        1,
        "{phases:?}"
    );
    assert!(
        st.phase_transition_timestamps
            .iter()
            .all(|t| t.phase_transition_timestamp.ends_with('Z'))
    );
    assert!(condition_true(&st.conditions, &ConditionType::Ready));
    assert!(condition_true(
        &st.conditions,
        &ConditionType::AgentConnected
    ));
    assert!(condition_true(
        &st.conditions,
        &ConditionType::LiveMigratable
    ));
    assert_eq!(
        condition(&st.conditions, &ConditionType::Paused).map(|c| &c.status),
        Some(&ConditionStatus::False)
    );
    assert_eq!(st.interfaces.len(), 1);
    assert_eq!(st.interfaces[0].name.as_deref(), Some("default"));
    assert_eq!(st.interfaces[0].ip_address.as_deref(), Some("10.77.0.10"));
    // What this release does not know is kept.
    let raw = w.cp.get(VMI, "default/a").unwrap();
    assert_eq!(
        raw.pointer("/status/futureStatus").unwrap(),
        &json!({"k": 1})
    );
    assert_eq!(raw.pointer("/metadata/futureMeta").unwrap(), 1);

    // Nothing changed: nothing is written.
    sync::sync_all(&w.agent, false).await.unwrap();
    assert_eq!(w.cp.calls("put_vmi_status").len(), 1);
}

#[tokio::test]
async fn a_guest_that_powers_off_ends_its_vmi() {
    let w = world();
    let uid = "u-off-0001";
    running(&w, uid);
    sync::sync_all(&w.agent, false).await.unwrap();
    assert_eq!(vmi_status(&w).phase, Some(Phase::Running));

    w.hv.shutdown(&dom(uid)).unwrap();
    sync::sync_all(&w.agent, false).await.unwrap();
    let st = vmi_status(&w);
    assert_eq!(st.phase, Some(Phase::Succeeded));
    assert_eq!(st.reason.as_deref(), Some("GuestShutdown"));
    let ready = condition(&st.conditions, &ConditionType::Ready).unwrap();
    assert_eq!(ready.status, ConditionStatus::False);
    assert_eq!(ready.reason.as_deref(), Some("GuestShutdown"));
    assert!(!condition_true(
        &st.conditions,
        &ConditionType::AgentConnected
    ));
    assert_eq!(starts(&w), 0);

    // A final instance is left alone.
    let writes = w.cp.calls.lock().unwrap().len();
    sync::sync_all(&w.agent, false).await.unwrap();
    assert_eq!(w.cp.calls.lock().unwrap().len(), writes);
}

#[tokio::test]
async fn a_paused_annotation_pauses_and_is_reported() {
    let w = world();
    let uid = "u-pause-001";
    running(&w, uid);
    w.cp.edit(VMI, "default/a", |v| {
        set(
            v,
            "/metadata/annotations",
            json!({crate::types::annotations::PAUSED_ANNOTATION: "true"}),
        )
    });
    sync::sync_all(&w.agent, false).await.unwrap();
    assert_eq!(w.ls.calls(), vec![format!("call {uid} Pause")]);
    let st = vmi_status(&w);
    assert!(condition_true(&st.conditions, &ConditionType::Paused));
    let ready = condition(&st.conditions, &ConditionType::Ready).unwrap();
    assert_eq!(
        (ready.status.clone(), ready.reason.as_deref()),
        (ConditionStatus::False, Some("Paused"))
    );
}

#[tokio::test]
async fn deletion_shuts_the_guest_down_then_releases_the_vmi() {
    let w = world();
    let uid = "u-del-00001";
    running(&w, uid);
    w.cp.edit(VMI, "default/a", |v| {
        set(
            v,
            "/metadata/deletionTimestamp",
            json!("2026-01-01T00:00:00Z"),
        )
    });

    sync::sync_all(&w.agent, false).await.unwrap();
    assert_eq!(
        w.ls.calls(),
        vec![format!("call {uid} Shutdown {{ grace_secs: 5 }}")]
    );
    assert!(w.agent.stopping.lock().await.contains_key(uid));
    assert!(w.cp.calls("patch_vmi").is_empty(), "not released yet");
    assert!(vmi(&w).metadata.finalizers.is_some());

    // The guest is down: the finalizer goes, and with it the VMI.
    sync::sync_all(&w.agent, false).await.unwrap();
    let patches = w.cp.calls("patch_vmi");
    assert_eq!(patches.len(), 1);
    assert_eq!(patches[0].body, json!({"metadata": {"finalizers": []}}));
    assert!(w.cp.get(VMI, "default/a").is_none());
    assert!(w.ls.calls().contains(&format!("forget {uid}")));
    assert!(w.agent.stopping.lock().await.is_empty());
    assert!(w.cp.calls("put_vmi_status").is_empty());
}

#[tokio::test]
async fn a_running_launcher_is_adopted_after_an_agent_restart() {
    let w = world();
    let uid = "u-adopt-001";
    running(&w, uid);

    let adopted = w.agent.launchers.adopt_all().await;
    assert_eq!(adopted, vec![uid.to_string()]);
    sync::sync_all(&w.agent, false).await.unwrap();
    assert_eq!(starts(&w), 0, "no second launcher: {:?}", w.ls.calls());
    assert!(w.hv.state(&dom(uid)).unwrap().is_some());
    assert_eq!(vmi_status(&w).phase, Some(Phase::Running));
}

#[tokio::test]
async fn a_crashed_launcher_is_replaced_and_adopts_the_running_domain() {
    let w = world();
    let uid = "u-crash-001";
    running(&w, uid);
    w.ls.running.lock().unwrap().clear();

    sync::sync_all(&w.agent, false).await.unwrap();
    assert_eq!(w.ls.calls(), vec![format!("start {uid}")]);
    // The domain was not created anew: the new launcher serves the one that ran.
    assert_eq!(
        w.hv.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.starts_with("create"))
            .count(),
        1
    );
    sync::sync_all(&w.agent, false).await.unwrap();
    assert_eq!(vmi_status(&w).phase, Some(Phase::Running));
    assert_eq!(starts(&w), 1);
}

#[tokio::test]
async fn a_crashed_launcher_whose_domain_is_gone_ends_the_vmi() {
    let w = world();
    let uid = "u-gone-0001";
    w.cp.insert(VMI, vmi_json(uid, "Running", ME));
    sync::sync_all(&w.agent, false).await.unwrap();
    let st = vmi_status(&w);
    assert_eq!(st.phase, Some(Phase::Succeeded));
    assert_eq!(st.reason.as_deref(), Some("DomainGone"));
    assert_eq!(starts(&w), 0);
}

#[tokio::test]
async fn a_launcher_that_fails_to_start_fails_the_vmi() {
    let w = world();
    let uid = "u-fail-0001";
    w.cp.insert(VMI, vmi_json(uid, "Scheduled", ME));
    w.ls.fail_start
        .lock()
        .unwrap()
        .insert(uid.into(), "cannot open the domain XML".into());
    sync::sync_all(&w.agent, false).await.unwrap();
    assert_eq!(vmi_status(&w).phase, Some(Phase::Scheduled));
    sync::sync_all(&w.agent, false).await.unwrap();
    let st = vmi_status(&w);
    assert_eq!(st.phase, Some(Phase::Failed));
    assert_eq!(st.reason.as_deref(), Some("LauncherFailed"));
    assert_eq!(starts(&w), 1);
}

#[tokio::test]
async fn an_unowned_domain_of_this_installation_is_destroyed() {
    let w = world();
    // A domain this agent created for a VMI that no longer exists.
    let xml = format!(
        "<domain><name>ev-default-x-12345678</name><metadata><ev:instance xmlns:ev='{}' install='install-1' node='{ME}' vmi-uid='u-old'/></metadata></domain>",
        crate::hypervisor::METADATA_NS
    );
    w.hv.create(&xml).unwrap();
    // One of another node sharing the libvirtd stays.
    w.hv.create(&xml.replace("x-12345678", "y-12345678").replace(ME, "n9"))
        .unwrap();
    sync::sync_all(&w.agent, false).await.unwrap();
    assert!(w.hv.state("ev-default-x-12345678").unwrap().is_none());
    assert!(w.hv.state("ev-default-y-12345678").unwrap().is_some());
    assert_eq!(w.ls.calls(), vec!["forget u-old".to_string()]);
}

#[tokio::test]
async fn a_vmi_that_does_not_decode_keeps_its_domain() {
    let w = world();
    let uid = "u-odd-00001";
    running(&w, uid);
    let xml = format!(
        "<domain><name>{}</name><metadata><ev:instance xmlns:ev='{}' install='install-1' node='{ME}' vmi-uid='{uid}'/></metadata></domain>",
        dom("b"),
        crate::hypervisor::METADATA_NS
    );
    w.hv.create(&xml).unwrap();
    // A newer peer wrote a status this release reads differently.
    w.cp.edit(VMI, "default/a", |v| {
        set(v, "/status/conditions", json!("odd"))
    });
    sync::sync_all(&w.agent, false).await.unwrap();
    assert!(w.hv.state(&dom("b")).unwrap().is_some(), "not swept");
    assert!(w.cp.calls.lock().unwrap().is_empty(), "left alone");
}

fn migration_json(phase: &str, source: &str, target: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": "m1", "namespace": "default", "uid": "mig-00001"},
        "spec": {"vmiName": "a"},
        "status": {"phase": phase, "futureMigration": true,
                   "migrationState": {"sourceNode": source, "targetNode": target}}
    })
}

#[tokio::test]
async fn migration_target_prepares_publishes_its_domain_and_finishes() {
    let w = world();
    let uid = "u-tgt-00001";
    w.cp.insert(VMI, vmi_json(uid, "Running", "n0"));
    w.cp.insert(VMIM, migration_json("Scheduled", "n0", ME));

    migrate::sync(&w.agent).await.unwrap();
    until("TargetReady", || {
        (migration_phase(&w) == Some(MigrationPhase::TargetReady)).then_some(())
    })
    .await;
    let st = migration(&w).status.unwrap();
    let phases: Vec<_> = st
        .phase_transition_timestamps
        .iter()
        .map(|p| p.phase.clone())
        .collect();
    assert_eq!(
        phases,
        vec![MigrationPhase::PreparingTarget, MigrationPhase::TargetReady]
    );
    assert!(
        st.target_domain
            .as_deref()
            .is_some_and(|x| x.contains(&dom(uid)))
    );
    assert_eq!(
        migration(&w).status.unwrap().phase,
        Some(MigrationPhase::TargetReady)
    );
    assert_eq!(
        w.cp.get(VMIM, "default/m1")
            .unwrap()
            .pointer("/status/futureMigration")
            .cloned()
            .unwrap(),
        true
    );
    assert!(w.agent.incoming.lock().await.contains(uid));
    until("a tunnel side waiting", || {
        (!w.cp.calls("tunnel").is_empty()).then_some(())
    })
    .await;
    assert_eq!(
        w.cp.calls("tunnel")[0].key,
        "/migration-tunnel/default/m1/0?side=target"
    );
    // A migration that does not decode for a while stops nothing.
    let good = w.cp.get(VMIM, "default/m1").unwrap();
    w.cp.edit(VMIM, "default/m1", |v| set(v, "/status/phase", json!(7)));
    migrate::sync(&w.agent).await.unwrap();
    assert!(w.agent.incoming.lock().await.contains(uid));
    assert_eq!(w.agent.migrations.lock().await.len(), 1);
    w.cp.insert(VMIM, good);

    // The source reports success: the target stops waiting and takes the instance.
    w.cp.edit(VMIM, "default/m1", |v| {
        set(v, "/status/phase", json!("Succeeded"))
    });
    migrate::sync(&w.agent).await.unwrap();
    assert!(!w.agent.incoming.lock().await.contains(uid));
    assert!(w.agent.migrations.lock().await.is_empty());
}

/// A VMI running here with a migration whose target is ready.
fn source_world(uid: &str) -> World {
    let w = world();
    running(&w, uid);
    let mut m = migration_json("TargetReady", ME, "n2");
    set(
        &mut m,
        "/status/targetDomain",
        json!("<domain><name>moved</name></domain>"),
    );
    w.cp.insert(VMIM, m);
    w
}

#[tokio::test]
async fn migration_source_migrates_and_hands_the_vmi_to_the_target() {
    let uid = "u-src-00001";
    let w = source_world(uid);
    migrate::sync(&w.agent).await.unwrap();
    until("Succeeded", || {
        (migration_phase(&w) == Some(MigrationPhase::Succeeded)).then_some(())
    })
    .await;
    assert!(
        w.ls.calls()
            .contains(&format!("migrate {uid} block=false xml=35")),
        "{:?}",
        w.ls.calls()
    );
    let st = vmi_status(&w);
    assert_eq!(st.node_name.as_deref(), Some("n2"));
    let ms = st.migration_state.unwrap();
    assert!(ms.completed && !ms.failed);
    assert!(ms.start_timestamp.is_some() && ms.end_timestamp.is_some());
    let mst = migration(&w).status.unwrap();
    assert!(mst.migration_state.as_ref().unwrap().completed);
    let phases: Vec<_> = mst
        .phase_transition_timestamps
        .iter()
        .map(|p| p.phase.clone())
        .collect();
    assert_eq!(
        phases,
        vec![MigrationPhase::Running, MigrationPhase::Succeeded]
    );
    // The instance is no longer this node's: the sync loop leaves it alone.
    assert!(w.agent.migrating.lock().await.contains(uid));
    assert!(w.hv.state(&dom(uid)).unwrap().is_none());
}

#[tokio::test]
async fn a_failed_migration_leaves_the_vm_running_here() {
    let uid = "u-srcf-0001";
    let w = source_world(uid);
    *w.ls.migrate_outcome.lock().unwrap() = MigrateOutcome::Fail(LauncherError::Libvirt(
        "unable to connect to the target".into(),
    ));
    migrate::sync(&w.agent).await.unwrap();
    until("Failed", || {
        (migration_phase(&w) == Some(MigrationPhase::Failed)).then_some(())
    })
    .await;
    let ms = migration(&w).status.unwrap().migration_state.unwrap();
    assert!(ms.failed && !ms.completed);
    assert_eq!(
        ms.failure_reason.as_deref(),
        Some("libvirt: unable to connect to the target")
    );
    assert_eq!(ms.abort_status, None);
    let st = vmi_status(&w);
    assert_eq!(st.node_name.as_deref(), Some(ME));
    assert!(st.migration_state.unwrap().failed);
    assert!(!w.agent.migrating.lock().await.contains(uid));
    assert!(w.hv.state(&dom(uid)).unwrap().is_some());
    // The sync loop owns the instance again.
    sync::sync_all(&w.agent, false).await.unwrap();
    assert_eq!(vmi_status(&w).phase, Some(Phase::Running));
}

#[tokio::test]
async fn an_aborted_migration_is_cancelled_and_the_vm_stays() {
    let uid = "u-abrt-0001";
    let w = source_world(uid);
    *w.ls.migrate_outcome.lock().unwrap() = MigrateOutcome::UntilAborted;
    migrate::sync(&w.agent).await.unwrap();
    until("the launcher migrating", || {
        w.ls.calls()
            .iter()
            .any(|c| c.starts_with("migrate "))
            .then_some(())
    })
    .await;
    assert_eq!(migration_phase(&w), Some(MigrationPhase::Running));

    w.cp.edit(VMIM, "default/m1", |v| {
        set(v, "/status/migrationState/abortRequested", json!(true))
    });
    migrate::sync(&w.agent).await.unwrap();
    assert!(w.ls.calls().contains(&format!("abort {uid}")));
    // Asked once only.
    migrate::sync(&w.agent).await.unwrap();
    until("Failed", || {
        (migration_phase(&w) == Some(MigrationPhase::Failed)).then_some(())
    })
    .await;
    assert_eq!(
        w.ls.calls()
            .iter()
            .filter(|c| c.starts_with("abort "))
            .count(),
        1
    );
    let ms = migration(&w).status.unwrap().migration_state.unwrap();
    assert_eq!(ms.abort_status.as_deref(), Some("Succeeded"));
    assert!(
        ms.failure_reason
            .as_deref()
            .is_some_and(|r| r.starts_with("aborted: ")),
        "{ms:?}"
    );
    assert_eq!(vmi_status(&w).node_name.as_deref(), Some(ME));
    assert!(w.hv.state(&dom(uid)).unwrap().is_some());
}
