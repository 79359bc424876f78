//! Where KubeVirt's published schema has which field, so that a field edgevirt does not
//! implement is called "not supported yet" when KubeVirt has it at that place, and "unknown"
//! only when KubeVirt does not (a typo, or a field from somewhere else).
//!
//! `kubevirt-fields.txt` is derived from KubeVirt's OpenAPI document
//! (`tests/fixtures/kubevirt/swagger.json`, at the commit its README names): one line per
//! definition reachable from the VM, VMI, migration, instancetype and preference specs, the definition's name and then
//! its fields, `field=definition` where the field holds an object of another definition (or a
//! list or map of them). The test `the_field_file_matches_kubevirts_schema` keeps it in step
//! and rewrites it when run with `EDGEVIRT_WRITE_KUBEVIRT_FIELDS=1`.

use std::collections::HashMap;
use std::sync::OnceLock;

const FIELDS: &str = include_str!("kubevirt-fields.txt");

/// A definition's fields, each with the definition of its value when that is an object.
type Fields = HashMap<&'static str, Option<&'static str>>;

fn definitions() -> &'static HashMap<&'static str, Fields> {
    static DEFS: OnceLock<HashMap<&'static str, Fields>> = OnceLock::new();
    DEFS.get_or_init(|| {
        FIELDS
            .lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                let name = words.next()?;
                let fields = words
                    .map(|w| match w.split_once('=') {
                        Some((field, def)) => (field, Some(def)),
                        None => (w, None),
                    })
                    .collect();
                Some((name, fields))
            })
            .collect()
    })
}

/// The schema definition of the spec of a kind, where its fields start.
pub fn spec_definition(kind: &str) -> Option<&'static str> {
    match kind {
        "VirtualMachine" => Some("v1.VirtualMachineSpec"),
        "VirtualMachineInstance" => Some("v1.VirtualMachineInstanceSpec"),
        "VirtualMachineInstanceMigration" => Some("v1.VirtualMachineInstanceMigrationSpec"),
        "VirtualMachineInstancetype" | "VirtualMachineClusterInstancetype" => {
            Some("v1beta1.VirtualMachineInstancetypeSpec")
        }
        "VirtualMachinePreference" | "VirtualMachineClusterPreference" => {
            Some("v1beta1.VirtualMachinePreferenceSpec")
        }
        "DataVolume" => Some("v1beta1.DataVolumeSpec"),
        _ => None,
    }
}

