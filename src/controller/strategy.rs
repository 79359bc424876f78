//! The install strategy and the version rollout.
//!
//! The controller keeps the desired release and the settings of each role as a manifest,
//! stored in the shape of KubeVirt's install-strategy ConfigMap: the manifest gzip-compressed
//! and base64-encoded under `data.manifests`, with the version, an identifier (a hash of
//! the manifest) and the encoding as annotations. From the nodes' reported versions and the
//! launcher version of each VMI it computes the rollout: which nodes and launchers still run
//! another release, and "rolled over" once every one runs the desired release. Pure logic
//! plus two store calls; it never restarts anything (launchers move to a new release when
//! their VM next starts).

use std::collections::BTreeMap;
use std::io::{Read, Write};

use base64::Engine;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::store::Store;
use crate::types::kubevirt::{ConditionType, Phase, condition_true};
use crate::types::{Meta, Node, VirtualMachineInstance};

/// The settings key the strategy's ConfigMap is stored under.
pub const SETTING_KEY: &str = "install-strategy";
pub const VERSION_ANNOTATION: &str = "edgevirt.io/install-strategy-version";
pub const IDENTIFIER_ANNOTATION: &str = "edgevirt.io/install-strategy-identifier";
pub const ENCODING_ANNOTATION: &str = "edgevirt.io/install-strategy-cm-encoding";
pub const STRATEGY_LABEL: &str = "edgevirt.io/install-strategy";
pub const ENCODING: &str = "gzip+base64";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the install strategy is not valid: {0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// What the install strategy says: the desired release and each role's settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The release every node and launcher should run.
    pub version: String,
    /// `controller`, `agent`, `launcher` → their settings.
    #[serde(default)]
    pub roles: BTreeMap<String, RoleSettings>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleSettings {
    /// The protocol versions this role speaks at the desired release.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protocols: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
}

impl Manifest {
    /// The manifest this build would write for its own release.
    pub fn current(settings: BTreeMap<String, BTreeMap<String, String>>) -> Manifest {
        let mut roles = BTreeMap::new();
        let agent = crate::version::AGENT_PROTOCOL.to_string();
        let launcher: Vec<String> = crate::launcher::protocol::VERSIONS
            .iter()
            .map(u32::to_string)
            .collect();
        for (role, protocols) in [
            ("controller", vec![agent.clone()]),
            ("agent", vec![agent]),
            ("launcher", launcher),
        ] {
            roles.insert(
                role.to_string(),
                RoleSettings {
                    protocols,
                    settings: settings.get(role).cloned().unwrap_or_default(),
                },
            );
        }
        Manifest {
            version: crate::version::RELEASE.to_string(),
            roles,
        }
    }

    /// The manifest as YAML: what `data.manifests` holds once decompressed.
    pub fn to_yaml(&self) -> String {
        serde_yaml_ng::to_string(self).unwrap_or_default()
    }

    /// The identifier: the first 16 hex digits of the SHA-256 of the manifest.
    pub fn identifier(&self) -> String {
        hex::encode(&Sha256::digest(self.to_yaml().as_bytes())[..8])
    }

    /// The ConfigMap holding this manifest, gzip + base64.
    pub fn to_config_map(&self) -> ConfigMap {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        // Writing into a Vec cannot fail.
        let _ = gz.write_all(self.to_yaml().as_bytes());
        let bytes = gz.finish().unwrap_or_default();
        let id = self.identifier();
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("edgevirt-install-strategy-{}", &id[..8])),
                labels: map(&[
                    (STRATEGY_LABEL, ""),
                    ("app.kubernetes.io/managed-by", "edgevirt-controller"),
                ]),
                annotations: map(&[
                    (VERSION_ANNOTATION, &self.version),
                    (IDENTIFIER_ANNOTATION, &id),
                    (ENCODING_ANNOTATION, ENCODING),
                ]),
                ..Default::default()
            },
            data: map(&[(
                "manifests",
                &base64::engine::general_purpose::STANDARD.encode(bytes),
            )]),
            ..Default::default()
        }
    }

    /// Read a manifest back from its ConfigMap (as JSON, from a file or the store): checks the
    /// encoding, the identifier and the version annotation. A ConfigMap without the encoding
    /// annotation holds plain YAML.
    pub fn from_config_map(cm: &Value) -> Result<Manifest> {
        let cm: ConfigMap = serde_json::from_value(cm.clone())
            .map_err(|e| Error::Invalid(format!("not a ConfigMap: {e}")))?;
        Self::from_typed_config_map(&cm)
    }

    /// [`Manifest::from_config_map`] for a typed ConfigMap.
    pub fn from_typed_config_map(cm: &ConfigMap) -> Result<Manifest> {
        let ann = |k: &str| cm.metadata.annotations.as_ref()?.get(k).map(String::as_str);
        let data = cm
            .data
            .as_ref()
            .and_then(|d| d.get("manifests"))
            .ok_or_else(|| Error::Invalid("data.manifests is missing".into()))?;
        let yaml = match ann(ENCODING_ANNOTATION) {
            None | Some("") => data.to_string(),
            Some(ENCODING) => {
                let gz = base64::engine::general_purpose::STANDARD
                    .decode(data.trim())
                    .map_err(|e| Error::Invalid(format!("data.manifests is not base64: {e}")))?;
                let mut out = String::new();
                flate2::read::GzDecoder::new(gz.as_slice())
                    .read_to_string(&mut out)
                    .map_err(|e| Error::Invalid(format!("data.manifests is not gzip: {e}")))?;
                out
            }
            Some(other) => {
                return Err(Error::Invalid(format!(
                    "unknown encoding {other:?} (expected {ENCODING})"
                )));
            }
        };
        let m: Manifest = serde_yaml_ng::from_str(&yaml)
            .map_err(|e| Error::Invalid(format!("the manifest: {e}")))?;
        if let Some(id) = ann(IDENTIFIER_ANNOTATION)
            && id != m.identifier()
        {
            return Err(Error::Invalid(format!(
                "identifier {id} does not match the manifest ({})",
                m.identifier()
            )));
        }
        if let Some(v) = ann(VERSION_ANNOTATION)
            && v != m.version
        {
            return Err(Error::Invalid(format!(
                "version annotation {v} does not match the manifest ({})",
                m.version
            )));
        }
        Ok(m)
    }
}

