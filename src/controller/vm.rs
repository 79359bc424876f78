//! VM → VMI by run strategy, state-change requests (start/stop/restart), VM status, and VMI
//! scheduling and clean-up of never-scheduled instances.

use std::time::Duration;

use serde_json::{Value, json};

use super::{Action, Context, scheduler};
use crate::api::admission::{LAUNCHER_FINALIZER, VOLUMES_FINALIZER};
use crate::store::Error;
use crate::types::kubevirt::{RunStrategy, VirtualMachineSpec, phase};
use crate::types::{Kind, now};

use crate::types::annotations::VOLUMES_NODE_ANNOTATION;

fn deleting(o: &Value) -> bool {
    o["metadata"].get("deletionTimestamp").is_some()
}

fn vmi_phase(o: &Value) -> &str {
    o["status"]["phase"].as_str().unwrap_or(phase::PENDING)
}

pub async fn reconcile_vm(ctx: &Context, ns: &str, name: &str) -> Result<Action, Error> {
    let store = &ctx.store;
    let vm = store.get(Kind::VirtualMachine, ns, name).await?;
    let vmi = store.get(Kind::VirtualMachineInstance, ns, name).await?;
    let Some(vm) = vm else {
        // The VM is gone: its instance goes too.
        if let Some(vmi) = vmi
            && owned_by_vm(&vmi).is_some()
            && !deleting(&vmi)
        {
            store
                .delete(Kind::VirtualMachineInstance, ns, name, None)
                .await?;
        }
        return Ok(Action::Done);
    };
    let vm_uid = vm["metadata"]["uid"].as_str().unwrap_or("").to_string();
    let vmi = vmi.filter(|v| owned_by_vm(v).is_none_or(|u| u == vm_uid));
    if deleting(&vm) {
        if let Some(vmi) = &vmi {
            if !deleting(vmi) {
                store
                    .delete(Kind::VirtualMachineInstance, ns, name, None)
                    .await?;
            }
        } else if vm["metadata"]["annotations"]
            .get(VOLUMES_NODE_ANNOTATION)
            .is_none()
        {
            // No volumes were ever created for it: nothing for an agent to clean up.
            remove_finalizer(ctx, Kind::VirtualMachine, ns, name, VOLUMES_FINALIZER).await?;
            return Ok(Action::Done);
        }
        set_vm_status(ctx, ns, name, vmi.as_ref()).await?;
        return Ok(Action::Done);
    }
    let spec: VirtualMachineSpec = match serde_json::from_value(vm["spec"].clone()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(namespace = %ns, %name, error = %e, "stored VM spec does not decode");
            return Ok(Action::Done);
        }
    };

    // Pending start/stop requests come first, in order.
    let requests = vm["status"]["stateChangeRequests"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if let Some(first) = requests.first() {
        let done = match first["action"].as_str() {
            Some("Stop") => match &vmi {
                Some(v) if first["uid"].is_null() || first["uid"] == v["metadata"]["uid"] => {
                    if !deleting(v) {
                        store
                            .delete(Kind::VirtualMachineInstance, ns, name, None)
                            .await?;
                    }
                    false
                }
                _ => true,
            },
            Some("Start") => match &vmi {
                None => {
                    create_vmi(ctx, &vm, &spec).await?;
                    true
                }
                Some(v) if deleting(v) => false,
                Some(v) if phase::is_final(vmi_phase(v)) => {
                    store
                        .delete(Kind::VirtualMachineInstance, ns, name, None)
                        .await?;
                    false
                }
                Some(_) => true,
            },
            _ => true,
        };
        if done {
            store
                .update(Kind::VirtualMachine, ns, name, |o| {
                    if let Some(a) = o["status"]["stateChangeRequests"].as_array_mut()
                        && !a.is_empty()
                    {
                        a.remove(0);
                    }
                    Ok(())
                })
                .await?;
        }
        set_vm_status(ctx, ns, name, vmi.as_ref()).await?;
        return Ok(Action::Done);
    }

    let mut action = Action::Done;
    match (spec.strategy(), &vmi) {
        (RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once, None) => {
            // After failures, wait out the crash-loop backoff before starting again.
            match retry_wait(&vm) {
                Some(wait) => action = Action::RequeueAfter(wait),
                // Once: start only if it never ran (a finished instance stays, keeping it
                // stopped).
                None => create_vmi(ctx, &vm, &spec).await?,
            }
        }
        (RunStrategy::Always | RunStrategy::RerunOnFailure, Some(v))
            if vmi_phase(v) == phase::FAILED && !deleting(v) =>
        {
            record_failure(ctx, ns, name, v).await?;
            store
                .delete(Kind::VirtualMachineInstance, ns, name, None)
                .await?;
        }
        (RunStrategy::Always, Some(v)) if phase::is_final(vmi_phase(v)) && !deleting(v) => {
            store
                .delete(Kind::VirtualMachineInstance, ns, name, None)
                .await?;
        }
        (RunStrategy::Halted, Some(v)) if !deleting(v) => {
            store
                .delete(Kind::VirtualMachineInstance, ns, name, None)
                .await?;
        }
        _ => {}
    }
    let vmi = store.get(Kind::VirtualMachineInstance, ns, name).await?;
    set_vm_status(ctx, ns, name, vmi.as_ref()).await?;
    Ok(action)
}

