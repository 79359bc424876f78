//! The dashboard's graphs, kept by edgevirt itself in round-robin archives (as Proxmox keeps
//! RRD files), so a site needs no Prometheus to see them: for every VM and every node, CPU,
//! memory, disk and network over the last hour, day, week and month.
//!
//! Each node report becomes one sample per VM and per node ([`Graphs::record`]): rates from
//! the difference with the previous report (CPU in cores, bytes per second), memory as it
//! is. A [`Graph`] holds four archives of fixed length, each averaging the samples of its
//! step into one point; a point not reached is empty (`null`), so a gap shows as a gap. The
//! size of a graph is fixed by its archives (a few tens of KiB of JSON), whatever the time
//! it covers. Graphs are kept in memory and written to `DATA_DIR/graphs/` (one file per VM
//! or node, replaced atomically) at most once a minute; a restart loses at most that.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::NodeReport;
use crate::hypervisor::DomainStats;

/// The series every graph has, in this order.
pub const SERIES: [&str; 7] = [
    "cpu",
    "memory",
    "diskRead",
    "diskWrite",
    "netIn",
    "netOut",
    "diskUsed",
];
const N: usize = SERIES.len();

/// (name, step in seconds, points): an hour of minutes, a day of quarter hours, a week of
/// two hours, a month (31 days) of eight hours.
pub const ARCHIVES: [(&str, u64, usize); 4] = [
    ("hour", 60, 60),
    ("day", 900, 96),
    ("week", 7200, 84),
    ("month", 28800, 93),
];

/// One archive: a ring of points, and the point being filled.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Archive {
    /// Each point's averages, by slot (`time / step % points`), `None` where no sample came.
    points: Vec<[Option<f32>; N]>,
    /// The start time (Unix seconds) of the slot each point belongs to, so a point from a
    /// previous round of the ring is not shown as a new one.
    times: Vec<u64>,
    /// The slot being filled: its start, and the sums and counts of its samples.
    current: u64,
    sums: [f64; N],
    counts: [u32; N],
}

/// A VM's or a node's graph.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Graph {
    archives: Vec<Archive>,
}

impl Default for Graph {
    fn default() -> Graph {
        Graph::new()
    }
}

/// What the dashboard draws: the times of the points (Unix seconds, oldest first) and one
/// list of values per series, `null` where there is none.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Points {
    pub step: u64,
    pub times: Vec<u64>,
    pub series: Vec<(&'static str, Vec<Option<f32>>)>,
}

impl Graph {
    fn new() -> Graph {
        Graph {
            archives: ARCHIVES
                .iter()
                .map(|(_, _, points)| Archive {
                    points: vec![[None; N]; *points],
                    times: vec![0; *points],
                    ..Default::default()
                })
                .collect(),
        }
    }

    /// Add one sample taken at `t` (Unix seconds); `None` for a series not measured.
    pub fn add(&mut self, t: u64, sample: [Option<f64>; N]) {
        if self.archives.len() != ARCHIVES.len() {
            *self = Graph::new();
        }
        for (a, (_, step, _)) in self.archives.iter_mut().zip(ARCHIVES) {
            let slot = t / step * step;
            if slot < a.current {
                continue; // a sample from the past (a clock step back): ignored
            }
            if slot != a.current {
                a.close(step);
                a.current = slot;
            }
            for (i, v) in sample.iter().enumerate() {
                if let Some(v) = v.filter(|v| v.is_finite()) {
                    a.sums[i] += v;
                    a.counts[i] += 1;
                }
            }
        }
    }

