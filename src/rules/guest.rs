//! What the node agent does inside a running guest on the VMI's behalf, as rules: KubeVirt's
//! readiness and liveness probes (their actions, Kubernetes' timings and thresholds) and its
//! access credentials (SSH keys and passwords from Secrets, through cloud-init or the guest
//! agent). The API checks specs with [`validate`]; the agent runs what these functions decide.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::types::Invalid;
use crate::types::kubevirt::{AccessCredential, IntOrString, Probe, VirtualMachineInstanceSpec};

/// What a probe does, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeAction {
    /// The guest agent answers a ping.
    GuestAgentPing,
    /// A command the guest agent runs; success is exit status 0.
    Exec(Vec<String>),
    /// A TCP connection to `host` (the guest's address when unset) and `port` is accepted.
    Tcp { host: Option<String>, port: u16 },
    /// An HTTP GET answered 200..=399.
    Http {
        host: Option<String>,
        port: u16,
        path: String,
        https: bool,
        headers: Vec<(String, String)>,
    },
}

/// A probe's timings, with Kubernetes' defaults and minimums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeTiming {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

fn port(p: &IntOrString, at: &str) -> Result<u16, Invalid> {
    match p {
        IntOrString::Int(n) if (1..=65535).contains(n) => Ok(*n as u16),
        IntOrString::Int(n) => Err(Invalid(format!("{at}.port: {n} is not a port (1-65535)"))),
        IntOrString::String(s) => Err(Invalid(format!(
            "{at}.port: {s:?}: a named port is a container's; a VM's probe names its port by \
             number"
        ))),
    }
}

fn host(h: &Option<String>, at: &str) -> Result<Option<String>, Invalid> {
    match h.as_deref() {
        None | Some("") => Ok(None),
        Some(h) if h.len() <= 253 && h.parse::<std::net::IpAddr>().is_ok() => Ok(Some(h.into())),
        Some(h) => Err(Invalid(format!(
            "{at}.host: {h:?} is not an IP address (leave it out to probe the guest's address)"
        ))),
    }
}

impl ProbeAction {
    /// The one action of `p` (at `at`, e.g. `spec.readinessProbe`).
    pub fn of(p: &Probe, at: &str) -> Result<ProbeAction, Invalid> {
        let set = [
            p.guest_agent_ping.is_some(),
            p.exec.is_some(),
            p.tcp_socket.is_some(),
            p.http_get.is_some(),
        ];
        if set.iter().filter(|s| **s).count() != 1 {
            return Err(Invalid(format!(
                "{at}: exactly one of guestAgentPing, exec, tcpSocket and httpGet is required"
            )));
        }
        if p.guest_agent_ping.is_some() {
            return Ok(ProbeAction::GuestAgentPing);
        }
        if let Some(e) = &p.exec {
            if e.command.is_empty() || e.command[0].is_empty() {
                return Err(Invalid(format!(
                    "{at}.exec.command: a command (its program first) is required"
                )));
            }
            if e.command.len() > 64 || e.command.iter().map(String::len).sum::<usize>() > 4096 {
                return Err(Invalid(format!(
                    "{at}.exec.command: at most 64 words and 4096 bytes"
                )));
            }
            return Ok(ProbeAction::Exec(e.command.clone()));
        }
        if let Some(t) = &p.tcp_socket {
            let at = format!("{at}.tcpSocket");
            return Ok(ProbeAction::Tcp {
                host: host(&t.host, &at)?,
                port: port(&t.port, &at)?,
            });
        }
        let h = p.http_get.as_ref().expect("one action is set");
        let at = format!("{at}.httpGet");
        let https = match h.scheme.as_deref() {
            None | Some("HTTP") => false,
            Some("HTTPS") => true,
            Some(s) => {
                return Err(Invalid(format!(
                    "{at}.scheme: {s:?}: HTTP or HTTPS (upper case, as Kubernetes)"
                )));
            }
        };
        let path = h.path.clone().unwrap_or_else(|| "/".into());
        if !path.starts_with('/') || path.len() > 2048 || path.chars().any(char::is_control) {
            return Err(Invalid(format!(
                "{at}.path: {path:?}: an absolute URL path of at most 2048 bytes"
            )));
        }
        let mut headers = Vec::new();
        for (i, hd) in h.http_headers.iter().enumerate() {
            let ok_name = !hd.name.is_empty()
                && hd.name.len() <= 256
                && hd
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
            if !ok_name || hd.value.len() > 4096 || hd.value.chars().any(char::is_control) {
                return Err(Invalid(format!(
                    "{at}.httpHeaders[{i}]: {:?} is not a header this probe can send",
                    hd.name
                )));
            }
            headers.push((hd.name.clone(), hd.value.clone()));
        }
        Ok(ProbeAction::Http {
            host: host(&h.host, &at)?,
            port: port(&h.port, &at)?,
            path,
            https,
            headers,
        })
    }
}

