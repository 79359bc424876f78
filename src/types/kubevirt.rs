//! The `kubevirt.io/v1` kinds edgevirt serves: `VirtualMachine` and `VirtualMachineInstance`,
//! with KubeVirt's field names. Only the fields edgevirt implements are modelled; the specs
//! decode tolerantly (unknown fields are ignored, as every peer of another release must), and
//! admission ([`crate::types::decode`]) refuses unknown fields, naming KubeVirt fields that exist
//! upstream but are not supported here yet, so nothing a user wrote is silently dropped.

use std::collections::BTreeMap;

use kube::CustomResource;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a VM's instance is kept running, as KubeVirt's `spec.runStrategy`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum RunStrategy {
    Always,
    RerunOnFailure,
    Manual,
    #[default]
    Halted,
    Once,
}

/// What the VM is: the instance it runs (its template), how that instance is kept running,
/// and the instancetype, preference and DataVolumes it uses.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachine",
    namespaced,
    status = "VirtualMachineStatus",
    shortname = "vm",
    shortname = "vms",
    category = "all",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.printableStatus"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].status"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct VirtualMachineSpec {
    /// Deprecated KubeVirt switch: `true` is `Always`, `false` is `Halted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_strategy: Option<RunStrategy>,
    /// The VM's size from a `VirtualMachine(Cluster)Instancetype`: its vCPUs and memory,
    /// which the template may then not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instancetype: Option<Matcher>,
    /// Defaults for what the template leaves unset, from a `VirtualMachine(Cluster)Preference`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preference: Option<Matcher>,
    /// DataVolumes the VM owns: created with it, deleted with it, named by its
    /// `dataVolume` volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_volume_templates: Vec<super::cdi::DataVolumeTemplateSpec>,
    /// The instance the VM creates when it starts: its labels, annotations and spec.
    pub template: VirtualMachineInstanceTemplateSpec,
    /// How a change of the VM's volumes reaches its running instance: `Replacement` (the
    /// only one here, and KubeVirt's default) applies it at the next start; `Migration`
    /// (moving the disks of a running VM) is not supported yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_volumes_strategy: Option<String>,
}

impl VirtualMachine {
    /// The owner reference of what the VM controls (its instance, its revisions).
    pub fn owner_reference(
        &self,
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "kubevirt.io/v1".into(),
            kind: "VirtualMachine".into(),
            name: self.metadata.name.clone().unwrap_or_default(),
            uid: self.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }
}

impl VirtualMachineSpec {
    /// The effective run strategy, folding in the older `running` field.
    pub fn strategy(&self) -> RunStrategy {
        match (self.run_strategy, self.running) {
            (Some(s), _) => s,
            (None, Some(true)) => RunStrategy::Always,
            _ => RunStrategy::Halted,
        }
    }
}

/// The instance a VM creates each time it starts.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct VirtualMachineInstanceTemplateSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// The spec of the instance, as a VirtualMachineInstance's `spec`.
    pub spec: VirtualMachineInstanceSpec,
}

/// The part of `ObjectMeta` a template may carry.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMeta {
    /// Labels the instance gets (edgevirt adds `kubevirt.io/vm`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations the instance gets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// KubeVirt templates often carry `creationTimestamp: null`; accepted and ignored.
    #[serde(default, skip_serializing)]
    pub creation_timestamp: Option<serde_json::Value>,
}

/// What the controller last observed about the VM and its instance.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    /// A one-word summary for `kubectl get`: Stopped, Starting, Running, Paused, Stopping,
    /// Terminating, CrashLoopBackOff, ErrorUnschedulable, ErrImagePull or Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub printable_status: Option<String>,
    /// Whether the VM's instance exists.
    #[serde(default)]
    pub created: bool,
    /// Whether the VM's instance exists and is Ready.
    #[serde(default)]
    pub ready: bool,
    /// The VM's conditions: `Ready`, and `Failure` when it cannot start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Start and stop requests made through the VM's subresources (`virtctl start`, `stop`,
    /// `restart`), carried out in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_change_requests: Vec<StateChangeRequest>,
    /// The effective run strategy, as KubeVirt reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_strategy: Option<RunStrategy>,
    /// Failed starts and when the next one may come, as KubeVirt's `startFailure`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_failure: Option<StartFailure>,
    /// The instancetype the VM uses and the revision (copy) of it the VM keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instancetype_ref: Option<StatusRef>,
    /// The preference the VM uses and the revision (copy) of it the VM keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preference_ref: Option<StatusRef>,
}

/// KubeVirt's `VirtualMachineStartFailure`: the crash-loop backoff of a VM.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StartFailure {
    /// How many starts in a row have failed.
    #[serde(default)]
    pub retries: u32,
    /// The uid of the last instance that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "lastFailedVMIUID")]
    pub last_failed_vmi_uid: Option<String>,
    /// When the next start may come (RFC 3339); the wait doubles from 10 seconds up to 5
    /// minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_timestamp: Option<String>,
}

/// A pending start or stop asked through a subresource, as KubeVirt's `stateChangeRequests`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StateChangeRequest {
    /// `Start` or `Stop`.
    pub action: String,
    /// The uid of the instance a `Stop` is for; unset means the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// What an instance runs: its virtual hardware (domain), volumes and networks, where it may
/// be placed, and how its guest is checked.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachineInstance",
    namespaced,
    status = "VirtualMachineInstanceStatus",
    shortname = "vmi",
    shortname = "vmis",
    category = "all",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".status.interfaces[0].ipAddress"}"#,
    printcolumn = r#"{"name":"NodeName","type":"string","jsonPath":".status.nodeName"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].status"}"#,
    printcolumn = r#"{"name":"Live-Migratable","type":"string","jsonPath":".status.conditions[?(@.type=='LiveMigratable')].status","priority":1}"#,
    printcolumn = r#"{"name":"Paused","type":"string","jsonPath":".status.conditions[?(@.type=='Paused')].status","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct VirtualMachineInstanceSpec {
    /// The virtual hardware: CPU, memory, devices, firmware, clock and hypervisor features.
    pub domain: DomainSpec,
    /// The guest's CPU architecture: `amd64` (the only one these hosts run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// The instance's volumes, each presented by the disk of the same name (a volume without
    /// a disk entry becomes a virtio disk).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// The networks the interfaces connect to; only `pod` networks (the node's NAT network)
    /// are supported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<Network>,
    /// Seconds the guest has to shut down after an ACPI power-off before the domain is
    /// destroyed; 30 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    /// Node labels the instance's node must all have.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Node affinity on node labels (and names); pod (anti-)affinity is not supported yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// The node taints the instance may be placed despite.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// How evenly the instances a selector picks spread over topology domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// Kept for a move to Kubernetes; edgevirt does not preempt VMs, so it has no effect
    /// here (docs/kubevirt-fields.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// `default-scheduler` (what Kubernetes writes when none is named) or empty: edgevirt's
    /// one scheduler. Any other name is refused: no other scheduler would place the VM here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// SSH keys and passwords from Secrets, put into the guest through cloud-init or the
    /// guest agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_credentials: Vec<AccessCredential>,
    /// Whether the guest is ready: the VMI's `Ready` condition waits for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Probe>,
    /// Whether the guest is alive: when it fails, the VMI fails (and its VM's run strategy
    /// decides whether it starts again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<Probe>,
    /// What `edgevirt node drain` does with the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_strategy: Option<EvictionStrategy>,
    /// `Paused`: the guest is created paused and runs once unpaused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_strategy: Option<StartStrategy>,
    /// The guest's hostname (cloud-init `local-hostname`); the VMI's name when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Kept for a move to Kubernetes (a headless Service's DNS domain); edgevirt has no
    /// cluster DNS, so it has no effect here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdomain: Option<String>,
}

/// Kubernetes' `Toleration`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Toleration {
    /// Empty with `Exists`: every taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `Equal` (the default) or `Exists`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    /// The taint value to match with `Equal`; empty with `Exists`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Empty: every effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
    /// Accepted; running instances are not evicted by `NoExecute` taints yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

/// Kubernetes' `Affinity`: by node, and by the other instances ("pods") on nodes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Affinity {
    /// Which nodes the instance must or prefers to run on, by node labels or names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<NodeAffinity>,
    /// Instances this one must or prefers to run near (in the same topology domain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_affinity: Option<PodAffinity>,
    /// Instances this one must or prefers to run away from (in another topology domain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_anti_affinity: Option<PodAffinity>,
}

