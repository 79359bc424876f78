//! Node affinity, as Kubernetes' scheduler reads it: `required...` terms are ORed and a
//! term's requirements ANDed (a node that matches none is never chosen); `preferred...`
//! terms add their weight for each node they match, and the scheduler takes the highest
//! score among the nodes that fit. Requirements are on node labels (`matchExpressions`) or
//! the node's name (`matchFields` on `metadata.name`). Taints and tolerations: a node's
//! `NoSchedule` and `NoExecute` taints keep off instances that do not tolerate them, its
//! `PreferNoSchedule` ones make it a last choice.

use std::collections::BTreeMap;

use crate::types::Invalid;
use crate::types::edgevirt::Taint;
use crate::types::kubevirt::{Affinity, NodeSelectorRequirement, NodeSelectorTerm, Toleration};

const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// Whether one toleration tolerates a taint, as Kubernetes matches them.
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect_ok = t
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key_ok = match t.key.as_deref() {
        None | Some("") => t.operator.as_deref() == Some("Exists"),
        Some(k) => k == taint.key,
    };
    let value_ok = match t.operator.as_deref() {
        Some("Exists") => true,
        _ => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
    };
    effect_ok && key_ok && value_ok
}

/// The node's taints of `effect` that none of the instance's tolerations tolerates.
pub fn untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    effect: &str,
) -> Vec<&'a Taint> {
    taints
        .iter()
        .filter(|t| t.effect == effect && !tolerations.iter().any(|tol| tolerates(tol, t)))
        .collect()
}

/// A taint as `kubectl describe node` shows it: `key=value:Effect`.
pub fn taint_text(t: &Taint) -> String {
    match &t.value {
        Some(v) if !v.is_empty() => format!("{}={v}:{}", t.key, t.effect),
        _ => format!("{}:{}", t.key, t.effect),
    }
}

/// Check a node's taints.
pub fn check_taints(taints: &[Taint]) -> Result<(), Invalid> {
    for (i, t) in taints.iter().enumerate() {
        crate::types::check_label_key(&format!("spec.taints[{i}].key"), &t.key)?;
        if let Some(v) = &t.value {
            crate::types::check_label_value(&format!("spec.taints[{i}].value"), v)?;
        }
        if !EFFECTS.contains(&t.effect.as_str()) {
            return Err(Invalid(format!(
                "spec.taints[{i}].effect: {:?}: must be NoSchedule, PreferNoSchedule or NoExecute",
                t.effect
            )));
        }
    }
    Ok(())
}

/// Check an instance's tolerations as the API server does.
pub fn check_tolerations(tolerations: &[Toleration]) -> Result<(), Invalid> {
    for (i, t) in tolerations.iter().enumerate() {
        let at = format!("spec.tolerations[{i}]");
        match t.operator.as_deref() {
            None | Some("Equal") => {
                if t.key.as_deref().is_none_or(str::is_empty) {
                    return Err(Invalid(format!(
                        "{at}.operator: operator must be Exists when key is empty"
                    )));
                }
            }
            Some("Exists") => {
                if t.value.as_deref().is_some_and(|v| !v.is_empty()) {
                    return Err(Invalid(format!(
                        "{at}.operator: value must be empty when operator is Exists"
                    )));
                }
            }
            Some(other) => {
                return Err(Invalid(format!(
                    "{at}.operator: {other:?}: must be Equal or Exists"
                )));
            }
        }
        if let Some(e) = t.effect.as_deref()
            && !e.is_empty()
            && !EFFECTS.contains(&e)
        {
            return Err(Invalid(format!(
                "{at}.effect: {e:?}: must be NoSchedule, PreferNoSchedule or NoExecute"
            )));
        }
    }
    Ok(())
}

/// What the rules read of a node.
pub struct NodeView<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let int = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| r.values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !r.values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(int), r.values.first().and_then(|x| int(x))), (Some(v), Some(x)) if v > x)
        }
        "Lt" => {
            matches!((value.and_then(int), r.values.first().and_then(|x| int(x))), (Some(v), Some(x)) if v < x)
        }
        _ => false,
    }
}

