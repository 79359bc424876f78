//! The command line: `serve` (the roles), the hidden `launcher` role, and client commands
//! for VMs, VMIs and images. Settings come from flags, `EDGEVIRT_*` environment variables and
//! a TOML file, in that order of precedence.

mod backup;
mod console;
mod cpu;
mod k8s;
mod lockout;
mod network;
mod node;
mod output;
mod snapshot;
mod strategy;
mod vm;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

use crate::client::Client;
use crate::server::{self, Role};

#[derive(Parser, Debug)]
#[command(
    name = "edgevirt",
    version,
    about = "A single-binary virtualization appliance for edge sites, with a KubeVirt-compatible API",
    long_about = "edgevirt runs VMs on libvirt/KVM hosts. `edgevirt serve` runs the appliance \
                  (controller, agent, or both); the other commands are clients of its API.\n\n\
                  Client settings: --server/--token, or EDGEVIRT_SERVER/EDGEVIRT_TOKEN, or \
                  ~/.config/edgevirt/client.toml (server, token, ca_cert). On the appliance \
                  itself, as root, the token in /var/lib/edgevirt/initial-admin is used."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the appliance: API and controller, agent, or both (the default).
    Serve(Box<ServeArgs>),
    /// Manage virtual machines.
    Vm(vm::VmArgs),
    /// Inspect virtual machine instances (the running side of a VM).
    Vmi(vm::VmiArgs),
    /// Import, list and delete images (disks, kernels, initrds).
    Image(vm::ImageArgs),
    /// The hosts: list, inspect, cordon, delete; join tokens for adding hosts.
    Node(node::NodeArgs),
    /// Site networks (LAN, VLANs): NetworkAttachmentDefinitions naming a host bridge.
    Network(network::NetworkArgs),
    /// Snapshots of VMs (KubeVirt's VirtualMachineSnapshot): take, list, delete.
    Snapshot(snapshot::SnapshotArgs),
    /// Put a VM back to a snapshot (its disks and spec).
    Restore(snapshot::RestoreArgs),
    /// Backups of VMs to a backup target (KubeVirt's VirtualMachineBackup): take, list,
    /// delete; verify a backup folder, or restore a VM from one as a new VM.
    Backup(backup::BackupArgs),
    /// Host CPUs of the nodes, the cluster's baseline CPU model, and CPU checks.
    Cpu(cpu::CpuArgs),
    /// Print the CustomResourceDefinitions of the kinds edgevirt serves, for a Kubernetes cluster.
    Crds(k8s::CrdsArgs),
    /// Print the VMs as clean KubeVirt manifests (no status, no edgevirt-only fields), after
    /// the NetworkAttachmentDefinitions they name.
    Export(k8s::ExportArgs),
    /// Print a kubeconfig for kubectl and other Kubernetes clients.
    Kubeconfig(k8s::KubeconfigArgs),
    /// The install strategy (desired version) and the rollout of versions to nodes and VMs.
    Strategy(strategy::StrategyArgs),
    /// Failed dashboard logins and lockouts; clear them for a locked-out user (admins).
    Lockout(lockout::LockoutArgs),
    /// Per-VM launcher process (started by the agent, not by hand).
    #[command(hide = true)]
    Launcher(LauncherArgs),
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Which roles this process runs.
    #[arg(long, env = "EDGEVIRT_ROLE", value_enum)]
    role: Option<Role>,
    /// Where the database, images, volumes and logs live [default: /var/lib/edgevirt].
    #[arg(long, env = "EDGEVIRT_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Address for the API [default: 127.0.0.1:8080]. Non-loopback addresses require TLS.
    #[arg(long, env = "EDGEVIRT_LISTEN")]
    listen: Option<SocketAddr>,
    /// libvirt connection [default: qemu:///system].
    #[arg(long, env = "EDGEVIRT_LIBVIRT_URI")]
    libvirt_uri: Option<String>,
    /// Accelerator: auto (kvm where /dev/kvm works and a probe guest boots under it, else
    /// qemu), kvm, or qemu (TCG).
    #[arg(long, env = "EDGEVIRT_ACCEL", value_parser = ["auto", "kvm", "qemu"])]
    accel: Option<String>,
    /// Controller URL, https://HOST:PORT (agent role).
    #[arg(long, env = "EDGEVIRT_CONTROLLER")]
    controller: Option<String>,
    /// One-time join token from `edgevirt node token create` on the controller (agent role,
    /// first start only). It names the controller's certificate, which the agent then
    /// trusts alone; the credential it gets back is kept in DATA_DIR/agent-credential.json.
    #[arg(long, env = "EDGEVIRT_JOIN_TOKEN", hide_env_values = true)]
    join_token: Option<String>,
    /// Unused: agents trust the certificate their join token names. Kept so that older
    /// configuration files still parse.
    #[arg(long, env = "EDGEVIRT_CONTROLLER_CA", hide = true)]
    controller_ca: Option<PathBuf>,
    /// Serve HTTPS on loopback too (a self-signed certificate unless --tls-cert/--tls-key).
    /// kubectl sends tokens only over HTTPS.
    #[arg(long, env = "EDGEVIRT_TLS")]
    tls: bool,
    /// TLS certificate (PEM); with --tls-key. Generated when listening beyond loopback.
    #[arg(long, env = "EDGEVIRT_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    #[arg(long, env = "EDGEVIRT_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// This host's node name [default: the hostname].
    #[arg(long, env = "EDGEVIRT_NODE_NAME")]
    node_name: Option<String>,
    /// The libvirt NAT network for `pod` networks [default: edgevirt].
    #[arg(long, env = "EDGEVIRT_NAT_NETWORK")]
    nat_network: Option<String>,
    /// First three octets of the NAT network's /24 [default: 10.77.0].
    #[arg(long, env = "EDGEVIRT_NAT_PREFIX")]
    nat_prefix: Option<String>,
    /// Guest CPU model when a VM sets none: host-model, host-passthrough, migratable (the
    /// model every node can run) or a named libvirt model [default: host-model].
    #[arg(long, env = "EDGEVIRT_CPU_MODEL")]
    cpu_model: Option<String>,
    /// A shared storage pool this host mounts, as NAME=PATH: a filesystem every host that
    /// names it mounts (NFS, CephFS, ...). `persistentVolumeClaim` volumes are the files
    /// PATH/NAMESPACE/CLAIM.qcow2 (or .raw) there, and VMs whose disks all live there
    /// live-migrate between hosts that mount the same pool without copying them. Hosts that
    /// mount the same filesystem use the same NAME.
    #[arg(long, env = "EDGEVIRT_SHARED_POOL")]
    shared_pool: Option<String>,
    /// A backup target this host mounts, as NAME=PATH (repeat it, or separate with commas):
    /// a folder (a backup disk, an NFS share) VirtualMachineBackups naming NAME in `pvcName`
    /// are written to, as PATH/NAMESPACE/VM/FOLDER. Hosts that mount the same folder use the
    /// same NAME; a VM can be restored from the folder alone, on any host.
    #[arg(
        long = "backup-target",
        env = "EDGEVIRT_BACKUP_TARGETS",
        value_delimiter = ','
    )]
    backup_targets: Vec<String>,
    /// Seconds between copies of the controller's database to each backup target of its
    /// host (TARGET/_controller/; the newest 48 are kept) [default: 3600].
    #[arg(long, env = "EDGEVIRT_DATABASE_BACKUP_INTERVAL")]
    database_backup_interval: Option<u64>,
    /// The one folder where KubeVirt `hostDisk` volumes may live on this host (an absolute
    /// path). Unset: hostDisk volumes are refused here. A hostDisk path must be inside it;
    /// `DiskOrCreate` makes a sparse raw file of the asked capacity there.
    #[arg(long, env = "EDGEVIRT_HOST_DISK_DIR")]
    host_disk_dir: Option<PathBuf>,
    /// A registry mirror for container disks, as HOST=URL (repeat it, or separate with
    /// commas): images named `HOST/...` are pulled from URL first, then from HOST itself, as
    /// containerd's mirror setting does. `quay.io=http://10.0.0.5:5000` serves a site without
    /// internet from its own registry; an http:// URL is spoken to without TLS. Pulls go
    /// through the proxy in HTTPS_PROXY / HTTP_PROXY / NO_PROXY.
    #[arg(
        long = "registry-mirror",
        env = "EDGEVIRT_REGISTRY_MIRRORS",
        value_delimiter = ','
    )]
    registry_mirrors: Vec<String>,
    /// Seconds a container disk that no VM on this node uses stays in the cache [default: 3600].
    #[arg(long, env = "EDGEVIRT_IMAGE_GC_GRACE")]
    image_gc_grace: Option<u64>,
    /// Seconds between an agent's collections of its node's figures (domain CPU, memory,
    /// disk and network counters; host CPU, memory and disk) for /metrics and the graphs
    /// [default: 15].
    #[arg(long, env = "EDGEVIRT_STATS_INTERVAL")]
    stats_interval: Option<u64>,
    /// The IP address other hosts reach this host's agent at to send a live migration
    /// directly (TLS, with a certificate and key made for each migration and exchanged
    /// through the controller). `tunnel`: always send migrations through the controller.
    /// [default: the address of the route to the controller; none when that is loopback]
    #[arg(long, env = "EDGEVIRT_MIGRATION_ADDRESS")]
    migration_address: Option<String>,
    /// Seconds a new connection has for its TLS handshake and first request head, and a
    /// kept-alive one for a next request it began to send [default: 10].
    #[arg(long, env = "EDGEVIRT_HEADER_READ_TIMEOUT")]
    header_read_timeout: Option<u64>,
    /// Seconds a connection with no request in flight stays open, and a response may wait
    /// for the client to read it [default: 120]. Consoles and tunnels are not cut.
    #[arg(long, env = "EDGEVIRT_IDLE_TIMEOUT")]
    idle_timeout: Option<u64>,
    /// Connections at once, logged in or not [default: 16384, lowered to fit the open-file
    /// limit with 1024 files kept back].
    #[arg(long, env = "EDGEVIRT_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// Connections that have not yet carried an authenticated request (token, session or
    /// console ticket), in all [default: 1024]. When full, a newcomer evicts the oldest
    /// idle one of the address holding the most; connections of agents, logged-in users and
    /// the CLI are not counted here.
    #[arg(long, env = "EDGEVIRT_MAX_UNAUTHENTICATED")]
    max_unauthenticated: Option<usize>,
    /// Of those, per client address (an IPv6 client is its /64) [default: 128]; a newcomer
    /// past it evicts that address's oldest idle one.
    #[arg(long, env = "EDGEVIRT_MAX_UNAUTHENTICATED_PER_ADDRESS")]
    max_unauthenticated_per_address: Option<usize>,
    /// Concurrent streams on one HTTP/2 connection [default: 256].
    #[arg(long, env = "EDGEVIRT_HTTP2_MAX_STREAMS")]
    http2_max_streams: Option<u32>,
    /// Bytes of the largest WebSocket message a console, agent channel or migration tunnel
    /// accepts [default: 1048576].
    #[arg(long, env = "EDGEVIRT_WEBSOCKET_MAX_MESSAGE")]
    websocket_max_message: Option<usize>,
    /// Seconds a console ticket stays valid (tests shorten it).
    #[arg(
        long,
        env = "EDGEVIRT_CONSOLE_TICKET_TTL",
        default_value_t = 30,
        hide = true
    )]
    console_ticket_ttl: u64,
    /// TOML settings file [default: /etc/edgevirt/edgevirt.toml if it exists].
    #[arg(long, env = "EDGEVIRT_CONFIG")]
    config: Option<PathBuf>,
}

