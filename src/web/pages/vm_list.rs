//! The VM list and its polled rows. A poll names the rows it holds (the digest of the
//! last answer, `X-Rows-Have`): nothing changed is a 304 with no body; rows that changed
//! in place come alone (`X-Rows: delta`); anything else (a VM added or gone, a digest the
//! server no longer knows) is the whole table (`X-Rows: full`). At 1,000 VMs a poll sent
//! the whole table, about 324 KB, every two seconds.

use std::collections::{BTreeMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex};

use askama::Template;
use axum::extract::{Extension, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;

use super::{
    Chrome, condition_status, created, error_page, labels_text, or_dash, printable_status, render,
    url_encode, vmi_ip, vmi_status,
};
use crate::http::AppState;
use crate::store::{FieldSelector, LabelSelector};
use crate::types::kubevirt::{ConditionType, Phase, VirtualMachine, VirtualMachineInstance};
use crate::types::{Meta, age};
use crate::web::{S, WebUser};

pub struct VmRow {
    ns: String,
    name: String,
    status: String,
    /// When the VM was made (RFC 3339): the page's script keeps `age` current from it.
    created: String,
    age: String,
    phase: String,
    ip: String,
    node: String,
    ready: String,
    live_migratable: String,
    labels: String,
}

#[derive(Deserialize, Default)]
pub struct ListQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    label: String,
    /// `NS/NAME` of a VM whose deletion the API just accepted.
    #[serde(default)]
    deleted: Option<String>,
}

#[derive(Template)]
#[template(path = "vm_list.html")]
struct VmListTpl {
    c: Chrome,
    q: String,
    label: String,
    poll_url: String,
    /// The rendered rows (each escaped by its own template).
    rows: String,
    digest: String,
}

impl VmRow {
    /// What the row shows, but for its age: that moves every second by itself, and the
    /// page's script moves it, so a row whose VM did not change is not sent again.
    fn content_hash(&self) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        (
            &self.ns,
            &self.name,
            &self.status,
            &self.created,
            &self.phase,
            &self.ip,
            &self.node,
            &self.ready,
            &self.live_migratable,
            &self.labels,
        )
            .hash(&mut h);
        h.finish()
    }
}

#[derive(Template)]
#[template(path = "vm_row.html")]
struct VmRowTpl<'a> {
    r: &'a VmRow,
}

/// The table's rows, rendered: each row's key (`ns/name`), its HTML and that HTML's hash.
struct Rendered {
    rows: Vec<(String, String, u64)>,
}

/// How many recent row sets the server remembers to answer with only what changed: enough
/// for several open lists with different filters.
const REMEMBERED: usize = 32;

/// Recent row sets by digest: each row's key and hash.
type RowSet = Arc<Vec<(String, u64)>>;
static RECENT: LazyLock<Mutex<VecDeque<(String, RowSet)>>> =
    LazyLock::new(|| Mutex::new(VecDeque::new()));

impl Rendered {
    fn new(rows: &[VmRow]) -> Result<Rendered, Response> {
        let rows = rows
            .iter()
            .map(|r| {
                let html = VmRowTpl { r }
                    .render()
                    .map_err(|e| error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))?;
                Ok((format!("{}/{}", r.ns, r.name), html, r.content_hash()))
            })
            .collect::<Result<_, Response>>()?;
        Ok(Rendered { rows })
    }

    /// The digest of the whole set (keys, order and content), remembered for later polls.
    fn digest(&self) -> String {
        let mut h = std::hash::DefaultHasher::new();
        for (k, _, x) in &self.rows {
            (k, x).hash(&mut h);
        }
        let d = format!("{:016x}", h.finish());
        let set: RowSet = Arc::new(self.rows.iter().map(|(k, _, x)| (k.clone(), *x)).collect());
        let mut recent = RECENT.lock().unwrap_or_else(|e| e.into_inner());
        if !recent.iter().any(|(x, _)| *x == d) {
            recent.push_back((d.clone(), set));
            if recent.len() > REMEMBERED {
                recent.pop_front();
            }
        }
        d
    }

    fn all(&self) -> String {
        if self.rows.is_empty() {
            return "<tr><td colspan=\"10\" class=\"empty\">No virtual machine matches.</td></tr>\n"
                .into();
        }
        self.rows.iter().map(|(_, h, _)| h.as_str()).collect()
    }

    /// The rows that differ from a remembered set with the same keys in the same order, or
    /// None when the set is unknown or its rows were added, removed or reordered.
    fn changed_since(&self, had: &str) -> Option<String> {
        let old = RECENT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(d, _)| d == had)
            .map(|(_, s)| s.clone())?;
        if old.len() != self.rows.len()
            || old
                .iter()
                .zip(&self.rows)
                .any(|((k, _), (nk, _, _))| k != nk)
        {
            return None;
        }
        Some(
            old.iter()
                .zip(&self.rows)
                .filter(|((_, h), (_, _, nh))| h != nh)
                .map(|(_, (_, html, _))| html.as_str())
                .collect(),
        )
    }
}

