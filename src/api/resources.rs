//! Generic handlers for stored kinds: list (with selectors, paging, watch), get, create,
//! replace, patch, delete. Kind-specific checks live in [`super::admission`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::{Access, Principal};
use super::error::{ApiError, ApiResult};
use super::table;
use super::{AppState, S, admission, parse_body};
use crate::store::{FieldSelector, LabelSelector, rv_of};
use crate::types::Kind;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListParams {
    label_selector: Option<String>,
    field_selector: Option<String>,
    watch: Option<String>,
    resource_version: Option<String>,
    limit: Option<usize>,
    #[serde(rename = "continue")]
    continue_: Option<String>,
    timeout_seconds: Option<u64>,
    dry_run: Option<String>,
    include_object: Option<String>,
    send_initial_events: Option<bool>,
    /// Deleting a node: the administrator confirms the host is down, so its instances may
    /// be started elsewhere.
    force: Option<bool>,
}

/// Map a path's group, version and plural onto a kind this server stores.
pub fn kind_for(group: &str, version: &str, plural: &str) -> ApiResult<Kind> {
    let version_ok = version == "v1" || (group == "kubevirt.io" && version == "v1alpha3");
    match Kind::from_plural(group, plural) {
        Some(k) if version_ok => Ok(k),
        _ => Err(ApiError::not_found(format!(
            "the server could not find the requested resource ({plural}.{group}/{version})"
        ))),
    }
}

fn check_scope(kind: Kind, namespaced_path: bool) -> ApiResult<()> {
    if kind.namespaced() != namespaced_path {
        return Err(ApiError::not_found(format!(
            "{} is {}namespaced",
            kind.plural(),
            if kind.namespaced() { "" } else { "not " }
        )));
    }
    Ok(())
}

pub async fn list_all(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, plural)): Path<(String, String, String)>,
    Query(q): Query<ListParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let kind = kind_for(&group, &version, &plural)?;
    list(st, p, kind, None, q, &headers).await
}

pub async fn list_ns(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, ns, plural)): Path<(String, String, String, String)>,
    Query(q): Query<ListParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let kind = kind_for(&group, &version, &plural)?;
    check_scope(kind, true)?;
    list(st, p, kind, Some(ns), q, &headers).await
}

async fn list(
    st: Arc<AppState>,
    p: Principal,
    kind: Kind,
    ns: Option<String>,
    q: ListParams,
    headers: &HeaderMap,
) -> ApiResult<Response> {
    let as_table = table::wanted(headers, q.include_object.as_deref());
    p.require(Access::Read)?;
    let labels = LabelSelector::parse(q.label_selector.as_deref().unwrap_or(""))?;
    let fields = FieldSelector::parse(q.field_selector.as_deref().unwrap_or(""))?;
    if matches!(q.watch.as_deref(), Some("true") | Some("1")) {
        return watch(st, kind, ns, labels, fields, q, as_table).await;
    }
    let (mut items, rv) = st.store.list(kind, ns.as_deref(), &labels, &fields).await?;
    let mut cont = None;
    if let Some(after) = q.continue_.as_deref().filter(|c| !c.is_empty()) {
        let key = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(after)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
        items.retain(|o| obj_key(o) > key);
    }
    if let Some(limit) = q.limit.filter(|l| *l > 0)
        && items.len() > limit
    {
        items.truncate(limit);
        cont = items.last().map(|o| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(obj_key(o).as_bytes())
        });
    }
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    if let Some(include) = as_table {
        return Ok(table_response(table::table(
            kind, &items, meta, include, true,
        )));
    }
    // Serialized straight from the items: `json!` would deep-copy every object first.
    #[derive(serde::Serialize)]
    struct List<'a> {
        #[serde(rename = "apiVersion")]
        api_version: String,
        kind: String,
        metadata: Value,
        items: &'a [Value],
    }
    let body = serde_json::to_vec(&List {
        api_version: kind.api_version(),
        kind: format!("{}List", kind.name()),
        metadata: meta,
        items: &items,
    })
    .map_err(ApiError::internal)?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