/// Whether `a` is an older release than `b` (semver; unparsable strings never are).
pub fn older(a: &str, b: &str) -> bool {
    match (semver::Version::parse(a), semver::Version::parse(b)) {
        (Ok(a), Ok(b)) => a < b,
        _ => false,
    }
}

/// Check a version an administrator asks for.
pub fn valid_version(v: &str) -> std::result::Result<(), String> {
    semver::Version::parse(v)
        .map(|_| ())
        .map_err(|e| format!("{v:?} is not a release version (like 0.2.0): {e}"))
}

/// The stored strategy, if any.
pub async fn load(store: &Store) -> Result<Option<(ConfigMap, Manifest)>> {
    let Some(text) = store.setting(SETTING_KEY).await? else {
        return Ok(None);
    };
    let cm: ConfigMap =
        serde_json::from_str(&text).map_err(|e| Error::Invalid(format!("stored: {e}")))?;
    let m = Manifest::from_typed_config_map(&cm)?;
    Ok(Some((cm, m)))
}

pub async fn save(store: &Store, m: &Manifest) -> Result<ConfigMap> {
    let cm = m.to_config_map();
    let text = serde_json::to_string(&cm).map_err(|e| Error::Invalid(e.to_string()))?;
    store.set_setting(SETTING_KEY, &text).await?;
    Ok(cm)
}

/// At controller start: write this release's strategy with the role settings given. The
/// desired version never moves back by itself: an administrator's newer target is kept.
pub async fn ensure(
    store: &Store,
    settings: BTreeMap<String, BTreeMap<String, String>>,
) -> Result<Manifest> {
    let mut m = Manifest::current(settings);
    if let Ok(Some((_, old))) = load(store).await
        && !older(&old.version, &m.version)
    {
        m.version = old.version;
    }
    save(store, &m).await?;
    Ok(m)
}

/// Change the desired version (`edgevirt strategy set-version`).
pub async fn set_version(store: &Store, version: &str) -> Result<Manifest> {
    valid_version(version).map_err(Error::Invalid)?;
    let mut m = match load(store).await? {
        Some((_, m)) => m,
        None => Manifest::current(BTreeMap::new()),
    };
    m.version = version.to_string();
    save(store, &m).await?;
    Ok(m)
}

/// One node's release.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeVersion {
    pub name: String,
    pub version: String,
    pub ready: bool,
    pub up_to_date: bool,
}

/// One running VMI's launcher release.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LauncherVersion {
    pub namespace: String,
    pub name: String,
    pub node: String,
    /// Empty when the agent has not reported it yet.
    pub version: String,
    pub up_to_date: bool,
}

