//! Users, API tokens, join tokens for new hosts, and login lockouts.

use askama::Template;
use axum::Form;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{Chrome, error_page, render_status};
use crate::http::AppState;
use crate::http::auth::{self, Principal, Role};
use crate::web::{Api, S, WebUser, api_message};

#[derive(Template)]
#[template(path = "admin.html")]
struct AdminTpl {
    c: Chrome,
    users: Vec<crate::store::UserInfo>,
    tokens: Vec<TokenRow>,
    new_token: Option<String>,
    join_tokens: Vec<JoinTokenRow>,
    /// The command a new host runs, with a join token just made (shown once).
    join_command: Option<String>,
    lockouts: Vec<crate::http::throttle::Lockout>,
}

pub struct TokenRow {
    id: String,
    user: String,
    role: String,
    description: String,
    created: String,
    expires: String,
    last_used: String,
    /// A node agent's credential: revoked with its node, not from this list.
    agent: bool,
}

pub struct JoinTokenRow {
    id: String,
    state: &'static str,
    expires: String,
    used_by: String,
    description: String,
}

/// What the page says after a change: at most one of each.
#[derive(Default)]
struct Said {
    error: Option<String>,
    notice: Option<String>,
    new_token: Option<String>,
    join_command: Option<String>,
}

impl Said {
    fn error(m: impl Into<String>) -> Self {
        Said {
            error: Some(m.into()),
            ..Said::default()
        }
    }
}

fn require_admin(u: &WebUser) -> Result<(), Response> {
    if u.role == Role::Admin {
        Ok(())
    } else {
        Err(error_page(
            StatusCode::FORBIDDEN,
            "only administrators manage users and tokens",
        ))
    }
}

