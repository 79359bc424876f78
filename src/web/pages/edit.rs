//! Editing a VM's YAML and the action buttons.

use askama::Template;
use axum::Form;
use axum::extract::{Extension, Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{
    Chrome, YamlForm, detail_url, error_page, load_raw_vm, parse_pasted_yaml, render,
    render_status, url_encode, vm_path,
};
use crate::http::auth::Principal;
use crate::types::Meta;
use crate::web::{Api, S, WebUser, api_message};

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
    if let Some(r) = super::viewer_refused(&u, "edit VMs") {
        return r;
    }
    let mut vm = match load_raw_vm(&st, &ns, &name).await {
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
        a @ ("start" | "stop" | "restart") => (Method::PUT, subresource(&ns, &name, a)),
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
    // The next page says the action was taken (its status then follows it).
    if f.action == "delete" {
        Redirect::to(&format!(
            "/ui/vms?deleted={}",
            url_encode(&format!("{ns}/{name}"))
        ))
        .into_response()
    } else {
        Redirect::to(&format!("{}?done={}", detail_url(&ns, &name), f.action)).into_response()
    }
}

#[derive(Deserialize)]
pub struct MigrateForm {
    /// A node's name, or empty: the scheduler chooses.
    #[serde(default)]
    target: String,
    /// Copy local disks along (block migration).
    #[serde(default)]
    block: Option<String>,
}

/// `POST /ui/vms/{ns}/{name}/migrate`: live-migrate the VM's instance, to a chosen node
/// (KubeVirt's `addedNodeSelector` on its hostname) or where the scheduler chooses.
pub async fn vm_migrate(
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<MigrateForm>,
) -> Response {
    let mut opts = serde_json::json!({});
    if !f.target.is_empty() {
        opts["addedNodeSelector"] =
            serde_json::json!({crate::rules::placement::HOSTNAME_KEY: f.target});
    }
    if f.block.is_some() {
        opts["blockMigration"] = true.into();
    }
    let uri = format!(
        "/apis/subresources.kubevirt.io/v1/namespaces/{}/virtualmachineinstances/{}/migrate",
        url_encode(&ns),
        url_encode(&name)
    );
    let (code, v) = api
        .call(&p, Method::PUT, &uri, "application/json", opts.to_string())
        .await;
    if !code.is_success() {
        return error_page(code, &api_message(&v));
    }
    Redirect::to(&format!("{}?done=migrate", detail_url(&ns, &name))).into_response()
}

#[derive(Deserialize)]
pub struct GrowForm {
    datavolume: String,
    gib: String,
}

/// `POST /ui/vms/{ns}/{name}/grow`: grow one of the VM's DataVolumes to `gib` GiB through
/// the API, which refuses a smaller size. The node holding the disk grows it, and a running
/// guest sees the new size at once.
pub async fn grow(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<GrowForm>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "grow disks") {
        return r;
    }
    let gib = match disk_gib(&f.gib) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let vm = match load_raw_vm(&st, &ns, &name).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let uses = vm["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .is_some_and(|v| {
            v.iter()
                .any(|v| v["dataVolume"]["name"] == f.datavolume.as_str())
        });
    if !uses {
        return error_page(
            StatusCode::CONFLICT,
            &format!("VM {name} has no disk on DataVolume {:?}", f.datavolume),
        );
    }
    let dv_path = format!("{}/{}", datavolumes(&ns), url_encode(&f.datavolume));
    let (code, mut dv) = api
        .call(&p, Method::GET, &dv_path, "application/json", "")
        .await;
    if !code.is_success() {
        return error_page(code, &api_message(&dv));
    }
    let claim = if dv["spec"].get("storage").is_some() {
        "storage"
    } else {
        "pvc"
    };
    dv["spec"][claim]["resources"]["requests"]["storage"] = format!("{gib}Gi").into();
    if let Some(o) = dv.as_object_mut() {
        o.remove("status");
    }
    let (code, v) = api
        .call(
            &p,
            Method::PUT,
            &dv_path,
            "application/json",
            dv.to_string(),
        )
        .await;
    if !code.is_success() {
        return error_page(code, &api_message(&v));
    }
    tracing::info!(namespace = %ns, vm = %name, datavolume = %f.datavolume, gib, user = %p.user, "grew a disk");
    Redirect::to(&format!("{}?done=grow", detail_url(&ns, &name))).into_response()
}