fn obj_key(o: &Value) -> String {
    format!(
        "{}/{}",
        o["metadata"]["namespace"].as_str().unwrap_or(""),
        o["metadata"]["name"].as_str().unwrap_or("")
    )
}

/// Stream changes as newline-delimited watch events; resumes from `resourceVersion`.
async fn watch(
    st: Arc<AppState>,
    kind: Kind,
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    q: ListParams,
    as_table: Option<table::Include>,
) -> ApiResult<Response> {
    let mut rx = st.store.subscribe();
    // As a Table, each event's object is a one-row table; only the first has the columns.
    let mut first = true;
    let mut event = move |t: &str, o: Value| -> Value {
        let object = match as_table {
            Some(include) => {
                let with_columns = std::mem::replace(&mut first, false);
                table::table(kind, &[o], json!({}), include, with_columns)
            }
            None => o,
        };
        json!({"type": t, "object": object})
    };
    let since: u64 = match q.resource_version.as_deref() {
        None | Some("") | Some("0") => 0,
        Some(v) => v
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {v:?}")))?,
    };
    let wanted = {
        let ns = ns.clone();
        move |k: Kind, o: &Value| {
            k == kind
                && ns
                    .as_deref()
                    .is_none_or(|ns| o["metadata"]["namespace"].as_str() == Some(ns))
                && labels.matches(o)
                && fields.matches(o)
        }
    };
    let mut initial = Vec::new();
    let mut last = since;
    // Watch-list (current kubectl's `wait`): the current objects, then a bookmark saying
    // they are all there, then changes.
    let watch_list = q.send_initial_events == Some(true);
    if since == 0 || watch_list {
        let (items, rv) = st
            .store
            .list(
                kind,
                ns.as_deref(),
                &LabelSelector::default(),
                &FieldSelector::default(),
            )
            .await?;
        for o in items.into_iter().filter(|o| wanted(kind, o)) {
            initial.push(event("ADDED", o));
        }
        last = rv;
        if watch_list {
            initial.push(json!({"type": "BOOKMARK", "object": {
                "kind": kind.name(), "apiVersion": kind.api_version(),
                "metadata": {"resourceVersion": rv.to_string(),
                             "annotations": {"k8s.io/initial-events-end": "true"}},
            }}));
        }
    } else {
        for ev in st.store.events_since(since).await? {
            if wanted(ev.kind, &ev.object) {
                initial.push(event(ev.event_type, ev.object));
            }
            last = ev.rv;
        }
    }
    let (tx, out) = tokio::sync::mpsc::channel::<Bytes>(64);
    let timeout = Duration::from_secs(q.timeout_seconds.unwrap_or(1800).min(3600));
    tokio::spawn(async move {
        let line = |v: &Value| {
            let mut b = serde_json::to_vec(v).unwrap_or_default();
            b.push(b'\n');
            Bytes::from(b)
        };
        for ev in &initial {
            if tx.send(line(ev)).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = tx.closed() => return,
                ev = rx.recv() => match ev {
                    Ok(ev) if ev.rv > last && wanted(ev.kind, &ev.object) => {
                        last = ev.rv;
                        if tx.send(line(&event(ev.event_type, ev.object.clone()))).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    // A watcher that fell behind is closed; the client re-lists and resumes.
                    Err(_) => return,
                }
            }
        }
    });
    let stream = futures::stream::unfold(out, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response())
}

pub async fn get_ns(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, ns, plural, name)): Path<(String, String, String, String, String)>,
    Query(q): Query<ListParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let kind = kind_for(&group, &version, &plural)?;
    check_scope(kind, true)?;
    get(st, p, kind, &ns, &name, q, &headers).await
}

