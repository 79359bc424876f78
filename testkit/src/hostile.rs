//! Hostile and careless requests, and what watches the appliance while they run. Shared by
//! the test (`tests/hostile.rs`, which asserts) and the benchmark (`benches/hostile.rs`,
//! which measures the same cases against an older binary too).
//!
//! - [`cases`]: the requests, each with the answers it may get as an administrator.
//! - [`Monitor`]: while a case runs, GET `/healthz` every 50 ms (worst latency) and follow
//!   serve's RSS (peak via `VmHWM` after resetting it with `clear_refs`, plus VmRSS samples,
//!   which can also kill serve before a vulnerable build takes the host down).
//! - [`snapshot`]: the stored objects a hostile request must not change.
//! - [`Runner`]: one case as one identity (admin, viewer, no credentials) with all of the
//!   above; the problems it found, as sentences naming the case.
//! - login and `/join` helpers for the floods.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::{Client, Method};
use serde_json::{Value, json};

use crate::{Appliance, Vm};

pub const VMS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";
/// A VM created during setup: the target of the PUT and PATCH cases.
pub const BASE_VM: &str = "hostile-base";
/// A namespace created during setup: the target of the namespace PATCH cases.
pub const NS: &str = "hostile";
/// The image the VMs of the cases name (a 4 KiB raw file uploaded during setup).
pub const IMAGE: &str = "k";
pub const LOCKOUTS: &str = "/apis/edgevirt.io/v1/loginlockouts";
pub const KIB: usize = 1 << 10;
pub const MIB: usize = 1 << 20;
/// The healthz budget of the acceptance text.
pub const HEALTHZ_BUDGET: Duration = Duration::from_secs(1);
/// serve's peak RSS may pass its idle RSS by this much.
pub const RSS_BUDGET_KIB: u64 = 200 * 1024;
/// What "fast" means for a refused bomb or deep nesting (debug builds, 2 shared cores).
pub const QUICK: Duration = Duration::from_secs(2);

// ------------------------------------------------------------------------------ cases

/// Who a case's request needs to be from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Auth {
    /// An API path behind the bearer check.
    Api,
    /// Unauthenticated by design (`/join`, the login form): sent without credentials.
    Open,
    /// A dashboard page: the admin's session cookie (the form carries its CSRF token).
    Session,
}

/// The identity a case is sent as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    Admin,
    Viewer,
    Anonymous,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Identity::Admin => "admin",
            Identity::Viewer => "viewer",
            Identity::Anonymous => "anonymous",
        })
    }
}

#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub method: Method,
    pub path: String,
    pub content_type: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// The answers an administrator may get (any of them).
    pub expect: Vec<u16>,
    /// Text the Status message must contain (case-insensitive) when the answer is expected.
    pub message_has: Option<&'static str>,
    pub auth: Auth,
    /// A write: a viewer must get 403.
    pub write: bool,
    /// The answer is a `Status` or a list (API paths); dashboard forms answer HTML and
    /// `/metrics` Prometheus' text.
    pub status_body: bool,
    /// Send this many copies at once.
    pub parallel: usize,
    /// The client's source address (127.0.0.0/8 is all loopback on Linux).
    pub from: Option<IpAddr>,
    /// Must be answered within [`QUICK`].
    pub quick: bool,
    /// Beyond the issue's list (the report says so).
    pub extra: bool,
}

impl Case {
    pub fn new(name: impl Into<String>, method: Method, path: impl Into<String>) -> Case {
        Case {
            name: name.into(),
            method,
            path: path.into(),
            content_type: None,
            headers: Vec::new(),
            body: Bytes::new(),
            expect: Vec::new(),
            message_has: None,
            auth: Auth::Api,
            write: false,
            status_body: true,
            parallel: 1,
            from: None,
            quick: false,
            extra: false,
        }
    }
    fn body(mut self, ct: Option<&str>, body: impl Into<Bytes>) -> Case {
        self.content_type = ct.map(str::to_string);
        self.body = body.into();
        self.write = true;
        self
    }
    pub fn json(self, v: &Value) -> Case {
        self.body(Some("application/json"), serde_json::to_vec(v).unwrap())
    }
    pub fn raw(self, ct: Option<&str>, body: impl Into<Bytes>) -> Case {
        self.body(ct, body)
    }
    pub fn yaml(self, text: String) -> Case {
        self.body(Some("application/yaml"), text.into_bytes())
    }
    pub fn merge_patch(self, v: &Value) -> Case {
        self.body(
            Some("application/merge-patch+json"),
            serde_json::to_vec(v).unwrap(),
        )
    }
    pub fn expect(mut self, codes: &[u16]) -> Case {
        self.expect = codes.to_vec();
        self
    }
    pub fn msg(mut self, needle: &'static str) -> Case {
        self.message_has = Some(needle);
        self
    }
    pub fn open(mut self) -> Case {
        self.auth = Auth::Open;
        self
    }
    pub fn session(mut self) -> Case {
        self.auth = Auth::Session;
        self
    }
    pub fn html(mut self) -> Case {
        self.status_body = false;
        self
    }
    pub fn parallel(mut self, n: usize) -> Case {
        self.parallel = n;
        self
    }
    pub fn from(mut self, ip: &str) -> Case {
        self.from = Some(ip.parse().unwrap());
        self
    }
    pub fn quick(mut self) -> Case {
        self.quick = true;
        self
    }
    pub fn extra(mut self) -> Case {
        self.extra = true;
        self
    }
    pub fn header(mut self, k: &str, v: &str) -> Case {
        self.headers.push((k.into(), v.into()));
        self
    }
}

/// What [`cases`] needs from setup.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    /// The admin's dashboard session: (cookie value, CSRF token).
    pub session: Option<(String, String)>,
}

// ---- bodies

/// A VirtualMachine edgevirt accepts (Halted, so nothing boots), changed by `f`.
pub fn vm(name: &str, f: impl FnOnce(&mut Value)) -> Value {
    Vm::halted(name, IMAGE)
        .namespace("default")
        .label("app", "hostile")
        .cpu(json!({"cores": 1}))
        .with(f)
        .json()
}

fn domain(v: &mut Value) -> &mut Value {
    &mut v["spec"]["template"]["spec"]["domain"]
}

/// The YAML text of a JSON value (JSON is YAML): for cases that send a valid object as YAML.
pub fn as_yaml(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap()
}

/// "Billion laughs": `levels` anchors, each a list of `width` aliases of the previous one.
pub fn yaml_laughs(levels: usize, width: usize) -> String {
    let mut s = format!("l0: &l0 [{}]\n", vec!["\"lol\""; width].join(", "));
    for i in 1..levels {
        s.push_str(&format!(
            "l{i}: &l{i} [{}]\n",
            vec![format!("*l{}", i - 1); width].join(", ")
        ));
    }
    s
}

/// One anchor of `items` scalars, aliased `aliases` times (a wide, flat bomb).
pub fn yaml_wide_alias(items: usize, aliases: usize) -> String {
    format!(
        "a: &a [{}]\nb: [{}]\n",
        vec!["x"; items].join(","),
        vec!["*a"; aliases].join(",")
    )
}

/// Billion laughs in block style, with the aliases as values of nested keys.
pub fn yaml_block_laughs(levels: usize, width: usize) -> String {
    let mut s = String::from("l0: &l0\n");
    for k in 0..width {
        s.push_str(&format!("  k{k}: lol\n"));
    }
    for i in 1..levels {
        s.push_str(&format!("l{i}: &l{i}\n"));
        for k in 0..width {
            s.push_str(&format!("  k{k}: *l{}\n", i - 1));
        }
    }
    s
}

/// One scalar of `bytes` bytes, aliased `aliases` times.
pub fn yaml_scalar_alias(bytes: usize, aliases: usize) -> String {
    format!(
        "a: &a {}\nb: [{}]\n",
        "x".repeat(bytes),
        vec!["*a"; aliases].join(",")
    )
}

/// `a: [[[...]]]`, `bytes` long in all.
pub fn yaml_flow_nesting(bytes: usize) -> String {
    let n = bytes / 2;
    format!("a: {}{}\n", "[".repeat(n), "]".repeat(n))
}

/// `- - - ... x`: block sequences nested `depth` deep on one line.
pub fn yaml_block_seq_nesting(depth: usize) -> String {
    format!("a:\n{}x\n", "- ".repeat(depth))
}

/// Block mappings nested `depth` deep, each indented one more space.
pub fn yaml_block_map_nesting(depth: usize) -> String {
    let mut s = String::new();
    for i in 0..depth {
        s.push_str(&" ".repeat(i));
        s.push_str("k:\n");
    }
    s.push_str(&" ".repeat(depth));
    s.push_str("x\n");
    s
}

pub fn json_array_nesting(depth: usize) -> Vec<u8> {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes()
}

pub fn json_object_nesting(depth: usize) -> Vec<u8> {
    format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth)).into_bytes()
}

/// A `/join` body with `secret` as the secret.
pub fn join_body(secret: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"nodeName": "hostile-node", "secret": secret, "version": "1"}))
        .unwrap()
}

/// A JSON patch whose `copy` operations double the object `doublings` times, from a seed
/// of 1 KiB: 3 KiB of patch, 2^doublings KiB once applied.
pub fn json_patch_doubling(doublings: usize) -> Vec<u8> {
    let mut ops =
        vec![json!({"op": "add", "path": "/metadata/labels/seed", "value": "x".repeat(KIB)})];
    for i in 0..doublings {
        ops.push(json!({"op": "copy", "from": "/metadata/labels", "path": format!("/metadata/labels/d{i}")}));
    }
    serde_json::to_vec(&ops).unwrap()
}

fn url_encode(s: &str) -> String {
    serde_urlencoded::to_string([("x", s)]).unwrap()[2..].to_string()
}

/// The login form's body.
pub fn login_body(csrf: &str, user: &str, password: &str) -> String {
    serde_urlencoded::to_string([
        ("csrf", csrf),
        ("next", "/ui/"),
        ("username", user),
        ("password", password),
    ])
    .unwrap()
}

