//! The HTTP API: Kubernetes-style paths for `kubevirt.io/v1` and `edgevirt.io/v1` kinds,
//! KubeVirt's subresources, health endpoints. Routes are declared in one table in
//! [`router`]; handlers parse, check access, and go through the store. Only `api`, `web` and
//! `vnc` import axum.

pub mod admission;
pub mod auth;
pub mod body;
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
pub mod throttle;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::json;

use crate::store::Store;
use auth::{Access, Principal, Role};
pub use body::parse_body;
use error::{ApiError, ApiResult};
use throttle::{Bursts, LoginGuard, RateLimit};

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
    /// Failed dashboard logins, lockouts.
    pub logins: Arc<LoginGuard>,
    /// `POST /join` tries per client address.
    pub join_limit: Arc<RateLimit>,
    /// Failure logs, one line per burst.
    pub bursts: Arc<Bursts>,
}

/// `/join`: ten tries at once from one address, then one every six seconds.
const JOIN_BURST: u32 = 10;
const JOIN_EVERY: Duration = Duration::from_secs(6);

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
            logins: Default::default(),
            join_limit: Arc::new(RateLimit::new(JOIN_BURST, JOIN_EVERY)),
            bursts: Default::default(),
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
        .layer(axum::extract::DefaultBodyLimit::max(body::OBJECT_LIMIT))
        .layer(middleware::from_fn(agent_skew))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate));
    let api_for_web = authed.clone().with_state(state.clone());
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/join",
            axum::routing::post(join::join)
                .layer(axum::extract::DefaultBodyLimit::max(body::JOIN_LIMIT)),
        )
        .merge(authed)
        .merge(crate::vnc::ticket_routes())
        .merge(crate::web::routes(state.clone(), api_for_web))
        .fallback(|| async { ApiError::not_found("no such path") })
        .layer(middleware::map_response(status_errors))
        .with_state(state)
}

/// The peer of a request, as an extractor (absent for in-process calls).
pub type Peer = Option<axum::Extension<ConnectInfo<SocketAddr>>>;

/// The client's address as the connection shows it (never a header a client could set);
/// unspecified for in-process calls.
pub fn peer_ip(p: &Peer) -> IpAddr {
    p.as_ref()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.0.ip())
}

/// Errors that axum's extractors answer in plain text (a bad query, a body over its limit,
/// a wrong method) become `Status` objects with the same code, like every other error.
async fn status_errors(res: Response) -> Response {
    let code = res.status();
    let plain = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|ct| ct.starts_with("text/plain"));
    if !(code.is_client_error() || code.is_server_error()) || !plain {
        return res;
    }
    let (parts, body) = res.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_string();
    let reason = match code {
        StatusCode::BAD_REQUEST => "BadRequest",
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowed",
        StatusCode::PAYLOAD_TOO_LARGE => "RequestEntityTooLarge",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "UnsupportedMediaType",
        StatusCode::UNPROCESSABLE_ENTITY => "Invalid",
        StatusCode::TOO_MANY_REQUESTS => "TooManyRequests",
        c if c.is_server_error() => "InternalError",
        _ => "BadRequest",
    };
    let message = match code {
        StatusCode::PAYLOAD_TOO_LARGE => format!(
            "the request body is too large for this endpoint (objects: at most {} MiB; \
             /join: {} KiB; the login form: {} KiB)",
            body::OBJECT_LIMIT >> 20,
            body::JOIN_LIMIT >> 10,
            body::LOGIN_LIMIT >> 10
        ),
        StatusCode::METHOD_NOT_ALLOWED if text.is_empty() => {
            "this method is not allowed on this path".to_string()
        }
        _ if text.is_empty() => code
            .canonical_reason()
            .unwrap_or("the request failed")
            .to_string(),
        _ => text,
    };
    let mut r = ApiError::new(code, reason, message).into_response();
    for (k, v) in parts.headers.iter() {
        if k == header::RETRY_AFTER || k == header::ALLOW {
            r.headers_mut().insert(k, v.clone());
        }
    }
    r
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
        .route(
            "/apis/edgevirt.io/v1/loginlockouts",
            get(list_lockouts).delete(clear_lockouts),
        )
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
                        if let Some(refused) = read_only_refusal(role, &s.user, &req) {
                            return refused;
                        }
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
                if let Some(refused) = read_only_refusal(role, &user, &req) {
                    return refused;
                }
                req.extensions_mut().insert(Principal { user, role });
                next.run(req).await
            }
            None => ApiError::unauthorized().into_response(),
        },
        Ok(None) => ApiError::unauthorized().into_response(),
        Err(e) => ApiError::internal(e).into_response(),
    }
}

/// A viewer may change nothing: its writes are refused here, before a body is read or
/// parsed, so a viewer's request never gets further than a 403.
fn read_only_refusal(role: Role, user: &str, req: &Request) -> Option<Response> {
    (role == Role::Viewer && !req.method().is_safe()).then(|| {
        ApiError::forbidden(format!(
            "user {user:?} with role Viewer may not change anything ({} {})",
            req.method(),
            req.uri().path()
        ))
        .into_response()
    })
}

#[derive(Debug, Default, serde::Deserialize)]
struct LockoutQuery {
    user: Option<String>,
    address: Option<IpAddr>,
}

/// `GET /apis/edgevirt.io/v1/loginlockouts`: failed dashboard logins and lockouts.
async fn list_lockouts(
    State(st): S,
    axum::Extension(p): axum::Extension<Principal>,
) -> ApiResult<Response> {
    p.require(Access::Admin)?;
    Ok(axum::Json(json!({
        "kind": "LoginLockoutList",
        "apiVersion": "edgevirt.io/v1",
        "items": st.logins.list(),
    }))
    .into_response())
}

/// `DELETE /apis/edgevirt.io/v1/loginlockouts[?user=U][&address=A]`: let them try again.
async fn clear_lockouts(
    State(st): S,
    axum::Extension(p): axum::Extension<Principal>,
    axum::extract::Query(q): axum::extract::Query<LockoutQuery>,
) -> ApiResult<Response> {
    p.require(Access::Admin)?;
    let n = st.logins.clear(q.user.as_deref(), q.address);
    tracing::info!(by = %p.user, user = ?q.user, address = ?q.address, cleared = n, "login lockouts cleared");
    Ok(axum::Json(json!({
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Success",
        "message": format!("cleared {n} login failure records"),
    }))
    .into_response())
}

#[cfg(test)]
mod tests;