    /// The points of one archive, oldest first, the slot being filled last.
    pub fn points(&self, archive: &str, now: u64) -> Option<Points> {
        let i = ARCHIVES.iter().position(|(n, _, _)| *n == archive)?;
        let (_, step, len) = ARCHIVES[i];
        let a = self.archives.get(i)?;
        let last = now / step * step;
        let mut times = Vec::with_capacity(len);
        let mut cols: Vec<Vec<Option<f32>>> = (0..N).map(|_| Vec::with_capacity(len)).collect();
        for k in (0..len as u64).rev() {
            let Some(t) = last.checked_sub(k * step) else {
                continue;
            };
            let values = if t == a.current {
                a.average()
            } else {
                let slot = ((t / step) % len as u64) as usize;
                if a.times.get(slot) == Some(&t) {
                    a.points[slot]
                } else {
                    [None; N]
                }
            };
            times.push(t);
            for (c, v) in cols.iter_mut().zip(values) {
                c.push(v);
            }
        }
        Some(Points {
            step,
            times,
            series: SERIES.iter().copied().zip(cols).collect(),
        })
    }
}

impl Archive {
    fn average(&self) -> [Option<f32>; N] {
        let mut out = [None; N];
        for ((o, sum), n) in out.iter_mut().zip(self.sums).zip(self.counts) {
            if n > 0 {
                *o = Some((sum / f64::from(n)) as f32);
            }
        }
        out
    }

    /// Store the slot being filled into its place in the ring.
    fn close(&mut self, step: u64) {
        if self.current == 0 || self.points.is_empty() {
            self.sums = [0.0; N];
            self.counts = [0; N];
            return;
        }
        let slot = ((self.current / step) % self.points.len() as u64) as usize;
        self.points[slot] = self.average();
        self.times[slot] = self.current;
        self.sums = [0.0; N];
        self.counts = [0; N];
    }
}

/// The previous counters of a domain or a node, to turn the next into rates.
struct Last {
    at: Instant,
    domain: Option<DomainStats>,
    busy: f64,
    idle: f64,
}

/// Every graph of the site, and where they are kept.
pub struct Graphs {
    dir: PathBuf,
    graphs: Mutex<HashMap<String, (Graph, bool)>>,
    last: Mutex<HashMap<String, Last>>,
    flushed: Mutex<Instant>,
}

/// How often changed graphs are written.
const FLUSH_EVERY: Duration = Duration::from_secs(60);

/// Now, in Unix seconds: the time graphs are kept in.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A graph's key: `vm-<VM uid>` or `node-<name>`; a file name (uids and node names are
/// checked names, never a path).
pub fn vm_key(uid: &str) -> String {
    format!("vm-{uid}")
}

pub fn node_key(name: &str) -> String {
    format!("node-{name}")
}

impl Graphs {
    pub fn new(dir: &Path) -> Graphs {
        Graphs {
            dir: dir.to_path_buf(),
            graphs: Mutex::new(HashMap::new()),
            last: Mutex::new(HashMap::new()),
            flushed: Mutex::new(Instant::now()),
        }
    }

