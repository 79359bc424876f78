//! `edgevirt vm console` and `edgevirt vm vnc`: the same one-time tickets and websockets the
//! dashboard uses, bridged to this terminal or to a local TCP port.

use std::net::SocketAddr;
use std::os::fd::AsFd;

use anyhow::Context as _;
use futures::{SinkExt, StreamExt};
use nix::sys::termios;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

use crate::client::{Client, WebSocket};

/// Ctrl-]: leaves the console, as in `virsh console` and telnet.
const ESCAPE: u8 = 0x1d;

/// Puts the terminal in raw mode while alive (when stdin is a terminal).
struct RawMode(Option<termios::Termios>);

impl RawMode {
    fn enter() -> RawMode {
        let stdin = std::io::stdin();
        let Ok(saved) = termios::tcgetattr(stdin.as_fd()) else {
            return RawMode(None); // not a terminal: pass bytes as they come
        };
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        if termios::tcsetattr(stdin.as_fd(), termios::SetArg::TCSANOW, &raw).is_err() {
            return RawMode(None);
        }
        RawMode(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = termios::tcsetattr(std::io::stdin().as_fd(), termios::SetArg::TCSANOW, saved);
        }
    }
}

pub async fn serial(c: &Client, ns: &str, name: &str) -> anyhow::Result<()> {
    let ws = c.console(ns, name, "serial").await?;
    eprintln!("Connected to the serial console of {ns}/{name}; Ctrl-] leaves.\r");
    let raw = RawMode::enter();
    let r = pump_terminal(ws).await;
    drop(raw);
    eprintln!();
    r
}

async fn pump_terminal(ws: WebSocket) -> anyhow::Result<()> {
    let (mut tx, mut rx) = ws.split();
    let mut stdin = tokio::io::stdin();
    let mut stdout = tokio::io::stdout();
    let input = async move {
        let mut buf = [0u8; 4096];
        loop {
            let n = stdin.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            let data = &buf[..n];
            if let Some(i) = data.iter().position(|&b| b == ESCAPE) {
                if i > 0 {
                    tx.send(Message::Binary(data[..i].to_vec().into())).await?;
                }
                break;
            }
            tx.send(Message::Binary(data.to_vec().into())).await?;
        }
        let _ = tx.send(Message::Close(None)).await;
        anyhow::Ok(())
    };
    let output = async move {
        while let Some(m) = rx.next().await {
            match m? {
                Message::Binary(b) => stdout.write_all(&b).await?,
                Message::Text(t) => stdout.write_all(t.as_bytes()).await?,
                Message::Close(_) => break,
                _ => continue,
            }
            stdout.flush().await?;
        }
        anyhow::Ok(())
    };
    tokio::select! {
        r = input => r,
        r = output => r,
    }
}

pub async fn vnc(c: &Client, ns: &str, name: &str, listen: SocketAddr) -> anyhow::Result<()> {
    // Fail early when the VM has no console (not running, no rights), before listening: a
    // ticket is refused then. An unused ticket simply expires.
    c.post(
        "/console/tickets",
        &serde_json::json!({"namespace": ns, "name": name, "kind": "vnc"}),
    )
    .await?;
    let l = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let local = l.local_addr()?;
    println!(
        "VNC of {ns}/{name} on {local}: point a VNC viewer there (e.g. vncviewer {}::{}); Ctrl-C stops",
        local.ip(),
        local.port()
    );
    loop {
        let (sock, peer) = tokio::select! {
            r = l.accept() => r?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        // Each viewer gets its own one-time ticket.
        let ws = match c.console(ns, name, "vnc").await {
            Ok(ws) => ws,
            Err(e) => {
                eprintln!("viewer {peer}: {e:#}");
                continue;
            }
        };
        eprintln!("viewer {peer} connected");
        tokio::spawn(async move {
            if let Err(e) = bridge(sock, ws).await {
                eprintln!("viewer {peer}: {e:#}");
            }
            eprintln!("viewer {peer} left");
        });
    }
}

async fn bridge(sock: tokio::net::TcpStream, ws: WebSocket) -> anyhow::Result<()> {
    let (mut rd, mut wr) = sock.into_split();
    let (mut tx, mut rx) = ws.split();
    let up = async move {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = rd.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            tx.send(Message::Binary(buf[..n].to_vec().into())).await?;
        }
        let _ = tx.send(Message::Close(None)).await;
        anyhow::Ok(())
    };
    let down = async move {
        while let Some(m) = rx.next().await {
            match m? {
                Message::Binary(b) => wr.write_all(&b).await?,
                Message::Close(_) => break,
                _ => continue,
            }
        }
        anyhow::Ok(())
    };
    tokio::select! {
        r = up => r,
        r = down => r,
    }
}
