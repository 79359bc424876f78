//! The libvirt implementation of [`Hypervisor`], over the `virt` crate. The only module
//! that imports `virt`. Every call blocks; a lost connection (libvirtd restarted) is
//! reopened once and the call retried.

use std::sync::Mutex;

use virt::connect::Connect;
use virt::domain::{Domain, DomainState as LvState};
use virt::enumutil::Enum;
use virt::error::ErrorNumber;
use virt::sys;

use crate::hypervisor::{
    BlockCopy, CpuCompare, DomainState, DomainStats, Error, GuestAddress, HostFacts, Hypervisor,
    Job, METADATA_NS, OwnedDomain, Param, Result,
};

pub struct Libvirt {
    uri: String,
    conn: Mutex<Connect>,
}

fn lv(e: virt::error::Error) -> Error {
    Error::Libvirt(e.message().to_string())
}

fn is_no_domain(e: &virt::error::Error) -> bool {
    matches!(e.code(), Enum::Known(ErrorNumber::NoDomain))
}

fn is_conn_lost(e: &virt::error::Error) -> bool {
    matches!(
        e.code(),
        Enum::Known(ErrorNumber::SystemError)
            | Enum::Known(ErrorNumber::Rpc)
            | Enum::Known(ErrorNumber::NoConnect)
            | Enum::Known(ErrorNumber::InvalidConn)
    )
}

impl Libvirt {
    pub fn open(uri: &str) -> Result<Libvirt> {
        // Errors reach callers as values; keep libvirt from also printing them to stderr.
        virt::error::clear_error_callback();
        events::start_loop();
        let conn = Connect::open(Some(uri)).map_err(lv)?;
        Ok(Libvirt {
            uri: uri.to_string(),
            conn: Mutex::new(conn),
        })
    }

    /// Run `f` with the connection, reopening it once if libvirtd went away.
    fn with<T>(
        &self,
        f: impl Fn(&Connect) -> std::result::Result<T, virt::error::Error>,
    ) -> Result<T> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match f(&conn) {
            Ok(v) => Ok(v),
            Err(e) if is_conn_lost(&e) && !conn.is_alive().unwrap_or(false) => {
                tracing::warn!(uri = %self.uri, error = %e.message(), "libvirt connection lost; reconnecting");
                let fresh = Connect::open(Some(&self.uri)).map_err(lv)?;
                *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
                f(&fresh).map_err(lv)
            }
            Err(e) => Err(lv(e)),
        }
    }

    /// A domain's checkpoint by name; the caller frees the handle
    /// (`virDomainCheckpointFree`).
    fn checkpoint(&self, name: &str, checkpoint: &str) -> Result<sys::virDomainCheckpointPtr> {
        let d = self.domain(name)?;
        let ck = cstring(checkpoint)?;
        // SAFETY: `d` is a live domain handle and `ck` NUL-terminated for the call; the
        // checkpoint handle returned holds its own reference to the domain.
        let c = unsafe { sys::virDomainCheckpointLookupByName(d.as_ptr(), ck.as_ptr(), 0) };
        if c.is_null() {
            return Err(last_error());
        }
        Ok(c)
    }

    fn domain(&self, name: &str) -> Result<Domain> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match conn.lookup_domain_by_name(name) {
            Ok(d) => Ok(d),
            Err(e) if is_no_domain(&e) => Err(Error::NoDomain(name.to_string())),
            Err(e) if is_conn_lost(&e) => self
                .with(|c| c.lookup_domain_by_name(name))
                .map_err(|_| Error::NoDomain(name.to_string())),
            Err(e) => Err(lv(e)),
        }
    }

    fn on_domain(
        &self,
        name: &str,
        f: impl Fn(&Domain) -> std::result::Result<(), virt::error::Error>,
    ) -> Result<()> {
        let d = self.domain(name)?;
        f(&d).map_err(|e| {
            if is_no_domain(&e) {
                Error::NoDomain(name.into())
            } else {
                lv(e)
            }
        })
    }
}

