//! What keeps clients without a login (and careless ones with) from exhausting the appliance:
//!
//! - [`Pool`]: CPU-heavy work (password hashes, large bodies) runs on blocking threads, a few
//!   at a time, with a short queue that sheds the rest with 429. The async workers stay free
//!   for `/healthz` and everyone else.
//! - [`LoginGuard`]: failed logins per (user, client address) and per client address lock
//!   that pair or address out for a while (60 s, doubling to 15 min); a user with many
//!   failures from anywhere is slowed down. Administrators see and clear lockouts.
//! - [`RateLimit`]: a token bucket per client address (`/join`).
//! - [`Bursts`]: repeated failures are logged once when they start and once per minute with
//!   a count, never once per try, and never silently.
//!
//! State is in memory and bounded: a restart forgets it, which a locked-out user may use.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::http::StatusCode;
use tokio::sync::Semaphore;

use super::error::ApiError;

/// Entries a map keeps before it forgets the idle ones (and then the oldest).
const MAX_ENTRIES: usize = 10_000;

/// The address limits apply to: an IPv6 client usually has a whole /64, so that is one
/// client; an IPv4-mapped address is its IPv4 address.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
        v4 => v4,
    }
}

/// A user name as the limits and logs keep it: never more than 64 characters.
fn short(user: &str) -> String {
    user.chars().take(64).collect()
}

/// Forget the oldest tenth of a full map (by the time each entry was last touched).
fn evict_oldest<K: Clone + std::hash::Hash + Eq, V>(
    map: &mut HashMap<K, V>,
    last: impl Fn(&V) -> Instant,
) {
    let mut ages: Vec<(Instant, K)> = map.iter().map(|(k, v)| (last(v), k.clone())).collect();
    ages.sort_by_key(|(t, _)| *t);
    for (_, k) in ages.into_iter().take(MAX_ENTRIES / 10) {
        map.remove(&k);
    }
}

// ---------------------------------------------------------------- pools

/// A bounded pool for blocking, CPU-heavy work.
pub struct Pool {
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_waiting: usize,
}

/// The pool is full: the caller should answer 429.
#[derive(Debug)]
pub struct Busy;

impl Busy {
    /// 429 with `Retry-After: 1`.
    pub fn into_error(self, what: &str) -> ApiError {
        ApiError::too_many(format!("the server is busy {what}; retry in a second"), 1)
    }
}

/// Decrements the waiting count however the wait ends (a client may go away).
struct Waiting<'a>(&'a AtomicUsize);
impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Pool {
    pub fn new(workers: usize, max_waiting: usize) -> Pool {
        Pool {
            permits: Arc::new(Semaphore::new(workers)),
            waiting: AtomicUsize::new(0),
            max_waiting,
        }
    }

    /// Parsing large request bodies.
    pub fn parsing() -> &'static Pool {
        static P: LazyLock<Pool> = LazyLock::new(|| Pool::new(2, 32));
        &P
    }

    /// Password checks: argon2 takes about 19 MiB and tens of milliseconds each.
    pub fn passwords() -> &'static Pool {
        static P: LazyLock<Pool> = LazyLock::new(|| Pool::new(2, 16));
        &P
    }

    /// Run `f` on a blocking thread once a worker is free; [`Busy`] at once if the queue is
    /// full. A started job finishes (and holds its worker) even if the caller goes away.
    pub async fn run<T, F>(&self, f: F) -> Result<T, Busy>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_waiting {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Busy);
        }
        let permit = {
            let _w = Waiting(&self.waiting);
            self.permits
                .clone()
                .acquire_owned()
                .await
                .expect("the pool's semaphore is never closed")
        };
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f()
        })
        .await
        .map_err(|_| Busy)
    }
}

// ---------------------------------------------------------------- gates

/// A bounded number of holders at a time (large listings being built and sent); the others
/// wait in a bounded queue for a while, and past that are shed with [`Busy`] (429 with
/// `Retry-After`), never with a 5xx and never with memory growing with the number of
/// clients.
pub struct Gate {
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_waiting: usize,
    max_wait: Duration,
}

