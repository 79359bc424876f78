//! `edgevirt serve`: opens the store, creates the first admin on first start, and runs the
//! roles asked for (API + controller, agent, or all) until SIGTERM/SIGINT. Stopping never
//! stops a VM: launchers and QEMU are separate processes that outlive this one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio_util::sync::CancellationToken;

use crate::http::{self, AppState, auth};
use crate::store::Store;
use crate::tls;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    All,
    Controller,
    Agent,
}

/// Settings of `serve`, after flags, environment and config file are merged.
#[derive(Clone, Debug)]
pub struct Settings {
    pub role: Role,
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub libvirt_uri: String,
    pub accel: String,
    pub controller: Option<String>,
    pub join_token: Option<String>,
    pub controller_ca: Option<PathBuf>,
    pub tls: bool,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub node_name: String,
    pub nat_network: String,
    pub nat_prefix: String,
    pub console_ticket_ttl: Duration,
    /// The cluster default guest CPU model (`cpu_model`).
    pub cpu_model: String,
    /// The shared storage pool this host mounts: name and path (`shared_pool`).
    pub shared_pool: Option<(String, PathBuf)>,
    /// The backup targets this host mounts: name and path (`backup_target`).
    pub backup_targets: Vec<(String, PathBuf)>,
    /// How often the controller copies its database to those targets.
    pub database_backup_interval: Duration,
    /// The folder hostDisk volumes may live in (`host_disk_dir`).
    pub host_disk_dir: Option<PathBuf>,
    /// Registry mirrors for container disks (`registry_mirrors`).
    pub registry_mirrors: crate::registry::Mirrors,
    /// How long an unused container disk stays cached (`image_gc_grace`).
    pub image_gc_grace: Duration,
    /// How often agents send their node's figures (`stats_interval`).
    pub stats_interval: Duration,
    /// Where other agents send migrations directly (`--migration-address`).
    pub migration_address: Option<String>,
    /// The API listener's timeouts and connection caps.
    pub limits: crate::http::conn::Limits,
    /// The open-file limit in force ([`raise_file_limit`], called once, before the
    /// limits' defaults are worked out from it).
    pub nofile: u64,
}

/// What the first start writes for the administrator.
pub const INITIAL_ADMIN_FILE: &str = "initial-admin";

pub async fn run(s: Settings) -> anyhow::Result<()> {
    return_large_frees_to_the_os();
    let nofile = s.nofile;
    if s.role != Role::Agent {
        s.limits
            .check(nofile)
            .map_err(|e| anyhow::anyhow!("connection limits: {e}"))?;
        tracing::info!(
            nofile,
            max_connections = s.limits.max_connections,
            max_unauthenticated = s.limits.max_unauthenticated,
            per_address = s.limits.max_unauthenticated_per_address,
            header_read_timeout_s = s.limits.header_read_timeout.as_secs(),
            idle_timeout_s = s.limits.idle_timeout.as_secs(),
            "connection limits"
        );
    }
    tls::install_crypto_provider();
    crate::cpu::policy::set_cluster_default(&s.cpu_model);
    std::fs::create_dir_all(&s.data_dir)
        .with_context(|| format!("creating data dir {}", s.data_dir.display()))?;
    let cancel = CancellationToken::new();
    {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("installing SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
            }
            tracing::info!("signal received; shutting down (VMs keep running)");
            // Said here, before anything winds down: from a task woken by the cancel, it
            // could be lost when the runtime ends first. (A no-op without NOTIFY_SOCKET.)
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
            cancel.cancel();
        });
    }
    match s.role {
        Role::Agent => {
            let controller = s.controller.clone().context(
                "--role agent needs --controller https://HOST:PORT (and --join-token TOKEN the \
                 first time)",
            )?;
            std::fs::create_dir_all(&s.data_dir)?;
            let cred = crate::agent::join::credential(
                &s.data_dir,
                &controller,
                &s.node_name,
                s.join_token.as_deref(),
            )
            .await?;
            let mut cfg = agent_config(&s, cred.controller, cred.token, None)?;
            cfg.cert_pin = Some(cred.cert_sha256);
            systemd_notify(cancel.clone());
            crate::agent::run(cfg, cancel).await
        }
        Role::Controller | Role::All => serve_controller(s, cancel).await,
    }
}

