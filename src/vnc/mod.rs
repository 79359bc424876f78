//! Consoles: the websocket ⇄ VNC/serial proxy. A viewer first asks for a ticket
//! (`POST /console/tickets`, authenticated like any API call); the ticket is short-lived,
//! bound to the user, the VM and the kind of console, and usable once. The websocket
//! (`GET /console/ws/{kind}/{ns}/{name}?ticket=...`) is then checked — ticket, VM, user,
//! Origin — before edgevirt opens the VM's socket, whose path it derives itself: the client
//! never names the target.
//!
//! Several people may watch one VM's screen at once. One of them holds control; the others'
//! input is dropped by the proxy (see [`rfb::ClientFilter`]). Control passes on request.

pub mod remote;
pub mod rfb;
pub mod tunnel;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ws::{
    Message, WebSocket, WebSocketUpgrade, rejection::WebSocketUpgradeRejection,
};
use axum::extract::{Extension, FromRef, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::from_fn;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, body::Bytes};
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use crate::http::auth::{self, Principal, Role};
use crate::http::error::{ApiError, ApiResult};
use crate::http::{AppState, LocalNode};
use crate::types::Kind;
use crate::types::kubevirt::phase;

/// How long a ticket may wait for its websocket, unless the server is told otherwise.
pub const TICKET_TTL: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsoleKind {
    Vnc,
    Serial,
}

impl ConsoleKind {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "vnc" => Some(Self::Vnc),
            "serial" => Some(Self::Serial),
            _ => None,
        }
    }
    fn as_str(self) -> &'static str {
        match self {
            Self::Vnc => "vnc",
            Self::Serial => "serial",
        }
    }
    fn socket(self) -> &'static str {
        match self {
            Self::Vnc => "vnc.sock",
            Self::Serial => "serial.sock",
        }
    }
}

struct Ticket {
    kind: ConsoleKind,
    namespace: String,
    name: String,
    vmi_uid: String,
    user: String,
    connection: u64,
    expires: Instant,
}

/// One open console connection.
struct Viewer {
    id: u64,
    user: String,
    kind: ConsoleKind,
    control: AtomicBool,
    since: chrono::DateTime<chrono::Utc>,
}

pub type VmKey = (String, String);

/// The console proxy's state: the handlers' [`AppState`] (which it derefs to) and the
/// registries of tickets and viewers, migration tunnels and agents' channels.
pub struct VncState {
    pub app: Arc<AppState>,
    pub consoles: Arc<Consoles>,
    /// Migration tunnels waiting for their other side.
    pub tunnels: Arc<tunnel::Tunnels>,
    /// Agents' channels, on which consoles of VMs on their nodes are asked for.
    pub channels: Arc<remote::Channels>,
}

impl VncState {
    pub fn new(app: Arc<AppState>) -> Self {
        VncState {
            consoles: Arc::new(
                app.console_ticket_ttl
                    .map_or_else(Consoles::default, Consoles::new),
            ),
            app,
            tunnels: Default::default(),
            channels: Default::default(),
        }
    }
}

impl std::ops::Deref for VncState {
    type Target = AppState;
    fn deref(&self) -> &AppState {
        &self.app
    }
}

/// Tickets and open connections, shared by all requests.
pub struct Consoles {
    ttl: Duration,
    /// By the SHA-256 of the ticket.
    tickets: std::sync::Mutex<HashMap<String, Ticket>>,
    viewers: std::sync::Mutex<HashMap<VmKey, Vec<Arc<Viewer>>>>,
    next_id: AtomicU64,
}

impl Default for Consoles {
    fn default() -> Self {
        Self::new(TICKET_TTL)
    }
}

/// Open connections per VM, as KubeVirt counts them: `kubevirt_console_active_connections`
/// (serial) and `kubevirt_vnc_active_connections` (screen).
fn connections(kind: ConsoleKind) -> &'static prometheus::IntGaugeVec {
    use std::sync::LazyLock;
    static SERIAL: LazyLock<prometheus::IntGaugeVec> = LazyLock::new(|| {
        prometheus::register_int_gauge_vec!(
            "kubevirt_console_active_connections",
            "Amount of active serial console connections, by VMI.",
            &["vmi", "namespace"]
        )
        .expect("a valid metric")
    });
    static VNC: LazyLock<prometheus::IntGaugeVec> = LazyLock::new(|| {
        prometheus::register_int_gauge_vec!(
            "kubevirt_vnc_active_connections",
            "Amount of active VNC connections, by VMI.",
            &["vmi", "namespace"]
        )
        .expect("a valid metric")
    });
    match kind {
        ConsoleKind::Serial => &SERIAL,
        ConsoleKind::Vnc => &VNC,
    }
}