/// Rows as `kubectl get vmi -o wide` has them, for every VM (stopped ones too).
async fn rows(st: &AppState, q: &ListQuery) -> Result<Vec<VmRow>, Response> {
    let labels = LabelSelector::parse(&q.label)
        .map_err(|e| error_page(StatusCode::BAD_REQUEST, &format!("bad label selector: {e}")))?;
    let fields = FieldSelector::default();
    let (vms, vmis) = tokio::try_join!(
        st.store
            .list_typed::<VirtualMachine>(None, &labels, &fields),
        st.store.all::<VirtualMachineInstance>()
    )
    .map_err(|e| error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))?;
    let vmis: BTreeMap<(&str, &str), &VirtualMachineInstance> = vmis
        .iter()
        .map(|i| ((i.namespace(), i.name()), i))
        .collect();
    let needle = q.q.trim().to_lowercase();
    Ok(vms
        .iter()
        .filter(|vm| needle.is_empty() || vm.name().to_lowercase().contains(&needle))
        .map(|vm| {
            let (ns, name) = (vm.namespace(), vm.name());
            let vmi = vmis.get(&(ns, name)).copied();
            let status = vmi.map(vmi_status);
            VmRow {
                ns: ns.into(),
                name: name.into(),
                status: or_dash(printable_status(vm)),
                age: age(&created(vm)),
                created: created(vm),
                phase: status
                    .map(|s| or_dash(s.phase.as_ref().map_or("", Phase::as_str)))
                    .unwrap_or("-".into()),
                ip: vmi.map(vmi_ip).map(|x| or_dash(&x)).unwrap_or("-".into()),
                node: status
                    .map(|s| or_dash(s.node_name.as_deref().unwrap_or_default()))
                    .unwrap_or("-".into()),
                ready: status
                    .and_then(|s| condition_status(&s.conditions, ConditionType::Ready))
                    .unwrap_or("-".into()),
                live_migratable: status
                    .and_then(|s| condition_status(&s.conditions, ConditionType::LiveMigratable))
                    .unwrap_or("-".into()),
                labels: labels_text(vm),
            }
        })
        .collect())
}

fn rows_url(q: &ListQuery) -> String {
    format!(
        "/ui/vms/rows?q={}&label={}",
        url_encode(&q.q),
        url_encode(&q.label)
    )
}

pub async fn vm_list(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Query(q): Query<ListQuery>,
) -> Response {
    let r = match rows(&st, &q).await.and_then(|r| Rendered::new(&r)) {
        Ok(r) => r,
        Err(r) => return r,
    };
    render(&VmListTpl {
        c: Chrome {
            notice: q
                .deleted
                .as_ref()
                .filter(|vm| {
                    vm.split_once('/').is_some_and(|(ns, name)| {
                        crate::types::check_name("namespace", ns).is_ok()
                            && crate::types::check_name("name", name).is_ok()
                    })
                })
                .map(|vm| {
                    format!("Delete of {vm} accepted; it leaves the list once its disks are gone.")
                }),
            ..Chrome::new(&u, "Virtual machines")
        },
        poll_url: rows_url(&q),
        q: q.q,
        label: q.label,
        digest: r.digest(),
        rows: r.all(),
    })
}

/// `GET /ui/vms/rows`: the polled rows; see the module's comment for `X-Rows-Have`.
pub async fn vm_rows(State(st): S, Query(q): Query<ListQuery>, headers: HeaderMap) -> Response {
    let r = match rows(&st, &q).await.and_then(|r| Rendered::new(&r)) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let digest = r.digest();
    let had = headers
        .get("x-rows-have")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let (mode, body) = if had == digest {
        ("same", None)
    } else {
        match r.changed_since(had) {
            Some(delta) => ("delta", Some(delta)),
            None => ("full", Some(r.all())),
        }
    };
    let mut res = match body {
        None => StatusCode::NOT_MODIFIED.into_response(),
        Some(b) => Html(b).into_response(),
    };
    let h = res.headers_mut();
    h.insert("x-rows", HeaderValue::from_static(mode));
    if let Ok(v) = HeaderValue::from_str(&digest) {
        h.insert("x-rows-digest", v);
    }
    h.insert(
        axum::http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    res
}
