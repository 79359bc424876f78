//! Page handlers and their templates, one file per part of the dashboard. Reads go to the
//! store directly (fast lists); changes go through the API in-process as the logged-in user.
//! What several parts share (the page frame, error pages, loading a VM, small formatters)
//! lives here; the parts do not import each other.

// Helpers return a finished error page as their Err: it is built once per failed request,
// so its size does not matter.
#![allow(clippy::result_large_err)]

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use kube::Resource;
use serde::Deserialize;
use serde_json::Value;

use super::WebUser;
use crate::http::AppState;
use crate::http::auth::Role;
use crate::types::kubevirt::{
    self, Condition, ConditionType, VirtualMachine, VirtualMachineInstance,
    VirtualMachineInstanceStatus,
};
use crate::types::{Kind, Meta, Typed};

mod account;
mod admin;
mod backups;
mod consoles;
mod create;
mod detail;
mod edit;
mod history;
mod images;
mod login;
mod monitoring;
mod networks;
mod nodes;
mod overview;
mod storage;
mod vm_list;

pub use account::{account, change_password, logout_everywhere};
pub use admin::{
    admin, clear_lockouts, create_join_token, create_token, create_user, delete_join_token,
    delete_token, delete_user,
};
pub use backups::{backups, create_schedule, delete_schedule, suspend_schedule};
pub use consoles::{console, serial};
pub use create::{create_from_form, create_from_yaml, new_vm};
pub use detail::{vm_detail, vm_status};
pub use edit::{
    add_disk, back_up_now, delete_backup, delete_snapshot, detach, edit_vm, eject, grow,
    restore_backup, restore_snapshot, save_vm, take_snapshot, verify_backup, vm_action, vm_migrate,
};
pub use images::{delete_image, images};
pub use login::{login, login_page, logout};
pub use monitoring::{activity, node_graphs, vm_graphs};
pub use networks::networks;
pub use nodes::{node_action, node_page, node_vms_fragment};
pub use overview::overview;
pub use storage::storage;
pub use vm_list::{vm_list, vm_rows};

/// What every page's frame shows.
pub struct Chrome {
    pub title: String,
    pub user: String,
    pub role: &'static str,
    pub csrf: String,
    pub is_admin: bool,
    pub can_operate: bool,
    pub error: Option<String>,
    pub notice: Option<String>,
}

impl Chrome {
    fn new(u: &WebUser, title: impl Into<String>) -> Self {
        Chrome {
            title: title.into(),
            user: u.name.clone(),
            role: role_name(u.role),
            csrf: u.csrf.clone(),
            is_admin: u.role == Role::Admin,
            can_operate: may_operate(u.role),
            error: None,
            notice: None,
        }
    }
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Admin => "admin",
        Role::Operator => "operator",
        Role::Viewer => "viewer",
        Role::Agent => "agent",
    }
}

fn render<T: Template>(t: &T) -> Response {
    match t.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "rendering a page failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "rendering the page failed",
            )
                .into_response()
        }
    }
}

fn render_status<T: Template>(code: StatusCode, t: &T) -> Response {
    let mut r = render(t);
    *r.status_mut() = code;
    r
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorTpl<'a> {
    code: u16,
    message: &'a str,
}

/// Whether a role may act on VMs (operators and admins), not only look at them.
fn may_operate(r: Role) -> bool {
    matches!(r, Role::Admin | Role::Operator)
}

/// A viewer asking for a page only operators and admins may use (a form they could not
/// submit, a console): refused before it is shown, not after Save.
fn viewer_refused(u: &WebUser, what: &str) -> Option<Response> {
    (!may_operate(u.role)).then(|| {
        error_page(
            StatusCode::FORBIDDEN,
            &format!("viewers may not {what} (operator or admin needed)"),
        )
    })
}

pub fn error_page(code: StatusCode, message: &str) -> Response {
    render_status(
        code,
        &ErrorTpl {
            code: code.as_u16(),
            message,
        },
    )
}

pub fn url_encode(s: &str) -> String {
    serde_urlencoded::to_string([("", s)])
        .map(|e| e.trim_start_matches('=').to_string())
        .unwrap_or_default()
}

fn or_dash(x: &str) -> String {
    if x.is_empty() { "-".into() } else { x.into() }
}

fn human_bytes(b: u64) -> String {
    const GI: f64 = (1u64 << 30) as f64;
    const MI: f64 = (1u64 << 20) as f64;
    if b as f64 >= GI {
        // 1 GiB, 1.5 GiB: no trailing ".0".
        let s = format!("{:.1}", b as f64 / GI);
        format!("{} GiB", s.strip_suffix(".0").unwrap_or(&s))
    } else {
        format!("{:.0} MiB", b as f64 / MI)
    }
}