impl ProbeTiming {
    /// Kubernetes' defaults (0 s delay, every 10 s, 1 s timeout, 1 success, 3 failures) and
    /// limits; a liveness probe's success threshold must be 1.
    pub fn of(p: &Probe, at: &str, liveness: bool) -> Result<ProbeTiming, Invalid> {
        let secs = |v: Option<i32>, field: &str, default: u32, min: u32| match v {
            None => Ok(default),
            Some(n) if n >= min as i32 && n <= 86_400 => Ok(n as u32),
            Some(n) => Err(Invalid(format!(
                "{at}.{field}: {n} is out of range ({min} to 86400)"
            ))),
        };
        let t = ProbeTiming {
            initial_delay: Duration::from_secs(
                secs(p.initial_delay_seconds, "initialDelaySeconds", 0, 0)?.into(),
            ),
            period: Duration::from_secs(secs(p.period_seconds, "periodSeconds", 10, 1)?.into()),
            timeout: Duration::from_secs(secs(p.timeout_seconds, "timeoutSeconds", 1, 1)?.into()),
            success_threshold: secs(p.success_threshold, "successThreshold", 1, 1)?,
            failure_threshold: secs(p.failure_threshold, "failureThreshold", 3, 1)?,
        };
        if liveness && t.success_threshold != 1 {
            return Err(Invalid(format!(
                "{at}.successThreshold: must be 1 for a liveness probe"
            )));
        }
        Ok(t)
    }
}

/// One probe of one running instance: when it is due, and what its results add up to.
#[derive(Clone, Debug)]
pub struct ProbeState {
    pub timing: ProbeTiming,
    started: Instant,
    last: Option<Instant>,
    successes: u32,
    failures: u32,
    /// The outcome so far: `None` until the thresholds decide either way.
    pub passing: Option<bool>,
    /// What the last run said (why it failed).
    pub message: String,
}

impl ProbeState {
    pub fn new(timing: ProbeTiming, started: Instant) -> ProbeState {
        ProbeState {
            timing,
            started,
            last: None,
            successes: 0,
            failures: 0,
            passing: None,
            message: String::new(),
        }
    }

    /// Whether a run is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.started + self.timing.initial_delay
            && self.last.is_none_or(|l| now >= l + self.timing.period)
    }

    /// Count one run's result; the outcome flips after `successThreshold` successes or
    /// `failureThreshold` failures in a row.
    pub fn record(&mut self, ok: bool, message: String, now: Instant) {
        self.last = Some(now);
        self.message = message;
        if ok {
            self.successes += 1;
            self.failures = 0;
            if self.successes >= self.timing.success_threshold {
                self.passing = Some(true);
            }
        } else {
            self.failures += 1;
            self.successes = 0;
            if self.failures >= self.timing.failure_threshold {
                self.passing = Some(false);
            }
        }
    }
}

/// Check what a VMI spec asks of the guest: its probes, access credentials and hostname.
pub fn validate(spec: &VirtualMachineInstanceSpec) -> Result<(), Invalid> {
    for (p, at, liveness) in [
        (&spec.readiness_probe, "spec.readinessProbe", false),
        (&spec.liveness_probe, "spec.livenessProbe", true),
    ] {
        if let Some(p) = p {
            ProbeAction::of(p, at)?;
            ProbeTiming::of(p, at, liveness)?;
        }
    }
    for (i, c) in spec.access_credentials.iter().enumerate() {
        check_credential(spec, c, &format!("spec.accessCredentials[{i}]"))?;
    }
    for (field, v) in [("hostname", &spec.hostname), ("subdomain", &spec.subdomain)] {
        if let Some(v) = v {
            crate::types::check_name(&format!("spec.{field}"), v)?;
        }
    }
    Ok(())
}