/// Kubernetes' `TopologySpreadConstraint`: the instances its selector picks (in the
/// instance's namespace) may differ by at most `maxSkew` between topology domains.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct TopologySpreadConstraint {
    /// The largest difference allowed between the domain the instance lands in and the
    /// emptiest one, counting the instance (1 or more).
    pub max_skew: i32,
    /// The node label whose values are the domains (`kubernetes.io/hostname`: one node).
    pub topology_key: String,
    /// `DoNotSchedule` (a node that would break it is never chosen) or `ScheduleAnyway`
    /// (emptier domains are preferred).
    pub when_unsatisfiable: String,
    /// The instances counted (unset: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelectorSpec>,
    /// Not supported yet: refused by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_domains: Option<i32>,
    /// Not supported yet: refused by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_label_keys: Vec<String>,
    /// Not supported yet: refused by name (edgevirt counts every ready node's domain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity_policy: Option<String>,
    /// Not supported yet: refused by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_taints_policy: Option<String>,
}

/// Kubernetes' `PodAffinity` and `PodAntiAffinity` (the same fields), read against the
/// instances placed on nodes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct PodAffinity {
    /// Terms ANDed: a node that breaks one is never chosen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_during_scheduling_ignored_during_execution: Vec<PodAffinityTerm>,
    /// Each term met (affinity) or broken (anti-affinity) adds or takes its weight.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred_during_scheduling_ignored_during_execution: Vec<WeightedPodAffinityTerm>,
}

/// Which instances a term is about, and what "near" means.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct PodAffinityTerm {
    /// The instances' labels to match (unset: none match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelectorSpec>,
    /// The namespaces of those instances; empty: the instance's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Namespaces by their labels: only `{}` (every namespace) is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelectorSpec>,
    /// The node label whose value is a topology domain: `kubernetes.io/hostname` (the
    /// node's name when the node has no such label) means one node.
    pub topology_key: String,
}

/// A preferred term and its weight (1 to 100).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct WeightedPodAffinityTerm {
    /// 1 to 100.
    pub weight: i32,
    /// The term.
    pub pod_affinity_term: PodAffinityTerm,
}

/// Kubernetes' `LabelSelector`: `matchLabels` and `matchExpressions`, ANDed.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct LabelSelectorSpec {
    /// Labels that must have exactly these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements with In, NotIn, Exists or DoesNotExist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One requirement of a label selector.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    /// The label's key.
    pub key: String,
    /// In, NotIn, Exists or DoesNotExist.
    pub operator: String,
    /// One value or more for In and NotIn, none for Exists and DoesNotExist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct NodeAffinity {
    /// Nodes that do not match are never chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_during_scheduling_ignored_during_execution: Option<NodeSelector>,
    /// Among the nodes that fit, those matching more weight are chosen first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred_during_scheduling_ignored_during_execution: Vec<PreferredSchedulingTerm>,
}

/// Terms ORed: a node matches when it matches one of them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct NodeSelector {
    /// The terms; a node must match at least one.
    pub node_selector_terms: Vec<NodeSelectorTerm>,
}

/// Requirements ANDed.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct NodeSelectorTerm {
    /// On the node's labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<NodeSelectorRequirement>,
    /// On the node's fields: `metadata.name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_fields: Vec<NodeSelectorRequirement>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct NodeSelectorRequirement {
    /// The node label's key; in `matchFields`, the field `metadata.name`.
    pub key: String,
    /// In, NotIn, Exists, DoesNotExist, Gt, Lt.
    pub operator: String,
    /// The values: one or more for In and NotIn, one integer for Gt and Lt, none for Exists
    /// and DoesNotExist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct PreferredSchedulingTerm {
    /// 1 to 100.
    pub weight: i32,
    /// What a node must match to get the weight.
    pub preference: NodeSelectorTerm,
}

// The CRD inlines these enums, so their docs are what `kubectl explain` shows for the field.
/// KubeVirt's `startStrategy`: `Paused` creates the guest paused; it runs once unpaused
/// (`edgevirt vm unpause`, `virtctl unpause`). Unset, it starts running.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum StartStrategy {
    /// Created paused (its vCPUs never ran); `edgevirt vm unpause` (or `virtctl unpause`)
    /// lets it run.
    Paused,
}

/// KubeVirt's `evictionStrategy`: what `edgevirt node drain` does with the instance. `LiveMigrate` migrates it (the drain fails if it
/// cannot), `LiveMigrateIfPossible` migrates it when it is live-migratable and otherwise
/// treats it as `None`, `None` leaves it running (a forced drain stops it).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum EvictionStrategy {
    /// Not moved: the drain stops it only when forced (`--force`), and its VM's run
    /// strategy decides whether it starts again elsewhere.
    None,
    /// Live-migrated; the drain fails if it cannot move.
    LiveMigrate,
    /// Live-migrated when it can be, else treated as `None`.
    LiveMigrateIfPossible,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct AccessCredential {
    /// SSH public keys from a Secret, put into the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_public_key: Option<SshPublicKeyAccessCredential>,
    /// User passwords from a Secret, set in the guest by the guest agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_password: Option<UserPasswordAccessCredential>,
}

/// Authorized SSH keys: every value of the Secret holds one or more keys, one per line.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct SshPublicKeyAccessCredential {
    /// The Secret holding the keys.
    pub source: AccessCredentialSource,
    /// How the keys reach the guest: `noCloud` (cloud-init user data), `configDrive` (the
    /// config drive's `meta_data.json`, `public_keys`) or `qemuGuestAgent`.
    pub propagation_method: SshPropagation,
}

