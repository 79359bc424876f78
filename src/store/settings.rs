//! Settings: small key/value pairs (install id, install strategy, ...).

use super::{Result, Store};

impl Store {
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
        .execute(self.w())
        .await?;
        Ok(())
    }

    /// Set a setting only if it is not set yet; returns the value in force.
    pub async fn setting_init(&self, key: &str, value: &str) -> Result<String> {
        let w = self.w();
        sqlx::query("INSERT OR IGNORE INTO settings (key, value) VALUES (?, ?)")
            .bind(key)
            .bind(value)
            .execute(w)
            .await?;
        let (v,): (String,) = sqlx::query_as("SELECT value FROM settings WHERE key = ?")
            .bind(key)
            .fetch_one(w)
            .await?;
        Ok(v)
    }
}
