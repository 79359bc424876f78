//! Getting a VMI ready to run on this node: images present locally, a qcow2 overlay per VM
//! disk, the cloud-init NoCloud disk, the domain XML, and the detached launcher process.
//! Every path is derived from uids; nothing a user typed becomes a path.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context as _, bail};
use serde_json::json;

use super::ports::Stored;
use super::{Agent, Config};
use crate::hostnet::TapVlan;
use crate::registry::{DockerConfig, PullPolicy, Source};
use crate::types::annotations::VOLUMES_NODE_ANNOTATION;
use crate::types::cni::Bridge;
use crate::types::{Meta, VirtualMachineInstance};
use crate::virt::convert::{self, ResolvedDisk};

/// The libvirt domain name of a VMI: readable, and unique through the uid.
pub fn domain_name(ns: &str, name: &str, uid: &str) -> String {
    format!("ev-{ns}-{name}-{}", &uid[..8.min(uid.len())])
}

/// Create the NAT network `pod` networks map onto, if missing.
pub async fn ensure_network(agent: &Agent) -> anyhow::Result<()> {
    let name = agent.cfg.nat_network.clone();
    let p = &agent.cfg.nat_prefix;
    let short: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(10)
        .collect();
    let xml = format!(
        "<network xmlns:dnsmasq='http://libvirt.org/schemas/network/dnsmasq/1.0'>\n  <name>{name}</name>\n  \
         <forward mode='nat'/>\n  <bridge name='evbr-{short}' stp='on' delay='0'/>\n  \
         <ip address='{p}.1' netmask='255.255.255.0'>\n    <dhcp>\n      <range start='{p}.10' end='{p}.250'/>\n    </dhcp>\n  </ip>\n  \
         <dnsmasq:options>\n    <dnsmasq:option value='no-ping'/>\n  </dnsmasq:options>\n</network>\n"
    );
    let hv = agent.hv.clone();
    tokio::task::spawn_blocking(move || hv.ensure_network(&name, &xml))
        .await?
        .context("creating the NAT network")?;
    Ok(())
}

/// The uid of the VM owning a VMI, or the VMI's own uid for a standalone VMI.
pub fn owner_uid(vmi: &VirtualMachineInstance) -> String {
    vmi.owner_uid("VirtualMachine")
        .unwrap_or(vmi.uid())
        .to_string()
}

/// The disk of a `persistentVolumeClaim` in this node's shared pool: `POOL/NS/CLAIM.qcow2`
/// or `POOL/NS/CLAIM.raw` (the path comes from checked names only), with its format.
/// edgevirt never creates these: the operator puts them there, like a provisioned volume.
/// A disk with a backing file or an external data file is refused, as on image import:
/// it could make QEMU open a file outside the pool. The extension sets the format; the
/// file's contents are never probed for one.
pub async fn claim_disk(agent: &Agent, ns: &str, claim: &str) -> anyhow::Result<(PathBuf, String)> {
    let (pool, root) = claims_pool(agent, ns, claim)?;
    let dir = root.join(ns);
    let Some((path, format)) = [("qcow2", "qcow2"), ("raw", "raw")]
        .into_iter()
        .map(|(ext, format)| (dir.join(format!("{claim}.{ext}")), format))
        .find(|(p, _)| p.is_file())
    else {
        bail!(
            "claim {ns}/{claim}: no disk {claim}.qcow2 or {claim}.raw in {} (shared pool {pool})",
            dir.display()
        );
    };
    crate::virt::image::inspect(&path, Some(format))
        .await
        .map_err(|e| anyhow::anyhow!("claim {ns}/{claim}: {}: {e}", path.display()))?;
    Ok((path, format.to_string()))
}

/// The shared pool (name and folder) a claim of `ns` lives on, once both names are checked.
fn claims_pool<'a>(
    agent: &'a Agent,
    ns: &str,
    claim: &str,
) -> anyhow::Result<&'a (String, PathBuf)> {
    crate::types::check_name("namespace", ns)?;
    crate::types::check_name("claimName", claim)?;
    agent.cfg.shared_pool.as_ref().ok_or_else(|| {
        anyhow::anyhow!(
            "claim {ns}/{claim}: node {} mounts no shared storage pool (serve --shared-pool)",
            agent.cfg.node_name
        )
    })
}

/// The folder a virtiofs filesystem shares for a `persistentVolumeClaim`:
/// `POOL/NS/CLAIM/`, which the operator makes, as for claim disks. It must be a folder
/// itself, not a symbolic link, so it stays inside the pool; virtiofsd keeps the guest
/// inside it.
async fn claim_folder(agent: &Agent, ns: &str, claim: &str) -> anyhow::Result<PathBuf> {
    let (pool, root) = claims_pool(agent, ns, claim)?;
    let dir = root.join(ns).join(claim);
    match tokio::fs::symlink_metadata(&dir).await {
        Ok(m) if m.is_dir() => Ok(dir),
        Ok(_) => bail!(
            "claim {ns}/{claim}: {} is not a folder (a filesystem shares a folder; symbolic \
             links are refused)",
            dir.display()
        ),
        Err(e) => bail!(
            "claim {ns}/{claim}: no folder {} on shared pool {pool} to share: {e}",
            dir.display()
        ),
    }
}