#[derive(Deserialize)]
pub struct EjectForm {
    disk: String,
}

/// `POST /ui/vms/{ns}/{name}/eject`: take a CD drive (an installer or drivers ISO, once the
/// install is done) out of the VM, with its volume, through the API. The VM's own disks
/// are not taken out here. A running VM keeps the drive until it restarts.
pub async fn eject(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<EjectForm>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "change VMs") {
        return r;
    }
    let mut vm = match load_raw_vm(&st, &ns, &name).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let spec = &mut vm["spec"]["template"]["spec"];
    let Some(disks) = spec["domain"]["devices"]["disks"].as_array_mut() else {
        return error_page(StatusCode::CONFLICT, &format!("VM {name} has no CD drive"));
    };
    let Some(at) = disks
        .iter()
        .position(|d| d["name"] == f.disk.as_str() && d.get("cdrom").is_some())
    else {
        return error_page(
            StatusCode::CONFLICT,
            &format!(
                "VM {name} has no CD drive {:?}; only CD drives are taken out here",
                f.disk
            ),
        );
    };
    disks.remove(at);
    if let Some(volumes) = spec["volumes"].as_array_mut() {
        volumes.retain(|v| v["name"] != f.disk.as_str());
    }
    if let Some(o) = vm.as_object_mut() {
        o.remove("status");
    }
    // The stored resourceVersion goes along: a change made since is not overwritten.
    let (code, v) = api
        .call(
            &p,
            Method::PUT,
            &vm_path(&ns, &name),
            "application/json",
            vm.to_string(),
        )
        .await;
    if !code.is_success() {
        return error_page(code, &api_message(&v));
    }
    tracing::info!(namespace = %ns, vm = %name, disk = %f.disk, user = %p.user, "took a CD drive out");
    Redirect::to(&format!("{}?done=eject", detail_url(&ns, &name))).into_response()
}

#[derive(Deserialize)]
pub struct AddDiskForm {
    gib: String,
}

/// `POST /ui/vms/{ns}/{name}/adddisk`: a blank DataVolume of `gib` GiB, `<vm>-disk-N`, added
/// to the running guest through the API's `addvolume` (persistent: the VM keeps it). The
/// DataVolume goes again when the API refuses the disk.
pub async fn add_disk(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<AddDiskForm>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "add disks") {
        return r;
    }
    let gib = match disk_gib(&f.gib) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let vm = match load_raw_vm(&st, &ns, &name).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let volumes = vm["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let dvs = datavolumes(&ns);
    // The first free name: no volume of the VM and no DataVolume has it.
    let mut pick = None;
    for n in 1..=64 {
        let (vol, dv) = (format!("disk-{n}"), format!("{name}-disk-{n}"));
        if volumes.iter().any(|v| v["name"] == vol.as_str()) || dv.len() > 63 {
            continue;
        }
        let (code, _) = api
            .call(
                &p,
                Method::GET,
                &format!("{dvs}/{}", url_encode(&dv)),
                "application/json",
                "",
            )
            .await;
        if code == StatusCode::NOT_FOUND {
            pick = Some((vol, dv));
            break;
        }
    }
    let Some((vol, dv)) = pick else {
        return error_page(
            StatusCode::CONFLICT,
            &format!("no free disk name for VM {name} (disk-1 to disk-64 are taken)"),
        );
    };
    let body = serde_json::json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": dv, "namespace": ns},
        "spec": {"source": {"blank": {}},
                 "storage": {"resources": {"requests": {"storage": format!("{gib}Gi")}}}},
    });
    let (code, v) = api
        .call(&p, Method::POST, &dvs, "application/json", body.to_string())
        .await;
    if !code.is_success() {
        return error_page(code, &api_message(&v));
    }
    let add = serde_json::json!({
        "name": vol,
        "disk": {"disk": {"bus": "scsi"}},
        "volumeSource": {"dataVolume": {"name": dv}},
    });
    let (code, v) = api
        .call(
            &p,
            Method::PUT,
            &subresource(&ns, &name, "addvolume"),
            "application/json",
            add.to_string(),
        )
        .await;
    if !code.is_success() {
        let _ = api
            .call(
                &p,
                Method::DELETE,
                &format!("{dvs}/{}", url_encode(&dv)),
                "application/json",
                "",
            )
            .await;
        return error_page(code, &api_message(&v));
    }
    tracing::info!(namespace = %ns, vm = %name, datavolume = %dv, gib, user = %p.user, "added a disk");
    Redirect::to(&format!("{}?done=adddisk", detail_url(&ns, &name))).into_response()
}

