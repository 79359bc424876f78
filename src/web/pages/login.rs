//! Logging in and out of the dashboard.

use askama::Template;
use axum::Form;
use axum::extract::{Extension, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{error_page, render_status};
use crate::http::AppState;
use crate::http::auth::{self};
use crate::web::{S, WebUser};

#[derive(Template)]
#[template(path = "login.html")]
struct LoginTpl {
    csrf: String,
    next: String,
    username: String,
    error: Option<String>,
    notice: Option<&'static str>,
}

/// Before login there is no session, so the login form's CSRF token is a double-submit
/// cookie: the form must send the value the cookie holds.
const PRELOGIN_COOKIE: &str = "edgevirt_prelogin";

fn cookie_header(st: &AppState, name: &str, value: &str, max_age: Option<i64>) -> HeaderValue {
    let mut c = cookie::Cookie::build((name.to_string(), value.to_string()))
        .path("/")
        .http_only(true)
        .same_site(cookie::SameSite::Strict)
        .secure(st.tls);
    if let Some(a) = max_age {
        c = c.max_age(cookie::time::Duration::seconds(a));
    }
    HeaderValue::from_str(&c.build().to_string()).expect("cookie values are hex")
}

#[derive(Deserialize, Default)]
pub struct LoginQuery {
    #[serde(default)]
    next: String,
    /// After a password change (every session ended).
    #[serde(default)]
    changed: Option<String>,
}

fn safe_next(next: &str) -> String {
    // Only paths of the dashboard: never another site.
    if next.starts_with("/ui/") && !next.starts_with("//") {
        next.to_string()
    } else {
        "/ui/".into()
    }
}

fn login_form(
    st: &AppState,
    next: &str,
    username: &str,
    error: Option<String>,
    code: StatusCode,
) -> Response {
    login_form_with(st, next, username, error, None, code)
}

fn login_form_with(
    st: &AppState,
    next: &str,
    username: &str,
    error: Option<String>,
    notice: Option<&'static str>,
    code: StatusCode,
) -> Response {
    let csrf = auth::random_secret(16);
    let mut r = render_status(
        code,
        &LoginTpl {
            csrf: csrf.clone(),
            next: safe_next(next),
            username: username.to_string(),
            error,
            notice,
        },
    );
    r.headers_mut().append(
        header::SET_COOKIE,
        cookie_header(st, PRELOGIN_COOKIE, &csrf, Some(3600)),
    );
    r
}

pub async fn login_page(State(st): S, Query(q): Query<LoginQuery>) -> Response {
    let notice = q
        .changed
        .is_some()
        .then_some("Your password was changed and every session ended: log in with the new one.");
    login_form_with(&st, &q.next, "", None, notice, StatusCode::OK)
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    next: String,
    username: String,
    password: String,
}

/// The login form again, with 429 and `Retry-After`: try again in `secs` seconds.
fn login_wait(st: &AppState, f: &LoginForm, message: String, secs: u64) -> Response {
    let mut r = login_form(
        st,
        &f.next,
        &f.username,
        Some(message),
        StatusCode::TOO_MANY_REQUESTS,
    );
    r.headers_mut().insert(header::RETRY_AFTER, secs.into());
    r
}

pub async fn login(
    State(st): S,
    peer: crate::http::Peer,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    use crate::http::throttle::{Pool, Refusal, retry_after_secs};
    let expected = auth::cookie(&headers, PRELOGIN_COOKIE).unwrap_or_default();
    if expected.is_empty() || !auth::same_secret(&f.csrf, &expected) {
        return login_form(
            &st,
            &f.next,
            &f.username,
            Some("the login form expired or did not come from this server; try again".into()),
            StatusCode::FORBIDDEN,
        );
    }
    let addr = crate::http::peer_ip(&peer);
    // For messages and logs: a user name is short; whatever a client sent may not be.
    let who: String = f.username.chars().take(64).collect();
    let attempt = match st.logins.begin(&f.username, addr) {
        Ok(a) => a,
        Err(Refusal::Locked(wait)) => {
            st.bursts.record(
                "dashboard login refused",
                addr,
                format!("user {who:?} is locked out from this address"),
            );
            let secs = retry_after_secs(wait);
            let message = format!(
                "too many failed logins for {who:?} from your address; try again in {} (an \
                 administrator can clear this on the Admin page or with \
                 `edgevirt lockout clear --user {who}`)",
                crate::types::human_duration(secs as i64),
            );
            return login_wait(&st, &f, message, secs);
        }
    };
    if !attempt.delay.is_zero() {
        // This user is failing from many addresses: every try waits, nobody's CPU spent.
        tokio::time::sleep(attempt.delay).await;
    }
    let user = match st.store.user(&f.username).await {
        Ok(u) => u,
        Err(e) => {
            st.logins.abandon(attempt);
            return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string());
        }
    };
    let ok = match &user {
        Some((hash, _)) => {
            let (p, h) = (f.password.clone(), hash.clone());
            match Pool::passwords()
                .run(move || auth::verify_password(&p, &h))
                .await
            {
                Ok(ok) => ok,
                Err(_) => {
                    st.logins.abandon(attempt);
                    let message = "the server is busy checking other logins; try again";
                    return login_wait(&st, &f, message.into(), 1);
                }
            }
        }
        None => false,
    };
    let locked = st.logins.finish(attempt, ok);
    let Some((_, role)) = user.filter(|_| ok) else {
        st.bursts.record(
            "dashboard login failed",
            addr,
            format!("wrong username or password for {who:?}"),
        );
        let mut error = "wrong username or password".to_string();
        if let Some(l) = locked {
            error.push_str(&format!(
                "; too many failed logins: further tries from your address wait {}",
                crate::types::human_duration(l.as_secs() as i64)
            ));
        }
        return login_form(
            &st,
            &f.next,
            &f.username,
            Some(error),
            StatusCode::UNAUTHORIZED,
        );
    };
    // A fresh session id at every login: a cookie planted before login is worth nothing.
    if let Some(old) = auth::cookie(&headers, auth::SESSION_COOKIE) {
        let _ = st.store.delete_session(&auth::token_hash(&old)).await;
    }
    let id = auth::random_secret(32);
    let csrf = auth::random_secret(16);
    if let Err(e) = st
        .store
        .create_session(
            &auth::token_hash(&id),
            &f.username,
            &role,
            &csrf,
            auth::SESSION_TTL_SECS,
        )
        .await
    {
        return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string());
    }
    tracing::info!(user = %f.username, role = %role, "dashboard login");
    let mut r = Redirect::to(&safe_next(&f.next)).into_response();
    let h = r.headers_mut();
    h.append(
        header::SET_COOKIE,
        cookie_header(&st, auth::SESSION_COOKIE, &id, Some(auth::SESSION_TTL_SECS)),
    );
    h.append(
        header::SET_COOKIE,
        cookie_header(&st, PRELOGIN_COOKIE, "", Some(0)),
    );
    r
}

pub async fn logout(
    State(st): S,
    Extension(u): Extension<WebUser>,
    headers: HeaderMap,
) -> Response {
    if let Some(id) = auth::cookie(&headers, auth::SESSION_COOKIE) {
        let _ = st.store.delete_session(&auth::token_hash(&id)).await;
    }
    tracing::info!(user = %u.name, "dashboard logout");
    let mut r = Redirect::to("/ui/login").into_response();
    r.headers_mut().append(
        header::SET_COOKIE,
        cookie_header(&st, auth::SESSION_COOKIE, "", Some(0)),
    );
    r
}
