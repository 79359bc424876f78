//! Node affinity, as Kubernetes' scheduler reads it: `required...` terms are ORed and a
//! term's requirements ANDed (a node that matches none is never chosen); `preferred...`
//! terms add their weight for each node they match, and the scheduler takes the highest
//! score among the nodes that fit. Requirements are on node labels (`matchExpressions`) or
//! the node's name (`matchFields` on `metadata.name`). Taints and tolerations: a node's
//! `NoSchedule` and `NoExecute` taints keep off instances that do not tolerate them, its
//! `PreferNoSchedule` ones make it a last choice.
//!
//! Pod affinity and anti-affinity read the instances placed on nodes as Kubernetes reads
//! pods: a term selects instances by labels (in the instance's own namespace unless it
//! names others) and groups nodes into topology domains by a node label
//! (`kubernetes.io/hostname`, which is the node's name when no label says otherwise).
//! A required affinity term holds on a node whose domain has a selected instance (or, when
//! none exists anywhere yet, for an instance its own term selects: the first of a group);
//! a required anti-affinity term holds on a node whose domain has none. Preferred terms
//! add (affinity met) or take (anti-affinity broken) their weight. As in Kubernetes, a placed
//! instance's required anti-affinity also keeps the instances it selects out of its domain
//! (symmetry); its preferred terms are not read back.

use std::collections::BTreeMap;

use crate::types::Invalid;
use crate::types::edgevirt::Taint;
use crate::types::kubevirt::{
    Affinity, LabelSelectorSpec, NodeSelectorRequirement, NodeSelectorTerm, PodAffinityTerm,
    Toleration, TopologySpreadConstraint,
};

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

