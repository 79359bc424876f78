//! Users, API tokens and login lockouts.

use askama::Template;
use axum::Form;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{Chrome, error_page, render_status};
use crate::http::AppState;
use crate::http::auth::{self, Role};
use crate::web::{S, WebUser};

#[derive(Template)]
#[template(path = "admin.html")]
struct AdminTpl {
    c: Chrome,
    users: Vec<crate::store::UserInfo>,
    tokens: Vec<crate::store::TokenInfo>,
    new_token: Option<String>,
    lockouts: Vec<crate::http::throttle::Lockout>,
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

async fn admin_page(
    st: &AppState,
    u: &WebUser,
    error: Option<String>,
    notice: Option<String>,
    new_token: Option<String>,
    code: StatusCode,
) -> Response {
    if let Err(r) = require_admin(u) {
        return r;
    }
    let (users, tokens) = match tokio::try_join!(st.store.users(), st.store.tokens()) {
        Ok(x) => x,
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let mut c = Chrome::new(u, "Users and tokens");
    c.error = error;
    c.notice = notice;
    render_status(
        code,
        &AdminTpl {
            c,
            users,
            tokens,
            new_token,
            lockouts: st.logins.list(),
        },
    )
}

pub async fn admin(State(st): S, Extension(u): Extension<WebUser>) -> Response {
    admin_page(&st, &u, None, None, None, StatusCode::OK).await
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
                None,
                Some(format!("User {} created.", f.name)),
                None,
                StatusCode::OK,
            )
            .await
        }
        Err((code, m)) => admin_page(&st, &u, Some(m), None, None, code).await,
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
            Some("you cannot delete yourself".into()),
            None,
            None,
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
                Some(format!("no user {user:?}")),
                None,
                None,
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
                Some(format!("no user {:?}", f.user)),
                None,
                None,
                StatusCode::NOT_FOUND,
            )
            .await;
        }
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let secret = auth::random_secret(24);
    match st
        .store
        .add_token(
            &auth::token_hash(&secret),
            &f.user,
            &role,
            f.description.trim(),
        )
        .await
    {
        Ok(id) => {
            tracing::info!(admin = %u.name, user = %f.user, token = %id, "API token created");
            admin_page(&st, &u, None, None, Some(secret), StatusCode::OK).await
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
                    Some(format!("{a:?} is not an IP address")),
                    None,
                    None,
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
    match st.store.delete_token(&id).await {
        Ok(true) => {
            tracing::info!(admin = %u.name, token = %id, "API token revoked");
            Redirect::to("/ui/admin").into_response()
        }
        Ok(false) => {
            admin_page(
                &st,
                &u,
                Some(format!("no token {id:?}")),
                None,
                None,
                StatusCode::NOT_FOUND,
            )
            .await
        }
        Err(e) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}
