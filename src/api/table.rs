//! Server-side printing: `meta.k8s.io/v1` `Table` answers for clients that ask for them
//! (`kubectl get` does, with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`). The
//! columns are the kinds' printer columns, taken from the same CRD definitions `edgevirt
//! crds` prints (KubeVirt's: VM NAME AGE STATUS READY; VMI NAME AGE PHASE IP NODENAME READY,
//! and LIVE-MIGRATABLE PAUSED in `-o wide`), evaluated with the small JSONPath subset those
//! columns use. Dates become ages the way the Kubernetes API server renders them.

use axum::http::{HeaderMap, header};
use serde_json::{Value, json};

use crate::types::{Kind, age};

/// What a row carries besides its cells (`includeObject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Include {
    None,
    Metadata,
    Object,
}

/// Does the client want a Table? Only when it lists `as=Table` among what it accepts.
pub fn wanted(headers: &HeaderMap, include_object: Option<&str>) -> Option<Include> {
    let accept = headers.get(header::ACCEPT)?.to_str().ok()?;
    let table = accept.split(',').any(|part| {
        let params: Vec<&str> = part.split(';').map(str::trim).collect();
        params.contains(&"as=Table") && params.contains(&"g=meta.k8s.io")
    });
    let include = match include_object {
        Some("None") => Include::None,
        Some("Object") => Include::Object,
        _ => Include::Metadata,
    };
    table.then_some(include)
}

/// The Content-Type of a Table answer.
pub const CONTENT_TYPE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

struct Column {
    name: String,
    /// A cell that is not one field (an event's `kind/name`), else from `json_path`.
    compute: Option<fn(&Value) -> Value>,
    type_: String,
    json_path: String,
    priority: i32,
    description: String,
}

/// The columns of a kind, computed once (deriving a CRD runs schemars).
fn columns(kind: Kind) -> &'static [Column] {
    static CACHE: std::sync::OnceLock<Vec<(Kind, Vec<Column>)>> = std::sync::OnceLock::new();
    let all = CACHE.get_or_init(|| {
        Kind::ALL
            .into_iter()
            .map(|k| (k, make_columns(k)))
            .collect()
    });
    all.iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, c)| c.as_slice())
        .unwrap_or(&[])
}

fn make_columns(kind: Kind) -> Vec<Column> {
    let crd = match kind {
        Kind::Namespace => {
            return vec![
                col("Status", "string", ".status.phase", 0),
                col("Age", "date", ".metadata.creationTimestamp", 0),
            ];
        }
        Kind::Secret => {
            return vec![
                col("Type", "string", ".type", 0),
                col("Age", "date", ".metadata.creationTimestamp", 0),
            ];
        }
        Kind::StorageClass => {
            return vec![
                col("Provisioner", "string", ".provisioner", 0),
                col("ReclaimPolicy", "string", ".reclaimPolicy", 0),
                col("VolumeBindingMode", "string", ".volumeBindingMode", 0),
                col(
                    "AllowVolumeExpansion",
                    "boolean",
                    ".allowVolumeExpansion",
                    0,
                ),
                col("Age", "date", ".metadata.creationTimestamp", 0),
            ];
        }
        Kind::ControllerRevision => {
            return vec![
                col(
                    "Controller",
                    "string",
                    ".metadata.ownerReferences[0].name",
                    0,
                ),
                col("Revision", "integer", ".revision", 0),
                col("Age", "date", ".metadata.creationTimestamp", 0),
            ];
        }
        // As `kubectl get events` prints them on a cluster: the name only in `-o wide`.
        Kind::Event => {
            let computed = |name: &str, f: fn(&Value) -> Value| Column {
                compute: Some(f),
                ..col(name, "string", "", 0)
            };
            return vec![
                computed("Last Seen", |e| {
                    let at = e["lastTimestamp"].as_str().or(e["eventTime"].as_str());
                    at.map_or(Value::Null, |t| json!(age(t)))
                }),
                col("Type", "string", ".type", 0),
                col("Reason", "string", ".reason", 0),
                computed("Object", |e| {
                    let o = &e["involvedObject"];
                    let kind = o["kind"].as_str().unwrap_or("").to_ascii_lowercase();
                    json!(format!("{kind}/{}", o["name"].as_str().unwrap_or("")))
                }),
                col("Subobject", "string", ".involvedObject.fieldPath", 1),
                Column {
                    priority: 1,
                    ..computed("Source", |e| {
                        let s = &e["source"];
                        let parts = [&s["component"], &s["host"]];
                        let parts: Vec<&str> = parts.iter().filter_map(|p| p.as_str()).collect();
                        json!(parts.join(", "))
                    })
                },
                col("Message", "string", ".message", 0),
                col("First Seen", "date", ".firstTimestamp", 1),
                col("Count", "integer", ".count", 1),
                col("Name", "string", ".metadata.name", 1),
            ];
        }
        // Multus defines none (kubectl shows the name and age); `-o wide` adds what the
        // config says.
        Kind::NetworkAttachmentDefinition => {
            fn bridge(o: &Value) -> Option<crate::types::cni::Bridge> {
                crate::types::cni::parse_config(o["spec"]["config"].as_str().unwrap_or("")).ok()
            }
            return vec![
                col("Age", "date", ".metadata.creationTimestamp", 0),
                Column {
                    compute: Some(|o| bridge(o).map_or(Value::Null, |b| json!(b.bridge))),
                    ..col("Bridge", "string", "", 1)
                },
                Column {
                    compute: Some(|o| {
                        bridge(o)
                            .and_then(|b| b.vlan)
                            .map_or(Value::Null, |v| json!(v))
                    }),
                    ..col("VLAN", "integer", "", 1)
                },
            ];
        }
        // KubeVirt defines no columns for these (nor edgevirt a data count for ConfigMaps):
        // kubectl shows the name and age.
        Kind::ConfigMap
        | Kind::VirtualMachineInstancetype
        | Kind::VirtualMachineClusterInstancetype
        | Kind::VirtualMachinePreference
        | Kind::VirtualMachineClusterPreference => {
            return vec![col("Age", "date", ".metadata.creationTimestamp", 0)];
        }
        k => k.crd().expect("a kind with a CRD"),
    };
    crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| Column {
            compute: None,
            name: c.name.clone(),
            type_: c.type_.clone(),
            json_path: c.json_path.clone(),
            priority: c.priority.unwrap_or(0),
            description: c.description.clone().unwrap_or_default(),
        })
        .collect()
}