fn check_credential(
    spec: &VirtualMachineInstanceSpec,
    c: &AccessCredential,
    at: &str,
) -> Result<(), Invalid> {
    let secret = |s: &crate::types::kubevirt::AccessCredentialSource, at: &str| {
        let name = s.secret.as_ref().map(|s| s.secret_name.as_str());
        match name {
            Some(n) => crate::types::check_subdomain_name(&format!("{at}.source.secret"), n),
            None => Err(Invalid(format!("{at}.source.secret.secretName: required"))),
        }
    };
    match (&c.ssh_public_key, &c.user_password) {
        (Some(k), None) => {
            let at = format!("{at}.sshPublicKey");
            secret(&k.source, &at)?;
            let m = &k.propagation_method;
            let n = [
                m.no_cloud.is_some(),
                m.config_drive.is_some(),
                m.qemu_guest_agent.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if n != 1 {
                return Err(Invalid(format!(
                    "{at}.propagationMethod: exactly one of noCloud, configDrive and \
                     qemuGuestAgent is required"
                )));
            }
            if m.no_cloud.is_some() && !spec.volumes.iter().any(|v| v.cloud_init_no_cloud.is_some())
            {
                return Err(Invalid(format!(
                    "{at}.propagationMethod.noCloud: the VMI has no cloudInitNoCloud volume to \
                     carry the keys"
                )));
            }
            if m.config_drive.is_some()
                && !spec
                    .volumes
                    .iter()
                    .any(|v| v.cloud_init_config_drive.is_some())
            {
                return Err(Invalid(format!(
                    "{at}.propagationMethod.configDrive: the VMI has no cloudInitConfigDrive \
                     volume to carry the keys"
                )));
            }
            if let Some(g) = &m.qemu_guest_agent {
                check_users(
                    &g.users,
                    &format!("{at}.propagationMethod.qemuGuestAgent.users"),
                )?;
            }
        }
        (None, Some(p)) => {
            let at = format!("{at}.userPassword");
            secret(&p.source, &at)?;
            if p.propagation_method.qemu_guest_agent.is_none() {
                return Err(Invalid(format!(
                    "{at}.propagationMethod.qemuGuestAgent: required (the only method)"
                )));
            }
        }
        _ => {
            return Err(Invalid(format!(
                "{at}: exactly one of sshPublicKey and userPassword is required"
            )));
        }
    }
    Ok(())
}

/// A guest user name: what `useradd` takes (no path or shell metacharacters).
pub fn check_user(u: &str, at: &str) -> Result<(), Invalid> {
    let ok = !u.is_empty()
        && u.len() <= 32
        && !u.starts_with('-')
        && u.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-$".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Invalid(format!("{at}: {u:?} is not a user name")))
    }
}

fn check_users(users: &[String], at: &str) -> Result<(), Invalid> {
    if users.is_empty() {
        return Err(Invalid(format!("{at}: at least one user is required")));
    }
    for (i, u) in users.iter().enumerate() {
        check_user(u, &format!("{at}[{i}]"))?;
    }
    Ok(())
}

/// The SSH keys a Secret holds: every value, one key per line, blank lines and comments
/// left out, in the order of the Secret's keys (as KubeVirt reads them).
pub fn authorized_keys(data: &BTreeMap<String, Vec<u8>>) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for v in data.values() {
        for line in String::from_utf8_lossy(v).lines() {
            let line = line.trim();
            if !line.is_empty() && !line.starts_with('#') && !keys.iter().any(|k| k == line) {
                keys.push(line.to_string());
            }
        }
    }
    keys
}

