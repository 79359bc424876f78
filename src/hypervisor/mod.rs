//! The hypervisor boundary: whole-domain operations behind the [`Hypervisor`] trait and the
//! types they exchange, with an in-memory [`fake`] for unit tests. The libvirt
//! implementation lives in [`crate::virt`], the only module that imports the `virt` crate;
//! code below it (the CPU policy) reaches a host only through this trait.
//!
//! All trait methods block; async callers run them on `spawn_blocking`.

// A hypervisor in memory for the agent's and the CPU policy's unit tests; not in a build.
#[cfg(test)]
pub mod fake;

use serde::{Deserialize, Serialize};

/// The XML namespace of the `<metadata>` element that marks domains edgevirt created.
pub const METADATA_NS: &str = "https://edgevirt.io/xmlns/domain/1";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The domain does not exist (any more).
    #[error("domain {0} not found")]
    NoDomain(String),
    /// The guest agent is not connected or did not answer.
    #[error("guest agent unavailable: {0}")]
    AgentUnavailable(String),
    #[error("libvirt: {0}")]
    Libvirt(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// A domain's run state, as libvirt reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DomainState {
    Running,
    Paused,
    ShuttingDown,
    ShutOff,
    Crashed,
    Other,
}

/// A domain edgevirt created, found by its metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedDomain {
    pub name: String,
    pub install_id: String,
    /// The node whose agent created it (empty for domains of older releases).
    pub node: String,
    pub vmi_uid: String,
}

/// An address libvirt knows for a guest interface.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestAddress {
    pub interface: String,
    pub mac: Option<String>,
    pub ip: String,
}

/// Facts about the host libvirt runs on.
#[derive(Clone, Debug, Default)]
pub struct HostFacts {
    pub memory_bytes: u64,
    pub cpus: u32,
    pub libvirt_version: String,
    /// Domain types libvirt can create here, e.g. `kvm`, `qemu`.
    pub domain_types: Vec<String>,
}

/// libvirt's verdict on a guest CPU against what a host's hypervisor can provide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpuCompare {
    Identical,
    Superset,
    /// Not runnable there; libvirt's message names the missing features.
    Incompatible(String),
}

/// Where a block migration sends QEMU's own streams: unix sockets that exist under the
/// same paths on both hosts (on the source, the agent listens there and forwards each
/// connection to the target, where QEMU listens under that path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    /// `unix:///...`: the guest's memory and device state.
    pub memory_uri: String,
    /// `unix:///...`: the target's NBD server, which receives the disks.
    pub disks_uri: String,
}

/// A domain job (a backup), as libvirt reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Job {
    /// Running: bytes copied of the total.
    Running { processed: u64, total: u64 },
    /// The last job finished well.
    Completed,
    /// The last job failed (or was aborted), with libvirt's reason.
    Failed(String),
    /// No job ran, or its outcome is not known.
    None,
}

