//! The VM list and its polled rows.

use askama::Template;
use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use std::collections::BTreeMap;

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
    rows: Vec<VmRow>,
}

#[derive(Template)]
#[template(path = "vm_rows.html")]
struct VmRowsTpl {
    rows: Vec<VmRow>,
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
    match rows(&st, &q).await {
        Ok(rows) => render(&VmListTpl {
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
                        format!(
                            "Delete of {vm} accepted; it leaves the list once its disks are gone."
                        )
                    }),
                ..Chrome::new(&u, "Virtual machines")
            },
            poll_url: rows_url(&q),
            q: q.q,
            label: q.label,
            rows,
        }),
        Err(r) => r,
    }
}

pub async fn vm_rows(State(st): S, Query(q): Query<ListQuery>) -> Response {
    match rows(&st, &q).await {
        Ok(rows) => render(&VmRowsTpl { rows }),
        Err(r) => r,
    }
}
