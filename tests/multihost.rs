//! Multi-host tests: a controller in this machine's root namespace and test hosts made by
//! `tests/multihost/host.sh` (a network namespace on the test bridge plus a mount namespace
//! with a libvirtd of its own), each running `edgevirt serve --role agent`. They need root and
//! the test guest, so plain `cargo test` skips them (`#[ignore]`); `scripts/test.sh` runs them.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::Locator;
use serde_json::{Value, json};
use testkit::*;

#[path = "common/chromium.rs"]
mod chromium;

const BOOT: Duration = Duration::from_secs(180);
/// The controller's address on the test bridge.
const CONTROLLER_IP: &str = "10.213.60.1";
/// NAT network of the guests on every test host (each host has its own, in its namespace).
const HOST_NAT: &str = "evmh";
const HOST_NAT_PREFIX: &str = "10.213.61";

fn host_sh(args: &[&str]) -> std::process::Output {
    Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/multihost/host.sh"
    ))
    .args(args)
    .output()
    .expect("running tests/multihost/host.sh")
}

/// One test host; `down` on drop removes it with everything that runs in it.
struct Host {
    name: String,
    data: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    agent: Option<Child>,
    /// Extra environment for the agent (e.g. a narrower simulated CPU).
    env: Vec<(String, String)>,
}

