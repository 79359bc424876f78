//! Debian's Prometheus on loopback, scraping an appliance with the example configuration
//! edgevirt ships (`packaging/prometheus/`): its rules loaded, its target, token file and
//! TLS settings pointed at the appliance, and a one-second interval so a test sees samples
//! quickly. Killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::wait_for;

/// `packaging/prometheus/` of this checkout.
pub fn packaging_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("packaging")
        .join("prometheus")
}

pub struct Prometheus {
    child: Child,
    pub url: String,
    pub dir: PathBuf,
}

impl Prometheus {
    /// Start it in `dir`, scraping `appliance_url` (`http://` or `https://HOST:PORT`) with
    /// `token`.
    pub async fn start(dir: &Path, appliance_url: &str, token: &str) -> Prometheus {
        std::fs::create_dir_all(dir).unwrap();
        let token_file = dir.join("edgevirt.token");
        std::fs::write(&token_file, token).unwrap();
        std::fs::copy(
            packaging_dir().join("edgevirt-rules.yml"),
            dir.join("edgevirt-rules.yml"),
        )
        .unwrap();
        let shipped = std::fs::read_to_string(packaging_dir().join("prometheus.yml")).unwrap();
        let mut cfg: serde_yaml_ng::Value = serde_yaml_ng::from_str(&shipped).unwrap();
        cfg["global"]["scrape_interval"] = "1s".into();
        cfg["global"]["evaluation_interval"] = "1s".into();
        let job = &mut cfg["scrape_configs"][0];
        let (scheme, host) = appliance_url.split_once("://").unwrap();
        job["scheme"] = scheme.into();
        job["authorization"]["credentials_file"] = token_file.to_string_lossy().as_ref().into();
        // The appliance's certificate is self-signed for a test directory.
        job["tls_config"] = serde_yaml_ng::from_str("{insecure_skip_verify: true}").unwrap();
        job["static_configs"][0]["targets"][0] = host.trim_end_matches('/').into();
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, serde_yaml_ng::to_string(&cfg).unwrap()).unwrap();
        let check = Command::new("promtool")
            .args(["check", "config"])
            .arg(&config)
            .output()
            .expect("promtool (Debian's prometheus package)");
        assert!(
            check.status.success(),
            "promtool check config: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        // A free port: the kernel's pick, released for Prometheus to take.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian's prometheus package)");
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir: dir.to_path_buf(),
        };
        let http = reqwest::Client::new();
        let ready = format!("{}/-/ready", p.url);
        wait_for(
            "Prometheus to be ready",
            Duration::from_secs(60),
            || async {
                let r = http.get(&ready).send().await.ok()?;
                r.status().is_success().then_some(())
            },
        )
        .await;
        p
    }

    /// A GET of Prometheus' HTTP API, its JSON answer.
    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        reqwest::Client::new()
            .get(format!("{}{path}", self.url))
            .query(query)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// An instant query: each series' labels and value.
    pub async fn query(&self, q: &str) -> Vec<(Value, f64)> {
        let v = self.api("/api/v1/query", &[("query", q)]).await;
        assert_eq!(v["status"], "success", "query {q}: {v}");
        v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let value = r["value"][1].as_str().and_then(|s| s.parse().ok());
                (r["metric"].clone(), value.unwrap_or(f64::NAN))
            })
            .collect()
    }

    /// The one value of a query that selects one series, once there is one.
    pub async fn value(&self, q: &str) -> f64 {
        wait_for(
            &format!("a sample of {q}"),
            Duration::from_secs(60),
            || async {
                match self.query(q).await.as_slice() {
                    [(_, v)] if v.is_finite() => Some(*v),
                    _ => None,
                }
            },
        )
        .await
    }

    /// The state of the scrape target and its last error, as Prometheus sees them.
    pub async fn target_health(&self) -> (String, String) {
        let v = self.api("/api/v1/targets", &[]).await;
        let t = &v["data"]["activeTargets"][0];
        (
            t["health"].as_str().unwrap_or("").to_string(),
            t["lastError"].as_str().unwrap_or("").to_string(),
        )
    }

    /// Alerting and recording rules Prometheus loaded.
    pub async fn rule_names(&self) -> Vec<String> {
        let v = self.api("/api/v1/rules", &[]).await;
        v["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .filter_map(|r| r["name"].as_str().map(str::to_string))
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
