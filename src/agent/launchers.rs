//! The real [`Launchers`]: detached `edgevirt launcher` processes, reached over their unix
//! sockets under `run/launchers/`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::{Mutex, Notify};

use super::Config;
use super::ports::{LauncherStatus, Launchers};
use super::prepare::spawn_launcher;
use crate::launcher::client::{Incompatible, LauncherClient, LauncherError};
use crate::launcher::protocol::Request;

/// How long a started launcher may take to open its socket.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Sockets {
    cfg: Config,
    /// Wakes the sync loop when a started launcher's socket appears.
    wake: Arc<Notify>,
    /// Open connections by VMI uid.
    conns: Mutex<HashMap<String, LauncherClient>>,
    /// Launchers that exited with an error before their domain ran: uid → message.
    failed: Arc<Mutex<HashMap<String, String>>>,
    /// Launchers that share no protocol version with this agent: uid → why. Their VMs are
    /// left alone (no new launcher, no stop) until one side is upgraded.
    incompatible: Mutex<HashMap<String, String>>,
}

impl Sockets {
    pub fn new(cfg: Config, wake: Arc<Notify>) -> Sockets {
        Sockets {
            cfg,
            wake,
            conns: Mutex::new(HashMap::new()),
            failed: Arc::new(Mutex::new(HashMap::new())),
            incompatible: Mutex::new(HashMap::new()),
        }
    }

    fn dir(&self) -> PathBuf {
        self.cfg.data_dir.join("run/launchers")
    }

    fn socket(&self, uid: &str) -> PathBuf {
        crate::launcher::socket_path(&self.dir(), uid)
    }

    /// Remember (and say once) that a launcher shares no protocol version with this agent.
    async fn note_incompatible(&self, e: &Incompatible) {
        let mut map = self.incompatible.lock().await;
        if map.insert(e.vmi_uid.clone(), e.to_string()).is_none() {
            tracing::error!(vmi = %e.vmi_uid, error = %e, "refusing an incompatible launcher");
        }
    }

    async fn connect(&self, uid: &str) -> Result<LauncherClient, LauncherError> {
        let sock = self.socket(uid);
        if !sock.exists() {
            return Err(LauncherError::NoLauncher(uid.into()));
        }
        LauncherClient::connect(&sock)
            .await
            .map_err(|e| LauncherError::Unavailable(format!("{e:#}")))
    }
}

