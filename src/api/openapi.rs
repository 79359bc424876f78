//! OpenAPI documents for the served kinds, built from the CRD schemas (the Rust types):
//! v3 (`/openapi/v3` index and one document per group/version), which current `kubectl`
//! uses for `explain` and to learn that the server validates fields itself; and v2
//! (`/openapi/v2`) as the gnostic protobuf older `kubectl` (1.20) insists on before `apply`,
//! `create` and `edit`, and reads for `explain`.

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::http::error::{ApiError, ApiResult};
use crate::types::Kind;

fn gvk(kind: Kind) -> Value {
    json!({"group": kind.group(), "version": kind.version(), "kind": kind.name()})
}

/// The schema's name in the documents: Kubernetes' reversed-group style.
fn schema_name(kind: Kind) -> String {
    match kind.group() {
        "" => format!("io.k8s.api.core.v1.{}", kind.name()),
        g => {
            let rev: Vec<&str> = g.split('.').rev().collect();
            format!("{}.{}.{}", rev.join("."), kind.version(), kind.name())
        }
    }
}

/// The kind's schema, with the fields every object has and its GVK as a list (what
/// `kubectl explain` looks for).
fn schema(kind: Kind) -> Value {
    let mut s = kind
        .crd()
        .and_then(|c| c.spec.versions[0].schema.clone())
        .and_then(|s| s.open_api_v3_schema)
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .unwrap_or_else(|| {
            json!({"type": "object", "description": description(kind),
                   "properties": {"status": {"type": "object",
                       "description": "The object's state, as Kubernetes reports it.",
                       "properties":
                       {"phase": {"type": "string", "description": "Active."}}}}})
        });
    if let Some(o) = s.as_object_mut() {
        o.remove("title");
        o.remove("required");
        o.insert("description".into(), json!(description(kind)));
    }
    let props = s["properties"].as_object_mut().expect("an object schema");
    props.insert(
        "apiVersion".into(),
        json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}),
    );
    props.insert(
        "kind".into(),
        json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}),
    );
    props.insert(
        "metadata".into(),
        json!({"type": "object", "description": "Standard object's metadata: name, namespace, labels, annotations."}),
    );
    s["x-kubernetes-group-version-kind"] = json!([gvk(kind)]);
    s
}

