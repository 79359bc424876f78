//! The HTTP API: Kubernetes-style paths for `kubevirt.io/v1` and `edgevirt.io/v1` kinds,
//! KubeVirt's subresources, health endpoints. Routes are declared in one table in
//! [`router`]; handlers parse, check access, and go through the store. Only `api`, `web` and
//! `vnc` import axum.

pub mod admission;
pub mod auth;
mod discovery;
pub mod error;
mod images;
pub mod join;
mod openapi;
mod protobuf;
mod resources;
mod scope;
pub use resources::ensure_namespaces;
mod strategy;
mod subresources;
mod table;

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::{Value, json};

use crate::store::Store;
use auth::{Principal, Role};
use error::{ApiError, ApiResult};

/// The node whose agent runs in this same process (role `all`).
#[derive(Clone, Debug)]
pub struct LocalNode {
    pub name: String,
    pub data_dir: PathBuf,
}

/// What handlers share.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub data_dir: PathBuf,
    pub install_id: String,
    pub local_node: Option<LocalNode>,
    pub consoles: Arc<crate::vnc::Consoles>,
    /// Served over TLS: cookies get the Secure attribute.
    pub tls: bool,
    /// SHA-256 (hex) of the certificate served, which join tokens carry for agents to pin.
    pub cert_pin: Option<String>,
    /// Migration tunnels waiting for their other side.
    pub tunnels: Arc<crate::vnc::tunnel::Tunnels>,
    /// Agents' channels, on which consoles of VMs on their nodes are asked for.
    pub channels: Arc<crate::vnc::remote::Channels>,
}

impl AppState {
    pub fn new(store: Store, data_dir: PathBuf, install_id: String) -> Self {
        AppState {
            store,
            data_dir,
            install_id,
            local_node: None,
            consoles: Default::default(),
            tls: false,
            cert_pin: None,
            tunnels: Default::default(),
            channels: Default::default(),
        }
    }

    pub fn images_dir(&self) -> PathBuf {
        self.data_dir.join("images")
    }
}

type S = State<Arc<AppState>>;

/// Everything served on the one port: API, console proxy, dashboard.
pub fn router(state: AppState) -> Router {
    let state = Arc::new(state);
    let authed = api_routes()
        .merge(crate::vnc::authed_routes())
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(middleware::from_fn(agent_skew))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate));
    let api_for_web = authed.clone().with_state(state.clone());
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/join", axum::routing::post(join::join))
        .merge(authed)
        .merge(crate::vnc::ticket_routes())
        .merge(crate::web::routes(state.clone(), api_for_web))
        .fallback(|| async { ApiError::not_found("no such path") })
        .with_state(state)
}

/// The Kubernetes-style API paths.
fn api_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/readyz", get(readyz))
        .route("/version", get(version))
        .route("/apis/edgevirt.io/v1/info", get(info))
        .route(
            "/apis/edgevirt.io/v1/jointokens",
            get(join::list_tokens).post(join::create_token),
        )
        .route(
            "/apis/edgevirt.io/v1/jointokens/{id}",
            axum::routing::delete(join::delete_token),
        )
        .route(
            "/apis/edgevirt.io/v1/installstrategy",
            get(strategy::get_strategy),
        )
        .route(
            "/apis/edgevirt.io/v1/installstrategy/version",
            put(strategy::put_version),
        )
        .route("/apis/edgevirt.io/v1/rollout", get(strategy::get_rollout))
        .route("/api", get(discovery::core))
        .route("/api/{version}", get(discovery::core_version))
        .route("/apis", get(discovery::groups))
        .route("/apis/{group}/{version}", get(discovery::group_version))
        .route("/openapi/v2", get(openapi::v2))
        .route("/openapi/v3", get(openapi::v3_index))
        .route("/openapi/v3/{*path}", get(openapi::v3_group))
        .route(
            "/api/{version}/{plural}",
            get(resources::core_list).post(resources::core_create),
        )
        .route(
            "/api/{version}/{plural}/{name}",
            get(resources::core_get)
                .put(resources::core_replace)
                .patch(resources::core_patch)
                .delete(resources::core_delete),
        )
        .route(
            "/apis/{group}/{version}/{plural}",
            get(resources::list_all).post(resources::create_cluster),
        )
        .route(
            "/apis/{group}/{version}/namespaces/{ns}/{plural}",
            get(resources::list_ns).post(resources::create_ns),
        )
        .route(
            "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}",
            get(resources::get_ns)
                .put(resources::replace_ns)
                .patch(resources::patch_ns)
                .delete(resources::delete_ns),
        )
        .route(
            "/apis/{group}/{version}/{plural}/{name}",
            get(resources::get_cluster)
                .put(resources::replace_cluster)
                .patch(resources::patch_cluster)
                .delete(resources::delete_cluster),
        )
        .route(
            "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}/{sub}",
            put(subresources::put_ns)
                .patch(subresources::patch_ns)
                .get(subresources::get_ns),
        )
        .route(
            "/apis/{group}/{version}/{plural}/{name}/{sub}",
            put(subresources::put_cluster)
                .patch(subresources::patch_cluster)
                .get(subresources::get_cluster),
        )
}

