//! The site's backups: the backup targets the nodes mount (size and free space, what they
//! hold), the backup schedules (last and next run, retention, and forms to add, suspend and
//! delete one), and every backup of every VM.

use askama::Template;
use axum::Form;
use axum::extract::{Extension, Path, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde::Deserialize;

use super::{BackupRow, Chrome, all, backup_rows, error_page, human_bytes, render, url_encode};
use crate::http::auth::Principal;
use crate::types::Meta;
use crate::types::backup::{BackupSchedule, VirtualMachineBackup};
use crate::types::edgevirt::Node;
use crate::web::{Api, S, WebUser};

/// A backup target as one node mounts it.
pub struct TargetRow {
    name: String,
    node: String,
    path: String,
    size: String,
    free: String,
    used_pct: u64,
    low: bool,
    /// The backups written to it (all nodes) and their size.
    backups: usize,
    bytes: String,
}

pub struct ScheduleRow {
    ns: String,
    name: String,
    target: String,
    /// The VMs it backs up: names and label selector.
    what: String,
    every: String,
    /// The retention rule, e.g. `last 3, daily 7`.
    keep: String,
    last_run: String,
    next_run: String,
    runs: u64,
    pruned: u64,
    message: String,
    suspended: bool,
}

#[derive(Template)]
#[template(path = "backups.html")]
struct BackupsTpl {
    c: Chrome,
    targets: Vec<TargetRow>,
    schedules: Vec<ScheduleRow>,
    backups: Vec<BackupRow>,
    /// The target names, for the new schedule's picker.
    target_names: Vec<String>,
    notice: Option<&'static str>,
}

#[derive(Deserialize)]
pub struct DoneQuery {
    #[serde(default)]
    done: String,
}

/// `GET /ui/backups`
pub async fn backups(
    State(st): S,
    Extension(u): Extension<WebUser>,
    axum::extract::Query(q): axum::extract::Query<DoneQuery>,
) -> Response {
    let (nodes, scheds, all_backups) = match tokio::try_join!(
        all::<Node>(&st),
        all::<BackupSchedule>(&st),
        all::<VirtualMachineBackup>(&st)
    ) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut targets = vec![];
    for n in &nodes {
        let Some(s) = &n.status else { continue };
        for t in &s.backup_targets {
            let facts = s
                .storage
                .iter()
                .find(|f| f.name == format!("backup:{}", t.name));
            let (cap, free) = facts.map_or((0, 0), |f| (f.capacity_bytes, f.free_bytes));
            let used_pct = (cap.saturating_sub(free) * 100)
                .checked_div(cap)
                .unwrap_or(0);
            let on_it: Vec<&VirtualMachineBackup> = all_backups
                .iter()
                .filter(|b| b.spec.pvc_name.as_deref() == Some(t.name.as_str()) && b.succeeded())
                .collect();
            targets.push(TargetRow {
                name: t.name.clone(),
                node: n.name().to_string(),
                path: t.path.clone(),
                size: if facts.is_some() {
                    human_bytes(cap)
                } else {
                    "-".into()
                },
                free: if facts.is_some() {
                    human_bytes(free)
                } else {
                    "not mounted?".into()
                },
                used_pct,
                low: cap > 0 && 100 - used_pct < 10,
                backups: on_it.len(),
                bytes: human_bytes(
                    on_it
                        .iter()
                        .filter_map(|b| b.status.as_ref().and_then(|s| s.size_bytes))
                        .sum(),
                ),
            });
        }
    }
    targets.sort_by(|a, b| (&a.name, &a.node).cmp(&(&b.name, &b.node)));
    let mut target_names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
    target_names.dedup();
    let schedules = scheds
        .iter()
        .map(|s| {
            let st = s.status.clone().unwrap_or_default();
            let mut what = s.spec.vms.join(", ");
            if let Some(l) = &s.spec.match_labels {
                let sel: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v}")).collect();
                if !what.is_empty() {
                    what.push_str("; ");
                }
                what.push_str(&format!("labels {}", sel.join(",")));
            }
            let k = &s.spec.keep;
            let keep: Vec<String> = [
                ("last", k.last),
                ("hourly", k.hourly),
                ("daily", k.daily),
                ("weekly", k.weekly),
                ("monthly", k.monthly),
            ]
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(w, n)| format!("{w} {n}"))
            .collect();
            ScheduleRow {
                ns: s.namespace().to_string(),
                name: s.name().to_string(),
                target: s.spec.target.clone(),
                what,
                every: s.spec.every.clone(),
                keep: if keep.is_empty() {
                    "everything".into()
                } else {
                    keep.join(", ")
                },
                last_run: st.last_run.unwrap_or_else(|| "-".into()),
                next_run: st.next_run.unwrap_or_else(|| "-".into()),
                runs: st.runs,
                pruned: st.pruned,
                message: st.message.unwrap_or_default(),
                suspended: s.spec.suspend == Some(true),
            }
        })
        .collect();
    let notice = match q.done.as_str() {
        "created" => Some("The schedule is saved; its first backups start now."),
        "suspended" => Some("The schedule is suspended: no new backups (pruning goes on)."),
        "resumed" => Some("The schedule runs again."),
        "deleted" => Some("The schedule is deleted; the backups it made stay until deleted."),
        _ => None,
    };
    render(&BackupsTpl {
        c: Chrome::new(&u, "Backups"),
        targets,
        schedules,
        backups: backup_rows(&all_backups, |_| true),
        target_names,
        notice,
    })
}