/// Every case, with what an administrator gets.
pub fn cases(setup: &Setup) -> Vec<Case> {
    let mut c = Vec::new();
    let post = |name: &str| Case::new(name, Method::POST, VMS);
    let base = format!("{VMS}/{BASE_VM}");
    let ns = format!("/api/v1/namespaces/{NS}");
    let valid = serde_json::to_vec(&vm("hostile-valid", |_| {})).unwrap();

    // ---- 1. content types and body limits on object writes
    // No type is JSON, as kube-apiserver takes it (kubectl 1.20 sends none): a YAML body
    // without one is not guessed as YAML.
    c.push(
        post("vm-yaml-without-content-type")
            .raw(
                None,
                serde_yaml_ng::to_string(&vm("hostile-valid", |_| {}))
                    .unwrap()
                    .into_bytes(),
            )
            .expect(&[400])
            .msg("JSON"),
    );
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/octet-stream",
        "multipart/form-data; boundary=x",
    ] {
        let n = ct.split(';').next().unwrap().replace('/', "-");
        c.push(
            post(&format!("vm-as-{n}"))
                .raw(Some(ct), valid.clone())
                .expect(&[415]),
        );
    }
    c.push(
        post("vm-8MiB-annotation")
            .json(&vm("hostile-big", |v| {
                v["metadata"]["annotations"] = json!({"big": "x".repeat(8 * MIB)});
            }))
            .expect(&[413]),
    );
    c.push(
        Case::new("put-8MiB-annotation", Method::PUT, base.clone())
            .json(&vm(BASE_VM, |v| {
                v["metadata"]["annotations"] = json!({"big": "x".repeat(8 * MIB)});
            }))
            .expect(&[413]),
    );
    c.push(
        post("vm-2.9MiB-name")
            .json(&vm(&"a".repeat(2900 * KIB), |_| {}))
            .expect(&[400, 413, 422]),
    );
    c.push(
        post("vm-2.9MiB-name-x16-parallel")
            .json(&vm(&"b".repeat(2900 * KIB), |_| {}))
            .expect(&[400, 413, 422, 429])
            .parallel(16)
            .extra(),
    );

    // ---- YAML budgets
    c.push(
        post("yaml-billion-laughs")
            .yaml(yaml_laughs(9, 10))
            .expect(&[400])
            .msg("yaml")
            .quick(),
    );
    c.push(
        post("yaml-6000x6000-aliases")
            .yaml(yaml_wide_alias(6000, 6000))
            .expect(&[400])
            .msg("yaml")
            .quick(),
    );
    c.push(
        post("yaml-block-key-laughs")
            .yaml(yaml_block_laughs(9, 10))
            .expect(&[400])
            .msg("yaml")
            .quick(),
    );
    c.push(
        post("yaml-1MiB-scalar-x1000-aliases")
            .yaml(yaml_scalar_alias(MIB, 1000))
            .expect(&[400])
            .msg("yaml")
            .quick(),
    );
    c.push(
        post("yaml-flow-nesting-240KB")
            .yaml(yaml_flow_nesting(240_000))
            .expect(&[400])
            .msg("yaml")
            .quick(),
    );
    c.push(
        post("yaml-block-seq-nesting-50000")
            .yaml(yaml_block_seq_nesting(50_000))
            .expect(&[400])
            .msg("yaml")
            .quick(),
    );
    c.push(
        post("yaml-block-map-nesting-700")
            .yaml(yaml_block_map_nesting(700))
            .expect(&[400])
            .msg("yaml")
            .quick(),
    );
    c.push(
        post("yaml-flow-nesting-as-text-plain")
            .raw(Some("text/plain"), yaml_flow_nesting(240_000))
            .expect(&[415]),
    );
    c.push(
        Case::new(
            "namespace-yaml-6000x6000-aliases",
            Method::POST,
            "/api/v1/namespaces",
        )
        .yaml(yaml_wide_alias(6000, 6000))
        .expect(&[400])
        .msg("yaml")
        .quick(),
    );
    c.push(
        Case::new("put-yaml-6000x6000-aliases", Method::PUT, base.clone())
            .yaml(yaml_wide_alias(6000, 6000))
            .expect(&[400])
            .msg("yaml")
            .quick(),
    );
    for ct in ["application/x-yaml", "text/yaml"] {
        c.push(
            post(&format!("yaml-billion-laughs-as-{}", ct.replace('/', "-")))
                .raw(Some(ct), yaml_laughs(9, 10))
                .expect(&[400])
                .msg("yaml")
                .quick(),
        );
    }

    // ---- JSON nesting
    c.push(
        post("json-array-nesting-100000")
            .raw(Some("application/json"), json_array_nesting(100_000))
            .expect(&[400])
            .quick(),
    );
    c.push(
        post("json-object-nesting-100000")
            .raw(Some("application/json"), json_object_nesting(100_000))
            .expect(&[400])
            .quick(),
    );

    // ---- 4. object validation
    let label = |name: &str, k: String, val: String| {
        post(name)
            .json(&vm(&format!("hostile-{}", name.to_lowercase()), |v| {
                v["metadata"]["labels"] = json!({ k: val });
            }))
            .expect(&[422])
            .msg("metadata.labels")
    };
    c.push(label("label-key-name-64", "a".repeat(64), "x".into()));
    c.push(label(
        "label-key-prefix-254",
        format!("{}/k", "a".repeat(254)),
        "x".into(),
    ));
    c.push(label("label-key-space", "a b".into(), "x".into()));
    c.push(label("label-key-leading-dash", "-x".into(), "x".into()));
    c.push(label("label-value-64", "k".into(), "v".repeat(64)));
    c.push(label("label-value-space", "k".into(), "a b".into()));
    c.push(
        post("annotations-300KiB")
            .json(&vm("hostile-annotations", |v| {
                v["metadata"]["annotations"] = json!({"big": "x".repeat(300 * KIB)});
            }))
            .expect(&[422])
            .msg("metadata.annotations"),
    );
    c.push(
        post("cpu-65536-sockets-x-65536-cores")
            .json(&vm("hostile-cpu", |v| {
                domain(v)["cpu"] = json!({"sockets": 65536, "cores": 65536});
            }))
            .expect(&[422])
            .msg("cpu"),
    );
    c.push(
        post("cpu-4294967295-sockets")
            .json(&vm("hostile-cpu-max", |v| {
                domain(v)["cpu"] = json!({"sockets": 4294967295u64});
            }))
            .expect(&[400, 422]),
    );
    for m in [
        "18446744073709551616",
        "1e400",
        "99999999Ei",
        "-1Gi",
        "1.5.5Gi",
    ] {
        c.push(
            post(&format!("memory-guest-{m}"))
                .json(&vm("hostile-memory", |v| {
                    domain(v)["memory"]["guest"] = json!(m)
                }))
                .expect(&[422])
                .msg("memory"),
        );
    }
    c.push(
        post("memory-guest-number-1e400")
            .raw(
                Some("application/json"),
                String::from_utf8(valid.clone())
                    .unwrap()
                    .replace("\"64Mi\"", "1e400")
                    .into_bytes(),
            )
            .expect(&[400, 422])
            .extra(),
    );
    c.push(
        Case::new("put-label-key-space", Method::PUT, base.clone())
            .json(&vm(BASE_VM, |v| {
                v["metadata"]["labels"] = json!({"a b": "x"});
            }))
            .expect(&[422])
            .msg("metadata.labels"),
    );

    // ---- container disks from registries: references and pull policies are checked at
    // admission (the node pulls them later), and Secrets are checked as they are written.
    let volumes = |v: &mut Value, cd: Value| {
        v["spec"]["template"]["spec"]["volumes"] = json!([{"name": "data", "containerDisk": cd}]);
        domain(v)["devices"]["disks"] = json!([{"name": "data", "disk": {}}]);
    };
    for (name, cd, needle) in [
        (
            "containerDisk-bad-reference",
            json!({"image": "quay.io/a b:c"}),
            "image reference",
        ),
        (
            "containerDisk-100KiB-reference",
            json!({"image": format!("quay.io/{}:1", "a".repeat(100 * KIB))}),
            "image",
        ),
        (
            "containerDisk-bad-digest",
            json!({"image": "quay.io/a/b@sha256:xyz"}),
            "image",
        ),
        (
            "containerDisk-pull-policy-Sometimes",
            json!({"image": "quay.io/a/b:1", "imagePullPolicy": "Sometimes"}),
            "imagePullPolicy",
        ),
        (
            "containerDisk-pull-secret-path",
            json!({"image": "quay.io/a/b:1", "imagePullSecret": "../../etc/shadow"}),
            "imagePullSecret",
        ),
    ] {
        c.push(
            post(name)
                .json(&vm("hostile-cd", |v| volumes(v, cd)))
                .expect(&[422])
                .msg(needle),
        );
    }
    // Domain settings that reach the domain XML: every value is checked before rendering.
    for (name, f, needle) in [
        (
            "emptyDisk-1Ei",
            json!({"volumes": [{"name": "e", "emptyDisk": {"capacity": "1Ei"}}]}),
            "emptyDisk",
        ),
        (
            "clock-timezone-xml-injection",
            json!({"domain": {"clock": {"timezone": "UTC'/><devices><disk"}}}),
            "timezone",
        ),
        (
            "hyperv-vendorid-xml-injection",
            json!({"domain": {"features": {"hyperv": {"vendorid": {"vendorid": "a'b"}}}}}),
            "vendorid",
        ),
        (
            // Markup is escaped into the XML; control characters are refused.
            "firmware-serial-control-chars",
            json!({"domain": {"firmware": {"serial": "a\u{1}\nb"}}}),
            "serial",
        ),
        (
            "kernelBoot-path-escapes-the-image",
            json!({"domain": {"firmware": {"kernelBoot": {"container": {
                "image": "quay.io/a/b:1", "kernelPath": "/boot/../../etc/shadow"}}}}}),
            "kernelPath",
        ),
        (
            "firmware-uuid-garbage",
            json!({"domain": {"firmware": {"uuid": "x".repeat(4096)}}}),
            "uuid",
        ),
        // Probes run by the agent, and credentials it writes into guests.
        (
            "probe-exec-1MiB-command",
            json!({"livenessProbe": {"exec": {"command": vec!["x".repeat(KIB); 1024]}}}),
            "exec.command",
        ),
        (
            "probe-tcp-host-not-an-address",
            json!({"readinessProbe": {"tcpSocket": {"port": 22, "host": "metadata.internal"}}}),
            "host",
        ),
        (
            "probe-http-header-injection",
            json!({"readinessProbe": {"httpGet": {"port": 80,
                "httpHeaders": [{"name": "X\r\nHost", "value": "evil"}]}}}),
            "httpHeaders",
        ),
        (
            "probe-http-path-control-chars",
            json!({"readinessProbe": {"httpGet": {"port": 80, "path": "/\r\nGET /x"}}}),
            "path",
        ),
        (
            "probe-period-negative",
            json!({"readinessProbe": {"guestAgentPing": {}, "periodSeconds": -1}}),
            "periodSeconds",
        ),
        (
            "probe-two-actions",
            json!({"livenessProbe": {"guestAgentPing": {}, "tcpSocket": {"port": 1}}}),
            "exactly one",
        ),
        (
            "credentials-user-path",
            json!({"accessCredentials": [{"sshPublicKey": {
                "source": {"secret": {"secretName": "k"}},
                "propagationMethod": {"qemuGuestAgent": {"users": ["../../root"]}}}}]}),
            "user name",
        ),
        (
            "credentials-secret-name-traversal",
            json!({"accessCredentials": [{"userPassword": {
                "source": {"secret": {"secretName": "../../secrets/x"}},
                "propagationMethod": {"qemuGuestAgent": {}}}}]}),
            "secret",
        ),
        // Device settings land in the domain XML: only the listed values, never markup.
        (
            "video-type-xml-injection",
            json!({"domain": {"devices": {"video": {"type": "vga'/><disk type='block'"}}}}),
            "video.type",
        ),
        (
            "watchdog-action-xml-injection",
            json!({"domain": {"devices": {"watchdog": {"name": "w",
                "i6300esb": {"action": "reset' foo='"}}}}}),
            "action",
        ),
        (
            "input-bus-unknown",
            json!({"domain": {"devices": {"inputs": [{"name": "t", "type": "tablet", "bus": "ps2'"}]}}}),
            "bus",
        ),
        (
            "disk-cache-xml-injection",
            json!({"domain": {"devices": {"disks": [{"name": "d",
                "cache": "none' io='native"}]}},
                "volumes": [{"name": "d", "emptyDisk": {"capacity": "1Mi"}}]}),
            "cache",
        ),
        (
            "disk-error-policy-unknown",
            json!({"domain": {"devices": {"disks": [{"name": "d",
                "errorPolicy": "reboot"}]}},
                "volumes": [{"name": "d", "emptyDisk": {"capacity": "1Mi"}}]}),
            "errorPolicy",
        ),
        (
            "disk-block-size-huge",
            json!({"domain": {"devices": {"disks": [{"name": "d",
                "blockSize": {"custom": {"logical": 4294967295u32, "physical": 4294967295u32}}}]}},
                "volumes": [{"name": "d", "emptyDisk": {"capacity": "1Mi"}}]}),
            "blockSize",
        ),
        (
            "reboot-policy-unknown",
            json!({"domain": {"rebootPolicy": "Halt"}}),
            "rebootPolicy",
        ),
        (
            "io-threads-policy-unknown",
            json!({"domain": {"ioThreadsPolicy": "all-of-them"}}),
            "ioThreadsPolicy",
        ),
        (
            "emulator-thread-without-dedicated-cpus",
            json!({"domain": {"cpu": {"isolateEmulatorThread": true}}}),
            "dedicatedCpuPlacement",
        ),
        (
            "dedicated-cpus-not-a-bool",
            json!({"domain": {"cpu": {"dedicatedCpuPlacement": "all"}}}),
            "dedicatedCpuPlacement",
        ),
        (
            "affinity-operator-unknown",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "z", "operator": "Near'"}]}]}}}}),
            "operator",
        ),
        (
            "affinity-weight-1000",
            json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
                [{"weight": 1000, "preference": {"matchExpressions": [{"key": "z", "operator": "Exists"}]}}]}}}),
            "weight",
        ),
        (
            "toleration-operator-unknown",
            json!({"tolerations": [{"key": "k", "operator": "Maybe", "effect": "NoSchedule"}]}),
            "operator",
        ),
        (
            "toleration-effect-unknown",
            json!({"tolerations": [{"key": "k", "operator": "Exists", "effect": "Evict"}]}),
            "effect",
        ),
        (
            "nic-model-xml-injection",
            json!({"networks": [{"name": "default", "pod": {}}],
                "domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {},
                    "model": "virtio'/><interface type='direct'"}]}}}),
            "model",
        ),
        (
            "nic-mac-garbage",
            json!({"networks": [{"name": "default", "pod": {}}],
                "domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {},
                    "macAddress": "zz:zz"}]}}}),
            "macAddress",
        ),
        (
            "nic-state-absent",
            json!({"networks": [{"name": "default", "pod": {}}],
                "domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {},
                    "state": "absent"}]}}}),
            "state",
        ),
        (
            "host-disk-dotdot",
            json!({"volumes": [{"name": "d", "hostDisk": {"path": "/var/lib/edgevirt/../../etc/shadow",
                "type": "Disk"}}]}),
            "hostDisk.path",
        ),
        (
            "host-disk-relative",
            json!({"volumes": [{"name": "d", "hostDisk": {"path": "etc/shadow", "type": "Disk"}}]}),
            "hostDisk.path",
        ),
        (
            "host-disk-huge",
            json!({"volumes": [{"name": "d", "hostDisk": {"path": "/var/data/x.img",
                "type": "DiskOrCreate", "capacity": "1Ei"}}]}),
            "capacity",
        ),
        (
            "io-threads-pool-huge",
            json!({"domain": {"ioThreadsPolicy": "supplementalPool",
                "ioThreads": {"supplementalPoolThreadCount": 4294967295u64}}}),
            "ioThreads",
        ),
        (
            "configmap-volume-name-traversal",
            json!({"volumes": [{"name": "d", "configMap": {"name": "../../etc"}}]}),
            "configMap.name",
        ),
        (
            "secret-volume-no-name",
            json!({"volumes": [{"name": "d", "secret": {}}]}),
            "secretName",
        ),
        (
            "config-volume-label-argument",
            json!({"volumes": [{"name": "d", "configMap": {"name": "c",
                "volumeLabel": "x -o /etc/passwd"}}]}),
            "volumeLabel",
        ),
        (
            "downward-path-dotdot",
            json!({"volumes": [{"name": "d", "downwardAPI": {"fields": [{"path": "../../x",
                "fieldRef": {"fieldPath": "metadata.name"}}]}}]}),
            "path",
        ),
        (
            "downward-field-node",
            json!({"volumes": [{"name": "d", "downwardAPI": {"fields": [{"path": "n",
                "fieldRef": {"fieldPath": "spec.nodeName"}}]}}]}),
            "fieldPath",
        ),
        (
            "downward-resource-field",
            json!({"volumes": [{"name": "d", "downwardAPI": {"fields": [{"path": "n",
                "resourceFieldRef": {"resource": "limits.memory"}}]}}]}),
            "not support",
        ),
        (
            "virtiofs-host-folder",
            json!({"volumes": [{"name": "d", "hostDisk": {"path": "/etc", "type": "Disk"}}],
                "domain": {"devices": {"filesystems": [{"name": "d", "virtiofs": {}}]}}}),
            "persistentVolumeClaim",
        ),
        (
            "virtiofs-claim-dotdot",
            json!({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "../../etc"}}],
                "domain": {"devices": {"filesystems": [{"name": "d", "virtiofs": {}}]}}}),
            "claimName",
        ),
        (
            "spread-skew-zero",
            json!({"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "zone",
                "whenUnsatisfiable": "DoNotSchedule"}]}),
            "maxSkew",
        ),
        (
            "spread-when-unknown",
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                "whenUnsatisfiable": "Sometimes"}]}),
            "whenUnsatisfiable",
        ),
        (
            "spread-min-domains",
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                "whenUnsatisfiable": "DoNotSchedule", "minDomains": 3}]}),
            "minDomains",
        ),
        (
            "pod-anti-affinity-no-topology-key",
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": ""}]}}}),
            "topologyKey",
        ),
        (
            "pod-affinity-selector-injection",
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchExpressions": [{"key": "app' OR 1=1", "operator": "In",
                    "values": ["x"]}]}, "topologyKey": "kubernetes.io/hostname"}]}}}),
            "key",
        ),
        (
            "pod-affinity-namespace-selector",
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"namespaceSelector": {"matchLabels": {"team": "a"}},
                 "topologyKey": "kubernetes.io/hostname"}]}}}),
            "namespaceSelector",
        ),
        (
            "tpm-persistent-not-a-bool",
            json!({"domain": {"devices": {"tpm": {"persistent": "../../etc"}}}}),
            "tpm.persistent",
        ),
        (
            "efi-persistent-not-a-bool",
            json!({"domain": {"firmware": {"bootloader": {"efi": {"persistent": "yes"}}}}}),
            "efi.persistent",
        ),
        (
            "eviction-strategy-unknown",
            json!({"evictionStrategy": "External"}),
            "evictionStrategy",
        ),
        (
            "scheduler-name-other",
            json!({"schedulerName": "volcano"}),
            "schedulerName",
        ),
    ] {
        c.push(
            post(name)
                .json(&vm("hostile-domain", |v| {
                    let spec = &mut v["spec"]["template"]["spec"];
                    for (k, val) in f.as_object().unwrap() {
                        if k == "domain" {
                            for (dk, dv) in val.as_object().unwrap() {
                                spec["domain"][dk] = dv.clone();
                            }
                        } else {
                            spec[k] = val.clone();
                        }
                    }
                }))
                .expect(&[422])
                .msg(needle),
        );
    }
    c.push(
        post("update-volumes-migration")
            .json(&vm("hostile-update-volumes", |v| {
                v["spec"]["updateVolumesStrategy"] = json!("Migration");
            }))
            .expect(&[422])
            .msg("updateVolumesStrategy"),
    );
    let core = |kind: &str, name: &str, mut body: Value| {
        body["apiVersion"] = json!("v1");
        body["kind"] = json!(kind);
        body["metadata"] = json!({"name": format!("hostile-{}", name.to_lowercase())});
        let path = format!("{ns}/{}s", kind.to_lowercase());
        Case::new(name, Method::POST, path).json(&body)
    };
    let secret = |name: &str, body: Value| core("Secret", name, body);
    let config_map = |name: &str, body: Value| core("ConfigMap", name, body);
    for (name, body, needle) in [
        ("configmap-key-dotdot", json!({"data": {"..": "v"}}), "key"),
        ("configmap-key-slash", json!({"data": {"a/b": "v"}}), "key"),
        ("configmap-data-number", json!({"data": {"k": 1}}), "string"),
        (
            "configmap-binary-not-base64",
            json!({"binaryData": {"k": "!!!"}}),
            "base64",
        ),
        (
            "configmap-key-twice",
            json!({"data": {"k": "a"}, "binaryData": {"k": "YQ=="}}),
            "both",
        ),
    ] {
        c.push(config_map(name, body).expect(&[422]).msg(needle));
    }
    // Events by hand (agents, scripts): about something, with a reason, Normal or Warning.
    let event = |name: &str, body: Value| core("Event", name, body);
    let about = json!({"kind": "VirtualMachine", "name": "web"});
    for (name, body, needle) in [
        (
            "event-about-nothing",
            json!({"involvedObject": {"kind": "VirtualMachine"}, "reason": "X"}),
            "involvedObject.name",
        ),
        (
            "event-no-reason",
            json!({"involvedObject": about.clone()}),
            "reason",
        ),
        (
            "event-type-critical",
            json!({"involvedObject": about.clone(), "reason": "X", "type": "Critical"}),
            "Normal",
        ),
        (
            "event-count-words",
            json!({"involvedObject": about.clone(), "reason": "X", "count": "many"}),
            "count",
        ),
    ] {
        c.push(event(name, body).expect(&[422]).msg(needle));
    }
    let events_v1 = "/apis/events.k8s.io/v1/namespaces/default/events";
    c.push(Case::new("events-v1-list", Method::GET, events_v1).expect(&[200]));
    c.push(
        Case::new("events-v1-create", Method::POST, events_v1)
            .json(&json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": "hostile-v1"}, "reason": "X", "note": "y",
                "eventTime": "2026-01-01T00:00:00.000000Z", "action": "A",
                "reportingController": "x", "reportingInstance": "y"}))
            .expect(&[405])
            .msg("reading"),
    );
    c.push(
        Case::new(
            "events-fieldselector-unknown",
            Method::GET,
            format!("{ns}/events?fieldSelector=involvedObject.color%3Dred"),
        )
        .expect(&[400])
        .msg("not supported"),
    );
    // Metrics: any logged-in principal scrapes; only a node's agent sends its figures.
    c.push(
        Case::new("metrics-scrape", Method::GET, "/metrics")
            .expect(&[200])
            .html(),
    );
    // The guest agent's lists: of an instance that is not there, and written to.
    let vmi_sub = |what: &str| {
        format!(
            "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/hostile-none/{what}"
        )
    };
    for what in ["userlist", "filesystemlist"] {
        c.push(Case::new(format!("{what}-of-nothing"), Method::GET, vmi_sub(what)).expect(&[404]));
        c.push(
            Case::new(format!("{what}-put"), Method::PUT, vmi_sub(what))
                .json(&json!({"items": [{"userName": "root"}]}))
                .expect(&[404]),
        );
    }
    // Hotplug: a stopped VM gets nothing added; bodies are KubeVirt's options, checked.
    let vm_sub = |what: &str| {
        format!(
            "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/{BASE_VM}/{what}"
        )
    };
    let add_dv = json!({"name": "extra", "disk": {"disk": {"bus": "scsi"}},
                        "volumeSource": {"dataVolume": {"name": "extra"}}});
    c.push(
        Case::new("addvolume-stopped-vm", Method::PUT, vm_sub("addvolume"))
            .json(&add_dv)
            .expect(&[409])
            .msg("not running"),
    );
    c.push(
        Case::new("addvolume-missing-vmi", Method::PUT, vmi_sub("addvolume"))
            .json(&add_dv)
            .expect(&[404]),
    );
    c.push(
        Case::new("addvolume-without-body", Method::PUT, vm_sub("addvolume"))
            .raw(Some("application/json"), "")
            .expect(&[400])
            .msg("needs a body"),
    );
    c.push(
        Case::new("addvolume-not-json", Method::PUT, vm_sub("addvolume"))
            .raw(Some("application/json"), "{\"name\": ")
            .expect(&[400]),
    );
    c.push(
        Case::new("addvolume-unknown-field", Method::PUT, vm_sub("addvolume"))
            .json(&json!({"name": "x", "volumeSource": {}, "hostPath": "/etc"}))
            .expect(&[400])
            .msg("unknown field"),
    );
    c.push(
        Case::new("addvolume-traversal-name", Method::PUT, vm_sub("addvolume"))
            .json(&json!({"name": "../../etc/passwd",
                          "volumeSource": {"dataVolume": {"name": "x"}}}))
            .expect(&[400, 422]),
    );
    c.push(
        Case::new(
            "removevolume-stopped-vm",
            Method::PUT,
            vm_sub("removevolume"),
        )
        .json(&json!({"name": "rootdisk"}))
        .expect(&[409])
        .msg("not running"),
    );
    c.push(
        Case::new(
            "removevolume-wrong-type",
            Method::PUT,
            vm_sub("removevolume"),
        )
        .json(&json!({"name": ["rootdisk"]}))
        .expect(&[400]),
    );
    // Snapshots: bodies are KubeVirt's snapshot kinds, checked; contents are edgevirt's.
    let snaps = "/apis/snapshot.kubevirt.io/v1beta1/namespaces/default";
    let snap = |source: Value| {
        json!({"apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineSnapshot",
               "metadata": {"name": "hostile-snap"}, "spec": {"source": source}})
    };
    c.push(
        Case::new(
            "snapshot-of-a-pod",
            Method::POST,
            format!("{snaps}/virtualmachinesnapshots"),
        )
        .json(&snap(json!({"apiGroup": "", "kind": "Pod", "name": "x"})))
        .expect(&[422])
        .msg("only a VirtualMachine"),
    );
    c.push(
        Case::new(
            "snapshot-traversal-name",
            Method::POST,
            format!("{snaps}/virtualmachinesnapshots"),
        )
        .json(&snap(
            json!({"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "../../etc"}),
        ))
        .expect(&[422]),
    );
    c.push(
        Case::new(
            "snapshot-unknown-field",
            Method::POST,
            format!("{snaps}/virtualmachinesnapshots"),
        )
        .json(&json!({"apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineSnapshot",
                      "metadata": {"name": "hostile-snap"},
                      "spec": {"source": {"kind": "VirtualMachine", "name": BASE_VM}, "volumes": []}}))
        .expect(&[400, 422]),
    );
    c.push(
        Case::new(
            "snapshot-bad-deadline",
            Method::POST,
            format!("{snaps}/virtualmachinesnapshots"),
        )
        .json(
            &json!({"apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineSnapshot",
                      "metadata": {"name": "hostile-snap"},
                      "spec": {"source": {"kind": "VirtualMachine", "name": BASE_VM},
                               "failureDeadline": "forever"}}),
        )
        .expect(&[422])
        .msg("no duration"),
    );
    c.push(
        Case::new(
            "snapshot-content-by-hand",
            Method::POST,
            format!("{snaps}/virtualmachinesnapshotcontents"),
        )
        .json(&json!({"apiVersion": "snapshot.kubevirt.io/v1beta1",
                      "kind": "VirtualMachineSnapshotContent",
                      "metadata": {"name": "hostile-content"},
                      "spec": {"source": {"virtualMachine": {"spec": {}}},
                               "volumeBackups": [{"volumeName": "x",
                                   "persistentVolumeClaim": {"metadata": {"name": "../../etc/passwd"}}}]}}))
        .expect(&[422])
        .msg("made by edgevirt"),
    );
    let backups = "/apis/backup.kubevirt.io/v1alpha1/namespaces/default/virtualmachinebackups";
    let backup = |spec: Value| {
        json!({"apiVersion": "backup.kubevirt.io/v1alpha1", "kind": "VirtualMachineBackup",
               "metadata": {"name": "hostile-backup"}, "spec": spec})
    };
    for (name, spec, msg) in [
        (
            "backup-traversal-target",
            json!({"source": {"kind": "VirtualMachine", "name": BASE_VM}, "pvcName": "../../etc"}),
            "spec.pvcName",
        ),
        (
            "backup-traversal-source",
            json!({"source": {"kind": "VirtualMachine", "name": "../x"}, "pvcName": "nas"}),
            "spec.source.name",
        ),
        (
            "backup-without-target",
            json!({"source": {"kind": "VirtualMachine", "name": BASE_VM}}),
            "backup target",
        ),
        (
            "backup-pull-mode",
            json!({"source": {"kind": "VirtualMachine", "name": BASE_VM}, "pvcName": "nas",
                   "mode": "Pull", "tokenSecretRef": "s"}),
            "Push backups only",
        ),
        (
            "backup-of-a-pod",
            json!({"source": {"kind": "Pod", "name": BASE_VM}, "pvcName": "nas"}),
            "backs up VirtualMachines",
        ),
        (
            "backup-unknown-field",
            json!({"source": {"kind": "VirtualMachine", "name": BASE_VM}, "pvcName": "nas",
                   "path": "/etc"}),
            "path",
        ),
        (
            "backup-wrong-type",
            json!({"source": {"kind": "VirtualMachine", "name": BASE_VM}, "pvcName": "nas",
                   "forceFullBackup": "yes"}),
            "forceFullBackup",
        ),
    ] {
        c.push(
            Case::new(name, Method::POST, backups.to_string())
                .json(&backup(spec))
                .expect(&[422])
                .msg(msg),
        );
    }
    let schedules = "/apis/edgevirt.io/v1/namespaces/default/backupschedules";
    let schedule = |spec: Value| {
        json!({"apiVersion": "edgevirt.io/v1", "kind": "BackupSchedule",
               "metadata": {"name": "hostile-schedule"}, "spec": spec})
    };
    for (name, spec, msg) in [
        (
            "schedule-no-vms",
            json!({"target": "nas", "every": "1h"}),
            "name the VMs",
        ),
        (
            "schedule-zero-interval",
            json!({"target": "nas", "vms": [BASE_VM], "every": "0s"}),
            "at least 1s",
        ),
        (
            "schedule-traversal-vm",
            json!({"target": "nas", "vms": ["../../etc"], "every": "1h"}),
            "vms[0]",
        ),
        (
            "schedule-traversal-target",
            json!({"target": "/mnt/nas", "vms": [BASE_VM], "every": "1h"}),
            "spec.target",
        ),
        (
            "schedule-negative-keep",
            json!({"target": "nas", "vms": [BASE_VM], "every": "1h", "keep": {"last": -1}}),
            "keep",
        ),
        (
            "schedule-unknown-keep",
            json!({"target": "nas", "vms": [BASE_VM], "every": "1h", "keep": {"yearly": 2}}),
            "yearly",
        ),
    ] {
        c.push(
            Case::new(name, Method::POST, schedules.to_string())
                .json(&schedule(spec))
                .expect(&[422])
                .msg(msg),
        );
    }
    c.push(
        Case::new("backup-not-json", Method::POST, backups.to_string())
            .body(Some("text/plain"), b"pvcName: nas".to_vec())
            .expect(&[415]),
    );
    c.push(
        Case::new(
            "restore-with-patches",
            Method::POST,
            format!("{snaps}/virtualmachinerestores"),
        )
        .json(
            &json!({"apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineRestore",
                      "metadata": {"name": "hostile-restore"},
                      "spec": {"target": {"kind": "VirtualMachine", "name": BASE_VM},
                               "virtualMachineSnapshotName": "nope",
                               "targetReadinessPolicy": "Whenever",
                               "patches": ["{\"op\": \"remove\"}"]}}),
        )
        .expect(&[422])
        .msg("targetReadinessPolicy"),
    );
    c.push(
        Case::new(
            "restore-without-spec",
            Method::POST,
            format!("{snaps}/virtualmachinerestores"),
        )
        .json(
            &json!({"apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineRestore",
                      "metadata": {"name": "hostile-restore"}}),
        )
        .expect(&[422]),
    );
    // freeze / unfreeze of an instance that is not there, and bad timeouts.
    c.push(
        Case::new("freeze-missing-vmi", Method::PUT, vmi_sub("freeze"))
            .raw(None, "")
            .expect(&[404]),
    );
    c.push(
        Case::new("unfreeze-missing-vmi", Method::PUT, vmi_sub("unfreeze"))
            .json(&json!({}))
            .expect(&[404]),
    );
    c.push(
        Case::new("freeze-bad-timeout", Method::PUT, vmi_sub("freeze"))
            .json(&json!({"unfreezeTimeout": "-5m"}))
            .expect(&[400])
            .msg("no duration"),
    );
    c.push(
        Case::new("freeze-not-json", Method::PUT, vmi_sub("freeze"))
            .raw(Some("application/json"), "{\"unfreezeTimeout\": ")
            .expect(&[400]),
    );
    c.push(
        Case::new("freeze-on-a-vm", Method::PUT, vm_sub("freeze"))
            .json(&json!({"unfreezeTimeout": "1m"}))
            .expect(&[404]),
    );
    let stats = "/apis/edgevirt.io/v1/nodes/hostile-node/stats";
    c.push(
        Case::new("node-stats-not-json", Method::PUT, stats)
            .raw(Some("application/json"), "{\"domains\": [")
            .expect(&[400]),
    );
    c.push(
        Case::new("node-stats-wrong-shape", Method::PUT, stats)
            .json(&json!({"domains": "all of them"}))
            .expect(&[400])
            .msg("node report"),
    );
    c.push(
        Case::new("node-stats-text", Method::PUT, stats)
            .raw(Some("text/plain"), "cpu 1")
            .expect(&[415]),
    );
    c.push(
        Case::new("node-stats-unknown-node", Method::PUT, stats)
            .json(&json!({"intervalSecs": 15, "domains": []}))
            .expect(&[404]),
    );
    // kubectl's protobuf bodies are checked as JSON ones once decoded; a broken one is 415.
    let proto = |fields: &[(u8, Vec<u8>)]| {
        fields
            .iter()
            .flat_map(|(n, payload)| {
                let mut v = vec![n << 3 | 2];
                let mut len = payload.len();
                while len >= 0x80 {
                    v.push((len as u8) | 0x80);
                    len >>= 7;
                }
                v.push(len as u8);
                v.extend_from_slice(payload);
                v
            })
            .collect::<Vec<u8>>()
    };
    let type_meta = proto(&[(1, b"v1".to_vec()), (2, b"ConfigMap".to_vec())]);
    let meta = proto(&[(1, b"hostile-proto".to_vec())]);
    let bad_key = proto(&[
        (1, meta.clone()),
        (2, proto(&[(1, b"..".to_vec()), (2, b"v".to_vec())])),
    ]);
    let envelope = |obj: &[u8]| {
        [
            b"k8s\0".to_vec(),
            proto(&[(1, type_meta.clone()), (2, obj.to_vec())]),
        ]
        .concat()
    };
    let pb = "application/vnd.kubernetes.protobuf";
    let cms = format!("{ns}/configmaps");
    c.push(
        Case::new("configmap-protobuf-key-dotdot", Method::POST, cms.clone())
            .raw(Some(pb), envelope(&bad_key))
            .expect(&[422])
            .msg("key"),
    );
    let mut truncated = envelope(&proto(&[(1, meta)]));
    truncated.truncate(truncated.len() - 3);
    c.push(
        Case::new("configmap-protobuf-truncated", Method::POST, cms)
            .raw(Some(pb), truncated)
            .expect(&[415])
            .msg("truncated"),
    );
    c.push(
        config_map(
            "configmap-8MiB-value",
            json!({"data": {"k": "x".repeat(8 * MIB)}}),
        )
        .expect(&[413]),
    );
    c.push(
        secret(
            "secret-dockerconfigjson-not-json",
            json!({"type": "kubernetes.io/dockerconfigjson",
                   "stringData": {".dockerconfigjson": "{not json"}}),
        )
        .expect(&[422])
        .msg("dockerconfigjson"),
    );
    c.push(
        secret(
            "secret-dockerconfigjson-missing",
            json!({"type": "kubernetes.io/dockerconfigjson", "data": {}}),
        )
        .expect(&[422])
        .msg("dockerconfigjson"),
    );
    c.push(
        secret("secret-data-not-base64", json!({"data": {"k": "!!!"}}))
            .expect(&[422])
            .msg("base64"),
    );
    c.push(
        secret("secret-key-slash", json!({"stringData": {"../k": "v"}}))
            .expect(&[422])
            .msg("key"),
    );
    c.push(
        secret("secret-data-array", json!({"data": ["a"]}))
            .expect(&[422])
            .msg("data"),
    );
    c.push(
        secret(
            "secret-8MiB-value",
            json!({"stringData": {"k": "x".repeat(8 * MIB)}}),
        )
        .expect(&[413]),
    );

    // ---- instancetypes and preferences: sizes, quantities, names; the cluster kinds and
    // ControllerRevisions are the administrator's (the viewer's 403 is checked for every write).
    let it_path = format!(
        "/apis/instancetype.kubevirt.io/v1beta1/namespaces/{NS}/virtualmachineinstancetypes"
    );
    let instancetype = |name: &str, spec: Value| {
        Case::new(name, Method::POST, it_path.clone()).json(&json!({
            "apiVersion": "instancetype.kubevirt.io/v1beta1",
            "kind": "VirtualMachineInstancetype",
            "metadata": {"name": format!("hostile-{}", name.to_lowercase())},
            "spec": spec,
        }))
    };
    for (name, spec, needle) in [
        (
            "instancetype-cpu-0",
            json!({"cpu": {"guest": 0}, "memory": {"guest": "1Gi"}}),
            "cpu",
        ),
        (
            "instancetype-cpu-4-billion",
            json!({"cpu": {"guest": 4_000_000_000u64}, "memory": {"guest": "1Gi"}}),
            "cpu",
        ),
        (
            "instancetype-memory-garbage",
            json!({"cpu": {"guest": 1}, "memory": {"guest": "lots"}}),
            "memory",
        ),
        (
            "instancetype-memory-1Ei",
            json!({"cpu": {"guest": 1}, "memory": {"guest": "1Ei"}}),
            "memory",
        ),
        (
            "instancetype-overcommit-101",
            json!({"cpu": {"guest": 1}, "memory": {"guest": "1Gi", "overcommitPercent": 101}}),
            "overcommitPercent",
        ),
        (
            "instancetype-no-cpu",
            json!({"memory": {"guest": "1Gi"}}),
            "cpu",
        ),
    ] {
        c.push(instancetype(name, spec).expect(&[400, 422]).msg(needle));
    }
    c.push(
        Case::new(
            "instancetype-name-with-slash",
            Method::POST,
            it_path.clone(),
        )
        .json(&json!({
            "apiVersion": "instancetype.kubevirt.io/v1beta1",
            "kind": "VirtualMachineInstancetype",
            "metadata": {"name": "a/../b"},
            "spec": {"cpu": {"guest": 1}, "memory": {"guest": "1Gi"}},
        }))
        .expect(&[400, 422]),
    );
    // inferFromVolume reads labels of a claim in the VM's own namespace, named by a volume.
    for (name, matcher, needle) in [
        (
            "infer-volume-missing",
            json!({"inferFromVolume": "../../etc"}),
            "no volume named",
        ),
        (
            "infer-policy-unknown",
            json!({"inferFromVolume": "x", "inferFromVolumeFailurePolicy": "Always"}),
            "Reject or Ignore",
        ),
        (
            "infer-with-name",
            json!({"inferFromVolume": "x", "name": "u1.small"}),
            "mutually exclusive",
        ),
    ] {
        c.push(
            Case::new(name, Method::POST, VMS)
                .json(&vm("hostile-infer", |v| {
                    v["spec"]["instancetype"] = matcher.clone();
                }))
                .expect(&[422])
                .msg(needle),
        );
    }

    // ---- DataVolumes: sources that reach the host (file URLs, other namespaces, traversing
    // names), sizes, storage classes, and the status agents write (a viewer and an
    // administrator may not; the agent only for its own node, checked in the API tests).
    let dv_path = format!("/apis/cdi.kubevirt.io/v1beta1/namespaces/{NS}/datavolumes");
    let datavolume = |name: &str, spec: Value| {
        Case::new(name, Method::POST, dv_path.clone()).json(&json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": {"name": format!("hostile-{}", name.to_lowercase())},
            "spec": spec,
        }))
    };
    let size = json!({"resources": {"requests": {"storage": "1Gi"}}});
    for (name, spec, needle) in [
        (
            "dv-http-file-url",
            json!({"source": {"http": {"url": "file:///etc/shadow"}}, "storage": size}),
            "http",
        ),
        (
            "dv-http-url-1MiB",
            json!({"source": {"http": {"url": format!("http://x/{}", "a".repeat(MIB))}}, "storage": size}),
            "2048",
        ),
        (
            "dv-registry-not-docker",
            json!({"source": {"registry": {"url": "oci-archive:///etc/passwd"}}, "storage": size}),
            "docker://",
        ),
        (
            "dv-registry-bad-reference",
            json!({"source": {"registry": {"url": "docker://UPPER/../x:"}}, "storage": size}),
            "url",
        ),
        (
            "dv-clone-other-namespace",
            json!({"source": {"pvc": {"name": "x", "namespace": "kube-system"}}, "storage": size}),
            "namespace",
        ),
        (
            "dv-clone-traversing-name",
            json!({"source": {"pvc": {"name": "../../etc"}}, "storage": size}),
            "name",
        ),
        (
            "dv-size-1Ei",
            json!({"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Ei"}}}}),
            "64Ti",
        ),
        (
            "dv-size-negative",
            json!({"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "-1Gi"}}}}),
            "storage",
        ),
        (
            "dv-no-size",
            json!({"source": {"blank": {}}, "storage": {}}),
            "storage",
        ),
        (
            "dv-unknown-class",
            json!({"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "../ceph"}}),
            "storage class",
        ),
        (
            "dv-two-sources",
            json!({"source": {"blank": {}, "http": {"url": "http://x/y"}}, "storage": size}),
            "exactly one",
        ),
        (
            "dv-s3-source",
            json!({"source": {"s3": {"url": "s3://bucket/disk"}}, "storage": size}),
            "does not support",
        ),
        (
            "dv-backup-traversing-name",
            json!({"source": {"backup": {"name": "../../etc", "volume": "root"}}, "storage": size}),
            "backup.name",
        ),
        (
            "dv-backup-traversing-volume",
            json!({"source": {"backup": {"name": "b1", "volume": "../../shadow"}}, "storage": size}),
            "backup.volume",
        ),
        (
            "dv-backup-with-a-path",
            json!({"source": {"backup": {"name": "b1", "volume": "root", "path": "/etc/shadow"}}, "storage": size}),
            "path",
        ),
        (
            "dv-upload-with-fields",
            json!({"source": {"upload": {"path": "/etc/shadow"}}, "storage": size}),
            "upload",
        ),
        (
            "dv-archive",
            json!({"source": {"blank": {}}, "storage": size, "contentType": "archive"}),
            "contentType",
        ),
    ] {
        c.push(datavolume(name, spec).expect(&[400, 422]).msg(needle));
    }
    // ---- NetworkAttachmentDefinitions: configs that would mean more on a Multus cluster than
    // edgevirt does (other plugins, IPAM), bridge names that are paths, and VMs whose
    // networks point nowhere or whose MACs collide.
    let nad_path =
        format!("/apis/k8s.cni.cncf.io/v1/namespaces/{NS}/network-attachment-definitions");
    let nad = |name: &str, config: Value| {
        Case::new(name, Method::POST, nad_path.clone()).json(&json!({
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": format!("hostile-{}", name.to_lowercase())},
            "spec": {"config": config},
        }))
    };
    let cfg = |v: Value| json!(v.to_string());
    for (name, config, needle) in [
        (
            "nad-macvlan",
            cfg(json!({"type": "macvlan", "master": "eth0"})),
            "spec.config.type",
        ),
        (
            "nad-ipam",
            cfg(json!({"type": "bridge", "bridge": "br0", "ipam": {"type": "host-local"}})),
            "spec.config.ipam.type",
        ),
        (
            "nad-bridge-path",
            cfg(json!({"type": "bridge", "bridge": "../../etc"})),
            "spec.config.bridge",
        ),
        (
            "nad-bridge-xml",
            cfg(json!({"type": "bridge", "bridge": "b'/><x"})),
            "spec.config.bridge",
        ),
        (
            "nad-vlan-4096",
            cfg(json!({"type": "bridge", "vlan": 4096})),
            "spec.config.vlan",
        ),
        (
            "nad-vlan-negative",
            cfg(json!({"type": "bridge", "vlan": -1})),
            "spec.config.vlan",
        ),
        (
            "nad-ip-masq",
            cfg(json!({"type": "bridge", "ipMasq": true})),
            "spec.config.ipMasq",
        ),
        (
            "nad-plugin-list",
            cfg(json!({"plugins": [{"type": "bridge"}]})),
            "spec.config.plugins",
        ),
        (
            "nad-config-not-json",
            json!("{\"type\": bridge"),
            "not JSON",
        ),
        ("nad-config-number", json!(7), "config"),
        (
            "nad-config-deep",
            json!(String::from_utf8(json_array_nesting(100_000)).unwrap()),
            "spec.config",
        ),
    ] {
        c.push(nad(name, config).expect(&[400, 422]).msg(needle));
    }
    let lan_vm = |nets: Value, ifaces: Value| {
        vm("hostile-lan", |v| {
            v["spec"]["template"]["spec"]["networks"] = nets;
            domain(v)["devices"]["interfaces"] = ifaces;
        })
    };
    for (name, body, needle) in [
        (
            "vm-missing-nad",
            lan_vm(
                json!([{"name": "lan", "multus": {"networkName": "no-such-lan"}}]),
                json!([{"name": "lan", "bridge": {}}]),
            ),
            "default/no-such-lan does not exist",
        ),
        (
            "vm-nad-name-traversal",
            lan_vm(
                json!([{"name": "lan", "multus": {"networkName": "../../etc/passwd"}}]),
                json!([{"name": "lan", "bridge": {}}]),
            ),
            "networkName",
        ),
        (
            "vm-two-nics-one-mac",
            lan_vm(
                json!([{"name": "a", "pod": {}}, {"name": "b", "multus": {"networkName": "x"}}]),
                json!([{"name": "a", "masquerade": {}, "macAddress": "02:00:00:00:00:09"},
                       {"name": "b", "bridge": {}, "macAddress": "02:00:00:00:00:09"}]),
            ),
            "given to two interfaces",
        ),
        (
            "vm-multicast-mac-on-lan",
            lan_vm(
                json!([{"name": "lan", "multus": {"networkName": "x"}}]),
                json!([{"name": "lan", "bridge": {}, "macAddress": "01:00:5e:00:00:01"}]),
            ),
            "multicast",
        ),
    ] {
        c.push(
            Case::new(name, Method::POST, VMS.to_string())
                .json(&body)
                .expect(&[422])
                .msg(needle),
        );
    }
    c.push(
        Case::new("dv-template-bad-name", Method::POST, VMS.to_string())
            .json(&json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": "hostile-dv-template"},
                "spec": {"runStrategy": "Halted",
                    "dataVolumeTemplates": [{"metadata": {"name": "../x"},
                        "spec": {"source": {"blank": {}}, "storage": size}}],
                    "template": {"spec": {"domain": {"devices": {}}}}}
            }))
            .expect(&[400, 422])
            .msg("dataVolumeTemplates"),
    );
    c.push(
        Case::new(
            "dv-upload-to-nothing",
            Method::PUT,
            format!("{dv_path}/hostile-nothing/upload"),
        )
        .raw(Some("application/octet-stream"), vec![0u8; 4096])
        .expect(&[404]),
    );
    c.push(
        Case::new(
            "dv-status-by-an-operator",
            Method::PUT,
            format!("{dv_path}/hostile-nothing/status"),
        )
        .json(&json!({"status": {"phase": "Succeeded"}}))
        .expect(&[404]),
    );

    // ---- 5. selectors, 6. query parameters (reads)
    for sel in [
        "!!", "((((!!==", "a=b=c", "a in (b", "=x", "a b", "!a=b", "a=(b)",
    ] {
        c.push(
            Case::new(
                format!("labelSelector {sel}"),
                Method::GET,
                format!("{VMS}?labelSelector={}", url_encode(sel)),
            )
            .expect(&[400]),
        );
    }
    c.push(
        Case::new(
            "fieldSelector metadata.name==a==b",
            Method::GET,
            format!("{VMS}?fieldSelector={}", url_encode("metadata.name==a==b")),
        )
        .expect(&[400]),
    );
    // `a==` is Kubernetes' "a is the empty string", not an error.
    for sel in ["app=web", "app in (a,b)", "!app", "app", "a=="] {
        c.push(
            Case::new(
                format!("labelSelector {sel} (valid)"),
                Method::GET,
                format!("{VMS}?labelSelector={}", url_encode(sel)),
            )
            .expect(&[200]),
        );
    }
    for q in ["limit=-1", "limit=abc", "timeoutSeconds=x"] {
        c.push(Case::new(format!("list ?{q}"), Method::GET, format!("{VMS}?{q}")).expect(&[400]));
    }

    // ---- 7. PATCH
    for (target, path) in [("namespace", &ns), ("vm", &base)] {
        c.push(
            Case::new(
                format!("patch-{target}-metadata-null"),
                Method::PATCH,
                path.clone(),
            )
            .merge_patch(&json!({"metadata": null}))
            .expect(&[422]),
        );
        c.push(
            Case::new(
                format!("patch-{target}-rename"),
                Method::PATCH,
                path.clone(),
            )
            .merge_patch(&json!({"metadata": {"name": "hostile-renamed"}}))
            .expect(&[422]),
        );
        c.push(
            Case::new(
                format!("patch-{target}-text-plain"),
                Method::PATCH,
                path.clone(),
            )
            .raw(Some("text/plain"), &b"{\"metadata\":{}}"[..])
            .expect(&[415]),
        );
    }
    c.push(
        Case::new(
            "node-taint-time-added",
            Method::POST,
            "/apis/edgevirt.io/v1/nodes",
        )
        .json(&json!({"apiVersion": "edgevirt.io/v1", "kind": "Node",
                "metadata": {"name": "hostile-taint"},
                "spec": {"taints": [{"key": "k", "effect": "NoExecute",
                    "timeAdded": "yesterday"}]}}))
        .expect(&[422])
        .msg("timeAdded"),
    );
    c.push(
        Case::new("patch-vm-memory-1e400", Method::PATCH, base.clone())
            .merge_patch(&json!({"spec": {"template": {"spec": {"domain": {"memory": {"guest": "1e400"}}}}}}))
            .expect(&[422])
            .msg("memory"),
    );
    c.push(
        Case::new("patch-vm-label-key-space", Method::PATCH, base.clone())
            .merge_patch(&json!({"metadata": {"labels": {"a b": "x"}}}))
            .expect(&[422])
            .msg("metadata.labels"),
    );
    c.push(
        Case::new(
            "patch-vm-json-patch-copy-doubling-18",
            Method::PATCH,
            base.clone(),
        )
        .raw(Some("application/json-patch+json"), json_patch_doubling(18))
        .expect(&[413, 422])
        .extra(),
    );

    // ---- resumable image uploads: ranges are checked before a byte is written, the
    // image name before any path is made of it.
    let part = |name: &str, image: &str, range: &str| {
        Case::new(
            name,
            Method::PUT,
            format!("/apis/edgevirt.io/v1/images/{image}/upload"),
        )
        .raw(Some("application/octet-stream"), vec![0u8; 16])
        .header("content-range", range)
        .quick()
    };
    c.push(
        part(
            "upload-range-overflow",
            "hostile-part",
            "bytes 0-99999999999999999999/1",
        )
        .expect(&[400]),
    );
    c.push(part("upload-range-backwards", "hostile-part", "bytes 9-3/16").expect(&[400]));
    c.push(
        part(
            "upload-range-4PiB",
            "hostile-part",
            "bytes 0-15/4503599627370496",
        )
        .expect(&[413]),
    );
    c.push(
        part(
            "upload-range-from-the-middle",
            "hostile-part",
            "bytes 1024-1039/4096",
        )
        .expect(&[409]),
    );
    c.push(
        part(
            "upload-part-traversal-name",
            "..%2F..%2Fetc%2Fpasswd",
            "bytes 0-15/32",
        )
        .expect(&[400, 404, 422]),
    );
    // What an upload says it is: only `type=iso` or `type=disk`, and an ISO must be one
    // (40 KiB of zeros has no volume descriptor).
    c.push(
        Case::new(
            "upload-type-unknown",
            Method::PUT,
            "/apis/edgevirt.io/v1/images/hostile-iso/upload?type=..%2F..%2Fetc",
        )
        .raw(Some("application/octet-stream"), vec![0u8; 16])
        .expect(&[400])
        .quick(),
    );
    c.push(
        Case::new(
            "upload-iso-that-is-not-one",
            Method::PUT,
            "/apis/edgevirt.io/v1/images/hostile-iso/upload?type=iso",
        )
        .raw(Some("application/octet-stream"), vec![0u8; 40 << 10])
        .expect(&[422])
        .quick(),
    );
    // Reading an upload's offset needs the rights to upload: a viewer gets 403.
    let mut offset = Case::new(
        "upload-offset-traversal-name",
        Method::GET,
        "/apis/edgevirt.io/v1/images/..%2F..%2Fetc%2Fpasswd/upload",
    )
    .expect(&[400, 404, 422])
    .quick();
    offset.write = true;
    c.push(offset);

    // ---- /join (unauthenticated by design; each case from its own address, so the
    // per-address rate limit does not decide the answers)
    let join = |name: &str, ip: &str| Case::new(name, Method::POST, "/join").open().from(ip);
    c.push(
        join("join-wrong-secret", "127.0.1.1")
            .raw(Some("application/json"), join_body(&"0".repeat(48)))
            .expect(&[401]),
    );
    c.push(
        join("join-yaml-bomb-without-content-type", "127.0.1.2")
            .raw(None, yaml_laughs(9, 10))
            .expect(&[400]),
    );
    c.push(
        join("join-text-plain", "127.0.1.3")
            .raw(Some("text/plain"), join_body("x"))
            .expect(&[415]),
    );
    c.push(
        join("join-form-urlencoded", "127.0.1.4")
            .raw(
                Some("application/x-www-form-urlencoded"),
                &b"nodeName=x&secret=y&version=1"[..],
            )
            .expect(&[415]),
    );
    let mut nested = b"{\"nodeName\":\"x\",\"secret\":".to_vec();
    nested.extend(json_array_nesting(210_000));
    nested.push(b'}');
    c.push(
        join("join-420KB-nested-x2-parallel", "127.0.1.5")
            .raw(Some("application/json"), nested)
            .expect(&[413])
            .parallel(2),
    );
    c.push(
        join("join-100KiB", "127.0.1.6")
            .raw(Some("application/json"), join_body(&"s".repeat(100 * KIB)))
            .expect(&[413]),
    );
    c.push(
        join("join-json-nesting-30000", "127.0.1.7")
            .raw(Some("application/json"), json_array_nesting(30_000))
            .expect(&[400])
            .quick(),
    );
    c.push(
        join("join-yaml-6000x6000-aliases", "127.0.1.8")
            .yaml(yaml_wide_alias(6000, 6000))
            .expect(&[400])
            .msg("yaml")
            .quick(),
    );
    c.push(
        join("join-yaml-billion-laughs", "127.0.1.9")
            .yaml(yaml_laughs(9, 10))
            .expect(&[400])
            .msg("yaml")
            .quick(),
    );

    // ---- the login form (unauthenticated by design): a double-submit CSRF pair of ours
    let pair = "0123456789abcdef0123456789abcdef";
    let login = |name: &str, ip: &str| {
        Case::new(name, Method::POST, "/ui/login")
            .open()
            .html()
            .from(ip)
            .header("cookie", &format!("edgevirt_prelogin={pair}"))
    };
    c.push(
        login("login-20KiB-form", "127.0.2.1")
            .raw(
                Some("application/x-www-form-urlencoded"),
                login_body(pair, "admin", &"p".repeat(20 * KIB)).into_bytes(),
            )
            .expect(&[413]),
    );
    c.push(
        login("login-as-json", "127.0.2.2")
            .raw(
                Some("application/json"),
                &br#"{"username":"admin","password":"x"}"#[..],
            )
            .expect(&[415]),
    );

    // ---- the dashboard's graphs and activity (an admin's session): names from the path
    // are looked up, never opened as files; a range the archives lack is refused.
    if setup.session.is_some() {
        for (name, path, code) in [
            ("dashboard-node-missing", "/ui/nodes/nosuch", 404),
            (
                "dashboard-node-graphs-traversal",
                "/ui/nodes/..%2F..%2Fetc%2Fpasswd/graphs",
                404,
            ),
            (
                "dashboard-vm-graphs-missing",
                "/ui/vms/default/nosuch/graphs?range=hour",
                404,
            ),
            ("dashboard-networks", "/ui/networks", 200),
            (
                "dashboard-activity-odd-filter",
                "/ui/activity?vm=%00%2F..&node=%FF",
                200,
            ),
        ] {
            c.push(
                Case::new(name, Method::GET, path)
                    .session()
                    .html()
                    .expect(&[code]),
            );
        }
    }

    // ---- the dashboard's "create from YAML" form (an admin's session)
    if let Some((_, csrf)) = &setup.session {
        for (name, yaml) in [
            (
                "dashboard-yaml-6000x6000-aliases",
                yaml_wide_alias(6000, 6000),
            ),
            (
                "dashboard-yaml-flow-nesting-240KB",
                yaml_flow_nesting(240_000),
            ),
        ] {
            let form =
                serde_urlencoded::to_string([("csrf", csrf.as_str()), ("yaml", &yaml)]).unwrap();
            c.push(
                Case::new(name, Method::POST, "/ui/vms/yaml")
                    .session()
                    .html()
                    .raw(Some("application/x-www-form-urlencoded"), form.into_bytes())
                    .expect(&[400])
                    .quick()
                    .extra(),
            );
        }
        // The dashboard's node, migration, image, join-token and account forms: names
        // from the path are looked up through the API (never opened), numbers are bounded,
        // a huge form is refused before anything is hashed.
        let form = |fields: &[(&str, &str)]| {
            let mut all = vec![("csrf", csrf.as_str())];
            all.extend_from_slice(fields);
            serde_urlencoded::to_string(all).unwrap().into_bytes()
        };
        let big = "p".repeat(100 * KIB);
        for (name, path, body, codes) in [
            (
                "dashboard-drain-missing-node",
                "/ui/nodes/nosuch/action",
                form(&[("action", "drain"), ("force", "1")]),
                &[404][..],
            ),
            (
                "dashboard-node-odd-action",
                "/ui/nodes/nosuch/action",
                form(&[("action", "reboot")]),
                &[400],
            ),
            (
                "dashboard-migrate-traversal-target",
                "/ui/vms/default/nosuch/migrate",
                form(&[("target", "../../etc/passwd")]),
                &[404, 422],
            ),
            (
                "dashboard-eject-missing-vm",
                "/ui/vms/default/nosuch/eject",
                form(&[("disk", "../../etc/passwd")]),
                &[404],
            ),
            (
                "dashboard-grow-missing-vm",
                "/ui/vms/default/nosuch/grow",
                form(&[("datavolume", "../../etc"), ("gib", "2")]),
                &[404],
            ),
            (
                "dashboard-grow-huge",
                "/ui/vms/default/nosuch/grow",
                form(&[("datavolume", "x"), ("gib", "99999999999999999999999")]),
                &[422],
            ),
            (
                "dashboard-adddisk-missing-vm",
                "/ui/vms/default/nosuch/adddisk",
                form(&[("gib", "1")]),
                &[404],
            ),
            (
                "dashboard-adddisk-huge",
                "/ui/vms/default/nosuch/adddisk",
                form(&[("gib", "99999999999999999999999")]),
                &[422],
            ),
            (
                "dashboard-detach-missing-vm",
                "/ui/vms/default/nosuch/detach",
                form(&[("disk", "data")]),
                &[404],
            ),
            (
                "dashboard-detach-traversal-disk",
                "/ui/vms/default/nosuch/detach",
                form(&[("disk", "../../etc")]),
                &[422],
            ),
            (
                "dashboard-snapshot-missing-vm",
                "/ui/vms/default/nosuch/snapshot",
                form(&[]),
                &[404],
            ),
            (
                "dashboard-restore-traversal-snapshot",
                "/ui/vms/default/nosuch/restore",
                form(&[("snapshot", "../../etc/passwd")]),
                &[404],
            ),
            (
                "dashboard-restore-without-snapshot",
                "/ui/vms/default/nosuch/restore",
                form(&[]),
                &[404],
            ),
            (
                "dashboard-deletesnapshot-missing",
                "/ui/vms/default/nosuch/deletesnapshot",
                form(&[("snapshot", "nosuch")]),
                &[404],
            ),
            (
                "dashboard-backup-missing-vm",
                "/ui/vms/default/nosuch/backup",
                form(&[("target", "nas")]),
                &[404],
            ),
            (
                "dashboard-backup-traversal-target",
                "/ui/vms/default/hostile-base/backup",
                form(&[("target", "../../etc")]),
                &[422],
            ),
            (
                "dashboard-deletebackup-traversal",
                "/ui/vms/default/hostile-base/deletebackup",
                form(&[("backup", "../../etc/passwd")]),
                &[404],
            ),
            (
                "dashboard-verifybackup-traversal",
                "/ui/vms/default/hostile-base/verifybackup",
                form(&[("backup", "../../etc/passwd")]),
                &[404],
            ),
            (
                "dashboard-restorebackup-traversal",
                "/ui/vms/default/hostile-base/restorebackup",
                form(&[("backup", "../x"), ("as", "../../etc")]),
                &[404],
            ),
            (
                "dashboard-restorebackup-missing-backup",
                "/ui/vms/default/hostile-base/restorebackup",
                form(&[("backup", "nosuch"), ("as", "copy")]),
                &[404],
            ),
            (
                "dashboard-schedule-traversal-name",
                "/ui/backups/schedules",
                form(&[
                    ("name", "../../etc"),
                    ("target", "nas"),
                    ("vms", "a"),
                    ("every", "1h"),
                ]),
                &[422],
            ),
            (
                "dashboard-schedule-huge-keep",
                "/ui/backups/schedules",
                form(&[
                    ("name", "s"),
                    ("target", "nas"),
                    ("vms", "a"),
                    ("every", "1h"),
                    ("keep_last", "99999999999"),
                ]),
                &[422],
            ),
            (
                "dashboard-schedule-every-nanosecond",
                "/ui/backups/schedules",
                form(&[
                    ("name", "s"),
                    ("target", "nas"),
                    ("vms", "a"),
                    ("every", "1ns"),
                ]),
                &[422],
            ),
            (
                "dashboard-schedule-suspend-traversal",
                "/ui/backups/schedules/..%2F..%2Fetc/x/suspend",
                form(&[("suspend", "true")]),
                &[400, 404, 422],
            ),
            (
                "dashboard-schedule-delete-missing",
                "/ui/backups/schedules/default/nosuch/delete",
                form(&[]),
                &[404],
            ),
            (
                "dashboard-eject-without-disk",
                "/ui/vms/default/nosuch/eject",
                form(&[]),
                &[400, 422],
            ),
            (
                "dashboard-image-delete-traversal",
                "/ui/images/..%2F..%2Fetc%2Fpasswd/delete",
                form(&[]),
                &[400, 404, 422],
            ),
            (
                "dashboard-join-token-hours-huge",
                "/ui/admin/jointokens",
                form(&[("hours", "99999999999999999999999")]),
                &[422],
            ),
            (
                "dashboard-password-100KiB",
                "/ui/account/password",
                form(&[("current", "x"), ("new", &big), ("again", &big)]),
                &[413, 422],
            ),
        ] {
            c.push(
                Case::new(name, Method::POST, path)
                    .session()
                    .html()
                    .raw(Some("application/x-www-form-urlencoded"), body)
                    .expect(codes)
                    .quick(),
            );
        }
    }
    c
}

