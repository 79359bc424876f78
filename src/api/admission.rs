//! Admission: every object a client writes is checked and put in canonical form here before
//! it reaches the store. Bad input is refused with a message naming the field; a KubeVirt
//! field edgevirt does not support is refused by name.

use serde_json::{Value, json};

use crate::http::error::{ApiError, ApiResult};
use crate::store::Store;
use crate::types::kubevirt::{
    VirtualMachineInstanceMigrationSpec, VirtualMachineInstanceSpec, VirtualMachineSpec,
};
use crate::types::{Kind, check_name, decode};
use crate::virt::convert;

pub use crate::types::annotations::{LAUNCHER_FINALIZER, MIGRATION_FINALIZER, VOLUMES_FINALIZER};

/// Check and canonicalize an object for `kind` about to be created (no `existing`) or to
/// replace `existing`.
pub async fn admit(
    store: &Store,
    kind: Kind,
    ns: &str,
    mut obj: Value,
    existing: Option<&Value>,
) -> ApiResult<Value> {
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && av != kind.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "apiVersion {av:?} does not match this endpoint, which serves {}",
            kind.api_version()
        )));
    }
    if let Some(k) = obj.get("kind").and_then(Value::as_str)
        && k != kind.name()
    {
        return Err(ApiError::bad_request(format!(
            "kind {k:?} does not match this endpoint, which serves {}",
            kind.name()
        )));
    }
    if !obj["metadata"].is_object() {
        return Err(ApiError::invalid("metadata is required"));
    }
    if existing.is_none()
        && obj["metadata"]["name"].as_str().is_none_or(str::is_empty)
        && let Some(prefix) = obj["metadata"]["generateName"].as_str()
    {
        // Kubernetes' generateName: the prefix plus five random characters.
        use rand::Rng;
        let suffix: String = (0..5)
            .map(|_| {
                let c = rand::rng().random_range(0..36u8);
                (if c < 10 { b'0' + c } else { b'a' + c - 10 }) as char
            })
            .collect();
        obj["metadata"]["name"] = json!(format!("{prefix}{suffix}"));
    }
    let name = obj["metadata"]["name"]
        .as_str()
        .ok_or_else(|| ApiError::invalid("metadata.name is required"))?
        .to_string();
    check_name("metadata.name", &name)?;
    if kind.namespaced() {
        if let Some(body_ns) = obj["metadata"]["namespace"].as_str()
            && body_ns != ns
        {
            return Err(ApiError::bad_request(format!(
                "the namespace of the object ({body_ns}) does not match the namespace of the request ({ns})"
            )));
        }
        check_name("namespace", ns)?;
        obj["metadata"]["namespace"] = json!(ns);
    }
    crate::types::check_labels_and_annotations(&obj["metadata"])?;
    let refused = |e| ApiError::invalid_fields(kind.group(), kind.name(), &name, e);
    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    match kind {
        Kind::VirtualMachine => {
            if spec.is_null() {
                return Err(ApiError::invalid("spec is required"));
            }
            let vm: VirtualMachineSpec = decode("VirtualMachine", spec).map_err(refused)?;
            if vm.running.is_some() && vm.run_strategy.is_some() {
                return Err(ApiError::invalid(
                    "spec.running and spec.runStrategy are mutually exclusive; set only runStrategy",
                ));
            }
            check_vmi_spec(store, &vm.template.spec, "spec.template.spec").await?;
            obj["spec"] = serde_json::to_value(&vm).map_err(ApiError::internal)?;
            if existing.is_none() {
                add_finalizer(&mut obj, VOLUMES_FINALIZER);
            }
        }
        Kind::VirtualMachineInstance => {
            if spec.is_null() {
                return Err(ApiError::invalid("spec is required"));
            }
            let vmi: VirtualMachineInstanceSpec =
                decode("VirtualMachineInstance", spec).map_err(refused)?;
            let canon = serde_json::to_value(&vmi).map_err(ApiError::internal)?;
            if let Some(old) = existing {
                if old["spec"] != canon {
                    return Err(ApiError::invalid(
                        "the spec of a VirtualMachineInstance cannot be changed; edit its \
                         VirtualMachine instead and restart it",
                    ));
                }
            } else {
                check_vmi_spec(store, &vmi, "spec").await?;
                add_finalizer(&mut obj, LAUNCHER_FINALIZER);
                obj["status"] = json!({"phase": "Pending"});
            }
            obj["spec"] = canon;
        }
        Kind::VirtualMachineInstanceMigration => {
            if spec.is_null() {
                return Err(ApiError::invalid("spec is required"));
            }
            let m: VirtualMachineInstanceMigrationSpec =
                decode("VirtualMachineInstanceMigration", spec).map_err(refused)?;
            let canon = serde_json::to_value(&m).map_err(ApiError::internal)?;
            match existing {
                Some(old) if old["spec"] != canon => {
                    return Err(ApiError::invalid(
                        "the spec of a VirtualMachineInstanceMigration cannot be changed; \
                         delete it and create another",
                    ));
                }
                Some(_) => {}
                None => {
                    crate::controller::check_migration_request(store, ns, &m.vmi_name, &obj)
                        .await
                        .map_err(|e| match e {
                            crate::controller::MigrationRefused::Store(e) => e.into(),
                            crate::controller::MigrationRefused::Invalid(m) => ApiError::invalid(m),
                        })?;
                    add_finalizer(&mut obj, MIGRATION_FINALIZER);
                    obj["status"] = json!({"phase": "Pending"});
                }
            }
            obj["spec"] = canon;
        }
        Kind::Node => {}
        Kind::Namespace => {
            if let Some(o) = obj.as_object_mut() {
                o.remove("spec");
            }
            obj["status"] = json!({"phase": "Active"});
        }
        Kind::Image => {
            if existing.is_none() {
                return Err(ApiError::bad_request(
                    "images are created by uploading them: `edgevirt image import NAME FILE` \
                     (PUT /apis/edgevirt.io/v1/images/NAME/upload)",
                ));
            }
        }
    }
    match existing {
        // Status is written through the status subresource only.
        Some(old) if !matches!(kind, Kind::Node | Kind::Namespace) => {
            if let Some(s) = old.get("status") {
                obj["status"] = s.clone();
            }
        }
        None if !matches!(
            kind,
            Kind::Node | Kind::VirtualMachineInstance | Kind::Namespace
        ) =>
        {
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
        }
        _ => {}
    }
    check_size(&obj)?;
    Ok(obj)
}

