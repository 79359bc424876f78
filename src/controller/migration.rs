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

use serde_json::Value;

use super::vm::{read, remove_finalizer};
use super::{Action, Context, scheduler};
use crate::rules::migration::{migration_method, set_phase};
use crate::rules::node::node_ready;
use crate::store::{Error, FieldSelector, LabelSelector, Store};
use crate::types::annotations::MIGRATION_FINALIZER;
use crate::types::kubevirt::{
    Condition, ConditionType, MigrationPhase, MigrationState, Phase,
    VirtualMachineInstanceMigration, set_condition,
};
use crate::types::{Meta, Node, Typed, VirtualMachineInstance, now};

/// How long a target may take to become ready before the migration fails.
const TARGET_READY_TIMEOUT: Duration = Duration::from_secs(180);

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
    let migration = VirtualMachineInstanceMigration::from_value(migration.clone())
        .map_err(|e| MigrationRefused::Invalid(e.0))?;
    let Some(vmi) = store
        .get_typed::<VirtualMachineInstance>(ns, vmi_name)
        .await?
    else {
        return Err(MigrationRefused::Invalid(format!(
            "the VMI \"{ns}/{vmi_name}\" does not exist"
        )));
    };
    let p = vmi.status.as_ref().and_then(|s| s.phase.clone());
    if p != Some(Phase::Running) || vmi.deleting() {
        let shown = p.as_ref().map_or("", |p| p.as_str());
        return Err(MigrationRefused::Invalid(format!(
            "cannot migrate VMI \"{ns}/{vmi_name}\": it is not running (phase {shown:?})"
        )));
    }
    if let Err(m) = migration_method(&vmi, &migration) {
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
    let items: Vec<VirtualMachineInstanceMigration> = store
        .list_typed(
            Some(ns),
            &LabelSelector::default(),
            &FieldSelector::default(),
        )
        .await?;
    Ok(items
        .iter()
        .filter(|m| m.spec.vmi_name == vmi_name)
        .find(|m| !m.phase().is_final())
        .map(|m| m.name().to_string()))
}

