//! Live migration, the controller's part. A `VirtualMachineInstanceMigration` moves through
//! KubeVirt's phases:
//!
//! - `Pending`: the controller checks the instance (Running, LiveMigratable), picks a target
//!   node with the scheduler's rules (never the source), writes `migrationState` (source,
//!   target, uid) on the VMI and the migration, and sets `Scheduled`;
//! - `PreparingTarget` → `TargetReady`: the target node's agent prepares disks and the
//!   domain XML it will run, then waits for the tunnel;
//! - `Running`: the source node's agent has its launcher migrate the domain through libvirt
//!   (peer to peer, tunnelled over an agent ⇄ controller ⇄ agent websocket relay);
//! - `Succeeded`: libvirt reported success and the VMI's `nodeName` is the target; or
//!   `Failed`, with the VM still running on the source.
//!
//! Deleting a migration that runs asks for an abort; the finalizer keeps the object until
//! the source agent reports the outcome. A migration whose source or target node stops
//! reporting fails; the instance stays where libvirt says it is.

use std::time::Duration;

use serde_json::{Value, json};

use super::{Action, Context, scheduler};
use crate::store::{Error, FieldSelector, LabelSelector, Store};
use crate::types::annotations::{BLOCK_MIGRATION_ANNOTATION, MIGRATION_FINALIZER};
use crate::types::kubevirt::{migration_phase as mp, phase};
use crate::types::{Kind, now};

/// How long a target may take to become ready before the migration fails.
const TARGET_READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Whether an instance can live-migrate, as KubeVirt's `calculateLiveMigrationCondition`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migratability {
    pub ok: bool,
    /// KubeVirt's reason: `DisksNotLiveMigratable`, `InterfaceNotLiveMigratable`, ...
    pub reason: String,
    pub message: String,
    /// `LiveMigration` (nothing to copy) or `BlockMigration` (local disks are copied).
    pub method: &'static str,
}

/// Compute the LiveMigratable condition from the instance's spec, as KubeVirt's
/// `calculateLiveMigrationCondition`. `persistentVolumeClaim` disks live on the shared
/// storage pool (like a ReadWriteMany PVC): the target opens the same files. Disks built
/// from images (`containerDisk`, `dataVolume`) are copies on the node's local disk: they
/// move only by block migration, which copies them while the guest runs. KubeVirt
/// block-migrates such disks unasked; edgevirt copies them only when asked (the copy takes
/// as long as the disk is big, and the link may be a branch office's): the annotation
/// `edgevirt.io/block-migration: "true"` on the VMI makes it LiveMigratable with method
/// BlockMigration, and the same annotation on one migration asks for it once (see
/// [`migration_method`]). An instance with both kinds cannot be block-migrated: libvirt
/// would copy its shared disks onto themselves. NoCloud disks are made anew on the target.
/// edgevirt has no disk hotplug yet, so HotplugNotLiveMigratable does not arise.
pub fn live_migratable(vmi: &Value) -> Migratability {
    let spec = &vmi["spec"];
    let block = vmi["metadata"]["annotations"][BLOCK_MIGRATION_ANNOTATION] == "true";
    for i in spec["domain"]["devices"]["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if i.get("bridge").is_some() {
            return Migratability {
                ok: false,
                reason: "InterfaceNotLiveMigratable".into(),
                message: format!(
                    "cannot migrate VMI which does not use masquerade to connect to the pod \
                     network (interface {})",
                    i["name"].as_str().unwrap_or("")
                ),
                method: "LiveMigration",
            };
        }
    }
    let (local, shared) = (local_disks(vmi), shared_disks(vmi));
    if local.is_empty() {
        return Migratability {
            ok: true,
            reason: String::new(),
            message: String::new(),
            method: "LiveMigration",
        };
    }
    if !shared.is_empty() {
        return Migratability {
            ok: false,
            reason: "DisksNotLiveMigratable".into(),
            message: format!(
                "cannot migrate VMI: disks {} are on this node's local storage and disks {} on \
                 the shared pool; a block migration would copy the shared ones onto \
                 themselves, so move the local disks to the shared pool \
                 (persistentVolumeClaim) first",
                local.join(", "),
                shared.join(", ")
            ),
            method: "LiveMigration",
        };
    }
    if block {
        return Migratability {
            ok: true,
            reason: String::new(),
            message: format!(
                "local disks {} are copied (block migration)",
                local.join(", ")
            ),
            method: "BlockMigration",
        };
    }
    Migratability {
        ok: false,
        reason: "DisksNotLiveMigratable".into(),
        message: format!(
            "cannot migrate VMI: disks {} are on this node's local storage, not shared; \
             ask for block migration to copy them (edgevirt vm migrate --block, or the \
             annotation {BLOCK_MIGRATION_ANNOTATION}: \"true\" on the migration), or put \
             them on the shared pool (persistentVolumeClaim)",
            local.join(", ")
        ),
        method: "LiveMigration",
    }
}

