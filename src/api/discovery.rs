//! Kubernetes discovery, so `kubectl` and client libraries find the kinds: `/api`, `/api/v1`,
//! `/apis`, `/apis/{group}/{version}`, in the legacy form and, when the client asks for it
//! (`Accept: ...;as=APIGroupDiscoveryList`), the aggregated `apidiscovery.k8s.io/v2` form.
//! Names, short names and categories come from the kinds' CRD definitions, the same ones
//! `edgevirt crds` prints.

use axum::Json;
use axum::extract::Path;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::http::error::{ApiError, ApiResult};
use crate::types::{Kind, version_of};

/// One served resource, as discovery describes it.
struct Resource {
    kind: Kind,
    singular: String,
    short_names: Vec<String>,
    categories: Vec<String>,
    status: bool,
    verbs: &'static [&'static str],
}

const VERBS: [&str; 7] = [
    "create", "delete", "get", "list", "patch", "update", "watch",
];
const STATUS_VERBS: [&str; 3] = ["get", "patch", "update"];
const READ_VERBS: [&str; 3] = ["get", "list", "watch"];

/// `events.k8s.io/v1`: the core events in their newer shape, served for reading.
pub const EVENTS_GROUP: &str = "events.k8s.io";

fn resource(kind: Kind) -> Resource {
    let Some(crd) = kind.crd() else {
        // Kubernetes' own kinds.
        let short: &[&str] = match kind {
            Kind::Namespace => &["ns"],
            Kind::StorageClass => &["sc"],
            _ => &[],
        };
        return Resource {
            kind,
            singular: kind.name().to_ascii_lowercase(),
            short_names: short.iter().map(|s| s.to_string()).collect(),
            categories: vec![],
            status: false,
            verbs: &VERBS,
        };
    };
    Resource {
        kind,
        singular: crd.spec.names.singular.clone().unwrap_or_default(),
        short_names: crd.spec.names.short_names.clone().unwrap_or_default(),
        categories: crd.spec.names.categories.clone().unwrap_or_default(),
        status: matches!(
            kind,
            Kind::VirtualMachine
                | Kind::VirtualMachineInstance
                | Kind::VirtualMachineInstanceMigration
        ),
        verbs: &VERBS,
    }
}

/// The groups edgevirt serves, each at one version ([`version_of`]): the core group is "".
pub const GROUPS: [&str; 11] = [
    "",
    "kubevirt.io",
    "edgevirt.io",
    crate::types::instancetype::GROUP,
    "apps",
    crate::types::cdi::GROUP,
    "storage.k8s.io",
    EVENTS_GROUP,
    crate::types::cni::GROUP,
    crate::types::snapshot::GROUP,
    crate::types::backup::GROUP,
];

fn resources_of(group: &str) -> Vec<Resource> {
    if group == EVENTS_GROUP {
        return vec![Resource {
            verbs: &READ_VERBS,
            ..resource(Kind::Event)
        }];
    }
    Kind::ALL
        .into_iter()
        .filter(|k| k.group() == group)
        .map(resource)
        .collect()
}

/// KubeVirt's action subresources (`subresources.kubevirt.io/v1`).
const SUBRESOURCES: [(&str, &str); 14] = [
    ("virtualmachines", "start"),
    ("virtualmachines", "stop"),
    ("virtualmachines", "restart"),
    ("virtualmachines", "rename"),
    ("virtualmachines", "migrate"),
    ("virtualmachineinstances", "migrate"),
    ("virtualmachineinstances", "pause"),
    ("virtualmachineinstances", "unpause"),
    ("virtualmachineinstances", "softreboot"),
    ("virtualmachineinstances", "guestosinfo"),
    ("virtualmachineinstances", "userlist"),
    ("virtualmachineinstances", "filesystemlist"),
    ("virtualmachineinstances", "vnc"),
    ("virtualmachineinstances", "console"),
];

const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| {
            a.split(',').any(|part| {
                let p: Vec<&str> = part.split(';').map(str::trim).collect();
                p.contains(&"as=APIGroupDiscoveryList") && p.contains(&"v=v2")
            })
        })
}

fn aggregated(items: Vec<Value>) -> Response {
    (
        [(header::CONTENT_TYPE, AGGREGATED)],
        Json(json!({
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": items,
        })),
    )
        .into_response()
}

/// The versions a group is served at, preferred first: its own, then the older aliases the
/// resource paths take too (KubeVirt's `v1alpha3`).
fn versions_of(group: &str) -> Vec<&'static str> {
    let mut v = vec![version_of(group)];
    if !group.is_empty() && crate::types::is_alias(&format!("{group}/v1alpha3")) {
        v.push("v1alpha3");
    }
    v
}

fn aggregated_group(group: &str) -> Value {
    let versions: Vec<Value> = versions_of(group)
        .into_iter()
        .map(|version| {
            json!({"version": version, "resources": aggregated_resources(group, version),
                "freshness": "Current"})
        })
        .collect();
    let mut meta = json!({"creationTimestamp": null});
    if !group.is_empty() {
        meta["name"] = json!(group);
    }
    json!({"metadata": meta, "versions": versions})
}

