//! Reconciler tests against a real SQLite store (no libvirt): run strategies, requests,
//! scheduling, leases.

use serde_json::json;

use super::*;
use crate::types::edgevirt::SharedPool;
use crate::types::kubevirt::{ConditionType, Phase, RunStrategy, StateChangeRequest, condition};
use crate::types::{Meta, Node, Typed, VirtualMachine, VirtualMachineInstance};

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

/// A ready node with `mem` bytes, labelled `zone=ZONE` when a zone is given.
async fn add_zoned_node(ctx: &Context, name: &str, mem: u64, zone: Option<&str>) {
    add_node(ctx, name, mem).await;
    if let Some(zone) = zone {
        let zone = zone.to_string();
        ctx.store
            .update_typed("", name, move |o: &mut Node| {
                o.metadata
                    .labels
                    .get_or_insert_default()
                    .insert("zone".into(), zone);
                Ok(())
            })
            .await
            .unwrap();
    }
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

async fn vmi_phase(ctx: &Context, name: &str) -> Option<Phase> {
    get_vmi(ctx, name).await.map(|v| v.phase())
}

async fn get_vmi(ctx: &Context, name: &str) -> Option<VirtualMachineInstance> {
    ctx.store.get_typed("default", name).await.unwrap()
}

async fn get_vm(ctx: &Context, name: &str) -> VirtualMachine {
    ctx.store.get_typed("default", name).await.unwrap().unwrap()
}

fn printable(vm: &VirtualMachine) -> &str {
    vm.status
        .as_ref()
        .and_then(|s| s.printable_status.as_deref())
        .unwrap_or_default()
}

/// The message and reason of a VMI's PodScheduled condition.
fn scheduled_condition(v: &VirtualMachineInstance) -> (String, String) {
    let c = condition(v.conditions(), &ConditionType::PodScheduled).expect("PodScheduled");
    (
        c.message.clone().unwrap_or_default(),
        c.reason.clone().unwrap_or_default(),
    )
}

#[tokio::test]
async fn always_creates_and_schedules_halted_removes() {
    let (_d, ctx) = ctx().await;
    add_node(&ctx, "n1", 4 << 30).await;
    add_vm(&ctx, "a", "Always").await;
    vm::reconcile_vm(&ctx, "default", "a").await.unwrap();
    assert_eq!(vmi_phase(&ctx, "a").await, Some(Phase::Pending));
    vm::reconcile_vmi(&ctx, "default", "a").await.unwrap();
    let vmi = get_vmi(&ctx, "a").await.unwrap();
    assert_eq!(vmi.phase(), Phase::Scheduled);
    assert_eq!(vmi.node_name(), Some("n1"));
    ctx.store
        .update_typed("default", "a", |o: &mut VirtualMachine| {
            o.spec.run_strategy = Some(RunStrategy::Halted);
            Ok(())
        })
        .await
        .unwrap();
    vm::reconcile_vm(&ctx, "default", "a").await.unwrap();
    let vmi = get_vmi(&ctx, "a").await.unwrap();
    assert!(vmi.deleting(), "VMI not being deleted");
    let vm = get_vm(&ctx, "a").await;
    assert_eq!(printable(&vm), "Stopping");
}

#[tokio::test]
async fn manual_waits_for_start_request_and_unschedulable_is_reported() {
    let (_d, ctx) = ctx().await;
    add_node(&ctx, "small", 512 << 20).await;
    add_vm(&ctx, "m", "Manual").await;
    vm::reconcile_vm(&ctx, "default", "m").await.unwrap();
    assert_eq!(vmi_phase(&ctx, "m").await, None);
    ctx.store
        .update_typed("default", "m", |o: &mut VirtualMachine| {
            o.status.get_or_insert_default().state_change_requests = vec![StateChangeRequest {
                action: "Start".into(),
                uid: None,
            }];
            Ok(())
        })
        .await
        .unwrap();
    vm::reconcile_vm(&ctx, "default", "m").await.unwrap();
    assert_eq!(vmi_phase(&ctx, "m").await, Some(Phase::Pending));
    let a = vm::reconcile_vmi(&ctx, "default", "m").await.unwrap();
    assert!(matches!(a, Action::RequeueAfter(_)));
    let vmi = get_vmi(&ctx, "m").await.unwrap();
    let (msg, _) = scheduled_condition(&vmi);
    assert!(msg.contains("insufficient memory"), "{msg}");
    vm::reconcile_vm(&ctx, "default", "m").await.unwrap();
    let vm = get_vm(&ctx, "m").await;
    assert_eq!(printable(&vm), "ErrorUnschedulable");
    assert!(vm.status.unwrap().state_change_requests.is_empty());
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
    assert_eq!(vmi_phase(&ctx, "v").await, Some(Phase::Unknown));
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
        .update_typed("default", "crash", |o: &mut VirtualMachineInstance| {
            o.status.get_or_insert_default().phase = Some(Phase::Failed);
            o.metadata.finalizers = Some(vec![]);
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
    let vm = get_vm(&ctx, "crash").await;
    assert_eq!(printable(&vm), "CrashLoopBackOff");
    assert_eq!(vm.status.unwrap().start_failure.unwrap().retries, 1);
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
    let vmi = get_vmi(&ctx, "rome").await.unwrap();
    assert_eq!(vmi.phase(), Phase::Pending);
    let (msg, reason) = scheduled_condition(&vmi);
    assert!(
        msg.contains("intel: the node cannot run the VM's CPU model") && msg.ends_with("EPYC-Rome"),
        "{msg}"
    );
    assert_eq!(reason, "Unschedulable");
    // An AMD EPYC Rome node joins: the VMI goes there, with the chosen CPU recorded.
    add_cpu_node(&ctx, "amd", "amd-epyc-7502p").await;
    vm::reconcile_vmi(&ctx, "default", "rome").await.unwrap();
    let vmi = get_vmi(&ctx, "rome").await.unwrap();
    assert_eq!(vmi.node_name(), Some("amd"));
    let g: crate::cpu::GuestCpu = serde_json::from_str(
        vmi.annotation(crate::cpu::policy::GUEST_CPU_ANNOTATION)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (g.mode, g.model.as_deref()),
        (crate::cpu::Mode::Custom, Some("EPYC-Rome"))
    );
}

async fn set_pool(ctx: &Context, node: &str, pool: &str) {
    let pool = pool.to_string();
    ctx.store
        .update_typed("", node, move |o: &mut Node| {
            o.status.get_or_insert_default().shared_pool = Some(SharedPool {
                name: pool,
                path: "/srv/pool".into(),
            });
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
    let vmi = VirtualMachineInstance::from_value(
        json!({"metadata": {"name": "c", "namespace": "default"}, "spec": {
        "domain": {"memory": {"guest": "1Gi"}, "devices": {}},
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}}),
    )
    .unwrap();
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
        .update_typed("", "p2", |o: &mut Node| {
            o.spec.unschedulable = true;
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
    let plain = VirtualMachineInstance::from_value(
        json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {
        "domain": {"memory": {"guest": "1Gi"}, "devices": {}}}}),
    )
    .unwrap();
    let (node, _) = scheduler::pick_node(&ctx, &plain, None, &none)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node, "big");
}

#[tokio::test]
async fn a_deleted_node_releases_its_instances_only_when_forced() {
    let (_d, ctx) = ctx().await;
    add_node(&ctx, "gone", 4 << 30).await;
    ctx.store
        .create(
            Kind::VirtualMachineInstance,
            json!({"metadata": {"name": "v", "namespace": "default",
                                "finalizers": [crate::types::annotations::LAUNCHER_FINALIZER]},
                   "spec": {"domain": {"devices": {}}},
                   "status": {"phase": "Running", "nodeName": "gone"}}),
            false,
        )
        .await
        .unwrap();
    // Not forced: refused, naming the instance and the way out.
    match release_node(&ctx.store, "gone", false, false).await {
        Err(Release::Busy(m)) => assert!(m.contains("default/v") && m.contains("--force"), "{m}"),
        other => panic!("not refused: {other:?}"),
    }
    // Forced as a dry run: nothing changes.
    release_node(&ctx.store, "gone", true, true).await.unwrap();
    assert_eq!(vmi_phase(&ctx, "v").await, Some(Phase::Running));
    // Forced: the instance fails and goes, so its VM can start elsewhere.
    let mut events = ctx.store.subscribe();
    release_node(&ctx.store, "gone", true, false).await.unwrap();
    assert_eq!(vmi_phase(&ctx, "v").await, None);
    let mut failed = false;
    while let Ok(ev) = events.try_recv() {
        let v = VirtualMachineInstance::from_value(ev.object.clone()).unwrap();
        failed |= v.phase() == Phase::Failed
            && v.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("NodeDeleted");
    }
    assert!(
        failed,
        "the instance was not marked Failed/NodeDeleted first"
    );
    // A node without instances is released at once.
    release_node(&ctx.store, "gone", false, false)
        .await
        .unwrap();
}

/// The periodic resync of VMs that are where they should be reads one listing per kind and
/// writes nothing: no write transaction at all, not even one that finds nothing changed.
#[tokio::test]
async fn an_idle_resync_writes_nothing() {
    let (_d, ctx) = ctx().await;
    add_node(&ctx, "n1", 64 << 30).await;
    for i in 0..20 {
        add_vm(&ctx, &format!("h{i}"), "Halted").await;
        vm::reconcile_vm(&ctx, "default", &format!("h{i}"))
            .await
            .unwrap();
    }
    add_vm(&ctx, "run", "Always").await;
    vm::reconcile_vm(&ctx, "default", "run").await.unwrap();
    vm::reconcile_vmi(&ctx, "default", "run").await.unwrap();
    vm::reconcile_vm(&ctx, "default", "run").await.unwrap();
    // What the first resync after these changes finds to do, it does.
    let queue = Queue::default();
    resync(&ctx, &queue).await;
    for (kind, ns, name) in queue.take() {
        match kind {
            Kind::VirtualMachine => vm::reconcile_vm(&ctx, &ns, &name).await.unwrap(),
            _ => vm::reconcile_vmi(&ctx, &ns, &name).await.unwrap(),
        };
    }
    ctx.store.prune_events().await.unwrap();

    let before = ctx.store.writes();
    resync(&ctx, &queue).await;
    assert_eq!(queue.take(), Vec::<Key>::new(), "nothing to reconcile");
    ctx.store.prune_events().await.unwrap();
    scheduler::check_leases(&ctx).await.unwrap();
    assert_eq!(ctx.store.writes(), before, "an idle resync wrote");

    // A VM whose status is behind is found, reconciled and written.
    ctx.store
        .update_typed("default", "h3", |o: &mut VirtualMachine| {
            o.status.get_or_insert_default().printable_status = Some("Running".into());
            Ok(())
        })
        .await
        .unwrap();
    resync(&ctx, &queue).await;
    let keys = queue.take();
    assert_eq!(
        keys,
        vec![(Kind::VirtualMachine, "default".into(), "h3".into())]
    );
    vm::reconcile_vm(&ctx, "default", "h3").await.unwrap();
    let h3 = get_vm(&ctx, "h3").await;
    assert_eq!(printable(&h3), "Stopped");
}

/// A VM's dataVolumeTemplates become DataVolumes it owns, waiting for their first consumer;
/// the node its instance is placed on gets them, every later instance goes there (even when
/// another node has more room), and they go when the VM goes.
#[tokio::test]
async fn data_volumes_wait_bind_to_the_first_node_and_go_with_their_vm() {
    use crate::types::cdi::{DataVolume, NODE_ANNOTATION};
    let (_d, ctx) = ctx().await;
    add_node(&ctx, "first", 4 << 30).await;
    ctx.store
        .create(
            Kind::VirtualMachine,
            json!({"metadata": {"name": "d", "namespace": "default"}, "spec": {
                "runStrategy": "Always",
                "dataVolumeTemplates": [{"metadata": {"name": "d-root", "labels": {"app": "d"}},
                    "spec": {"source": {"blank": {}},
                             "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}],
                "template": {"spec": {"domain": {"memory": {"guest": "1Gi"}, "devices": {}},
                    "volumes": [{"name": "root", "dataVolume": {"name": "d-root"}}]}}}}),
            false,
        )
        .await
        .unwrap();
    vm::reconcile_vm(&ctx, "default", "d").await.unwrap();
    let dv: DataVolume = ctx
        .store
        .get_typed("default", "d-root")
        .await
        .unwrap()
        .unwrap();
    let owner = &dv.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("VirtualMachine", "d")
    );
    assert_eq!(dv.metadata.labels.as_ref().unwrap()["app"], "d");
    let st = dv.status.clone().unwrap();
    assert_eq!(st.phase.as_deref(), Some("WaitForFirstConsumer"));
    assert_eq!(dv.annotation(NODE_ANNOTATION), None);

    vm::reconcile_vmi(&ctx, "default", "d").await.unwrap();
    assert_eq!(get_vmi(&ctx, "d").await.unwrap().node_name(), Some("first"));
    let dv: DataVolume = ctx
        .store
        .get_typed("default", "d-root")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(dv.annotation(NODE_ANNOTATION), Some("first"));

    // A roomier node joins; the next instance still goes where its disk is.
    add_node(&ctx, "roomy", 64 << 30).await;
    let vmi = get_vmi(&ctx, "d").await.unwrap();
    let none = Default::default();
    let (node, _) = scheduler::pick_node(&ctx, &vmi, None, &none)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node, "first");
    // Migrating away finds no node, and says why.
    let why = scheduler::pick_node(&ctx, &vmi, Some("first"), &none)
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        why.contains("roomy: DataVolume d-root lives on node first"),
        "{why}"
    );

    // The VM goes: its DataVolume goes too.
    ctx.store
        .delete(Kind::VirtualMachine, "default", "d", None)
        .await
        .unwrap();
    // (the volumes finalizer is the agent's; without it the VM is gone at once)
    vm::reconcile_vm(&ctx, "default", "d").await.unwrap();
    assert!(
        ctx.store
            .get(Kind::DataVolume, "default", "d-root")
            .await
            .unwrap()
            .is_none()
    );
}

/// A DataVolume created on its own gets CDI's first status.
#[tokio::test]
async fn a_lone_data_volume_waits_for_its_first_consumer() {
    let (_d, ctx) = ctx().await;
    ctx.store
        .create(
            Kind::DataVolume,
            json!({"metadata": {"name": "lone", "namespace": "default"}, "spec": {
                "source": {"http": {"url": "http://example.com/d.img"}},
                "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}),
            false,
        )
        .await
        .unwrap();
    datavolume::reconcile_dv(&ctx, "default", "lone")
        .await
        .unwrap();
    let dv: crate::types::cdi::DataVolume = ctx
        .store
        .get_typed("default", "lone")
        .await
        .unwrap()
        .unwrap();
    let st = dv.status.unwrap();
    assert_eq!(
        (
            st.phase.as_deref(),
            st.progress.as_deref(),
            st.claim_name.as_deref()
        ),
        (Some("WaitForFirstConsumer"), Some("N/A"), Some("lone"))
    );
    assert!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "Bound" && c.status == "False")
    );
}

/// Dedicated CPUs: the scheduler gives each vCPU (and the emulator thread) a host CPU no
/// other dedicated instance holds, and a node without enough is passed over, saying why.
#[tokio::test]
async fn dedicated_cpus_are_held_once_per_node() {
    let (_d, ctx) = ctx().await;
    add_node(&ctx, "two", 64 << 30).await;
    add_node(&ctx, "four", 4 << 30).await;
    for (n, count) in [("two", 2), ("four", 4)] {
        ctx.store
            .update_typed("", n, move |o: &mut Node| {
                o.status.get_or_insert_default().cpu.count = count;
                Ok(())
            })
            .await
            .unwrap();
    }
    let dedicated = |name: &str| {
        VirtualMachineInstance::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"domain": {"memory": {"guest": "1Gi"}, "devices": {},
                "cpu": {"cores": 2, "dedicatedCpuPlacement": true, "isolateEmulatorThread": true}}}}))
        .unwrap()
    };
    for name in ["d1", "d2"] {
        ctx.store.create_typed(&dedicated(name)).await.unwrap();
    }
    // "two" has the most memory but only two CPUs: three are wanted.
    assert!(scheduler::schedule(&ctx, &dedicated("d1")).await.unwrap());
    let d1 = get_vmi(&ctx, "d1").await.unwrap();
    assert_eq!(d1.node_name(), Some("four"));
    assert_eq!(
        d1.annotation(crate::rules::cpus::DEDICATED_CPUS_ANNOTATION),
        Some("vcpus=2,3;emulator=1")
    );
    // The second finds one CPU left on "four", and nowhere else to go.
    assert!(!scheduler::schedule(&ctx, &dedicated("d2")).await.unwrap());
    let (msg, _) = scheduled_condition(&get_vmi(&ctx, "d2").await.unwrap());
    assert!(
        msg.contains("two: not enough free CPUs for dedicated placement (3 wanted; 0 of its 2")
            && msg.contains(
                "four: not enough free CPUs for dedicated placement (3 wanted; 3 of its 4"
            ),
        "{msg}"
    );
}

/// The node the scheduler picks for a 1Gi instance with `field` of its spec set to
/// `value`, or why none fits.
async fn pick_for(ctx: &Context, field: &str, value: serde_json::Value) -> Result<String, String> {
    let mut spec = json!({"domain": {"memory": {"guest": "1Gi"}, "devices": {}}});
    spec[field] = value;
    let vmi = VirtualMachineInstance::from_value(
        json!({"metadata": {"name": "p", "namespace": "default"}, "spec": spec}),
    )
    .unwrap();
    scheduler::pick_node(ctx, &vmi, None, &Default::default())
        .await
        .unwrap()
        .map(|(node, _)| node)
}

/// Node affinity: a required term keeps the instance off nodes that do not match (even the
/// roomiest), a preferred one wins over free memory, and the reasons name it.
#[tokio::test]
async fn node_affinity_is_required_then_preferred() {
    let (_d, ctx) = ctx().await;
    for (n, mem, zone) in [
        ("big", 64u64 << 30, "office"),
        ("shop1", 4 << 30, "shop"),
        ("shop2", 8 << 30, "shop"),
    ] {
        add_zoned_node(&ctx, n, mem, Some(zone)).await;
    }
    let pick =
        |affinity: serde_json::Value| pick_for(&ctx, "affinity", json!({"nodeAffinity": affinity}));
    let shop = json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["shop"]}]}]}});
    assert_eq!(
        pick(shop.clone()).await.unwrap(),
        "shop2",
        "the roomier shop node"
    );
    let mut prefer = shop.clone();
    prefer["preferredDuringSchedulingIgnoredDuringExecution"] = json!([{"weight": 50,
        "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["shop1"]}]}}]);
    assert_eq!(
        pick(prefer).await.unwrap(),
        "shop1",
        "preferred over free memory"
    );
    let nowhere = json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["moon"]}]}]}});
    let why = pick(nowhere).await.unwrap_err();
    assert!(
        why.contains("big: does not match the instance's node affinity"),
        "{why}"
    );
}