/// Whole-domain operations on one hypervisor connection.
pub trait Hypervisor: Send + Sync + 'static {
    /// Start a transient domain from XML.
    fn create(&self, xml: &str) -> Result<()>;
    /// Create a domain whose vCPUs do not run until it is resumed.
    fn create_paused(&self, xml: &str) -> Result<()>;
    /// The domain's state, or `None` if it does not exist.
    fn state(&self, name: &str) -> Result<Option<DomainState>>;
    /// Every domain carrying edgevirt's metadata, of any installation.
    fn owned_domains(&self) -> Result<Vec<OwnedDomain>>;
    /// ACPI power button.
    fn shutdown(&self, name: &str) -> Result<()>;
    fn destroy(&self, name: &str) -> Result<()>;
    fn suspend(&self, name: &str) -> Result<()>;
    fn resume(&self, name: &str) -> Result<()>;
    /// Reboot, through the guest agent when `agent` is true, else by ACPI.
    fn reboot(&self, name: &str, agent: bool) -> Result<()>;
    /// Run one guest-agent JSON command and return its JSON reply.
    fn agent_command(&self, name: &str, cmd: &str, timeout_secs: i32) -> Result<String>;
    /// Addresses from the libvirt network's DHCP leases.
    fn lease_addresses(&self, name: &str) -> Result<Vec<GuestAddress>>;
    /// Define and start a network from XML unless one of that name exists; start it if inactive.
    fn ensure_network(&self, name: &str, xml: &str) -> Result<()>;
    fn host_facts(&self) -> Result<HostFacts>;
    /// The live domain XML.
    fn xml(&self, name: &str) -> Result<String>;
    /// Live-migrate the domain peer to peer to the libvirtd at `dest_uri`, as `dest_xml`
    /// there. Without `block`, QEMU's memory stream is tunnelled through that libvirt
    /// connection. With `block`, local disks are copied too (the top layer of each, onto
    /// disks the target prepared): libvirt cannot tunnel that copy, so QEMU's memory and
    /// disk streams go to the unix sockets `block` names, which the caller forwards.
    /// `shared_storage`: the writable disks that are not copied are on a pool the operator
    /// declared shared, which libvirt is told to trust. Returns when libvirt reports the
    /// outcome.
    fn migrate(
        &self,
        name: &str,
        dest_uri: &str,
        dest_xml: &str,
        block: Option<&BlockCopy>,
        shared_storage: bool,
    ) -> Result<()> {
        let _ = (name, dest_uri, dest_xml, block, shared_storage);
        Err(Error::Libvirt("this backend cannot migrate".into()))
    }
    /// Grow a disk of a running domain (named by its source path) to `bytes`; the guest
    /// sees the new size at once.
    fn block_resize(&self, name: &str, disk: &str, bytes: u64) -> Result<()> {
        let _ = (name, disk, bytes);
        Err(Error::Libvirt("this backend cannot resize disks".into()))
    }
    /// Add a device (a `<disk>` element) to a running domain.
    fn attach_device(&self, name: &str, xml: &str) -> Result<()> {
        let _ = (name, xml);
        Err(Error::Libvirt("this backend cannot hotplug devices".into()))
    }
    /// Take a device (a `<disk>` element naming its target) out of a running domain.
    fn detach_device(&self, name: &str, xml: &str) -> Result<()> {
        let _ = (name, xml);
        Err(Error::Libvirt("this backend cannot hotplug devices".into()))
    }
    /// Abort the domain's running job (a migration).
    fn abort_job(&self, name: &str) -> Result<()> {
        let _ = name;
        Err(Error::Libvirt("this backend has no jobs".into()))
    }
    /// Start a push-mode backup (`<domainbackup>` XML): QEMU copies the named disks, as
    /// they were at this moment, into new files while the guest runs on.
    /// With `checkpoint` (`<domaincheckpoint>` XML), a checkpoint starts at the same
    /// instant: a dirty bitmap in each named disk that a later incremental backup counts from.
    /// With `reuse`, the target files exist already (qcow2, each of its disk's size);
    /// otherwise libvirt creates them.
    fn backup_begin(
        &self,
        name: &str,
        xml: &str,
        checkpoint: Option<&str>,
        reuse: bool,
    ) -> Result<()> {
        let _ = (name, xml, checkpoint, reuse);
        Err(Error::Libvirt("this backend cannot back up disks".into()))
    }
    /// The size the guest sees of the domain's disk `target` (`vda`), in bytes.
    fn disk_capacity(&self, name: &str, target: &str) -> Result<u64> {
        let _ = (name, target);
        Err(Error::Libvirt("this backend cannot size disks".into()))
    }
    /// The names of the domain's checkpoints.
    fn checkpoints(&self, name: &str) -> Result<Vec<String>> {
        let _ = name;
        Ok(vec![])
    }
    /// A checkpoint's definition (`<domaincheckpoint>` XML, as libvirt redefines it).
    fn checkpoint_xml(&self, name: &str, checkpoint: &str) -> Result<String> {
        let _ = (name, checkpoint);
        Err(Error::Libvirt("this backend has no checkpoints".into()))
    }
    /// Define again a checkpoint whose bitmaps the disks still hold (after the guest
    /// restarted); fails when a bitmap is missing or was left inconsistent.
    fn checkpoint_redefine(&self, name: &str, xml: &str) -> Result<()> {
        let _ = (name, xml);
        Err(Error::Libvirt("this backend has no checkpoints".into()))
    }
    /// Delete a checkpoint (its bitmaps merge into its parent's, if any).
    fn checkpoint_delete(&self, name: &str, checkpoint: &str) -> Result<()> {
        let _ = (name, checkpoint);
        Err(Error::Libvirt("this backend has no checkpoints".into()))
    }
    /// The domain's job: the one running, else how the last one ended.
    fn job(&self, name: &str) -> Result<Job> {
        let _ = name;
        Err(Error::Libvirt("this backend has no jobs".into()))
    }
    /// The guest's pause at the switch-over of the last completed incoming migration, in ms.
    fn completed_migration_downtime_ms(&self, name: &str) -> Result<Option<u64>> {
        let _ = name;
        Ok(None)
    }
    /// libvirt's domain capabilities XML for guests of domain type `virt_type` (`kvm`, `qemu`).
    fn domain_capabilities(&self, virt_type: &str) -> Result<String>;
    /// Compare a guest `<cpu>` definition with what this host's hypervisor can provide for
    /// `virt_type` (libvirt's `virConnectCompareHypervisorCPU`).
    fn compare_cpu(&self, virt_type: &str, cpu_xml: &str) -> Result<CpuCompare>;
    /// The CPU every one of the given `<cpu>` definitions can run, as a `<cpu>` element
    /// (libvirt's `virConnectBaselineHypervisorCPU`).
    fn baseline_cpu(&self, virt_type: &str, cpu_xmls: &[String]) -> Result<String>;
    /// Call `on_event` whenever libvirt reports a lifecycle event (started, suspended,
    /// resumed, stopped, ...) for the domain. Backends without events do nothing; callers
    /// keep polling as a fallback either way.
    fn watch_lifecycle(&self, _name: &str, _on_event: Box<dyn Fn() + Send + Sync>) -> Result<()> {
        Ok(())
    }
    /// The counters of every running domain, in one call (libvirt's bulk domain stats).
    fn domain_stats(&self) -> Result<Vec<DomainStats>> {
        Ok(Vec::new())
    }
}