fn aggregated_resources(group: &str, version: &str) -> Vec<Value> {
    resources_of(group)
        .iter()
        .map(|r| {
            let gvk = json!({"group": group, "version": version, "kind": r.kind.name()});
            let mut v = json!({
                "resource": r.kind.plural(),
                "responseKind": gvk,
                "scope": if r.kind.namespaced() { "Namespaced" } else { "Cluster" },
                "singularResource": r.singular,
                "verbs": r.verbs,
            });
            if !r.short_names.is_empty() {
                v["shortNames"] = json!(r.short_names);
            }
            if !r.categories.is_empty() {
                v["categories"] = json!(r.categories);
            }
            if r.status {
                v["subresources"] = json!([
                    {"subresource": "status", "responseKind": gvk, "verbs": STATUS_VERBS}
                ]);
            }
            v
        })
        .collect()
}

fn resource_list(group: &str, version: &str) -> Value {
    let mut list = vec![];
    if group == "subresources.kubevirt.io" {
        for (plural, sub) in SUBRESOURCES {
            list.push(json!({
                "name": format!("{plural}/{sub}"), "singularName": "", "namespaced": true,
                "kind": "", "verbs": if matches!(sub, "guestosinfo" | "userlist" | "filesystemlist" | "vnc" | "console") { json!(["get"]) } else { json!(["update"]) },
            }));
        }
    }
    for r in resources_of(group) {
        let mut v = json!({
            "name": r.kind.plural(),
            "singularName": r.singular,
            "namespaced": r.kind.namespaced(),
            "kind": r.kind.name(),
            "verbs": r.verbs,
        });
        if !r.short_names.is_empty() {
            v["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            v["categories"] = json!(r.categories);
        }
        list.push(v);
        if r.status {
            list.push(json!({
                "name": format!("{}/status", r.kind.plural()), "singularName": "",
                "namespaced": r.kind.namespaced(), "kind": r.kind.name(), "verbs": STATUS_VERBS,
            }));
        }
    }
    let gv = if group.is_empty() {
        "v1".to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list})
}

/// `GET /api`
pub async fn core(headers: HeaderMap) -> Response {
    if wants_aggregated(&headers) {
        return aggregated(vec![aggregated_group("")]);
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string();
    Json(json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
    }))
    .into_response()
}

/// `GET /api/{version}`
pub async fn core_version(Path(version): Path<String>) -> ApiResult<Json<Value>> {
    if version != "v1" {
        return Err(ApiError::not_found(format!(
            "version {version} is not served"
        )));
    }
    Ok(Json(resource_list("", "v1")))
}

fn group_entry(name: &str) -> Value {
    let versions: Vec<Value> = versions_of(name)
        .into_iter()
        .map(|version| json!({"groupVersion": format!("{name}/{version}"), "version": version}))
        .collect();
    json!({"name": name, "preferredVersion": versions[0], "versions": versions})
}

/// `GET /apis`
pub async fn groups(headers: HeaderMap) -> Response {
    let named = GROUPS.iter().filter(|g| !g.is_empty());
    if wants_aggregated(&headers) {
        let mut items: Vec<Value> = named.map(|g| aggregated_group(g)).collect();
        items.push(json!({
            "metadata": {"name": "subresources.kubevirt.io", "creationTimestamp": null},
            "versions": [{"version": "v1", "resources": [], "freshness": "Current"}],
        }));
        return aggregated(items);
    }
    let mut groups: Vec<Value> = named.map(|g| group_entry(g)).collect();
    groups.push(group_entry("subresources.kubevirt.io"));
    Json(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})).into_response()
}

/// `GET /apis/{group}/{version}`
pub async fn group_version(
    Path((group, version)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let known = GROUPS.contains(&group.as_str()) || group == "subresources.kubevirt.io";
    if group.is_empty() || !known || !versions_of(&group).contains(&version.as_str()) {
        return Err(ApiError::not_found(format!(
            "the server could not find the requested resource ({group}/{version})"
        )));
    }
    Ok(Json(resource_list(&group, &version)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubevirt_group_lists_kinds_with_short_names_and_status() {
        let l = resource_list("kubevirt.io", "v1");
        let names: Vec<&str> = l["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "virtualmachines",
                "virtualmachines/status",
                "virtualmachineinstances",
                "virtualmachineinstances/status",
                "virtualmachineinstancemigrations",
                "virtualmachineinstancemigrations/status"
            ]
        );
        assert_eq!(l["resources"][0]["shortNames"], json!(["vm", "vms"]));
        assert_eq!(l["resources"][2]["shortNames"], json!(["vmi", "vmis"]));
        assert_eq!(l["resources"][0]["categories"], json!(["all"]));
        let core = resource_list("", "v1");
        assert_eq!(core["groupVersion"], "v1");
        assert_eq!(core["resources"][0]["shortNames"], json!(["ns"]));
        assert_eq!(core["resources"][0]["namespaced"], false);
    }

    #[test]
    fn aggregated_resources_carry_response_kinds() {
        let g = aggregated_group("kubevirt.io");
        for r in g["versions"][0]["resources"].as_array().unwrap() {
            assert_eq!(r["responseKind"]["group"], "kubevirt.io");
            assert_eq!(r["scope"], "Namespaced");
            assert_eq!(r["subresources"][0]["responseKind"], r["responseKind"]);
        }
        let e = aggregated_group("edgevirt.io");
        assert_eq!(e["versions"][0]["resources"][0]["scope"], "Cluster");
    }
}
