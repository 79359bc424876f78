//! A VM's history in words: what each recorded change of the VM or its instances did
//! (created, deleted, which spec fields went from what to what, status and node moves),
//! when, and who made it.

use serde_json::Value;

use crate::store::events::Change;
use crate::types::Kind;

/// One line of the history table.
pub struct HistoryRow {
    pub rv: u64,
    pub at: String,
    pub who: String,
    pub object: &'static str,
    pub what: String,
}

/// At most this many phrases per change; the rest is counted.
const MAX_PHRASES: usize = 4;

/// Rows for `changes` of one kind, newest first as the store gives them. A change is
/// compared with the previous change of the same object (uid); the oldest one in the window
/// has none to compare with.
pub fn rows(kind: Kind, changes: &[Change]) -> Vec<HistoryRow> {
    let object = if kind == Kind::VirtualMachine {
        "VM"
    } else {
        "instance"
    };
    changes
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let uid = &c.body["metadata"]["uid"];
            let prev = changes[i + 1..]
                .iter()
                .find(|p| &p.body["metadata"]["uid"] == uid);
            HistoryRow {
                rv: c.rv,
                at: c.at.clone().unwrap_or_else(|| "-".into()),
                who: c.actor.clone().unwrap_or_else(|| "edgevirt".into()),
                object,
                what: describe(kind, &c.change_type, prev.map(|p| &p.body), &c.body),
            }
        })
        .collect()
}

/// A change in words.
pub fn describe(kind: Kind, change_type: &str, prev: Option<&Value>, cur: &Value) -> String {
    match change_type {
        "ADDED" => {
            return match node(cur) {
                Some(n) if kind == Kind::VirtualMachineInstance => format!("created on {n}"),
                _ => "created".into(),
            };
        }
        "DELETED" => return "deleted".into(),
        _ => {}
    }
    let Some(prev) = prev else {
        return match status(kind, cur) {
            Some(s) => format!("changed (status {s})"),
            None => "changed".into(),
        };
    };
    let mut phrases = Vec::new();
    if prev["metadata"]["deletionTimestamp"].is_null()
        && !cur["metadata"]["deletionTimestamp"].is_null()
    {
        phrases.push("deletion requested".to_string());
    }
    let (mut before, mut after) = (Vec::new(), Vec::new());
    for part in ["spec", "metadata.labels", "metadata.annotations"] {
        let at = |v: &Value| {
            part.split('.')
                .fold(v.clone(), |v, k| v.get(k).cloned().unwrap_or(Value::Null))
        };
        leaves(part, &at(prev), &mut before);
        leaves(part, &at(cur), &mut after);
    }
    for (path, new) in &after {
        if path.contains("last-applied-configuration") {
            continue;
        }
        match before.iter().find(|(p, _)| p == path) {
            Some((_, old)) if old == new => {}
            Some((_, old)) => phrases.push(format!("{path}: {} → {}", short(old), short(new))),
            None => phrases.push(format!("{path} set to {}", short(new))),
        }
    }
    for (path, _) in &before {
        if !after.iter().any(|(p, _)| p == path) && !path.contains("last-applied-configuration") {
            phrases.push(format!("{path} removed"));
        }
    }
    match (status(kind, prev), status(kind, cur)) {
        (Some(a), Some(b)) if a != b => phrases.push(format!("status {a} → {b}")),
        (None, Some(b)) => phrases.push(format!("status {b}")),
        _ => {}
    }
    match (node(prev), node(cur)) {
        (Some(a), Some(b)) if a != b => phrases.push(format!("moved from {a} to {b}")),
        (None, Some(b)) => phrases.push(format!("placed on {b}")),
        _ => {}
    }
    if phrases.is_empty() {
        return "status details updated".into();
    }
    let more = phrases.len().saturating_sub(MAX_PHRASES);
    phrases.truncate(MAX_PHRASES);
    let mut s = phrases.join("; ");
    if more > 0 {
        s.push_str(&format!("; and {more} more"));
    }
    s
}

/// What the object showed as its status: a VM's `printableStatus`, an instance's phase.
fn status(kind: Kind, v: &Value) -> Option<&str> {
    let s = if kind == Kind::VirtualMachine {
        &v["status"]["printableStatus"]
    } else {
        &v["status"]["phase"]
    };
    s.as_str().filter(|s| !s.is_empty())
}

fn node(v: &Value) -> Option<&str> {
    v["status"]["nodeName"].as_str().filter(|s| !s.is_empty())
}

