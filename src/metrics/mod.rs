//! Prometheus metrics: what `/metrics` serves, one scrape target per site.
//!
//! Each node's agent collects libvirt's bulk domain stats and its host's own figures on an
//! interval and sends them to the controller as a [`NodeReport`]; the controller keeps the
//! latest report of every node in the [`Hub`] and, at each scrape, renders them with what
//! its store knows (VMI phases, VMs, migrations) under KubeVirt's metric names and labels
//! (`kubevirt_vmi_*`, with `name`, `namespace` and `node`). edgevirt's own figures are
//! named `edgevirt_*`: the layers that own them (API, store, controller, console proxy)
//! register them in the `prometheus` crate's default registry, which the scrape gathers
//! too. The per-VM families are built straight into the crate's `MetricFamily` model (see
//! [`Families`]) and the whole text is written by the crate's encoder (the classic text
//! format 0.0.4 that `promtool check metrics` reads).

pub mod graphs;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::{Encoder, TextEncoder};
use serde::{Deserialize, Serialize};

use crate::hypervisor::DomainStats;
use crate::store::{self, Store};
use crate::types::Kind;

/// What a node's agent sends the controller on every collection. Decoded tolerantly
/// (an older or newer agent may send fewer or more fields).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NodeReport {
    /// How often the agent collects, in seconds: a report older than three of these is
    /// stale and no longer served.
    pub interval_secs: u64,
    pub host: HostSample,
    /// Every running domain of the node.
    pub domains: Vec<DomainStats>,
    /// The node's launchers by the protocol version they speak.
    pub launchers: BTreeMap<String, u64>,
}

/// A host's own figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HostSample {
    /// CPU time spent busy and idle over all CPUs since boot, in seconds.
    pub cpu_busy_seconds: f64,
    pub cpu_idle_seconds: f64,
    pub cpus: u64,
    pub memory_total_bytes: u64,
    pub memory_available_bytes: u64,
    pub load1: f64,
    /// The filesystem of the data folder (images, disks, the store).
    pub data_capacity_bytes: u64,
    pub data_free_bytes: u64,
}

impl HostSample {
    /// Read this host's figures from `/proc` and the data folder's filesystem.
    pub fn read(data_dir: &std::path::Path) -> HostSample {
        let mut h = HostSample::default();
        if let Ok(stat) = std::fs::read_to_string("/proc/stat") {
            h.read_cpu(&stat);
        }
        if let Ok(mem) = std::fs::read_to_string("/proc/meminfo") {
            for line in mem.lines() {
                let mut w = line.split_whitespace();
                let (Some(k), Some(v)) = (w.next(), w.next()) else {
                    continue;
                };
                let bytes = v.parse::<u64>().unwrap_or(0) * 1024;
                match k {
                    "MemTotal:" => h.memory_total_bytes = bytes,
                    "MemAvailable:" => h.memory_available_bytes = bytes,
                    _ => {}
                }
            }
        }
        if let Ok(l) = std::fs::read_to_string("/proc/loadavg") {
            h.load1 = l
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
        }
        if let Ok(fs) = nix::sys::statvfs::statvfs(data_dir) {
            let block = fs.fragment_size();
            h.data_capacity_bytes = fs.blocks() * block;
            h.data_free_bytes = fs.blocks_available() * block;
        }
        h
    }

    /// The `cpu` lines of `/proc/stat`: the total and the number of CPUs. Times are in
    /// USER_HZ (100 per second on Linux).
    fn read_cpu(&mut self, stat: &str) {
        for line in stat.lines() {
            let mut w = line.split_whitespace();
            match w.next() {
                Some("cpu") => {
                    let v: Vec<f64> = w.filter_map(|x| x.parse().ok()).collect();
                    // user nice system idle iowait irq softirq steal (guest time is in user).
                    let at = |i: usize| v.get(i).copied().unwrap_or(0.0) / 100.0;
                    self.cpu_idle_seconds = at(3) + at(4);
                    self.cpu_busy_seconds = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
                }
                Some(c) if c.starts_with("cpu") => self.cpus += 1,
                _ => {}
            }
        }
    }
}

/// The latest report of every node, as the controller received them.
#[derive(Default)]
pub struct Hub {
    reports: Mutex<HashMap<String, (Instant, NodeReport)>>,
}

