//! Kubernetes events: what happened to a VM, an instance, a migration or a node, recorded as
//! core `v1` Events the way KubeVirt and Kubernetes word them, so `kubectl get events` and
//! `kubectl describe vmi NAME` show a site's history as on a cluster.
//!
//! Events are derived from the changes the controller sees in the store, whoever made them
//! (an agent reporting a phase, the scheduler, a user deleting an instance): the
//! [`Observer`] remembers a small summary of every instance, migration and node and turns
//! each change of summary into notes ([`vmi_notes`], pure and tested). The recorder writes
//! them on its own task, so a slow write never holds up a reconcile. Repeats of one note on
//! one object land on one Event whose `count` and `lastTimestamp` grow, as Kubernetes'
//! recorder aggregates them: the Event's name is derived from what makes it the same note,
//! so that holds across controller restarts too. Events older than [`KEEP`] are pruned,
//! and at most [`MAX_EVENTS`] are kept.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::rules::node::node_ready;
use crate::store::{self, Store};
use crate::types::kubevirt::{
    ConditionStatus, ConditionType, MigrationPhase, Phase, condition_true,
};
use crate::types::{
    Kind, Meta, Node, Typed, VirtualMachineInstance, VirtualMachineInstanceMigration,
};

/// Events older than this go (Kubernetes keeps one hour by default; a site with nobody on
/// it is looked at less often, so edgevirt keeps three days).
pub const KEEP: Duration = Duration::from_secs(3 * 24 * 3600);
/// And at most this many, the oldest going first.
pub const MAX_EVENTS: usize = 5000;
/// How often old events are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(600);
/// Notes waiting to be written; beyond this they are dropped (and logged), never blocking
/// the controller.
const BACKLOG: usize = 1024;

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

/// Who reports a note, as `source.component` (and `host` for a node's agent).
const CONTROLLER: &str = "edgevirt-controller";
const AGENT: &str = "edgevirt-agent";

/// One thing that happened to one object.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub type_: &'static str,
    pub reason: &'static str,
    pub message: String,
    pub component: &'static str,
    /// The node whose agent saw it happen.
    pub host: Option<String>,
}

impl Note {
    fn about<T: Meta>(kind: Kind, obj: &T, type_: &'static str, reason: &'static str) -> Note {
        Note {
            kind,
            namespace: obj.namespace().to_string(),
            name: obj.name().to_string(),
            uid: obj.uid().to_string(),
            type_,
            reason,
            message: String::new(),
            component: CONTROLLER,
            host: None,
        }
    }

    fn says(mut self, message: impl Into<String>) -> Note {
        self.message = message.into();
        self
    }

    fn by_agent(mut self, node: Option<&str>) -> Note {
        self.component = AGENT;
        self.host = node.map(str::to_string);
        self
    }

    /// The Event's name: the object's, then a digest of what makes two notes the same one
    /// (so a repeat counts on the same Event).
    fn event_name(&self) -> String {
        let mut h = Sha256::new();
        for part in [
            self.kind.name(),
            &self.uid,
            self.type_,
            self.reason,
            &self.message,
            self.component,
            self.host.as_deref().unwrap_or(""),
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        format!("{}.{}", self.name, &hex::encode(h.finalize())[..16])
    }

    fn to_event(&self, now: Timestamp) -> Event {
        let time = Some(Time(now));
        Event {
            metadata: ObjectMeta {
                name: Some(self.event_name()),
                namespace: Some(self.namespace.clone()).filter(|n| !n.is_empty()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some(self.kind.api_version()),
                kind: Some(self.kind.name().to_string()),
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()).filter(|n| !n.is_empty()),
                uid: Some(self.uid.clone()),
                ..Default::default()
            },
            reason: Some(self.reason.to_string()),
            message: Some(self.message.clone()),
            type_: Some(self.type_.to_string()),
            count: Some(1),
            first_timestamp: time.clone(),
            last_timestamp: time,
            source: Some(EventSource {
                component: Some(self.component.to_string()),
                host: self.host.clone(),
            }),
            reporting_component: Some(self.component.to_string()),
            reporting_instance: Some(
                self.host
                    .clone()
                    .unwrap_or_else(|| self.component.to_string()),
            ),
            ..Default::default()
        }
    }
}

/// What the observer remembers of an object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    phase: Option<Phase>,
    node: Option<String>,
    deleting: bool,
    /// Why it cannot be scheduled, while it cannot.
    unschedulable: Option<String>,
    agent: bool,
    /// The last migration's uid and whether it completed or failed.
    migration: Option<(String, bool, bool)>,
    /// A node's readiness; a migration's phase.
    ready: bool,
    migration_phase: Option<MigrationPhase>,
}

