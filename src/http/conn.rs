//! Who may hold a connection, and for how long. One client on the LAN, without a login,
//! must not be able to make the appliance unreachable by opening connections and sending
//! nothing (or half a request line) on them, so:
//!
//! - **Timeouts** ([`Limits::header_read_timeout`], [`Limits::idle_timeout`]): a new
//!   connection has 10 s to finish its TLS handshake and the head of its first request; a
//!   kept-alive one with no request in flight is closed after 2 minutes of quiet, or 10 s
//!   after it began to send a next request it does not finish; a response the client does
//!   not read for 2 minutes ends the connection. Upgraded connections (consoles, tunnels)
//!   are the upgrade's own business.
//! - **Caps** ([`Tracker`]): connections that have not yet carried an authenticated request
//!   are capped per client address (an IPv6 client is its /64) and in all; once a request
//!   on a connection authenticates (a token, a session, a console ticket) the connection
//!   leaves both caps, so the connections of agents, of a logged-in dashboard and of the
//!   CLI never compete with strangers'. Only [`Limits::max_connections`] bounds them, kept
//!   below the process's file limit so that `accept`, SQLite, libvirt and the launchers'
//!   sockets always have descriptors left.
//! - **Fair eviction**: a full cap does not simply refuse the newcomer. When its own
//!   address is at its cap, the oldest idle unauthenticated connection of that address is
//!   closed for it (a flood only churns itself); when the total is full, the oldest idle one
//!   of the address holding the most is closed, if that address holds more than the
//!   newcomer's would. So an address with few connections always gets in, however many
//!   addresses flood. Only when nothing can be evicted is the newcomer refused.
//!
//! The HTTP shell (`crate::shell::listen`) asks [`Tracker::admit`] for every accepted
//! socket, keeps the [`Slot`] with the socket, and reports activity through
//! [`ConnState`]; the authenticating code calls [`authenticated`].

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::throttle::client_key;

/// The limits of the HTTP listener (`serve` flags of the same names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// From accept to the end of the first request's head (TLS handshake included); and
    /// from the first byte of a next request on a kept-alive connection to its head's end.
    pub header_read_timeout: Duration,
    /// How long a connection with no request in flight stays open, and how long a response
    /// may wait for the client to read it.
    pub idle_timeout: Duration,
    /// All connections at once, authenticated or not.
    pub max_connections: usize,
    /// Connections that have not carried an authenticated request, in all.
    pub max_unauthenticated: usize,
    /// Connections that have not carried an authenticated request, per client address.
    pub max_unauthenticated_per_address: usize,
    /// Concurrent streams on one HTTP/2 connection.
    pub http2_max_streams: u32,
    /// The largest WebSocket message (and frame) a console or tunnel accepts.
    pub websocket_max_message: usize,
}

/// Descriptors kept back from connections for the store, libvirt, the launchers' sockets,
/// images and logs.
pub const FILES_RESERVED: u64 = 1024;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            max_connections: 16_384,
            max_unauthenticated: 1024,
            max_unauthenticated_per_address: 128,
            http2_max_streams: 256,
            websocket_max_message: 1 << 20,
        }
    }
}

impl Limits {
    /// The defaults, with `max_connections` lowered to fit a process allowed `nofile` open
    /// files ([`FILES_RESERVED`] of them kept back, and never fewer than half), and the
    /// unauthenticated caps to fit that.
    pub fn for_file_limit(nofile: u64) -> Limits {
        let mut l = Limits::default();
        let budget = nofile.saturating_sub(FILES_RESERVED).max(nofile / 2) as usize;
        l.max_connections = l.max_connections.min(budget).max(1);
        l.max_unauthenticated = l.max_unauthenticated.min(l.max_connections / 2).max(1);
        l.max_unauthenticated_per_address =
            l.max_unauthenticated_per_address.min(l.max_unauthenticated);
        l
    }