/// A running domain's counters, as libvirt's bulk stats report them (cumulative since the
/// domain started; memory in bytes). Fields a hypervisor does not report stay `None`.
/// Sent by agents to the controller, so decoded tolerantly.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DomainStats {
    pub name: String,
    /// CPU time of the whole domain (vCPUs and QEMU's own threads), and its user and
    /// system parts, in nanoseconds.
    pub cpu_time_ns: Option<u64>,
    pub cpu_user_ns: Option<u64>,
    pub cpu_system_ns: Option<u64>,
    /// Each vCPU's run time, in nanoseconds, by vCPU number.
    pub vcpu_time_ns: Vec<u64>,
    /// The balloon's view: memory given to the guest, what the guest can use, what it
    /// leaves unused, and QEMU's resident set.
    pub memory_current_bytes: Option<u64>,
    pub memory_available_bytes: Option<u64>,
    pub memory_unused_bytes: Option<u64>,
    pub memory_usable_bytes: Option<u64>,
    pub memory_rss_bytes: Option<u64>,
    pub net: Vec<NetStats>,
    pub block: Vec<BlockStats>,
}

/// One guest interface's traffic (the host side's tap device).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NetStats {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_drops: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_drops: u64,
}

/// One disk's I/O, by its target device (`vda`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct BlockStats {
    pub name: String,
    pub read_bytes: u64,
    pub read_requests: u64,
    pub read_time_ns: u64,
    pub write_bytes: u64,
    pub write_requests: u64,
    pub write_time_ns: u64,
    pub flush_requests: u64,
    /// The image's size as the guest sees it, and what it takes on the host.
    pub capacity_bytes: Option<u64>,
    pub allocation_bytes: Option<u64>,
}

