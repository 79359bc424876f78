//! Join tokens and the credentials agents receive for them. A join token is used once: the
//! join that redeems it also replaces any earlier credential of the joining node, in one
//! transaction, so a node has exactly one working credential.

use super::{Result, Store};
use crate::types::now;

/// A join token without its secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinTokenInfo {
    pub id: String,
    pub description: String,
    pub created: String,
    /// Unix seconds.
    pub expires: i64,
    pub used_by: Option<String>,
    pub used_at: Option<String>,
}

/// Why a join was refused (for the log; the client gets one message for all of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinRefusal {
    Unknown,
    Used,
    Expired,
}

/// The user name of a node's agent credential.
pub fn node_user(node: &str) -> String {
    format!("node:{node}")
}

impl Store {
    pub async fn add_join_token(
        &self,
        hash: &str,
        description: &str,
        expires: i64,
    ) -> Result<String> {
        let id = uuid::Uuid::new_v4().to_string();
        sqlx::query(
            "INSERT INTO join_tokens (id, hash, description, created, expires) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(&id)
        .bind(hash)
        .bind(description)
        .bind(now())
        .bind(expires)
        .execute(self.w())
        .await?;
        Ok(id)
    }

    pub async fn join_tokens(&self) -> Result<Vec<JoinTokenInfo>> {
        type Row = (String, String, String, i64, Option<String>, Option<String>);
        let rows = sqlx::query_as::<_, Row>(
            "SELECT id, description, created, expires, used_by, used_at FROM join_tokens ORDER BY created, id",
        )
        .fetch_all(&self.reader)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, description, created, expires, used_by, used_at)| JoinTokenInfo {
                    id,
                    description,
                    created,
                    expires,
                    used_by,
                    used_at,
                },
            )
            .collect())
    }

    pub async fn delete_join_token(&self, id: &str) -> Result<bool> {
        let r = sqlx::query("DELETE FROM join_tokens WHERE id = ?")
            .bind(id)
            .execute(self.w())
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Redeem a join token for `node`: mark it used, drop the node's earlier credentials and
    /// record the new one (`credential_hash`, role agent). All or nothing.
    pub async fn redeem_join_token(
        &self,
        hash: &str,
        node: &str,
        credential_hash: &str,
        now_unix: i64,
    ) -> Result<std::result::Result<(), JoinRefusal>> {
        let mut tx = self.begin_write().await?;
        let row: Option<(i64, Option<String>)> =
            sqlx::query_as("SELECT expires, used_by FROM join_tokens WHERE hash = ?")
                .bind(hash)
                .fetch_optional(&mut *tx)
                .await?;
        let refusal = match row {
            None => Some(JoinRefusal::Unknown),
            Some((_, Some(_))) => Some(JoinRefusal::Used),
            Some((exp, None)) if exp <= now_unix => Some(JoinRefusal::Expired),
            Some(_) => None,
        };
        if let Some(r) = refusal {
            return Ok(Err(r));
        }
        sqlx::query("UPDATE join_tokens SET used_by = ?, used_at = ? WHERE hash = ?")
            .bind(node)
            .bind(now())
            .bind(hash)
            .execute(&mut *tx)
            .await?;
        let user = node_user(node);
        sqlx::query("DELETE FROM tokens WHERE user_name = ?")
            .bind(&user)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO tokens (id, hash, user_name, role, description, created) VALUES (?, ?, ?, 'agent', ?, ?)",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(credential_hash)
        .bind(&user)
        .bind(format!("agent credential of node {node}"))
        .bind(now())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Ok(()))
    }

    /// Remove every credential of a node's agent (the node was deleted).
    pub async fn revoke_node_credentials(&self, node: &str) -> Result<u64> {
        let r = sqlx::query("DELETE FROM tokens WHERE user_name = ?")
            .bind(node_user(node))
            .execute(self.w())
            .await?;
        Ok(r.rows_affected())
    }
}