/// Cloud-init user data with `keys` added to its `ssh_authorized_keys`: new `#cloud-config`
/// when there was none, the keys appended when it is `#cloud-config`. Other user data (a
/// script, MIME parts) cannot carry them and is refused.
pub fn user_data_with_keys(user_data: &str, keys: &[String]) -> Result<String, Invalid> {
    use serde_yaml_ng::{Mapping, Value};
    if keys.is_empty() {
        return Ok(user_data.to_string());
    }
    let mut doc = if user_data.trim().is_empty() {
        Mapping::new()
    } else if user_data.starts_with("#cloud-config") {
        match serde_yaml_ng::from_str::<Value>(user_data) {
            Ok(Value::Mapping(m)) => m,
            Ok(Value::Null) => Mapping::new(),
            Ok(_) | Err(_) => {
                return Err(Invalid(
                    "the cloud-init user data is not a #cloud-config mapping, so the SSH keys of \
                     accessCredentials cannot be added to it"
                        .into(),
                ));
            }
        }
    } else {
        return Err(Invalid(
            "the cloud-init user data is not #cloud-config (a script or MIME parts?), so the SSH \
             keys of accessCredentials (noCloud) cannot be added to it"
                .into(),
        ));
    };
    let field = Value::String("ssh_authorized_keys".into());
    let mut list = match doc.remove(&field) {
        Some(Value::Sequence(s)) => s,
        None | Some(Value::Null) => Vec::new(),
        Some(_) => {
            return Err(Invalid(
                "ssh_authorized_keys in the cloud-init user data is not a list".into(),
            ));
        }
    };
    for k in keys {
        let k = Value::String(k.clone());
        if !list.contains(&k) {
            list.push(k);
        }
    }
    doc.insert(field, Value::Sequence(list));
    let body = serde_yaml_ng::to_string(&Value::Mapping(doc))
        .map_err(|e| Invalid(format!("writing the cloud-init user data: {e}")))?;
    Ok(format!("#cloud-config\n{body}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(v: serde_json::Value) -> VirtualMachineInstanceSpec {
        let mut v = v;
        v["domain"] = json!({"devices": {}});
        serde_json::from_value(v).unwrap()
    }

    fn err(v: serde_json::Value) -> String {
        validate(&spec(v)).unwrap_err().0
    }

    #[test]
    fn probes_take_one_action_and_kubernetes_timings() {
        let p: Probe = serde_json::from_value(json!({"guestAgentPing": {}})).unwrap();
        assert_eq!(
            ProbeAction::of(&p, "p").unwrap(),
            ProbeAction::GuestAgentPing
        );
        let t = ProbeTiming::of(&p, "p", true).unwrap();
        assert_eq!(
            (t.initial_delay, t.period, t.timeout),
            (
                Duration::ZERO,
                Duration::from_secs(10),
                Duration::from_secs(1)
            )
        );
        assert_eq!((t.success_threshold, t.failure_threshold), (1, 3));
        let p: Probe =
            serde_json::from_value(json!({"httpGet": {"port": 8080, "scheme": "HTTPS"}})).unwrap();
        assert!(matches!(
            ProbeAction::of(&p, "p").unwrap(),
            ProbeAction::Http { port: 8080, https: true, ref path, .. } if path == "/"
        ));
        assert!(
            err(json!({"readinessProbe": {"guestAgentPing": {}, "tcpSocket": {"port": 22}}}))
                .contains("exactly one of")
        );
        assert!(err(json!({"readinessProbe": {}})).contains("exactly one of"));
        assert!(
            err(json!({"livenessProbe": {"tcpSocket": {"port": "ssh"}}})).contains("named port")
        );
        assert!(err(json!({"livenessProbe": {"tcpSocket": {"port": 70000}}})).contains("1-65535"));
        assert!(
            err(json!({"livenessProbe": {"guestAgentPing": {}, "successThreshold": 2}}))
                .contains("must be 1")
        );
        assert!(
            err(json!({"readinessProbe": {"guestAgentPing": {}, "periodSeconds": 0}}))
                .contains("periodSeconds")
        );
        assert!(err(json!({"readinessProbe": {"exec": {"command": []}}})).contains("exec.command"));
        assert!(
            err(json!({"readinessProbe": {"httpGet": {"port": 80, "scheme": "ftp"}}}))
                .contains("scheme")
        );
        assert!(
            err(json!({"readinessProbe": {"tcpSocket": {"port": 80, "host": "x; rm"}}}))
                .contains("not an IP address")
        );
        validate(&spec(json!({
            "readinessProbe": {"httpGet": {"port": 80, "path": "/healthz",
                "httpHeaders": [{"name": "X-Probe", "value": "1"}]}},
            "livenessProbe": {"exec": {"command": ["true"]}, "initialDelaySeconds": 30}
        })))
        .unwrap();
    }

    #[test]
    fn a_probe_flips_after_its_thresholds_and_runs_on_its_period() {
        let t0 = Instant::now();
        let timing = ProbeTiming {
            initial_delay: Duration::from_secs(5),
            period: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
            success_threshold: 2,
            failure_threshold: 3,
        };
        let mut p = ProbeState::new(timing, t0);
        assert!(!p.due(t0), "not before the initial delay");
        let at = |s| t0 + Duration::from_secs(s);
        assert!(p.due(at(5)));
        p.record(true, String::new(), at(5));
        assert_eq!(p.passing, None, "one success of two");
        assert!(!p.due(at(14)) && p.due(at(15)));
        p.record(true, String::new(), at(15));
        assert_eq!(p.passing, Some(true));
        p.record(false, "refused".into(), at(25));
        p.record(false, "refused".into(), at(35));
        assert_eq!(p.passing, Some(true), "two failures of three");
        p.record(false, "refused".into(), at(45));
        assert_eq!(p.passing, Some(false));
        assert_eq!(p.message, "refused");
        p.record(true, String::new(), at(55));
        assert_eq!(p.passing, Some(false), "one success does not undo it");
    }

    #[test]
    fn access_credentials_name_their_secret_and_one_method() {
        let ssh = |m: serde_json::Value| {
            json!({"accessCredentials": [{"sshPublicKey": {
                "source": {"secret": {"secretName": "my-keys"}}, "propagationMethod": m}}]})
        };
        validate(&spec(ssh(
            json!({"qemuGuestAgent": {"users": ["root", "fedora"]}}),
        )))
        .unwrap();
        assert!(err(ssh(json!({"noCloud": {}}))).contains("no cloudInitNoCloud volume"));
        let mut with_ci = ssh(json!({"noCloud": {}}));
        with_ci["volumes"] =
            json!([{"name": "ci", "cloudInitNoCloud": {"userData": "#cloud-config\n"}}]);
        validate(&spec(with_ci)).unwrap();
        assert!(err(ssh(json!({"configDrive": {}}))).contains("no cloudInitConfigDrive volume"));
        let mut with_cd = ssh(json!({"configDrive": {}}));
        with_cd["volumes"] =
            json!([{"name": "cd", "cloudInitConfigDrive": {"userData": "#cloud-config\n"}}]);
        validate(&spec(with_cd)).unwrap();
        assert!(err(ssh(json!({}))).contains("exactly one of noCloud"));
        assert!(
            err(ssh(json!({"qemuGuestAgent": {"users": ["../etc"]}}))).contains("not a user name")
        );
        assert!(err(ssh(json!({"qemuGuestAgent": {"users": []}}))).contains("at least one"));
        assert!(err(json!({"accessCredentials": [{}]})).contains("exactly one of sshPublicKey"));
        assert!(
            err(json!({"accessCredentials": [{"userPassword": {
                "source": {"secret": {"secretName": "Bad_Name"}},
                "propagationMethod": {"qemuGuestAgent": {}}}}]}))
            .contains("secret")
        );
        assert!(err(json!({"hostname": "not_a_label"})).contains("spec.hostname"));
    }

    #[test]
    fn keys_join_cloud_config_user_data() {
        let data = BTreeMap::from([
            (
                "a".to_string(),
                b"ssh-ed25519 AAAA one\n\n# note\n".to_vec(),
            ),
            (
                "b".to_string(),
                b"ssh-rsa BBBB two\nssh-ed25519 AAAA one\n".to_vec(),
            ),
        ]);
        let keys = authorized_keys(&data);
        assert_eq!(keys, ["ssh-ed25519 AAAA one", "ssh-rsa BBBB two"]);
        let fresh = user_data_with_keys("", &keys).unwrap();
        assert!(fresh.starts_with("#cloud-config\n"), "{fresh}");
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&fresh).unwrap();
        assert_eq!(
            v["ssh_authorized_keys"][1].as_str(),
            Some("ssh-rsa BBBB two")
        );
        let merged = user_data_with_keys(
            "#cloud-config\nhostname: x\nssh_authorized_keys:\n  - ssh-ed25519 CCCC mine\n",
            &keys,
        )
        .unwrap();
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&merged).unwrap();
        assert_eq!(v["hostname"].as_str(), Some("x"));
        assert_eq!(v["ssh_authorized_keys"].as_sequence().unwrap().len(), 3);
        assert!(user_data_with_keys("#!/bin/sh\necho hi\n", &keys).is_err());
        assert!(user_data_with_keys("#cloud-config\n- a list\n", &keys).is_err());
        assert_eq!(
            user_data_with_keys("#!/bin/sh\n", &[]).unwrap(),
            "#!/bin/sh\n"
        );
    }
}