/// Whether KubeVirt's schema has the field at `path` (dot-separated, list positions as
/// numbers, as serde reports them) inside an object of definition `root`.
pub fn has_field(root: &str, path: &str) -> bool {
    let defs = definitions();
    let mut def = root;
    let mut fields = path
        .split('.')
        .filter(|s| !s.is_empty() && !s.bytes().all(|b| b.is_ascii_digit()))
        .peekable();
    while let Some(field) = fields.next() {
        let Some(found) = defs.get(def).and_then(|d| d.get(field)) else {
            return false;
        };
        if fields.peek().is_none() {
            return true;
        }
        match found {
            Some(next) => def = next,
            // A field whose value is not an object of a known definition has nothing below.
            None => return false,
        }
    }
    false
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::BTreeMap;

    /// The repository's copy of KubeVirt's OpenAPI document (the test kit checks it is the
    /// project's reference copy, where that is laid beside the repository).
    const SWAGGER: &str = "tests/fixtures/kubevirt/swagger.json";

    /// KubeVirt's OpenAPI document, from the repository's copy.
    pub(crate) fn swagger() -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(SWAGGER);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap()
    }

    /// The definition a property's value is an object of: itself, as list items or as map
    /// values.
    fn value_definition(prop: &Value) -> Option<String> {
        [
            &prop["$ref"],
            &prop["items"]["$ref"],
            &prop["additionalProperties"]["$ref"],
        ]
        .into_iter()
        .find_map(|r| r.as_str())
        .map(|r| r.rsplit('/').next().unwrap_or(r).to_string())
    }

    /// A definition as found: the kind whose spec reaches it first, the path there (list
    /// positions as `0`), and its fields with the definitions of their values.
    type Found = (String, String, BTreeMap<String, Option<String>>);

    /// Every definition reachable from the three specs.
    pub(crate) fn reachable(swagger: &Value) -> BTreeMap<String, Found> {
        let defs = &swagger["definitions"];
        let mut out = BTreeMap::new();
        let mut todo: std::collections::VecDeque<(String, String, String)> = [
            "VirtualMachine",
            "VirtualMachineInstance",
            "VirtualMachineInstanceMigration",
            "VirtualMachineInstancetype",
            "VirtualMachinePreference",
        ]
        .into_iter()
        .map(|k| {
            (
                spec_definition(k).unwrap().to_string(),
                k.to_string(),
                String::new(),
            )
        })
        .collect();
        while let Some((name, kind, at)) = todo.pop_front() {
            if out.contains_key(&name) {
                continue;
            }
            let mut fields = BTreeMap::new();
            if let Some(props) = defs[&name]["properties"].as_object() {
                for (field, prop) in props {
                    let def = value_definition(prop);
                    if let Some(d) = &def {
                        let list = if prop["type"] == "array" { ".0" } else { "" };
                        let below = if at.is_empty() {
                            format!("{field}{list}")
                        } else {
                            format!("{at}.{field}{list}")
                        };
                        todo.push_back((d.clone(), kind.clone(), below));
                    }
                    fields.insert(field.clone(), def);
                }
            }
            out.insert(name, (kind, at, fields));
        }
        out
    }

    fn field_file(swagger: &Value) -> String {
        let mut text = String::new();
        for (name, (_, _, fields)) in reachable(swagger) {
            text.push_str(&name);
            for (field, def) in fields {
                text.push(' ');
                text.push_str(&field);
                if let Some(d) = def {
                    text.push('=');
                    text.push_str(&d);
                }
            }
            text.push('\n');
        }
        text
    }

    #[test]
    fn the_field_file_matches_kubevirts_schema() {
        let want = field_file(&swagger());
        if std::env::var_os("EDGEVIRT_WRITE_KUBEVIRT_FIELDS").is_some() {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("src/types/kubevirt-fields.txt");
            std::fs::write(&path, &want).unwrap();
        }
        assert!(
            FIELDS == want,
            "src/types/kubevirt-fields.txt is not what tests/fixtures/kubevirt/swagger.json gives; \
             run this test with EDGEVIRT_WRITE_KUBEVIRT_FIELDS=1 to rewrite it"
        );
    }

    #[test]
    fn fields_are_found_where_kubevirt_has_them() {
        let vm = spec_definition("VirtualMachine").unwrap();
        assert!(has_field(vm, "template.spec.domain.devices.rng"));
        assert!(has_field(
            vm,
            "template.spec.domain.devices.disks.0.disk.bus"
        ));
        assert!(has_field(vm, "dataVolumeTemplates"));
        // Real KubeVirt fields, but not at these places.
        assert!(!has_field(vm, "template.spec.rng"));
        assert!(!has_field(vm, "template.spec.domain.devices.disks.0.bus"));
        assert!(!has_field(vm, "template.spec.domain.bogus"));
        assert!(!has_field(vm, "runStrategy.x"));
        let vmi = spec_definition("VirtualMachineInstance").unwrap();
        assert!(has_field(vmi, "domain.ioThreads"));
        assert!(!has_field(vmi, "template"));
    }

    /// A spec with `null` at `path` (list positions as one-item lists).
    fn spec_with(path: &str) -> Value {
        fn put(at: &mut Value, segs: &[&str]) {
            let Some((first, rest)) = segs.split_first() else {
                return;
            };
            let next = if rest.is_empty() {
                Value::Null
            } else if rest[0].bytes().all(|b| b.is_ascii_digit()) {
                serde_json::json!([{}])
            } else {
                serde_json::json!({})
            };
            if first.bytes().all(|b| b.is_ascii_digit()) {
                put(&mut at[0], rest);
                return;
            }
            if at.get(*first).is_none() {
                at[*first] = next;
            }
            put(&mut at[*first], rest);
        }
        let mut v = serde_json::json!({});
        let segs: Vec<&str> = path.split('.').collect();
        put(&mut v, &segs);
        v
    }

    /// Whether edgevirt refuses KubeVirt's field at `path` of `kind`'s spec as "not
    /// supported yet" (set to `null`: a field it takes decodes, or fails on its value only).
    fn refused(kind: &str, path: &str) -> bool {
        use crate::types::kubevirt::{
            VirtualMachineInstanceMigrationSpec, VirtualMachineInstanceSpec, VirtualMachineSpec,
        };
        let spec = spec_with(path);
        let errors = match kind {
            "VirtualMachine" => crate::types::decode::<VirtualMachineSpec>(kind, spec).err(),
            "VirtualMachineInstance" => {
                crate::types::decode::<VirtualMachineInstanceSpec>(kind, spec).err()
            }
            _ => crate::types::decode::<VirtualMachineInstanceMigrationSpec>(kind, spec).err(),
        };
        let want = format!("spec.{path}");
        errors
            .iter()
            .flat_map(|e| &e.errors)
            .any(|e| e.field == want && e.reason == "FieldValueForbidden")
    }

    /// The parts of KubeVirt's schema `docs/kubevirt-fields.md` decides on, field by field.
    const TABLE_PARTS: [&str; 8] = [
        "v1.VirtualMachineSpec",
        "v1.VirtualMachineInstanceSpec",
        "v1.DomainSpec",
        "v1.Devices",
        "v1.Disk",
        "v1.Interface",
        "v1.Network",
        "v1.Volume",
    ];

    /// Decisions that mean edgevirt takes the field; the others mean it refuses it by name.
    const TAKEN: [&str; 3] = ["supported", "accepted", "limited"];
    const REFUSED: [&str; 2] = ["not supported yet", "refused"];

    /// The field table in `docs/` covers every field of those parts, and says "supported" or
    /// "accepted" exactly where edgevirt's types take the field. With
    /// `EDGEVIRT_WRITE_FIELD_TABLE=1` it rewrites the table's rows: decisions from the code,
    /// reasons kept where the decision did not change (new ones must then be written).
    #[test]
    fn the_field_table_matches_the_code() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/kubevirt-fields.md");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut rows: BTreeMap<(String, String), (String, String)> = BTreeMap::new();
        for line in text.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            if cells.len() == 6 && cells[1].starts_with("v1.") {
                let field = cells[2].trim_matches('`').to_string();
                rows.insert(
                    (cells[1].to_string(), field),
                    (cells[3].to_string(), cells[4].to_string()),
                );
            }
        }
        let found = reachable(&swagger());
        let mut problems = Vec::new();
        let mut table = String::new();
        let mut seen = std::collections::BTreeSet::new();
        for part in TABLE_PARTS {
            let (kind, at, fields) = &found[part];
            table.push_str(&format!(
                "\n### {part}\n\n| definition | field | decision | reason |\n|---|---|---|---|\n"
            ));
            for field in fields.keys() {
                let p = if at.is_empty() {
                    field.clone()
                } else {
                    format!("{at}.{field}")
                };
                let taken = !refused(kind, &p);
                let key = (part.to_string(), field.clone());
                seen.insert(key.clone());
                let (decision, reason) = rows.get(&key).cloned().unwrap_or_default();
                let ok = if taken {
                    TAKEN.contains(&decision.as_str())
                } else {
                    REFUSED.contains(&decision.as_str())
                };
                if !ok {
                    problems.push(format!(
                        "{part} {field}: the table says {decision:?}, edgevirt {}",
                        if taken { "takes it" } else { "refuses it" }
                    ));
                }
                if reason.is_empty() {
                    problems.push(format!("{part} {field}: no reason"));
                }
                let decision = match (ok, taken) {
                    (true, _) => decision,
                    (false, true) => "supported".into(),
                    (false, false) => "not supported yet".into(),
                };
                table.push_str(&format!("| {part} | `{field}` | {decision} | {reason} |\n"));
            }
        }
        for (part, field) in rows.keys() {
            if !seen.contains(&(part.clone(), field.clone())) {
                problems.push(format!(
                    "{part} {field}: a row for a field KubeVirt does not have"
                ));
            }
        }
        if std::env::var_os("EDGEVIRT_WRITE_FIELD_TABLE").is_some() {
            let head = text.split("\n### ").next().unwrap_or("").trim_end();
            std::fs::write(&path, format!("{head}\n{table}")).unwrap();
        }
        assert!(
            problems.is_empty(),
            "docs/kubevirt-fields.md is out of step with the code ({} problems):\n{}",
            problems.len(),
            problems.join("\n")
        );
    }

    /// Every field of KubeVirt's VM, VMI and migration specs, set where KubeVirt has it:
    /// edgevirt either takes it (or refuses its value) or calls it "not supported yet",
    /// never "unknown".
    #[test]
    fn no_kubevirt_field_is_called_unknown() {
        use crate::types::kubevirt::{
            VirtualMachineInstanceMigrationSpec, VirtualMachineInstanceSpec, VirtualMachineSpec,
        };
        let (mut checked, mut unsupported) = (0, 0);
        let mut wrong = Vec::new();
        for (def, (kind, at, fields)) in reachable(&swagger()) {
            for field in fields.keys() {
                let path = if at.is_empty() {
                    field.clone()
                } else {
                    format!("{at}.{field}")
                };
                let spec = spec_with(&path);
                let errors = match kind.as_str() {
                    "VirtualMachine" => {
                        crate::types::decode::<VirtualMachineSpec>(&kind, spec).err()
                    }
                    "VirtualMachineInstance" => {
                        crate::types::decode::<VirtualMachineInstanceSpec>(&kind, spec).err()
                    }
                    "VirtualMachineInstancetype" => crate::types::decode::<
                        crate::types::instancetype::InstancetypeSpec,
                    >(&kind, spec)
                    .err(),
                    "VirtualMachinePreference" => crate::types::decode::<
                        crate::types::instancetype::PreferenceSpec,
                    >(&kind, spec)
                    .err(),
                    _ => crate::types::decode::<VirtualMachineInstanceMigrationSpec>(&kind, spec)
                        .err(),
                };
                checked += 1;
                let want = format!("spec.{path}");
                for e in errors.iter().flat_map(|e| &e.errors) {
                    if e.field == want && e.reason == "FieldValueForbidden" {
                        unsupported += 1;
                    }
                    if e.reason == "FieldValueInvalid" {
                        wrong.push(format!("{kind} {want} ({def}): {}", e.field));
                    }
                }
            }
        }
        eprintln!("{checked} KubeVirt fields set; {unsupported} refused as not supported yet");
        assert!(checked > 500, "only {checked} fields found in the schema");
        assert!(unsupported > 0);
        assert!(wrong.is_empty(), "called unknown:\n{}", wrong.join("\n"));
    }
}
