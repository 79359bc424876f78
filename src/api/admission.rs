//! Admission: every object a client writes is checked and put in canonical form here before
//! it reaches the store. Bad input is refused with a message naming the field; a KubeVirt
//! field edgevirt does not support is refused by name.

use serde_json::{Value, json};

use crate::controller::instancetype::Resolved;
use crate::http::error::{ApiError, ApiResult};
use crate::registry::{self, PullPolicy, Source};
use crate::store::Store;
use crate::types::cdi::{DataVolume, DataVolumeSpec, Fill};
use crate::types::cni::NetworkAttachmentDefinitionSpec;
use crate::types::instancetype::{InstancetypeSpec, PreferenceSpec};
use crate::types::kubevirt::{
    VirtualMachineInstanceMigrationSpec, VirtualMachineInstanceSpec, VirtualMachineSpec,
};
use crate::types::{FieldError, FieldErrors, Kind, Meta, check_name, decode};
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
    // An object written as an older alias of its version (kubevirt.io/v1alpha3) is stored
    // as the current one.
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && crate::types::is_alias(av)
        && av.split('/').next() == Some(kind.group())
    {
        obj["apiVersion"] = json!(kind.api_version());
    }
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
    if matches!(
        kind,
        Kind::VirtualMachineInstancetype
            | Kind::VirtualMachineClusterInstancetype
            | Kind::VirtualMachinePreference
            | Kind::VirtualMachineClusterPreference
            | Kind::ControllerRevision
    ) {
        // KubeVirt's common set is named `u1.medium`, `windows.11`: DNS subdomains.
        crate::types::check_subdomain_name("metadata.name", &name)?;
    } else {
        check_name("metadata.name", &name)?;
    }
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
            let mut vm: VirtualMachineSpec = decode("VirtualMachine", spec).map_err(refused)?;
            if vm.running.is_some() && vm.run_strategy.is_some() {
                return Err(ApiError::invalid(
                    "spec.running and spec.runStrategy are mutually exclusive; set only runStrategy",
                ));
            }
            if let Some(u) = vm
                .update_volumes_strategy
                .as_deref()
                .filter(|u| *u != "Replacement")
            {
                return Err(ApiError::invalid(format!(
                    "spec.updateVolumesStrategy {u:?}: only Replacement (volume changes apply at \
                     the next start); Migration is not supported yet"
                )));
            }
            check_hooks(
                &obj["spec"]["template"]["metadata"],
                "spec.template.metadata",
            )?;
            let mut problems = Vec::new();
            let mut names: Vec<String> = Vec::new();
            let classes = if vm.data_volume_templates.is_empty() {
                Vec::new()
            } else {
                storage_classes(store).await?
            };
            for (i, t) in vm.data_volume_templates.iter().enumerate() {
                let at = format!("spec.dataVolumeTemplates[{i}]");
                if let Err(e) = check_name("name", &t.metadata.name) {
                    problems.push(FieldError {
                        field: format!("{at}.metadata.name"),
                        reason: "FieldValueInvalid",
                        message: e.0,
                    });
                } else if names.contains(&t.metadata.name) {
                    problems.push(FieldError {
                        field: format!("{at}.metadata.name"),
                        reason: "FieldValueDuplicate",
                        message: format!("{:?} names two templates", t.metadata.name),
                    });
                }
                names.push(t.metadata.name.clone());
                problems.extend(data_volume_problems(
                    &t.spec,
                    ns,
                    &format!("{at}.spec"),
                    &classes,
                ));
            }
            if !problems.is_empty() {
                return Err(refused(FieldErrors {
                    kind: kind.name().into(),
                    errors: problems,
                }));
            }
            infer_from_volumes(store, ns, &mut vm).await?;
            check_vm_instancetype(store, ns, &name, &vm, &names).await?;
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
                check_hooks(&obj["metadata"], "metadata")?;
                check_vmi_spec(store, ns, &vmi, "spec", &[]).await?;
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
        Kind::Node => {
            if let Some(t) = obj["spec"].get("taints").filter(|t| !t.is_null()) {
                let mut taints: Vec<crate::types::edgevirt::Taint> =
                    serde_json::from_value(t.clone())
                        .map_err(|e| ApiError::invalid(format!("spec.taints: {e}")))?;
                crate::rules::placement::check_taints(&taints)
                    .map_err(|e| ApiError::invalid(e.0))?;
                // As kube-apiserver: a NoExecute taint's tolerationSeconds count from here.
                for t in taints.iter_mut().filter(|t| t.effect == "NoExecute") {
                    t.time_added.get_or_insert_with(crate::types::now);
                }
                obj["spec"]["taints"] =
                    serde_json::to_value(&taints).map_err(ApiError::internal)?;
            }
        }
        Kind::ControllerRevision => {}
        Kind::StorageClass => {
            return Err(ApiError::invalid(format!(
                "storage classes are edgevirt's own: {:?} (the node's disk, bound when a VM \
                 first uses a DataVolume) and one per shared pool, named after it (appears \
                 when a node mounts the pool: serve --shared-pool NAME=PATH); they cannot be \
                 created or changed",
                crate::types::cdi::LOCAL_CLASS
            )));
        }
        Kind::DataVolume => {
            if spec.is_null() {
                return Err(ApiError::invalid("spec is required"));
            }
            let dv: DataVolumeSpec = decode(kind.name(), spec).map_err(refused)?;
            let classes = storage_classes(store).await?;
            let problems = data_volume_problems(&dv, ns, "spec", &classes);
            if !problems.is_empty() {
                return Err(refused(FieldErrors {
                    kind: kind.name().into(),
                    errors: problems,
                }));
            }
            let canon = serde_json::to_value(&dv).map_err(ApiError::internal)?;
            if let Some(old) = existing
                && old["spec"] != canon
            {
                let before: DataVolumeSpec =
                    serde_json::from_value(old["spec"].clone()).map_err(ApiError::internal)?;
                before.check_update(&dv).map_err(ApiError::invalid)?;
            }
            obj["spec"] = canon;
        }
        Kind::VirtualMachineInstancetype | Kind::VirtualMachineClusterInstancetype => {
            let it: InstancetypeSpec = decode(kind.name(), spec).map_err(refused)?;
            check_instancetype(&it)?;
            obj["spec"] = serde_json::to_value(&it).map_err(ApiError::internal)?;
        }
        Kind::VirtualMachinePreference | Kind::VirtualMachineClusterPreference => {
            let p: PreferenceSpec = decode(kind.name(), spec).map_err(refused)?;
            obj["spec"] = serde_json::to_value(&p).map_err(ApiError::internal)?;
        }
        Kind::Secret => check_secret(&mut obj)?,
        Kind::ConfigMap => check_config_map(&mut obj)?,
        Kind::Event => check_event(&mut obj)?,
        Kind::NetworkAttachmentDefinition => {
            let nad: NetworkAttachmentDefinitionSpec =
                decode(kind.name(), spec).map_err(refused)?;
            crate::types::cni::parse_config(&nad.config).map_err(ApiError::invalid)?;
            obj["spec"] = serde_json::to_value(&nad).map_err(ApiError::internal)?;
        }
        Kind::VirtualMachineSnapshot => {
            use crate::types::snapshot::{VirtualMachineSnapshotSpec, snapshot_problems};
            let canon = checked_spec::<VirtualMachineSnapshotSpec>(
                kind,
                &spec,
                existing,
                snapshot_problems,
                refused,
            )?;
            obj["spec"] = canon;
        }
        Kind::VirtualMachineRestore => {
            use crate::types::snapshot::{VirtualMachineRestoreSpec, restore_problems};
            let canon = checked_spec::<VirtualMachineRestoreSpec>(
                kind,
                &spec,
                existing,
                restore_problems,
                refused,
            )?;
            obj["spec"] = canon;
        }
        Kind::VirtualMachineBackup => {
            use crate::types::backup::{VirtualMachineBackupSpec, backup_problems};
            let canon = checked_spec::<VirtualMachineBackupSpec>(
                kind,
                &spec,
                existing,
                backup_problems,
                refused,
            )?;
            obj["spec"] = canon;
        }
        Kind::BackupSchedule => {
            use crate::types::backup::{BackupScheduleSpec, schedule_problems};
            // Unlike the backups, a schedule may change (suspend it, change its rule).
            let sched: BackupScheduleSpec = decode(kind.name(), spec).map_err(&refused)?;
            let errors = schedule_problems(&sched);
            if !errors.is_empty() {
                return Err(refused(FieldErrors {
                    kind: kind.name().into(),
                    errors,
                }));
            }
            obj["spec"] = serde_json::to_value(&sched).map_err(ApiError::internal)?;
        }
        Kind::VirtualMachineSnapshotContent => match existing {
            None => {
                return Err(ApiError::invalid(
                    "VirtualMachineSnapshotContents are made by edgevirt for each \
                     VirtualMachineSnapshot; create a VirtualMachineSnapshot instead",
                ));
            }
            Some(old) if old["spec"] != spec => {
                return Err(ApiError::invalid(
                    "the spec of a VirtualMachineSnapshotContent cannot be changed",
                ));
            }
            Some(_) => {}
        },
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
        Some(old)
            if !matches!(
                kind,
                Kind::Node | Kind::Namespace | Kind::Secret | Kind::ConfigMap | Kind::Event
            ) =>
        {
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

/// A spec that must decode as `T`, pass `problems`, and never change once created (KubeVirt's
/// snapshot kinds): its canonical form.
fn checked_spec<T: serde::de::DeserializeOwned + serde::Serialize>(
    kind: Kind,
    spec: &Value,
    existing: Option<&Value>,
    problems: fn(&T) -> Vec<crate::types::FieldError>,
    refused: impl Fn(FieldErrors) -> ApiError,
) -> ApiResult<Value> {
    if spec.is_null() {
        return Err(ApiError::invalid("spec is required"));
    }
    let typed: T = decode(kind.name(), spec.clone()).map_err(&refused)?;
    let errors = problems(&typed);
    if !errors.is_empty() {
        return Err(refused(FieldErrors {
            kind: kind.name().into(),
            errors,
        }));
    }
    let canon = serde_json::to_value(&typed).map_err(ApiError::internal)?;
    if let Some(old) = existing
        && old["spec"] != canon
    {
        return Err(ApiError::invalid(format!(
            "the spec of a {} cannot be changed; delete it and create another",
            kind.name()
        )));
    }
    Ok(canon)
}

/// The labels a claim (here: a DataVolume) carries to name the instancetype and
/// preference of VMs booting from it, as KubeVirt's.
const DEFAULT_INSTANCETYPE: (&str, &str) = (
    "instancetype.kubevirt.io/default-instancetype",
    "instancetype.kubevirt.io/default-instancetype-kind",
);
const DEFAULT_PREFERENCE: (&str, &str) = (
    "instancetype.kubevirt.io/default-preference",
    "instancetype.kubevirt.io/default-preference-kind",
);

/// Why an inference failed: `ignorable` ones (no labels, a volume type that carries none)
/// let `inferFromVolumeFailurePolicy: Ignore` drop the matcher, as in KubeVirt.
struct InferError {
    ignorable: bool,
    message: String,
}

/// Resolve `inferFromVolume` in a VM's matchers when it is created, as KubeVirt's mutating
/// webhook does: the volume's claim labels name the instancetype or preference, which the
/// VM then carries by `name` and `kind` (and `inferFromVolume` goes). A claim here is a
/// DataVolume of that name; one of the VM's `dataVolumeTemplates` is read through its
/// `source.pvc`, as KubeVirt reads templates.
async fn infer_from_volumes(store: &Store, ns: &str, vm: &mut VirtualMachineSpec) -> ApiResult<()> {
    for (preference, field, labels) in [
        (false, "spec.instancetype", DEFAULT_INSTANCETYPE),
        (true, "spec.preference", DEFAULT_PREFERENCE),
    ] {
        let m = if preference {
            &vm.preference
        } else {
            &vm.instancetype
        };
        let Some(m) = m.clone() else { continue };
        let ignore = match m.infer_from_volume_failure_policy.as_deref() {
            None | Some("Reject") => false,
            Some("Ignore") => true,
            Some(other) => {
                return Err(ApiError::invalid(format!(
                    "{field}.inferFromVolumeFailurePolicy: {other:?}: must be Reject or Ignore"
                )));
            }
        };
        let Some(volume) = m.infer_from_volume.as_deref() else {
            if m.infer_from_volume_failure_policy.is_some() {
                return Err(ApiError::invalid(format!(
                    "{field}.inferFromVolumeFailurePolicy: only with inferFromVolume"
                )));
            }
            continue;
        };
        if !m.name.is_empty() {
            return Err(ApiError::invalid(format!(
                "{field}: name and inferFromVolume are mutually exclusive"
            )));
        }
        let inferred = match infer_one(store, ns, vm, volume, labels).await? {
            Ok((name, kind)) => Some(crate::types::kubevirt::Matcher {
                name,
                kind,
                ..Default::default()
            }),
            Err(e) if e.ignorable && ignore => None,
            Err(e) => {
                return Err(ApiError::invalid(format!(
                    "{field}.inferFromVolume: {}{}",
                    e.message,
                    if e.ignorable {
                        " (inferFromVolumeFailurePolicy: Ignore takes the VM without it)"
                    } else {
                        ""
                    }
                )));
            }
        };
        if preference {
            vm.preference = inferred;
        } else {
            vm.instancetype = inferred;
        }
    }
    Ok(())
}

/// The name and kind the labels of the volume `volume`'s claim give, or why not.
async fn infer_one(
    store: &Store,
    ns: &str,
    vm: &VirtualMachineSpec,
    volume: &str,
    labels: (&str, &str),
) -> ApiResult<Result<(String, Option<String>), InferError>> {
    let hard = |message: String| InferError {
        ignorable: false,
        message,
    };
    let soft = |message: String| InferError {
        ignorable: true,
        message,
    };
    let Some(v) = vm.template.spec.volumes.iter().find(|v| v.name == volume) else {
        return Ok(Err(hard(format!(
            "no volume named {volume:?} in spec.template.spec.volumes"
        ))));
    };
    let claim = if let Some(c) = &v.persistent_volume_claim {
        c.claim_name.clone()
    } else if let Some(d) = &v.data_volume {
        if let Some(t) = vm
            .data_volume_templates
            .iter()
            .find(|t| t.metadata.name == d.name)
        {
            match t.spec.source.as_ref().and_then(|s| s.pvc.as_ref()) {
                Some(p) if p.namespace.as_deref().is_none_or(|n| n == ns) => p.name.clone(),
                _ => {
                    return Ok(Err(soft(format!(
                        "the dataVolumeTemplate {:?} has no source.pvc to read labels from",
                        d.name
                    ))));
                }
            }
        } else {
            match store
                .get_typed::<DataVolume>(ns, &d.name)
                .await
                .map_err(ApiError::internal)?
            {
                None => {
                    return Ok(Err(hard(format!("DataVolume {:?} not found", d.name))));
                }
                Some(dv) if dv.label(labels.0).is_some() => d.name.clone(),
                Some(dv) => match dv.spec.source.as_ref().and_then(|s| s.pvc.as_ref()) {
                    Some(p) if p.namespace.as_deref().is_none_or(|n| n == ns) => p.name.clone(),
                    _ => {
                        return Ok(Err(soft(format!(
                            "unable to find required {} label on DataVolume {:?}",
                            labels.0, d.name
                        ))));
                    }
                },
            }
        }
    } else {
        return Ok(Err(soft(format!(
            "unable to infer defaults from volume {volume:?}: only persistentVolumeClaim and \
             dataVolume volumes carry labels"
        ))));
    };
    // A claim is a DataVolume of that name (an operator's disk on the shared pool has no
    // labels to read).
    let Some(dv) = store
        .get_typed::<DataVolume>(ns, &claim)
        .await
        .map_err(ApiError::internal)?
    else {
        return Ok(Err(soft(format!(
            "claim {claim:?} is no DataVolume, so it has no {} label",
            labels.0
        ))));
    };
    match dv.label(labels.0) {
        Some(name) => Ok(Ok((
            name.to_string(),
            dv.label(labels.1).map(str::to_string),
        ))),
        None => Ok(Err(soft(format!(
            "unable to find required {} label on claim {claim:?}",
            labels.0
        )))),
    }
}

/// A VM's instancetype and preference, as KubeVirt's webhook checks them: when they exist,
/// the template with both applied must not conflict and must pass the instance checks; when
/// one does not exist yet the VM is taken (the controller reports it and starts the VM once
/// it appears), and the template's own fields are checked as far as they go.
async fn check_vm_instancetype(
    store: &Store,
    ns: &str,
    name: &str,
    vm: &VirtualMachineSpec,
    templates: &[String],
) -> ApiResult<()> {
    let at = "spec.template.spec";
    if vm.instancetype.is_none() && vm.preference.is_none() {
        return check_vmi_spec(store, ns, &vm.template.spec, at, templates).await;
    }
    for (m, preference, field) in [
        (&vm.instancetype, false, "spec.instancetype"),
        (&vm.preference, true, "spec.preference"),
    ] {
        if let Some(m) = m {
            if m.name.is_empty() {
                return Err(ApiError::invalid(format!(
                    "{field}.name: required (or inferFromVolume, naming a volume whose claim \
                     has the default-instancetype labels)"
                )));
            }
            m.scope(preference)
                .map_err(|e| ApiError::invalid(format!("{field}.kind: {e}")))?;
        }
    }
    let probe = crate::types::VirtualMachine {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            ..Default::default()
        },
        spec: vm.clone(),
        status: None,
    };
    let (resolved, missing) = Resolved::existing(store, &probe).await?;
    let (spec, _) = resolved.expand(&probe, at).map_err(|errors| {
        ApiError::invalid_fields(
            "kubevirt.io",
            "VirtualMachine",
            name,
            crate::types::FieldErrors {
                kind: "VirtualMachine".into(),
                errors,
            },
        )
    })?;
    if missing.is_empty() {
        check_vmi_spec(store, ns, &spec, at, templates).await?;
    } else {
        tracing::info!(namespace = %ns, %name, missing = %missing.join("; "), "VM taken before its instancetype or preference exists");
    }
    Ok(())
}