/// Where the rollout to the desired version stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    pub desired_version: String,
    pub identifier: String,
    /// `RolledOver` when every node and launcher runs the desired version, else `Progressing`.
    pub state: String,
    pub nodes: Vec<NodeVersion>,
    pub launchers: Vec<LauncherVersion>,
    pub nodes_pending: usize,
    pub launchers_pending: usize,
}

pub const ROLLED_OVER: &str = "RolledOver";
pub const PROGRESSING: &str = "Progressing";

/// Compute the rollout from Node objects and VMIs (only running VMIs have launchers).
pub fn rollout(m: &Manifest, nodes: &[Node], vmis: &[VirtualMachineInstance]) -> Rollout {
    let nodes: Vec<NodeVersion> = nodes
        .iter()
        .map(|n| {
            let st = n.status.clone().unwrap_or_default();
            NodeVersion {
                name: n.name().to_string(),
                ready: condition_true(&st.conditions, &ConditionType::Ready),
                up_to_date: st.version == m.version,
                version: st.version,
            }
        })
        .collect();
    let launchers: Vec<LauncherVersion> = vmis
        .iter()
        .filter(|v| v.phase() == Phase::Running)
        .map(|v| {
            let version = v
                .status
                .as_ref()
                .and_then(|s| s.launcher_version.clone())
                .unwrap_or_default();
            LauncherVersion {
                namespace: v.namespace().into(),
                name: v.name().into(),
                node: v.node_name().unwrap_or_default().into(),
                up_to_date: version == m.version,
                version,
            }
        })
        .collect();
    let nodes_pending = nodes.iter().filter(|n| !n.up_to_date).count();
    let launchers_pending = launchers.iter().filter(|l| !l.up_to_date).count();
    Rollout {
        desired_version: m.version.clone(),
        identifier: m.identifier(),
        state: if nodes_pending + launchers_pending == 0 {
            ROLLED_OVER
        } else {
            PROGRESSING
        }
        .into(),
        nodes,
        launchers,
        nodes_pending,
        launchers_pending,
    }
}

