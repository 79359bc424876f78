//! The dashboard: server-rendered askama pages under `/ui`, a little JavaScript, assets
//! embedded with rust-embed (our own from `web/static`, noVNC, xterm.js and uPlot from their
//! pinned npm packages in `web/node_modules`, fetched by build.rs), so the binary needs no
//! files beside it.
//!
//! Browsers log in with a username and password and get a session cookie (HttpOnly,
//! SameSite=Strict, Secure over TLS; a new id at every login). Every form carries the
//! session's CSRF token, checked here before any handler runs; scripts send it as
//! `X-CSRF-Token` to the API. Every response carries a Content-Security-Policy.
//!
//! Forms that change things go through the API in-process (same admission, same checks, same
//! log lines as `kubectl` or the CLI), with the session's principal.

mod pages;

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{FromRef, Path, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use rust_embed::RustEmbed;
use serde_json::Value;
use tower::ServiceExt;

use crate::http::auth::{self, Principal, Role};
use crate::vnc::VncState;

#[derive(RustEmbed)]
#[folder = "web/static/"]
struct Static;

#[derive(RustEmbed)]
#[folder = "web/node_modules/@novnc/novnc/"]
#[include = "core/**/*.js"]
#[include = "vendor/pako/**/*.js"]
#[include = "LICENSE.txt"]
struct NoVnc;

#[derive(RustEmbed)]
#[folder = "web/node_modules/@xterm/xterm/"]
#[include = "lib/xterm.mjs"]
#[include = "css/xterm.css"]
#[include = "LICENSE"]
struct Xterm;

/// uPlot draws the graphs: small (50 KiB), no dependencies, canvas-based.
#[derive(RustEmbed)]
#[folder = "web/node_modules/uplot/"]
#[include = "dist/uPlot.iife.min.js"]
#[include = "dist/uPlot.min.css"]
#[include = "LICENSE"]
struct UPlot;

/// The session of a logged-in browser, as pages see it.
#[derive(Clone, Debug)]
pub struct WebUser {
    pub name: String,
    pub role: Role,
    pub csrf: String,
}

/// The API router, called in-process by form handlers.
#[derive(Clone)]
struct Api(Router);

/// The dashboard shows who watches a VM's console, so it takes the console proxy's state
/// (which derefs to the handlers' `AppState`).
type S = State<Arc<VncState>>;

/// Strict by default; the serial console page also allows the inline styles xterm.js writes.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; \
                   form-action 'self'";
const CSP_XTERM: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                         img-src 'self' data:; connect-src 'self'; object-src 'none'; \
                         base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

/// Dashboard routes. `api` is the authenticated API router the forms call through.
pub fn routes<St>(state: Arc<VncState>, api: Router) -> Router<St>
where
    Arc<VncState>: FromRef<St>,
    St: Clone + Send + Sync + 'static,
{
    let private = Router::new()
        .route("/ui/", get(pages::overview))
        .route("/ui/vms", get(pages::vm_list))
        .route("/ui/vms/rows", get(pages::vm_rows))
        .route(
            "/ui/vms/new",
            get(pages::new_vm).post(pages::create_from_form),
        )
        .route("/ui/vms/yaml", post(pages::create_from_yaml))
        .route("/ui/vms/{ns}/{name}", get(pages::vm_detail))
        .route(
            "/ui/vms/{ns}/{name}/status",
            get(pages::vm_status).layer(middleware::from_fn(unchanged_fragment)),
        )
        .route("/ui/vms/{ns}/{name}/graphs", get(pages::vm_graphs))
        .route("/ui/nodes/{name}", get(pages::node_page))
        .route("/ui/nodes/{name}/graphs", get(pages::node_graphs))
        .route(
            "/ui/nodes/{name}/vms",
            get(pages::node_vms_fragment).layer(middleware::from_fn(unchanged_fragment)),
        )
        .route("/ui/nodes/{name}/action", post(pages::node_action))
        .route("/ui/activity", get(pages::activity))
        .route("/ui/images", get(pages::images))
        .route("/ui/storage", get(pages::storage))
        .route("/ui/backups", get(pages::backups))
        .route("/ui/backups/schedules", post(pages::create_schedule))
        .route(
            "/ui/backups/schedules/{ns}/{name}/suspend",
            post(pages::suspend_schedule),
        )
        .route(
            "/ui/backups/schedules/{ns}/{name}/delete",
            post(pages::delete_schedule),
        )
        .route("/ui/images/{name}/delete", post(pages::delete_image))
        .route("/ui/networks", get(pages::networks))
        .route(
            "/ui/vms/{ns}/{name}/edit",
            get(pages::edit_vm).post(pages::save_vm),
        )
        .route("/ui/vms/{ns}/{name}/action", post(pages::vm_action))
        .route("/ui/vms/{ns}/{name}/migrate", post(pages::vm_migrate))
        .route("/ui/vms/{ns}/{name}/eject", post(pages::eject))
        .route("/ui/vms/{ns}/{name}/grow", post(pages::grow))
        .route("/ui/vms/{ns}/{name}/adddisk", post(pages::add_disk))
        .route("/ui/vms/{ns}/{name}/detach", post(pages::detach))
        .route("/ui/vms/{ns}/{name}/snapshot", post(pages::take_snapshot))
        .route("/ui/vms/{ns}/{name}/backup", post(pages::back_up_now))
        .route(
            "/ui/vms/{ns}/{name}/deletebackup",
            post(pages::delete_backup),
        )
        .route(
            "/ui/vms/{ns}/{name}/verifybackup",
            post(pages::verify_backup),
        )
        .route(
            "/ui/vms/{ns}/{name}/restorebackup",
            post(pages::restore_backup),
        )
        .route("/ui/vms/{ns}/{name}/restore", post(pages::restore_snapshot))
        .route(
            "/ui/vms/{ns}/{name}/deletesnapshot",
            post(pages::delete_snapshot),
        )
        .route("/ui/vms/{ns}/{name}/console", get(pages::console))
        .route("/ui/vms/{ns}/{name}/serial", get(pages::serial))
        .route("/ui/admin", get(pages::admin))
        .route("/ui/admin/users", post(pages::create_user))
        .route("/ui/admin/users/{user}/delete", post(pages::delete_user))
        .route("/ui/admin/tokens", post(pages::create_token))
        .route("/ui/admin/tokens/{id}/delete", post(pages::delete_token))
        .route("/ui/admin/lockouts/clear", post(pages::clear_lockouts))
        .route("/ui/admin/jointokens", post(pages::create_join_token))
        .route(
            "/ui/admin/jointokens/{id}/delete",
            post(pages::delete_join_token),
        )
        .route("/ui/logout", post(pages::logout))
        .route("/ui/account", get(pages::account))
        .route("/ui/account/password", post(pages::change_password))
        .route(
            "/ui/account/logout-everywhere",
            post(pages::logout_everywhere),
        )
        .layer(middleware::from_fn_with_state(state, require_session))
        .layer(axum::Extension(Api(api)));
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route(
            "/ui/login",
            get(pages::login_page)
                .post(pages::login)
                .layer(axum::extract::DefaultBodyLimit::max(
                    crate::http::body::LOGIN_LIMIT,
                )),
        )
        .route("/ui/static/{*path}", get(static_asset))
        .route("/ui/vendor/novnc/{*path}", get(novnc_asset))
        .route("/ui/vendor/xterm/{*path}", get(xterm_asset))
        .route("/ui/vendor/uplot/{*path}", get(uplot_asset))
        .merge(private)
        .layer(middleware::map_response(security_headers))
}

async fn security_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    res
}