async fn readyz(State(st): S) -> Response {
    match st.store.current_rv().await {
        Ok(_) => "ok".into_response(),
        Err(e) => ApiError::internal(e).into_response(),
    }
}

async fn version() -> impl IntoResponse {
    axum::Json(json!({
        "major": "1",
        "minor": "34",
        "gitVersion": format!("v1.34.0-edgevirt.{}", crate::version::RELEASE),
        "platform": "linux/amd64",
        "edgevirtVersion": crate::version::RELEASE,
    }))
}

async fn info(State(st): S) -> impl IntoResponse {
    axum::Json(json!({
        "installId": st.install_id,
        "version": crate::version::RELEASE,
        "agentProtocol": crate::version::AGENT_PROTOCOL.to_string(),
        "cpuModel": crate::cpu::policy::cluster_default(),
    }))
}

/// Refuse an agent whose protocol is outside the skew window, with both versions named.
/// Requests without the header (CLI, kubectl, browsers, release-1 agents) pass.
async fn agent_skew(req: Request, next: Next) -> Response {
    use crate::version::{AGENT_PROTOCOL, AGENT_PROTOCOL_HEADER, Protocol, RELEASE_HEADER};
    let Some(v) = req.headers().get(AGENT_PROTOCOL_HEADER) else {
        return next.run(req).await;
    };
    let theirs: Protocol = match v.to_str().map_err(|e| e.to_string()).and_then(str::parse) {
        Ok(p) => p,
        Err(e) => {
            return ApiError::bad_request(format!("{AGENT_PROTOCOL_HEADER}: {e}")).into_response();
        }
    };
    let release = req
        .headers()
        .get(RELEASE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown release")
        .to_string();
    match AGENT_PROTOCOL.check(&format!("the agent ({release})"), theirs) {
        Ok(()) => next.run(req).await,
        Err(m) => ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "VersionSkew",
            format!("{m} (this controller is {})", crate::version::RELEASE),
        )
        .into_response(),
    }
}

/// Check the bearer token, or the dashboard's session cookie (with its CSRF token on every
/// state change); put the [`Principal`] into the request. A principal already present was
/// put there in-process by the dashboard, which calls the API for its forms.
async fn authenticate(State(st): S, mut req: Request, next: Next) -> Response {
    if req.extensions().get::<Principal>().is_some() {
        return next.run(req).await;
    }
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(token) = token else {
        return match auth::session_of(&st.store, req.headers()).await {
            Ok(Some(s)) => {
                let safe = req.method().is_safe();
                let csrf = req
                    .headers()
                    .get(auth::CSRF_HEADER)
                    .and_then(|v| v.to_str().ok());
                if !safe && !csrf.is_some_and(|c| auth::same_secret(c, &s.csrf)) {
                    return ApiError::forbidden(
                        "a state change with a session cookie needs the X-CSRF-Token header",
                    )
                    .into_response();
                }
                match Role::parse(&s.role) {
                    Some(role) => {
                        req.extensions_mut()
                            .insert(Principal { user: s.user, role });
                        next.run(req).await
                    }
                    None => ApiError::unauthorized().into_response(),
                }
            }
            Ok(None) => ApiError::unauthorized().into_response(),
            Err(e) => ApiError::internal(e).into_response(),
        };
    };
    match st.store.token(&auth::token_hash(token)).await {
        Ok(Some((user, role))) => match Role::parse(&role) {
            Some(role) => {
                req.extensions_mut().insert(Principal { user, role });
                next.run(req).await
            }
            None => ApiError::unauthorized().into_response(),
        },
        Ok(None) => ApiError::unauthorized().into_response(),
        Err(e) => ApiError::internal(e).into_response(),
    }
}

/// Decode a request body as JSON or YAML (by content type, falling back on a sniff).
pub fn parse_body(headers: &HeaderMap, body: &Bytes) -> ApiResult<Value> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    if ct.starts_with(protobuf::CONTENT_TYPE) {
        return protobuf::decode(body).map_err(|m| {
            ApiError::new(
                axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                m,
            )
        });
    }
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the request body is not UTF-8"))?;
    let v: Value = if ct.contains("yaml") {
        serde_yaml_ng::from_str(text)
            .map_err(|e| ApiError::bad_request(format!("the body is not valid YAML: {e}")))?
    } else {
        match serde_json::from_str(text) {
            Ok(v) => v,
            Err(je) if !ct.contains("json") => serde_yaml_ng::from_str(text).map_err(|e| {
                ApiError::bad_request(format!("the body is neither JSON ({je}) nor YAML ({e})"))
            })?,
            Err(e) => {
                return Err(ApiError::bad_request(format!(
                    "the body is not valid JSON: {e}"
                )));
            }
        }
    };
    if !v.is_object() {
        return Err(ApiError::bad_request("the body must be an object"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests;