/// Names of the volumes of a VMI with the given sources.
fn volumes_with(vmi: &Value, sources: &[&str]) -> Vec<String> {
    vmi["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| sources.iter().any(|s| v.get(*s).is_some()))
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect()
}

/// Volumes copied onto the node's local disk from images.
fn local_disks(vmi: &Value) -> Vec<String> {
    volumes_with(vmi, &["containerDisk", "dataVolume"])
}

/// Volumes on the shared storage pool.
pub fn shared_disks(vmi: &Value) -> Vec<String> {
    volumes_with(vmi, &["persistentVolumeClaim"])
}

/// How one migration moves its instance: `Ok("LiveMigration" | "BlockMigration")`, or why
/// it cannot. A migration annotated `edgevirt.io/block-migration: "true"` copies local
/// disks even when the instance itself does not ask for it (unless it has shared ones).
pub fn migration_method(vmi: &Value, migration: &Value) -> Result<&'static str, Migratability> {
    let m = live_migratable(vmi);
    if m.ok {
        return Ok(m.method);
    }
    let asked = migration["metadata"]["annotations"][BLOCK_MIGRATION_ANNOTATION] == "true";
    if asked && m.reason == "DisksNotLiveMigratable" && shared_disks(vmi).is_empty() {
        return Ok("BlockMigration");
    }
    Err(m)
}

/// Why a migration request is refused at admission.
#[derive(Debug)]
pub enum MigrationRefused {
    Store(Error),
    Invalid(String),
}

impl From<Error> for MigrationRefused {
    fn from(e: Error) -> Self {
        MigrationRefused::Store(e)
    }
}

/// Admission of a new migration: the instance exists, runs, is live-migratable, and has no
/// other migration in flight.
pub async fn check_migration_request(
    store: &Store,
    ns: &str,
    vmi_name: &str,
    migration: &Value,
) -> Result<(), MigrationRefused> {
    crate::types::check_name("spec.vmiName", vmi_name)
        .map_err(|e| MigrationRefused::Invalid(e.0))?;
    let Some(vmi) = store
        .get(Kind::VirtualMachineInstance, ns, vmi_name)
        .await?
    else {
        return Err(MigrationRefused::Invalid(format!(
            "the VMI \"{ns}/{vmi_name}\" does not exist"
        )));
    };
    let p = vmi["status"]["phase"].as_str().unwrap_or("");
    if p != phase::RUNNING || vmi["metadata"].get("deletionTimestamp").is_some() {
        return Err(MigrationRefused::Invalid(format!(
            "cannot migrate VMI \"{ns}/{vmi_name}\": it is not running (phase {p:?})"
        )));
    }
    if let Err(m) = migration_method(&vmi, migration) {
        return Err(MigrationRefused::Invalid(format!(
            "cannot migrate VMI \"{ns}/{vmi_name}\": {}: {}",
            m.reason, m.message
        )));
    }
    if let Some(other) = active_migration(store, ns, vmi_name).await? {
        return Err(MigrationRefused::Invalid(format!(
            "in-flight migration detected: {other} is already migrating VMI \"{ns}/{vmi_name}\""
        )));
    }
    Ok(())
}

/// The name of a migration of this instance that has not finished, if any.
pub async fn active_migration(
    store: &Store,
    ns: &str,
    vmi_name: &str,
) -> Result<Option<String>, Error> {
    let (items, _) = store
        .list(
            Kind::VirtualMachineInstanceMigration,
            Some(ns),
            &LabelSelector::default(),
            &FieldSelector::default(),
        )
        .await?;
    Ok(items
        .iter()
        .filter(|m| m["spec"]["vmiName"] == vmi_name)
        .find(|m| !mp::is_final(m["status"]["phase"].as_str().unwrap_or("")))
        .and_then(|m| m["metadata"]["name"].as_str().map(str::to_string)))
}

fn deleting(o: &Value) -> bool {
    o["metadata"].get("deletionTimestamp").is_some()
}

