//! The HTTP API: Kubernetes-style paths for `kubevirt.io/v1` and `edgevirt.io/v1` kinds,
//! KubeVirt's subresources, discovery, OpenAPI, and edgevirt's own endpoints (join tokens,
//! the install strategy, login lockouts). [`routes`] declares the authenticated paths in
//! one table and [`public_routes`] the one path without a login (`/join`); the HTTP shell
//! (`crate::shell`) mounts them behind authentication. Handlers parse, check access, and go
//! through the store.

pub mod admission;
mod discovery;
mod hotplug;
mod images;
pub mod join;
mod openapi;
mod resources;
mod scope;
mod strategy;
mod subresources;
mod table;

use std::net::IpAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRef, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::json;

use crate::http::AppState;
use crate::http::auth::{self, Principal};
use crate::http::error::{ApiError, ApiResult};
use axum::middleware::from_fn;

type S = State<Arc<AppState>>;

/// The Kubernetes-style API paths, all behind authentication.
pub fn routes<St>() -> Router<St>
where
    Arc<AppState>: FromRef<St>,
    St: Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/readyz", get(readyz))
        // Prometheus scrapes with a bearer token; a viewer's is enough.
        .route("/metrics", get(metrics))
        .route("/version", get(version))
        .route("/apis/edgevirt.io/v1/info", get(info))
        // Administrators only: join tokens, the desired version, login lockouts.
        .route(
            "/apis/edgevirt.io/v1/jointokens",
            get(join::list_tokens)
                .post(join::create_token)
                .route_layer(from_fn(auth::admins)),
        )
        .route(
            "/apis/edgevirt.io/v1/jointokens/{id}",
            axum::routing::delete(join::delete_token).route_layer(from_fn(auth::admins)),
        )
        .route(
            "/apis/edgevirt.io/v1/installstrategy/version",
            put(strategy::put_version).route_layer(from_fn(auth::admins)),
        )
        .route(
            "/apis/edgevirt.io/v1/loginlockouts",
            get(list_lockouts)
                .delete(clear_lockouts)
                .route_layer(from_fn(auth::admins)),
        )
        // Any logged-in principal.
        .route(
            "/apis/edgevirt.io/v1/installstrategy",
            get(strategy::get_strategy),
        )
        .route("/apis/edgevirt.io/v1/rollout", get(strategy::get_rollout))
        .route("/api", get(discovery::core))
        .route("/api/{version}", get(discovery::core_version))
        .route("/apis", get(discovery::groups))
        .route("/apis/{group}/{version}", get(discovery::group_version))
        .route("/openapi/v2", get(openapi::v2))
        .route("/openapi/v3", get(openapi::v3_index))
        .route("/openapi/v3/{*path}", get(openapi::v3_group))
        // Every resource path goes to one handler, which parses the path and the method.
        .route("/api/{version}/{plural}", collection())
        .route("/api/{version}/{plural}/{name}", object())
        .route("/api/{version}/namespaces/{ns}/{plural}", collection())
        .route("/api/{version}/namespaces/{ns}/{plural}/{name}", object())
        .route("/apis/{group}/{version}/{plural}", collection())
        .route(
            "/apis/{group}/{version}/namespaces/{ns}/{plural}",
            collection(),
        )
        .route(
            "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}",
            object(),
        )
        .route("/apis/{group}/{version}/{plural}/{name}", object())
        .route(
            "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}/{sub}",
            put(subresources::namespaced)
                .patch(subresources::namespaced)
                .get(subresources::namespaced),
        )
        .route(
            "/apis/{group}/{version}/{plural}/{name}/{sub}",
            put(subresources::cluster)
                .patch(subresources::cluster)
                .get(subresources::cluster),
        )
}

/// The methods of a collection path (list, watch, create).
fn collection<St>() -> axum::routing::MethodRouter<St>
where
    Arc<AppState>: FromRef<St>,
    St: Clone + Send + Sync + 'static,
{
    get(resources::resource).post(resources::resource)
}

/// The methods of one object's path.
fn object<St>() -> axum::routing::MethodRouter<St>
where
    Arc<AppState>: FromRef<St>,
    St: Clone + Send + Sync + 'static,
{
    get(resources::resource)
        .put(resources::resource)
        .patch(resources::resource)
        .delete(resources::resource)
}

/// The paths that need no login: an agent's `POST /join` with a join token.
pub fn public_routes<St>() -> Router<St>
where
    Arc<AppState>: FromRef<St>,
    St: Clone + Send + Sync + 'static,
{
    Router::new().route(
        "/join",
        axum::routing::post(join::join).layer(axum::extract::DefaultBodyLimit::max(
            crate::http::body::JOIN_LIMIT,
        )),
    )
}

async fn readyz(State(st): S) -> Response {
    match st.store.current_rv().await {
        Ok(_) => "ok".into_response(),
        Err(e) => ApiError::internal(e).into_response(),
    }
}

/// `GET /metrics`: the site's metrics in Prometheus' text format.
async fn metrics(State(st): S) -> ApiResult<Response> {
    let text = crate::metrics::render(&st.store, &st.metrics, &st.data_dir)
        .await
        .map_err(|e| match e {
            crate::metrics::RenderError::Store(e) => ApiError::from(e),
            e => ApiError::internal(e),
        })?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
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

#[derive(Debug, Default, serde::Deserialize)]
struct LockoutQuery {
    user: Option<String>,
    address: Option<IpAddr>,
}

/// `GET /apis/edgevirt.io/v1/loginlockouts`: failed dashboard logins and lockouts.
async fn list_lockouts(State(st): S) -> ApiResult<Response> {
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