/// An instancetype's size within what a guest can have.
fn check_instancetype(it: &InstancetypeSpec) -> ApiResult<()> {
    if it.cpu.guest == 0 || u64::from(it.cpu.guest) > convert::MAX_VCPUS {
        return Err(ApiError::invalid(format!(
            "spec.cpu.guest: {} vCPUs; from 1 to {}",
            it.cpu.guest,
            convert::MAX_VCPUS
        )));
    }
    let mut probe = VirtualMachineInstanceSpec::default();
    probe.domain.memory = Some(crate::types::kubevirt::Memory {
        guest: Some(it.memory.guest.clone()),
    });
    convert::guest_memory(&probe)
        .map_err(|e| ApiError::invalid(format!("spec.memory.guest: {}", e.0)))?;
    if it.memory.overcommit_percent.is_some_and(|p| p > 100) {
        return Err(ApiError::invalid(
            "spec.memory.overcommitPercent: from 0 to 100",
        ));
    }
    Ok(())
}

/// KubeVirt's sidecar hooks run a container beside the VM that rewrites its domain: there
/// are no containers here, so the annotation is refused by name rather than ignored.
const HOOK_SIDECARS: &str = "hooks.kubevirt.io/hookSidecars";

fn check_hooks(meta: &Value, at: &str) -> ApiResult<()> {
    if meta["annotations"].get(HOOK_SIDECARS).is_some() {
        return Err(ApiError::invalid(format!(
            "{at}.annotations[{HOOK_SIDECARS}]: sidecar hooks are not supported: edgevirt runs \
             no containers beside a VM; remove the annotation"
        )));
    }
    Ok(())
}