/// `nodeSelector` matches labels, and `kubernetes.io/hostname` is a node's name when no
/// label says otherwise (a migration to a chosen node selects it so).
#[tokio::test]
async fn node_selector_reads_labels_and_the_hostname() {
    let (_d, ctx) = ctx().await;
    add_zoned_node(&ctx, "big", 64 << 30, Some("office")).await;
    add_zoned_node(&ctx, "small", 4 << 30, Some("shop")).await;
    let pick = |sel: serde_json::Value| pick_for(&ctx, "nodeSelector", sel);
    assert_eq!(pick(json!({"zone": "shop"})).await.unwrap(), "small");
    assert_eq!(
        pick(json!({"kubernetes.io/hostname": "small"}))
            .await
            .unwrap(),
        "small"
    );
    let why = pick(json!({"kubernetes.io/hostname": "gone"}))
        .await
        .unwrap_err();
    assert!(why.contains("big: does not match nodeSelector"), "{why}");
}

/// Taints: a NoSchedule taint keeps off instances that do not tolerate it (even from the
/// roomiest node), a PreferNoSchedule one makes its node the last choice, and a toleration
/// lets the instance back on.
#[tokio::test]
async fn taints_keep_instances_off_unless_tolerated() {
    let (_d, ctx) = ctx().await;
    for (n, mem, taint) in [
        (
            "big",
            64u64 << 30,
            json!({"key": "dedicated", "value": "pos", "effect": "NoSchedule"}),
        ),
        (
            "mid",
            16 << 30,
            json!({"key": "slow", "effect": "PreferNoSchedule"}),
        ),
        ("small", 4 << 30, serde_json::Value::Null),
    ] {
        add_node(&ctx, n, mem).await;
        if taint.is_null() {
            continue;
        }
        ctx.store
            .update_typed("", n, move |o: &mut Node| {
                o.spec.taints = vec![serde_json::from_value(taint).unwrap()];
                Ok(())
            })
            .await
            .unwrap();
    }
    let pick = |tolerations: serde_json::Value| pick_for(&ctx, "tolerations", tolerations);
    assert_eq!(
        pick(json!([])).await.unwrap(),
        "small",
        "past the tainted big node and the PreferNoSchedule mid one"
    );
    assert_eq!(
        pick(json!([{"key": "slow", "operator": "Exists"}]))
            .await
            .unwrap(),
        "mid"
    );
    assert_eq!(
        pick(json!([{"key": "dedicated", "value": "pos", "effect": "NoSchedule"}]))
            .await
            .unwrap(),
        "big"
    );
    assert_eq!(
        pick(json!([{"operator": "Exists"}])).await.unwrap(),
        "big",
        "an empty key with Exists tolerates everything"
    );
    // With only the tainted node left, the reason names its taint.
    ctx.store
        .update_typed("", "small", |o: &mut Node| {
            o.spec.taints = vec![
                serde_json::from_value(json!({"key": "maintenance", "effect": "NoExecute"}))
                    .unwrap(),
            ];
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(
        pick(json!([{"key": "dedicated", "operator": "Equal", "value": "office"}]))
            .await
            .unwrap(),
        "mid",
        "PreferNoSchedule only weighs"
    );
    ctx.store
        .update_typed("", "mid", |o: &mut Node| {
            o.spec.taints[0].effect = "NoSchedule".into();
            Ok(())
        })
        .await
        .unwrap();
    let why = pick(json!([])).await.unwrap_err();
    assert!(
        why.contains("big: has taints the instance does not tolerate: dedicated=pos:NoSchedule")
            && why.contains(
                "small: has taints the instance does not tolerate: maintenance:NoExecute"
            ),
        "{why}"
    );
}

/// NoExecute: a running instance that does not tolerate its node's taint is deleted at
/// once; one that tolerates it for `tolerationSeconds` stays that long after the taint's
/// `timeAdded`; one that tolerates it without a limit stays.
#[tokio::test]
async fn no_execute_taints_evict_running_instances() {
    let (_d, ctx) = ctx().await;
    add_node(&ctx, "n1", 16 << 30).await;
    let brief = json!([{"key": "maintenance", "operator": "Exists", "effect": "NoExecute",
                        "tolerationSeconds": 3600}]);
    let always = json!([{"key": "maintenance", "operator": "Exists"}]);
    for (name, tolerations) in [("plain", json!([])), ("brief", brief), ("always", always)] {
        ctx.store
            .create(
                Kind::VirtualMachineInstance,
                json!({"metadata": {"name": name, "namespace": "default"},
                    "spec": {"domain": {"memory": {"guest": "1Gi"}, "devices": {}},
                             "tolerations": tolerations},
                    "status": {"phase": "Running", "nodeName": "n1"}}),
                false,
            )
            .await
            .unwrap();
    }
    let node = |ctx: &Context| {
        let store = ctx.store.clone();
        async move { store.get_typed::<Node>("", "n1").await.unwrap().unwrap() }
    };
    assert!(
        node::no_execute_candidates(&ctx.store, &node(&ctx).await)
            .await
            .unwrap()
            .is_empty(),
        "an untainted node lists nothing"
    );
    let taint = |added: String| {
        let store = ctx.store.clone();
        async move {
            store
                .update_typed("", "n1", move |o: &mut Node| {
                    o.spec.taints = vec![crate::types::edgevirt::Taint {
                        key: "maintenance".into(),
                        value: None,
                        effect: "NoExecute".into(),
                        time_added: Some(added),
                    }];
                    Ok(())
                })
                .await
                .unwrap();
        }
    };
    taint(crate::types::now()).await;
    let mut listed = node::no_execute_candidates(&ctx.store, &node(&ctx).await)
        .await
        .unwrap();
    listed.sort();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(matches!(
        vm::reconcile_vmi(&ctx, "default", "plain").await.unwrap(),
        Action::Done
    ));
    assert_eq!(vmi_phase(&ctx, "plain").await, None, "evicted at once");
    let a = vm::reconcile_vmi(&ctx, "default", "brief").await.unwrap();
    assert!(
        matches!(a, Action::RequeueAfter(d) if d > Duration::from_secs(3500) && d <= Duration::from_secs(3600)),
        "{a:?}"
    );
    assert_eq!(vmi_phase(&ctx, "brief").await, Some(Phase::Running));
    assert!(matches!(
        vm::reconcile_vmi(&ctx, "default", "always").await.unwrap(),
        Action::Done
    ));
    // The taint has been there two hours: the brief toleration has run out.
    taint("2000-01-01T00:00:00Z".into()).await;
    vm::reconcile_vmi(&ctx, "default", "brief").await.unwrap();
    assert_eq!(vmi_phase(&ctx, "brief").await, None);
    assert_eq!(vmi_phase(&ctx, "always").await, Some(Phase::Running));
}

/// A DataVolume on a shared pool: the pool's storage class appears when a node reports
/// it, the DataVolume is bound at once to a node mounting the pool, its VM runs on any
/// such node, migrates among them, and its volume status says ReadWriteMany.
#[tokio::test]
async fn data_volumes_on_a_shared_pool_bind_at_once_and_follow_the_pool() {
    use crate::types::cdi::{DataVolume, NODE_ANNOTATION};
    let (_d, ctx) = ctx().await;
    add_node(&ctx, "big", 64 << 30).await;
    add_node(&ctx, "p1", 4 << 30).await;
    add_node(&ctx, "p2", 4 << 30).await;
    // No node mounts the pool yet: no class, and a DataVolume naming it waits, saying why.
    ctx.store
        .create(
            Kind::DataVolume,
            json!({"metadata": {"name": "s", "namespace": "default"}, "spec": {
                "source": {"blank": {}},
                "storage": {"storageClassName": "site",
                            "resources": {"requests": {"storage": "1Gi"}}}}}),
            false,
        )
        .await
        .unwrap();
    let a = datavolume::reconcile_dv(&ctx, "default", "s")
        .await
        .unwrap();
    assert!(
        matches!(a, Action::RequeueAfter(_)),
        "it looks again for a node: {a:?}"
    );
    let dv_key = (Kind::DataVolume, "default".to_string(), "s".to_string());
    assert!(
        resync_keys(&ctx.store).await.contains(&dv_key),
        "the resync looks again too (after a controller restart)"
    );
    let dv: DataVolume = ctx.store.get_typed("default", "s").await.unwrap().unwrap();
    assert_eq!(dv.annotation(NODE_ANNOTATION), None);
    let st = dv.status.unwrap();
    assert_eq!(st.phase.as_deref(), Some("Pending"));
    let bound = st.conditions.iter().find(|c| c.type_ == "Bound").unwrap();
    assert!(
        bound
            .message
            .as_deref()
            .unwrap_or("")
            .contains("no ready node mounts shared pool \"site\""),
        "{bound:?}"
    );
    assert!(
        ctx.store
            .get(Kind::StorageClass, "", "site")
            .await
            .unwrap()
            .is_none()
    );

    // p2 and p1 mount it: the class exists, and the DataVolume is named for a filler.
    set_pool(&ctx, "p2", "site").await;
    set_pool(&ctx, "p1", "site").await;
    for n in ["p1", "p2", "big"] {
        let node: Node = ctx.store.get_typed("", n).await.unwrap().unwrap();
        datavolume::on_node(&ctx.store, &node).await.unwrap();
    }
    let sc = ctx
        .store
        .get(Kind::StorageClass, "", "site")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sc["volumeBindingMode"], "Immediate", "{sc}");
    assert_eq!(sc["provisioner"], crate::types::cdi::SHARED_PROVISIONER);
    datavolume::reconcile_dv(&ctx, "default", "s")
        .await
        .unwrap();
    let dv: DataVolume = ctx.store.get_typed("default", "s").await.unwrap().unwrap();
    assert_eq!(
        dv.annotation(NODE_ANNOTATION),
        Some("p1"),
        "the first by name"
    );
    assert!(!resync_keys(&ctx.store).await.contains(&dv_key));

    // A VM using it: never on the roomy node without the pool; it may migrate p1 -> p2.
    add_vm(&ctx, "v", "Always").await;
    ctx.store
        .update_typed("default", "v", |o: &mut VirtualMachine| {
            let t = &mut o.spec.template;
            t.spec.volumes = vec![
                serde_json::from_value(json!({"name": "disk", "dataVolume": {"name": "s"}}))
                    .unwrap(),
            ];
            Ok(())
        })
        .await
        .unwrap();
    vm::reconcile_vm(&ctx, "default", "v").await.unwrap();
    vm::reconcile_vmi(&ctx, "default", "v").await.unwrap();
    let vmi = get_vmi(&ctx, "v").await.unwrap();
    let on = vmi.node_name().unwrap().to_string();
    assert!(on == "p1" || on == "p2", "placed on {on}");
    let vs = &vmi.status.as_ref().unwrap().volume_status;
    assert_eq!(vs.len(), 1, "{vs:?}");
    let claim = vs[0].persistent_volume_claim_info.as_ref().unwrap();
    assert_eq!(
        (claim.claim_name.as_deref(), claim.access_modes.as_slice()),
        (Some("s"), &["ReadWriteMany".to_string()][..])
    );
    assert!(crate::rules::migration::live_migratable(&vmi).ok);
    // (without the guest CPU the scheduler wrote: these test nodes report no host CPU to
    // compare a running guest's with)
    let mut vmi = vmi;
    vmi.metadata.annotations = None;
    let none = Default::default();
    let (to, _) = scheduler::pick_node(&ctx, &vmi, Some(&on), &none)
        .await
        .unwrap()
        .unwrap();
    assert!(to != on && to != "big", "migrates to {to}");
    // With the other pool node cordoned, the reasons name the pool for the roomy node.
    ctx.store
        .update_typed("", &to, |o: &mut Node| {
            o.spec.unschedulable = true;
            Ok(())
        })
        .await
        .unwrap();
    let why = scheduler::pick_node(&ctx, &vmi, Some(&on), &none)
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        why.contains("big: does not mount shared pool site (DataVolume s lives there)"),
        "{why}"
    );
}

