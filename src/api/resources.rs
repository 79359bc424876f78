//! Generic handlers for stored kinds: list (with selectors, paging, watch), get, create,
//! replace, patch, delete. Kind-specific checks live in [`super::admission`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use super::table;
use super::{AppState, S, admission};
use crate::http::auth::{Access, Principal};
use crate::http::body::parse_body;
use crate::http::error::{ApiError, ApiResult};
use crate::http::throttle;
use crate::store::events::push_watch_line;
use crate::store::{Continue, Event, FieldSelector, LabelSelector, ListQuery, rv_of};
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
    if group == super::discovery::EVENTS_GROUP && version == "v1" && plural == "events" {
        return Ok(Kind::Event);
    }
    let version_ok = version == crate::types::version_of(group)
        || crate::types::is_alias(&format!("{group}/{version}"));
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

async fn list(
    st: Arc<AppState>,
    kind: Kind,
    ns: Option<String>,
    q: ListParams,
    headers: &HeaderMap,
) -> ApiResult<Response> {
    let as_table = table::wanted(headers, q.include_object.as_deref());
    let labels = LabelSelector::parse(q.label_selector.as_deref().unwrap_or(""))?;
    let fields = FieldSelector::parse(q.field_selector.as_deref().unwrap_or(""))?;
    if matches!(q.watch.as_deref(), Some("true") | Some("1")) {
        return watch(st, kind, ns, labels, fields, q, as_table).await;
    }
    // Keyset paging: the token names the last key handed out and the listing's
    // resourceVersion, which every page reports, as Kubernetes does (a watch from it then
    // sees whatever changed while the pages were read).
    let after = match q.continue_.as_deref().filter(|c| !c.is_empty()) {
        Some(token) => Some(
            Continue::decode(token)
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?,
        ),
        None => None,
    };
    let limit = q.limit.filter(|l| *l > 0);
    // A full listing holds its items' JSON until the answer is sent: a few at a time.
    let permit = match limit {
        Some(l) if l <= SMALL_PAGE => None,
        _ => Some(
            throttle::Gate::listings()
                .enter()
                .await
                .map_err(|b| b.into_error("listing"))?,
        ),
    };
    let raw = st
        .store
        .list_raw(
            kind,
            &ListQuery {
                namespace: ns.as_deref(),
                labels: Some(&labels),
                fields: Some(&fields),
                after: after
                    .as_ref()
                    .map(|c| (c.namespace.as_str(), c.name.as_str())),
                limit,
            },
        )
        .await?;
    let rv = after.as_ref().map_or(0, |c| c.rv);
    let rv = if rv == 0 { raw.rv } else { rv };
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some((namespace, name)) = &raw.more {
        let c = Continue {
            rv,
            namespace: namespace.clone(),
            name: name.clone(),
        };
        meta["continue"] = json!(c.encode());
    }
    if let Some(include) = as_table {
        let items = raw
            .iter()
            .map(serde_json::from_str)
            .collect::<Result<Vec<Value>, _>>()
            .map_err(ApiError::internal)?;
        return Ok(table_response(table::table(
            kind, &items, meta, include, true,
        )));
    }
    // The stored JSON goes out as it is, between the list's head and tail: no parse, no
    // serialization, no copy.
    let head = list_head(kind, meta).map_err(ApiError::internal)?;
    let items = Bytes::from(raw.into_items_json());
    let tail = Bytes::from_static(b"]}");
    let len = head.len() + items.len() + tail.len();
    let chunks = [head, items, tail];
    // The turn is held until the body is sent (or the client goes away), but not longer
    // than GATE_HOLD: a client that stops reading must not keep others waiting.
    let held = permit.is_some();
    let turn = Turn(Arc::new(std::sync::Mutex::new(permit)));
    if held {
        let slot = turn.0.clone();
        tokio::spawn(async move {
            tokio::time::sleep(GATE_HOLD).await;
            if let Ok(mut p) = slot.lock() {
                p.take();
            }
        });
    }
    let stream = futures::stream::iter(chunks).map(move |c| {
        let _ = &turn;
        Ok::<_, Infallible>(c)
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// A turn at the listing gate, given back when the answer is dropped (sent or abandoned) or
/// by the timer, whichever comes first.
struct Turn(Arc<std::sync::Mutex<Option<tokio::sync::OwnedSemaphorePermit>>>);

impl Drop for Turn {
    fn drop(&mut self) {
        if let Ok(mut p) = self.0.lock() {
            p.take();
        }
    }
}

/// The longest a LIST's answer holds its turn at the listing gate while it is sent.
const GATE_HOLD: Duration = Duration::from_secs(30);

/// Pages up to this size are cheap enough to need no turn at the listing gate.
const SMALL_PAGE: usize = 1000;

/// `{"apiVersion":..,"kind":"<Kind>List","metadata":<meta>,"items":[`: the list as
/// serde_json writes it, up to its items.
fn list_head(kind: Kind, metadata: Value) -> serde_json::Result<Bytes> {
    #[derive(serde::Serialize)]
    struct Head {
        #[serde(rename = "apiVersion")]
        api_version: String,
        kind: String,
        metadata: Value,
    }
    let mut b = serde_json::to_vec(&Head {
        api_version: kind.api_version(),
        kind: format!("{}List", kind.name()),
        metadata,
    })?;
    b.pop();
    b.extend_from_slice(b",\"items\":[");
    Ok(Bytes::from(b))
}

/// A watch ERROR event with a `Status` (410 Expired: the watcher fell behind and must list
/// again, as client-go does on it).
fn watch_error(code: u16, reason: &str, message: &str) -> Bytes {
    let mut b = serde_json::to_vec(&json!({"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    }}))
    .unwrap_or_default();
    b.push(b'\n');
    Bytes::from(b)
}

/// Bytes of initial events sent to a watcher at a time.
const WATCH_CHUNK: usize = 64 << 10;

/// Stream changes as newline-delimited watch events; resumes from `resourceVersion`.
/// Watchers starting from a full listing share one (read once, however many start at
/// once); each change is encoded once for every JSON watcher; each watcher has a small
/// bounded buffer, and one that falls too far behind gets a 410 ERROR event and is closed.
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
    let seen = st.store.published_rv();
    // As a Table, each event's object is a one-row table; only the first has the columns.
    let mut first = true;
    let mut table_line = move |t: &str, o: Value, include: table::Include| -> Bytes {
        let with_columns = std::mem::replace(&mut first, false);
        let object = table::table(kind, &[o], json!({}), include, with_columns);
        let mut b = serde_json::to_vec(&json!({"type": t, "object": object})).unwrap_or_default();
        b.push(b'\n');
        Bytes::from(b)
    };
    let since: u64 = match q.resource_version.as_deref() {
        None | Some("") | Some("0") => 0,
        Some(v) => v
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {v:?}")))?,
    };
    let selective = !labels.is_empty() || !fields.is_empty();
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
    let mut last = since;
    // Watch-list (current kubectl's `wait`): the current objects, then a bookmark saying
    // they are all there, then changes.
    let watch_list = q.send_initial_events == Some(true);
    let mut listing = None;
    let mut replay = Vec::new();
    if since == 0 || watch_list {
        let permit = throttle::Gate::listings()
            .enter()
            .await
            .map_err(|b| b.into_error("listing"))?;
        let (cell, list) = st.store.shared_listing(kind, ns.as_deref(), seen).await?;
        drop(permit);
        last = list.rv;
        if list.rv < seen {
            // The shared listing was under way before this watcher subscribed: what
            // happened in between comes from the log.
            replay = st.store.events_since(list.rv).await?;
        }
        listing = Some((cell, list));
    } else {
        replay = st.store.events_since(since).await?;
    }
    let (tx, out) = tokio::sync::mpsc::channel::<Bytes>(8);
    let timeout = Duration::from_secs(q.timeout_seconds.unwrap_or(1800).min(3600));
    tokio::spawn(async move {
        if let Some((cell, list)) = listing {
            let mut buf = Vec::with_capacity(WATCH_CHUNK + (16 << 10));
            for body in list.iter() {
                if selective || as_table.is_some() {
                    let Ok(o) = serde_json::from_str::<Value>(body) else {
                        continue;
                    };
                    if !wanted(kind, &o) {
                        continue;
                    }
                    if let Some(include) = as_table {
                        buf.extend_from_slice(&table_line("ADDED", o, include));
                    } else {
                        push_watch_line(&mut buf, "ADDED", body);
                    }
                } else {
                    push_watch_line(&mut buf, "ADDED", body);
                }
                if buf.len() >= WATCH_CHUNK
                    && tx
                        .send(Bytes::from(std::mem::replace(
                            &mut buf,
                            Vec::with_capacity(WATCH_CHUNK + (16 << 10)),
                        )))
                        .await
                        .is_err()
                {
                    return;
                }
            }
            let rv = list.rv;
            drop((list, cell));
            if watch_list {
                let mut b = serde_json::to_vec(&json!({"type": "BOOKMARK", "object": {
                    "kind": kind.name(), "apiVersion": kind.api_version(),
                    "metadata": {"resourceVersion": rv.to_string(),
                                 "annotations": {"k8s.io/initial-events-end": "true"}},
                }}))
                .unwrap_or_default();
                b.push(b'\n');
                buf.extend_from_slice(&b);
            }
            if !buf.is_empty() && tx.send(Bytes::from(buf)).await.is_err() {
                return;
            }
        }
        let mut line = |ev: &Event| match as_table {
            Some(include) => table_line(ev.event_type, ev.object.clone(), include),
            None => ev.watch_line(),
        };
        for ev in replay {
            if ev.rv > last && wanted(ev.kind, &ev.object) {
                last = ev.rv;
                if tx.send(line(&ev)).await.is_err() {
                    return;
                }
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
                        if tx.send(line(&ev)).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    // A watcher that fell behind is told so and closed; the client lists
                    // again and resumes, as after a compaction in Kubernetes.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        let _ = tx.try_send(watch_error(
                            410,
                            "Expired",
                            &format!("too old resource version: {last}: the watcher fell behind"),
                        ));
                        return;
                    }
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

async fn get(
    st: Arc<AppState>,
    kind: Kind,
    ns: &str,
    name: &str,
    q: ListParams,
    headers: &HeaderMap,
) -> ApiResult<Response> {
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

/// What a request on a resource path does: the method, and whether it names one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    List,
    Get,
    Create,
    Replace,
    Patch,
    Delete,
}

impl Verb {
    fn of(method: &Method, named: bool) -> ApiResult<Verb> {
        Ok(match (method, named) {
            (&Method::GET, false) => Verb::List,
            (&Method::POST, false) => Verb::Create,
            (&Method::GET, true) => Verb::Get,
            (&Method::PUT, true) => Verb::Replace,
            (&Method::PATCH, true) => Verb::Patch,
            (&Method::DELETE, true) => Verb::Delete,
            _ => {
                return Err(ApiError::new(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    format!("{method} is not allowed on this path"),
                ));
            }
        })
    }

    /// Who may do what, declared once for every kind: any of these accesses will do.
    /// Agents register and update their Node (and, within `scope::check`, patch what their
    /// node runs); only an administrator deletes a node.
    fn access(self, kind: Kind) -> &'static [Access] {
        match (self, kind) {
            // As Kubernetes' `view` role: secrets are not for viewers.
            (Verb::List | Verb::Get, Kind::Secret) => &[Access::Operate, Access::AgentWrite],
            (Verb::List | Verb::Get, _) => &[Access::Read],
            (Verb::Delete, Kind::Node) => &[Access::Admin],
            // Cluster-wide sizes and preferences are every namespace's: administrators keep
            // them. Revisions are the controller's record of what a VM uses.
            (
                Verb::Create | Verb::Replace | Verb::Patch | Verb::Delete,
                Kind::VirtualMachineClusterInstancetype
                | Kind::VirtualMachineClusterPreference
                | Kind::ControllerRevision
                | Kind::StorageClass,
            ) => &[Access::Admin],
            (Verb::Create | Verb::Replace | Verb::Patch, Kind::Node) => &[Access::AgentWrite],
            // Events are the system's record: agents and administrators write them.
            (Verb::Create | Verb::Replace | Verb::Patch | Verb::Delete, Kind::Event) => {
                &[Access::Admin, Access::AgentWrite]
            }
            (Verb::Patch, _) => &[Access::Operate, Access::AgentWrite],
            (Verb::Create | Verb::Replace | Verb::Delete, _) => &[Access::Operate],
        }
    }
}

/// Where a request on a resource path points: from the path's parameters, for all six
/// shapes (`/api/{version}/...` for the core group, `/apis/{group}/{version}/...`, with or
/// without `namespaces/{ns}`, with or without a name).
struct Target {
    kind: Kind,
    /// The path's namespace, if it has one.
    ns: Option<String>,
    name: Option<String>,
    /// The path's group and version when it is an older alias of the kind's (KubeVirt's
    /// `kubevirt.io/v1alpha3`): objects are stored as the current version and answered as
    /// the asked one.
    alias: Option<String>,
}

impl Target {
    fn parse(mut params: HashMap<String, String>) -> ApiResult<Target> {
        let mut take = |k: &str| params.remove(k);
        let group = take("group").unwrap_or_default();
        let (version, plural) = (
            take("version").unwrap_or_default(),
            take("plural").unwrap_or_default(),
        );
        let kind = kind_for(&group, &version, &plural)?;
        let asked = if group.is_empty() {
            version
        } else {
            format!("{group}/{version}")
        };
        let alias = (asked != kind.api_version()).then_some(asked);
        Ok(Target {
            kind,
            ns: take("ns"),
            name: take("name"),
            alias,
        })
    }
}

/// Every resource path, every verb: parse where it points and what it does, check who may
/// do that, then run the verb. Listing every namespace's objects needs no namespace in the
/// path; everything else must match the kind's scope.
pub async fn resource(
    State(st): S,
    Extension(p): Extension<Principal>,
    method: Method,
    Path(params): Path<HashMap<String, String>>,
    Query(q): Query<ListParams>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let t = Target::parse(params)?;
    let verb = Verb::of(&method, t.name.is_some())?;
    if !(verb == Verb::List && t.ns.is_none()) {
        check_scope(t.kind, t.ns.is_some())?;
    }
    let allowed = verb.access(t.kind);
    if !allowed.iter().any(|a| p.require(*a).is_ok()) {
        p.require(allowed[0])?;
    }
    let kind = t.kind;
    let ns = t.ns.unwrap_or_default();
    let name = t.name.unwrap_or_default();
    if let Some(alias) = t.alias {
        if alias == EVENTS_V1 && !matches!(verb, Verb::List | Verb::Get) {
            return Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "events.k8s.io/v1 events are served for reading; write core v1 events \
                 (/api/v1/namespaces/NAMESPACE/events)",
            ));
        }
        let watch = matches!(q.watch.as_deref(), Some("true") | Some("1"));
        let resp = Box::pin(run_verb(st, p, verb, kind, ns, name, q, headers, body)).await?;
        return Ok(as_alias(resp, &kind.api_version(), &alias, watch).await);
    }
    run_verb(st, p, verb, kind, ns, name, q, headers, body).await
}

/// One verb on one kind, the path checked.
#[allow(clippy::too_many_arguments)]
async fn run_verb(
    st: Arc<AppState>,
    p: Principal,
    verb: Verb,
    kind: Kind,
    ns: String,
    name: String,
    q: ListParams,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    match verb {
        Verb::List => list(st, kind, (!ns.is_empty()).then_some(ns), q, &headers).await,
        Verb::Get => get(st, kind, &ns, &name, q, &headers).await,
        Verb::Create => create(st, p, kind, ns, q, headers, body).await,
        Verb::Replace => Ok(replace(st, p, kind, ns, name, q, headers, body)
            .await?
            .into_response()),
        Verb::Patch => Ok(patch(st, p, kind, ns, name, q, headers, body)
            .await?
            .into_response()),
        Verb::Delete => Ok(delete(st, p, kind, ns, name, q, body)
            .await?
            .into_response()),
    }
}

/// The events group's version, whose objects are the core events reshaped.
const EVENTS_V1: &str = "events.k8s.io/v1";

/// Objects, lists and watch events of a JSON response with `apiVersion` `current` (at the
/// top, in `items`, in a watch event's `object`) relabelled as `alias`; for
/// `events.k8s.io/v1`, each core event reshaped as one of that group.
fn relabel(v: &mut Value, current: &str, alias: &str) {
    if v["apiVersion"] == current {
        if alias != EVENTS_V1 || v["kind"] == "EventList" {
            v["apiVersion"] = json!(alias);
        } else if v["kind"] == "Event" {
            *v = event_v1(v);
        }
    }
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        for i in items {
            relabel(i, current, alias);
        }
    }
    if v.get("type").is_some_and(Value::is_string)
        && let Some(o) = v.get_mut("object")
    {
        relabel(o, current, alias);
    }
}

/// A core `v1` Event as `events.k8s.io/v1` shows it: `regarding` and `note` for
/// `involvedObject` and `message`, an `eventTime` always (required there), a `series` for a
/// repeated one, and the core-only fields under their `deprecated*` names.
fn event_v1(e: &Value) -> Value {
    let mut out = json!({
        "apiVersion": EVENTS_V1,
        "kind": "Event",
        "metadata": e["metadata"],
        "regarding": e["involvedObject"],
        "reason": e["reason"],
        "note": e["message"],
        "type": e["type"],
        "reportingController": e.get("reportingComponent").filter(|v| !v.is_null()).unwrap_or(&e["source"]["component"]),
        "reportingInstance": e.get("reportingInstance").filter(|v| !v.is_null()).unwrap_or(&e["source"]["host"]),
        "deprecatedSource": e["source"],
        "deprecatedFirstTimestamp": e["firstTimestamp"],
        "deprecatedLastTimestamp": e["lastTimestamp"],
        "deprecatedCount": e["count"],
    });
    // MicroTime: the first sighting, with microseconds.
    let first = e["eventTime"]
        .as_str()
        .or(e["firstTimestamp"].as_str())
        .or(e["metadata"]["creationTimestamp"].as_str());
    out["eventTime"] = match first {
        Some(t) if !t.contains('.') => json!(t.replace('Z', ".000000Z")),
        Some(t) => json!(t),
        None => Value::Null,
    };
    if e["count"].as_i64().unwrap_or(1) > 1 {
        out["series"] = json!({
            "count": e["count"],
            "lastObservedTime": e["lastTimestamp"].as_str().map(|t| t.replace('Z', ".000000Z")),
        });
    }
    if let Some(o) = out.as_object_mut() {
        o.retain(|_, v| !v.is_null());
    }
    out
}

/// A response in the version the path asked for (KubeVirt's `v1alpha3`): JSON bodies and
/// newline-delimited watch streams relabelled; tables and protobuf are left as they are.
async fn as_alias(resp: Response, current: &str, alias: &str, watch: bool) -> Response {
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    let table = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("as=Table"));
    if !json || table {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let (current, alias) = (current.to_string(), alias.to_string());
    if watch {
        let mut rest: Vec<u8> = Vec::new();
        let stream = body.into_data_stream().map(move |chunk| {
            rest.extend_from_slice(&chunk?);
            let mut out = Vec::with_capacity(rest.len());
            while let Some(i) = rest.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = rest.drain(..=i).collect();
                match serde_json::from_slice::<Value>(&line) {
                    Ok(mut v) => {
                        relabel(&mut v, &current, &alias);
                        out.extend(serde_json::to_vec(&v).unwrap_or_default());
                        out.push(b'\n');
                    }
                    Err(_) => out.extend(line),
                }
            }
            Ok::<_, axum::Error>(Bytes::from(out))
        });
        return Response::from_parts(parts, Body::from_stream(stream));
    }
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => return ApiError::internal(format!("reading the response: {e}")).into_response(),
    };
    let out = match serde_json::from_slice::<Value>(&bytes) {
        Ok(mut v) => {
            relabel(&mut v, &current, &alias);
            Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
        }
        Err(_) => bytes,
    };
    Response::from_parts(parts, Body::from(out))
}

fn dry_run(q: &ListParams) -> bool {
    q.dry_run.as_deref() == Some("All")
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
            if copied > crate::http::body::OBJECT_LIMIT {
                return Err(ApiError::invalid(format!(
                    "the JSON patch copies more than {} MiB (operation {i}); patches may not \
                     grow an object past what a request could send",
                    crate::http::body::OBJECT_LIMIT >> 20
                )));
            }
        }
        json_patch::patch_unsafe(target, std::slice::from_ref(op)).map_err(|e| {
            ApiError::invalid(format!("the JSON patch does not apply: operation {i}: {e}"))
        })?;
    }
    Ok(())
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
        let obj = if p.role == crate::http::auth::Role::Agent {
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

async fn delete(
    st: Arc<AppState>,
    p: Principal,
    kind: Kind,
    ns: String,
    name: String,
    q: ListParams,
    body: Bytes,
) -> ApiResult<Json<Value>> {
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
    if kind == Kind::NetworkAttachmentDefinition {
        check_network_unused(&st, &ns, &name).await?;
    }
    if kind == Kind::Node {
        crate::controller::release_node(&st.store, &name, q.force == Some(true), dry_run(&q))
            .await
            .map_err(|e| match e {
                crate::controller::Release::Busy(m) => ApiError::conflict(m),
                crate::controller::Release::Store(e) => e.into(),
            })?;
    }
    if dry_run(&q) {
        return Ok(Json(existing));
    }
    let uid = opts.preconditions.and_then(|p| p.uid);
    let out = st.store.delete(kind, &ns, &name, uid.as_deref()).await?;
    if kind == Kind::Namespace {
        // Its events go with it, as Kubernetes' namespace deletion takes them.
        let (events, _) = st
            .store
            .list(
                Kind::Event,
                Some(&name),
                &LabelSelector::default(),
                &FieldSelector::default(),
            )
            .await?;
        for e in events {
            if let Some(n) = e["metadata"]["name"].as_str() {
                match st.store.delete(Kind::Event, &name, n, None).await {
                    Ok(_) | Err(crate::store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
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

/// A NetworkAttachmentDefinition goes only when no instance that has not finished uses it
/// (its VMs' next start would fail; a running VM would lose what its LAN is on record).
async fn check_network_unused(st: &AppState, ns: &str, name: &str) -> ApiResult<()> {
    use crate::types::Meta;
    let vmis: Vec<crate::types::VirtualMachineInstance> = st.store.all().await?;
    let users: Vec<String> = vmis
        .iter()
        .filter(|v| !v.phase().is_final())
        .filter(|v| crate::rules::network::uses(v.namespace(), &v.spec.networks, ns, name))
        .map(|v| format!("{}/{}", v.namespace(), v.name()))
        .collect();
    if users.is_empty() {
        return Ok(());
    }
    Err(ApiError::conflict(format!(
        "NetworkAttachmentDefinition {ns}/{name} is used by running VMs: {}; stop them (or \
         move them to another network) first",
        users.join(", ")
    )))
}

/// A namespace goes only when nothing is left in it (Kubernetes would delete its contents; for
/// VMs and their disks, edgevirt asks for that to be done on purpose).
async fn check_namespace_empty(st: &AppState, name: &str) -> ApiResult<()> {
    if name == "default" {
        return Err(ApiError::forbidden(
            "namespace \"default\" may not be deleted",
        ));
    }
    // Events are a record of what happened, not contents: they go with the namespace.
    for kind in Kind::ALL
        .into_iter()
        .filter(|k| k.namespaced() && *k != Kind::Event)
    {
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