#[derive(Deserialize)]
pub struct DetachForm {
    disk: String,
}

/// `POST /ui/vms/{ns}/{name}/detach`: a hotplugged disk out of the running guest and the VM
/// (`removevolume`); its DataVolume stays. The API refuses the VM's own disks.
pub async fn detach(
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<DetachForm>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "detach disks") {
        return r;
    }
    let body = serde_json::json!({"name": f.disk});
    tracing::info!(namespace = %ns, vm = %name, disk = %f.disk, user = %p.user, "detaching a disk");
    let uri = subresource(&ns, &name, "removevolume");
    api_then_back(
        &api,
        &p,
        (Method::PUT, uri, body.to_string()),
        (&ns, &name, "detach"),
    )
    .await
}

#[derive(Deserialize)]
pub struct SnapshotForm {
    #[serde(default)]
    snapshot: String,
}

/// A JSON call to the API as the signed-in user, then back to the VM's page with the
/// notice `done`; the API's refusal as the page to show.
async fn api_then_back(
    api: &Api,
    p: &Principal,
    (method, uri, body): (Method, String, String),
    (ns, name, done): (&str, &str, &str),
) -> Response {
    let to = format!("{}?done={done}", detail_url(ns, name));
    super::api_then(api, p, (method, &uri, "application/json", body), &to).await
}

/// The snapshot kinds of namespace `ns`, as the API serves them.
fn snapshot_kinds(ns: &str, plural: &str) -> String {
    format!(
        "/apis/snapshot.kubevirt.io/v1beta1/namespaces/{}/{plural}",
        url_encode(ns)
    )
}

/// `POST /ui/vms/{ns}/{name}/snapshot`: a `VirtualMachineSnapshot` of the VM, named
/// `<vm>-<time>`.
pub async fn take_snapshot(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "take snapshots") {
        return r;
    }
    if let Err(r) = load_raw_vm(&st, &ns, &name).await {
        return r;
    }
    let stamp = chrono::Utc::now().format("%Y%m%d-%H%M%S");
    let mut snap = format!("{name}-{stamp}");
    if snap.len() > 63 {
        snap = format!("snapshot-{stamp}");
    }
    let body = serde_json::json!({
        "apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineSnapshot",
        "metadata": {"name": snap, "namespace": ns},
        "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": name}},
    });
    tracing::info!(namespace = %ns, vm = %name, snapshot = %snap, user = %p.user, "taking a snapshot");
    let uri = snapshot_kinds(&ns, "virtualmachinesnapshots");
    api_then_back(
        &api,
        &p,
        (Method::POST, uri, body.to_string()),
        (&ns, &name, "snapshot"),
    )
    .await
}