fn seen_vmi(vmi: &VirtualMachineInstance) -> Seen {
    let st = vmi.status.as_ref();
    let conditions = st.map(|s| s.conditions.as_slice()).unwrap_or(&[]);
    Seen {
        phase: Some(vmi.phase()),
        node: vmi.node_name().map(str::to_string),
        deleting: vmi.deleting(),
        unschedulable: conditions
            .iter()
            .find(|c| c.type_ == ConditionType::PodScheduled && c.status == ConditionStatus::False)
            .map(|c| c.message.clone().unwrap_or_default()),
        agent: condition_true(conditions, &ConditionType::AgentConnected),
        migration: st.and_then(|s| s.migration_state.as_ref()).map(|m| {
            (
                m.migration_uid.clone().unwrap_or_default(),
                m.completed,
                m.failed,
            )
        }),
        ..Default::default()
    }
}

/// The notes a change of an instance makes: `old` is what was seen before (`None` for a new
/// one), `gone` says it was removed from the store.
pub fn vmi_notes(old: Option<&Seen>, vmi: &VirtualMachineInstance, gone: bool) -> Vec<Note> {
    let new = seen_vmi(vmi);
    let old_or_default = old.cloned().unwrap_or_default();
    let old = &old_or_default;
    let mut out = Vec::new();
    let kind = Kind::VirtualMachineInstance;
    let note = |type_, reason| Note::about(kind, vmi, type_, reason);
    let node = new.node.as_deref();
    let owner = vmi.owner_uid("VirtualMachine").map(|uid| Note {
        uid: uid.to_string(),
        ..Note::about(Kind::VirtualMachine, vmi, NORMAL, "")
    });

    if let Some(owner) = &owner
        && old.phase.is_none()
        && !gone
    {
        out.push(
            Note {
                reason: "SuccessfulCreate",
                ..owner.clone()
            }
            .says(format!(
                "Started the virtual machine by creating the new virtual machine instance {}",
                vmi.name()
            )),
        );
    }
    if let Some(why) = &new.unschedulable
        && old.unschedulable.as_ref() != Some(why)
    {
        out.push(note(WARNING, "FailedScheduling").says(why.clone()));
    }
    match (&old.node, node) {
        (None, Some(n)) => out.push(note(NORMAL, "Scheduled").says(format!(
            "Successfully assigned {}/{} to {n}",
            vmi.namespace(),
            vmi.name()
        ))),
        (Some(a), Some(b)) if a != b => out.push(
            note(NORMAL, "Migrated")
                .says(format!("The VirtualMachineInstance migrated to node {b}."))
                .by_agent(Some(b)),
        ),
        _ => {}
    }
    if let Some((uid, _, true)) = &new.migration
        && old
            .migration
            .as_ref()
            .is_none_or(|(u, _, failed)| u != uid || !failed)
    {
        let why = vmi
            .status
            .as_ref()
            .and_then(|s| s.migration_state.as_ref())
            .and_then(|m| m.failure_reason.clone())
            .unwrap_or_else(|| "unknown".into());
        out.push(
            note(WARNING, "MigrationFailed")
                .says(format!(
                    "VirtualMachineInstance migration uid {uid} failed. reason: {why}"
                ))
                .by_agent(node),
        );
    }
    if new.agent && !old.agent && old.phase.is_some() {
        out.push(
            note(NORMAL, "AgentConnected")
                .says("The guest agent connected.")
                .by_agent(node),
        );
    }
    if new.phase != old.phase && old.phase.is_some() {
        match new.phase {
            Some(Phase::Running) => out.push(
                note(NORMAL, "Started")
                    .says("VirtualMachineInstance started.")
                    .by_agent(node),
            ),
            Some(Phase::Succeeded) => out.push(
                note(NORMAL, "Stopped")
                    .says("The VirtualMachineInstance was shut down.")
                    .by_agent(node),
            ),
            Some(Phase::Failed) => out.push(
                note(WARNING, "Stopped")
                    .says("The VirtualMachineInstance crashed.")
                    .by_agent(node),
            ),
            _ => {}
        }
    }
    // Deleted while it ran: its agent shut it down and let it go, with no final phase.
    if gone && new.phase == Some(Phase::Running) {
        out.push(
            note(NORMAL, "Stopped")
                .says("The VirtualMachineInstance was shut down.")
                .by_agent(node),
        );
    }
    // Going away: deleted with a finalizer (a deletionTimestamp first), or at once.
    if (new.deleting || gone) && !old.deleting {
        if matches!(new.phase, Some(Phase::Running)) {
            out.push(note(NORMAL, "ShuttingDown").says("Signaled Graceful Shutdown"));
        }
        if let Some(owner) = &owner {
            out.push(
                Note {
                    reason: "SuccessfulDelete",
                    ..owner.clone()
                }
                .says(format!(
                    "Stopped the virtual machine by deleting the virtual machine instance {}",
                    vmi.uid()
                )),
            );
        }
    }
    out
}

