//! Registry credentials as Kubernetes keeps them: the `.dockerconfigjson` of a Secret of type
//! `kubernetes.io/dockerconfigjson`, which a VM names in `containerDisk.imagePullSecret`.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Deserialize;

/// The `auths` of a docker config: registry host → credentials.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct DockerConfig {
    #[serde(default)]
    pub auths: BTreeMap<String, DockerAuth>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct DockerAuth {
    /// base64 of `user:password`.
    #[serde(default)]
    pub auth: Option<String>,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
}

/// The Secret type whose `.dockerconfigjson` key holds registry credentials.
pub const DOCKER_CONFIG_SECRET: &str = "kubernetes.io/dockerconfigjson";

impl DockerConfig {
    /// The config in a Secret's `data` (values base64, as stored): its `.dockerconfigjson`
    /// key decoded and parsed.
    pub fn from_secret_data(
        data: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<DockerConfig, String> {
        let raw = data
            .get(".dockerconfigjson")
            .and_then(serde_json::Value::as_str)
            .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
            .ok_or_else(|| {
                format!(
                    "data[\".dockerconfigjson\"]: required (base64) for type {DOCKER_CONFIG_SECRET}"
                )
            })?;
        DockerConfig::parse(&raw).map_err(|e| format!("data[\".dockerconfigjson\"]: {e}"))
    }

    /// The config of a Secret object, which must be of type `kubernetes.io/dockerconfigjson`.
    pub fn from_secret(s: &serde_json::Value) -> Result<DockerConfig, String> {
        if s["type"] != DOCKER_CONFIG_SECRET {
            return Err(format!("type is {}, not {DOCKER_CONFIG_SECRET}", s["type"]));
        }
        let empty = serde_json::Map::new();
        DockerConfig::from_secret_data(s["data"].as_object().unwrap_or(&empty))
    }

    /// Parse the bytes of a `.dockerconfigjson` key; the error says what is wrong.
    pub fn parse(data: &[u8]) -> Result<DockerConfig, String> {
        let c: DockerConfig =
            serde_json::from_slice(data).map_err(|e| format!(".dockerconfigjson: {e}"))?;
        for (host, a) in &c.auths {
            if credentials(a).is_none() {
                return Err(format!(
                    ".dockerconfigjson: auths[{host:?}] has neither a base64 `auth` of \
                     user:password nor `username` and `password`"
                ));
            }
        }
        Ok(c)
    }
}

fn credentials(a: &DockerAuth) -> Option<(String, String)> {
    if let (Some(u), Some(p)) = (&a.username, &a.password) {
        return Some((u.clone(), p.clone()));
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(a.auth.as_deref()?.trim())
        .ok()?;
    let s = String::from_utf8(raw).ok()?;
    let (u, p) = s.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

/// The credentials for a registry host. Keys are matched as the kubelet matches them: the
/// host itself, or a URL whose host is it (`https://index.docker.io/v1/` for `docker.io`).
pub fn credentials_for(c: &DockerConfig, host: &str) -> Option<(String, String)> {
    let host_of = |key: &str| -> String {
        let k = key
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        k.split('/').next().unwrap_or("").to_string()
    };
    let wanted = if host == "docker.io" {
        "index.docker.io"
    } else {
        host
    };
    c.auths
        .iter()
        .find(|(k, _)| {
            let h = host_of(k);
            h == host || h == wanted
        })
        .and_then(|(_, a)| credentials(a))
}