impl Consoles {
    pub fn new(ttl: Duration) -> Self {
        Consoles {
            ttl,
            tickets: Default::default(),
            viewers: Default::default(),
            next_id: AtomicU64::new(0),
        }
    }

    fn issue(&self, t: Ticket) -> String {
        let secret = auth::random_secret(24);
        let mut tickets = self.tickets.lock().unwrap();
        let now = Instant::now();
        tickets.retain(|_, t| t.expires > now);
        tickets.insert(auth::token_hash(&secret), t);
        secret
    }

    /// Take a ticket out: whatever happens next, it cannot be used again.
    fn redeem(&self, secret: &str) -> Option<Ticket> {
        self.tickets
            .lock()
            .unwrap()
            .remove(&auth::token_hash(secret))
    }

    fn join(&self, key: &VmKey, id: u64, user: &str, kind: ConsoleKind) -> Arc<Viewer> {
        let mut all = self.viewers.lock().unwrap();
        let list = all.entry(key.clone()).or_default();
        let first = kind == ConsoleKind::Serial
            || !list
                .iter()
                .any(|v| v.kind == kind && v.control.load(Ordering::SeqCst));
        let v = Arc::new(Viewer {
            id,
            user: user.to_string(),
            kind,
            control: AtomicBool::new(first),
            since: chrono::Utc::now(),
        });
        list.push(v.clone());
        connections(kind)
            .with_label_values(&[key.1.as_str(), key.0.as_str()])
            .inc();
        v
    }

    fn leave(&self, key: &VmKey, id: u64) {
        let mut all = self.viewers.lock().unwrap();
        if let Some(list) = all.get_mut(key) {
            let Some(pos) = list.iter().position(|v| v.id == id) else {
                return;
            };
            let gone = list.remove(pos);
            let gauge = connections(gone.kind);
            let labels = [key.1.as_str(), key.0.as_str()];
            if list.iter().any(|v| v.kind == gone.kind) {
                gauge.with_label_values(&labels).dec();
            } else {
                // No series left behind for a VM nobody watches.
                let _ = gauge.remove_label_values(&labels);
            }
            // Control passes to whoever has watched longest.
            if gone.control.load(Ordering::SeqCst)
                && let Some(next) = list.iter().find(|v| v.kind == gone.kind)
            {
                next.control.store(true, Ordering::SeqCst);
            }
            if list.is_empty() {
                all.remove(key);
            }
        }
    }

    fn in_use(&self, key: &VmKey, kind: ConsoleKind) -> Option<String> {
        let all = self.viewers.lock().unwrap();
        all.get(key)?
            .iter()
            .find(|v| v.kind == kind)
            .map(|v| v.user.clone())
    }

    /// Give control of a VM's screen to connection `id`.
    fn take_control(&self, key: &VmKey, id: u64, p: &Principal) -> ApiResult<()> {
        let all = self.viewers.lock().unwrap();
        let list = all
            .get(key)
            .ok_or_else(|| ApiError::not_found("nobody is watching this VM"))?;
        let me = list
            .iter()
            .find(|v| v.id == id && v.kind == ConsoleKind::Vnc)
            .ok_or_else(|| ApiError::not_found(format!("no console connection {id}")))?;
        if me.user != p.user && p.role != Role::Admin {
            return Err(ApiError::forbidden(
                "that console connection is someone else's",
            ));
        }
        for v in list.iter().filter(|v| v.kind == ConsoleKind::Vnc) {
            v.control.store(v.id == id, Ordering::SeqCst);
        }
        Ok(())
    }

