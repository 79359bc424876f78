//! The install strategy and rollout endpoints: `GET /apis/edgevirt.io/v1/installstrategy`
//! (the stored ConfigMap, its decoded manifest and the rollout), `GET .../rollout`, and
//! `PUT .../installstrategy/version` (admins) to change the desired version.

use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Json};
use serde_json::json;

use super::AppState;
use crate::controller::strategy::{self, Error as StrategyError};
use crate::http::auth::Principal;
use crate::http::error::{ApiError, ApiResult};

impl From<StrategyError> for ApiError {
    fn from(e: StrategyError) -> Self {
        match e {
            StrategyError::Invalid(m) => ApiError::invalid(m),
            StrategyError::Store(e) => e.into(),
        }
    }
}

pub async fn get_strategy(State(st): State<Arc<AppState>>) -> ApiResult<impl IntoResponse> {
    let Some((cm, manifest)) = strategy::load(&st.store).await? else {
        return Err(ApiError::not_found(
            "no install strategy stored yet (the controller writes one when it starts)",
        ));
    };
    let rollout = strategy::current_rollout(&st.store).await?;
    Ok(Json(json!({
        "configMap": cm,
        "manifest": manifest,
        "rollout": rollout,
    })))
}

pub async fn get_rollout(State(st): State<Arc<AppState>>) -> ApiResult<impl IntoResponse> {
    Ok(Json(strategy::current_rollout(&st.store).await?))
}

/// Body: `{"version": "0.2.0"}`.
pub async fn put_version(
    State(st): State<Arc<AppState>>,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let v = crate::http::body::parse_body(&headers, &body).await?;
    let version = v["version"]
        .as_str()
        .ok_or_else(|| ApiError::bad_request("the body needs {\"version\": \"X.Y.Z\"}"))?;
    let m = strategy::set_version(&st.store, version).await?;
    tracing::info!(user = %p.user, version = %m.version, "desired version changed");
    Ok(Json(json!({
        "manifest": m,
        "rollout": strategy::current_rollout(&st.store).await?,
    })))
}