/// How long to wait before starting a VM whose instances keep failing (KubeVirt's
/// `status.startFailure`), if at all.
fn retry_wait(vm: &Value) -> Option<Duration> {
    let at = vm["status"]["startFailure"]["retryAfterTimestamp"].as_str()?;
    let at = chrono::DateTime::parse_from_rfc3339(at).ok()?;
    (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
        .to_std()
        .ok()
        .filter(|d| !d.is_zero())
}

/// Count a failed start and set the next retry time: 10 s, doubling, at most 5 min.
async fn record_failure(ctx: &Context, ns: &str, name: &str, vmi: &Value) -> Result<(), Error> {
    let failed_uid = vmi["metadata"]["uid"].clone();
    ctx.store
        .update(Kind::VirtualMachine, ns, name, move |o| {
            let sf = &o["status"]["startFailure"];
            if sf["lastFailedVMIUID"] == failed_uid {
                return Ok(());
            }
            let retries = sf["retries"].as_u64().unwrap_or(0) + 1;
            let wait = (10u64 << (retries - 1).min(5)).min(300);
            let at = chrono::Utc::now() + chrono::Duration::seconds(wait as i64);
            o["status"]["startFailure"] = json!({
                "retries": retries,
                "lastFailedVMIUID": failed_uid,
                "retryAfterTimestamp": at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            });
            tracing::warn!(namespace = %o["metadata"]["namespace"].as_str().unwrap_or(""), name = %o["metadata"]["name"].as_str().unwrap_or(""), retries, wait_secs = wait, "VMI failed; backing off before the next start");
            Ok(())
        })
        .await
        .map(|_| ())
}

fn owned_by_vm(vmi: &Value) -> Option<String> {
    vmi["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["kind"] == "VirtualMachine")
        .and_then(|r| r["uid"].as_str().map(str::to_string))
}

async fn create_vmi(ctx: &Context, vm: &Value, spec: &VirtualMachineSpec) -> Result<(), Error> {
    let meta = &vm["metadata"];
    let tmeta = spec.template.metadata.clone().unwrap_or_default();
    let mut labels = serde_json::to_value(&tmeta.labels).unwrap_or(json!({}));
    labels["kubevirt.io/vm"] = meta["name"].clone();
    let vmi = json!({
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": tmeta.annotations,
            "ownerReferences": [{
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachine",
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": true,
                "blockOwnerDeletion": true,
            }],
            "finalizers": [LAUNCHER_FINALIZER],
        },
        "spec": spec.template.spec,
        "status": {"phase": phase::PENDING, "phaseTransitionTimestampsMap": {phase::PENDING: now()}},
    });
    match ctx
        .store
        .create(Kind::VirtualMachineInstance, vmi, false)
        .await
    {
        Ok(_) => {
            tracing::info!(namespace = %meta["namespace"].as_str().unwrap_or(""), name = %meta["name"].as_str().unwrap_or(""), "created VirtualMachineInstance");
            Ok(())
        }
        Err(Error::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// KubeVirt's printable status of a VM from its instance.
pub fn printable_status(vm_deleting: bool, vmi: Option<&Value>) -> &'static str {
    if vm_deleting {
        return "Terminating";
    }
    let Some(v) = vmi else { return "Stopped" };
    if deleting(v) {
        return "Stopping";
    }
    let conds = v["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let cond = |t: &str, s: &str| conds.iter().any(|c| c["type"] == t && c["status"] == s);
    match vmi_phase(v) {
        phase::PENDING | phase::SCHEDULING if cond("PodScheduled", "False") => "ErrorUnschedulable",
        phase::PENDING | phase::SCHEDULING | phase::SCHEDULED => "Starting",
        phase::RUNNING if cond("Paused", "True") => "Paused",
        phase::RUNNING => "Running",
        phase::SUCCEEDED => "Stopped",
        phase::FAILED => "CrashLoopBackOff",
        _ => "Unknown",
    }
}

async fn set_vm_status(
    ctx: &Context,
    ns: &str,
    name: &str,
    vmi: Option<&Value>,
) -> Result<(), Error> {
    let vmi = vmi.cloned();
    let r = ctx
        .store
        .update(Kind::VirtualMachine, ns, name, move |o| {
            let printable = printable_status(deleting(o), vmi.as_ref());
            let ready = vmi.as_ref().is_some_and(|v| {
                v["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
            });
            let strategy = serde_json::from_value::<VirtualMachineSpec>(o["spec"].clone())
                .map(|s| s.strategy())
                .unwrap_or_default();
            if !o["status"].is_object() {
                o["status"] = json!({});
            }
            let running = vmi.as_ref().is_some_and(|v| vmi_phase(v) == phase::RUNNING);
            let backing_off = vmi.is_none() && retry_wait(o).is_some();
            let st = o["status"].as_object_mut().expect("object");
            if running {
                st.remove("startFailure");
            }
            let printable = if backing_off { "CrashLoopBackOff" } else { printable };
            st.insert("printableStatus".into(), json!(printable));
            st.insert("created".into(), json!(vmi.is_some()));
            st.insert("ready".into(), json!(ready));
            st.insert("runStrategy".into(), json!(strategy));
            let cond = json!([{
                "type": "Ready",
                "status": if ready { "True" } else { "False" },
                "reason": if ready { "" } else if vmi.is_some() { "NotReady" } else { "VMINotExists" },
            }]);
            if st.get("conditions").map(|c| c[0]["status"] != cond[0]["status"]).unwrap_or(true) {
                let mut c = cond;
                c[0]["lastTransitionTime"] = json!(now());
                st.insert("conditions".into(), c);
            }
            Ok(())
        })
        .await;
    match r {
        Ok(_) | Err(Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

async fn remove_finalizer(
    ctx: &Context,
    kind: Kind,
    ns: &str,
    name: &str,
    f: &str,
) -> Result<(), Error> {
    let f = f.to_string();
    match ctx
        .store
        .update(kind, ns, name, move |o| {
            if let Some(a) = o["metadata"]["finalizers"].as_array_mut() {
                a.retain(|x| x != f.as_str());
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
    let Some(vmi) = ctx
        .store
        .get(Kind::VirtualMachineInstance, ns, name)
        .await?
    else {
        return Ok(Action::Done);
    };
    let node = vmi["status"]["nodeName"].as_str().unwrap_or("");
    if deleting(&vmi) {
        if node.is_empty() {
            // Never placed: no agent holds anything for it.
            remove_finalizer(
                ctx,
                Kind::VirtualMachineInstance,
                ns,
                name,
                LAUNCHER_FINALIZER,
            )
            .await?;
        }
        return Ok(Action::Done);
    }
    if node.is_empty() && vmi_phase(&vmi) == phase::PENDING {
        return match scheduler::schedule(ctx, &vmi).await? {
            true => Ok(Action::Done),
            false => Ok(Action::RequeueAfter(Duration::from_secs(5))),
        };
    }
    Ok(Action::Done)
}