fn description(kind: Kind) -> &'static str {
    match kind {
        Kind::VirtualMachine => {
            "VirtualMachine handles the VirtualMachines that are not running or are in a stopped \
             state. It keeps a VirtualMachineInstance running as its runStrategy says."
        }
        Kind::VirtualMachineInstance => {
            "VirtualMachineInstance is a running virtual machine: one libvirt domain on one node."
        }
        Kind::VirtualMachineInstanceMigration => {
            "VirtualMachineInstanceMigration moves a running VirtualMachineInstance to another \
             node; deleting it while it runs cancels the migration."
        }
        Kind::Node => "Node is a host running the edgevirt agent.",
        Kind::Image => "Image is a disk, kernel or initrd image imported into edgevirt.",
        Kind::Namespace => "Namespace is a name scope for VMs, as in Kubernetes.",
        Kind::Secret => {
            "Secret holds credentials, as in Kubernetes: a `kubernetes.io/dockerconfigjson` \
             secret gives a containerDisk's imagePullSecret its registry login."
        }
        Kind::Event => {
            "Event is a report of something that happened to an object (a VM started, stopped, \
             failed to be scheduled, migrated; a node went NotReady), as Kubernetes records \
             them: repeats are counted on one event, and events older than three days go."
        }
        Kind::ConfigMap => {
            "ConfigMap holds files, as in Kubernetes: a VM's `configMap` volume presents its \
             keys to the guest as files on a disk (ISO 9660, labelled `cfgdata` or the \
             disk's `volumeLabel`)."
        }
        Kind::VirtualMachineInstancetype => {
            "VirtualMachineInstancetype is a VM size in a namespace: vCPUs and memory a VM's \
             spec.instancetype takes, which the VM may not override."
        }
        Kind::VirtualMachineClusterInstancetype => {
            "VirtualMachineClusterInstancetype is a VM size for every namespace (edgevirt keeps \
             KubeVirt's common set: u1, o1, cx1, m1)."
        }
        Kind::VirtualMachinePreference => {
            "VirtualMachinePreference holds what a guest OS prefers (disk bus, NIC model, \
             firmware, clock, features); it fills only what the VM leaves unset."
        }
        Kind::VirtualMachineClusterPreference => {
            "VirtualMachineClusterPreference holds what a guest OS prefers, for every namespace \
             (edgevirt keeps a common set for current Linux and Windows releases)."
        }
        Kind::DataVolume => {
            "DataVolume is a persistent disk filled once from a source (blank, http, a \
             registry image, another DataVolume's disk), as CDI's. On `local` storage the \
             node that first runs a VM using it fills it, and VMs using it run there; on a \
             shared pool's class any node mounting the pool runs them."
        }
        Kind::StorageClass => {
            "StorageClass says where DataVolumes' disks live, as in Kubernetes: edgevirt keeps \
             `local` (the node's own disk, bound when a VM first uses the DataVolume) and one \
             class per shared pool a node mounts, named after it (bound at once; its VMs \
             live-migrate without a copy)."
        }
        Kind::VirtualMachineSnapshot => {
            "VirtualMachineSnapshot asks for a point-in-time copy of a VirtualMachine (its spec \
             and every persistent disk), as KubeVirt's: a running guest keeps running, its \
             filesystems frozen through the guest agent only while the copy starts."
        }
        Kind::VirtualMachineSnapshotContent => {
            "VirtualMachineSnapshotContent is what a snapshot holds: the VM as it was and a \
             copy of each of its DataVolumes, kept by the node that holds the VM's disks."
        }
        Kind::VirtualMachineRestore => {
            "VirtualMachineRestore puts a VirtualMachine back to a snapshot: its disks (in \
             place) and its spec; a running VM is stopped first with targetReadinessPolicy \
             StopTarget."
        }
        Kind::VirtualMachineBackup => {
            "VirtualMachineBackup copies a VirtualMachine (its spec and every persistent disk) \
             to a backup target (`pvcName` names it) while the guest runs: the first backup \
             is full, later ones hold only the blocks changed since the previous one."
        }
        Kind::BackupSchedule => {
            "BackupSchedule backs up VMs to a backup target every `every` (a duration) and \
             deletes the schedule's older backups by a retention rule (`keep`: last, hourly, \
             daily, weekly, monthly, as Proxmox prunes)."
        }
        Kind::NetworkAttachmentDefinition => {
            "NetworkAttachmentDefinition is a network VMs join (Multus' kind): the CNI \
             configuration of a `bridge` plugin naming a host bridge the operator made, with \
             an optional VLAN. A VM names it in a `multus` network with a `bridge` interface; \
             it runs only on nodes that have the bridge."
        }
        Kind::ControllerRevision => {
            "ControllerRevision is the copy of an instancetype or preference a VM keeps using, \
             so changing the object does not change the VM."
        }
    }
}

fn gv_key(group: &str) -> String {
    if group.is_empty() {
        "api/v1".into()
    } else {
        format!("apis/{group}/{}", crate::types::version_of(group))
    }
}

/// Changes whenever the documents may: the version of this binary.
fn hash() -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(env!("CARGO_PKG_VERSION").as_bytes())[..8])
}

/// `GET /openapi/v3`
pub async fn v3_index() -> Response {
    let mut paths = Map::new();
    for g in super::discovery::GROUPS {
        let key = gv_key(g);
        paths.insert(
            key.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={}", hash())}),
        );
    }
    axum::Json(json!({ "paths": paths })).into_response()
}

fn operation(kind: Kind, verb: &str) -> Value {
    let mut op = json!({
        "operationId": format!("{verb}{}", kind.name()),
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema":
            {"$ref": format!("#/components/schemas/{}", schema_name(kind))}}}}},
        "x-kubernetes-group-version-kind": gvk(kind),
        "x-kubernetes-action": verb,
    });
    if matches!(verb, "patch" | "put" | "post") {
        // edgevirt checks fields itself (unknown fields are refused), so kubectl need not.
        op["parameters"] = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
        ]);
        // No strategic-merge-patch here: kubectl then sends JSON merge patches.
        let types: &[&str] = if verb == "patch" {
            &[
                "application/merge-patch+json",
                "application/json-patch+json",
            ]
        } else {
            &["application/json", "application/yaml"]
        };
        let content: Map<String, Value> = types
            .iter()
            .map(|t| (t.to_string(), json!({"schema": {"type": "object"}})))
            .collect();
        op["requestBody"] = json!({ "content": content });
    }
    op
}