impl Hypervisor for Libvirt {
    fn create(&self, xml: &str) -> Result<()> {
        self.with(|c| c.create_domain_xml(xml, sys::VIR_DOMAIN_NONE).map(|_| ()))
    }

    fn create_paused(&self, xml: &str) -> Result<()> {
        self.with(|c| {
            c.create_domain_xml(xml, sys::VIR_DOMAIN_START_PAUSED)
                .map(|_| ())
        })
    }

    fn state(&self, name: &str) -> Result<Option<DomainState>> {
        let d = match self.domain(name) {
            Ok(d) => d,
            Err(Error::NoDomain(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        match d.state() {
            Ok((s, _)) => Ok(Some(match s {
                Enum::Known(LvState::Running) | Enum::Known(LvState::Blocked) => {
                    DomainState::Running
                }
                Enum::Known(LvState::Paused) | Enum::Known(LvState::PMSuspended) => {
                    DomainState::Paused
                }
                Enum::Known(LvState::Shutdown) => DomainState::ShuttingDown,
                Enum::Known(LvState::Shutoff) => DomainState::ShutOff,
                Enum::Known(LvState::Crashed) => DomainState::Crashed,
                _ => DomainState::Other,
            })),
            Err(e) if is_no_domain(&e) => Ok(None),
            Err(e) => Err(lv(e)),
        }
    }

    fn owned_domains(&self) -> Result<Vec<OwnedDomain>> {
        let doms = self.with(|c| c.list_all_domains(0))?;
        let mut out = Vec::new();
        for d in doms {
            let Ok(name) = d.name() else { continue };
            if let Ok(meta) = d.metadata(
                sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
                Some(METADATA_NS),
                0,
            ) && let Some(o) = crate::hypervisor::parse_metadata(&name, &meta)
            {
                out.push(o);
            }
        }
        Ok(out)
    }

    fn shutdown(&self, name: &str) -> Result<()> {
        self.on_domain(name, |d| d.shutdown())
    }

    fn destroy(&self, name: &str) -> Result<()> {
        self.on_domain(name, |d| d.destroy())
    }

    fn block_resize(&self, name: &str, disk: &str, bytes: u64) -> Result<()> {
        self.on_domain(name, |d| {
            d.block_resize(disk, bytes, sys::VIR_DOMAIN_BLOCK_RESIZE_BYTES)
        })
    }

    fn migrate(
        &self,
        name: &str,
        dest_uri: &str,
        dest_xml: &str,
        block: Option<&BlockCopy>,
        shared_storage: bool,
    ) -> Result<()> {
        let mut flags =
            sys::VIR_MIGRATE_LIVE | sys::VIR_MIGRATE_PEER2PEER | sys::VIR_MIGRATE_ABORT_ON_ERROR;
        if shared_storage {
            // libvirt 9 trusts only filesystems it recognises as shared (NFS, GFS2, ...;
            // the `shared_filesystems` setting came later); the operator declared this pool.
            flags |= sys::VIR_MIGRATE_UNSAFE;
        }
        let mut params = virt::domain::MigrateParameters {
            dest_xml: Some(dest_xml.to_string()),
            ..Default::default()
        };
        match block {
            // libvirt 9 cannot tunnel the NBD disk copy ("argument key 'host' must not have
            // null value"), so both of QEMU's streams go to sockets the agent forwards.
            Some(b) => {
                flags |= sys::VIR_MIGRATE_NON_SHARED_INC;
                params.uri = Some(b.memory_uri.clone());
                params.disks_uri = Some(b.disks_uri.clone());
            }
            None => flags |= sys::VIR_MIGRATE_TUNNELLED,
        }
        self.on_domain(name, |d| {
            d.migrate_to_uri3(Some(dest_uri), params.clone(), flags)
        })
    }

    fn attach_device(&self, name: &str, xml: &str) -> Result<()> {
        self.on_domain(name, |d| {
            d.attach_device_flags(xml, sys::VIR_DOMAIN_AFFECT_LIVE)
        })
    }

    fn detach_device(&self, name: &str, xml: &str) -> Result<()> {
        self.on_domain(name, |d| {
            d.detach_device_flags(xml, sys::VIR_DOMAIN_AFFECT_LIVE)
        })
    }

    fn abort_job(&self, name: &str) -> Result<()> {
        let d = self.domain(name)?;
        // SAFETY: `d` is a live domain handle for the duration of the call;
        // virDomainAbortJob takes no other pointers.
        let r = unsafe { sys::virDomainAbortJob(d.as_ptr()) };
        if r < 0 {
            return Err(Error::Libvirt(
                virt::error::Error::last_error().message().to_string(),
            ));
        }
        Ok(())
    }

    fn backup_begin(
        &self,
        name: &str,
        xml: &str,
        checkpoint: Option<&str>,
        reuse: bool,
    ) -> Result<()> {
        let d = self.domain(name)?;
        let xml = cstring(xml)?;
        let ck = checkpoint.map(cstring).transpose()?;
        let ck_ptr = ck.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        let flags = if reuse {
            sys::VIR_DOMAIN_BACKUP_BEGIN_REUSE_EXTERNAL
        } else {
            0
        };
        // SAFETY: `d` is a live domain handle and `xml` (and `ck` when given) NUL-terminated
        // strings, all valid for the duration of the call; NULL asks for no checkpoint.
        let r = unsafe { sys::virDomainBackupBegin(d.as_ptr(), xml.as_ptr(), ck_ptr, flags) };
        if r < 0 {
            return Err(last_error());
        }
        Ok(())
    }

    fn disk_capacity(&self, name: &str, target: &str) -> Result<u64> {
        let d = self.domain(name)?;
        let target = cstring(target)?;
        let mut info = sys::virDomainBlockInfo {
            capacity: 0,
            allocation: 0,
            physical: 0,
        };
        // SAFETY: `d` is live, `target` NUL-terminated and `info` a struct libvirt fills in;
        // all outlive the call. (The `virt` crate's `block_info` reads its struct even when
        // the call failed, so it is not used.)
        let r = unsafe { sys::virDomainGetBlockInfo(d.as_ptr(), target.as_ptr(), &mut info, 0) };
        if r < 0 {
            return Err(last_error());
        }
        Ok(info.capacity)
    }

    fn checkpoints(&self, name: &str) -> Result<Vec<String>> {
        let d = self.domain(name)?;
        let mut list: *mut sys::virDomainCheckpointPtr = std::ptr::null_mut();
        // SAFETY: `d` is live; libvirt allocates `list` with `n` handles, each freed below,
        // then the array itself.
        let n = unsafe { sys::virDomainListAllCheckpoints(d.as_ptr(), &mut list, 0) };
        if n < 0 {
            return Err(last_error());
        }
        let mut names = vec![];
        for i in 0..n as usize {
            // SAFETY: `i < n`: each entry is a checkpoint handle libvirt gave us; its name
            // is copied before the handle is freed.
            unsafe {
                let c = *list.add(i);
                let p = sys::virDomainCheckpointGetName(c);
                if !p.is_null() {
                    names.push(std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned());
                }
                sys::virDomainCheckpointFree(c);
            }
        }
        if !list.is_null() {
            // SAFETY: the array libvirt allocated with malloc, its entries already freed.
            unsafe { libc::free(list as *mut std::ffi::c_void) };
        }
        Ok(names)
    }

    fn checkpoint_xml(&self, name: &str, checkpoint: &str) -> Result<String> {
        let c = self.checkpoint(name, checkpoint)?;
        // SAFETY: `c` is a live checkpoint handle, freed below; the XML string (malloc'ed
        // by libvirt) is copied, then freed.
        unsafe {
            let x = sys::virDomainCheckpointGetXMLDesc(c, 0);
            sys::virDomainCheckpointFree(c);
            if x.is_null() {
                return Err(last_error());
            }
            let s = std::ffi::CStr::from_ptr(x).to_string_lossy().into_owned();
            libc::free(x as *mut std::ffi::c_void);
            Ok(s)
        }
    }

    fn checkpoint_redefine(&self, name: &str, xml: &str) -> Result<()> {
        let d = self.domain(name)?;
        let xml = cstring(xml)?;
        let flags = sys::VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE
            | sys::VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE_VALIDATE;
        // SAFETY: `d` is live and `xml` NUL-terminated; the returned handle is freed.
        unsafe {
            let c = sys::virDomainCheckpointCreateXML(d.as_ptr(), xml.as_ptr(), flags);
            if c.is_null() {
                return Err(last_error());
            }
            sys::virDomainCheckpointFree(c);
        }
        Ok(())
    }

    fn checkpoint_delete(&self, name: &str, checkpoint: &str) -> Result<()> {
        let c = self.checkpoint(name, checkpoint)?;
        // SAFETY: `c` is a live checkpoint handle, freed after the delete.
        unsafe {
            let r = sys::virDomainCheckpointDelete(c, 0);
            let e = (r < 0).then(last_error);
            sys::virDomainCheckpointFree(c);
            if let Some(e) = e {
                return Err(e);
            }
        }
        Ok(())
    }

    fn job(&self, name: &str) -> Result<Job> {
        let d = self.domain(name)?;
        let now = raw_job_stats(&d, 0)?;
        if now.kind == sys::VIR_DOMAIN_JOB_BOUNDED as i32
            || now.kind == sys::VIR_DOMAIN_JOB_UNBOUNDED as i32
        {
            return Ok(Job::Running {
                processed: now.processed,
                total: now.total,
            });
        }
        let done = raw_job_stats(
            &d,
            sys::VIR_DOMAIN_JOB_STATS_COMPLETED | sys::VIR_DOMAIN_JOB_STATS_KEEP_COMPLETED,
        )?;
        Ok(match done.kind as u32 {
            sys::VIR_DOMAIN_JOB_COMPLETED => Job::Completed,
            sys::VIR_DOMAIN_JOB_FAILED | sys::VIR_DOMAIN_JOB_CANCELLED => Job::Failed(
                done.error
                    .unwrap_or_else(|| "the job failed (libvirt gave no reason)".into()),
            ),
            _ => Job::None,
        })
    }

    fn completed_migration_downtime_ms(&self, name: &str) -> Result<Option<u64>> {
        let d = self.domain(name)?;
        // KEEP_COMPLETED: reading them does not clear them for others (virsh domjobinfo).
        let stats = raw_job_stats(
            &d,
            sys::VIR_DOMAIN_JOB_STATS_COMPLETED | sys::VIR_DOMAIN_JOB_STATS_KEEP_COMPLETED,
        )?;
        Ok(stats.downtime)
    }

    fn suspend(&self, name: &str) -> Result<()> {
        self.on_domain(name, |d| d.suspend())
    }

    fn resume(&self, name: &str) -> Result<()> {
        self.on_domain(name, |d| d.resume())
    }

    fn reboot(&self, name: &str, agent: bool) -> Result<()> {
        let flags = if agent {
            sys::VIR_DOMAIN_REBOOT_GUEST_AGENT
        } else {
            sys::VIR_DOMAIN_REBOOT_ACPI_POWER_BTN
        };
        self.on_domain(name, |d| d.reboot(flags))
    }

    fn agent_command(&self, name: &str, cmd: &str, timeout_secs: i32) -> Result<String> {
        let d = self.domain(name)?;
        d.qemu_agent_command(cmd, timeout_secs, 0).map_err(|e| {
            if is_no_domain(&e) {
                Error::NoDomain(name.into())
            } else {
                Error::AgentUnavailable(e.message().to_string())
            }
        })
    }

    fn lease_addresses(&self, name: &str) -> Result<Vec<GuestAddress>> {
        let d = self.domain(name)?;
        let ifaces = d
            .interface_addresses(sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, 0)
            .map_err(lv)?;
        Ok(ifaces
            .into_iter()
            .flat_map(|i| {
                let (iname, mac) = (i.name.clone(), i.hwaddr.clone());
                i.addrs.into_iter().map(move |a| GuestAddress {
                    interface: iname.clone(),
                    mac: mac.clone(),
                    ip: a.addr,
                })
            })
            .collect())
    }

    fn ensure_network(&self, name: &str, xml: &str) -> Result<()> {
        self.with(|c| {
            let net = match c.lookup_network_by_name(name) {
                Ok(n) => n,
                // Another agent on this host may define it at the same moment.
                Err(_) => match c.define_network_xml(xml) {
                    Ok(n) => {
                        let _ = n.set_autostart(true);
                        n
                    }
                    Err(_) => c.lookup_network_by_name(name)?,
                },
            };
            if !net.is_active()? && net.create().is_err() && !net.is_active()? {
                net.create()?;
            }
            Ok(())
        })
    }

    fn host_facts(&self) -> Result<HostFacts> {
        self.with(|c| {
            let info = c.node_info()?;
            let v = c.lib_version()?;
            let caps = c.capabilities()?;
            let mut domain_types: Vec<String> = caps
                .match_indices("<domain type='")
                .filter_map(|(i, m)| caps[i + m.len()..].split('\'').next().map(str::to_string))
                .collect();
            domain_types.sort();
            domain_types.dedup();
            Ok(HostFacts {
                memory_bytes: info.memory * 1024,
                cpus: info.cpus,
                libvirt_version: format!("{}.{}.{}", v / 1_000_000, (v / 1000) % 1000, v % 1000),
                domain_types,
            })
        })
    }

    fn xml(&self, name: &str) -> Result<String> {
        let d = self.domain(name)?;
        d.xml_desc(0).map_err(lv)
    }

    fn domain_capabilities(&self, virt_type: &str) -> Result<String> {
        self.with(|c| c.domain_capabilities(None, Some("x86_64"), None, Some(virt_type), 0))
    }

    fn compare_cpu(&self, virt_type: &str, cpu_xml: &str) -> Result<CpuCompare> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        cpu_ffi::compare(&conn, virt_type, cpu_xml)
    }

    fn baseline_cpu(&self, virt_type: &str, cpu_xmls: &[String]) -> Result<String> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        cpu_ffi::baseline(&conn, virt_type, cpu_xmls)
    }

    fn domain_stats(&self) -> Result<Vec<DomainStats>> {
        self.with(bulk_stats)
    }

    fn watch_lifecycle(&self, name: &str, on_event: Box<dyn Fn() + Send + Sync>) -> Result<()> {
        let d = self.domain(name)?;
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        events::register_lifecycle(&conn, &d, on_event).map_err(Error::Libvirt)
    }
}

/// libvirt's event loop and lifecycle callbacks. The `virt` crate has no safe wrapper for
/// domain event registration, so this module holds the only `unsafe` FFI of the backend.
mod events {
    use std::os::raw::{c_int, c_void};
    use std::sync::Once;

