//! The event log (every change, in resourceVersion order, so a watcher can resume), the
//! in-process fan-out to watchers, and the shared listing that watchers starting without a
//! resourceVersion begin from (one listing for all of them, as kube-apiserver's watch cache
//! serves many watchers from one copy).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use bytes::Bytes;
use serde_json::Value;
use sqlx::Row;
use tokio::sync::{OnceCell, broadcast};

use super::{Error, ListQuery, RawList, Result, Store, Tx};
use crate::types::Kind;

/// Keep this many events for watchers to resume from.
const EVENT_LOG_KEEP: i64 = 20_000;
/// And at most this many bytes of them: big objects written often would otherwise keep
/// gigabytes.
const EVENT_LOG_MAX_BYTES: i64 = 64 << 20;

/// One change, as a watch delivers it.
#[derive(Clone, Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: Kind,
    pub namespace: String,
    pub event_type: &'static str,
    pub object: Value,
    /// The object's JSON as stored.
    body: String,
    /// The watch line, encoded once for every watcher.
    line: OnceLock<Bytes>,
}

impl Event {
    pub fn new(
        rv: u64,
        kind: Kind,
        namespace: String,
        event_type: &'static str,
        object: Value,
        body: String,
    ) -> Event {
        Event {
            rv,
            kind,
            namespace,
            event_type,
            object,
            body,
            line: OnceLock::new(),
        }
    }

    /// The object's stored JSON text.
    pub fn body(&self) -> &str {
        &self.body
    }

    /// The event as one line of a JSON watch stream, encoded on first use and shared by
    /// every watcher after that.
    pub fn watch_line(&self) -> Bytes {
        self.line
            .get_or_init(|| watch_line(self.event_type, &self.body))
            .clone()
    }
}

/// `{"object":<body>,"type":"<t>"}` and a newline: what serde_json writes for
/// `json!({"type": t, "object": object})` (keys in order), from the stored text of the object.
pub fn watch_line(event_type: &str, body: &str) -> Bytes {
    let mut b = Vec::with_capacity(body.len() + 32);
    push_watch_line(&mut b, event_type, body);
    Bytes::from(b)
}

/// Append one watch line to `out`.
pub fn push_watch_line(out: &mut Vec<u8>, event_type: &str, body: &str) {
    out.extend_from_slice(b"{\"object\":");
    out.extend_from_slice(body.as_bytes());
    out.extend_from_slice(b",\"type\":\"");
    out.extend_from_slice(event_type.as_bytes());
    out.extend_from_slice(b"\"}\n");
}

fn event_type(t: &str) -> &'static str {
    match t {
        "ADDED" => "ADDED",
        "DELETED" => "DELETED",
        _ => "MODIFIED",
    }
}

/// A listing being read or read, shared by the watchers that wait for it or use it.
pub type SharedListing = Arc<OnceCell<Arc<RawList>>>;

type ListingKey = (Kind, Option<String>);

/// Listings shared by watchers, per kind and namespace; held only while a watcher uses one.
#[derive(Default)]
pub(super) struct Listings {
    by_key: Mutex<HashMap<ListingKey, Weak<OnceCell<Arc<RawList>>>>>,
}

tokio::task_local! {
    /// Who makes the changes written while a future runs in this scope: the HTTP layer
    /// scopes each authenticated request with its user, and the changes it records name
    /// them. Changes made outside any request (the controller's own) name nobody.
    pub static ACTOR: String;
}

/// One recorded change of an object, for its history.
#[derive(Debug, Clone)]
pub struct Change {
    pub rv: u64,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub change_type: String,
    /// The object as it was after the change.
    pub body: Value,
    /// When (RFC 3339), if recorded (not before schema 4).
    pub at: Option<String>,
    /// Who, if a request made it.
    pub actor: Option<String>,
}

impl Store {
    /// Subscribe to changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }

    /// The highest resourceVersion published to subscribers so far.
    pub fn published_rv(&self) -> u64 {
        self.stats.published.load(Ordering::SeqCst)
    }

    pub(super) fn publish(&self, ev: Event) {
        self.stats.published.fetch_max(ev.rv, Ordering::SeqCst);
        let _ = self.events.send(Arc::new(ev));
    }

    /// The objects of a kind (in a namespace or all), unfiltered, for a watcher that
    /// subscribed (with [`Store::subscribe`]) when [`Store::published_rv`] was `seen`.
    /// Watchers that ask at the same time share one listing: it is read once, and kept only
    /// while one of them holds it. A listing older than `seen` is never shared; the caller
    /// still checks the listing's `rv` against `seen` and reads the events in between from
    /// the log when it is older (a listing that was under way when it subscribed).
    pub async fn shared_listing(
        &self,
        kind: Kind,
        ns: Option<&str>,
        seen: u64,
    ) -> Result<(SharedListing, Arc<RawList>)> {
        let key = (kind, ns.map(str::to_string));
        let cell = {
            let mut map = self.listings.by_key.lock().expect("listings lock");
            map.retain(|_, w| w.strong_count() > 0);
            match map.get(&key).and_then(Weak::upgrade) {
                Some(c) if c.get().is_none_or(|l| l.rv >= seen) => c,
                _ => {
                    let c = Arc::new(OnceCell::new());
                    map.insert(key, Arc::downgrade(&c));
                    c
                }
            }
        };
        let list = cell
            .get_or_try_init(|| async {
                let q = ListQuery {
                    namespace: ns,
                    ..Default::default()
                };
                Ok::<_, Error>(Arc::new(self.list_raw(kind, &q).await?))
            })
            .await?
            .clone();
        Ok((cell, list))
    }