    /// Take one node report: a sample for the node and for each of its domains whose VM
    /// `owner` knows (domain name → the VM's graph key).
    pub fn record(
        &self,
        node: &str,
        report: &NodeReport,
        owner: impl Fn(&str) -> Option<String>,
        now: u64,
    ) {
        let at = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let mut samples = Vec::new();
        // The node: cores busy, memory used, data disk used, and its VMs' I/O summed.
        let mut io = [0.0f64; 4];
        let mut io_known = false;
        for d in &report.domains {
            let key = format!("dom-{node}-{}", d.name);
            let prev = last.get(&key);
            let sample = domain_sample(prev, d, at);
            if let Some(prev_d) = prev.and_then(|p| p.domain.as_ref()) {
                let dt = at.duration_since(prev.map_or(at, |p| p.at)).as_secs_f64();
                if dt > 0.0 {
                    let (r, w, i, o) = io_totals(prev_d, d);
                    for (slot, v) in io.iter_mut().zip([r, w, i, o]) {
                        *slot += v / dt;
                    }
                    io_known = true;
                }
            }
            last.insert(
                key,
                Last {
                    at,
                    domain: Some(d.clone()),
                    busy: 0.0,
                    idle: 0.0,
                },
            );
            if let Some(k) = owner(&d.name) {
                samples.push((k, sample));
            }
        }
        let h = &report.host;
        let key = node_key(node);
        let cpu = last.get(&key).and_then(|p| {
            let busy = h.cpu_busy_seconds - p.busy;
            let total = busy + (h.cpu_idle_seconds - p.idle);
            (total > 0.0 && busy >= 0.0).then(|| busy / total * h.cpus.max(1) as f64)
        });
        let io = |i: usize| io_known.then_some(io[i]);
        let node_sample = [
            cpu,
            Some(
                h.memory_total_bytes
                    .saturating_sub(h.memory_available_bytes) as f64,
            ),
            io(0),
            io(1),
            io(2),
            io(3),
            Some(h.data_capacity_bytes.saturating_sub(h.data_free_bytes) as f64),
        ];
        last.insert(
            key.clone(),
            Last {
                at,
                domain: None,
                busy: h.cpu_busy_seconds,
                idle: h.cpu_idle_seconds,
            },
        );
        drop(last);
        samples.push((key, node_sample));
        let mut graphs = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
        for (key, sample) in samples {
            let entry = graphs
                .entry(key.clone())
                .or_insert_with(|| (self.load(&key).unwrap_or_default(), false));
            entry.0.add(now, sample);
            entry.1 = true;
        }
    }

