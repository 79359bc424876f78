//! The launcher role: one process per VM that owns one libvirt domain.
//!
//! Started detached by the agent (`edgevirt launcher ...`, a hidden subcommand), it creates
//! the domain from the XML the agent wrote, or adopts it if it already runs (after a launcher
//! crash or upgrade), serves the versioned protocol of [`protocol`] on a unix socket, keeps a
//! cached status fed by domain state and the guest agent, and exits when its domain is gone.
//! It never touches any other domain, and it never stops its domain because it is exiting.

pub mod client;
pub mod protocol;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::RwLock;

use crate::hypervisor::{DomainState, GuestAddress, Hypervisor};
use crate::types::kubevirt::{
    FileSystem, FileSystemDisk, FileSystemInfo, GuestAgentInfo, GuestOsInfo, GuestOsUser,
};
use protocol::{
    CpuFeature, CpuModel, CpuModelField, CpuTopology, Envelope, GuestCpu, Info, Request, Response,
    Status,
};

/// What the launcher is told on its command line.
#[derive(Clone, Debug)]
pub struct Config {
    pub socket: PathBuf,
    pub libvirt_uri: String,
    pub domain_name: String,
    pub vmi_uid: String,
    /// The domain XML to create when the domain does not exist yet.
    pub xml_file: PathBuf,
}

struct Launcher {
    cfg: Config,
    hv: Arc<dyn Hypervisor>,
    status: RwLock<Status>,
    /// Answers still owed (a migration): the launcher does not exit while any is open, even
    /// though a migrated domain is gone from here before libvirt returns.
    owed: std::sync::atomic::AtomicUsize,
}

/// Run the launcher until its domain is gone.
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    let uri = cfg.libvirt_uri.clone();
    let hv: Arc<dyn Hypervisor> = Arc::new(
        tokio::task::spawn_blocking(move || crate::virt::libvirt::Libvirt::open(&uri)).await??,
    );
    run_with(cfg, hv).await
}

/// A file beside the domain XML that asks for the domain to be created paused.
pub const START_PAUSED_FILE: &str = "start-paused";

/// Run with a given hypervisor (the fake in unit tests).
pub async fn run_with(cfg: Config, hv: Arc<dyn Hypervisor>) -> anyhow::Result<()> {
    let l = Arc::new(Launcher {
        cfg: cfg.clone(),
        hv,
        status: RwLock::new(Status::default()),
        owed: std::sync::atomic::AtomicUsize::new(0),
    });
    let state = l.blocking(|hv, name| hv.state(name)).await?;
    match state {
        Some(_) => tracing::info!(domain = %cfg.domain_name, "adopting running domain"),
        None => {
            let xml = std::fs::read_to_string(&cfg.xml_file)?;
            // startStrategy Paused: the agent leaves this file beside the XML.
            let paused = cfg.xml_file.with_file_name(START_PAUSED_FILE).exists();
            // Taps on a VLAN get it before the guest's first frame: the domain starts paused
            // until they have it.
            let dir = cfg.xml_file.parent().unwrap_or(Path::new("."));
            let taps = crate::hostnet::read_tap_vlans(dir)?;
            tracing::info!(domain = %cfg.domain_name, paused, vlans = taps.len(), "creating domain");
            let hv = l.hv.clone();
            let name = cfg.domain_name.clone();
            tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                if !paused && taps.is_empty() {
                    return Ok(hv.create(&xml)?);
                }
                hv.create_paused(&xml)?;
                if let Some(e) = taps.iter().find_map(|t| crate::hostnet::set_vlan(t).err()) {
                    // Never let the guest run on the bridge's default VLAN instead.
                    let _ = hv.destroy(&name);
                    return Err(e.context("the domain was destroyed: its tap has no VLAN"));
                }
                if !paused {
                    hv.resume(&name)?;
                }
                Ok(())
            })
            .await??;
        }
    }
    let _ = std::fs::remove_file(&cfg.socket);
    let listener = UnixListener::bind(&cfg.socket)?;
    // libvirt lifecycle events wake the status loop at once; polling stays as the fallback.
    let wake = Arc::new(tokio::sync::Notify::new());
    {
        let wake = wake.clone();
        let hv = l.hv.clone();
        let name = cfg.domain_name.clone();
        let r = tokio::task::spawn_blocking(move || {
            hv.watch_lifecycle(&name, Box::new(move || wake.notify_one()))
        })
        .await?;
        if let Err(e) = r {
            tracing::warn!(error = %e, "no domain events; polling only");
        }
    }
    // Domain state only: the guest agent cannot answer this early, and the agent is waiting.
    l.refresh(false).await;
    match l.blocking(|hv, n| hv.xml(n)).await {
        Ok(xml) => l.status.write().await.cpu = cpu_from_xml(&xml),
        Err(e) => tracing::warn!(error = %e, "reading the domain XML failed; no CPU reported"),
    }

    let poller = {
        let l = l.clone();
        tokio::spawn(async move {
            let mut tick = 0u64;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = wake.notified() => {}
                }
                tick += 1;
                // The guest agent is asked every 2 s; domain state every 0.5 s.
                if !l.refresh(tick.is_multiple_of(4)).await
                    && l.owed.load(std::sync::atomic::Ordering::SeqCst) == 0
                {
                    return;
                }
            }
        })
    };
    let server = {
        let l = l.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let l = l.clone();
                tokio::spawn(async move {
                    if let Err(e) = l.serve(stream).await {
                        tracing::debug!(error = %e, "launcher connection ended");
                    }
                });
            }
        })
    };
    let _ = poller.await;
    server.abort();
    let _ = std::fs::remove_file(&cfg.socket);
    tracing::info!(domain = %cfg.domain_name, "domain is gone; launcher exits");
    Ok(())
}