fn col(name: &str, type_: &str, path: &str, priority: i32) -> Column {
    Column {
        compute: None,
        name: name.into(),
        type_: type_.into(),
        json_path: path.into(),
        priority,
        description: String::new(),
    }
}

/// Evaluate the JSONPath subset printer columns use: `.a.b`, `[N]`, `[?(@.k=='v')]`.
pub fn json_path<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = v;
    let mut rest = path.strip_prefix('.').unwrap_or(path);
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = &r[..end];
            rest = &r[end + 1..];
            cur = if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')'))
            {
                let (key, want) = filter.split_once("==")?;
                let want = want.trim().trim_matches(|c| c == '\'' || c == '"');
                cur.as_array()?
                    .iter()
                    .find(|e| e[key.trim()].as_str() == Some(want))?
            } else {
                cur.get(inner.parse::<usize>().ok()?)?
            };
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            let key = &rest[..end];
            cur = cur.get(key)?;
            rest = &rest[end..];
        }
        rest = rest.strip_prefix('.').unwrap_or(rest);
    }
    Some(cur)
}

fn cell(c: &Column, obj: &Value) -> Value {
    if let Some(f) = c.compute {
        return f(obj);
    }
    match json_path(obj, &c.json_path) {
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(s)) if c.type_ == "date" => json!(age(s)),
        Some(Value::String(s)) => json!(s),
        Some(v) if c.type_ == "string" => json!(v.to_string()),
        Some(v) => v.clone(),
    }
}

/// Does the name come first, as for every kind but events (whose name is long and
/// generated: `kubectl get events` shows it only in `-o wide`)?
fn name_first(kind: Kind) -> bool {
    kind != Kind::Event
}

