//! VM → VMI by run strategy, state-change requests (start/stop/restart), VM status, and VMI
//! scheduling and clean-up of never-scheduled instances.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::instancetype::{self, Resolved, Unusable};
use super::{Action, Context, scheduler};
use crate::store::Error;
use crate::types::annotations::{LAUNCHER_FINALIZER, VOLUMES_FINALIZER, VOLUMES_NODE_ANNOTATION};
use crate::types::kubevirt::{
    Condition, ConditionStatus, ConditionType, ERR_IMAGE_PULL, Phase, RunStrategy, StartFailure,
    VirtualMachineInstanceStatus, condition_true, remove_condition, set_condition,
};
use crate::types::{Meta, Typed, VirtualMachine, VirtualMachineInstance};

/// A stored object read for a reconcile; one that does not decode is logged and left alone
/// (a newer peer's shape this release cannot read), not retried in a loop.
pub(super) async fn read<T: Typed>(
    ctx: &Context,
    ns: &str,
    name: &str,
) -> Result<Option<T>, Error> {
    match ctx.store.get_typed::<T>(ns, name).await {
        Err(Error::Invalid(e)) => {
            tracing::error!(namespace = %ns, %name, error = %e, "stored object does not decode; leaving it alone");
            Ok(None)
        }
        r => r,
    }
}

pub async fn reconcile_vm(ctx: &Context, ns: &str, name: &str) -> Result<Action, Error> {
    let store = &ctx.store;
    let vm = read::<VirtualMachine>(ctx, ns, name).await?;
    let vmi = read::<VirtualMachineInstance>(ctx, ns, name).await?;
    let Some(vm) = vm else {
        // The VM is gone: its revisions and DataVolumes go, and its instance too.
        instancetype::forget_revisions(store, ns, name).await?;
        super::datavolume::forget_owned(store, ns, name).await?;
        if let Some(vmi) = vmi
            && vmi.owner_uid("VirtualMachine").is_some()
            && !vmi.deleting()
        {
            store
                .delete(VirtualMachineInstance::KIND, ns, name, None)
                .await?;
        }
        return Ok(Action::Done);
    };
    let vmi = owned(&vm, vmi.as_ref()).cloned();
    if vm.deleting() {
        if let Some(vmi) = &vmi {
            if !vmi.deleting() {
                store
                    .delete(VirtualMachineInstance::KIND, ns, name, None)
                    .await?;
            }
        } else if vm.annotation(VOLUMES_NODE_ANNOTATION).is_none() {
            // No volumes were ever created for it: nothing for an agent to clean up.
            remove_finalizer::<VirtualMachine>(ctx, ns, name, VOLUMES_FINALIZER).await?;
            return Ok(Action::Done);
        }
        set_vm_status(ctx, ns, name, vmi.as_ref()).await?;
        return Ok(Action::Done);
    }

    // Its DataVolumes exist from the start, as KubeVirt creates them (they wait for a
    // consumer).
    super::datavolume::ensure_templates(store, &vm).await?;

    // The instancetype and preference it uses are copied before anything starts it.
    if instancetype::needs_revisions(&vm) {
        match instancetype::keep_revisions(store, &vm).await {
            Ok(()) => {}
            Err(Unusable::Store(e)) => return Err(e),
            Err(Unusable::Missing { reason, message }) => {
                set_failure(ctx, ns, name, reason, &message).await?;
                return Ok(Action::RequeueAfter(Duration::from_secs(10)));
            }
        }
    }

    // Pending start/stop requests come first, in order.
    let first = vm
        .status
        .as_ref()
        .and_then(|s| s.state_change_requests.first());
    if let Some(first) = first {
        let done = match first.action.as_str() {
            "Stop" => match &vmi {
                Some(v) if first.uid.as_deref().is_none_or(|u| u == v.uid()) => {
                    if !v.deleting() {
                        store
                            .delete(VirtualMachineInstance::KIND, ns, name, None)
                            .await?;
                    }
                    false
                }
                _ => true,
            },
            "Start" => match &vmi {
                None => {
                    create_vmi(ctx, &vm).await?;
                    true
                }
                Some(v) if v.deleting() => false,
                Some(v) if v.phase().is_final() => {
                    store
                        .delete(VirtualMachineInstance::KIND, ns, name, None)
                        .await?;
                    false
                }
                Some(_) => true,
            },
            _ => true,
        };
        if done {
            store
                .update_typed(ns, name, |o: &mut VirtualMachine| {
                    if let Some(st) = o.status.as_mut()
                        && !st.state_change_requests.is_empty()
                    {
                        st.state_change_requests.remove(0);
                    }
                    Ok(())
                })
                .await?;
        }
        set_vm_status(ctx, ns, name, vmi.as_ref()).await?;
        return Ok(Action::Done);
    }

    let mut action = Action::Done;
    match (vm.spec.strategy(), &vmi) {
        (RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once, None) => {
            // After failures, wait out the crash-loop backoff before starting again.
            match retry_wait(&vm) {
                Some(wait) => action = Action::RequeueAfter(wait),
                // Once: start only if it never ran (a finished instance stays, keeping it
                // stopped).
                None => create_vmi(ctx, &vm).await?,
            }
        }
        (RunStrategy::Always | RunStrategy::RerunOnFailure, Some(v))
            if v.phase() == Phase::Failed && !v.deleting() =>
        {
            record_failure(ctx, ns, name, v).await?;
            store
                .delete(VirtualMachineInstance::KIND, ns, name, None)
                .await?;
        }
        (RunStrategy::Always, Some(v)) if v.phase().is_final() && !v.deleting() => {
            store
                .delete(VirtualMachineInstance::KIND, ns, name, None)
                .await?;
        }
        (RunStrategy::Halted, Some(v)) if !v.deleting() => {
            store
                .delete(VirtualMachineInstance::KIND, ns, name, None)
                .await?;
        }
        _ => {}
    }
    let vmi = read::<VirtualMachineInstance>(ctx, ns, name).await?;
    set_vm_status(ctx, ns, name, vmi.as_ref()).await?;
    Ok(action)
}

