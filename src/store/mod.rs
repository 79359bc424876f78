//! The store: every object, user and token, in SQLite (WAL) under the data dir.
//!
//! Objects are JSON documents with a few indexed columns. Each write takes the next value of
//! one global `resourceVersion` counter, appends to the event log in the same transaction, and
//! then wakes in-process watchers. Writes go through a single connection, so concurrent API
//! clients queue instead of failing with `SQLITE_BUSY`. This is the only module with SQL.

mod accounts;
mod join;
pub use join::{JoinRefusal, JoinTokenInfo, node_user};
mod selector;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use tokio::sync::broadcast;

pub use accounts::{Session, TokenInfo, UserInfo};
pub use selector::{FieldSelector, LabelSelector};

use crate::types::{Kind, now};

/// Errors from the store; API handlers map them onto HTTP statuses.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object does not exist.
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    /// An object with that name exists already.
    #[error("{kind} {name:?} already exists")]
    AlreadyExists { kind: &'static str, name: String },
    /// The caller's resourceVersion is stale.
    #[error(
        "the object has been modified; please apply your changes to the latest version and try again"
    )]
    Conflict,
    /// A watch asked to resume from a point the event log no longer holds.
    #[error("too old resource version: {0}")]
    Gone(u64),
    /// The database was written by a newer edgevirt.
    #[error(
        "the database at {path} has schema version {found}, newer than this edgevirt knows \
         (up to {known}); run the newer edgevirt or restore the backup taken before the upgrade"
    )]
    TooNew {
        path: String,
        found: i64,
        known: i64,
    },
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored object is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Invalid(String),
    /// A query (selector, paging) that does not parse: 400, not 422.
    #[error("{0}")]
    BadQuery(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// One change, as a watch delivers it.
#[derive(Clone, Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: Kind,
    pub namespace: String,
    pub event_type: &'static str,
    pub object: Value,
}

#[derive(Clone)]
pub struct Store {
    writer: SqlitePool,
    reader: SqlitePool,
    events: broadcast::Sender<Arc<Event>>,
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The most one stored object may take, as Kubernetes' etcd allows (1.5 MiB). Every write
/// (an API write, a status from an agent, a controller's update) is held to it.
pub const OBJECT_MAX_BYTES: usize = 1536 << 10;

/// Keep this many events for watchers to resume from.
const EVENT_LOG_KEEP: i64 = 20_000;
/// And at most this many bytes of them: big objects written often would otherwise keep
/// gigabytes.
const EVENT_LOG_MAX_BYTES: i64 = 64 << 20;

impl Store {
    /// Open (creating if needed) the database file, refuse a newer schema, back it up and
    /// apply pending migrations.
    pub async fn open(path: &Path) -> Result<Store> {
        // A newer schema is refused before anything opens the file for writing, so the file
        // stays exactly as the newer edgevirt left it.
        if path.exists() {
            Self::refuse_newer(path).await?;
        }
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(opts.clone())
            .await?;
        Self::backup_before_migrating(&writer, path).await?;
        MIGRATOR.run(&writer).await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts.read_only(true))
            .await?;
        let (events, _) = broadcast::channel(4096);
        Ok(Store {
            writer,
            reader,
            events,
        })
    }

    /// The schema version of a database: its highest applied migration (0 when none).
    async fn schema_version(pool: &SqlitePool) -> Result<i64> {
        let has_table: Option<(String,)> = sqlx::query_as(
            "SELECT name FROM sqlite_master WHERE type='table' AND name='_sqlx_migrations'",
        )
        .fetch_optional(pool)
        .await?;
        if has_table.is_none() {
            return Ok(0);
        }
        let (found,): (Option<i64>,) =
            sqlx::query_as("SELECT MAX(version) FROM _sqlx_migrations WHERE success = 1")
                .fetch_one(pool)
                .await?;
        Ok(found.unwrap_or(0))
    }

    /// The highest migration this binary knows.
    pub fn known_schema() -> i64 {
        MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
    }

    /// Refuse a database with migrations this binary does not know, reading it through a
    /// read-only connection that changes nothing (not even the journal mode).
    async fn refuse_newer(path: &Path) -> Result<()> {
        let ro = SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(ro)
            .await?;
        let found = Self::schema_version(&pool).await;
        pool.close().await;
        let (found, known) = (found?, Self::known_schema());
        if found > known {
            return Err(Error::TooNew {
                path: path.display().to_string(),
                found,
                known,
            });
        }
        Ok(())
    }