async fn admin_page(st: &AppState, u: &WebUser, said: Said, code: StatusCode) -> Response {
    if let Err(r) = require_admin(u) {
        return r;
    }
    let (users, tokens, joins) =
        match tokio::try_join!(st.store.users(), st.store.tokens(), st.store.join_tokens()) {
            Ok(x) => x,
            Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
    let mut c = Chrome::new(u, "Users and tokens");
    c.error = said.error;
    c.notice = said.notice;
    let now = chrono::Utc::now().timestamp();
    let join_tokens = joins
        .into_iter()
        .rev()
        .map(|t| JoinTokenRow {
            state: match (&t.used_by, t.expires <= now) {
                (Some(_), _) => "used",
                (None, true) => "expired",
                (None, false) => "valid",
            },
            expires: chrono::DateTime::from_timestamp(t.expires, 0)
                .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
                .unwrap_or_default(),
            used_by: t.used_by.unwrap_or_else(|| "-".into()),
            description: t.description,
            id: t.id,
        })
        .collect();
    let tokens = tokens
        .into_iter()
        .map(|t| TokenRow {
            agent: t.role == "agent",
            expires: match t.expires {
                None => "never".into(),
                Some(e) if e < now => "expired".into(),
                Some(e) => chrono::DateTime::from_timestamp(e, 0)
                    .map(|t| t.format("%Y-%m-%d").to_string())
                    .unwrap_or_default(),
            },
            last_used: t.last_used.unwrap_or_else(|| "never".into()),
            id: t.id,
            user: t.user,
            role: t.role,
            description: t.description,
            created: t.created,
        })
        .collect();
    render_status(
        code,
        &AdminTpl {
            c,
            users,
            tokens,
            new_token: said.new_token,
            join_tokens,
            join_command: said.join_command,
            lockouts: st.logins.list(),
        },
    )
}

pub async fn admin(State(st): S, Extension(u): Extension<WebUser>) -> Response {
    admin_page(&st, &u, Said::default(), StatusCode::OK).await
}

#[derive(Deserialize)]
pub struct UserForm {
    name: String,
    role: String,
    password: String,
}

pub async fn create_user(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Form(f): Form<UserForm>,
) -> Response {
    if let Err(r) = require_admin(&u) {
        return r;
    }
    let bad = |m: String| (StatusCode::UNPROCESSABLE_ENTITY, m);
    let result = if crate::types::check_name("user", &f.name).is_err() {
        Err(bad(format!(
            "{:?} is not a valid user name (lower-case letters, digits and '-')",
            f.name
        )))
    } else if !matches!(f.role.as_str(), "admin" | "operator" | "viewer") {
        Err(bad(format!(
            "no role {:?} (admin, operator or viewer)",
            f.role
        )))
    } else if f.password.chars().count() < 8 {
        Err(bad("the password needs at least 8 characters".into()))
    } else {
        let p = f.password.clone();
        let hash = tokio::task::spawn_blocking(move || auth::hash_password(&p))
            .await
            .unwrap_or_default();
        match st.store.create_user(&f.name, &hash, &f.role).await {
            Ok(true) => Ok(()),
            Ok(false) => Err((
                StatusCode::CONFLICT,
                format!("user {:?} exists already", f.name),
            )),
            Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        }
    };
    match result {
        Ok(()) => {
            tracing::info!(admin = %u.name, user = %f.name, role = %f.role, "user created");
            admin_page(
                &st,
                &u,
                Said {
                    notice: Some(format!("User {} created.", f.name)),
                    ..Said::default()
                },
                StatusCode::OK,
            )
            .await
        }
        Err((code, m)) => admin_page(&st, &u, Said::error(m), code).await,
    }
}

pub async fn delete_user(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Path(user): Path<String>,
) -> Response {
    if let Err(r) = require_admin(&u) {
        return r;
    }
    if user == u.name {
        return admin_page(
            &st,
            &u,
            Said::error("you cannot delete yourself"),
            StatusCode::CONFLICT,
        )
        .await;
    }
    match st.store.delete_user(&user).await {
        Ok(true) => {
            tracing::info!(admin = %u.name, %user, "user deleted");
            Redirect::to("/ui/admin").into_response()
        }
        Ok(false) => {
            admin_page(
                &st,
                &u,
                Said::error(format!("no user {user:?}")),
                StatusCode::NOT_FOUND,
            )
            .await
        }
        Err(e) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

#[derive(Deserialize)]
pub struct TokenForm {
    user: String,
    #[serde(default)]
    description: String,
    /// Days until it expires; empty or 0: never.
    #[serde(default)]
    days: String,
}

pub async fn create_token(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Form(f): Form<TokenForm>,
) -> Response {
    if let Err(r) = require_admin(&u) {
        return r;
    }
    let role = match st.store.user(&f.user).await {
        Ok(Some((_, role))) => role,
        Ok(None) => {
            return admin_page(
                &st,
                &u,
                Said::error(format!("no user {:?}", f.user)),
                StatusCode::NOT_FOUND,
            )
            .await;
        }
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let expires = match f.days.trim() {
        "" | "0" => None,
        d => match d.parse::<i64>() {
            Ok(d) if (1..=3650).contains(&d) => Some(chrono::Utc::now().timestamp() + d * 86_400),
            _ => {
                return admin_page(
                    &st,
                    &u,
                    Said::error(format!(
                        "a token expires after 1 to 3650 days (or never), not {:?}",
                        f.days
                    )),
                    StatusCode::UNPROCESSABLE_ENTITY,
                )
                .await;
            }
        },
    };
    let secret = auth::random_secret(24);
    match st
        .store
        .add_expiring_token(
            &auth::token_hash(&secret),
            &f.user,
            &role,
            f.description.trim(),
            expires,
        )
        .await
    {
        Ok(id) => {
            tracing::info!(admin = %u.name, user = %f.user, token = %id, "API token created");
            admin_page(
                &st,
                &u,
                Said {
                    new_token: Some(secret),
                    ..Said::default()
                },
                StatusCode::OK,
            )
            .await
        }
        Err(e) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

#[derive(Deserialize)]
pub struct ClearLockoutForm {
    #[serde(default)]
    user: String,
    #[serde(default)]
    address: String,
}

/// Clear failed logins: one user's and/or one address's, or all when both are empty.
pub async fn clear_lockouts(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Form(f): Form<ClearLockoutForm>,
) -> Response {
    if let Err(r) = require_admin(&u) {
        return r;
    }
    let user = Some(f.user.as_str()).filter(|s| !s.is_empty());
    let addr = match f.address.as_str() {
        "" => None,
        a => match a.parse() {
            Ok(ip) => Some(ip),
            Err(_) => {
                return admin_page(
                    &st,
                    &u,
                    Said::error(format!("{a:?} is not an IP address")),
                    StatusCode::UNPROCESSABLE_ENTITY,
                )
                .await;
            }
        },
    };
    let n = st.logins.clear(user, addr);
    tracing::info!(admin = %u.name, user = ?user, address = ?addr, cleared = n, "login lockouts cleared");
    Redirect::to("/ui/admin").into_response()
}

pub async fn delete_token(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = require_admin(&u) {
        return r;
    }
    // An agent's credential goes with its node: revoking it by itself would leave a node
    // that can no longer report, which is never what a click on this page means.
    match st.store.tokens().await {
        Ok(all) if all.iter().any(|t| t.id == id && t.role == "agent") => {
            return admin_page(
                &st,
                &u,
                Said::error(
                    "that is a node agent's credential: it is revoked by deleting the node \
                     (on its page, or `edgevirt node delete`)",
                ),
                StatusCode::CONFLICT,
            )
            .await;
        }
        Ok(_) => {}
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
    match st.store.delete_token(&id).await {
        Ok(true) => {
            tracing::info!(admin = %u.name, token = %id, "API token revoked");
            Redirect::to("/ui/admin").into_response()
        }
        Ok(false) => {
            admin_page(
                &st,
                &u,
                Said::error(format!("no token {id:?}")),
                StatusCode::NOT_FOUND,
            )
            .await
        }
        Err(e) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

#[derive(Deserialize)]
pub struct JoinTokenForm {
    #[serde(default)]
    description: String,
    /// How long the token stays usable, in hours.
    #[serde(default)]
    hours: String,
}

/// `POST /ui/admin/jointokens`: a join token for a new host, made through the API (which
/// refuses on a plain-HTTP controller), and the command to run on that host.
pub async fn create_join_token(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Form(f): Form<JoinTokenForm>,
) -> Response {
    if let Err(r) = require_admin(&u) {
        return r;
    }
    let hours: i64 = match f.hours.trim().parse() {
        Ok(h) if (1..=168).contains(&h) => h,
        _ => {
            return admin_page(
                &st,
                &u,
                Said::error(format!(
                    "a join token is valid for 1 to 168 hours, not {:?}",
                    f.hours
                )),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await;
        }
    };
    let body = serde_json::json!({"ttlSeconds": hours * 3600, "description": f.description.trim()});
    let (code, v) = api
        .call(
            &p,
            Method::POST,
            "/apis/edgevirt.io/v1/jointokens",
            "application/json",
            body.to_string(),
        )
        .await;
    if !code.is_success() {
        return admin_page(&st, &u, Said::error(api_message(&v)), code).await;
    }
    let token = v["token"].as_str().unwrap_or_default();
    // The address this administrator reached the dashboard at: the controller, as the new
    // host will reach it (join tokens exist only on a TLS controller). HTTP/2 names it in
    // the request's authority, HTTP/1.1 in the Host header.
    let host = uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| {
            headers
                .get(axum::http::header::HOST)
                .and_then(|h| h.to_str().ok())
        })
        .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_graphic()))
        .unwrap_or("CONTROLLER:PORT");
    admin_page(
        &st,
        &u,
        Said {
            notice: Some(format!(
                "Join token {} created, usable once until {}.",
                v["id"].as_str().unwrap_or_default(),
                v["expires"].as_str().unwrap_or_default()
            )),
            join_command: Some(format!(
                "edgevirt serve --role agent --controller https://{host} --join-token {token}"
            )),
            ..Said::default()
        },
        StatusCode::OK,
    )
    .await
}

/// `POST /ui/admin/jointokens/{id}/delete`
pub async fn delete_join_token(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = require_admin(&u) {
        return r;
    }
    let uri = format!("/apis/edgevirt.io/v1/jointokens/{}", super::url_encode(&id));
    let (code, v) = api
        .call(&p, Method::DELETE, &uri, "application/json", "{}")
        .await;
    if !code.is_success() {
        return admin_page(&st, &u, Said::error(api_message(&v)), code).await;
    }
    Redirect::to("/ui/admin#join").into_response()
}