    /// What is wrong with a set of limits, said for the operator.
    pub fn check(&self, nofile: u64) -> Result<(), String> {
        if self.header_read_timeout.is_zero() || self.idle_timeout.is_zero() {
            return Err("header_read_timeout and idle_timeout must be at least 1 s".into());
        }
        if self.max_connections == 0
            || self.max_unauthenticated == 0
            || self.max_unauthenticated_per_address == 0
            || self.http2_max_streams == 0
        {
            return Err("connection and stream limits must be at least 1".into());
        }
        if self.max_unauthenticated > self.max_connections {
            return Err(format!(
                "max_unauthenticated ({}) is more than max_connections ({})",
                self.max_unauthenticated, self.max_connections
            ));
        }
        if self.max_unauthenticated_per_address > self.max_unauthenticated {
            return Err(format!(
                "max_unauthenticated_per_address ({}) is more than max_unauthenticated ({})",
                self.max_unauthenticated_per_address, self.max_unauthenticated
            ));
        }
        if self.max_connections as u64 + FILES_RESERVED / 4 > nofile {
            return Err(format!(
                "max_connections ({}) does not fit this process's open-file limit ({nofile}) \
                 with room for its own files: lower it or raise LimitNOFILE",
                self.max_connections
            ));
        }
        if self.websocket_max_message < 64 << 10 {
            return Err("websocket_max_message must be at least 65536 bytes".into());
        }
        Ok(())
    }
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Every connection slot is taken and none could be freed.
    Total,
    /// The address's unauthenticated connections are at their cap, all of them busy.
    PerAddress,
    /// The unauthenticated connections are at their cap and no address holds more than
    /// this one would.
    Unauthenticated,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::Total => "every connection slot is taken (max_connections)",
            Refusal::PerAddress => {
                "this address holds its most connections without a login, all busy \
                 (max_unauthenticated_per_address)"
            }
            Refusal::Unauthenticated => {
                "the connections without a login are at their cap (max_unauthenticated)"
            }
        })
    }
}

/// Connections in and out, for `/metrics` and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub open: usize,
    pub unauthenticated: usize,
    pub refused: u64,
    pub evicted: u64,
}

/// Every connection of one listener.
pub struct Tracker {
    limits: Limits,
    epoch: Instant,
    next_id: AtomicU64,
    refused: AtomicU64,
    evicted: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Open connections, counting evicted ones until their socket is closed.
    open: usize,
    /// Of those, evicted ones whose socket is still being closed.
    closing: usize,
    unauthenticated: usize,
    /// The unauthenticated connections of each client address, oldest (lowest id) first.
    by_address: HashMap<IpAddr, BTreeMap<u64, Arc<ConnState>>>,
}

impl Inner {
    fn live(&self) -> usize {
        self.open - self.closing
    }
}

/// What is known of one connection while it is open. Times are milliseconds since the
/// tracker's epoch, plus one (0 means "not set").
pub struct ConnState {
    id: u64,
    key: IpAddr,
    tracker: Arc<Tracker>,
    /// Still in its address's list of unauthenticated connections.
    listed: AtomicBool,
    evicted: AtomicBool,
    close: CancellationToken,
    in_flight: AtomicUsize,
    requests: AtomicU64,
    accepted_at: u64,
    idle_since: AtomicU64,
    read_while_idle: AtomicU64,
    write_blocked_since: AtomicU64,
}

/// A connection's place in the tracker; released when dropped (kept with the socket, so
/// an upgraded connection keeps its place until it closes).
pub struct Slot(Arc<ConnState>);

/// A request extension: the connection the request came on.
#[derive(Clone)]
pub struct Conn(pub Arc<ConnState>);

