//! Subresources: KubeVirt's actions under `subresources.kubevirt.io` (start, stop, restart,
//! pause, unpause, softreboot, rename, guestosinfo), and the `status` subresource agents
//! write through. Actions record intent in the store; the controller and the agent carry it
//! out, so an action survives a restart of either.

use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::auth::{Access, Principal};
use super::error::{ApiError, ApiResult};
use super::resources::{apply_patch, kind_for};
use super::{AppState, S, images};
use crate::types::kubevirt::{Condition, RunStrategy, VirtualMachineSpec, condition_true, phase};
use crate::types::{Kind, check_name};

use crate::types::annotations::{PAUSED_ANNOTATION, SOFTREBOOT_ANNOTATION};

type NsPath = Path<(String, String, String, String, String, String)>;
type ClusterPath = Path<(String, String, String, String, String)>;

pub async fn put_ns(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, ns, plural, name, sub)): NsPath,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    if group == "subresources.kubevirt.io" {
        if version != "v1" && version != "v1alpha3" {
            return Err(ApiError::not_found(format!(
                "version {version} is not served"
            )));
        }
        return action(st, p, &ns, &plural, &name, &sub, body).await;
    }
    status_write(
        st, p, &group, &version, &ns, &plural, &name, &sub, headers, body, false,
    )
    .await
}

pub async fn patch_ns(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, ns, plural, name, sub)): NsPath,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    status_write(
        st, p, &group, &version, &ns, &plural, &name, &sub, headers, body, true,
    )
    .await
}

pub async fn get_ns(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, ns, plural, name, sub)): NsPath,
) -> ApiResult<Response> {
    p.require(Access::Read)?;
    if group == "subresources.kubevirt.io"
        && plural == "virtualmachineinstances"
        && sub == "guestosinfo"
    {
        let _ = version;
        let vmi = st
            .store
            .must_get(Kind::VirtualMachineInstance, &ns, &name)
            .await?;
        let conditions: Vec<Condition> =
            serde_json::from_value(vmi["status"]["conditions"].clone()).unwrap_or_default();
        if !condition_true(&conditions, "AgentConnected") {
            return Err(ApiError::conflict(format!(
                "VirtualMachineInstance {name:?} has no guest agent connected"
            )));
        }
        return Ok(Json(vmi["status"]["guestAgentInfo"].clone()).into_response());
    }
    if sub == "status" {
        let kind = kind_for(&group, &version, &plural)?;
        return Ok(Json(st.store.must_get(kind, &ns, &name).await?).into_response());
    }
    Err(ApiError::not_found(format!(
        "subresource {sub:?} does not exist or is not readable"
    )))
}

pub async fn put_cluster(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, plural, name, sub)): ClusterPath,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    if group == "edgevirt.io" && plural == "images" && sub == "upload" {
        return images::upload(st, p, &name, body).await;
    }
    let body = axum::body::to_bytes(body, super::body::OBJECT_LIMIT)
        .await
        .map_err(|_| {
            ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                format!(
                    "the request body is over {} MiB",
                    super::body::OBJECT_LIMIT >> 20
                ),
            )
        })?;
    status_write(
        st, p, &group, &version, "", &plural, &name, &sub, headers, body, false,
    )
    .await
}

pub async fn patch_cluster(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, plural, name, sub)): ClusterPath,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    status_write(
        st, p, &group, &version, "", &plural, &name, &sub, headers, body, true,
    )
    .await
}

pub async fn get_cluster(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, _version, plural, name, sub)): ClusterPath,
) -> ApiResult<Response> {
    p.require(Access::Read)?;
    if group == "edgevirt.io" && plural == "images" && sub == "data" {
        return images::download(st, &name).await;
    }
    Err(ApiError::not_found(format!(
        "subresource {sub:?} does not exist or is not readable"
    )))
}

/// PUT or PATCH of `.../status`: only the status of the stored object changes.
#[allow(clippy::too_many_arguments)]
async fn status_write(
    st: Arc<AppState>,
    p: Principal,
    group: &str,
    version: &str,
    ns: &str,
    plural: &str,
    name: &str,
    sub: &str,
    headers: HeaderMap,
    body: Bytes,
    patch: bool,
) -> ApiResult<Response> {
    if sub != "status" {
        return Err(ApiError::not_found(format!(
            "subresource {sub:?} does not exist"
        )));
    }
    let kind = kind_for(group, version, plural)?;
    p.require(Access::AgentWrite)?;
    let stored = st.store.get(kind, ns, name).await?;
    super::scope::check(&st.store, &p, kind, ns, name, stored.as_ref()).await?;
    let new_status = if patch {
        let mut cur = st.store.must_get(kind, ns, name).await?;
        apply_patch(&headers, &body, &mut cur)?;
        cur["status"].clone()
    } else {
        let mut v = super::parse_body(&headers, &body).await?;
        // migrationState belongs to the migration machinery: a status PUT that does not
        // mention it (an agent's periodic status) keeps the stored one.
        if kind == Kind::VirtualMachineInstance
            && v["status"].is_object()
            && v["status"].get("migrationState").is_none()
            && let Some(ms) = stored
                .as_ref()
                .and_then(|o| o["status"].get("migrationState"))
        {
            v["status"]["migrationState"] = ms.clone();
        }
        v["status"].clone()
    };
    let out = st
        .store
        .update(kind, ns, name, move |o| {
            o["status"] = new_status;
            Ok(())
        })
        .await?;
    Ok(Json(out).into_response())
}