fn schedules_uri(ns: &str) -> String {
    format!(
        "/apis/edgevirt.io/v1/namespaces/{}/backupschedules",
        url_encode(ns)
    )
}

/// The new-schedule form.
#[derive(Deserialize)]
pub struct ScheduleForm {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    target: String,
    /// VM names, separated by commas or spaces.
    #[serde(default)]
    vms: String,
    #[serde(default)]
    every: String,
    #[serde(default)]
    keep_last: String,
    #[serde(default)]
    keep_daily: String,
    #[serde(default)]
    keep_weekly: String,
    #[serde(default)]
    keep_monthly: String,
}

/// A count from the form: empty is 0; anything but a whole number up to 10000 is refused.
fn count(field: &str, v: &str) -> Result<u32, Response> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(0);
    }
    match v.parse::<u32>() {
        Ok(n) if n <= 10_000 => Ok(n),
        _ => Err(error_page(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("{field}: {v:?} is not a whole number from 0 to 10000"),
        )),
    }
}

/// `POST /ui/backups/schedules`: a `BackupSchedule` from the form (the API checks it).
pub async fn create_schedule(
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Form(f): Form<ScheduleForm>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "create backup schedules") {
        return r;
    }
    let keep = match (|| {
        Ok::<_, Response>(serde_json::json!({
            "last": count("keep last", &f.keep_last)?,
            "daily": count("keep daily", &f.keep_daily)?,
            "weekly": count("keep weekly", &f.keep_weekly)?,
            "monthly": count("keep monthly", &f.keep_monthly)?,
        }))
    })() {
        Ok(k) => k,
        Err(r) => return r,
    };
    let ns = match f.namespace.trim() {
        "" => "default",
        n => n,
    };
    if let Err(e) = crate::types::check_name("namespace", ns) {
        return error_page(StatusCode::UNPROCESSABLE_ENTITY, &e.0);
    }
    let vms: Vec<&str> = f
        .vms
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|v| !v.is_empty())
        .collect();
    let body = serde_json::json!({
        "apiVersion": "edgevirt.io/v1", "kind": "BackupSchedule",
        "metadata": {"name": f.name.trim(), "namespace": ns},
        "spec": {"target": f.target.trim(), "vms": vms, "every": f.every.trim(), "keep": keep},
    });
    tracing::info!(namespace = %ns, schedule = %f.name.trim(), user = %p.user, "creating a backup schedule");
    let uri = schedules_uri(ns);
    let call = (
        Method::POST,
        uri.as_str(),
        "application/json",
        body.to_string(),
    );
    super::api_then(&api, &p, call, "/ui/backups?done=created").await
}

#[derive(Deserialize)]
pub struct SuspendForm {
    #[serde(default)]
    suspend: String,
}

/// `POST /ui/backups/schedules/{ns}/{name}/suspend`: `suspend=true` stops new backups,
/// `false` resumes.
pub async fn suspend_schedule(
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<SuspendForm>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "suspend backup schedules") {
        return r;
    }
    let on = match f.suspend.as_str() {
        "true" => true,
        "false" => false,
        other => {
            return error_page(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("suspend: {other:?} is neither true nor false"),
            );
        }
    };
    let uri = format!("{}/{}", schedules_uri(&ns), url_encode(&name));
    let patch = serde_json::json!({"spec": {"suspend": on}});
    tracing::info!(namespace = %ns, schedule = %name, suspend = on, user = %p.user, "suspending or resuming a backup schedule");
    let done = if on { "suspended" } else { "resumed" };
    let merge = "application/merge-patch+json";
    let call = (Method::PATCH, uri.as_str(), merge, patch.to_string());
    super::api_then(&api, &p, call, &format!("/ui/backups?done={done}")).await
}

/// `POST /ui/backups/schedules/{ns}/{name}/delete`
pub async fn delete_schedule(
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "delete backup schedules") {
        return r;
    }
    let uri = format!("{}/{}", schedules_uri(&ns), url_encode(&name));
    tracing::info!(namespace = %ns, schedule = %name, user = %p.user, "deleting a backup schedule");
    let call = (
        Method::DELETE,
        uri.as_str(),
        "application/json",
        String::new(),
    );
    super::api_then(&api, &p, call, "/ui/backups?done=deleted").await
}