impl DomainStats {
    /// Read libvirt's typed parameters (`cpu.time`, `vcpu.0.time`, `balloon.rss`,
    /// `net.0.rx.bytes`, `block.1.wr.reqs`, `net.0.name`, ...). Unknown ones are ignored.
    pub fn from_params<'a>(
        name: &str,
        params: impl IntoIterator<Item = (&'a str, Param<'a>)>,
    ) -> Self {
        let mut s = DomainStats {
            name: name.to_string(),
            ..Default::default()
        };
        let kib = |v: u64| Some(v.saturating_mul(1024));
        for (field, p) in params {
            let v = match p {
                Param::Num(v) => v,
                Param::Text(t) => {
                    s.name_device(field, t);
                    continue;
                }
            };
            match field {
                "cpu.time" => s.cpu_time_ns = Some(v),
                "cpu.user" => s.cpu_user_ns = Some(v),
                "cpu.system" => s.cpu_system_ns = Some(v),
                "balloon.current" => s.memory_current_bytes = kib(v),
                "balloon.available" => s.memory_available_bytes = kib(v),
                "balloon.unused" => s.memory_unused_bytes = kib(v),
                "balloon.usable" => s.memory_usable_bytes = kib(v),
                "balloon.rss" => s.memory_rss_bytes = kib(v),
                _ => {
                    let mut parts = field.splitn(3, '.');
                    let (Some(group), Some(i), Some(rest)) =
                        (parts.next(), parts.next(), parts.next())
                    else {
                        continue;
                    };
                    let Ok(i) = i.parse::<usize>() else { continue };
                    // At most a few hundred devices: a bad index must not allocate much.
                    if i >= 1024 {
                        continue;
                    }
                    match group {
                        "vcpu" if rest == "time" => {
                            if s.vcpu_time_ns.len() <= i {
                                s.vcpu_time_ns.resize(i + 1, 0);
                            }
                            s.vcpu_time_ns[i] = v;
                        }
                        "net" => {
                            let n = slot(&mut s.net, i);
                            match rest {
                                "rx.bytes" => n.rx_bytes = v,
                                "rx.pkts" => n.rx_packets = v,
                                "rx.errs" => n.rx_errors = v,
                                "rx.drop" => n.rx_drops = v,
                                "tx.bytes" => n.tx_bytes = v,
                                "tx.pkts" => n.tx_packets = v,
                                "tx.errs" => n.tx_errors = v,
                                "tx.drop" => n.tx_drops = v,
                                _ => {}
                            }
                        }
                        "block" => {
                            let b = slot(&mut s.block, i);
                            match rest {
                                "rd.bytes" => b.read_bytes = v,
                                "rd.reqs" => b.read_requests = v,
                                "rd.times" => b.read_time_ns = v,
                                "wr.bytes" => b.write_bytes = v,
                                "wr.reqs" => b.write_requests = v,
                                "wr.times" => b.write_time_ns = v,
                                "fl.reqs" => b.flush_requests = v,
                                "capacity" => b.capacity_bytes = Some(v),
                                "allocation" => b.allocation_bytes = Some(v),
                                _ => {}
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        s
    }

    /// Name the devices numbered in the parameters: `net.N.name`, `block.N.name`.
    fn name_device(&mut self, field: &str, value: &str) {
        let mut parts = field.splitn(3, '.');
        let (Some(group), Some(i), Some("name")) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let Ok(i) = i.parse::<usize>() else { return };
        if i >= 1024 {
            return;
        }
        match group {
            "net" => slot(&mut self.net, i).name = value.to_string(),
            "block" => slot(&mut self.block, i).name = value.to_string(),
            _ => {}
        }
    }
}

/// One libvirt typed parameter's value: every integer type as u64 (negative ones as 0),
/// or text.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Param<'a> {
    Num(u64),
    Text(&'a str),
}

/// Entry `i` of a device list, growing it as needed.
fn slot<T: Default>(v: &mut Vec<T>, i: usize) -> &mut T {
    if v.len() <= i {
        v.resize_with(i + 1, T::default);
    }
    &mut v[i]
}

/// One `<disk>` of a domain's XML: its target device, source file, and whether the guest
/// may write to it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DomainDisk {
    pub target: String,
    pub file: String,
    pub readonly: bool,
    /// The device's alias (`ua-` and the volume's name, for edgevirt's disks).
    pub alias: String,
}

/// The file-backed disks of a domain's XML.
pub fn domain_disks(xml: &str) -> Vec<DomainDisk> {
    let mut all = all_domain_disks(xml);
    all.retain(|d| !d.file.is_empty());
    all
}

/// Every disk of a domain's XML, an empty CD drive's too.
pub fn all_domain_disks(xml: &str) -> Vec<DomainDisk> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(xml);
    let (mut out, mut cur): (Vec<DomainDisk>, Option<DomainDisk>) = (Vec::new(), None);
    let attr = |e: &quick_xml::events::BytesStart, k: &[u8]| {
        e.attributes()
            .flatten()
            .find(|a| a.key.local_name().as_ref() == k)
            .and_then(|a| a.unescape_value().ok().map(|v| v.to_string()))
    };
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) if e.local_name().as_ref() == b"disk" => {
                cur = Some(DomainDisk {
                    target: String::new(),
                    file: String::new(),
                    readonly: false,
                    alias: String::new(),
                });
            }
            Ok(Event::Start(e)) | Ok(Event::Empty(e)) => {
                if let Some(d) = cur.as_mut() {
                    match e.local_name().as_ref() {
                        b"source" => d.file = attr(&e, b"file").unwrap_or_default(),
                        b"target" => d.target = attr(&e, b"dev").unwrap_or_default(),
                        b"readonly" => d.readonly = true,
                        b"alias" => d.alias = attr(&e, b"name").unwrap_or_default(),
                        _ => {}
                    }
                }
            }
            Ok(Event::End(e)) if e.local_name().as_ref() == b"disk" => {
                out.extend(cur.take());
            }
            Ok(Event::Eof) | Err(_) => break,
            _ => {}
        }
    }
    out
}

