//! Reconciler tests against a real SQLite store (no libvirt): run strategies, requests,
//! scheduling, leases.

use serde_json::json;

use super::*;
use crate::types::kubevirt::phase;

async fn ctx() -> (tempfile::TempDir, Context) {
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(&d.path().join("db")).await.unwrap();
    (d, Context { store })
}

async fn add_node(ctx: &Context, name: &str, mem: u64) {
    ctx.store
        .create(
            Kind::Node,
            json!({"metadata": {"name": name}, "spec": {}, "status": {
                "memoryBytes": mem, "lastHeartbeatTime": crate::types::now(),
                "conditions": [{"type": "Ready", "status": "True"}]}}),
            false,
        )
        .await
        .unwrap();
}

async fn add_vm(ctx: &Context, name: &str, strategy: &str) {
    ctx.store
        .create(
            Kind::VirtualMachine,
            json!({"metadata": {"name": name, "namespace": "default"}, "spec": {
                "runStrategy": strategy,
                "template": {"spec": {"domain": {"memory": {"guest": "1Gi"}, "devices": {}}}}}}),
            false,
        )
        .await
        .unwrap();
}

async fn vmi_phase(ctx: &Context, name: &str) -> Option<String> {
    ctx.store
        .get(Kind::VirtualMachineInstance, "default", name)
        .await
        .unwrap()
        .map(|v| v["status"]["phase"].as_str().unwrap_or("").to_string())
}

#[tokio::test]
async fn always_creates_and_schedules_halted_removes() {
    let (_d, ctx) = ctx().await;
    add_node(&ctx, "n1", 4 << 30).await;
    add_vm(&ctx, "a", "Always").await;
    vm::reconcile_vm(&ctx, "default", "a").await.unwrap();
    assert_eq!(vmi_phase(&ctx, "a").await.as_deref(), Some(phase::PENDING));
    vm::reconcile_vmi(&ctx, "default", "a").await.unwrap();
    let vmi = ctx
        .store
        .get(Kind::VirtualMachineInstance, "default", "a")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(vmi["status"]["phase"], phase::SCHEDULED);
    assert_eq!(vmi["status"]["nodeName"], "n1");
    ctx.store
        .update(Kind::VirtualMachine, "default", "a", |o| {
            o["spec"]["runStrategy"] = json!("Halted");
            Ok(())
        })
        .await
        .unwrap();
    vm::reconcile_vm(&ctx, "default", "a").await.unwrap();
    let vmi = ctx
        .store
        .get(Kind::VirtualMachineInstance, "default", "a")
        .await
        .unwrap()
        .unwrap();
    assert!(
        vmi["metadata"]["deletionTimestamp"].is_string(),
        "VMI not being deleted"
    );
    let vm = ctx
        .store
        .get(Kind::VirtualMachine, "default", "a")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(vm["status"]["printableStatus"], "Stopping");
}

#[tokio::test]
async fn manual_waits_for_start_request_and_unschedulable_is_reported() {
    let (_d, ctx) = ctx().await;
    add_node(&ctx, "small", 512 << 20).await;
    add_vm(&ctx, "m", "Manual").await;
    vm::reconcile_vm(&ctx, "default", "m").await.unwrap();
    assert_eq!(vmi_phase(&ctx, "m").await, None);
    ctx.store
        .update(Kind::VirtualMachine, "default", "m", |o| {
            o["status"]["stateChangeRequests"] = json!([{"action": "Start"}]);
            Ok(())
        })
        .await
        .unwrap();
    vm::reconcile_vm(&ctx, "default", "m").await.unwrap();
    assert_eq!(vmi_phase(&ctx, "m").await.as_deref(), Some(phase::PENDING));
    let a = vm::reconcile_vmi(&ctx, "default", "m").await.unwrap();
    assert!(matches!(a, Action::RequeueAfter(_)));
    let vmi = ctx
        .store
        .get(Kind::VirtualMachineInstance, "default", "m")
        .await
        .unwrap()
        .unwrap();
    let msg = vmi["status"]["conditions"][0]["message"].as_str().unwrap();
    assert!(msg.contains("insufficient memory"), "{msg}");
    vm::reconcile_vm(&ctx, "default", "m").await.unwrap();
    let vm = ctx
        .store
        .get(Kind::VirtualMachine, "default", "m")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(vm["status"]["printableStatus"], "ErrorUnschedulable");
    assert_eq!(vm["status"]["stateChangeRequests"], json!([]));
}

