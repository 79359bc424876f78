//! Byte streams carried over the agent's websockets to the controller (migration tunnels,
//! consoles of this node's VMs).

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

pub type Ws = crate::client::WebSocket;

/// Relay a local stream over the websocket until either side ends.
pub async fn pipe<S: AsyncRead + AsyncWrite + Unpin>(ws: Ws, stream: S) -> anyhow::Result<()> {
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (mut rd, mut wr) = tokio::io::split(stream);
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = rd.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            ws_tx
                .send(Message::Binary(buf[..n].to_vec().into()))
                .await?;
        }
        let _ = ws_tx.send(Message::Close(None)).await;
        anyhow::Ok(())
    };
    let down = async {
        while let Some(m) = ws_rx.next().await {
            match m? {
                Message::Binary(b) => wr.write_all(&b).await?,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = wr.shutdown().await;
        anyhow::Ok(())
    };
    tokio::select! {
        r = up => r,
        r = down => r,
    }
}