async fn get(
    st: Arc<AppState>,
    p: Principal,
    kind: Kind,
    ns: &str,
    name: &str,
    q: ListParams,
    headers: &HeaderMap,
) -> ApiResult<Response> {
    p.require(Access::Read)?;
    let obj = st.store.must_get(kind, ns, name).await?;
    match table::wanted(headers, q.include_object.as_deref()) {
        Some(include) => {
            let meta = json!({"resourceVersion": obj["metadata"]["resourceVersion"]});
            Ok(table_response(table::table(
                kind,
                &[obj],
                meta,
                include,
                true,
            )))
        }
        None => Ok(Json(obj).into_response()),
    }
}

fn table_response(t: Value) -> Response {
    (
        [(header::CONTENT_TYPE, table::CONTENT_TYPE)],
        serde_json::to_vec(&t).unwrap_or_default(),
    )
        .into_response()
}

pub async fn get_cluster(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, plural, name)): Path<(String, String, String, String)>,
    Query(q): Query<ListParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let kind = kind_for(&group, &version, &plural)?;
    check_scope(kind, false)?;
    get(st, p, kind, "", &name, q, &headers).await
}

fn write_access(kind: Kind) -> Access {
    match kind {
        Kind::Node => Access::AgentWrite,
        _ => Access::Operate,
    }
}

fn dry_run(q: &ListParams) -> bool {
    q.dry_run.as_deref() == Some("All")
}

pub async fn create_ns(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, ns, plural)): Path<(String, String, String, String)>,
    Query(q): Query<ListParams>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let kind = kind_for(&group, &version, &plural)?;
    check_scope(kind, true)?;
    create(st, p, kind, ns, q, headers, body).await
}

pub async fn create_cluster(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, plural)): Path<(String, String, String)>,
    Query(q): Query<ListParams>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let kind = kind_for(&group, &version, &plural)?;
    check_scope(kind, false)?;
    create(st, p, kind, String::new(), q, headers, body).await
}

async fn create(
    st: Arc<AppState>,
    p: Principal,
    kind: Kind,
    ns: String,
    q: ListParams,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    p.require(write_access(kind))?;
    let mut obj = parse_body(&headers, &body).await?;
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
    super::scope::check(&st.store, &p, kind, &ns, &name, None).await?;
    super::scope::keep_node_spec(&p, kind, None, &mut obj);
    if kind.namespaced() && st.store.get(Kind::Namespace, "", &ns).await?.is_none() {
        return Err(ApiError::not_found(format!(
            "namespaces \"{ns}\" not found; create it first (kubectl create namespace {ns})"
        )));
    }
    let obj = admission::admit(&st.store, kind, &ns, obj, None).await?;
    if dry_run(&q) {
        return Ok((StatusCode::CREATED, Json(obj)).into_response());
    }
    let created = st.store.create(kind, obj, false).await?;
    tracing::info!(kind = kind.name(), namespace = %ns, name = %created["metadata"]["name"].as_str().unwrap_or(""), user = %p.user, "created");
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

pub async fn replace_ns(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, ns, plural, name)): Path<(String, String, String, String, String)>,
    Query(q): Query<ListParams>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let kind = kind_for(&group, &version, &plural)?;
    check_scope(kind, true)?;
    replace(st, p, kind, ns, name, q, headers, body).await
}

pub async fn replace_cluster(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, plural, name)): Path<(String, String, String, String)>,
    Query(q): Query<ListParams>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let kind = kind_for(&group, &version, &plural)?;
    check_scope(kind, false)?;
    replace(st, p, kind, String::new(), name, q, headers, body).await
}

