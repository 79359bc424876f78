//! The migration tunnel: a relay in the controller between the source and the target
//! node's agents, both of which connect out to it over their pinned TLS connection. The
//! source agent opens one websocket per connection its libvirtd makes to the "remote"
//! libvirtd (`side=source`); the target agent keeps one waiting per next connection
//! (`side=target`) and, once paired, joins it to its local libvirtd socket. Only the
//! migration's own source and target nodes may open its tunnels, and only while it is
//! TargetReady or Running. Bytes are relayed as they come; nothing is kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, Path, Query, State};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use serde::Deserialize;

use crate::api::AppState;
use crate::api::auth::Principal;
use crate::api::error::ApiError;
use crate::types::Kind;
use crate::types::kubevirt::migration_phase as mp;

/// How long one side waits for the other.
const PAIR_TIMEOUT: Duration = Duration::from_secs(120);

/// Sides waiting for their peer, by (migration uid, connection number).
#[derive(Default)]
pub struct Tunnels {
    waiting: Mutex<HashMap<(String, u32), tokio::sync::oneshot::Sender<WebSocket>>>,
}

#[derive(Debug, Deserialize)]
pub struct TunnelQuery {
    side: String,
}

/// `GET /migration-tunnel/{ns}/{name}/{n}?side=source|target` (websocket).
pub async fn tunnel(
    State(st): State<Arc<AppState>>,
    Extension(p): Extension<Principal>,
    Path((ns, name, n)): Path<(String, String, u32)>,
    Query(q): Query<TunnelQuery>,
    ws: WebSocketUpgrade,
) -> Response {
    let m = match st
        .store
        .get(Kind::VirtualMachineInstanceMigration, &ns, &name)
        .await
    {
        Ok(Some(m)) => m,
        Ok(None) => {
            return ApiError::not_found(format!("migration {ns}/{name} not found")).into_response();
        }
        Err(e) => return ApiError::from(e).into_response(),
    };
    let phase = m["status"]["phase"].as_str().unwrap_or("");
    if phase != mp::TARGET_READY && phase != mp::RUNNING {
        return ApiError::conflict(format!(
            "migration {ns}/{name} is {phase}, not TargetReady or Running"
        ))
        .into_response();
    }
    let node_field = match q.side.as_str() {
        "source" => "sourceNode",
        "target" => "targetNode",
        other => {
            return ApiError::bad_request(format!("side must be source or target, not {other:?}"))
                .into_response();
        }
    };
    let want = m["status"]["migrationState"][node_field]
        .as_str()
        .unwrap_or("");
    if p.node() != Some(want) || want.is_empty() {
        return ApiError::forbidden(format!(
            "only the agent of node {want:?} opens the {} side of migration {ns}/{name}",
            q.side
        ))
        .into_response();
    }
    let key = (m["metadata"]["uid"].as_str().unwrap_or("").to_string(), n);
    let tunnels = st.tunnels.clone();
    ws.on_upgrade(move |socket| async move {
        let peer = tunnels.waiting.lock().unwrap().remove(&key);
        match peer {
            Some(tx) => {
                // The other side waits: hand it this socket; it relays.
                let _ = tx.send(socket);
            }
            None => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                tunnels.waiting.lock().unwrap().insert(key.clone(), tx);
                match tokio::time::timeout(PAIR_TIMEOUT, rx).await {
                    Ok(Ok(other)) => relay(socket, other).await,
                    _ => {
                        tunnels.waiting.lock().unwrap().remove(&key);
                        tracing::warn!(migration = %key.0, n = key.1, "tunnel side was not paired in time");
                    }
                }
            }
        }
    })
}

/// Tell both sides they are paired, then forward binary messages both ways until one ends.
async fn relay(a: WebSocket, b: WebSocket) {
    let (mut a_tx, mut a_rx) = a.split();
    let (mut b_tx, mut b_rx) = b.split();
    if a_tx.send(Message::Text("paired".into())).await.is_err()
        || b_tx.send(Message::Text("paired".into())).await.is_err()
    {
        return;
    }
    let ab = async {
        while let Some(Ok(m)) = a_rx.next().await {
            if matches!(m, Message::Close(_)) || b_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = b_tx.send(Message::Close(None)).await;
    };
    let ba = async {
        while let Some(Ok(m)) = b_rx.next().await {
            if matches!(m, Message::Close(_)) || a_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = a_tx.send(Message::Close(None)).await;
    };
    tokio::select! {
        _ = ab => {}
        _ = ba => {}
    }
}