/// How long to wait before starting a VM whose instances keep failing (KubeVirt's
/// `status.startFailure`), if at all.
fn retry_wait(vm: &VirtualMachine) -> Option<Duration> {
    let at = vm
        .status
        .as_ref()?
        .start_failure
        .as_ref()?
        .retry_after_timestamp
        .as_deref()?;
    let at = chrono::DateTime::parse_from_rfc3339(at).ok()?;
    (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
        .to_std()
        .ok()
        .filter(|d| !d.is_zero())
}

/// Count a failed start and set the next retry time: 10 s, doubling, at most 5 min.
async fn record_failure(
    ctx: &Context,
    ns: &str,
    name: &str,
    vmi: &VirtualMachineInstance,
) -> Result<(), Error> {
    let failed_uid = vmi.uid().to_string();
    ctx.store
        .update_typed(ns, name, |o: &mut VirtualMachine| {
            let st = o.status.get_or_insert_default();
            let sf = st.start_failure.get_or_insert_default();
            if sf.last_failed_vmi_uid.as_deref() == Some(failed_uid.as_str()) {
                return Ok(());
            }
            let retries = sf.retries + 1;
            let wait = (10u64 << (retries - 1).min(5)).min(300);
            let at = chrono::Utc::now() + chrono::Duration::seconds(wait as i64);
            *sf = StartFailure {
                retries,
                last_failed_vmi_uid: Some(failed_uid),
                retry_after_timestamp: Some(at.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
            };
            tracing::warn!(namespace = %ns, %name, retries, wait_secs = wait, "VMI failed; backing off before the next start");
            Ok(())
        })
        .await
        .map(|_| ())
}

/// KubeVirt's `Failure` condition on a VM: it cannot start, and why.
async fn set_failure(
    ctx: &Context,
    ns: &str,
    name: &str,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    tracing::warn!(namespace = %ns, %name, %reason, %message, "VM cannot start");
    update_vm(ctx, ns, name, |o| {
        let st = o.status.get_or_insert_default();
        set_condition(
            &mut st.conditions,
            Condition::new(ConditionType::Failure, true, reason, message),
        );
    })
    .await
}

/// A new instance from the VM's template (with its instancetype and preference applied),
/// owned by the VM, Pending. One that cannot be made is the VM's `Failure` condition.
async fn create_vmi(ctx: &Context, vm: &VirtualMachine) -> Result<(), Error> {
    let (ns, name) = (vm.namespace(), vm.name());
    let resolved = match Resolved::of(&ctx.store, vm).await {
        Ok(r) => r,
        Err(Unusable::Store(e)) => return Err(e),
        Err(Unusable::Missing { reason, message }) => {
            return set_failure(ctx, ns, name, reason, &message).await;
        }
    };
    let (spec, extra_annotations) = match resolved.expand(vm, "spec") {
        Ok(x) => x,
        Err(errors) => {
            let lines: Vec<String> = errors.iter().map(|e| e.message.clone()).collect();
            let message = format!("VMI conflicts with instancetype spec: {}", lines.join(", "));
            return set_failure(ctx, ns, name, "FailedCreate", &message).await;
        }
    };
    let had_failure = vm.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == ConditionType::Failure)
    });
    if had_failure {
        ctx.store
            .update_typed(ns, name, |o: &mut VirtualMachine| {
                if let Some(st) = o.status.as_mut() {
                    remove_condition(&mut st.conditions, &ConditionType::Failure);
                }
                Ok(())
            })
            .await?;
    }
    let tmeta = vm.spec.template.metadata.clone().unwrap_or_default();
    let mut annotations = tmeta.annotations;
    for (k, v) in extra_annotations {
        annotations.entry(k).or_insert(v);
    }
    for (m, preference, ns_key, cluster_key) in [
        (
            &vm.spec.instancetype,
            false,
            "kubevirt.io/instancetype-name",
            "kubevirt.io/cluster-instancetype-name",
        ),
        (
            &vm.spec.preference,
            true,
            "kubevirt.io/preference-name",
            "kubevirt.io/cluster-preference-name",
        ),
    ] {
        if let Some(m) = m {
            let cluster = m.scope(preference) != Ok(crate::types::instancetype::Scope::Namespaced);
            let key = if cluster { cluster_key } else { ns_key };
            annotations.insert(key.to_string(), m.name.clone());
        }
    }
    let mut labels = tmeta.labels;
    labels.insert("kubevirt.io/vm".into(), vm.name().to_string());
    let vmi = VirtualMachineInstance {
        metadata: ObjectMeta {
            name: Some(vm.name().to_string()),
            namespace: Some(vm.namespace().to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![vm.owner_reference()]),
            finalizers: Some(vec![LAUNCHER_FINALIZER.to_string()]),
            ..Default::default()
        },
        spec,
        status: Some({
            let mut st = VirtualMachineInstanceStatus::default();
            st.enter_phase(Phase::Pending, false);
            st
        }),
    };
    match ctx.store.create_typed(&vmi).await {
        Ok(_) => {
            tracing::info!(namespace = %vm.namespace(), name = %vm.name(), "created VirtualMachineInstance");
            Ok(())
        }
        Err(Error::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// KubeVirt's printable status of a VM from its instance.
pub fn printable_status(vm_deleting: bool, vmi: Option<&VirtualMachineInstance>) -> &'static str {
    if vm_deleting {
        return "Terminating";
    }
    let Some(v) = vmi else { return "Stopped" };
    if v.deleting() {
        return "Stopping";
    }
    let unschedulable = v
        .conditions()
        .iter()
        .any(|c| c.type_ == ConditionType::PodScheduled && c.status == ConditionStatus::False);
    let paused = condition_true(v.conditions(), &ConditionType::Paused);
    let pull_failed = v.conditions().iter().any(|c| {
        c.type_ == ConditionType::Synchronized
            && c.status == ConditionStatus::False
            && c.reason.as_deref() == Some(ERR_IMAGE_PULL)
    });
    match v.phase() {
        Phase::Pending | Phase::Scheduling if unschedulable => "ErrorUnschedulable",
        Phase::Scheduled if pull_failed => ERR_IMAGE_PULL,
        Phase::Pending | Phase::Scheduling | Phase::Scheduled => "Starting",
        Phase::Running if paused => "Paused",
        Phase::Running => "Running",
        Phase::Succeeded => "Stopped",
        Phase::Failed => "CrashLoopBackOff",
        _ => "Unknown",
    }
}

async fn set_vm_status(
    ctx: &Context,
    ns: &str,
    name: &str,
    vmi: Option<&VirtualMachineInstance>,
) -> Result<(), Error> {
    update_vm(ctx, ns, name, |o| apply_vm_status(o, vmi)).await
}

/// Change a VM that may have gone meanwhile (then there is nothing to change).
async fn update_vm(
    ctx: &Context,
    ns: &str,
    name: &str,
    f: impl FnOnce(&mut VirtualMachine),
) -> Result<(), Error> {
    let r = ctx
        .store
        .update_typed(ns, name, |o: &mut VirtualMachine| {
            f(o);
            Ok(())
        })
        .await;
    match r {
        Ok(_) | Err(Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The VM's status as its instance makes it (what [`set_vm_status`] writes).
fn apply_vm_status(o: &mut VirtualMachine, vmi: Option<&VirtualMachineInstance>) {
    let printable = printable_status(o.deleting(), vmi);
    let ready = vmi.is_some_and(|v| condition_true(v.conditions(), &ConditionType::Ready));
    let strategy = o.spec.strategy();
    let running = vmi.is_some_and(|v| v.phase() == Phase::Running);
    let backing_off = vmi.is_none() && retry_wait(o).is_some();
    let st = o.status.get_or_insert_default();
    if running {
        st.start_failure = None;
    }
    st.printable_status = Some(
        if backing_off {
            "CrashLoopBackOff"
        } else {
            printable
        }
        .to_string(),
    );
    st.created = vmi.is_some();
    st.ready = ready;
    st.run_strategy = Some(strategy);
    let reason = if ready {
        ""
    } else if vmi.is_some() {
        "NotReady"
    } else {
        "VMINotExists"
    };
    set_condition(
        &mut st.conditions,
        Condition::new(ConditionType::Ready, ready, reason, ""),
    );
}

/// The instance a VM owns, of those with its name (one left from a deleted VM of the same
/// name is not its).
fn owned<'a>(
    vm: &VirtualMachine,
    vmi: Option<&'a VirtualMachineInstance>,
) -> Option<&'a VirtualMachineInstance> {
    vmi.filter(|v| v.owner_uid("VirtualMachine").is_none_or(|u| u == vm.uid()))
}

/// Whether reconciling this VM would change anything, judged from a listing (the periodic
/// resync): an idle VM is neither read again nor written.
pub fn vm_idle(vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>) -> bool {
    if vm.deleting() {
        return false;
    }
    if vm
        .status
        .as_ref()
        .is_some_and(|s| !s.state_change_requests.is_empty())
        || instancetype::needs_revisions(vm)
    {
        return false;
    }
    let vmi = owned(vm, vmi);
    // The same cases as reconcile_vm's: any that acts is not idle.
    let acts = match (vm.spec.strategy(), vmi) {
        (RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once, None) => true,
        (RunStrategy::Always | RunStrategy::RerunOnFailure, Some(v))
            if v.phase() == Phase::Failed && !v.deleting() =>
        {
            true
        }
        (RunStrategy::Always, Some(v)) if v.phase().is_final() && !v.deleting() => true,
        (RunStrategy::Halted, Some(v)) if !v.deleting() => true,
        _ => false,
    };
    if acts {
        return false;
    }
    let mut after = vm.clone();
    apply_vm_status(&mut after, vmi);
    after.status == vm.status
}

/// Whether reconcile_vmi would do nothing for this instance.
pub fn vmi_idle(vmi: &VirtualMachineInstance) -> bool {
    let unplaced = vmi.node_name().is_none();
    if vmi.deleting() {
        return !unplaced;
    }
    !(unplaced && vmi.phase() == Phase::Pending)
}

/// Remove a finalizer from an object, if it is still there.
pub(super) async fn remove_finalizer<T: Typed>(
    ctx: &Context,
    ns: &str,
    name: &str,
    f: &str,
) -> Result<(), Error> {
    match ctx
        .store
        .update_typed(ns, name, |o: &mut T| {
            if let Some(fs) = o.meta_mut().finalizers.as_mut() {
                fs.retain(|x| x != f);
            }
            Ok(())
        })
        .await
    {
        Ok(_) | Err(Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

pub async fn reconcile_vmi(ctx: &Context, ns: &str, name: &str) -> Result<Action, Error> {
    let Some(vmi) = read::<VirtualMachineInstance>(ctx, ns, name).await? else {
        return Ok(Action::Done);
    };
    if vmi.deleting() {
        if vmi.node_name().is_none() {
            // Never placed: no agent holds anything for it.
            remove_finalizer::<VirtualMachineInstance>(ctx, ns, name, LAUNCHER_FINALIZER).await?;
        }
        return Ok(Action::Done);
    }
    if vmi.node_name().is_none() && vmi.phase() == Phase::Pending {
        return match scheduler::schedule(ctx, &vmi).await? {
            true => Ok(Action::Done),
            false => Ok(Action::RequeueAfter(Duration::from_secs(5))),
        };
    }
    if let Some(node) = vmi.node_name()
        && !vmi.phase().is_final()
        && let Some(left) = super::node::evict_for_taints(&ctx.store, &vmi, node).await?
    {
        // Another look when its tolerationSeconds run out (or sooner, if the taint goes).
        return Ok(Action::RequeueAfter(left.max(Duration::from_millis(100))));
    }
    Ok(Action::Done)
}