impl Host {
    fn up(name: &str, index: u8) -> Host {
        let _ = host_sh(&["down", name]);
        let out = host_sh(&["up", name, &index.to_string()]);
        assert!(
            out.status.success(),
            "host {name} did not come up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tmp = tempfile::Builder::new()
            .prefix(&format!("evmh-{name}-"))
            .tempdir_in("/var/tmp")
            .unwrap();
        Host {
            name: name.to_string(),
            data: tmp.path().to_path_buf(),
            _tmp: Some(tmp),
            agent: None,
            env: Vec::new(),
        }
    }

    /// Start the agent; returns immediately (see [`Host::wait_agent_exit`] for refusals).
    fn start_agent(&mut self, controller: &str, join_token: Option<&str>) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data.join("agent.log"))
            .unwrap();
        let mut cmd = Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/multihost/host.sh"
        ));
        cmd.args(["exec", &self.name])
            .arg(exe())
            .args(["serve", "--role", "agent"])
            .args(["--controller", controller])
            .arg("--data-dir")
            .arg(&self.data)
            .args(["--node-name", &self.name, "--accel", "qemu"])
            .args(["--nat-network", HOST_NAT, "--nat-prefix", HOST_NAT_PREFIX])
            .env("EDGEVIRT_LOG", "info,edgevirt=debug")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(t) = join_token {
            cmd.args(["--join-token", t]);
        }
        self.agent = Some(cmd.spawn().expect("starting the agent"));
    }

    /// Wait for an agent that should refuse to run; its exit status and log.
    fn wait_agent_exit(&mut self, timeout: Duration) -> (bool, String) {
        let mut child = self.agent.take().expect("agent started");
        let start = std::time::Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                let log = std::fs::read_to_string(self.data.join("agent.log")).unwrap_or_default();
                return (st.success(), log);
            }
            if start.elapsed() > timeout {
                let _ = child.kill();
                panic!("the agent of {} kept running", self.name);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILL the agent (nsenter execs it, so the child is the agent itself).
    fn kill_agent(&mut self) {
        if let Some(mut c) = self.agent.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn virsh(&self, args: &[&str]) -> (bool, String) {
        let mut a = vec!["exec", &self.name, "virsh", "-c", "qemu:///system"];
        a.extend_from_slice(args);
        let out = host_sh(&a);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )
    }

    fn domains(&self) -> Vec<String> {
        let (_, out) = self.virsh(&["list", "--name"]);
        out.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Run a program in the guest through its guest agent; its stdout.
    fn guest_exec(&self, dom: &str, path: &str, args: &[&str]) -> Option<String> {
        guest_exec_with(|a| self.virsh(a), dom, path, args)
    }

    /// Seconds since the guest booted, through its guest agent.
    fn guest_uptime(&self, dom: &str) -> Option<f64> {
        self.guest_exec(dom, "/bin/cat", &["/proc/uptime"])?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill_agent();
        kill_launchers(&self.data);
        if std::thread::panicking() {
            // The host's libvirt and QEMU logs go with its state: keep them with the data.
            let state =
                std::env::var("EDGEVIRT_MH_STATE").unwrap_or_else(|_| "/run/edgevirt-mh".into());
            let _ = std::process::Command::new("cp")
                .arg("-a")
                .arg(format!("{state}/{}/log", self.name))
                .arg(self.data.join("libvirt-log"))
                .status();
        }
        let _ = host_sh(&["down", &self.name]);
        if std::thread::panicking()
            && let Some(t) = self._tmp.take()
        {
            eprintln!("keeping {} for inspection", t.keep().display());
        }
    }
}

async fn controller() -> Appliance {
    // The bridge exists once a host is up; the controller listens on it (TLS: not loopback).
    Appliance::start(&[
        "--role",
        "controller",
        "--listen",
        &format!("{CONTROLLER_IP}:0"),
    ])
    .await
}

async fn join_token(c: &Appliance) -> String {
    let (code, v) = c
        .call(
            reqwest::Method::POST,
            "/apis/edgevirt.io/v1/jointokens",
            Some(("application/json", br#"{"ttlSeconds": 600}"#.to_vec())),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    v["token"].as_str().unwrap().to_string()
}

/// Join hosts a and b to the controller, each with a join token of its own, and wait until
/// both nodes are ready; their nodes, in that order.
async fn join_both(c: &Appliance, a: &mut Host, b: &mut Host) -> (Value, Value) {
    let (ta, tb) = (join_token(c).await, join_token(c).await);
    a.start_agent(&c.url, Some(&ta));
    b.start_agent(&c.url, Some(&tb));
    (
        wait_ready(c, "a", Duration::from_secs(60)).await,
        wait_ready(c, "b", Duration::from_secs(60)).await,
    )
}

async fn node(c: &Appliance, name: &str) -> Option<Value> {
    let (code, v) = c.get(&format!("/apis/edgevirt.io/v1/nodes/{name}")).await;
    (code == 200).then_some(v)
}

fn is_ready(n: &Value) -> bool {
    n["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

async fn wait_ready(c: &Appliance, name: &str, timeout: Duration) -> Value {
    wait_for(&format!("node {name} Ready"), timeout, || async {
        node(c, name).await.filter(is_ready)
    })
    .await
}

/// The edgevirt client a CLI user has: the controller's URL, the admin token, its CA.
fn api_client(c: &Appliance) -> edgevirt::client::Client {
    edgevirt::client::Client::new(&c.url, &c.token, Some(&c.dir.join("tls/server.crt")), false)
        .unwrap()
}

/// Through the controller's console proxy: type a command on the VM's serial console until
/// its answer comes back; everything the console said.
async fn serial_through_controller(c: &Appliance, vm: &str) -> String {
    let mut ws = api_client(c)
        .console("default", vm, "serial")
        .await
        .unwrap_or_else(|e| panic!("the serial console of {vm} through the controller: {e:#}"));
    serial_echo(&mut ws, "remote").await
}

/// Through the controller's console proxy: the first bytes of the VM's VNC server.
async fn vnc_greeting_through_controller(c: &Appliance, vm: &str) -> Vec<u8> {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let mut ws = api_client(c)
        .console("default", vm, "vnc")
        .await
        .unwrap_or_else(|e| panic!("the VNC console of {vm} through the controller: {e:#}"));
    let mut got = Vec::new();
    while got.len() < 12 {
        match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => got.extend_from_slice(&b),
            Ok(Some(Ok(_))) => {}
            other => panic!("no RFB greeting from {vm}: {other:?}"),
        }
    }
    got
}

#[tokio::test]
#[ignore = "needs root, libvirtd, network namespaces and the test guest: run scripts/test.sh"]
async fn hosts_join_vms_spread_and_a_lost_host_comes_back() {
    let mut a = Host::up("a", 11);
    let mut b = Host::up("b", 12);
    let c = controller().await;
    assert!(c.url.starts_with("https://"), "{}", c.url);
    c.import_guest().await;

    // --- Join: two agents with their own tokens.
    let (ta, tb) = (join_token(&c).await, join_token(&c).await);
    a.start_agent(&c.url, Some(&ta));
    b.start_agent(&c.url, Some(&tb));
    for h in ["a", "b"] {
        let n = wait_ready(&c, h, Duration::from_secs(60)).await;
        assert_eq!(n["status"]["accelerator"], "qemu", "{n}");
        assert!(
            !n["status"]["cpu"]["vendor"]
                .as_str()
                .unwrap_or("")
                .is_empty(),
            "{n}"
        );
        assert!(
            n["status"]["memoryBytes"].as_u64().unwrap_or(0) > 1 << 30,
            "{n}"
        );
        assert_eq!(n["status"]["version"], env!("CARGO_PKG_VERSION"), "{n}");
    }
    // Each agent keeps its own credential, and only it, bound to its node.
    let cred: Value = serde_json::from_str(
        &std::fs::read_to_string(a.data.join("agent-credential.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cred["nodeName"], "a");
    let a_token = cred["token"].as_str().unwrap().to_string();
    assert_ne!(a_token, ta, "the join token is not the credential");
    let as_a = |method: reqwest::Method, path: String, body: Value| {
        let http = c.http.clone();
        let url = format!("{}{path}", c.url);
        let t = a_token.clone();
        async move {
            let r = http
                .request(method, url)
                .bearer_auth(t)
                .header("content-type", "application/merge-patch+json")
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        }
    };
    assert_eq!(
        as_a(
            reqwest::Method::PATCH,
            "/apis/edgevirt.io/v1/nodes/b/status".into(),
            json!({"status": {"memoryBytes": 1}})
        )
        .await,
        403,
        "node a's agent may not change node b"
    );
    assert_eq!(
        as_a(
            reqwest::Method::PATCH,
            "/apis/edgevirt.io/v1/nodes/a".into(),
            json!({"spec": {"unschedulable": false}, "metadata": {"labels": {"x": "y"}}})
        )
        .await,
        200,
        "an agent may patch its own node"
    );

    // --- Refusals: a wrong secret, a used token, a token for another certificate.
    let mut x = Host::up("x", 13);
    let (secret_len, pin) = {
        let parts: Vec<&str> = ta.split('.').collect();
        (parts[1].len(), parts[2].to_string())
    };
    x.start_agent(
        &c.url,
        Some(&format!("ev1.{}.{pin}", "0".repeat(secret_len))),
    );
    let (ok, log) = x.wait_agent_exit(Duration::from_secs(30));
    assert!(!ok && log.contains("join token is not valid"), "{log}");
    x.start_agent(&c.url, Some(&ta));
    let (ok, log) = x.wait_agent_exit(Duration::from_secs(30));
    assert!(
        !ok && log.contains("join token is not valid"),
        "a used token: {log}"
    );
    let t3 = join_token(&c).await;
    let wrong_pin = t3.rsplit_once('.').unwrap().0.to_string() + "." + &"ab".repeat(32);
    x.start_agent(&c.url, Some(&wrong_pin));
    let (ok, log) = x.wait_agent_exit(Duration::from_secs(30));
    assert!(
        !ok && log.contains("not the pinned controller certificate"),
        "{log}"
    );
    x.start_agent(&c.url, None);
    let (ok, log) = x.wait_agent_exit(Duration::from_secs(30));
    assert!(!ok && log.contains("has not joined"), "{log}");
    assert!(
        node(&c, "x").await.is_none(),
        "a refused host registers nothing"
    );
    drop(x);
    // An unknown bearer token gets nothing.
    let r = c
        .http
        .get(format!(
            "{}/apis/kubevirt.io/v1/virtualmachineinstances",
            c.url
        ))
        .bearer_auth("not-a-credential")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);

    // --- Ten VMs spread over the two nodes; one that fits nowhere stays Pending, saying why.
    for i in 0..10 {
        let (code, v) = c
            .post_yaml(
                VMS,
                &Vm::guest(&format!("spread-{i}")).memory("128Mi").yaml(),
            )
            .await;
        assert_eq!(code, 201, "{v}");
    }
    let (code, v) = c
        .post_yaml(VMS, &Vm::guest("huge").memory("4096Gi").yaml())
        .await;
    assert_eq!(code, 201, "{v}");
    let mut per_node = std::collections::BTreeMap::new();
    for i in 0..10 {
        let vmi = c.wait_running(&format!("spread-{i}"), None, BOOT).await;
        *per_node
            .entry(vmi["status"]["nodeName"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    assert_eq!(per_node.len(), 2, "both nodes got VMs: {per_node:?}");
    assert!(
        per_node.values().all(|n| *n >= 4),
        "spread evenly: {per_node:?}"
    );
    assert_eq!(a.domains().len() + b.domains().len(), 10);
    let huge = wait_for(
        "the huge VMI to say why it is Pending",
        Duration::from_secs(30),
        || async {
            c.vmi("huge").await.filter(|v| {
                v["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c["type"] == "PodScheduled"
                            && c["status"] == "False"
                            && c["reason"] == "Unschedulable"
                            && c["message"]
                                .as_str()
                                .is_some_and(|m| m.contains("insufficient memory"))
                    })
                })
            })
        },
    )
    .await;
    assert_eq!(huge["status"]["phase"], "Pending", "{huge}");
    assert!(huge["status"]["nodeName"].as_str().unwrap_or("").is_empty());
    for i in 0..10 {
        c.delete(&format!("{VMS}/spread-{i}")).await;
    }
    c.delete(&format!("{VMS}/huge")).await;
    wait_for("the spread VMs gone", BOOT, || async {
        (a.domains().is_empty() && b.domains().is_empty()).then_some(())
    })
    .await;

    // --- Host b dies (agent and libvirtd killed; its QEMU keeps running): NotReady and
    // Unknown, nothing started on a; back again, Ready and Running without a reboot.
    let mut ccmd = Command::new(exe());
    ccmd.args([
        "node", "cordon", "a", "--server", &c.url, "--token", &c.token,
    ])
    .arg("--ca-cert")
    .arg(c.dir.join("tls/server.crt"));
    assert!(ccmd.status().unwrap().success(), "cordon a");
    let (code, v) = c
        .post_yaml(VMS, &Vm::guest("survivor").memory("128Mi").yaml())
        .await;
    assert_eq!(code, 201, "{v}");
    let vmi = c.wait_running("survivor", None, BOOT).await;
    assert_eq!(vmi["status"]["nodeName"], "b", "cordoned a takes no VMs");
    let uid = vmi["metadata"]["uid"].as_str().unwrap().to_string();
    let dom = wait_for("survivor's domain on b", BOOT, || async {
        b.domains().into_iter().find(|d| d.contains("survivor"))
    })
    .await;
    let up_before = wait_for("the guest agent on b", BOOT, || async {
        b.guest_uptime(&dom)
    })
    .await;
    let qemu_pid = {
        let (_, out) = b.virsh(&["qemu-monitor-command", &dom, "--hmp", "info status"]);
        assert!(out.contains("running"), "{out}");
        find_qemu_pid(&dom)
    };
    let mut ucmd = Command::new(exe());
    ucmd.args([
        "node", "uncordon", "a", "--server", &c.url, "--token", &c.token,
    ])
    .arg("--ca-cert")
    .arg(c.dir.join("tls/server.crt"));
    assert!(ucmd.status().unwrap().success(), "uncordon a");

    // --- The consoles of a VM on b, through the controller (it has no node of its own).
    let seen = serial_through_controller(&c, "survivor").await;
    assert!(
        seen.contains("survivor:"),
        "the prompt names the guest: {seen:?}"
    );
    let greeting = vnc_greeting_through_controller(&c, "survivor").await;
    assert!(greeting.starts_with(b"RFB 003."), "{greeting:?}");

    b.kill_agent();
    // Without b's agent, its consoles are unreachable, and the ticket request says why.
    let refused = wait_for(
        "console tickets refused",
        Duration::from_secs(30),
        || async {
            let r = c
                .http
                .post(format!("{}/console/tickets", c.url))
                .bearer_auth(&c.token)
                .json(&json!({"namespace": "default", "name": "survivor", "kind": "serial"}))
                .send()
                .await
                .ok()?;
            let code = r.status().as_u16();
            let v: Value = r.json().await.ok()?;
            (code == 503).then_some(v)
        },
    )
    .await;
    assert!(
        refused["message"].as_str().unwrap_or("").contains("\"b\""),
        "names the node: {refused}"
    );
    assert!(host_sh(&["kill-libvirtd", "b"]).status.success());
    let lost = Duration::from_secs(90);
    wait_for("node b NotReady", lost, || async {
        node(&c, "b").await.filter(|n| !is_ready(n))
    })
    .await;
    let vmi = wait_for("survivor Unknown", lost, || async {
        c.vmi("survivor")
            .await
            .filter(|v| v["status"]["phase"] == "Unknown")
    })
    .await;
    assert_eq!(
        vmi["metadata"]["uid"],
        uid.as_str(),
        "the same instance, not a new one"
    );
    assert_eq!(vmi["status"]["nodeName"], "b");
    assert!(
        std::path::Path::new(&format!("/proc/{qemu_pid}")).exists(),
        "the guest keeps running while its host is unreachable"
    );
    // Fencing: a VM of a NotReady node is not started elsewhere. This watches for something
    // that must not happen, so it looks for a fixed window: two controller resyncs (10 s each).
    tokio::time::sleep(Duration::from_secs(21)).await;
    assert!(
        a.domains().is_empty(),
        "nothing was started on a: {:?}",
        a.domains()
    );
    let (code, v) = c
        .get("/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances")
        .await;
    assert_eq!(code, 200);
    assert_eq!(v["items"].as_array().unwrap().len(), 1, "one instance: {v}");

    assert!(host_sh(&["start-libvirtd", "b"]).status.success());
    b.start_agent(&c.url, None); // its stored credential, no join token
    wait_ready(&c, "b", Duration::from_secs(60)).await;
    let vmi = c.wait_running("survivor", None, BOOT).await;
    assert_eq!(
        vmi["metadata"]["uid"],
        uid.as_str(),
        "adopted, not restarted"
    );
    assert_eq!(find_qemu_pid(&dom), qemu_pid, "the same QEMU process");
    let up_after = wait_for("the guest agent on b again", BOOT, || async {
        b.guest_uptime(&dom)
    })
    .await;
    assert!(
        up_after > up_before,
        "uptime did not reset: {up_before} -> {up_after}"
    );
    assert!(a.domains().is_empty());

    // A node with instances is not deleted unless the host is confirmed down.
    let (code, v) = c.delete("/apis/edgevirt.io/v1/nodes/b").await;
    assert_eq!(code, 409, "{v}");
    assert!(
        v["message"].as_str().unwrap_or("").contains("survivor"),
        "{v}"
    );
    c.delete(&format!("{VMS}/survivor")).await;
    wait_for("survivor gone", BOOT, || async {
        b.domains().is_empty().then_some(())
    })
    .await;
    wait_for("survivor's VMI gone", BOOT, || async {
        c.vmi("survivor").await.is_none().then_some(())
    })
    .await;
    let (code, v) = c.delete("/apis/edgevirt.io/v1/nodes/b").await;
    assert_eq!(code, 200, "{v}");
    let (ok, log) = b.wait_agent_exit(Duration::from_secs(60));
    assert!(!ok, "a deleted node's agent stops: {log}");
}

/// The pid of the QEMU process running domain `dom` (any namespace).
fn find_qemu_pid(dom: &str) -> u32 {
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("qemu-system") && cmd.contains(&format!("guest={dom},")) {
            return pid;
        }
    }
    panic!("no QEMU process for {dom}");
}

fn cli(c: &Appliance, args: &[&str]) -> (bool, String) {
    let out = Command::new(exe())
        .args(args)
        .args(["--server", &c.url, "--token", &c.token])
        .arg("--ca-cert")
        .arg(c.dir.join("tls/server.crt"))
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

async fn migrate(c: &Appliance, vm: &str) -> (u16, Value) {
    c.put_json(
        &format!(
            "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/{vm}/migrate"
        ),
        &json!({}),
    )
    .await
}

async fn migration(c: &Appliance, name: &str) -> Option<Value> {
    let (code, v) = c
        .get(&format!(
            "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstancemigrations/{name}"
        ))
        .await;
    (code == 200).then_some(v)
}

async fn wait_migration_phase(
    c: &Appliance,
    name: &str,
    phases: &[&str],
    timeout: Duration,
) -> Value {
    wait_for(
        &format!("migration {name} in {phases:?}"),
        timeout,
        || async {
            migration(c, name).await.filter(|m| {
                let p = m["status"]["phase"].as_str().unwrap_or("");
                assert!(
                    phases.contains(&p) || !["Succeeded", "Failed"].contains(&p),
                    "migration {name} ended {p}: {m}"
                );
                phases.contains(&p)
            })
        },
    )
    .await
}

fn domain_of(h: &Host, vm: &str) -> Option<String> {
    h.domains()
        .into_iter()
        .find(|d| d.starts_with(&format!("ev-default-{vm}-")))
}

#[tokio::test]
#[ignore = "needs root, libvirtd, network namespaces and the test guest: run scripts/test.sh"]
async fn vms_live_migrate_cancel_and_drain() {
    let mut a = Host::up("a", 11);
    let mut b = Host::up("b", 12);
    let c = controller().await;
    c.import_guest().await;
    let disk = c.dir.join("blank.qcow2");
    assert!(
        Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&disk)
            .arg("16M")
            .status()
            .unwrap()
            .success()
    );
    c.import("test-disk", &disk).await;
    // A shared storage pool both hosts mount (here: the same folder, seen from both mount
    // namespaces), with one raw disk for the claim `shared-data`.
    let pool = tempfile::Builder::new()
        .prefix("evmh-pool-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::create_dir(pool.path().join("default")).unwrap();
    let claim = pool.path().join("default/shared-data.raw");
    std::fs::File::create(&claim)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    for h in [&mut a, &mut b] {
        h.env.push((
            "EDGEVIRT_SHARED_POOL".into(),
            format!("site={}", pool.path().display()),
        ));
    }
    // b takes migrations directly from a at the address of its route to the controller; a
    // names an address b cannot reach it at (b's own loopback), so migrations to a fall
    // back to the controller's relay.
    a.env
        .push(("EDGEVIRT_MIGRATION_ADDRESS".into(), "127.0.0.1".into()));
    let (na, _) = join_both(&c, &mut a, &mut b).await;
    assert_eq!(na["status"]["sharedPool"]["name"], "site", "{na}");
    let (ok, out) = cli(&c, &["node", "list", "-o", "wide"]);
    assert!(
        ok && out.contains("POOL") && out.contains(" site "),
        "{out}"
    );

    // Three VMs on a: diskless, with a local disk, and with a disk on the shared pool. A
    // NoSchedule taint (none of them tolerates it) keeps them off b.
    let (ok, out) = cli(&c, &["node", "taint", "b", "site=office:NoSchedule"]);
    assert!(
        ok && out.contains("node/b tainted: site=office:NoSchedule"),
        "{out}"
    );
    // shared also has a DataVolume on the pool (class `site`): filled there by one node,
    // opened by whichever runs the VM.
    let shared_yaml = Vm::guest("shared")
        .memory("128Mi")
        .disk(
            "data",
            json!({"persistentVolumeClaim": {"claimName": "shared-data"}}),
        )
        .disk("scratch", json!({"dataVolume": {"name": "shared-dv"}}))
        .with(|v: &mut Value| {
            v["spec"]["dataVolumeTemplates"] = json!([{"metadata": {"name": "shared-dv"},
                "spec": {"source": {"blank": {}}, "storage": {"storageClassName": "site",
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "16Mi"}}}}}]);
        })
        .yaml();
    let sc = wait_for(
        "the pool's storage class",
        Duration::from_secs(30),
        || async {
            let (code, v) = c.get("/apis/storage.k8s.io/v1/storageclasses/site").await;
            (code == 200).then_some(v)
        },
    )
    .await;
    assert_eq!(sc["volumeBindingMode"], "Immediate", "{sc}");
    // A DataVolume named like the operator's claim disk: the fill refuses to overwrite it.
    let dvs = "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes";
    let clash = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "shared-data"},
        "spec": {"source": {"blank": {}}, "storage": {"storageClassName": "site",
            "resources": {"requests": {"storage": "16Mi"}}}}});
    let (code, v) = c.post_yaml(dvs, &clash.to_string()).await;
    assert_eq!(code, 201, "{v}");
    let failed = wait_for(
        "the clashing DataVolume refused",
        Duration::from_secs(60),
        || async {
            let (_, v) = c.get(&format!("{dvs}/shared-data")).await;
            (v["status"]["phase"] == "Failed").then_some(v)
        },
    )
    .await;
    assert!(failed.to_string().contains("never overwritten"), "{failed}");
    c.delete(&format!("{dvs}/shared-data")).await;
    assert_eq!(std::fs::metadata(&claim).unwrap().len(), 16 << 20);
    // Their eviction strategies: mig must live-migrate on a drain, disky must not move
    // (None), shared is unset (edgevirt's default: migrate).
    let evict = |s: &'static str| {
        move |v: &mut Value| v["spec"]["template"]["spec"]["evictionStrategy"] = json!(s)
    };
    for (name, yaml) in [
        (
            "mig",
            Vm::guest("mig")
                .memory("128Mi")
                .with(evict("LiveMigrate"))
                .yaml(),
        ),
        (
            "disky",
            Vm::guest("disky")
                .memory("128Mi")
                .container_disk("test-disk")
                .with(evict("None"))
                .yaml(),
        ),
        ("shared", shared_yaml),
    ] {
        let (code, v) = c.post_yaml(VMS, &yaml).await;
        assert_eq!(code, 201, "{name}: {v}");
    }
    for name in ["mig", "disky", "shared"] {
        let vmi = c.wait_running(name, None, BOOT).await;
        assert_eq!(vmi["status"]["nodeName"], "a", "{name}");
    }
    let (ok, out) = cli(&c, &["node", "taint", "b", "site-"]);
    assert!(ok && out.contains("node/b tainted: <none>"), "{out}");
    let dom = wait_for("mig's domain", BOOT, || async { domain_of(&a, "mig") }).await;
    let up0 = wait_for("mig's guest agent on a", BOOT, || async {
        a.guest_uptime(&dom)
    })
    .await;
    let vmi = c.vmi("mig").await.unwrap();
    let cond = |v: &Value| {
        v["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "LiveMigratable").cloned())
            .unwrap_or(Value::Null)
    };
    assert_eq!(cond(&vmi)["status"], "True", "{vmi}");

    // --- A disk on the pool hotplugged into mig (addvolume) goes along with it.
    let hot = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "mig-hot"},
        "spec": {"source": {"blank": {}}, "storage": {"storageClassName": "site",
            "resources": {"requests": {"storage": "16Mi"}}}}});
    let (code, v) = c.post_yaml(dvs, &hot.to_string()).await;
    assert_eq!(code, 201, "{v}");
    let (code, v) = c
        .call(
            reqwest::Method::PUT,
            "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/mig/addvolume",
            Some((
                "application/json",
                json!({"name": "hot", "volumeSource": {"dataVolume": {"name": "mig-hot"}}})
                    .to_string()
                    .into_bytes(),
            )),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    let marked = wait_for("the hotplugged disk in the guest on a", BOOT, || async {
        a.guest_exec(
            &dom,
            "/bin/sh",
            &["-c", "[ \"$(cat /sys/block/sda/size)\" = 32768 ] && printf moved-along | dd of=/dev/sda conv=fsync 2>/dev/null && echo ok"],
        )
        .filter(|o| o.trim() == "ok")
    })
    .await;
    assert_eq!(marked.trim(), "ok");
    let hot_status = |v: &Value| {
        v["status"]["volumeStatus"]
            .as_array()
            .and_then(|l| l.iter().find(|s| s["name"] == "hot").cloned())
            .unwrap_or(Value::Null)
    };
    let vmi = wait_for("hot's status", BOOT, || async {
        let v = c.vmi("mig").await?;
        (hot_status(&v)["phase"] == "Ready").then_some(v)
    })
    .await;
    let st = hot_status(&vmi);
    assert_eq!(st["target"], "sda", "{vmi}");
    assert_eq!(
        st["persistentVolumeClaimInfo"]["accessModes"],
        json!(["ReadWriteMany"]),
        "on the pool: no copy needed: {vmi}"
    );

    // --- A live migration a -> b: the guest keeps running (uptime grows), now on b.
    let (code, m) = migrate(&c, "mig").await;
    assert_eq!(code, 201, "{m}");
    let mname = m["metadata"]["name"].as_str().unwrap().to_string();
    let done = wait_migration_phase(&c, &mname, &["Succeeded"], Duration::from_secs(180)).await;
    let ms = &done["status"]["migrationState"];
    assert_eq!(
        (ms["sourceNode"].as_str(), ms["targetNode"].as_str()),
        (Some("a"), Some("b")),
        "{done}"
    );
    assert_eq!(ms["completed"], true, "{done}");
    // It went straight from a to b, at the address b published.
    assert_eq!(ms["targetNodeAddress"], "10.213.60.12", "{done}");
    let ports = ms["targetDirectMigrationNodePorts"].as_object().cloned();
    assert_eq!(ports.map(|p| p.len()), Some(1), "{done}");
    let alog = std::fs::read_to_string(a.data.join("agent.log")).unwrap();
    assert!(
        alog.contains("migration streams go directly to the target")
            && !alog.contains("the controller relays the migration"),
        "a's agent log: {alog}"
    );
    let vmi = c.vmi("mig").await.unwrap();
    assert_eq!(vmi["status"]["nodeName"], "b", "{vmi}");
    assert_eq!(vmi["status"]["migrationState"]["completed"], true, "{vmi}");
    assert!(
        vmi["status"]["migrationState"]["endTimestamp"].is_string(),
        "{vmi}"
    );
    assert!(domain_of(&a, "mig").is_none(), "the domain left a");
    let up1 = wait_for("mig's guest agent on b", BOOT, || async {
        b.guest_uptime(&dom)
    })
    .await;
    assert!(up1 > up0, "the guest did not reboot: uptime {up0} -> {up1}");
    // The hotplugged disk came along under the same name, with what the guest wrote.
    let kept = b
        .guest_exec(&dom, "/bin/sh", &["-c", "head -c 11 /dev/sda"])
        .unwrap_or_default();
    assert_eq!(kept, "moved-along", "the hotplugged disk on b");
    let (_, xml) = b.virsh(&["dumpxml", &dom]);
    assert!(xml.contains("ua-hot"), "{xml}");
    let vmi = c.wait_running("mig", None, BOOT).await;
    assert_eq!(vmi["status"]["nodeName"], "b", "adopted on b: {vmi}");

    // --- A migration cancelled mid-flight (the link throttled) leaves the VM on b.
    let tc = |args: &str| {
        let mut a = vec!["exec", "b", "tc"];
        a.extend(args.split(' '));
        host_sh(&a)
    };
    let out = tc("qdisc add dev eth0 root tbf rate 1mbit burst 32kbit latency 400ms");
    assert!(
        out.status.success(),
        "tc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, m) = migrate(&c, "mig").await;
    assert_eq!(code, 201, "{m}");
    let mname = m["metadata"]["name"].as_str().unwrap().to_string();
    wait_migration_phase(&c, &mname, &["Running"], Duration::from_secs(120)).await;
    // Let data flow for a moment so the abort hits a migration in progress.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (code, v) = c
        .delete(&format!(
            "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstancemigrations/{mname}"
        ))
        .await;
    assert_eq!(code, 200, "{v}");
    wait_for(
        "the cancelled migration gone",
        Duration::from_secs(120),
        || async { migration(&c, &mname).await.is_none().then_some(()) },
    )
    .await;
    assert!(tc("qdisc del dev eth0 root").status.success());
    // a's address was not reachable from b: the relay carried it.
    let blog = std::fs::read_to_string(b.data.join("agent.log")).unwrap();
    assert!(
        blog.contains("the target's direct migration path cannot be reached; the controller relays the migration"),
        "b's agent log: {blog}"
    );
    let vmi = c.vmi("mig").await.unwrap();
    assert_eq!(vmi["status"]["nodeName"], "b", "{vmi}");
    assert_eq!(
        vmi["status"]["migrationState"]["abortStatus"], "Succeeded",
        "{vmi}"
    );
    assert_eq!(vmi["status"]["migrationState"]["completed"], false, "{vmi}");
    let up2 = wait_for("mig's guest agent still on b", BOOT, || async {
        b.guest_uptime(&dom)
    })
    .await;
    assert!(up2 > up1, "still the same guest: {up1} -> {up2}");
    wait_for("nothing left on a", Duration::from_secs(60), || async {
        domain_of(&a, "mig").is_none().then_some(())
    })
    .await;

    // --- A local disk: not live-migratable, with the reason; asking is refused.
    let vmi = c.vmi("disky").await.unwrap();
    assert_eq!(cond(&vmi)["status"], "False", "{vmi}");
    assert_eq!(cond(&vmi)["reason"], "DisksNotLiveMigratable", "{vmi}");
    let (code, v) = migrate(&c, "disky").await;
    assert_eq!(code, 422, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap_or("")
            .contains("DisksNotLiveMigratable"),
        "{v}"
    );
    // --- A disk on the shared pool: live-migratable without a copy. A marker the guest
    // writes on a (straight to the file: cache='none') is in the pool's file on the host.
    let sdom = wait_for("shared's domain", BOOT, || async {
        domain_of(&a, "shared")
    })
    .await;
    let vmi = c.vmi("shared").await.unwrap();
    assert_eq!(cond(&vmi)["status"], "True", "{vmi}");
    let smarker = format!("edgevirt-shared-{}", std::process::id());
    let swrite = format!("printf {smarker} > /dev/vda && sync && echo written");
    wait_for("the shared marker written on a", BOOT, || async {
        a.guest_exec(&sdom, "/bin/sh", &["-c", &swrite])
            .filter(|o| o.contains("written"))
    })
    .await;
    let on_pool = std::fs::read(&claim).unwrap();
    assert_eq!(
        &on_pool[..smarker.len()],
        smarker.as_bytes(),
        "the guest writes the pool's file"
    );
    let sup0 = a.guest_uptime(&sdom).expect("shared's uptime on a");

    // --- Drain b: mig moves to a (disky and shared are there already). Then drain a:
    // disky (evictionStrategy None) stays and drain says so, while mig and shared move to b.
    let (ok, out) = cli(&c, &["node", "drain", "b"]);
    assert!(ok, "{out}");
    assert!(out.contains("default/mig: moved to a"), "{out}");
    assert_eq!(c.vmi("mig").await.unwrap()["status"]["nodeName"], "a");
    assert!(b.domains().is_empty(), "{:?}", b.domains());
    assert!(cli(&c, &["node", "uncordon", "b"]).0);
    let (ok, out) = cli(&c, &["node", "drain", "a"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("default/disky: evictionStrategy None: left running (--force stops it)"),
        "{out}"
    );
    assert!(out.contains("could not move: default/disky"), "{out}");
    assert!(
        domain_of(&a, "disky").is_some(),
        "disky was left running on a"
    );
    assert!(out.contains("default/mig: moved to b"), "{out}");
    assert_eq!(c.vmi("mig").await.unwrap()["status"]["nodeName"], "b");
    assert!(out.contains("default/shared: moved to b"), "{out}");
    // shared moved without a copy, and b's QEMU opened the pool's own file: the marker is
    // there, read past the guest's page cache, and what b's guest writes lands in it.
    let vmi = c.vmi("shared").await.unwrap();
    assert_eq!(
        (
            vmi["status"]["nodeName"].as_str(),
            vmi["status"]["migrationMethod"].as_str()
        ),
        (Some("b"), Some("LiveMigration")),
        "{vmi}"
    );
    let sread = format!(
        "echo 3 > /proc/sys/vm/drop_caches && head -c {} /dev/vda",
        smarker.len()
    );
    let got = wait_for("the shared marker read on b", BOOT, || async {
        b.guest_exec(&sdom, "/bin/sh", &["-c", &sread])
    })
    .await;
    assert_eq!(got, smarker, "b's guest reads the shared disk");
    let sup1 = b.guest_uptime(&sdom).expect("shared's uptime on b");
    assert!(
        sup1 > sup0,
        "the guest did not reboot: uptime {sup0} -> {sup1}"
    );
    let (ok, xml) = b.virsh(&["dumpxml", &sdom]);
    assert!(ok && xml.contains(&claim.display().to_string()), "{xml}");
    // The DataVolume's disk is on the pool, with edgevirt's marker beside it, and b opened it.
    let dv_disk = pool.path().join("default/shared-dv.qcow2");
    assert!(xml.contains(&dv_disk.display().to_string()), "{xml}");
    let dv_marker = || {
        std::fs::read_dir(pool.path().join("default"))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|f| f.starts_with(".shared-dv.") && f.ends_with(".edgevirt-dv"))
    };
    assert!(dv_disk.is_file() && dv_marker().is_some());
    let again = smarker.replace("shared", "from-b");
    let bwrite = format!("printf {again} > /dev/vda && sync && echo written");
    wait_for("a marker written on b", BOOT, || async {
        b.guest_exec(&sdom, "/bin/sh", &["-c", &bwrite])
            .filter(|o| o.contains("written"))
    })
    .await;
    let on_pool = std::fs::read(&claim).unwrap();
    assert_eq!(
        &on_pool[..again.len()],
        again.as_bytes(),
        "b writes the pool's file"
    );

    // --- Block migration, asked for: disky moves to b with its disk. A marker written to
    // the disk on a is read back on b past the guest's page cache: b's overlay started
    // empty, so only the copy can have brought it.
    let ddom = wait_for("disky's domain", BOOT, || async { domain_of(&a, "disky") }).await;
    let marker = format!("edgevirt-block-{}", std::process::id());
    let write = format!(
        "printf {marker} > /dev/vda && sync && echo 3 > /proc/sys/vm/drop_caches && echo written"
    );
    let out = wait_for("the marker written on a", BOOT, || async {
        a.guest_exec(&ddom, "/bin/sh", &["-c", &write])
            .filter(|o| o.contains("written"))
    })
    .await;
    assert!(out.contains("written"), "{out}");
    let dup0 = a.guest_uptime(&ddom).expect("disky's uptime on a");
    let (ok, out) = cli(&c, &["vm", "migrate", "disky", "--block", "--wait"]);
    assert!(ok, "block migration: {out}");
    let vmi = c.vmi("disky").await.unwrap();
    assert_eq!(vmi["status"]["nodeName"], "b", "{vmi}");
    assert_eq!(vmi["status"]["migrationState"]["completed"], true, "{vmi}");
    assert!(domain_of(&a, "disky").is_none(), "disky's domain left a");
    let read = format!(
        "echo 3 > /proc/sys/vm/drop_caches && head -c {} /dev/vda",
        marker.len()
    );
    let got = wait_for("the marker read on b", BOOT, || async {
        b.guest_exec(&ddom, "/bin/sh", &["-c", &read])
    })
    .await;
    assert_eq!(got, marker, "the disk's content moved with the guest");
    let dup1 = b.guest_uptime(&ddom).expect("disky's uptime on b");
    assert!(
        dup1 > dup0,
        "the guest did not reboot: uptime {dup0} -> {dup1}"
    );
    // Its consoles follow it: reached on b through the controller.
    let seen = serial_through_controller(&c, "disky").await;
    assert!(
        seen.contains("disky:"),
        "the prompt names the guest: {seen:?}"
    );
    let greeting = vnc_greeting_through_controller(&c, "disky").await;
    assert!(greeting.starts_with(b"RFB 003."), "{greeting:?}");
    // The sockets of QEMU's streams are gone on the source.
    let left = host_sh(&["exec", "a", "ls", "/run/libvirt/edgevirt-migration"]);
    let left = String::from_utf8_lossy(&left.stdout);
    assert!(!left.contains(".sock"), "left on a: {left}");

    // --- A forced drain of b: mig and shared move back to a, disky (None) is stopped;
    // its VM may start it again, as a new instance.
    assert!(cli(&c, &["node", "uncordon", "a"]).0);
    let disky_uid = c.vmi("disky").await.unwrap()["metadata"]["uid"].clone();
    let (ok, out) = cli(&c, &["node", "drain", "b", "--force"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("default/disky: stopping (evictionStrategy None)")
            && out.contains("default/disky: stopped")
            && out.contains("default/mig: moved to a")
            && out.contains("default/shared: moved to a"),
        "{out}"
    );
    assert!(
        c.vmi("disky")
            .await
            .is_none_or(|v| v["metadata"]["uid"] != disky_uid),
        "disky's instance was stopped"
    );

    // --- A NoExecute taint on disky's node: disky tolerates nothing, so it is stopped
    // there and its VM (runStrategy Always) starts it again on the other node; whatever
    // else ran there goes the same way.
    assert!(cli(&c, &["node", "uncordon", "b"]).0);
    let before = c.wait_running("disky", None, BOOT).await;
    let from = before["status"]["nodeName"].as_str().unwrap().to_string();
    let (to, from_host) = if from == "a" { ("b", &a) } else { ("a", &b) };
    let taint_arg = "maintenance:NoExecute";
    let (ok, out) = cli(&c, &["node", "taint", &from, taint_arg]);
    assert!(ok, "{out}");
    let node = c.get(&format!("/apis/edgevirt.io/v1/nodes/{from}")).await.1;
    assert!(
        node["spec"]["taints"][0]["timeAdded"].is_string(),
        "the API server stamps a NoExecute taint: {node}"
    );
    let after = wait_for(
        "disky evicted and running on the other node",
        BOOT,
        || async {
            c.vmi("disky").await.filter(|v| {
                v["metadata"]["uid"] != before["metadata"]["uid"]
                    && v["status"]["phase"] == "Running"
                    && v["status"]["nodeName"] == to
            })
        },
    )
    .await;
    assert_eq!(after["status"]["nodeName"], to);
    wait_for("nothing left on the tainted node", BOOT, || async {
        from_host.domains().is_empty().then_some(())
    })
    .await;
    assert!(cli(&c, &["node", "taint", &from, "maintenance-"]).0);

    // --- The same from the dashboard, in chromium: migrate mig to the node chosen on its
    // page, then cordon, drain and uncordon that node from the node page, following each
    // VM's fate there.
    dashboard_migrate_cordon_drain(&c).await;

    for name in ["mig", "disky", "shared"] {
        c.delete(&format!("{VMS}/{name}")).await;
    }
    wait_for("all VMs gone", BOOT, || async {
        (a.domains().is_empty() && b.domains().is_empty()).then_some(())
    })
    .await;
    // A claim's disk is the operator's: deleting its VM leaves it, contents and all. The
    // DataVolume went with its VM, and its disk and marker go from the pool.
    wait_for(
        "the DataVolume's disk swept from the pool",
        Duration::from_secs(120),
        || async { (!dv_disk.exists() && dv_marker().is_none()).then_some(()) },
    )
    .await;
    let on_pool = std::fs::read(&claim).expect("the claim's disk is still there");
    assert_eq!(&on_pool[..again.len()], again.as_bytes());
}

/// Chromium logged in to the controller's dashboard as its first administrator.
async fn dashboard(c: &Appliance) -> chromium::Driver {
    // The controller's certificate is its own: this browser does not pin it.
    let d = chromium::start_browser(&["--ignore-certificate-errors"]).await;
    let b = &d.client;
    let password = serve::initial_admin(&c.dir, "password");
    chromium::log_in(b, &c.url, "admin", &password).await;
    d
}

/// The node a running VMI is on, and the other test host.
async fn node_and_other(c: &Appliance, vm: &str) -> (String, String) {
    let vmi = c.wait_running(vm, None, BOOT).await;
    let on = vmi["status"]["nodeName"].as_str().unwrap().to_string();
    let other = if on == "a" { "b" } else { "a" };
    (on, other.to_string())
}

/// See the end of `vms_live_migrate_cancel_and_drain`.
async fn dashboard_migrate_cordon_drain(c: &Appliance) {
    let d = dashboard(c).await;
    let b = &d.client;
    let (from, to) = node_and_other(c, "mig").await;
    b.goto(&format!("{}/ui/vms/default/mig", c.url))
        .await
        .unwrap();
    let form = wait_for("the migrate form", BOOT, || async {
        let f = b.find(Locator::Id("migrate")).await.ok()?;
        f.is_displayed().await.ok()?.then_some(f)
    })
    .await;
    form.find(Locator::Id("migrate-target"))
        .await
        .unwrap()
        .select_by_value(&to)
        .await
        .unwrap();
    chromium::click(b, "action-migrate").await;
    chromium::wait_text(
        b,
        ".notice",
        "the migration accepted",
        Duration::from_secs(20),
        |t| t == "Migration of mig accepted; the status below follows it.",
    )
    .await;
    let moved = format!("moved from {from} to {to}");
    let said = chromium::wait_text(b, "#vm-migration", "the move on the VM page", BOOT, |t| {
        t.starts_with(&moved)
    })
    .await;
    println!("the VM page: {said}");
    assert_eq!(
        c.vmi("mig").await.unwrap()["status"]["nodeName"],
        to.as_str()
    );
    chromium::shot(b, "mh-01-migrated").await;

    // Cordon, then drain the node mig is now on: it moves back; disky (evictionStrategy
    // None), if it is there, stays and the page says why.
    let unschedulable = |n: String| async move {
        c.get(&format!("/apis/edgevirt.io/v1/nodes/{n}")).await.1["spec"]["unschedulable"]
            == json!(true)
    };
    b.goto(&format!("{}/ui/nodes/{to}", c.url)).await.unwrap();
    chromium::click(b, "node-cordon").await;
    chromium::wait_text(
        b,
        ".notice",
        "the cordon confirmed",
        Duration::from_secs(20),
        |t| t.starts_with(&format!("{to} is cordoned")),
    )
    .await;
    assert!(unschedulable(to.clone()).await);
    let disky_here = c
        .vmi("disky")
        .await
        .is_some_and(|v| v["status"]["nodeName"] == to.as_str());
    chromium::click(b, "node-drain").await;
    let report = chromium::wait_text(
        b,
        "#drain-report",
        "the drain report",
        Duration::from_secs(30),
        |_| true,
    )
    .await;
    println!("drain report: {report}");
    assert!(report.contains("default/mig: migrating"), "{report}");
    if disky_here {
        assert!(
            report.contains("default/disky: left running: evictionStrategy None"),
            "{report}"
        );
    }
    // The live region follows mig's migration to its end: the newest row about mig.
    let newest_mig = r#"const row = [...document.querySelectorAll('#node-moves tbody tr')]
        .find(r => r.cells[0] && r.cells[0].textContent === 'default/mig');
        return row ? row.cells[1].textContent : '';"#;
    let outcome = wait_for("mig moved off on the node page", BOOT, || async {
        let v = b.execute(newest_mig, vec![]).await.ok()?;
        let t = v.as_str()?.to_string();
        (t.starts_with("moved to") || t.starts_with("failed")).then_some(t)
    })
    .await;
    assert_eq!(outcome, format!("moved to {from}"));
    assert_eq!(
        c.vmi("mig").await.unwrap()["status"]["nodeName"],
        from.as_str()
    );
    let here = chromium::text_of(b, "#node-vm-table tbody").await.unwrap();
    assert!(!here.contains("default/mig"), "{here}");
    if disky_here {
        assert!(
            here.contains("default/disky") && here.contains("evictionStrategy None"),
            "{here}"
        );
    }
    chromium::shot(b, "mh-02-drained").await;
    chromium::click(b, "node-uncordon").await;
    chromium::wait_text(
        b,
        ".notice",
        "the uncordon confirmed",
        Duration::from_secs(20),
        |t| t == format!("{to} takes new VMs again."),
    )
    .await;
    assert!(!unschedulable(to.clone()).await);
    d.client.clone().close().await.unwrap();
}

#[tokio::test]
#[ignore = "needs root, libvirtd, network namespaces and the test guest: run scripts/test.sh"]
async fn migration_refused_when_the_target_cpu_lacks_a_feature() {
    let mut a = Host::up("a", 11);
    let mut b = Host::up("b", 12);
    // Host b's CPU lacks `aes` (this machine's /proc/cpuinfo without it, what b's agent reads).
    let narrow = b.data.join("cpuinfo-without-aes");
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    assert!(
        cpuinfo.contains(" aes "),
        "the test needs a host CPU with aes"
    );
    std::fs::write(&narrow, cpuinfo.replace(" aes ", " ")).unwrap();
    b.env
        .push(("EDGEVIRT_CPUINFO".into(), narrow.display().to_string()));
    let c = controller().await;
    c.import_guest().await;
    let (_, nb) = join_both(&c, &mut a, &mut b).await;
    assert!(
        !nb["status"]["cpu"]["flags"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "aes")),
        "b reports no aes: {nb}"
    );
    // A guest CPU that requires aes: it lands on a (b cannot run it), and cannot move to b.
    let yaml = Vm::guest("aesvm")
        .memory("128Mi")
        .cpu(json!({"cores": 1, "model": "Westmere", "features": [{"name": "aes", "policy": "require"}]}))
        .yaml();
    let (code, v) = c.post_yaml(VMS, &yaml).await;
    assert_eq!(code, 201, "{v}");
    let vmi = c.wait_running("aesvm", None, BOOT).await;
    assert_eq!(vmi["status"]["nodeName"], "a", "{vmi}");
    let (code, m) = migrate(&c, "aesvm").await;
    assert_eq!(code, 201, "{m}");
    let mname = m["metadata"]["name"].as_str().unwrap().to_string();
    let failed = wait_migration_phase(&c, &mname, &["Failed"], Duration::from_secs(60)).await;
    let why = failed["status"]["migrationState"]["failureReason"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        why.contains("b:") && why.contains("aes"),
        "names the node and the feature: {why}"
    );
    let vmi = c.vmi("aesvm").await.unwrap();
    assert_eq!(vmi["status"]["nodeName"], "a");
    assert_eq!(vmi["status"]["phase"], "Running");
    assert!(domain_of(&b, "aesvm").is_none());
    assert!(domain_of(&a, "aesvm").is_some());
    c.delete(&format!("{VMS}/aesvm")).await;
    wait_for("aesvm gone", BOOT, || async {
        a.domains().is_empty().then_some(())
    })
    .await;
}

/// The site LAN of `tests/multihost/lan.sh`, joined to the given hosts; removed on drop.
struct Lan(Vec<String>);

fn lan_sh(args: &[&str]) -> std::process::Output {
    Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/multihost/lan.sh"
    ))
    .args(args)
    .output()
    .expect("running tests/multihost/lan.sh")
}

