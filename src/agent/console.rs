//! Consoles of this node's VMs, for viewers of the controller (`vnc::remote` is the other
//! half). The agent keeps one websocket open to the controller, its channel, and reopens it
//! when it drops. For each console asked for on it, the agent connects to the VM's local
//! socket, opens the stream websocket the request names, says `ok` (or `error: <why>`), and
//! relays bytes until either side ends.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use super::Agent;
use super::relay::{Ws, pipe};

/// The longest wait between two attempts to open the channel.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Ask {
    id: String,
    vmi_uid: String,
    kind: String,
}

#[derive(Debug, Deserialize)]
struct Request {
    console: Ask,
}

/// Keep the channel open until `cancel`.
pub async fn run(agent: Arc<Agent>, cancel: CancellationToken) {
    let mut backoff = Duration::from_secs(1);
    loop {
        match agent.api.websocket("/agent-channel").await {
            Ok(ws) => {
                tracing::debug!("console channel to the controller open");
                backoff = Duration::from_secs(1);
                if serve(&agent, ws, &cancel).await {
                    return;
                }
                tracing::debug!("console channel to the controller closed; reopening");
            }
            Err(e) => {
                tracing::debug!(error = %format!("{e:#}"), "console channel not open; retrying")
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Answer requests on one channel until it closes; true when cancelled.
async fn serve(agent: &Arc<Agent>, mut ws: Ws, cancel: &CancellationToken) -> bool {
    loop {
        let m = tokio::select! {
            _ = cancel.cancelled() => {
                let _ = ws.close(None).await;
                return true;
            }
            m = ws.next() => m,
        };
        match m {
            Some(Ok(Message::Text(t))) => match serde_json::from_str::<Request>(t.as_str()) {
                Ok(Request { console }) => {
                    let agent = agent.clone();
                    tokio::spawn(async move {
                        let (kind, vmi) = (console.kind.clone(), console.vmi_uid.clone());
                        match open(&agent, console).await {
                            Ok(()) => {
                                tracing::info!(%kind, vmi_uid = %vmi, "remote console closed")
                            }
                            Err(e) => {
                                tracing::warn!(%kind, vmi_uid = %vmi, error = %format!("{e:#}"), "remote console failed")
                            }
                        }
                    });
                }
                Err(e) => tracing::warn!(error = %e, "unknown request on the console channel"),
            },
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return false,
        }
    }
}

/// The VM's socket for a console kind, under this node's run directory. The uid comes from
/// the controller; it is checked to be one, so it names a directory of ours and no other.
fn socket(agent: &Agent, vmi_uid: &str, kind: &str) -> anyhow::Result<std::path::PathBuf> {
    let file = match kind {
        "vnc" => "vnc.sock",
        "serial" => "serial.sock",
        other => anyhow::bail!("no console kind {other:?}"),
    };
    anyhow::ensure!(
        !vmi_uid.is_empty() && vmi_uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-'),
        "not a VMI uid: {vmi_uid:?}"
    );
    Ok(super::vmi_run_dir(&agent.cfg.data_dir, vmi_uid).join(file))
}

async fn open(agent: &Arc<Agent>, ask: Ask) -> anyhow::Result<()> {
    let mut ws = agent
        .api
        .websocket(&format!("/console-stream/{}", ask.id))
        .await?;
    let local = socket(agent, &ask.vmi_uid, &ask.kind);
    let conn = match &local {
        Ok(path) => tokio::net::UnixStream::connect(path)
            .await
            .map_err(|e| anyhow::anyhow!("{e}")),
        Err(e) => Err(anyhow::anyhow!("{e}")),
    };
    match conn {
        Ok(sock) => {
            ws.send(Message::Text("ok".into())).await?;
            tracing::info!(kind = %ask.kind, vmi_uid = %ask.vmi_uid, "remote console connected");
            pipe(ws, sock).await
        }
        Err(e) => {
            let why = format!(
                "error: the VM's {} console is not reachable on node {:?}: {e}",
                ask.kind, agent.cfg.node_name
            );
            ws.send(Message::Text(why.into())).await?;
            let _ = ws.close(None).await;
            Err(e)
        }
    }
}