/// Passwords: the Secret maps user names to their passwords.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct UserPasswordAccessCredential {
    /// The Secret mapping user names to passwords.
    pub source: AccessCredentialSource,
    /// How the passwords reach the guest: only `qemuGuestAgent` is supported.
    pub propagation_method: PasswordPropagation,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct AccessCredentialSource {
    /// A Secret in the instance's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretName>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct SecretName {
    /// The Secret's name.
    pub secret_name: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct SshPropagation {
    /// Into the user data of the VMI's `cloudInitNoCloud` volume (`ssh_authorized_keys`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_cloud: Option<Empty>,
    /// Into `public_keys` of the `meta_data.json` of the VMI's `cloudInitConfigDrive` volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_drive: Option<Empty>,
    /// Written by the guest agent into each user's `~/.ssh/authorized_keys`, and kept in
    /// step while the VMI runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qemu_guest_agent: Option<GuestAgentUsers>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct GuestAgentUsers {
    /// The guest users whose `~/.ssh/authorized_keys` the guest agent writes.
    pub users: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct PasswordPropagation {
    /// Set the passwords through the guest agent (`guest-set-user-password`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qemu_guest_agent: Option<Empty>,
}

/// KubeVirt's `Probe`: one of its actions, with Kubernetes' timings.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Probe {
    /// The guest agent answers a ping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_agent_ping: Option<Empty>,
    /// A command run in the guest by the guest agent; exit status 0 is success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecAction>,
    /// A TCP connection to the guest's address accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TcpSocketAction>,
    /// An HTTP GET to the guest's address answered with a status from 200 to 399.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HttpGetAction>,
    /// Seconds after the instance starts before the first probe; 0 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_seconds: Option<i32>,
    /// Seconds between probes; 10 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_seconds: Option<i32>,
    /// Seconds a probe may take before it counts as failed; 1 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
    /// Successes in a row, after a failure, before the probe passes; 1 by default, and it
    /// must be 1 for a liveness probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_threshold: Option<i32>,
    /// Failures in a row before the probe fails; 3 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<i32>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct ExecAction {
    /// The program and its arguments, run in the guest by the guest agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
}

/// A port by number; a named port (a container's) has no meaning for a VM.
pub type IntOrString = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct TcpSocketAction {
    /// The port to connect to, by number (named ports are refused).
    pub port: IntOrString,
    /// An IP address to connect to instead of the guest's own address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct HttpGetAction {
    /// The port to connect to, by number (named ports are refused).
    pub port: IntOrString,
    /// An IP address to connect to instead of the guest's own address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The URL path to request; `/` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// HTTP or HTTPS (whose certificate is not checked, as Kubernetes' probes do not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Extra headers sent with the request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http_headers: Vec<HttpHeader>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct HttpHeader {
    /// The header's name.
    pub name: String,
    /// The header's value.
    pub value: String,
}

impl VirtualMachineInstanceSpec {
    /// `domain.firmware.kernelBoot.container`, if the spec boots a kernel directly.
    pub fn kernel_boot_container(&self) -> Option<&KernelBootContainer> {
        self.domain
            .firmware
            .as_ref()
            .and_then(|f| f.kernel_boot.as_ref())
            .and_then(|k| k.container.as_ref())
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct DomainSpec {
    /// The vCPU topology, CPU model and features, and dedicated CPU placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    /// The guest's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// Resource requests of the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// The guest's devices: disks, network interfaces, consoles and others.
    #[serde(default)]
    pub devices: Devices,
    /// How the guest boots (BIOS, EFI or a kernel directly) and the SMBIOS system identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// The QEMU machine type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    /// Hypervisor features: ACPI, APIC, SMM, Hyper-V enlightenments, KVM hiding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Features>,
    /// The guest's clock: UTC (with an offset) or a timezone, and its timers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<Clock>,
    /// The SMBIOS chassis the guest sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chassis: Option<Chassis>,
    /// I/O threads for virtio disks: `shared` (one for all), `auto` (a pool of up to two
    /// per vCPU, disks spread over it) or `supplementalPool` (a pool of
    /// `ioThreads.supplementalPoolThreadCount`, disks spread over it); a disk with
    /// `dedicatedIOThread` gets its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_threads_policy: Option<String>,
    /// The size of the `supplementalPool` I/O thread pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_threads: Option<DiskIoThreads>,
    /// What a reboot inside the guest does: `Reboot` (the default: it reboots) or
    /// `Terminate` (the instance ends, and its VM's run strategy decides whether a new one
    /// starts, with the VM's current spec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot_policy: Option<String>,
}

/// KubeVirt's `FeatureState`: present means on unless `enabled: false`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct FeatureState {
    /// `false` turns the feature off; it is on otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

impl FeatureState {
    pub fn on(&self) -> bool {
        self.enabled != Some(false)
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Features {
    /// ACPI, which the guest needs for power-off requests; on by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acpi: Option<FeatureState>,
    /// The APIC; on by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apic: Option<FeatureApic>,
    /// System Management Mode; Secure Boot cannot run without it, so it must be on with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smm: Option<FeatureState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hyperv: Option<FeatureHyperv>,
    /// KVM-specific settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvm: Option<FeatureKvm>,
    /// Paravirtualized spinlocks; not used under TCG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvspinlock: Option<FeatureState>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct FeatureApic {
    /// `false` turns the APIC off; it is on otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Turns on end-of-interrupt (EOI) notifications in the guest; off by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_of_interrupt: Option<bool>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct FeatureKvm {
    /// `true` hides from the guest's standard discovery that it runs on KVM; off by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<bool>,
}

/// Hyper-V enlightenments for Windows guests, as KubeVirt names them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct FeatureHyperv {
    /// Relaxed timing: the guest does not time out on watchdogs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relaxed: Option<FeatureState>,
    /// Paravirtualized APIC access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vapic: Option<FeatureState>,
    /// How often the guest retries a spinlock before notifying the hypervisor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spinlocks: Option<FeatureSpinlocks>,
    /// The virtual processor index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpindex: Option<FeatureState>,
    /// Processor time accounting for the guest's scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<FeatureState>,
    /// The synthetic interrupt controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synic: Option<FeatureState>,
    /// Synthetic timers of the synthetic interrupt controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synictimer: Option<SynicTimer>,
    /// Reset of the guest through Hyper-V.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset: Option<FeatureState>,
    /// The hypervisor vendor id the guest sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendorid: Option<FeatureVendorId>,
    /// The TSC and APIC frequencies, read by the guest from the hypervisor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequencies: Option<FeatureState>,
    /// Notifications to the guest when the TSC frequency changes (after a migration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reenlightenment: Option<FeatureState>,
    /// Paravirtualized TLB flushes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tlbflush: Option<TlbFlush>,
    /// Paravirtualized inter-processor interrupts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipi: Option<FeatureState>,
    /// Enlightened VMCS, for nested virtualization in the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evmcs: Option<FeatureState>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct FeatureSpinlocks {
    /// `false` turns the spinlock enlightenment off; it is on otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Retries before a spinlock is reported to the hypervisor; KubeVirt's default 4096.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spinlocks: Option<u32>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct SynicTimer {
    /// `false` turns the synthetic timers off; they are on otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Direct-mode synthetic timers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct: Option<FeatureState>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct TlbFlush {
    /// `false` turns paravirtualized TLB flushes off; they are on otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// TLB flushes sent straight to the hypervisor, which helps nested guests (Windows VBS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct: Option<FeatureState>,
    /// Partial (extended) TLB flushes; accepted, but not passed to libvirt yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extended: Option<FeatureState>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct FeatureVendorId {
    /// `false` turns the vendor id off; it is on otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// The vendor id: 1 to 12 letters or digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendorid: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Clock {
    /// Keep the guest's clock in UTC, optionally with an offset; exclusive with `timezone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utc: Option<ClockOffsetUtc>,
    /// An IANA timezone (`Europe/Berlin`) the guest's RTC keeps, as Windows expects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// The guest's timers and their tick policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timer: Option<Timers>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct ClockOffsetUtc {
    /// The guest clock's offset from UTC, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset_seconds: Option<i64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Timers {
    /// The High Precision Event Timer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hpet: Option<Timer>,
    /// The KVM paravirtual clock (`kvmclock`), for Linux guests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvm: Option<Timer>,
    /// The Programmable Interval Timer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pit: Option<Timer>,
    /// The Real Time Clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtc: Option<Timer>,
    /// The Hyper-V reference clock (`hypervclock`), for Windows guests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hyperv: Option<Timer>,
}

/// One timer (KubeVirt has a type per timer; their fields are this one's subsets).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Timer {
    /// `false` removes the timer; a timer named here is present otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
    /// `delay`, `catchup`, `merge` or `discard` (hpet, pit, rtc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tick_policy: Option<String>,
    /// `guest` or `wall` (rtc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub track: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Chassis {
    /// The chassis manufacturer: at most 64 printable ASCII characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manufacturer: Option<String>,
    /// The chassis version: at most 64 printable ASCII characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The chassis serial number: at most 64 printable ASCII characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// The chassis asset tag: at most 64 printable ASCII characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asset: Option<String>,
    /// The chassis SKU number: at most 64 printable ASCII characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sku: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Cpu {
    /// Cores per socket; 1 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Sockets; 1 by default. Sockets times cores times threads is at most 288 vCPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    /// Threads per core; 1 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// `host-model`, `host-passthrough` or a named libvirt CPU model (KubeVirt's
    /// `spec.domain.cpu.model`); unset means the cluster default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// CPU features to add or remove, as KubeVirt's `spec.domain.cpu.features`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<CpuFeature>,
    /// Pin each vCPU to a host CPU no other dedicated instance on the node holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedicated_cpu_placement: Option<bool>,
    /// One more dedicated host CPU, for QEMU's emulator thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolate_emulator_thread: Option<bool>,
}

/// One entry of KubeVirt's `spec.domain.cpu.features`: a libvirt feature name and its policy
/// (`force`, `require`, `optional`, `disable`, `forbid`; KubeVirt's default is `require`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct CpuFeature {
    /// The feature's libvirt name (`avx2`, `vmx`).
    pub name: String,
    /// `force`, `require` (the default), `optional`, `disable` or `forbid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Memory {
    /// The memory the guest sees, a quantity (`2Gi`) from 16Mi to 16Ti;
    /// `resources.requests.memory` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Resources {
    /// Only `memory` is taken (the guest's memory when `memory.guest` is unset); other
    /// requests are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Devices {
    /// The disks and CD-ROMs the guest sees, each presenting the volume of the same name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<Disk>,
    /// The guest's network interfaces, each on the network of the same name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    /// `false`: no graphics device, so no VNC console; one is attached otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_graphics_device: Option<bool>,
    /// `false`: no serial console; one is attached otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_serial_console: Option<bool>,
    /// `false`: an instance with no interfaces and no networks has no NIC; otherwise it
    /// gets one on the node's NAT network (KubeVirt's default pod interface, here with
    /// `masquerade`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_pod_interface: Option<bool>,
    /// A virtio random number generator fed from the host's `/dev/urandom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rng: Option<Rng>,
    /// Pointing devices: a tablet on USB or virtio (absolute pointer, for VNC).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<Input>,
    /// A tablet even when `inputs` names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_input_device: Option<bool>,
    /// `false`: no memory balloon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoattach_mem_balloon: Option<bool>,
    /// The graphics adapter behind the VNC console.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub video: Option<VideoDevice>,
    /// A watchdog that acts when the guest stops feeding it; only `i6300esb` is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<Watchdog>,
    /// A virtual TPM 2.0 (swtpm), as Windows 11 and measured boot need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<TpmDevice>,
    /// A sound card, for guests that need one; the sound goes nowhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sound: Option<SoundDevice>,
    /// Devices through which the guest reports a panic to the host, which then destroys the
    /// domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub panic_devices: Vec<PanicDevice>,
    /// One queue per vCPU on virtio disks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_multi_queue: Option<bool>,
    /// One queue per vCPU on virtio network interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_interface_multiqueue: Option<bool>,
    /// virtio devices in their transitional form, for guests older than virtio 1.0
    /// (RHEL 6 and the like).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_virtio_transitional: Option<bool>,
    /// Accepted: the serial console goes to the launcher's socket (`edgevirt console`)
    /// either way; no separate log is kept yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_serial_console: Option<bool>,
    /// No virtio-scsi controller waits for hotplugged disks (`addvolume` is then refused by
    /// the node), unless a disk on the `scsi` bus needs one anyway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_hotplug: Option<bool>,
    /// Folders shared with the guest over virtiofs, each presenting the volume of the same
    /// name: a `persistentVolumeClaim`, whose folder `POOL/NAMESPACE/CLAIM/` on the shared
    /// pool is shared. The guest mounts it by its name: `mount -t virtiofs NAME /mnt`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filesystems: Vec<Filesystem>,
}

impl Volume {
    /// Added to a running guest by `addvolume` (a `dataVolume` or `persistentVolumeClaim`
    /// marked `hotpluggable`).
    pub fn hotpluggable(&self) -> bool {
        self.data_volume
            .as_ref()
            .and_then(|d| d.hotpluggable)
            .or(self
                .persistent_volume_claim
                .as_ref()
                .and_then(|c| c.hotpluggable))
            == Some(true)
    }
}

impl Devices {
    /// Whether a `filesystems` entry shares the volume `name` (then no disk presents it).
    pub fn is_filesystem(&self, name: &str) -> bool {
        self.filesystems.iter().any(|f| f.name == name)
    }
}

/// KubeVirt's `Filesystem`: a volume shared as a folder rather than presented as a disk.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Filesystem {
    /// The name of the volume it shares, and the tag the guest mounts it by.
    pub name: String,
    /// Share it over virtiofs (QEMU's virtiofsd), the one way KubeVirt has.
    pub virtiofs: Empty,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Input {
    /// The device's name.
    pub name: String,
    /// `tablet`, the one type KubeVirt has.
    #[serde(rename = "type")]
    pub type_: String,
    /// `usb` (the default) or `virtio`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct VideoDevice {
    /// `vga` (the default), `virtio`, `bochs` or `cirrus`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}

/// KubeVirt's `TPMDevice`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct TpmDevice {
    /// `false` turns off a vTPM a preference asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Keep the vTPM's state (its keys and NV storage) across restarts and live
    /// migrations, in the VM's folder on its node. Defaults to false: the state lives as
    /// long as the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent: Option<bool>,
}

impl TpmDevice {
    pub fn on(t: &Option<TpmDevice>) -> bool {
        t.as_ref().is_some_and(|t| t.enabled != Some(false))
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Watchdog {
    /// The watchdog's name.
    pub name: String,
    /// Intel 6300ESB, the x86 watchdog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub i6300esb: Option<I6300EsbWatchdog>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct I6300EsbWatchdog {
    /// `reset` (the default), `poweroff` or `shutdown` when the guest stops feeding it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct SoundDevice {
    /// The sound card's name.
    pub name: String,
    /// `ich9` (the default) or `ac97`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct PanicDevice {
    /// `isa` (the default on x86), `hyperv` or `pvpanic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// KubeVirt's `devices.rng`: no settings; its presence adds the device.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Rng {}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Disk {
    /// The name of the volume this disk presents.
    pub name: String,
    /// Present the volume as a hard disk, on `virtio` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskTarget>,
    /// Present the volume as a read-only CD-ROM, on `sata` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdrom: Option<DiskTarget>,
    /// The disk's place in the boot order, lowest first; when any disk has one, disks without
    /// one are not booted from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_order: Option<u32>,
    /// The serial number the guest sees for the disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// An I/O thread of its own (with `domain.ioThreadsPolicy`, or alone).
    #[serde(
        default,
        rename = "dedicatedIOThread",
        skip_serializing_if = "Option::is_none"
    )]
    pub dedicated_io_thread: Option<bool>,
    /// The host's cache mode for the disk: `none`, `writethrough` or `writeback`. Unset:
    /// `none` on the shared pool and for `shareable` or `io: native` disks, else QEMU's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// QEMU's I/O mode: `native` (Linux AIO; needs cache `none`), `threads` or `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<String>,
    /// What the guest sees on a host I/O error: `stop` (pause the VM; QEMU's default),
    /// `report`, `ignore` or `enospace` (stop only when the host disk is full).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_policy: Option<String>,
    /// Several VMs may write the disk at once (a cluster filesystem's disk): a raw disk,
    /// opened with cache `none` and without QEMU's image lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shareable: Option<bool>,
    /// The block sizes the guest sees (`custom` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<BlockSize>,
}

/// The block sizes a disk presents to the guest.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct BlockSize {
    /// Sizes given in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom: Option<CustomBlockSize>,
    /// The sizes of the storage below: not supported yet (refused by name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_volume: Option<FeatureState>,
}

/// Logical and physical block size (powers of two from 512 bytes to 2 MiB, physical at
/// least logical) and the discard granularity, in bytes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct CustomBlockSize {
    /// The smallest unit the guest may address.
    #[serde(default)]
    pub logical: u32,
    /// The unit the guest should write in for best speed.
    #[serde(default)]
    pub physical: u32,
    /// The unit of discard requests (0 or unset: QEMU's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discard_granularity: Option<u32>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct DiskTarget {
    /// `virtio`, `sata` or `scsi`; other buses (such as `usb`) are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    /// Attach the volume read-only; a CD-ROM always is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
}