impl Launchers for Sockets {
    fn protocol_versions(&self) -> BoxFuture<'_, std::collections::BTreeMap<String, u64>> {
        Box::pin(async move {
            let mut out = std::collections::BTreeMap::new();
            for c in self.conns.lock().await.values() {
                *out.entry(c.version.to_string()).or_default() += 1;
            }
            let incompatible = self.incompatible.lock().await.len() as u64;
            if incompatible > 0 {
                out.insert("incompatible".to_string(), incompatible);
            }
            out
        })
    }

    fn start<'a>(
        &'a self,
        uid: &'a str,
        domain: &'a str,
        xml: PathBuf,
    ) -> BoxFuture<'a, Result<(), LauncherError>> {
        Box::pin(async move {
            let mut child = spawn_launcher(&self.cfg, uid, domain, &xml)
                .map_err(|e| LauncherError::Unavailable(format!("{e:#}")))?;
            // Wake the sync loop as soon as the launcher's socket appears (its domain runs).
            let sock = self.socket(uid);
            let wake = self.wake.clone();
            tokio::spawn(async move {
                let deadline = Instant::now() + START_TIMEOUT;
                while Instant::now() < deadline {
                    if sock.exists() {
                        wake.notify_one();
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            let uid = uid.to_string();
            let log = self
                .cfg
                .data_dir
                .join("log")
                .join(format!("launcher-{uid}.log"));
            let fails = self.failed.clone();
            tokio::spawn(async move {
                // Reap the launcher; remember why it failed if it did.
                if let Ok(st) = child.wait().await
                    && !st.success()
                {
                    let tail = std::fs::read_to_string(&log)
                        .ok()
                        .and_then(|t| {
                            t.lines()
                                .rev()
                                .find(|l| !l.trim().is_empty())
                                .map(str::to_string)
                        })
                        .unwrap_or_else(|| format!("launcher exited with {st}"));
                    fails.lock().await.insert(uid, tail);
                }
            });
            Ok(())
        })
    }

    fn take_failure<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move { self.failed.lock().await.remove(uid) })
    }

    fn adopt_all(&self) -> BoxFuture<'_, Vec<String>> {
        Box::pin(async move {
            let mut adopted = Vec::new();
            let Ok(mut dir) = tokio::fs::read_dir(self.dir()).await else {
                return adopted;
            };
            while let Ok(Some(e)) = dir.next_entry().await {
                let path = e.path();
                if path.extension().is_none_or(|x| x != "sock") {
                    continue;
                }
                match LauncherClient::connect(&path).await {
                    Ok(c) => {
                        tracing::info!(vmi = %c.info.vmi_uid, domain = %c.info.domain_name, pid = c.info.pid, version = c.version, "adopted launcher");
                        adopted.push(c.info.vmi_uid.clone());
                        self.conns.lock().await.insert(c.info.vmi_uid.clone(), c);
                    }
                    Err(err) => match err.downcast::<Incompatible>() {
                        // Its launcher still runs: keep the socket, leave the VM alone.
                        Ok(inc) => self.note_incompatible(&inc).await,
                        Err(err) => {
                            tracing::info!(socket = %path.display(), error = %err, "removing stale launcher socket");
                            let _ = tokio::fs::remove_file(&path).await;
                        }
                    },
                }
            }
            adopted
        })
    }

    fn status<'a>(
        &'a self,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<LauncherStatus>, LauncherError>> {
        Box::pin(async move {
            let mut map = self.conns.lock().await;
            if let Some(c) = map.get_mut(uid) {
                match c.status().await {
                    Ok(status) => {
                        return Ok(Some(LauncherStatus {
                            status,
                            launcher_version: c.info.launcher_version.clone(),
                        }));
                    }
                    Err(_) => {
                        map.remove(uid);
                    }
                }
            }
            let sock = self.socket(uid);
            if !sock.exists() {
                self.incompatible.lock().await.remove(uid);
                return Ok(None);
            }
            match LauncherClient::connect(&sock).await {
                Ok(mut c) => {
                    let s = c.status().await.ok().map(|status| LauncherStatus {
                        status,
                        launcher_version: c.info.launcher_version.clone(),
                    });
                    map.insert(uid.to_string(), c);
                    self.incompatible.lock().await.remove(uid);
                    Ok(s)
                }
                Err(e) => match e.downcast::<Incompatible>() {
                    Ok(inc) => {
                        self.note_incompatible(&inc).await;
                        Err(LauncherError::Incompatible(inc.to_string()))
                    }
                    Err(_) => Ok(None),
                },
            }
        })
    }

    fn call<'a>(&'a self, uid: &'a str, req: Request) -> BoxFuture<'a, Result<(), LauncherError>> {
        Box::pin(async move {
            let mut map = self.conns.lock().await;
            let c = map
                .get_mut(uid)
                .ok_or_else(|| LauncherError::NoLauncher(uid.into()))?;
            c.call(req).await.map(drop)
        })
    }

    fn migrate<'a>(
        &'a self,
        uid: &'a str,
        req: Request,
    ) -> BoxFuture<'a, Result<(), LauncherError>> {
        Box::pin(async move {
            let mut c = self.connect(uid).await?;
            c.call_within(req, Duration::from_secs(24 * 3600))
                .await
                .map(drop)
        })
    }

    fn abort_migration<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Result<(), LauncherError>> {
        Box::pin(async move {
            let mut c = self.connect(uid).await?;
            c.call(Request::AbortMigration).await.map(drop)
        })
    }

    fn guest_agent<'a>(
        &'a self,
        uid: &'a str,
        command: serde_json::Value,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<serde_json::Value, LauncherError>> {
        Box::pin(async move {
            let mut c = self.connect(uid).await?;
            let secs = u32::try_from(timeout.as_secs()).unwrap_or(60).max(1);
            c.call_within(
                Request::GuestAgent {
                    command,
                    timeout_secs: secs,
                },
                timeout + Duration::from_secs(5),
            )
            .await
        })
    }

    fn forget<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.conns.lock().await.remove(uid);
        })
    }
}