fn v3_document(group: &str) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for kind in Kind::ALL.into_iter().filter(|k| k.group() == group) {
        let base = if kind.namespaced() {
            format!(
                "{}/namespaces/{{namespace}}/{}",
                kind.path_prefix(),
                kind.plural()
            )
        } else {
            format!("{}/{}", kind.path_prefix(), kind.plural())
        };
        paths.insert(
            base.clone(),
            json!({"get": operation(kind, "list"), "post": operation(kind, "post")}),
        );
        paths.insert(
            format!("{base}/{{name}}"),
            json!({
                "get": operation(kind, "get"),
                "put": operation(kind, "put"),
                "patch": operation(kind, "patch"),
                "delete": operation(kind, "delete"),
            }),
        );
        schemas.insert(schema_name(kind), schema(kind));
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "edgevirt", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// `GET /openapi/v3/{*path}`: `api/v1` or `apis/{group}/v1`.
pub async fn v3_group(
    Path(path): Path<String>,
    Query(_q): Query<std::collections::HashMap<String, String>>,
) -> ApiResult<Response> {
    let Some(group) = super::discovery::GROUPS
        .into_iter()
        .find(|g| gv_key(g) == path)
    else {
        return Err(ApiError::not_found(format!("no OpenAPI document {path:?}")));
    };
    Ok(axum::Json(v3_document(group)).into_response())
}

/// The Content-Type of the v2 protobuf, as kube-apiserver sends it (Go's mime parser
/// refuses the `@` of the Accept form).
const PROTO_V2: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// Swagger 2.0 paths: for each kind, its item path with get/put/patch/delete carrying the
/// GVK and the query parameters (kubectl 1.20 looks for `dryRun` here before a server-side
/// dry run).
fn v2_paths() -> Map<String, Value> {
    let mut paths = Map::new();
    for kind in Kind::ALL {
        let base = if kind.namespaced() {
            format!(
                "{}/namespaces/{{namespace}}/{}",
                kind.path_prefix(),
                kind.plural()
            )
        } else {
            format!("{}/{}", kind.path_prefix(), kind.plural())
        };
        let op = |verb: &str| {
            json!({
                "operationId": format!("{verb}{}", kind.name()),
                "parameters": [
                    {"name": "dryRun", "in": "query", "type": "string"},
                    {"name": "fieldManager", "in": "query", "type": "string"},
                    {"name": "fieldValidation", "in": "query", "type": "string"},
                ],
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-group-version-kind": gvk(kind),
                "x-kubernetes-action": verb,
            })
        };
        paths.insert(
            format!("{base}/{{name}}"),
            json!({
                "get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete"),
            }),
        );
        paths.insert(base, json!({"get": op("list"), "post": op("post")}));
    }
    paths
}