impl Lan {
    fn up(hosts: &[&str]) -> Lan {
        let mut down = vec!["down"];
        down.extend_from_slice(hosts);
        let _ = lan_sh(&down);
        let mut up = vec!["up"];
        up.extend_from_slice(hosts);
        let out = lan_sh(&up);
        assert!(
            out.status.success(),
            "the LAN did not come up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Lan(hosts.iter().map(|h| h.to_string()).collect())
    }
    /// Whether this kernel filters VLANs on a bridge (else the LAN has no VLANs).
    fn vlans() -> bool {
        lan_sh(&["vlans"]).status.success()
    }
    /// Whether the LAN namespace `ns` gets an answer from `ip`.
    fn pings(&self, ns: &str, ip: &str) -> bool {
        lan_sh(&[
            "exec", ns, "busybox", "ping", "-c", "2", "-i", "0.2", "-W", "2", ip,
        ])
        .status
        .success()
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        let mut args = vec!["down"];
        args.extend(self.0.iter().map(String::as_str));
        let _ = lan_sh(&args);
    }
}

/// Why the scheduler cannot place the VM's instance (its PodScheduled condition).
async fn unschedulable(c: &Appliance, vm: &str) -> String {
    wait_for(
        &format!("{vm} unschedulable"),
        Duration::from_secs(60),
        || async {
            let vmi = c.vmi(vm).await?;
            let conds = vmi["status"]["conditions"].as_array()?.clone();
            conds
                .iter()
                .find(|c| c["type"] == "PodScheduled" && c["status"] == "False")
                .map(|c| c["message"].as_str().unwrap_or("").to_string())
        },
    )
    .await
}

/// The VMI's status interface named `name`, once it has an IPv4 address.
async fn lan_address(c: &Appliance, vm: &str, name: &str) -> Value {
    wait_for(
        &format!("{vm}'s interface {name} with an address"),
        BOOT,
        || async {
            let vmi = c.vmi(vm).await?;
            vmi["status"]["interfaces"]
                .as_array()?
                .iter()
                .find(|i| {
                    i["name"] == name && i["ipAddress"].as_str().is_some_and(|a| a.contains('.'))
                })
                .cloned()
        },
    )
    .await
}

#[tokio::test]
#[ignore = "needs root, libvirtd, network namespaces and the test guest: run scripts/test.sh"]
async fn vms_join_the_site_lan_and_its_vlans_and_keep_them_across_migration() {
    let mut a = Host::up("a", 11);
    let mut b = Host::up("b", 12);
    let lan = Lan::up(&["a", "b"]);
    let vlans = Lan::vlans();
    if !vlans {
        println!(
            "this kernel has no bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING): the VLAN \
             checks become checks that a VLAN network is not placed on a non-filtering bridge"
        );
    }
    let c = controller().await;
    c.import_guest().await;
    let (na, _) = join_both(&c, &mut a, &mut b).await;
    // Each node reports the operator's bridge, VLAN filtering on.
    assert!(
        na["status"]["bridges"]
            .as_array()
            .is_some_and(|bs| bs.contains(&json!({"name": "brsite", "vlanFiltering": vlans}))),
        "{na}"
    );

    // kubectl applies the NetworkAttachmentDefinitions and the VMs as a Multus cluster takes
    // them.
    let home = c.dir.join("kube");
    std::fs::create_dir_all(&home).unwrap();
    let k = Kubectl {
        bin: std::env::var_os("EDGEVIRT_KUBECTL_NEW")
            .map(PathBuf::from)
            .unwrap_or_else(|| "kubectl".into()),
        config: home.join("config"),
    };
    kubeconfig(&c, &c.token, &k.config);
    let nad = |name: &str, config: Value| {
        json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name}, "spec": {"config": config.to_string()}})
    };
    let nads = [
        nad(
            "site-lan",
            json!({"cniVersion": "0.3.1", "name": "site-lan", "type": "bridge",
            "bridge": "brsite", "macspoofchk": true, "ipam": {}}),
        ),
        nad(
            "site-vlan100",
            json!({"cniVersion": "0.3.1", "type": "bridge", "bridge": "brsite",
            "vlan": 100, "ipam": {}}),
        ),
        nad(
            "elsewhere",
            json!({"cniVersion": "0.3.1", "type": "bridge", "bridge": "brnone"}),
        ),
    ];
    let file = home.join("nads.yaml");
    let text: Vec<String> = nads
        .iter()
        .map(|n| serde_json::to_string(n).unwrap())
        .collect();
    std::fs::write(&file, text.join("\n---\n")).unwrap();
    let out = k.ok(&["apply", "-f", file.to_str().unwrap()]);
    assert!(out.contains("site-vlan100"), "{out}");
    let out = k.ok(&["get", "net-attach-def", "-o", "wide"]);
    assert!(
        out.contains("site-vlan100") && out.contains("brsite") && out.contains("100"),
        "{out}"
    );
    // What edgevirt cannot honour is refused naming the key.
    let bad = home.join("macvlan.yaml");
    std::fs::write(
        &bad,
        serde_json::to_string(&nad("mv", json!({"type": "macvlan", "master": "eth0"}))).unwrap(),
    )
    .unwrap();
    let o = k.run(&["apply", "-f", bad.to_str().unwrap()]);
    assert!(
        !o.ok && o.stderr.contains("spec.config.type"),
        "{}",
        o.stderr
    );

    // Three VMs: "lan" on the site LAN and NAT (LAN first, so kubectl's IP column shows it),
    // "v100" on VLAN 100 only, "lost" on a bridge no node has.
    let multus = |net: &str, nad: &str| json!({"name": net, "multus": {"networkName": nad}});
    let lan_vm = Vm::guest("lan")
        .memory("128Mi")
        .with(|v| {
            let t = &mut v["spec"]["template"]["spec"];
            t["domain"]["devices"]["interfaces"] = json!([
                {"name": "lan", "bridge": {}},
                {"name": "default", "masquerade": {}}]);
            t["networks"] = json!([multus("lan", "site-lan"), {"name": "default", "pod": {}}]);
        })
        .yaml();
    let one_nic = |name: &str, nad: &str| {
        Vm::guest(name)
            .memory("128Mi")
            .with(|v| {
                let t = &mut v["spec"]["template"]["spec"];
                t["domain"]["devices"]["interfaces"] = json!([{"name": "office", "bridge": {}}]);
                t["networks"] = json!([multus("office", nad)]);
            })
            .yaml()
    };
    for (name, yaml) in [
        ("lan", lan_vm),
        ("v100", one_nic("v100", "site-vlan100")),
        ("lost", one_nic("lost", "elsewhere")),
    ] {
        let f = home.join(format!("{name}.yaml"));
        std::fs::write(&f, yaml).unwrap();
        k.ok(&["apply", "-f", f.to_str().unwrap()]);
    }
    // A VM naming a NetworkAttachmentDefinition that does not exist is refused with its name.
    let f = home.join("nonad.yaml");
    std::fs::write(&f, one_nic("nonad", "no-such-net")).unwrap();
    let o = k.run(&["apply", "-f", f.to_str().unwrap()]);
    assert!(
        !o.ok && o.stderr.contains("default/no-such-net does not exist"),
        "{}",
        o.stderr
    );

    // The CLI lists the networks with their bridges, nodes and VMs; `export` gives back the
    // NetworkAttachmentDefinitions (first) and VMs as applied: applying it changes nothing.
    let (ok, out) = cli(&c, &["node", "list", "-o", "wide"]);
    let bridges = if vlans { "brsite(vlan)" } else { "brsite" };
    assert!(
        ok && out.contains("BRIDGES") && out.contains(bridges),
        "{out}"
    );
    let (ok, out) = cli(&c, &["network", "list"]);
    let row = out
        .lines()
        .find(|l| l.starts_with("site-lan "))
        .unwrap_or("");
    assert!(
        ok && row.contains("brsite") && row.contains("a,b") && row.contains(" lan "),
        "{out}"
    );
    let (ok, exported) = cli(&c, &["export"]);
    assert!(ok, "{exported}");
    let nad_at = exported.find("name: site-lan").expect("site-lan exported");
    assert!(
        nad_at < exported.find("kind: VirtualMachine").unwrap(),
        "{exported}"
    );
    let f = home.join("export.yaml");
    std::fs::write(&f, &exported).unwrap();
    let (ok, out) = cli(&c, &["vm", "apply", "-f", f.to_str().unwrap()]);
    assert!(
        ok && out.contains("networkattachmentdefinition/site-lan unchanged")
            && out.contains("virtualmachine/lan unchanged")
            && !out.contains("configured"),
        "{out}"
    );

    // "lost" stays Pending, naming the missing bridge per node.
    let why = unschedulable(&c, "lost").await;
    for n in ["a", "b"] {
        assert!(
            why.contains(&format!("{n}: no bridge brnone (network office)")),
            "{why}"
        );
    }
    assert_eq!(c.vmi("lost").await.unwrap()["status"]["phase"], "Pending");

    // "lan": both NICs get addresses, the LAN one from the site's DHCP server.
    c.wait_running("lan", None, BOOT).await;
    let lan_if = lan_address(&c, "lan", "lan").await;
    let nat_if = lan_address(&c, "lan", "default").await;
    let lan_ip = lan_if["ipAddress"].as_str().unwrap().to_string();
    let lan_mac = lan_if["mac"].as_str().unwrap().to_string();
    assert!(lan_ip.starts_with("10.213.70."), "{lan_if}");
    assert!(
        nat_if["ipAddress"]
            .as_str()
            .unwrap()
            .starts_with(HOST_NAT_PREFIX),
        "{nat_if}"
    );
    assert_ne!(nat_if["mac"], lan_if["mac"]);
    assert!(
        lan_if["infoSource"]
            .as_str()
            .unwrap()
            .contains("guest-agent"),
        "{lan_if}"
    );
    let leases = String::from_utf8_lossy(&lan_sh(&["leases"]).stdout).into_owned();
    assert!(
        leases.contains(&lan_mac) && leases.contains(&lan_ip),
        "the site's dnsmasq gave {lan_ip} to {lan_mac}: {leases}"
    );
    let out = k.ok(&["get", "vmi", "lan", "-o", "wide"]);
    assert!(out.contains(&lan_ip), "{out}");
    // The dashboard shows the NICs on the VM page, and the network with its nodes and VMs.
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let (session, _) =
        testkit::hostile::dashboard_session(&http, &c.url, &testkit::hostile::admin_password(&c))
            .await
            .unwrap();
    let page = |path: &str| {
        let req = http
            .get(format!("{}{path}", c.url))
            .header("cookie", format!("edgevirt_session={session}"));
        async move { req.send().await.unwrap().text().await.unwrap() }
    };
    let vm_page = page("/ui/vms/default/lan").await;
    assert!(
        vm_page.contains(&format!("lan (network site-lan): {lan_mac}, {lan_ip}")),
        "{vm_page}"
    );
    let nets_page = page("/ui/networks").await;
    let row = nets_page
        .split("<tr>")
        .find(|r| r.contains("default/site-lan"))
        .unwrap_or("");
    assert!(
        row.contains("brsite")
            && row.contains(">a<")
            && row.contains(">b<")
            && row.contains(">lan<"),
        "{nets_page}"
    );
    // The client reaches the VM and the VM reaches the client.
    assert!(lan.pings("c1", &lan_ip), "c1 -> lan {lan_ip}");
    let on = c.vmi("lan").await.unwrap()["status"]["nodeName"]
        .as_str()
        .unwrap()
        .to_string();
    let host = |n: &str| if n == "a" { &a } else { &b };
    let dom = domain_of(host(&on), "lan").unwrap();
    let reply = host(&on).guest_exec(&dom, "/bin/ping", &["-c", "2", "-W", "2", "10.213.70.50"]);
    assert!(
        reply
            .as_deref()
            .is_some_and(|r| r.contains("2 packets received")),
        "lan -> c1: {reply:?}"
    );
    // macspoofchk: frames from another MAC than the NIC's own are dropped.
    let dev = lan_if["interfaceName"].as_str().unwrap();
    let spoof = format!(
        "ip link set {dev} address 02:00:00:00:00:99; ping -c 2 -W 2 10.213.70.50; \
         ip link set {dev} address {lan_mac}"
    );
    let reply = host(&on).guest_exec(&dom, "/bin/sh", &["-c", &spoof]);
    assert!(
        reply
            .as_deref()
            .is_some_and(|r| r.contains("0 packets received")),
        "a spoofed MAC got through: {reply:?}"
    );
    let reply = host(&on).guest_exec(&dom, "/bin/ping", &["-c", "2", "-W", "2", "10.213.70.50"]);
    assert!(
        reply
            .as_deref()
            .is_some_and(|r| r.contains("2 packets received")),
        "lan -> c1 with its own MAC again: {reply:?}"
    );

    if !vlans {
        // No VLAN filtering on any node's bridge: the VLAN VM waits, saying why per node.
        let why = unschedulable(&c, "v100").await;
        assert!(
            why.contains("a: bridge brsite has VLAN filtering off"),
            "{why}"
        );
        k.ok(&["delete", "vm", "v100"]);
    }
    // "v100": on VLAN 100, it reaches VLAN 100's client and not VLAN 200's (same subnet).
    if vlans {
        c.wait_running("v100", None, BOOT).await;
        let v_if = lan_address(&c, "v100", "office").await;
        let v_ip = v_if["ipAddress"].as_str().unwrap().to_string();
        assert!(v_ip.starts_with("10.213.71."), "{v_if}");
        assert!(lan.pings("c100", &v_ip), "c100 -> v100 {v_ip}");
        assert!(
            !lan.pings("c200", &v_ip),
            "c200 reached v100 {v_ip} across VLANs"
        );
        assert!(
            !lan.pings("c1", &v_ip),
            "the untagged LAN reached v100 {v_ip}"
        );
    }

    // A NetworkAttachmentDefinition in use is not deleted.
    let o = k.run(&["delete", "net-attach-def", "site-lan"]);
    assert!(!o.ok && o.stderr.contains("default/lan"), "{}", o.stderr);

    // Live migration of "lan" while c1 pings it every 50 ms: same MAC and address, answers
    // on the target, pings lost within libvirt's downtime (plus one interval each side).
    let pinger = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/multihost/lan.sh"
    ))
    .args(["exec", "c1", "busybox", "ping", "-i", "0.05", &lan_ip])
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    // Its first answers, so the count starts with the VM reachable.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (code, m) = migrate(&c, "lan").await;
    assert_eq!(code, 201, "{m}");
    let mname = m["metadata"]["name"].as_str().unwrap().to_string();
    wait_migration_phase(&c, &mname, &["Succeeded"], Duration::from_secs(180)).await;
    // The target agent records libvirt's downtime just after the migration succeeds.
    let downtime = wait_for(
        "the migration's downtime",
        Duration::from_secs(30),
        || async {
            migration(&c, &mname).await?["status"]["migrationState"]["downtimeMs"].as_u64()
        },
    )
    .await;
    // Until the VM answers on the target, then a little longer.
    wait_for(
        "lan answering after the migration",
        Duration::from_secs(30),
        || async { lan.pings("c1", &lan_ip).then_some(()) },
    )
    .await;
    // SAFETY: kill(2) of a child this test started and has not reaped yet.
    unsafe { libc::kill(pinger.id() as i32, libc::SIGINT) };
    let out = pinger.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let stat = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary: {text}"))
        .to_string();
    let nums: Vec<u64> = stat
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse().ok())
        .collect();
    let (sent, got) = (nums[0], nums[1]);
    let lost = sent - got;
    println!(
        "LAN migration: {sent} pings every 50 ms, {lost} lost ({} ms), libvirt downtime {downtime} ms",
        lost * 50
    );
    assert!(
        lost * 50 <= downtime + 100,
        "{lost} pings lost ({} ms) for a downtime of {downtime} ms: {stat}",
        lost * 50
    );
    let moved = lan_address(&c, "lan", "lan").await;
    let now_on = c.vmi("lan").await.unwrap()["status"]["nodeName"].clone();
    assert_ne!(now_on, json!(on), "lan moved");
    assert_eq!(moved["mac"], json!(lan_mac));
    assert_eq!(moved["ipAddress"], json!(lan_ip));

    // "v100" migrates too: its tap gets VLAN 100 on the target.
    if !vlans {
        return;
    }
    let v_ip = lan_address(&c, "v100", "office").await["ipAddress"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, m) = migrate(&c, "v100").await;
    assert_eq!(code, 201, "{m}");
    let mname = m["metadata"]["name"].as_str().unwrap().to_string();
    wait_migration_phase(&c, &mname, &["Succeeded"], Duration::from_secs(180)).await;
    wait_for(
        "v100 answering on VLAN 100 after the migration",
        Duration::from_secs(30),
        || async { lan.pings("c100", &v_ip).then_some(()) },
    )
    .await;
    assert!(
        !lan.pings("c200", &v_ip),
        "c200 reached v100 after the migration"
    );
}