/// Whether a node matches one term (an empty term matches no node, as in Kubernetes).
pub fn term_matches(t: &NodeSelectorTerm, n: &NodeView) -> bool {
    if t.match_expressions.is_empty() && t.match_fields.is_empty() {
        return false;
    }
    t.match_expressions
        .iter()
        .all(|r| requirement_matches(r, n.labels.get(&r.key).map(String::as_str)))
        && t.match_fields
            .iter()
            .all(|r| requirement_matches(r, (r.key == "metadata.name").then_some(n.name)))
}

/// Whether the node may take the instance.
pub fn required(a: &Option<Affinity>, n: &NodeView) -> bool {
    match a
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        }) {
        Some(sel) => sel.node_selector_terms.iter().any(|t| term_matches(t, n)),
        None => true,
    }
}

/// The node's score: the weights of the preferred terms it matches.
pub fn score(a: &Option<Affinity>, n: &NodeView) -> i64 {
    a.as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .map(|na| {
            na.preferred_during_scheduling_ignored_during_execution
                .iter()
                .filter(|p| term_matches(&p.preference, n))
                .map(|p| i64::from(p.weight))
                .sum()
        })
        .unwrap_or(0)
}

fn check_term(t: &NodeSelectorTerm, at: &str) -> Result<(), Invalid> {
    for (field, list) in [
        ("matchExpressions", &t.match_expressions),
        ("matchFields", &t.match_fields),
    ] {
        for (i, r) in list.iter().enumerate() {
            let at = format!("{at}.{field}[{i}]");
            if field == "matchFields" && r.key != "metadata.name" {
                return Err(Invalid(format!(
                    "{at}.key: {:?}: only metadata.name can be matched as a field",
                    r.key
                )));
            }
            crate::types::check_label_key(&format!("{at}.key"), &r.key)?;
            let ok = match r.operator.as_str() {
                "In" | "NotIn" => !r.values.is_empty(),
                "Exists" | "DoesNotExist" => r.values.is_empty() && field == "matchExpressions",
                "Gt" | "Lt" => {
                    field == "matchExpressions"
                        && r.values.len() == 1
                        && r.values[0].parse::<i64>().is_ok()
                }
                other => {
                    return Err(Invalid(format!(
                        "{at}.operator: {other:?}: must be In, NotIn, Exists, DoesNotExist, Gt or Lt"
                    )));
                }
            };
            if !ok {
                return Err(Invalid(format!(
                    "{at}.values: {} takes {}",
                    r.operator,
                    match r.operator.as_str() {
                        "In" | "NotIn" => "one value or more",
                        "Exists" | "DoesNotExist" => "no values (and only on labels)",
                        _ => "exactly one integer value (and only on labels)",
                    }
                )));
            }
        }
    }
    Ok(())
}