fn node_notes(old: Option<&Seen>, node: &Node) -> Vec<Note> {
    let ready = node_ready(node);
    let Some(old) = old else {
        return Vec::new();
    };
    if old.ready == ready {
        return Vec::new();
    }
    let (type_, reason, status) = if ready {
        (NORMAL, "NodeReady", "NodeReady")
    } else {
        (WARNING, "NodeNotReady", "NodeNotReady")
    };
    vec![
        Note::about(Kind::Node, node, type_, reason)
            .says(format!("Node {} status is now: {status}", node.name())),
    ]
}

fn migration_notes(old: Option<&Seen>, m: &VirtualMachineInstanceMigration) -> Vec<Note> {
    let phase = m.phase();
    if old.and_then(|o| o.migration_phase.as_ref()) == Some(&phase) {
        return Vec::new();
    }
    let note = |type_, reason| Note::about(Kind::VirtualMachineInstanceMigration, m, type_, reason);
    match phase {
        MigrationPhase::Succeeded => {
            vec![
                note(NORMAL, "SuccessfulMigration")
                    .says("Source node reported migration succeeded"),
            ]
        }
        MigrationPhase::Failed => {
            let why = m
                .status
                .as_ref()
                .and_then(|s| s.migration_state.as_ref())
                .and_then(|s| s.failure_reason.clone())
                .or_else(|| {
                    let st = m.status.as_ref()?;
                    st.conditions.iter().find_map(|c| c.message.clone())
                })
                .unwrap_or_else(|| "unknown".into());
            vec![note(WARNING, "FailedMigration").says(format!("Migration failed: {why}"))]
        }
        _ => Vec::new(),
    }
}

/// Remembers what it saw of every instance, migration and node, and sends the notes each
/// change makes to the recorder.
pub struct Observer {
    seen: HashMap<(Kind, String, String), Seen>,
    tx: mpsc::Sender<Note>,
}

impl Observer {
    /// Start the recorder's task, and an observer that feeds it.
    pub fn start(store: &Store, cancel: CancellationToken) -> Observer {
        let (tx, rx) = mpsc::channel(BACKLOG);
        tokio::spawn(run(store.clone(), rx, cancel));
        Observer {
            seen: HashMap::new(),
            tx,
        }
    }

    /// Learn the current state without recording anything: what happened before the
    /// controller started was recorded by the one before it.
    pub async fn seed(&mut self, store: &Store) {
        if let Ok(vmis) = store.all::<VirtualMachineInstance>().await {
            for v in vmis {
                self.remember(Kind::VirtualMachineInstance, &v, seen_vmi(&v));
            }
        }
        if let Ok(nodes) = store.all::<Node>().await {
            for n in nodes {
                let ready = node_ready(&n);
                self.remember(
                    Kind::Node,
                    &n,
                    Seen {
                        ready,
                        ..Default::default()
                    },
                );
            }
        }
        if let Ok(ms) = store.all::<VirtualMachineInstanceMigration>().await {
            for m in ms {
                let s = Seen {
                    migration_phase: Some(m.phase()),
                    ..Default::default()
                };
                self.remember(Kind::VirtualMachineInstanceMigration, &m, s);
            }
        }
    }