    /// Before any pending migration, write a consistent copy of the database next to it
    /// (`VACUUM INTO`, safe with WAL): `<file>.bak-<schema>-<UTC timestamp>`.
    async fn backup_before_migrating(pool: &SqlitePool, path: &Path) -> Result<()> {
        let (found, known) = (Self::schema_version(pool).await?, Self::known_schema());
        let has_data: Option<(String,)> =
            sqlx::query_as("SELECT name FROM sqlite_master WHERE type='table' LIMIT 1")
                .fetch_optional(pool)
                .await?;
        if found >= known || has_data.is_none() {
            // Up to date, or a new empty database: nothing to keep.
            return Ok(());
        }
        let backup = format!(
            "{}.bak-{found}-{}",
            path.display(),
            chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ")
        );
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "VACUUM INTO '{}'",
            backup.replace('\'', "''")
        )))
        .execute(pool)
        .await?;
        tracing::info!(%backup, from = found, to = known, "backed up the database before updating its schema");
        Ok(())
    }

    /// Subscribe to changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }

    /// The current global resourceVersion.
    pub async fn current_rv(&self) -> Result<u64> {
        let (v,): (i64,) =
            sqlx::query_as("SELECT value FROM counters WHERE name = 'resourceVersion'")
                .fetch_one(&self.reader)
                .await?;
        Ok(v as u64)
    }

    pub async fn get(&self, kind: Kind, ns: &str, name: &str) -> Result<Option<Value>> {
        load(&mut *self.reader.acquire().await?, kind, ns, name).await
    }

    /// Like [`Store::get`] but a missing object is an error.
    pub async fn must_get(&self, kind: Kind, ns: &str, name: &str) -> Result<Value> {
        self.get(kind, ns, name)
            .await?
            .ok_or_else(|| Error::NotFound {
                kind: kind.name(),
                name: name.to_string(),
            })
    }

    /// List objects of a kind, optionally in one namespace, filtered by selectors; also
    /// returns the resourceVersion the list is consistent with.
    pub async fn list(
        &self,
        kind: Kind,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> Result<(Vec<Value>, u64)> {
        let mut tx = self.reader.begin().await?;
        let (rv,): (i64,) =
            sqlx::query_as("SELECT value FROM counters WHERE name = 'resourceVersion'")
                .fetch_one(&mut *tx)
                .await?;
        let rows = match (ns, fields.node_name()) {
            (_, Some(node)) => {
                sqlx::query("SELECT body FROM objects WHERE kind = ? AND node_name = ? ORDER BY namespace, name")
                    .bind(kind.name())
                    .bind(node)
                    .fetch_all(&mut *tx)
                    .await?
            }
            (Some(ns), None) => {
                sqlx::query("SELECT body FROM objects WHERE kind = ? AND namespace = ? ORDER BY name")
                    .bind(kind.name())
                    .bind(ns)
                    .fetch_all(&mut *tx)
                    .await?
            }
            (None, None) => {
                sqlx::query("SELECT body FROM objects WHERE kind = ? ORDER BY namespace, name")
                    .bind(kind.name())
                    .fetch_all(&mut *tx)
                    .await?
            }
        };
        tx.commit().await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let v: Value = serde_json::from_str(r.get::<&str, _>("body"))?;
            if ns.is_some_and(|ns| v["metadata"]["namespace"].as_str().unwrap_or("") != ns) {
                continue;
            }
            if labels.matches(&v) && fields.matches(&v) {
                out.push(v);
            }
        }
        Ok((out, rv as u64))
    }

    /// Create an object. Fills uid (unless `keep_uid` and one is present), creationTimestamp,
    /// generation and resourceVersion.
    pub async fn create(&self, kind: Kind, mut obj: Value, keep_uid: bool) -> Result<Value> {
        let (ns, name) = ns_name(kind, &obj)?;
        let mut tx = self.writer.begin().await?;
        if load(&mut tx, kind, &ns, &name).await?.is_some() {
            return Err(Error::AlreadyExists {
                kind: kind.name(),
                name,
            });
        }
        let rv = next_rv(&mut tx).await?;
        {
            let meta = meta_mut(&mut obj);
            if !(keep_uid && meta.get("uid").is_some_and(|u| u.is_string())) {
                meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            }
            meta.insert("creationTimestamp".into(), json!(now()));
            meta.insert("generation".into(), json!(1));
            meta.insert("resourceVersion".into(), json!(rv.to_string()));
            meta.remove("deletionTimestamp");
            if kind.namespaced() {
                meta.insert("namespace".into(), json!(ns));
            } else {
                meta.remove("namespace");
            }
        }
        obj["apiVersion"] = json!(kind.api_version());
        obj["kind"] = json!(kind.name());
        insert_row(&mut tx, kind, &ns, &name, &obj, rv).await?;
        let ev = log_event(&mut tx, kind, &ns, &name, "ADDED", &obj, rv).await?;
        tx.commit().await?;
        self.publish(ev);
        Ok(obj)
    }

    /// Replace an object. With `expected_rv`, fails with [`Error::Conflict`] if the stored
    /// object has moved on. Identity fields (uid, creationTimestamp) are kept from the store.
    pub async fn replace(&self, kind: Kind, obj: Value, expected_rv: Option<u64>) -> Result<Value> {
        let (ns, name) = ns_name(kind, &obj)?;
        self.update(kind, &ns, &name, move |cur| {
            if let Some(want) = expected_rv
                && rv_of(cur) != Some(want)
            {
                return Err(Error::Conflict);
            }
            let keep_status = cur.get("status").cloned();
            let mut new = obj;
            copy_identity(cur, &mut new);
            if let Some(st) = keep_status
                && new.get("status").is_none()
            {
                new["status"] = st;
            }
            *cur = new;
            Ok(())
        })
        .await
    }

    /// Read-modify-write one object in one transaction. `f` may refuse with an error, in which
    /// case nothing changes. Bumps `generation` when the spec changed. If the result has a
    /// deletionTimestamp and no finalizers, the object is removed.
    pub async fn update<F>(&self, kind: Kind, ns: &str, name: &str, f: F) -> Result<Value>
    where
        F: FnOnce(&mut Value) -> Result<()>,
    {
        let mut tx = self.writer.begin().await?;
        let old = load_existing(&mut tx, kind, ns, name).await?;
        let mut obj = old.clone();
        f(&mut obj)?;
        copy_identity(&old, &mut obj);
        if obj == old {
            tx.rollback().await?;
            return Ok(obj);
        }
        let rv = next_rv(&mut tx).await?;
        {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
            let bump = old.get("spec") != obj.get("spec");
            let meta = meta_mut(&mut obj);
            meta.insert("resourceVersion".into(), json!(rv.to_string()));
            meta.insert(
                "generation".into(),
                json!(if bump { generation + 1 } else { generation }),
            );
        }
        let finalizers_empty = obj["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|a| a.is_empty());
        remove_row(&mut tx, kind, ns, name).await?;
        let ev = if obj["metadata"].get("deletionTimestamp").is_some() && finalizers_empty {
            log_event(&mut tx, kind, ns, name, "DELETED", &obj, rv).await?
        } else {
            insert_row(&mut tx, kind, ns, name, &obj, rv).await?;
            log_event(&mut tx, kind, ns, name, "MODIFIED", &obj, rv).await?
        };
        tx.commit().await?;
        self.publish(ev);
        Ok(obj)
    }

    /// Delete an object: with finalizers it only gets a deletionTimestamp, without it is
    /// removed. `uid` is a precondition when given. Returns the object as last stored.
    pub async fn delete(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<Value> {
        let uid = uid.map(str::to_string);
        self.update(kind, ns, name, move |cur| {
            if let Some(uid) = uid
                && cur["metadata"]["uid"].as_str() != Some(uid.as_str())
            {
                return Err(Error::Conflict);
            }
            if cur["metadata"].get("deletionTimestamp").is_none() {
                meta_mut(cur).insert("deletionTimestamp".into(), json!(now()));
            }
            Ok(())
        })
        .await
    }

    /// Rename: the object moves to a new name keeping its uid and spec (one transaction).
    pub async fn rename(&self, kind: Kind, ns: &str, name: &str, new_name: &str) -> Result<Value> {
        let mut tx = self.writer.begin().await?;
        let mut old = load_existing(&mut tx, kind, ns, name).await?;
        if load(&mut tx, kind, ns, new_name).await?.is_some() {
            return Err(Error::AlreadyExists {
                kind: kind.name(),
                name: new_name.to_string(),
            });
        }
        remove_row(&mut tx, kind, ns, name).await?;
        let rv = next_rv(&mut tx).await?;
        meta_mut(&mut old).insert("resourceVersion".into(), json!(rv.to_string()));
        let del = log_event(&mut tx, kind, ns, name, "DELETED", &old, rv).await?;
        let mut new = old.clone();
        let rv2 = next_rv(&mut tx).await?;
        {
            let meta = meta_mut(&mut new);
            meta.insert("name".into(), json!(new_name));
            meta.insert("resourceVersion".into(), json!(rv2.to_string()));
        }
        insert_row(&mut tx, kind, ns, new_name, &new, rv2).await?;
        let add = log_event(&mut tx, kind, ns, new_name, "ADDED", &new, rv2).await?;
        tx.commit().await?;
        self.publish(del);
        self.publish(add);
        Ok(new)
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
                Ok(Event {
                    rv: r.get::<i64, _>("rv") as u64,
                    kind: Kind::from_name(r.get::<&str, _>("kind"))
                        .ok_or_else(|| Error::Invalid("unknown kind in event log".into()))?,
                    namespace: r.get::<String, _>("namespace"),
                    event_type: match r.get::<&str, _>("type") {
                        "ADDED" => "ADDED",
                        "DELETED" => "DELETED",
                        _ => "MODIFIED",
                    },
                    object: serde_json::from_str(r.get::<&str, _>("body"))?,
                })
            })
            .collect()
    }

    /// The latest `limit` changes of one object, newest first: (resourceVersion, type, body).
    pub async fn object_history(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        limit: u32,
    ) -> Result<Vec<(u64, String, Value)>> {
        let rows = sqlx::query(
            "SELECT rv, type, body FROM events WHERE kind = ? AND namespace = ? AND name = ? \
             ORDER BY rv DESC LIMIT ?",
        )
        .bind(kind.name())
        .bind(ns)
        .bind(name)
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok((
                    r.get::<i64, _>("rv") as u64,
                    r.get::<String, _>("type"),
                    serde_json::from_str(r.get::<&str, _>("body"))?,
                ))
            })
            .collect()
    }

    fn publish(&self, ev: Event) {
        let _ = self.events.send(Arc::new(ev));
    }

    pub async fn setting(&self, key: &str) -> Result<Option<String>> {
        Ok(
            sqlx::query_as::<_, (String,)>("SELECT value FROM settings WHERE key = ?")
                .bind(key)
                .fetch_optional(&self.reader)
                .await?
                .map(|r| r.0),
        )
    }

    /// Set (or replace) a setting.
    pub async fn set_setting(&self, key: &str, value: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO settings (key, value) VALUES (?, ?) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )
        .bind(key)
        .bind(value)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Set a setting only if it is not set yet; returns the value in force.
    pub async fn setting_init(&self, key: &str, value: &str) -> Result<String> {
        sqlx::query("INSERT OR IGNORE INTO settings (key, value) VALUES (?, ?)")
            .bind(key)
            .bind(value)
            .execute(&self.writer)
            .await?;
        let (v,): (String,) = sqlx::query_as("SELECT value FROM settings WHERE key = ?")
            .bind(key)
            .fetch_one(&self.writer)
            .await?;
        Ok(v)
    }

    /// Drop events older than the keep window, and the oldest ones past the size cap.
    pub async fn prune_events(&self) -> Result<u64> {
        Ok(self.prune_events_keep(EVENT_LOG_KEEP).await?
            + self.prune_events_bytes(EVENT_LOG_MAX_BYTES).await?)
    }

    /// Keep only the newest events that fit in `max_bytes` of bodies.
    pub async fn prune_events_bytes(&self, max_bytes: i64) -> Result<u64> {
        let r = sqlx::query(
            "DELETE FROM events WHERE rv <= (SELECT rv FROM \
               (SELECT rv, SUM(length(CAST(body AS BLOB))) OVER (ORDER BY rv DESC) AS acc FROM events) \
             WHERE acc > ? ORDER BY rv DESC LIMIT 1)",
        )
        .bind(max_bytes)
        .execute(&self.writer)
        .await?;
        Ok(r.rows_affected())
    }

    /// Keep only the last `keep` events (tests compact the log on purpose).
    pub async fn prune_events_keep(&self, keep: i64) -> Result<u64> {
        let r = sqlx::query(
            "DELETE FROM events WHERE rv < (SELECT value FROM counters WHERE name = 'resourceVersion') - ?",
        )
        .bind(keep)
        .execute(&self.writer)
        .await?;
        Ok(r.rows_affected())
    }
}