/// An empty object, as KubeVirt uses for `masquerade: {}` or `pod: {}`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Empty {}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Interface {
    /// The name of the network this interface connects to.
    pub name: String,
    /// NAT through the node's libvirt network, the binding edgevirt supports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masquerade: Option<Empty>,
    /// Bridge binding: the NIC joins the host bridge of a `multus` network (refused on a
    /// `pod` network: use `masquerade` there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<Empty>,
    /// The interface's MAC address; by default one derived from the VM, stable across
    /// restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    /// The NIC model QEMU emulates: `virtio` (the default), `e1000`, `e1000e`, `rtl8139` and
    /// the like.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The ports a masquerade interface forwards (KubeVirt); edgevirt's NAT network takes
    /// no inbound connections from outside the node, so this is recorded and checked only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    /// Its place in the boot order (network boot, PXE), shared with the disks' `bootOrder`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_order: Option<u32>,
    /// The guest PCI address of the NIC, `DDDD:BB:SS.F` (e.g. `0000:01:01.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// The ACPI index the guest sees for the NIC (1 to 16383), which names it stably
    /// (`eno<N>` under systemd's naming).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acpi_index: Option<u32>,
    /// The link: `up` (or empty, the default) or `down` (the NIC is there with no carrier).
    /// `absent` (hot-unplug) is not supported yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Port {
    /// An optional name for the port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The port number, from 1 to 65535.
    pub port: i32,
    /// TCP (the default) or UDP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Firmware {
    /// BIOS (the default) or EFI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootloader: Option<Bootloader>,
    /// Boot a kernel (and initrd) directly instead of from a disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_boot: Option<KernelBoot>,
    /// The SMBIOS system UUID the guest sees (Windows licensing keys on it); by default
    /// one derived from the VM, stable across restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The SMBIOS system serial number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Bootloader {
    /// Boot with the legacy BIOS (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bios: Option<Empty>,
    /// Boot with UEFI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efi: Option<Efi>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Efi {
    /// Secure Boot (the OVMF firmware with Microsoft's keys enrolled); on unless `false`, as
    /// in KubeVirt, and then `features.smm` must be on too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
    /// Keep the VM's EFI variables (boot entries, Secure Boot keys) across restarts, in a
    /// file in the VM's folder on its node. Defaults to false: each instance starts from
    /// the firmware's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent: Option<bool>,
}

