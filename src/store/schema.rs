//! Opening the database: WAL, one writer connection and a few readers, a newer schema
//! refused, a backup before migrating, then the migrations under `migrations/`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use tokio::sync::broadcast;

use super::{Error, Result, Stats, Store};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Reader connections: listings, watches' initial lists and point reads run side by side.
pub(super) const READERS: u32 = 4;

/// Every connection's page cache, in KiB: larger than any store we expect (10,000 VMs take
/// 25 MB), and only taken as pages are read.
///
/// The SQLite that sqlx bundles is built with `SQLITE_ENABLE_MEMORY_MANAGEMENT`: the page
/// caches of all the connections in the process share one pool, as large as the sum of
/// their `cache_size`s, and one least-recently-used list. A connection at its own limit
/// takes the oldest page of any connection; a connection below its limit, when the pool is
/// full, drops each page it reads as soon as its statement lets go of it, so it cannot
/// grow back. With SQLite's default (2 MiB each) a store of 10,000 VMs filled the pool,
/// one connection ended up holding all 2,415 pages of it, and a reader read the ~300
/// pages of a 500-item page from the file ~1,000 times (a table page above the rows once
/// per row), every time. When each cache can hold the whole store the pool never fills.
const CACHE_KIB: u32 = 128 * 1024;

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
            .foreign_keys(true)
            .pragma("cache_size", format!("-{CACHE_KIB}"));
        // A connection to a local file does not go away by itself: no ping (one more
        // round trip to the connection's thread) before each use.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(60))
            .test_before_acquire(false)
            .connect_with(opts.clone())
            .await?;
        Self::backup_before_migrating(&writer, path).await?;
        MIGRATOR.run(&writer).await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(READERS)
            .test_before_acquire(false)
            .connect_with(opts.read_only(true))
            .await?;
        let (events, _) = broadcast::channel(4096);
        let store = Store {
            writer,
            reader,
            events,
            stats: Arc::new(Stats::default()),
            listings: Default::default(),
            touched: Default::default(),
        };
        let rv = store.current_rv().await?;
        store
            .stats
            .published
            .store(rv, std::sync::atomic::Ordering::SeqCst);
        store
            .stats
            .pruned_at
            .store(0, std::sync::atomic::Ordering::SeqCst);
        Ok(store)
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
    /// Write a consistent copy of the whole database to `dest` (SQLite's `VACUUM INTO`:
    /// one transaction's view, while writers go on). `dest` must not exist.
    pub async fn copy_to(&self, dest: &Path) -> Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "VACUUM INTO '{}'",
            dest.to_string_lossy().replace('\'', "''")
        )))
        .execute(&self.reader)
        .await?;
        Ok(())
    }

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
}