    /// Events after `rv` from the log, oldest first; [`Error::Gone`] if pruned.
    pub async fn events_since(&self, rv: u64) -> Result<Vec<Event>> {
        let (min,): (Option<i64>,) = sqlx::query_as("SELECT MIN(rv) FROM events")
            .fetch_one(&self.reader)
            .await?;
        if let Some(min) = min
            && (rv as i64) < min - 1
        {
            return Err(Error::Gone(rv));
        }
        let rows = sqlx::query(
            "SELECT rv, kind, namespace, type, body FROM events WHERE rv > ? ORDER BY rv",
        )
        .bind(rv as i64)
        .fetch_all(&self.reader)
        .await?;
        rows.into_iter()
            .map(|r| {
                let body: String = r.get("body");
                Ok(Event::new(
                    r.get::<i64, _>("rv") as u64,
                    Kind::from_name(r.get::<&str, _>("kind"))
                        .ok_or_else(|| Error::Invalid("unknown kind in event log".into()))?,
                    r.get::<String, _>("namespace"),
                    event_type(r.get::<&str, _>("type")),
                    serde_json::from_str(&body)?,
                    body,
                ))
            })
            .collect()
    }

    /// The latest `limit` changes of the objects of `kind` named `ns/name` that are the object
    /// with uid `uid` or owned by it (a VM's instances), newest first. An older object of the
    /// same name, deleted since, is another object: its changes are not this one's.
    pub async fn object_history(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        uid: &str,
        limit: u32,
    ) -> Result<Vec<Change>> {
        let rows = sqlx::query(
            "SELECT rv, type, body, at, actor FROM events WHERE kind = ? AND namespace = ? AND name = ? \
             AND (json_extract(body, '$.metadata.uid') = ? \
                  OR EXISTS (SELECT 1 FROM json_each(body, '$.metadata.ownerReferences') o \
                             WHERE json_extract(o.value, '$.uid') = ?)) \
             ORDER BY rv DESC LIMIT ?",
        )
        .bind(kind.name())
        .bind(ns)
        .bind(name)
        .bind(uid)
        .bind(uid)
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(Change {
                    rv: r.get::<i64, _>("rv") as u64,
                    change_type: r.get::<String, _>("type"),
                    body: serde_json::from_str(r.get::<&str, _>("body"))?,
                    at: r.get("at"),
                    actor: r.get("actor"),
                })
            })
            .collect()
    }

    /// Drop events older than the keep window, and the oldest ones past the size cap. Does
    /// nothing (and writes nothing) when nothing was written since the last pruning.
    pub async fn prune_events(&self) -> Result<u64> {
        let rv = self.published_rv();
        if self.stats.pruned_at.load(Ordering::SeqCst) == rv {
            return Ok(0);
        }
        let n = self.prune_events_keep(EVENT_LOG_KEEP).await?
            + self.prune_events_bytes(EVENT_LOG_MAX_BYTES).await?;
        self.stats.pruned_at.store(rv, Ordering::SeqCst);
        Ok(n)
    }

    /// Keep only the newest events that fit in `max_bytes` of bodies.
    pub async fn prune_events_bytes(&self, max_bytes: i64) -> Result<u64> {
        let r = sqlx::query(
            "DELETE FROM events WHERE rv <= (SELECT rv FROM \
               (SELECT rv, SUM(length(CAST(body AS BLOB))) OVER (ORDER BY rv DESC) AS acc FROM events) \
             WHERE acc > ? ORDER BY rv DESC LIMIT 1)",
        )
        .bind(max_bytes)
        .execute(self.w())
        .await?;
        Ok(r.rows_affected())
    }

    /// Keep only the last `keep` events (tests compact the log on purpose).
    pub async fn prune_events_keep(&self, keep: i64) -> Result<u64> {
        let r = sqlx::query(
            "DELETE FROM events WHERE rv < (SELECT value FROM counters WHERE name = 'resourceVersion') - ?",
        )
        .bind(keep)
        .execute(self.w())
        .await?;
        Ok(r.rows_affected())
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn log_event(
    tx: &mut Tx<'_>,
    kind: Kind,
    ns: &str,
    name: &str,
    event_type: &'static str,
    obj: &Value,
    body: String,
    rv: u64,
) -> Result<Event> {
    let actor = ACTOR.try_with(Clone::clone).ok();
    let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    sqlx::query(
        "INSERT INTO events (rv, kind, namespace, name, type, body, at, actor) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(rv as i64)
    .bind(kind.name())
    .bind(ns)
    .bind(name)
    .bind(event_type)
    .bind(&body)
    .bind(at)
    .bind(actor)
    .execute(&mut **tx)
    .await?;
    Ok(Event::new(
        rv,
        kind,
        ns.to_string(),
        event_type,
        obj.clone(),
        body,
    ))
}