/// The status of the condition of a type (`True`, `False`, ...), if there is one.
fn condition_status(conditions: &[Condition], t: ConditionType) -> Option<String> {
    kubevirt::condition(conditions, &t).map(|c| c.status.to_string())
}

/// An object's labels as `k=v, k=v`.
fn labels_text<K: Resource>(o: &K) -> String {
    o.meta()
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// When an object was created, as stored (RFC 3339), empty if it does not say.
fn created<K: Resource>(o: &K) -> String {
    o.meta()
        .creation_timestamp
        .as_ref()
        .and_then(|t| serde_json::to_value(t).ok())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A VM's `printableStatus`, empty when it has none yet.
fn printable_status(vm: &VirtualMachine) -> &str {
    vm.status
        .as_ref()
        .and_then(|s| s.printable_status.as_deref())
        .unwrap_or_default()
}

/// What the pages show of an instance's status: an instance without one shows as empty.
fn vmi_status(vmi: &VirtualMachineInstance) -> &VirtualMachineInstanceStatus {
    static NONE: std::sync::LazyLock<VirtualMachineInstanceStatus> =
        std::sync::LazyLock::new(VirtualMachineInstanceStatus::default);
    vmi.status.as_ref().unwrap_or(&NONE)
}

/// Every stored object of a kind.
async fn all<T: Typed>(st: &AppState) -> Result<Vec<T>, Response> {
    st.store
        .all::<T>()
        .await
        .map_err(|e| error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))
}

/// The instance's addresses, as `kubectl get vmi -o wide` lists them.
fn vmi_ip(vmi: &VirtualMachineInstance) -> String {
    vmi_status(vmi)
        .interfaces
        .iter()
        .filter_map(|i| i.ip_address.as_deref())
        .filter(|ip| !ip.is_empty())
        .collect::<Vec<_>>()
        .join(", ")
}

fn vm_path(ns: &str, name: &str) -> String {
    format!(
        "/apis/kubevirt.io/v1/namespaces/{}/virtualmachines/{}",
        url_encode(ns),
        url_encode(name)
    )
}

fn detail_url(ns: &str, name: &str) -> String {
    format!("/ui/vms/{}/{}", url_encode(ns), url_encode(name))
}

#[derive(Deserialize)]
pub struct YamlForm {
    #[serde(default)]
    yaml: String,
}

/// Pasted YAML is parsed as the API parses YAML bodies: within limits, off the async workers.
async fn parse_pasted_yaml(yaml: String) -> Result<Value, String> {
    crate::http::throttle::Pool::parsing()
        .run(move || crate::http::body::parse_yaml(&yaml))
        .await
        .unwrap_or_else(|_| Err("the server is busy; try again in a second".into()))
}

/// A VM as stored, every field as it is (for the YAML the pages show and edit).
async fn load_raw_vm(st: &AppState, ns: &str, name: &str) -> Result<Value, Response> {
    st.store
        .get(Kind::VirtualMachine, ns, name)
        .await
        .map_err(|e| error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))?
        .ok_or_else(|| error_page(StatusCode::NOT_FOUND, &format!("no VM {ns}/{name}")))
}

/// A VM as stored, typed, and its instance if it has one.
async fn load_vm(
    st: &AppState,
    ns: &str,
    name: &str,
) -> Result<(Value, VirtualMachine, Option<VirtualMachineInstance>), Response> {
    let internal = |e: String| error_page(StatusCode::INTERNAL_SERVER_ERROR, &e);
    let raw = load_raw_vm(st, ns, name).await?;
    let vm = VirtualMachine::from_value(raw.clone()).map_err(|e| internal(e.0))?;
    let vmi = st
        .store
        .get_typed::<VirtualMachineInstance>(ns, name)
        .await
        .map_err(|e| internal(e.to_string()))?;
    Ok((raw, vm, vmi))
}

/// A call to the API as the signed-in user (a body of `content_type`), then a redirect to
/// `to`; the API's refusal as the page to show.
async fn api_then(
    api: &crate::web::Api,
    p: &crate::http::auth::Principal,
    (method, uri, content_type, body): (axum::http::Method, &str, &str, String),
    to: &str,
) -> Response {
    let (code, v) = api.call(p, method, uri, content_type, body).await;
    if !code.is_success() {
        return error_page(code, &crate::web::api_message(&v));
    }
    axum::response::Redirect::to(to).into_response()
}