/// `POST /ui/vms/{ns}/{name}/restore`: a `VirtualMachineRestore` of one of the VM's
/// snapshots, stopping the VM first (`StopTarget`).
pub async fn restore_snapshot(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<SnapshotForm>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "restore snapshots") {
        return r;
    }
    if let Err(r) = own_snapshot(&st, &ns, &name, &f.snapshot).await {
        return r;
    }
    let body = serde_json::json!({
        "apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineRestore",
        "metadata": {"generateName": "restore-", "namespace": ns},
        "spec": {"target": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": name},
                 "virtualMachineSnapshotName": f.snapshot,
                 "targetReadinessPolicy": "StopTarget"},
    });
    tracing::info!(namespace = %ns, vm = %name, snapshot = %f.snapshot, user = %p.user, "restoring a snapshot");
    let uri = snapshot_kinds(&ns, "virtualmachinerestores");
    api_then_back(
        &api,
        &p,
        (Method::POST, uri, body.to_string()),
        (&ns, &name, "restore"),
    )
    .await
}

/// `POST /ui/vms/{ns}/{name}/deletesnapshot`: delete one of the VM's snapshots.
pub async fn delete_snapshot(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<SnapshotForm>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "delete snapshots") {
        return r;
    }
    if let Err(r) = own_snapshot(&st, &ns, &name, &f.snapshot).await {
        return r;
    }
    tracing::info!(namespace = %ns, vm = %name, snapshot = %f.snapshot, user = %p.user, "deleting a snapshot");
    let uri = format!(
        "{}/{}",
        snapshot_kinds(&ns, "virtualmachinesnapshots"),
        url_encode(&f.snapshot)
    );
    api_then_back(
        &api,
        &p,
        (Method::DELETE, uri, String::new()),
        (&ns, &name, "deletesnapshot"),
    )
    .await
}

/// The form names a snapshot of this VM (404 when it names anything else).
#[derive(Deserialize)]
pub struct BackupForm {
    #[serde(default)]
    target: String,
    #[serde(default)]
    backup: String,
}

fn backups_uri(ns: &str) -> String {
    format!(
        "/apis/backup.kubevirt.io/v1alpha1/namespaces/{}/virtualmachinebackups",
        url_encode(ns)
    )
}

/// `POST /ui/vms/{ns}/{name}/backup`: a `VirtualMachineBackup` of the VM to the target the
/// form names (the API checks it).
pub async fn back_up_now(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<BackupForm>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "take backups") {
        return r;
    }
    if let Err(r) = load_raw_vm(&st, &ns, &name).await {
        return r;
    }
    let stamp = chrono::Utc::now().format("%Y%m%d-%H%M%S");
    let mut backup = format!("{name}-backup-{stamp}");
    if backup.len() > 63 {
        backup = format!("backup-{stamp}");
    }
    let body = serde_json::json!({
        "apiVersion": "backup.kubevirt.io/v1alpha1", "kind": "VirtualMachineBackup",
        "metadata": {"name": backup, "namespace": ns},
        "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": name},
                 "pvcName": f.target, "mode": "Push"},
    });
    tracing::info!(namespace = %ns, vm = %name, backup = %backup, target = %f.target, user = %p.user, "backing up");
    api_then_back(
        &api,
        &p,
        (Method::POST, backups_uri(&ns), body.to_string()),
        (&ns, &name, "backup"),
    )
    .await
}

/// `POST /ui/vms/{ns}/{name}/deletebackup`: delete one of the VM's backups (and its folder).
pub async fn delete_backup(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<BackupForm>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "delete backups") {
        return r;
    }
    if let Err(r) = own_backup(&st, &ns, &name, &f.backup).await {
        return r;
    }
    tracing::info!(namespace = %ns, vm = %name, backup = %f.backup, user = %p.user, "deleting a backup");
    let uri = format!("{}/{}", backups_uri(&ns), url_encode(&f.backup));
    api_then_back(
        &api,
        &p,
        (Method::DELETE, uri, String::new()),
        (&ns, &name, "deletebackup"),
    )
    .await
}

