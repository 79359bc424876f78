//! The controller role: reconcilers that drive VMs to VMIs by run strategy, a scheduler that
//! binds VMIs to Ready nodes, and node leases. Each reconcile works from the current stored
//! state and is idempotent; a per-object queue is fed by store events and a periodic resync,
//! and a failed reconcile is retried with backoff.

mod backup;
pub mod datavolume;
pub mod dbbackup;
pub mod instancetype;
mod migration;
mod node;
pub mod recorder;
mod scheduler;
mod snapshot;
pub mod strategy;
mod vm;

pub use migration::{MigrationRefused, active_migration, check_migration_request};
pub use node::{Release, release_node};

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::store::{FieldSelector, LabelSelector, Store};
use crate::types::{
    Kind, Meta, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration,
};

/// What a reconcile asks for next.
#[derive(Debug, PartialEq)]
pub enum Action {
    Done,
    RequeueAfter(Duration),
}

pub type Key = (Kind, String, String);

pub use crate::rules::node::NODE_LEASE;

/// A deduplicating work queue of object keys.
#[derive(Default)]
struct Queue {
    pending: std::sync::Mutex<BTreeSet<(String, String, String)>>,
    delayed: std::sync::Mutex<HashMap<(String, String, String), Instant>>,
    notify: Notify,
}

impl Queue {
    fn push(&self, k: &Key) {
        self.pending
            .lock()
            .unwrap()
            .insert((k.0.name().to_string(), k.1.clone(), k.2.clone()));
        self.notify.notify_one();
    }
    fn push_after(&self, k: &Key, d: Duration) {
        self.delayed.lock().unwrap().insert(
            (k.0.name().to_string(), k.1.clone(), k.2.clone()),
            Instant::now() + d,
        );
    }
    fn take(&self) -> Vec<Key> {
        let now = Instant::now();
        let mut p = self.pending.lock().unwrap();
        let mut d = self.delayed.lock().unwrap();
        let due: Vec<_> = d
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            d.remove(&k);
            p.insert(k);
        }
        std::mem::take(&mut *p)
            .into_iter()
            .filter_map(|(k, ns, n)| Kind::from_name(&k).map(|k| (k, ns, n)))
            .collect()
    }
}

static QUEUE_DEPTH: std::sync::LazyLock<prometheus::IntGauge> = std::sync::LazyLock::new(|| {
    prometheus::register_int_gauge!(
        "edgevirt_reconcile_queue_depth",
        "Objects waiting for a reconcile, now or after a delay."
    )
    .expect("a valid metric")
});

static RECONCILES: std::sync::LazyLock<prometheus::IntCounterVec> =
    std::sync::LazyLock::new(|| {
        prometheus::register_int_counter_vec!(
            "edgevirt_reconciles_total",
            "Reconciles run, by kind.",
            &["kind"]
        )
        .expect("a valid metric")
    });

static RECONCILE_ERRORS: std::sync::LazyLock<prometheus::IntCounterVec> =
    std::sync::LazyLock::new(|| {
        prometheus::register_int_counter_vec!(
            "edgevirt_reconcile_errors_total",
            "Reconciles that failed (and were retried with backoff), by kind.",
            &["kind"]
        )
        .expect("a valid metric")
    });

pub struct Context {
    pub store: Store,
}

