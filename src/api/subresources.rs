//! Subresources: KubeVirt's actions under `subresources.kubevirt.io` (start, stop, restart,
//! pause, unpause, softreboot, rename, migrate, addvolume, removevolume, freeze, unfreeze,
//! guestosinfo), the
//! `status` subresource agents write through, and image upload and download. A request is
//! parsed into a [`Request`] first (path, method and body); [`Request::access`] declares who
//! may make it, in one place; [`execute`] carries it out. Actions record intent in the store;
//! the controller and the agent carry it out, so an action survives a restart of either.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::resources::{apply_patch, kind_for};
use super::{AppState, S, images};
use crate::http::auth::{Access, Principal};
use crate::http::error::{ApiError, ApiResult};
use crate::store::Error as StoreError;
use crate::types::annotations::{
    BLOCK_MIGRATION_ANNOTATION, FREEZE_ANNOTATION, PAUSED_ANNOTATION, SOFTREBOOT_ANNOTATION,
};
use crate::types::kubevirt::{
    ConditionType, Phase, RunStrategy, StateChangeRequest, condition_true,
};
use crate::types::{Kind, Meta, Typed, VirtualMachine, VirtualMachineInstance, check_name};

/// What a subresource request asks for, parsed from its path, method and body.
#[derive(Debug, PartialEq)]
enum Request {
    Start,
    Stop,
    Restart,
    Rename {
        new_name: String,
    },
    Migrate {
        options: MigrateOptions,
    },
    Pause,
    Unpause,
    SoftReboot,
    /// `addvolume`: persistent on a VM, for this instance only on a VMI.
    AddVolume {
        vmi_only: bool,
        options: super::hotplug::AddVolumeOptions,
    },
    RemoveVolume {
        vmi_only: bool,
        options: super::hotplug::RemoveVolumeOptions,
    },
    /// `freeze`: the guest's filesystems, through its agent, until `unfreeze` or the
    /// timeout (`None`: no timeout).
    Freeze {
        timeout: Option<std::time::Duration>,
    },
    Unfreeze,
    GuestOsInfo,
    /// `userlist` and `filesystemlist`: what the guest agent reported, as KubeVirt's lists.
    GuestList(GuestList),
    StatusRead(Kind),
    StatusWrite {
        kind: Kind,
        patch: bool,
    },
    ImageUpload,
    ImageDownload,
    /// A node's agent sends its figures for `/metrics` and the graphs.
    NodeStats,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum GuestList {
    Users,
    FileSystems,
}

/// KubeVirt's `MigrateOptions`, with edgevirt's `blockMigration`.
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MigrateOptions {
    #[serde(default)]
    added_node_selector: Option<Value>,
    #[serde(default)]
    block_migration: Option<Value>,
}

/// Where a subresource request points.
struct Target {
    group: String,
    version: String,
    ns: String,
    plural: String,
    name: String,
    sub: String,
    /// The query string, which only uploads read (`?type=iso`).
    query: Option<String>,
}

impl Target {
    /// `PUT .../images/{name}/upload`: the one request whose body streams (not read first).
    fn is_upload(&self, method: &Method) -> bool {
        method == Method::PUT
            && self.group == "edgevirt.io"
            && self.plural == "images"
            && self.ns.is_empty()
            && self.sub == "upload"
    }

    /// `GET .../images/{name}/upload`: how much of a resumable upload the server has.
    fn is_upload_offset(&self, method: &Method) -> bool {
        method == Method::GET
            && self.group == "edgevirt.io"
            && self.plural == "images"
            && self.ns.is_empty()
            && self.sub == "upload"
    }

    /// `PUT .../datavolumes/{name}/upload`: an upload DataVolume's data, streamed too.
    fn is_data_volume_upload(&self, method: &Method) -> bool {
        method == Method::PUT
            && self.group == crate::types::cdi::GROUP
            && self.plural == "datavolumes"
            && !self.ns.is_empty()
            && self.sub == "upload"
    }
}

impl Request {
    /// Who may make this request: declared here once for every subresource.
    fn access(&self) -> Access {
        match self {
            Request::GuestOsInfo
            | Request::GuestList(_)
            | Request::StatusRead(_)
            | Request::ImageDownload => Access::Read,
            Request::StatusWrite { .. } | Request::NodeStats => Access::AgentWrite,
            Request::Start
            | Request::Stop
            | Request::Restart
            | Request::Rename { .. }
            | Request::Migrate { .. }
            | Request::Pause
            | Request::Unpause
            | Request::SoftReboot
            | Request::AddVolume { .. }
            | Request::RemoveVolume { .. }
            | Request::Freeze { .. }
            | Request::Unfreeze
            | Request::ImageUpload => Access::Operate,
        }
    }