/// A Secret as Kubernetes keeps it: `stringData` folded into `data` (base64), every `data`
/// value base64, and the keys its type needs; a `kubernetes.io/dockerconfigjson` secret's
/// config must parse, so a bad one is refused here rather than at a VM's start.
fn check_secret(obj: &mut Value) -> ApiResult<()> {
    use base64::Engine as _;
    let b64 = &base64::engine::general_purpose::STANDARD;
    let o = obj
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("a Secret is a JSON object"))?;
    o.remove("spec");
    o.remove("status");
    let ty = match o.get("type") {
        None | Some(Value::Null) => "Opaque".to_string(),
        Some(Value::String(t)) => t.clone(),
        Some(_) => return Err(ApiError::invalid("type: must be a string")),
    };
    o.insert("type".into(), json!(ty));
    let mut data = match o.remove("data") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(ApiError::invalid(
                "data: must be a map of key to base64 value",
            ));
        }
    };
    for (k, v) in &data {
        let ok = v.as_str().is_some_and(|s| b64.decode(s).is_ok());
        if !ok {
            return Err(ApiError::invalid(format!("data[{k:?}]: must be base64")));
        }
    }
    match o.remove("stringData") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                let s = v.as_str().ok_or_else(|| {
                    ApiError::invalid(format!("stringData[{k:?}]: must be a string"))
                })?;
                data.insert(k, json!(b64.encode(s)));
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "stringData: must be a map of key to string",
            ));
        }
    }
    for k in data.keys() {
        check_data_key("data", k)?;
    }
    if ty == registry::DOCKER_CONFIG_SECRET {
        registry::DockerConfig::from_secret_data(&data).map_err(ApiError::invalid)?;
    }
    o.insert("data".into(), Value::Object(data));
    Ok(())
}