/// Parse edgevirt's metadata element out of a domain's XML metadata text.
pub fn parse_metadata(name: &str, xml: &str) -> Option<OwnedDomain> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(xml);
    let (mut install, mut uid, mut node) = (None, None, String::new());
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) | Ok(Event::Empty(e)) if e.local_name().as_ref() == b"instance" => {
                for a in e.attributes().flatten() {
                    let v = a.unescape_value().ok()?.to_string();
                    match a.key.local_name().as_ref() {
                        b"install" => install = Some(v),
                        b"vmi-uid" => uid = Some(v),
                        b"node" => node = v,
                        _ => {}
                    }
                }
            }
            Ok(Event::Eof) | Err(_) => break,
            _ => {}
        }
    }
    Some(OwnedDomain {
        name: name.to_string(),
        install_id: install?,
        node,
        vmi_uid: uid?,
    })
}

#[cfg(test)]
mod tests {
    use super::{DomainStats, Param};

    /// libvirt's bulk-stats parameters, as libvirt 9 names them for a guest with one NIC
    /// and two disks.
    #[test]
    fn bulk_stats_parameters_are_read() {
        let params = [
            ("state.state", Param::Num(1)),
            ("cpu.time", Param::Num(3_500_000_000)),
            ("cpu.user", Param::Num(1_000_000_000)),
            ("cpu.system", Param::Num(2_000_000_000)),
            ("balloon.current", Param::Num(196_608)),
            ("balloon.rss", Param::Num(150_000)),
            ("balloon.available", Param::Num(180_000)),
            ("balloon.unused", Param::Num(100_000)),
            ("vcpu.current", Param::Num(2)),
            ("vcpu.1.time", Param::Num(7)),
            ("vcpu.0.time", Param::Num(5)),
            ("net.count", Param::Num(1)),
            ("net.0.name", Param::Text("vnet3")),
            ("net.0.rx.bytes", Param::Num(1400)),
            ("net.0.tx.pkts", Param::Num(9)),
            ("block.count", Param::Num(2)),
            ("block.1.name", Param::Text("vdb")),
            ("block.1.wr.bytes", Param::Num(4_194_304)),
            ("block.1.wr.reqs", Param::Num(64)),
            ("block.0.name", Param::Text("vda")),
            ("block.0.rd.bytes", Param::Num(512)),
            ("block.0.capacity", Param::Num(33_554_432)),
            // An index far too large is ignored, not allocated for.
            ("block.4000000000.rd.bytes", Param::Num(1)),
        ];
        let s = DomainStats::from_params("ev-default-web-1234", params);
        assert_eq!(s.name, "ev-default-web-1234");
        assert_eq!(s.cpu_time_ns, Some(3_500_000_000));
        assert_eq!(s.vcpu_time_ns, [5, 7]);
        assert_eq!(s.memory_rss_bytes, Some(150_000 * 1024));
        assert_eq!(s.memory_current_bytes, Some(196_608 * 1024));
        assert_eq!(s.memory_available_bytes, Some(180_000 * 1024));
        assert_eq!((s.net.len(), s.net[0].name.as_str()), (1, "vnet3"));
        assert_eq!((s.net[0].rx_bytes, s.net[0].tx_packets), (1400, 9));
        assert_eq!(s.block.len(), 2);
        assert_eq!(s.block[1].name, "vdb");
        assert_eq!(
            (s.block[1].write_bytes, s.block[1].write_requests),
            (4_194_304, 64)
        );
        assert_eq!(s.block[0].capacity_bytes, Some(33_554_432));
    }