impl Gate {
    pub fn new(holders: usize, max_waiting: usize, max_wait: Duration) -> Gate {
        Gate {
            permits: Arc::new(Semaphore::new(holders)),
            waiting: AtomicUsize::new(0),
            max_waiting,
            max_wait,
        }
    }

    /// Full listings (LIST without a small limit, the start of a watch): each holds its
    /// items' JSON until its answer is sent, so only a few are built at once. Two cores
    /// serve two at a time at full speed; the queue evens out bursts of clients.
    pub fn listings() -> &'static Gate {
        static G: LazyLock<Gate> = LazyLock::new(|| Gate::new(4, 1024, Duration::from_secs(60)));
        &G
    }

    /// Wait for a turn; [`Busy`] when the queue is full or the wait is over.
    pub async fn enter(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Busy> {
        if let Ok(p) = self.permits.clone().try_acquire_owned() {
            return Ok(p);
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_waiting {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Busy);
        }
        let _w = Waiting(&self.waiting);
        match tokio::time::timeout(self.max_wait, self.permits.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            _ => Err(Busy),
        }
    }
}

// ---------------------------------------------------------------- logins

/// Failures before a (user, address) pair is locked out.
pub const USER_ADDR_FAILURES: u32 = 5;
/// Failures from one address (any user) before it is locked out.
pub const ADDR_FAILURES: u32 = 20;
/// Failures for one user (any address) after which each try waits [`USER_SLOWDOWN`].
pub const USER_FAILURES_SLOW: u32 = 30;
pub const USER_SLOWDOWN: Duration = Duration::from_secs(1);
/// The first lockout; each next one doubles, up to [`MAX_LOCK`].
pub const FIRST_LOCK: Duration = Duration::from_secs(60);
pub const MAX_LOCK: Duration = Duration::from_secs(15 * 60);
/// Failures older than this are forgotten.
const WINDOW: Duration = Duration::from_secs(15 * 60);

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    UserAddr(String, IpAddr),
    Addr(IpAddr),
    User(String),
}

#[derive(Clone, Debug)]
struct Entry {
    /// Failures counted towards the next lock (reset when one starts).
    failures: u32,
    /// Failures in the window, for administrators.
    total: u32,
    /// Tries under way (counted against the limit until they end).
    in_flight: u32,
    lockouts: u32,
    locked_until: Option<Instant>,
    last: Instant,
}

impl Entry {
    fn new(now: Instant) -> Entry {
        Entry {
            failures: 0,
            total: 0,
            in_flight: 0,
            lockouts: 0,
            locked_until: None,
            last: now,
        }
    }
    fn locked(&self, now: Instant) -> Option<Duration> {
        self.locked_until
            .filter(|u| *u > now)
            .map(|u| u.duration_since(now))
    }
    fn idle(&self, now: Instant) -> bool {
        self.in_flight == 0 && self.locked(now).is_none() && now.duration_since(self.last) > WINDOW
    }
}

/// A lockout as an administrator sees it.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Lockout {
    pub user: Option<String>,
    pub address: Option<String>,
    pub failures: u32,
    pub locked_until: Option<String>,
}

/// Why a login may not be tried now.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Locked out for this long.
    Locked(Duration),
}

/// The record of failed logins.
#[derive(Default)]
pub struct LoginGuard {
    entries: Mutex<HashMap<Key, Entry>>,
}

/// A login try under way; [`LoginGuard::finish`] ends it.
#[must_use]
pub struct Attempt {
    user: String,
    addr: IpAddr,
    /// How long to wait before checking the password (the user is under attack).
    pub delay: Duration,
}

impl LoginGuard {
    fn keys(user: &str, addr: IpAddr) -> [(Key, u32); 3] {
        let (user, addr) = (short(user), client_key(addr));
        [
            (Key::UserAddr(user.clone(), addr), USER_ADDR_FAILURES),
            (Key::Addr(addr), ADDR_FAILURES),
            (Key::User(user), u32::MAX),
        ]
    }