impl Efi {
    /// Whether Secure Boot is on: KubeVirt's default is on.
    pub fn secure(&self) -> bool {
        self.secure_boot != Some(false)
    }
}

/// Direct kernel boot. As in KubeVirt, `container.kernelPath` and `container.initrdPath` are
/// absolute paths of files inside the OCI image `container.image`, pulled by the node; or, as
/// edgevirt had it first, plain names of images imported with `edgevirt image import` (then
/// `container.image` is kept for round-trips and not used).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct KernelBoot {
    /// The kernel command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_args: Option<String>,
    /// Where the kernel and initrd come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<KernelBootContainer>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct KernelBootContainer {
    /// The OCI image holding the kernel and initrd, pulled by the node; kept but unused when
    /// `kernelPath` and `initrdPath` name imported images.
    #[serde(default)]
    pub image: String,
    /// The kernel: an absolute path inside `image`, or the name of an imported image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_path: Option<String>,
    /// The initrd: an absolute path inside `image`, or the name of an imported image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
    /// Always, IfNotPresent or Never; Always for a `:latest` or untagged image, else
    /// IfNotPresent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// As a containerDisk's: a `kubernetes.io/dockerconfigjson` Secret in the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secret: Option<String>,
}

impl KernelBootContainer {
    /// Whether the kernel (and initrd) are files inside `image`, as in KubeVirt (absolute
    /// paths), rather than names of images imported into edgevirt.
    pub fn from_image(&self) -> bool {
        self.kernel_path
            .as_deref()
            .is_some_and(|p| p.starts_with('/'))
            || self
                .initrd_path
                .as_deref()
                .is_some_and(|p| p.starts_with('/'))
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Machine {
    /// The QEMU machine type; `q35` by default.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub machine_type: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Volume {
    /// The volume's name, which the disk presenting it uses.
    pub name: String,
    /// An ephemeral disk from an OCI image or an imported image: the guest's writes are lost
    /// when the instance ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_disk: Option<ContainerDisk>,
    /// A DataVolume in the namespace: a persistent disk of the VM's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_volume: Option<DataVolumeSource>,
    /// Cloud-init data, given to the guest as a NoCloud ISO (volume label `cidata`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init_no_cloud: Option<CloudInitNoCloud>,
    /// Cloud-init data, given to the guest as an OpenStack config drive (an ISO labelled
    /// `config-2` holding `openstack/latest/user_data`, `meta_data.json` and
    /// `network_data.json`). Same fields as `cloudInitNoCloud`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init_config_drive: Option<CloudInitNoCloud>,
    /// A disk file on the shared storage pool, persistent and the same on every node that
    /// mounts the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimSource>,
    /// A blank disk of `capacity`, ephemeral like a containerDisk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_disk: Option<EmptyDiskSource>,
    /// A raw disk file on the node, inside the one folder the node allows for them
    /// (`serve --host-disk-dir`); anywhere else it is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_disk: Option<HostDisk>,
    /// A claim on the shared pool under an overlay of this instance's own: the guest reads
    /// the claim's disk, its writes go to the overlay and are gone when the instance ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<EphemeralVolumeSource>,
    /// A ConfigMap of the namespace: each key a file on an ISO disk, made anew at each start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapVolumeSource>,
    /// A Secret of the namespace: each key a file on an ISO disk, made anew at each start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretVolumeSource>,
    /// The instance's own name, namespace, uid, labels or annotations as files on an ISO
    /// disk.
    #[serde(
        default,
        rename = "downwardAPI",
        skip_serializing_if = "Option::is_none"
    )]
    pub downward_api: Option<DownwardApiVolumeSource>,
}

/// KubeVirt's `DiskIOThreads`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct DiskIoThreads {
    /// How many I/O threads the `supplementalPool` policy makes (1 to 64 here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supplemental_pool_thread_count: Option<u32>,
}

/// KubeVirt's `ConfigMapVolumeSource`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct ConfigMapVolumeSource {
    /// The ConfigMap's name, in the instance's namespace.
    #[serde(default)]
    pub name: String,
    /// `true`: a missing ConfigMap gives an empty disk instead of stopping the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// The ISO's volume label (`cfgdata` by default; `cidata`, `config-2` or `OEMDRV` let
    /// cloud-init or kickstart find it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_label: Option<String>,
}

/// KubeVirt's `SecretVolumeSource`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct SecretVolumeSource {
    /// The Secret's name, in the instance's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// `true`: a missing Secret gives an empty disk instead of stopping the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// The ISO's volume label (`cfgdata` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_label: Option<String>,
}

/// KubeVirt's `DownwardAPIVolumeSource`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct DownwardApiVolumeSource {
    /// The files: each a path on the disk and the field it holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<DownwardApiVolumeFile>,
    /// The ISO's volume label (`cfgdata` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_label: Option<String>,
}

/// Kubernetes' `DownwardAPIVolumeFile`, with field references only.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct DownwardApiVolumeFile {
    /// The file's path on the disk, relative, without `..`.
    pub path: String,
    /// The field it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_ref: Option<ObjectFieldSelector>,
    /// Accepted: files on an ISO are read-only, whatever their mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<i32>,
}

impl DownwardApiVolumeFile {
    /// The path, checked: relative, of plain names (letters, digits, `-`, `_`, `.`), no `..`.
    pub fn check_path(&self) -> Result<(), crate::types::Invalid> {
        if self.path.len() <= 253 && self.path.split('/').all(crate::types::is_file_name) {
            Ok(())
        } else {
            Err(crate::types::Invalid(format!(
                "path {:?}: a relative path of names (letters, digits, '-', '_', '.'), \
                 without '..'",
                self.path
            )))
        }
    }
}

/// The metadata a downwardAPI file can hold.
pub struct DownwardMeta<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub uid: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub annotations: &'a BTreeMap<String, String>,
}

/// Kubernetes' `ObjectFieldSelector`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct ObjectFieldSelector {
    /// `v1` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `metadata.name`, `metadata.namespace`, `metadata.uid`, `metadata.labels`,
    /// `metadata.annotations`, or one of them: `metadata.labels['KEY']`.
    pub field_path: String,
}

impl ObjectFieldSelector {
    /// The field it names, checked: (`metadata.name` and the like, a label or annotation
    /// key).
    fn parse(&self) -> Result<(&str, Option<&str>), crate::types::Invalid> {
        let p = self.field_path.as_str();
        if self.api_version.as_deref().is_some_and(|v| v != "v1") {
            return Err(crate::types::Invalid(format!(
                "fieldRef.apiVersion {:?}: only v1",
                self.api_version.as_deref().unwrap_or_default()
            )));
        }
        const WHOLE: [&str; 5] = [
            "metadata.name",
            "metadata.namespace",
            "metadata.uid",
            "metadata.labels",
            "metadata.annotations",
        ];
        if WHOLE.contains(&p) {
            return Ok((p, None));
        }
        for map in ["metadata.labels", "metadata.annotations"] {
            if let Some(key) = p
                .strip_prefix(map)
                .and_then(|r| r.strip_prefix("['"))
                .and_then(|r| r.strip_suffix("']"))
                .filter(|k| !k.is_empty() && !k.contains('\''))
            {
                return Ok((map, Some(key)));
            }
        }
        Err(crate::types::Invalid(format!(
            "fieldRef.fieldPath {p:?}: one of {}, or metadata.labels['KEY'] or \
             metadata.annotations['KEY'] (other fields are not supported yet)",
            WHOLE.join(", ")
        )))
    }

