//! Objects: point reads, listings (with the stored JSON passed through as is), and the
//! writes, each in one transaction that also takes the next resourceVersion and appends to
//! the event log.

use futures::TryStreamExt;
use serde_json::{Value, json};
use sqlx::Row;

use super::events::log_event;
use super::{Error, FieldSelector, LabelSelector, OBJECT_MAX_BYTES, Result, Store, Tx};
use crate::types::{Kind, now};

/// What to list: a namespace (or all), selectors, and a page.
#[derive(Clone, Copy, Debug, Default)]
pub struct ListQuery<'a> {
    pub namespace: Option<&'a str>,
    pub labels: Option<&'a LabelSelector>,
    pub fields: Option<&'a FieldSelector>,
    /// Start after this key (namespace, name): keyset paging.
    pub after: Option<(&'a str, &'a str)>,
    /// At most this many items (0 or none: all).
    pub limit: Option<usize>,
}

/// A listing with each item's stored JSON text, never parsed unless a selector needed it.
/// The items are kept in one buffer, separated by commas: `items_json` is the inside of a
/// JSON array.
#[derive(Debug, Default)]
pub struct RawList {
    /// The resourceVersion the listing is consistent with.
    pub rv: u64,
    buf: String,
    starts: Vec<usize>,
    /// Set when a limit cut the listing: the key of the last item returned.
    pub more: Option<(String, String)>,
}

impl RawList {
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// The items' JSON, comma-separated (the inside of a JSON array).
    pub fn items_json(&self) -> &str {
        &self.buf
    }

    /// Give the buffer away (the inside of a JSON array).
    pub fn into_items_json(self) -> String {
        self.buf
    }

    /// Each item's stored JSON.
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.starts.len()).map(move |i| {
            let end = self
                .starts
                .get(i + 1)
                .map_or(self.buf.len(), |next| next - 1);
            &self.buf[self.starts[i]..end]
        })
    }

    fn push(&mut self, body: &str) {
        if !self.starts.is_empty() {
            self.buf.push(',');
        }
        self.starts.push(self.buf.len());
        self.buf.push_str(body);
    }
}

/// A `continue` token: where the next page starts, and the resourceVersion of the listing
/// that handed it out. URL-safe base64 of a small JSON object. Tokens of earlier versions
/// (base64 of `namespace/name`) are still read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Continue {
    pub rv: u64,
    pub namespace: String,
    pub name: String,
}

impl Continue {
    pub fn encode(&self) -> String {
        use base64::Engine;
        let j = json!({"rv": self.rv, "ns": self.namespace, "name": self.name});
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(j.to_string())
    }

    /// `None` for a token this server did not hand out.
    pub fn decode(token: &str) -> Option<Continue> {
        use base64::Engine;
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .ok()?;
        let text = String::from_utf8(raw).ok()?;
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            return Some(Continue {
                rv: v["rv"].as_u64()?,
                namespace: v["ns"].as_str()?.to_string(),
                name: v["name"].as_str()?.to_string(),
            });
        }
        let (ns, name) = text.split_once('/')?;
        Some(Continue {
            rv: 0,
            namespace: ns.to_string(),
            name: name.to_string(),
        })
    }
}

