//! How a separate agent gets and keeps its credential. On first start it presents the join
//! token (`ev1.<secret>.<controller certificate sha256>`) at the controller's `POST /join`,
//! trusting only the certificate the token names, and stores what it gets back in
//! `DATA_DIR/agent-credential.json` (mode 0600). Later starts use that file; the join token
//! is not needed again (and no longer valid).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::client::Client;
use crate::rules::join::parse_join_token;

pub const CREDENTIAL_FILE: &str = "agent-credential.json";

/// What the agent keeps after joining.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Credential {
    pub controller: String,
    pub node_name: String,
    pub token: String,
    /// SHA-256 (hex) of the controller's certificate: the only one this agent trusts.
    pub cert_sha256: String,
}

pub fn credential_path(data_dir: &Path) -> PathBuf {
    data_dir.join(CREDENTIAL_FILE)
}

/// The stored credential for this controller and node, or a fresh one from joining.
pub async fn credential(
    data_dir: &Path,
    controller: &str,
    node_name: &str,
    join_token: Option<&str>,
) -> anyhow::Result<Credential> {
    let controller = controller.trim_end_matches('/').to_string();
    let path = credential_path(data_dir);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let c: Credential = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a valid credential file", path.display()))?;
        if c.controller == controller && c.node_name == node_name {
            return Ok(c);
        }
        tracing::warn!(
            file = %path.display(), stored_controller = %c.controller, stored_node = %c.node_name,
            "the stored credential is for another controller or node name; joining again"
        );
    }
    let Some(token) = join_token else {
        bail!(
            "this host has not joined {controller} yet: pass --join-token (create one on the \
             controller with `edgevirt node token create`)"
        );
    };
    let Some((secret, pin)) = parse_join_token(token) else {
        bail!(
            "the join token is malformed: expected ev1.<secret>.<certificate sha256>, as \
             `edgevirt node token create` prints it"
        );
    };
    let client = Client::pinned(&controller, "", pin)?;
    let answer = client
        .post(
            "/join",
            &json!({"nodeName": node_name, "secret": secret, "version": env!("CARGO_PKG_VERSION")}),
        )
        .await
        .with_context(|| format!("joining {controller} as node {node_name:?}"))?;
    let cred = Credential {
        controller,
        node_name: node_name.to_string(),
        token: answer["credential"]
            .as_str()
            .context("the join answer has no credential")?
            .to_string(),
        cert_sha256: pin.to_ascii_lowercase(),
    };
    std::fs::create_dir_all(data_dir)?;
    crate::tls::write_private(&path, serde_json::to_string_pretty(&cred)?.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    tracing::info!(node = %node_name, controller = %cred.controller, "joined the controller");
    Ok(cred)
}