    /// Parse a request; the body only where the request has one (an image upload streams
    /// and is not read here).
    fn parse(method: &Method, at: &Target, body: &[u8]) -> ApiResult<Request> {
        let missing = || {
            ApiError::not_found(format!(
                "subresource {:?} of {} does not exist",
                at.sub, at.plural
            ))
        };
        if at.group == "subresources.kubevirt.io" {
            if at.version != "v1" && at.version != "v1alpha3" {
                return Err(ApiError::not_found(format!(
                    "version {} is not served",
                    at.version
                )));
            }
            let vm_or_vmi = matches!(
                at.plural.as_str(),
                "virtualmachines" | "virtualmachineinstances"
            );
            return match (method, at.plural.as_str(), at.sub.as_str()) {
                (&Method::GET, "virtualmachineinstances", "guestosinfo") => {
                    Ok(Request::GuestOsInfo)
                }
                (&Method::GET, "virtualmachineinstances", "userlist") => {
                    Ok(Request::GuestList(GuestList::Users))
                }
                (&Method::GET, "virtualmachineinstances", "filesystemlist") => {
                    Ok(Request::GuestList(GuestList::FileSystems))
                }
                (&Method::PUT, "virtualmachines", "start") => Ok(Request::Start),
                (&Method::PUT, "virtualmachines", "stop") => Ok(Request::Stop),
                (&Method::PUT, "virtualmachines", "restart") => Ok(Request::Restart),
                (&Method::PUT, "virtualmachines", "rename") => Ok(Request::Rename {
                    new_name: parse_rename(body)?,
                }),
                (&Method::PUT, _, "migrate") if vm_or_vmi => Ok(Request::Migrate {
                    options: parse_migrate(body)?,
                }),
                (&Method::PUT, _, "pause") if vm_or_vmi => Ok(Request::Pause),
                (&Method::PUT, _, "unpause") if vm_or_vmi => Ok(Request::Unpause),
                (&Method::PUT, _, "softreboot") if vm_or_vmi => Ok(Request::SoftReboot),
                (&Method::PUT, plural, "addvolume") if vm_or_vmi => Ok(Request::AddVolume {
                    vmi_only: plural == "virtualmachineinstances",
                    options: super::hotplug::parse_add(body)?,
                }),
                (&Method::PUT, plural, "removevolume") if vm_or_vmi => Ok(Request::RemoveVolume {
                    vmi_only: plural == "virtualmachineinstances",
                    options: super::hotplug::parse_remove(body)?,
                }),
                (&Method::PUT, "virtualmachineinstances", "freeze") => Ok(Request::Freeze {
                    timeout: parse_freeze(body)?,
                }),
                (&Method::PUT, "virtualmachineinstances", "unfreeze") => Ok(Request::Unfreeze),
                (&Method::GET, ..) => Err(ApiError::not_found(format!(
                    "subresource {:?} does not exist or is not readable",
                    at.sub
                ))),
                _ => Err(missing()),
            };
        }
        if at.is_upload(method) {
            return Ok(Request::ImageUpload);
        }
        if at.group == "edgevirt.io"
            && at.plural == "images"
            && at.ns.is_empty()
            && method == Method::GET
            && at.sub == "data"
        {
            return Ok(Request::ImageDownload);
        }
        if at.group == "edgevirt.io"
            && at.plural == "nodes"
            && at.ns.is_empty()
            && method == Method::PUT
            && at.sub == "stats"
        {
            return Ok(Request::NodeStats);
        }
        if at.sub != "status" {
            return Err(match *method {
                Method::GET => ApiError::not_found(format!(
                    "subresource {:?} does not exist or is not readable",
                    at.sub
                )),
                _ => ApiError::not_found(format!("subresource {:?} does not exist", at.sub)),
            });
        }
        let kind = kind_for(&at.group, &at.version, &at.plural)?;
        match *method {
            Method::GET => Ok(Request::StatusRead(kind)),
            Method::PUT => Ok(Request::StatusWrite { kind, patch: false }),
            Method::PATCH => Ok(Request::StatusWrite { kind, patch: true }),
            _ => Err(missing()),
        }
    }
}

fn parse_rename(body: &[u8]) -> ApiResult<String> {
    let new_name = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("newName").and_then(Value::as_str).map(str::to_string))
        .ok_or_else(|| ApiError::bad_request(r#"rename needs a body {"newName": "..."}"#))?;
    check_name("newName", &new_name)?;
    Ok(new_name)
}

/// KubeVirt's `FreezeUnfreezeTimeout` (`{"unfreezeTimeout": "5m"}`): how long the guest
/// stays frozen at most; 5 minutes without a body, no limit for `0s`.
fn parse_freeze(body: &[u8]) -> ApiResult<Option<std::time::Duration>> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct FreezeUnfreezeTimeout {
        #[serde(default)]
        unfreeze_timeout: Option<String>,
    }
    const DEFAULT: std::time::Duration = std::time::Duration::from_secs(300);
    if body.is_empty() {
        return Ok(Some(DEFAULT));
    }
    let o: FreezeUnfreezeTimeout = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid FreezeUnfreezeTimeout: {e}")))?;
    let Some(t) = o.unfreeze_timeout else {
        return Ok(Some(DEFAULT));
    };
    let d = crate::types::parse_duration(&t).ok_or_else(|| {
        ApiError::bad_request(format!(
            "invalid FreezeUnfreezeTimeout: unfreezeTimeout {t:?} is no duration (such as 5m)"
        ))
    })?;
    Ok((!d.is_zero()).then_some(d))
}

fn parse_migrate(body: &[u8]) -> ApiResult<MigrateOptions> {
    if body.is_empty() {
        return Ok(MigrateOptions::default());
    }
    let o: MigrateOptions = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid MigrateOptions: {e}")))?;
    match &o.block_migration {
        None | Some(Value::Bool(_)) => Ok(o),
        Some(other) => Err(ApiError::bad_request(format!(
            "invalid MigrateOptions: blockMigration must be true or false, not {other}"
        ))),
    }
}

type NsPath = Path<(String, String, String, String, String, String)>;
type ClusterPath = Path<(String, String, String, String, String)>;

/// `.../namespaces/{ns}/{plural}/{name}/{sub}`, every method.
pub async fn namespaced(
    State(st): S,
    Extension(p): Extension<Principal>,
    method: Method,
    Path((group, version, ns, plural, name, sub)): NsPath,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let at = Target {
        group,
        version,
        ns,
        plural,
        name,
        sub,
        query,
    };
    handle(st, p, method, at, headers, body).await
}

/// `.../{plural}/{name}/{sub}` of cluster-scoped kinds, every method.
pub async fn cluster(
    State(st): S,
    Extension(p): Extension<Principal>,
    method: Method,
    Path((group, version, plural, name, sub)): ClusterPath,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let at = Target {
        group,
        version,
        ns: String::new(),
        plural,
        name,
        sub,
        query,
    };
    handle(st, p, method, at, headers, body).await
}

/// Parse, check access, execute.
async fn handle(
    st: Arc<AppState>,
    p: Principal,
    method: Method,
    at: Target,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    // An upload streams its body; every other request's body is read within the limit.
    if at.is_upload(&method) {
        p.require(Request::ImageUpload.access())?;
        let declared = images::Declared::from_query(at.query.as_deref())?;
        return images::upload(st, p, &at.name, declared, &headers, body).await;
    }
    if at.is_upload_offset(&method) {
        p.require(Request::ImageUpload.access())?;
        return images::upload_offset(st, &at.name).await;
    }
    if at.is_data_volume_upload(&method) {
        p.require(Request::ImageUpload.access())?;
        return images::upload_data_volume(st, p, &at.ns, &at.name, body).await;
    }
    let bytes = axum::body::to_bytes(body, crate::http::body::OBJECT_LIMIT)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                format!(
                    "the request body is over {} MiB",
                    crate::http::body::OBJECT_LIMIT >> 20
                ),
            )
        })?;
    let req = Request::parse(&method, &at, &bytes)?;
    p.require(req.access())?;
    execute(&st, &p, &at, req, &headers, bytes).await
}