    /// Start a login try, or refuse it without checking anything.
    pub fn begin(&self, user: &str, addr: IpAddr) -> Result<Attempt, Refusal> {
        self.begin_at(user, addr, Instant::now())
    }

    fn begin_at(&self, user: &str, addr: IpAddr, now: Instant) -> Result<Attempt, Refusal> {
        let mut map = self.entries.lock().expect("login guard lock");
        if map.len() >= MAX_ENTRIES {
            map.retain(|_, e| !e.idle(now));
            if map.len() >= MAX_ENTRIES {
                evict_oldest(&mut map, |e| e.last);
            }
        }
        let keys = Self::keys(user, addr);
        for (k, limit) in &keys {
            if let Some(e) = map.get(k) {
                if let Some(left) = e.locked(now) {
                    return Err(Refusal::Locked(left));
                }
                // Tries under way count: a hundred at once get no more guesses than five.
                if e.failures + e.in_flight >= *limit {
                    return Err(Refusal::Locked(Duration::from_secs(1)));
                }
            }
        }
        let mut delay = Duration::ZERO;
        for (k, _) in keys {
            let e = map.entry(k.clone()).or_insert_with(|| Entry::new(now));
            if now.duration_since(e.last) > WINDOW && e.locked(now).is_none() {
                e.failures = 0;
                e.total = 0;
            }
            e.in_flight += 1;
            e.last = now;
            if matches!(k, Key::User(_)) && e.failures >= USER_FAILURES_SLOW {
                delay = USER_SLOWDOWN;
            }
        }
        Ok(Attempt {
            user: short(user),
            addr,
            delay,
        })
    }

    /// End a try: a success forgets the pair's failures; a failure may lock the pair or the
    /// address. Returns the lock it started, if any.
    pub fn finish(&self, a: Attempt, ok: bool) -> Option<Duration> {
        self.finish_at(a, ok, Instant::now())
    }

    fn finish_at(&self, a: Attempt, ok: bool, now: Instant) -> Option<Duration> {
        let mut map = self.entries.lock().expect("login guard lock");
        let mut started = None;
        for (k, limit) in Self::keys(&a.user, a.addr) {
            let Some(e) = map.get_mut(&k) else { continue };
            e.in_flight = e.in_flight.saturating_sub(1);
            if ok {
                if matches!(k, Key::UserAddr(..)) {
                    e.failures = 0;
                    e.total = 0;
                    e.lockouts = 0;
                }
                continue;
            }
            e.failures += 1;
            e.total += 1;
            e.last = now;
            if e.failures >= limit {
                let lock = FIRST_LOCK
                    .saturating_mul(1u32 << e.lockouts.min(8))
                    .min(MAX_LOCK);
                e.lockouts += 1;
                e.failures = 0;
                e.locked_until = Some(now + lock);
                started = Some(started.map_or(lock, |s: Duration| s.max(lock)));
            }
        }
        started
    }

    /// End a try that checked nothing (the server was busy): it counts neither way.
    pub fn abandon(&self, a: Attempt) {
        let mut map = self.entries.lock().expect("login guard lock");
        for (k, _) in Self::keys(&a.user, a.addr) {
            if let Some(e) = map.get_mut(&k) {
                e.in_flight = e.in_flight.saturating_sub(1);
            }
        }
    }

