//! The observability benchmark (a benchmark, not a test: it prints figures and only fails
//! when something could not be measured at all).
//!
//!   cargo bench --bench metrics            (root, libvirtd and the test guest for part 2)
//!
//! 1. One `/metrics` scrape with `BENCH_VMIS` (1,000) running VMIs in a real SQLite store
//!    and one node report holding a domain (a NIC and two disks) for each: the server-side
//!    render (`metrics::render`, what `GET /metrics` runs) against the floor of reading the
//!    same VMIs' stored JSON with a raw `SELECT` (`Store::list_raw`). Medians of 15.
//! 2. Collecting the node's figures for `BENCH_GUESTS` (20) running guests (test kernel,
//!    paused after start so 20 TCG boots do not load the machine): libvirt's bulk stats and
//!    the host's figures, as the agent collects them every 15 s (`Hypervisor::domain_stats`
//!    and `HostSample::read`), timed in CPU (this process and libvirtd, whose side of the
//!    call is most of it) and wall time, against a bare `virsh domstats` of the same
//!    domains. Then the same collection 500 times: this process's RSS before and after
//!    (the `virt` crate's own wrapper leaks every record; this one frees them).
//! 3. The graph of one VM fed a sample every 15 s for 40 simulated days: its file's size
//!    after 1, 31 and 40 days (it must stay under 1 MiB and not grow once the month is
//!    full).
//!
//! Targets (issue 21): scrape ≤ 100 ms; collection ≤ 2% of one core at a 15 s interval;
//! graph < 1 MiB and not growing. Printed next to the figures, never asserted.

use std::process::Command;
use std::time::{Duration, Instant};

use edgevirt::hypervisor::{BlockStats, DomainStats, Hypervisor, NetStats};
use edgevirt::metrics::graphs::{Graph, SERIES};
use edgevirt::metrics::{HostSample, Hub, NodeReport};
use edgevirt::store::{ListQuery, Store};
use edgevirt::types::Kind;
use serde_json::json;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    // `cargo test --all-targets` runs bench targets too (without `--bench`): nothing to do.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    scrape().await;
    collection();
    graph();
}