/// Run the controller until cancelled.
pub async fn run(store: Store, cancel: CancellationToken) -> anyhow::Result<()> {
    let ctx = Arc::new(Context {
        store: store.clone(),
    });
    if let Err(e) = datavolume::keep_storage_class(&store).await {
        tracing::warn!(error = %e, "could not keep the local storage class");
    }
    if let Err(e) = instancetype::keep_common_set(&store).await {
        tracing::warn!(error = %e, "could not keep the common instancetypes and preferences");
    }
    let queue = Arc::new(Queue::default());
    let mut events = store.subscribe();
    let mut observer = recorder::Observer::start(&store, cancel.clone());
    observer.seed(&store).await;
    resync(&ctx, &queue).await;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_resync = Instant::now();
    let mut failures: HashMap<Key, u32> = HashMap::new();
    tracing::info!("controller started");
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            ev = events.recv() => match ev {
                Ok(ev) => {
                    observer.see(&ev);
                    let (ns, name) = key_of(&ev.object);
                    match ev.kind {
                        Kind::VirtualMachine => queue.push(&(Kind::VirtualMachine, ns, name)),
                        Kind::VirtualMachineInstance => {
                            queue.push(&(Kind::VirtualMachineInstance, ns.clone(), name.clone()));
                            queue.push(&(Kind::VirtualMachine, ns, name));
                        }
                        Kind::Node => {
                            // A node that became ready again may take pending VMIs.
                            enqueue_unscheduled(&ctx, &queue).await;
                            if let Ok(node) = serde_json::from_value::<crate::types::Node>(ev.object.clone()) {
                                if let Err(e) = datavolume::on_node(&ctx.store, &node).await {
                                    tracing::warn!(error = %e, "keeping the shared pool's storage class failed");
                                }
                                // Instances a NoExecute taint may evict.
                                match node::no_execute_candidates(&ctx.store, &node).await {
                                    Ok(vmis) => for (ns, name) in vmis {
                                        queue.push(&(Kind::VirtualMachineInstance, ns, name));
                                    },
                                    Err(e) => tracing::warn!(error = %e, "listing a tainted node's instances failed"),
                                }
                            }
                        }
                        Kind::VirtualMachineInstanceMigration => {
                            queue.push(&(Kind::VirtualMachineInstanceMigration, ns, name));
                        }
                        Kind::DataVolume => queue.push(&(Kind::DataVolume, ns, name)),
                        Kind::VirtualMachineSnapshot => {
                            if let Some(content) = snapshot::content_of_snapshot(&ev.object) {
                                queue.push(&(Kind::VirtualMachineSnapshotContent, ns.clone(), content));
                            }
                            queue.push(&(ev.kind, ns, name));
                        }
                        Kind::VirtualMachineRestore | Kind::BackupSchedule => {
                            queue.push(&(ev.kind, ns, name))
                        }
                        Kind::VirtualMachineBackup => {
                            // A schedule prunes when its backups end.
                            if let Some(s) = backup::schedule_of(&ev.object) {
                                queue.push(&(Kind::BackupSchedule, ns.clone(), s));
                            }
                            queue.push(&(ev.kind, ns, name))
                        }
                        Kind::VirtualMachineSnapshotContent => {
                            if let Some(snap) = snapshot::snapshot_of_content(&ev.object) {
                                queue.push(&(Kind::VirtualMachineSnapshot, ns.clone(), snap));
                            }
                            queue.push(&(ev.kind, ns, name));
                        }
                        Kind::Image
                        | Kind::Namespace
                        | Kind::Secret
                        | Kind::ConfigMap
                        | Kind::VirtualMachineInstancetype
                        | Kind::VirtualMachineClusterInstancetype
                        | Kind::VirtualMachinePreference
                        | Kind::VirtualMachineClusterPreference
                        | Kind::ControllerRevision
                        | Kind::StorageClass
                        | Kind::Event
                        | Kind::NetworkAttachmentDefinition => {}
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => resync(&ctx, &queue).await,
                Err(_) => return Ok(()),
            },
            _ = queue.notify.notified() => {},
            _ = tick.tick() => {
                if last_resync.elapsed() > Duration::from_secs(10) {
                    last_resync = Instant::now();
                    resync(&ctx, &queue).await;
                    if let Err(e) = scheduler::check_leases(&ctx).await {
                        tracing::warn!(error = %e, "checking node leases failed");
                    }
                    let _ = ctx.store.prune_events().await;
                }
            },
        }
        let keys = queue.take();
        QUEUE_DEPTH.set((keys.len() + queue.delayed.lock().unwrap().len()) as i64);
        for key in keys {
            RECONCILES.with_label_values(&[key.0.name()]).inc();
            let r = match key.0 {
                Kind::VirtualMachine => vm::reconcile_vm(&ctx, &key.1, &key.2).await,
                Kind::VirtualMachineInstance => vm::reconcile_vmi(&ctx, &key.1, &key.2).await,
                Kind::VirtualMachineInstanceMigration => {
                    migration::reconcile_migration(&ctx, &key.1, &key.2).await
                }
                Kind::DataVolume => datavolume::reconcile_dv(&ctx, &key.1, &key.2).await,
                Kind::VirtualMachineSnapshot => {
                    snapshot::reconcile_snapshot(&ctx, &key.1, &key.2).await
                }
                Kind::VirtualMachineSnapshotContent => {
                    snapshot::reconcile_content(&ctx, &key.1, &key.2).await
                }
                Kind::VirtualMachineRestore => {
                    snapshot::reconcile_restore(&ctx, &key.1, &key.2).await
                }
                Kind::VirtualMachineBackup => backup::reconcile_backup(&ctx, &key.1, &key.2).await,
                Kind::BackupSchedule => {
                    backup::reconcile_schedule(&ctx, &key.1, &key.2, chrono::Utc::now()).await
                }
                _ => Ok(Action::Done),
            };
            match r {
                Ok(Action::Done) => {
                    failures.remove(&key);
                }
                Ok(Action::RequeueAfter(d)) => {
                    failures.remove(&key);
                    queue.push_after(&key, d);
                }
                Err(e) => {
                    RECONCILE_ERRORS.with_label_values(&[key.0.name()]).inc();
                    let n = failures.entry(key.clone()).or_insert(0);
                    *n += 1;
                    let backoff = Duration::from_millis(200 * 2u64.pow((*n).min(7)));
                    tracing::warn!(kind = key.0.name(), namespace = %key.1, name = %key.2, error = %e, retry_in = ?backoff, "reconcile failed");
                    queue.push_after(&key, backoff);
                }
            }
        }
    }
}

