//! The listener: accepts TCP connections, admits each through the connection tracker
//! (`crate::http::conn`), speaks TLS when configured, and serves HTTP/1.1 (with upgrades for
//! consoles and tunnels) or HTTP/2 on it with hyper, under a watchdog that closes the
//! connection when a timeout of its state runs out or the tracker evicts it.
//!
//! `axum::serve` has no header-read or idle timeout and no way to refuse or evict a
//! connection, so one client holding sockets open could take every descriptor of the
//! process; this loop is the same hyper machinery with those added.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use crate::http::conn::{Conn, ConnState, InFlight, Slot, Tracker};
use crate::http::throttle::Bursts;

/// How long connections get to finish their requests once serve is asked to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Most header lines in one HTTP/1.1 request head.
const MAX_HEADERS: usize = 100;
/// Most bytes of header fields in one HTTP/2 request.
const H2_MAX_HEADER_LIST: u32 = 64 << 10;
/// Streams a client may open and reset before it is told to go away (the HTTP/2 "rapid
/// reset" attack).
const H2_MAX_RESETS: usize = 32;
/// HTTP/2 pings to find dead peers, and how long one may go unanswered.
const H2_KEEPALIVE: Duration = Duration::from_secs(30);
const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Serve `app` on `listener` (TLS when `tls` is set) until `cancel`, then give open
/// connections [`SHUTDOWN_GRACE`] to finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    tracker: Arc<Tracker>,
    bursts: Arc<Bursts>,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let builder = Arc::new(builder(&tracker));
    let conns = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = cancel.cancelled() => break,
            r = listener.accept() => match r {
                Ok(a) => a,
                Err(e) => {
                    accept_failed(&e, &bursts).await;
                    continue;
                }
            },
        };
        let slot = match tracker.admit(peer.ip()) {
            Ok((s, None)) => s,
            Ok((s, Some(from))) => {
                bursts.record_any(
                    "connection evicted",
                    format!(
                        "an idle connection without a login from {from} was closed to make room \
                         for one from {} (max_unauthenticated_per_address, max_unauthenticated)",
                        peer.ip()
                    ),
                );
                s
            }
            Err(why) => {
                // Reset, not closed: no FIN handshake or TIME_WAIT is spent on a flood.
                let _ = stream.set_zero_linger();
                drop(stream);
                bursts.record_any("connection refused", format!("from {}: {why}", peer.ip()));
                continue;
            }
        };
        let (app, tls, builder, cancel) =
            (app.clone(), tls.clone(), builder.clone(), cancel.clone());
        conns.spawn(async move {
            connection(stream, peer, slot, tls, app, &builder, cancel).await;
        });
    }
    conns.close();
    if tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(1), conns.wait())
        .await
        .is_err()
    {
        tracing::info!(
            open = conns.len(),
            "connections still open at shutdown are dropped"
        );
    }
    Ok(())
}

/// Connections the kernel completes before they are accepted (capped by
/// `net.core.somaxconn`): a flood of connects must not make a client's SYN wait for a
/// retransmission (1 s) because the queue was full.
const BACKLOG: u32 = 4096;

/// The listening socket, with a backlog of [`BACKLOG`].
pub fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let s = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }?;
    s.set_reuseaddr(true)?;
    s.bind(addr)
        .and_then(|()| s.listen(BACKLOG))
        .with_context(|| format!("listening on {addr}"))
}

/// An accept that failed: out of descriptors (logged, and a pause so the loop does not
/// spin while connections close), or a connection gone before it was accepted.
async fn accept_failed(e: &std::io::Error, bursts: &Arc<Bursts>) {
    let raw = e.raw_os_error();
    if raw == Some(libc::EMFILE) || raw == Some(libc::ENFILE) || raw == Some(libc::ENOMEM) {
        bursts.record_any("accept failed", e.to_string());
        tokio::time::sleep(Duration::from_millis(50)).await;
    } else {
        tracing::debug!(error = %e, "accept failed");
    }
}

type Builder = hyper_util::server::conn::auto::Builder<TokioExecutor>;

fn builder(tracker: &Tracker) -> Builder {
    let l = tracker.limits();
    let mut b = Builder::new(TokioExecutor::new());
    // No hyper timer on HTTP/1: its header-read timeout would also cut kept-alive
    // connections after 10 s; the watchdog below keeps both timeouts.
    b.http1().max_headers(MAX_HEADERS);
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(l.http2_max_streams)
        .max_pending_accept_reset_streams(H2_MAX_RESETS)
        .max_local_error_reset_streams(H2_MAX_RESETS)
        .max_header_list_size(H2_MAX_HEADER_LIST)
        .keep_alive_interval(H2_KEEPALIVE)
        .keep_alive_timeout(H2_KEEPALIVE_TIMEOUT);
    b
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    slot: Slot,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
    builder: &Builder,
    cancel: CancellationToken,
) {
    // TCP_NODELAY: console frames are many websocket messages; without it each waits for
    // the peer's delayed ACK.
    let _ = stream.set_nodelay(true);
    let state = slot.state().clone();
    let io = Tracked {
        inner: stream,
        slot,
    };
    match tls {
        None => http(TokioIo::new(io), peer, state, app, builder, cancel).await,
        Some(acceptor) => {
            let handshake = async {
                tokio::select! {
                    r = acceptor.accept(io) => r.ok(),
                    _ = state.evicted() => None,
                    _ = cancel.cancelled() => None,
                    _ = expiry(&state) => None,
                }
            };
            if let Some(s) = handshake.await {
                http(TokioIo::new(s), peer, state, app, builder, cancel).await;
            }
        }
    }
}

/// Resolves when the watchdog's view of `state` says to close (no request in flight: the
/// TLS handshake or the first head is overdue).
async fn expiry(state: &ConnState) {
    loop {
        match state.due() {
            Ok(at) => tokio::time::sleep_until(at.into()).await,
            Err(why) => {
                tracing::trace!(%why, "closing a connection");
                return;
            }
        }
    }
}

async fn http<I>(
    io: TokioIo<I>,
    peer: SocketAddr,
    state: Arc<ConnState>,
    app: Router,
    builder: &Builder,
    cancel: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn_state = state.clone();
    let service =
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            let busy = conn_state.begin_request();
            req.extensions_mut().insert(ConnectInfo(peer));
            req.extensions_mut().insert(Conn(conn_state.clone()));
            let app = app.clone();
            async move {
                let res = match app.oneshot(req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                };
                Ok::<_, Infallible>(res.map(|body| {
                    Body::new(Busy {
                        inner: body,
                        busy: Some(busy),
                    })
                }))
            }
        });
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::trace!(%peer, error = %e, "connection ended with an error");
            }
        }
        _ = state.evicted() => {
            tracing::trace!(%peer, "closed: evicted");
        }
        _ = expiry(&state) => {}
        _ = cancel.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn).await;
        }
    }
}

/// A response body that keeps its request in flight until it is sent (or dropped).
struct Busy {
    inner: Body,
    busy: Option<InFlight>,
}

impl http_body::Body for Busy {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = r {
            self.busy = None;
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The TCP stream, reporting reads and blocked writes to the connection's state, and
/// holding its tracker slot for as long as the socket lives (through an upgrade too).
struct Tracked {
    inner: TcpStream,
    slot: Slot,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.slot.state().on_read();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.slot.state().on_write(r.is_pending());
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.slot.state().on_write(r.is_pending());
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
