//! Your own account, for every role: change your password (the current one checked as a
//! login is, with the same lockout), your live sessions with when each was last used, and
//! "log out everywhere".

use askama::Template;
use axum::Form;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{Chrome, error_page, render_status};
use crate::http::AppState;
use crate::http::auth;
use crate::http::throttle::{Pool, Refusal, retry_after_secs};
use crate::web::{S, WebUser};

pub struct SessionRow {
    created: String,
    last_used: String,
    expires: String,
    current: bool,
}

#[derive(Template)]
#[template(path = "account.html")]
struct AccountTpl {
    c: Chrome,
    sessions: Vec<SessionRow>,
}

async fn page(
    st: &AppState,
    u: &WebUser,
    headers: &HeaderMap,
    error: Option<String>,
    notice: Option<String>,
    code: StatusCode,
) -> Response {
    let current = auth::cookie(headers, auth::SESSION_COOKIE)
        .map(|id| auth::token_hash(&id))
        .unwrap_or_default();
    let sessions = match st.store.sessions_of(&u.name).await {
        Ok(s) => s,
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let when = |t: i64| {
        chrono::DateTime::from_timestamp(t, 0)
            .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
            .unwrap_or_default()
    };
    let mut c = Chrome::new(u, "Your account");
    c.error = error;
    c.notice = notice;
    render_status(
        code,
        &AccountTpl {
            c,
            sessions: sessions
                .into_iter()
                .map(|s| SessionRow {
                    current: s.hash == current,
                    created: s.created,
                    last_used: s.last_used.unwrap_or_else(|| "-".into()),
                    expires: when(s.expires),
                })
                .collect(),
        },
    )
}

/// `GET /ui/account`
pub async fn account(
    State(st): S,
    Extension(u): Extension<WebUser>,
    headers: HeaderMap,
) -> Response {
    page(&st, &u, &headers, None, None, StatusCode::OK).await
}

/// The longest password taken (argon2 hashes any length; nobody types more).
const MAX_PASSWORD: usize = 1024;

#[derive(Deserialize)]
pub struct PasswordForm {
    #[serde(default)]
    current: String,
    #[serde(default)]
    new: String,
    #[serde(default)]
    again: String,
}

/// `POST /ui/account/password`: a new password for yourself. Every session of yours ends
/// (this one too): you log in again with the new password.
pub async fn change_password(
    State(st): S,
    Extension(u): Extension<WebUser>,
    peer: crate::http::Peer,
    headers: HeaderMap,
    Form(f): Form<PasswordForm>,
) -> Response {
    let refuse = |m: &str, code| {
        let (st, u, headers, m) = (st.clone(), u.clone(), headers.clone(), m.to_string());
        async move { page(&st, &u, &headers, Some(m), None, code).await }
    };
    // Long passwords are refused before anything is hashed or counted as a try.
    if f.new.len() > MAX_PASSWORD || f.current.len() > MAX_PASSWORD {
        return refuse(
            &format!("a password has at most {MAX_PASSWORD} bytes"),
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
    }
    if f.new.chars().count() < 8 {
        return refuse(
            "the new password needs at least 8 characters",
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
    }
    if f.new != f.again {
        return refuse(
            "the new password and its repetition differ",
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
    }
    // The current password is checked as a login is: counted, and locked out the same way.
    let addr = crate::http::peer_ip(&peer);
    let attempt = match st.logins.begin(&u.name, addr) {
        Ok(a) => a,
        Err(Refusal::Locked(wait)) => {
            let mut r = refuse(
                &format!(
                    "too many wrong passwords; try again in {}",
                    crate::types::human_duration(retry_after_secs(wait) as i64)
                ),
                StatusCode::TOO_MANY_REQUESTS,
            )
            .await;
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                retry_after_secs(wait).into(),
            );
            return r;
        }
    };
    let hash = match st.store.user(&u.name).await {
        Ok(Some((h, _))) => h,
        Ok(None) => {
            st.logins.abandon(attempt);
            return error_page(StatusCode::NOT_FOUND, "your user no longer exists");
        }
        Err(e) => {
            st.logins.abandon(attempt);
            return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string());
        }
    };
    let (cur, new) = (f.current.clone(), f.new.clone());
    let checked = Pool::passwords()
        .run(move || auth::verify_password(&cur, &hash).then(|| auth::hash_password(&new)))
        .await;
    let new_hash = match checked {
        Err(_) => {
            st.logins.abandon(attempt);
            return refuse(
                "the server is busy checking other passwords; try again",
                StatusCode::SERVICE_UNAVAILABLE,
            )
            .await;
        }
        Ok(None) => {
            st.logins.finish(attempt, false);
            tracing::warn!(user = %u.name, "password change refused: wrong current password");
            return refuse("the current password is wrong", StatusCode::FORBIDDEN).await;
        }
        Ok(Some(h)) => {
            st.logins.finish(attempt, true);
            h
        }
    };
    match st.store.set_password(&u.name, &new_hash).await {
        Ok(_) => {
            tracing::info!(user = %u.name, "password changed; every session of the user ended");
            Redirect::to("/ui/login?changed=1").into_response()
        }
        Err(e) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

#[derive(Deserialize)]
pub struct Nothing {}

/// `POST /ui/account/logout-everywhere`: end every session of yours, this one too.
pub async fn logout_everywhere(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Form(_): Form<Nothing>,
) -> Response {
    match st.store.delete_sessions_of(&u.name).await {
        Ok(n) => {
            tracing::info!(user = %u.name, sessions = n, "logged out everywhere");
            Redirect::to("/ui/login").into_response()
        }
        Err(e) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}