/// Add a node report to the graphs of the node and of the VMs it runs (by each instance's
/// domain; an instance without a VM is graphed on its own uid), and write the graphs now
/// and then, off the async threads.
async fn graph(
    st: &Arc<AppState>,
    node: &str,
    report: &crate::metrics::NodeReport,
) -> ApiResult<()> {
    use crate::metrics::graphs::vm_key;
    let vmis: Vec<VirtualMachineInstance> = st
        .store
        .list_typed(
            None,
            &crate::store::LabelSelector::default(),
            &crate::store::FieldSelector::node(node),
        )
        .await?;
    let owners: std::collections::HashMap<&str, String> = vmis
        .iter()
        .filter_map(|v| {
            let dom = v.status.as_ref()?.domain_name.as_deref()?;
            Some((
                dom,
                vm_key(v.owner_uid("VirtualMachine").unwrap_or(v.uid())),
            ))
        })
        .collect();
    st.graphs.record(
        node,
        report,
        |dom| owners.get(dom).cloned(),
        crate::metrics::graphs::unix_now(),
    );
    let graphs = st.graphs.clone();
    tokio::task::spawn_blocking(move || {
        if let Err(e) = graphs.flush(false) {
            tracing::warn!(error = %e, "writing graphs failed");
        }
    });
    Ok(())
}