/// The `serve` keys of the TOML file (same names as the flags, with underscores).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    role: Option<Role>,
    data_dir: Option<PathBuf>,
    listen: Option<SocketAddr>,
    libvirt_uri: Option<String>,
    accel: Option<String>,
    controller: Option<String>,
    join_token: Option<String>,
    controller_ca: Option<PathBuf>,
    tls: Option<bool>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    node_name: Option<String>,
    nat_network: Option<String>,
    nat_prefix: Option<String>,
    cpu_model: Option<String>,
    shared_pool: Option<String>,
    backup_targets: Option<Vec<String>>,
    database_backup_interval: Option<u64>,
    host_disk_dir: Option<PathBuf>,
    registry_mirrors: Option<Vec<String>>,
    image_gc_grace: Option<u64>,
    stats_interval: Option<u64>,
    migration_address: Option<String>,
    header_read_timeout: Option<u64>,
    idle_timeout: Option<u64>,
    max_connections: Option<usize>,
    max_unauthenticated: Option<usize>,
    max_unauthenticated_per_address: Option<usize>,
    http2_max_streams: Option<u32>,
    websocket_max_message: Option<usize>,
}

#[derive(Args, Debug)]
struct LauncherArgs {
    #[arg(long)]
    socket: PathBuf,
    #[arg(long)]
    libvirt_uri: String,
    #[arg(long)]
    domain_name: String,
    #[arg(long)]
    vmi_uid: String,
    #[arg(long)]
    xml_file: PathBuf,
}