/// Check an affinity as Kubernetes' API server does.
pub fn check(a: &Option<Affinity>) -> Result<(), Invalid> {
    let Some(na) = a.as_ref().and_then(|a| a.node_affinity.as_ref()) else {
        return Ok(());
    };
    let at = "spec.affinity.nodeAffinity";
    if let Some(sel) = &na.required_during_scheduling_ignored_during_execution {
        let at = format!("{at}.requiredDuringSchedulingIgnoredDuringExecution");
        if sel.node_selector_terms.is_empty() {
            return Err(Invalid(format!(
                "{at}.nodeSelectorTerms: must have at least one term"
            )));
        }
        for (i, t) in sel.node_selector_terms.iter().enumerate() {
            check_term(t, &format!("{at}.nodeSelectorTerms[{i}]"))?;
        }
    }
    for (i, p) in na
        .preferred_during_scheduling_ignored_during_execution
        .iter()
        .enumerate()
    {
        let at = format!("{at}.preferredDuringSchedulingIgnoredDuringExecution[{i}]");
        if !(1..=100).contains(&p.weight) {
            return Err(Invalid(format!(
                "{at}.weight: {}: must be in the range 1-100",
                p.weight
            )));
        }
        check_term(&p.preference, &format!("{at}.preference"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn affinity(v: serde_json::Value) -> Option<Affinity> {
        Some(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn required_terms_or_requirements_and_preferred_weigh() {
        let a = affinity(serde_json::json!({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["shop", "plant"]},
                                      {"key": "gpu", "operator": "DoesNotExist"}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["spare"]}]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [{"key": "ssd", "operator": "Exists"}]}},
                {"weight": 5, "preference": {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["8"]}]}}]}}));
        assert!(check(&a).is_ok());
        let labels = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let shop = labels(&[("zone", "shop"), ("ssd", "yes"), ("cores", "16")]);
        let gpu = labels(&[("zone", "shop"), ("gpu", "1")]);
        let none = labels(&[]);
        let n = |name, labels| NodeView { name, labels };
        assert!(required(&a, &n("a", &shop)));
        assert!(!required(&a, &n("b", &gpu)), "gpu must not exist");
        assert!(!required(&a, &n("c", &none)));
        assert!(required(&a, &n("spare", &none)), "matched by name");
        assert_eq!(score(&a, &n("a", &shop)), 15);
        assert_eq!(score(&a, &n("b", &gpu)), 0);
        assert!(required(&None, &n("c", &none)));
    }

    #[test]
    fn tolerations_match_taints_as_kubernetes_does() {
        let taint = |k: &str, v: Option<&str>, e: &str| Taint {
            key: k.into(),
            value: v.map(Into::into),
            effect: e.into(),
        };
        let tol = |v: serde_json::Value| -> Toleration { serde_json::from_value(v).unwrap() };
        let taints = [
            taint("dedicated", Some("pos"), "NoSchedule"),
            taint("maintenance", None, "NoExecute"),
            taint("slow", None, "PreferNoSchedule"),
        ];
        assert_eq!(untolerated(&taints, &[], "NoSchedule").len(), 1);
        let pos = [tol(
            serde_json::json!({"key": "dedicated", "value": "pos", "effect": "NoSchedule"}),
        )];
        assert!(untolerated(&taints, &pos, "NoSchedule").is_empty());
        let wrong = [tol(
            serde_json::json!({"key": "dedicated", "value": "office"}),
        )];
        assert_eq!(untolerated(&taints, &wrong, "NoSchedule").len(), 1);
        let exists = [tol(
            serde_json::json!({"key": "maintenance", "operator": "Exists"}),
        )];
        assert!(untolerated(&taints, &exists, "NoExecute").is_empty());
        let all = [tol(serde_json::json!({"operator": "Exists"}))];
        for e in EFFECTS {
            assert!(untolerated(&taints, &all, e).is_empty(), "{e}");
        }
        assert_eq!(taint_text(&taints[0]), "dedicated=pos:NoSchedule");
        assert!(check_tolerations(&[tol(serde_json::json!({"value": "x"}))]).is_err());
        assert!(
            check_tolerations(&[tol(
                serde_json::json!({"key": "a", "operator": "Exists", "value": "x"})
            )])
            .is_err()
        );
        assert!(
            check_tolerations(&[tol(serde_json::json!({"key": "a", "effect": "Sometimes"}))])
                .is_err()
        );
        assert!(check_taints(&[taint("a", None, "Never")]).is_err());
        assert!(check_taints(&taints).is_ok());
    }

    #[test]
    fn malformed_requirements_are_refused_naming_the_field() {
        for (v, needle) in [
            (
                serde_json::json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}),
                "at least one term",
            ),
            (
                serde_json::json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "a", "operator": "Near"}]}]}}),
                "operator",
            ),
            (
                serde_json::json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "a", "operator": "In"}]}]}}),
                "one value or more",
            ),
            (
                serde_json::json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["x"]}]}]}}),
                "integer",
            ),
            (
                serde_json::json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.labels", "operator": "In", "values": ["x"]}]}]}}),
                "metadata.name",
            ),
            (
                serde_json::json!({"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 101, "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}}]}),
                "1-100",
            ),
        ] {
            let e = check(&affinity(serde_json::json!({"nodeAffinity": v})))
                .unwrap_err()
                .0;
            assert!(e.contains(needle), "{e}");
        }
    }
}