/// One of the VM's backups (404 when the name is anything else).
async fn own_backup(
    st: &crate::http::AppState,
    ns: &str,
    vm: &str,
    backup: &str,
) -> Result<crate::types::backup::VirtualMachineBackup, Response> {
    let found = match crate::types::check_name("backup", backup) {
        Ok(()) => st
            .store
            .get_typed::<crate::types::backup::VirtualMachineBackup>(ns, backup)
            .await
            .ok()
            .flatten(),
        Err(_) => None,
    };
    match found {
        Some(b) if b.spec.source.name == vm && !b.deleting() => Ok(b),
        _ => Err(error_page(
            StatusCode::NOT_FOUND,
            &format!("VM {vm} has no backup {backup:?}"),
        )),
    }
}

/// A completed backup, else 409 saying why there is nothing to work on yet.
fn completed(
    b: crate::types::backup::VirtualMachineBackup,
) -> Result<crate::types::backup::VirtualMachineBackup, Response> {
    if b.succeeded() {
        return Ok(b);
    }
    Err(error_page(
        StatusCode::CONFLICT,
        &format!(
            "backup {} has not completed (it failed or still runs): there is nothing to work \
             on yet",
            b.name()
        ),
    ))
}

/// `POST /ui/vms/{ns}/{name}/verifybackup`: ask the node that holds the backup to re-read it
/// and its parents against their manifests (the `edgevirt.io/verify` annotation); the answer
/// is its `Verified` condition, on this page.
pub async fn verify_backup(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<BackupForm>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "verify backups") {
        return r;
    }
    if let Err(r) = own_backup(&st, &ns, &name, &f.backup)
        .await
        .and_then(completed)
    {
        return r;
    }
    tracing::info!(namespace = %ns, vm = %name, backup = %f.backup, user = %p.user, "asking for a backup's verification");
    let uri = format!("{}/{}", backups_uri(&ns), url_encode(&f.backup));
    let patch = serde_json::json!({"metadata": {"annotations": {
        crate::types::backup::VERIFY_ANNOTATION: crate::types::now()}}});
    let to = format!("{}?done=verifybackup", detail_url(&ns, &name));
    let merge = "application/merge-patch+json";
    super::api_then(
        &api,
        &p,
        (Method::PATCH, &uri, merge, patch.to_string()),
        &to,
    )
    .await
}

/// The restore form: the backup and the new VM's name.
#[derive(Deserialize)]
pub struct RestoreBackupForm {
    #[serde(default)]
    backup: String,
    #[serde(default, rename = "as")]
    as_name: String,
}