type Tx<'a> = sqlx::Transaction<'a, sqlx::Sqlite>;

/// One object by key, on any connection (pool or transaction).
async fn load(
    conn: &mut sqlx::SqliteConnection,
    kind: Kind,
    ns: &str,
    name: &str,
) -> Result<Option<Value>> {
    let row = sqlx::query("SELECT body FROM objects WHERE kind = ? AND namespace = ? AND name = ?")
        .bind(kind.name())
        .bind(ns)
        .bind(name)
        .fetch_optional(conn)
        .await?;
    row.map(|r| Ok(serde_json::from_str(r.get::<&str, _>("body"))?))
        .transpose()
}

/// Like [`load`], but a missing object is [`Error::NotFound`].
async fn load_existing(tx: &mut Tx<'_>, kind: Kind, ns: &str, name: &str) -> Result<Value> {
    load(tx, kind, ns, name)
        .await?
        .ok_or_else(|| Error::NotFound {
            kind: kind.name(),
            name: name.to_string(),
        })
}

async fn remove_row(tx: &mut Tx<'_>, kind: Kind, ns: &str, name: &str) -> Result<()> {
    sqlx::query("DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ?")
        .bind(kind.name())
        .bind(ns)
        .bind(name)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn next_rv(tx: &mut Tx<'_>) -> Result<u64> {
    let (v,): (i64,) = sqlx::query_as(
        "UPDATE counters SET value = value + 1 WHERE name = 'resourceVersion' RETURNING value",
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok(v as u64)
}

async fn insert_row(
    tx: &mut Tx<'_>,
    kind: Kind,
    ns: &str,
    name: &str,
    obj: &Value,
    rv: u64,
) -> Result<()> {
    let body = serde_json::to_string(obj)?;
    if body.len() > OBJECT_MAX_BYTES {
        return Err(Error::Invalid(format!(
            "{} {name:?} would take {} KiB; at most {} KiB (1.5 MiB) is stored",
            kind.name(),
            body.len() >> 10,
            OBJECT_MAX_BYTES >> 10
        )));
    }
    sqlx::query(
        "INSERT INTO objects (kind, namespace, name, uid, resource_version, node_name, phase, body) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(kind.name())
    .bind(ns)
    .bind(name)
    .bind(obj["metadata"]["uid"].as_str().unwrap_or_default())
    .bind(rv as i64)
    .bind(obj["status"]["nodeName"].as_str())
    .bind(obj["status"]["phase"].as_str())
    .bind(body)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn log_event(
    tx: &mut Tx<'_>,
    kind: Kind,
    ns: &str,
    name: &str,
    event_type: &'static str,
    obj: &Value,
    rv: u64,
) -> Result<Event> {
    sqlx::query(
        "INSERT INTO events (rv, kind, namespace, name, type, body) VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(rv as i64)
    .bind(kind.name())
    .bind(ns)
    .bind(name)
    .bind(event_type)
    .bind(serde_json::to_string(obj)?)
    .execute(&mut **tx)
    .await?;
    Ok(Event {
        rv,
        kind,
        namespace: ns.to_string(),
        event_type,
        object: obj.clone(),
    })
}

fn meta_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

/// Fields a client may not change: uid, creationTimestamp, deletionTimestamp, and the kind.
fn copy_identity(from: &Value, to: &mut Value) {
    let meta = meta_mut(to);
    for k in ["uid", "creationTimestamp", "namespace", "name"] {
        match from["metadata"].get(k) {
            Some(v) => {
                meta.insert(k.into(), v.clone());
            }
            None => {
                meta.remove(k);
            }
        }
    }
    if let Some(d) = from["metadata"].get("deletionTimestamp") {
        meta.insert("deletionTimestamp".into(), d.clone());
    }
    meta.insert(
        "resourceVersion".into(),
        from["metadata"]["resourceVersion"].clone(),
    );
    to["apiVersion"] = from["apiVersion"].clone();
    to["kind"] = from["kind"].clone();
}

/// The resourceVersion of a stored object.
pub fn rv_of(obj: &Value) -> Option<u64> {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
}

fn ns_name(kind: Kind, obj: &Value) -> Result<(String, String)> {
    let name = obj["metadata"]["name"]
        .as_str()
        .ok_or_else(|| Error::Invalid("metadata.name is required".into()))?
        .to_string();
    let ns = if kind.namespaced() {
        obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string()
    } else {
        String::new()
    };
    Ok((ns, name))
}

#[cfg(test)]
mod tests;