/// Raise the soft limit of open files to the hard one (as Go programs do at start: the
/// soft 1,024 is a relic of select(2), which nothing here uses); the limit in force.
pub fn raise_file_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => {
            if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        Err(_) => 1024,
    }
}

/// glibc serves blocks of 128 KiB and more with mmap, and gives them back when freed, but
/// raises that threshold to the largest block freed so far: after one argon2 check (19 MiB)
/// or one large body, such blocks stay in the heap, and a burst of logins or uploads left
/// hundreds of MiB behind for good. A fixed threshold keeps RSS where the work left it.
fn return_large_frees_to_the_os() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator parameters; called before other threads
    // allocate much, with a valid parameter and value.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

/// Under systemd (`Type=notify`): say READY=1 now, then WATCHDOG=1 at half the watchdog
/// interval from this runtime until the cancel (STOPPING=1 is said by the signal handler in
/// `run`). Nothing without NOTIFY_SOCKET.
fn systemd_notify(cancel: CancellationToken) {
    use sd_notify::NotifyState;
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(&[NotifyState::Ready]) {
        tracing::warn!(error = %e, "sd_notify READY failed");
    }
    let every = sd_notify::watchdog_enabled().map(|d| d / 2);
    tokio::spawn(async move {
        let Some(every) = every else { return };
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tick.tick() => { let _ = sd_notify::notify(&[NotifyState::Watchdog]); }
            }
        }
    });
}

/// The settings of each role that go into the install strategy (no secrets).
fn role_settings(
    s: &Settings,
) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>> {
    let pairs = |kv: &[(&str, String)]| {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    std::collections::BTreeMap::from([
        (
            "controller".to_string(),
            pairs(&[
                ("listen", s.listen.to_string()),
                ("tls", (s.tls || !s.listen.ip().is_loopback()).to_string()),
            ]),
        ),
        (
            "agent".to_string(),
            pairs(&[
                ("accel", s.accel.clone()),
                ("libvirtUri", s.libvirt_uri.clone()),
                ("natNetwork", s.nat_network.clone()),
                ("natPrefix", s.nat_prefix.clone()),
            ]),
        ),
        (
            "launcher".to_string(),
            pairs(&[("libvirtUri", s.libvirt_uri.clone())]),
        ),
    ])
}

fn agent_config(
    s: &Settings,
    url: String,
    token: String,
    ca: Option<PathBuf>,
) -> anyhow::Result<crate::agent::Config> {
    Ok(crate::agent::Config {
        node_name: s.node_name.clone(),
        data_dir: s.data_dir.clone(),
        libvirt_uri: s.libvirt_uri.clone(),
        accel: s.accel.clone(),
        controller_url: url,
        token,
        ca_file: ca,
        cert_pin: None,
        exe: std::env::current_exe().context("finding this executable")?,
        nat_network: s.nat_network.clone(),
        nat_prefix: s.nat_prefix.clone(),
        shared_pool: s.shared_pool.clone(),
        backup_targets: s.backup_targets.clone(),
        host_disk_dir: s.host_disk_dir.clone(),
        registry_mirrors: s.registry_mirrors.clone(),
        image_gc_grace: s.image_gc_grace,
        stats_interval: s.stats_interval,
        migration_address: s.migration_address.clone(),
    })
}

async fn serve_controller(s: Settings, cancel: CancellationToken) -> anyhow::Result<()> {
    let store = Store::open(&s.data_dir.join("edgevirt.db")).await?;
    let install_id = store
        .setting_init("installId", &uuid::Uuid::new_v4().to_string())
        .await?;
    first_start(&store, &s.data_dir).await?;
    store.ensure_namespaces().await?;
    let strategy = crate::controller::strategy::ensure(&store, role_settings(&s)).await?;
    tracing::info!(version = %strategy.version, id = %strategy.identifier(), "install strategy");

    let tls_files = if s.listen.ip().is_loopback() && s.tls_cert.is_none() && !s.tls {
        None
    } else {
        match (&s.tls_cert, &s.tls_key) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            (None, None) => Some(tls::ensure_self_signed(
                &s.data_dir,
                &[
                    s.listen.ip().to_string(),
                    "127.0.0.1".into(),
                    s.node_name.clone(),
                ],
            )?),
            _ => bail!("set both tls_cert and tls_key, or neither"),
        }
    };
    let scheme = if tls_files.is_some() { "https" } else { "http" };
    let mut state = AppState::new(store.clone(), s.data_dir.clone(), install_id);
    state.tls = tls_files.is_some();
    if let Some((cert, _)) = &tls_files {
        let pem = std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
        state.cert_pin = Some(tls::pem_sha256(&pem)?);
    }
    state.console_ticket_ttl = Some(s.console_ticket_ttl);
    state.websocket_max_message = s.limits.websocket_max_message;
    let conns = crate::http::conn::Tracker::new(s.limits.clone());
    let bursts = state.bursts.clone();
    if s.role == Role::All {
        state.local_node = Some(http::LocalNode {
            name: s.node_name.clone(),
            data_dir: s.data_dir.clone(),
        });
    }
    let app = crate::shell::router(state).layer(tower_http::trace::TraceLayer::new_for_http());

    let listener = crate::shell::listen::bind(s.listen)?;
    let local = listener.local_addr()?;
    println!(
        "edgevirt {} ({:?} role) serving the API on {scheme}://{local}",
        crate::version::RELEASE,
        s.role
    );
    if s.role != Role::Agent {
        println!("dashboard: {scheme}://{local}/ui/ (log in as admin)");
    }
    println!(
        "first admin credentials: {}",
        s.data_dir.join(INITIAL_ADMIN_FILE).display()
    );

    let mut tasks = tokio::task::JoinSet::new();
    {
        let store = store.clone();
        let cancel = cancel.clone();
        tasks.spawn(async move { crate::controller::run(store, cancel).await });
    }
    {
        let (store, dir, targets) = (store.clone(), s.data_dir.clone(), s.backup_targets.clone());
        let (every, cancel) = (s.database_backup_interval, cancel.clone());
        tasks.spawn(async move {
            crate::controller::dbbackup::run(store, dir, targets, every, 48, cancel).await;
            Ok(())
        });
    }
    if s.role == Role::All {
        let token = local_agent_token(&store, &s.data_dir).await?;
        let host = if local.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            local.ip().to_string()
        };
        let url = format!(
            "{scheme}://{}",
            SocketAddr::new(host.parse()?, local.port())
        );
        let ca = tls_files.as_ref().map(|(c, _)| c.clone());
        let cfg = agent_config(&s, url, token, ca)?;
        let cancel = cancel.clone();
        tasks.spawn(async move { crate::agent::run(cfg, cancel).await });
    }
    {
        let tls = tls_files
            .as_ref()
            .map(|(cert, key)| tls::server_config(cert, key))
            .transpose()?;
        let (tracker, bursts, cancel) = (conns, bursts, cancel.clone());
        tasks.spawn(async move {
            crate::shell::listen::serve(listener, app, tls, tracker, bursts, cancel).await
        });
    }
    systemd_notify(cancel.clone());
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                cancel.cancel();
                return Err(e);
            }
            Err(e) => {
                cancel.cancel();
                bail!("a role task failed: {e}");
            }
        }
    }
    Ok(())
}