impl Launcher {
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Hypervisor, &str) -> crate::hypervisor::Result<T> + Send + 'static,
    ) -> crate::hypervisor::Result<T> {
        let hv = self.hv.clone();
        let name = self.cfg.domain_name.clone();
        tokio::task::spawn_blocking(move || f(hv.as_ref(), &name))
            .await
            .unwrap_or_else(|e| {
                Err(crate::hypervisor::Error::Libvirt(format!(
                    "task failed: {e}"
                )))
            })
    }

    /// Update the cached status; false once the domain is gone.
    async fn refresh(&self, with_agent: bool) -> bool {
        let state = match self.blocking(|hv, n| hv.state(n)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "reading domain state failed");
                return true;
            }
        };
        let gone = state.is_none();
        {
            let mut st = self.status.write().await;
            st.state = state;
        }
        if gone {
            return false;
        }
        if with_agent && state == Some(DomainState::Running) {
            let (guest, addrs) = self.blocking(guest_info).await.unwrap_or((None, vec![]));
            let mut st = self.status.write().await;
            st.agent_connected = guest.is_some();
            if let Some(g) = guest {
                st.guest = Some(g);
            }
            if !addrs.is_empty() {
                st.addresses = addrs;
                st.address_source = Some("guest-agent".into());
            } else if let Ok(leases) = self.blocking(|hv, n| hv.lease_addresses(n)).await
                && !leases.is_empty()
            {
                st.addresses = leases;
                st.address_source = Some("dhcp-lease".into());
            }
        }
        true
    }

    async fn serve(&self, stream: UnixStream) -> anyhow::Result<()> {
        let (r, mut w) = stream.into_split();
        let mut lines = BufReader::new(r).lines();
        while let Some(line) = lines.next_line().await? {
            let resp = match serde_json::from_str::<Envelope>(&line) {
                Ok(env)
                    if !protocol::VERSIONS.contains(&env.version)
                        && env.request != Request::Info =>
                {
                    Response {
                        ok: false,
                        error: Some(format!(
                            "protocol version {} not supported; this launcher speaks {:?}",
                            env.version,
                            protocol::VERSIONS
                        )),
                        result: Value::Null,
                    }
                }
                Ok(env) if matches!(env.request, Request::Migrate { .. }) => {
                    use std::sync::atomic::Ordering;
                    self.owed.fetch_add(1, Ordering::SeqCst);
                    let resp = self.handle(env.request, env.version).await;
                    let mut out = serde_json::to_vec(&resp)?;
                    out.push(b'\n');
                    let r = w.write_all(&out).await;
                    self.owed.fetch_sub(1, Ordering::SeqCst);
                    r?;
                    continue;
                }
                Ok(env) => self.handle(env.request, env.version).await,
                Err(e) => Response {
                    ok: false,
                    error: Some(format!("bad request: {e}")),
                    result: Value::Null,
                },
            };
            let mut out = serde_json::to_vec(&resp)?;
            out.push(b'\n');
            w.write_all(&out).await?;
        }
        Ok(())
    }

    async fn handle(&self, req: Request, version: u32) -> Response {
        let res: Result<Value, String> = match req {
            Request::Info => Ok(serde_json::to_value(Info {
                versions: protocol::VERSIONS.to_vec(),
                launcher_version: crate::version::RELEASE.into(),
                domain_name: self.cfg.domain_name.clone(),
                vmi_uid: self.cfg.vmi_uid.clone(),
                pid: std::process::id(),
            })
            .unwrap_or_default()),
            Request::Status => Ok(serde_json::to_value(
                self.status.read().await.for_version(version),
            )
            .unwrap_or_default()),
            Request::Pause => self.act(|hv, n| hv.suspend(n)).await,
            Request::Unpause => self.act(|hv, n| hv.resume(n)).await,
            Request::Destroy => self.act(|hv, n| hv.destroy(n)).await,
            Request::Migrate {
                dest_uri,
                dest_xml,
                block,
                memory_uri,
                disks_uri,
                shared_storage,
            } => {
                tracing::info!(domain = %self.cfg.domain_name, block, shared_storage, "migrating");
                let copy = match (block, memory_uri, disks_uri) {
                    (false, _, _) => Ok(None),
                    (true, Some(memory_uri), Some(disks_uri)) => {
                        Ok(Some(crate::hypervisor::BlockCopy {
                            memory_uri,
                            disks_uri,
                        }))
                    }
                    (true, _, _) => {
                        Err("a block migration needs memory_uri and disks_uri".to_string())
                    }
                };
                let r = match copy {
                    Ok(copy) => {
                        self.act(move |hv, n| {
                            hv.migrate(n, &dest_uri, &dest_xml, copy.as_ref(), shared_storage)
                        })
                        .await
                    }
                    Err(e) => Err(e),
                };
                match &r {
                    Ok(_) => tracing::info!(domain = %self.cfg.domain_name, "migration completed"),
                    Err(e) => {
                        tracing::warn!(domain = %self.cfg.domain_name, error = %e, "migration failed")
                    }
                }
                r
            }
            Request::AbortMigration => self.act(|hv, n| hv.abort_job(n)).await,
            Request::GuestAgent {
                command,
                timeout_secs,
            } => {
                let cmd = command.to_string();
                let t = timeout_secs.clamp(1, 60) as i32;
                self.blocking(move |hv, n| hv.agent_command(n, &cmd, t))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|out| {
                        serde_json::from_str::<Value>(&out)
                            .map(|v| v["return"].clone())
                            .map_err(|e| format!("bad guest agent reply: {e}"))
                    })
            }
            Request::SoftReboot => {
                let agent = self.status.read().await.agent_connected;
                self.act(move |hv, n| hv.reboot(n, agent)).await
            }
            Request::Shutdown { grace_secs } => {
                let r = self.act(|hv, n| hv.shutdown(n)).await;
                let hv = self.hv.clone();
                let name = self.cfg.domain_name.clone();
                tokio::spawn(async move {
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(grace_secs);
                    let mut last_press = tokio::time::Instant::now();
                    loop {
                        let (hv2, n2) = (hv.clone(), name.clone());
                        let state = tokio::task::spawn_blocking(move || hv2.state(&n2)).await;
                        if !matches!(state, Ok(Ok(Some(_)))) {
                            return;
                        }
                        let now = tokio::time::Instant::now();
                        if now >= deadline {
                            tracing::info!(domain = %name, "grace period over; destroying");
                            let (hv2, n2) = (hv.clone(), name.clone());
                            let _ = tokio::task::spawn_blocking(move || hv2.destroy(&n2)).await;
                            return;
                        }
                        // A guest still booting may miss the first ACPI press: repeat it.
                        if now >= last_press + Duration::from_secs(5) {
                            last_press = now;
                            let (hv2, n2) = (hv.clone(), name.clone());
                            let _ = tokio::task::spawn_blocking(move || hv2.shutdown(&n2)).await;
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                });
                r
            }
        };
        match res {
            Ok(result) => Response {
                ok: true,
                error: None,
                result,
            },
            Err(e) => Response {
                ok: false,
                error: Some(e),
                result: Value::Null,
            },
        }
    }

    async fn act(
        &self,
        f: impl FnOnce(&dyn Hypervisor, &str) -> crate::hypervisor::Result<()> + Send + 'static,
    ) -> Result<Value, String> {
        let r = self.blocking(f).await.map_err(|e| e.to_string());
        self.refresh(false).await;
        r.map(|_| Value::Null)
    }
}

