//! The migration tunnel: a relay in the controller between the source and the target
//! node's agents, both of which connect out to it over their pinned TLS connection. The
//! source agent opens one websocket per connection its libvirtd makes to the "remote"
//! libvirtd (`side=source`); the target agent keeps one waiting per next connection
//! (`side=target`) and, once paired, joins it to its local libvirtd socket. A block
//! migration adds QEMU's own streams (`stream=memory|disks`), which the target joins to the
//! unix sockets its QEMU listens on; connection numbers are shared by all streams. Agents
//! that can reach each other use the relay only to agree on a direct path (`stream=direct`,
//! see `agent::direct`), and it carries what the direct path cannot. Only the
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

use super::VncState;
use crate::http::auth::Principal;
use crate::http::error::ApiError;
use crate::types::Kind;
use crate::types::kubevirt::migration_phase as mp;

/// How long one side waits for the other.
const PAIR_TIMEOUT: Duration = Duration::from_secs(120);

/// Sides waiting for their peer, by (migration uid, connection number).
#[derive(Default)]
pub struct Tunnels {
    waiting: Mutex<HashMap<(String, u32), tokio::sync::oneshot::Sender<Side>>>,
}

/// A side that arrived, with the stream its source named (`None` from a target).
type Side = (WebSocket, Option<String>);

#[derive(Debug, Deserialize)]
pub struct TunnelQuery {
    side: String,
    /// What a source connection carries: `libvirt` (the default: libvirtd's connection, in
    /// which a plain live migration tunnels QEMU's stream), or, for a block migration,
    /// `memory` or `disks` (QEMU's own streams). The target learns it when paired.
    #[serde(default)]
    stream: Option<String>,
}

/// The streams a tunnel may carry. `direct` carries one message, from the target to the
/// source: how to reach the target without the relay (its address, certificate pin and a
/// key for this migration), which must not travel anywhere else.
pub const STREAMS: [&str; 4] = ["libvirt", "memory", "disks", "direct"];

/// `GET /migration-tunnel/{ns}/{name}/{n}?side=source|target` (websocket).
pub async fn tunnel(
    State(st): State<Arc<VncState>>,
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
    let stream = match (q.side.as_str(), q.stream) {
        ("source", None) => Some("libvirt".to_string()),
        ("source", Some(s)) if STREAMS.contains(&s.as_str()) => Some(s),
        ("source", Some(s)) => {
            return ApiError::bad_request(format!(
                "stream must be one of {}, not {s:?}",
                STREAMS.join(", ")
            ))
            .into_response();
        }
        (_, Some(_)) => {
            return ApiError::bad_request("only the source side names a stream").into_response();
        }
        (_, None) => None,
    };
    let key = (m["metadata"]["uid"].as_str().unwrap_or("").to_string(), n);
    let tunnels = st.tunnels.clone();
    super::bounded(ws, &st).on_upgrade(move |socket| async move {
        let peer = tunnels.waiting.lock().unwrap().remove(&key);
        match peer {
            Some(tx) => {
                // The other side waits: hand it this socket; it relays.
                let _ = tx.send((socket, stream));
            }
            None => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                tunnels.waiting.lock().unwrap().insert(key.clone(), tx);
                match tokio::time::timeout(PAIR_TIMEOUT, rx).await {
                    Ok(Ok((other, other_stream))) => {
                        let stream = stream.or(other_stream).unwrap_or_default();
                        relay(socket, other, &stream).await
                    }
                    _ => {
                        tunnels.waiting.lock().unwrap().remove(&key);
                        tracing::warn!(migration = %key.0, n = key.1, "tunnel side was not paired in time");
                    }
                }
            }
        }
    })
}

/// Tell both sides they are paired (and what the stream carries: `paired disks`; a plain
/// `paired` for libvirtd's connection, as agents of protocol 1.0 expect), then forward
/// binary messages both ways until one ends.
async fn relay(a: WebSocket, b: WebSocket, stream: &str) {
    let (mut a_tx, mut a_rx) = a.split();
    let (mut b_tx, mut b_rx) = b.split();
    let hello = match stream {
        "libvirt" | "" => "paired".to_string(),
        s => format!("paired {s}"),
    };
    if a_tx
        .send(Message::Text(hello.clone().into()))
        .await
        .is_err()
        || b_tx.send(Message::Text(hello.into())).await.is_err()
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