    pub fn check(&self) -> Result<(), crate::types::Invalid> {
        self.parse().map(drop)
    }

    /// Its value for an instance with this metadata, as the kubelet writes it: a map as
    /// sorted `key="value"` lines, a missing key as an empty file.
    pub fn value(&self, m: &DownwardMeta) -> Result<String, crate::types::Invalid> {
        let (field, key) = self.parse()?;
        let map = match field {
            "metadata.name" => return Ok(m.name.to_string()),
            "metadata.namespace" => return Ok(m.namespace.to_string()),
            "metadata.uid" => return Ok(m.uid.to_string()),
            "metadata.labels" => m.labels,
            _ => m.annotations,
        };
        Ok(match key {
            Some(k) => map.get(k).cloned().unwrap_or_default(),
            None => map
                .iter()
                .map(|(k, v)| format!("{k}={}", serde_json::Value::from(v.as_str())))
                .collect::<Vec<_>>()
                .join("\n"),
        })
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct EmptyDiskSource {
    /// A quantity (`2Gi`).
    pub capacity: String,
}

/// KubeVirt's `hostDisk`: a raw disk file at a path on the node.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct HostDisk {
    /// The file's absolute path, inside the node's host disk folder.
    pub path: String,
    /// `Disk` (it must exist) or `DiskOrCreate` (a sparse file of `capacity` is made).
    #[serde(rename = "type")]
    pub type_: String,
    /// The size of a disk `DiskOrCreate` makes (a quantity, `1Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<String>,
    /// The same file is on every node (shared storage): the VM then migrates without a copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<bool>,
}

/// KubeVirt's `ephemeral` volume: a claim read under a throwaway overlay.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct EphemeralVolumeSource {
    /// The claim whose disk is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimSource>,
}

/// A persistent volume: the disk file `CLAIM.qcow2` (or `CLAIM.raw`) in the namespace's
/// folder of the shared storage pool the nodes mount (`serve --shared-pool NAME=PATH`). Like
/// a ReadWriteMany PVC it is the same disk on every node that mounts the pool, so the VM
/// live-migrates without copying it; edgevirt never creates or deletes it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct PersistentVolumeClaimSource {
    /// The claim's name: the disk `NAME.qcow2` (or `NAME.raw`) in the namespace's folder of
    /// the pool.
    pub claim_name: String,
    /// Attach the disk read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Added to the running guest (`addvolume`), and taken away by `removevolume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotpluggable: Option<bool>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct ContainerDisk {
    /// An OCI image in a registry holding the disk under `/disk/` (KubeVirt's containerDisk
    /// layout), pulled by the node that runs the VM; or the plain name of an image imported
    /// with `edgevirt image import`. Its writes go when the instance ends.
    pub image: String,
    /// Always, IfNotPresent or Never; Always for a `:latest` or untagged image, else
    /// IfNotPresent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// A `kubernetes.io/dockerconfigjson` Secret in the VM's namespace with the registry's
    /// credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secret: Option<String>,
}

/// Whether a `containerDisk.image` names an OCI image in a registry (it has a registry host,
/// a repository path, a tag or a digest) rather than an image imported into edgevirt (a
/// plain DNS-1123 name, as before registries existed, so those names keep working).
pub fn names_registry_image(image: &str) -> bool {
    image.contains(['/', ':', '@'])
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct DataVolumeSource {
    /// The name of a DataVolume in the VM's namespace (or of one of its
    /// `dataVolumeTemplates`); else of an imported image, as edgevirt's dashboard writes it.
    pub name: String,
    /// Added to the running guest (`addvolume`), and taken away by `removevolume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotpluggable: Option<bool>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct CloudInitNoCloud {
    /// The user data, inline (`#cloud-config` and the like).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    /// The user data, base64-encoded; used when `userData` is unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_base64: Option<String>,
    /// The network configuration (cloud-init's `network-config`), inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data: Option<String>,
    /// The network configuration, base64-encoded; used when `networkData` is unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data_base64: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Network {
    /// The network's name, which the interface on it uses.
    pub name: String,
    /// The NAT network of the node (its subnet is a node setting, `--nat-prefix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<Empty>,
    /// A NetworkAttachmentDefinition's network (a host bridge, maybe a VLAN), joined with a
    /// `bridge` interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multus: Option<MultusNetwork>,
}

/// A network defined by a NetworkAttachmentDefinition, as KubeVirt names it through Multus.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct MultusNetwork {
    /// The NetworkAttachmentDefinition: `name` (in the instance's namespace) or
    /// `namespace/name`.
    pub network_name: String,
    /// Multus' default network of the pod; here it only makes this the first interface's
    /// network when the instance has no `pod` network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<bool>,
}

/// What the controller and the node's agent last observed about the instance.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceStatus {
    /// Where the instance is in its life: Pending, Scheduling, Scheduled, Running, Succeeded,
    /// Failed or Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// A one-word reason for the phase when something went wrong (`LivenessProbeFailed`,
    /// `NodeUnresponsive`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The node the instance is placed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The instance's conditions, such as `Ready`, `LiveMigratable`, `Paused` and
    /// `Synchronized`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The guest's network interfaces and their addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStatus>,
    /// The guest's operating system, as the guest agent reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "guestOSInfo")]
    pub guest_os_info: Option<GuestOsInfo>,
    /// edgevirt extension: what the guest agent last reported (served by `guestosinfo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_agent_info: Option<GuestAgentInfo>,
    /// `frozen` while the guest's filesystems are frozen (the `freeze` subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_freeze_status: Option<String>,
    /// edgevirt's first form of the timestamps below, still written for peers of earlier
    /// releases.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub phase_transition_timestamps_map: BTreeMap<String, String>,
    /// When the instance entered each phase, in order, as KubeVirt lists them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_transition_timestamps: Vec<VmiPhaseTransition>,
    /// edgevirt extension: the libvirt domain this instance runs as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_name: Option<String>,
    /// edgevirt extension: the release of the launcher serving this instance (it keeps
    /// running an older release until the VM restarts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launcher_version: Option<String>,
    /// The vCPU topology the domain runs with, as its launcher reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "currentCPUTopology")]
    pub current_cpu_topology: Option<CpuTopologyStatus>,
    /// The migration in flight or the last one, as KubeVirt's `migrationState`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_state: Option<MigrationState>,
    /// How the instance migrates: `LiveMigration` or `BlockMigration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_method: Option<MigrationMethod>,
    /// The instance's claim and DataVolume volumes, with the claims' access modes (a
    /// ReadWriteMany one lives on a shared pool and migrates without a copy), written when
    /// it is scheduled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_status: Vec<VolumeStatus>,
}

/// One volume of an instance, as KubeVirt's `VolumeStatus` (the parts edgevirt writes).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatus {
    /// The volume's name.
    pub name: String,
    /// The disk's target device, when known (empty until then).
    #[serde(default)]
    pub target: String,
    /// The claim behind a `persistentVolumeClaim` or `dataVolume` volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_info: Option<PersistentVolumeClaimInfo>,
    /// A hotplugged volume's phase: `Pending` until the node attached it, then `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Why it is in that phase (`VolumeReady`, `AttachFailed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What happened to it, in words (the device it was attached as, or why not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Set on the volumes `addvolume` added (KubeVirt names the pod that attached it here;
    /// edgevirt has none, so it is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotplug_volume: Option<HotplugVolumeStatus>,
}

/// KubeVirt's `HotplugVolumeStatus`: present on a hotplugged volume.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HotplugVolumeStatus {}

/// What KubeVirt caches about a volume's claim: its name and access modes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaimInfo {
    /// The claim's name (a DataVolume's claim has the DataVolume's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// `ReadWriteMany` for a disk on the shared pool, `ReadWriteOnce` on a node's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_modes: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuTopologyStatus {
    /// Sockets.
    #[serde(default)]
    pub sockets: u32,
    /// Cores per socket.
    #[serde(default)]
    pub cores: u32,
    /// Threads per core.
    #[serde(default)]
    pub threads: u32,
}