/// Options every client command takes.
#[derive(Args, Debug, Clone)]
pub struct ClientOpts {
    /// API URL [default: http://127.0.0.1:8080].
    #[arg(long, global = true, env = "EDGEVIRT_SERVER")]
    server: Option<String>,
    /// Bearer token.
    #[arg(long, global = true, env = "EDGEVIRT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// CA certificate (PEM) to trust for the server.
    #[arg(long, global = true, env = "EDGEVIRT_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// Do not verify the server's TLS certificate.
    #[arg(long, global = true)]
    insecure_skip_tls_verify: bool,
}

#[derive(Debug, Default, Deserialize)]
struct ClientFile {
    server: Option<String>,
    token: Option<String>,
    ca_cert: Option<PathBuf>,
}

/// Where and how a client command talks to the server, after flags, environment and file.
pub struct ClientSettings {
    pub server: String,
    pub token: String,
    pub ca_cert: Option<PathBuf>,
    pub insecure: bool,
}

impl ClientOpts {
    pub fn client(&self) -> anyhow::Result<Client> {
        let s = self.settings()?;
        Client::new(&s.server, &s.token, s.ca_cert.as_deref(), s.insecure)
    }

    pub fn settings(&self) -> anyhow::Result<ClientSettings> {
        let file: ClientFile = std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".config/edgevirt/client.toml"))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|t| toml::from_str(&t))
            .transpose()
            .context("reading ~/.config/edgevirt/client.toml")?
            .unwrap_or_default();
        let server = self
            .server
            .clone()
            .or(file.server)
            .unwrap_or_else(|| "http://127.0.0.1:8080".into());
        let token = self.token.clone().or(file.token).or_else(|| {
            std::fs::read_to_string("/var/lib/edgevirt/initial-admin")
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("token=").map(str::to_string))
                })
        });
        let token = token.context(
            "no API token: pass --token, set EDGEVIRT_TOKEN, or put token = \"...\" in \
             ~/.config/edgevirt/client.toml (the first one is in <data-dir>/initial-admin)",
        )?;
        Ok(ClientSettings {
            server,
            token,
            ca_cert: self.ca_cert.clone().or(file.ca_cert),
            insecure: self.insecure_skip_tls_verify,
        })
    }
}