/// KubeVirt's `tpm.persistent` across a live migration: the guest stores a value in its
/// vTPM's NV storage on the host it started on (raw TPM 2.0 commands, `testkit::tpm`), moves
/// to the other while it runs and reads the value back there; the vTPM's state is then in
/// the VM's folder on that host.
#[tokio::test]
#[ignore = "needs root, libvirtd, swtpm, network namespaces and the test guest: run scripts/test.sh"]
async fn a_persistent_tpm_moves_with_a_live_migration() {
    let mut a = Host::up("a", 11);
    let mut b = Host::up("b", 12);
    let c = controller().await;
    c.import_guest().await;
    join_both(&c, &mut a, &mut b).await;
    const EFI_VAR: &str =
        "/sys/firmware/efi/efivars/EdgevirtMoved-3b0f4d4a-5a8c-4c4e-9d3e-0e5f2a1b7c6d";
    let yaml = Vm::guest("tpmvm")
        .memory("512Mi")
        .with(|v| {
            let domain = Vm::domain_of(v);
            domain["devices"]["tpm"] = json!({"persistent": true});
            domain["firmware"]["bootloader"] =
                json!({"efi": {"secureBoot": false, "persistent": true}});
        })
        .yaml();
    let (code, v) = c.post_yaml(VMS, &yaml).await;
    assert_eq!(code, 201, "{v}");
    let vmi = c.wait_running("tpmvm", None, BOOT).await;
    let (src, dst) = match vmi["status"]["nodeName"].as_str() {
        Some("a") => (&a, &b),
        _ => (&b, &a),
    };
    let dst_name = if std::ptr::eq(dst, &a) { "a" } else { "b" };
    let tpm = |h: &Host, cmd: Vec<u8>| {
        let dom = domain_of(h, "tpmvm")?;
        h.guest_exec(&dom, "/bin/sh", &["-c", &tpm::guest_shell(&cmd)])
            .and_then(|out| tpm::parse(&out))
    };
    let (rc, _) = wait_for("the guest's TPM", BOOT, || async {
        tpm(src, tpm::nv_define(8))
    })
    .await;
    assert_eq!(rc, 0, "NV_DefineSpace");
    assert_eq!(
        tpm(src, tpm::nv_write(b"migrated")).unwrap().0,
        0,
        "NV_Write"
    );
    let efivars = "mount -t efivarfs efivarfs /sys/firmware/efi/efivars 2>/dev/null";
    let set_var =
        format!("{efivars}; printf '\\007\\000\\000\\000went-along' >{EFI_VAR} && echo set");
    let dom = domain_of(src, "tpmvm").unwrap();
    assert_eq!(
        src.guest_exec(&dom, "/bin/sh", &["-c", &set_var])
            .unwrap_or_default()
            .trim(),
        "set",
        "an EFI variable written"
    );
    let read_var = format!("{efivars}; tail -c +5 {EFI_VAR}");

    let (code, m) = migrate(&c, "tpmvm").await;
    assert_eq!(code, 201, "{m}");
    let mname = m["metadata"]["name"].as_str().unwrap().to_string();
    wait_migration_phase(&c, &mname, &["Succeeded"], Duration::from_secs(120)).await;
    let vmi = c.vmi("tpmvm").await.unwrap();
    assert_eq!(vmi["status"]["nodeName"], dst_name, "{vmi}");
    let uptime = wait_for("the guest agent after the move", BOOT, || async {
        domain_of(dst, "tpmvm").and_then(|d| dst.guest_uptime(&d))
    })
    .await;
    let (rc, resp) = tpm(dst, tpm::nv_read(8)).unwrap();
    assert_eq!(rc, 0, "NV_Read after the move: {resp:02x?}");
    assert_eq!(tpm::nv_read_data(&resp).unwrap(), b"migrated");
    assert!(
        uptime > 5.0,
        "the same guest, not a new boot: up {uptime} s"
    );
    let vm_uid = c.vm("tpmvm").await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let state = dst.data.join("volumes").join(&vm_uid).join("tpm/tpm2");
    wait_for(
        "the vTPM's state in the VM's folder there",
        BOOT,
        || async {
            std::fs::read_dir(&state)
                .ok()
                .and_then(|mut d| d.next())
                .map(|_| ())
        },
    )
    .await;
    // The EFI variables: QEMU writes the flash it brought along into the target's file
    // once the guest runs there, so the VM's folder on the target holds the variable.
    let nvram = dst.data.join("volumes").join(&vm_uid).join("efi-vars.fd");
    let utf16: Vec<u8> = "EdgevirtMoved"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    wait_for("the EFI variable in the target's file", BOOT, || async {
        let file = std::fs::read(&nvram).ok()?;
        file.windows(utf16.len()).any(|w| w == utf16).then_some(())
    })
    .await;
    // A restart on the target (the source tainted): the new instance reads both back.
    let src_name = if dst_name == "a" { "b" } else { "a" };
    let (ok, out) = cli(&c, &["node", "taint", src_name, "moved=away:NoSchedule"]);
    assert!(ok, "{out}");
    let old = vmi["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(c.action("tpmvm", "restart").await, 202);
    let vmi = c.wait_running("tpmvm", Some(&old), BOOT).await;
    assert_eq!(vmi["status"]["nodeName"], dst_name, "{vmi}");
    let dom = domain_of(dst, "tpmvm").unwrap();
    let var = wait_for("the EFI variable after the restart", BOOT, || async {
        dst.guest_exec(&dom, "/bin/sh", &["-c", &read_var])
            .filter(|v| !v.is_empty())
    })
    .await;
    assert_eq!(
        var, "went-along",
        "the EFI variable on the target after a restart"
    );
    let (rc, resp) = tpm(dst, tpm::nv_read(8)).unwrap();
    assert_eq!(rc, 0, "NV_Read after the restart: {resp:02x?}");
    assert_eq!(tpm::nv_read_data(&resp).unwrap(), b"migrated");
    c.delete(&format!("{VMS}/tpmvm")).await;
    wait_for("tpmvm gone", BOOT, || async {
        (a.domains().is_empty() && b.domains().is_empty()).then_some(())
    })
    .await;
}

/// Backups on one host, restored as a new VM on the other: both hosts mount the same backup
/// target; a VM pinned to a is backed up fully, writes more, is backed up incrementally;
/// `edgevirt backup restore` of the incremental as a new VM pinned to b boots there with the
/// data disk the guest had at that moment (same SHA-256 inside both guests).
#[tokio::test]
#[ignore = "needs root, libvirtd, network namespaces and the test guest: run scripts/test.sh"]
async fn a_backup_taken_on_one_host_comes_back_as_a_new_vm_on_the_other() {
    let mut a = Host::up("a", 11);
    let mut b = Host::up("b", 12);
    let c = controller().await;
    c.import_guest().await;
    let nas = tempfile::Builder::new()
        .prefix("evmh-nas-")
        .tempdir_in("/var/tmp")
        .unwrap();
    for h in [&mut a, &mut b] {
        h.env.push((
            "EDGEVIRT_BACKUP_TARGETS".into(),
            format!("nas={}", nas.path().display()),
        ));
    }
    let (na, nb) = join_both(&c, &mut a, &mut b).await;
    for n in [&na, &nb] {
        assert_eq!(n["status"]["backupTargets"][0]["name"], "nas", "{n}");
    }
    let dvs = "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes";
    for (name, size) in [("keep-root", "128Mi"), ("keep-data", "32Mi")] {
        let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name},
            "spec": {"source": {"blank": {}},
                     "storage": {"resources": {"requests": {"storage": size}}}}});
        let (code, v) = c.post_yaml(dvs, &dv.to_string()).await;
        assert_eq!(code, 201, "{v}");
    }
    let yaml = Vm::guest("keep")
        .memory("128Mi")
        .disk_root("root", json!({"dataVolume": {"name": "keep-root"}}))
        .disk("data", json!({"dataVolume": {"name": "keep-data"}}))
        .with(|v: &mut Value| {
            v["spec"]["template"]["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": "a"});
        })
        .yaml();
    let (code, v) = c.post_yaml(VMS, &yaml).await;
    assert_eq!(code, 201, "{v}");
    c.wait_running("keep", None, BOOT).await;
    let dom = domain_of(&a, "keep").expect("keep runs on a");
    let sh = |h: &Host, dom: &str, cmd: &str| {
        h.guest_exec(dom, "/bin/sh", &["-c", cmd])
            .unwrap_or_default()
    };
    wait_for("the guest on its disk root", BOOT, || async {
        Some(sh(&a, &dom, "grep -q ' / ext2' /proc/mounts && echo disk"))
            .filter(|s| s.trim() == "disk")
    })
    .await;
    let write = |seek: u32| {
        let out = sh(
            &a,
            &dom,
            &format!(
                "dd if=/dev/urandom of=/dev/vdb bs=1M seek={seek} count=8 conv=fsync 2>/dev/null && echo ok"
            ),
        );
        assert_eq!(out.trim(), "ok");
    };
    write(0);
    let (ok, out) = cli(
        &c,
        &[
            "backup", "create", "keep", "--target", "nas", "--name", "k1",
        ],
    );
    assert!(ok && out.contains("Full backup"), "{out}");
    write(16);
    let sum = sh(&a, &dom, "sha256sum /dev/vdb");
    let sum = sum
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    assert_eq!(sum.len(), 64);
    let (ok, out) = cli(
        &c,
        &[
            "backup", "create", "keep", "--target", "nas", "--name", "k2",
        ],
    );
    assert!(ok && out.contains("Incremental backup"), "{out}");
    let (_, k2) = c
        .get("/apis/backup.kubevirt.io/v1alpha1/namespaces/default/virtualmachinebackups/k2")
        .await;
    let folder = nas.path().join(k2["status"]["path"].as_str().unwrap());

    let (ok, out) = cli(
        &c,
        &[
            "backup",
            "restore",
            folder.to_str().unwrap(),
            "--as",
            "kept",
            "--node",
            "b",
        ],
    );
    assert!(ok, "{out}");
    let vmi = c.wait_running("kept", None, BOOT).await;
    assert_eq!(vmi["status"]["nodeName"], "b", "{vmi}");
    let dom2 = domain_of(&b, "kept").expect("kept runs on b");
    wait_for("the restored guest on its disk root", BOOT, || async {
        Some(sh(&b, &dom2, "grep -q ' / ext2' /proc/mounts && echo disk"))
            .filter(|s| s.trim() == "disk")
    })
    .await;
    let got = sh(&b, &dom2, "sha256sum /dev/vdb");
    assert_eq!(
        got.split_whitespace().next(),
        Some(sum.as_str()),
        "the restored data disk on b is the guest's at the incremental backup"
    );
    // The original runs on, on a.
    assert!(domain_of(&a, "keep").is_some());
    c.delete(&format!("{VMS}/kept")).await;
    c.delete(&format!("{VMS}/keep")).await;
}