#[allow(clippy::too_many_arguments)]
async fn replace(
    st: Arc<AppState>,
    p: Principal,
    kind: Kind,
    ns: String,
    name: String,
    q: ListParams,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    p.require(write_access(kind))?;
    let obj = parse_body(&headers, &body).await?;
    if obj["metadata"]["name"].as_str() != Some(name.as_str()) {
        return Err(ApiError::bad_request(format!(
            "metadata.name must be {name:?}, the name in the path"
        )));
    }
    let expected = match obj["metadata"].get("resourceVersion") {
        Some(Value::String(s)) if !s.is_empty() => Some(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {s:?}")))?,
        ),
        _ => None,
    };
    let existing = st.store.get(kind, &ns, &name).await?;
    super::scope::check(&st.store, &p, kind, &ns, &name, existing.as_ref()).await?;
    let mut obj = obj;
    super::scope::keep_node_spec(&p, kind, existing.as_ref(), &mut obj);
    let Some(existing) = existing else {
        // PUT of a missing node registers it (agents upsert their Node).
        if kind == Kind::Node {
            let obj = admission::admit(&st.store, kind, &ns, obj, None).await?;
            return Ok(Json(st.store.create(kind, obj, false).await?));
        }
        return Err(ApiError::not_found(format!(
            "{} {name:?} not found",
            kind.name()
        )));
    };
    if let Some(want) = expected
        && rv_of(&existing) != Some(want)
    {
        return Err(crate::store::Error::Conflict.into());
    }
    let obj = admission::admit(&st.store, kind, &ns, obj, Some(&existing)).await?;
    if dry_run(&q) {
        return Ok(Json(obj));
    }
    Ok(Json(
        st.store
            .replace(kind, obj, expected.or(rv_of(&existing)))
            .await?,
    ))
}

/// Apply a PATCH body (merge, strategic-merge treated as merge, or JSON patch) to `target`.
pub fn apply_patch(headers: &HeaderMap, body: &Bytes, target: &mut Value) -> ApiResult<()> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.starts_with("application/json-patch+json") {
        let patch: json_patch::Patch = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
        apply_json_patch(target, &patch.0)?;
    } else if ct.starts_with("application/merge-patch+json")
        || ct.starts_with("application/strategic-merge-patch+json")
    {
        let patch: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid merge patch: {e}")))?;
        json_patch::merge(target, &patch);
    } else if ct.starts_with("application/apply-patch+yaml") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            "server-side apply is not supported by edgevirt; use client-side apply \
             (`kubectl apply` without --server-side), which edgevirt fully supports",
        ));
    } else {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "PATCH content type {ct:?} is not supported; use application/merge-patch+json \
                 or application/json-patch+json"
            ),
        ));
    }
    Ok(())
}

/// Kubernetes' limit on the operations of one JSON patch.
const JSON_PATCH_MAX_OPS: usize = 10_000;

/// Apply a JSON patch one operation at a time, refusing one whose `copy` operations would
/// copy more than a request may carry (each copy can double the object: 30 of them would
/// make a gigabyte of a kilobyte). The caller works on a copy and drops it on error.
fn apply_json_patch(target: &mut Value, ops: &[json_patch::PatchOperation]) -> ApiResult<()> {
    if ops.len() > JSON_PATCH_MAX_OPS {
        return Err(ApiError::invalid(format!(
            "the JSON patch has {} operations; at most {JSON_PATCH_MAX_OPS}",
            ops.len()
        )));
    }
    let mut copied = 0usize;
    for (i, op) in ops.iter().enumerate() {
        if let json_patch::PatchOperation::Copy(c) = op
            && let Some(v) = target.pointer(c.from.as_str())
        {
            copied += serde_json::to_vec(v).map_or(0, |b| b.len());
            if copied > super::body::OBJECT_LIMIT {
                return Err(ApiError::invalid(format!(
                    "the JSON patch copies more than {} MiB (operation {i}); patches may not \
                     grow an object past what a request could send",
                    super::body::OBJECT_LIMIT >> 20
                )));
            }
        }
        json_patch::patch_unsafe(target, std::slice::from_ref(op)).map_err(|e| {
            ApiError::invalid(format!("the JSON patch does not apply: operation {i}: {e}"))
        })?;
    }
    Ok(())
}