/// Set the migration's phase (with KubeVirt's phase transition list) and optionally a
/// failure; mirror the state onto the VMI.
pub fn set_phase(o: &mut Value, p: &str) {
    if o["status"]["phase"] == p {
        return;
    }
    o["status"]["phase"] = json!(p);
    if !o["status"]["phaseTransitionTimestamps"].is_array() {
        o["status"]["phaseTransitionTimestamps"] = json!([]);
    }
    if let Some(a) = o["status"]["phaseTransitionTimestamps"].as_array_mut() {
        a.push(json!({"phase": p, "phaseTransitionTimestamp": now()}));
    }
}

async fn fail(
    ctx: &Context,
    ns: &str,
    name: &str,
    vmi_name: &str,
    uid: &str,
    why: &str,
) -> Result<(), Error> {
    tracing::warn!(namespace = %ns, migration = %name, vmi = %vmi_name, reason = %why, "migration failed");
    let why2 = why.to_string();
    ctx.store
        .update(Kind::VirtualMachineInstanceMigration, ns, name, move |o| {
            set_phase(o, mp::FAILED);
            o["status"]["migrationState"]["failed"] = json!(true);
            o["status"]["migrationState"]["failureReason"] = json!(why2);
            o["status"]["migrationState"]["endTimestamp"] = json!(now());
            scheduler::set_cond(o, "Failed", "True", "MigrationFailed", &why2);
            Ok(())
        })
        .await?;
    let why = why.to_string();
    let uid = uid.to_string();
    match ctx
        .store
        .update(Kind::VirtualMachineInstance, ns, vmi_name, move |o| {
            if o["status"]["migrationState"]["migrationUid"] == uid.as_str() {
                o["status"]["migrationState"]["failed"] = json!(true);
                o["status"]["migrationState"]["failureReason"] = json!(why);
                o["status"]["migrationState"]["endTimestamp"] = json!(now());
            }
            Ok(())
        })
        .await
    {
        Ok(_) | Err(Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

async fn remove_finalizer(ctx: &Context, ns: &str, name: &str) -> Result<(), Error> {
    match ctx
        .store
        .update(Kind::VirtualMachineInstanceMigration, ns, name, |o| {
            if let Some(f) = o["metadata"]["finalizers"].as_array_mut() {
                f.retain(|f| f != MIGRATION_FINALIZER);
            }
            Ok(())
        })
        .await
    {
        Ok(_) | Err(Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

fn since(ts: &Value) -> Option<Duration> {
    let t = chrono::DateTime::parse_from_rfc3339(ts.as_str()?).ok()?;
    (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
        .to_std()
        .ok()
}

pub async fn reconcile_migration(ctx: &Context, ns: &str, name: &str) -> Result<Action, Error> {
    let Some(m) = ctx
        .store
        .get(Kind::VirtualMachineInstanceMigration, ns, name)
        .await?
    else {
        return Ok(Action::Done);
    };
    let uid = m["metadata"]["uid"].as_str().unwrap_or("").to_string();
    let vmi_name = m["spec"]["vmiName"].as_str().unwrap_or("").to_string();
    let p = m["status"]["phase"]
        .as_str()
        .unwrap_or(mp::PENDING)
        .to_string();
    let state = &m["status"]["migrationState"];

    if deleting(&m) {
        return match p.as_str() {
            mp::RUNNING => {
                // The source agent aborts and reports; ask once.
                if !state["abortRequested"].as_bool().unwrap_or(false) {
                    tracing::info!(namespace = %ns, migration = %name, "migration deleted while running: aborting");
                    ctx.store
                        .update(Kind::VirtualMachineInstanceMigration, ns, name, |o| {
                            o["status"]["migrationState"]["abortRequested"] = json!(true);
                            o["status"]["migrationState"]["abortStatus"] = json!("Aborting");
                            Ok(())
                        })
                        .await?;
                    let uid2 = uid.clone();
                    let _ = ctx
                        .store
                        .update(Kind::VirtualMachineInstance, ns, &vmi_name, move |o| {
                            if o["status"]["migrationState"]["migrationUid"] == uid2.as_str() {
                                o["status"]["migrationState"]["abortRequested"] = json!(true);
                                o["status"]["migrationState"]["abortStatus"] = json!("Aborting");
                            }
                            Ok(())
                        })
                        .await;
                }
                Ok(Action::RequeueAfter(Duration::from_secs(2)))
            }
            p if mp::is_final(p) => {
                remove_finalizer(ctx, ns, name).await?;
                Ok(Action::Done)
            }
            _ => {
                // Not started: nothing to abort. The target agent cleans up what it prepared.
                fail(
                    ctx,
                    ns,
                    name,
                    &vmi_name,
                    &uid,
                    "cancelled before it started",
                )
                .await?;
                let uid2 = uid.clone();
                let _ = ctx
                    .store
                    .update(Kind::VirtualMachineInstanceMigration, ns, name, move |o| {
                        let _ = &uid2;
                        o["status"]["migrationState"]["abortStatus"] = json!("Succeeded");
                        Ok(())
                    })
                    .await;
                remove_finalizer(ctx, ns, name).await?;
                Ok(Action::Done)
            }
        };
    }
    if mp::is_final(&p) {
        return Ok(Action::Done);
    }
    let vmi = ctx
        .store
        .get(Kind::VirtualMachineInstance, ns, &vmi_name)
        .await?;
    let Some(vmi) = vmi else {
        fail(ctx, ns, name, &vmi_name, &uid, "the VMI is gone").await?;
        return Ok(Action::Done);
    };
    match p.as_str() {
        mp::PENDING | "" => {
            if vmi["status"]["phase"] != phase::RUNNING {
                fail(ctx, ns, name, &vmi_name, &uid, "the VMI is not running").await?;
                return Ok(Action::Done);
            }
            let source = vmi["status"]["nodeName"].as_str().unwrap_or("").to_string();
            let extra = m["spec"]["addedNodeSelector"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            let target = match scheduler::pick_node(ctx, &vmi, Some(&source), &extra).await? {
                Ok((t, _)) => t,
                Err(why) => {
                    fail(
                        ctx,
                        ns,
                        name,
                        &vmi_name,
                        &uid,
                        &format!("no node can take the VMI: {why}"),
                    )
                    .await?;
                    return Ok(Action::Done);
                }
            };
            let method = match migration_method(&vmi, &m) {
                Ok(method) => method,
                Err(why) => {
                    let msg = format!("{}: {}", why.reason, why.message);
                    fail(ctx, ns, name, &vmi_name, &uid, &msg).await?;
                    return Ok(Action::Done);
                }
            };
            let st = json!({
                "migrationUid": uid,
                "sourceNode": source,
                "targetNode": target,
                "mode": "PreCopy",
                "completed": false,
                "failed": false,
                "abortRequested": false,
            });
            let st2 = st.clone();
            ctx.store
                .update(Kind::VirtualMachineInstance, ns, &vmi_name, move |o| {
                    o["status"]["migrationState"] = st2;
                    o["status"]["migrationMethod"] = json!(method);
                    Ok(())
                })
                .await?;
            ctx.store
                .update(Kind::VirtualMachineInstanceMigration, ns, name, move |o| {
                    set_phase(o, mp::SCHEDULED);
                    o["status"]["migrationState"] = st;
                    Ok(())
                })
                .await?;
            tracing::info!(namespace = %ns, migration = %name, vmi = %vmi_name, %source, %target, method, "migration scheduled");
            Ok(Action::RequeueAfter(Duration::from_secs(5)))
        }
        mp::SCHEDULED | mp::PREPARING_TARGET | mp::TARGET_READY | mp::RUNNING => {
            for (role, node) in [
                ("source", &state["sourceNode"]),
                ("target", &state["targetNode"]),
            ] {
                let n = node.as_str().unwrap_or("");
                let ready = ctx
                    .store
                    .get(Kind::Node, "", n)
                    .await?
                    .is_some_and(|n| scheduler::node_ready(&n));
                if !ready {
                    fail(
                        ctx,
                        ns,
                        name,
                        &vmi_name,
                        &uid,
                        &format!("the {role} node {n} is not ready"),
                    )
                    .await?;
                    return Ok(Action::Done);
                }
            }
            if p != mp::RUNNING {
                let scheduled_at = m["status"]["phaseTransitionTimestamps"]
                    .as_array()
                    .and_then(|a| a.iter().find(|t| t["phase"] == mp::SCHEDULED))
                    .map(|t| t["phaseTransitionTimestamp"].clone())
                    .unwrap_or(Value::Null);
                if since(&scheduled_at).is_some_and(|d| d > TARGET_READY_TIMEOUT) {
                    fail(
                        ctx,
                        ns,
                        name,
                        &vmi_name,
                        &uid,
                        "the target node did not get ready in time",
                    )
                    .await?;
                    return Ok(Action::Done);
                }
            }
            Ok(Action::RequeueAfter(Duration::from_secs(5)))
        }
        other => {
            fail(
                ctx,
                ns,
                name,
                &vmi_name,
                &uid,
                &format!("unknown phase {other:?}"),
            )
            .await?;
            Ok(Action::Done)
        }
    }
}