/// Checked here too (the store holds every write to it) so a dry run says so.
fn check_size(obj: &Value) -> ApiResult<()> {
    let n = serde_json::to_vec(obj).map_err(ApiError::internal)?.len();
    if n > crate::store::OBJECT_MAX_BYTES {
        return Err(ApiError::invalid(format!(
            "the object is {} KiB; at most {} KiB (1.5 MiB) is stored",
            n >> 10,
            crate::store::OBJECT_MAX_BYTES >> 10
        )));
    }
    Ok(())
}

fn add_finalizer(obj: &mut Value, f: &str) {
    let list = &mut obj["metadata"]["finalizers"];
    if !list.is_array() {
        *list = json!([]);
    }
    let arr = list.as_array_mut().expect("finalizers is an array");
    if !arr.iter().any(|x| x == f) {
        arr.push(json!(f));
    }
}

/// The checks of a VMI spec shared by VMs and standalone VMIs: structure, then that every
/// image it names was imported.
async fn check_vmi_spec(
    store: &Store,
    spec: &VirtualMachineInstanceSpec,
    at: &str,
) -> ApiResult<()> {
    convert::validate(spec).map_err(|e| ApiError::invalid(format!("{at}: {}", e.0)))?;
    for image in referenced_images(spec) {
        if store.get(Kind::Image, "", &image).await?.is_none() {
            return Err(ApiError::invalid(format!(
                "{at}: image {image:?} does not exist; import it first with \
                 `edgevirt image import {image} FILE`"
            )));
        }
    }
    Ok(())
}

/// Names of the images a VMI spec uses (disks, kernel, initrd).
pub fn referenced_images(spec: &VirtualMachineInstanceSpec) -> Vec<String> {
    let mut out = Vec::new();
    for v in &spec.volumes {
        if let Some(c) = &v.container_disk {
            out.push(c.image.clone());
        }
        if let Some(d) = &v.data_volume {
            out.push(d.name.clone());
        }
    }
    if let Some(c) = spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
        .and_then(|k| k.container.as_ref())
    {
        out.extend(c.kernel_path.iter().cloned());
        out.extend(c.initrd_path.iter().cloned());
    }
    out
}