    use virt::connect::Connect;
    use virt::domain::Domain;
    use virt::sys;

    type Callback = Box<dyn Fn() + Send + Sync>;

    /// Register libvirt's default event loop (before any connection is opened) and run it on
    /// a thread of its own, once per process.
    pub fn start_loop() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            if virt::event::event_register_default_impl().is_err() {
                tracing::warn!("libvirt event loop unavailable; relying on polling");
                return;
            }
            let spawned = std::thread::Builder::new()
                .name("libvirt-events".into())
                .spawn(|| {
                    loop {
                        if virt::event::event_run_default_impl().is_err() {
                            std::thread::sleep(std::time::Duration::from_millis(100));
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start the libvirt event thread");
            }
        });
    }

    unsafe extern "C" fn on_lifecycle(
        _conn: sys::virConnectPtr,
        _dom: sys::virDomainPtr,
        _event: c_int,
        _detail: c_int,
        opaque: *mut c_void,
    ) -> c_int {
        // SAFETY: `opaque` is the `Box<Callback>` leaked in `register_lifecycle`; libvirt
        // keeps it alive until `free_callback` runs, and only reads it from its event thread.
        let cb = unsafe { &*(opaque as *const Callback) };
        cb();
        0
    }

    unsafe extern "C" fn free_callback(opaque: *mut c_void) {
        // SAFETY: called once by libvirt when the registration ends; reclaims the box.
        drop(unsafe { Box::from_raw(opaque as *mut Callback) });
    }

