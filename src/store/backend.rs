//! What a store backend provides. [`Store`] (SQLite) fills it; a backend for sites that must
//! survive the loss of a host (etcd: resourceVersions from its revisions, the event log from
//! its watch history) would fill the same, and callers would not change: they see objects
//! as JSON, listings as stored JSON text, keys, resourceVersions and [`Event`]s, never SQL
//! or a driver's types.
//!
//! The contract every backend keeps:
//! - one global, increasing resourceVersion; every write takes the next one, and the object
//!   and its event are stored together or not at all;
//! - [`Backend::update`] reads, applies `f` and writes in one step, and stores no new
//!   version (no resourceVersion, no event) when `f` changed nothing; callers that run
//!   often over many objects (the controller's resync) decide from a listing first, so that
//!   an idle pass opens no write at all ([`Backend::writes`] counts them);
//! - listings are in key order (namespace, name) and consistent with the resourceVersion
//!   they report; a page starts after a key and reads only its own items;
//! - events reach subscribers in resourceVersion order after they are stored, and
//!   [`Backend::events_since`] replays them or says [`super::Error::Gone`].

use std::future::Future;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

use super::{Event, ListQuery, RawList, Result, Store};
use crate::types::Kind;

pub trait Backend: Clone + Send + Sync + 'static {
    fn current_rv(&self) -> impl Future<Output = Result<u64>> + Send;
    fn get(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Value>>> + Send;
    fn list_raw(
        &self,
        kind: Kind,
        q: &ListQuery<'_>,
    ) -> impl Future<Output = Result<RawList>> + Send;
    fn create(
        &self,
        kind: Kind,
        obj: Value,
        keep_uid: bool,
    ) -> impl Future<Output = Result<Value>> + Send;
    fn update<F>(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        f: F,
    ) -> impl Future<Output = Result<Value>> + Send
    where
        F: FnOnce(&mut Value) -> Result<()> + Send;
    fn delete(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        uid: Option<&str>,
    ) -> impl Future<Output = Result<Value>> + Send;
    fn events_since(&self, rv: u64) -> impl Future<Output = Result<Vec<Event>>> + Send;
    fn subscribe(&self) -> broadcast::Receiver<Arc<Event>>;
    /// Write operations so far (a resync that changes nothing must not add to it).
    fn writes(&self) -> u64;
}

impl Backend for Store {
    fn current_rv(&self) -> impl Future<Output = Result<u64>> + Send {
        Store::current_rv(self)
    }
    fn get(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Value>>> + Send {
        Store::get(self, kind, ns, name)
    }
    fn list_raw(
        &self,
        kind: Kind,
        q: &ListQuery<'_>,
    ) -> impl Future<Output = Result<RawList>> + Send {
        Store::list_raw(self, kind, q)
    }
    fn create(
        &self,
        kind: Kind,
        obj: Value,
        keep_uid: bool,
    ) -> impl Future<Output = Result<Value>> + Send {
        Store::create(self, kind, obj, keep_uid)
    }
    fn update<F>(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        f: F,
    ) -> impl Future<Output = Result<Value>> + Send
    where
        F: FnOnce(&mut Value) -> Result<()> + Send,
    {
        Store::update(self, kind, ns, name, f)
    }
    fn delete(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        uid: Option<&str>,
    ) -> impl Future<Output = Result<Value>> + Send {
        Store::delete(self, kind, ns, name, uid)
    }
    fn events_since(&self, rv: u64) -> impl Future<Output = Result<Vec<Event>>> + Send {
        Store::events_since(self, rv)
    }
    fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        Store::subscribe(self)
    }
    fn writes(&self) -> u64 {
        Store::writes(self)
    }
}
