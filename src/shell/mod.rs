//! The HTTP shell: one router on one port for the API, the console proxy and the dashboard,
//! composed from the routes each of them exports, behind one authentication (bearer token,
//! or session cookie with its CSRF token) and one agent version-skew check; errors that axum
//! answers in plain text become `Status` objects here.

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRef, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::http::auth::{self, Principal, Role};
use crate::http::error::ApiError;
use crate::http::{body, conn};
use crate::vnc::VncState;
use crate::{api, vnc, web};

pub use crate::http::{AppState, LocalNode};

/// The router's state: the handlers' [`AppState`] and the console proxy's registries on top
/// of it; each layer's handlers take the part they need.
#[derive(Clone)]
struct Shared {
    app: Arc<AppState>,
    vnc: Arc<VncState>,
}

impl FromRef<Shared> for Arc<AppState> {
    fn from_ref(s: &Shared) -> Self {
        s.app.clone()
    }
}

impl FromRef<Shared> for Arc<VncState> {
    fn from_ref(s: &Shared) -> Self {
        s.vnc.clone()
    }
}

type S = State<Arc<AppState>>;

/// Everything served on the one port: API, console proxy, dashboard.
pub fn router(state: AppState) -> Router {
    let app = Arc::new(state);
    let shared = Shared {
        vnc: Arc::new(VncState::new(app.clone())),
        app: app.clone(),
    };
    let authed = api::routes()
        .merge(vnc::authed_routes())
        .layer(axum::extract::DefaultBodyLimit::max(body::OBJECT_LIMIT))
        .layer(middleware::from_fn(agent_skew))
        .layer(middleware::from_fn_with_state(app, authenticate));
    let api_for_web = authed.clone().with_state(shared.clone());
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .merge(api::public_routes())
        .merge(authed)
        .merge(vnc::ticket_routes())
        .merge(web::routes(shared.vnc.clone(), api_for_web))
        .fallback(|| async { ApiError::not_found("no such path") })
        .layer(middleware::map_response(status_errors))
        .layer(middleware::from_fn(observe::observe))
        .with_state(shared)
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
    if let Some(p) = req.extensions().get::<Principal>() {
        let user = p.user.clone();
        return as_actor(user, next, req).await;
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
                        req.extensions_mut().insert(Principal {
                            user: s.user.clone(),
                            role,
                        });
                        conn::authenticated(req.extensions());
                        as_actor(s.user, next, req).await
                    }
                    None => ApiError::unauthorized().into_response(),
                }
            }
            Ok(None) => ApiError::unauthorized().into_response(),
            Err(e) => ApiError::internal(e).into_response(),
        };
    };
    let hash = auth::token_hash(token);
    match st.store.token(&hash).await {
        Ok(Some((user, role))) => match Role::parse(&role) {
            Some(role) => {
                if let Err(e) = st.store.touch_token(&hash).await {
                    tracing::debug!(error = %e, "noting a token's use failed");
                }
                if let Some(refused) = read_only_refusal(role, &user, &req) {
                    return refused;
                }
                req.extensions_mut().insert(Principal {
                    user: user.clone(),
                    role,
                });
                conn::authenticated(req.extensions());
                as_actor(user, next, req).await
            }
            None => ApiError::unauthorized().into_response(),
        },
        Ok(None) => ApiError::unauthorized().into_response(),
        Err(e) => ApiError::internal(e).into_response(),
    }
}

/// Run the request with `user` as the actor of every change it records (the objects'
/// history names them).
async fn as_actor(user: String, next: Next, req: Request) -> Response {
    crate::store::events::ACTOR.scope(user, next.run(req)).await
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

pub mod listen;
mod observe;
#[cfg(test)]
mod tests;