fn row(kind: Kind, cols: &[Column], obj: &Value, include: Include) -> Value {
    let mut cells = Vec::with_capacity(cols.len() + 1);
    if name_first(kind) {
        cells.push(obj["metadata"]["name"].clone());
    }
    cells.extend(cols.iter().map(|c| cell(c, obj)));
    let mut r = json!({ "cells": cells });
    match include {
        Include::None => {}
        Include::Object => r["object"] = obj.clone(),
        Include::Metadata => {
            r["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            })
        }
    }
    r
}

/// A Table of `objs`; `with_columns: false` leaves out the column definitions (watch events
/// after the first, as the Kubernetes API server does).
pub fn table(
    kind: Kind,
    objs: &[Value],
    metadata: Value,
    include: Include,
    with_columns: bool,
) -> Value {
    let cols = columns(kind);
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "rows": objs.iter().map(|o| row(kind, cols, o, include)).collect::<Vec<_>>(),
    });
    if with_columns {
        let mut defs = Vec::with_capacity(cols.len() + 1);
        if name_first(kind) {
            defs.push(json!({
                "name": "Name", "type": "string", "format": "name", "priority": 0,
                "description": "Name must be unique within a namespace.",
            }));
        }
        defs.extend(cols.iter().map(|c| {
            json!({
                "name": c.name, "type": c.type_, "format": "", "priority": c.priority,
                "description": c.description,
            })
        }));
        t["columnDefinitions"] = json!(defs);
    } else {
        t["columnDefinitions"] = Value::Null;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi() -> Value {
        json!({
            // Three days old: the age reads the same whatever second the test runs in.
            "metadata": {"name": "web", "namespace": "default",
                "creationTimestamp": (chrono::Utc::now() - chrono::Duration::days(3))
                    .format("%Y-%m-%dT%H:%M:%SZ").to_string()},
            "status": {"phase": "Running", "nodeName": "n1",
                "interfaces": [{"ipAddress": "10.0.0.5"}],
                "conditions": [{"type": "Paused", "status": "False"},
                               {"type": "Ready", "status": "True"},
                               {"type": "LiveMigratable", "status": "False"}]},
        })
    }

    /// Every kind has columns (a kind without a CRD needs its own).
    #[test]
    fn every_kind_has_columns() {
        for k in Kind::ALL {
            assert!(!columns(k).is_empty(), "{k:?}");
        }
    }

    #[test]
    fn json_path_subset() {
        let v = vmi();
        assert_eq!(
            json_path(&v, ".status.interfaces[0].ipAddress"),
            Some(&json!("10.0.0.5"))
        );
        assert_eq!(
            json_path(&v, ".status.conditions[?(@.type=='Ready')].status"),
            Some(&json!("True"))
        );
        assert_eq!(
            json_path(&v, ".status.conditions[?(@.type=='Nope')].status"),
            None
        );
        assert_eq!(json_path(&v, ".status.interfaces[3].ipAddress"), None);
    }

    /// A table's columns: (name, priority).
    fn column_names(t: &Value) -> Vec<(&str, i64)> {
        t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["name"].as_str().unwrap(), c["priority"].as_i64().unwrap()))
            .collect()
    }

    #[test]
    fn vmi_table_has_kubevirt_columns_and_wide_ones_at_priority_1() {
        let t = table(
            Kind::VirtualMachineInstance,
            &[vmi()],
            json!({}),
            Include::Metadata,
            true,
        );
        let names = column_names(&t);
        assert_eq!(
            names,
            [
                ("Name", 0),
                ("Age", 0),
                ("Phase", 0),
                ("IP", 0),
                ("NodeName", 0),
                ("Ready", 0),
                ("Live-Migratable", 1),
                ("Paused", 1)
            ]
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "web", "3d", "Running", "10.0.0.5", "n1", "True", "False", "False"
            ])
        );
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["rows"][0]["object"]["metadata"]["namespace"], "default");
    }

    /// Events print as on a cluster: no name first, the object as `kind/name`, the source
    /// and the name only in `-o wide`.
    #[test]
    fn event_table_is_kubectls() {
        let ev = json!({"metadata": {"name": "web.0123"},
            "involvedObject": {"kind": "VirtualMachineInstance", "name": "web"},
            "type": "Normal", "reason": "Started", "message": "VirtualMachineInstance started.",
            "source": {"component": "edgevirt-agent", "host": "n1"}, "count": 2,
            "lastTimestamp": (chrono::Utc::now() - chrono::Duration::minutes(20))
                .format("%Y-%m-%dT%H:%M:%SZ").to_string()});
        let t = table(Kind::Event, &[ev], json!({}), Include::None, true);
        let defs = column_names(&t);
        assert_eq!(
            defs[..5],
            [
                ("Last Seen", 0),
                ("Type", 0),
                ("Reason", 0),
                ("Object", 0),
                ("Subobject", 1)
            ]
        );
        assert_eq!(defs.last(), Some(&("Name", 1)));
        let cells = &t["rows"][0]["cells"];
        // 20m0s to 20m59s all read 20m: the test does not race the clock.
        assert_eq!(cells[0], "20m");
        assert_eq!(cells[3], "virtualmachineinstance/web");
        assert_eq!(cells[5], "edgevirt-agent, n1");
        assert_eq!(cells[6], "VirtualMachineInstance started.");
        assert_eq!(cells[8], 2);
    }

    #[test]
    fn asks_for_a_table_only_when_accepting_one() {
        let mut h = HeaderMap::new();
        assert_eq!(wanted(&h, None), None);
        h.insert(header::ACCEPT, "application/json".parse().unwrap());
        assert_eq!(wanted(&h, None), None);
        h.insert(
            header::ACCEPT,
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
                .parse()
                .unwrap(),
        );
        assert_eq!(wanted(&h, None), Some(Include::Metadata));
        assert_eq!(wanted(&h, Some("None")), Some(Include::None));
    }
}