/// Pod affinity and anti-affinity read the instances placed on nodes: required terms keep
/// an instance away from (or with) the ones they select in the same topology domain, the
/// first of a group may go anywhere, preferred terms weigh, and namespaces are kept apart.
#[tokio::test]
async fn pod_affinity_reads_the_instances_placed_on_nodes() {
    let (_d, ctx) = ctx().await;
    for (n, mem, zone) in [
        ("a", 64u64 << 30, "office"),
        ("b", 16 << 30, "shop"),
        ("c", 8 << 30, "shop"),
    ] {
        add_zoned_node(&ctx, n, mem, Some(zone)).await;
    }
    let place = |name: &'static str, ns: &'static str, app: &'static str, node: &'static str| {
        let ctx = &ctx;
        async move {
            ctx.store
                .create(
                    Kind::VirtualMachineInstance,
                    json!({"metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
                        "spec": {"domain": {"memory": {"guest": "1Gi"}, "devices": {}}},
                        "status": {"phase": "Running", "nodeName": node}}),
                    false,
                )
                .await
                .unwrap();
        }
    };
    place("db-1", "default", "db", "a").await;
    place("web-1", "default", "web", "c").await;
    place("db-x", "other", "db", "b").await;
    let pick = |app: &'static str, affinity: serde_json::Value| {
        let ctx = &ctx;
        async move {
            let vmi = VirtualMachineInstance::from_value(json!({
                "metadata": {"name": "new", "namespace": "default", "labels": {"app": app}},
                "spec": {"domain": {"memory": {"guest": "1Gi"}, "devices": {}},
                         "affinity": affinity}}))
            .unwrap();
            scheduler::pick_node(ctx, &vmi, None, &Default::default())
                .await
                .unwrap()
                .map(|(node, _)| node)
        }
    };
    let term = |app: &str, key: &str| json!({"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key});
    let required = |which: &str, t: serde_json::Value| json!({which: {"requiredDuringSchedulingIgnoredDuringExecution": [t]}});
    // Away from db-1's node (the roomiest); db-x is in another namespace and does not count.
    assert_eq!(
        pick(
            "db",
            required("podAntiAffinity", term("db", "kubernetes.io/hostname"))
        )
        .await
        .unwrap(),
        "b"
    );
    // Unless the term names that namespace too.
    let mut both = term("db", "kubernetes.io/hostname");
    both["namespaces"] = json!(["default", "other"]);
    assert_eq!(
        pick("db", required("podAntiAffinity", both)).await.unwrap(),
        "c"
    );
    // Away from db-1's zone: the shop nodes.
    assert_eq!(
        pick("db", required("podAntiAffinity", term("db", "zone")))
            .await
            .unwrap(),
        "b"
    );
    // With web-1, on the smallest node.
    assert_eq!(
        pick(
            "api",
            required("podAffinity", term("web", "kubernetes.io/hostname"))
        )
        .await
        .unwrap(),
        "c"
    );
    // With "cache", of which none runs: only the first cache itself may go (anywhere).
    assert_eq!(
        pick(
            "cache",
            required("podAffinity", term("cache", "kubernetes.io/hostname"))
        )
        .await
        .unwrap(),
        "a"
    );
    let why = pick(
        "api",
        required("podAffinity", term("cache", "kubernetes.io/hostname")),
    )
    .await
    .unwrap_err();
    assert!(
        why.contains(
            "a: no instance its pod affinity selects runs in its kubernetes.io/hostname domain"
        ),
        "{why}"
    );
    // Preferred anti-affinity outweighs free memory.
    let preferred = json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": term("db", "zone")}]}});
    assert_eq!(pick("db", preferred).await.unwrap(), "b");
    // Nowhere left: every zone has a db.
    place("db-2", "default", "db", "b").await;
    let why = pick("db", required("podAntiAffinity", term("db", "zone")))
        .await
        .unwrap_err();
    assert!(
        why.contains("c: an instance its pod anti-affinity selects runs in its zone domain (shop)"),
        "{why}"
    );
    // Symmetry: "quiet" on a keeps "noisy" instances off its node by its own anti-affinity,
    // though "noisy" asks nothing; the roomiest node is no longer theirs.
    assert_eq!(pick("noisy", serde_json::Value::Null).await.unwrap(), "a");
    ctx.store
        .create(
            Kind::VirtualMachineInstance,
            json!({"metadata": {"name": "quiet", "namespace": "default", "labels": {"app": "quiet"}},
                "spec": {"domain": {"memory": {"guest": "1Gi"}, "devices": {}},
                         "affinity": required("podAntiAffinity", term("noisy", "kubernetes.io/hostname"))},
                "status": {"phase": "Running", "nodeName": "a"}}),
            false,
        )
        .await
        .unwrap();
    assert_eq!(pick("noisy", serde_json::Value::Null).await.unwrap(), "b");
    let why = pick(
        "noisy",
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}]}}}),
    )
    .await
    .unwrap_err();
    assert!(
        why.contains("a: default/quiet runs in its kubernetes.io/hostname domain (a) and its pod anti-affinity selects this instance"),
        "{why}"
    );
}