/// When an instance placed on a node must leave it for the node's `NoExecute` taints, as
/// Kubernetes' taint manager decides: `None` while it tolerates them all without a limit;
/// otherwise the time by which it must be gone and the taint that decides it. A taint it
/// does not tolerate decides at once (the Unix epoch); a toleration with
/// `tolerationSeconds` lets it stay that long after the taint's `timeAdded` (the smallest
/// such limit wins). A taint without a readable `timeAdded` counts from `now`.
pub fn no_execute_deadline<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    now: chrono::DateTime<chrono::Utc>,
) -> Option<(chrono::DateTime<chrono::Utc>, &'a Taint)> {
    let mut first: Option<(chrono::DateTime<chrono::Utc>, &Taint)> = None;
    for taint in taints.iter().filter(|t| t.effect == "NoExecute") {
        let matching: Vec<&Toleration> = tolerations
            .iter()
            .filter(|tol| tolerates(tol, taint))
            .collect();
        let deadline = if matching.is_empty() {
            chrono::DateTime::UNIX_EPOCH
        } else if let Some(secs) = matching.iter().filter_map(|t| t.toleration_seconds).min() {
            let added = taint
                .time_added
                .as_deref()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .map_or(now, |t| t.to_utc());
            added + chrono::Duration::seconds(secs.max(0))
        } else {
            continue;
        };
        if first.is_none_or(|(d, _)| deadline < d) {
            first = Some((deadline, taint));
        }
    }
    first
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
        if let Some(at) = &t.time_added
            && chrono::DateTime::parse_from_rfc3339(at).is_err()
        {
            return Err(Invalid(format!(
                "spec.taints[{i}].timeAdded: {at:?} is not an RFC 3339 time"
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

/// An instance placed on a node, as the pod (anti-)affinity rules read it.
pub struct PlacedView<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub node: &'a str,
    /// Its own affinity: its required anti-affinity keeps others off too (symmetry).
    pub affinity: Option<&'a Affinity>,
}

/// The well-known topology key of one node.
pub const HOSTNAME_KEY: &str = "kubernetes.io/hostname";

/// A node's topology domain for `key`: its label's value (for `kubernetes.io/hostname`, its
/// name when it has no such label).
pub fn topology<'a>(n: &NodeView<'a>, key: &str) -> Option<&'a str> {
    match n.labels.get(key) {
        Some(v) => Some(v.as_str()),
        None if key == HOSTNAME_KEY => Some(n.name),
        None => None,
    }
}

/// The topology domain for `key` of the node named `node`, among `nodes`.
fn domain_of<'a>(nodes: &'a [NodeView<'a>], node: &str, key: &str) -> Option<&'a str> {
    nodes
        .iter()
        .find(|n| n.name == node)
        .and_then(|n| topology(n, key))
}

/// Whether labels match a selector (unset selects nothing; `{}` everything).
fn selects(sel: &Option<LabelSelectorSpec>, labels: &BTreeMap<String, String>) -> bool {
    let Some(sel) = sel else { return false };
    sel.match_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
        && sel.match_expressions.iter().all(|r| {
            let value = labels.get(&r.key).map(String::as_str);
            match r.operator.as_str() {
                "In" => value.is_some_and(|v| r.values.iter().any(|x| x == v)),
                "NotIn" => value.is_none_or(|v| !r.values.iter().any(|x| x == v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// Whether a term is about instances in namespace `ns` (the term's owner lives in `own`).
fn in_namespaces(t: &PodAffinityTerm, own: &str, ns: &str) -> bool {
    if t.namespace_selector.is_some() {
        return true;
    }
    if t.namespaces.is_empty() {
        ns == own
    } else {
        t.namespaces.iter().any(|n| n == ns)
    }
}

/// The placed instances a term selects, with their nodes' domains.
fn selected<'a>(
    t: &PodAffinityTerm,
    own_ns: &str,
    placed: &'a [PlacedView<'a>],
    nodes: &'a [NodeView<'a>],
) -> Vec<Option<&'a str>> {
    placed
        .iter()
        .filter(|p| in_namespaces(t, own_ns, p.namespace) && selects(&t.label_selector, p.labels))
        .map(|p| domain_of(nodes, p.node, &t.topology_key))
        .collect()
}

/// Why the node may not take the instance by its pod (anti-)affinity, if it may not.
pub fn pod_required(
    a: &Option<Affinity>,
    own_ns: &str,
    own_labels: &BTreeMap<String, String>,
    node: &NodeView,
    placed: &[PlacedView],
    nodes: &[NodeView],
) -> Result<(), String> {
    // Kubernetes' symmetry: a placed instance's required anti-affinity term that selects
    // this instance keeps it out of that instance's domain.
    for p in placed {
        for t in p
            .affinity
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .iter()
            .flat_map(|pa| &pa.required_during_scheduling_ignored_during_execution)
        {
            if !in_namespaces(t, p.namespace, own_ns) || !selects(&t.label_selector, own_labels) {
                continue;
            }
            if let Some(d) = domain_of(nodes, p.node, &t.topology_key)
                && topology(node, &t.topology_key) == Some(d)
            {
                return Err(format!(
                    "{}/{} runs in its {} domain ({d}) and its pod anti-affinity selects this \
                     instance",
                    p.namespace, p.name, t.topology_key
                ));
            }
        }
    }
    let Some(a) = a else { return Ok(()) };
    for t in a
        .pod_affinity
        .iter()
        .flat_map(|p| &p.required_during_scheduling_ignored_during_execution)
    {
        let hits = selected(t, own_ns, placed, nodes);
        let here = topology(node, &t.topology_key);
        let first_of_group = hits.is_empty()
            && in_namespaces(t, own_ns, own_ns)
            && selects(&t.label_selector, own_labels);
        if !first_of_group && (here.is_none() || !hits.contains(&here)) {
            return Err(format!(
                "no instance its pod affinity selects runs in its {} domain",
                t.topology_key
            ));
        }
    }
    for t in a
        .pod_anti_affinity
        .iter()
        .flat_map(|p| &p.required_during_scheduling_ignored_during_execution)
    {
        if let Some(here) = topology(node, &t.topology_key)
            && selected(t, own_ns, placed, nodes).contains(&Some(here))
        {
            return Err(format!(
                "an instance its pod anti-affinity selects runs in its {} domain ({here})",
                t.topology_key
            ));
        }
    }
    Ok(())
}

/// The node's pod (anti-)affinity score: preferred affinity terms it meets add their
/// weight, preferred anti-affinity terms it breaks take theirs.
pub fn pod_score(
    a: &Option<Affinity>,
    own_ns: &str,
    node: &NodeView,
    placed: &[PlacedView],
    nodes: &[NodeView],
) -> i64 {
    let Some(a) = a else { return 0 };
    let near = |t: &PodAffinityTerm| {
        topology(node, &t.topology_key)
            .is_some_and(|here| selected(t, own_ns, placed, nodes).contains(&Some(here)))
    };
    let plus: i64 = a
        .pod_affinity
        .iter()
        .flat_map(|p| &p.preferred_during_scheduling_ignored_during_execution)
        .filter(|w| near(&w.pod_affinity_term))
        .map(|w| i64::from(w.weight))
        .sum();
    let minus: i64 = a
        .pod_anti_affinity
        .iter()
        .flat_map(|p| &p.preferred_during_scheduling_ignored_during_execution)
        .filter(|w| near(&w.pod_affinity_term))
        .map(|w| i64::from(w.weight))
        .sum();
    plus - minus
}

/// Topology spread on one node: `Err` naming the constraint a `DoNotSchedule` one would
/// break, else the score (`ScheduleAnyway` ones take 10 for each selected instance above
/// the emptiest domain's count). Domains are the values of the key on `domains_of` (every
/// node, cordoned or not ready ones too, as Kubernetes' default policies count them); a
/// node without the key breaks a `DoNotSchedule` constraint.
pub fn spread(
    constraints: &[TopologySpreadConstraint],
    own_ns: &str,
    own_labels: &BTreeMap<String, String>,
    node: &NodeView,
    placed: &[PlacedView],
    domains_of: &[NodeView],
) -> Result<i64, String> {
    let mut score = 0;
    for c in constraints {
        let count = |domain: &str| {
            placed
                .iter()
                .filter(|p| p.namespace == own_ns && selects(&c.label_selector, p.labels))
                .filter(|p| domain_of(domains_of, p.node, &c.topology_key) == Some(domain))
                .count() as i64
        };
        let min = domains_of
            .iter()
            .filter_map(|n| topology(n, &c.topology_key))
            .map(count)
            .min()
            .unwrap_or(0);
        let hard = c.when_unsatisfiable == "DoNotSchedule";
        let Some(here) = topology(node, &c.topology_key) else {
            if hard {
                return Err(format!(
                    "has no {} label for its topology spread constraint",
                    c.topology_key
                ));
            }
            continue;
        };
        let own = i64::from(selects(&c.label_selector, own_labels));
        let skew = count(here) + own - min;
        if hard && skew > i64::from(c.max_skew) {
            return Err(format!(
                "would make the {} domain {here} {skew} instances fuller than the emptiest \
                 (maxSkew {})",
                c.topology_key, c.max_skew
            ));
        }
        if !hard {
            score -= 10 * (skew - own).max(0);
        }
    }
    Ok(score)
}

/// Check topology spread constraints as Kubernetes' API server does, refusing the parts
/// edgevirt does not read by name.
pub fn check_spread(constraints: &[TopologySpreadConstraint]) -> Result<(), Invalid> {
    for (i, c) in constraints.iter().enumerate() {
        let at = format!("spec.topologySpreadConstraints[{i}]");
        if c.max_skew < 1 {
            return Err(Invalid(format!(
                "{at}.maxSkew: {}: must be greater than zero",
                c.max_skew
            )));
        }
        check_pod_term(
            &PodAffinityTerm {
                label_selector: c.label_selector.clone(),
                topology_key: c.topology_key.clone(),
                ..Default::default()
            },
            &at,
        )?;
        if !matches!(
            c.when_unsatisfiable.as_str(),
            "DoNotSchedule" | "ScheduleAnyway"
        ) {
            return Err(Invalid(format!(
                "{at}.whenUnsatisfiable: {:?}: must be DoNotSchedule or ScheduleAnyway",
                c.when_unsatisfiable
            )));
        }
        for (field, set) in [
            ("minDomains", c.min_domains.is_some()),
            ("matchLabelKeys", !c.match_label_keys.is_empty()),
            ("nodeAffinityPolicy", c.node_affinity_policy.is_some()),
            ("nodeTaintsPolicy", c.node_taints_policy.is_some()),
        ] {
            if set {
                return Err(Invalid(format!("{at}.{field} is not supported yet")));
            }
        }
    }
    Ok(())
}

/// Check one pod affinity term as Kubernetes' API server does.
fn check_pod_term(t: &PodAffinityTerm, at: &str) -> Result<(), Invalid> {
    if t.topology_key.is_empty() {
        return Err(Invalid(format!("{at}.topologyKey: required")));
    }
    crate::types::check_label_key(&format!("{at}.topologyKey"), &t.topology_key)?;
    for n in &t.namespaces {
        crate::types::check_name(&format!("{at}.namespaces"), n)?;
    }
    if let Some(ns) = &t.namespace_selector
        && (!ns.match_labels.is_empty() || !ns.match_expressions.is_empty())
    {
        return Err(Invalid(format!(
            "{at}.namespaceSelector: only {{}} (every namespace) is supported yet"
        )));
    }
    for (k, v) in t.label_selector.iter().flat_map(|s| &s.match_labels) {
        crate::types::check_label_key(&format!("{at}.labelSelector.matchLabels"), k)?;
        crate::types::check_label_value(&format!("{at}.labelSelector.matchLabels"), v)?;
    }
    for (i, r) in t
        .label_selector
        .iter()
        .flat_map(|s| &s.match_expressions)
        .enumerate()
    {
        let at = format!("{at}.labelSelector.matchExpressions[{i}]");
        crate::types::check_label_key(&format!("{at}.key"), &r.key)?;
        let ok = match r.operator.as_str() {
            "In" | "NotIn" => !r.values.is_empty(),
            "Exists" | "DoesNotExist" => r.values.is_empty(),
            other => {
                return Err(Invalid(format!(
                    "{at}.operator: {other:?}: must be In, NotIn, Exists or DoesNotExist"
                )));
            }
        };
        if !ok {
            return Err(Invalid(format!(
                "{at}.values: {} takes {}",
                r.operator,
                if r.operator.ends_with("In") {
                    "one value or more"
                } else {
                    "no values"
                }
            )));
        }
    }
    Ok(())
}

/// Check the pod affinity and anti-affinity of an instance.
fn check_pod(a: &Affinity) -> Result<(), Invalid> {
    for (field, p) in [
        ("podAffinity", &a.pod_affinity),
        ("podAntiAffinity", &a.pod_anti_affinity),
    ] {
        let Some(p) = p else { continue };
        let at = format!("spec.affinity.{field}");
        for (i, t) in p
            .required_during_scheduling_ignored_during_execution
            .iter()
            .enumerate()
        {
            check_pod_term(
                t,
                &format!("{at}.requiredDuringSchedulingIgnoredDuringExecution[{i}]"),
            )?;
        }
        for (i, w) in p
            .preferred_during_scheduling_ignored_during_execution
            .iter()
            .enumerate()
        {
            let at = format!("{at}.preferredDuringSchedulingIgnoredDuringExecution[{i}]");
            if !(1..=100).contains(&w.weight) {
                return Err(Invalid(format!(
                    "{at}.weight: {}: must be in the range 1-100",
                    w.weight
                )));
            }
            check_pod_term(&w.pod_affinity_term, &format!("{at}.podAffinityTerm"))?;
        }
    }
    Ok(())
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
    if let Some(a) = a {
        check_pod(a)?;
    }
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
    fn no_execute_deadlines_follow_the_taint_manager() {
        let now = chrono::Utc::now();
        let taint = |key: &str, effect: &str, added: Option<&str>| Taint {
            key: key.into(),
            value: None,
            effect: effect.into(),
            time_added: added.map(str::to_string),
        };
        let tol = |key: &str, secs: Option<i64>| Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            toleration_seconds: secs,
            ..Default::default()
        };
        let taints = [
            taint("soft", "NoSchedule", None),
            taint("a", "NoExecute", Some("2030-01-01T00:00:00Z")),
            taint("b", "NoExecute", Some("2030-01-01T00:00:00Z")),
        ];
        // NoSchedule taints never evict; an untolerated NoExecute one evicts at once.
        assert_eq!(no_execute_deadline(&taints[..1], &[], now), None);
        let (d, t) = no_execute_deadline(&taints, &[tol("a", None)], now).unwrap();
        assert_eq!((d, t.key.as_str()), (chrono::DateTime::UNIX_EPOCH, "b"));
        // Tolerated for ever: no deadline; tolerated for a while: the smallest limit.
        assert_eq!(
            no_execute_deadline(&taints, &[tol("a", None), tol("b", None)], now),
            None
        );
        let (d, t) =
            no_execute_deadline(&taints, &[tol("a", Some(60)), tol("b", Some(30))], now).unwrap();
        assert_eq!(d.to_rfc3339(), "2030-01-01T00:00:30+00:00");
        assert_eq!(t.key, "b");
        // Without a timeAdded the limit counts from now.
        let fresh = [taint("a", "NoExecute", None)];
        let (d, _) = no_execute_deadline(&fresh, &[tol("a", Some(10))], now).unwrap();
        assert_eq!(d, now + chrono::Duration::seconds(10));
    }

    #[test]
    fn tolerations_match_taints_as_kubernetes_does() {
        let taint = |k: &str, v: Option<&str>, e: &str| Taint {
            key: k.into(),
            value: v.map(Into::into),
            effect: e.into(),
            time_added: None,
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
    fn malformed_pod_affinity_is_refused_naming_the_field() {
        let term = |t: serde_json::Value| {
            affinity(serde_json::json!({"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [t]}}))
        };
        let err = |a: Option<Affinity>| check(&a).unwrap_err().0;
        check(&term(
            serde_json::json!({"topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
            "namespaceSelector": {}}),
        ))
        .unwrap();
        for (t, needle) in [
            (
                serde_json::json!({"topologyKey": ""}),
                "topologyKey: required",
            ),
            (
                serde_json::json!({"topologyKey": "bad key!"}),
                "topologyKey",
            ),
            (
                serde_json::json!({"topologyKey": "zone", "namespaces": ["../x"]}),
                "namespaces",
            ),
            (
                serde_json::json!({"topologyKey": "zone", "namespaceSelector": {"matchLabels": {"a": "b"}}}),
                "only {} (every namespace)",
            ),
            (
                serde_json::json!({"topologyKey": "zone", "labelSelector": {"matchExpressions": [
                    {"key": "app", "operator": "Gt", "values": ["1"]}]}}),
                "must be In, NotIn, Exists or DoesNotExist",
            ),
            (
                serde_json::json!({"topologyKey": "zone", "labelSelector": {"matchExpressions": [
                    {"key": "app", "operator": "In"}]}}),
                "In takes one value or more",
            ),
        ] {
            let e = err(term(t.clone()));
            assert!(e.contains(needle), "{t}: {e}");
            assert!(e.contains("spec.affinity.podAntiAffinity"), "{e}");
        }
        let heavy = affinity(serde_json::json!({"podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 101,
                "podAffinityTerm": {"topologyKey": "zone"}}]}}));
        assert!(err(heavy).contains("weight: 101"));
    }

    #[test]
    fn malformed_spread_constraints_are_refused_naming_the_field() {
        let c = |v: serde_json::Value| -> Vec<TopologySpreadConstraint> {
            vec![serde_json::from_value(v).unwrap()]
        };
        check_spread(&c(serde_json::json!({"maxSkew": 1, "topologyKey": "zone",
            "whenUnsatisfiable": "ScheduleAnyway"})))
        .unwrap();
        for (v, needle) in [
            (
                serde_json::json!({"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}),
                "[0].maxSkew: 0",
            ),
            (
                serde_json::json!({"maxSkew": 1, "topologyKey": "", "whenUnsatisfiable": "DoNotSchedule"}),
                "[0].topologyKey: required",
            ),
            (
                serde_json::json!({"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Always"}),
                "whenUnsatisfiable",
            ),
            (
                serde_json::json!({"maxSkew": 1, "topologyKey": "zone",
                    "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor"}),
                "nodeTaintsPolicy is not supported yet",
            ),
        ] {
            let e = check_spread(&c(v.clone())).unwrap_err().0;
            assert!(e.contains(needle), "{v}: {e}");
            assert!(e.starts_with("spec.topologySpreadConstraints[0]"), "{e}");
        }
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