#[tokio::test]
async fn silent_node_turns_instances_unknown() {
    let (_d, ctx) = ctx().await;
    ctx.store
        .create(
            Kind::Node,
            json!({"metadata": {"name": "old"}, "spec": {}, "status": {
                "memoryBytes": 8u64 << 30, "lastHeartbeatTime": "2020-01-01T00:00:00Z",
                "conditions": [{"type": "Ready", "status": "True"}]}}),
            false,
        )
        .await
        .unwrap();
    ctx.store
        .create(
            Kind::VirtualMachineInstance,
            json!({"metadata": {"name": "v", "namespace": "default"}, "spec": {"domain": {"devices": {}}},
                   "status": {"phase": "Running", "nodeName": "old"}}),
            false,
        )
        .await
        .unwrap();
    scheduler::check_leases(&ctx).await.unwrap();
    assert_eq!(vmi_phase(&ctx, "v").await.as_deref(), Some(phase::UNKNOWN));
    assert!(
        ctx.store
            .get(Kind::VirtualMachineInstance, "default", "v")
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn failing_instances_back_off() {
    let (_d, ctx) = ctx().await;
    add_node(&ctx, "n1", 4 << 30).await;
    add_vm(&ctx, "crash", "Always").await;
    vm::reconcile_vm(&ctx, "default", "crash").await.unwrap();
    ctx.store
        .update(Kind::VirtualMachineInstance, "default", "crash", |o| {
            o["status"]["phase"] = json!("Failed");
            o["metadata"]["finalizers"] = json!([]);
            Ok(())
        })
        .await
        .unwrap();
    // The failed instance is removed and the next start waits.
    vm::reconcile_vm(&ctx, "default", "crash").await.unwrap();
    assert_eq!(vmi_phase(&ctx, "crash").await, None);
    let a = vm::reconcile_vm(&ctx, "default", "crash").await.unwrap();
    assert!(
        matches!(a, Action::RequeueAfter(d) if d > Duration::from_secs(5)),
        "{a:?}"
    );
    assert_eq!(
        vmi_phase(&ctx, "crash").await,
        None,
        "restarted without backoff"
    );
    let vm = ctx
        .store
        .get(Kind::VirtualMachine, "default", "crash")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(vm["status"]["startFailure"]["retries"], 1);
    assert_eq!(vm["status"]["printableStatus"], "CrashLoopBackOff");
}

/// A node with the CPU facts of a fixture host (`tests/fixtures/cpu/`).
async fn add_cpu_node(ctx: &Context, name: &str, host: &str) {
    let cpu = crate::cpu::facts::tests::fixture_facts(host, "kvm");
    ctx.store
        .create(
            Kind::Node,
            json!({"metadata": {"name": name}, "spec": {}, "status": {
                "cpu": cpu, "accelerator": "kvm",
                "memoryBytes": 8u64 << 30, "lastHeartbeatTime": crate::types::now(),
                "conditions": [{"type": "Ready", "status": "True"}]}}),
            false,
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn scheduler_places_by_cpu_and_names_what_is_missing() {
    let (_d, ctx) = ctx().await;
    add_cpu_node(&ctx, "intel", "intel-xeon-e5-2660v3").await;
    // EPYC-Rome: only an EPYC Rome host can run it, and there is none yet.
    ctx.store
        .create(
            Kind::VirtualMachine,
            json!({"metadata": {"name": "rome", "namespace": "default"}, "spec": {
                "runStrategy": "Always",
                "template": {"spec": {"domain": {"memory": {"guest": "1Gi"}, "devices": {},
                    "cpu": {"model": "EPYC-Rome"}}}}}}),
            false,
        )
        .await
        .unwrap();
    vm::reconcile_vm(&ctx, "default", "rome").await.unwrap();
    vm::reconcile_vmi(&ctx, "default", "rome").await.unwrap();
    let vmi = ctx
        .store
        .get(Kind::VirtualMachineInstance, "default", "rome")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(vmi["status"]["phase"], phase::PENDING);
    let msg = vmi["status"]["conditions"][0]["message"].as_str().unwrap();
    assert!(
        msg.contains("intel: the node cannot run the VM's CPU model") && msg.ends_with("EPYC-Rome"),
        "{msg}"
    );
    assert_eq!(vmi["status"]["conditions"][0]["reason"], "Unschedulable");
    // An AMD EPYC Rome node joins: the VMI goes there, with the chosen CPU recorded.
    add_cpu_node(&ctx, "amd", "amd-epyc-7502p").await;
    vm::reconcile_vmi(&ctx, "default", "rome").await.unwrap();
    let vmi = ctx
        .store
        .get(Kind::VirtualMachineInstance, "default", "rome")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(vmi["status"]["nodeName"], "amd");
    let g: crate::cpu::GuestCpu = serde_json::from_str(
        vmi["metadata"]["annotations"][crate::cpu::policy::GUEST_CPU_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (g.mode, g.model.as_deref()),
        (crate::cpu::Mode::Custom, Some("EPYC-Rome"))
    );
}

#[test]
fn local_disks_move_only_by_block_migration_when_asked() {
    let vmi = |annotations: serde_json::Value, volume: serde_json::Value| {
        json!({"metadata": {"annotations": annotations}, "spec": {
            "domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {}}]}},
            "volumes": [volume]}})
    };
    let local = json!({"name": "data", "containerDisk": {"image": "img"}});
    let cloud = json!({"name": "ci", "cloudInitNoCloud": {"userData": "#cloud-config"}});
    let plain = json!({"metadata": {}});
    let asked = json!({"metadata": {"annotations": {"edgevirt.io/block-migration": "true"}}});

    // A local disk: not live-migratable, and the message says how to ask for the copy.
    let m = live_migratable(&vmi(json!({}), local.clone()));
    assert!(!m.ok);
    assert_eq!(m.reason, "DisksNotLiveMigratable");
    assert!(
        m.message.contains("data") && m.message.contains("--block"),
        "{m:?}"
    );
    assert_eq!(
        migration_method(&vmi(json!({}), local.clone()), &plain)
            .unwrap_err()
            .reason,
        "DisksNotLiveMigratable"
    );
    // Asked on the migration: copied, this once.
    assert_eq!(
        migration_method(&vmi(json!({}), local.clone()), &asked),
        Ok("BlockMigration")
    );
    // Asked on the instance: live-migratable by block migration.
    let annotated = vmi(json!({"edgevirt.io/block-migration": "true"}), local);
    let m = live_migratable(&annotated);
    assert!(m.ok, "{m:?}");
    assert_eq!(m.method, "BlockMigration");
    assert_eq!(migration_method(&annotated, &plain), Ok("BlockMigration"));
    // Nothing local: a plain live migration whatever was asked.
    assert_eq!(
        migration_method(&vmi(json!({}), cloud.clone()), &asked),
        Ok("LiveMigration")
    );
    // Asking for block migration does not move a bridge interface.
    let mut bridged = vmi(json!({}), cloud);
    bridged["spec"]["domain"]["devices"]["interfaces"] = json!([{"name": "br", "bridge": {}}]);
    assert_eq!(
        migration_method(&bridged, &asked).unwrap_err().reason,
        "InterfaceNotLiveMigratable"
    );
}

#[test]
fn shared_pool_disks_migrate_without_a_copy() {
    let vmi = |volumes: serde_json::Value| json!({"metadata": {}, "spec": {"volumes": volumes}});
    let claim = json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}});
    let local = json!({"name": "root", "containerDisk": {"image": "img"}});
    let asked = json!({"metadata": {"annotations": {"edgevirt.io/block-migration": "true"}}});

    let m = live_migratable(&vmi(json!([claim.clone()])));
    assert!(m.ok, "{m:?}");
    assert_eq!(m.method, "LiveMigration");
    // A claim next to a local disk: a block migration would copy the claim onto itself, so
    // it is refused even when asked, and the message names both kinds.
    let mixed = vmi(json!([claim, local]));
    let m = live_migratable(&mixed);
    assert_eq!((m.ok, m.reason.as_str()), (false, "DisksNotLiveMigratable"));
    assert!(
        m.message.contains("root") && m.message.contains("data"),
        "{m:?}"
    );
    assert_eq!(
        migration_method(&mixed, &asked).unwrap_err().reason,
        "DisksNotLiveMigratable"
    );
}

async fn set_pool(ctx: &Context, node: &str, pool: &str) {
    let pool = pool.to_string();
    ctx.store
        .update(Kind::Node, "", node, move |o| {
            o["status"]["sharedPool"] = json!({"name": pool, "path": "/srv/pool"});
            Ok(())
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn claims_go_only_to_nodes_that_mount_the_shared_pool() {
    let (_d, ctx) = ctx().await;
    // The roomiest node mounts no pool; the claim must not land there.
    add_node(&ctx, "big", 64 << 30).await;
    add_node(&ctx, "p1", 4 << 30).await;
    add_node(&ctx, "p2", 4 << 30).await;
    add_node(&ctx, "other", 8 << 30).await;
    set_pool(&ctx, "p1", "site").await;
    set_pool(&ctx, "p2", "site").await;
    set_pool(&ctx, "other", "elsewhere").await;
    let vmi = json!({"metadata": {"name": "c", "namespace": "default"}, "spec": {
        "domain": {"memory": {"guest": "1Gi"}, "devices": {}},
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}});
    let none = Default::default();
    let (node, _) = scheduler::pick_node(&ctx, &vmi, None, &none)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(node, "big", "a node without the pool cannot open the claim");
    // Migrating from p1: only p2 mounts the same pool ("other" has more room).
    let (node, _) = scheduler::pick_node(&ctx, &vmi, Some("p1"), &none)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node, "p2");
    // With p2 cordoned nothing fits, and the reasons say why for each node.
    ctx.store
        .update(Kind::Node, "", "p2", |o| {
            o["spec"]["unschedulable"] = json!(true);
            Ok(())
        })
        .await
        .unwrap();
    let why = scheduler::pick_node(&ctx, &vmi, Some("p1"), &none)
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        why.contains("big: mounts no shared storage pool")
            && why.contains("other: mounts shared pool elsewhere, not site")
            && why.contains("p2: cordoned"),
        "{why}"
    );
    // A VMI without claims still goes to the roomiest node.
    let plain = json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {
        "domain": {"memory": {"guest": "1Gi"}, "devices": {}}}});
    let (node, _) = scheduler::pick_node(&ctx, &plain, None, &none)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node, "big");
}