    #[test]
    fn disks_of_a_domain() {
        let xml = "<domain><devices>\
            <disk type='file' device='disk'><driver name='qemu' type='qcow2' cache='none'/>\
              <source file='/srv/pool/default/data.qcow2'/><backingStore/>\
              <target dev='vda' bus='virtio'/><alias name='ua-data'/></disk>\
            <disk type='file' device='cdrom'><source file='/var/lib/edgevirt/run/u/ci.iso'/>\
              <target dev='sda' bus='sata'/><readonly/></disk>\
            <disk type='file' device='cdrom'><target dev='sdb' bus='sata'/><readonly/></disk>\
            </devices></domain>";
        let d = super::domain_disks(xml);
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(
            (d[0].target.as_str(), d[0].file.as_str(), d[0].readonly),
            ("vda", "/srv/pool/default/data.qcow2", false)
        );
        assert_eq!((d[1].target.as_str(), d[1].readonly), ("sda", true));
    }

    #[test]
    fn metadata_round_trip() {
        let xml = r#"<ev:instance xmlns:ev="https://edgevirt.io/xmlns/domain/1" install="i1" vmi-uid="u1" node="n1" namespace="default" name="a"/>"#;
        let d = super::parse_metadata("dom", xml).unwrap();
        assert_eq!(
            (d.install_id.as_str(), d.vmi_uid.as_str(), d.node.as_str()),
            ("i1", "u1", "n1")
        );
        assert!(super::parse_metadata("dom", "<other/>").is_none());
    }
}