    pub fn state(&self, key: &VmKey) -> Value {
        let all = self.viewers.lock().unwrap();
        let list: Vec<Value> = all
            .get(key)
            .map(|l| {
                l.iter()
                    .map(|v| {
                        json!({
                            "connection": v.id,
                            "user": v.user,
                            "kind": v.kind.as_str(),
                            "control": v.control.load(Ordering::SeqCst),
                            "since": v.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        json!({ "viewers": list })
    }

    /// Open connections, all VMs (for the dashboard and tests).
    pub fn open_connections(&self) -> usize {
        self.viewers.lock().unwrap().values().map(Vec::len).sum()
    }
}

type S = State<Arc<VncState>>;

/// Routes that need an authenticated principal (bearer token or session + CSRF).
pub fn authed_routes<St>() -> Router<St>
where
    Arc<VncState>: FromRef<St>,
    St: Clone + Send + Sync + 'static,
{
    Router::new()
        // Opening and taking over consoles: operators and administrators.
        .route(
            "/console/tickets",
            post(create_ticket).route_layer(from_fn(auth::operators)),
        )
        .route(
            "/console/control/{ns}/{name}",
            post(take_control).route_layer(from_fn(auth::operators)),
        )
        .route("/console/state/{ns}/{name}", get(console_state))
        .route("/migration-tunnel/{ns}/{name}/{n}", get(tunnel::tunnel))
        .route("/agent-channel", get(remote::channel))
        .route("/console-stream/{id}", get(remote::stream))
}

/// The websocket itself: the ticket is its credential.
pub fn ticket_routes<St>() -> Router<St>
where
    Arc<VncState>: FromRef<St>,
    St: Clone + Send + Sync + 'static,
{
    Router::new().route("/console/ws/{kind}/{ns}/{name}", get(websocket))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TicketRequest {
    #[serde(default = "default_ns")]
    namespace: String,
    name: String,
    kind: ConsoleKind,
}

fn default_ns() -> String {
    "default".into()
}

/// Where a VM's console sockets are: in this server's own node, or on another node,
/// reached through that node's agent.
enum Place {
    Local(PathBuf),
    Remote(String),
}

/// The running VMI behind a VM name, and where its sockets are.
async fn running_vmi(st: &VncState, ns: &str, name: &str) -> ApiResult<(String, Place)> {
    let vmi = st
        .store
        .get(Kind::VirtualMachineInstance, ns, name)
        .await?
        .ok_or_else(|| ApiError::conflict(format!("VM {name:?} is not running")))?;
    if vmi["status"]["phase"].as_str() != Some(phase::RUNNING) {
        return Err(ApiError::conflict(format!(
            "VM {name:?} is not running (phase {})",
            vmi["status"]["phase"].as_str().unwrap_or("Pending")
        )));
    }
    let uid = vmi["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let node = vmi["status"]["nodeName"].as_str().unwrap_or_default();
    match &st.local_node {
        Some(LocalNode { name, data_dir }) if name == node => {
            let dir = crate::rules::paths::vmi_run_dir(data_dir, &uid);
            Ok((uid, Place::Local(dir)))
        }
        _ => Ok((uid, Place::Remote(node.to_string()))),
    }
}

async fn create_ticket(
    State(st): S,
    Extension(p): Extension<Principal>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: TicketRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid ticket request: {e}")))?;
    let (vmi_uid, place) = running_vmi(&st, &req.namespace, &req.name).await?;
    if let Place::Remote(node) = &place
        && !st.channels.connected(node)
    {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!(
                "VM {:?} runs on node {node:?}, whose agent is not connected to this \
                 controller (it is down, or of a version that does not relay consoles)",
                req.name
            ),
        ));
    }
    let key = (req.namespace.clone(), req.name.clone());
    if req.kind == ConsoleKind::Serial
        && let Some(user) = st.consoles.in_use(&key, ConsoleKind::Serial)
    {
        return Err(ApiError::conflict(format!(
            "the serial console of VM {:?} is in use by {user:?}; one connection at a time",
            req.name
        )));
    }
    let connection = st.consoles.next_id.fetch_add(1, Ordering::SeqCst) + 1;
    let secret = st.consoles.issue(Ticket {
        kind: req.kind,
        namespace: req.namespace.clone(),
        name: req.name.clone(),
        vmi_uid,
        user: p.user.clone(),
        connection,
        expires: Instant::now() + st.consoles.ttl,
    });
    let path = format!(
        "/console/ws/{}/{}/{}?ticket={secret}",
        req.kind.as_str(),
        req.namespace,
        req.name
    );
    tracing::info!(user = %p.user, namespace = %req.namespace, name = %req.name, kind = req.kind.as_str(), connection, "console ticket issued");
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "ticket": secret,
            "path": path,
            "connection": connection,
            "expiresInSeconds": st.consoles.ttl.as_secs(),
        })),
    )
        .into_response())
}

async fn console_state(
    State(st): S,
    Path((ns, name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    Ok(Json(st.consoles.state(&(ns, name))))
}

#[derive(Deserialize)]
struct ControlRequest {
    connection: u64,
}

async fn take_control(
    State(st): S,
    Extension(p): Extension<Principal>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let req: ControlRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid control request: {e}")))?;
    let key = (ns, name);
    st.consoles.take_control(&key, req.connection, &p)?;
    tracing::info!(user = %p.user, namespace = %key.0, name = %key.1, connection = req.connection, "console control taken");
    Ok(Json(st.consoles.state(&key)))
}

#[derive(Deserialize)]
struct WsQuery {
    ticket: Option<String>,
}

/// A browser's websocket must come from a page of this server: Origin, when sent, must name
/// the host the request was sent to.
fn origin_ok(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true; // not a browser (CLI, tests); the ticket is the credential
    };
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    let authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    authority == Some(host)
}

fn refuse(code: StatusCode, msg: impl Into<String>) -> Response {
    let reason = if code == StatusCode::UNAUTHORIZED {
        "Unauthorized"
    } else {
        "Forbidden"
    };
    ApiError::new(code, reason, msg).into_response()
}

async fn websocket(
    State(st): S,
    Path((kind, ns, name)): Path<(String, String, String)>,
    Query(q): Query<WsQuery>,
    headers: HeaderMap,
    conn: Option<Extension<crate::http::conn::Conn>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let Some(kind) = ConsoleKind::parse(&kind) else {
        return ApiError::not_found(format!("no console kind {kind:?} (vnc or serial)"))
            .into_response();
    };
    if !origin_ok(&headers) {
        tracing::warn!(%ns, %name, origin = ?headers.get(header::ORIGIN), "console refused: foreign Origin");
        return refuse(
            StatusCode::FORBIDDEN,
            "the Origin of this request is not this server",
        );
    }
    let Some(secret) = q.ticket.filter(|t| !t.is_empty()) else {
        return refuse(StatusCode::UNAUTHORIZED, "a console ticket is required");
    };
    let Some(ticket) = st.consoles.redeem(&secret) else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "unknown or already used console ticket; ask for a new one",
        );
    };
    if ticket.expires < Instant::now() {
        return refuse(StatusCode::UNAUTHORIZED, "the console ticket has expired");
    }
    if ticket.kind != kind || ticket.namespace != ns || ticket.name != name {
        tracing::warn!(user = %ticket.user, %ns, %name, "console refused: ticket for another VM");
        return refuse(StatusCode::FORBIDDEN, "the ticket is for another console");
    }
    // A browser also sends its session cookie: it must be the ticket holder's.
    match auth::session_of(&st.store, &headers).await {
        Ok(Some(s)) if s.user != ticket.user => {
            return refuse(StatusCode::FORBIDDEN, "the ticket belongs to another user");
        }
        Ok(_) => {}
        Err(e) => return ApiError::internal(e).into_response(),
    }
    // The ticket is this connection's authentication: it leaves the caps on strangers'.
    if let Some(Extension(c)) = conn {
        c.0.mark_authenticated();
    }
    let place = match running_vmi(&st, &ns, &name).await {
        Ok((uid, _)) if uid != ticket.vmi_uid => {
            return ApiError::conflict("the VM was restarted since the ticket was issued")
                .into_response();
        }
        Ok((_, place)) => place,
        Err(e) => return e.into_response(),
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => return e.into_response(),
    };
    let target = match place {
        Place::Local(dir) => {
            let sock = dir.join(kind.socket());
            match UnixStream::connect(&sock).await {
                Ok(s) => Target::Local(s),
                Err(e) => {
                    tracing::warn!(path = %sock.display(), error = %e, "console socket unreachable");
                    return ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        "BadGateway",
                        format!("the VM's {} console is not reachable: {e}", kind.as_str()),
                    )
                    .into_response();
                }
            }
        }
        Place::Remote(node) => match st.channels.open(&node, &ticket.vmi_uid, kind).await {
            Ok(agent) => Target::Remote(Box::new(agent)),
            Err(e) => {
                tracing::warn!(%node, %ns, %name, error = %e.message, "remote console unreachable");
                return e.into_response();
            }
        },
    };
    let key = (ns, name);
    let viewer = st
        .consoles
        .join(&key, ticket.connection, &ticket.user, kind);
    tracing::info!(user = %ticket.user, namespace = %key.0, name = %key.1, kind = kind.as_str(), connection = viewer.id, control = viewer.control.load(Ordering::SeqCst), "console connected");
    let consoles = st.consoles.clone();
    bounded(ws, &st)
        .protocols(["binary"])
        // What viewers send is small (input events, update requests): a small read buffer
        // keeps idle connections cheap.
        .read_buffer_size(8 << 10)
        .on_upgrade(move |socket| async move {
            let v = (kind == ConsoleKind::Vnc).then(|| viewer.clone());
            let r = match target {
                Target::Local(sock) => relay(socket, sock, v).await,
                Target::Remote(agent) => relay_remote(socket, *agent, v).await,
            };
            consoles.leave(&key, viewer.id);
            match r {
                Ok(()) => tracing::info!(namespace = %key.0, name = %key.1, connection = viewer.id, "console closed"),
                Err(e) => tracing::info!(namespace = %key.0, name = %key.1, connection = viewer.id, error = %e, "console closed"),
            }
        })
}