fn agent_json(hv: &dyn Hypervisor, name: &str, cmd: &str) -> crate::hypervisor::Result<Value> {
    let out = hv.agent_command(name, &format!(r#"{{"execute":"{cmd}"}}"#), 2)?;
    let v: Value = serde_json::from_str(&out)
        .map_err(|e| crate::hypervisor::Error::AgentUnavailable(format!("bad reply: {e}")))?;
    Ok(v["return"].clone())
}

fn s(v: &Value, k: &str) -> Option<String> {
    v[k].as_str().map(str::to_string)
}

/// Ask the guest agent what it knows: OS, hostname, timezone, addresses.
fn guest_info(
    hv: &dyn Hypervisor,
    name: &str,
) -> crate::hypervisor::Result<(Option<GuestAgentInfo>, Vec<GuestAddress>)> {
    if agent_json(hv, name, "guest-ping").is_err() {
        return Ok((None, vec![]));
    }
    let os = agent_json(hv, name, "guest-get-osinfo").unwrap_or_default();
    let host = agent_json(hv, name, "guest-get-host-name").unwrap_or_default();
    let tz = agent_json(hv, name, "guest-get-timezone").unwrap_or_default();
    let info = agent_json(hv, name, "guest-info").unwrap_or_default();
    let ifaces = agent_json(hv, name, "guest-network-get-interfaces").unwrap_or_default();
    let mut addrs = Vec::new();
    for i in ifaces.as_array().into_iter().flatten() {
        let iname = s(i, "name").unwrap_or_default();
        if iname == "lo" {
            continue;
        }
        for a in i["ip-addresses"].as_array().into_iter().flatten() {
            if a["ip-address-type"] == "ipv4"
                && let Some(ip) = s(a, "ip-address")
            {
                addrs.push(GuestAddress {
                    interface: iname.clone(),
                    mac: s(i, "hardware-address"),
                    ip,
                });
            }
        }
    }
    let guest = GuestAgentInfo {
        guest_agent_version: s(&info, "version"),
        hostname: s(&host, "host-name"),
        os: GuestOsInfo {
            id: s(&os, "id"),
            name: s(&os, "name"),
            pretty_name: s(&os, "pretty-name"),
            version: s(&os, "version"),
            version_id: s(&os, "version-id"),
            kernel_release: s(&os, "kernel-release"),
            kernel_version: s(&os, "kernel-version"),
            machine: s(&os, "machine"),
        },
        timezone: s(&tz, "zone").map(|z| format!("{z}, {}", tz["offset"].as_i64().unwrap_or(0))),
        user_list: agent_json(hv, name, "guest-get-users")
            .map(|u| users_of(&u))
            .unwrap_or_default(),
        fs_info: agent_json(hv, name, "guest-get-fsinfo")
            .ok()
            .map(|f| filesystems_of(&f)),
    };
    Ok((Some(guest), addrs))
}

/// `guest-get-users`' answer: `[{"user", "domain"?, "login-time"}]`.
fn users_of(v: &Value) -> Vec<GuestOsUser> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|u| {
            Some(GuestOsUser {
                user_name: s(u, "user")?,
                domain: s(u, "domain"),
                login_time: u["login-time"].as_f64(),
            })
        })
        .collect()
}

