//! Page handlers and their templates. Reads go to the store directly (fast lists); changes go
//! through the API in-process as the logged-in user.

// Helpers return a finished error page as their Err: it is built once per failed request,
// so its size does not matter.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;

use askama::Template;
use axum::Form;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Api, CSP_XTERM, S, WebUser, api_message};
use crate::api::AppState;
use crate::api::auth::{self, Principal, Role};
use crate::store::{FieldSelector, LabelSelector};
use crate::types::kubevirt::phase;
use crate::types::{Kind, age};

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
            can_operate: matches!(u.role, Role::Admin | Role::Operator),
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

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or("")
}

fn or_dash(x: &str) -> String {
    if x.is_empty() { "-".into() } else { x.into() }
}

fn human_bytes(b: u64) -> String {
    const GI: f64 = (1u64 << 30) as f64;
    const MI: f64 = (1u64 << 20) as f64;
    if b as f64 >= GI {
        format!("{:.1} GiB", b as f64 / GI)
    } else {
        format!("{:.0} MiB", b as f64 / MI)
    }
}

fn condition(v: &Value, t: &str) -> Option<String> {
    v["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
        .and_then(|c| c["status"].as_str().map(str::to_string))
}

fn labels_text(v: &Value) -> String {
    v["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------- login

#[derive(Template)]
#[template(path = "login.html")]
struct LoginTpl {
    csrf: String,
    next: String,
    username: String,
    error: Option<String>,
}

/// Before login there is no session, so the login form's CSRF token is a double-submit
/// cookie: the form must send the value the cookie holds.
const PRELOGIN_COOKIE: &str = "edgevirt_prelogin";

fn cookie_header(st: &AppState, name: &str, value: &str, max_age: Option<i64>) -> HeaderValue {
    let mut c = cookie::Cookie::build((name.to_string(), value.to_string()))
        .path("/")
        .http_only(true)
        .same_site(cookie::SameSite::Strict)
        .secure(st.tls);
    if let Some(a) = max_age {
        c = c.max_age(cookie::time::Duration::seconds(a));
    }
    HeaderValue::from_str(&c.build().to_string()).expect("cookie values are hex")
}

#[derive(Deserialize, Default)]
pub struct LoginQuery {
    #[serde(default)]
    next: String,
}

fn safe_next(next: &str) -> String {
    // Only paths of the dashboard: never another site.
    if next.starts_with("/ui/") && !next.starts_with("//") {
        next.to_string()
    } else {
        "/ui/".into()
    }
}

fn login_form(
    st: &AppState,
    next: &str,
    username: &str,
    error: Option<String>,
    code: StatusCode,
) -> Response {
    let csrf = auth::random_secret(16);
    let mut r = render_status(
        code,
        &LoginTpl {
            csrf: csrf.clone(),
            next: safe_next(next),
            username: username.to_string(),
            error,
        },
    );
    r.headers_mut().append(
        header::SET_COOKIE,
        cookie_header(st, PRELOGIN_COOKIE, &csrf, Some(3600)),
    );
    r
}

pub async fn login_page(State(st): S, Query(q): Query<LoginQuery>) -> Response {
    login_form(&st, &q.next, "", None, StatusCode::OK)
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    next: String,
    username: String,
    password: String,
}

/// The login form again, with 429 and `Retry-After`: try again in `secs` seconds.
fn login_wait(st: &AppState, f: &LoginForm, message: String, secs: u64) -> Response {
    let mut r = login_form(
        st,
        &f.next,
        &f.username,
        Some(message),
        StatusCode::TOO_MANY_REQUESTS,
    );
    r.headers_mut().insert(header::RETRY_AFTER, secs.into());
    r
}

pub async fn login(
    State(st): S,
    peer: crate::api::Peer,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    use crate::api::throttle::{Pool, Refusal, retry_after_secs};
    let expected = auth::cookie(&headers, PRELOGIN_COOKIE).unwrap_or_default();
    if expected.is_empty() || !auth::same_secret(&f.csrf, &expected) {
        return login_form(
            &st,
            &f.next,
            &f.username,
            Some("the login form expired or did not come from this server; try again".into()),
            StatusCode::FORBIDDEN,
        );
    }
    let addr = crate::api::peer_ip(&peer);
    // For messages and logs: a user name is short; whatever a client sent may not be.
    let who: String = f.username.chars().take(64).collect();
    let attempt = match st.logins.begin(&f.username, addr) {
        Ok(a) => a,
        Err(Refusal::Locked(wait)) => {
            st.bursts.record(
                "dashboard login refused",
                addr,
                format!("user {who:?} is locked out from this address"),
            );
            let secs = retry_after_secs(wait);
            let message = format!(
                "too many failed logins for {who:?} from your address; try again in {} (an \
                 administrator can clear this on the Admin page or with \
                 `edgevirt lockout clear --user {who}`)",
                crate::types::human_duration(secs as i64),
            );
            return login_wait(&st, &f, message, secs);
        }
    };
    if !attempt.delay.is_zero() {
        // This user is failing from many addresses: every try waits, nobody's CPU spent.
        tokio::time::sleep(attempt.delay).await;
    }
    let user = match st.store.user(&f.username).await {
        Ok(u) => u,
        Err(e) => {
            st.logins.abandon(attempt);
            return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string());
        }
    };
    let ok = match &user {
        Some((hash, _)) => {
            let (p, h) = (f.password.clone(), hash.clone());
            match Pool::passwords()
                .run(move || auth::verify_password(&p, &h))
                .await
            {
                Ok(ok) => ok,
                Err(_) => {
                    st.logins.abandon(attempt);
                    let message = "the server is busy checking other logins; try again";
                    return login_wait(&st, &f, message.into(), 1);
                }
            }
        }
        None => false,
    };
    let locked = st.logins.finish(attempt, ok);
    let Some((_, role)) = user.filter(|_| ok) else {
        st.bursts.record(
            "dashboard login failed",
            addr,
            format!("wrong username or password for {who:?}"),
        );
        let mut error = "wrong username or password".to_string();
        if let Some(l) = locked {
            error.push_str(&format!(
                "; too many failed logins: further tries from your address wait {}",
                crate::types::human_duration(l.as_secs() as i64)
            ));
        }
        return login_form(
            &st,
            &f.next,
            &f.username,
            Some(error),
            StatusCode::UNAUTHORIZED,
        );
    };
    // A fresh session id at every login: a cookie planted before login is worth nothing.
    if let Some(old) = auth::cookie(&headers, auth::SESSION_COOKIE) {
        let _ = st.store.delete_session(&auth::token_hash(&old)).await;
    }
    let id = auth::random_secret(32);
    let csrf = auth::random_secret(16);
    if let Err(e) = st
        .store
        .create_session(
            &auth::token_hash(&id),
            &f.username,
            &role,
            &csrf,
            auth::SESSION_TTL_SECS,
        )
        .await
    {
        return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string());
    }
    tracing::info!(user = %f.username, role = %role, "dashboard login");
    let mut r = Redirect::to(&safe_next(&f.next)).into_response();
    let h = r.headers_mut();
    h.append(
        header::SET_COOKIE,
        cookie_header(&st, auth::SESSION_COOKIE, &id, Some(auth::SESSION_TTL_SECS)),
    );
    h.append(
        header::SET_COOKIE,
        cookie_header(&st, PRELOGIN_COOKIE, "", Some(0)),
    );
    r
}

pub async fn logout(
    State(st): S,
    Extension(u): Extension<WebUser>,
    headers: HeaderMap,
) -> Response {
    if let Some(id) = auth::cookie(&headers, auth::SESSION_COOKIE) {
        let _ = st.store.delete_session(&auth::token_hash(&id)).await;
    }
    tracing::info!(user = %u.name, "dashboard logout");
    let mut r = Redirect::to("/ui/login").into_response();
    r.headers_mut().append(
        header::SET_COOKIE,
        cookie_header(&st, auth::SESSION_COOKIE, "", Some(0)),
    );
    r
}

// ---------------------------------------------------------------- overview

pub struct NodeRow {
    name: String,
    status: String,
    cordoned: bool,
    vendor: String,
    model: String,
    /// CPUID family/model/stepping, e.g. `24/1/1`.
    signature: String,
    /// libvirt's host-model CPU, e.g. `Dhyana`.
    host_model: String,
    cpus: u64,
    accel: String,
    memory: String,
    vms: usize,
    version: String,
    heartbeat: String,
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewTpl {
    c: Chrome,
    nodes: Vec<NodeRow>,
    total: usize,
    by_status: Vec<(String, usize)>,
    rollout: crate::controller::strategy::Rollout,
}

async fn all(st: &AppState, kind: Kind) -> Result<Vec<Value>, Response> {
    st.store
        .list(
            kind,
            None,
            &LabelSelector::default(),
            &FieldSelector::default(),
        )
        .await
        .map(|(v, _)| v)
        .map_err(|e| error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))
}

pub async fn overview(State(st): S, Extension(u): Extension<WebUser>) -> Response {
    let (nodes, vms, vmis) = match tokio::try_join!(
        all(&st, Kind::Node),
        all(&st, Kind::VirtualMachine),
        all(&st, Kind::VirtualMachineInstance)
    ) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for i in &vmis {
        *per_node.entry(s(i, &["status", "nodeName"])).or_default() += 1;
    }
    let nodes = nodes
        .iter()
        .map(|n| {
            let name = s(n, &["metadata", "name"]).to_string();
            let ready = condition(n, "Ready");
            NodeRow {
                vms: per_node.get(name.as_str()).copied().unwrap_or(0),
                status: match ready.as_deref() {
                    Some("True") => "Ready".into(),
                    Some(_) => "NotReady".into(),
                    None => "Unknown".into(),
                },
                cordoned: n["spec"]["unschedulable"] == json!(true),
                vendor: or_dash(s(n, &["status", "cpu", "vendor"])),
                model: or_dash(s(n, &["status", "cpu", "model"])),
                signature: match n["status"]["cpu"]["family"].as_u64() {
                    Some(f) => format!(
                        "{f}/{}/{}",
                        n["status"]["cpu"]["modelNumber"].as_u64().unwrap_or(0),
                        n["status"]["cpu"]["stepping"].as_u64().unwrap_or(0)
                    ),
                    None => "-".into(),
                },
                host_model: or_dash(s(n, &["status", "cpu", "hostModel", "model"])),
                cpus: n["status"]["cpu"]["count"].as_u64().unwrap_or(0),
                accel: or_dash(s(n, &["status", "accelerator"])),
                memory: human_bytes(n["status"]["memoryBytes"].as_u64().unwrap_or(0)),
                version: or_dash(s(n, &["status", "version"])),
                heartbeat: match s(n, &["status", "lastHeartbeatTime"]) {
                    "" => "-".into(),
                    t => format!("{} ago", age(t)),
                },
                name,
            }
        })
        .collect();
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    for vm in &vms {
        *by_status
            .entry(or_dash(s(vm, &["status", "printableStatus"])))
            .or_default() += 1;
    }
    let rollout = match crate::controller::strategy::current_rollout(&st.store).await {
        Ok(r) => r,
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    render(&OverviewTpl {
        c: Chrome::new(&u, "Overview"),
        nodes,
        total: vms.len(),
        by_status: by_status.into_iter().collect(),
        rollout,
    })
}

// ---------------------------------------------------------------- VM list

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

fn vmi_ip(vmi: &Value) -> String {
    vmi["status"]["interfaces"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["ipAddress"].as_str())
                .filter(|ip| !ip.is_empty())
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// Rows as `kubectl get vmi -o wide` has them, for every VM (stopped ones too).
async fn rows(st: &AppState, q: &ListQuery) -> Result<Vec<VmRow>, Response> {
    let labels = LabelSelector::parse(&q.label)
        .map_err(|e| error_page(StatusCode::BAD_REQUEST, &format!("bad label selector: {e}")))?;
    let (vms, vmis) = tokio::try_join!(
        async {
            st.store
                .list(
                    Kind::VirtualMachine,
                    None,
                    &labels,
                    &FieldSelector::default(),
                )
                .await
        },
        async {
            st.store
                .list(
                    Kind::VirtualMachineInstance,
                    None,
                    &LabelSelector::default(),
                    &FieldSelector::default(),
                )
                .await
        }
    )
    .map_err(|e| error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))?;
    let vmis: BTreeMap<(&str, &str), &Value> = vmis
        .0
        .iter()
        .map(|i| {
            (
                (
                    s(i, &["metadata", "namespace"]),
                    s(i, &["metadata", "name"]),
                ),
                i,
            )
        })
        .collect();
    let needle = q.q.trim().to_lowercase();
    Ok(vms
        .0
        .iter()
        .filter(|vm| {
            needle.is_empty()
                || s(vm, &["metadata", "name"])
                    .to_lowercase()
                    .contains(&needle)
        })
        .map(|vm| {
            let ns = s(vm, &["metadata", "namespace"]);
            let name = s(vm, &["metadata", "name"]);
            let vmi = vmis.get(&(ns, name)).copied();
            VmRow {
                ns: ns.into(),
                name: name.into(),
                status: or_dash(s(vm, &["status", "printableStatus"])),
                age: age(s(vm, &["metadata", "creationTimestamp"])),
                phase: vmi
                    .map(|i| or_dash(s(i, &["status", "phase"])))
                    .unwrap_or("-".into()),
                ip: vmi.map(vmi_ip).map(|x| or_dash(&x)).unwrap_or("-".into()),
                node: vmi
                    .map(|i| or_dash(s(i, &["status", "nodeName"])))
                    .unwrap_or("-".into()),
                ready: vmi
                    .and_then(|i| condition(i, "Ready"))
                    .unwrap_or("-".into()),
                live_migratable: vmi
                    .and_then(|i| condition(i, "LiveMigratable"))
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
            c: Chrome::new(&u, "Virtual machines"),
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

// ---------------------------------------------------------------- create

#[derive(Deserialize, Clone, Default)]
pub struct VmForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    cpus: String,
    #[serde(default)]
    memory: String,
    #[serde(default)]
    image: String,
    #[serde(default)]
    kernel: String,
    #[serde(default)]
    initrd: String,
    #[serde(default)]
    kernel_args: String,
    #[serde(default)]
    user_data: String,
    #[serde(default)]
    network: String,
    #[serde(default)]
    labels: String,
    #[serde(default)]
    start: Option<String>,
}

/// The form as the template fills it back in.
pub struct FormValues {
    name: String,
    namespace: String,
    cpus: String,
    memory: String,
    image: String,
    kernel: String,
    initrd: String,
    kernel_args: String,
    user_data: String,
    network: String,
    labels: String,
    start: bool,
}

impl From<VmForm> for FormValues {
    fn from(f: VmForm) -> Self {
        FormValues {
            name: f.name,
            namespace: if f.namespace.is_empty() {
                "default".into()
            } else {
                f.namespace
            },
            cpus: if f.cpus.is_empty() {
                "1".into()
            } else {
                f.cpus
            },
            memory: if f.memory.is_empty() {
                "512Mi".into()
            } else {
                f.memory
            },
            image: f.image,
            kernel: f.kernel,
            initrd: f.initrd,
            kernel_args: f.kernel_args,
            user_data: f.user_data,
            network: if f.network.is_empty() {
                "nat".into()
            } else {
                f.network
            },
            labels: f.labels,
            start: f.start.is_some(),
        }
    }
}

#[derive(Template)]
#[template(path = "vm_new.html")]
struct NewVmTpl {
    c: Chrome,
    f: FormValues,
    images: Vec<String>,
    yaml: String,
}

async fn image_names(st: &AppState) -> Vec<String> {
    all(st, Kind::Image)
        .await
        .unwrap_or_default()
        .iter()
        .map(|i| s(i, &["metadata", "name"]).to_string())
        .collect()
}

pub async fn new_vm(State(st): S, Extension(u): Extension<WebUser>) -> Response {
    let blank = VmForm {
        start: Some("yes".into()),
        ..Default::default()
    };
    render(&NewVmTpl {
        c: Chrome::new(&u, "New VM"),
        f: blank.into(),
        images: image_names(&st).await,
        yaml: String::new(),
    })
}

fn parse_labels(s: &str) -> Result<serde_json::Map<String, Value>, String> {
    let mut m = serde_json::Map::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("label {part:?} is not key=value"))?;
        m.insert(k.trim().to_string(), json!(v.trim()));
    }
    Ok(m)
}

/// A KubeVirt VirtualMachine from the form's fields.
fn vm_from_form(f: &FormValues) -> Result<Value, String> {
    let cpus: u32 = f
        .cpus
        .trim()
        .parse()
        .map_err(|_| format!("CPUs must be a whole number, not {:?}", f.cpus))?;
    let mut labels = parse_labels(&f.labels)?;
    labels
        .entry("app".to_string())
        .or_insert_with(|| json!(f.name));
    let mut disks = vec![];
    let mut volumes = vec![];
    if !f.image.is_empty() {
        disks.push(json!({"name": "rootdisk", "disk": {"bus": "virtio"}}));
        volumes.push(json!({"name": "rootdisk", "containerDisk": {"image": f.image}}));
    }
    if !f.user_data.trim().is_empty() {
        disks.push(json!({"name": "cloudinitdisk", "disk": {"bus": "virtio"}}));
        volumes
            .push(json!({"name": "cloudinitdisk", "cloudInitNoCloud": {"userData": f.user_data}}));
    }
    let mut domain = json!({
        "cpu": {"cores": cpus},
        "memory": {"guest": f.memory.trim()},
        "devices": {"disks": disks},
    });
    let mut spec = json!({"domain": {}, "volumes": volumes});
    if f.network == "nat" {
        domain["devices"]["interfaces"] = json!([{"name": "default", "masquerade": {}}]);
        spec["networks"] = json!([{"name": "default", "pod": {}}]);
    }
    if !f.kernel.is_empty() {
        let mut c = json!({"image": f.kernel, "kernelPath": f.kernel});
        if !f.initrd.is_empty() {
            c["initrdPath"] = json!(f.initrd);
        }
        let mut kb = json!({"container": c});
        if !f.kernel_args.trim().is_empty() {
            kb["kernelArgs"] = json!(f.kernel_args.trim());
        }
        domain["firmware"] = json!({"kernelBoot": kb});
    } else if f.image.is_empty() {
        return Err("choose a boot disk image or a kernel to boot".into());
    }
    spec["domain"] = domain;
    Ok(json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": f.name.trim(), "namespace": f.namespace.trim(), "labels": labels},
        "spec": {
            "runStrategy": if f.start { "Always" } else { "Halted" },
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }))
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

pub async fn create_from_form(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Form(form): Form<VmForm>,
) -> Response {
    let f: FormValues = form.into();
    let attempt = match vm_from_form(&f) {
        Ok(vm) => {
            let uri = format!(
                "/apis/kubevirt.io/v1/namespaces/{}/virtualmachines",
                url_encode(&f.namespace)
            );
            let (code, v) = api
                .call(&p, Method::POST, &uri, "application/json", vm.to_string())
                .await;
            if code.is_success() {
                return Redirect::to(&detail_url(&f.namespace, &f.name)).into_response();
            }
            (code, api_message(&v))
        }
        Err(m) => (StatusCode::UNPROCESSABLE_ENTITY, m),
    };
    let mut c = Chrome::new(&u, "New VM");
    c.error = Some(attempt.1);
    render_status(
        attempt.0,
        &NewVmTpl {
            c,
            f,
            images: image_names(&st).await,
            yaml: String::new(),
        },
    )
}

#[derive(Deserialize)]
pub struct YamlForm {
    #[serde(default)]
    yaml: String,
}

/// Pasted YAML is parsed as the API parses YAML bodies: within limits, off the async workers.
async fn parse_pasted_yaml(yaml: String) -> Result<Value, String> {
    crate::api::throttle::Pool::parsing()
        .run(move || crate::api::body::parse_yaml(&yaml))
        .await
        .unwrap_or_else(|_| Err("the server is busy; try again in a second".into()))
}

pub async fn create_from_yaml(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Form(form): Form<YamlForm>,
) -> Response {
    let parsed = parse_pasted_yaml(form.yaml.clone()).await;
    let (code, msg) = match parsed {
        Ok(v) if v["kind"] == "VirtualMachine" => {
            let ns = v["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string();
            let name = v["metadata"]["name"].as_str().unwrap_or("").to_string();
            let uri = format!(
                "/apis/kubevirt.io/v1/namespaces/{}/virtualmachines",
                url_encode(&ns)
            );
            let (code, r) = api
                .call(&p, Method::POST, &uri, "application/json", v.to_string())
                .await;
            if code.is_success() {
                return Redirect::to(&detail_url(&ns, &name)).into_response();
            }
            (code, api_message(&r))
        }
        Ok(_) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "the YAML must be one object of kind VirtualMachine".to_string(),
        ),
        Err(m) => (StatusCode::BAD_REQUEST, m),
    };
    let mut c = Chrome::new(&u, "New VM");
    c.error = Some(msg);
    let blank: FormValues = VmForm {
        start: Some("yes".into()),
        ..Default::default()
    }
    .into();
    render_status(
        code,
        &NewVmTpl {
            c,
            f: blank,
            images: image_names(&st).await,
            yaml: form.yaml,
        },
    )
}

// ---------------------------------------------------------------- VM detail

pub struct StatusView {
    status: String,
    phase: String,
    node: String,
    ip: String,
    ready: String,
    live_migratable: String,
    guest_os: String,
    viewers: String,
    conditions: Vec<(String, String, String, String)>,
}

pub struct SpecView {
    run_strategy: String,
    cpus: String,
    memory: String,
    disks: String,
    networks: String,
    labels: String,
}

pub struct EventRow {
    rv: u64,
    kind: &'static str,
    change: String,
    status: String,
}

#[derive(Template)]
#[template(path = "vm_detail.html")]
struct DetailTpl {
    c: Chrome,
    ns: String,
    name: String,
    st: StatusView,
    spec: SpecView,
    events: Vec<EventRow>,
    yaml: String,
}

#[derive(Template)]
#[template(path = "vm_status.html")]
struct StatusTpl {
    st: StatusView,
}

async fn load_vm(st: &AppState, ns: &str, name: &str) -> Result<(Value, Option<Value>), Response> {
    let vm = st
        .store
        .get(Kind::VirtualMachine, ns, name)
        .await
        .map_err(|e| error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))?
        .ok_or_else(|| error_page(StatusCode::NOT_FOUND, &format!("no VM {ns}/{name}")))?;
    let vmi = st
        .store
        .get(Kind::VirtualMachineInstance, ns, name)
        .await
        .map_err(|e| error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))?;
    Ok((vm, vmi))
}

fn status_view(st: &AppState, vm: &Value, vmi: Option<&Value>) -> StatusView {
    let key = (
        s(vm, &["metadata", "namespace"]).to_string(),
        s(vm, &["metadata", "name"]).to_string(),
    );
    let viewers = st.consoles.state(&key);
    let viewers = viewers["viewers"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| {
                    format!(
                        "{} ({}{})",
                        v["user"].as_str().unwrap_or(""),
                        v["kind"].as_str().unwrap_or(""),
                        if v["control"] == json!(true) && v["kind"] == "vnc" {
                            ", in control"
                        } else {
                            ""
                        }
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let gos = vmi.map(|i| &i["status"]["guestOSInfo"]);
    StatusView {
        status: or_dash(s(vm, &["status", "printableStatus"])),
        phase: vmi
            .map(|i| or_dash(s(i, &["status", "phase"])))
            .unwrap_or("-".into()),
        node: vmi
            .map(|i| or_dash(s(i, &["status", "nodeName"])))
            .unwrap_or("-".into()),
        ip: vmi.map(vmi_ip).map(|x| or_dash(&x)).unwrap_or("-".into()),
        ready: vmi
            .and_then(|i| condition(i, "Ready"))
            .unwrap_or("-".into()),
        live_migratable: vmi
            .and_then(|i| {
                let c = i["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == "LiveMigratable")?;
                Some(match c["reason"].as_str() {
                    Some(r) if !r.is_empty() => {
                        format!("{} ({r})", c["status"].as_str().unwrap_or(""))
                    }
                    _ => c["status"].as_str().unwrap_or("").to_string(),
                })
            })
            .unwrap_or("-".into()),
        guest_os: gos
            .map(|g| {
                let pretty = g["prettyName"]
                    .as_str()
                    .or(g["name"].as_str())
                    .unwrap_or("");
                let kernel = g["kernelRelease"].as_str().unwrap_or("");
                or_dash(format!("{pretty} {kernel}").trim())
            })
            .unwrap_or("-".into()),
        viewers: or_dash(&viewers),
        conditions: vmi
            .and_then(|i| i["status"]["conditions"].as_array())
            .map(|a| {
                a.iter()
                    .map(|c| {
                        (
                            s(c, &["type"]).to_string(),
                            s(c, &["status"]).to_string(),
                            s(c, &["reason"]).to_string(),
                            s(c, &["message"]).to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn spec_view(vm: &Value) -> SpecView {
    let t = &vm["spec"]["template"]["spec"];
    let cpu = &t["domain"]["cpu"];
    let n = |k: &str| cpu[k].as_u64().unwrap_or(1);
    let names = |arr: &Value, f: &dyn Fn(&Value) -> String| {
        arr.as_array()
            .map(|a| a.iter().map(f).collect::<Vec<_>>().join(", "))
            .unwrap_or_default()
    };
    SpecView {
        run_strategy: vm["spec"]["runStrategy"]
            .as_str()
            .map(str::to_string)
            .or_else(|| {
                vm["spec"]["running"]
                    .as_bool()
                    .map(|r| format!("running: {r}"))
            })
            .unwrap_or("-".into()),
        cpus: (n("cores") * n("sockets") * n("threads")).to_string(),
        memory: or_dash(
            t["domain"]["memory"]["guest"]
                .as_str()
                .or(t["domain"]["resources"]["requests"]["memory"].as_str())
                .unwrap_or(""),
        ),
        disks: or_dash(&names(&t["volumes"], &|v| {
            let src = v
                .as_object()
                .and_then(|o| o.keys().find(|k| *k != "name").cloned())
                .unwrap_or_default();
            format!("{} ({src})", s(v, &["name"]))
        })),
        networks: or_dash(&names(&t["networks"], &|v| s(v, &["name"]).to_string())),
        labels: or_dash(&labels_text(vm)),
    }
}

pub async fn vm_detail(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    let (vm, vmi) = match load_vm(&st, &ns, &name).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut events = vec![];
    for kind in [Kind::VirtualMachine, Kind::VirtualMachineInstance] {
        if let Ok(h) = st.store.object_history(kind, &ns, &name, 15).await {
            for (rv, change, body) in h {
                let status = match kind {
                    Kind::VirtualMachine => s(&body, &["status", "printableStatus"]),
                    _ => s(&body, &["status", "phase"]),
                };
                events.push(EventRow {
                    rv,
                    kind: if kind == Kind::VirtualMachine {
                        "VM"
                    } else {
                        "VMI"
                    },
                    change,
                    status: or_dash(status),
                });
            }
        }
    }
    events.sort_by_key(|e| std::cmp::Reverse(e.rv));
    events.truncate(20);
    let mut clean = vm.clone();
    if let Some(m) = clean["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    render(&DetailTpl {
        c: Chrome::new(&u, name.clone()),
        st: status_view(&st, &vm, vmi.as_ref()),
        spec: spec_view(&vm),
        events,
        yaml: serde_yaml_ng::to_string(&clean).unwrap_or_default(),
        ns,
        name,
    })
}

pub async fn vm_status(State(st): S, Path((ns, name)): Path<(String, String)>) -> Response {
    match load_vm(&st, &ns, &name).await {
        Ok((vm, vmi)) => render(&StatusTpl {
            st: status_view(&st, &vm, vmi.as_ref()),
        }),
        Err(r) => r,
    }
}

// ---------------------------------------------------------------- edit, actions

#[derive(Template)]
#[template(path = "vm_edit.html")]
struct EditTpl {
    c: Chrome,
    ns: String,
    name: String,
    yaml: String,
}

pub async fn edit_vm(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    let (mut vm, _) = match load_vm(&st, &ns, &name).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if let Some(o) = vm.as_object_mut() {
        o.remove("status");
    }
    render(&EditTpl {
        c: Chrome::new(&u, format!("Edit {name}")),
        yaml: serde_yaml_ng::to_string(&vm).unwrap_or_default(),
        ns,
        name,
    })
}

pub async fn save_vm(
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(form): Form<YamlForm>,
) -> Response {
    let (code, msg) = match parse_pasted_yaml(form.yaml.clone()).await {
        Ok(v) => {
            let (code, r) = api
                .call(
                    &p,
                    Method::PUT,
                    &vm_path(&ns, &name),
                    "application/json",
                    v.to_string(),
                )
                .await;
            if code.is_success() {
                return Redirect::to(&detail_url(&ns, &name)).into_response();
            }
            (code, api_message(&r))
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            format!("the YAML does not parse: {e}"),
        ),
    };
    let mut c = Chrome::new(&u, format!("Edit {name}"));
    c.error = Some(msg);
    render_status(
        code,
        &EditTpl {
            c,
            ns,
            name,
            yaml: form.yaml,
        },
    )
}

#[derive(Deserialize)]
pub struct ActionForm {
    action: String,
}

pub async fn vm_action(
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<ActionForm>,
) -> Response {
    let (method, uri) = match f.action.as_str() {
        "delete" => (Method::DELETE, vm_path(&ns, &name)),
        a @ ("start" | "stop" | "restart") => (
            Method::PUT,
            format!(
                "/apis/subresources.kubevirt.io/v1/namespaces/{}/virtualmachines/{}/{a}",
                url_encode(&ns),
                url_encode(&name)
            ),
        ),
        a @ ("pause" | "unpause" | "softreboot") => (
            Method::PUT,
            format!(
                "/apis/subresources.kubevirt.io/v1/namespaces/{}/virtualmachineinstances/{}/{a}",
                url_encode(&ns),
                url_encode(&name)
            ),
        ),
        other => return error_page(StatusCode::BAD_REQUEST, &format!("no action {other:?}")),
    };
    let (code, v) = api.call(&p, method, &uri, "application/json", "{}").await;
    if !code.is_success() {
        return error_page(code, &api_message(&v));
    }
    if f.action == "delete" {
        Redirect::to("/ui/vms").into_response()
    } else {
        Redirect::to(&detail_url(&ns, &name)).into_response()
    }
}

// ---------------------------------------------------------------- consoles

#[derive(Template)]
#[template(path = "console.html")]
struct ConsoleTpl {
    c: Chrome,
    ns: String,
    name: String,
    running: bool,
    status: String,
}

#[derive(Template)]
#[template(path = "serial.html")]
struct SerialTpl {
    c: Chrome,
    ns: String,
    name: String,
    running: bool,
    status: String,
}

async fn console_common(
    st: &AppState,
    u: &WebUser,
    ns: &str,
    name: &str,
) -> Result<(bool, String), Response> {
    if !matches!(u.role, Role::Admin | Role::Operator) {
        return Err(error_page(
            StatusCode::FORBIDDEN,
            "viewers may not open consoles (operator or admin needed)",
        ));
    }
    let (vm, vmi) = load_vm(st, ns, name).await?;
    let running = vmi
        .as_ref()
        .is_some_and(|i| s(i, &["status", "phase"]) == phase::RUNNING);
    Ok((running, or_dash(s(&vm, &["status", "printableStatus"]))))
}

pub async fn console(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    match console_common(&st, &u, &ns, &name).await {
        Ok((running, status)) => render(&ConsoleTpl {
            c: Chrome::new(&u, format!("Console of {name}")),
            ns,
            name,
            running,
            status,
        }),
        Err(r) => r,
    }
}

pub async fn serial(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    match console_common(&st, &u, &ns, &name).await {
        Ok((running, status)) => {
            let mut r = render(&SerialTpl {
                c: Chrome::new(&u, format!("Serial console of {name}")),
                ns,
                name,
                running,
                status,
            });
            r.headers_mut().insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP_XTERM),
            );
            r
        }
        Err(r) => r,
    }
}

// ---------------------------------------------------------------- admin

#[derive(Template)]
#[template(path = "admin.html")]
struct AdminTpl {
    c: Chrome,
    users: Vec<crate::store::UserInfo>,
    tokens: Vec<crate::store::TokenInfo>,
    new_token: Option<String>,
    lockouts: Vec<crate::api::throttle::Lockout>,
}

fn require_admin(u: &WebUser) -> Result<(), Response> {
    if u.role == Role::Admin {
        Ok(())
    } else {
        Err(error_page(
            StatusCode::FORBIDDEN,
            "only administrators manage users and tokens",
        ))
    }
}

async fn admin_page(
    st: &AppState,
    u: &WebUser,
    error: Option<String>,
    notice: Option<String>,
    new_token: Option<String>,
    code: StatusCode,
) -> Response {
    if let Err(r) = require_admin(u) {
        return r;
    }
    let (users, tokens) = match tokio::try_join!(st.store.users(), st.store.tokens()) {
        Ok(x) => x,
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let mut c = Chrome::new(u, "Users and tokens");
    c.error = error;
    c.notice = notice;
    render_status(
        code,
        &AdminTpl {
            c,
            users,
            tokens,
            new_token,
            lockouts: st.logins.list(),
        },
    )
}

pub async fn admin(State(st): S, Extension(u): Extension<WebUser>) -> Response {
    admin_page(&st, &u, None, None, None, StatusCode::OK).await
}

#[derive(Deserialize)]
pub struct UserForm {
    name: String,
    role: String,
    password: String,
}

pub async fn create_user(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Form(f): Form<UserForm>,
) -> Response {
    if let Err(r) = require_admin(&u) {
        return r;
    }
    let bad = |m: String| (StatusCode::UNPROCESSABLE_ENTITY, m);
    let result = if crate::types::check_name("user", &f.name).is_err() {
        Err(bad(format!(
            "{:?} is not a valid user name (lower-case letters, digits and '-')",
            f.name
        )))
    } else if !matches!(f.role.as_str(), "admin" | "operator" | "viewer") {
        Err(bad(format!(
            "no role {:?} (admin, operator or viewer)",
            f.role
        )))
    } else if f.password.chars().count() < 8 {
        Err(bad("the password needs at least 8 characters".into()))
    } else {
        let p = f.password.clone();
        let hash = tokio::task::spawn_blocking(move || auth::hash_password(&p))
            .await
            .unwrap_or_default();
        match st.store.create_user(&f.name, &hash, &f.role).await {
            Ok(true) => Ok(()),
            Ok(false) => Err((
                StatusCode::CONFLICT,
                format!("user {:?} exists already", f.name),
            )),
            Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        }
    };
    match result {
        Ok(()) => {
            tracing::info!(admin = %u.name, user = %f.name, role = %f.role, "user created");
            admin_page(
                &st,
                &u,
                None,
                Some(format!("User {} created.", f.name)),
                None,
                StatusCode::OK,
            )
            .await
        }
        Err((code, m)) => admin_page(&st, &u, Some(m), None, None, code).await,
    }
}

pub async fn delete_user(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Path(user): Path<String>,
) -> Response {
    if let Err(r) = require_admin(&u) {
        return r;
    }
    if user == u.name {
        return admin_page(
            &st,
            &u,
            Some("you cannot delete yourself".into()),
            None,
            None,
            StatusCode::CONFLICT,
        )
        .await;
    }
    match st.store.delete_user(&user).await {
        Ok(true) => {
            tracing::info!(admin = %u.name, %user, "user deleted");
            Redirect::to("/ui/admin").into_response()
        }
        Ok(false) => {
            admin_page(
                &st,
                &u,
                Some(format!("no user {user:?}")),
                None,
                None,
                StatusCode::NOT_FOUND,
            )
            .await
        }
        Err(e) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

#[derive(Deserialize)]
pub struct TokenForm {
    user: String,
    #[serde(default)]
    description: String,
}

pub async fn create_token(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Form(f): Form<TokenForm>,
) -> Response {
    if let Err(r) = require_admin(&u) {
        return r;
    }
    let role = match st.store.user(&f.user).await {
        Ok(Some((_, role))) => role,
        Ok(None) => {
            return admin_page(
                &st,
                &u,
                Some(format!("no user {:?}", f.user)),
                None,
                None,
                StatusCode::NOT_FOUND,
            )
            .await;
        }
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let secret = auth::random_secret(24);
    match st
        .store
        .add_token(
            &auth::token_hash(&secret),
            &f.user,
            &role,
            f.description.trim(),
        )
        .await
    {
        Ok(id) => {
            tracing::info!(admin = %u.name, user = %f.user, token = %id, "API token created");
            admin_page(&st, &u, None, None, Some(secret), StatusCode::OK).await
        }
        Err(e) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

#[derive(Deserialize)]
pub struct ClearLockoutForm {
    #[serde(default)]
    user: String,
    #[serde(default)]
    address: String,
}

/// Clear failed logins: one user's and/or one address's, or all when both are empty.
pub async fn clear_lockouts(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Form(f): Form<ClearLockoutForm>,
) -> Response {
    if let Err(r) = require_admin(&u) {
        return r;
    }
    let user = Some(f.user.as_str()).filter(|s| !s.is_empty());
    let addr = match f.address.as_str() {
        "" => None,
        a => match a.parse() {
            Ok(ip) => Some(ip),
            Err(_) => {
                return admin_page(
                    &st,
                    &u,
                    Some(format!("{a:?} is not an IP address")),
                    None,
                    None,
                    StatusCode::UNPROCESSABLE_ENTITY,
                )
                .await;
            }
        },
    };
    let n = st.logins.clear(user, addr);
    tracing::info!(admin = %u.name, user = ?user, address = ?addr, cleared = n, "login lockouts cleared");
    Redirect::to("/ui/admin").into_response()
}

pub async fn delete_token(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = require_admin(&u) {
        return r;
    }
    match st.store.delete_token(&id).await {
        Ok(true) => {
            tracing::info!(admin = %u.name, token = %id, "API token revoked");
            Redirect::to("/ui/admin").into_response()
        }
        Ok(false) => {
            admin_page(
                &st,
                &u,
                Some(format!("no token {id:?}")),
                None,
                None,
                StatusCode::NOT_FOUND,
            )
            .await
        }
        Err(e) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}