/// A websocket whose messages and frames from the peer are at most the configured size
/// (`websocket_max_message`): consoles, agents' channels and migration tunnels.
pub(crate) fn bounded(ws: WebSocketUpgrade, st: &AppState) -> WebSocketUpgrade {
    ws.max_message_size(st.websocket_max_message)
        .max_frame_size(st.websocket_max_message)
}

/// What a viewer's websocket is joined to.
enum Target {
    /// The VM's socket on this server's node.
    Local(UnixStream),
    /// The stream its node's agent opened (see [`remote`]).
    Remote(Box<WebSocket>),
}

/// Most read from a VM's socket at once (one websocket message); below glibc's mmap threshold.
const READ_CHUNK: usize = 64 << 10;

/// Copy bytes both ways until either side closes. With a viewer, the client's RFB stream is
/// framed and its input dropped while it has no control.
async fn relay(
    socket: WebSocket,
    target: UnixStream,
    viewer: Option<Arc<Viewer>>,
) -> anyhow::Result<()> {
    let (rd, mut wr) = target.into_split();
    let (mut tx, mut rx) = socket.split();
    let down = async move {
        // A buffer only while there is something to read: idle consoles hold none. Whatever
        // the socket has ready goes out as messages flushed together, once.
        loop {
            rd.readable().await?;
            let mut sent = 0;
            loop {
                let mut buf = bytes::BytesMut::with_capacity(READ_CHUNK);
                match rd.try_read_buf(&mut buf) {
                    Ok(0) if sent == 0 => {
                        let _ = tx.send(Message::Close(None)).await;
                        return anyhow::Ok(());
                    }
                    Ok(0) => break,
                    Ok(_) => {
                        tx.feed(Message::Binary(buf.freeze())).await?;
                        sent += 1;
                        if sent == 16 {
                            break; // flush at least every 1 MiB
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e.into()),
                }
            }
            if sent > 0 {
                tx.flush().await?;
            }
        }
    };
    let up = async move {
        let mut input = Input::new(viewer);
        while let Some(m) = rx.next().await {
            match input.next(m?)? {
                Some(out) if !out.is_empty() => wr.write_all(&out).await?,
                Some(_) => {}
                None => break,
            }
        }
        anyhow::Ok(())
    };
    tokio::select! {
        r = down => r,
        r = up => r,
    }
}

/// What a viewer sends, on its way to the VM: with a VNC viewer, the RFB stream is framed
/// and input dropped while the viewer has no control.
struct Input {
    viewer: Option<Arc<Viewer>>,
    filter: Option<rfb::ClientFilter>,
}

impl Input {
    fn new(viewer: Option<Arc<Viewer>>) -> Self {
        let filter = viewer.as_ref().map(|_| rfb::ClientFilter::new());
        Input { viewer, filter }
    }

    /// The bytes to forward for one message (`None`: the viewer closed).
    fn next(&mut self, m: Message) -> anyhow::Result<Option<Vec<u8>>> {
        let data = match m {
            Message::Binary(b) => b,
            Message::Text(t) => Bytes::from(t.as_str().to_owned()),
            Message::Close(_) => return Ok(None),
            _ => return Ok(Some(Vec::new())),
        };
        Ok(Some(match (&mut self.filter, &self.viewer) {
            (Some(f), Some(v)) => {
                f.feed(&data, v.control.load(Ordering::SeqCst))
                    .map_err(anyhow::Error::msg)?
                    .forward
            }
            _ => data.to_vec(),
        }))
    }
}

/// As [`relay`], to a stream an agent opened: messages both ways, the viewer's filtered.
async fn relay_remote(
    socket: WebSocket,
    agent: WebSocket,
    viewer: Option<Arc<Viewer>>,
) -> anyhow::Result<()> {
    let (mut tx, mut rx) = socket.split();
    let (mut atx, mut arx) = agent.split();
    let down = async move {
        while let Some(m) = arx.next().await {
            match m? {
                Message::Binary(b) => tx.send(Message::Binary(b)).await?,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = tx.send(Message::Close(None)).await;
        anyhow::Ok(())
    };
    let up = async move {
        let mut input = Input::new(viewer);
        while let Some(m) = rx.next().await {
            match input.next(m?)? {
                Some(out) if !out.is_empty() => atx.send(Message::Binary(out.into())).await?,
                Some(_) => {}
                None => break,
            }
        }
        let _ = atx.send(Message::Close(None)).await;
        anyhow::Ok(())
    };
    tokio::select! {
        r = down => r,
        r = up => r,
    }
}