/// A key of a Secret's or ConfigMap's data, as Kubernetes allows it; it becomes a file name
/// in the guest, so never a path.
fn check_data_key(field: &str, k: &str) -> ApiResult<()> {
    if crate::types::is_file_name(k) {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "{field}[{k:?}]: a key is letters, digits, '-', '_' and '.'"
        )))
    }
}

/// A ConfigMap as Kubernetes keeps it: `data` maps keys to text, `binaryData` to base64,
/// and no key is in both.
fn check_config_map(obj: &mut Value) -> ApiResult<()> {
    use base64::Engine as _;
    let o = obj
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("a ConfigMap is a JSON object"))?;
    o.remove("spec");
    o.remove("status");
    let mut keys = Vec::new();
    for (field, binary) in [("data", false), ("binaryData", true)] {
        let Some(v) = o.get(field).filter(|v| !v.is_null()) else {
            continue;
        };
        let m = v
            .as_object()
            .ok_or_else(|| ApiError::invalid(format!("{field}: must be a map of key to string")))?;
        for (k, v) in m {
            check_data_key(field, k)?;
            let ok = v.as_str().is_some_and(|s| {
                !binary || base64::engine::general_purpose::STANDARD.decode(s).is_ok()
            });
            if !ok {
                let what = if binary { "base64" } else { "a string" };
                return Err(ApiError::invalid(format!("{field}[{k:?}]: must be {what}")));
            }
            if keys.contains(k) {
                return Err(ApiError::invalid(format!(
                    "{field}[{k:?}]: the key is in data and binaryData both"
                )));
            }
            keys.push(k.clone());
        }
    }
    Ok(())
}