// ------------------------------------------------------------------------------ HTTP

/// reqwest clients trusting serve's certificate, per source address and protocol; no
/// redirects followed.
///
/// The cases go over HTTP/2 where serve offers it (ALPN), as kubectl's do: on HTTP/1.1 a
/// server that answers before reading a large body (413, 401, 403) and closes the connection
/// makes hyper's client fail with "broken pipe" instead of returning that answer. Floods use
/// HTTP/1.1, a connection per concurrent request, as most floods do.
pub struct Clients {
    ca: Option<reqwest::Certificate>,
    timeout: Duration,
    cache: Mutex<HashMap<(Option<IpAddr>, bool), Client>>,
}

impl Clients {
    pub fn new(a: &Appliance, timeout: Duration) -> Clients {
        let ca = std::fs::read(a.dir.join("tls/server.crt"))
            .ok()
            .map(|pem| reqwest::Certificate::from_pem(&pem).unwrap());
        Clients {
            ca,
            timeout,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// HTTP/1.1 from `ip`.
    pub fn from(&self, ip: Option<IpAddr>) -> Client {
        self.client(ip, true)
    }

    /// HTTP/2 if serve offers it, from `ip`.
    pub fn alpn(&self, ip: Option<IpAddr>) -> Client {
        self.client(ip, false)
    }

    fn client(&self, ip: Option<IpAddr>, http1: bool) -> Client {
        let mut cache = self.cache.lock().unwrap();
        cache
            .entry((ip, http1))
            .or_insert_with(|| {
                let mut b = Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .timeout(self.timeout)
                    .local_address(ip);
                if http1 {
                    b = b.http1_only();
                }
                if let Some(ca) = &self.ca {
                    b = b.add_root_certificate(ca.clone());
                }
                b.build().unwrap()
            })
            .clone()
    }

    pub fn default(&self) -> Client {
        self.from(None)
    }
}

/// One answer (or the failure to get one).
#[derive(Clone, Debug, Default)]
pub struct Answer {
    pub code: Option<u16>,
    pub retry_after: Option<String>,
    pub set_cookie: Vec<String>,
    pub body: String,
    pub elapsed: Duration,
    pub error: Option<String>,
    pub version: String,
}

impl Answer {
    pub fn code(&self) -> u16 {
        self.code.unwrap_or(0)
    }
    pub fn describe(&self) -> String {
        match (&self.code, &self.error) {
            (Some(c), _) => format!(
                "{c} after {} ms: {}",
                self.elapsed.as_millis(),
                trunc(&self.body, 300)
            ),
            (None, e) => format!(
                "no answer after {} ms: {}",
                self.elapsed.as_millis(),
                e.as_deref().unwrap_or("?")
            ),
        }
    }
}

pub fn trunc(s: &str, n: usize) -> String {
    let s = s.trim();
    if s.len() <= n {
        return s.replace('\n', " ");
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", s[..end].replace('\n', " "), s.len())
}

pub async fn send(req: reqwest::RequestBuilder) -> Answer {
    let start = Instant::now();
    match req.send().await {
        Ok(r) => {
            let code = r.status().as_u16();
            let version = format!("{:?}", r.version());
            let h = r.headers();
            let retry_after = h
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let set_cookie = h
                .get_all("set-cookie")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::to_string)
                .collect();
            let (body, error) = match r.bytes().await {
                Ok(b) => (String::from_utf8_lossy(&b).into_owned(), None),
                Err(e) => (String::new(), Some(format!("reading the body: {e:#}"))),
            };
            Answer {
                code: Some(code),
                retry_after,
                set_cookie,
                body,
                elapsed: start.elapsed(),
                error,
                version,
            }
        }
        Err(e) => Answer {
            elapsed: start.elapsed(),
            error: Some(error_chain(&e)),
            ..Default::default()
        },
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

/// What is wrong with an error answer that should be a Kubernetes `Status`.
pub fn status_problem(code: u16, body: &str) -> Option<String> {
    let v: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(_) => return Some(format!("the body is not a Status: {}", trunc(body, 200))),
    };
    let mut p = Vec::new();
    if v["kind"] != "Status" {
        p.push(format!("kind {}", v["kind"]));
    }
    if v["apiVersion"] != "v1" {
        p.push(format!("apiVersion {}", v["apiVersion"]));
    }
    if v["status"] != "Failure" {
        p.push(format!("status {}", v["status"]));
    }
    if v["message"].as_str().is_none_or(|m| m.trim().is_empty()) {
        p.push("no message".into());
    }
    if v["reason"].as_str().is_none_or(|m| m.trim().is_empty()) {
        p.push("no reason".into());
    }
    if v["code"].as_u64() != Some(code as u64) {
        p.push(format!("code {} in the body", v["code"]));
    }
    (!p.is_empty()).then(|| {
        format!(
            "not a proper Status ({}): {}",
            p.join(", "),
            trunc(body, 200)
        )
    })
}

pub fn status_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_default()
}

// ------------------------------------------------------------------------------ monitor

/// `/proc/PID/status` field in KiB.
pub fn proc_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Reset the peak RSS (`VmHWM`) to the current RSS.
pub fn reset_hwm(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// One GET /healthz: (time to the whole answer, what was wrong).
pub async fn healthz_once(client: &Client, url: &str) -> (Duration, Option<String>) {
    let start = Instant::now();
    let r = client
        .get(format!("{url}/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    let err = match r {
        Ok(r) if r.status().as_u16() == 200 => match r.text().await {
            Ok(t) if t.trim() == "ok" => None,
            Ok(t) => Some(format!("answered {t:?}")),
            Err(e) => Some(format!("reading: {e}")),
        },
        Ok(r) => Some(format!("answered {}", r.status())),
        Err(e) => Some(error_chain(&e)),
    };
    (start.elapsed(), err)
}

#[derive(Clone, Debug, Default)]
pub struct Health {
    pub worst: Duration,
    pub checks: u32,
    pub failures: Vec<String>,
}

impl Health {
    fn record(&mut self, d: Duration, err: Option<String>) {
        self.checks += 1;
        self.worst = self.worst.max(d);
        if let Some(e) = err {
            self.failures
                .push(format!("{e} (after {} ms)", d.as_millis()));
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub health: Health,
    /// The peak RSS while the case ran.
    pub peak_rss_kib: u64,
    /// The RSS guard killed serve.
    pub killed: bool,
    /// `VmHWM` could be reset and read (else the peak is from 20 ms samples of VmRSS).
    pub hwm: bool,
    /// VmRSS when the case started (memory kept from earlier cases counts against the budget).
    pub start_rss_kib: u64,
}

/// Watches serve while a case runs: `/healthz` every 50 ms and its RSS every 20 ms.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    health: tokio::task::JoinHandle<Health>,
    rss: tokio::task::JoinHandle<(u64, bool)>,
    pid: u32,
    hwm: bool,
    start_rss_kib: u64,
    client: Client,
    url: String,
}

impl Monitor {
    /// Start watching serve `pid` at `url`; kill it (SIGKILL) if its RSS passes
    /// `kill_above_kib` (0: never).
    pub fn start(client: Client, url: &str, pid: u32, kill_above_kib: u64) -> Monitor {
        let hwm = reset_hwm(pid);
        let start_rss_kib = proc_kib(pid, "VmRSS").unwrap_or(0);
        let stop = Arc::new(AtomicBool::new(false));
        let health = {
            let (stop, client, url) = (stop.clone(), client.clone(), url.to_string());
            tokio::spawn(async move {
                let mut h = Health::default();
                loop {
                    let (d, err) = healthz_once(&client, &url).await;
                    h.record(d, err);
                    if stop.load(Ordering::SeqCst) {
                        return h;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if stop.load(Ordering::SeqCst) {
                        return h;
                    }
                }
            })
        };
        let rss = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut max = 0;
                while !stop.load(Ordering::SeqCst) {
                    let Some(kib) = proc_kib(pid, "VmRSS") else {
                        break;
                    };
                    max = max.max(kib);
                    if kill_above_kib > 0 && kib > kill_above_kib {
                        // Our own child: killed by its pid before it takes the host down.
                        // SAFETY: kill(2) with a pid and a signal; no memory is involved.
                        unsafe {
                            libc::kill(pid as i32, libc::SIGKILL);
                        }
                        return (max, true);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (max, false)
            })
        };
        Monitor {
            stop,
            health,
            rss,
            pid,
            hwm,
            start_rss_kib,
            client,
            url: url.to_string(),
        }
    }

    /// Keep watching for `settle` (work the server goes on with), then stop; one more
    /// /healthz at the end.
    pub async fn finish(self, settle: Duration) -> Sample {
        tokio::time::sleep(settle).await;
        self.stop.store(true, Ordering::SeqCst);
        let mut health = self.health.await.unwrap_or_default();
        let (max_rss, killed) = self.rss.await.unwrap_or_default();
        if !killed {
            let (d, err) = healthz_once(&self.client, &self.url).await;
            health.record(d, err);
        }
        let hwm = if self.hwm {
            proc_kib(self.pid, "VmHWM")
        } else {
            None
        };
        Sample {
            health,
            peak_rss_kib: max_rss.max(hwm.unwrap_or(0)),
            killed,
            hwm: hwm.is_some(),
            start_rss_kib: self.start_rss_kib,
        }
    }
}

/// serve's RSS once it has settled: the smallest of a few VmRSS samples over a second.
pub async fn idle_rss_kib(pid: u32) -> u64 {
    let mut min = u64::MAX;
    for _ in 0..5 {
        if let Some(k) = proc_kib(pid, "VmRSS") {
            min = min.min(k);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    min
}

// ------------------------------------------------------------------------------ the store

/// The stored objects hostile requests must leave alone: VMs, VMIs, migrations, namespaces
/// (identity, spec, labels, annotations, finalizers, deletion; not status or resourceVersion,
/// which the controller writes) and join tokens (whether used).
pub async fn snapshot(
    client: &Client,
    url: &str,
    token: &str,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (kind, path) in [
        ("vm", "/apis/kubevirt.io/v1/virtualmachines"),
        ("vmi", "/apis/kubevirt.io/v1/virtualmachineinstances"),
        (
            "migration",
            "/apis/kubevirt.io/v1/virtualmachineinstancemigrations",
        ),
        ("namespace", "/api/v1/namespaces"),
        ("jointoken", "/apis/edgevirt.io/v1/jointokens"),
    ] {
        let a = send(client.get(format!("{url}{path}")).bearer_auth(token)).await;
        if a.code != Some(200) {
            return Err(format!("GET {path}: {}", a.describe()));
        }
        let v: Value = serde_json::from_str(&a.body).map_err(|e| format!("GET {path}: {e}"))?;
        for i in v["items"].as_array().cloned().unwrap_or_default() {
            let (key, val) = if kind == "jointoken" {
                (
                    format!("jointoken {}", i["id"]),
                    json!({"usedBy": i["usedBy"], "description": i["description"]}),
                )
            } else {
                let m = &i["metadata"];
                (
                    format!(
                        "{kind} {}/{}",
                        m["namespace"].as_str().unwrap_or(""),
                        m["name"].as_str().unwrap_or("")
                    ),
                    json!({
                        "uid": m["uid"], "generation": m["generation"], "labels": m["labels"],
                        "annotations": m["annotations"], "finalizers": m["finalizers"],
                        "deletionTimestamp": m["deletionTimestamp"], "spec": i["spec"],
                    }),
                )
            };
            out.insert(key, trunc(&val.to_string(), 400));
        }
    }
    Ok(out)
}

/// What changed between two snapshots.
pub fn store_diff(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Option<String> {
    let mut d = Vec::new();
    for (k, v) in b {
        match a.get(k) {
            None => d.push(format!("added {k}")),
            Some(old) if old != v => d.push(format!("changed {k}: {old} -> {v}")),
            _ => {}
        }
    }
    for k in a.keys().filter(|k| !b.contains_key(*k)) {
        d.push(format!("removed {k}"));
    }
    (!d.is_empty()).then(|| d.join("; "))
}

// ------------------------------------------------------------------------------ setup

/// Make what the cases refer to: image `k`, namespace `hostile`, VM `hostile-base`, a join
/// token, and the admin's dashboard session. Problems are returned, not panicked on (an
/// older binary may lack something).
pub async fn setup(a: &Appliance, clients: &Clients) -> (Setup, Vec<String>) {
    let (c, url, tok) = (clients.default(), a.url.clone(), a.token.clone());
    let mut problems = Vec::new();
    let mut expect = |what: &str, ans: Answer, codes: &[u16]| {
        if !codes.contains(&ans.code()) {
            problems.push(format!("setup: {what}: {}", ans.describe()));
        }
    };
    let r = send(
        c.put(format!("{url}/apis/edgevirt.io/v1/images/{IMAGE}/upload"))
            .bearer_auth(&tok)
            .header("content-type", "application/octet-stream")
            .body(vec![0u8; 4096]),
    )
    .await;
    expect("uploading image k", r, &[200, 201]);
    let r = send(
        c.post(format!("{url}/api/v1/namespaces"))
            .bearer_auth(&tok)
            .json(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})),
    )
    .await;
    expect("creating namespace hostile", r, &[201]);
    // The base VM, as JSON, and the same VM as YAML in a dry run: the shape of every VM
    // case is valid, so their 422s are about the field each one changes.
    let r = send(
        c.post(format!("{url}{VMS}"))
            .bearer_auth(&tok)
            .json(&vm(BASE_VM, |_| {})),
    )
    .await;
    expect("creating VM hostile-base", r, &[201]);
    let r = send(
        c.post(format!("{url}{VMS}?dryRun=All"))
            .bearer_auth(&tok)
            .header("content-type", "application/yaml")
            .body(as_yaml(&vm("hostile-dry", |_| {}))),
    )
    .await;
    expect("creating a VM as YAML (dry run)", r, &[200, 201]);
    let r = send(
        c.post(format!("{url}/apis/edgevirt.io/v1/jointokens"))
            .bearer_auth(&tok)
            .json(&json!({"description": "hostile"})),
    )
    .await;
    expect("creating a join token", r, &[201]);
    // The admin's dashboard session (from an address of its own).
    let mut setup = Setup::default();
    let web = clients.from(Some("127.0.3.1".parse().unwrap()));
    match dashboard_session(&web, &url, &admin_password(a)).await {
        Ok(s) => setup.session = Some(s),
        Err(e) => problems.push(format!("setup: dashboard login: {e}")),
    }
    // Let the controller settle the base VM's status before the first snapshot.
    for _ in 0..50 {
        let r = send(c.get(format!("{url}{VMS}/{BASE_VM}")).bearer_auth(&tok)).await;
        if serde_json::from_str::<Value>(&r.body)
            .is_ok_and(|v| v["status"]["printableStatus"].is_string())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    (setup, problems)
}

pub fn admin_password(a: &Appliance) -> String {
    std::fs::read_to_string(a.dir.join("initial-admin"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("password="))
        .unwrap()
        .to_string()
}

// ------------------------------------------------------------------------------ logins

/// The login form's double-submit pair from `GET /ui/login`.
#[derive(Clone, Debug)]
pub struct LoginForm {
    pub cookie: String,
    pub csrf: String,
}

pub async fn prelogin(client: &Client, url: &str) -> Result<LoginForm, String> {
    let a = send(client.get(format!("{url}/ui/login"))).await;
    if a.code != Some(200) {
        return Err(format!("GET /ui/login: {}", a.describe()));
    }
    let cookie = a
        .set_cookie
        .iter()
        .find_map(|c| c.strip_prefix("edgevirt_prelogin="))
        .and_then(|c| c.split(';').next())
        .ok_or_else(|| format!("GET /ui/login set no prelogin cookie: {:?}", a.set_cookie))?
        .to_string();
    let csrf = a
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .ok_or("the login page has no csrf field")?
        .to_string();
    if csrf != cookie {
        return Err(format!(
            "the csrf field {csrf:?} is not the cookie {cookie:?}"
        ));
    }
    Ok(LoginForm { cookie, csrf })
}

pub async fn login(client: &Client, url: &str, f: &LoginForm, user: &str, pw: &str) -> Answer {
    send(
        client
            .post(format!("{url}/ui/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("cookie", format!("edgevirt_prelogin={}", f.cookie))
            .body(login_body(&f.csrf, user, pw)),
    )
    .await
}

/// A login succeeded: 303 with a session cookie.
pub fn logged_in(a: &Answer) -> bool {
    a.code == Some(303)
        && a.set_cookie
            .iter()
            .any(|c| c.starts_with("edgevirt_session="))
}

/// Log in on the dashboard: (session cookie value, the session's CSRF token).
pub async fn dashboard_session(
    client: &Client,
    url: &str,
    password: &str,
) -> Result<(String, String), String> {
    let f = prelogin(client, url).await?;
    let a = login(client, url, &f, "admin", password).await;
    if !logged_in(&a) {
        return Err(format!("POST /ui/login: {}", a.describe()));
    }
    let session = a
        .set_cookie
        .iter()
        .find_map(|c| c.strip_prefix("edgevirt_session="))
        .and_then(|c| c.split(';').next())
        .unwrap()
        .to_string();
    let page = send(
        client
            .get(format!("{url}/ui/"))
            .header("cookie", format!("edgevirt_session={session}")),
    )
    .await;
    let csrf = page
        .body
        .split("name=\"csrf-token\" content=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .ok_or_else(|| format!("GET /ui/ has no csrf-token: {}", page.describe()))?
        .to_string();
    Ok((session, csrf))
}

/// `n` logins at once.
pub async fn concurrent_logins(
    client: &Client,
    url: &str,
    f: &LoginForm,
    user: &str,
    pw: &str,
    n: usize,
) -> Vec<Answer> {
    futures::future::join_all((0..n).map(|_| login(client, url, f, user, pw))).await
}

/// `n` wrong-secret joins, `concurrency` at a time.
pub async fn join_tries(client: &Client, url: &str, n: usize, concurrency: usize) -> Vec<Answer> {
    use futures::StreamExt;
    let body = Bytes::from(join_body(&"0".repeat(48)));
    futures::stream::iter(0..n)
        .map(|_| {
            send(
                client
                    .post(format!("{url}/join"))
                    .header("content-type", "application/json")
                    .body(body.clone()),
            )
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// Answers counted by code ("none" for no answer), e.g. `401×3 429×997`.
pub fn code_counts<'a>(answers: impl IntoIterator<Item = &'a Answer>) -> String {
    let mut m: BTreeMap<String, usize> = BTreeMap::new();
    for a in answers {
        *m.entry(a.code.map_or("none".into(), |c| c.to_string()))
            .or_default() += 1;
    }
    m.iter()
        .map(|(k, n)| {
            if *n == 1 {
                k.clone()
            } else {
                format!("{k}×{n}")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

// ------------------------------------------------------------------------------ the runner

/// One case as one identity: its answers, what the monitor saw, and what was wrong.
#[derive(Clone, Debug)]
pub struct CaseResult {
    pub name: String,
    pub identity: Identity,
    pub answers: Vec<Answer>,
    pub sample: Sample,
    pub rss_over_idle_kib: i64,
    pub problems: Vec<String>,
    /// serve was restarted after this case (dead, killed or not answering).
    pub restarted: bool,
}

impl CaseResult {
    pub fn codes(&self) -> String {
        code_counts(&self.answers)
    }
    pub fn slowest(&self) -> Duration {
        self.answers
            .iter()
            .map(|a| a.elapsed)
            .max()
            .unwrap_or_default()
    }
}

/// Runs cases against an appliance, restarting serve when a case killed or wedged it.
pub struct Runner<'a> {
    pub a: &'a mut Appliance,
    pub clients: Clients,
    pub viewer_token: String,
    pub setup: Setup,
    pub idle_rss_kib: u64,
    /// Kill serve above this RSS (protects the host from a vulnerable build).
    pub kill_above_kib: u64,
    /// How long the monitor keeps watching after the answers.
    pub settle: Duration,
    pub check_store: bool,
    pub restarts: u32,
}

impl Runner<'_> {
    /// Start watching serve's `/healthz` and RSS, from an address no case sends from
    /// (127.0.0.250), so no limit of the appliance applies to the watching.
    pub fn monitor(&self) -> Monitor {
        Monitor::start(
            self.clients.from(Some("127.0.0.250".parse().unwrap())),
            &self.a.url,
            self.a.pid(),
            self.kill_above_kib,
        )
    }

    /// The answers `case` should get as `who`; `None`: the case is not sent as `who`.
    pub fn expected(case: &Case, who: Identity) -> Option<Vec<u16>> {
        match (who, case.auth) {
            (Identity::Admin, _) => Some(case.expect.clone()),
            (Identity::Anonymous, Auth::Api) => Some(vec![401]),
            (Identity::Viewer, Auth::Api) if case.write => Some(vec![403]),
            (Identity::Viewer, Auth::Api) => Some(case.expect.clone()),
            _ => None,
        }
    }

    fn request(&self, case: &Case, who: Identity) -> reqwest::RequestBuilder {
        let client = self.clients.alpn(case.from);
        let mut r = client.request(case.method.clone(), format!("{}{}", self.a.url, case.path));
        match (case.auth, who) {
            (Auth::Api, Identity::Admin) => r = r.bearer_auth(&self.a.token),
            (Auth::Api, Identity::Viewer) => r = r.bearer_auth(&self.viewer_token),
            (Auth::Session, _) => {
                if let Some((s, _)) = &self.setup.session {
                    r = r.header("cookie", format!("edgevirt_session={s}"));
                }
            }
            _ => {}
        }
        if let Some(ct) = &case.content_type {
            r = r.header("content-type", ct);
        }
        for (k, v) in &case.headers {
            r = r.header(k, v);
        }
        if !case.body.is_empty() || case.write {
            r = r.body(case.body.clone());
        }
        r
    }

    pub async fn snapshot(&self) -> Result<BTreeMap<String, String>, String> {
        snapshot(&self.clients.default(), &self.a.url, &self.a.token).await
    }

    /// Restart serve if it died or stopped answering /healthz (10 s); whether it did.
    pub async fn revive(&mut self) -> Option<String> {
        let exited = self
            .a
            .server
            .as_mut()
            .and_then(|s| s.child.as_mut())
            .map(|c| c.try_wait().ok().flatten().is_some())
            .unwrap_or(true);
        let why = if exited {
            Some("serve exited".to_string())
        } else {
            let c = self.clients.default();
            let mut last = None;
            for _ in 0..2 {
                let (_, err) = healthz_once(&c, &self.a.url).await;
                last = err;
                if last.is_none() {
                    break;
                }
            }
            last.map(|e| format!("serve stopped answering /healthz ({e})"))
        };
        if why.is_some() {
            self.a.kill9();
            self.a.spawn().await;
            self.restarts += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        why
    }

    pub async fn run(&mut self, case: &Case, who: Identity) -> Option<CaseResult> {
        let expect = Self::expected(case, who)?;
        let tag = format!("[{who}] {}", case.name);
        let mut problems = Vec::new();
        let before = if self.check_store {
            match self.snapshot().await {
                Ok(s) => Some(s),
                Err(e) => {
                    problems.push(format!("{tag}: store snapshot before: {e}"));
                    None
                }
            }
        } else {
            None
        };
        let monitor = self.monitor();
        let answers =
            futures::future::join_all((0..case.parallel).map(|_| send(self.request(case, who))))
                .await;
        let sample = monitor.finish(self.settle).await;
        let rss_over_idle_kib = sample.peak_rss_kib as i64 - self.idle_rss_kib as i64;

        for ans in &answers {
            let Some(code) = ans.code else {
                problems.push(format!("{tag}: expected {expect:?}, {}", ans.describe()));
                continue;
            };
            if !expect.contains(&code) {
                problems.push(format!(
                    "{tag}: expected {expect:?}, got {}",
                    ans.describe()
                ));
                continue;
            }
            if code >= 400 && case.status_body {
                if let Some(p) = status_problem(code, &ans.body) {
                    problems.push(format!("{tag}: {code}: {p}"));
                }
                if let Some(n) = case.message_has
                    && (who == Identity::Admin || (who == Identity::Viewer && !case.write))
                {
                    let m = status_message(&ans.body);
                    if !m.to_lowercase().contains(&n.to_lowercase()) {
                        problems.push(format!(
                            "{tag}: {code}: the message does not mention {n:?}: {}",
                            trunc(&m, 300)
                        ));
                    }
                }
            }
            if code >= 400 && !case.status_body && ans.body.trim().is_empty() {
                problems.push(format!("{tag}: {code} with an empty body"));
            }
            if code == 429 && ans.retry_after.is_none() {
                problems.push(format!("{tag}: 429 without Retry-After"));
            }
            if code == 200 && case.method == Method::GET && case.status_body {
                let ok = serde_json::from_str::<Value>(&ans.body)
                    .is_ok_and(|v| v["kind"].as_str().is_some_and(|k| k.ends_with("List")));
                if !ok {
                    problems.push(format!(
                        "{tag}: 200 but not a list: {}",
                        trunc(&ans.body, 200)
                    ));
                }
            }
            if case.quick && ans.elapsed > QUICK {
                problems.push(format!(
                    "{tag}: answered {code} after {} ms (more than {} ms)",
                    ans.elapsed.as_millis(),
                    QUICK.as_millis()
                ));
            }
        }
        problems.extend(self.judge(&tag, &sample));
        let mut restarted = false;
        if let Some(why) = self.revive().await {
            problems.push(format!("{tag}: {why}; restarted it"));
            restarted = true;
        } else if let (Some(b), true) = (before, self.check_store) {
            match self.snapshot().await {
                Ok(after) => {
                    if let Some(d) = store_diff(&b, &after) {
                        problems.push(format!("{tag}: the store changed: {d}"));
                    }
                }
                Err(e) => problems.push(format!("{tag}: store snapshot after: {e}")),
            }
        }
        Some(CaseResult {
            name: case.name.clone(),
            identity: who,
            answers,
            sample,
            rss_over_idle_kib,
            problems,
            restarted,
        })
    }

    /// Problems with /healthz and RSS during a case or flood.
    pub fn judge(&self, tag: &str, s: &Sample) -> Vec<String> {
        let mut p = Vec::new();
        if s.killed {
            p.push(format!(
                "{tag}: serve's RSS passed {} MiB: killed it",
                self.kill_above_kib / 1024
            ));
        }
        if !s.health.failures.is_empty() {
            p.push(format!(
                "{tag}: /healthz failed {} of {} times: {}",
                s.health.failures.len(),
                s.health.checks,
                s.health.failures[0]
            ));
        }
        if s.health.worst >= HEALTHZ_BUDGET {
            p.push(format!(
                "{tag}: /healthz took {} ms (budget {} ms)",
                s.health.worst.as_millis(),
                HEALTHZ_BUDGET.as_millis()
            ));
        }
        let over = s.peak_rss_kib as i64 - self.idle_rss_kib as i64;
        if over >= RSS_BUDGET_KIB as i64 {
            p.push(format!(
                "{tag}: serve's peak RSS {} MiB is {} MiB over idle (budget {} MiB; {} MiB when \
                 this started)",
                s.peak_rss_kib / 1024,
                over / 1024,
                RSS_BUDGET_KIB / 1024,
                s.start_rss_kib / 1024
            ));
        }
        p
    }
}

// ------------------------------------------------------------------------------ connections

/// What a half-open connection sends before it goes quiet: half a request line (plain
/// HTTP), or the start of a TLS record that announces a ClientHello it never finishes.
pub const HALF_REQUEST_LINE: &[u8] = b"GET /apis/kubevirt.io/v1/namesp";
pub const HALF_CLIENT_HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01];

/// Open files of process `pid`.
pub fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// How an attack's connections fared.
#[derive(Debug, Default)]
pub struct HalfOpen {
    /// Connections the kernel completed and the server has not closed (as far as seen).
    pub held: Vec<tokio::net::TcpStream>,
    /// Connections the server closed while the attack went on (let go of then: a socket
    /// the server closed holds nothing of the server's, and this process has a file limit
    /// of its own).
    pub closed_early: usize,
    /// Connects that failed or timed out (a full accept queue drops SYNs; this process out
    /// of descriptors).
    pub failed: usize,
    pub first_error: Option<String>,
}

const RESET: &str = "reset at connect";

/// `n` connections to `to` from `from`, each sending `payload` and then nothing, opened
/// `batch` at a time; every connect gets `timeout`.
pub async fn half_open(
    to: std::net::SocketAddr,
    from: IpAddr,
    n: usize,
    payload: &'static [u8],
    batch: usize,
    timeout: Duration,
) -> HalfOpen {
    use tokio::io::AsyncWriteExt;
    let one = || async move {
        let sock = match from {
            IpAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
            IpAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
        }
        .map_err(|e| format!("socket: {e}"))?;
        // The port is picked at connect, per destination: bound first, every source
        // address would share one range of ports.
        {
            use std::os::fd::AsRawFd;
            let one: libc::c_int = 1;
            // SAFETY: setsockopt on a socket this closure owns, with a live int.
            unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::IPPROTO_IP,
                    libc::IP_BIND_ADDRESS_NO_PORT,
                    (&one as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
        }
        sock.bind(std::net::SocketAddr::new(from, 0))
            .map_err(|e| format!("bind: {e}"))?;
        let mut s = tokio::time::timeout(timeout, sock.connect(to))
            .await
            .map_err(|_| "connect timed out".to_string())?
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::ConnectionReset {
                    RESET.to_string()
                } else {
                    format!("connect: {e}")
                }
            })?;
        // A write to a connection the server already closed may fail: it still counts as
        // connected (the server saw and dropped it).
        let _ = s.write_all(payload).await;
        Ok::<_, String>(s)
    };
    let mut h = HalfOpen::default();
    let mut left = n;
    while left > 0 {
        let k = left.min(batch);
        left -= k;
        for r in futures::future::join_all((0..k).map(|_| one())).await {
            match r {
                Ok(s) => h.held.push(s),
                // Accepted by the kernel and reset by the server before the connect
                // returned: refused.
                Err(e) if e == RESET => h.closed_early += 1,
                Err(e) => {
                    h.failed += 1;
                    h.first_error.get_or_insert(e);
                }
            }
        }
        let before = h.held.len();
        h.held.retain(still_open);
        h.closed_early += before - h.held.len();
    }
    h
}

/// Whether the server has left `s` open, without waiting: what it sent (a TLS alert, a
/// 408) is read on to the end of file or the reset.
fn still_open(s: &tokio::net::TcpStream) -> bool {
    let mut b = [0u8; 256];
    loop {
        match s.try_read(&mut b) {
            Ok(0) => return false,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
}

/// Of `conns`, how many the server has closed (a read gives end of file or an error
/// rather than blocking), waiting at most `wait` for each still open.
pub async fn closed_by_server(conns: &mut [tokio::net::TcpStream], wait: Duration) -> usize {
    use tokio::io::AsyncReadExt;
    let mut closed = 0;
    let deadline = tokio::time::Instant::now() + wait;
    let mut buf = [0u8; 64];
    for c in conns.iter_mut() {
        loop {
            match tokio::time::timeout_at(deadline, c.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    closed += 1;
                    break;
                }
                // An answer (a TLS alert, a 408): read on to the close.
                Ok(Ok(_)) => continue,
                Err(_) => break,
            }
        }
    }
    closed
}