    pub fn register_lifecycle(conn: &Connect, dom: &Domain, cb: Callback) -> Result<(), String> {
        let opaque = Box::into_raw(Box::new(cb)) as *mut c_void;
        type Lifecycle = unsafe extern "C" fn(
            sys::virConnectPtr,
            sys::virDomainPtr,
            c_int,
            c_int,
            *mut c_void,
        ) -> c_int;
        // SAFETY: libvirt's API takes every event callback as the generic type and calls it
        // with the signature of the event id (VIR_DOMAIN_EVENT_CALLBACK in C); the lifecycle
        // signature matches `on_lifecycle`. The pointers come from live `Connect`/`Domain`
        // values, and `opaque` stays valid until `free_callback`.
        let id = unsafe {
            let generic: unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, *mut c_void) =
                std::mem::transmute::<Lifecycle, _>(on_lifecycle as Lifecycle);
            sys::virConnectDomainEventRegisterAny(
                conn.as_ptr(),
                dom.as_ptr(),
                sys::VIR_DOMAIN_EVENT_ID_LIFECYCLE as c_int,
                Some(generic),
                opaque,
                Some(free_callback),
            )
        };
        if id < 0 {
            // SAFETY: registration failed, so libvirt did not take ownership of `opaque`.
            drop(unsafe { Box::from_raw(opaque as *mut Callback) });
            return Err("registering for domain events failed".into());
        }
        Ok(())
    }
}