    fn remember<T: Meta>(&mut self, kind: Kind, obj: &T, s: Seen) {
        let key = (kind, obj.namespace().to_string(), obj.name().to_string());
        self.seen.insert(key, s);
    }

    /// Look at one change from the store.
    pub fn see(&mut self, ev: &store::Event) {
        let gone = ev.event_type == "DELETED";
        let notes = match ev.kind {
            Kind::VirtualMachineInstance => {
                self.see_typed(ev, gone, |old, v| (vmi_notes(old, v, gone), seen_vmi(v)))
            }
            Kind::Node => self.see_typed(ev, gone, |old, n: &Node| {
                let ready = node_ready(n);
                (
                    node_notes(old, n),
                    Seen {
                        ready,
                        ..Default::default()
                    },
                )
            }),
            Kind::VirtualMachineInstanceMigration => {
                self.see_typed(ev, gone, |old, m: &VirtualMachineInstanceMigration| {
                    let s = Seen {
                        migration_phase: Some(m.phase()),
                        ..Default::default()
                    };
                    (migration_notes(old, m), s)
                })
            }
            _ => return,
        };
        for n in notes {
            if let Err(e) = self.tx.try_send(n) {
                tracing::warn!(error = %e, "dropping an event: the recorder is behind");
            }
        }
    }

    fn see_typed<T: Typed + Meta>(
        &mut self,
        ev: &store::Event,
        gone: bool,
        f: impl FnOnce(Option<&Seen>, &T) -> (Vec<Note>, Seen),
    ) -> Vec<Note> {
        let Ok(obj) = T::from_value(ev.object.clone()) else {
            return Vec::new();
        };
        let key = (T::KIND, obj.namespace().to_string(), obj.name().to_string());
        // A new object (a new uid under an old name) starts from nothing.
        let old = self.seen.get(&key).filter(|_| ev.event_type != "ADDED");
        let (notes, now) = f(old, &obj);
        if gone {
            self.seen.remove(&key);
        } else {
            self.seen.insert(key, now);
        }
        notes
    }
}

/// Write notes as they come; prune old events now and then.
async fn run(store: Store, mut rx: mpsc::Receiver<Note>, cancel: CancellationToken) {
    let mut prune = tokio::time::interval(PRUNE_EVERY);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            note = rx.recv() => match note {
                Some(n) => {
                    if let Err(e) = record(&store, &n).await {
                        tracing::warn!(reason = n.reason, object = %n.name, error = %e, "recording an event failed");
                    }
                }
                None => return,
            },
            _ = prune.tick() => {
                match prune_events(&store, Timestamp::now(), KEEP, MAX_EVENTS).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(pruned = n, "pruned old events"),
                    Err(e) => tracing::warn!(error = %e, "pruning events failed"),
                }
            }
        }
    }
}

/// Record one note: a new Event, or one more on the Event of the same note.
pub async fn record(store: &Store, note: &Note) -> store::Result<()> {
    let now = Timestamp::now();
    let name = note.event_name();
    let bump = |ev: &mut Event| {
        ev.count = Some(ev.count.unwrap_or(1) + 1);
        ev.last_timestamp = Some(Time(now));
        Ok(())
    };
    match store.update_typed(&note.namespace, &name, bump).await {
        Err(store::Error::NotFound { .. }) => {}
        r => return r.map(drop),
    }
    match store.create_typed(&note.to_event(now)).await {
        // Created by another write between the two: count on it.
        Err(store::Error::AlreadyExists { .. }) => {
            store.update_typed(&note.namespace, &name, bump).await?;
            Ok(())
        }
        r => r.map(drop),
    }
}