/// One condition of an object, as Kubernetes writes them: a type with a True, False or
/// Unknown status.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type, such as `Ready`.
    #[serde(rename = "type")]
    pub type_: ConditionType,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// A one-word reason for the status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable explanation of the status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// When the condition was last checked (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<String>,
}

impl Condition {
    /// A condition that is True when `ok`, else False, changed now.
    pub fn new(type_: ConditionType, ok: bool, reason: &str, message: &str) -> Self {
        Condition {
            type_,
            status: if ok {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            reason: (!reason.is_empty()).then(|| reason.to_string()),
            message: (!message.is_empty()).then(|| message.to_string()),
            last_transition_time: Some(crate::types::now()),
            last_probe_time: None,
        }
    }

    pub fn is_true(&self) -> bool {
        self.status == ConditionStatus::True
    }
}

/// The one way to change a condition list: replace the condition of the same type or add
/// it, keeping its transition time when its status did not change. Returns whether
/// anything but that time changed, so callers can skip a write that changes nothing.
pub fn set_condition(conditions: &mut Vec<Condition>, mut c: Condition) -> bool {
    if let Some(old) = conditions.iter_mut().find(|o| o.type_ == c.type_) {
        if old.status == c.status {
            c.last_transition_time = old.last_transition_time.clone();
        }
        let changed = *old != c;
        *old = c;
        changed
    } else {
        conditions.push(c);
        true
    }
}

/// Remove the condition of a type; whether there was one.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &ConditionType) -> bool {
    let before = conditions.len();
    conditions.retain(|c| &c.type_ != type_);
    conditions.len() != before
}

/// The condition of a type, if present.
pub fn condition<'a>(conditions: &'a [Condition], type_: &ConditionType) -> Option<&'a Condition> {
    conditions.iter().find(|c| &c.type_ == type_)
}

/// Whether the condition of a type is present and True.
pub fn condition_true(conditions: &[Condition], type_: &ConditionType) -> bool {
    condition(conditions, type_).is_some_and(Condition::is_true)
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStatus {
    /// The name of the spec's interface this is (`default` when the spec lists none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The interface's first IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
    /// All of the interface's IP addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    /// The interface's MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// The interface's name as its source reports it (the guest's own, such as `eth0`, from
    /// the guest agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    /// Where the addresses come from: `guest-agent` or `dhcp-lease`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info_source: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GuestOsInfo {
    /// The OS's id (`ubuntu`, `mswindows`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The OS's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The OS's full name, with its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pretty_name: Option<String>,
    /// The OS's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The OS's version id (`24.04`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
    /// The kernel's release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_release: Option<String>,
    /// The kernel's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_version: Option<String>,
    /// The guest's machine architecture (`x86_64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
}

/// The shape of KubeVirt's `VirtualMachineInstanceGuestAgentInfo`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GuestAgentInfo {
    /// The guest agent's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_agent_version: Option<String>,
    /// The guest's hostname.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The guest's operating system.
    #[serde(default)]
    pub os: GuestOsInfo,
    /// The guest's timezone and its offset from UTC in seconds (`Europe/Berlin, 3600`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Users logged in to the guest (the `userlist` subresource).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_list: Vec<GuestOsUser>,
    /// The guest's mounted filesystems with their use (the `filesystemlist` subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_info: Option<FileSystemInfo>,
}

/// KubeVirt's `VirtualMachineInstanceGuestOSUser`: one user logged in to the guest.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GuestOsUser {
    /// The user's login name.
    pub user_name: String,
    /// A Windows user's domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// When the user logged in (the earliest of several logins), in fractional seconds since
    /// the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login_time: Option<f64>,
}

/// KubeVirt's `VirtualMachineInstanceFileSystemInfo`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FileSystemInfo {
    /// The mounted filesystems on block devices.
    #[serde(default)]
    pub disks: Vec<FileSystem>,
}

/// KubeVirt's `VirtualMachineInstanceFileSystem`: one mounted filesystem of the guest.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FileSystem {
    /// The guest's name of the device (`sda1`, `vda`).
    #[serde(default)]
    pub disk_name: String,
    /// Where it is mounted (`/`, `C:\\`).
    #[serde(default)]
    pub mount_point: String,
    /// Its type (`ext4`, `xfs`, `NTFS`).
    #[serde(default)]
    pub file_system_type: String,
    /// Bytes in use.
    #[serde(default)]
    pub used_bytes: u64,
    /// Its size in bytes.
    #[serde(default)]
    pub total_bytes: u64,
    /// The disks under it: their serial numbers and buses, as the guest sees them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disk: Vec<FileSystemDisk>,
}

/// KubeVirt's `VirtualMachineInstanceFileSystemDisk`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FileSystemDisk {
    /// The disk's serial number, as the VM's disk sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// The bus the guest sees it on (`virtio`, `scsi`, `sata`).
    #[serde(default)]
    pub bus_type: String,
}

crate::open_enum! {
    /// A condition's type: KubeVirt's, and edgevirt's own on nodes.
    pub enum ConditionType {
        Ready => "Ready",
        LiveMigratable => "LiveMigratable",
        AgentConnected => "AgentConnected",
        Paused => "Paused",
        PodScheduled => "PodScheduled",
        /// A VMI's: false while the node cannot prepare it (an image that does not pull,
        /// reason [`ERR_IMAGE_PULL`]).
        Synchronized => "Synchronized",
        /// A migration's: it failed.
        Failed => "Failed",
        /// A VM's: it cannot start (its instancetype is missing or conflicts with it).
        Failure => "Failure",
        /// A VMI's: the guest agent wrote its access credentials (or why not).
        AccessCredentialsSynchronized => "AccessCredentialsSynchronized",
    }
}

/// KubeVirt's reason (and the VM's printable status) when a VMI's image does not pull.
pub const ERR_IMAGE_PULL: &str = "ErrImagePull";

crate::open_enum! {
    /// A condition's status.
    pub enum ConditionStatus {
        True => "True",
        False => "False",
        Unknown => "Unknown",
    }
}

impl Default for ConditionType {
    fn default() -> Self {
        ConditionType::Other(String::new())
    }
}

#[allow(clippy::derivable_impls)] // the enum comes from open_enum!, which derives no Default
impl Default for ConditionStatus {
    fn default() -> Self {
        ConditionStatus::Unknown
    }
}

crate::open_enum! {
    /// KubeVirt's VMI phases.
    pub enum Phase {
        Pending => "Pending",
        Scheduling => "Scheduling",
        Scheduled => "Scheduled",
        Running => "Running",
        Succeeded => "Succeeded",
        Failed => "Failed",
        Unknown => "Unknown",
    }
}

#[allow(clippy::derivable_impls)] // the enum comes from open_enum!, which derives no Default
impl Default for Phase {
    fn default() -> Self {
        Phase::Pending
    }
}