/// Every leaf under `v` as (dotted path, value); lists are leaves.
fn leaves(path: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                leaves(&format!("{path}.{k}"), x, out);
            }
        }
        Value::Null => {}
        x => out.push((path.to_string(), x.clone())),
    }
}

/// A value as it reads in one line: strings bare, anything else as compact JSON, cut short.
fn short(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        x => x.to_string(),
    };
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(39).collect::<String>())
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn change(rv: u64, t: &str, body: Value, actor: Option<&str>) -> Change {
        Change {
            rv,
            change_type: t.into(),
            body,
            at: Some("2026-12-06T10:00:00Z".into()),
            actor: actor.map(str::to_string),
        }
    }

    #[test]
    fn changes_read_as_words() {
        let v1 = json!({"metadata": {"uid": "u1", "labels": {"app": "web"}},
            "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"cpu": {"cores": 1}}}}}});
        let mut v2 = v1.clone();
        v2["spec"]["runStrategy"] = json!("Always");
        v2["spec"]["template"]["spec"]["domain"]["cpu"]["cores"] = json!(2);
        v2["metadata"]["labels"]["tier"] = json!("front");
        let mut v3 = v2.clone();
        v3["status"] = json!({"printableStatus": "Running"});
        let mut v4 = v3.clone();
        v4["metadata"]["deletionTimestamp"] = json!("2026-12-06T10:05:00Z");
        v4["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("app");
        let h = vec![
            change(9, "DELETED", v4.clone(), Some("alice")),
            change(8, "MODIFIED", v4, Some("alice")),
            change(7, "MODIFIED", v3, None),
            change(6, "MODIFIED", v2, Some("bob")),
            change(5, "ADDED", v1, Some("bob")),
        ];
        let r = rows(Kind::VirtualMachine, &h);
        let what: Vec<&str> = r.iter().map(|r| r.what.as_str()).collect();
        assert_eq!(
            what,
            [
                "deleted",
                "deletion requested; metadata.labels.app removed",
                "status Running",
                "spec.runStrategy: Halted → Always; spec.template.spec.domain.cpu.cores: 1 → 2; \
                 metadata.labels.tier set to front",
                "created",
            ]
        );
        assert_eq!(r[2].who, "edgevirt", "the controller's own change");
        assert_eq!(r[3].who, "bob");
        assert_eq!(r[0].at, "2026-12-06T10:00:00Z");
    }

    #[test]
    fn instances_compare_with_their_own_past_and_say_where_they_run() {
        let a1 = json!({"metadata": {"uid": "i1"}, "spec": {}, "status": {"phase": "Scheduling"}});
        let a2 = json!({"metadata": {"uid": "i1"}, "spec": {},
            "status": {"phase": "Running", "nodeName": "a"}});
        let b1 = json!({"metadata": {"uid": "i2"}, "spec": {},
            "status": {"phase": "Running", "nodeName": "b"}});
        let mut b2 = b1.clone();
        b2["status"]["nodeName"] = json!("a");
        let mut b3 = b2.clone();
        b3["status"]["guestOSInfo"] = json!({"name": "Debian"});
        let h = vec![
            change(14, "MODIFIED", b3, Some("system:node:a")),
            change(13, "MODIFIED", b2, None),
            change(12, "ADDED", b1, None),
            change(11, "MODIFIED", a2, None),
            change(10, "MODIFIED", a1, None),
        ];
        let what: Vec<String> = rows(Kind::VirtualMachineInstance, &h)
            .into_iter()
            .map(|r| r.what)
            .collect();
        assert_eq!(
            what,
            [
                "status details updated",
                "moved from b to a",
                "created on b",
                "status Scheduling → Running; placed on a",
                "changed (status Scheduling)",
            ]
        );
        // Long values are cut; past four phrases the rest is counted.
        let old = json!({"metadata": {"uid": "x"}, "spec": {"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": "x".repeat(100)}});
        let new = json!({"metadata": {"uid": "x"}, "spec": {"a": 2, "b": 2, "c": 2, "d": 2, "e": 2, "f": "y".repeat(100)}});
        let w = describe(Kind::VirtualMachine, "MODIFIED", Some(&old), &new);
        assert!(w.ends_with("; and 2 more"), "{w}");
        assert!(
            describe(
                Kind::VirtualMachine,
                "MODIFIED",
                Some(&json!({"spec": {"f": "x".repeat(100)}})),
                &json!({"spec": {"f": "y".repeat(100)}})
            )
            .contains('…')
        );
    }
}