/// `guest-get-fsinfo`' answer: `[{"name", "mountpoint", "type", "used-bytes"?,
/// "total-bytes"?, "disk": [{"serial"?, "bus-type", ...}]}]`.
fn filesystems_of(v: &Value) -> FileSystemInfo {
    FileSystemInfo {
        disks: v
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| FileSystem {
                disk_name: s(f, "name").unwrap_or_default(),
                mount_point: s(f, "mountpoint").unwrap_or_default(),
                file_system_type: s(f, "type").unwrap_or_default(),
                used_bytes: f["used-bytes"].as_u64().unwrap_or(0),
                total_bytes: f["total-bytes"].as_u64().unwrap_or(0),
                disk: f["disk"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|d| FileSystemDisk {
                        serial: s(d, "serial"),
                        bus_type: s(d, "bus-type").unwrap_or_default(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The guest CPU from a domain's XML (`<cpu>`: mode, check, model with fallback and
/// vendor_id, features, topology). `None` when the XML has no `<cpu>`.
pub fn cpu_from_xml(xml: &str) -> Option<GuestCpu> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut cpu: Option<GuestCpu> = None;
    let mut depth = 0usize;
    let mut cpu_depth = None;
    let mut in_model = false;
    let attrs = |e: &quick_xml::events::BytesStart| -> Vec<(String, String)> {
        e.attributes()
            .flatten()
            .filter_map(|a| {
                let k = String::from_utf8(a.key.local_name().as_ref().to_vec()).ok()?;
                Some((k, a.unescape_value().ok()?.to_string()))
            })
            .collect()
    };
    let get =
        |a: &[(String, String)], k: &str| a.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    loop {
        let ev = match reader.read_event() {
            Ok(Event::Eof) | Err(_) => break,
            Ok(ev) => ev,
        };
        let (start, empty) = match &ev {
            Event::Start(e) => (Some(e.clone()), false),
            Event::Empty(e) => (Some(e.clone()), true),
            _ => (None, false),
        };
        if let Some(e) = start {
            let name = e.local_name().as_ref().to_vec();
            let a = attrs(&e);
            // Only the domain's own <cpu> (a direct child of <domain>), not <cpu> elsewhere.
            if name == b"cpu" && depth == 1 && cpu.is_none() {
                cpu = Some(GuestCpu {
                    mode: get(&a, "mode").unwrap_or_default(),
                    check: get(&a, "check"),
                    ..Default::default()
                });
                if !empty {
                    cpu_depth = Some(depth);
                }
            } else if let (Some(c), Some(d)) = (cpu.as_mut(), cpu_depth)
                && depth == d + 1
            {
                match name.as_slice() {
                    b"model" => {
                        c.model = Some(CpuModelField::Model(CpuModel {
                            name: String::new(),
                            fallback: get(&a, "fallback"),
                            vendor_id: get(&a, "vendor_id"),
                        }));
                        in_model = !empty;
                    }
                    b"feature" => c.features.push(CpuFeature {
                        name: get(&a, "name").unwrap_or_default(),
                        policy: get(&a, "policy").unwrap_or_else(|| "require".into()),
                    }),
                    b"topology" => {
                        let n = |k| get(&a, k).and_then(|v| v.parse().ok()).unwrap_or(1);
                        c.topology = Some(CpuTopology {
                            sockets: n("sockets"),
                            cores: n("cores"),
                            threads: n("threads"),
                        })
                    }
                    _ => {}
                }
            }
            if !empty {
                depth += 1;
            }
            continue;
        }
        match ev {
            Event::Text(t) if in_model => {
                if let (Some(c), Ok(text)) = (cpu.as_mut(), t.decode())
                    && let Some(CpuModelField::Model(m)) = c.model.as_mut()
                {
                    m.name.push_str(text.trim());
                }
            }
            Event::End(_) => {
                depth = depth.saturating_sub(1);
                in_model = false;
                if cpu_depth == Some(depth) {
                    cpu_depth = None;
                }
            }
            _ => {}
        }
    }
    cpu
}

/// The socket path of a VMI's launcher inside the launchers folder.
pub fn socket_path(dir: &Path, vmi_uid: &str) -> PathBuf {
    dir.join(format!("{vmi_uid}.sock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_from_domain_xml() {
        let xml = r#"<domain type='kvm'><name>d</name><vcpu>4</vcpu>
  <cpu mode='custom' match='exact' check='partial'>
    <model fallback='allow' vendor_id='AuthenticAMD'>EPYC</model>
    <topology sockets='1' dies='1' cores='2' threads='2'/>
    <feature policy='disable' name='svm'/>
    <feature name='x2apic'/>
  </cpu>
  <devices><cpu>ignored</cpu></devices></domain>"#;
        let c = cpu_from_xml(xml).unwrap();
        assert_eq!(c.mode, "custom");
        assert_eq!(c.check.as_deref(), Some("partial"));
        let m = c.model();
        assert_eq!(
            (
                m.name.as_str(),
                m.fallback.as_deref(),
                m.vendor_id.as_deref()
            ),
            ("EPYC", Some("allow"), Some("AuthenticAMD"))
        );
        assert_eq!(
            c.topology.as_ref().map(|t| (t.sockets, t.cores, t.threads)),
            Some((1, 2, 2))
        );
        assert_eq!(c.features.len(), 2);
        assert_eq!(
            (c.features[0].name.as_str(), c.features[0].policy.as_str()),
            ("svm", "disable")
        );
        assert_eq!(c.features[1].policy, "require");

        let hm = cpu_from_xml("<domain><cpu mode='host-model'/></domain>").unwrap();
        assert_eq!(hm.mode, "host-model");
        assert!(hm.model.is_none());
        assert!(cpu_from_xml("<domain><name>x</name></domain>").is_none());
    }
}