/// Topology spread: DoNotSchedule keeps the selected instances within maxSkew of the
/// emptiest domain (a node without the key cannot take the instance), ScheduleAnyway
/// prefers emptier domains over free memory.
#[tokio::test]
async fn topology_spread_keeps_groups_even() {
    let (_d, ctx) = ctx().await;
    for (n, mem, zone) in [
        ("a", 64u64 << 30, Some("office")),
        ("b", 16 << 30, Some("shop")),
        ("c", 8 << 30, None),
    ] {
        add_zoned_node(&ctx, n, mem, zone).await;
    }
    for (name, node) in [("web-1", "a"), ("web-2", "a")] {
        ctx.store
            .create(
                Kind::VirtualMachineInstance,
                json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
                    "spec": {"domain": {"memory": {"guest": "1Gi"}, "devices": {}}},
                    "status": {"phase": "Running", "nodeName": node}}),
                false,
            )
            .await
            .unwrap();
    }
    let pick = |constraint: serde_json::Value| {
        let ctx = &ctx;
        async move {
            let vmi = VirtualMachineInstance::from_value(json!({
                "metadata": {"name": "new", "namespace": "default", "labels": {"app": "web"}},
                "spec": {"domain": {"memory": {"guest": "1Gi"}, "devices": {}},
                         "topologySpreadConstraints": [constraint]}}))
            .unwrap();
            scheduler::pick_node(ctx, &vmi, None, &Default::default())
                .await
                .unwrap()
                .map(|(node, _)| node)
        }
    };
    let web = json!({"matchLabels": {"app": "web"}});
    // One per node at most beyond the emptiest: a has two, so b (roomier than c).
    assert_eq!(
        pick(
            json!({"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": web})
        )
        .await
        .unwrap(),
        "b"
    );
    // By zone: c has no zone label and cannot take it; office is full, so shop.
    let why = pick(json!({"maxSkew": 1, "topologyKey": "zone",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "none"}}}))
    .await
    .unwrap();
    assert_eq!(why, "a", "nothing selected: the roomiest");
    let r = pick(json!({"maxSkew": 3, "topologyKey": "zone",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": web}))
    .await
    .unwrap();
    assert_eq!(r, "a", "skew 3 allows office a third");
    let by_zone = json!({"maxSkew": 1, "topologyKey": "zone",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": web});
    assert_eq!(pick(by_zone.clone()).await.unwrap(), "b");
    // With b cordoned, nothing fits, and each node says why.
    ctx.store
        .update_typed("", "b", |o: &mut Node| {
            o.spec.unschedulable = true;
            Ok(())
        })
        .await
        .unwrap();
    let err = pick(by_zone).await.unwrap_err();
    assert!(
        err.contains("a: would make the zone domain office 3 instances fuller than the emptiest"),
        "{err}"
    );
    assert!(err.contains("c: has no zone label"), "{err}");
    ctx.store
        .update_typed("", "b", |o: &mut Node| {
            o.spec.unschedulable = false;
            Ok(())
        })
        .await
        .unwrap();
    // ScheduleAnyway: the emptier zone beats the roomier node.
    assert_eq!(
        pick(json!({"maxSkew": 1, "topologyKey": "zone",
            "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": web}))
        .await
        .unwrap(),
        "b"
    );
}

/// Snapshot and restore bookkeeping, with the node's part played by hand: a snapshot of a
/// stopped VM gets a content naming the DataVolume's node and volume (the cloud-init volume
/// left out); once the node marks it ready the snapshot succeeds with the indications the
/// node recorded; a restore of a running VM under StopTarget halts it, then hands the disks
/// to the node, then writes the snapshot's spec back; deleting the snapshot deletes its
/// content.
/// A stopped VM `vm` with a DataVolume `root` whose disk is on node n1, and a cloud-init
/// volume.
async fn add_vm_with_disk_on_n1(s: &crate::store::Store) {
    s.create(
        Kind::DataVolume,
        json!({"metadata": {"name": "root", "namespace": "default",
                "annotations": {crate::types::cdi::NODE_ANNOTATION: "n1"}},
               "spec": {"source": {"blank": {}},
                        "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}),
        false,
    )
    .await
    .unwrap();
    s.create(
        Kind::VirtualMachine,
        json!({"metadata": {"name": "vm", "namespace": "default"}, "spec": {
            "runStrategy": "Halted",
            "template": {"spec": {"domain": {"memory": {"guest": "1Gi"}, "devices": {}},
                "volumes": [{"name": "root", "dataVolume": {"name": "root"}},
                            {"name": "ci", "cloudInitNoCloud": {"userData": "x"}}]}}}}),
        false,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn snapshot_and_restore_bookkeeping() {
    use crate::types::snapshot::*;
    let (_d, ctx) = ctx().await;
    let s = &ctx.store;
    add_vm_with_disk_on_n1(s).await;
    let snap = |name: &str| {
        json!({"metadata": {"name": name, "namespace": "default"},
               "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "vm"}}})
    };
    s.create(Kind::VirtualMachineSnapshot, snap("s1"), false)
        .await
        .unwrap();
    snapshot::reconcile_snapshot(&ctx, "default", "s1")
        .await
        .unwrap();
    let s1: VirtualMachineSnapshot = s.get_typed("default", "s1").await.unwrap().unwrap();
    let st = s1.status.clone().unwrap();
    assert_eq!(st.phase.as_deref(), Some("InProgress"));
    let cname = st.virtual_machine_snapshot_content_name.clone().unwrap();
    assert_eq!(cname, content_name(s1.uid()));
    let vols = st.snapshot_volumes.unwrap();
    assert_eq!(vols.included_volumes, ["root"]);
    assert_eq!(vols.excluded_volumes, ["ci"]);
    let c: VirtualMachineSnapshotContent = s.get_typed("default", &cname).await.unwrap().unwrap();
    assert_eq!(c.annotation(NODE_ANNOTATION), Some("n1"));
    assert!(c.has_finalizer(FILES_FINALIZER));
    assert_eq!(c.spec.volume_backups[0].claim(), "root");
    assert_eq!(
        c.spec.volume_backups[0].persistent_volume_claim["spec"]["resources"]["requests"]["storage"],
        "1073741824"
    );
    // The node copies the disk.
    s.update_typed(
        "default",
        &cname,
        |c: &mut VirtualMachineSnapshotContent| {
            c.metadata.annotations.get_or_insert_default().extend([
                (
                    INDICATIONS_ANNOTATION.to_string(),
                    "Online,GuestAgent".to_string(),
                ),
                (FROZEN_MS_ANNOTATION.to_string(), "12".to_string()),
            ]);
            c.status = Some(VirtualMachineSnapshotContentStatus {
                ready_to_use: Some(true),
                creation_time: Some(crate::types::now()),
                ..Default::default()
            });
            Ok(())
        },
    )
    .await
    .unwrap();
    snapshot::reconcile_snapshot(&ctx, "default", "s1")
        .await
        .unwrap();
    let st = s
        .get_typed::<VirtualMachineSnapshot>("default", "s1")
        .await
        .unwrap()
        .unwrap()
        .status
        .unwrap();
    assert_eq!(st.phase.as_deref(), Some("Succeeded"));
    assert_eq!(st.ready_to_use, Some(true));
    assert_eq!(st.indications, ["Online", "GuestAgent"]);
    assert!(
        st.source_indications[1]
            .message
            .as_deref()
            .unwrap()
            .contains("12 ms")
    );
    assert!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );

    // The VM changes and runs; a restore under StopTarget halts it first.
    s.update_typed("default", "vm", |v: &mut VirtualMachine| {
        v.spec.run_strategy = Some(RunStrategy::Always);
        v.spec.template.spec.domain.memory = None;
        v.spec.template.spec.volumes.push(
            serde_json::from_value(json!({"name": "extra", "dataVolume": {"name": "extra-dv"}}))
                .unwrap(),
        );
        Ok(())
    })
    .await
    .unwrap();
    s.create(
        Kind::VirtualMachineInstance,
        json!({"metadata": {"name": "vm", "namespace": "default"},
               "spec": {"domain": {"devices": {}}}, "status": {"phase": "Running"}}),
        false,
    )
    .await
    .unwrap();
    s.create(
        Kind::VirtualMachineRestore,
        json!({"metadata": {"name": "r1", "namespace": "default"},
               "spec": {"target": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "vm"},
                        "virtualMachineSnapshotName": "s1",
                        "targetReadinessPolicy": "StopTarget"}}),
        false,
    )
    .await
    .unwrap();
    snapshot::reconcile_restore(&ctx, "default", "r1")
        .await
        .unwrap();
    assert_eq!(
        get_vm(&ctx, "vm").await.spec.strategy(),
        RunStrategy::Halted
    );
    let r: VirtualMachineRestore = s.get_typed("default", "r1").await.unwrap().unwrap();
    let msg = r.status.unwrap().conditions[0].message.clone().unwrap();
    assert!(
        msg.contains("puts back the disk of volume \"root\""),
        "{msg}"
    );
    assert!(
        msg.contains("drops volume \"extra\" (added since the snapshot)"),
        "{msg}"
    );
    // Stopped: the node is asked to put the disks back, and the spec waits for it.
    s.delete(Kind::VirtualMachineInstance, "default", "vm", None)
        .await
        .unwrap();
    s.update(Kind::VirtualMachineInstance, "default", "vm", |o| {
        o["metadata"]["finalizers"] = json!([]);
        Ok(())
    })
    .await
    .ok();
    assert!(get_vmi(&ctx, "vm").await.is_none());
    snapshot::reconcile_restore(&ctx, "default", "r1")
        .await
        .unwrap();
    let r: VirtualMachineRestore = s.get_typed("default", "r1").await.unwrap().unwrap();
    assert_eq!(r.annotation(NODE_ANNOTATION), Some("n1"));
    assert_ne!(r.status.as_ref().unwrap().complete, Some(true));
    assert!(
        get_vm(&ctx, "vm")
            .await
            .spec
            .template
            .spec
            .domain
            .memory
            .is_none()
    );
    let content_uid = c.uid().to_string();
    s.update_typed("default", "r1", |r: &mut VirtualMachineRestore| {
        r.metadata
            .annotations
            .get_or_insert_default()
            .insert(RESTORED_ANNOTATION.into(), content_uid);
        Ok(())
    })
    .await
    .unwrap();
    snapshot::reconcile_restore(&ctx, "default", "r1")
        .await
        .unwrap();
    let r: VirtualMachineRestore = s.get_typed("default", "r1").await.unwrap().unwrap();
    let rst = r.status.unwrap();
    assert_eq!(rst.complete, Some(true));
    assert_eq!(rst.restores[0].volume_name, "root");
    let vm = get_vm(&ctx, "vm").await;
    assert_eq!(
        vm.spec.strategy(),
        RunStrategy::Halted,
        "the snapshot's spec"
    );
    assert!(vm.spec.template.spec.domain.memory.is_some());
    assert_eq!(
        vm.spec.template.spec.volumes.len(),
        2,
        "the snapshot's volumes"
    );

    // Deleting the snapshot deletes its content (kept by its finalizer for the node).
    s.delete(Kind::VirtualMachineSnapshot, "default", "s1", None)
        .await
        .unwrap();
    snapshot::reconcile_content(&ctx, "default", &cname)
        .await
        .unwrap();
    let c: VirtualMachineSnapshotContent = s.get_typed("default", &cname).await.unwrap().unwrap();
    assert!(c.deleting());

    // A snapshot of a VM that does not exist fails with the reason.
    s.create(
        Kind::VirtualMachineSnapshot,
        json!({"metadata": {"name": "s2", "namespace": "default"},
               "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "nope"}}}),
        false,
    )
    .await
    .unwrap();
    snapshot::reconcile_snapshot(&ctx, "default", "s2")
        .await
        .unwrap();
    let st = s
        .get_typed::<VirtualMachineSnapshot>("default", "s2")
        .await
        .unwrap()
        .unwrap()
        .status
        .unwrap();
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert!(
        st.error
            .unwrap()
            .message
            .unwrap()
            .contains("default/nope does not exist")
    );
}

/// A backup goes to the node holding the VM's disks when that node mounts its target, and
/// fails at once, saying why, when it does not or when the VM is missing.
#[tokio::test]
async fn a_backup_goes_to_the_node_that_holds_the_disks_and_mounts_the_target() {
    use crate::types::backup::*;
    let (_d, ctx) = ctx().await;
    let s = &ctx.store;
    s.create(
        Kind::Node,
        json!({"metadata": {"name": "n1"}, "spec": {}, "status": {
            "memoryBytes": 1u64 << 33, "lastHeartbeatTime": crate::types::now(),
            "conditions": [{"type": "Ready", "status": "True"}],
            "backupTargets": [{"name": "nas", "path": "/mnt/nas"}]}}),
        false,
    )
    .await
    .unwrap();
    add_vm_with_disk_on_n1(s).await;
    let backup = |name: &str, vm: &str, target: &str| {
        json!({"metadata": {"name": name, "namespace": "default"},
               "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": vm},
                        "pvcName": target}})
    };
    let failure = |b: &VirtualMachineBackup| {
        b.status
            .as_ref()
            .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Failure"))
            .and_then(|c| c.message.clone())
    };
    for (name, vm, target) in [
        ("ok", "vm", "nas"),
        ("usb", "vm", "usb"),
        ("gone", "nope", "nas"),
    ] {
        s.create(Kind::VirtualMachineBackup, backup(name, vm, target), false)
            .await
            .unwrap();
        backup::reconcile_backup(&ctx, "default", name)
            .await
            .unwrap();
    }
    assert_eq!(
        backup::pending(s).await,
        Vec::<crate::controller::Key>::new(),
        "every backup is handed over or failed"
    );
    let ok: VirtualMachineBackup = s.get_typed("default", "ok").await.unwrap().unwrap();
    assert_eq!(ok.annotation(NODE_ANNOTATION), Some("n1"));
    assert!(!ok.finished());
    let st = ok.status.clone().unwrap();
    assert_eq!(st.included_volumes.len(), 1);
    assert_eq!(st.included_volumes[0].volume_name, "root");
    let usb: VirtualMachineBackup = s.get_typed("default", "usb").await.unwrap().unwrap();
    assert!(usb.finished() && !usb.succeeded());
    assert!(
        failure(&usb).unwrap().contains(
            "node n1, which holds the disks of default/vm, does not mount backup target \"usb\""
        ),
        "{:?}",
        failure(&usb)
    );
    assert_eq!(usb.annotation(NODE_ANNOTATION), None);
    let gone: VirtualMachineBackup = s.get_typed("default", "gone").await.unwrap().unwrap();
    assert!(failure(&gone).unwrap().contains("does not exist"));
    // Handed over, it is the node's: the controller leaves it be.
    backup::reconcile_backup(&ctx, "default", "ok")
        .await
        .unwrap();
    let again: VirtualMachineBackup = s.get_typed("default", "ok").await.unwrap().unwrap();
    assert_eq!(again.status, ok.status);
    // Deleted, it waits for its node to remove the folder; once the node is gone, it goes.
    assert!(again.has_finalizer(FILES_FINALIZER));
    s.delete(Kind::VirtualMachineBackup, "default", "ok", None)
        .await
        .unwrap();
    let action = backup::reconcile_backup(&ctx, "default", "ok")
        .await
        .unwrap();
    assert!(matches!(action, crate::controller::Action::RequeueAfter(_)));
    let waiting: VirtualMachineBackup = s.get_typed("default", "ok").await.unwrap().unwrap();
    assert!(waiting.deleting(), "kept for node n1");
    s.delete(Kind::Node, "", "n1", None).await.unwrap();
    backup::reconcile_backup(&ctx, "default", "ok")
        .await
        .unwrap();
    assert!(
        s.get_typed::<VirtualMachineBackup>("default", "ok")
            .await
            .unwrap()
            .is_none(),
        "its node is gone: nothing holds it"
    );
}

/// A schedule against a fake clock: it runs when due and not before, and once its backups
/// are done, its rule (keep the last 1) deletes the older.
#[tokio::test]
async fn a_schedule_runs_when_due_and_prunes_by_its_rule() {
    use crate::types::backup::*;
    let (_d, ctx) = ctx().await;
    let s = &ctx.store;
    add_vm_with_disk_on_n1(s).await;
    s.create(
        Kind::BackupSchedule,
        json!({"metadata": {"name": "hourly", "namespace": "default"},
               "spec": {"target": "nas", "vms": ["vm"], "every": "1h", "keep": {"last": 1}}}),
        false,
    )
    .await
    .unwrap();
    let t0 = chrono::DateTime::parse_from_rfc3339("2026-12-07T02:00:00Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    let ours = || async {
        let mut l: Vec<VirtualMachineBackup> = s
            .all::<VirtualMachineBackup>()
            .await
            .unwrap()
            .into_iter()
            .filter(|b| !b.deleting())
            .collect();
        l.sort_by(|a, b| a.name().cmp(b.name()));
        l
    };
    let finish = |name: String, at: &'static str| async move {
        s.update_typed("default", &name, |b: &mut VirtualMachineBackup| {
            let st = b.status.get_or_insert_with(Default::default);
            set(&mut st.conditions, "Done", true, "Completed", "");
            st.completion_time = Some(at.into());
            Ok(())
        })
        .await
        .unwrap();
    };
    let ctx = &ctx;
    let run = |at: chrono::DateTime<chrono::Utc>| async move {
        backup::reconcile_schedule(ctx, "default", "hourly", at)
            .await
            .unwrap()
    };
    let action = run(t0).await;
    assert!(matches!(action, Action::RequeueAfter(d) if d == std::time::Duration::from_secs(3600)));
    let l = ours().await;
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].name(), "hourly-vm-20261207020000");
    assert_eq!(l[0].spec.pvc_name.as_deref(), Some("nas"));
    assert_eq!(
        l[0].metadata.labels.as_ref().unwrap()[SCHEDULE_LABEL],
        "hourly"
    );
    // Not due yet: nothing new.
    run(t0 + chrono::Duration::minutes(10)).await;
    assert_eq!(ours().await.len(), 1);
    finish(l[0].name().to_string(), "2026-12-07T02:01:00Z").await;
    run(t0 + chrono::Duration::minutes(61)).await;
    let l = ours().await;
    assert_eq!(l.len(), 2, "due again");
    finish(l[1].name().to_string(), "2026-12-07T03:02:00Z").await;
    run(t0 + chrono::Duration::minutes(62)).await;
    let l = ours().await;
    assert_eq!(
        l.iter().map(|b| b.name()).collect::<Vec<_>>(),
        ["hourly-vm-20261207030100"],
        "keep last 1: the older one is pruned"
    );
    let sched: BackupSchedule = s.get_typed("default", "hourly").await.unwrap().unwrap();
    let st = sched.status.unwrap();
    assert_eq!((st.runs, st.pruned), (2, 1));
    assert_eq!(st.next_run.as_deref(), Some("2026-12-07T04:01:00Z"));
}