impl Store {
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
        let raw = self
            .list_raw(
                kind,
                &ListQuery {
                    namespace: ns,
                    labels: Some(labels),
                    fields: Some(fields),
                    ..Default::default()
                },
            )
            .await?;
        let items = raw
            .iter()
            .map(serde_json::from_str)
            .collect::<std::result::Result<Vec<Value>, _>>()?;
        Ok((items, raw.rv))
    }

    /// A listing in key order (namespace, name) with each object's stored JSON as is,
    /// consistent with one resourceVersion; a page (`limit`, `after`) starts at its key in
    /// the index. Without selectors SQLite builds it ([`Store::list_whole`]); with them, rows
    /// are read one at a time, parsed for the selectors, and kept until the page is full.
    pub async fn list_raw(&self, kind: Kind, q: &ListQuery<'_>) -> Result<RawList> {
        let labels = q.labels.filter(|l| !l.is_empty());
        let fields = q.fields.filter(|f| !f.is_empty());
        if labels.is_none() && fields.is_none() {
            return self.list_whole(kind, q).await;
        }
        let node = fields.and_then(FieldSelector::node_name);
        let limit = q.limit.filter(|l| *l > 0);
        // One statement reads the counter with the rows: a statement sees one snapshot, so
        // no transaction (and no round trips to begin and end one) is needed.
        let mut sql = String::from(
            "SELECT (SELECT value FROM counters WHERE name = 'resourceVersion') AS rv, \
             namespace, name, body FROM objects WHERE kind = ?",
        );
        if node.is_some() {
            sql.push_str(" AND node_name = ?");
        }
        key_range_sql(q, &mut sql);
        sql.push_str(" ORDER BY namespace, name");
        let mut conn = self.reader.acquire().await?;
        let mut out = RawList::default();
        let mut rv = None;
        {
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(kind.name());
            if let Some(node) = node {
                query = query.bind(node);
            }
            let mut rows = bind_key_range(query, q).fetch(&mut *conn);
            // The last row handed out, kept whole: its key is read only if a page ends there.
            let mut last: Option<sqlx::sqlite::SqliteRow> = None;
            while let Some(row) = rows.try_next().await? {
                if rv.is_none() {
                    rv = Some(row.try_get::<i64, _>(0)?);
                }
                let body: &str = row.try_get(3)?;
                let v: Value = serde_json::from_str(body)?;
                if !(labels.is_none_or(|l| l.matches(&v)) && fields.is_none_or(|f| f.matches(&v))) {
                    continue;
                }
                if let Some(l) = limit
                    && out.len() == l
                {
                    if let Some(r) = last.take() {
                        out.more = Some((r.try_get(1)?, r.try_get(2)?));
                    }
                    break;
                }
                out.push(body);
                if limit.is_some() {
                    last = Some(row);
                }
            }
        }
        out.rv = match rv {
            Some(rv) => rv as u64,
            // No rows: the counter alone.
            None => {
                let (rv,): (i64,) =
                    sqlx::query_as("SELECT value FROM counters WHERE name = 'resourceVersion'")
                        .fetch_one(&mut *conn)
                        .await?;
                rv as u64
            }
        };
        Ok(out)
    }

    /// A listing with no selector to apply, built by SQLite itself: one statement reads the
    /// counter, the rows' stored JSON already joined with commas and their byte lengths
    /// (where each item starts), so a listing costs one result row however many items it
    /// has, not one row handed across threads per item. A page reads one row more than
    /// asked: whether there is a next one.
    ///
    /// The aggregates take the rows in the order the inner SELECT hands them out (key
    /// order: it walks the primary key), with no sort of their own. SQLite does not promise
    /// that order to `group_concat` without an ORDER BY inside it, but one there sorts the
    /// whole listing again and doubles its cost; `store::tests::listings_keep_key_order`
    /// writes rows out of key order and fails if a SQLite update ever changes it.
    async fn list_whole(&self, kind: Kind, q: &ListQuery<'_>) -> Result<RawList> {
        let limit = q.limit.filter(|l| *l > 0);
        let mut sql = String::from(
            "SELECT (SELECT value FROM counters WHERE name = 'resourceVersion'), \
             group_concat(octet_length(body), ','), group_concat(body, ',') \
             FROM (SELECT body FROM objects WHERE kind = ?",
        );
        key_range_sql(q, &mut sql);
        sql.push_str(" ORDER BY namespace, name LIMIT ?)");
        let query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(kind.name());
        // SQLite: a negative LIMIT is none.
        let row = bind_key_range(query, q)
            .bind(limit.map_or(-1, |l| l as i64 + 1))
            .fetch_one(&self.reader)
            .await?;
        let rv: i64 = row.try_get(0)?;
        let lengths: Option<&str> = row.try_get(1)?;
        let buf: Option<String> = row.try_get(2)?;
        let mut out = RawList {
            rv: rv as u64,
            buf: buf.unwrap_or_default(),
            ..RawList::default()
        };
        let mut at = 0;
        for len in lengths.unwrap_or("").split(',').filter(|l| !l.is_empty()) {
            let len: usize = len
                .parse()
                .map_err(|_| Error::Db(format!("item length {len:?} in a listing")))?;
            out.starts.push(at);
            at += len + 1;
        }
        if at.saturating_sub(1) != out.buf.len() {
            return Err(Error::Db(format!(
                "a listing of {} bytes whose items add up to {}",
                out.buf.len(),
                at.saturating_sub(1)
            )));
        }
        if let Some(l) = limit
            && out.starts.len() > l
        {
            // The extra row only said there is more: drop it (and its comma). The page
            // ends on its last item's key, read from that item as the key columns were
            // when it was written.
            out.buf.truncate(out.starts[l] - 1);
            out.starts.truncate(l);
            let last: Value = serde_json::from_str(out.iter().last().unwrap_or("{}"))?;
            out.more = Some(ns_name(kind, &last)?);
        }
        Ok(out)
    }

    /// Create an object. Fills uid (unless `keep_uid` and one is present), creationTimestamp,
    /// generation and resourceVersion.
    pub async fn create(&self, kind: Kind, mut obj: Value, keep_uid: bool) -> Result<Value> {
        let (ns, name) = ns_name(kind, &obj)?;
        let _timer = super::WRITE_SECONDS.start_timer();
        let mut tx = self.begin_write().await?;
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
        let body = insert_row(&mut tx, kind, &ns, &name, &obj, rv).await?;
        let ev = log_event(&mut tx, kind, &ns, &name, "ADDED", &obj, body, rv).await?;
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
        let _timer = super::WRITE_SECONDS.start_timer();
        let mut tx = self.begin_write().await?;
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
            let body = serde_json::to_string(&obj)?;
            log_event(&mut tx, kind, ns, name, "DELETED", &obj, body, rv).await?
        } else {
            let body = insert_row(&mut tx, kind, ns, name, &obj, rv).await?;
            log_event(&mut tx, kind, ns, name, "MODIFIED", &obj, body, rv).await?
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
        let _timer = super::WRITE_SECONDS.start_timer();
        let mut tx = self.begin_write().await?;
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
        let old_body = serde_json::to_string(&old)?;
        let del = log_event(&mut tx, kind, ns, name, "DELETED", &old, old_body, rv).await?;
        let mut new = old.clone();
        let rv2 = next_rv(&mut tx).await?;
        {
            let meta = meta_mut(&mut new);
            meta.insert("name".into(), json!(new_name));
            meta.insert("resourceVersion".into(), json!(rv2.to_string()));
        }
        let body = insert_row(&mut tx, kind, ns, new_name, &new, rv2).await?;
        let add = log_event(&mut tx, kind, ns, new_name, "ADDED", &new, body, rv2).await?;
        tx.commit().await?;
        self.publish(del);
        self.publish(add);
        Ok(new)
    }
}

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