/// Most a form may carry (pasted YAML included).
const FORM_LIMIT: usize = 2 << 20;

/// Pages need a session: without one, GETs go to the login page and the rest get 401.
/// Every POST must carry the session's CSRF token in its `csrf` form field.
async fn require_session(State(st): S, req: Request, next: Next) -> Response {
    let session = match auth::session_of(&st.store, req.headers()).await {
        Ok(s) => s,
        Err(e) => return pages::error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let Some(session) = session else {
        if req.method() == Method::GET {
            let next_path = req.uri().path().to_string();
            let to = format!("/ui/login?next={}", pages::url_encode(&next_path));
            return Redirect::to(&to).into_response();
        }
        return pages::error_page(StatusCode::UNAUTHORIZED, "you are not logged in");
    };
    let Some(role) = Role::parse(&session.role) else {
        return pages::error_page(StatusCode::UNAUTHORIZED, "the session has an unknown role");
    };
    let (mut parts, body) = req.into_parts();
    let body = if parts.method == Method::POST {
        let bytes = match axum::body::to_bytes(body, FORM_LIMIT).await {
            Ok(b) => b,
            Err(_) => {
                return pages::error_page(StatusCode::PAYLOAD_TOO_LARGE, "the form is too large");
            }
        };
        let sent = form_field(&bytes, "csrf");
        if !sent.is_some_and(|c| auth::same_secret(&c, &session.csrf)) {
            tracing::warn!(user = %session.user, path = %parts.uri.path(), "form refused: missing or wrong CSRF token");
            return pages::error_page(
                StatusCode::FORBIDDEN,
                "the form's CSRF token is missing or wrong; reload the page and try again",
            );
        }
        Body::from(bytes)
    } else {
        body
    };
    crate::http::conn::authenticated(&parts.extensions);
    parts.extensions.insert(Principal {
        user: session.user.clone(),
        role,
    });
    parts.extensions.insert(WebUser {
        name: session.user,
        role,
        csrf: session.csrf,
    });
    next.run(Request::from_parts(parts, body)).await
}

fn form_field(body: &[u8], name: &str) -> Option<String> {
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

fn asset<E: RustEmbed>(path: &str) -> Response {
    match E::get(path) {
        Some(f) => {
            let mime = mime_guess::from_path(path).first_or_octet_stream();
            (
                [
                    (header::CONTENT_TYPE, mime.as_ref().to_string()),
                    (header::CACHE_CONTROL, "public, max-age=3600".to_string()),
                ],
                f.data,
            )
                .into_response()
        }
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}

async fn static_asset(Path(path): Path<String>) -> Response {
    asset::<Static>(&path)
}

async fn novnc_asset(Path(path): Path<String>) -> Response {
    asset::<NoVnc>(&path)
}

async fn xterm_asset(Path(path): Path<String>) -> Response {
    asset::<Xterm>(&path)
}

async fn uplot_asset(Path(path): Path<String>) -> Response {
    asset::<UPlot>(&path)
}

/// A polled fragment the page already has is a 304 with no body: its ETag is a hash of
/// the HTML, and the page's script sends the last one back in `If-None-Match`.
async fn unchanged_fragment(req: Request, next: Next) -> Response {
    use std::hash::{Hash, Hasher};
    let had = req.headers().get(header::IF_NONE_MATCH).cloned();
    let res = next.run(req).await;
    if res.status() != StatusCode::OK {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 16 << 20).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let mut h = std::hash::DefaultHasher::new();
    bytes.hash(&mut h);
    let tag = HeaderValue::from_str(&format!("\"{:016x}\"", h.finish()))
        .expect("hex is a valid header value");
    parts
        .headers
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if had.as_ref() == Some(&tag) {
        let mut r = StatusCode::NOT_MODIFIED.into_response();
        r.headers_mut().extend([(header::ETAG, tag)]);
        return r;
    }
    parts.headers.insert(header::ETAG, tag);
    Response::from_parts(parts, Body::from(bytes))
}

impl Api {
    /// Call the API as `p`; the answer's status and JSON body (a `Status` on errors).
    async fn call(
        &self,
        p: &Principal,
        method: Method,
        uri: &str,
        content_type: &str,
        body: impl Into<Bytes>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from(body.into()))
            .expect("a request from valid parts");
        req.extensions_mut().insert(p.clone());
        let res = match self.0.clone().oneshot(req).await {
            Ok(r) => r,
            Err(e) => match e {},
        };
        let status = res.status();
        let bytes = axum::body::to_bytes(res.into_body(), 16 << 20)
            .await
            .unwrap_or_default();
        let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, v)
    }
}

/// The message of an API error answer.
fn api_message(v: &Value) -> String {
    v["message"]
        .as_str()
        .unwrap_or("the request failed")
        .to_string()
}
