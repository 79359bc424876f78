//! Joining hosts. An administrator creates a join token (`edgevirt node token create`): a
//! one-time secret plus the SHA-256 of the controller's TLS certificate, written as
//! `ev1.<secret>.<certificate sha256>`. The agent on the new host pins that certificate for
//! its first request and every later one, presents the secret once at `POST /join`, and gets
//! back its own credential: an `agent` token bound to its node name (user `node:<name>`),
//! which may change only that node and the instances placed on it.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AppState, S};
use crate::http::auth::{self, Principal};
use crate::http::error::{ApiError, ApiResult};
use crate::rules::join::JOIN_TOKEN_PREFIX;
use crate::store::JoinRefusal;

const DEFAULT_TTL_SECS: i64 = 3600;
const MAX_TTL_SECS: i64 = 7 * 24 * 3600;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateBody {
    #[serde(default)]
    ttl_seconds: Option<i64>,
    #[serde(default)]
    description: Option<String>,
}

pub async fn create_token(
    State(st): S,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let b: CreateBody = if body.is_empty() {
        CreateBody::default()
    } else {
        serde_json::from_value(crate::http::body::parse_body(&headers, &body).await?)
            .map_err(|e| ApiError::bad_request(format!("join token request: {e}")))?
    };
    let ttl = b.ttl_seconds.unwrap_or(DEFAULT_TTL_SECS);
    if !(60..=MAX_TTL_SECS).contains(&ttl) {
        return Err(ApiError::invalid(format!(
            "ttlSeconds must be between 60 and {MAX_TTL_SECS} (7 days), not {ttl}"
        )));
    }
    let Some(pin) = st.cert_pin.clone() else {
        return Err(ApiError::conflict(
            "this controller serves plain HTTP, so an agent could not pin its certificate; \
             start it with --tls (or a --listen address beyond loopback) to add hosts",
        ));
    };
    let secret = auth::random_secret(24);
    let expires = chrono::Utc::now().timestamp() + ttl;
    let description = b.description.unwrap_or_default();
    let id = st
        .store
        .add_join_token(&auth::token_hash(&secret), &description, expires)
        .await?;
    tracing::info!(%id, user = %p.user, ttl, "join token created");
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "id": id,
            "token": format!("{JOIN_TOKEN_PREFIX}.{secret}.{pin}"),
            "expires": chrono::DateTime::from_timestamp(expires, 0).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            "certSha256": pin,
            "description": description,
        })),
    )
        .into_response())
}

pub async fn list_tokens(State(st): S) -> ApiResult<Response> {
    let now = chrono::Utc::now().timestamp();
    let items: Vec<Value> = st
        .store
        .join_tokens()
        .await?
        .into_iter()
        .map(|t| {
            let state = match (&t.used_by, t.expires <= now) {
                (Some(_), _) => "Used",
                (None, true) => "Expired",
                (None, false) => "Valid",
            };
            json!({
                "id": t.id,
                "description": t.description,
                "created": t.created,
                "expires": chrono::DateTime::from_timestamp(t.expires, 0).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
                "state": state,
                "usedBy": t.used_by,
                "usedAt": t.used_at,
            })
        })
        .collect();
    Ok(Json(json!({"items": items})).into_response())
}

pub async fn delete_token(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    if st.store.delete_join_token(&id).await? {
        tracing::info!(user = %p.user, %id, "join token deleted");
        Ok(Json(json!({"kind": "Status", "status": "Success", "message": format!("join token {id} deleted")})).into_response())
    } else {
        Err(ApiError::not_found(format!("join token {id} not found")))
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct JoinBody {
    node_name: String,
    /// The secret part of the join token.
    secret: String,
    #[serde(default)]
    version: String,
}

/// `POST /join`: not behind the bearer check; the join secret is the credential. Tries are
/// rate-limited per client address, before the body is parsed.
pub async fn join(
    State(st): State<Arc<AppState>>,
    peer: crate::http::Peer,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let addr = crate::http::peer_ip(&peer);
    if let Err(wait) = st.join_limit.take(addr) {
        st.bursts.record(
            "join refused",
            addr,
            "too many tries from this address".into(),
        );
        return crate::http::throttle::too_many(
            format!(
                "too many join requests from {addr}; retry in {} s",
                crate::http::throttle::retry_after_secs(wait)
            ),
            wait,
        );
    }
    match join_inner(&st, addr, &headers, &body).await {
        Ok(r) => r,
        Err(e) => {
            // Token refusals were logged with their cause where it was known.
            if e.code.is_client_error() && e.code != StatusCode::UNAUTHORIZED {
                st.bursts.record("join refused", addr, e.message.clone());
            }
            e.into_response()
        }
    }
}

async fn join_inner(
    st: &AppState,
    addr: std::net::IpAddr,
    headers: &HeaderMap,
    body: &Bytes,
) -> ApiResult<Response> {
    // Nothing is parsed where nobody can join.
    let Some(pin) = st.cert_pin.clone() else {
        return Err(ApiError::conflict(
            "this controller serves plain HTTP; agents join only over TLS",
        ));
    };
    let b: JoinBody = serde_json::from_value(crate::http::body::parse_body(headers, body).await?)
        .map_err(|e| ApiError::bad_request(format!("join request: {e}")))?;
    crate::types::check_name("node name", &b.node_name).map_err(|e| ApiError::invalid(e.0))?;
    if let Some(node) = st
        .store
        .get_typed::<crate::types::Node>("", &b.node_name)
        .await?
        && crate::rules::node::node_ready(&node)
    {
        return Err(ApiError::conflict(format!(
            "node {:?} is already joined and Ready; pick another --node-name, or delete the \
             node first (edgevirt node delete {})",
            b.node_name, b.node_name
        )));
    }
    let credential = auth::random_secret(32);
    let outcome = st
        .store
        .redeem_join_token(
            &auth::token_hash(b.secret.trim()),
            &b.node_name,
            &auth::token_hash(&credential),
            chrono::Utc::now().timestamp(),
        )
        .await?;
    if let Err(why) = outcome {
        let why = match why {
            JoinRefusal::Unknown => "unknown",
            JoinRefusal::Used => "already used",
            JoinRefusal::Expired => "expired",
        };
        // The client is not told which: that would say whether a guessed secret was real.
        st.bursts.record(
            "join refused",
            addr,
            format!("node {:?}: join token {why}", b.node_name),
        );
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "the join token is not valid (unknown, already used or expired); create a new one \
             with `edgevirt node token create`",
        ));
    }
    tracing::info!(node = %b.node_name, agent_version = %b.version, from = %addr, "node joined");
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "nodeName": b.node_name,
            "credential": credential,
            "installId": st.install_id,
            "certSha256": pin,
            "controllerVersion": env!("CARGO_PKG_VERSION"),
        })),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn token_format() {
        let pin = "ab".repeat(32);
        let t = format!("ev1.{}.{pin}", "0".repeat(48));
        assert_eq!(
            crate::rules::join::parse_join_token(&t),
            Some((&t[4..52], &t[53..]))
        );
        assert!(crate::rules::join::parse_join_token("ev2.x.y").is_none());
        assert!(crate::rules::join::parse_join_token(&format!("ev1.short.{pin}")).is_none());
        assert!(
            crate::rules::join::parse_join_token(&format!(
                "ev1.{}.{}",
                "0".repeat(48),
                "zz".repeat(32)
            ))
            .is_none()
        );
        assert!(crate::rules::join::parse_join_token(&format!("{t}.extra")).is_none());
    }
}