/// Checked here too (the store holds every write to it) so a dry run says so.
/// An event someone records by hand (an agent, a script): it names the object it is about,
/// says why in a reason, and is Normal or Warning; the times and count default as the
/// Kubernetes API server leaves them to the recorder.
fn check_event(obj: &mut Value) -> ApiResult<()> {
    use k8s_openapi::api::core::v1::Event;
    if let Some(o) = obj.as_object_mut() {
        o.remove("spec");
        o.remove("status");
    }
    let ev: Event = decode("Event", obj.clone())
        .map_err(|e| ApiError::invalid(format!("the event does not decode: {e}")))?;
    if ev.involved_object.name.as_deref().unwrap_or("").is_empty() {
        return Err(ApiError::invalid("involvedObject.name: Required value"));
    }
    if ev.reason.as_deref().unwrap_or("").is_empty() {
        return Err(ApiError::invalid("reason: Required value"));
    }
    if let Some(t) = ev
        .type_
        .as_deref()
        .filter(|t| !matches!(*t, "Normal" | "Warning"))
    {
        return Err(ApiError::invalid(format!(
            "type: Unsupported value: {t:?}: supported values: \"Normal\", \"Warning\""
        )));
    }
    let now = crate::types::now();
    for field in ["firstTimestamp", "lastTimestamp"] {
        if obj[field].is_null() {
            obj[field] = json!(now);
        }
    }
    if obj["count"].is_null() {
        obj["count"] = json!(1);
    }
    Ok(())
}

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
/// Every problem of a DataVolume spec, the image reference of a registry source included.
/// The names of the storage classes that exist: `local` and one per shared pool a node
/// mounts (the controller keeps them).
async fn storage_classes(store: &Store) -> ApiResult<Vec<String>> {
    let (classes, _) = store
        .list(
            Kind::StorageClass,
            None,
            &crate::store::LabelSelector::default(),
            &crate::store::FieldSelector::default(),
        )
        .await
        .map_err(ApiError::internal)?;
    Ok(classes
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_string))
        .collect())
}