fn serve_settings(a: ServeArgs) -> anyhow::Result<server::Settings> {
    let path = a.config.clone().or_else(|| {
        let p = PathBuf::from("/etc/edgevirt/edgevirt.toml");
        p.exists().then_some(p)
    });
    let f: FileSettings = match &path {
        Some(p) => toml::from_str(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )
        .with_context(|| format!("parsing {}", p.display()))?,
        None => FileSettings::default(),
    };
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
        .to_lowercase();
    let node_name = a.node_name.or(f.node_name).unwrap_or(hostname);
    let accel = a.accel.or(f.accel).unwrap_or_else(|| "auto".into());
    if !["auto", "kvm", "qemu"].contains(&accel.as_str()) {
        anyhow::bail!("accel {accel:?} is not one of auto, kvm, qemu");
    }
    crate::types::check_name("node name", &node_name)
        .map_err(|e| anyhow::anyhow!("{e}; set --node-name"))?;
    let cpu_model = a
        .cpu_model
        .or(f.cpu_model)
        .unwrap_or_else(|| crate::cpu::policy::DEFAULT_CPU_MODEL.into());
    crate::cpu::policy::check_default(&cpu_model).map_err(|e| anyhow::anyhow!("{e}"))?;
    let shared_pool = a
        .shared_pool
        .or(f.shared_pool)
        .map(|p| parse_shared_pool(&p))
        .transpose()?;
    let targets = if a.backup_targets.is_empty() {
        f.backup_targets.unwrap_or_default()
    } else {
        a.backup_targets
    };
    let mut backup_targets = vec![];
    for t in &targets {
        let (name, path) = parse_shared_pool(t).map_err(|e| {
            anyhow::anyhow!(
                "backup target: {}",
                e.to_string().replace("shared pool", "target")
            )
        })?;
        anyhow::ensure!(
            !backup_targets.iter().any(|(n, _)| *n == name),
            "backup target {name} is named twice"
        );
        backup_targets.push((name, path));
    }
    let host_disk_dir = a.host_disk_dir.or(f.host_disk_dir);
    if let Some(d) = &host_disk_dir {
        anyhow::ensure!(
            d.is_absolute(),
            "host disk folder {}: must be an absolute path",
            d.display()
        );
    }
    let mirrors = if a.registry_mirrors.is_empty() {
        f.registry_mirrors.unwrap_or_default()
    } else {
        a.registry_mirrors
    };
    let registry_mirrors =
        crate::registry::Mirrors::parse(&mirrors).map_err(|e| anyhow::anyhow!("{e}"))?;
    let migration_address = a.migration_address.or(f.migration_address);
    if let Some(m) = &migration_address {
        anyhow::ensure!(
            m == "tunnel" || m.parse::<std::net::IpAddr>().is_ok(),
            "migration address {m:?}: write an IP address, or `tunnel` to send migrations \
             through the controller"
        );
    }
    let nofile = server::raise_file_limit();
    let defaults = crate::http::conn::Limits::for_file_limit(nofile);
    let limits = crate::http::conn::Limits {
        header_read_timeout: a
            .header_read_timeout
            .or(f.header_read_timeout)
            .map_or(defaults.header_read_timeout, std::time::Duration::from_secs),
        idle_timeout: a
            .idle_timeout
            .or(f.idle_timeout)
            .map_or(defaults.idle_timeout, std::time::Duration::from_secs),
        max_connections: a
            .max_connections
            .or(f.max_connections)
            .unwrap_or(defaults.max_connections),
        max_unauthenticated: a
            .max_unauthenticated
            .or(f.max_unauthenticated)
            .unwrap_or(defaults.max_unauthenticated),
        max_unauthenticated_per_address: a
            .max_unauthenticated_per_address
            .or(f.max_unauthenticated_per_address)
            .unwrap_or(defaults.max_unauthenticated_per_address),
        http2_max_streams: a
            .http2_max_streams
            .or(f.http2_max_streams)
            .unwrap_or(defaults.http2_max_streams),
        websocket_max_message: a
            .websocket_max_message
            .or(f.websocket_max_message)
            .unwrap_or(defaults.websocket_max_message),
    };
    Ok(server::Settings {
        limits,
        nofile,
        role: a.role.or(f.role).unwrap_or(Role::All),
        data_dir: a
            .data_dir
            .or(f.data_dir)
            .unwrap_or_else(|| "/var/lib/edgevirt".into()),
        listen: a
            .listen
            .or(f.listen)
            .unwrap_or_else(|| "127.0.0.1:8080".parse().expect("valid default")),
        libvirt_uri: a
            .libvirt_uri
            .or(f.libvirt_uri)
            .unwrap_or_else(|| "qemu:///system".into()),
        accel,
        controller: a.controller.or(f.controller),
        join_token: a.join_token.or(f.join_token),
        controller_ca: a.controller_ca.or(f.controller_ca),
        tls: a.tls || f.tls.unwrap_or(false),
        tls_cert: a.tls_cert.or(f.tls_cert),
        tls_key: a.tls_key.or(f.tls_key),
        node_name,
        nat_network: a
            .nat_network
            .or(f.nat_network)
            .unwrap_or_else(|| "edgevirt".into()),
        nat_prefix: a
            .nat_prefix
            .or(f.nat_prefix)
            .unwrap_or_else(|| "10.77.0".into()),
        console_ticket_ttl: std::time::Duration::from_secs(a.console_ticket_ttl.max(1)),
        cpu_model,
        shared_pool,
        backup_targets,
        database_backup_interval: std::time::Duration::from_secs(
            a.database_backup_interval
                .or(f.database_backup_interval)
                .unwrap_or(3600)
                .max(1),
        ),
        host_disk_dir,
        registry_mirrors,
        image_gc_grace: std::time::Duration::from_secs(
            a.image_gc_grace.or(f.image_gc_grace).unwrap_or(3600),
        ),
        stats_interval: std::time::Duration::from_secs(
            a.stats_interval
                .or(f.stats_interval)
                .unwrap_or(15)
                .clamp(1, 3600),
        ),
        migration_address,
    })
}