/// KubeVirt's VM and VMI actions.
async fn action(
    st: Arc<AppState>,
    p: Principal,
    ns: &str,
    plural: &str,
    name: &str,
    sub: &str,
    body: Bytes,
) -> ApiResult<Response> {
    p.require(Access::Operate)?;
    let store = &st.store;
    match (plural, sub) {
        ("virtualmachines", "start") => {
            let vm = store.must_get(Kind::VirtualMachine, ns, name).await?;
            let vmi = store.get(Kind::VirtualMachineInstance, ns, name).await?;
            if vmi
                .as_ref()
                .is_some_and(|v| v["metadata"].get("deletionTimestamp").is_none())
            {
                return Err(ApiError::conflict(format!(
                    "VM {name:?} is already running"
                )));
            }
            let spec: VirtualMachineSpec =
                serde_json::from_value(vm["spec"].clone()).map_err(ApiError::internal)?;
            store
                .update(Kind::VirtualMachine, ns, name, move |o| {
                    match spec.strategy() {
                        RunStrategy::Always | RunStrategy::Halted if spec.running.is_some() => {
                            o["spec"]["running"] = json!(true);
                        }
                        RunStrategy::Always | RunStrategy::Halted => {
                            o["spec"]["runStrategy"] = json!("Always");
                        }
                        _ => push_request(o, json!({"action": "Start"})),
                    }
                    Ok(())
                })
                .await?;
            accepted()
        }
        ("virtualmachines", "stop") => {
            let vm = store.must_get(Kind::VirtualMachine, ns, name).await?;
            let vmi = store.get(Kind::VirtualMachineInstance, ns, name).await?;
            let spec: VirtualMachineSpec =
                serde_json::from_value(vm["spec"].clone()).map_err(ApiError::internal)?;
            if vmi.is_none() && spec.strategy() == RunStrategy::Halted {
                return Err(ApiError::conflict(format!("VM {name:?} is not running")));
            }
            let uid = vmi
                .as_ref()
                .and_then(|v| v["metadata"]["uid"].as_str().map(str::to_string));
            store
                .update(Kind::VirtualMachine, ns, name, move |o| {
                    if spec.running.is_some() {
                        o["spec"]["running"] = json!(false);
                    } else if spec.strategy() == RunStrategy::Manual {
                        push_request(o, json!({"action": "Stop", "uid": uid}));
                    } else {
                        o["spec"]["runStrategy"] = json!("Halted");
                    }
                    Ok(())
                })
                .await?;
            accepted()
        }
        ("virtualmachines", "restart") => {
            store.must_get(Kind::VirtualMachine, ns, name).await?;
            let vmi = store.get(Kind::VirtualMachineInstance, ns, name).await?;
            let Some(vmi) = vmi else {
                return Err(ApiError::conflict(format!(
                    "VM {name:?} is not running; start it instead"
                )));
            };
            let uid = vmi["metadata"]["uid"].clone();
            store
                .update(Kind::VirtualMachine, ns, name, move |o| {
                    push_request(o, json!({"action": "Stop", "uid": uid}));
                    push_request(o, json!({"action": "Start"}));
                    Ok(())
                })
                .await?;
            accepted()
        }
        ("virtualmachines", "rename") => {
            let new_name = if body.is_empty() {
                None
            } else {
                serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v["newName"].as_str().map(str::to_string))
            };
            let Some(new_name) = new_name else {
                return Err(ApiError::bad_request(
                    r#"rename needs a body {"newName": "..."}"#,
                ));
            };
            check_name("newName", &new_name)?;
            if new_name == name {
                return Err(ApiError::bad_request("newName is the current name"));
            }
            if store
                .get(Kind::VirtualMachineInstance, ns, name)
                .await?
                .is_some()
            {
                return Err(ApiError::conflict(format!(
                    "VM {name:?} is running; stop it before renaming"
                )));
            }
            let out = store
                .rename(Kind::VirtualMachine, ns, name, &new_name)
                .await?;
            tracing::info!(namespace = %ns, from = %name, to = %new_name, "renamed VM");
            Ok(Json(out).into_response())
        }
        ("virtualmachines" | "virtualmachineinstances", "migrate") => {
            // KubeVirt's `migrate` subresource: a VirtualMachineInstanceMigration for it.
            let opts: Value = if body.is_empty() {
                json!({})
            } else {
                serde_json::from_slice(&body)
                    .map_err(|e| ApiError::bad_request(format!("invalid MigrateOptions: {e}")))?
            };
            let mut spec = json!({"vmiName": name});
            if let Some(sel) = opts.get("addedNodeSelector") {
                spec["addedNodeSelector"] = sel.clone();
            }
            let mut metadata =
                json!({"generateName": format!("{name}-migration-"), "namespace": ns});
            // edgevirt's addition to KubeVirt's MigrateOptions: copy local disks.
            match opts.get("blockMigration") {
                None | Some(Value::Bool(false)) => {}
                Some(Value::Bool(true)) => {
                    metadata["annotations"] =
                        json!({crate::types::annotations::BLOCK_MIGRATION_ANNOTATION: "true"});
                }
                Some(other) => {
                    return Err(ApiError::bad_request(format!(
                        "invalid MigrateOptions: blockMigration must be true or false, not {other}"
                    )));
                }
            }
            let obj = json!({
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstanceMigration",
                "metadata": metadata,
                "spec": spec,
            });
            let obj = super::admission::admit(
                store,
                Kind::VirtualMachineInstanceMigration,
                ns,
                obj,
                None,
            )
            .await?;
            let created = store
                .create(Kind::VirtualMachineInstanceMigration, obj, false)
                .await?;
            tracing::info!(namespace = %ns, vmi = %name, migration = %created["metadata"]["name"].as_str().unwrap_or(""), user = %p.user, "migration requested");
            Ok((StatusCode::CREATED, Json(created)).into_response())
        }
        ("virtualmachines" | "virtualmachineinstances", "pause" | "unpause" | "softreboot") => {
            let vmi = store.get(Kind::VirtualMachineInstance, ns, name).await?;
            let Some(vmi) = vmi else {
                return Err(ApiError::conflict(format!("VM {name:?} is not running")));
            };
            if vmi["status"]["phase"].as_str() != Some(phase::RUNNING) {
                return Err(ApiError::conflict(format!(
                    "VirtualMachineInstance {name:?} is not running (phase {})",
                    vmi["status"]["phase"].as_str().unwrap_or("unknown")
                )));
            }
            let paused = vmi["metadata"]["annotations"][PAUSED_ANNOTATION] == "true";
            match sub {
                "pause" if paused => {
                    return Err(ApiError::conflict(format!(
                        "VMI {name:?} is already paused"
                    )));
                }
                "unpause" if !paused => {
                    return Err(ApiError::conflict(format!("VMI {name:?} is not paused")));
                }
                "softreboot" if paused => {
                    return Err(ApiError::conflict(format!(
                        "VMI {name:?} is paused; unpause it first"
                    )));
                }
                _ => {}
            }
            let sub = sub.to_string();
            store
                .update(Kind::VirtualMachineInstance, ns, name, move |o| {
                    if !o["metadata"]["annotations"].is_object() {
                        o["metadata"]["annotations"] = json!({});
                    }
                    let a = o["metadata"]["annotations"]
                        .as_object_mut()
                        .expect("object");
                    match sub.as_str() {
                        "pause" => {
                            a.insert(PAUSED_ANNOTATION.into(), json!("true"));
                        }
                        "unpause" => {
                            a.remove(PAUSED_ANNOTATION);
                        }
                        _ => {
                            let n = a
                                .get(SOFTREBOOT_ANNOTATION)
                                .and_then(|v| v.as_str())
                                .and_then(|s| s.parse::<u64>().ok())
                                .unwrap_or(0);
                            a.insert(SOFTREBOOT_ANNOTATION.into(), json!((n + 1).to_string()));
                        }
                    }
                    Ok(())
                })
                .await?;
            accepted()
        }
        _ => Err(ApiError::not_found(format!(
            "subresource {sub:?} of {plural} does not exist"
        ))),
    }
}

fn push_request(o: &mut Value, req: Value) {
    let list = &mut o["status"]["stateChangeRequests"];
    if !list.is_array() {
        *list = json!([]);
    }
    list.as_array_mut().expect("array").push(req);
}

fn accepted() -> ApiResult<Response> {
    Ok((StatusCode::ACCEPTED, Json(json!({}))).into_response())
}
