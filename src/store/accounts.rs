//! Users, API tokens and browser sessions. Passwords are argon2 hashes, tokens and session
//! ids are kept only as SHA-256 hashes (hashing is the caller's job, in `api::auth`).

use super::{Result, Store};
use crate::types::now;

/// A user as the admin pages list it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub role: String,
    pub created: String,
}

/// An API token without its secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: String,
    pub user: String,
    pub role: String,
    pub description: String,
    pub created: String,
    /// Unix seconds; None: never.
    pub expires: Option<i64>,
    /// RFC 3339, to the minute; None: never used since it was made (or since schema 4).
    pub last_used: Option<String>,
}

/// One of a user's live sessions, for their account page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// The session's hash: the account page tells the current one from the others.
    pub hash: String,
    pub created: String,
    pub expires: i64,
    pub last_used: Option<String>,
}

/// Uses of a token or session closer together than this are written once.
const TOUCH_EVERY_SECS: i64 = 60;

/// A live browser session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub user: String,
    pub role: String,
    pub csrf: String,
    pub expires: i64,
}

fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

impl Store {
    /// Create a user if it does not exist; false if it existed.
    pub async fn create_user(&self, name: &str, password_hash: &str, role: &str) -> Result<bool> {
        let r = sqlx::query(
            "INSERT OR IGNORE INTO users (name, password_hash, role, created) VALUES (?, ?, ?, ?)",
        )
        .bind(name)
        .bind(password_hash)
        .bind(role)
        .bind(now())
        .execute(self.w())
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// (password hash, role) of a user.
    pub async fn user(&self, name: &str) -> Result<Option<(String, String)>> {
        Ok(sqlx::query_as::<_, (String, String)>(
            "SELECT password_hash, role FROM users WHERE name = ?",
        )
        .bind(name)
        .fetch_optional(&self.reader)
        .await?)
    }

    pub async fn users(&self) -> Result<Vec<UserInfo>> {
        let rows = sqlx::query_as::<_, (String, String, String)>(
            "SELECT name, role, created FROM users ORDER BY name",
        )
        .fetch_all(&self.reader)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(name, role, created)| UserInfo {
                name,
                role,
                created,
            })
            .collect())
    }

    /// Delete a user with its tokens and sessions; false if there was none.
    pub async fn delete_user(&self, name: &str) -> Result<bool> {
        let mut tx = self.begin_write().await?;
        let r = sqlx::query("DELETE FROM users WHERE name = ?")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM tokens WHERE user_name = ?")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM sessions WHERE user_name = ?")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(r.rows_affected() == 1)
    }

    /// Set a new password hash; logs the user out everywhere.
    pub async fn set_password(&self, name: &str, password_hash: &str) -> Result<bool> {
        let mut tx = self.begin_write().await?;
        let r = sqlx::query("UPDATE users SET password_hash = ? WHERE name = ?")
            .bind(password_hash)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM sessions WHERE user_name = ?")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(r.rows_affected() == 1)
    }

    /// A token that never expires.
    pub async fn add_token(
        &self,
        hash: &str,
        user: &str,
        role: &str,
        description: &str,
    ) -> Result<String> {
        self.add_expiring_token(hash, user, role, description, None)
            .await
    }

    /// A token valid until `expires` (Unix seconds), or for ever.
    pub async fn add_expiring_token(
        &self,
        hash: &str,
        user: &str,
        role: &str,
        description: &str,
        expires: Option<i64>,
    ) -> Result<String> {
        let id = uuid::Uuid::new_v4().to_string();
        sqlx::query(
            "INSERT INTO tokens (id, hash, user_name, role, description, created, expires) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&id)
        .bind(hash)
        .bind(user)
        .bind(role)
        .bind(description)
        .bind(now())
        .bind(expires)
        .execute(self.w())
        .await?;
        Ok(id)
    }

    /// Look a token up by its hash: (user, role). An expired token is no token.
    pub async fn token(&self, hash: &str) -> Result<Option<(String, String)>> {
        Ok(sqlx::query_as::<_, (String, String)>(
            "SELECT user_name, role FROM tokens WHERE hash = ? AND (expires IS NULL OR expires >= ?)",
        )
        .bind(hash)
        .bind(unix_now())
        .fetch_optional(&self.reader)
        .await?)
    }

    pub async fn tokens(&self) -> Result<Vec<TokenInfo>> {
        type Row = (
            String,
            String,
            String,
            String,
            String,
            Option<i64>,
            Option<String>,
        );
        let rows = sqlx::query_as::<_, Row>(
            "SELECT id, user_name, role, description, created, expires, last_used FROM tokens \
             ORDER BY created, id",
        )
        .fetch_all(&self.reader)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, user, role, description, created, expires, last_used)| TokenInfo {
                    id,
                    user,
                    role,
                    description,
                    created,
                    expires,
                    last_used,
                },
            )
            .collect())
    }

    /// Whether a use of `key` should be written now (none written in the last minute).
    fn touch_due(&self, key: String) -> bool {
        let now = unix_now();
        let mut t = self.touched.lock().unwrap_or_else(|e| e.into_inner());
        if t.len() > 10_000 {
            t.retain(|_, at| now - *at < TOUCH_EVERY_SECS);
        }
        match t.get(&key) {
            Some(at) if now - *at < TOUCH_EVERY_SECS => false,
            _ => {
                t.insert(key, now);
                true
            }
        }
    }

    /// Note that the token with this hash was used (written at most once a minute).
    pub async fn touch_token(&self, hash: &str) -> Result<()> {
        self.touch("t", "UPDATE tokens SET last_used = ? WHERE hash = ?", hash)
            .await
    }

    /// Note that the session with this hash was used (written at most once a minute).
    pub async fn touch_session(&self, hash: &str) -> Result<()> {
        self.touch(
            "s",
            "UPDATE sessions SET last_used = ? WHERE hash = ?",
            hash,
        )
        .await
    }

    async fn touch(&self, kind: &str, update: &'static str, hash: &str) -> Result<()> {
        if self.touch_due(format!("{kind}:{hash}")) {
            sqlx::query(update)
                .bind(now())
                .bind(hash)
                .execute(self.w())
                .await?;
        }
        Ok(())
    }

    /// A user's live sessions, newest first.
    pub async fn sessions_of(&self, user: &str) -> Result<Vec<SessionInfo>> {
        let rows = sqlx::query_as::<_, (String, String, i64, Option<String>)>(
            "SELECT hash, created, expires, last_used FROM sessions \
             WHERE user_name = ? AND expires >= ? ORDER BY created DESC, hash",
        )
        .bind(user)
        .bind(unix_now())
        .fetch_all(&self.reader)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(hash, created, expires, last_used)| SessionInfo {
                hash,
                created,
                expires,
                last_used,
            })
            .collect())
    }

    /// End every session of a user (log out everywhere); how many there were.
    pub async fn delete_sessions_of(&self, user: &str) -> Result<u64> {
        let r = sqlx::query("DELETE FROM sessions WHERE user_name = ?")
            .bind(user)
            .execute(self.w())
            .await?;
        Ok(r.rows_affected())
    }

    pub async fn delete_token(&self, id: &str) -> Result<bool> {
        let r = sqlx::query("DELETE FROM tokens WHERE id = ?")
            .bind(id)
            .execute(self.w())
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Record a session (by the hash of its id) valid for `ttl_secs`.
    pub async fn create_session(
        &self,
        hash: &str,
        user: &str,
        role: &str,
        csrf: &str,
        ttl_secs: i64,
    ) -> Result<()> {
        let mut tx = self.begin_write().await?;
        // Expired sessions go whenever a new one is made.
        sqlx::query("DELETE FROM sessions WHERE expires < ?")
            .bind(unix_now())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO sessions (hash, user_name, role, csrf, created, expires) VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(hash)
        .bind(user)
        .bind(role)
        .bind(csrf)
        .bind(now())
        .bind(unix_now() + ttl_secs)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// A session that has not expired.
    pub async fn session(&self, hash: &str) -> Result<Option<Session>> {
        let row = sqlx::query_as::<_, (String, String, String, i64)>(
            "SELECT user_name, role, csrf, expires FROM sessions WHERE hash = ? AND expires >= ?",
        )
        .bind(hash)
        .bind(unix_now())
        .fetch_optional(&self.reader)
        .await?;
        Ok(row.map(|(user, role, csrf, expires)| Session {
            user,
            role,
            csrf,
            expires,
        }))
    }

    pub async fn delete_session(&self, hash: &str) -> Result<()> {
        sqlx::query("DELETE FROM sessions WHERE hash = ?")
            .bind(hash)
            .execute(self.w())
            .await?;
        Ok(())
    }
}