async fn scrape() {
    let n = env("BENCH_VMIS", 1000);
    let dir = tempfile::Builder::new()
        .prefix("evbench-metrics-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let store = Store::open(&dir.path().join("db")).await.unwrap();
    let mut domains = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("vm-{i:05}");
        let dom = format!("ev-default-{name}-0000");
        store
            .create(
                Kind::VirtualMachineInstance,
                json!({"metadata": {"name": name, "namespace": "default",
                        "labels": {"app": "bench"},
                        "annotations": {"vm.kubevirt.io/os": "linux"}},
                       "spec": {"domain": {"devices": {}}},
                       "status": {"phase": "Running", "nodeName": "n1", "domainName": dom,
                                  "guestAgentInfo": {"fsInfo": {"disks": [{"diskName": "vda1",
                                      "mountPoint": "/", "fileSystemType": "ext4",
                                      "usedBytes": 1u64 << 30, "totalBytes": 10u64 << 30}]}}}}),
                false,
            )
            .await
            .unwrap();
        domains.push(DomainStats {
            name: dom,
            cpu_time_ns: Some(i as u64 * 1_000_000),
            cpu_user_ns: Some(1),
            cpu_system_ns: Some(1),
            vcpu_time_ns: vec![1, 2],
            memory_rss_bytes: Some(200 << 20),
            memory_available_bytes: Some(190 << 20),
            memory_unused_bytes: Some(100 << 20),
            memory_current_bytes: Some(192 << 20),
            net: vec![NetStats {
                name: "vnet0".into(),
                rx_bytes: 1000,
                tx_bytes: 1000,
                ..Default::default()
            }],
            block: ["vda", "vdb"]
                .iter()
                .map(|d| BlockStats {
                    name: d.to_string(),
                    read_bytes: 4096,
                    write_bytes: 4096,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
    }
    let hub = Hub::default();
    hub.put(
        "n1",
        NodeReport {
            interval_secs: 15,
            domains,
            ..Default::default()
        },
    );
    let q = ListQuery {
        namespace: None,
        labels: None,
        fields: None,
        after: None,
        limit: None,
    };
    let (mut render_t, mut floor_t) = (vec![], vec![]);
    let mut size = 0;
    for _ in 0..15 {
        let t = Instant::now();
        let raw = store
            .list_raw(Kind::VirtualMachineInstance, &q)
            .await
            .unwrap();
        floor_t.push(t.elapsed());
        assert_eq!(raw.len(), n);
        let t = Instant::now();
        let text = edgevirt::metrics::render(&store, &hub, dir.path())
            .await
            .unwrap();
        render_t.push(t.elapsed());
        size = text.len();
    }
    let (r, f) = (median(render_t), median(floor_t));
    println!(
        "scrape with {n} VMIs: render {:.1} ms ({} KiB of text), raw SELECT of the VMIs {:.1} ms: \
         {:.1}x the floor; target <= 100 ms",
        ms(r),
        size >> 10,
        ms(f),
        r.as_secs_f64() / f.as_secs_f64()
    );
}

/// CPU seconds of a process (user + system) from /proc/PID/stat.
fn cpu_of(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // After the comm: state(0) ppid(1) ... utime(11) stime(12), in clock ticks.
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn virsh(args: &[&str]) -> bool {
    Command::new("virsh")
        .args(["-c", "qemu:///system"])
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn collection() {
    let guests = env("BENCH_GUESTS", 20);
    let guest = std::env::var("EDGEVIRT_TEST_GUEST").unwrap_or_else(|_| "target/test-guest".into());
    let kernel = std::path::Path::new(&guest).join("vmlinuz");
    let initrd = std::path::Path::new(&guest).join("initrd.img");
    let Some(libvirtd) = std::fs::read_to_string("/run/libvirtd.pid")
        .ok()
        .map(|p| p.trim().to_string())
        .filter(|_| kernel.exists())
    else {
        println!(
            "collection: skipped (needs libvirtd started by setup-host.sh and the test guest)"
        );
        return;
    };
    let names: Vec<String> = (0..guests).map(|i| format!("evbench-stats-{i}")).collect();
    let dir = tempfile::tempdir().unwrap();
    for n in &names {
        let xml = format!(
            "<domain type='qemu'><name>{n}</name><memory unit='MiB'>96</memory><vcpu>1</vcpu>\
             <os><type arch='x86_64' machine='pc'>hvm</type><kernel>{}</kernel><initrd>{}</initrd>\
             <cmdline>console=ttyS0</cmdline></os><devices>\
             <disk type='file' device='disk'><driver name='qemu' type='raw'/>\
             <source file='{}/{n}.img'/><target dev='vda' bus='virtio'/></disk>\
             <interface type='network'><source network='default'/><model type='virtio'/></interface>\
             <memballoon model='virtio'/></devices></domain>",
            kernel.display(),
            initrd.display(),
            dir.path().display()
        );
        std::fs::write(dir.path().join(format!("{n}.img")), vec![0u8; 1 << 20]).unwrap();
        let file = dir.path().join(format!("{n}.xml"));
        // No default network everywhere: fall back to no NIC.
        let xml = if virsh(&["net-info", "default"]) {
            xml
        } else {
            xml.replace(
                "<interface type='network'><source network='default'/><model type='virtio'/></interface>",
                "",
            )
        };
        std::fs::write(&file, xml).unwrap();
        assert!(
            virsh(&["create", "--paused", file.to_str().unwrap()]),
            "virsh create {n}"
        );
    }
    let hv = edgevirt::virt::libvirt::Libvirt::open("qemu:///system").unwrap();
    let data = std::env::temp_dir();
    let collect = || {
        let d = hv.domain_stats().unwrap();
        let h = HostSample::read(&data);
        (d, h)
    };
    let (d, _) = collect();
    let ours: Vec<_> = d
        .iter()
        .filter(|d| d.name.starts_with("evbench-stats-"))
        .collect();
    assert_eq!(ours.len(), guests, "every guest in the bulk stats");
    let rounds = 20;
    let (c0, l0, t0) = (cpu_of("self"), cpu_of(&libvirtd), Instant::now());
    for _ in 0..rounds {
        std::hint::black_box(collect());
    }
    let (cpu_self, cpu_lv, wall) = (
        (cpu_of("self") - c0) / rounds as f64,
        (cpu_of(&libvirtd) - l0) / rounds as f64,
        t0.elapsed() / rounds,
    );
    let mut doms: Vec<&str> = vec!["domstats"];
    doms.extend(names.iter().map(String::as_str));
    let (l1, t1) = (cpu_of(&libvirtd), Instant::now());
    for _ in 0..rounds {
        assert!(virsh(&doms));
    }
    let (virsh_wall, virsh_lv) = (
        t1.elapsed() / rounds,
        (cpu_of(&libvirtd) - l1) / rounds as f64,
    );
    let share = (cpu_self + cpu_lv) / 15.0 * 100.0;
    println!(
        "collection for {guests} guests: {:.1} ms wall, CPU {:.1} ms here + {:.1} ms in libvirtd \
         = {share:.3}% of one core at a 15 s interval (target <= 2%); bare `virsh domstats`: \
         {:.1} ms wall ({:.2}x), {:.1} ms in libvirtd",
        ms(wall),
        cpu_self * 1000.0,
        cpu_lv * 1000.0,
        ms(virsh_wall),
        wall.as_secs_f64() / virsh_wall.as_secs_f64(),
        virsh_lv * 1000.0,
    );
    let before = rss_kib();
    for _ in 0..500 {
        std::hint::black_box(collect());
    }
    let after = rss_kib();
    println!(
        "500 more collections: RSS {before} KiB -> {after} KiB ({:+} KiB; the virt crate's \
         wrapper would keep every record)",
        after as i64 - before as i64
    );
    // Every guest goes, and the run says so if one would not.
    for n in &names {
        if !virsh(&["destroy", n]) && virsh(&["domid", n]) {
            println!("collection: could not destroy {n}; remove it with `virsh destroy {n}`");
        }
    }
}

fn graph() {
    let mut g = Graph::default();
    let t0 = 1_700_000_000u64;
    let mut sizes = vec![];
    for day in 0..40u64 {
        for i in 0..(86400 / 15) {
            let v = (i % 97) as f64 * 1.2345e6;
            g.add(t0 + day * 86400 + i * 15, [Some(v); SERIES.len()]);
        }
        if [0, 30, 39].contains(&day) {
            sizes.push((day + 1, serde_json::to_vec(&g).unwrap().len()));
        }
    }
    let text: Vec<String> = sizes
        .iter()
        .map(|(d, s)| format!("{d} days {:.1} KiB", *s as f64 / 1024.0))
        .collect();
    println!(
        "graph of one VM, a sample every 15 s: {} (target < 1024 KiB, no growth after a month)",
        text.join(", ")
    );
}