/// The namespace and name of a stored object (an event's or a listing's), which is all the
/// queue keeps; the reconcile reads the typed object itself.
fn key_of(o: &serde_json::Value) -> (String, String) {
    #[derive(serde::Deserialize, Default)]
    struct Meta {
        #[serde(default)]
        namespace: String,
        #[serde(default)]
        name: String,
    }
    #[derive(serde::Deserialize)]
    struct Keyed {
        #[serde(default)]
        metadata: Meta,
    }
    let k = Keyed::deserialize(o)
        .map(|k| k.metadata)
        .unwrap_or_default();
    (k.namespace, k.name)
}

/// Queue every object that a reconcile would change, judged from one listing per kind: an
/// idle VM or instance costs no point read and no write transaction. Migrations are all
/// queued (there are few, and they are short-lived).
async fn resync(ctx: &Context, queue: &Queue) {
    for k in resync_keys(&ctx.store).await {
        queue.push(&k);
    }
}

/// The keys the periodic resync queues: the objects a reconcile would change, from one
/// listing per kind (public for the API benchmark, which runs it against a full store).
pub async fn resync_keys(store: &Store) -> Vec<Key> {
    let key =
        |kind: Kind, ns: &str, name: &str| -> Key { (kind, ns.to_string(), name.to_string()) };
    let mut keys = Vec::new();
    let (Ok(vms), Ok(vmis)) = (
        store.all::<VirtualMachine>().await,
        store.all::<VirtualMachineInstance>().await,
    ) else {
        tracing::warn!("resync: listing failed");
        return keys;
    };
    let by_key: HashMap<(&str, &str), &VirtualMachineInstance> = vmis
        .iter()
        .map(|o| ((o.namespace(), o.name()), o))
        .collect();
    for vm in &vms {
        let vmi = by_key.get(&(vm.namespace(), vm.name())).copied();
        if !vm::vm_idle(vm, vmi) {
            keys.push(key(Kind::VirtualMachine, vm.namespace(), vm.name()));
        }
    }
    for vmi in &vmis {
        if !vm::vmi_idle(vmi) {
            keys.push(key(
                Kind::VirtualMachineInstance,
                vmi.namespace(),
                vmi.name(),
            ));
        }
    }
    // DataVolumes without a status yet, or waiting for a node on their shared pool.
    if let Ok(dvs) = store.all::<crate::types::cdi::DataVolume>().await {
        keys.extend(
            dvs.iter()
                .filter(|d| !datavolume::dv_idle(d))
                .map(|d| key(Kind::DataVolume, d.namespace(), d.name())),
        );
    }
    keys.extend(snapshot::pending(store).await);
    keys.extend(backup::pending(store).await);
    if let Ok(migrations) = store.all::<VirtualMachineInstanceMigration>().await {
        keys.extend(migrations.iter().map(|o| {
            key(
                Kind::VirtualMachineInstanceMigration,
                o.namespace(),
                o.name(),
            )
        }));
    }
    keys
}

async fn enqueue_unscheduled(ctx: &Context, queue: &Queue) {
    let f = FieldSelector::parse("status.phase=Pending").expect("valid selector");
    if let Ok((items, _)) = ctx
        .store
        .list(
            Kind::VirtualMachineInstance,
            None,
            &LabelSelector::default(),
            &f,
        )
        .await
    {
        for o in items {
            let (ns, name) = key_of(&o);
            queue.push(&(Kind::VirtualMachineInstance, ns, name));
        }
    }
}

#[cfg(test)]
mod tests;