/// libvirt's hypervisor-aware CPU comparison and baseline, which the `virt` crate does not
/// wrap (it has only the older host-CPU variants); the only other `unsafe` of this backend.
mod cpu_ffi {
    use std::ffi::{CStr, CString};
    use std::os::raw::c_char;

    use virt::connect::Connect;
    use virt::sys;

    use crate::hypervisor::{CpuCompare, Error, Result};

    fn cstr(s: &str) -> Result<CString> {
        CString::new(s).map_err(|_| Error::Libvirt("NUL byte in CPU XML".into()))
    }

    pub fn compare(conn: &Connect, virt_type: &str, cpu_xml: &str) -> Result<CpuCompare> {
        let (vt, xml) = (cstr(virt_type)?, cstr(cpu_xml)?);
        // SAFETY: the connection pointer comes from a live `Connect`; the strings outlive the
        // call; NULL emulator, arch and machine mean libvirt's defaults, as documented.
        let r = unsafe {
            sys::virConnectCompareHypervisorCPU(
                conn.as_ptr(),
                std::ptr::null(),
                c"x86_64".as_ptr(),
                std::ptr::null(),
                vt.as_ptr(),
                xml.as_ptr(),
                sys::VIR_CONNECT_COMPARE_CPU_FAIL_INCOMPATIBLE,
            )
        };
        match r as sys::virCPUCompareResult {
            sys::VIR_CPU_COMPARE_IDENTICAL => Ok(CpuCompare::Identical),
            sys::VIR_CPU_COMPARE_SUPERSET => Ok(CpuCompare::Superset),
            sys::VIR_CPU_COMPARE_INCOMPATIBLE => {
                Ok(CpuCompare::Incompatible("the CPU is incompatible".into()))
            }
            _ => {
                let e = virt::error::Error::last_error();
                if matches!(
                    e.code(),
                    virt::enumutil::Enum::Known(virt::error::ErrorNumber::CpuIncompatible)
                ) {
                    Ok(CpuCompare::Incompatible(e.message().to_string()))
                } else {
                    Err(Error::Libvirt(e.message().to_string()))
                }
            }
        }
    }