/// Change the migration state on the VMI too, if it is still this migration's.
async fn on_vmi_state(
    ctx: &Context,
    ns: &str,
    vmi_name: &str,
    uid: &str,
    f: impl FnOnce(&mut MigrationState),
) -> Result<(), Error> {
    match ctx
        .store
        .update_typed(ns, vmi_name, |o: &mut VirtualMachineInstance| {
            if let Some(ms) = o
                .status
                .as_mut()
                .and_then(|s| s.migration_state.as_mut())
                .filter(|ms| ms.migration_uid.as_deref() == Some(uid))
            {
                f(ms);
            }
            Ok(())
        })
        .await
    {
        Ok(_) | Err(Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
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
    let failed = |ms: &mut MigrationState| {
        ms.failed = true;
        ms.failure_reason = Some(why.to_string());
        ms.end_timestamp = Some(now());
    };
    ctx.store
        .update_typed(ns, name, |o: &mut VirtualMachineInstanceMigration| {
            let st = o.status.get_or_insert_default();
            set_phase(st, MigrationPhase::Failed);
            failed(st.migration_state.get_or_insert_default());
            set_condition(
                &mut st.conditions,
                Condition::new(ConditionType::Failed, true, "MigrationFailed", why),
            );
            Ok(())
        })
        .await?;
    on_vmi_state(ctx, ns, vmi_name, uid, failed).await
}

fn since(ts: &str) -> Option<Duration> {
    let t = chrono::DateTime::parse_from_rfc3339(ts).ok()?;
    (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
        .to_std()
        .ok()
}

pub async fn reconcile_migration(ctx: &Context, ns: &str, name: &str) -> Result<Action, Error> {
    let Some(m) = read::<VirtualMachineInstanceMigration>(ctx, ns, name).await? else {
        return Ok(Action::Done);
    };
    let uid = m.uid().to_string();
    let vmi_name = m.spec.vmi_name.clone();
    let p = match m.phase() {
        MigrationPhase::Other(s) if s.is_empty() => MigrationPhase::Pending,
        p => p,
    };
    let state = m.migration_state().cloned().unwrap_or_default();

    if m.deleting() {
        return match p {
            MigrationPhase::Running => {
                // The source agent aborts and reports; ask once.
                if !state.abort_requested {
                    tracing::info!(namespace = %ns, migration = %name, "migration deleted while running: aborting");
                    let abort = |ms: &mut MigrationState| {
                        ms.abort_requested = true;
                        ms.abort_status = Some("Aborting".into());
                    };
                    ctx.store
                        .update_typed(ns, name, |o: &mut VirtualMachineInstanceMigration| {
                            abort(
                                o.status
                                    .get_or_insert_default()
                                    .migration_state
                                    .get_or_insert_default(),
                            );
                            Ok(())
                        })
                        .await?;
                    on_vmi_state(ctx, ns, &vmi_name, &uid, abort).await?;
                }
                Ok(Action::RequeueAfter(Duration::from_secs(2)))
            }
            p if p.is_final() => {
                remove_finalizer::<VirtualMachineInstanceMigration>(
                    ctx,
                    ns,
                    name,
                    MIGRATION_FINALIZER,
                )
                .await?;
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
                let _ = ctx
                    .store
                    .update_typed(ns, name, |o: &mut VirtualMachineInstanceMigration| {
                        o.status
                            .get_or_insert_default()
                            .migration_state
                            .get_or_insert_default()
                            .abort_status = Some("Succeeded".into());
                        Ok(())
                    })
                    .await;
                remove_finalizer::<VirtualMachineInstanceMigration>(
                    ctx,
                    ns,
                    name,
                    MIGRATION_FINALIZER,
                )
                .await?;
                Ok(Action::Done)
            }
        };
    }
    if p.is_final() {
        return Ok(Action::Done);
    }
    let Some(vmi) = ctx
        .store
        .get_typed::<VirtualMachineInstance>(ns, &vmi_name)
        .await?
    else {
        fail(ctx, ns, name, &vmi_name, &uid, "the VMI is gone").await?;
        return Ok(Action::Done);
    };
    match p {
        MigrationPhase::Pending => {
            if vmi.phase() != Phase::Running {
                fail(ctx, ns, name, &vmi_name, &uid, "the VMI is not running").await?;
                return Ok(Action::Done);
            }
            let source = vmi.node_name().unwrap_or_default().to_string();
            let target =
                match scheduler::pick_node(ctx, &vmi, Some(&source), &m.spec.added_node_selector)
                    .await?
                {
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
            let st = MigrationState {
                migration_uid: Some(uid.clone()),
                source_node: Some(source.clone()),
                target_node: Some(target.clone()),
                mode: Some("PreCopy".into()),
                ..Default::default()
            };
            ctx.store
                .update_typed(ns, &vmi_name, |o: &mut VirtualMachineInstance| {
                    let s = o.status.get_or_insert_default();
                    s.migration_state = Some(st.clone());
                    s.migration_method = Some(method.clone());
                    Ok(())
                })
                .await?;
            ctx.store
                .update_typed(ns, name, |o: &mut VirtualMachineInstanceMigration| {
                    let s = o.status.get_or_insert_default();
                    set_phase(s, MigrationPhase::Scheduled);
                    s.migration_state = Some(st);
                    Ok(())
                })
                .await?;
            tracing::info!(namespace = %ns, migration = %name, vmi = %vmi_name, %source, %target, %method, "migration scheduled");
            Ok(Action::RequeueAfter(Duration::from_secs(5)))
        }
        MigrationPhase::Scheduled
        | MigrationPhase::PreparingTarget
        | MigrationPhase::TargetReady
        | MigrationPhase::Running => {
            for (role, node) in [
                ("source", &state.source_node),
                ("target", &state.target_node),
            ] {
                let n = node.as_deref().unwrap_or_default();
                let ready = ctx
                    .store
                    .get_typed::<Node>("", n)
                    .await?
                    .is_some_and(|n| node_ready(&n));
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
            if p != MigrationPhase::Running {
                let scheduled_at = m.status.as_ref().and_then(|s| {
                    s.phase_transition_timestamps
                        .iter()
                        .find(|t| t.phase == MigrationPhase::Scheduled)
                });
                if scheduled_at
                    .and_then(|t| since(&t.phase_transition_timestamp))
                    .is_some_and(|d| d > TARGET_READY_TIMEOUT)
                {
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
                &format!("unknown phase {:?}", other.as_str()),
            )
            .await?;
            Ok(Action::Done)
        }
    }
}