/// When an event was last seen: its last, else its first time, else its creation.
pub fn last_seen(e: &Event) -> Option<Timestamp> {
    e.last_timestamp
        .as_ref()
        .or(e.first_timestamp.as_ref())
        .or(e.metadata.creation_timestamp.as_ref())
        .map(|t| t.0)
}

/// Delete events last seen before `now - keep`, and the oldest beyond `max`. Returns how
/// many went.
pub async fn prune_events(
    store: &Store,
    now: Timestamp,
    keep: Duration,
    max: usize,
) -> store::Result<usize> {
    let mut all: Vec<Event> = store.all().await?;
    let last_seen = |e: &Event| last_seen(e).unwrap_or(now);
    all.sort_by_key(|e| std::cmp::Reverse(last_seen(e)));
    let cutoff = now
        .checked_sub(SignedDuration::try_from(keep).unwrap_or(SignedDuration::MAX))
        .unwrap_or(Timestamp::MIN);
    let mut pruned = 0;
    for (i, e) in all.iter().enumerate() {
        if i < max && last_seen(e) >= cutoff {
            continue;
        }
        match store
            .delete(Kind::Event, e.namespace(), e.name(), None)
            .await
        {
            Ok(_) | Err(store::Error::NotFound { .. }) => pruned += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(pruned)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn vmi(status: serde_json::Value, deleting: bool) -> VirtualMachineInstance {
        let mut meta = json!({"name": "web", "namespace": "default", "uid": "u-1",
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "name": "web", "uid": "vm-1", "controller": true}]});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        VirtualMachineInstance::from_value(json!({
            "metadata": meta, "spec": {"domain": {"devices": {}}}, "status": status,
        }))
        .unwrap()
    }

    fn reasons(notes: &[Note]) -> Vec<(&str, &str)> {
        notes.iter().map(|n| (n.kind.name(), n.reason)).collect()
    }

    /// A life from creation to shutdown makes KubeVirt's events, each once.
    #[test]
    fn an_instance_life_makes_kubevirt_events() {
        let mut seen: Option<Seen> = None;
        let mut step = |v: VirtualMachineInstance, gone: bool| {
            let notes = vmi_notes(seen.as_ref(), &v, gone);
            seen = Some(seen_vmi(&v));
            notes
        };
        let created = step(vmi(json!({"phase": "Pending"}), false), false);
        assert_eq!(reasons(&created), [("VirtualMachine", "SuccessfulCreate")]);
        assert_eq!(created[0].uid, "vm-1");

        let why = "0/1 nodes are available: 1 Insufficient memory";
        let unschedulable = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
            "status": "False", "reason": "Unschedulable", "message": why}]});
        let failed = step(vmi(unschedulable.clone(), false), false);
        assert_eq!(
            reasons(&failed),
            [("VirtualMachineInstance", "FailedScheduling")]
        );
        assert_eq!(
            (failed[0].type_, failed[0].message.as_str()),
            (WARNING, why)
        );
        // The same reason again is no new note.
        assert!(step(vmi(unschedulable, false), false).is_empty());

        let scheduled = step(
            vmi(json!({"phase": "Scheduled", "nodeName": "n1"}), false),
            false,
        );
        assert_eq!(
            reasons(&scheduled),
            [("VirtualMachineInstance", "Scheduled")]
        );
        assert_eq!(
            scheduled[0].message,
            "Successfully assigned default/web to n1"
        );

        let running = json!({"phase": "Running", "nodeName": "n1",
            "conditions": [{"type": "AgentConnected", "status": "True"}]});
        let started = step(vmi(running.clone(), false), false);
        assert_eq!(
            reasons(&started),
            [
                ("VirtualMachineInstance", "AgentConnected"),
                ("VirtualMachineInstance", "Started")
            ]
        );
        assert_eq!(started[1].source_of(), ("edgevirt-agent", Some("n1")));
        assert!(step(vmi(running.clone(), false), false).is_empty());

        let stopping = step(vmi(running, true), false);
        assert_eq!(
            reasons(&stopping),
            [
                ("VirtualMachineInstance", "ShuttingDown"),
                ("VirtualMachine", "SuccessfulDelete")
            ]
        );
        let stopped = step(
            vmi(json!({"phase": "Succeeded", "nodeName": "n1"}), true),
            false,
        );
        assert_eq!(reasons(&stopped), [("VirtualMachineInstance", "Stopped")]);
        assert_eq!(stopped[0].type_, NORMAL);
        assert!(
            step(
                vmi(json!({"phase": "Succeeded", "nodeName": "n1"}), true),
                true
            )
            .is_empty()
        );

        // Deleted while running: the agent lets it go without a final phase.
        let running = seen_vmi(&vmi(json!({"phase": "Running", "nodeName": "n1"}), true));
        let gone = vmi(json!({"phase": "Running", "nodeName": "n1"}), true);
        let notes = vmi_notes(Some(&running), &gone, true);
        assert_eq!(reasons(&notes), [("VirtualMachineInstance", "Stopped")]);
    }

    #[test]
    fn migrations_and_crashes_are_told() {
        let before = seen_vmi(&vmi(json!({"phase": "Running", "nodeName": "n1"}), false));
        let moved = vmi(
            json!({"phase": "Running", "nodeName": "n2", "migrationState":
            {"migrationUid": "m-1", "completed": true}}),
            false,
        );
        let notes = vmi_notes(Some(&before), &moved, false);
        assert_eq!(reasons(&notes), [("VirtualMachineInstance", "Migrated")]);
        assert_eq!(
            notes[0].message,
            "The VirtualMachineInstance migrated to node n2."
        );

        let failed = vmi(
            json!({"phase": "Running", "nodeName": "n1", "migrationState":
            {"migrationUid": "m-2", "failed": true, "failureReason": "target refused"}}),
            false,
        );
        let notes = vmi_notes(Some(&before), &failed, false);
        assert_eq!(
            reasons(&notes),
            [("VirtualMachineInstance", "MigrationFailed")]
        );
        assert!(
            notes[0].message.contains("target refused"),
            "{}",
            notes[0].message
        );
        assert!(vmi_notes(Some(&seen_vmi(&failed)), &failed, false).is_empty());

        let crashed = vmi(json!({"phase": "Failed", "nodeName": "n1"}), false);
        let notes = vmi_notes(Some(&before), &crashed, false);
        assert_eq!((notes[0].reason, notes[0].type_), ("Stopped", WARNING));
        assert_eq!(notes[0].message, "The VirtualMachineInstance crashed.");
    }

    impl Note {
        fn source_of(&self) -> (&str, Option<&str>) {
            (self.component, self.host.as_deref())
        }
    }

    /// A repeat counts on one event; old events and those beyond the cap are pruned.
    #[tokio::test]
    async fn repeats_count_and_old_events_go() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(&d.path().join("db")).await.unwrap();
        let v = vmi(json!({"phase": "Running"}), false);
        let note = Note::about(
            Kind::VirtualMachineInstance,
            &v,
            WARNING,
            "FailedScheduling",
        )
        .says("no node");
        for _ in 0..3 {
            record(&store, &note).await.unwrap();
        }
        record(&store, &note.clone().says("another reason"))
            .await
            .unwrap();
        let mut events: Vec<Event> = store.all().await.unwrap();
        events.sort_by_key(|e| e.count);
        assert_eq!(events.len(), 2);
        assert_eq!(events[1].count, Some(3));
        assert_eq!(events[1].involved_object.uid.as_deref(), Some("u-1"));
        assert_eq!(
            events[1].source.as_ref().unwrap().component.as_deref(),
            Some(CONTROLLER)
        );

        // Nothing is old yet; a cap of one keeps the newest.
        assert_eq!(
            prune_events(&store, Timestamp::now(), KEEP, 10)
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            prune_events(&store, Timestamp::now(), KEEP, 1)
                .await
                .unwrap(),
            1
        );
        let left: Vec<Event> = store.all().await.unwrap();
        assert_eq!(left.len(), 1);
        // Four days on, it is older than three days.
        let later = Timestamp::now() + SignedDuration::from_hours(96);
        assert_eq!(prune_events(&store, later, KEEP, 10).await.unwrap(), 1);
        assert!(store.all::<Event>().await.unwrap().is_empty());
    }
}
