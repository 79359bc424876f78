//! The agent's side of the launcher protocol: connect, negotiate, call. A launcher with no
//! protocol version in common is refused with [`Incompatible`].

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::protocol::{self, Envelope, Info, Request, Response, Status};

/// A launcher that shares no protocol version with this agent. The agent leaves it and its
/// domain alone: it neither replaces the launcher nor touches the VM.
#[derive(Debug, thiserror::Error)]
#[error(
    "launcher {launcher_version:?} of VMI {vmi_uid} speaks protocol versions {theirs:?}, this agent \
     ({release}) speaks {ours:?}: no common version; the VM is left as it is until one side \
     is upgraded",
    release = crate::version::RELEASE
)]
pub struct Incompatible {
    pub vmi_uid: String,
    pub launcher_version: String,
    pub theirs: Vec<u32>,
    pub ours: Vec<u32>,
}

/// Why a launcher call failed, typed from its reply. The wire carries only the message
/// (`Response::error`); the kind is derived here from the messages every released launcher
/// sends, so no protocol version changes: `domain NAME not found` (the hypervisor's
/// `NoDomain`), `protocol version N not supported` / `bad request: unknown variant` (a request
/// this launcher does not know), `libvirt: ...`, `guest agent unavailable: ...`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LauncherError {
    /// No launcher runs (or none is connected) for the instance.
    #[error("no launcher for VMI {0}")]
    NoLauncher(String),
    /// The launcher's domain is gone.
    #[error("domain {0} not found")]
    NoDomain(String),
    /// The launcher does not know the request or the protocol version.
    #[error("unsupported by the launcher: {0}")]
    Unsupported(String),
    #[error("libvirt: {0}")]
    Libvirt(String),
    #[error("guest agent unavailable: {0}")]
    AgentUnavailable(String),
    /// The socket failed, timed out or closed.
    #[error("launcher unavailable: {0}")]
    Unavailable(String),
    /// A launcher runs but shares no protocol version with this agent ([`Incompatible`]).
    #[error("{0}")]
    Incompatible(String),
    /// Any other refusal, as the launcher worded it.
    #[error("{0}")]
    Other(String),
}

impl LauncherError {
    /// The error of a launcher's refusal, from its message.
    pub fn from_reply(msg: &str) -> LauncherError {
        if let Some(name) = msg
            .strip_prefix("domain ")
            .and_then(|r| r.strip_suffix(" not found"))
        {
            return LauncherError::NoDomain(name.into());
        }
        if (msg.starts_with("protocol version ") && msg.contains("not supported"))
            || (msg.starts_with("bad request: ") && msg.contains("unknown variant"))
        {
            return LauncherError::Unsupported(msg.into());
        }
        if let Some(m) = msg.strip_prefix("libvirt: ") {
            return LauncherError::Libvirt(m.into());
        }
        if let Some(m) = msg.strip_prefix("guest agent unavailable: ") {
            return LauncherError::AgentUnavailable(m.into());
        }
        LauncherError::Other(msg.into())
    }

    /// A short stable code: `NoLauncher`, `NoDomain`, `Unsupported`, `Libvirt`,
    /// `AgentUnavailable`, `Unavailable`, `Incompatible`, `Other`.
    pub fn code(&self) -> &'static str {
        match self {
            LauncherError::NoLauncher(_) => "NoLauncher",
            LauncherError::NoDomain(_) => "NoDomain",
            LauncherError::Unsupported(_) => "Unsupported",
            LauncherError::Libvirt(_) => "Libvirt",
            LauncherError::AgentUnavailable(_) => "AgentUnavailable",
            LauncherError::Unavailable(_) => "Unavailable",
            LauncherError::Incompatible(_) => "Incompatible",
            LauncherError::Other(_) => "Other",
        }
    }
}

pub struct LauncherClient {
    reader: BufReader<tokio::net::unix::OwnedReadHalf>,
    writer: tokio::net::unix::OwnedWriteHalf,
    pub version: u32,
    pub info: Info,
}