impl Tracker {
    pub fn new(limits: Limits) -> Arc<Tracker> {
        Arc::new(Tracker {
            limits,
            epoch: Instant::now(),
            next_id: AtomicU64::new(1),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            inner: Mutex::new(Inner::default()),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// The instant of a tracker time.
    fn instant(&self, t: u64) -> Instant {
        self.epoch + Duration::from_millis(t.saturating_sub(1))
    }

    pub fn counts(&self) -> Counts {
        let g = self.inner.lock().expect("connection tracker lock");
        Counts {
            open: g.live(),
            unauthenticated: g.unauthenticated,
            refused: self.refused.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
        }
    }

    /// A slot for a new connection from `ip`, evicting an idle unauthenticated one to make
    /// room where that is fair (see the module's text), or why not. With the slot: the
    /// address (as the caps count it) whose connection was evicted for it, if one was.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<(Slot, Option<IpAddr>), Refusal> {
        let key = client_key(ip);
        let l = &self.limits;
        let mut g = self.inner.lock().expect("connection tracker lock");
        let held = |g: &Inner| g.by_address.get(&key).map_or(0, BTreeMap::len);
        let refused = |r| {
            self.refused.fetch_add(1, Ordering::Relaxed);
            Err(r)
        };
        let mut evicted = None;
        if g.live() >= l.max_connections {
            let mine = held(&g);
            evicted = self.evict_fairly(&mut g, key, mine);
            if evicted.is_none() {
                return refused(Refusal::Total);
            }
        }
        // Counted again: an eviction for the total may have freed this address's place.
        let mine = held(&g);
        if mine >= l.max_unauthenticated_per_address {
            evicted = self.evict_oldest_idle(&mut g, key);
            if evicted.is_none() {
                return refused(Refusal::PerAddress);
            }
        } else if g.unauthenticated >= l.max_unauthenticated {
            evicted = self.evict_fairly(&mut g, key, mine);
            if evicted.is_none() {
                return refused(Refusal::Unauthenticated);
            }
        }
        let now = self.now();
        let state = Arc::new(ConnState {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            key,
            tracker: self.clone(),
            listed: AtomicBool::new(true),
            evicted: AtomicBool::new(false),
            close: CancellationToken::new(),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            accepted_at: now,
            idle_since: AtomicU64::new(now),
            read_while_idle: AtomicU64::new(0),
            write_blocked_since: AtomicU64::new(0),
        });
        g.open += 1;
        g.unauthenticated += 1;
        g.by_address
            .entry(key)
            .or_default()
            .insert(state.id, state.clone());
        Ok((Slot(state), evicted))
    }

    /// Evict from the address holding the most unauthenticated connections, if that is
    /// `key` itself or holds more than `key` would with the newcomer (`mine + 1`).
    fn evict_fairly(&self, g: &mut Inner, key: IpAddr, mine: usize) -> Option<IpAddr> {
        let (&top, n) = g
            .by_address
            .iter()
            .map(|(k, m)| (k, m.len()))
            .max_by_key(|&(_, n)| n)?;
        if top == key || n > mine + 1 {
            self.evict_oldest_idle(g, top)
        } else {
            None
        }
    }

    /// Close the oldest unauthenticated connection of `key` that has no request in flight.
    fn evict_oldest_idle(&self, g: &mut Inner, key: IpAddr) -> Option<IpAddr> {
        let conns = g.by_address.get_mut(&key)?;
        let id = conns
            .iter()
            .find(|(_, c)| c.in_flight.load(Ordering::SeqCst) == 0)
            .map(|(id, _)| *id)?;
        let c = conns.remove(&id).expect("listed");
        if conns.is_empty() {
            g.by_address.remove(&key);
        }
        c.listed.store(false, Ordering::SeqCst);
        c.evicted.store(true, Ordering::SeqCst);
        g.unauthenticated -= 1;
        g.closing += 1;
        c.close.cancel();
        self.evicted.fetch_add(1, Ordering::Relaxed);
        Some(key)
    }

    /// Take `c` off its address's list (authenticated, or closed).
    fn unlist(&self, g: &mut Inner, c: &ConnState) {
        if !c.listed.swap(false, Ordering::SeqCst) {
            return;
        }
        g.unauthenticated -= 1;
        if let Some(conns) = g.by_address.get_mut(&c.key) {
            conns.remove(&c.id);
            if conns.is_empty() {
                g.by_address.remove(&c.key);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let c = &self.0;
        let t = &c.tracker;
        let mut g = t.inner.lock().expect("connection tracker lock");
        t.unlist(&mut g, c);
        g.open -= 1;
        if c.evicted.load(Ordering::SeqCst) {
            g.closing -= 1;
        }
    }
}

impl Slot {
    pub fn state(&self) -> &Arc<ConnState> {
        &self.0
    }
}

/// Why the watchdog closes a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// No complete request head (or TLS handshake) within the header-read timeout.
    HeaderRead,
    /// No request in flight for the idle timeout.
    Idle,
    /// The client read none of a response for the idle timeout.
    Stalled,
}

impl std::fmt::Display for Expiry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Expiry::HeaderRead => "no complete request within the header-read timeout",
            Expiry::Idle => "idle for the idle timeout",
            Expiry::Stalled => "the client read nothing of a response for the idle timeout",
        })
    }
}