/// `NAME=PATH`: a pool name (an RFC 1123 label) and an absolute path.
fn parse_shared_pool(s: &str) -> anyhow::Result<(String, PathBuf)> {
    let (name, path) = s
        .split_once('=')
        .with_context(|| format!("shared pool {s:?}: write it as NAME=PATH"))?;
    crate::types::check_name("shared pool name", name).map_err(|e| anyhow::anyhow!("{e}"))?;
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        anyhow::bail!("shared pool {name}: the path {path:?} must be absolute");
    }
    Ok((name.to_string(), path))
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("EDGEVIRT_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,tower_http=warn,sqlx=warn"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // colours only for a person at a terminal, not in files or the journal
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Parse the command line and run it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    // An upload keeps SIGPIPE ignored: a server that refuses it before reading the whole
    // body closes the socket, and the client must live to print the refusal.
    let uploads = matches!(&cli.command, Command::Image(a) if a.uploads())
        || matches!(&cli.command, Command::Backup(a) if a.uploads());
    if !matches!(cli.command, Command::Serve(_) | Command::Launcher(_)) && !uploads {
        // Client commands end quietly when their output pipe closes (`edgevirt crds | head`),
        // as command-line tools do, instead of panicking in `print!`.
        // SAFETY: called before any other thread exists; SIG_DFL is a valid disposition.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // A launcher runs per VM: keep it to one thread plus a few blocking ones.
    let built = if matches!(cli.command, Command::Launcher(_)) {
        tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(4)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(32)
            .enable_all()
            .build()
    };
    let rt = match built {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r: anyhow::Result<()> = rt.block_on(async move {
        match cli.command {
            Command::Serve(a) => server::run(serve_settings(*a)?).await,
            Command::Launcher(a) => {
                crate::launcher::run(crate::launcher::Config {
                    socket: a.socket,
                    libvirt_uri: a.libvirt_uri,
                    domain_name: a.domain_name,
                    vmi_uid: a.vmi_uid,
                    xml_file: a.xml_file,
                })
                .await
            }
            Command::Vm(a) => vm::run_vm(a).await,
            Command::Vmi(a) => vm::run_vmi(a).await,
            Command::Image(a) => vm::run_image(a).await,
            Command::Node(a) => node::run_node(a).await,
            Command::Cpu(a) => cpu::run(a).await,
            Command::Network(a) => network::run(a).await,
            Command::Snapshot(a) => snapshot::run(a).await,
            Command::Restore(a) => snapshot::restore(a).await,
            Command::Backup(a) => backup::run(a).await,
            Command::Crds(a) => k8s::crds(a),
            Command::Export(a) => k8s::export(a).await,
            Command::Kubeconfig(a) => k8s::kubeconfig(a),
            Command::Strategy(a) => strategy::run(a).await,
            Command::Lockout(a) => lockout::run(a).await,
        }
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every setting the shipped `edgevirt.toml` shows (commented out) is one `serve` reads,
    /// with a value of the right type: uncommented, the file parses.
    #[test]
    fn the_shipped_settings_file_names_only_real_keys() {
        let text = include_str!("../../packaging/edgevirt.toml");
        let uncommented: String = text
            .lines()
            .filter_map(|l| {
                let kv = l.strip_prefix('#')?;
                let key = kv.split_once(" = ")?.0;
                key.chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_')
                    .then(|| format!("{kv}\n"))
            })
            .collect();
        assert!(uncommented.contains("max_unauthenticated_per_address = 128"));
        let f: FileSettings =
            toml::from_str(&uncommented).unwrap_or_else(|e| panic!("{e}\nin:\n{uncommented}"));
        assert_eq!(f.header_read_timeout, Some(10));
        assert_eq!(f.websocket_max_message, Some(1 << 20));
    }
}