impl Phase {
    /// Succeeded or Failed: the instance will not run again.
    pub fn is_final(&self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

crate::open_enum! {
    /// KubeVirt's migration phases.
    pub enum MigrationPhase {
        Pending => "Pending",
        Scheduling => "Scheduling",
        Scheduled => "Scheduled",
        PreparingTarget => "PreparingTarget",
        TargetReady => "TargetReady",
        Running => "Running",
        Succeeded => "Succeeded",
        Failed => "Failed",
    }
}

#[allow(clippy::derivable_impls)] // the enum comes from open_enum!, which derives no Default
impl Default for MigrationPhase {
    fn default() -> Self {
        MigrationPhase::Pending
    }
}

impl MigrationPhase {
    pub fn is_final(&self) -> bool {
        matches!(self, MigrationPhase::Succeeded | MigrationPhase::Failed)
    }
}

crate::open_enum! {
    /// How an instance migrates: nothing to copy, or its local disks copied along.
    pub enum MigrationMethod {
        LiveMigration => "LiveMigration",
        BlockMigration => "BlockMigration",
    }
}

/// KubeVirt's VMI phases.
pub mod phase {
    pub const PENDING: &str = "Pending";
    pub const SCHEDULING: &str = "Scheduling";
    pub const SCHEDULED: &str = "Scheduled";
    pub const RUNNING: &str = "Running";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const FAILED: &str = "Failed";
    pub const UNKNOWN: &str = "Unknown";

    pub fn is_final(p: &str) -> bool {
        p == SUCCEEDED || p == FAILED
    }
}

/// A request to move a running instance to another node, as KubeVirt's
/// `VirtualMachineInstanceMigration`. Deleting it while it runs cancels the migration.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachineInstanceMigration",
    namespaced,
    status = "VirtualMachineInstanceMigrationStatus",
    shortname = "vmim",
    shortname = "vmims",
    category = "all",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"VMI","type":"string","jsonPath":".spec.vmiName"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct VirtualMachineInstanceMigrationSpec {
    /// The running VirtualMachineInstance to move, in the migration's namespace.
    pub vmi_name: String,
    /// Extra node labels the target must have (KubeVirt's `addedNodeSelector`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub added_node_selector: BTreeMap<String, String>,
}

/// Where the migration is and how it went.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationStatus {
    /// Pending, Scheduling, Scheduled, PreparingTarget, TargetReady, Running, Succeeded or
    /// Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MigrationPhase>,
    /// When the migration entered each phase, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_transition_timestamps: Vec<PhaseTransition>,
    /// The migration's conditions (`Failed` when it failed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The migration's nodes, times and outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_state: Option<MigrationState>,
    /// edgevirt extension: the domain XML the target prepared, which the source migrates to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_domain: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VmiPhaseTransition {
    /// The phase entered.
    pub phase: Phase,
    /// When it was entered (RFC 3339).
    pub phase_transition_timestamp: String,
}

impl VirtualMachineInstanceStatus {
    /// Enter phase `p`: set it and record when, in both timestamp forms. `first_only`: keep
    /// the time of an earlier entry into the same phase (a phase re-asserted on every sync).
    pub fn enter_phase(&mut self, p: Phase, first_only: bool) {
        let name = p.to_string();
        let at = match (first_only, self.phase_transition_timestamps_map.get(&name)) {
            (true, Some(t)) => t.clone(),
            _ => crate::types::now(),
        };
        self.phase_transition_timestamps_map
            .insert(name, at.clone());
        if self.phase_transition_timestamps.last().map(|t| &t.phase) != Some(&p) {
            self.phase_transition_timestamps.push(VmiPhaseTransition {
                phase: p.clone(),
                phase_transition_timestamp: at,
            });
        }
        self.phase = Some(p);
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTransition {
    /// The phase entered.
    pub phase: MigrationPhase,
    /// When it was entered (RFC 3339).
    pub phase_transition_timestamp: String,
}

/// KubeVirt's `VirtualMachineInstanceMigrationState`, on the VMI and its migration.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MigrationState {
    /// The uid of the VirtualMachineInstanceMigration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_uid: Option<String>,
    /// The node the instance moves from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_node: Option<String>,
    /// The node the instance moves to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node: Option<String>,
    /// When the migration started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<String>,
    /// When the migration ended (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_timestamp: Option<String>,
    /// Whether the migration completed.
    #[serde(default)]
    pub completed: bool,
    /// Whether the migration failed.
    #[serde(default)]
    pub failed: bool,
    /// Why the migration failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// Whether an abort was asked (its migration was deleted while it ran).
    #[serde(default)]
    pub abort_requested: bool,
    /// `Aborting`, `Succeeded` or `Failed` once an abort was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_status: Option<String>,
    /// `PreCopy` (the only mode edgevirt uses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The address on which the target node's agent takes the migration's streams
    /// directly from the source's (without it, or when it cannot be reached, they go
    /// through the controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node_address: Option<String>,
    /// The ports open for the migration at `targetNodeAddress` (each mapped to 0: one port
    /// carries every stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_direct_migration_node_ports: Option<std::collections::BTreeMap<String, i32>>,
    /// edgevirt extension: how long the guest was paused at the switch-over, from libvirt's
    /// job statistics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_ms: Option<u64>,
}

/// KubeVirt's migration phases.
pub mod migration_phase {
    pub const PENDING: &str = "Pending";
    pub const SCHEDULING: &str = "Scheduling";
    pub const SCHEDULED: &str = "Scheduled";
    pub const PREPARING_TARGET: &str = "PreparingTarget";
    pub const TARGET_READY: &str = "TargetReady";
    pub const RUNNING: &str = "Running";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const FAILED: &str = "Failed";

    pub fn is_final(p: &str) -> bool {
        p == SUCCEEDED || p == FAILED
    }
}

impl VirtualMachineInstance {
    /// The phase, Pending until someone set one.
    pub fn phase(&self) -> Phase {
        self.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default()
    }

    /// The node it is bound to, if any.
    pub fn node_name(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty())
    }

    pub fn conditions(&self) -> &[Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }

    pub fn migration_state(&self) -> Option<&MigrationState> {
        self.status.as_ref()?.migration_state.as_ref()
    }

    /// A migration of it is in flight (neither completed nor failed).
    pub fn migrating(&self) -> bool {
        self.migration_state()
            .is_some_and(|m| !m.completed && !m.failed)
    }
}

impl VirtualMachineInstanceMigration {
    /// The phase, Pending until the controller set one.
    pub fn phase(&self) -> MigrationPhase {
        self.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default()
    }

    pub fn migration_state(&self) -> Option<&MigrationState> {
        self.status.as_ref()?.migration_state.as_ref()
    }
}

/// What a VM's `spec.instancetype` or `spec.preference` names (KubeVirt's
/// `InstancetypeMatcher` and `PreferenceMatcher`, which have the same fields).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Matcher {
    /// The name of the instancetype or preference.
    #[serde(default)]
    pub name: String,
    /// The namespaced kind or the cluster kind; unset means the cluster kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// A `ControllerRevision` to use instead of the object: set by older KubeVirt releases,
    /// honoured when a VM carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_name: Option<String>,
    /// The volume whose claim's labels (`instancetype.kubevirt.io/default-instancetype`,
    /// `-kind`, and the same for `default-preference`) name the object: resolved when the
    /// VM is created, which then carries `name` and `kind` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infer_from_volume: Option<String>,
    /// `Reject` (the default: a volume without those labels refuses the VM) or `Ignore`
    /// (the VM is taken without this matcher).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infer_from_volume_failure_policy: Option<String>,
}

/// The VM status' record of what it uses (KubeVirt's `InstancetypeStatusRef`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatusRef {
    /// The object's name.
    #[serde(default)]
    pub name: String,
    /// The object's kind (`VirtualMachineClusterInstancetype`, `VirtualMachinePreference`,
    /// ...).
    #[serde(default)]
    pub kind: String,
    /// The ControllerRevision holding the copy the VM uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_revision_ref: Option<RevisionRef>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct RevisionRef {
    /// The ControllerRevision's name.
    #[serde(default)]
    pub name: String,
}

/// Which of the kinds a matcher names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Namespaced,
    Cluster,
}

impl Matcher {
    /// The scope its `kind` names: the singular, plural and short spellings KubeVirt takes,
    /// cluster-wide when unset.
    pub fn scope(&self, preference: bool) -> Result<Scope, String> {
        let k = self.kind.as_deref().unwrap_or("").to_ascii_lowercase();
        let (ns, cluster): (&[&str], &[&str]) = if preference {
            (
                &["virtualmachinepreference", "virtualmachinepreferences"],
                &[
                    "",
                    "virtualmachineclusterpreference",
                    "virtualmachineclusterpreferences",
                ],
            )
        } else {
            (
                &["virtualmachineinstancetype", "virtualmachineinstancetypes"],
                &[
                    "",
                    "virtualmachineclusterinstancetype",
                    "virtualmachineclusterinstancetypes",
                ],
            )
        };
        if ns.contains(&k.as_str()) {
            Ok(Scope::Namespaced)
        } else if cluster.contains(&k.as_str()) {
            Ok(Scope::Cluster)
        } else {
            Err(format!(
                "{:?} is not a kind of {}; use {} or {}",
                self.kind.as_deref().unwrap_or(""),
                if preference {
                    "preference"
                } else {
                    "instancetype"
                },
                if preference {
                    "VirtualMachinePreference"
                } else {
                    "VirtualMachineInstancetype"
                },
                if preference {
                    "VirtualMachineClusterPreference"
                } else {
                    "VirtualMachineClusterInstancetype"
                },
            ))
        }
    }
}