    pub fn baseline(conn: &Connect, virt_type: &str, cpu_xmls: &[String]) -> Result<String> {
        let vt = cstr(virt_type)?;
        let owned: Vec<CString> = cpu_xmls.iter().map(|x| cstr(x)).collect::<Result<_>>()?;
        let mut ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        // SAFETY: `ptrs` holds `ptrs.len()` valid C strings that outlive the call; the
        // connection pointer is live; NULL emulator and machine mean libvirt's defaults.
        let out = unsafe {
            sys::virConnectBaselineHypervisorCPU(
                conn.as_ptr(),
                std::ptr::null(),
                c"x86_64".as_ptr(),
                std::ptr::null(),
                vt.as_ptr(),
                ptrs.as_mut_ptr(),
                ptrs.len() as u32,
                sys::VIR_CONNECT_BASELINE_CPU_MIGRATABLE,
            )
        };
        if out.is_null() {
            return Err(Error::Libvirt(
                virt::error::Error::last_error().message().to_string(),
            ));
        }
        // SAFETY: libvirt returned a NUL-terminated string we own; copied, then freed with
        // libc's free as libvirt documents for this call.
        let s = unsafe {
            let s = CStr::from_ptr(out).to_string_lossy().into_owned();
            libc::free(out as *mut std::ffi::c_void);
            s
        };
        Ok(s)
    }
}