/// The rollout as stored now.
pub async fn current_rollout(store: &Store) -> Result<Rollout> {
    let m = match load(store).await? {
        Some((_, m)) => m,
        None => Manifest::current(BTreeMap::new()),
    };
    Ok(rollout(&m, &store.all().await?, &store.all().await?))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::Typed;

    fn manifest() -> Manifest {
        let mut s = BTreeMap::new();
        s.insert(
            "agent".to_string(),
            BTreeMap::from([("accel".to_string(), "auto".to_string())]),
        );
        Manifest::current(s)
    }

    #[test]
    fn config_map_round_trip() {
        let m = manifest();
        let cm = serde_json::to_value(m.to_config_map()).unwrap();
        let ann = cm.pointer("/metadata/annotations").unwrap();
        assert_eq!(ann[ENCODING_ANNOTATION], ENCODING);
        assert_eq!(ann[VERSION_ANNOTATION], crate::version::RELEASE);
        assert_eq!(ann[IDENTIFIER_ANNOTATION], m.identifier());
        assert!(
            cm.pointer(&format!(
                "/metadata/labels/{}",
                STRATEGY_LABEL.replace('/', "~1")
            ))
            .is_some()
        );
        assert_eq!(
            (cm["apiVersion"].as_str(), cm["kind"].as_str()),
            (Some("v1"), Some("ConfigMap"))
        );
        // Really gzip: the magic bytes after base64.
        let raw = base64::engine::general_purpose::STANDARD
            .decode(cm.pointer("/data/manifests").unwrap().as_str().unwrap())
            .unwrap();
        assert_eq!(&raw[..2], &[0x1f, 0x8b]);
        let back = Manifest::from_config_map(&cm).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.roles["agent"].settings["accel"], "auto");
        assert!(!back.roles["launcher"].protocols.is_empty());
        // Plain YAML without the encoding annotation also reads (as KubeVirt allows).
        let mut plain = m.to_config_map();
        plain
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(ENCODING_ANNOTATION);
        plain.data = Some(BTreeMap::from([("manifests".to_string(), m.to_yaml())]));
        assert_eq!(Manifest::from_typed_config_map(&plain).unwrap(), m);
    }

    fn with(m: &Manifest, key: &str, value: &str) -> ConfigMap {
        let mut cm = m.to_config_map();
        if key == "manifests" {
            cm.data = Some(BTreeMap::from([(key.to_string(), value.to_string())]));
        } else {
            cm.metadata
                .annotations
                .get_or_insert_default()
                .insert(key.to_string(), value.to_string());
        }
        cm
    }

    #[test]
    fn tampered_config_maps_are_refused() {
        let m = manifest();
        let cm = with(&m, IDENTIFIER_ANNOTATION, "0000000000000000");
        let e = Manifest::from_typed_config_map(&cm)
            .unwrap_err()
            .to_string();
        assert!(e.contains("identifier"), "{e}");
        let cm = with(&m, VERSION_ANNOTATION, "9.9.9");
        assert!(
            Manifest::from_typed_config_map(&cm)
                .unwrap_err()
                .to_string()
                .contains("9.9.9")
        );
        let cm = with(&m, "manifests", "not base64!");
        assert!(
            Manifest::from_typed_config_map(&cm)
                .unwrap_err()
                .to_string()
                .contains("base64")
        );
        let cm = with(&m, ENCODING_ANNOTATION, "zstd");
        assert!(
            Manifest::from_typed_config_map(&cm)
                .unwrap_err()
                .to_string()
                .contains("zstd")
        );
        // A different manifest has a different identifier.
        let mut other = m.clone();
        other.version = "9.9.9".into();
        assert_ne!(other.identifier(), m.identifier());
    }

    fn node(name: &str, version: &str) -> Node {
        Node::from_value(json!({"metadata": {"name": name}, "spec": {}, "status": {
            "version": version, "conditions": [{"type": "Ready", "status": "True"}]}}))
        .unwrap()
    }

    fn vmi(name: &str, phase: &str, launcher: Option<&str>) -> VirtualMachineInstance {
        VirtualMachineInstance::from_value(json!({
            "metadata": {"namespace": "default", "name": name},
            "spec": {"domain": {}},
            "status": {"phase": phase, "nodeName": "a", "launcherVersion": launcher}}))
        .unwrap()
    }

    #[test]
    fn rollout_states() {
        let mut m = manifest();
        m.version = "0.2.0".into();
        let r = rollout(
            &m,
            &[node("a", "0.2.0"), node("b", "0.1.0")],
            &[
                vmi("new", "Running", Some("0.2.0")),
                vmi("old", "Running", Some("0.1.0")),
                vmi("unknown", "Running", None),
                vmi("done", "Succeeded", Some("0.1.0")),
            ],
        );
        assert_eq!(r.state, PROGRESSING);
        assert_eq!((r.nodes_pending, r.launchers_pending), (1, 2));
        assert_eq!(r.launchers.len(), 3, "only running VMIs have launchers");
        assert!(!r.nodes[1].up_to_date && r.nodes[1].version == "0.1.0");
        let done = rollout(
            &m,
            &[node("a", "0.2.0")],
            &[
                vmi("new", "Running", Some("0.2.0")),
                vmi("x", "Failed", None),
            ],
        );
        assert_eq!(done.state, ROLLED_OVER);
        assert_eq!(done.identifier, m.identifier());
        assert!(older("0.1.0", "0.2.0") && older("0.1.0-previous", "0.1.0"));
        assert!(!older("0.2.0", "0.1.0") && !older("junk", "0.1.0"));
        assert!(valid_version("0.2.0").is_ok() && valid_version("latest").is_err());
    }

    #[tokio::test]
    async fn stored_strategy_moves_forward_only_by_itself() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).await.unwrap();
        let m = ensure(&store, BTreeMap::new()).await.unwrap();
        assert_eq!(m.version, crate::version::RELEASE);
        set_version(&store, "99.0.0").await.unwrap();
        // A controller restart keeps an administrator's newer target.
        assert_eq!(
            ensure(&store, BTreeMap::new()).await.unwrap().version,
            "99.0.0"
        );
        set_version(&store, "0.0.1").await.unwrap();
        // ... but moves an older one up to its own release.
        assert_eq!(
            ensure(&store, BTreeMap::new()).await.unwrap().version,
            crate::version::RELEASE
        );
        let e = set_version(&store, "latest").await.unwrap_err().to_string();
        assert!(e.contains("latest"), "{e}");
        let (cm, loaded) = load(&store).await.unwrap().unwrap();
        assert_eq!(
            cm.metadata.annotations.unwrap()[VERSION_ANNOTATION],
            loaded.version
        );
        let r = current_rollout(&store).await.unwrap();
        assert_eq!(
            r.state, ROLLED_OVER,
            "no nodes, no launchers: nothing pending"
        );
    }
}