/// A request in flight on a connection; the connection is idle again once every one of
/// them is dropped (with the response's body, so a watch is in flight while it streams).
pub struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let c = &self.0;
        if c.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            c.idle_since.store(c.tracker.now(), Ordering::SeqCst);
        }
    }
}

impl ConnState {
    /// A request head arrived: the connection is busy until the returned guard drops.
    pub fn begin_request(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.requests.fetch_add(1, Ordering::SeqCst);
        self.read_while_idle.store(0, Ordering::SeqCst);
        InFlight(self.clone())
    }

    /// A request on this connection authenticated: it leaves the unauthenticated caps.
    pub fn mark_authenticated(&self) {
        if !self.listed.load(Ordering::SeqCst) {
            return;
        }
        let t = &self.tracker;
        let mut g = t.inner.lock().expect("connection tracker lock");
        t.unlist(&mut g, self);
    }

    pub fn is_authenticated(&self) -> bool {
        !self.listed.load(Ordering::SeqCst) && !self.evicted.load(Ordering::SeqCst)
    }

    /// Resolves when the tracker evicted this connection.
    pub async fn evicted(&self) {
        self.close.cancelled().await
    }

    /// Bytes arrived (the IO below TLS reports it).
    pub fn on_read(&self) {
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            let now = self.tracker.now();
            let _ =
                self.read_while_idle
                    .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    /// A write could not go out (the client's window is full), or could.
    pub fn on_write(&self, blocked: bool) {
        if blocked {
            let now = self.tracker.now();
            let _ = self.write_blocked_since.compare_exchange(
                0,
                now,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        } else if self.write_blocked_since.load(Ordering::Relaxed) != 0 {
            self.write_blocked_since.store(0, Ordering::SeqCst);
        }
    }

    /// When to look at this connection again, or why to close it now.
    pub fn due(&self) -> Result<Instant, Expiry> {
        let t = &self.tracker;
        self.due_at(t.now()).map(|ms| t.instant(ms))
    }

    fn due_at(&self, now: u64) -> Result<u64, Expiry> {
        let l = &self.tracker.limits;
        let (header, idle) = (
            l.header_read_timeout.as_millis() as u64,
            l.idle_timeout.as_millis() as u64,
        );
        let check = |deadline: u64, why: Expiry| {
            if now >= deadline {
                Err(why)
            } else {
                // Looked at again no later than a header-read timeout from now, so that a
                // deadline that moves closer (a next request begun) is not missed for long.
                Ok(deadline.min(now + header))
            }
        };
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return match self.write_blocked_since.load(Ordering::SeqCst) {
                0 => Ok(now + header),
                since => check(since + idle, Expiry::Stalled),
            };
        }
        if self.requests.load(Ordering::SeqCst) == 0 {
            return check(self.accepted_at + header, Expiry::HeaderRead);
        }
        let idle_deadline = self.idle_since.load(Ordering::SeqCst) + idle;
        match self.read_while_idle.load(Ordering::SeqCst) {
            0 => check(idle_deadline, Expiry::Idle),
            first => {
                let head = first + header;
                if head <= idle_deadline {
                    check(head, Expiry::HeaderRead)
                } else {
                    check(idle_deadline, Expiry::Idle)
                }
            }
        }
    }
}

/// Note that the request whose extensions these are authenticated (a no-op for requests
/// made in-process, which have no connection).
pub fn authenticated(ext: &axum::http::Extensions) {
    if let Some(c) = ext.get::<Conn>() {
        c.0.mark_authenticated();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn limits(total: usize, unauth: usize, per: usize) -> Limits {
        Limits {
            max_connections: total,
            max_unauthenticated: unauth,
            max_unauthenticated_per_address: per,
            ..Limits::default()
        }
    }

    #[test]
    fn a_flooding_address_churns_its_own_connections() {
        let t = Tracker::new(limits(100, 50, 4));
        let a = ip("10.0.0.1");
        let first: Vec<Slot> = (0..4).map(|_| t.admit(a).unwrap().0).collect();
        // The fifth evicts the oldest idle one of the same address.
        let (fifth, from) = t.admit(a).unwrap();
        assert_eq!(from, Some(a));
        assert!(first[0].state().close.is_cancelled());
        assert!(first[1..].iter().all(|s| !s.state().close.is_cancelled()));
        assert_eq!(t.counts().unauthenticated, 4);
        assert_eq!(t.counts().evicted, 1);
        // Busy connections are not evicted: with all four busy, the next is refused.
        let _busy: Vec<InFlight> = first[1..]
            .iter()
            .chain([&fifth])
            .map(|s| s.state().begin_request())
            .collect();
        assert_eq!(t.admit(a).err(), Some(Refusal::PerAddress));
        assert_eq!(t.counts().refused, 1);
        // Another address is not affected.
        assert!(t.admit(ip("10.0.0.2")).is_ok());
    }

    #[test]
    fn a_small_address_gets_in_when_many_addresses_flood() {
        let t = Tracker::new(limits(1000, 24, 10));
        let flood: Vec<Slot> = (0..8).map(|_| t.admit(ip("10.0.1.0")).unwrap().0).collect();
        let mut others = Vec::new();
        for i in 1..5 {
            for _ in 0..4 {
                others.push(t.admit(ip(&format!("10.0.1.{i}"))).unwrap().0);
            }
        }
        assert_eq!(t.counts().unauthenticated, 24);
        // Full: a newcomer from another address evicts from the largest (8 > 0 + 1).
        let newcomer = t.admit(ip("10.0.2.1")).unwrap().0;
        // The flooding address, still the largest, evicts its own oldest.
        let _more = t.admit(ip("10.0.1.0")).unwrap().0;
        assert_eq!(t.counts().evicted, 2);
        let gone = |v: &[Slot]| v.iter().filter(|s| s.state().close.is_cancelled()).count();
        assert_eq!((gone(&flood), gone(&others)), (2, 0));
        assert!(flood[0].state().close.is_cancelled() && flood[1].state().close.is_cancelled());
        assert!(!newcomer.state().close.is_cancelled());
        // Once balanced, a further newcomer is refused.
        let t = Tracker::new(limits(1000, 4, 4));
        let _a: Vec<Slot> = (0..2).map(|_| t.admit(ip("10.0.3.1")).unwrap().0).collect();
        let _b: Vec<Slot> = (0..2).map(|_| t.admit(ip("10.0.3.2")).unwrap().0).collect();
        let _c = t.admit(ip("10.0.3.3")).unwrap().0; // 2 > 0 + 1: evicts
        let _d = t.admit(ip("10.0.3.4")).unwrap().0; // 2 > 0 + 1: evicts
        assert_eq!(
            t.admit(ip("10.0.3.5")).err(),
            Some(Refusal::Unauthenticated)
        );
    }

    #[test]
    fn authenticated_connections_leave_the_caps_and_slots_are_released() {
        let t = Tracker::new(limits(3, 2, 2));
        let a = ip("10.0.0.1");
        let s1 = t.admit(a).unwrap().0;
        s1.state().mark_authenticated();
        assert!(s1.state().is_authenticated());
        assert_eq!(t.counts().unauthenticated, 0);
        let s2 = t.admit(a).unwrap().0;
        let _s3 = t.admit(a).unwrap().0;
        assert_eq!(t.counts().open, 3);
        // Total reached: an authenticated connection is never evicted, an idle
        // unauthenticated one of the newcomer's own address is.
        let s4 = t.admit(a).unwrap().0;
        assert!(s2.state().close.is_cancelled());
        assert!(!s1.state().close.is_cancelled());
        drop(s2);
        assert_eq!(t.counts().open, 3);
        drop(s4);
        drop(s1);
        let c = t.counts();
        assert_eq!((c.open, c.unauthenticated), (1, 1));
        // IPv6 clients are their /64.
        let t = Tracker::new(limits(10, 10, 1));
        let _x = t.admit(ip("2001:db8::1")).unwrap().0;
        let _y = t.admit(ip("2001:db8::2")).unwrap().0;
        assert_eq!(t.counts().evicted, 1);
    }

    #[test]
    fn deadlines_follow_the_connections_state() {
        let t = Tracker::new(limits(10, 10, 10));
        let s = t.admit(ip("10.0.0.1")).unwrap().0;
        let c = s.state();
        let (h, i) = (10_000, 120_000);
        let at = c.accepted_at;
        // A new connection: the header-read timeout from accept.
        assert_eq!(c.due_at(at + 1), Ok(at + h));
        assert_eq!(c.due_at(at + h), Err(Expiry::HeaderRead));
        // A request in flight: looked at again, never closed while it reads.
        let r = c.begin_request();
        assert_eq!(c.due_at(at + 5 * i), Ok(at + 5 * i + h));
        // ... unless the client stops reading the response.
        c.write_blocked_since.store(at + 100, Ordering::SeqCst);
        assert_eq!(c.due_at(at + 100 + i), Err(Expiry::Stalled));
        c.on_write(false);
        drop(r);
        // Kept alive: the idle timeout from the end of the last response...
        let idle = c.idle_since.load(Ordering::SeqCst);
        c.idle_since.store(at + 1000, Ordering::SeqCst);
        assert!(idle >= at);
        assert_eq!(c.due_at(at + 2000), Ok(at + 2000 + h));
        assert_eq!(c.due_at(at + 1000 + i), Err(Expiry::Idle));
        // ... or the header-read timeout from the first byte of a next request.
        c.read_while_idle.store(at + 3000, Ordering::SeqCst);
        assert_eq!(c.due_at(at + 3001), Ok(at + 3000 + h));
        assert_eq!(c.due_at(at + 3000 + h), Err(Expiry::HeaderRead));
    }

    #[test]
    fn default_limits_fit_the_file_limit() {
        let l = Limits::for_file_limit(1 << 20);
        assert_eq!(l, Limits::default());
        assert!(l.check(1 << 20).is_ok());
        let small = Limits::for_file_limit(1024);
        assert_eq!(small.max_connections, 512);
        assert_eq!(small.max_unauthenticated, 256);
        assert_eq!(small.max_unauthenticated_per_address, 128);
        assert!(small.check(1024).is_ok());
        assert!(Limits::default().check(4096).is_err());
        let l = Limits {
            max_unauthenticated_per_address: 2000,
            ..Limits::default()
        };
        assert!(l.check(1 << 20).unwrap_err().contains("per_address"));
    }
}