impl LauncherClient {
    /// Connect and negotiate the protocol version.
    pub async fn connect(socket: &Path) -> anyhow::Result<LauncherClient> {
        let stream = tokio::time::timeout(Duration::from_secs(2), UnixStream::connect(socket))
            .await
            .context("connecting to launcher timed out")??;
        let (r, w) = stream.into_split();
        let mut c = LauncherClient {
            reader: BufReader::new(r),
            writer: w,
            version: protocol::VERSIONS[0],
            info: Info::default(),
        };
        let info: Info = serde_json::from_value(c.call(Request::Info).await?)?;
        let Some(v) = protocol::negotiate(&info.versions) else {
            return Err(Incompatible {
                vmi_uid: info.vmi_uid,
                launcher_version: info.launcher_version,
                theirs: info.versions,
                ours: protocol::VERSIONS.to_vec(),
            }
            .into());
        };
        c.version = v;
        c.info = info;
        Ok(c)
    }

    pub async fn call(&mut self, request: Request) -> Result<serde_json::Value, LauncherError> {
        self.call_within(request, Duration::from_secs(30)).await
    }

    /// A call that may take up to `timeout` (a migration).
    pub async fn call_within(
        &mut self,
        request: Request,
        timeout: Duration,
    ) -> Result<serde_json::Value, LauncherError> {
        let unavailable = |e: &dyn std::fmt::Display| LauncherError::Unavailable(e.to_string());
        let mut line = serde_json::to_vec(&Envelope {
            version: self.version,
            request,
        })
        .map_err(|e| unavailable(&e))?;
        line.push(b'\n');
        self.writer
            .write_all(&line)
            .await
            .map_err(|e| unavailable(&e))?;
        let mut buf = String::new();
        let n = tokio::time::timeout(timeout, self.reader.read_line(&mut buf))
            .await
            .map_err(|_| unavailable(&"launcher did not answer"))?
            .map_err(|e| unavailable(&e))?;
        if n == 0 {
            return Err(unavailable(&"launcher closed the connection"));
        }
        let resp: Response = serde_json::from_str(&buf)
            .map_err(|e| LauncherError::Other(format!("bad reply: {e}")))?;
        if !resp.ok {
            return Err(LauncherError::from_reply(
                resp.error.as_deref().unwrap_or("launcher refused"),
            ));
        }
        Ok(resp.result)
    }

    pub async fn status(&mut self) -> Result<Status, LauncherError> {
        serde_json::from_value(self.call(Request::Status).await?)
            .map_err(|e| LauncherError::Other(format!("bad status: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::LauncherError;

    #[test]
    fn refusals_are_typed_from_what_released_launchers_say() {
        // What the hypervisor errors print, as the launcher forwards them.
        let no = crate::hypervisor::Error::NoDomain("ev-default-a-1234".into()).to_string();
        assert_eq!(
            LauncherError::from_reply(&no),
            LauncherError::NoDomain("ev-default-a-1234".into())
        );
        let lv = crate::hypervisor::Error::Libvirt("operation failed".into()).to_string();
        assert_eq!(
            LauncherError::from_reply(&lv),
            LauncherError::Libvirt("operation failed".into())
        );
        let ga = crate::hypervisor::Error::AgentUnavailable("x".into()).to_string();
        assert_eq!(LauncherError::from_reply(&ga).code(), "AgentUnavailable");
        // The golden refusal of every released protocol version.
        for v in ["v1", "v2"] {
            let path = format!(
                "{}/tests/wire/{v}/response-error.json",
                env!("CARGO_MANIFEST_DIR")
            );
            let resp: crate::launcher::protocol::Response =
                serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            let e = LauncherError::from_reply(resp.error.as_deref().unwrap());
            assert_eq!(e.code(), "Unsupported", "{v}: {e}");
        }
        // A request a launcher of an older release does not know.
        let old: Result<crate::launcher::protocol::Envelope, _> =
            serde_json::from_str(r#"{"version":1,"op":"Hibernate"}"#);
        let msg = format!("bad request: {}", old.unwrap_err());
        assert_eq!(
            LauncherError::from_reply(&msg).code(),
            "Unsupported",
            "{msg}"
        );
        assert_eq!(
            LauncherError::from_reply("launcher refused"),
            LauncherError::Other("launcher refused".into())
        );
    }
}
