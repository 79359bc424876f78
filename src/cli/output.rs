//! Printing objects as tables (like `kubectl get`), JSON or YAML.

use anyhow::Context as _;
use kube::Resource;
use serde_json::Value;

use crate::types::Typed;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Wide,
    Json,
    Yaml,
}

pub use crate::types::age;

pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let n = cells.len();
        for (i, c) in cells.into_iter().enumerate() {
            out.push_str(c);
            if i + 1 < n {
                out.push_str(&" ".repeat(widths[i] - c.len() + 3));
            }
        }
        out.push('\n');
    };
    line(headers.to_vec(), &mut out);
    for r in rows {
        line(r.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

pub fn print_value(v: &Value, f: Format) -> anyhow::Result<()> {
    match f {
        Format::Yaml => print!("{}", serde_yaml_ng::to_string(v)?),
        _ => println!("{}", serde_json::to_string_pretty(v)?),
    }
    Ok(())
}

pub fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or("")
}

/// An object the API answered with, as its kind. Fields this release does not know (a newer
/// server's) are ignored; a field of the wrong shape is an error naming it.
pub fn decode<T: Typed>(v: Value) -> anyhow::Result<T> {
    Ok(T::from_value(v)?)
}

/// The items of a list the API answered with, as their kind. One that does not decode (a
/// newer server's, in a shape this release cannot read) is named on stderr and left out, as
/// the store's typed lists do, so one odd object does not hide the others.
pub fn items<T: Typed>(list: &Value) -> anyhow::Result<Vec<T>> {
    let items: Vec<Value> = match list.get("items") {
        None | Some(Value::Null) => vec![],
        Some(items) => serde_json::from_value(items.clone()).context("the list has no items")?,
    };
    Ok(items
        .into_iter()
        .filter_map(|v| {
            let name = v.pointer("/metadata/name").cloned().unwrap_or_default();
            decode(v)
                .inspect_err(|e| eprintln!("warning: leaving out {name}: {e:#}"))
                .ok()
        })
        .collect())
}

/// An object's age, as kubectl's AGE column (`<unknown>` without a creation time).
pub fn created_age<K: Resource>(o: &K) -> String {
    let ts = o
        .meta()
        .creation_timestamp
        .as_ref()
        .and_then(|t| serde_json::to_value(t).ok())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    age(&ts)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::Meta;
    use crate::types::kubevirt::VirtualMachineInstance;

    #[test]
    fn list_items_decode_one_by_one() {
        let list = json!({"items": [
            {"metadata": {"name": "a"}, "spec": {"domain": {}, "newerField": 1}},
            {"metadata": {"name": "b"}, "spec": {"domain": {}}, "status": {"phase": 7}},
            {"metadata": {"name": "c"}, "spec": {"domain": {}}},
        ]});
        let got: Vec<VirtualMachineInstance> = items(&list).unwrap();
        let names: Vec<&str> = got.iter().map(|i| i.name()).collect();
        assert_eq!(names, ["a", "c"]);
        assert!(
            items::<VirtualMachineInstance>(&json!({}))
                .unwrap()
                .is_empty()
        );
        assert!(items::<VirtualMachineInstance>(&json!({"items": 3})).is_err());
    }
}