fn data_volume_problems(
    spec: &DataVolumeSpec,
    ns: &str,
    at: &str,
    classes: &[String],
) -> Vec<FieldError> {
    let mut problems = spec.check(ns, at);
    problems.extend(spec.check_class(classes, at));
    if let Some(Fill::Registry(image)) = spec.fill(ns)
        && let Err(e) = registry::check_reference(&image)
    {
        problems.push(FieldError {
            field: format!("{at}.source.registry.url"),
            reason: "FieldValueInvalid",
            message: e.to_string(),
        });
    }
    problems
}

/// Check an instance spec in namespace `ns`; `templates` are the names of the DataVolumes
/// its VM creates (its `dataVolume` volumes may name them before they exist).
async fn check_vmi_spec(
    store: &Store,
    ns: &str,
    spec: &VirtualMachineInstanceSpec,
    at: &str,
    templates: &[String],
) -> ApiResult<()> {
    convert::validate(spec).map_err(|e| ApiError::invalid(format!("{at}: {}", e.0)))?;
    // A hostDisk path must be inside the host disk folder of some node (each node checks
    // its own again, links resolved, when the instance starts there).
    if spec.volumes.iter().any(|v| v.host_disk.is_some()) {
        let nodes: Vec<crate::types::Node> = store.all().await.map_err(ApiError::internal)?;
        let dirs: Vec<String> = nodes
            .iter()
            .filter_map(|n| {
                let d = n.status.as_ref()?.host_disk_dir.as_deref()?;
                Some(format!(
                    "{} allows {d}",
                    n.metadata.name.as_deref().unwrap_or("?")
                ))
            })
            .collect();
        let probe = crate::types::VirtualMachineInstance {
            metadata: Default::default(),
            spec: spec.clone(),
            status: None,
        };
        let fits = nodes.iter().any(|n| {
            crate::rules::migration::host_disks_allowed(
                &probe,
                n.status.as_ref().and_then(|s| s.host_disk_dir.as_deref()),
            )
        });
        if !fits {
            return Err(ApiError::invalid(format!(
                "{at}.volumes: no node allows these hostDisk paths ({}); a node allows host \
                 disks only inside its folder (serve --host-disk-dir)",
                if dirs.is_empty() {
                    "no node has a host disk folder".to_string()
                } else {
                    dirs.join(", ")
                }
            )));
        }
    }
    // A multus network names a NetworkAttachmentDefinition that exists (its bridge may come
    // to a node later: the scheduler waits for one, saying which bridge it lacks).
    for n in &spec.networks {
        if let Some(m) = &n.multus {
            let (nns, nad) = crate::types::cni::reference(ns, &m.network_name);
            if store
                .get(Kind::NetworkAttachmentDefinition, nns, nad)
                .await?
                .is_none()
            {
                return Err(ApiError::invalid(format!(
                    "{at}.networks: network {:?}: NetworkAttachmentDefinition {nns}/{nad} does \
                     not exist; create it first (a `bridge` CNI config naming the host bridge)",
                    n.name
                )));
            }
        }
    }
    // A registry reference is pulled by the node at start: here only its syntax and pull
    // policy can be checked.
    for (i, v) in spec.volumes.iter().enumerate() {
        if let Some(cd) = &v.container_disk
            && let Source::Registry(image) = Source::of(&cd.image)
        {
            check_pull(
                &format!("{at}.volumes[{i}].containerDisk"),
                &image,
                cd.image_pull_policy.as_deref(),
                cd.image_pull_secret.as_deref(),
            )?;
        }
    }
    if let Some(c) = spec.kernel_boot_container() {
        let field = format!("{at}.domain.firmware.kernelBoot.container");
        if c.from_image() {
            // KubeVirt's form: files inside an OCI image the node pulls. A path never
            // reaches the host's files: without a registry image it is refused.
            if !matches!(Source::of(&c.image), Source::Registry(_)) {
                return Err(ApiError::invalid(format!(
                    "{field}.image: {:?} is not an OCI image reference (registry/repository:tag), \
                     so kernelPath and initrdPath cannot be paths inside it; name images \
                     imported with `edgevirt image import` there instead, not paths",
                    c.image
                )));
            }
            check_pull(
                &field,
                &c.image,
                c.image_pull_policy.as_deref(),
                c.image_pull_secret.as_deref(),
            )?;
            if [&c.kernel_path, &c.initrd_path]
                .into_iter()
                .flatten()
                .any(|p| !p.starts_with('/'))
            {
                return Err(ApiError::invalid(format!(
                    "{field}: kernelPath and initrdPath are both paths inside the image or \
                     both names of imported images, not one of each"
                )));
            }
            if c.kernel_path.is_none() {
                return Err(ApiError::invalid(format!(
                    "{field}.kernelPath: required with initrdPath"
                )));
            }
            for (name, path) in [
                ("kernelPath", &c.kernel_path),
                ("initrdPath", &c.initrd_path),
            ] {
                // Absolute already (checked above).
                if let Some(p) = path
                    && (p.len() > 4096 || p.split('/').any(|s| s == "..") || p.ends_with('/'))
                {
                    return Err(ApiError::invalid(format!(
                        "{field}.{name}: {p:?}: an absolute path of a file inside the image, \
                         without '..'"
                    )));
                }
            }
        }
    }
    // A dataVolume names a DataVolume (existing, or one of the VM's templates) or else an
    // imported image.
    let mut data_volumes = Vec::new();
    for v in &spec.volumes {
        if let Some(d) = &v.data_volume
            && (templates.contains(&d.name)
                || store.get(Kind::DataVolume, ns, &d.name).await?.is_some())
        {
            data_volumes.push(d.name.clone());
        }
    }
    for image in referenced_images(spec) {
        if matches!(Source::of(&image), Source::Registry(_)) || data_volumes.contains(&image) {
            continue;
        }
        if store.get(Kind::Image, "", &image).await?.is_none() {
            return Err(ApiError::invalid(format!(
                "{at}: image {image:?} does not exist; import it first with \
                 `edgevirt image import {image} FILE` (a dataVolume names a DataVolume in \
                 the namespace, one of the VM's dataVolumeTemplates, or an imported image)"
            )));
        }
    }
    Ok(())
}

/// The checks admission can make of an image the node will pull (at `field`, a
/// containerDisk or a kernelBoot container): the reference's syntax, the pull policy, the
/// pull secret's name.
fn check_pull(
    field: &str,
    image: &str,
    policy: Option<&str>,
    secret: Option<&str>,
) -> ApiResult<()> {
    registry::check_reference(image)
        .map_err(|e| ApiError::invalid(format!("{field}.image: {e}")))?;
    PullPolicy::resolve(policy, image)
        .map_err(|e| ApiError::invalid(format!("{field}.imagePullPolicy: {e}")))?;
    if let Some(secret) = secret {
        check_name(&format!("{field}.imagePullSecret"), secret)
            .map_err(|e| ApiError::invalid(e.0))?;
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
    if let Some(c) = spec.kernel_boot_container()
        && !c.from_image()
    {
        out.extend(c.kernel_path.iter().cloned());
        out.extend(c.initrd_path.iter().cloned());
    }
    out
}