/// `POST /ui/vms/{ns}/{name}/restorebackup`: the backup as a new VM named `as`, on the node
/// that took it (it mounts the target): one DataVolume per volume with a `backup` source
/// (the node verifies the chain, then reads the disk out of it), and the VM as it was backed
/// up, without its MAC addresses and firmware identity, so both can run.
pub async fn restore_backup(
    State(st): S,
    Extension(u): Extension<WebUser>,
    Extension(p): Extension<Principal>,
    Extension(api): Extension<Api>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<RestoreBackupForm>,
) -> Response {
    if let Some(r) = super::viewer_refused(&u, "restore backups") {
        return r;
    }
    let b = match own_backup(&st, &ns, &name, &f.backup)
        .await
        .and_then(completed)
    {
        Ok(b) => b,
        Err(r) => return r,
    };
    let new = f.as_name.trim();
    if let Err(e) = crate::types::check_name("the new VM's name", new) {
        return error_page(StatusCode::UNPROCESSABLE_ENTITY, &e.0);
    }
    let bst = b.status.clone().unwrap_or_default();
    let Some(old) = bst.virtual_machine.as_ref() else {
        return error_page(
            StatusCode::CONFLICT,
            &format!(
                "backup {} records no VM to restore: restore its folder with `edgevirt backup \
                 restore FOLDER --as {new}` on a host that mounts the target",
                b.name()
            ),
        );
    };
    if load_raw_vm(&st, &ns, new).await.is_ok() {
        return error_page(
            StatusCode::CONFLICT,
            &format!("VM {ns}/{new} exists already: choose another name"),
        );
    }
    let mut dvs = vec![];
    for v in &bst.included_volumes {
        let dv = format!("{new}-{}", v.volume_name);
        if let Err(e) = crate::types::check_name("DataVolume name", &dv) {
            return error_page(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("{}: choose a shorter VM name", e.0),
            );
        }
        let Some(size) = v.virtual_size else {
            return error_page(
                StatusCode::CONFLICT,
                &format!(
                    "backup {} records no size for volume {}",
                    b.name(),
                    v.volume_name
                ),
            );
        };
        dvs.push((v.volume_name.clone(), dv, size));
    }
    let dv_uri = format!(
        "/apis/cdi.kubevirt.io/v1beta1/namespaces/{}/datavolumes",
        url_encode(&ns)
    );
    tracing::info!(namespace = %ns, vm = %name, backup = %b.name(), new = %new, user = %p.user, "restoring a backup as a new VM");
    let mut made: Vec<String> = vec![];
    let mut fail = None;
    for (volume, dv, size) in &dvs {
        let body = serde_json::json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": dv, "namespace": ns},
            "spec": {"source": {"backup": {"name": b.name(), "volume": volume}},
                     "storage": {"resources": {"requests": {"storage": size.to_string()}}}},
        });
        let (code, v) = api
            .call(
                &p,
                Method::POST,
                &dv_uri,
                "application/json",
                body.to_string(),
            )
            .await;
        if !code.is_success() {
            fail = Some((code, api_message(&v)));
            break;
        }
        made.push(dv.clone());
    }
    if fail.is_none() {
        let pairs: Vec<(String, String)> =
            dvs.iter().map(|(v, d, _)| (v.clone(), d.clone())).collect();
        let node = b.annotation(crate::types::backup::NODE_ANNOTATION);
        let vm = crate::types::backup::restored_vm(old, &ns, new, &pairs, node, false);
        let uri = format!(
            "/apis/kubevirt.io/v1/namespaces/{}/virtualmachines",
            url_encode(&ns)
        );
        let (code, v) = api
            .call(&p, Method::POST, &uri, "application/json", vm.to_string())
            .await;
        if !code.is_success() {
            fail = Some((code, api_message(&v)));
        }
    }
    if let Some((code, msg)) = fail {
        // Nothing half made stays behind.
        for dv in made {
            let _ = api
                .call(
                    &p,
                    Method::DELETE,
                    &format!("{dv_uri}/{}", url_encode(&dv)),
                    "application/json",
                    "",
                )
                .await;
        }
        return error_page(code, &msg);
    }
    Redirect::to(&format!("{}?done=restored", detail_url(&ns, new))).into_response()
}

async fn own_snapshot(
    st: &crate::http::AppState,
    ns: &str,
    vm: &str,
    snap: &str,
) -> Result<(), Response> {
    let found = match crate::types::check_name("snapshot", snap) {
        Ok(()) => st
            .store
            .get_typed::<crate::types::snapshot::VirtualMachineSnapshot>(ns, snap)
            .await
            .ok()
            .flatten(),
        Err(_) => None,
    };
    match found {
        Some(s) if s.spec.source.name == vm => Ok(()),
        _ => Err(error_page(
            StatusCode::NOT_FOUND,
            &format!("VM {vm} has no snapshot {snap:?}"),
        )),
    }
}

/// A disk size from a form: a whole number of GiB from 1 to 65536.
fn disk_gib(text: &str) -> Result<u64, Response> {
    match text.trim().parse() {
        Ok(n) if (1..=65536).contains(&n) => Ok(n),
        _ => Err(error_page(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("the size is a whole number of GiB from 1 to 65536, not {text:?}"),
        )),
    }
}

/// The DataVolumes of namespace `ns`, as the API serves them.
fn datavolumes(ns: &str) -> String {
    format!(
        "/apis/cdi.kubevirt.io/v1beta1/namespaces/{}/datavolumes",
        url_encode(ns)
    )
}

/// A VM's KubeVirt subresource, as the API serves it.
fn subresource(ns: &str, name: &str, what: &str) -> String {
    format!(
        "/apis/subresources.kubevirt.io/v1/namespaces/{}/virtualmachines/{}/{what}",
        url_encode(ns),
        url_encode(name)
    )
}
