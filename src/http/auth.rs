//! Authentication and roles. Bearer tokens are looked up by their SHA-256 hash; passwords
//! are argon2 hashes. Roles: admin (everything), operator (VM actions, images), viewer (read
//! only), agent (node registration and VMI status for its node).

use argon2::password_hash::{PasswordHasher, SaltString, rand_core::OsRng};
use argon2::{Argon2, PasswordHash, PasswordVerifier};
use sha2::{Digest, Sha256};

use super::error::ApiError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Admin,
    Operator,
    Viewer,
    Agent,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "admin" => Role::Admin,
            "operator" => Role::Operator,
            "viewer" => Role::Viewer,
            "agent" => Role::Agent,
            _ => return None,
        })
    }
}

/// Who made a request.
#[derive(Clone, Debug)]
pub struct Principal {
    pub user: String,
    pub role: Role,
}

/// What a request wants to do, for the role check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    /// Create, change or act on VMs, VMIs and images.
    Operate,
    /// Node registration and VMI/VM status from an agent.
    AgentWrite,
    Admin,
}

impl Principal {
    pub fn require(&self, a: Access) -> Result<(), ApiError> {
        let ok = matches!(
            (self.role, a),
            (Role::Admin, _)
                | (_, Access::Read)
                | (Role::Operator, Access::Operate)
                | (Role::Agent, Access::AgentWrite)
        );
        if ok {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "user {:?} with role {:?} may not do this ({a:?} access needed)",
                self.user, self.role
            )))
        }
    }
}

pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh random secret, URL-safe.
pub fn random_secret(bytes: usize) -> String {
    use rand::RngCore;
    let mut b = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut b);
    hex::encode(b)
}

pub fn hash_password(p: &str) -> String {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(p.as_bytes(), &salt)
        .expect("argon2 hashing with default parameters cannot fail")
        .to_string()
}

pub fn verify_password(p: &str, hash: &str) -> bool {
    PasswordHash::new(hash)
        .map(|h| Argon2::default().verify_password(p.as_bytes(), &h).is_ok())
        .unwrap_or(false)
}

/// The dashboard's session cookie; its value is a random id, stored only as a hash.
pub const SESSION_COOKIE: &str = "edgevirt_session";
/// Header that carries the session's CSRF token on state changes made by scripts.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// Sessions last a working day.
pub const SESSION_TTL_SECS: i64 = 12 * 3600;

/// A cookie's value from the request headers.
pub fn cookie(headers: &axum::http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| cookie::Cookie::split_parse(v.to_owned()))
        .filter_map(Result::ok)
        .find(|c| c.name() == name)
        .map(|c| c.value().to_string())
}

/// The live session the request's cookie names, if any.
pub async fn session_of(
    store: &crate::store::Store,
    headers: &axum::http::HeaderMap,
) -> crate::store::Result<Option<crate::store::Session>> {
    match cookie(headers, SESSION_COOKIE) {
        Some(id) if !id.is_empty() => {
            let hash = token_hash(&id);
            let s = store.session(&hash).await?;
            if s.is_some()
                && let Err(e) = store.touch_session(&hash).await
            {
                tracing::debug!(error = %e, "noting a session's use failed");
            }
            Ok(s)
        }
        _ => Ok(None),
    }
}

pub use crate::tls::same_secret;

/// Route layers that declare who may reach a route, where the route is declared
/// (`.route_layer(middleware::from_fn(auth::admins))`); routes any logged-in principal may
/// read need none. The principal was put into the request by authentication.
pub async fn admins(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    gate(Access::Admin, req, next).await
}

/// See [`admins`]: operators and administrators.
pub async fn operators(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    gate(Access::Operate, req, next).await
}

async fn gate(
    access: Access,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let refused = match req.extensions().get::<Principal>() {
        Some(p) => p.require(access).err(),
        None => Some(ApiError::unauthorized()),
    };
    match refused {
        Some(e) => e.into_response(),
        None => next.run(req).await,
    }
}
