//! Consoles of VMs on other nodes. The browser (or CLI) still talks only to the controller;
//! agents connect out only, so each keeps one websocket open to the controller, its
//! channel (`GET /agent-channel`), on which the controller asks it for console streams:
//!
//! ```json
//! {"console": {"id": "<random>", "vmiUid": "...", "kind": "vnc"}}
//! ```
//!
//! The agent opens `GET /console-stream/{id}` with its own credential, connects it to the
//! VM's local socket, and sends `ok` (or `error: <why>`) before the bytes. The controller
//! pairs that stream with the viewer's websocket, checked as for a local console (ticket,
//! user, Origin), and relays it with the same control filter. A stream id is usable once,
//! only by the agent of the node it was asked of, and only for a few seconds.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use super::{ConsoleKind, S};
use crate::http::auth::{self, Principal};
use crate::http::error::ApiError;

/// How long the controller waits for an agent to open an asked-for stream, and then for
/// its first word.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Pings on an idle channel, so that a dead peer is noticed and middleboxes keep it open.
const KEEPALIVE: Duration = Duration::from_secs(20);

struct Pending {
    node: String,
    tx: oneshot::Sender<WebSocket>,
}

/// The agents' channels and the streams asked for on them.
#[derive(Default)]
pub struct Channels {
    /// By node name: (generation, sender of messages to that agent).
    agents: Mutex<HashMap<String, (u64, mpsc::UnboundedSender<String>)>>,
    pending: Mutex<HashMap<String, Pending>>,
    generation: AtomicU64,
}

impl Channels {
    /// Whether the agent of `node` has its channel open now.
    pub fn connected(&self, node: &str) -> bool {
        self.agents
            .lock()
            .unwrap()
            .get(node)
            .is_some_and(|(_, tx)| !tx.is_closed())
    }

    /// Ask the agent of `node` for a stream of the VM's `kind` console; the agent's
    /// websocket, once it said `ok`.
    pub(super) async fn open(
        &self,
        node: &str,
        vmi_uid: &str,
        kind: ConsoleKind,
    ) -> Result<WebSocket, ApiError> {
        let tx = self
            .agents
            .lock()
            .unwrap()
            .get(node)
            .map(|(_, tx)| tx.clone())
            .ok_or_else(|| not_connected(node))?;
        let id = auth::random_secret(18);
        let (otx, orx) = oneshot::channel();
        self.pending.lock().unwrap().insert(
            id.clone(),
            Pending {
                node: node.to_string(),
                tx: otx,
            },
        );
        let ask = json!({"console": {"id": id, "vmiUid": vmi_uid, "kind": kind.as_str()}});
        if tx.send(ask.to_string()).is_err() {
            self.pending.lock().unwrap().remove(&id);
            return Err(not_connected(node));
        }
        let got = tokio::time::timeout(OPEN_TIMEOUT, orx).await;
        self.pending.lock().unwrap().remove(&id);
        let mut ws = match got {
            Ok(Ok(ws)) => ws,
            _ => {
                return Err(gateway(format!(
                    "the agent of node {node:?} did not open the console stream within {} s",
                    OPEN_TIMEOUT.as_secs()
                )));
            }
        };
        match tokio::time::timeout(OPEN_TIMEOUT, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) if t.as_str() == "ok" => Ok(ws),
            Ok(Some(Ok(Message::Text(t)))) => Err(gateway(
                t.as_str()
                    .strip_prefix("error: ")
                    .unwrap_or(t.as_str())
                    .to_string(),
            )),
            _ => Err(gateway(format!(
                "the agent of node {node:?} opened the console stream but said nothing"
            ))),
        }
    }
}

fn not_connected(node: &str) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        format!(
            "the VM runs on node {node:?}, whose agent is not connected to this controller \
             (it is down, or of a version that does not relay consoles)"
        ),
    )
}

fn gateway(msg: String) -> ApiError {
    ApiError::new(StatusCode::BAD_GATEWAY, "BadGateway", msg)
}

/// `GET /agent-channel` (websocket): a node's agent waits here for console requests.
pub async fn channel(
    State(st): S,
    Extension(p): Extension<Principal>,
    ws: WebSocketUpgrade,
) -> Response {
    let Some(node) = p.node().map(str::to_string) else {
        return ApiError::forbidden("only a node's agent opens an agent channel").into_response();
    };
    let channels = st.channels.clone();
    super::bounded(ws, &st).on_upgrade(move |socket| async move {
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        let generation = channels.generation.fetch_add(1, Ordering::SeqCst);
        // A newer channel of the same node replaces an older one (the agent restarted).
        channels
            .agents
            .lock()
            .unwrap()
            .insert(node.clone(), (generation, tx));
        tracing::info!(%node, "agent channel open");
        let (mut wtx, mut wrx) = socket.split();
        loop {
            tokio::select! {
                m = rx.recv() => match m {
                    Some(t) => if wtx.send(Message::Text(t.into())).await.is_err() { break },
                    None => break,
                },
                m = wrx.next() => match m {
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => {}
                },
                _ = tokio::time::sleep(KEEPALIVE) => {
                    if wtx.send(Message::Ping(Default::default())).await.is_err() {
                        break;
                    }
                }
            }
        }
        let mut agents = channels.agents.lock().unwrap();
        if agents.get(&node).is_some_and(|(g, _)| *g == generation) {
            agents.remove(&node);
        }
        tracing::info!(%node, "agent channel closed");
    })
}

/// `GET /console-stream/{id}` (websocket): the agent's side of an asked-for console.
pub async fn stream(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    ws: WebSocketUpgrade,
) -> Response {
    let pending = {
        let mut all = st.channels.pending.lock().unwrap();
        match all.get(&id) {
            Some(w) if p.node() == Some(w.node.as_str()) => all.remove(&id),
            Some(w) => {
                return ApiError::forbidden(format!(
                    "this console stream was asked of the agent of node {:?}",
                    w.node
                ))
                .into_response();
            }
            None => None,
        }
    };
    let Some(pending) = pending else {
        return ApiError::not_found("no console stream is waiting under that id").into_response();
    };
    super::bounded(ws, &st).on_upgrade(move |socket| async move {
        let _ = pending.tx.send(socket);
    })
}
