//! The store: every object, user and token, in SQLite (WAL) under the data dir.
//!
//! Objects are JSON documents with a few indexed columns. Each write takes the next value of
//! one global `resourceVersion` counter, appends to the event log in the same transaction, and
//! then wakes in-process watchers. Writes go through a single connection, so concurrent API
//! clients queue instead of failing with `SQLITE_BUSY`. This is the only module with SQL.
//!
//! Files follow the seams: [`schema`] (opening, migrations, backups), [`objects`] (CRUD and
//! listings), [`events`] (the event log, watchers, the shared listing watchers start from),
//! [`settings`], accounts and join tokens. [`Backend`] is what another backend (etcd) would
//! have to provide; callers never see SQL or sqlx types.

mod accounts;
mod backend;
pub mod events;
mod join;
mod namespaces;
mod objects;
mod schema;
mod selector;
mod settings;
mod typed;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::sqlite::SqlitePool;
use tokio::sync::broadcast;

pub use accounts::{Session, SessionInfo, TokenInfo, UserInfo};
pub use backend::Backend;
pub use events::Event;
pub use join::{JoinRefusal, JoinTokenInfo, node_user};
pub use objects::{Continue, ListQuery, RawList, rv_of};
pub use selector::{FieldSelector, LabelSelector};

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
    /// Every connection stayed busy for the whole wait: load, not a fault (429, not 500).
    #[error("the store is busy; retry in a second")]
    Busy,
    #[error("database error: {0}")]
    Db(String),
    #[error("migration error: {0}")]
    Migrate(String),
    #[error("stored object is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Invalid(String),
    /// A query (selector, paging) that does not parse: 400, not 422.
    #[error("{0}")]
    BadQuery(String),
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::PoolTimedOut => Error::Busy,
            e => Error::Db(e.to_string()),
        }
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        Error::Migrate(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// The SQLite backend.
#[derive(Clone)]
pub struct Store {
    writer: SqlitePool,
    reader: SqlitePool,
    events: broadcast::Sender<Arc<Event>>,
    stats: Arc<Stats>,
    listings: Arc<events::Listings>,
    /// When each token or session was last written as used (Unix seconds), so that a
    /// busy client costs one write a minute, not one per request.
    touched: Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>>,
}

/// Counters kept in memory.
#[derive(Default)]
struct Stats {
    /// Uses of the writer connection (write transactions and single write statements).
    writes: AtomicU64,
    /// The highest resourceVersion published to watchers.
    published: AtomicU64,
    /// The resourceVersion at the last pruning of the event log.
    pruned_at: AtomicU64,
}

/// The most one stored object may take, as Kubernetes' etcd allows (1.5 MiB). Every write
/// (an API write, a status from an agent, a controller's update) is held to it.
pub const OBJECT_MAX_BYTES: usize = 1536 << 10;

/// How long object writes take, from the transaction's start to its commit (waiting for
/// the writer connection included).
static WRITE_SECONDS: std::sync::LazyLock<prometheus::Histogram> = std::sync::LazyLock::new(|| {
    prometheus::register_histogram!(
        "edgevirt_store_write_duration_seconds",
        "Time an object write takes in the store, waiting for the writer included.",
        vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5
        ]
    )
    .expect("a valid metric")
});

impl Store {
    /// The database's size in bytes (its pages; the write-ahead log is checkpointed into
    /// it).
    pub async fn size_bytes(&self) -> Result<u64> {
        let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
            .fetch_one(&self.reader)
            .await?;
        let size: i64 = sqlx::query_scalar("PRAGMA page_size")
            .fetch_one(&self.reader)
            .await?;
        Ok((pages.max(0) as u64) * (size.max(0) as u64))
    }

    /// The writer connection, counted: every write goes through here.
    fn w(&self) -> &SqlitePool {
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        &self.writer
    }

    /// A write transaction on the writer connection, counted.
    async fn begin_write(&self) -> Result<Tx<'static>> {
        Ok(self.w().begin().await?)
    }

    /// How many times the writer connection was used since the store was opened (each write
    /// transaction or write statement, whether or not it changed anything). A resync that
    /// finds nothing to do leaves it unchanged.
    pub fn writes(&self) -> u64 {
        self.stats.writes.load(Ordering::Relaxed)
    }
}

type Tx<'a> = sqlx::Transaction<'a, sqlx::Sqlite>;

#[cfg(test)]
mod tests;