/// `GET /openapi/v2`: protobuf when asked (kubectl), JSON otherwise.
pub async fn v2(headers: HeaderMap) -> Response {
    let definitions: Map<String, Value> = Kind::ALL
        .into_iter()
        .map(|k| (schema_name(k), schema(k)))
        .collect();
    let paths = v2_paths();
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("protobuf") {
        return (
            [(header::CONTENT_TYPE, PROTO_V2)],
            proto::document(&paths, &definitions),
        )
            .into_response();
    }
    axum::Json(json!({
        "swagger": "2.0",
        "info": {"title": "edgevirt", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "definitions": definitions,
    }))
    .into_response()
}

/// Just enough of gnostic's `openapi_v2.Document` protobuf (google/gnostic,
/// `openapiv2/OpenAPIv2.proto`) for kubectl to read definitions: field numbers from that file.
mod proto {
    use serde_json::{Map, Value};

    fn varint(mut n: u64, out: &mut Vec<u8>) {
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    /// A length-delimited field.
    fn field(num: u64, payload: &[u8], out: &mut Vec<u8>) {
        varint(num << 3 | 2, out);
        varint(payload.len() as u64, out);
        out.extend_from_slice(payload);
    }

    fn bool_field(num: u64, v: bool, out: &mut Vec<u8>) {
        varint(num << 3, out);
        out.push(v as u8);
    }

    /// `Any { yaml = 2 }`: JSON is YAML.
    fn any(v: &Value) -> Vec<u8> {
        let mut o = vec![];
        field(2, v.to_string().as_bytes(), &mut o);
        o
    }

    /// `NamedAny { name = 1; value = 2 }`
    fn named_any(name: &str, v: &Value) -> Vec<u8> {
        let mut o = vec![];
        field(1, name.as_bytes(), &mut o);
        field(2, &any(v), &mut o);
        o
    }

    fn schema(s: &Value) -> Vec<u8> {
        let mut o = vec![];
        if let Some(r) = s["$ref"].as_str() {
            field(1, r.as_bytes(), &mut o);
        }
        if let Some(f) = s["format"].as_str() {
            field(2, f.as_bytes(), &mut o);
        }
        if let Some(d) = s["description"].as_str() {
            field(4, d.as_bytes(), &mut o);
        }
        for r in s["required"].as_array().into_iter().flatten() {
            if let Some(r) = r.as_str() {
                field(19, r.as_bytes(), &mut o);
            }
        }
        for e in s["enum"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| !e.is_null())
        {
            field(20, &any(e), &mut o);
        }
        match &s["additionalProperties"] {
            Value::Object(_) => {
                let mut ap = vec![];
                field(1, &schema(&s["additionalProperties"]), &mut ap);
                field(21, &ap, &mut o);
            }
            Value::Bool(b) => {
                let mut ap = vec![];
                bool_field(2, *b, &mut ap);
                field(21, &ap, &mut o);
            }
            _ => {}
        }
        if let Some(t) = s["type"].as_str() {
            // TypeItem { repeated string value = 1 }
            let mut ti = vec![];
            field(1, t.as_bytes(), &mut ti);
            field(22, &ti, &mut o);
        }
        if s["items"].is_object() {
            // ItemsItem { repeated Schema schema = 1 }
            let mut it = vec![];
            field(1, &schema(&s["items"]), &mut it);
            field(23, &it, &mut o);
        }
        if let Some(props) = s["properties"].as_object() {
            // Properties { repeated NamedSchema additional_properties = 1 }
            let mut ps = vec![];
            for (k, v) in props {
                let mut ns = vec![];
                field(1, k.as_bytes(), &mut ns);
                field(2, &schema(v), &mut ns);
                field(1, &ns, &mut ps);
            }
            field(25, &ps, &mut o);
        }
        if let Some(obj) = s.as_object() {
            for (k, v) in obj.iter().filter(|(k, _)| k.starts_with("x-")) {
                field(31, &named_any(k, v), &mut o);
            }
        }
        o
    }

    /// `Operation { operation_id = 5; parameters = 8; responses = 9; vendor_extension = 13 }`
    /// with query parameters only.
    fn operation(op: &Value) -> Vec<u8> {
        let mut o = vec![];
        if let Some(id) = op["operationId"].as_str() {
            field(5, id.as_bytes(), &mut o);
        }
        for p in op["parameters"].as_array().into_iter().flatten() {
            // ParametersItem.parameter(1) → Parameter.non_body_parameter(2) →
            // NonBodyParameter.query_parameter_sub_schema(3) { in = 2; name = 4; type = 6 }
            let mut q = vec![];
            field(2, b"query", &mut q);
            field(4, p["name"].as_str().unwrap_or("").as_bytes(), &mut q);
            field(6, p["type"].as_str().unwrap_or("string").as_bytes(), &mut q);
            let mut nb = vec![];
            field(3, &q, &mut nb);
            let mut param = vec![];
            field(2, &nb, &mut param);
            let mut item = vec![];
            field(1, &param, &mut item);
            field(8, &item, &mut o);
        }
        // Responses.response_code(1) { name = 1; value = 2 → ResponseValue.response(1) →
        // Response.description(1) }
        let mut desc = vec![];
        field(1, b"OK", &mut desc);
        let mut rv = vec![];
        field(1, &desc, &mut rv);
        let mut named = vec![];
        field(1, b"200", &mut named);
        field(2, &rv, &mut named);
        let mut responses = vec![];
        field(1, &named, &mut responses);
        field(9, &responses, &mut o);
        if let Some(obj) = op.as_object() {
            for (k, v) in obj.iter().filter(|(k, _)| k.starts_with("x-")) {
                field(13, &named_any(k, v), &mut o);
            }
        }
        o
    }

    /// `PathItem { get = 2; put = 3; post = 4; delete = 5; patch = 8 }`
    fn path_item(item: &Value) -> Vec<u8> {
        let mut o = vec![];
        for (verb, num) in [
            ("get", 2),
            ("put", 3),
            ("post", 4),
            ("delete", 5),
            ("patch", 8),
        ] {
            if item[verb].is_object() {
                field(num, &operation(&item[verb]), &mut o);
            }
        }
        o
    }

    /// `Document { swagger = 1; info = 2; paths = 8; definitions = 9 }`
    pub fn document(paths: &Map<String, Value>, definitions: &Map<String, Value>) -> Vec<u8> {
        let mut o = vec![];
        field(1, b"2.0", &mut o);
        let mut info = vec![];
        field(1, b"edgevirt", &mut info);
        field(2, env!("CARGO_PKG_VERSION").as_bytes(), &mut info);
        field(2, &info, &mut o);
        // Paths { path = 2: NamedPathItem { name = 1; value = 2 } }
        let mut ps = vec![];
        for (name, item) in paths {
            let mut np = vec![];
            field(1, name.as_bytes(), &mut np);
            field(2, &path_item(item), &mut np);
            field(2, &np, &mut ps);
        }
        field(8, &ps, &mut o);
        let mut defs = vec![];
        for (name, s) in definitions {
            let mut ns = vec![];
            field(1, name.as_bytes(), &mut ns);
            field(2, &schema(s), &mut ns);
            field(1, &ns, &mut defs);
        }
        field(9, &defs, &mut o);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v3_patch_operations_say_the_server_validates_fields() {
        let d = v3_document("kubevirt.io");
        let p = &d["paths"]["/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}"]["patch"];
        assert_eq!(
            p["x-kubernetes-group-version-kind"]["kind"],
            "VirtualMachine"
        );
        assert!(
            p["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["name"] == "fieldValidation")
        );
        assert!(
            p["requestBody"]["content"]
                .get("application/strategic-merge-patch+json")
                .is_none()
        );
        let s = &d["components"]["schemas"]["io.kubevirt.v1.VirtualMachine"];
        assert_eq!(
            s["x-kubernetes-group-version-kind"][0]["kind"],
            "VirtualMachine"
        );
        assert_eq!(
            s["properties"]["spec"]["properties"]["runStrategy"]["type"],
            "string"
        );
        let core = v3_document("");
        assert!(core["paths"].get("/api/v1/namespaces/{name}").is_some());
    }

    /// Collects, below `at`, the paths of properties without a non-empty description:
    /// through properties, list items, map values, `$ref`s into the document's definitions
    /// and `allOf`/`anyOf`/`oneOf`/`not`.
    fn undescribed(
        root: &Value,
        s: &Value,
        at: &str,
        seen: &mut Vec<String>,
        out: &mut Vec<String>,
    ) {
        if let Some(r) = s["$ref"].as_str() {
            if seen.iter().any(|x| x == r) {
                return;
            }
            let name = r.rsplit('/').next().unwrap_or(r);
            let target = ["definitions", "$defs"]
                .into_iter()
                .map(|d| &root[d][name])
                .find(|t| !t.is_null());
            match target {
                Some(t) => {
                    seen.push(r.to_string());
                    undescribed(root, t, at, seen, out);
                    seen.pop();
                }
                None => out.push(format!("{at} (unresolved $ref {r})")),
            }
        }
        if let Some(props) = s["properties"].as_object() {
            for (name, p) in props {
                let path = if at.is_empty() {
                    name.clone()
                } else {
                    format!("{at}.{name}")
                };
                let described = p["description"]
                    .as_str()
                    .is_some_and(|d| !d.trim().is_empty());
                if !described {
                    out.push(path.clone());
                }
                undescribed(root, p, &path, seen, out);
            }
        }
        if s["items"].is_object() {
            undescribed(root, &s["items"], &format!("{at}[]"), seen, out);
        }
        for items in s["items"].as_array().into_iter().flatten() {
            undescribed(root, items, &format!("{at}[]"), seen, out);
        }
        if s["additionalProperties"].is_object() {
            undescribed(
                root,
                &s["additionalProperties"],
                &format!("{at}{{}}"),
                seen,
                out,
            );
        }
        for key in ["allOf", "anyOf", "oneOf"] {
            for branch in s[key].as_array().into_iter().flatten() {
                undescribed(root, branch, at, seen, out);
            }
        }
        if s["not"].is_object() {
            undescribed(root, &s["not"], at, seen, out);
        }
    }

    /// `kubectl explain` has something to say about every property of every served kind:
    /// each one has a description (for the kinds built from Rust types, the `///` doc
    /// comment of its field, or of its type).
    #[test]
    fn every_served_property_has_a_description() {
        let mut problems = Vec::new();
        let mut total = 0;
        for kind in Kind::ALL {
            let s = schema(kind);
            let mut missing = Vec::new();
            undescribed(&s, &s, "", &mut Vec::new(), &mut missing);
            if !missing.is_empty() {
                total += missing.len();
                problems.push(format!(
                    "{} ({}):\n  {}",
                    kind.name(),
                    missing.len(),
                    missing.join("\n  ")
                ));
            }
        }
        assert!(
            problems.is_empty(),
            "{total} served properties have no description:\n{}",
            problems.join("\n")
        );
    }

    #[test]
    fn v2_protobuf_starts_with_the_swagger_version() {
        let defs: Map<String, Value> = [("a".to_string(), json!({"type": "object"}))]
            .into_iter()
            .collect();
        let b = proto::document(&v2_paths(), &defs);
        assert_eq!(&b[..5], b"\x0a\x032.0");
    }
}