/// libvirt's bulk stats of every running domain (`virConnectGetAllDomainStats`), read and
/// freed here. The `virt` crate's `get_all_domain_stats` frees only the array, leaking
/// every record, its parameters and its domain reference on each call; an agent collecting
/// every 15 s would grow without end. Here the records are copied into owned values and
/// the whole list goes back with `virDomainStatsRecordListFree`.
fn bulk_stats(c: &Connect) -> std::result::Result<Vec<DomainStats>, virt::error::Error> {
    use std::ffi::CStr;
    let what = sys::VIR_DOMAIN_STATS_CPU_TOTAL
        | sys::VIR_DOMAIN_STATS_BALLOON
        | sys::VIR_DOMAIN_STATS_VCPU
        | sys::VIR_DOMAIN_STATS_INTERFACE
        | sys::VIR_DOMAIN_STATS_BLOCK;
    let mut records: *mut sys::virDomainStatsRecordPtr = std::ptr::null_mut();
    // SAFETY: the connection pointer is valid while `c` lives; libvirt fills `records` with
    // a NULL-terminated array it allocated, which is freed below whatever happens.
    let n = unsafe {
        sys::virConnectGetAllDomainStats(
            c.as_ptr(),
            what,
            &mut records,
            sys::VIR_CONNECT_GET_ALL_DOMAINS_STATS_ACTIVE,
        )
    };
    if n < 0 {
        return Err(virt::error::Error::last_error());
    }
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        // SAFETY: `records` holds `n` valid record pointers; each record's `params` holds
        // `nparams` parameters whose `field` is NUL-terminated and whose string values are
        // NUL-terminated, all valid until the list is freed.
        unsafe {
            let r = &**records.add(i);
            let name_ptr = sys::virDomainGetName(r.dom);
            if name_ptr.is_null() {
                continue;
            }
            let name = CStr::from_ptr(name_ptr).to_string_lossy().into_owned();
            let params = std::slice::from_raw_parts(r.params, r.nparams.max(0) as usize);
            let mut texts = Vec::new();
            let mut nums = Vec::with_capacity(params.len());
            for p in params {
                let field = CStr::from_ptr(p.field.as_ptr())
                    .to_string_lossy()
                    .into_owned();
                let v = &p.value;
                let num = match p.type_ as u32 {
                    sys::VIR_TYPED_PARAM_INT => u64::try_from(v.i).unwrap_or(0),
                    sys::VIR_TYPED_PARAM_UINT => u64::from(v.ui),
                    sys::VIR_TYPED_PARAM_LLONG => u64::try_from(v.l).unwrap_or(0),
                    sys::VIR_TYPED_PARAM_ULLONG => v.ul,
                    sys::VIR_TYPED_PARAM_DOUBLE => v.d.max(0.0) as u64,
                    sys::VIR_TYPED_PARAM_BOOLEAN => u64::from(v.b != 0),
                    sys::VIR_TYPED_PARAM_STRING if !v.s.is_null() => {
                        texts.push((field, CStr::from_ptr(v.s).to_string_lossy().into_owned()));
                        continue;
                    }
                    _ => continue,
                };
                nums.push((field, num));
            }
            let params = nums
                .iter()
                .map(|(f, v)| (f.as_str(), Param::Num(*v)))
                .chain(
                    texts
                        .iter()
                        .map(|(f, t)| (f.as_str(), Param::Text(t.as_str()))),
                );
            out.push(DomainStats::from_params(&name, params));
        }
    }
    // SAFETY: `records` came from virConnectGetAllDomainStats and is freed once.
    unsafe { sys::virDomainStatsRecordListFree(records) };
    Ok(out)
}