/// Create the `admin` user and an admin token on first start; write them to a 0600 file.
async fn first_start(store: &Store, data_dir: &Path) -> anyhow::Result<()> {
    let password = auth::random_secret(12);
    if !store
        .create_user("admin", &auth::hash_password(&password), "admin")
        .await?
    {
        return Ok(());
    }
    let token = auth::random_secret(24);
    store
        .add_token(
            &auth::token_hash(&token),
            "admin",
            "admin",
            "initial admin token",
        )
        .await?;
    let path = data_dir.join(INITIAL_ADMIN_FILE);
    tls::write_private(
        &path,
        format!("username=admin\npassword={password}\ntoken={token}\n").as_bytes(),
    )?;
    println!(
        "created user admin; its password and API token are in {} (mode 0600)",
        path.display()
    );
    Ok(())
}

/// The token the built-in agent uses in the all-in-one role, created once.
async fn local_agent_token(store: &Store, data_dir: &Path) -> anyhow::Result<String> {
    let path = data_dir.join("agent-token");
    if let Ok(t) = std::fs::read_to_string(&path)
        && store.token(&auth::token_hash(t.trim())).await?.is_some()
    {
        return Ok(t.trim().to_string());
    }
    let token = auth::random_secret(24);
    store
        .add_token(
            &auth::token_hash(&token),
            "local-agent",
            "agent",
            "built-in agent",
        )
        .await?;
    tls::write_private(&path, token.as_bytes())?;
    Ok(token)
}