impl Hub {
    pub fn put(&self, node: &str, report: NodeReport) {
        self.reports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node.to_string(), (Instant::now(), report));
    }

    /// Reports younger than three of their intervals (and a node that was deleted is
    /// forgotten when its report goes stale).
    pub fn fresh(&self) -> Vec<(String, Duration, NodeReport)> {
        let mut all = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|_, (at, r)| at.elapsed() < stale_after(r));
        let mut out: Vec<_> = all
            .iter()
            .map(|(n, (at, r))| (n.clone(), at.elapsed(), r.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

fn stale_after(r: &NodeReport) -> Duration {
    Duration::from_secs(3 * r.interval_secs.clamp(1, 3600))
}

/// What a scrape needs of a VMI: decoded from the stored JSON without the rest.
#[derive(Deserialize)]
struct VmiFacts {
    metadata: MetaFacts,
    #[serde(default)]
    status: StatusFacts,
}

#[derive(Deserialize)]
struct MetaFacts {
    #[serde(default)]
    name: String,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusFacts {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    domain_name: Option<String>,
    #[serde(default)]
    migration_state: Option<MigrationFacts>,
    #[serde(default)]
    guest_agent_info: Option<GuestFacts>,
    /// The NICs, the spec's first and in its order (the agent writes them so).
    #[serde(default)]
    interfaces: Vec<InterfaceFacts>,
}

#[derive(Default, Deserialize)]
struct InterfaceFacts {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GuestFacts {
    #[serde(default)]
    fs_info: Option<crate::types::kubevirt::FileSystemInfo>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MigrationFacts {
    #[serde(default)]
    start_timestamp: Option<String>,
    #[serde(default)]
    end_timestamp: Option<String>,
}

/// Families built for one scrape. The `prometheus` crate's metric vectors hash, lock and
/// sort every series as they are made and collected, which for a thousand VMs (tens of
/// thousands of series) took longer than the target of a scrape; here each family is a list
/// of series (with an index for the few that add up), handed to the crate's encoder as its
/// own `MetricFamily` model.
#[derive(Default)]
struct Families {
    all: Mutex<Vec<Fam>>,
}

/// One family's series under construction.
#[derive(Clone)]
struct Fam(std::sync::Arc<Mutex<FamData>>);

struct FamData {
    name: String,
    help: String,
    kind: prometheus::proto::MetricType,
    labels: Vec<String>,
    series: Vec<(Vec<String>, f64)>,
    index: HashMap<Vec<String>, usize>,
}

/// One series of a family: set it, or add to it.
struct Series<'a> {
    fam: &'a Fam,
    key: Vec<String>,
}

impl Fam {
    fn with_label_values(&self, values: &[&str]) -> Series<'_> {
        Series {
            fam: self,
            key: values.iter().map(|v| v.to_string()).collect(),
        }
    }
}

impl Series<'_> {
    fn update(self, f: impl FnOnce(&mut f64)) {
        let mut d = self.fam.0.lock().unwrap_or_else(|p| p.into_inner());
        let d = &mut *d;
        let i = match d.index.get(&self.key) {
            Some(i) => *i,
            None => {
                d.series.push((self.key.clone(), 0.0));
                d.index.insert(self.key, d.series.len() - 1);
                d.series.len() - 1
            }
        };
        f(&mut d.series[i].1);
    }
    fn set(self, v: f64) {
        self.update(|x| *x = v);
    }
    fn inc(self) {
        self.update(|x| *x += 1.0);
    }
    fn inc_by(self, v: f64) {
        self.update(|x| *x += v);
    }
}

impl Families {
    fn family(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        kind: prometheus::proto::MetricType,
    ) -> Result<Fam, RenderError> {
        let fam = Fam(std::sync::Arc::new(Mutex::new(FamData {
            name: name.to_string(),
            help: help.to_string(),
            kind,
            labels: labels.iter().map(|l| l.to_string()).collect(),
            series: Vec::new(),
            index: HashMap::new(),
        })));
        self.all
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(fam.clone());
        Ok(fam)
    }

    fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> Result<Fam, RenderError> {
        self.family(name, help, labels, prometheus::proto::MetricType::GAUGE)
    }

    /// A counter, its value a cumulative figure an agent reported.
    fn counter(&self, name: &str, help: &str, labels: &[&str]) -> Result<Fam, RenderError> {
        self.family(name, help, labels, prometheus::proto::MetricType::COUNTER)
    }

    /// The families with at least one series, in the crate's model.
    fn gather(self) -> Vec<prometheus::proto::MetricFamily> {
        use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
        let all = self.all.into_inner().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::with_capacity(all.len());
        for fam in all {
            let d = std::mem::replace(
                &mut *fam.0.lock().unwrap_or_else(|p| p.into_inner()),
                FamData {
                    name: String::new(),
                    help: String::new(),
                    kind: MetricType::GAUGE,
                    labels: Vec::new(),
                    series: Vec::new(),
                    index: HashMap::new(),
                },
            );
            if d.series.is_empty() {
                continue;
            }
            let mut mf = MetricFamily::default();
            mf.set_name(d.name);
            mf.set_help(d.help);
            mf.set_field_type(d.kind);
            // Labels in name order, as the crate's own vectors write them.
            let mut order: Vec<usize> = (0..d.labels.len()).collect();
            order.sort_by(|a, b| d.labels[*a].cmp(&d.labels[*b]));
            let metrics = mf.mut_metric();
            metrics.reserve(d.series.len());
            for (mut values, v) in d.series {
                let mut m = Metric::default();
                m.set_label(
                    order
                        .iter()
                        .map(|i| {
                            let mut l = LabelPair::default();
                            l.set_name(d.labels[*i].clone());
                            l.set_value(std::mem::take(&mut values[*i]));
                            l
                        })
                        .collect(),
                );
                if d.kind == MetricType::COUNTER {
                    let mut c = Counter::default();
                    c.set_value(v);
                    m.set_counter(c);
                } else {
                    let mut g = Gauge::default();
                    g.set_value(v);
                    m.set_gauge(g);
                }
                metrics.push(m);
            }
            out.push(mf);
        }
        out
    }
}

fn phase_label(phase: Option<&str>) -> String {
    phase.unwrap_or("Pending").to_ascii_lowercase()
}

fn seconds_since_epoch(ts: &str) -> Option<f64> {
    ts.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond() as f64 / 1000.0)
}

/// The whole scrape, as the text format.
pub async fn render(
    store: &Store,
    hub: &Hub,
    data_dir: &std::path::Path,
) -> Result<String, RenderError> {
    let f = Families::default();
    let vmis = list_facts::<VmiFacts>(store, Kind::VirtualMachineInstance).await?;
    let reports = hub.fresh();

    let info = f.gauge(
        "kubevirt_info",
        "Version information: edgevirt serves KubeVirt's API.",
        &["goversion", "kubeversion"],
    )?;
    info.with_label_values(&["none", crate::version::RELEASE])
        .set(1.0);

    // Phases, by node and KubeVirt's workload labels.
    let phases = f.gauge(
        "kubevirt_vmi_phase_count",
        "Sum of VMIs per phase and node.",
        &[
            "node",
            "phase",
            "os",
            "workload",
            "flavor",
            "instance_type",
            "preference",
        ],
    )?;
    for v in &vmis {
        let a = &v.metadata.annotations;
        let l = &v.metadata.labels;
        let pick = |m: &BTreeMap<String, String>, k: &str| {
            m.get(k).cloned().unwrap_or_else(|| "<none>".into())
        };
        phases
            .with_label_values(&[
                v.status.node_name.as_deref().unwrap_or(""),
                &phase_label(v.status.phase.as_deref()),
                &pick(a, "vm.kubevirt.io/os"),
                &pick(a, "vm.kubevirt.io/workload"),
                &pick(a, "vm.kubevirt.io/flavor"),
                &pick(l, "kubevirt.io/instancetype"),
                &pick(l, "kubevirt.io/preference"),
            ])
            .inc();
    }

    vms(&f, store).await?;

    f.gauge(
        "edgevirt_store_size_bytes",
        "Size of the controller's database.",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .set(store.size_bytes().await? as f64);
    if let Ok(fs) = nix::sys::statvfs::statvfs(data_dir) {
        let block = fs.fragment_size() as f64;
        for (name, help, v) in [
            (
                "edgevirt_store_filesystem_capacity_bytes",
                "Size of the filesystem the controller's database is on.",
                fs.blocks() as f64 * block,
            ),
            (
                "edgevirt_store_filesystem_free_bytes",
                "Free space on the filesystem the controller's database is on.",
                fs.blocks_available() as f64 * block,
            ),
        ] {
            f.gauge(name, help, &[])?
                .with_label_values(&[] as &[&str])
                .set(v);
        }
    }

    migrations(&f, store, &vmis).await?;
    filesystems(&f, &vmis)?;
    domains(&f, &vmis, &reports)?;
    nodes(&f, store, &reports).await?;

    let mut families = prometheus::gather();
    families.extend(f.gather());
    families.sort_by(|a, b| a.name().cmp(b.name()));
    let mut out = Vec::with_capacity(64 << 10);
    TextEncoder::new().encode(&families, &mut out)?;
    let mut text = String::from_utf8(out).map_err(|e| RenderError::Encode(e.to_string()))?;
    for name in UNTYPED {
        let gauge = format!("# TYPE {name} gauge\n");
        if let Some(at) = text.find(&gauge) {
            text.replace_range(at..at + gauge.len(), &format!("# TYPE {name} untyped\n"));
        }
    }
    Ok(text)
}

/// Families KubeVirt names against Prometheus' naming rules, served as `untyped` (which
/// Prometheus treats as a gauge) so that `promtool check metrics` accepts the scrape while
/// the name stays KubeVirt's, for the dashboards and alerts written for it: a gauge must
/// not end in `_count`, which only histograms and summaries use. The `prometheus` crate
/// writes no untyped families (its encoder does not implement them), so the one `TYPE` line
/// is changed after encoding; the samples are written the same way for both types.
const UNTYPED: &[&str] = &["kubevirt_vmi_phase_count"];

async fn list_facts<T: serde::de::DeserializeOwned>(
    store: &Store,
    kind: Kind,
) -> Result<Vec<T>, RenderError> {
    let raw = store
        .list_raw(
            kind,
            &store::ListQuery {
                namespace: None,
                labels: None,
                fields: None,
                after: None,
                limit: None,
            },
        )
        .await?;
    Ok(raw
        .iter()
        .filter_map(|json| serde_json::from_str(json).ok())
        .collect())
}

/// `kubevirt_number_of_vms` by namespace, and `kubevirt_vm_info` for each VM with its
/// printable status and run strategy (what the alert on a VM not running as its
/// runStrategy says reads).
async fn vms(f: &Families, store: &Store) -> Result<(), RenderError> {
    #[derive(Deserialize)]
    struct Vm {
        metadata: MetaFacts,
        #[serde(default)]
        spec: VmSpec,
        #[serde(default)]
        status: VmStatus,
    }
    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct VmSpec {
        #[serde(default)]
        run_strategy: Option<String>,
        #[serde(default)]
        running: Option<bool>,
    }
    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct VmStatus {
        #[serde(default)]
        printable_status: Option<String>,
    }
    let vms = list_facts::<Vm>(store, Kind::VirtualMachine).await?;
    let per_ns = f.gauge(
        "kubevirt_number_of_vms",
        "The number of VMs in the cluster by namespace.",
        &["namespace"],
    )?;
    let info = f.gauge(
        "kubevirt_vm_info",
        "Information about VirtualMachines: their status and run strategy.",
        &["name", "namespace", "status", "run_strategy"],
    )?;
    for vm in &vms {
        per_ns.with_label_values(&[&vm.metadata.namespace]).inc();
        let strategy = match (&vm.spec.run_strategy, vm.spec.running) {
            (Some(s), _) => s.as_str(),
            (None, Some(true)) => "Always",
            (None, _) => "Halted",
        };
        info.with_label_values(&[
            vm.metadata.name.as_str(),
            vm.metadata.namespace.as_str(),
            vm.status.printable_status.as_deref().unwrap_or("Unknown"),
            strategy,
        ])
        .set(1.0);
    }
    Ok(())
}

/// `kubevirt_vmi_migration_*`: migrations by phase, and the times and outcome of each
/// instance's last migration.
async fn migrations(f: &Families, store: &Store, vmis: &[VmiFacts]) -> Result<(), RenderError> {
    #[derive(Deserialize)]
    struct M {
        metadata: MetaFacts,
        #[serde(default)]
        spec: MSpec,
        #[serde(default)]
        status: MStatus,
    }
    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct MSpec {
        #[serde(default)]
        vmi_name: String,
    }
    #[derive(Default, Deserialize)]
    struct MStatus {
        #[serde(default)]
        phase: Option<String>,
    }
    let ms = list_facts::<M>(store, Kind::VirtualMachineInstanceMigration).await?;
    let mut by_phase: BTreeMap<&str, f64> = ["pending", "scheduling", "running"]
        .into_iter()
        .map(|p| (p, 0.0))
        .collect();
    let succeeded = f.gauge(
        "kubevirt_vmi_migration_succeeded",
        "Indicates if the VMI migration succeeded.",
        &["vmi", "namespace", "name"],
    )?;
    let failed = f.gauge(
        "kubevirt_vmi_migration_failed",
        "Indicates if the VMI migration failed.",
        &["vmi", "namespace", "name"],
    )?;
    for m in &ms {
        let phase = m.status.phase.as_deref().unwrap_or("Pending");
        let labels = [
            m.spec.vmi_name.as_str(),
            m.metadata.namespace.as_str(),
            m.metadata.name.as_str(),
        ];
        match phase {
            "Pending" => *by_phase.entry("pending").or_default() += 1.0,
            "Scheduling" | "Scheduled" | "PreparingTarget" | "TargetReady" => {
                *by_phase.entry("scheduling").or_default() += 1.0
            }
            "Running" => *by_phase.entry("running").or_default() += 1.0,
            "Succeeded" => succeeded.with_label_values(&labels).set(1.0),
            "Failed" => failed.with_label_values(&labels).set(1.0),
            _ => {}
        }
    }
    for (phase, n) in by_phase {
        f.gauge(
            &format!("kubevirt_vmi_migrations_in_{phase}_phase"),
            &format!("Number of current {phase} migrations."),
            &[],
        )?
        .with_label_values(&[] as &[&str])
        .set(n);
    }
    let start = f.gauge(
        "kubevirt_vmi_migration_start_time_seconds",
        "The time at which the migration started.",
        &["name", "namespace", "node"],
    )?;
    let end = f.gauge(
        "kubevirt_vmi_migration_end_time_seconds",
        "The time at which the migration ended.",
        &["name", "namespace", "node"],
    )?;
    for v in vmis {
        let Some(ms) = &v.status.migration_state else {
            continue;
        };
        let labels = [
            v.metadata.name.as_str(),
            v.metadata.namespace.as_str(),
            v.status.node_name.as_deref().unwrap_or(""),
        ];
        if let Some(t) = ms.start_timestamp.as_deref().and_then(seconds_since_epoch) {
            start.with_label_values(&labels).set(t);
        }
        if let Some(t) = ms.end_timestamp.as_deref().and_then(seconds_since_epoch) {
            end.with_label_values(&labels).set(t);
        }
    }
    Ok(())
}

/// `kubevirt_vmi_filesystem_{capacity,used}_bytes`: the guests' filesystems as their guest
/// agents last reported them.
fn filesystems(f: &Families, vmis: &[VmiFacts]) -> Result<(), RenderError> {
    const L: &[&str] = &[
        "name",
        "namespace",
        "node",
        "disk_name",
        "mount_point",
        "file_system_type",
    ];
    let capacity = f.gauge(
        "kubevirt_vmi_filesystem_capacity_bytes",
        "Total VM filesystem capacity in bytes.",
        L,
    )?;
    let used = f.gauge(
        "kubevirt_vmi_filesystem_used_bytes",
        "Used VM filesystem capacity in bytes.",
        L,
    )?;
    for v in vmis {
        let Some(fs) = v
            .status
            .guest_agent_info
            .as_ref()
            .and_then(|g| g.fs_info.as_ref())
        else {
            continue;
        };
        for d in &fs.disks {
            let labels = [
                v.metadata.name.as_str(),
                v.metadata.namespace.as_str(),
                v.status.node_name.as_deref().unwrap_or(""),
                d.disk_name.as_str(),
                d.mount_point.as_str(),
                d.file_system_type.as_str(),
            ];
            capacity
                .with_label_values(&labels)
                .set(d.total_bytes as f64);
            used.with_label_values(&labels).set(d.used_bytes as f64);
        }
    }
    Ok(())
}

/// The per-instance families from the nodes' domain stats.
fn domains(
    f: &Families,
    vmis: &[VmiFacts],
    reports: &[(String, Duration, NodeReport)],
) -> Result<(), RenderError> {
    const L: &[&str] = &["name", "namespace", "node"];
    let with = |extra: &'static str| -> Vec<&'static str> {
        let mut l = L.to_vec();
        l.push(extra);
        l
    };
    let cpu = f.counter(
        "kubevirt_vmi_cpu_usage_seconds_total",
        "Total CPU time spent in all modes (sum of both vcpu and hypervisor usage).",
        L,
    )?;
    let cpu_user = f.counter(
        "kubevirt_vmi_cpu_user_usage_seconds_total",
        "Total CPU time spent in user mode.",
        L,
    )?;
    let cpu_system = f.counter(
        "kubevirt_vmi_cpu_system_usage_seconds_total",
        "Total CPU time spent in system mode.",
        L,
    )?;
    let mut vcpu_labels = L.to_vec();
    vcpu_labels.extend(["id", "state"]);
    let vcpu = f.counter(
        "kubevirt_vmi_vcpu_seconds_total",
        "Total amount of time spent in each state by each vcpu (cpu_time excluding hypervisor time).",
        &vcpu_labels,
    )?;
    let resident = f.gauge(
        "kubevirt_vmi_memory_resident_bytes",
        "Resident set size of the process running the domain.",
        L,
    )?;
    let available = f.gauge(
        "kubevirt_vmi_memory_available_bytes",
        "Amount of usable memory as seen by the domain.",
        L,
    )?;
    let used = f.gauge(
        "kubevirt_vmi_memory_used_bytes",
        "Amount of used memory as seen by the domain.",
        L,
    )?;
    let domain_mem = f.gauge(
        "kubevirt_vmi_memory_domain_bytes",
        "The amount of memory in bytes allocated to the domain.",
        L,
    )?;
    let net = |dir: &str, what: &str, help: &str| {
        f.counter(
            &format!("kubevirt_vmi_network_{dir}_{what}_total"),
            help,
            &with("interface"),
        )
    };
    let rx_bytes = net(
        "receive",
        "bytes",
        "Total network traffic received in bytes.",
    )?;
    let tx_bytes = net(
        "transmit",
        "bytes",
        "Total network traffic transmitted in bytes.",
    )?;
    let rx_packets = net(
        "receive",
        "packets",
        "Total network traffic received packets.",
    )?;
    let tx_packets = net(
        "transmit",
        "packets",
        "Total network traffic transmitted packets.",
    )?;
    let rx_errors = net("receive", "errors", "Total network received error packets.")?;
    let tx_errors = net(
        "transmit",
        "errors",
        "Total network transmitted error packets.",
    )?;
    let rx_drop = net(
        "receive",
        "packets_dropped",
        "The total number of rx packets dropped on vNIC interfaces.",
    )?;
    let tx_drop = net(
        "transmit",
        "packets_dropped",
        "The total number of tx packets dropped on vNIC interfaces.",
    )?;
    let disk = |name: &str, help: &str| f.counter(name, help, &with("drive"));
    let rd_bytes = disk(
        "kubevirt_vmi_storage_read_traffic_bytes_total",
        "Total number of bytes read from storage.",
    )?;
    let wr_bytes = disk(
        "kubevirt_vmi_storage_write_traffic_bytes_total",
        "Total number of written bytes.",
    )?;
    let rd_iops = disk(
        "kubevirt_vmi_storage_iops_read_total",
        "Total number of I/O read operations.",
    )?;
    let wr_iops = disk(
        "kubevirt_vmi_storage_iops_write_total",
        "Total number of I/O write operations.",
    )?;
    let rd_time = disk(
        "kubevirt_vmi_storage_read_times_seconds_total",
        "Total time spent on read operations.",
    )?;
    let wr_time = disk(
        "kubevirt_vmi_storage_write_times_seconds_total",
        "Total time spent on write operations.",
    )?;
    let flush = disk(
        "kubevirt_vmi_storage_flush_requests_total",
        "Total storage flush requests.",
    )?;

    // Domains by (node, domain name): an instance's stats are those of its node's domain.
    let by_domain: HashMap<(&str, &str), &VmiFacts> = vmis
        .iter()
        .filter_map(|v| {
            Some((
                (
                    v.status.node_name.as_deref()?,
                    v.status.domain_name.as_deref()?,
                ),
                v,
            ))
        })
        .collect();
    for (node, _, report) in reports {
        for d in &report.domains {
            let Some(v) = by_domain.get(&(node.as_str(), d.name.as_str())) else {
                continue;
            };
            let labels = [
                v.metadata.name.as_str(),
                v.metadata.namespace.as_str(),
                node,
            ];
            let secs = |ns: u64| ns as f64 / 1e9;
            if let Some(t) = d.cpu_time_ns {
                cpu.with_label_values(&labels).inc_by(secs(t));
            }
            if let Some(t) = d.cpu_user_ns {
                cpu_user.with_label_values(&labels).inc_by(secs(t));
            }
            if let Some(t) = d.cpu_system_ns {
                cpu_system.with_label_values(&labels).inc_by(secs(t));
            }
            for (i, t) in d.vcpu_time_ns.iter().enumerate() {
                let id = i.to_string();
                let l = [labels[0], labels[1], labels[2], id.as_str(), "running"];
                vcpu.with_label_values(&l).inc_by(secs(*t));
            }
            let set = |g: &Fam, v: Option<u64>| {
                if let Some(v) = v {
                    g.with_label_values(&labels).set(v as f64);
                }
            };
            set(&resident, d.memory_rss_bytes);
            set(&available, d.memory_available_bytes);
            set(&domain_mem, d.memory_current_bytes);
            set(
                &used,
                d.memory_available_bytes
                    .zip(d.memory_unused_bytes)
                    .map(|(a, u)| a.saturating_sub(u)),
            );
            for n in &d.net {
                // KubeVirt names the NIC as the spec does; edgevirt's taps say which one.
                let nic = crate::virt::convert::nic_index(&v.metadata.uid, &n.name)
                    .and_then(|i| v.status.interfaces.get(i)?.name.as_deref());
                let l = [labels[0], labels[1], labels[2], nic.unwrap_or(&n.name)];
                for (c, v) in [
                    (&rx_bytes, n.rx_bytes),
                    (&tx_bytes, n.tx_bytes),
                    (&rx_packets, n.rx_packets),
                    (&tx_packets, n.tx_packets),
                    (&rx_errors, n.rx_errors),
                    (&tx_errors, n.tx_errors),
                    (&rx_drop, n.rx_drops),
                    (&tx_drop, n.tx_drops),
                ] {
                    c.with_label_values(&l).inc_by(v as f64);
                }
            }
            for b in &d.block {
                let l = [labels[0], labels[1], labels[2], b.name.as_str()];
                for (c, v) in [
                    (&rd_bytes, b.read_bytes as f64),
                    (&wr_bytes, b.write_bytes as f64),
                    (&rd_iops, b.read_requests as f64),
                    (&wr_iops, b.write_requests as f64),
                    (&rd_time, b.read_time_ns as f64 / 1e9),
                    (&wr_time, b.write_time_ns as f64 / 1e9),
                    (&flush, b.flush_requests as f64),
                ] {
                    c.with_label_values(&l).inc_by(v);
                }
            }
        }
    }
    Ok(())
}

/// Each node's own figures, its readiness, and its launchers.
async fn nodes(
    f: &Families,
    store: &Store,
    reports: &[(String, Duration, NodeReport)],
) -> Result<(), RenderError> {
    let ready = f.gauge(
        "edgevirt_node_ready",
        "1 if the node's agent heartbeats (Ready), else 0.",
        &["node"],
    )?;
    for n in store.all::<crate::types::Node>().await? {
        let r = crate::rules::node::node_ready(&n);
        ready
            .with_label_values(&[crate::types::Meta::name(&n)])
            .set(if r { 1.0 } else { 0.0 });
    }
    let cpu = f.counter(
        "edgevirt_node_cpu_seconds_total",
        "CPU time of the node over all its CPUs, busy or idle.",
        &["node", "mode"],
    )?;
    let g = |name: &str, help: &str| f.gauge(name, help, &["node"]);
    let cpus = g("edgevirt_node_cpus", "CPUs of the node.")?;
    let mem_total = g("edgevirt_node_memory_total_bytes", "Memory of the node.")?;
    let mem_avail = g(
        "edgevirt_node_memory_available_bytes",
        "Memory the node can still give (MemAvailable).",
    )?;
    let load = g("edgevirt_node_load1", "The node's one-minute load average.")?;
    let data_cap = g(
        "edgevirt_node_data_capacity_bytes",
        "Size of the filesystem of the node's data folder (images, disks).",
    )?;
    let data_free = g(
        "edgevirt_node_data_free_bytes",
        "Free space on the filesystem of the node's data folder.",
    )?;
    let age = g(
        "edgevirt_node_report_age_seconds",
        "Seconds since the node's agent last sent its figures.",
    )?;
    let launchers = f.gauge(
        "edgevirt_launchers",
        "Running launchers (one per VM) by node and the protocol version they speak.",
        &["node", "protocol_version"],
    )?;
    for (node, since, r) in reports {
        let h = &r.host;
        cpu.with_label_values(&[node.as_str(), "busy"])
            .inc_by(h.cpu_busy_seconds);
        cpu.with_label_values(&[node.as_str(), "idle"])
            .inc_by(h.cpu_idle_seconds);
        for (gauge, v) in [
            (&cpus, h.cpus as f64),
            (&mem_total, h.memory_total_bytes as f64),
            (&mem_avail, h.memory_available_bytes as f64),
            (&load, h.load1),
            (&data_cap, h.data_capacity_bytes as f64),
            (&data_free, h.data_free_bytes as f64),
            (&age, since.as_secs_f64()),
        ] {
            gauge.with_label_values(&[node.as_str()]).set(v);
        }
        for (version, n) in &r.launchers {
            launchers
                .with_label_values(&[node.as_str(), version.as_str()])
                .set(*n as f64);
        }
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("{0}")]
    Store(#[from] store::Error),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("encoding metrics: {0}")]
    Encode(String),
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::hypervisor::{BlockStats, NetStats};

    /// A scrape names an instance's figures by its name, namespace and node, from the report
    /// of the node it runs on; another node's domain of the same name is not it.
    #[tokio::test]
    async fn a_scrape_labels_domain_stats_with_their_instance() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(&d.path().join("db")).await.unwrap();
        let created = store
            .create(
                Kind::VirtualMachineInstance,
                json!({"metadata": {"name": "web", "namespace": "default"},
                       "spec": {"domain": {"devices": {}}},
                       "status": {"phase": "Running", "nodeName": "n1",
                                  "domainName": "ev-default-web-1",
                                  "interfaces": [{"name": "default"}, {"name": "lan"}]}}),
                false,
            )
            .await
            .unwrap();
        let uid = created["metadata"]["uid"].as_str().unwrap();
        let hub = Hub::default();
        let domain = DomainStats {
            name: "ev-default-web-1".into(),
            cpu_time_ns: Some(2_500_000_000),
            vcpu_time_ns: vec![1_000_000_000],
            net: vec![
                // A tap of an older release's domain: its own name.
                NetStats {
                    name: "vnet0".into(),
                    rx_bytes: 1400,
                    ..Default::default()
                },
                // edgevirt's tap of the second NIC: the spec's name.
                NetStats {
                    name: crate::virt::convert::tap_name(uid, 1),
                    rx_bytes: 700,
                    ..Default::default()
                },
            ],
            block: vec![BlockStats {
                name: "vda".into(),
                write_bytes: 4096,
                ..Default::default()
            }],
            ..Default::default()
        };
        let report = |d: DomainStats| NodeReport {
            interval_secs: 15,
            domains: vec![d],
            launchers: [("3".to_string(), 1)].into(),
            ..Default::default()
        };
        hub.put("n1", report(domain.clone()));
        hub.put(
            "n2",
            report(DomainStats {
                cpu_time_ns: Some(9_000_000_000),
                ..domain
            }),
        );
        let text = render(&store, &hub, d.path()).await.unwrap();
        let has = |line: &str| text.lines().any(|l| l == line);
        let l = r#"name="web",namespace="default",node="n1""#;
        assert!(
            has(&format!("kubevirt_vmi_cpu_usage_seconds_total{{{l}}} 2.5")),
            "{text}"
        );
        // (Only the VMI families: the process-wide counters, which other tests in this
        // process move, may read 9 too.)
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("kubevirt_vmi_")
                    && (l.ends_with(" 9") || l.ends_with(" 9.0"))),
            "n2's domain is not web: {text}"
        );
        assert!(has(&format!(
            "kubevirt_vmi_network_receive_bytes_total{{interface=\"vnet0\",{l}}} 1400"
        )));
        assert!(has(&format!(
            "kubevirt_vmi_network_receive_bytes_total{{interface=\"lan\",{l}}} 700"
        )));
        assert!(has(&format!(
            "kubevirt_vmi_storage_write_traffic_bytes_total{{drive=\"vda\",{l}}} 4096"
        )));
        assert!(has(&format!(
            "kubevirt_vmi_vcpu_seconds_total{{id=\"0\",{l},state=\"running\"}} 1"
        )));
        assert!(has("# TYPE kubevirt_vmi_phase_count untyped"), "{text}");
        assert!(text.contains("kubevirt_vmi_phase_count{") && text.contains(r#"phase="running""#));
        assert!(has(
            r#"edgevirt_launchers{node="n1",protocol_version="3"} 1"#
        ));
    }
}