    /// One archive of a graph, if it has one.
    pub fn points(&self, key: &str, archive: &str, now: u64) -> Option<Points> {
        let mut graphs = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
        if !graphs.contains_key(key) {
            let g = self.load(key)?;
            graphs.insert(key.to_string(), (g, false));
        }
        graphs.get(key)?.0.points(archive, now)
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    fn load(&self, key: &str) -> Option<Graph> {
        let text = std::fs::read(self.path(key)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Write the graphs that changed, if a minute passed since the last time (or `force`).
    /// Each file is written beside its place and renamed over it.
    pub fn flush(&self, force: bool) -> std::io::Result<usize> {
        {
            let mut at = self.flushed.lock().unwrap_or_else(|p| p.into_inner());
            if !force && at.elapsed() < FLUSH_EVERY {
                return Ok(0);
            }
            *at = Instant::now();
        }
        let dirty: Vec<(String, Vec<u8>)> = {
            let mut graphs = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
            graphs
                .iter_mut()
                .filter(|(_, (_, d))| *d)
                .map(|(k, (g, d))| {
                    *d = false;
                    (k.clone(), serde_json::to_vec(g).unwrap_or_default())
                })
                .collect()
        };
        if dirty.is_empty() {
            return Ok(0);
        }
        std::fs::create_dir_all(&self.dir)?;
        for (key, bytes) in &dirty {
            let tmp = self.dir.join(format!(".{key}.json.tmp"));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, self.path(key))?;
        }
        Ok(dirty.len())
    }

    /// Bytes a graph takes on disk (for the benchmark and the test).
    pub fn file_size(&self, key: &str) -> Option<u64> {
        std::fs::metadata(self.path(key)).ok().map(|m| m.len())
    }
}

/// A domain's sample: cores of CPU, memory in use, bytes per second read and written,
/// received and sent; rates need the previous counters.
fn domain_sample(prev: Option<&Last>, d: &DomainStats, at: Instant) -> [Option<f64>; N] {
    let memory = d
        .memory_available_bytes
        .zip(d.memory_unused_bytes)
        .map(|(a, u)| a.saturating_sub(u))
        .or(d.memory_rss_bytes)
        .map(|b| b as f64);
    let mut s = [None, memory, None, None, None, None, None];
    let Some((p, pd)) = prev.and_then(|p| Some((p, p.domain.as_ref()?))) else {
        return s;
    };
    let dt = at.duration_since(p.at).as_secs_f64();
    if dt <= 0.0 {
        return s;
    }
    if let (Some(now), Some(before)) = (d.cpu_time_ns, pd.cpu_time_ns)
        && now >= before
    {
        s[0] = Some((now - before) as f64 / 1e9 / dt);
    }
    let (r, w, i, o) = io_totals(pd, d);
    s[2] = Some(r / dt);
    s[3] = Some(w / dt);
    s[4] = Some(i / dt);
    s[5] = Some(o / dt);
    s
}

/// Bytes read, written, received and sent between two samples of a domain (devices matched
/// by name; a counter that went back, a restarted domain, counts from zero).
fn io_totals(before: &DomainStats, now: &DomainStats) -> (f64, f64, f64, f64) {
    let delta = |a: u64, b: u64| if a >= b { (a - b) as f64 } else { a as f64 };
    let (mut r, mut w, mut i, mut o) = (0.0, 0.0, 0.0, 0.0);
    for b in &now.block {
        let p = before.block.iter().find(|x| x.name == b.name);
        r += delta(b.read_bytes, p.map_or(0, |p| p.read_bytes));
        w += delta(b.write_bytes, p.map_or(0, |p| p.write_bytes));
    }
    for n in &now.net {
        let p = before.net.iter().find(|x| x.name == n.name);
        i += delta(n.rx_bytes, p.map_or(0, |p| p.rx_bytes));
        o += delta(n.tx_bytes, p.map_or(0, |p| p.tx_bytes));
    }
    (r, w, i, o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(v: f64) -> [Option<f64>; N] {
        [Some(v), None, None, None, None, None, None]
    }

    /// Points average their step's samples; an hour back is the oldest minute; a minute
    /// with no sample is empty, and a point from the ring's previous round is not shown.
    #[test]
    fn archives_average_and_forget() {
        let mut g = Graph::new();
        let t0 = 1_000_000_020; // 20 s into a minute
        g.add(t0, sample(1.0));
        g.add(t0 + 15, sample(3.0));
        g.add(t0 + 60, sample(5.0)); // the next minute
        let hour = g.points("hour", t0 + 60).unwrap();
        assert_eq!(hour.times.len(), 60);
        let cpu = &hour.series[0].1;
        assert_eq!(cpu[58], Some(2.0));
        assert_eq!(cpu[59], Some(5.0));
        assert_eq!(cpu[57], None);
        // Two hours on, with a sample every minute of the second: the first hour's points
        // are gone from the hour archive, kept (averaged) in the day's.
        for m in 60..180 {
            g.add(t0 + m * 60, sample(m as f64));
        }
        let hour = g.points("hour", t0 + 179 * 60).unwrap();
        assert!(
            hour.series[0]
                .1
                .iter()
                .all(|v| v.is_some_and(|v| v >= 120.0))
        );
        let day = g.points("day", t0 + 179 * 60).unwrap();
        assert_eq!(day.step, 900);
        // Quarter hours 0 and 4..=12 since t0 had samples: ten points.
        assert_eq!(day.series[0].1.iter().filter(|v| v.is_some()).count(), 10);
    }

    /// A month of samples every 15 s: the graph's file stays the same size after the
    /// archives are full, and under 1 MiB.
    #[test]
    fn a_month_of_samples_takes_a_fixed_size() {
        let mut g = Graph::new();
        let t0 = 1_700_000_000;
        let full = |g: &Graph| serde_json::to_vec(g).unwrap().len();
        let mut sizes = Vec::new();
        for day in 0..40u64 {
            for i in 0..(86400 / 15) {
                let v = (i % 100) as f64 + 0.123456;
                g.add(t0 + day * 86400 + i * 15, [Some(v); N]);
            }
            sizes.push(full(&g));
        }
        assert!(sizes[39] < 1 << 20, "{} bytes", sizes[39]);
        // After 31 days every point is filled; then the size varies only with the digits.
        let (lo, hi) = (
            sizes[32..].iter().min().unwrap(),
            sizes[32..].iter().max().unwrap(),
        );
        assert!(hi - lo < hi / 50, "{sizes:?}");
    }
}