/// Store the object's row; returns its JSON text (the event log and watchers reuse it).
async fn insert_row(
    tx: &mut Tx<'_>,
    kind: Kind,
    ns: &str,
    name: &str,
    obj: &Value,
    rv: u64,
) -> Result<String> {
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
    .bind(&body)
    .execute(&mut **tx)
    .await?;
    Ok(body)
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

/// The conditions of a listing's key range after `WHERE kind = ?`: its namespace, and the
/// key a page starts after. [`bind_key_range`] binds their values in the same order.
fn key_range_sql(q: &ListQuery<'_>, sql: &mut String) {
    if q.namespace.is_some() {
        sql.push_str(" AND namespace = ?");
    }
    match (q.after, q.namespace) {
        (Some(_), Some(_)) => sql.push_str(" AND name > ?"),
        (Some(_), None) => sql.push_str(" AND (namespace, name) > (?, ?)"),
        (None, _) => {}
    }
}

fn bind_key_range<'q>(
    mut query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    q: &ListQuery<'q>,
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
    if let Some(ns) = q.namespace {
        query = query.bind(ns);
    }
    match (q.after, q.namespace) {
        (Some((_, name)), Some(_)) => query.bind(name),
        (Some((ns, name)), None) => query.bind(ns).bind(name),
        (None, _) => query,
    }
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
