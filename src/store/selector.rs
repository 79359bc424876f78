//! Kubernetes label and field selectors, parsed from query strings and matched against
//! stored JSON objects.

use serde_json::Value;

use super::{Error, Result};

#[derive(Clone, Debug, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector(Vec<Req>);

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let bad = || Error::Invalid(format!("invalid label selector term {part:?}"));
            let req = if let Some((k, v)) = part.split_once("!=") {
                Req::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some(k) = part.strip_prefix('!') {
                Req::NotExists(k.trim().into())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set(rest).ok_or_else(bad)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Req::In(k.trim().into(), set(rest).ok_or_else(bad)?)
            } else if part.contains(' ') || part.contains('(') {
                return Err(bad());
            } else {
                Req::Exists(part.into())
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector` over the fields edgevirt indexes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

const FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "status.phase",
    "status.nodeName",
];

impl FieldSelector {
    pub fn parse(s: &str) -> Result<FieldSelector> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (k, true, v)
            } else {
                return Err(Error::Invalid(format!(
                    "invalid field selector term {part:?}"
                )));
            };
            if !FIELDS.contains(&k.trim()) {
                return Err(Error::Invalid(format!(
                    "field selector {:?} is not supported; use one of {}",
                    k.trim(),
                    FIELDS.join(", ")
                )));
            }
            out.push((k.trim().to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    /// Select objects bound to one node.
    pub fn node(name: &str) -> FieldSelector {
        FieldSelector(vec![("status.nodeName".into(), true, name.into())])
    }

    /// The node an equality term pins, which the store can answer from its index.
    pub fn node_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, eq, _)| k == "status.nodeName" && *eq)
            .map(|(_, _, v)| v.as_str())
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            let mut cur = obj;
            for seg in k.split('.') {
                cur = &cur[seg];
            }
            (cur.as_str().unwrap_or("") == v) == *eq
        })
    }
}

fn set(rest: &str) -> Option<Vec<String>> {
    let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|s| s.trim().to_string()).collect())
}

/// Split on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier=front", true),
            ("app!=web", false),
            ("app in (db, web)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("missing", false),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("a in b").is_err());
    }

    #[test]
    fn field_selectors() {
        let o =
            json!({"metadata": {"name": "a"}, "status": {"phase": "Running", "nodeName": "n1"}});
        assert!(
            FieldSelector::parse("status.phase=Running")
                .unwrap()
                .matches(&o)
        );
        assert!(
            !FieldSelector::parse("status.nodeName!=n1")
                .unwrap()
                .matches(&o)
        );
        assert_eq!(
            FieldSelector::parse("status.nodeName=n1")
                .unwrap()
                .node_name(),
            Some("n1")
        );
        assert!(FieldSelector::parse("spec.foo=1").is_err());
    }
}
