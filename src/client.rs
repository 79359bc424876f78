//! A small client for edgevirt's own API, used by the CLI and by agents talking to their
//! controller. Errors carry the server's `Status` message.

use std::time::Duration;

use anyhow::{Context, bail};
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// A console websocket opened by [`Client::console`].
pub type WebSocket = tokio_tungstenite::WebSocketStream<reqwest::Upgraded>;

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    /// HTTP/1.1 only: websocket upgrades.
    http1: reqwest::Client,
    base: String,
    token: String,
    /// Set for agents: every request carries the agent protocol and release headers.
    agent: bool,
}

/// An error answer from the server: its HTTP status and `Status.message`.
#[derive(Debug, thiserror::Error)]
#[error("{message} (HTTP {code})")]
pub struct ServerError {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

impl Client {
    /// `ca_file`: PEM certificate to trust (e.g. the appliance's self-signed one);
    /// `insecure`: skip TLS verification entirely (for first contact only).
    pub fn new(
        base: &str,
        token: &str,
        ca_file: Option<&std::path::Path>,
        insecure: bool,
    ) -> anyhow::Result<Client> {
        crate::tls::install_crypto_provider();
        let pem = match ca_file {
            Some(ca) => {
                Some(std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?)
            }
            None => None,
        };
        let builder = || -> anyhow::Result<reqwest::ClientBuilder> {
            let mut b = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .pool_idle_timeout(Duration::from_secs(30));
            if let Some(pem) = &pem {
                b = b.add_root_certificate(reqwest::Certificate::from_pem(pem)?);
            }
            if insecure {
                b = b.danger_accept_invalid_certs(true);
            }
            Ok(b)
        };
        Ok(Client {
            http: builder()?.build()?,
            http1: builder()?.http1_only().build()?,
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            agent: false,
        })
    }

    /// A client that trusts only the server certificate with this SHA-256 (hex): how an
    /// agent talks to the controller it joined.
    pub fn pinned(base: &str, token: &str, pin: &str) -> anyhow::Result<Client> {
        crate::tls::install_crypto_provider();
        anyhow::ensure!(
            base.starts_with("https://"),
            "the controller URL {base:?} must be https:// (agents talk to it over TLS only)"
        );
        let builder = |alpn: &[&str]| -> anyhow::Result<reqwest::ClientBuilder> {
            Ok(reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .pool_idle_timeout(Duration::from_secs(30))
                .tls_backend_preconfigured(crate::tls::pinned_client_config(pin, alpn)?))
        };
        Ok(Client {
            http: builder(&["h2", "http/1.1"])?.build()?,
            http1: builder(&["http/1.1"])?.http1_only().build()?,
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            agent: false,
        })
    }

    /// Ask for a one-time console ticket (`kind`: `vnc` or `serial`) and open its websocket.
    pub async fn console(
        &self,
        namespace: &str,
        name: &str,
        kind: &str,
    ) -> anyhow::Result<WebSocket> {
        let t = self
            .post(
                "/console/tickets",
                &serde_json::json!({"namespace": namespace, "name": name, "kind": kind}),
            )
            .await?;
        let path = t["path"]
            .as_str()
            .context("the ticket answer has no path")?;
        self.websocket(path).await
    }

    /// Open a websocket (binary subprotocol) at `path`.
    pub async fn websocket(&self, path: &str) -> anyhow::Result<WebSocket> {
        use reqwest::header;
        let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
        let r = self
            .http1
            .get(format!("{}{}", self.base, path))
            .bearer_auth(&self.token)
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket")
            .header(header::SEC_WEBSOCKET_VERSION, "13")
            .header(header::SEC_WEBSOCKET_KEY, key)
            .header(header::SEC_WEBSOCKET_PROTOCOL, "binary")
            .send()
            .await
            .with_context(|| format!("connecting to {}", self.base))?;
        if r.status() != StatusCode::SWITCHING_PROTOCOLS {
            let code = r.status();
            let v: Value = r.json().await.unwrap_or(Value::Null);
            bail!(
                "{} (HTTP {})",
                v["message"].as_str().unwrap_or("the websocket was refused"),
                code.as_u16()
            );
        }
        let up = r.upgrade().await.context("upgrading to a websocket")?;
        Ok(tokio_tungstenite::WebSocketStream::from_raw_socket(
            up,
            tokio_tungstenite::tungstenite::protocol::Role::Client,
            None,
        )
        .await)
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// This client speaks for an agent: it sends the agent protocol version with every
    /// request, so a controller outside the skew window refuses it with a clear message.
    pub fn for_agent(mut self) -> Client {
        self.agent = true;
        self
    }

    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let r = self
            .http
            .request(method, format!("{}{}", self.base, path))
            .bearer_auth(&self.token);
        if self.agent {
            use crate::version::{AGENT_PROTOCOL, AGENT_PROTOCOL_HEADER, RELEASE, RELEASE_HEADER};
            r.header(AGENT_PROTOCOL_HEADER, AGENT_PROTOCOL.to_string())
                .header(RELEASE_HEADER, RELEASE)
        } else {
            r
        }
    }

    /// Send and decode a JSON answer, turning error statuses into [`ServerError`].
    pub async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach edgevirt at {}", self.base))?;
        let code = resp.status();
        let bytes = resp.bytes().await?;
        if !code.is_success() {
            let v: Value = serde_json::from_slice(&bytes).unwrap_or_default();
            return Err(ServerError {
                code: code.as_u16(),
                reason: v["reason"].as_str().unwrap_or("").to_string(),
                message: v["message"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned()),
            }
            .into());
        }
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).context("the server's answer is not JSON")
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.send(self.request(Method::GET, path)).await
    }

    /// GET that maps 404 to `None`.
    pub async fn get_opt(&self, path: &str) -> anyhow::Result<Option<Value>> {
        match self.get(path).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_status(&e, StatusCode::NOT_FOUND) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send(self.request(Method::POST, path).json(body)).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send(self.request(Method::PUT, path).json(body)).await
    }

    pub async fn merge_patch(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send(
            self.request(Method::PATCH, path)
                .header("content-type", "application/merge-patch+json")
                .body(serde_json::to_vec(body)?),
        )
        .await
    }

    pub async fn delete(&self, path: &str) -> anyhow::Result<Value> {
        self.send(self.request(Method::DELETE, path)).await
    }
}

/// Whether an error is a [`ServerError`] with this status.
pub fn is_status(e: &anyhow::Error, code: StatusCode) -> bool {
    e.downcast_ref::<ServerError>()
        .is_some_and(|s| s.code == code.as_u16())
}

/// Fail unless the server answered with a success.
pub fn ensure_ok(v: anyhow::Result<Value>) -> anyhow::Result<Value> {
    match v {
        Ok(v) => Ok(v),
        Err(e) => bail!(e),
    }
}