fn cstring(s: &str) -> Result<std::ffi::CString> {
    std::ffi::CString::new(s).map_err(|e| Error::Libvirt(e.to_string()))
}

/// libvirt's last error on this thread.
fn last_error() -> Error {
    Error::Libvirt(virt::error::Error::last_error().message().to_string())
}

/// What [`Hypervisor::job`] reads of libvirt's job statistics.
struct RawJob {
    kind: i32,
    processed: u64,
    total: u64,
    /// A migration's downtime (ms).
    downtime: Option<u64>,
    error: Option<String>,
}

/// `virDomainGetJobStats`, called directly: the `virt` crate's wrapper cannot take the
/// empty parameter list libvirt returns when no completed job is on record.
fn raw_job_stats(d: &Domain, flags: u32) -> Result<RawJob> {
    let mut kind: std::os::raw::c_int = 0;
    let mut params: sys::virTypedParameterPtr = std::ptr::null_mut();
    let mut n: std::os::raw::c_int = 0;
    // SAFETY: `d` is a live domain handle; libvirt fills `kind`, `params` and `n`, and
    // `params` (possibly NULL with `n == 0`) is freed below with virTypedParamsFree.
    let r = unsafe { sys::virDomainGetJobStats(d.as_ptr(), &mut kind, &mut params, &mut n, flags) };
    if r < 0 {
        return Err(Error::Libvirt(
            virt::error::Error::last_error().message().to_string(),
        ));
    }
    let mut job = RawJob {
        kind,
        processed: 0,
        total: 0,
        downtime: None,
        error: None,
    };
    if !params.is_null() {
        // SAFETY: `params` holds `n` parameters from libvirt; the names are NUL-terminated
        // constants; a string value points into `params` and is copied before the free.
        unsafe {
            let mut v: std::os::raw::c_ulonglong = 0;
            if sys::virTypedParamsGetULLong(
                params,
                n,
                sys::VIR_DOMAIN_JOB_DISK_PROCESSED.as_ptr(),
                &mut v,
            ) == 1
            {
                job.processed = v;
            }
            if sys::virTypedParamsGetULLong(
                params,
                n,
                sys::VIR_DOMAIN_JOB_DISK_TOTAL.as_ptr(),
                &mut v,
            ) == 1
            {
                job.total = v;
            }
            if sys::virTypedParamsGetULLong(
                params,
                n,
                sys::VIR_DOMAIN_JOB_DOWNTIME.as_ptr(),
                &mut v,
            ) == 1
            {
                job.downtime = Some(v);
            }
            let mut s: *const std::os::raw::c_char = std::ptr::null();
            if sys::virTypedParamsGetString(params, n, sys::VIR_DOMAIN_JOB_ERRMSG.as_ptr(), &mut s)
                == 1
                && !s.is_null()
            {
                job.error = Some(std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned());
            }
            sys::virTypedParamsFree(params, n);
        }
    }
    Ok(job)
}