pub async fn patch_ns(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, ns, plural, name)): Path<(String, String, String, String, String)>,
    Query(q): Query<ListParams>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let kind = kind_for(&group, &version, &plural)?;
    check_scope(kind, true)?;
    patch(st, p, kind, ns, name, q, headers, body).await
}

pub async fn patch_cluster(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, plural, name)): Path<(String, String, String, String)>,
    Query(q): Query<ListParams>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let kind = kind_for(&group, &version, &plural)?;
    check_scope(kind, false)?;
    patch(st, p, kind, String::new(), name, q, headers, body).await
}

#[allow(clippy::too_many_arguments)]
async fn patch(
    st: Arc<AppState>,
    p: Principal,
    kind: Kind,
    ns: String,
    name: String,
    q: ListParams,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    if p.require(write_access(kind)).is_err() {
        p.require(Access::AgentWrite)?;
    }
    // Like Kubernetes, a patch is re-applied when the object changed underneath it (the
    // controller and agents write status often), unless the patch pins a resourceVersion.
    if headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/apply-patch"))
    {
        // Refused before anything is looked up, whether or not the object exists.
        let mut probe = Value::Null;
        apply_patch(&headers, &body, &mut probe)?;
    }
    let pinned = String::from_utf8_lossy(&body).contains("resourceVersion");
    let mut attempts = 0;
    loop {
        attempts += 1;
        let existing = st.store.must_get(kind, &ns, &name).await?;
        super::scope::check(&st.store, &p, kind, &ns, &name, Some(&existing)).await?;
        let mut obj = existing.clone();
        apply_patch(&headers, &body, &mut obj)?;
        check_patched_identity(&existing, &mut obj)?;
        let obj = if p.role == super::auth::Role::Agent {
            // Agents patch metadata (finalizers, annotations) of objects they manage.
            let mut o = existing.clone();
            o["metadata"] = obj["metadata"].clone();
            o
        } else {
            admission::admit(&st.store, kind, &ns, obj, Some(&existing)).await?
        };
        if dry_run(&q) {
            return Ok(Json(obj));
        }
        match st.store.replace(kind, obj, rv_of(&existing)).await {
            Err(crate::store::Error::Conflict) if !pinned && attempts < 5 => continue,
            r => return Ok(Json(r?)),
        }
    }
}

/// What a patch may not do to an object's identity: drop its metadata (422), rename it or
/// move it (422: the URL names the object), or pin another resourceVersion (409). A patch
/// that removes the resourceVersion applies to the current one, as in Kubernetes.
fn check_patched_identity(existing: &Value, obj: &mut Value) -> ApiResult<()> {
    if !obj["metadata"].is_object() {
        return Err(ApiError::invalid(
            "metadata: Required value: a patch cannot remove or replace the object's metadata",
        ));
    }
    for field in ["name", "namespace", "uid"] {
        let (was, now) = (&existing["metadata"][field], &obj["metadata"][field]);
        if was != now && !(field == "uid" && now.is_null()) {
            return Err(ApiError::invalid(format!(
                "metadata.{field}: Invalid value: {now}: field is immutable (it is {was}); \
                 create a new object instead"
            )));
        }
    }
    if existing["metadata"]["uid"].is_string() {
        obj["metadata"]["uid"] = existing["metadata"]["uid"].clone();
    }
    match obj["metadata"].get("resourceVersion") {
        None | Some(Value::Null) => {
            obj["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"].clone();
        }
        Some(rv) if *rv != existing["metadata"]["resourceVersion"] => {
            return Err(crate::store::Error::Conflict.into());
        }
        Some(_) => {}
    }
    Ok(())
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeleteOptions {
    #[serde(default)]
    preconditions: Option<Preconditions>,
}

#[derive(Debug, Default, Deserialize)]
struct Preconditions {
    uid: Option<String>,
}

pub async fn delete_ns(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, ns, plural, name)): Path<(String, String, String, String, String)>,
    Query(q): Query<ListParams>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let kind = kind_for(&group, &version, &plural)?;
    check_scope(kind, true)?;
    delete(st, p, kind, ns, name, q, body).await
}