    /// Current lockouts and failure counts, for administrators.
    pub fn list(&self) -> Vec<Lockout> {
        let (now, wall) = (Instant::now(), SystemTime::now());
        let map = self.entries.lock().expect("login guard lock");
        let mut out: Vec<(Key, Lockout)> = map
            .iter()
            .filter(|(_, e)| e.total > 0 || e.locked(now).is_some())
            .map(|(k, e)| {
                let (user, address) = match k {
                    Key::UserAddr(u, a) => (Some(u.clone()), Some(a.to_string())),
                    Key::Addr(a) => (None, Some(a.to_string())),
                    Key::User(u) => (Some(u.clone()), None),
                };
                // The wall-clock time is derived when shown: the lock itself is monotonic.
                let locked_until = e
                    .locked(now)
                    .map(|left| chrono::DateTime::<chrono::Utc>::from(wall + left).to_rfc3339());
                (
                    k.clone(),
                    Lockout {
                        user,
                        address,
                        failures: e.total,
                        locked_until,
                    },
                )
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.into_iter().map(|(_, l)| l).collect()
    }

    /// Forget failures and lockouts of a user and/or an address (both `None`: all).
    /// Returns how many records were cleared.
    pub fn clear(&self, user: Option<&str>, addr: Option<IpAddr>) -> usize {
        let (user, addr) = (user.map(short), addr.map(client_key));
        let user = user.as_deref();
        let mut map = self.entries.lock().expect("login guard lock");
        let before = map.len();
        map.retain(|k, _| {
            let (u, a) = match k {
                Key::UserAddr(u, a) => (Some(u.as_str()), Some(*a)),
                Key::Addr(a) => (None, Some(*a)),
                Key::User(u) => (Some(u.as_str()), None),
            };
            let hit = match (user, addr) {
                (None, None) => true,
                (Some(wu), None) => u == Some(wu),
                (None, Some(wa)) => a == Some(wa),
                (Some(wu), Some(wa)) => {
                    (u == Some(wu) && a == Some(wa))
                        || (u.is_none() && a == Some(wa))
                        || (a.is_none() && u == Some(wu))
                }
            };
            !hit
        });
        before - map.len()
    }
}

// ---------------------------------------------------------------- rate limits

/// A token bucket per client address.
pub struct RateLimit {
    burst: f64,
    per_second: f64,
    buckets: Mutex<HashMap<IpAddr, (f64, Instant)>>,
}

impl RateLimit {
    pub fn new(burst: u32, every: Duration) -> RateLimit {
        RateLimit {
            burst: burst as f64,
            per_second: 1.0 / every.as_secs_f64(),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Take a token for `addr`, or say how long until one is there.
    pub fn take(&self, addr: IpAddr) -> Result<(), Duration> {
        self.take_at(addr, Instant::now())
    }

    fn take_at(&self, addr: IpAddr, now: Instant) -> Result<(), Duration> {
        let mut map = self.buckets.lock().expect("rate limit lock");
        if map.len() >= MAX_ENTRIES {
            let (burst, rate) = (self.burst, self.per_second);
            map.retain(|_, (t, at)| *t + now.duration_since(*at).as_secs_f64() * rate < burst);
            if map.len() >= MAX_ENTRIES {
                evict_oldest(&mut map, |(_, at)| *at);
            }
        }
        let (tokens, at) = map.entry(client_key(addr)).or_insert((self.burst, now));
        *tokens =
            (*tokens + now.duration_since(*at).as_secs_f64() * self.per_second).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - *tokens) / self.per_second))
        }
    }
}

/// 429 with `Retry-After`, as a `Status`.
pub fn too_many(message: String, retry_after: Duration) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut r =
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", message).into_response();
    r.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        retry_after_secs(retry_after).into(),
    );
    r
}

/// Whole seconds for `Retry-After`, at least one.
pub fn retry_after_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0).max(u64::from(d.is_zero()))
}

// ---------------------------------------------------------------- logs

/// How long one burst of failures is summed up before its count is logged.
const BURST_WINDOW: Duration = Duration::from_secs(60);

