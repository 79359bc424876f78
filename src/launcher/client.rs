//! The agent's side of the launcher protocol: connect, negotiate, call. A launcher with no
//! protocol version in common is refused with [`Incompatible`].

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
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

    pub async fn call(&mut self, request: Request) -> anyhow::Result<serde_json::Value> {
        self.call_within(request, Duration::from_secs(30)).await
    }

    /// A call that may take up to `timeout` (a migration).
    pub async fn call_within(
        &mut self,
        request: Request,
        timeout: Duration,
    ) -> anyhow::Result<serde_json::Value> {
        let mut line = serde_json::to_vec(&Envelope {
            version: self.version,
            request,
        })?;
        line.push(b'\n');
        self.writer.write_all(&line).await?;
        let mut buf = String::new();
        let n = tokio::time::timeout(timeout, self.reader.read_line(&mut buf))
            .await
            .context("launcher did not answer")??;
        if n == 0 {
            bail!("launcher closed the connection");
        }
        let resp: Response = serde_json::from_str(&buf)?;
        if !resp.ok {
            bail!(resp.error.unwrap_or_else(|| "launcher refused".into()));
        }
        Ok(resp.result)
    }

    pub async fn status(&mut self) -> anyhow::Result<Status> {
        Ok(serde_json::from_value(self.call(Request::Status).await?)?)
    }
}