pub async fn delete_cluster(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((group, version, plural, name)): Path<(String, String, String, String)>,
    Query(q): Query<ListParams>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let kind = kind_for(&group, &version, &plural)?;
    check_scope(kind, false)?;
    delete(st, p, kind, String::new(), name, q, body).await
}

async fn delete(
    st: Arc<AppState>,
    p: Principal,
    kind: Kind,
    ns: String,
    name: String,
    q: ListParams,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    p.require(if kind == Kind::Node {
        Access::Admin
    } else {
        Access::Operate
    })?;
    let opts: DeleteOptions = if body.is_empty() {
        DeleteOptions::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    let existing = st.store.must_get(kind, &ns, &name).await?;
    if kind == Kind::Image {
        super::images::check_unused(&st, &name).await?;
    }
    if kind == Kind::Namespace {
        check_namespace_empty(&st, &name).await?;
    }
    if kind == Kind::Node {
        release_node(&st, &name, q.force == Some(true), dry_run(&q)).await?;
    }
    if dry_run(&q) {
        return Ok(Json(existing));
    }
    let uid = opts.preconditions.and_then(|p| p.uid);
    let out = st.store.delete(kind, &ns, &name, uid.as_deref()).await?;
    if kind == Kind::Image
        && let Some(file) = existing["status"]["file"].as_str()
    {
        let _ = std::fs::remove_file(st.images_dir().join(file));
    }
    if kind == Kind::Node {
        let n = st.store.revoke_node_credentials(&name).await?;
        tracing::info!(node = %name, credentials = n, "revoked the node's agent credentials");
    }
    tracing::info!(kind = kind.name(), namespace = %ns, %name, user = %p.user, "deleted");
    Ok(Json(out))
}

/// Before a node is deleted: refuse while instances are placed on it, unless `force` (the
/// administrator confirms the host is down), which fails them so that their VMs start again
/// elsewhere. This is the only way an instance leaves a node that stopped reporting.
async fn release_node(st: &AppState, node: &str, force: bool, dry_run: bool) -> ApiResult<()> {
    let (vmis, _) = st
        .store
        .list(
            Kind::VirtualMachineInstance,
            None,
            &LabelSelector::default(),
            &FieldSelector::node(node),
        )
        .await?;
    if vmis.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = vmis
        .iter()
        .map(|v| {
            format!(
                "{}/{}",
                v["metadata"]["namespace"].as_str().unwrap_or(""),
                v["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    if !force {
        return Err(ApiError::conflict(format!(
            "node {node:?} still holds {} instance(s): {}; drain it first (edgevirt node drain \
             {node}), or, if the host is down for good, delete it with --force so they start \
             elsewhere",
            names.len(),
            names.join(", ")
        )));
    }
    if dry_run {
        return Ok(());
    }
    for v in &vmis {
        let ns = v["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let name = v["metadata"]["name"].as_str().unwrap_or("").to_string();
        let node2 = node.to_string();
        st.store
            .update(Kind::VirtualMachineInstance, &ns, &name, move |o| {
                o["status"]["phase"] = json!(crate::types::kubevirt::phase::FAILED);
                o["status"]["reason"] = json!("NodeDeleted");
                o["status"]["message"] = json!(format!(
                    "node {node2} was deleted as down by an administrator"
                ));
                if let Some(f) = o["metadata"]["finalizers"].as_array_mut() {
                    f.retain(|f| f != crate::types::annotations::LAUNCHER_FINALIZER);
                }
                Ok(())
            })
            .await?;
        match st
            .store
            .delete(Kind::VirtualMachineInstance, &ns, &name, None)
            .await
        {
            Ok(_) | Err(crate::store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::warn!(%node, namespace = %ns, %name, "instance of a node deleted as down: failed and removed");
    }
    Ok(())
}

/// A namespace goes only when nothing is left in it (Kubernetes would delete its contents; for
/// VMs and their disks, edgevirt asks for that to be done on purpose).
async fn check_namespace_empty(st: &AppState, name: &str) -> ApiResult<()> {
    if name == "default" {
        return Err(ApiError::forbidden(
            "namespace \"default\" may not be deleted",
        ));
    }
    for kind in Kind::ALL.into_iter().filter(|k| k.namespaced()) {
        let (items, _) = st
            .store
            .list(
                kind,
                Some(name),
                &LabelSelector::default(),
                &FieldSelector::default(),
            )
            .await?;
        if let Some(o) = items.first() {
            return Err(ApiError::conflict(format!(
                "namespace {name:?} still holds {} {:?} (and maybe more); delete its VMs first",
                kind.name(),
                o["metadata"]["name"].as_str().unwrap_or("")
            )));
        }
    }
    Ok(())
}

// The core group (`/api/v1/...`, namespaces): the same handlers with group "".

type CoreName = Path<(String, String, String)>;

pub async fn core_list(
    st: S,
    p: Extension<Principal>,
    Path((version, plural)): Path<(String, String)>,
    q: Query<ListParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    list_all(st, p, Path((String::new(), version, plural)), q, headers).await
}

pub async fn core_create(
    st: S,
    p: Extension<Principal>,
    Path((version, plural)): Path<(String, String)>,
    q: Query<ListParams>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    create_cluster(
        st,
        p,
        Path((String::new(), version, plural)),
        q,
        headers,
        body,
    )
    .await
}

pub async fn core_get(
    st: S,
    p: Extension<Principal>,
    Path((version, plural, name)): CoreName,
    q: Query<ListParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    get_cluster(
        st,
        p,
        Path((String::new(), version, plural, name)),
        q,
        headers,
    )
    .await
}

pub async fn core_replace(
    st: S,
    p: Extension<Principal>,
    Path((version, plural, name)): CoreName,
    q: Query<ListParams>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    replace_cluster(
        st,
        p,
        Path((String::new(), version, plural, name)),
        q,
        headers,
        body,
    )
    .await
}

pub async fn core_patch(
    st: S,
    p: Extension<Principal>,
    Path((version, plural, name)): CoreName,
    q: Query<ListParams>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    patch_cluster(
        st,
        p,
        Path((String::new(), version, plural, name)),
        q,
        headers,
        body,
    )
    .await
}

pub async fn core_delete(
    st: S,
    p: Extension<Principal>,
    Path((version, plural, name)): CoreName,
    q: Query<ListParams>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    delete_cluster(st, p, Path((String::new(), version, plural, name)), q, body).await
}

/// `default` and every namespace an object is in exist as Namespace objects (databases from
/// before namespaces were stored get theirs here).
pub async fn ensure_namespaces(store: &crate::store::Store) -> crate::store::Result<()> {
    let mut names = std::collections::BTreeSet::from(["default".to_string()]);
    for kind in Kind::ALL.into_iter().filter(|k| k.namespaced()) {
        let (items, _) = store
            .list(
                kind,
                None,
                &LabelSelector::default(),
                &FieldSelector::default(),
            )
            .await?;
        for o in items {
            if let Some(ns) = o["metadata"]["namespace"].as_str() {
                names.insert(ns.to_string());
            }
        }
    }
    for ns in names {
        if store.get(Kind::Namespace, "", &ns).await?.is_none() {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                             "status": {"phase": "Active"}});
            match store.create(Kind::Namespace, obj, false).await {
                Ok(_) | Err(crate::store::Error::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}