/// A backup, as the VM page and the Backups page list it.
pub struct BackupRow {
    name: String,
    /// Its VM (`ns/name`) and the VM's page.
    vm: String,
    link: String,
    target: String,
    /// `Full`, `Incremental`, or empty until known.
    kind: String,
    /// `Done: ...`, `Running: copied ... (NN%)`, `Failed: why`.
    state: String,
    /// Its size on the target, in MiB, once done.
    size: String,
    /// Where it is: `TARGET:NS/VM/FOLDER`, for `edgevirt backup verify|restore`.
    path: String,
    created: String,
    /// Done: it can be verified and restored.
    done: bool,
    /// The last verification: `Whole (time): ...`, `Damaged (time): ...`, `Verifying...`,
    /// or empty.
    verified: String,
}

/// The backups `keep` picks (none being deleted), newest first.
fn backup_rows(
    all: &[crate::types::backup::VirtualMachineBackup],
    keep: impl Fn(&crate::types::backup::VirtualMachineBackup) -> bool,
) -> Vec<BackupRow> {
    let mut rows: Vec<BackupRow> = all
        .iter()
        .filter(|b| keep(b) && !b.deleting())
        .map(|b| {
            let st = b.status.clone().unwrap_or_default();
            let msg = |t: &str| {
                st.conditions
                    .iter()
                    .find(|c| c.type_ == t)
                    .and_then(|c| c.message.clone())
                    .unwrap_or_default()
            };
            let state = if b.succeeded() {
                "Done".to_string()
            } else if b.finished() {
                format!("Failed: {}", msg("Failure"))
            } else {
                format!("Running: {}", msg("Progressing"))
            };
            let target = b.spec.pvc_name.clone().unwrap_or_default();
            let asked = b.annotation(crate::types::backup::VERIFY_ANNOTATION);
            let verified = match st.conditions.iter().find(|c| c.type_ == "Verified") {
                _ if asked.is_some() && asked != st.verify_request.as_deref() => {
                    "Verifying...".to_string()
                }
                Some(c) => format!(
                    "{} ({}): {}",
                    match (c.status.as_str(), c.reason.as_deref()) {
                        ("True", _) => "Whole",
                        (_, Some("Damaged")) => "Damaged",
                        _ => "Not verified",
                    },
                    c.last_probe_time.as_deref().unwrap_or(""),
                    c.message.as_deref().unwrap_or("")
                ),
                None => String::new(),
            };
            BackupRow {
                vm: format!("{}/{}", b.namespace(), b.spec.source.name),
                link: detail_url(b.namespace(), &b.spec.source.name),
                done: b.succeeded(),
                verified,
                name: b.name().to_string(),
                path: st
                    .path
                    .as_ref()
                    .map(|p| format!("{target}:{p}"))
                    .unwrap_or_default(),
                target,
                kind: st.type_.clone().unwrap_or_default(),
                state,
                size: st
                    .size_bytes
                    .map(|b| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64))
                    .unwrap_or_default(),
                created: b
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
            }
        })
        .collect();
    rows.sort_by(|a, b| b.created.cmp(&a.created));
    rows
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn instance_fields_read_typed() {
        let vmi = VirtualMachineInstance::from_value(json!({
            "metadata": {"name": "a", "namespace": "ns", "creationTimestamp": "2026-01-02T03:04:05Z"},
            "spec": {"domain": {}},
            "status": {
                "interfaces": [{"ipAddress": "10.0.0.2"}, {"ipAddress": ""}, {"name": "x"},
                               {"ipAddress": "fd00::2"}],
                "conditions": [{"type": "Ready", "status": "False", "reason": "Booting"},
                               {"type": "SomethingNewer", "status": "True"}],
            },
        }))
        .unwrap();
        assert_eq!(vmi_ip(&vmi), "10.0.0.2, fd00::2");
        let c = &vmi_status(&vmi).conditions;
        assert_eq!(
            condition_status(c, ConditionType::Ready).as_deref(),
            Some("False")
        );
        assert_eq!(
            condition_status(c, ConditionType::Other("SomethingNewer".into())).as_deref(),
            Some("True")
        );
        assert_eq!(condition_status(c, ConditionType::LiveMigratable), None);
        assert_eq!(created(&vmi), "2026-01-02T03:04:05Z");

        let bare = VirtualMachineInstance::from_value(
            json!({"metadata": {"name": "b"}, "spec": {"domain": {}}}),
        )
        .unwrap();
        assert_eq!(vmi_ip(&bare), "");
        assert!(vmi_status(&bare).phase.is_none());
        assert_eq!(created(&bare), "");
    }
}