/// A hostDisk's file, inside this node's host disk folder (`serve --host-disk-dir`):
/// `DiskOrCreate` makes a sparse raw file of its capacity when none is there. The file and
/// its folder are resolved (symbolic links followed) and must still be inside the folder.
/// It is always given to QEMU as raw: its contents are never probed for a format.
async fn host_disk(
    agent: &Agent,
    vol: &str,
    h: &crate::types::kubevirt::HostDisk,
) -> anyhow::Result<PathBuf> {
    let path = PathBuf::from(&h.path);
    let Some(root) = &agent.cfg.host_disk_dir else {
        bail!(
            "hostDisk {}: node {} allows no host disks (serve --host-disk-dir FOLDER)",
            path.display(),
            agent.cfg.node_name
        );
    };
    let outside = || {
        anyhow::anyhow!(
            "hostDisk {}: outside node {}'s host disk folder {}",
            path.display(),
            agent.cfg.node_name,
            root.display()
        )
    };
    if !path.starts_with(root) || path == *root {
        return Err(outside());
    }
    let real_root = tokio::fs::canonicalize(root)
        .await
        .with_context(|| format!("host disk folder {}", root.display()))?;
    let parent = path.parent().ok_or_else(outside)?;
    if h.type_ == "DiskOrCreate" && !path.exists() {
        tokio::fs::create_dir_all(parent).await?;
        if !tokio::fs::canonicalize(parent)
            .await?
            .starts_with(&real_root)
        {
            return Err(outside());
        }
        let bytes = convert::empty_disk_bytes(h.capacity.as_deref().unwrap_or_default())?;
        let tmp = parent.join(format!(
            ".{}.creating",
            path.file_name().unwrap_or_default().to_string_lossy()
        ));
        let f = tokio::fs::File::create(&tmp).await?;
        f.set_len(bytes).await?;
        drop(f);
        // Never over a file that appeared meanwhile.
        if tokio::fs::hard_link(&tmp, &path).await.is_ok() {
            tracing::info!(volume = %vol, path = %path.display(), bytes, "created the hostDisk");
        }
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    let real = tokio::fs::canonicalize(&path)
        .await
        .with_context(|| format!("hostDisk {} (type {})", path.display(), h.type_))?;
    if !real.starts_with(&real_root) {
        return Err(outside());
    }
    anyhow::ensure!(
        tokio::fs::metadata(&real).await?.is_file(),
        "hostDisk {}: not a regular file",
        path.display()
    );
    Ok(real)
}

/// The file in a VMI's run dir naming the cached container disks (digests) it uses.
pub const CONTAINER_DISKS_FILE: &str = "container-disks";

/// A disk file on this node's own storage, writable.
fn local_disk(path: &Path) -> ResolvedDisk {
    local_file(path, "qcow2")
}

/// A file of this node's own (an overlay, an ISO) in `format`, writable by the guest.
fn local_file(path: &Path, format: &str) -> ResolvedDisk {
    ResolvedDisk {
        path: path.to_string_lossy().into_owned(),
        format: format.into(),
        shared: false,
        readonly: false,
    }
}

/// A qcow2 overlay at `overlay` on the image `base`, unless it exists; whether it was made.
async fn make_overlay(base: &Path, format: &str, overlay: &Path) -> anyhow::Result<bool> {
    let base = base.to_string_lossy();
    create_qcow2(overlay, &["-F", format, "-b", &base], None).await
}

/// A qcow2 file at `path` made by `qemu-img create` with `options` (and `size`, in bytes),
/// unless it exists; written under a temporary name first, so a crash leaves no half file
/// under the real one. Whether it was made.
async fn create_qcow2(path: &Path, options: &[&str], size: Option<u64>) -> anyhow::Result<bool> {
    if path.exists() {
        return Ok(false);
    }
    let tmp = path.with_extension("tmp");
    let (tmp_arg, size_arg) = (tmp.to_string_lossy(), size.map(|b| b.to_string()));
    let mut args = vec!["create", "-q", "-f", "qcow2"];
    args.extend_from_slice(options);
    args.push(&tmp_arg);
    args.extend(size_arg.as_deref());
    super::run_tool("qemu-img", &args).await?;
    tokio::fs::rename(&tmp, path).await?;
    Ok(true)
}

/// How to pull `image`: its `imagePullPolicy` resolved, and the credentials of its
/// `imagePullSecret` (a Secret in the VMI's namespace `ns`).
async fn pull_settings(
    agent: &Agent,
    ns: &str,
    image: &str,
    policy: Option<&str>,
    secret: Option<&str>,
) -> anyhow::Result<(PullPolicy, DockerConfig)> {
    let policy = PullPolicy::resolve(policy, image).map_err(|e| anyhow::anyhow!("{e}"))?;
    let auths = match secret {
        Some(secret) => agent.cp.pull_secret(ns, secret).await?,
        None => Default::default(),
    };
    Ok((policy, auths))
}

/// Everything on disk a VMI needs; returns the path of its domain XML.
pub async fn prepare(
    agent: &Agent,
    stored: &Stored<VirtualMachineInstance>,
) -> anyhow::Result<PathBuf> {
    let vmi = &stored.obj;
    let uid = vmi.uid().to_string();
    if uid.is_empty() {
        bail!("VMI without uid");
    }
    let ns = match vmi.namespace() {
        "" => "default".to_string(),
        ns => ns.to_string(),
    };
    let name = vmi.name().to_string();
    let spec = &vmi.spec;
    let owner = owner_uid(vmi);
    let run_dir = agent.run_dir(&uid);
    tokio::fs::create_dir_all(&run_dir).await?;
    let vol_dir = agent.volumes_dir(&owner);

    let mut disks = BTreeMap::new();
    let mut shares = BTreeMap::new();
    let mut made_volume = false;
    let mut pulled = Vec::new();
    for v in &spec.volumes {
        crate::types::check_name("volume name", &v.name)?;
        if let Some(cd) = &v.container_disk {
            // Ephemeral, as in KubeVirt: the overlay lives with this instance and goes with
            // it; a restart (a new instance) starts again from the image.
            let (base, format) = match Source::of(&cd.image) {
                Source::Imported(name) => super::local_image(agent, &name).await?,
                Source::Registry(image) => {
                    let (policy, auths) = pull_settings(
                        agent,
                        &ns,
                        &image,
                        cd.image_pull_policy.as_deref(),
                        cd.image_pull_secret.as_deref(),
                    )
                    .await?;
                    let disk = agent.disks.pull(&image, policy, &auths).await?;
                    let found = (disk.path.clone(), disk.format.clone());
                    // Kept (pinned against garbage collection) until recorded below.
                    pulled.push(disk);
                    found
                }
            };
            let overlay = run_dir.join(format!("disk-{}.qcow2", v.name));
            make_overlay(&base, &format, &overlay).await?;
            disks.insert(v.name.clone(), local_disk(&overlay));
        } else if let Some(e) = &v.empty_disk {
            // Ephemeral too: a blank disk for this instance only.
            let bytes = convert::empty_disk_bytes(&e.capacity)?;
            let disk = run_dir.join(format!("empty-{}.qcow2", v.name));
            create_qcow2(&disk, &[], Some(bytes)).await?;
            disks.insert(v.name.clone(), local_disk(&disk));
        } else if let Some(dv) = &v.data_volume
            && let Some((disk, shared)) = super::datavolume::disk(agent, &ns, &dv.name).await?
        {
            // A DataVolume's own disk (on this node, or on the shared pool): persistent, the
            // DataVolume's.
            disks.insert(
                v.name.clone(),
                ResolvedDisk {
                    shared,
                    ..local_disk(&disk)
                },
            );
        } else if let Some(dv) = &v.data_volume {
            // An imported image, under a persistent overlay that belongs to the VM and
            // outlives its instances.
            let (base, format) = super::local_image(agent, &dv.name).await?;
            tokio::fs::create_dir_all(&vol_dir).await?;
            let overlay = vol_dir.join(format!("{}.qcow2", v.name));
            made_volume |= make_overlay(&base, &format, &overlay).await?;
            disks.insert(v.name.clone(), local_disk(&overlay));
        } else if let Some((ci, drive)) = v
            .cloud_init_config_drive
            .as_ref()
            .map(|c| (c, true))
            .or(v.cloud_init_no_cloud.as_ref().map(|c| (c, false)))
        {
            // Cloud-init data as an OpenStack config drive or a NoCloud ISO, with the SSH
            // keys accessCredentials propagates that way.
            let by: fn(&crate::types::kubevirt::SshPropagation) -> bool = if drive {
                |m| m.config_drive.is_some()
            } else {
                |m| m.no_cloud.is_some()
            };
            let keys = propagated_keys(agent, &ns, spec, by).await?;
            let host = spec.hostname.as_deref().unwrap_or(&name);
            let iso = if drive {
                config_drive_iso(&run_dir, &uid, host, &v.name, ci, &keys).await?
            } else {
                cloud_init_iso(&run_dir, &uid, host, &v.name, ci, &keys).await?
            };
            disks.insert(v.name.clone(), local_file(&iso, "raw"));
        } else if let Some((label, files)) = config_files(agent, vmi, &ns, v).await? {
            if spec.domain.devices.is_filesystem(&v.name) {
                // Shared over virtiofs instead: a folder of the instance's own, gone with it.
                let dir = run_dir.join(format!("share-{}", v.name));
                write_files(&dir, &files).await?;
                shares.insert(v.name.clone(), dir.to_string_lossy().into_owned());
                continue;
            }
            let iso = config_iso(&run_dir, &v.name, &label, &files).await?;
            disks.insert(v.name.clone(), local_file(&iso, "raw"));
        } else if let Some(h) = &v.host_disk {
            let path = host_disk(agent, &v.name, h).await?;
            disks.insert(
                v.name.clone(),
                ResolvedDisk {
                    path: path.to_string_lossy().into_owned(),
                    format: "raw".into(),
                    shared: h.shared == Some(true),
                    readonly: false,
                },
            );
        } else if let Some(claim) = v
            .ephemeral
            .as_ref()
            .and_then(|e| e.persistent_volume_claim.as_ref())
        {
            // The claim's disk under an overlay of this instance's own (its run dir goes
            // with it): the claim is only read.
            let (base, format) = claim_disk(agent, &ns, &claim.claim_name).await?;
            let overlay = run_dir.join(format!("ephemeral-{}.qcow2", v.name));
            make_overlay(&base, &format, &overlay).await?;
            disks.insert(v.name.clone(), local_disk(&overlay));
        } else if let Some(claim) = v
            .persistent_volume_claim
            .as_ref()
            .filter(|_| spec.domain.devices.is_filesystem(&v.name))
        {
            let dir = claim_folder(agent, &ns, &claim.claim_name).await?;
            shares.insert(v.name.clone(), dir.to_string_lossy().into_owned());
        } else if let Some(claim) = &v.persistent_volume_claim {
            let (path, format) = claim_disk(agent, &ns, &claim.claim_name).await?;
            disks.insert(
                v.name.clone(),
                ResolvedDisk {
                    path: path.to_string_lossy().into_owned(),
                    format,
                    shared: true,
                    readonly: claim.read_only.unwrap_or(false),
                },
            );
        }
    }

    let (nvram, firmware_state) = firmware_state(agent, vmi, &vol_dir).await?;
    made_volume |= firmware_state;
    // A migration's target (the instance is still the source's) claims the VM's folder only
    // once the guest arrived (`migrate::finish_target`): a failed migration leaves it alone.
    let here = vmi.node_name() == Some(agent.cfg.node_name.as_str());
    if made_volume && here {
        let patch =
            json!({"metadata": {"annotations": {VOLUMES_NODE_ANNOTATION: agent.cfg.node_name}}});
        // A standalone VMI has no VM to note it on.
        agent.cp.patch_vm(&ns, &name, patch).await?;
    }
    let kb = spec.kernel_boot_container().cloned();
    let mut kernel = None;
    let mut initrd = None;
    let mut boot = None;
    if let Some(c) = kb.as_ref().filter(|c| c.from_image()) {
        // KubeVirt's form: the kernel and initrd are files inside the image.
        let (policy, auths) = pull_settings(
            agent,
            &ns,
            &c.image,
            c.image_pull_policy.as_deref(),
            c.image_pull_secret.as_deref(),
        )
        .await?;
        let files = agent
            .disks
            .pull_boot(
                &c.image,
                policy,
                &auths,
                c.kernel_path.as_deref().unwrap_or_default(),
                c.initrd_path.as_deref(),
            )
            .await?;
        kernel = Some(files.kernel.to_string_lossy().into_owned());
        initrd = files
            .initrd
            .as_ref()
            .map(|i| i.to_string_lossy().into_owned());
        boot = Some(files);
    } else if let Some(c) = kb {
        if let Some(k) = &c.kernel_path {
            kernel = Some(
                super::local_image(agent, k)
                    .await?
                    .0
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        if let Some(i) = &c.initrd_path {
            initrd = Some(
                super::local_image(agent, i)
                    .await?
                    .0
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    // What this instance uses of the image cache, for its garbage collection; the pins of
    // what it pulled are dropped only once that is written.
    let digests: Vec<&str> = pulled
        .iter()
        .map(|d| d.digest.as_str())
        .chain(boot.as_ref().map(|b| b.digest.as_str()))
        .collect();
    tokio::fs::write(run_dir.join(CONTAINER_DISKS_FILE), digests.join("\n")).await?;
    drop((pulled, boot));
    // The guest CPU the scheduler chose (recorded on the VMI), or resolved here against this
    // node's own facts.
    let (hv, accel) = (agent.hv.clone(), agent.accel.clone());
    let facts = tokio::task::spawn_blocking(move || crate::cpu::node_facts(&*hv, &accel)).await?;
    // The policy reads the scheduler's annotation and the spec.
    let cpu = crate::cpu::policy::for_vmi(&stored.obj, &facts, &agent.accel)?;
    tracing::info!(vmi = %name, mode = cpu.mode.as_str(), model = ?cpu.model, reason = %cpu.reason, "guest CPU");
    // Dedicated CPUs, as the scheduler gave them (checked against the vCPU count).
    let pins = crate::rules::cpus::Pins::of(vmi);
    let (so, co, th) = convert::topology(spec);
    if let Some((n, emulator)) = crate::rules::cpus::wants(vmi, so * co * th) {
        match &pins {
            Some(p) if p.vcpus.len() == n as usize && p.emulator.is_some() == emulator => {}
            _ => bail!(
                "the instance asks for dedicated CPUs but the scheduler gave it none that fit \
                 (annotation {}: {:?}); delete it so that it is scheduled again",
                crate::rules::cpus::DEDICATED_CPUS_ANNOTATION,
                pins.as_ref().map(|p| p.to_annotation())
            ),
        }
    }
    let bridges = bridges_of(agent, &ns, spec).await?;
    // The taps whose VLAN is set when they appear (by the launcher at a start, by this
    // agent on a migration's target).
    let taps: Vec<TapVlan> = convert::nics(spec, &owner)
        .into_iter()
        .enumerate()
        .filter_map(|(i, nic)| {
            let b = bridges.get(&nic.network?.name)?;
            Some(TapVlan {
                dev: convert::tap_name(&uid, i),
                bridge: b.bridge.clone(),
                vlan: b.vlan?,
            })
        })
        .collect();
    let vlans_file = run_dir.join(crate::hostnet::TAP_VLANS_FILE);
    if taps.is_empty() {
        let _ = tokio::fs::remove_file(&vlans_file).await;
    } else {
        tokio::fs::write(&vlans_file, serde_json::to_vec(&taps)?).await?;
    }
    let ctx = convert::Context {
        domain_name: domain_name(&ns, &name, &uid),
        domain_uuid: uid.clone(),
        install_id: agent.install_id.clone(),
        node: agent.cfg.node_name.clone(),
        vmi_uid: uid.clone(),
        namespace: ns,
        vmi_name: name,
        accel: agent.accel.clone(),
        nat_network: agent.cfg.nat_network.clone(),
        mac_seed: owner,
        vnc_socket: Some(run_dir.join("vnc.sock").to_string_lossy().into_owned()),
        serial_socket: Some(run_dir.join("serial.sock").to_string_lossy().into_owned()),
        disks,
        targets: hotplug_targets(vmi),
        shares,
        kernel,
        initrd,
        nvram,
        cpu,
        pins,
        bridges,
    };
    let xml = convert::domain_xml(spec, &ctx)?;
    let path = run_dir.join("domain.xml");
    tokio::fs::write(&path, xml).await?;
    Ok(path)
}

/// The disk of a volume `addvolume` added: a DataVolume's own disk or a claim's, as a
/// start would resolve it (those are the two sources KubeVirt hotplugs).
pub async fn hotplug_disk(
    agent: &Agent,
    ns: &str,
    v: &crate::types::kubevirt::Volume,
) -> anyhow::Result<ResolvedDisk> {
    crate::types::check_name("volume name", &v.name)?;
    if let Some(dv) = &v.data_volume {
        let Some((disk, shared)) = super::datavolume::disk(agent, ns, &dv.name).await? else {
            bail!("DataVolume {ns}/{} does not exist", dv.name);
        };
        return Ok(ResolvedDisk {
            shared,
            ..local_disk(&disk)
        });
    }
    if let Some(claim) = &v.persistent_volume_claim {
        let (path, format) = claim_disk(agent, ns, &claim.claim_name).await?;
        return Ok(ResolvedDisk {
            path: path.to_string_lossy().into_owned(),
            format,
            shared: true,
            readonly: claim.read_only.unwrap_or(false),
        });
    }
    bail!(
        "volume {:?}: only a dataVolume or a persistentVolumeClaim can be hotplugged",
        v.name
    )
}

/// The devices the instance's hotplugged volumes were attached as, from its status.
pub fn hotplug_targets(vmi: &VirtualMachineInstance) -> BTreeMap<String, String> {
    vmi.status
        .iter()
        .flat_map(|s| &s.volume_status)
        .filter(|v| v.hotplug_volume.is_some() && !v.target.is_empty())
        .map(|v| (v.name.clone(), v.target.clone()))
        .collect()
}

/// The file of the VM's EFI variables in its folder (`efi.persistent`).
pub const NVRAM_FILE: &str = "efi-vars.fd";
/// The folder of the VM's vTPM state in its folder (`tpm.persistent`).
pub const TPM_STATE_DIR: &str = "tpm";
/// Where libvirt keeps each domain's swtpm state: `<this>/<domain uuid>/tpm2/`.
const LIBVIRT_SWTPM_DIR: &str = "/var/lib/libvirt/swtpm";

/// The firmware state a VMI keeps in its VM's folder (`vol_dir`), made ready: the EFI
/// variables file's path when `efi.persistent` (libvirt fills a missing one from the
/// firmware's template), and for `tpm.persistent` a state folder that libvirt's swtpm
/// folder for the domain links to. A vTPM on a node without swtpm is refused here, with
/// the reason. Returns the path and whether anything was created in `vol_dir`.
async fn firmware_state(
    agent: &Agent,
    vmi: &VirtualMachineInstance,
    vol_dir: &std::path::Path,
) -> anyhow::Result<(Option<String>, bool)> {
    use crate::types::kubevirt::TpmDevice;
    let spec = &vmi.spec;
    let fw = spec.domain.firmware.clone().unwrap_or_default();
    let efi = fw.bootloader.as_ref().and_then(|b| b.efi.as_ref());
    let mut made = false;
    let nvram = if efi.is_some_and(|e| e.persistent == Some(true)) {
        tokio::fs::create_dir_all(vol_dir).await?;
        let path = vol_dir.join(NVRAM_FILE);
        made |= !tokio::fs::try_exists(&path).await.unwrap_or(false);
        Some(path.to_string_lossy().into_owned())
    } else {
        None
    };
    let tpm = &spec.domain.devices.tpm;
    if !TpmDevice::on(tpm) {
        return Ok((nvram, made));
    }
    if !["/usr/bin/swtpm", "/usr/local/bin/swtpm"]
        .iter()
        .any(|p| std::path::Path::new(p).exists())
    {
        bail!(
            "the VM has a TPM (spec.domain.devices.tpm) but node {} has no swtpm: install the \
             swtpm and swtpm-tools packages there, or run the VM on another node",
            agent.cfg.node_name
        );
    }
    if tpm.as_ref().is_some_and(|t| t.persistent == Some(true)) {
        // The domain's uuid: the VM's firmware uuid, else the instance's (as the domain XML
        // says), read back as a UUID so that no user text becomes a path.
        let uuid = domain_uuid(vmi)?;
        let state = vol_dir.join(TPM_STATE_DIR);
        made |= !tokio::fs::try_exists(&state).await.unwrap_or(false);
        tokio::fs::create_dir_all(&state).await?;
        link_swtpm_state(std::path::Path::new(LIBVIRT_SWTPM_DIR), &uuid, &state).await?;
    }
    Ok((nvram, made))
}

/// The domain's uuid: the VM's firmware uuid, else the instance's (as the domain XML says),
/// read back as a UUID so that no user text becomes a path.
fn domain_uuid(vmi: &VirtualMachineInstance) -> anyhow::Result<uuid::Uuid> {
    let fw = vmi.spec.domain.firmware.as_ref();
    Ok(match fw.and_then(|f| f.uuid.as_deref()) {
        Some(u) => uuid::Uuid::parse_str(u)
            .map_err(|e| anyhow::anyhow!("spec.domain.firmware.uuid {u:?}: {e}"))?,
        None => uuid::Uuid::parse_str(vmi.uid())?,
    })
}

/// Once an instance's domain is gone from this node: remove the link to its VM's vTPM
/// state from libvirt's swtpm folder (the state stays in the VM's folder).
pub async fn unlink_swtpm_state(vmi: &VirtualMachineInstance) {
    let Ok(uuid) = domain_uuid(vmi) else { return };
    let link = std::path::Path::new(LIBVIRT_SWTPM_DIR).join(uuid.hyphenated().to_string());
    if tokio::fs::symlink_metadata(&link)
        .await
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        let _ = tokio::fs::remove_file(&link).await;
    }
}

/// Make `<swtpm_dir>/<uuid>` a link to `state`, where libvirt's swtpm then reads and writes
/// the domain's vTPM state. A folder there (state of an earlier instance whose TPM was not
/// persistent) is removed first.
async fn link_swtpm_state(
    swtpm_dir: &std::path::Path,
    uuid: &uuid::Uuid,
    state: &std::path::Path,
) -> anyhow::Result<()> {
    tokio::fs::create_dir_all(swtpm_dir).await?;
    let link = swtpm_dir.join(uuid.hyphenated().to_string());
    match tokio::fs::symlink_metadata(&link).await {
        Ok(m) if m.file_type().is_symlink() => {
            if tokio::fs::read_link(&link).await? == state {
                return Ok(());
            }
            tokio::fs::remove_file(&link).await?;
        }
        Ok(m) if m.is_dir() => tokio::fs::remove_dir_all(&link).await?,
        Ok(_) => tokio::fs::remove_file(&link).await?,
        Err(_) => {}
    }
    tokio::fs::symlink(state, &link).await?;
    Ok(())
}

/// The bridge of each of the instance's `multus` networks, from its
/// NetworkAttachmentDefinition, checked against this host: the bridge must exist, and be
/// VLAN-filtering for a VLAN (the scheduler placed the instance by the same rule).
async fn bridges_of(
    agent: &Agent,
    ns: &str,
    spec: &crate::types::kubevirt::VirtualMachineInstanceSpec,
) -> anyhow::Result<BTreeMap<String, Bridge>> {
    let host = crate::hostnet::bridges();
    let mut out = BTreeMap::new();
    for n in &spec.networks {
        let Some(m) = &n.multus else { continue };
        let (nns, nad) = crate::types::cni::reference(ns, &m.network_name);
        let def = agent.cp.network(nns, nad).await?;
        let b = crate::rules::network::bridge_of(&n.name, (nns, nad), def.as_ref())
            .map_err(anyhow::Error::msg)?;
        if let Err(why) = crate::rules::network::bridge_fits(&b, &host) {
            bail!("network {}: {why}", n.name);
        }
        out.insert(n.name.clone(), b);
    }
    Ok(out)
}

/// A cloud-init volume's user data (with `keys` added, for NoCloud) and network data,
/// decoded.
fn cloud_init_data(
    vol: &str,
    ci: &crate::types::kubevirt::CloudInitNoCloud,
    keys: &[String],
) -> anyhow::Result<(String, Option<String>)> {
    use base64::Engine;
    let b64 = |s: &Option<String>| -> anyhow::Result<Option<String>> {
        s.as_ref()
            .map(|s| {
                base64::engine::general_purpose::STANDARD
                    .decode(s.trim())
                    .with_context(|| format!("volume {vol}: invalid base64 in its cloud-init data"))
                    .and_then(|b| String::from_utf8(b).context("cloud-init data is not UTF-8"))
            })
            .transpose()
    };
    let user = ci
        .user_data
        .clone()
        .or(b64(&ci.user_data_base64)?)
        .unwrap_or_default();
    let user = crate::rules::guest::user_data_with_keys(&user, keys)
        .map_err(|e| anyhow::anyhow!("volume {vol}: {}", e.0))?;
    let net = ci.network_data.clone().or(b64(&ci.network_data_base64)?);
    Ok((user, net))
}

/// Write an ISO labelled `volid` at `iso` holding the files under `dir` (paths relative to
/// it; none: an empty ISO), with Rock Ridge and Joliet names.
async fn write_iso(iso: &Path, volid: &str, dir: &Path, files: &[&str]) -> anyhow::Result<()> {
    let iso_s = iso.to_string_lossy().into_owned();
    // Graft points (`inside=outside`) keep each file's folder inside the ISO.
    let mut args: Vec<String> = [
        "-quiet",
        "-graft-points",
        "-output",
        &iso_s,
        "-volid",
        volid,
        "-joliet",
        "-rock",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(
        files
            .iter()
            .map(|f| format!("{f}={}", dir.join(f).to_string_lossy())),
    );
    if files.is_empty() {
        args.push(dir.to_string_lossy().into_owned());
    }
    super::run_tool("genisoimage", &args).await
}

/// The files of a `configMap`, `secret` or `downwardAPI` volume, with its ISO label
/// (`cfgdata` unless `volumeLabel` says); `None` for other volumes. A missing ConfigMap or
/// Secret stops the start, unless the volume is `optional` (then the disk is empty).
async fn config_files(
    agent: &Agent,
    vmi: &VirtualMachineInstance,
    ns: &str,
    v: &crate::types::kubevirt::Volume,
) -> anyhow::Result<Option<(String, BTreeMap<String, Vec<u8>>)>> {
    use crate::types::Kind;
    let (kind, name, optional, label) = if let Some(c) = &v.config_map {
        (
            Kind::ConfigMap,
            c.name.as_str(),
            c.optional,
            &c.volume_label,
        )
    } else if let Some(s) = &v.secret {
        let name = s.secret_name.as_deref().unwrap_or_default();
        (Kind::Secret, name, s.optional, &s.volume_label)
    } else if let Some(d) = &v.downward_api {
        let empty = BTreeMap::new();
        let meta = crate::types::kubevirt::DownwardMeta {
            name: vmi.name(),
            namespace: ns,
            uid: vmi.uid(),
            labels: vmi.metadata.labels.as_ref().unwrap_or(&empty),
            annotations: vmi.metadata.annotations.as_ref().unwrap_or(&empty),
        };
        let mut files = BTreeMap::new();
        for f in &d.fields {
            f.check_path()?;
            let value = match &f.field_ref {
                Some(r) => r.value(&meta)?,
                None => String::new(),
            };
            files.insert(f.path.clone(), value.into_bytes());
        }
        return Ok(Some((label_or_default(&d.volume_label), files)));
    } else {
        return Ok(None);
    };
    let files = match agent.cp.data_of(kind, ns, name).await? {
        Some(files) => files,
        None if optional == Some(true) => BTreeMap::new(),
        None => bail!(
            "volume {}: {} {ns}/{name} does not exist (mark the volume optional to start \
             without it)",
            v.name,
            kind.name()
        ),
    };
    // Admission checks keys; an object stored by an older release is checked here too, as
    // each key becomes a file name.
    if let Some(k) = files.keys().find(|k| !crate::types::is_file_name(k)) {
        bail!(
            "volume {}: {} {ns}/{name}: key {k:?} is no file name",
            v.name,
            kind.name()
        );
    }
    Ok(Some((label_or_default(label), files)))
}

fn label_or_default(label: &Option<String>) -> String {
    label.clone().unwrap_or_else(|| "cfgdata".into())
}

/// A fresh folder `dir` holding `files` (paths relative to it), readable by root only.
async fn write_files(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if tokio::fs::try_exists(dir).await? {
        tokio::fs::remove_dir_all(dir).await?;
    }
    tokio::fs::create_dir_all(dir).await?;
    tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).await?;
    for (path, bytes) in files {
        // Keys and downward paths were checked: relative, with no `..`.
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        tokio::fs::write(&file, bytes).await?;
    }
    Ok(())
}

/// An ISO labelled `label` holding `files` (paths relative to its root), as KubeVirt
/// presents ConfigMaps, Secrets and downward API files. The files are written to a folder
/// of the run dir only while the ISO is made.
async fn config_iso(
    run_dir: &Path,
    vol: &str,
    label: &str,
    files: &BTreeMap<String, Vec<u8>>,
) -> anyhow::Result<PathBuf> {
    let dir = run_dir.join(format!("config-{vol}"));
    write_files(&dir, files).await?;
    let iso = run_dir.join(format!("{vol}.iso"));
    let names: Vec<&str> = files.keys().map(String::as_str).collect();
    let made = write_iso(&iso, label, &dir, &names).await;
    // A Secret's files stay only in the ISO.
    tokio::fs::remove_dir_all(&dir).await?;
    made?;
    Ok(iso)
}

/// The NoCloud ISO (label `cidata`) of a `cloudInitNoCloud` volume.
async fn cloud_init_iso(
    run_dir: &Path,
    uid: &str,
    hostname: &str,
    vol: &str,
    ci: &crate::types::kubevirt::CloudInitNoCloud,
    keys: &[String],
) -> anyhow::Result<PathBuf> {
    let (user, net) = cloud_init_data(vol, ci, keys)?;
    let dir = run_dir.join(format!("cloudinit-{vol}"));
    tokio::fs::create_dir_all(&dir).await?;
    tokio::fs::write(dir.join("user-data"), user).await?;
    tokio::fs::write(
        dir.join("meta-data"),
        format!("instance-id: {uid}\nlocal-hostname: {hostname}\n"),
    )
    .await?;
    let mut files = vec!["user-data", "meta-data"];
    if let Some(n) = net {
        tokio::fs::write(dir.join("network-config"), n).await?;
        files.push("network-config");
    }
    let iso = run_dir.join(format!("{vol}.iso"));
    write_iso(&iso, "cidata", &dir, &files).await?;
    Ok(iso)
}

/// The OpenStack config drive (label `config-2`) of a `cloudInitConfigDrive` volume, as
/// KubeVirt writes it: `openstack/latest/user_data`, `meta_data.json` (the instance's
/// uid, host name, and the SSH keys propagated by `configDrive` as `public_keys`) and
/// `network_data.json` when network data is given.
async fn config_drive_iso(
    run_dir: &Path,
    uid: &str,
    hostname: &str,
    vol: &str,
    ci: &crate::types::kubevirt::CloudInitNoCloud,
    keys: &[String],
) -> anyhow::Result<PathBuf> {
    let (user, net) = cloud_init_data(vol, ci, &[])?;
    let dir = run_dir.join(format!("configdrive-{vol}"));
    let latest = dir.join("openstack/latest");
    tokio::fs::create_dir_all(&latest).await?;
    tokio::fs::write(latest.join("user_data"), user).await?;
    let public_keys: serde_json::Map<String, serde_json::Value> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (i.to_string(), json!(k)))
        .collect();
    let meta = json!({"uuid": uid, "hostname": hostname, "name": hostname,
                      "public_keys": public_keys});
    tokio::fs::write(latest.join("meta_data.json"), meta.to_string()).await?;
    let mut files = vec![
        "openstack/latest/user_data",
        "openstack/latest/meta_data.json",
    ];
    if let Some(n) = net {
        tokio::fs::write(latest.join("network_data.json"), n).await?;
        files.push("openstack/latest/network_data.json");
    }
    let iso = run_dir.join(format!("{vol}.iso"));
    write_iso(&iso, "config-2", &dir, &files).await?;
    Ok(iso)
}

/// The SSH keys `accessCredentials` propagates by the methods `by` picks (NoCloud, config
/// drive), from their Secrets in namespace `ns`.
async fn propagated_keys(
    agent: &Agent,
    ns: &str,
    spec: &crate::types::kubevirt::VirtualMachineInstanceSpec,
    by: fn(&crate::types::kubevirt::SshPropagation) -> bool,
) -> anyhow::Result<Vec<String>> {
    let mut keys = Vec::new();
    for c in &spec.access_credentials {
        if let Some(k) = &c.ssh_public_key
            && by(&k.propagation_method)
            && let Some(s) = &k.source.secret
        {
            let data = agent
                .cp
                .secret_data(ns, &s.secret_name)
                .await
                .context("accessCredentials")?;
            for key in crate::rules::guest::authorized_keys(&data) {
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
    }
    Ok(keys)
}

/// Start a launcher for a VMI as a detached process (its own session), logging to a file.
/// The command a launcher starts with: in its own transient scope (`systemd-run --scope`,
/// outside the agent's service cgroup) where systemd is PID 1, else the executable itself
/// (it is detached with `setsid` either way).
fn launcher_command(exe: &Path, uid: &str, systemd: bool) -> tokio::process::Command {
    let systemd_run = ["/usr/bin/systemd-run", "/bin/systemd-run"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists());
    match systemd_run {
        Some(run) if systemd => {
            let mut c = tokio::process::Command::new(run);
            c.args(["--scope", "--quiet", "--collect"])
                .arg(format!("--description=edgevirt launcher of VMI {uid}"))
                .arg("--")
                .arg(exe);
            c
        }
        _ => tokio::process::Command::new(exe),
    }
}

/// Whether systemd manages this host (sd_booted(3): `/run/systemd/system` exists).
pub fn systemd_is_pid1() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

pub fn spawn_launcher(
    cfg: &Config,
    uid: &str,
    domain: &str,
    xml: &Path,
) -> anyhow::Result<tokio::process::Child> {
    let socket = crate::launcher::socket_path(&cfg.data_dir.join("run/launchers"), uid);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(cfg.data_dir.join("log").join(format!("launcher-{uid}.log")))?;
    let mut cmd = launcher_command(&cfg.exe, uid, systemd_is_pid1());
    cmd.arg("launcher")
        .arg("--socket")
        .arg(&socket)
        .arg("--libvirt-uri")
        .arg(&cfg.libvirt_uri)
        .arg("--domain-name")
        .arg(domain)
        .arg("--vmi-uid")
        .arg(uid)
        .arg("--xml-file")
        .arg(xml)
        // One malloc arena is plenty for a single-threaded launcher.
        .env("MALLOC_ARENA_MAX", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(false);
    // SAFETY: setsid() is async-signal-safe and touches no memory of the parent; it puts the
    // launcher in its own session so signals to the agent's group do not reach it.
    unsafe {
        cmd.as_std_mut().pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn().context("starting the launcher")?;
    tracing::info!(vmi = %uid, %domain, pid = child.id().unwrap_or(0), "started launcher");
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iso_file(iso: &Path, inside: &str) -> String {
        let out = std::process::Command::new("isoinfo")
            .args(["-R", "-i"])
            .arg(iso)
            .args(["-x", inside])
            .output()
            .expect("isoinfo (genisoimage) is installed by setup-host.sh");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn iso_label(iso: &Path) -> String {
        let out = std::process::Command::new("isoinfo")
            .args(["-d", "-i"])
            .arg(iso)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("Volume id: ").map(str::to_string))
            .unwrap_or_default()
    }

    /// A config ISO: every file at its path (folders made for downward API paths), the
    /// label asked for, and no staging folder left; no files make an empty ISO.
    #[tokio::test]
    async fn config_isos_hold_their_files_under_their_label() {
        let d = tempfile::tempdir().unwrap();
        let files = BTreeMap::from([
            ("app.conf".to_string(), b"mode=edge\n".to_vec()),
            ("ids/name".to_string(), b"vm1".to_vec()),
        ]);
        let iso = config_iso(d.path(), "cfg", "OEMDRV", &files).await.unwrap();
        assert_eq!(iso_file(&iso, "/app.conf"), "mode=edge\n");
        assert_eq!(iso_file(&iso, "/ids/name"), "vm1");
        assert_eq!(iso_label(&iso), "OEMDRV");
        assert!(!d.path().join("config-cfg").exists());
        let empty = config_iso(d.path(), "none", "cfgdata", &BTreeMap::new())
            .await
            .unwrap();
        assert_eq!(iso_label(&empty), "cfgdata");
    }

    /// The two cloud-init ISOs, as cloud-init's NoCloud and ConfigDrive sources read them.
    #[tokio::test]
    async fn cloud_init_isos_are_laid_out_as_their_sources_expect() {
        let d = tempfile::tempdir().unwrap();
        let ci = crate::types::kubevirt::CloudInitNoCloud {
            user_data: Some("#cloud-config\nhostname: x\n".into()),
            network_data: Some("{\"links\": []}".into()),
            ..Default::default()
        };
        let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEdnZXZpcnQ k@e".to_string();
        let iso = config_drive_iso(
            d.path(),
            "uid-1",
            "host-1",
            "cd",
            &ci,
            std::slice::from_ref(&key),
        )
        .await
        .unwrap();
        assert_eq!(iso_label(&iso), "config-2");
        assert!(iso_file(&iso, "/openstack/latest/user_data").contains("hostname: x"));
        assert_eq!(
            iso_file(&iso, "/openstack/latest/network_data.json"),
            "{\"links\": []}"
        );
        let meta: serde_json::Value =
            serde_json::from_str(&iso_file(&iso, "/openstack/latest/meta_data.json")).unwrap();
        assert_eq!(
            meta,
            json!({"uuid": "uid-1", "hostname": "host-1", "name": "host-1",
                   "public_keys": {"0": key}})
        );
        let iso = cloud_init_iso(d.path(), "uid-1", "host-1", "ci", &ci, &[])
            .await
            .unwrap();
        assert_eq!(iso_label(&iso), "cidata");
        assert!(iso_file(&iso, "/meta-data").contains("local-hostname: host-1"));
        assert!(iso_file(&iso, "/user-data").contains("hostname: x"));
    }

    #[test]
    fn launchers_get_their_own_scope_under_systemd() {
        let exe = Path::new("/usr/bin/edgevirt");
        let plain = launcher_command(exe, "u1", false);
        assert_eq!(plain.as_std().get_program(), exe.as_os_str());
        let scoped = launcher_command(exe, "u1", true);
        if Path::new("/usr/bin/systemd-run").exists() || Path::new("/bin/systemd-run").exists() {
            let args: Vec<_> = scoped
                .as_std()
                .get_args()
                .map(|a| a.to_string_lossy().to_string())
                .collect();
            assert!(
                scoped
                    .as_std()
                    .get_program()
                    .to_string_lossy()
                    .ends_with("systemd-run")
            );
            assert_eq!(&args[..3], ["--scope", "--quiet", "--collect"]);
            assert_eq!(args.last().map(String::as_str), Some("/usr/bin/edgevirt"));
            assert!(args.iter().any(|a| a.contains("u1")));
        } else {
            assert_eq!(scoped.as_std().get_program(), exe.as_os_str());
        }
    }
}
