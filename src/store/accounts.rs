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
}

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

    pub async fn add_token(
        &self,
        hash: &str,
        user: &str,
        role: &str,
        description: &str,
    ) -> Result<String> {
        let id = uuid::Uuid::new_v4().to_string();
        sqlx::query(
            "INSERT INTO tokens (id, hash, user_name, role, description, created) VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(&id)
        .bind(hash)
        .bind(user)
        .bind(role)
        .bind(description)
        .bind(now())
        .execute(self.w())
        .await?;
        Ok(id)
    }

    /// Look a token up by its hash: (user, role).
    pub async fn token(&self, hash: &str) -> Result<Option<(String, String)>> {
        Ok(sqlx::query_as::<_, (String, String)>(
            "SELECT user_name, role FROM tokens WHERE hash = ?",
        )
        .bind(hash)
        .fetch_optional(&self.reader)
        .await?)
    }

    pub async fn tokens(&self) -> Result<Vec<TokenInfo>> {
        let rows = sqlx::query_as::<_, (String, String, String, String, String)>(
            "SELECT id, user_name, role, description, created FROM tokens ORDER BY created, id",
        )
        .fetch_all(&self.reader)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, user, role, description, created)| TokenInfo {
                id,
                user,
                role,
                description,
                created,
            })
            .collect())
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