/// What a running instance's guest agent reported, as stored; 409 without an agent.
async fn guest_agent_info(st: &AppState, ns: &str, name: &str) -> ApiResult<Value> {
    let raw = st
        .store
        .must_get(Kind::VirtualMachineInstance, ns, name)
        .await?;
    let vmi = VirtualMachineInstance::from_value(raw.clone())?;
    if !condition_true(vmi.conditions(), &ConditionType::AgentConnected) {
        return Err(ApiError::conflict(format!(
            "VirtualMachineInstance {name:?} has no guest agent connected"
        )));
    }
    Ok(raw
        .get("status")
        .and_then(|s| s.get("guestAgentInfo"))
        .cloned()
        .unwrap_or(Value::Null))
}

/// The one place a parsed subresource request is carried out.
async fn execute(
    st: &Arc<AppState>,
    p: &Principal,
    at: &Target,
    req: Request,
    headers: &HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let (ns, name) = (at.ns.as_str(), at.name.as_str());
    let store = &st.store;
    match req {
        Request::GuestOsInfo => {
            // As stored: what a newer agent reported beyond this release's type stays.
            let info = guest_agent_info(st, ns, name).await?;
            Ok(Json(info).into_response())
        }
        Request::GuestList(list) => {
            let info = guest_agent_info(st, ns, name).await?;
            let (kind, items) = match list {
                GuestList::Users => (
                    "VirtualMachineInstanceGuestOSUserList",
                    info["userList"].clone(),
                ),
                GuestList::FileSystems => (
                    "VirtualMachineInstanceFileSystemList",
                    info["fsInfo"]["disks"].clone(),
                ),
            };
            let items = if items.is_array() { items } else { json!([]) };
            Ok(Json(json!({
                "kind": kind,
                "apiVersion": "kubevirt.io/v1",
                "metadata": {},
                "items": items,
            }))
            .into_response())
        }
        Request::StatusRead(kind) => {
            Ok(Json(store.must_get(kind, ns, name).await?).into_response())
        }
        Request::StatusWrite { kind, patch } => {
            status_write(st, p, at, kind, headers, body, patch).await
        }
        Request::ImageDownload => images::download(st.clone(), name).await,
        Request::NodeStats => {
            let v = crate::http::body::parse_body(headers, &body).await?;
            let report: crate::metrics::NodeReport = serde_json::from_value(v)
                .map_err(|e| ApiError::bad_request(format!("invalid node report: {e}")))?;
            let node = store.must_get(Kind::Node, "", name).await?;
            super::scope::check(store, p, Kind::Node, "", name, Some(&node)).await?;
            graph(st, name, &report).await?;
            st.metrics.put(name, report);
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Request::ImageUpload => unreachable!("uploads stream: handled before parsing"),
        Request::Start => {
            let vm = must::<VirtualMachine>(st, ns, name).await?;
            let vmi = store.get_typed::<VirtualMachineInstance>(ns, name).await?;
            if vmi.as_ref().is_some_and(|v| !v.deleting()) {
                return Err(ApiError::conflict(format!(
                    "VM {name:?} is already running"
                )));
            }
            let spec = vm.spec;
            store
                .update_typed(ns, name, |o: &mut VirtualMachine| {
                    match spec.strategy() {
                        RunStrategy::Always | RunStrategy::Halted if spec.running.is_some() => {
                            o.spec.running = Some(true);
                        }
                        RunStrategy::Always | RunStrategy::Halted => {
                            o.spec.run_strategy = Some(RunStrategy::Always);
                        }
                        _ => push_request(o, "Start", None),
                    }
                    Ok(())
                })
                .await?;
            accepted()
        }
        Request::Stop => {
            let vm = must::<VirtualMachine>(st, ns, name).await?;
            let vmi = store.get_typed::<VirtualMachineInstance>(ns, name).await?;
            let spec = vm.spec;
            if vmi.is_none() && spec.strategy() == RunStrategy::Halted {
                return Err(ApiError::conflict(format!("VM {name:?} is not running")));
            }
            let uid = vmi.as_ref().map(|v| v.uid().to_string());
            store
                .update_typed(ns, name, |o: &mut VirtualMachine| {
                    if spec.running.is_some() {
                        o.spec.running = Some(false);
                    } else if spec.strategy() == RunStrategy::Manual {
                        push_request(o, "Stop", uid);
                    } else {
                        o.spec.run_strategy = Some(RunStrategy::Halted);
                    }
                    Ok(())
                })
                .await?;
            accepted()
        }
        Request::Restart => {
            must::<VirtualMachine>(st, ns, name).await?;
            let Some(vmi) = store.get_typed::<VirtualMachineInstance>(ns, name).await? else {
                return Err(ApiError::conflict(format!(
                    "VM {name:?} is not running; start it instead"
                )));
            };
            let uid = vmi.uid().to_string();
            store
                .update_typed(ns, name, |o: &mut VirtualMachine| {
                    push_request(o, "Stop", Some(uid));
                    push_request(o, "Start", None);
                    Ok(())
                })
                .await?;
            accepted()
        }
        Request::Rename { new_name } => {
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
        Request::Migrate { options } => {
            // KubeVirt's `migrate` subresource: a VirtualMachineInstanceMigration for it.
            let mut spec = json!({"vmiName": name});
            if let Some(sel) = options.added_node_selector {
                spec["addedNodeSelector"] = sel;
            }
            let mut metadata =
                json!({"generateName": format!("{name}-migration-"), "namespace": ns});
            // edgevirt's addition to KubeVirt's MigrateOptions: copy local disks.
            if options.block_migration == Some(Value::Bool(true)) {
                metadata["annotations"] = json!({BLOCK_MIGRATION_ANNOTATION: "true"});
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
            let migration =
                crate::types::VirtualMachineInstanceMigration::from_value(created.clone())?;
            tracing::info!(namespace = %ns, vmi = %name, migration = %migration.name(), user = %p.user, "migration requested");
            Ok((StatusCode::CREATED, Json(created)).into_response())
        }
        Request::AddVolume { vmi_only, options } => {
            super::hotplug::add(store, ns, name, vmi_only, options).await?;
            accepted()
        }
        Request::RemoveVolume { vmi_only, options } => {
            super::hotplug::remove(store, ns, name, vmi_only, options).await?;
            accepted()
        }
        Request::Freeze { timeout } => {
            running_vmi(store, ns, name).await?;
            let until = timeout.map_or_else(
                || "none".to_string(),
                |t| {
                    (chrono::Utc::now() + t)
                        .format("%Y-%m-%dT%H:%M:%SZ")
                        .to_string()
                },
            );
            store
                .update_typed(ns, name, |o: &mut VirtualMachineInstance| {
                    o.metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(FREEZE_ANNOTATION.into(), until);
                    Ok(())
                })
                .await?;
            accepted()
        }
        Request::Unfreeze => {
            running_vmi(store, ns, name).await?;
            store
                .update_typed(ns, name, |o: &mut VirtualMachineInstance| {
                    if let Some(a) = o.metadata.annotations.as_mut() {
                        a.remove(FREEZE_ANNOTATION);
                    }
                    Ok(())
                })
                .await?;
            accepted()
        }
        Request::Pause | Request::Unpause | Request::SoftReboot => {
            let Some(vmi) = store.get_typed::<VirtualMachineInstance>(ns, name).await? else {
                return Err(ApiError::conflict(format!("VM {name:?} is not running")));
            };
            if vmi.phase() != Phase::Running {
                let shown = vmi
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.as_ref())
                    .map_or("unknown", |p| p.as_str());
                return Err(ApiError::conflict(format!(
                    "VirtualMachineInstance {name:?} is not running (phase {shown})"
                )));
            }
            let paused = vmi.annotation(PAUSED_ANNOTATION) == Some("true");
            match req {
                Request::Pause if paused => {
                    return Err(ApiError::conflict(format!(
                        "VMI {name:?} is already paused"
                    )));
                }
                Request::Unpause if !paused => {
                    return Err(ApiError::conflict(format!("VMI {name:?} is not paused")));
                }
                Request::SoftReboot if paused => {
                    return Err(ApiError::conflict(format!(
                        "VMI {name:?} is paused; unpause it first"
                    )));
                }
                _ => {}
            }
            store
                .update_typed(ns, name, |o: &mut VirtualMachineInstance| {
                    let a = o.metadata.annotations.get_or_insert_with(BTreeMap::new);
                    match req {
                        Request::Pause => {
                            a.insert(PAUSED_ANNOTATION.into(), "true".into());
                        }
                        Request::Unpause => {
                            a.remove(PAUSED_ANNOTATION);
                        }
                        _ => {
                            let n = a
                                .get(SOFTREBOOT_ANNOTATION)
                                .and_then(|s| s.parse::<u64>().ok())
                                .unwrap_or(0);
                            a.insert(SOFTREBOOT_ANNOTATION.into(), (n + 1).to_string());
                        }
                    }
                    Ok(())
                })
                .await?;
            accepted()
        }
    }
}

/// A running instance (404 when there is none, 409 when it does not run).
async fn running_vmi(
    store: &crate::store::Store,
    ns: &str,
    name: &str,
) -> ApiResult<VirtualMachineInstance> {
    let Some(vmi) = store.get_typed::<VirtualMachineInstance>(ns, name).await? else {
        return Err(ApiError::not_found(format!(
            "VirtualMachineInstance {ns}/{name} not found"
        )));
    };
    if vmi.phase() != Phase::Running {
        return Err(ApiError::conflict(format!(
            "VirtualMachineInstance {name:?} is not running"
        )));
    }
    Ok(vmi)
}

/// A typed object that must exist (404 otherwise).
async fn must<T: Typed>(st: &AppState, ns: &str, name: &str) -> ApiResult<T> {
    st.store.get_typed::<T>(ns, name).await?.ok_or_else(|| {
        StoreError::NotFound {
            kind: T::KIND.name(),
            name: name.to_string(),
        }
        .into()
    })
}

/// PUT or PATCH of `.../status`: only the status of the stored object changes.
async fn status_write(
    st: &AppState,
    p: &Principal,
    at: &Target,
    kind: Kind,
    headers: &HeaderMap,
    body: Bytes,
    patch: bool,
) -> ApiResult<Response> {
    let (ns, name) = (at.ns.as_str(), at.name.as_str());
    let stored = st.store.get(kind, ns, name).await?;
    super::scope::check(&st.store, p, kind, ns, name, stored.as_ref()).await?;
    let new_status = if patch {
        let mut cur = st.store.must_get(kind, ns, name).await?;
        apply_patch(headers, &body, &mut cur)?;
        cur["status"].clone()
    } else {
        let mut v = crate::http::body::parse_body(headers, &body).await?;
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
    crate::types::object::check_status(kind, &new_status)?;
    let out = st
        .store
        .update(kind, ns, name, move |o| {
            o["status"] = new_status;
            Ok(())
        })
        .await?;
    Ok(Json(out).into_response())
}

fn push_request(o: &mut VirtualMachine, action: &str, uid: Option<String>) {
    o.status
        .get_or_insert_default()
        .state_change_requests
        .push(StateChangeRequest {
            action: action.to_string(),
            uid,
        });
}

fn accepted() -> ApiResult<Response> {
    Ok((StatusCode::ACCEPTED, Json(json!({}))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(group: &str, ns: &str, plural: &str, sub: &str) -> Target {
        Target {
            group: group.into(),
            version: "v1".into(),
            ns: ns.into(),
            plural: plural.into(),
            name: "a".into(),
            sub: sub.into(),
            query: None,
        }
    }

    #[test]
    fn requests_are_parsed_before_anything_runs_and_each_declares_its_access() {
        let sub = "subresources.kubevirt.io";
        let parse = |m: Method, a: Target, body: &str| Request::parse(&m, &a, body.as_bytes());
        let r = parse(
            Method::PUT,
            at(sub, "default", "virtualmachines", "start"),
            "",
        )
        .unwrap();
        assert_eq!((r.access(), &r), (Access::Operate, &Request::Start));
        let r = parse(
            Method::PUT,
            at(sub, "default", "virtualmachines", "rename"),
            r#"{"newName": "b"}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            Request::Rename {
                new_name: "b".into()
            }
        );
        let e = parse(
            Method::PUT,
            at(sub, "default", "virtualmachines", "rename"),
            "{}",
        )
        .unwrap_err();
        assert_eq!(e.code, StatusCode::BAD_REQUEST);
        let e = parse(
            Method::PUT,
            at(sub, "default", "virtualmachines", "rename"),
            r#"{"newName": "Bad_Name"}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, StatusCode::UNPROCESSABLE_ENTITY);
        let e = parse(
            Method::PUT,
            at(sub, "default", "virtualmachineinstances", "migrate"),
            r#"{"blockMigration": "yes"}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, StatusCode::BAD_REQUEST);
        // freeze: KubeVirt's FreezeUnfreezeTimeout; 5 minutes by default, `0s` for none.
        let freeze = |body: &str| {
            parse(
                Method::PUT,
                at(sub, "default", "virtualmachineinstances", "freeze"),
                body,
            )
        };
        let five = Some(std::time::Duration::from_secs(300));
        assert_eq!(freeze("").unwrap(), Request::Freeze { timeout: five });
        assert_eq!(freeze("{}").unwrap(), Request::Freeze { timeout: five });
        assert_eq!(
            freeze(r#"{"unfreezeTimeout": "90s"}"#).unwrap(),
            Request::Freeze {
                timeout: Some(std::time::Duration::from_secs(90))
            }
        );
        assert_eq!(
            freeze(r#"{"unfreezeTimeout": "0s"}"#).unwrap(),
            Request::Freeze { timeout: None }
        );
        for bad in [
            r#"{"unfreezeTimeout": "soon"}"#,
            r#"{"timeout": "1m"}"#,
            "[",
        ] {
            assert_eq!(
                freeze(bad).unwrap_err().code,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
        assert_eq!(freeze("").unwrap().access(), Access::Operate);
        let e = parse(
            Method::PUT,
            at(sub, "default", "virtualmachines", "freeze"),
            "",
        )
        .unwrap_err();
        assert_eq!(e.code, StatusCode::NOT_FOUND, "freeze is the instance's");
        let r = parse(
            Method::GET,
            at(sub, "default", "virtualmachineinstances", "guestosinfo"),
            "",
        )
        .unwrap();
        assert_eq!(r.access(), Access::Read);
        // Agents write status; a GET of status is a read.
        let r = parse(
            Method::PUT,
            at(
                "kubevirt.io",
                "default",
                "virtualmachineinstances",
                "status",
            ),
            "",
        )
        .unwrap();
        assert_eq!(r.access(), Access::AgentWrite);
        let r = parse(Method::GET, at("edgevirt.io", "", "nodes", "status"), "").unwrap();
        assert_eq!(r, Request::StatusRead(Kind::Node));
        let r = parse(Method::GET, at("edgevirt.io", "", "images", "data"), "").unwrap();
        let up = parse(Method::PUT, at("edgevirt.io", "", "images", "upload"), "").unwrap();
        assert!(at("edgevirt.io", "", "images", "upload").is_upload(&Method::PUT));
        assert_eq!((up.access(), &up), (Access::Operate, &Request::ImageUpload));
        assert_eq!(r.access(), Access::Read);
        // Unknown subresources and actions on the wrong kind are 404.
        for (m, a) in [
            (
                Method::PUT,
                at(sub, "default", "virtualmachineinstances", "start"),
            ),
            (
                Method::PUT,
                at(sub, "default", "virtualmachines", "explode"),
            ),
            (
                Method::GET,
                at("kubevirt.io", "default", "virtualmachines", "scale"),
            ),
            // Images are cluster-scoped: no upload under a namespace.
            (
                Method::PUT,
                at("edgevirt.io", "default", "images", "upload"),
            ),
        ] {
            assert_eq!(parse(m, a, "").unwrap_err().code, StatusCode::NOT_FOUND);
        }
    }
}
