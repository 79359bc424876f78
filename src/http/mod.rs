//! What the HTTP layers (api, vnc, web) share, below all of them: the state every handler
//! gets ([`AppState`]), errors as Kubernetes `Status` objects ([`error`]), principals,
//! roles, tokens and sessions ([`auth`]), request bodies parsed by content type within
//! limits ([`body`], [`protobuf`]), the throttles for logins, `/join` and parsing
//! ([`throttle`]), and who may hold a connection for how long ([`conn`]). The HTTP shell
//! (`crate::shell`) composes the layers' routes into one router and authenticates requests.

pub mod auth;
pub mod body;
pub mod conn;
pub mod error;
pub mod protobuf;
pub mod throttle;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;

use crate::store::Store;
use throttle::{Bursts, LoginGuard, RateLimit};

/// The node whose agent runs in this same process (role `all`).
#[derive(Clone, Debug)]
pub struct LocalNode {
    pub name: String,
    pub data_dir: PathBuf,
}

/// What every handler shares: the store, this server's identity and TLS pin, and the
/// guards against floods. The console proxy adds its own registries on top
/// (`crate::vnc::VncState`).
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub data_dir: PathBuf,
    pub install_id: String,
    pub local_node: Option<LocalNode>,
    /// Served over TLS: cookies get the Secure attribute.
    pub tls: bool,
    /// SHA-256 (hex) of the certificate served, which join tokens carry for agents to pin.
    pub cert_pin: Option<String>,
    /// Failed dashboard logins, lockouts.
    pub logins: Arc<LoginGuard>,
    /// `POST /join` tries per client address.
    pub join_limit: Arc<RateLimit>,
    /// Failure logs, one line per burst.
    pub bursts: Arc<Bursts>,
    /// How long a console ticket is valid; the console proxy's default when unset.
    pub console_ticket_ttl: Option<Duration>,
    /// The nodes' latest figures, which `/metrics` serves.
    pub metrics: Arc<crate::metrics::Hub>,
    /// The dashboard's graphs of every VM and node.
    pub graphs: Arc<crate::metrics::graphs::Graphs>,
    /// The largest WebSocket message a console or tunnel accepts.
    pub websocket_max_message: usize,
}

/// `/join`: ten tries at once from one address, then one every six seconds.
const JOIN_BURST: u32 = 10;
const JOIN_EVERY: Duration = Duration::from_secs(6);

impl AppState {
    pub fn new(store: Store, data_dir: PathBuf, install_id: String) -> Self {
        AppState {
            store,
            graphs: Arc::new(crate::metrics::graphs::Graphs::new(
                &data_dir.join("graphs"),
            )),
            data_dir,
            install_id,
            local_node: None,
            tls: false,
            cert_pin: None,
            logins: Default::default(),
            join_limit: Arc::new(RateLimit::new(JOIN_BURST, JOIN_EVERY)),
            bursts: Default::default(),
            console_ticket_ttl: None,
            metrics: Default::default(),
            websocket_max_message: conn::Limits::default().websocket_max_message,
        }
    }

    pub fn images_dir(&self) -> PathBuf {
        self.data_dir.join("images")
    }
}

/// The peer of a request, as an extractor (absent for in-process calls).
pub type Peer = Option<axum::Extension<ConnectInfo<SocketAddr>>>;

/// The client's address as the connection shows it (never a header a client could set);
/// unspecified for in-process calls.
pub fn peer_ip(p: &Peer) -> IpAddr {
    p.as_ref()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.0.ip())
}