type BurstKey = (&'static str, Option<IpAddr>);

/// Failure logs in bursts: the first failure of a burst is logged at once, the rest are
/// counted and logged as one line when the burst's minute is over.
#[derive(Default)]
pub struct Bursts {
    /// Per (kind of failure, address; `None` once too many addresses): the count since the
    /// burst's first line, and the latest detail.
    open: Mutex<HashMap<BurstKey, (u64, String)>>,
}

impl Bursts {
    /// Log a failure of kind `what` from `addr`.
    pub fn record(self: &Arc<Self>, what: &'static str, addr: IpAddr, detail: String) {
        self.record_key(what, Some(addr), detail)
    }

    /// Log a failure of kind `what` from whichever address, counted with every other
    /// address's (floods from many addresses at once: connections refused or evicted);
    /// the detail should name the address.
    pub fn record_any(self: &Arc<Self>, what: &'static str, detail: String) {
        self.record_key(what, None, detail)
    }

    fn record_key(self: &Arc<Self>, what: &'static str, addr: Option<IpAddr>, detail: String) {
        let mut map = self.open.lock().expect("bursts lock");
        // Past this many addresses at once, further ones are counted together.
        let key = if map.len() >= 1_000 && !map.contains_key(&(what, addr)) {
            (what, None)
        } else {
            (what, addr)
        };
        if let Some((count, last)) = map.get_mut(&key) {
            *count += 1;
            *last = detail;
            return;
        }
        match key.1 {
            Some(addr) => {
                tracing::warn!(from = %addr, "{what}: {detail} (further ones from this address in the next minute are counted, not logged)")
            }
            None => tracing::warn!(
                "{what}: {detail} (further ones in the next minute, from any address, are counted, not logged)"
            ),
        }
        map.insert(key, (0, detail));
        drop(map);
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(BURST_WINDOW).await;
            let ended = me.open.lock().expect("bursts lock").remove(&key);
            if let Some((n, last)) = ended
                && n > 0
            {
                let from = key
                    .1
                    .map_or("several addresses".to_string(), |a| a.to_string());
                tracing::warn!(from = %from, count = n, "{what}: {n} more in the last minute (last: {last})");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_pair_is_locked_after_five_failures_and_the_lock_doubles() {
        let g = LoginGuard::default();
        let now = Instant::now();
        let a = ip("10.0.0.1");
        for i in 0..USER_ADDR_FAILURES {
            let t = g.begin_at("admin", a, now).unwrap();
            let lock = g.finish_at(t, false, now);
            assert_eq!(lock.is_some(), i + 1 == USER_ADDR_FAILURES);
        }
        assert_eq!(
            g.begin_at("admin", a, now).err(),
            Some(Refusal::Locked(FIRST_LOCK))
        );
        // Another address may still log in as admin, and this address as someone else.
        assert!(g.begin_at("admin", ip("10.0.0.2"), now).is_ok());
        let later = now + FIRST_LOCK + Duration::from_secs(1);
        for _ in 0..USER_ADDR_FAILURES {
            let t = g.begin_at("admin", a, later).unwrap();
            g.finish_at(t, false, later);
        }
        assert_eq!(
            g.begin_at("admin", a, later).err(),
            Some(Refusal::Locked(FIRST_LOCK * 2))
        );
        assert!(!g.list().is_empty());
        assert!(g.clear(Some("admin"), None) > 0);
        assert!(g.begin_at("admin", a, later).is_ok());
    }

    #[test]
    fn tries_under_way_count_and_success_forgets() {
        let g = LoginGuard::default();
        let now = Instant::now();
        let a = ip("10.0.0.1");
        let tries: Vec<_> = (0..USER_ADDR_FAILURES)
            .map(|_| g.begin_at("u", a, now).unwrap())
            .collect();
        assert!(g.begin_at("u", a, now).is_err(), "a sixth concurrent try");
        for t in tries {
            g.finish_at(t, true, now);
        }
        assert!(g.begin_at("u", a, now).is_ok());
    }

    #[test]
    fn an_address_is_locked_for_every_user() {
        let g = LoginGuard::default();
        let now = Instant::now();
        let a = ip("10.0.0.9");
        for i in 0..ADDR_FAILURES {
            let t = g.begin_at(&format!("user{i}"), a, now).unwrap();
            g.finish_at(t, false, now);
        }
        assert!(g.begin_at("someone-else", a, now).is_err());
        assert!(g.begin_at("someone-else", ip("10.0.0.10"), now).is_ok());
        assert_eq!(g.clear(None, Some(a)), ADDR_FAILURES as usize + 1);
        assert!(g.begin_at("someone-else", a, now).is_ok());
    }

    #[test]
    fn a_user_attacked_from_everywhere_is_slowed() {
        let g = LoginGuard::default();
        let now = Instant::now();
        for i in 0..USER_FAILURES_SLOW {
            let t = g
                .begin_at("admin", ip(&format!("10.1.{}.{}", i / 200, i % 200)), now)
                .unwrap();
            assert_eq!(t.delay, Duration::ZERO);
            g.finish_at(t, false, now);
        }
        let t = g.begin_at("admin", ip("10.9.9.9"), now).unwrap();
        assert_eq!(t.delay, USER_SLOWDOWN);
    }

    #[test]
    fn the_bucket_allows_a_burst_then_one_per_period() {
        let r = RateLimit::new(3, Duration::from_secs(6));
        let (a, now) = (ip("10.0.0.1"), Instant::now());
        for _ in 0..3 {
            r.take_at(a, now).unwrap();
        }
        let wait = r.take_at(a, now).unwrap_err();
        assert!(
            wait > Duration::from_secs(5) && wait <= Duration::from_secs(6),
            "{wait:?}"
        );
        assert!(r.take_at(ip("10.0.0.2"), now).is_ok());
        assert!(r.take_at(a, now + Duration::from_secs(6)).is_ok());
    }

    #[test]
    fn limits_key_ipv6_clients_by_their_64_and_stay_bounded() {
        assert_eq!(
            client_key(ip("2001:db8::1")),
            client_key(ip("2001:db8::ffff:1"))
        );
        assert_ne!(
            client_key(ip("2001:db8::1")),
            client_key(ip("2001:db8:0:1::1"))
        );
        assert_eq!(client_key(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        let r = RateLimit::new(1, Duration::from_secs(60));
        let now = Instant::now();
        for i in 0..(MAX_ENTRIES as u32 + 500) {
            let _ = r.take_at(IpAddr::V4(i.into()), now);
        }
        assert!(r.buckets.lock().unwrap().len() <= MAX_ENTRIES);
        let g = LoginGuard::default();
        for i in 0..(MAX_ENTRIES as u32 + 500) {
            let t = g.begin_at("u", IpAddr::V4(i.into()), now).unwrap();
            g.finish_at(t, false, now);
        }
        assert!(g.entries.lock().unwrap().len() <= MAX_ENTRIES + 3);
    }

    #[tokio::test]
    async fn the_pool_sheds_past_its_queue() {
        let pool = Arc::new(Pool::new(1, 1));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = Arc::new(Mutex::new(rx));
        let job = |pool: Arc<Pool>, rx: Arc<Mutex<std::sync::mpsc::Receiver<()>>>| {
            tokio::spawn(async move { pool.run(move || rx.lock().unwrap().recv().is_ok()).await })
        };
        let running = job(pool.clone(), rx.clone());
        while pool.permits.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        let queued = job(pool.clone(), rx.clone());
        while pool.waiting.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        assert!(pool.run(|| true).await.is_err(), "a third job is shed");
        tx.send(()).unwrap();
        tx.send(()).unwrap();
        assert!(running.await.unwrap().unwrap());
        assert!(queued.await.unwrap().unwrap());
        assert_eq!(pool.waiting.load(Ordering::SeqCst), 0);
        assert!(pool.run(|| true).await.unwrap());
    }

    /// The gate lets its holders in, queues a bounded number of others, sheds the rest at
    /// once and the queued ones after their wait, and its 429 carries Retry-After.
    #[tokio::test]
    async fn the_gate_queues_a_few_then_sheds_with_retry_after() {
        let gate = Arc::new(Gate::new(1, 1, Duration::from_millis(200)));
        let held = gate.enter().await.unwrap();
        let g = gate.clone();
        let queued = tokio::spawn(async move { g.enter().await.map(drop) });
        while gate.waiting.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        let shed = gate.enter().await.expect_err("the queue is full");
        let r = axum::response::IntoResponse::into_response(shed.into_error("listing"));
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[axum::http::header::RETRY_AFTER], "1");
        assert!(queued.await.unwrap().is_err(), "waited past max_wait");
        drop(held);
        assert!(gate.enter().await.is_ok());
        assert_eq!(gate.waiting.load(Ordering::SeqCst), 0);
    }
}
