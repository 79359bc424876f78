//! End-to-end tests on a real libvirtd (`qemu:///system`) with real TCG guests. They need
//! root, libvirtd and the test guest, so plain `cargo test` skips them (`#[ignore]`);
//! `scripts/test.sh` runs them with `--include-ignored --test-threads=1`.

use std::time::Duration;

use serde_json::json;
use testkit::*;

const BOOT: Duration = Duration::from_secs(120);
const DVS: &str = "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes";
const FIRMWARE_UUID: &str = "5d307ca9-b3ef-428c-8861-06e72d69f223";

#[tokio::test]
#[ignore = "needs root, libvirtd and the test guest: run scripts/test.sh"]
async fn vm_lifecycle_on_a_real_guest() {
    // Figures every second, so the metrics check below sees them move quickly.
    let a = Appliance::start(&["--stats-interval", "1"]).await;
    a.import_guest().await;
    let disk = a.dir.join("blank.qcow2");
    assert!(
        std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&disk)
            .arg("32M")
            .status()
            .unwrap()
            .success()
    );
    a.import("test-disk", &disk).await;
    // A cloud-init NoCloud volume too (no disk entry: it is attached as the next virtio disk).
    // And KubeVirt's `devices.rng`, which QEMU must start with.
    // The disk is a dataVolume: it belongs to the VM and outlives its instances (rename
    // keeps it below). A containerDisk's ephemeral overlay is checked with the registries.
    let yaml = Vm::guest("life")
        .disk("data", json!({"dataVolume": {"name": "test-disk"}}))
        .cloud_init("#cloud-config\nhostname: life-ci\n")
        .with(|v| Vm::domain_of(v)["devices"]["rng"] = json!({}))
        .yaml();
    let (code, v) = a.post_yaml(VMS, &yaml).await;
    assert_eq!(code, 201, "{v}");

    // Running, with the node, an address from the NAT network and guest agent details.
    let vmi = a.wait_running("life", None, BOOT).await;
    assert_eq!(vmi["status"]["nodeName"], "testnode");
    let (code, node) = a.get("/apis/edgevirt.io/v1/nodes/testnode").await;
    assert_eq!(code, 200, "{node}");
    assert_eq!(
        node["status"]["accelerator"], "qemu",
        "the accelerator is reported on the node"
    );
    assert!(
        !node["status"]["cpu"]["vendor"]
            .as_str()
            .unwrap_or("")
            .is_empty()
    );
    assert!(node["status"]["memoryBytes"].as_u64().unwrap_or(0) > 0);
    let vmi = wait_for("an IPv4 address and guest OS info", BOOT, || async {
        a.vmi("life").await.filter(|v| {
            v["status"]["interfaces"][0]["ipAddress"]
                .as_str()
                .is_some_and(|ip| ip.starts_with(&format!("{NAT_PREFIX}.")))
                && v["status"]["guestOSInfo"]["kernelRelease"].is_string()
        })
    })
    .await;
    let kernel = std::fs::read_to_string(guest_dir().join("kernel-version")).unwrap_or_default();
    let release = vmi["status"]["guestOSInfo"]["kernelRelease"]
        .as_str()
        .unwrap();
    assert!(
        kernel.contains(release) || release.contains(kernel.trim()),
        "kernel {release:?} vs {kernel:?}"
    );
    let (code, info) = a
        .get("/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/life/guestosinfo")
        .await;
    assert_eq!(code, 200, "{info}");
    assert_eq!(info["hostname"], "life");
    let vm = a.vm("life").await.unwrap();
    assert_eq!(vm["status"]["printableStatus"], "Running");
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    assert_eq!(domstate(&dom).as_deref(), Some("running"));
    let overlay = a
        .dir
        .join("volumes")
        .join(vm["metadata"]["uid"].as_str().unwrap())
        .join("data.qcow2");
    assert!(overlay.exists(), "no overlay at {}", overlay.display());
    let (_, xml) = virsh(&["dumpxml", &dom]);
    assert!(
        xml.contains("<rng model='virtio'>") && xml.contains("/dev/urandom</backend>"),
        "no virtio RNG in {xml}"
    );
    let iso = nocloud_iso(&xml);
    assert!(
        nocloud_user_data(&iso).contains("hostname: life-ci"),
        "user-data not in {iso}"
    );
    let out = std::process::Command::new("isoinfo")
        .args(["-d", "-i", &iso])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Volume id: cidata"),
        "NoCloud label missing"
    );

    let ip = vmi["status"]["interfaces"][0]["ipAddress"]
        .as_str()
        .unwrap();
    metrics_of_a_running_guest(&a, &dom, ip).await;

    // pause / unpause are visible in libvirt.
    assert_eq!(a.action("life", "pause").await, 202);
    wait_for("domain paused", Duration::from_secs(20), || async {
        (domstate(&dom).as_deref() == Some("paused")).then_some(())
    })
    .await;
    wait_for("VM Paused", Duration::from_secs(20), || async {
        a.vm("life")
            .await
            .filter(|v| v["status"]["printableStatus"] == "Paused")
    })
    .await;
    assert_eq!(
        a.action("life", "pause").await,
        409,
        "pausing twice must be refused"
    );
    assert_eq!(a.action("life", "unpause").await, 202);
    wait_for("domain running again", Duration::from_secs(20), || async {
        (domstate(&dom).as_deref() == Some("running")).then_some(())
    })
    .await;

    // softreboot: the guest restarts inside the same domain (its uptime resets).
    let up = wait_for("guest uptime", BOOT, || async { guest_uptime(&dom) }).await;
    let id = domid(&dom);
    assert_eq!(a.action("life", "softreboot").await, 202);
    wait_for("guest rebooted", BOOT, || async {
        guest_uptime(&dom).filter(|u| *u < up).map(|_| ())
    })
    .await;
    assert_eq!(domid(&dom), id, "soft reboot must not restart the domain");

    // stop: Halted, domain gone.
    assert_eq!(a.action("life", "stop").await, 202);
    wait_for("VM Stopped", BOOT, || async {
        a.vm("life")
            .await
            .filter(|v| v["status"]["printableStatus"] == "Stopped")
    })
    .await;
    assert_eq!(a.vm("life").await.unwrap()["spec"]["runStrategy"], "Halted");
    assert!(
        domstate(&dom).is_none(),
        "domain {dom} still exists after stop"
    );
    assert!(a.vmi("life").await.is_none());

    // start: Running again, a new instance.
    assert_eq!(a.action("life", "start").await, 202);
    let first = a
        .wait_running("life", Some(vmi["metadata"]["uid"].as_str().unwrap()), BOOT)
        .await;

    // restart: a new VMI.
    assert_eq!(a.action("life", "restart").await, 202);
    let second = a
        .wait_running("life", first["metadata"]["uid"].as_str(), BOOT)
        .await;
    assert_ne!(first["metadata"]["uid"], second["metadata"]["uid"]);

    // rename (stopped) keeps the disk.
    assert_eq!(a.action("life", "stop").await, 202);
    wait_for("VM Stopped", BOOT, || async {
        a.vm("life")
            .await
            .filter(|v| v["status"]["printableStatus"] == "Stopped")
    })
    .await;
    let path = "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/life/rename";
    let (code, v) = a.put_json(path, &json!({"newName": "renamed"})).await;
    assert_eq!(code, 200, "{v}");
    assert!(a.vm("life").await.is_none());
    assert_eq!(
        a.vm("renamed").await.unwrap()["metadata"]["uid"],
        vm["metadata"]["uid"]
    );
    assert_eq!(a.action("renamed", "start").await, 202);
    let renamed = a.wait_running("renamed", None, BOOT).await;
    let rdom = renamed["status"]["domainName"].as_str().unwrap();
    let (_, xml) = virsh(&["dumpxml", rdom]);
    assert!(
        xml.contains(&overlay.display().to_string()),
        "renamed VM does not use its old disk"
    );

    // delete removes domain, overlay and rows.
    let (code, _) = a.delete(&format!("{VMS}/renamed")).await;
    assert_eq!(code, 200);
    wait_for("VM, VMI and domain gone", BOOT, || async {
        (a.vm("renamed").await.is_none()
            && a.vmi("renamed").await.is_none()
            && domstate(rdom).is_none())
        .then_some(())
    })
    .await;
    assert!(
        !overlay.exists(),
        "overlay {} left behind",
        overlay.display()
    );
    assert!(a.our_domains().is_empty());
}

/// `/metrics` as Prometheus sees it while a guest works: a real Prometheus (Debian's) with
/// the shipped scrape config and rules scrapes with a viewer's token; the guest's CPU time,
/// received bytes and disk writes grow as it is sent datagrams and writes to its disk;
/// `promtool check metrics` finds nothing wrong with a scrape; without a token it is 401.
async fn metrics_of_a_running_guest(a: &Appliance, dom: &str, ip: &str) {
    let anonymous = a
        .http
        .get(format!("{}/metrics", a.url))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    let viewer = a.add_token("prometheus", "viewer").await;
    let scrape = a
        .http
        .get(format!("{}/metrics", a.url))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(scrape.status(), 200);
    let text = scrape.text().await.unwrap();
    let mut lint = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package)");
    {
        use std::io::Write;
        lint.stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = lint.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for family in [
        "kubevirt_info",
        "kubevirt_vmi_phase_count",
        "kubevirt_number_of_vms",
        "kubevirt_vmi_memory_resident_bytes",
        "kubevirt_vmi_vcpu_seconds_total",
        "edgevirt_api_requests_total",
        "edgevirt_reconcile_queue_depth",
        "edgevirt_store_size_bytes",
        "edgevirt_launchers",
        "edgevirt_node_ready",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "no {family} in the scrape"
        );
    }

    let rules = testkit::prometheus::packaging_dir().join("edgevirt-rules.yml");
    let check = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "promtool check rules: {}",
        String::from_utf8_lossy(&check.stdout)
    );
    let prom =
        testkit::prometheus::Prometheus::start(&a.dir.join("prometheus"), &a.url, &viewer).await;
    let rules = prom.rule_names().await;
    for rule in [
        "EdgevirtNodeNotReady",
        "EdgevirtVMNotRunningAsRunStrategySays",
    ] {
        assert!(
            rules.iter().any(|r| r == rule),
            "{rule} not loaded: {rules:?}"
        );
    }
    let sel = r#"{name="life",namespace="default",node="testnode"}"#;
    let cpu = format!("kubevirt_vmi_cpu_usage_seconds_total{sel}");
    // The NIC is named as the spec names it, as in KubeVirt.
    let rx = r#"sum(kubevirt_vmi_network_receive_bytes_total{name="life",namespace="default",node="testnode",interface="default"})"#.to_string();
    let written = format!("sum(kubevirt_vmi_storage_write_traffic_bytes_total{sel})");
    let before = (
        prom.value(&cpu).await,
        prom.value(&rx).await,
        prom.value(&written).await,
    );
    // Traffic in: the host sends the guest ten large UDP datagrams (to the discard port).
    // Writes: 4 MiB onto its data disk (vda), well past the start, flushed.
    let udp = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    for _ in 0..10 {
        udp.send_to(&[0u8; 1400], (ip, 9)).unwrap();
    }
    let dd = "dd if=/dev/zero of=/dev/vda bs=65536 seek=256 count=64 && sync && echo done";
    assert_eq!(
        guest_exec(dom, "/bin/sh", &["-c", dd])
            .as_deref()
            .map(str::trim),
        Some("done")
    );
    let after = wait_for("the counters to grow in Prometheus", BOOT, || async {
        let now = (
            prom.value(&cpu).await,
            prom.value(&rx).await,
            prom.value(&written).await,
        );
        (now.0 > before.0 && now.1 >= before.1 + 10.0 * 1400.0 && now.2 >= before.2 + 4194304.0)
            .then_some(now)
    })
    .await;
    println!("metrics: cpu {before:?} -> {after:?} (cpu s, rx bytes, written bytes)");
    assert_eq!(prom.target_health().await.0, "up");
}

#[tokio::test]
#[ignore = "needs root, libvirtd and the test guest: run scripts/test.sh"]
async fn vms_survive_kill9_of_agent_and_launcher() {
    // A separate agent joins over TLS (it pins the controller's certificate) with a join
    // token; restarted, it uses the credential it stored.
    let ctl = Appliance::start(&["--role", "controller", "--tls"]).await;
    ctl.import_guest().await;
    let (code, jt) = ctl
        .call(
            reqwest::Method::POST,
            "/apis/edgevirt.io/v1/jointokens",
            Some(("application/json", b"{}".to_vec())),
        )
        .await;
    assert_eq!(code, 201, "{jt}");
    let join_token = jt["token"].as_str().unwrap().to_string();
    let agent_dir = tempfile::Builder::new()
        .prefix("evtest-agent-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let spawn_agent = || {
        std::process::Command::new(exe())
            .args([
                "serve",
                "--role",
                "agent",
                "--accel",
                "qemu",
                "--node-name",
                "testnode",
            ])
            .arg("--data-dir")
            .arg(agent_dir.path())
            .args(["--controller", &ctl.url, "--join-token", &join_token])
            .args(["--nat-network", NAT_NETWORK, "--nat-prefix", NAT_PREFIX])
            .stdout(std::process::Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(agent_dir.path().join("agent.log"))
                    .unwrap(),
            )
            .spawn()
            .unwrap()
    };
    struct Killer(std::process::Child, std::path::PathBuf);
    impl Drop for Killer {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            kill_launchers(&self.1);
        }
    }
    let mut agent = Killer(spawn_agent(), agent_dir.path().to_path_buf());
    let (code, v) = ctl.post_yaml(VMS, &Vm::guest("sturdy").yaml()).await;
    assert_eq!(code, 201, "{v}");
    let vmi = ctl.wait_running("sturdy", None, BOOT).await;
    let uid = vmi["metadata"]["uid"].as_str().unwrap().to_string();
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    let up1 = wait_for("guest uptime", BOOT, || async { guest_uptime(&dom) }).await;
    let id = domid(&dom).unwrap();
    let launcher_pid = || {
        let pids: Vec<String> = launcher_pids(agent_dir.path())
            .iter()
            .map(|p| p.to_string())
            .collect();
        pids.join("\n")
    };
    let lpid = launcher_pid();
    assert!(!lpid.is_empty(), "no launcher process");

    // kill -9 the agent: the guest keeps running.
    let _ = agent.0.kill();
    let _ = agent.0.wait();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(domstate(&dom).as_deref(), Some("running"));
    assert_eq!(launcher_pid(), lpid, "the launcher died with the agent");
    // A restarted agent adopts the launcher; the VMI stays Running with no restart.
    agent.0 = spawn_agent();
    wait_for(
        "agent adopted the launcher",
        Duration::from_secs(60),
        || async {
            std::fs::read_to_string(agent_dir.path().join("agent.log"))
                .ok()
                .filter(|l| l.contains("adopted launcher"))
        },
    )
    .await;
    let up2 = guest_uptime(&dom).unwrap();
    assert!(up2 > up1, "guest uptime reset: {up1} then {up2}");
    assert_eq!(domid(&dom).unwrap(), id);
    assert_eq!(launcher_pid(), lpid);
    let v = ctl.vmi("sturdy").await.unwrap();
    assert_eq!(
        (v["metadata"]["uid"].as_str(), v["status"]["phase"].as_str()),
        (Some(uid.as_str()), Some("Running"))
    );

    // kill -9 the launcher: the guest keeps running, a new launcher adopts the domain.
    assert!(
        std::process::Command::new("kill")
            .args(["-9", &lpid])
            .status()
            .unwrap()
            .success()
    );
    let new_pid = wait_for("a new launcher", Duration::from_secs(60), || async {
        let p = launcher_pid();
        (!p.is_empty() && p != lpid).then_some(p)
    })
    .await;
    assert_ne!(new_pid, lpid);
    assert_eq!(domstate(&dom).as_deref(), Some("running"));
    assert_eq!(domid(&dom).unwrap(), id, "the domain was restarted");
    let up3 = guest_uptime(&dom).unwrap();
    assert!(up3 > up2, "guest uptime reset: {up2} then {up3}");
    // Status still flows through the new launcher: pause shows up.
    assert_eq!(ctl.action("sturdy", "pause").await, 202);
    wait_for(
        "domain paused via the new launcher",
        Duration::from_secs(30),
        || async { (domstate(&dom).as_deref() == Some("paused")).then_some(()) },
    )
    .await;
    let v = ctl.vmi("sturdy").await.unwrap();
    assert_eq!(v["metadata"]["uid"].as_str(), Some(uid.as_str()));

    let (code, _) = ctl.delete(&format!("{VMS}/sturdy")).await;
    assert_eq!(code, 200);
    wait_for("domain gone", BOOT, || async {
        domstate(&dom).is_none().then_some(())
    })
    .await;
    drop(agent);
}

#[tokio::test]
#[ignore = "needs root, libvirtd and the test guest: run scripts/test.sh"]
async fn kill9_during_concurrent_creates_loses_nothing_and_leaks_nothing() {
    let mut a = Appliance::start(&[]).await;
    a.import_guest().await;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let pid = nix::unistd::Pid::from_raw(a.pid() as i32);
    // Two waves of 10 concurrent creates; the process is killed at the third
    // acknowledgement of the second wave, while the first wave's launchers are starting.
    let burst = |range: std::ops::Range<usize>, kill_at: Option<usize>| {
        let mut tasks = Vec::new();
        for i in range {
            let (url, token, acked) = (a.url.clone(), a.token.clone(), acked.clone());
            let yaml = Vm::guest(&format!("burst-{i}"))
                .memory("128Mi")
                .grace_period(0)
                .yaml();
            tasks.push(tokio::spawn(async move {
                let r = reqwest::Client::new()
                    .post(format!("{url}{VMS}"))
                    .bearer_auth(token)
                    .header("content-type", "application/yaml")
                    .body(yaml)
                    .send()
                    .await;
                if let Ok(r) = r
                    && r.status().as_u16() == 201
                {
                    let mut acked = acked.lock().unwrap();
                    acked.push(format!("burst-{i}"));
                    if Some(acked.len()) == kill_at {
                        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                    }
                }
            }));
        }
        tasks
    };
    for t in burst(0..10, None) {
        t.await.unwrap();
    }
    assert_eq!(acked.lock().unwrap().len(), 10);
    wait_for("the first domains", Duration::from_secs(60), || async {
        (!a.our_domains().is_empty()).then_some(())
    })
    .await;
    for t in burst(10..20, Some(13)) {
        let _ = t.await;
    }
    a.kill9();
    let acked = acked.lock().unwrap().clone();
    // A domain that looks like edgevirt's but belongs to another installation: never touched.
    let foreign = format!("evtest-foreign-{}", std::process::id());
    let xml = format!(
        "<domain type='qemu'><name>{foreign}</name><memory unit='MiB'>32</memory><vcpu>1</vcpu>\
         <metadata><ev:instance xmlns:ev='https://edgevirt.io/xmlns/domain/1' install='another-install' \
         vmi-uid='00000000-0000-0000-0000-000000000000' namespace='default' name='x'/></metadata>\
         <os><type arch='x86_64'>hvm</type></os><devices/></domain>"
    );
    let xml_path = a.dir.join("foreign.xml");
    std::fs::write(&xml_path, xml).unwrap();
    let (ok, out) = virsh(&["create", xml_path.to_str().unwrap()]);
    assert!(ok, "creating the foreign domain: {out}");
    a.spawn().await;
    let (code, list) = a.get(VMS).await;
    assert_eq!(code, 200);
    let names: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    eprintln!(
        "{} creates acknowledged before kill -9, {} VMs stored after restart",
        acked.len(),
        names.len()
    );
    assert!(
        acked.len() < 20,
        "the kill came after every create finished; the test proves nothing"
    );
    for n in &acked {
        assert_eq!(
            names.iter().filter(|x| *x == n).count(),
            1,
            "acknowledged VM {n} is not there exactly once"
        );
    }
    // After recovery every VM runs once, and no domain exists that the store does not know.
    for n in &names {
        a.wait_running(n, None, Duration::from_secs(300)).await;
    }
    let (_, vmis) = a.get("/apis/kubevirt.io/v1/virtualmachineinstances").await;
    let uids: Vec<String> = vmis["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["metadata"]["uid"].as_str().unwrap().to_string())
        .collect();
    let doms = a.our_domains();
    for (d, uid) in &doms {
        assert!(
            uids.contains(uid),
            "domain {d} belongs to no VMI in the store"
        );
    }
    assert_eq!(doms.len(), names.len(), "one domain per VM: {doms:?}");
    assert_eq!(
        domstate(&foreign).as_deref(),
        Some("running"),
        "edgevirt touched a domain it did not create"
    );
    virsh(&["destroy", &foreign]);
    for n in &names {
        a.delete(&format!("{VMS}/{n}")).await;
    }
    wait_for("all domains gone", Duration::from_secs(180), || async {
        a.our_domains().is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
#[ignore = "needs root and libvirtd: run scripts/test.sh"]
async fn bad_input_gets_a_clear_4xx_and_changes_nothing() {
    let a = Appliance::start(&["--role", "controller"]).await;
    a.import_guest().await;
    let (code, _) = a
        .post_yaml(VMS, &Vm::guest("good").run_strategy("Halted").yaml())
        .await;
    assert_eq!(code, 201);
    // Let the controller settle the VM's status first: that write is not under test.
    wait_for("VM status", Duration::from_secs(30), || async {
        a.vm("good")
            .await
            .filter(|v| v["status"]["printableStatus"] == "Stopped")
    })
    .await;
    let (_, before) = a.get(VMS).await;
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "malformed YAML",
            "metadata: {name: [unclosed".into(),
            400,
            "not valid YAML",
        ),
        (
            "unknown field",
            Vm::guest("x1")
                .with(|v| Vm::domain_of(v)["bogusField"] = json!(1))
                .yaml(),
            422,
            "unknown field",
        ),
        (
            "unsupported KubeVirt field",
            Vm::guest("x2")
                .with(|v| v["spec"]["template"]["spec"]["dnsPolicy"] = json!("None"))
                .yaml(),
            422,
            "does not support yet",
        ),
        (
            "name not DNS-1123",
            Vm::guest("Bad_Name").yaml(),
            422,
            "RFC 1123",
        ),
        (
            "disk path typed by the user",
            Vm::guest("x3").container_disk("/etc/shadow").yaml(),
            422,
            "never to paths",
        ),
        (
            "kernel path typed by the user",
            Vm::guest("x4").kernel_path("/boot/vmlinuz").yaml(),
            422,
            "not paths",
        ),
        (
            "claim naming a path",
            Vm::guest("x6")
                .disk(
                    "data",
                    json!({"persistentVolumeClaim": {"claimName": "../../etc/shadow"}}),
                )
                .yaml(),
            422,
            "never a path",
        ),
        (
            "hostDisk",
            Vm::guest("x5")
                .disk(
                    "data",
                    json!({"hostDisk": {"path": "/etc/shadow", "type": "Disk"}}),
                )
                .yaml(),
            422,
            "no node allows these hostDisk paths",
        ),
        (
            "same name twice",
            Vm::guest("good").run_strategy("Halted").yaml(),
            409,
            "already exists",
        ),
        (
            "missing image",
            Vm::guest("x6").container_disk("test-disk").yaml(),
            422,
            "does not exist",
        ),
        (
            "no memory",
            // JSON is YAML: memory replaced by a second `cpu` key, the last of which wins.
            Vm::guest("x7")
                .body()
                .replace(r#""memory":{"guest":"192Mi"}"#, r#""cpu":{"cores":1}"#),
            422,
            "memory",
        ),
    ];
    for (what, body, want, msg) in cases {
        let (code, v) = a.post_yaml(VMS, &body).await;
        assert_eq!(code, want, "{what}: {v}");
        assert_eq!(v["kind"], "Status", "{what}: not a Status: {v}");
        assert!(
            v["message"].as_str().unwrap_or("").contains(msg),
            "{what}: message {:?} lacks {msg:?}",
            v["message"]
        );
    }
    let (_, after) = a.get(VMS).await;
    assert_eq!(
        before["metadata"]["resourceVersion"], after["metadata"]["resourceVersion"],
        "a refused write changed the store"
    );
    assert_eq!(after["items"].as_array().unwrap().len(), 1);
    // Images that could make QEMU read other host files are refused.
    let base = a.dir.join("base.qcow2");
    let child = a.dir.join("child.qcow2");
    let img = |args: &[&str]| {
        assert!(
            std::process::Command::new("qemu-img")
                .args(args)
                .status()
                .unwrap()
                .success()
        )
    };
    img(&["create", "-q", "-f", "qcow2", base.to_str().unwrap(), "16M"]);
    img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-F",
        "qcow2",
        "-b",
        base.to_str().unwrap(),
        child.to_str().unwrap(),
    ]);
    let ext = a.dir.join("ext.qcow2");
    let ext_data = a.dir.join("ext.raw");
    img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        &format!("data_file={}", ext_data.display()),
        ext.to_str().unwrap(),
        "16M",
    ]);
    for (name, file, msg) in [
        ("with-backing", &child, "backing file"),
        ("with-data-file", &ext, "external data file"),
    ] {
        let (code, v) = a
            .call(
                reqwest::Method::PUT,
                &format!("/apis/edgevirt.io/v1/images/{name}/upload"),
                Some(("application/octet-stream", std::fs::read(file).unwrap())),
            )
            .await;
        assert_eq!(code, 422, "{name}: {v}");
        assert!(
            v["message"].as_str().unwrap_or("").contains(msg),
            "{name}: {v}"
        );
        assert_eq!(
            a.get(&format!("/apis/edgevirt.io/v1/images/{name}"))
                .await
                .0,
            404
        );
    }
    // Without a token nothing is served but /healthz.
    let r = reqwest::get(format!("{}{VMS}", a.url)).await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = reqwest::get(format!("{}/healthz", a.url)).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // A stale resourceVersion is a conflict.
    let mut vm = a.vm("good").await.unwrap();
    vm["metadata"]["resourceVersion"] = json!("1");
    vm["spec"]["runStrategy"] = json!("Always");
    let (code, v) = a.put_json(&format!("{VMS}/good"), &vm).await;
    assert_eq!(code, 409, "{v}");
}

/// The node's container-disk cache: the disks pulled, by manifest digest.
fn cached_disks(data_dir: &std::path::Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(data_dir.join("images/registry"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".qcow2") || n.ends_with(".raw"))
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// What the guest reads at the start of its first disk, past its page cache.
fn read_vda(dom: &str, n: usize) -> Option<String> {
    let read = format!("echo 3 > /proc/sys/vm/drop_caches && head -c {n} /dev/vda");
    guest_exec(dom, "/bin/sh", &["-c", &read])
}

#[tokio::test]
#[ignore = "needs root, libvirtd, the test guest and docker-registry: run scripts/test.sh"]
async fn container_disks_come_from_registries_and_forget_their_writes() {
    // Two real registries on loopback, under the names the VMs use, through the mirror
    // setting: one open, one that wants a login.
    let open = Registry::start(None);
    let private = Registry::start(Some(("puller", "pull-secret-pw")));
    let scratch = tempfile::tempdir().unwrap();
    let blank = scratch.path().join("blank.qcow2");
    assert!(
        std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&blank)
            .arg("32M")
            .status()
            .unwrap()
            .success()
    );
    let pushed = open.push_disk("edgevirt/blank:v1", &blank, "disk.qcow2");
    private.push_disk("edgevirt/blank:v1", &blank, "disk.qcow2");
    let mirrors = [
        format!("registry.test:5000=http://{}", open.host),
        format!("private.test:5000=http://{}", private.host),
    ];
    let a = Appliance::start(&[
        "--registry-mirror",
        &mirrors[0],
        "--registry-mirror",
        &mirrors[1],
        "--image-gc-grace",
        "0",
    ])
    .await;
    a.import_guest().await;
    a.import("test-disk", &blank).await;

    // A containerDisk VM and a dataVolume VM; each writes a marker to its disk.
    let image = "registry.test:5000/edgevirt/blank:v1";
    let eph = Vm::guest("eph")
        .memory("128Mi")
        .container_disk(image)
        .yaml();
    // keep also carries the KubeVirt domain settings a Windows VM writes (features, clock,
    // SMBIOS identity) and an emptyDisk: the guest must see them.
    let keep = Vm::guest("keep")
        .memory("128Mi")
        .disk("data", json!({"dataVolume": {"name": "test-disk"}}))
        .disk("scratch", json!({"emptyDisk": {"capacity": "64Mi"}}))
        .with(|v| {
            let d = Vm::domain_of(v);
            d["features"] = json!({"acpi": {}, "apic": {}, "smm": {}, "hyperv": {"relaxed": {}, "spinlocks": {"spinlocks": 8191}}, "kvm": {"hidden": true}});
            d["clock"] = json!({"utc": {"offsetSeconds": 7200}, "timer": {"hpet": {"present": false}, "rtc": {"tickPolicy": "catchup"}}});
            d["firmware"]["uuid"] = json!(FIRMWARE_UUID);
            d["firmware"]["serial"] = json!("EV-SERIAL-7");
            d["chassis"] = json!({"asset": "till-04"});
        })
        .yaml();
    for yaml in [&eph, &keep] {
        let (code, v) = a.post_yaml(VMS, yaml).await;
        assert_eq!(code, 201, "{v}");
    }
    let hex = pushed.manifest.trim_start_matches("sha256:");
    let mut uids = Vec::new();
    for name in ["eph", "keep"] {
        let vmi = a.wait_running(name, None, BOOT).await;
        let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
        let marker = format!("edgevirt-{name}-{}", std::process::id());
        let write = format!("printf {marker} > /dev/vda && sync && echo written");
        wait_for(&format!("{name}: marker written"), BOOT, || async {
            guest_exec(&dom, "/bin/sh", &["-c", &write]).filter(|o| o.contains("written"))
        })
        .await;
        assert_eq!(read_vda(&dom, marker.len()).as_deref(), Some(&*marker));
        uids.push((
            name,
            vmi["metadata"]["uid"].as_str().unwrap().to_string(),
            marker,
        ));
    }
    // The SMBIOS identity and the empty disk, as the guest sees them.
    let kdom = domain_of(&a, "keep").await;
    let read = |f: &str| guest_exec(&kdom, "/bin/cat", &[f]).map(|s| s.trim().to_string());
    assert_eq!(
        read("/sys/class/dmi/id/product_uuid").as_deref(),
        Some(FIRMWARE_UUID)
    );
    assert_eq!(
        read("/sys/class/dmi/id/product_serial").as_deref(),
        Some("EV-SERIAL-7")
    );
    assert_eq!(
        read("/sys/class/dmi/id/chassis_asset_tag").as_deref(),
        Some("till-04")
    );
    assert_eq!(
        read("/sys/block/vdb/size").as_deref(),
        Some("131072"),
        "the 64Mi emptyDisk in 512-byte sectors"
    );
    let (_, xml) = virsh(&["dumpxml", &kdom]);
    assert!(
        xml.contains("<smm state='on'/>") && xml.contains("adjustment='7200'"),
        "{xml}"
    );
    // Pulled once, kept by its manifest digest; the instance's overlay lives in its run dir.
    assert_eq!(cached_disks(&a.dir), [format!("{hex}.qcow2")]);
    let (_, xml) = virsh(&["dumpxml", &domain_of(&a, "eph").await]);
    assert!(
        xml.contains(&format!("run/vmi/{}/disk-data.qcow2", uids[0].1)),
        "{xml}"
    );

    // A restart: the containerDisk boots the image afresh, the dataVolume keeps its write.
    for (name, _, _) in &uids {
        assert_eq!(a.action(name, "restart").await, 202, "{name}");
    }
    for (name, uid, marker) in &uids {
        let vmi = a.wait_running(name, Some(uid), BOOT).await;
        let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
        let got = wait_for(
            &format!("{name}: disk read after restart"),
            BOOT,
            || async { read_vda(&dom, marker.len()) },
        )
        .await;
        if *name == "eph" {
            assert_ne!(
                got, *marker,
                "a containerDisk kept its write across a restart"
            );
            assert!(got.bytes().all(|b| b == 0), "{got:?}");
        } else {
            assert_eq!(got, *marker, "a dataVolume lost its write across a restart");
        }
    }

    // A registry that wants credentials: without imagePullSecret the VM says why it does not
    // start; with the Secret it runs.
    let private_image = "private.test:5000/edgevirt/blank:v1";
    let (code, v) = a
        .post_yaml(
            VMS,
            &Vm::guest("nocreds")
                .memory("128Mi")
                .container_disk(private_image)
                .yaml(),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let vmi = wait_for("nocreds: ErrImagePull", BOOT, || async {
        a.vmi("nocreds").await.filter(|v| {
            v["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Synchronized" && c["reason"] == "ErrImagePull")
            })
        })
    })
    .await;
    let msg = vmi["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Synchronized")
        .unwrap()["message"]
        .to_string();
    assert!(
        msg.contains(private_image) && msg.contains("Not authorized"),
        "{msg}"
    );
    assert_eq!(vmi["status"]["phase"], "Scheduled", "{vmi}");
    wait_for("nocreds: printableStatus ErrImagePull", BOOT, || async {
        a.vm("nocreds")
            .await
            .filter(|v| v["status"]["printableStatus"] == "ErrImagePull")
    })
    .await;
    let config = json!({"auths": {"private.test:5000": {"username": "puller", "password": "pull-secret-pw"}}});
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "private-pull"},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": config.to_string()},
    });
    let (code, v) = a
        .call(
            reqwest::Method::POST,
            "/api/v1/namespaces/default/secrets",
            Some(("application/json", secret.to_string().into_bytes())),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let (code, v) = a
        .post_yaml(
            VMS,
            &Vm::guest("withcreds")
                .memory("128Mi")
                .disk(
                    "data",
                    json!({"containerDisk": {"image": private_image, "imagePullSecret": "private-pull"}}),
                )
                .yaml(),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    a.wait_running("withcreds", None, BOOT).await;

    // DataVolumes: one on its own, filled by an HTTP download; a VM whose templates fill one
    // from the registry (through the mirror) and clone the first. Each disk has the size
    // asked for, and a write survives a restart.
    let files = tempfile::tempdir().unwrap();
    std::fs::copy(&blank, files.path().join("blank.qcow2")).unwrap();
    let web = FileServer::start(files.path().to_path_buf());
    let dv = |name: &str, source: serde_json::Value, size: &str| {
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
               "metadata": {"name": name},
               "spec": {"source": source, "storage": {"resources": {"requests": {"storage": size}}}}})
    };
    let (code, v) = a
        .post_yaml(
            DVS,
            &dv(
                "dv-web",
                json!({"http": {"url": format!("{}/blank.qcow2", web.url)}}),
                "48Mi",
            )
            .to_string(),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    // One filled by an upload, as `virtctl image-upload` does it: `edgevirt image upload`.
    let (code, v) = a
        .post_yaml(DVS, &dv("dv-up", json!({"upload": {}}), "40Mi").to_string())
        .await;
    assert_eq!(code, 201, "{v}");
    wait_for("dv-up: UploadReady", BOOT, || async {
        let v = a.get(&format!("{DVS}/dv-up")).await.1;
        (v["status"]["phase"] == "UploadReady").then_some(())
    })
    .await;
    let upload = || {
        std::process::Command::new(testkit::exe())
            .args(["image", "upload", "dv-up"])
            .arg(&blank)
            .env("EDGEVIRT_SERVER", &a.url)
            .env("EDGEVIRT_TOKEN", &a.token)
            .output()
            .unwrap()
    };
    let out = upload();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("datavolume/dv-up uploaded: qcow2 format"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = upload();
    assert!(
        !again.status.success()
            && String::from_utf8_lossy(&again.stderr).contains("already has its data"),
        "a second upload: {:?} {}{}",
        again.status,
        String::from_utf8_lossy(&again.stdout),
        String::from_utf8_lossy(&again.stderr)
    );
    let templates = json!([
        {"metadata": {"name": "dvm-data"},
         "spec": dv("", json!({"registry": {"url": format!("docker://{image}")}}), "64Mi")["spec"]},
        {"metadata": {"name": "dvm-copy"},
         "spec": dv("", json!({"pvc": {"name": "dv-web"}}), "56Mi")["spec"]},
    ]);
    let dvm = Vm::guest("dvm")
        .memory("128Mi")
        .disk("data", json!({"dataVolume": {"name": "dvm-data"}}))
        .disk("web", json!({"dataVolume": {"name": "dv-web"}}))
        .disk("copy", json!({"dataVolume": {"name": "dvm-copy"}}))
        .disk("up", json!({"dataVolume": {"name": "dv-up"}}))
        .with(|v| v["spec"]["dataVolumeTemplates"] = templates);
    let (code, v) = a.post_yaml(VMS, &dvm.yaml()).await;
    assert_eq!(code, 201, "{v}");
    let owned = wait_for("dvm-data created from its template", BOOT, || async {
        let (code, v) = a.get(&format!("{DVS}/dvm-data")).await;
        (code == 200).then_some(v)
    })
    .await;
    assert_eq!(
        owned["metadata"]["ownerReferences"][0]["name"], "dvm",
        "{owned}"
    );
    let vmi = a.wait_running("dvm", None, BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    for name in ["dvm-data", "dv-web", "dvm-copy", "dv-up"] {
        let v = a.get(&format!("{DVS}/{name}")).await.1;
        assert_eq!(
            (
                v["status"]["phase"].as_str(),
                v["status"]["progress"].as_str()
            ),
            (Some("Succeeded"), Some("100.0%")),
            "{v}"
        );
    }
    let sectors = |dev: &str| guest_exec(&dom, "/bin/cat", &[&format!("/sys/block/{dev}/size")]);
    for (dev, size) in [
        ("vda", "131072"),
        ("vdb", "98304"),
        ("vdc", "114688"),
        ("vdd", "81920"),
    ] {
        let got = wait_for(&format!("dvm: {dev} seen"), BOOT, || async { sectors(dev) }).await;
        assert_eq!(
            got.trim(),
            size,
            "{dev}: its DataVolume's size in 512-byte sectors"
        );
    }
    let marker = format!("edgevirt-dv-{}", std::process::id());
    let write = format!("printf {marker} > /dev/vda && sync && echo written");
    wait_for("dvm: marker written", BOOT, || async {
        guest_exec(&dom, "/bin/sh", &["-c", &write]).filter(|o| o.contains("written"))
    })
    .await;
    let uid = vmi["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(a.action("dvm", "restart").await, 202);
    let vmi = a.wait_running("dvm", Some(&uid), BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    let got = wait_for("dvm: disk read after restart", BOOT, || async {
        read_vda(&dom, marker.len())
    })
    .await;
    assert_eq!(got, marker, "a DataVolume lost its write across a restart");
    let filled = datavolume_disks(&a.dir);
    assert_eq!(filled.len(), 4, "{filled:?}");

    // A download that fails: the instance waits and says why, the DataVolume says Failed
    // with the reason, and nothing is left on disk.
    let bad = Vm::guest("dvbad")
        .memory("128Mi")
        .disk("data", json!({"dataVolume": {"name": "dvbad-data"}}))
        .with(|v| {
            v["spec"]["dataVolumeTemplates"] = json!([{"metadata": {"name": "dvbad-data"},
                "spec": dv("", json!({"http": {"url": format!("{}/missing.img", web.url)}}), "16Mi")["spec"]}])
        });
    let (code, v) = a.post_yaml(VMS, &bad.yaml()).await;
    assert_eq!(code, 201, "{v}");
    let failed = wait_for("dvbad-data: Failed", BOOT, || async {
        let v = a.get(&format!("{DVS}/dvbad-data")).await.1;
        (v["status"]["phase"] == "Failed").then_some(v)
    })
    .await;
    assert!(failed.to_string().contains("404"), "{failed}");
    let waiting = wait_for("dvbad: DataVolumeNotReady", BOOT, || async {
        a.vmi("dvbad").await.filter(|v| {
            cond_status(v, "Synchronized").is_some_and(|(_, r)| r == "DataVolumeNotReady")
        })
    })
    .await;
    assert_eq!(waiting["status"]["phase"], "Scheduled", "{waiting}");
    assert_eq!(
        datavolume_disks(&a.dir),
        filled,
        "a failed fill left a file"
    );

    // dvm goes and its two DataVolumes with it (their disks too); dv-web and dv-up stay.
    for name in ["dvm", "dvbad"] {
        let (code, v) = a.delete(&format!("{VMS}/{name}")).await;
        assert_eq!(code, 200, "{name}: {v}");
    }
    wait_for("dvm's DataVolumes and disks gone", BOOT, || async {
        let left = a.get(DVS).await.1["items"]
            .as_array()
            .map(|l| {
                l.iter()
                    .map(|d| d["metadata"]["name"].to_string())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        (left == ["\"dv-up\"", "\"dv-web\""] && datavolume_disks(&a.dir).len() == 2).then_some(())
    })
    .await;

    // With every VM gone, the cache empties (image_gc_grace is 0 here).
    for name in ["eph", "keep", "nocreds", "withcreds"] {
        let (code, v) = a.delete(&format!("{VMS}/{name}")).await;
        assert_eq!(code, 200, "{name}: {v}");
    }
    wait_for("VMs gone and the cache empty", BOOT, || async {
        (a.our_domains().is_empty() && cached_disks(&a.dir).is_empty()).then_some(())
    })
    .await;
}

/// The DataVolume disks on the appliance's node (not half-written ones).
fn datavolume_disks(data_dir: &std::path::Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(data_dir.join("datavolumes"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The ISO the agent wrote for volume `vol`, from a domain's XML.
fn volume_iso(xml: &str, vol: &str) -> String {
    xml.split("<source file='")
        .filter_map(|s| s.split('\'').next())
        .find(|p| p.ends_with(&format!("/{vol}.iso")))
        .unwrap_or_else(|| panic!("no ISO for volume {vol} in {xml}"))
        .to_string()
}

/// The NoCloud disk of a domain's XML (the cloud-init ISO the agent wrote).
fn nocloud_iso(xml: &str) -> String {
    volume_iso(xml, "cloudinit")
}

/// A file inside an ISO (Rock Ridge names).
fn iso_file(iso: &str, path: &str) -> String {
    let out = std::process::Command::new("isoinfo")
        .args(["-R", "-i", iso, "-x", path])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The user data inside a NoCloud ISO.
fn nocloud_user_data(iso: &str) -> String {
    iso_file(iso, "/user-data")
}

/// The status of a VMI's condition of `type_` (`None` when it has none).
fn cond_status(vmi: &serde_json::Value, type_: &str) -> Option<(String, String)> {
    vmi["status"]["conditions"]
        .as_array()?
        .iter()
        .find_map(|c| {
            (c["type"] == type_).then(|| {
                (
                    c["status"].as_str().unwrap_or("").to_string(),
                    c["reason"].as_str().unwrap_or("").to_string(),
                )
            })
        })
}

/// KubeVirt's guest-facing spec fields on one real guest sized by an instancetype: the
/// instancetype's CPUs and memory in the guest (and kept through a restart after the
/// instancetype changed), the preference's RNG, SSH keys from a Secret in `authorized_keys`
/// (guest agent) and in the NoCloud user data, a guest-agent readiness probe that follows
/// the agent, and a failing liveness probe that fails the instance (and its VM starts
/// another).
#[tokio::test]
#[ignore = "needs root, libvirtd and the test guest: run scripts/test.sh"]
async fn instancetypes_probes_and_access_credentials_on_a_real_guest() {
    let a = Appliance::start(&[]).await;
    a.import_guest().await;
    let key =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEdnZXZpcnQtZTJlLXRlc3Qta2V5LW5vdC1yZWFs e2e@edgevirt";
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: my-keys}}\nstringData:\n  key1: {key}\n"
    );
    let (code, v) = a
        .post_yaml("/api/v1/namespaces/default/secrets", &secret)
        .await;
    assert_eq!(code, 201, "{v}");
    let config = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: site-config}\n\
                  data: {app.conf: \"mode=edge\\n\"}\nbinaryData: {blob.bin: AAFiaW4=}\n";
    let (code, v) = a
        .post_yaml("/api/v1/namespaces/default/configmaps", config)
        .await;
    assert_eq!(code, 201, "{v}");
    let sized = Vm::guest("sized")
        .cloud_init("#cloud-config\nhostname: sized-ci\n")
        .with(|v| {
            v["spec"]["instancetype"] = json!({"name": "u1.medium"});
            v["spec"]["preference"] = json!({"name": "linux"});
            let spec = &mut v["spec"]["template"]["spec"];
            let domain = spec["domain"].as_object_mut().unwrap();
            domain.remove("cpu");
            domain.remove("memory");
            // KubeVirt's device switches, as libvirt and the guest see them.
            domain.insert("ioThreadsPolicy".into(), json!("shared"));
            let devices = domain["devices"].as_object_mut().unwrap();
            for (k, v) in [
                (
                    "inputs",
                    json!([{"name": "tablet", "type": "tablet", "bus": "usb"}]),
                ),
                ("video", json!({"type": "virtio"})),
                (
                    "watchdog",
                    json!({"name": "wd", "i6300esb": {"action": "reset"}}),
                ),
                ("sound", json!({"name": "audio"})),
                ("panicDevices", json!([{"model": "isa"}])),
                ("blockMultiQueue", json!(true)),
                ("networkInterfaceMultiqueue", json!(true)),
                ("useVirtioTransitional", json!(true)),
                ("autoattachMemBalloon", json!(false)),
                ("tpm", json!({})),
            ] {
                devices.insert(k.into(), v);
            }
            spec["accessCredentials"] = json!([
                {"sshPublicKey": {"source": {"secret": {"secretName": "my-keys"}},
                    "propagationMethod": {"qemuGuestAgent": {"users": ["root"]}}}},
                {"sshPublicKey": {"source": {"secret": {"secretName": "my-keys"}},
                    "propagationMethod": {"noCloud": {}}}},
            ]);
            spec["readinessProbe"] = json!({"guestAgentPing": {}, "periodSeconds": 1,
                "failureThreshold": 2});
            // The NIC's ACPI index, which the guest's kernel shows.
            spec["domain"]["devices"]["interfaces"][0]["acpiIndex"] = json!(7);
            // A scratch disk with the host-side settings KubeVirt's Disk has.
            spec["domain"]["devices"]["disks"] = json!([{"name": "scratch",
                "disk": {"bus": "virtio"}, "cache": "writeback", "io": "threads",
                "errorPolicy": "report",
                "blockSize": {"custom": {"logical": 512, "physical": 4096}}}]);
            let volumes = spec["volumes"].as_array_mut().unwrap();
            volumes.push(json!({"name": "scratch", "emptyDisk": {"capacity": "16Mi"}}));
            // A ConfigMap, a Secret and the instance's own metadata as files on ISO disks;
            // an optional ConfigMap that does not exist gives an empty one.
            volumes.extend([
                json!({"name": "cfg", "configMap": {"name": "site-config",
                    "volumeLabel": "OEMDRV"}}),
                json!({"name": "keys", "secret": {"secretName": "my-keys"}}),
                json!({"name": "meta", "downwardAPI": {"fields": [
                    {"path": "ids/name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}),
                json!({"name": "nothing", "configMap": {"name": "absent", "optional": true}}),
                // The same ConfigMap as a folder, over virtiofs.
                json!({"name": "cfgfs", "configMap": {"name": "site-config"}}),
            ]);
            spec["domain"]["devices"]["filesystems"] = json!([{"name": "cfgfs", "virtiofs": {}}]);
        })
        .yaml();
    let (code, v) = a.post_yaml(VMS, &sized).await;
    assert_eq!(code, 201, "{v}");
    // The instancetype's 1 vCPU and 4 GiB, seen by the guest; the preference's RNG.
    let vmi = a.wait_running("sized", None, BOOT).await;
    let uid1 = vmi["metadata"]["uid"].as_str().unwrap().to_string();
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    let guest_cpus_mem = |dom: String| async move {
        let cpus = wait_for("nproc in the guest", BOOT, || async {
            guest_exec(&dom, "/bin/sh", &["-c", "grep -c ^processor /proc/cpuinfo"])
        })
        .await;
        let mem = guest_exec(&dom, "/bin/sh", &["-c", "grep MemTotal /proc/meminfo"]).unwrap();
        let kib: u64 = mem.split_whitespace().nth(1).unwrap().parse().unwrap();
        (cpus.trim().to_string(), kib)
    };
    let (cpus, kib) = guest_cpus_mem(dom.clone()).await;
    assert_eq!(cpus, "1", "u1.medium has one vCPU");
    assert!(
        (3_500_000..=4 * 1024 * 1024).contains(&kib),
        "u1.medium has 4Gi; the guest sees {kib} KiB"
    );
    let (_, xml) = virsh(&["dumpxml", &dom]);
    assert!(
        xml.contains("<rng model='virtio-transitional'>"),
        "the preference's RNG: {xml}"
    );
    for want in [
        "<iothreads>1</iothreads>",
        "iothread='1'",
        "queues='1'",
        "<input type='tablet' bus='usb'>",
        "<model type='virtio' heads='1' primary='yes'/>",
        "<watchdog model='i6300esb' action='reset'>",
        "<sound model='ich9'>",
        "<panic model='isa'",
        "<memballoon model='none'/>",
        "<model type='virtio-transitional'/>",
        "<tpm model='tpm-tis'>",
        "<backend type='emulator' version='2.0'",
        "cache='writeback'",
        "error_policy='report'",
        "io='threads'",
        "<blockio logical_block_size='512' physical_block_size='4096'/>",
    ] {
        assert!(xml.contains(want), "{want} not in {xml}");
    }
    assert!(xml.contains("<acpi index='7'/>"), "{xml}");
    // The ConfigMap, Secret and downward API files, each on its ISO, as KubeVirt lays them
    // out; the staging folders are gone.
    let cfg = volume_iso(&xml, "cfg");
    assert_eq!(iso_file(&cfg, "/app.conf"), "mode=edge\n");
    assert_eq!(iso_file(&cfg, "/blob.bin").as_bytes(), b"\x00\x01bin");
    let label = std::process::Command::new("isoinfo")
        .args(["-d", "-i", &cfg])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&label.stdout).contains("Volume id: OEMDRV"),
        "{label:?}"
    );
    assert_eq!(iso_file(&volume_iso(&xml, "keys"), "/key1"), key);
    let meta = volume_iso(&xml, "meta");
    assert_eq!(iso_file(&meta, "/ids/name"), "sized");
    assert!(
        iso_file(&meta, "/labels").contains("=\""),
        "the labels as key=\"value\" lines"
    );
    let run_dir = std::path::Path::new(&cfg).parent().unwrap();
    assert!(
        !run_dir.join("config-keys").exists(),
        "a Secret's files stay only in the ISO"
    );
    assert!(std::path::Path::new(&volume_iso(&xml, "nothing")).is_file());
    // The guest reads the ConfigMap's disk.
    let seen = guest_exec(
        &dom,
        "/bin/sh",
        &[
            "-c",
            "for d in /dev/vd?; do grep -q mode=edge $d && echo found; done",
        ],
    )
    .unwrap_or_default();
    assert_eq!(
        seen.trim(),
        "found",
        "the ConfigMap's file on one guest disk"
    );
    let shared = guest_exec(
        &dom,
        "/bin/sh",
        &[
            "-c",
            "mkdir -p /mnt/cfg && mount -t virtiofs cfgfs /mnt/cfg && cat /mnt/cfg/app.conf",
        ],
    );
    assert_eq!(
        shared.as_deref(),
        Some("mode=edge\n"),
        "the ConfigMap as a virtiofs folder"
    );
    let indexes = guest_exec(
        &dom,
        "/bin/sh",
        &["-c", "cat /sys/bus/pci/devices/*/acpi_index 2>/dev/null"],
    )
    .unwrap_or_default();
    assert!(
        indexes.split_whitespace().any(|i| i == "7"),
        "the NIC's ACPI index in the guest: {indexes:?}"
    );
    // The scratch disk's block sizes, as the guest's kernel sees them (the only 16 MiB disk).
    let sizes = guest_exec(
        &dom,
        "/bin/sh",
        &[
            "-c",
            "for d in /sys/block/vd*; do [ $(cat $d/size) = 32768 ] && \
             cat $d/queue/logical_block_size $d/queue/physical_block_size; done",
        ],
    )
    .unwrap_or_default();
    assert_eq!(
        sizes.split_whitespace().collect::<Vec<_>>(),
        ["512", "4096"],
        "the scratch disk's block sizes in the guest"
    );
    // The vTPM (swtpm), as the guest's kernel sees it.
    assert_eq!(
        guest_exec(&dom, "/bin/cat", &["/sys/class/tpm/tpm0/tpm_version_major"])
            .map(|s| s.trim().to_string())
            .as_deref(),
        Some("2"),
        "a TPM 2.0 in the guest"
    );
    // The guest's PCI bus has the watchdog (8086:25ab) and the sound card (8086:293e).
    let pci = guest_exec(
        &dom,
        "/bin/sh",
        &[
            "-c",
            "cat /sys/bus/pci/devices/*/vendor /sys/bus/pci/devices/*/device",
        ],
    )
    .unwrap_or_default();
    assert!(
        pci.contains("0x25ab") && pci.contains("0x293e"),
        "watchdog and sound on the guest's PCI bus: {pci}"
    );
    let vm = a.vm("sized").await.unwrap();
    let revision = vm["status"]["instancetypeRef"]["controllerRevisionRef"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("no instancetype revision: {vm}"))
        .to_string();

    // The key, written by the guest agent into root's authorized_keys, and in the user data.
    let keys = wait_for("the key in root's authorized_keys", BOOT, || async {
        guest_exec(&dom, "/bin/cat", &["/root/.ssh/authorized_keys"]).filter(|k| k.contains(key))
    })
    .await;
    assert_eq!(keys.trim(), key);
    let synced = wait_for("AccessCredentialsSynchronized", BOOT, || async {
        a.vmi("sized")
            .await
            .and_then(|v| cond_status(&v, "AccessCredentialsSynchronized"))
            .filter(|(s, _)| s == "True")
    })
    .await;
    assert_eq!(synced.1, "AccessCredentialsSyncSuccess");
    let user_data = nocloud_user_data(&nocloud_iso(&xml));
    assert!(
        user_data.starts_with("#cloud-config")
            && user_data.contains(key)
            && user_data.contains("hostname: sized-ci"),
        "user data: {user_data}"
    );

    // A liveness probe that cannot pass (nothing listens on the discard port): the VMI
    // alone fails with the reason; under a VM, another instance follows after the back-off.
    // startStrategy Paused: the domain is created paused, the VMI is Running with Paused
    // True (the agent does not resume it), and it runs once unpaused.
    let (code, v) = a
        .post_yaml(
            VMS,
            &Vm::guest("held")
                .with(|v| {
                    let spec = &mut v["spec"]["template"]["spec"];
                    spec["startStrategy"] = json!("Paused");
                    // KubeVirt's link state: the NIC is there, without a carrier.
                    spec["domain"]["devices"]["interfaces"][0]["state"] = json!("down");
                    spec["domain"]["rebootPolicy"] = json!("Terminate");
                    // An OpenStack config drive carrying the key (configDrive propagation).
                    spec["volumes"] = json!([{"name": "cd",
                        "cloudInitConfigDrive": {"userData": "#cloud-config\nhostname: held-cd\n"}}]);
                    spec["accessCredentials"] = json!([{"sshPublicKey": {
                        "source": {"secret": {"secretName": "my-keys"}},
                        "propagationMethod": {"configDrive": {}}}}]);
                })
                .yaml(),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let held = a.wait_running("held", None, BOOT).await;
    let hdom = held["status"]["domainName"].as_str().unwrap().to_string();
    assert_eq!(domstate(&hdom).as_deref(), Some("paused"), "created paused");
    let (_, hxml) = virsh(&["dumpxml", &hdom]);
    let drive = hxml
        .split("<source file='")
        .filter_map(|s| s.split('\'').next())
        .find(|p| p.ends_with("/cd.iso"))
        .unwrap_or_else(|| panic!("no config drive in {hxml}"))
        .to_string();
    let iso_file = |inside: &str| {
        let out = std::process::Command::new("isoinfo")
            .args(["-R", "-i", &drive, "-x", inside])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(iso_file("/openstack/latest/user_data").contains("hostname: held-cd"));
    assert!(hxml.contains("<link state='down'/>"), "{hxml}");
    let meta: serde_json::Value =
        serde_json::from_str(&iso_file("/openstack/latest/meta_data.json")).unwrap();
    assert_eq!(meta["public_keys"]["0"], key, "{meta}");
    assert_eq!(meta["uuid"], held["metadata"]["uid"], "{meta}");
    let paused = wait_for("held: Paused condition", BOOT, || async {
        a.vmi("held")
            .await
            .filter(|v| cond_status(v, "Paused").is_some_and(|(s, _)| s == "True"))
    })
    .await;
    assert_eq!(paused["status"]["phase"], "Running", "{paused}");
    assert_eq!(
        domstate(&hdom).as_deref(),
        Some("paused"),
        "the agent resumed a guest that starts paused"
    );
    assert_eq!(a.action("held", "unpause").await, 202);
    wait_for("held: guest agent answers after unpause", BOOT, || async {
        guest_exec(&hdom, "/bin/cat", &["/proc/uptime"])
    })
    .await;
    assert_eq!(domstate(&hdom).as_deref(), Some("running"));
    // The link is down: the guest sees its NIC without a carrier.
    let carrier = guest_exec(
        &hdom,
        "/bin/sh",
        &["-c", "cat /sys/class/net/e*/carrier 2>&1"],
    )
    .unwrap_or_default();
    assert!(
        carrier.split_whitespace().any(|c| c == "0")
            && carrier.split_whitespace().all(|c| c != "1"),
        "carrier of the guest's NIC: {carrier:?}"
    );
    // rebootPolicy Terminate: a reboot inside the guest ends the instance, and the VM
    // (runStrategy Always) starts a new one.
    let (_, hxml) = virsh(&["dumpxml", &hdom]);
    assert!(hxml.contains("<on_reboot>destroy</on_reboot>"), "{hxml}");
    let huid = held["metadata"]["uid"].clone();
    let _ = guest_exec(&hdom, "/bin/sh", &["-c", "echo b > /proc/sysrq-trigger"]);
    let next = wait_for(
        "held: a new instance after the guest rebooted",
        BOOT,
        || async {
            a.vmi("held")
                .await
                .filter(|v| v["metadata"]["uid"] != huid && v["status"]["phase"] == "Running")
        },
    )
    .await;
    assert_ne!(next["metadata"]["uid"], huid);

    let unlive = |v: &mut serde_json::Value| {
        v["spec"]["template"]["spec"]["livenessProbe"] = json!({"tcpSocket": {"port": 9},
            "periodSeconds": 1, "failureThreshold": 3});
    };
    let (code, v) = a
        .post_yaml(VMS, &Vm::guest("unlive").with(unlive).yaml())
        .await;
    assert_eq!(code, 201, "{v}");
    let mut vmi = Vm::guest("unlive-vmi").with(unlive).json();
    vmi["kind"] = json!("VirtualMachineInstance");
    vmi["spec"] = vmi["spec"]["template"]["spec"].take();
    let (code, v) = a
        .post_yaml(
            "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances",
            &serde_json::to_string(&vmi).unwrap(),
        )
        .await;
    assert_eq!(code, 201, "{v}");

    // The liveness probe failed the lone VMI; the VM's instance failed and another follows.
    let failed = wait_for("unlive-vmi Failed", BOOT, || async {
        a.get("/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/unlive-vmi")
            .await
            .1
            .as_object()
            .cloned()
            .filter(|v| v["status"]["phase"] == "Failed")
    })
    .await;
    assert_eq!(
        failed["status"]["reason"], "LivenessProbeFailed",
        "{failed:?}"
    );
    let vm = wait_for("unlive's start failure recorded", BOOT, || async {
        a.vm("unlive")
            .await
            .filter(|v| v["status"]["startFailure"]["lastFailedVMIUID"].is_string())
    })
    .await;
    let failed_uid = vm["status"]["startFailure"]["lastFailedVMIUID"]
        .as_str()
        .unwrap()
        .to_string();
    a.wait_running("unlive", Some(&failed_uid), BOOT).await;
    let (code, v) = a.delete(&format!("{VMS}/unlive")).await;
    assert_eq!(code, 200, "{v}");

    // Ready follows the guest agent: true while it answers, false once it is gone.
    wait_for("sized Ready", BOOT, || async {
        a.vmi("sized")
            .await
            .and_then(|v| cond_status(&v, "Ready"))
            .filter(|(s, _)| s == "True")
    })
    .await;
    guest_exec(
        &dom,
        "/bin/sh",
        &[
            "-c",
            "(sleep 1; kill $(cat /run/qemu-ga.pid)) >/dev/null 2>&1 & echo ok",
        ],
    )
    .expect("the guest agent ran the command");
    let (_, reason) = wait_for("sized not Ready without its agent", BOOT, || async {
        a.vmi("sized")
            .await
            .and_then(|v| cond_status(&v, "Ready"))
            .filter(|(s, _)| s == "False")
    })
    .await;
    assert_eq!(reason, "GuestNotReady");
    assert_eq!(a.vmi("sized").await.unwrap()["status"]["phase"], "Running");

    // A bigger u1.medium does not change the VM: it restarts with the revision it kept.
    let (code, v) = a
        .call(
            reqwest::Method::PATCH,
            "/apis/instancetype.kubevirt.io/v1beta1/virtualmachineclusterinstancetypes/u1.medium",
            Some((
                "application/merge-patch+json",
                serde_json::to_vec(&json!({"spec": {"cpu": {"guest": 2}}})).unwrap(),
            )),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(a.action("sized", "restart").await, 202);
    let vmi = a.wait_running("sized", Some(&uid1), BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    let (cpus, _) = guest_cpus_mem(dom).await;
    assert_eq!(cpus, "1", "the VM keeps the instancetype it started with");
    let vm = a.vm("sized").await.unwrap();
    assert_eq!(
        vm["status"]["instancetypeRef"]["controllerRevisionRef"]["name"], revision,
        "{vm}"
    );

    for name in ["sized", "held"] {
        let (code, v) = a.delete(&format!("{VMS}/{name}")).await;
        assert_eq!(code, 200, "{name}: {v}");
    }
    let (code, v) = a
        .delete("/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/unlive-vmi")
        .await;
    assert_eq!(code, 200, "{v}");
    wait_for("VMs gone", BOOT, || async {
        a.our_domains().is_empty().then_some(())
    })
    .await;
}

/// The libvirt domain of a VM's instance.
/// Restart the VM `name` whose instance is `vmi`: the new instance once it runs, its domain
/// and the domain's live XML.
async fn restart(
    a: &Appliance,
    name: &str,
    vmi: &serde_json::Value,
) -> (serde_json::Value, String, String) {
    assert_eq!(a.action(name, "restart").await, 202);
    let old = vmi["metadata"]["uid"].as_str().unwrap();
    let vmi = a.wait_running(name, Some(old), BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    let (_, xml) = virsh(&["dumpxml", &dom]);
    (vmi, dom, xml)
}

async fn domain_of(a: &Appliance, name: &str) -> String {
    a.vmi(name).await.unwrap()["status"]["domainName"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Claims on the shared pool, on one guest: an `ephemeral` volume reads the claim's disk
/// under an overlay of the instance's own, so the guest's writes never reach the claim and
/// are gone after a restart; a `filesystems` entry shares the claim's folder over virtiofs,
/// both ways, and pins the instance to its node. Its disks use a supplemental pool of I/O
/// threads.
#[tokio::test]
#[ignore = "needs root, libvirtd and the test guest: run scripts/test.sh"]
async fn ephemeral_claims_and_virtiofs_folders_on_the_pool() {
    let pool = tempfile::Builder::new()
        .prefix("evtest-pool-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::create_dir(pool.path().join("default")).unwrap();
    let folder = pool.path().join("default/site-files");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("from-host.txt"), "written-by-the-host").unwrap();
    let base = pool.path().join("default/golden.raw");
    let marker = "golden-image";
    let mut bytes = vec![0u8; 16 << 20];
    bytes[..marker.len()].copy_from_slice(marker.as_bytes());
    std::fs::write(&base, &bytes).unwrap();
    let arg = format!("site={}", pool.path().display());
    let a = Appliance::start(&["--shared-pool", &arg]).await;
    a.import_guest().await;
    let yaml = Vm::guest("eph")
        .disk(
            "data",
            json!({"ephemeral": {"persistentVolumeClaim": {"claimName": "golden"}}}),
        )
        .volume(
            "files",
            json!({"persistentVolumeClaim": {"claimName": "site-files"}}),
        )
        .with(|v| {
            let domain = Vm::domain_of(v);
            domain["devices"]["filesystems"] = json!([{"name": "files", "virtiofs": {}}]);
            // The disks spread over a pool of two I/O threads.
            domain["ioThreadsPolicy"] = json!("supplementalPool");
            domain["ioThreads"] = json!({"supplementalPoolThreadCount": 2});
        })
        .yaml();
    let (code, v) = a.post_yaml(VMS, &yaml).await;
    assert_eq!(code, 201, "{v}");
    let vmi = a.wait_running("eph", None, BOOT).await;
    let uid = vmi["metadata"]["uid"].as_str().unwrap().to_string();
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    let (_, xml) = virsh(&["dumpxml", &dom]);
    assert!(
        xml.contains(&format!("run/vmi/{uid}/ephemeral-data.qcow2"))
            && xml.contains(&base.display().to_string()),
        "an overlay of the instance's own on the claim: {xml}"
    );
    assert!(
        xml.contains("<iothreads>2</iothreads>") && xml.contains("iothread='1'"),
        "a supplemental pool of two I/O threads: {xml}"
    );
    assert!(
        xml.contains(&format!("<source dir='{}'/>", folder.display()))
            && xml.contains("<target dir='files'/>"),
        "the claim's folder shared over virtiofs: {xml}"
    );
    // The guest mounts the folder by its name, reads the host's file and writes its own.
    let mount = "mkdir -p /mnt/files && (grep -q ' /mnt/files ' /proc/mounts || \
                 mount -t virtiofs files /mnt/files) && cat /mnt/files/from-host.txt && \
                 printf written-by-the-guest > /mnt/files/from-guest.txt && sync";
    let got = wait_for("the shared folder read in the guest", BOOT, || async {
        guest_exec(&dom, "/bin/sh", &["-c", mount]).filter(|o| !o.is_empty())
    })
    .await;
    assert_eq!(got, "written-by-the-host");
    assert_eq!(
        std::fs::read_to_string(folder.join("from-guest.txt")).unwrap(),
        "written-by-the-guest"
    );
    let vmi = wait_for("LiveMigratable false for virtiofs", BOOT, || async {
        let vmi = a.vmi("eph").await?;
        (cond_status(&vmi, "LiveMigratable")?.1 == "VirtIOFSNotLiveMigratable").then_some(vmi)
    })
    .await;
    assert_eq!(cond_status(&vmi, "LiveMigratable").unwrap().0, "False");
    let got = wait_for("the claim read through the overlay", BOOT, || async {
        read_vda(&dom, marker.len())
    })
    .await;
    assert_eq!(got, marker);
    let scribble = "scribbled-on";
    let write = format!("printf {scribble} > /dev/vda && sync && echo written");
    wait_for("the guest's write", BOOT, || async {
        guest_exec(&dom, "/bin/sh", &["-c", &write]).filter(|o| o.contains("written"))
    })
    .await;
    assert_eq!(read_vda(&dom, scribble.len()).as_deref(), Some(scribble));
    assert_eq!(
        &std::fs::read(&base).unwrap()[..marker.len()],
        marker.as_bytes(),
        "the claim itself is never written"
    );
    // A restart: a new overlay, the claim as it was.
    assert_eq!(a.action("eph", "restart").await, 202);
    let vmi = a.wait_running("eph", Some(&uid), BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    let got = wait_for("the claim read after the restart", BOOT, || async {
        read_vda(&dom, marker.len())
    })
    .await;
    assert_eq!(got, marker, "the write was gone with the instance");
}

/// hostDisk volumes live only in the node's host disk folder: DiskOrCreate makes a sparse
/// raw file there which the guest writes; a path outside it never reaches QEMU, and the
/// instance says why.
#[tokio::test]
#[ignore = "needs root, libvirtd and the test guest: run scripts/test.sh"]
async fn host_disks_stay_inside_the_nodes_folder() {
    let root = tempfile::Builder::new()
        .prefix("evtest-hostdisks-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let dir = root.path().display().to_string();
    let a = Appliance::start(&["--host-disk-dir", &dir]).await;
    a.import_guest().await;
    let file = root.path().join("vms/hd.img");
    let yaml = Vm::guest("hd")
        .disk(
            "data",
            json!({"hostDisk": {"path": file.display().to_string(),
                "type": "DiskOrCreate", "capacity": "16Mi"}}),
        )
        .yaml();
    let (code, v) = a.post_yaml(VMS, &yaml).await;
    assert_eq!(code, 201, "{v}");
    let vmi = a.wait_running("hd", None, BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 16 << 20);
    let marker = "host-disk-marker";
    let write = format!("printf {marker} > /dev/vda && sync && echo written");
    wait_for("the guest's write", BOOT, || async {
        guest_exec(&dom, "/bin/sh", &["-c", &write]).filter(|o| o.contains("written"))
    })
    .await;
    assert_eq!(
        &std::fs::read(&file).unwrap()[..marker.len()],
        marker.as_bytes(),
        "the guest wrote the host's file"
    );
    // Outside every node's folder: refused at once, naming the folders there are.
    let yaml = Vm::guest("hd-etc")
        .disk(
            "data",
            json!({"hostDisk": {"path": "/etc/hostname", "type": "Disk"}}),
        )
        .yaml();
    let (code, v) = a.post_yaml(VMS, &yaml).await;
    assert_eq!(code, 422, "{v}");
    assert!(
        v.to_string().contains(&format!("testnode allows {dir}")),
        "{v}"
    );
    // Through a link out of the folder: taken, then refused on the node, with the reason.
    std::os::unix::fs::symlink("/etc", root.path().join("etc-link")).unwrap();
    for (name, path) in [(
        "hd-link",
        root.path().join("etc-link/hostname").display().to_string(),
    )] {
        let yaml = Vm::guest(name)
            .disk("data", json!({"hostDisk": {"path": path, "type": "Disk"}}))
            .yaml();
        let (code, v) = a.post_yaml(VMS, &yaml).await;
        assert_eq!(code, 201, "{v}");
        let why = wait_for(&format!("{name}: refused on the node"), BOOT, || async {
            a.vmi(name)
                .await
                .and_then(|v| cond_status(&v, "Synchronized").map(|c| (c, v)))
                .filter(|((s, _), _)| s == "False")
                .map(|(_, v)| v)
        })
        .await;
        assert!(why.to_string().contains("outside node"), "{name}: {why}");
        assert_ne!(why["status"]["phase"], "Running", "{why}");
    }
    // A path with .. is refused at once.
    let yaml = Vm::guest("hd-dots")
        .disk(
            "data",
            json!({"hostDisk": {"path": format!("{dir}/../../etc/shadow"), "type": "Disk"}}),
        )
        .yaml();
    let (code, v) = a.post_yaml(VMS, &yaml).await;
    assert_eq!(code, 422, "{v}");
    assert!(v.to_string().contains("without . or .. parts"), "{v}");
}

/// `--accel auto` boots a probe guest under KVM before trusting it (on these test machines
/// KVM hangs a Linux kernel, though /dev/kvm opens). The probe sees a kernel boot (the test
/// kernel under TCG), sees a file that is no kernel fail, leaves nothing behind, and an
/// appliance whose probe kernel cannot boot picks qemu and says why on its node.
#[tokio::test]
#[ignore = "needs root, libvirtd and the test guest: run scripts/test.sh"]
async fn accel_auto_trusts_kvm_only_once_a_probe_guest_booted() {
    use edgevirt::agent::accel::probe;
    let hv: std::sync::Arc<dyn edgevirt::hypervisor::Hypervisor> =
        std::sync::Arc::new(edgevirt::virt::libvirt::Libvirt::open("qemu:///system").unwrap());
    let dir = tempfile::Builder::new()
        .prefix("evtest-probe-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let kernel = guest_dir().join("vmlinuz");
    let took = probe(hv.clone(), "qemu", &kernel, dir.path(), BOOT)
        .await
        .expect("the test kernel prints its first line under TCG");
    println!("probe: the test kernel's first line under TCG after {took:?}");
    let junk = dir.path().join("not-a-kernel");
    std::fs::write(&junk, vec![0x5au8; 8192]).unwrap();
    let why = probe(
        hv.clone(),
        "qemu",
        &junk,
        dir.path(),
        Duration::from_secs(5),
    )
    .await
    .expect_err("a file that is no kernel does not boot");
    assert!(
        why.contains("could not start") || why.contains("printed nothing"),
        "{why}"
    );
    // Nothing is left: no probe domain, no console file.
    let (_, out) = virsh(&["list", "--all", "--name"]);
    assert!(!out.contains("edgevirt-accel-probe"), "{out}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("accel-probe-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // An appliance with --accel auto whose probe kernel cannot boot: qemu, with the reason.
    let junk_s = junk.to_string_lossy().into_owned();
    let a = Appliance::start_with_env(
        &["--accel", "auto"],
        &[("EDGEVIRT_ACCEL_PROBE_KERNEL", junk_s.as_str())],
    )
    .await;
    let node = wait_for("the node's accelerator", BOOT, || async {
        let (code, n) = a.get("/apis/edgevirt.io/v1/nodes/testnode").await;
        (code == 200 && n["status"]["accelerator"].is_string()).then_some(n)
    })
    .await;
    let st = &node["status"];
    assert_eq!(st["accelerator"], "qemu", "{node}");
    let reason = st["acceleratorReason"].as_str().unwrap_or_default();
    assert!(reason.contains("using qemu (TCG)"), "{node}");
    let kvm_opens = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    if kvm_opens {
        assert!(
            reason.contains("KVM cannot run a Linux guest here") && reason.contains(&junk_s),
            "{node}"
        );
    }
}

/// An OS install from an ISO, as a user does it by hand: the installer ISO (built by
/// `tests/guest/build-iso.sh`) imported as an ISO, attached as a SATA cdrom that boots
/// first, and a blank 2Gi DataVolume as the install target. The VM boots from the ISO under
/// BIOS and, after an edit, under UEFI with Secure Boot; the guest sees the 2Gi disk and
/// "installs" onto it. With the cdrom removed, the VM still starts (by kernel boot) and its
/// disk still holds what the install wrote; its DataVolume then grows while the guest runs,
/// which sees the new size at once. A disk image is refused as an ISO. Last, an ISO at a
/// URL boots as KubeVirt users attach one: a DataVolume with an `http` source.
#[tokio::test]
#[ignore = "needs root, libvirtd and the test guest: run scripts/test.sh"]
async fn iso_install_onto_a_blank_disk_under_bios_and_uefi() {
    let iso = guest_dir().join("installer.iso");
    assert!(
        iso.exists(),
        "{} is missing: tests/guest/build-iso.sh builds it",
        iso.display()
    );
    let a = Appliance::start(&[]).await;
    a.import_guest().await;
    let upload = |name: &str, file: &std::path::Path, query: &str| {
        let path = format!("/apis/edgevirt.io/v1/images/{name}/upload{query}");
        let data = std::fs::read(file).unwrap();
        let a = &a;
        async move {
            a.call(
                reqwest::Method::PUT,
                &path,
                Some(("application/octet-stream", data)),
            )
            .await
        }
    };
    // A disk image is not an ISO: refused, and nothing is left of it.
    let (code, v) = upload("not-iso", &guest_dir().join("bootdisk.img"), "?type=iso").await;
    assert_eq!(code, 422, "{v}");
    assert!(v["message"].as_str().unwrap().contains("not an ISO"), "{v}");
    assert_eq!(a.get("/apis/edgevirt.io/v1/images/not-iso").await.0, 404);
    // Refused before the body is read: a small one, so the answer comes before the send
    // ends (a 57 MiB body would meet a closed connection).
    let (code, v) = a
        .call(
            reqwest::Method::PUT,
            "/apis/edgevirt.io/v1/images/installer/upload?type=bogus",
            Some(("application/octet-stream", vec![0u8; 16])),
        )
        .await;
    assert_eq!(code, 400, "{v}");
    let (code, v) = upload("installer", &iso, "?type=iso").await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["status"]["iso"], true, "{v}");
    assert_eq!(v["status"]["format"], "raw", "{v}");

    // The installer first, then the blank disk the install goes to.
    let yaml = Vm::guest("inst")
        .memory("512Mi")
        .with(|v| {
            v["spec"]["dataVolumeTemplates"] = json!([{
                "metadata": {"name": "inst-root"},
                "spec": {"source": {"blank": {}},
                         "storage": {"resources": {"requests": {"storage": "2Gi"}}}},
            }]);
            let spec = &mut v["spec"]["template"]["spec"];
            spec["domain"]["firmware"] = json!({"bootloader": {"bios": {}}});
            spec["domain"]["devices"]["disks"] = json!([
                {"name": "installer", "cdrom": {"bus": "sata"}, "bootOrder": 1},
                {"name": "root", "disk": {"bus": "virtio"}, "bootOrder": 2},
            ]);
            spec["volumes"] = json!([
                {"name": "installer", "containerDisk": {"image": "installer"}},
                {"name": "root", "dataVolume": {"name": "inst-root"}},
            ]);
        })
        .yaml();
    let (code, v) = a.post_yaml(VMS, &yaml).await;
    assert_eq!(code, 201, "{v}");
    let vmi = a.wait_running("inst", None, BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    let (_, xml) = virsh(&["dumpxml", &dom]);
    assert!(
        xml.contains("device='cdrom'") && xml.contains("bus='sata'"),
        "the ISO on a SATA CD drive: {xml}"
    );
    let hostname = |dom: String| async move {
        wait_for("the guest agent", BOOT, || async {
            guest_exec(&dom, "/bin/hostname", &[]).map(|h| h.trim().to_string())
        })
        .await
    };
    assert_eq!(
        hostname(dom.clone()).await,
        "isoboot",
        "booted from the ISO under BIOS"
    );
    // The install target: 2Gi (4194304 sectors), written by the "installer".
    let size = guest_exec(&dom, "/bin/cat", &["/sys/block/vda/size"]).unwrap_or_default();
    assert_eq!(size.trim(), "4194304", "the blank 2Gi disk in the guest");
    let installed = guest_exec(
        &dom,
        "/bin/sh",
        &[
            "-c",
            "printf installed-by-iso | dd of=/dev/vda conv=fsync 2>/dev/null && echo done",
        ],
    )
    .unwrap_or_default();
    assert_eq!(installed.trim(), "done");

    // UEFI with Secure Boot: the same ISO boots through its El Torito EFI image.
    let mut vm = a.vm("inst").await.unwrap();
    vm["spec"]["template"]["spec"]["domain"]["firmware"] = json!({"bootloader": {"efi": {}}});
    vm["spec"]["template"]["spec"]["domain"]["features"] = json!({"smm": {}});
    let (code, v) = a.put_json(&format!("{VMS}/inst"), &vm).await;
    assert_eq!(code, 200, "{v}");
    let (vmi, dom, xml) = restart(&a, "inst", &vmi).await;
    assert!(xml.contains("secure='yes'"), "Secure Boot firmware: {xml}");
    assert_eq!(
        hostname(dom.clone()).await,
        "isoboot",
        "booted from the ISO under UEFI"
    );
    let sb = guest_exec(
        &dom,
        "/bin/sh",
        &["-c", "dmesg | grep -c 'Secure boot enabled'"],
    )
    .unwrap_or_default();
    assert_eq!(sb.trim(), "1", "the guest's kernel saw Secure Boot on");

    // The install is done: the cdrom goes, and the VM starts without it (kernel boot, as a
    // second path), with the disk the install wrote.
    let mut vm = a.vm("inst").await.unwrap();
    let spec = &mut vm["spec"]["template"]["spec"];
    spec["domain"]["firmware"] =
        Vm::guest("inst").json()["spec"]["template"]["spec"]["domain"]["firmware"].clone();
    spec["domain"]["features"] = json!({});
    spec["domain"]["devices"]["disks"] = json!([{"name": "root", "disk": {"bus": "virtio"}}]);
    spec["volumes"] = json!([{"name": "root", "dataVolume": {"name": "inst-root"}}]);
    let (code, v) = a.put_json(&format!("{VMS}/inst"), &vm).await;
    assert_eq!(code, 200, "{v}");
    let (_, dom, xml) = restart(&a, "inst", &vmi).await;
    assert!(!xml.contains("device='cdrom'"), "no CD drive left: {xml}");
    assert_eq!(
        hostname(dom.clone()).await,
        "inst",
        "kernel boot, not the ISO"
    );
    let kept = guest_exec(&dom, "/bin/sh", &["-c", "head -c 16 /dev/vda"]).unwrap_or_default();
    assert_eq!(kept, "installed-by-iso", "the installed disk kept its data");

    // The disk fills up: its DataVolume grows to 3Gi and the running guest sees it at
    // once; shrinking it is refused.
    let (code, mut dv) = a.get(&format!("{DVS}/inst-root")).await;
    assert_eq!(code, 200, "{dv}");
    dv["spec"]["storage"]["resources"]["requests"]["storage"] = json!("1Gi");
    let (code, v) = a.put_json(&format!("{DVS}/inst-root"), &dv).await;
    assert_eq!(code, 422, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("can only grow"),
        "{v}"
    );
    dv["spec"]["storage"]["resources"]["requests"]["storage"] = json!("3Gi");
    let (code, v) = a.put_json(&format!("{DVS}/inst-root"), &dv).await;
    assert_eq!(code, 200, "{v}");
    wait_for("the guest to see the 3Gi disk", BOOT, || async {
        guest_exec(&dom, "/bin/cat", &["/sys/block/vda/size"]).filter(|s| s.trim() == "6291456")
    })
    .await;
    let kept = guest_exec(&dom, "/bin/sh", &["-c", "head -c 16 /dev/vda"]).unwrap_or_default();
    assert_eq!(kept, "installed-by-iso", "growing kept the data");

    hotplug_a_disk_into(&a, "inst", &dom).await;
    // The ISO is no longer used, so it can go.
    assert_eq!(
        a.delete("/apis/edgevirt.io/v1/images/installer").await.0,
        200
    );

    // KubeVirt's way to an ISO at a URL, unchanged: a DataVolume with an `http` source as
    // a cdrom. The node downloads it and the guest boots from it.
    let files = tempfile::tempdir().unwrap();
    std::fs::copy(&iso, files.path().join("installer.iso")).unwrap();
    let web = FileServer::start(files.path().to_path_buf());
    let yaml = Vm::guest("urliso")
        .memory("256Mi")
        .with(|v| {
            v["spec"]["dataVolumeTemplates"] = json!([{
                "metadata": {"name": "urliso-cd"},
                "spec": {"source": {"http": {"url": format!("{}/installer.iso", web.url)}},
                         "storage": {"resources": {"requests": {"storage": "100Mi"}}}},
            }]);
            let spec = &mut v["spec"]["template"]["spec"];
            spec["domain"]["firmware"] = json!({"bootloader": {"bios": {}}});
            spec["domain"]["devices"]["disks"] =
                json!([{"name": "cd", "cdrom": {"bus": "sata"}, "bootOrder": 1}]);
            spec["volumes"] = json!([{"name": "cd", "dataVolume": {"name": "urliso-cd"}}]);
        })
        .yaml();
    let (code, v) = a.post_yaml(VMS, &yaml).await;
    assert_eq!(code, 201, "{v}");
    let vmi = a.wait_running("urliso", None, BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    assert_eq!(
        hostname(dom).await,
        "isoboot",
        "booted from the downloaded ISO"
    );
    a.delete(&format!("{VMS}/urliso")).await;
}

/// KubeVirt's `addvolume` and `removevolume` on the running VM `vm` (domain `dom`): a blank
/// DataVolume appears in the guest as a SCSI disk, persistently (the VM's spec has it) or for
/// the instance only, and goes again; the disk the VM was defined with cannot be removed.
async fn hotplug_a_disk_into(a: &Appliance, vm: &str, dom: &str) {
    // PUT of a subresource of the VM (`virtualmachines`) or its instance.
    let put = |on: &'static str, what: &'static str, body: serde_json::Value| async move {
        let path = format!("/apis/subresources.kubevirt.io/v1/namespaces/default/{on}/{vm}/{what}");
        let body = serde_json::to_vec(&body).unwrap();
        a.call(
            reqwest::Method::PUT,
            &path,
            Some(("application/json", body)),
        )
        .await
    };
    let no_sda = |what: &'static str| async move {
        wait_for(what, BOOT, || async {
            guest_exec(dom, "/bin/sh", &["-c", "ls /sys/block"]).filter(|s| !s.contains("sda"))
        })
        .await
    };
    let dv = r#"{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "extra"},
        "spec": {"source": {"blank": {}},
                 "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}"#;
    let (code, v) = a.post_yaml(DVS, dv).await;
    assert_eq!(code, 201, "{v}");
    let add = json!({"name": "extra", "disk": {"disk": {"bus": "scsi"}},
                     "volumeSource": {"dataVolume": {"name": "extra"}}});
    let (code, v) = put("virtualmachines", "addvolume", add.clone()).await;
    assert_eq!(code, 202, "{v}");
    // The guest sees a 1Gi SCSI disk appear (2097152 sectors), without a restart.
    wait_for("the guest to see the hotplugged disk", BOOT, || async {
        guest_exec(dom, "/bin/cat", &["/sys/block/sda/size"]).filter(|s| s.trim() == "2097152")
    })
    .await;
    let vmi = a.vmi(vm).await.unwrap();
    let st = vmi["status"]["volumeStatus"]
        .as_array()
        .and_then(|l| l.iter().find(|s| s["name"] == "extra").cloned())
        .unwrap_or_default();
    assert_eq!(st["phase"], "Ready", "{vmi}");
    assert_eq!(st["target"], "sda", "{vmi}");
    assert!(st["hotplugVolume"].is_object(), "{vmi}");
    let spec = &a.vm(vm).await.unwrap()["spec"]["template"]["spec"];
    assert!(
        spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "extra" && v["dataVolume"]["hotpluggable"] == true),
        "persistent on the VM: {spec}"
    );
    let wrote = guest_exec(
        dom,
        "/bin/sh",
        &[
            "-c",
            "printf hotplugged | dd of=/dev/sda conv=fsync 2>/dev/null && echo done",
        ],
    )
    .unwrap_or_default();
    assert_eq!(wrote.trim(), "done");
    // The same name again is a conflict; the VM's own disk cannot be taken out.
    let (code, v) = put("virtualmachines", "addvolume", add).await;
    assert_eq!(code, 409, "{v}");
    let (code, v) = put("virtualmachines", "removevolume", json!({"name": "root"})).await;
    assert_eq!(code, 422, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("not hotplugged"),
        "{v}"
    );

    // removevolume: gone from the guest, the domain, the VM and the status.
    let (code, v) = put("virtualmachines", "removevolume", json!({"name": "extra"})).await;
    assert_eq!(code, 202, "{v}");
    no_sda("the disk to leave the guest").await;
    wait_for("the status to drop it", BOOT, || async {
        let vmi = a.vmi(vm).await?;
        let l = vmi["status"]["volumeStatus"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (!l.iter().any(|s| s["name"] == "extra")).then_some(())
    })
    .await;
    let (_, xml) = virsh(&["dumpxml", dom]);
    assert!(!xml.contains("ua-extra"), "{xml}");
    let spec = &a.vm(vm).await.unwrap()["spec"]["template"]["spec"];
    assert!(!spec.to_string().contains("extra"), "{spec}");

    // On the instance only: the VM's spec does not get it, and the data written is there.
    let (code, v) = put(
        "virtualmachineinstances",
        "addvolume",
        json!({"name": "again", "volumeSource": {"dataVolume": {"name": "extra"}}}),
    )
    .await;
    assert_eq!(code, 202, "{v}");
    let back = wait_for("the disk to come back", BOOT, || async {
        guest_exec(dom, "/bin/sh", &["-c", "head -c 10 /dev/sda"]).filter(|s| !s.is_empty())
    })
    .await;
    assert_eq!(
        back, "hotplugged",
        "the DataVolume kept what the guest wrote"
    );
    let spec = &a.vm(vm).await.unwrap()["spec"]["template"]["spec"];
    assert!(!spec.to_string().contains("again"), "{spec}");
    let (code, v) = put(
        "virtualmachineinstances",
        "removevolume",
        json!({"name": "again"}),
    )
    .await;
    assert_eq!(code, 202, "{v}");
    no_sda("the disk to leave the guest again").await;
}

/// KubeVirt's `tpm.persistent` and `efi.persistent` on a real guest: it stores a value in
/// its vTPM's NV storage (raw TPM 2.0 commands through `/dev/tpm0`, see `testkit::tpm`) and
/// an EFI variable through efivarfs, and a new instance after a restart reads both back. The
/// state lives in the VM's folder on the node, and libvirt's swtpm folder only links to it.
#[tokio::test]
#[ignore = "needs root, libvirtd, swtpm, OVMF and the test guest: run scripts/test.sh"]
async fn tpm_and_efi_variables_survive_a_restart() {
    const EFI_VAR: &str =
        "/sys/firmware/efi/efivars/EdgevirtTest-3b0f4d4a-5a8c-4c4e-9d3e-0e5f2a1b7c6d";
    let a = Appliance::start(&[]).await;
    a.import_guest().await;
    let yaml = Vm::guest("keeper")
        .memory("512Mi")
        .with(|v| {
            let domain = Vm::domain_of(v);
            domain["firmware"]["bootloader"] =
                json!({"efi": {"secureBoot": false, "persistent": true}});
            domain["devices"]["tpm"] = json!({"persistent": true});
        })
        .yaml();
    let (code, v) = a.post_yaml(VMS, &yaml).await;
    assert_eq!(code, 201, "{v}");
    let vmi = a.wait_running("keeper", None, BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    let (_, xml) = virsh(&["dumpxml", &dom]);
    assert!(xml.contains("persistent_state='yes'"), "{xml}");
    let vm_uid = a.vm("keeper").await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let folder = a.dir.join("volumes").join(&vm_uid);
    assert!(
        xml.contains(&format!(">{}/efi-vars.fd</nvram>", folder.display())),
        "the EFI variables in the VM's folder: {xml}"
    );
    let tpm = |dom: &str, cmd: Vec<u8>| {
        guest_exec(dom, "/bin/sh", &["-c", &tpm::guest_shell(&cmd)])
            .and_then(|out| tpm::parse(&out))
    };
    wait_for("the guest agent", BOOT, || async {
        guest_exec(&dom, "/bin/true", &[])
    })
    .await;
    let (rc, _) = tpm(&dom, tpm::nv_define(8)).expect("an answer from /dev/tpm0");
    assert_eq!(rc, 0, "NV_DefineSpace");
    let (rc, _) = tpm(&dom, tpm::nv_write(b"edgevirt")).unwrap();
    assert_eq!(rc, 0, "NV_Write");
    let set_var = format!(
        "mount -t efivarfs efivarfs /sys/firmware/efi/efivars 2>/dev/null; \
         printf '\\007\\000\\000\\000kept-in-nvram' >{EFI_VAR} && echo set"
    );
    assert_eq!(
        guest_exec(&dom, "/bin/sh", &["-c", &set_var])
            .unwrap_or_default()
            .trim(),
        "set",
        "an EFI variable written"
    );
    let read_var = format!(
        "mount -t efivarfs efivarfs /sys/firmware/efi/efivars 2>/dev/null; tail -c +5 {EFI_VAR}"
    );

    // A new instance: the same TPM and EFI variables.
    let (_, dom, _) = restart(&a, "keeper", &vmi).await;
    wait_for("the guest agent after the restart", BOOT, || async {
        guest_exec(&dom, "/bin/true", &[])
    })
    .await;
    let (rc, resp) = tpm(&dom, tpm::nv_read(8)).unwrap();
    assert_eq!(rc, 0, "NV_Read after the restart: {resp:02x?}");
    assert_eq!(tpm::nv_read_data(&resp).unwrap(), b"edgevirt");
    assert_eq!(
        guest_exec(&dom, "/bin/sh", &["-c", &read_var]).as_deref(),
        Some("kept-in-nvram"),
        "the EFI variable after the restart"
    );
    assert!(folder.join("efi-vars.fd").is_file());
    assert!(
        folder.join("tpm/tpm2/tpm2-00.permall").is_file(),
        "the vTPM's state in the VM's folder"
    );
    a.delete(&format!("{VMS}/keeper")).await;
    wait_for("the VM's folder removed", BOOT, || async {
        (!folder.exists()).then_some(())
    })
    .await;
}

/// UEFI Secure Boot refuses a kernel that is not signed as it was shipped: the test guest's
/// boot disk (Debian's signed shim, GRUB and kernel) with one byte of the kernel changed.
/// The guest starts paused, the test listens on its serial console, and after the unpause
/// the console shows shim's refusal and never the kernel's first line. (The untouched disk
/// boots under Secure Boot in `tests/examples.rs`, and the ISO's in the ISO test.)
#[tokio::test]
#[ignore = "needs root, libvirtd, OVMF and the test guest: run scripts/test.sh"]
async fn secure_boot_refuses_an_altered_kernel() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::Builder::new()
        .prefix("evtest-sb-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let disk = dir.path().join("altered.img");
    std::fs::copy(guest_dir().join("bootdisk.img"), &disk).unwrap();
    let kernel = dir.path().join("vmlinuz");
    let mtools = |args: &[&str]| {
        let ok = std::process::Command::new(args[0])
            .args(&args[1..])
            .env("MTOOLS_SKIP_CHECK", "1")
            .status()
            .unwrap()
            .success();
        assert!(ok, "{args:?}");
    };
    let (d, k) = (disk.to_str().unwrap(), kernel.to_str().unwrap());
    mtools(&["mcopy", "-i", d, "::/vmlinuz", k]);
    let mut bytes = std::fs::read(&kernel).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&kernel, &bytes).unwrap();
    mtools(&["mcopy", "-o", "-i", d, k, "::/vmlinuz"]);

    let a = Appliance::start(&[]).await;
    a.import("altered-boot", &disk).await;
    let yaml = Vm::guest("unsigned")
        .memory("512Mi")
        .with(|v| {
            let spec = &mut v["spec"]["template"]["spec"];
            spec["startStrategy"] = json!("Paused");
            spec["domain"]["firmware"] = json!({"bootloader": {"efi": {}}});
            spec["domain"]["features"] = json!({"smm": {}});
            spec["domain"]["devices"]["disks"] =
                json!([{"name": "boot", "disk": {"bus": "virtio"}}]);
            spec["volumes"] = json!([{"name": "boot", "containerDisk": {"image": "altered-boot"}}]);
        })
        .yaml();
    let (code, v) = a.post_yaml(VMS, &yaml).await;
    assert_eq!(code, 201, "{v}");
    let vmi = a.wait_running("unsigned", None, BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    assert_eq!(domstate(&dom).as_deref(), Some("paused"));
    let (_, xml) = virsh(&["dumpxml", &dom]);
    assert!(xml.contains("secure='yes'"), "Secure Boot firmware: {xml}");
    let socket = a
        .dir
        .join("run/vmi")
        .join(vmi["metadata"]["uid"].as_str().unwrap())
        .join("serial.sock");
    let mut serial = tokio::net::UnixStream::connect(&socket).await.unwrap();
    assert_eq!(a.action("unsigned", "unpause").await, 202);
    let mut seen = String::new();
    let refused = tokio::time::timeout(BOOT, async {
        let mut buf = [0u8; 4096];
        // shim refuses the kernel; GRUB then has none to boot.
        while !(seen.contains("bad shim signature")
            && seen.contains("you need to load the kernel first"))
        {
            let n = serial.read(&mut buf).await.unwrap();
            assert!(n > 0, "the serial console closed: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
    .await;
    assert!(refused.is_ok(), "no refusal on the console: {seen}");
    println!(
        "console: {}",
        seen.lines()
            .filter(|l| l.contains("error"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    assert!(
        !seen.contains("Linux version"),
        "the altered kernel must not start: {seen}"
    );
    a.delete(&format!("{VMS}/unsigned")).await;
}

const SNAPSHOTS: &str =
    "/apis/snapshot.kubevirt.io/v1beta1/namespaces/default/virtualmachinesnapshots";
const RESTORES: &str =
    "/apis/snapshot.kubevirt.io/v1beta1/namespaces/default/virtualmachinerestores";
const CONTENTS: &str =
    "/apis/snapshot.kubevirt.io/v1beta1/namespaces/default/virtualmachinesnapshotcontents";

fn kubevirt_snapshot_fixture(file: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kubevirt-snapshot")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Snapshots of a running guest whose root filesystem is on a DataVolume, from KubeVirt's
/// own manifests: the guest writes a marker, is snapshotted without being stopped (its
/// uptime goes on; its filesystems frozen through the guest agent for a few ms, which the
/// status says), writes a second marker; the restore (StopTarget) brings back the first and
/// not the second. A second snapshot deleted while the guest runs leaves it running with its
/// current data and removes the copy. `freeze` / `unfreeze` freeze and thaw the guest, and
/// a short `unfreezeTimeout` thaws it by itself.
#[tokio::test]
#[ignore = "needs root, libvirtd and the test guest: run scripts/test.sh"]
async fn snapshot_restore_and_freeze_a_running_guest() {
    let pool = tempfile::Builder::new()
        .prefix("evtest-pool-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let arg = format!("site={}", pool.path().display());
    let mut a = Appliance::start(&["--shared-pool", &arg]).await;
    a.import_guest().await;
    // A second disk on the shared pool: snapshots cover claims there too. (Its storage class
    // appears once the node reports the pool.)
    wait_for("the pool's storage class", BOOT, || async {
        let (code, _) = a.get("/apis/storage.k8s.io/v1/storageclasses/site").await;
        (code == 200).then_some(())
    })
    .await;
    let pool_dv = r#"{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "larry-pool"},
        "spec": {"source": {"blank": {}},
                 "storage": {"storageClassName": "site",
                             "resources": {"requests": {"storage": "16Mi"}}}}}"#;
    let (code, v) = a.post_yaml(DVS, pool_dv).await;
    assert_eq!(code, 201, "{v}");
    let dv = r#"{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "larry-root"},
        "spec": {"source": {"blank": {}},
                 "storage": {"resources": {"requests": {"storage": "128Mi"}}}}}"#;
    let (code, v) = a.post_yaml(DVS, dv).await;
    assert_eq!(code, 201, "{v}");
    let vm = Vm::guest("larry")
        .disk_root("root", json!({"dataVolume": {"name": "larry-root"}}))
        .disk("pool", json!({"dataVolume": {"name": "larry-pool"}}));
    let (code, v) = a.post_yaml(VMS, &vm.yaml()).await;
    assert_eq!(code, 201, "{v}");
    let vmi = a.wait_running("larry", None, BOOT).await;
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgevirt"))
            .args(args)
            .env("EDGEVIRT_SERVER", &a.url)
            .env("EDGEVIRT_TOKEN", &a.token)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "edgevirt {args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    let sh = |dom: &str, cmd: &str| guest_exec(dom, "/bin/sh", &["-c", cmd]).unwrap_or_default();
    wait_for("the guest on its disk root", BOOT, || async {
        Some(sh(&dom, "grep -q ' / ext2' /proc/mounts && echo disk")).filter(|s| s.trim() == "disk")
    })
    .await;
    assert_eq!(
        sh(&dom, "echo first >/marker1 && sync && echo ok").trim(),
        "ok"
    );
    let on_pool = |dom: &str, what: &str| {
        sh(
            dom,
            &format!("printf {what} | dd of=/dev/vdb conv=fsync 2>/dev/null && echo ok"),
        )
    };
    assert_eq!(on_pool(&dom, "pool-first").trim(), "ok");
    let id = domid(&dom).expect("a running domain");
    let up_before = guest_uptime(&dom).unwrap();

    // Refusals: a snapshot of anything but a VM, a content made by hand, a bad policy.
    let (code, v) = a
        .post_yaml(
            SNAPSHOTS,
            &kubevirt_snapshot_fixture("vmsnapshot.yaml")
                .replace("kind: VirtualMachine\n", "kind: Pod\n")
                .replace("snap-larry", "snap-pod"),
        )
        .await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        v["details"]["causes"][0]["field"], "spec.source.kind",
        "{v}"
    );
    let (code, v) = a
        .post_yaml(
            CONTENTS,
            r#"{"apiVersion": "snapshot.kubevirt.io/v1beta1",
                "kind": "VirtualMachineSnapshotContent",
                "metadata": {"name": "byhand"}, "spec": {"source": {}}}"#,
        )
        .await;
    assert_eq!(code, 422, "{v}");

    // The snapshot, from KubeVirt's manifest as it is.
    let (code, v) = a
        .post_yaml(SNAPSHOTS, &kubevirt_snapshot_fixture("vmsnapshot.yaml"))
        .await;
    assert_eq!(code, 201, "{v}");
    let snap = wait_for("the snapshot to be ready", BOOT, || async {
        let (_, s) = a.get(&format!("{SNAPSHOTS}/snap-larry")).await;
        assert_ne!(s["status"]["phase"], "Failed", "{s}");
        (s["status"]["readyToUse"] == true).then_some(s)
    })
    .await;
    let st = &snap["status"];
    assert_eq!(st["phase"], "Succeeded", "{snap}");
    assert_eq!(st["indications"], json!(["Online", "GuestAgent"]), "{snap}");
    assert_eq!(
        st["snapshotVolumes"]["includedVolumes"],
        json!(["root", "pool"]),
        "{snap}"
    );
    let ready = st["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "True", "{snap}");
    let frozen = st["sourceIndications"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["indication"] == "GuestAgent")
        .and_then(|i| i["message"].as_str())
        .expect("the GuestAgent indication says how long");
    let ms: u64 = frozen
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no duration in {frozen:?}"));
    println!("snapshot: the guest was frozen for {ms} ms");
    assert!(ms < 10_000, "{frozen}");
    let content_name = st["virtualMachineSnapshotContentName"].as_str().unwrap();
    let (code, content) = a.get(&format!("{CONTENTS}/{content_name}")).await;
    assert_eq!(code, 200, "{content}");
    assert_eq!(content["spec"]["volumeBackups"][0]["volumeName"], "root");
    assert_eq!(
        content["spec"]["source"]["virtualMachine"]["spec"]["runStrategy"],
        "Always"
    );
    let copy = a
        .dir
        .join("snapshots")
        .join(content["metadata"]["uid"].as_str().unwrap())
        .join("0.qcow2");
    assert!(copy.is_file(), "{}", copy.display());
    // The guest was never stopped: the same domain, its uptime running on.
    assert_eq!(domid(&dom).as_deref(), Some(id.as_str()));
    assert!(guest_uptime(&dom).unwrap() > up_before);
    assert_eq!(
        sh(&dom, "echo second >/marker2 && sync && echo ok").trim(),
        "ok"
    );
    assert_eq!(on_pool(&dom, "pool-later").trim(), "ok");

    // freeze / unfreeze through the VMI's subresources.
    let sub = |what: &str| {
        format!(
            "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/larry/{what}"
        )
    };
    let fs_status = |dom: &str| {
        virsh(&[
            "qemu-agent-command",
            dom,
            r#"{"execute":"guest-fsfreeze-status"}"#,
        ])
        .1
    };
    let (code, v) = a
        .put_json(&sub("freeze"), &json!({"unfreezeTimeout": "1m"}))
        .await;
    assert_eq!(code, 202, "{v}");
    wait_for("fsFreezeStatus frozen", BOOT, || async {
        a.vmi("larry")
            .await
            .filter(|v| v["status"]["fsFreezeStatus"] == "frozen")
    })
    .await;
    assert!(
        fs_status(&dom).contains("\"frozen\""),
        "{}",
        fs_status(&dom)
    );
    let (code, v) = a.put_json(&sub("unfreeze"), &json!({})).await;
    assert_eq!(code, 202, "{v}");
    wait_for("fsFreezeStatus gone", BOOT, || async {
        a.vmi("larry")
            .await
            .filter(|v| v["status"].get("fsFreezeStatus").is_none())
    })
    .await;
    assert!(
        fs_status(&dom).contains("\"thawed\""),
        "{}",
        fs_status(&dom)
    );
    let (code, v) = a
        .put_json(&sub("freeze"), &json!({"unfreezeTimeout": "3s"}))
        .await;
    assert_eq!(code, 202, "{v}");
    wait_for("the guest frozen", BOOT, || async {
        fs_status(&dom).contains("\"frozen\"").then_some(())
    })
    .await;
    wait_for("the unfreezeTimeout to thaw it", BOOT, || async {
        fs_status(&dom).contains("\"thawed\"").then_some(())
    })
    .await;
    let (code, v) = a
        .put_json(&sub("freeze"), &json!({"unfreezeTimeout": "soon"}))
        .await;
    assert_eq!(code, 400, "{v}");

    // A restore under FailImmediate refuses the running VM and says why; the CLI's
    // restore (StopTarget) stops it and brings back the first marker, not the second.
    let restore =
        kubevirt_snapshot_fixture("vmrestore.yaml") + "  targetReadinessPolicy: FailImmediate\n";
    let (code, v) = a.post_yaml(RESTORES, &restore).await;
    assert_eq!(code, 201, "{v}");
    let refused = wait_for("the FailImmediate restore to give up", BOOT, || async {
        let (_, r) = a.get(&format!("{RESTORES}/restore-larry")).await;
        r["status"]["conditions"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["type"] == "Ready"))
            .and_then(|c| c["message"].as_str().map(str::to_string))
            .filter(|m| m.contains("is running"))
    })
    .await;
    assert!(refused.contains("StopTarget"), "{refused}");
    assert!(
        a.vmi("larry").await.is_some(),
        "FailImmediate left the VM running"
    );
    let said = cli(&["restore", "snap-larry", "--stop"]);
    assert!(said.contains("complete"), "{said}");
    assert!(
        said.contains("puts back the disk of volume \"root\""),
        "{said}"
    );
    let vmi2 = a
        .wait_running(
            "larry",
            Some(vmi["metadata"]["uid"].as_str().unwrap()),
            BOOT,
        )
        .await;
    let dom = vmi2["status"]["domainName"].as_str().unwrap().to_string();
    let markers = wait_for("the restored guest", BOOT, || async {
        Some(sh(
            &dom,
            "grep -q ' / ext2' /proc/mounts && cat /marker1 /marker2 2>&1",
        ))
        .filter(|s| s.contains("first"))
    })
    .await;
    assert!(
        markers.contains("No such file") && !markers.contains("second"),
        "the second marker came after the snapshot: {markers}"
    );
    assert_eq!(
        sh(&dom, "head -c 10 /dev/vdb"),
        "pool-first",
        "the pool disk as it was at the snapshot"
    );

    // A second snapshot, by the CLI, deleted while the guest runs: its copy goes, the
    // guest stays.
    let said = cli(&["snapshot", "create", "larry", "--name", "snap-two"]);
    assert_eq!(
        said.trim(),
        "virtualmachinesnapshot snap-two ready (Online, GuestAgent)"
    );
    let listed = cli(&["snapshot", "list", "--vm", "larry"]);
    assert!(
        listed
            .lines()
            .any(|l| l.split_whitespace().take(4).collect::<Vec<_>>()
                == ["snap-two", "larry", "Succeeded", "true"]),
        "{listed}"
    );
    let two = wait_for("the second snapshot", BOOT, || async {
        let (_, s) = a.get(&format!("{SNAPSHOTS}/snap-two")).await;
        (s["status"]["readyToUse"] == true).then_some(s)
    })
    .await;
    let content2 = two["status"]["virtualMachineSnapshotContentName"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, c2) = a.get(&format!("{CONTENTS}/{content2}")).await;
    let folder2 = a
        .dir
        .join("snapshots")
        .join(c2["metadata"]["uid"].as_str().unwrap());
    assert!(folder2.join("0.qcow2").is_file());
    let id = domid(&dom).unwrap();
    assert_eq!(
        sh(&dom, "echo third >/marker3 && sync && echo ok").trim(),
        "ok"
    );
    cli(&["snapshot", "delete", "snap-two"]);
    wait_for("the content and its copy gone", BOOT, || async {
        let (code, _) = a.get(&format!("{CONTENTS}/{content2}")).await;
        (code == 404 && !folder2.exists()).then_some(())
    })
    .await;
    assert_eq!(
        domid(&dom).as_deref(),
        Some(id.as_str()),
        "still the same guest"
    );
    assert_eq!(sh(&dom, "cat /marker1 /marker3").trim(), "first\nthird");
    // The first snapshot and its copy are untouched.
    assert!(copy.is_file());

    // kill -9 of the appliance while a snapshot had the guest frozen (here frozen by hand)
    // and a copy was half written: after the restart the guest is thawed and the half copy
    // gone, and the guest ran on all along.
    let frozen = virsh(&[
        "qemu-agent-command",
        &dom,
        r#"{"execute":"guest-fsfreeze-freeze"}"#,
    ]);
    assert!(frozen.0, "{}", frozen.1);
    let half = a.dir.join("snapshots").join(".part-interrupted");
    std::fs::create_dir_all(&half).unwrap();
    std::fs::write(half.join("0.qcow2"), b"half").unwrap();
    a.kill9();
    a.spawn().await;
    wait_for("the restarted agent to thaw the guest", BOOT, || async {
        fs_status(&dom).contains("\"thawed\"").then_some(())
    })
    .await;
    wait_for("the half-written copy removed", BOOT, || async {
        (!half.exists()).then_some(())
    })
    .await;
    assert_eq!(
        domid(&dom).as_deref(),
        Some(id.as_str()),
        "the guest ran on"
    );
    assert!(copy.is_file(), "the whole copy stays");
}

const BACKUPS: &str = "/apis/backup.kubevirt.io/v1alpha1/namespaces/default/virtualmachinebackups";

/// Backups of a running guest to a backup target: a full backup, writes in the guest, an
/// incremental one whose data disk holds about what was written (not the whole disk), both
/// verified from the folder alone, a tampered copy refused by `verify`, and a restore of
/// the incremental as a new VM whose data disk has the checksum the guest's had at that
/// moment. The original guest runs throughout (same domain, uptime growing).
#[tokio::test]
#[ignore = "needs root, libvirtd and the test guest: run scripts/test.sh"]
async fn backups_full_then_incremental_verify_and_restore_as_a_new_vm() {
    let target = tempfile::Builder::new()
        .prefix("evtest-nas-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let arg = format!("nas={}", target.path().display());
    // A small target on a tmpfs of its own, to fill up.
    let small = Tmpfs::mount("evtest-small-", "192m");
    let small_arg = format!("small={}", small.path.display());
    let mut a = Appliance::start(&["--backup-target", &arg, "--backup-target", &small_arg]).await;
    a.import_guest().await;
    for (name, size) in [("bob-root", "128Mi"), ("bob-data", "64Mi")] {
        let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name},
            "spec": {"source": {"blank": {}},
                     "storage": {"resources": {"requests": {"storage": size}}}}});
        let (code, v) = a.post_yaml(DVS, &dv.to_string()).await;
        assert_eq!(code, 201, "{v}");
    }
    let vm = Vm::guest("bob")
        .disk_root("root", json!({"dataVolume": {"name": "bob-root"}}))
        .disk("data", json!({"dataVolume": {"name": "bob-data"}}));
    let (code, v) = a.post_yaml(VMS, &vm.yaml()).await;
    assert_eq!(code, 201, "{v}");
    let vmi = a.wait_running("bob", None, BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    let sh = |dom: &str, cmd: &str| guest_exec(dom, "/bin/sh", &["-c", cmd]).unwrap_or_default();
    wait_for("the guest on its disk root", BOOT, || async {
        Some(sh(&dom, "grep -q ' / ext2' /proc/mounts && echo disk")).filter(|s| s.trim() == "disk")
    })
    .await;
    let write = |dom: &str, seek_mib: u32, mib: u32| {
        let out = sh(
            dom,
            &format!(
                "dd if=/dev/urandom of=/dev/vdb bs=1M seek={seek_mib} count={mib} conv=fsync \
                 2>/dev/null && echo ok"
            ),
        );
        assert_eq!(out.trim(), "ok", "writing {mib} MiB in the guest");
    };
    let data_sum = |dom: &str| {
        let out = sh(dom, "sha256sum /dev/vdb");
        let sum = out
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        assert_eq!(sum.len(), 64, "sha256sum in the guest: {out:?}");
        sum
    };
    let id = domid(&dom).expect("a running domain");
    let up_before = guest_uptime(&dom).unwrap();

    // Refusals: a target no node mounts, a pull-mode backup.
    let (code, v) = a
        .post_yaml(
            BACKUPS,
            r#"{"apiVersion": "backup.kubevirt.io/v1alpha1", "kind": "VirtualMachineBackup",
                "metadata": {"name": "pull"},
                "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "bob"},
                         "mode": "Pull", "pvcName": "nas"}}"#,
        )
        .await;
    assert_eq!(code, 422, "{v}");
    let (ok, out) = ev_cli(
        &a,
        &[
            "backup", "create", "bob", "--target", "usb", "--name", "nowhere",
        ],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("does not mount backup target \"usb\""),
        "{out}"
    );

    // The full backup.
    write(&dom, 0, 8);
    let (ok, out) = ev_cli(
        &a,
        &["backup", "create", "bob", "--target", "nas", "--name", "b1"],
    );
    assert!(ok, "{out}");
    let (_, b1) = a.get(&format!("{BACKUPS}/b1")).await;
    assert_eq!(b1["status"]["type"], "Full", "{b1}");
    let vols = b1["status"]["includedVolumes"].as_array().unwrap();
    assert_eq!(vols.len(), 2, "{b1}");
    assert_eq!(vols[0]["volumeName"], "root");
    assert_eq!(vols[1]["volumeName"], "data");
    assert_eq!(vols[1]["virtualSize"], 64 << 20, "{b1}");
    assert_eq!(
        b1["status"]["virtualMachine"]["metadata"]["name"], "bob",
        "the VM as backed up, for a restore from the dashboard: {b1}"
    );
    let full_dir = target.path().join(b1["status"]["path"].as_str().unwrap());
    let full: serde_json::Value =
        serde_json::from_slice(&std::fs::read(full_dir.join("manifest.json")).unwrap()).unwrap();
    let full_data = full["disks"][1]["bytes"].as_u64().unwrap();
    assert!(
        full_data >= 8 << 20,
        "the full backup holds the 8 MiB written: {full}"
    );

    // Writes, then the incremental: it holds about the 16 MiB written, not the disk.
    write(&dom, 16, 16);
    let at_backup = data_sum(&dom);
    let (ok, out) = ev_cli(
        &a,
        &["backup", "create", "bob", "--target", "nas", "--name", "b2"],
    );
    assert!(ok, "{out}");
    let (_, b2) = a.get(&format!("{BACKUPS}/b2")).await;
    assert_eq!(b2["status"]["type"], "Incremental", "{b2}");
    assert_eq!(b2["status"]["parent"], full["name"], "{b2}");
    let inc_dir = target.path().join(b2["status"]["path"].as_str().unwrap());
    let inc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(inc_dir.join("manifest.json")).unwrap()).unwrap();
    let inc_data = inc["disks"][1]["bytes"].as_u64().unwrap();
    println!(
        "backup: full data disk {full_data} bytes, incremental {inc_data} bytes after 16 MiB written"
    );
    assert!(
        (16 << 20..=(2 * (16 << 20) + (4 << 20))).contains(&inc_data),
        "the incremental's data disk ({inc_data} bytes) is about the 16 MiB written"
    );
    // The guest goes on writing: the restore must show the moment of the backup.
    write(&dom, 40, 8);

    // verify, from the folder alone; a tampered copy does not verify.
    let (ok, out) = ev_cli(&a, &["backup", "verify", inc_dir.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("2 backup(s) in its chain"), "{out}");
    let copy = tempfile::Builder::new()
        .prefix("evtest-nascopy-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let vm_dir = inc_dir.parent().unwrap();
    assert!(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(vm_dir)
            .arg(copy.path())
            .status()
            .unwrap()
            .success()
    );
    let tampered = copy
        .path()
        .join("bob")
        .join(full["name"].as_str().unwrap())
        .join("1.qcow2");
    let mut bytes = std::fs::read(&tampered).unwrap();
    let at = bytes.len() - 4096;
    bytes[at] ^= 0xff;
    std::fs::write(&tampered, bytes).unwrap();
    let copied_inc = copy.path().join("bob").join(inc["name"].as_str().unwrap());
    let (ok, out) = ev_cli(&a, &["backup", "verify", copied_inc.to_str().unwrap()]);
    assert!(!ok, "a tampered parent must not verify: {out}");
    assert!(out.contains("1.qcow2 has checksum"), "{out}");
    let (ok, out) = ev_cli(
        &a,
        &[
            "backup",
            "restore",
            copied_inc.to_str().unwrap(),
            "--as",
            "bob-bad",
        ],
    );
    assert!(!ok && out.contains("not restoring"), "{out}");

    // The restore, as a new VM: its data disk is the guest's at the incremental's moment.
    let (ok, out) = ev_cli(
        &a,
        &[
            "backup",
            "restore",
            inc_dir.to_str().unwrap(),
            "--as",
            "bob2",
        ],
    );
    assert!(ok, "{out}");
    // The dashboard's verify and restore, which run on the node that holds the backup.
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let password = testkit::hostile::admin_password(&a);
    let (session, csrf) = testkit::hostile::dashboard_session(&http, &a.url, &password)
        .await
        .unwrap();
    let ui_post = |path: String, form: Vec<(&'static str, String)>| {
        let mut form = form;
        form.push(("csrf", csrf.clone()));
        http.post(format!("{}{path}", a.url))
            .header("cookie", format!("edgevirt_session={session}"))
            .form(&form)
            .send()
    };
    let r = ui_post(
        "/ui/vms/default/bob/restorebackup".into(),
        vec![("backup", "b2".into()), ("as", "bob3".into())],
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 303, "{}", r.text().await.unwrap_or_default());
    let r = ui_post(
        "/ui/vms/default/bob/verifybackup".into(),
        vec![("backup", "b2".into())],
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 303);
    let verified = wait_for("the node's verification", BOOT, || async {
        let (_, b) = a.get(&format!("{BACKUPS}/b2")).await;
        b["status"]["conditions"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["type"] == "Verified").cloned())
    })
    .await;
    assert_eq!(verified["status"], "True", "{verified}");
    assert!(
        verified["message"]
            .as_str()
            .unwrap()
            .contains("chain of 2 backup(s)"),
        "{verified}"
    );
    let page = http
        .get(format!("{}/ui/vms/default/bob", a.url))
        .header("cookie", format!("edgevirt_session={session}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Whole ("), "the page shows the verification");
    let (_, dv3) = a.get(&format!("{DVS}/bob3-data")).await;
    assert_eq!(
        dv3["spec"]["source"]["backup"],
        json!({"name": "b2", "volume": "data"}),
        "{dv3}"
    );
    let vmi3 = a.wait_running("bob3", None, BOOT).await;
    let dom3 = vmi3["status"]["domainName"].as_str().unwrap().to_string();
    wait_for("the guest restored from the dashboard", BOOT, || async {
        Some(sh(&dom3, "grep -q ' / ext2' /proc/mounts && echo disk"))
            .filter(|s| s.trim() == "disk")
    })
    .await;
    assert_eq!(
        data_sum(&dom3),
        at_backup,
        "the data disk restored by the node"
    );
    a.delete(&format!("{VMS}/bob3")).await;
    let vmi2 = a.wait_running("bob2", None, BOOT).await;
    let dom2 = vmi2["status"]["domainName"].as_str().unwrap().to_string();
    wait_for("the restored guest on its disk root", BOOT, || async {
        Some(sh(&dom2, "grep -q ' / ext2' /proc/mounts && echo disk"))
            .filter(|s| s.trim() == "disk")
    })
    .await;
    assert_eq!(data_sum(&dom2), at_backup, "the restored data disk");
    let (code, v) = a.get(&format!("{VMS}/bob2")).await;
    assert_eq!(code, 200);
    assert_eq!(
        v["spec"]["template"]["spec"]["volumes"][1]["dataVolume"]["name"], "bob2-data",
        "{v}"
    );
    let (ok, out) = ev_cli(&a, &["backup", "list"]);
    assert!(
        ok && out.contains("Incremental") && out.contains("Full"),
        "{out}"
    );

    a.delete(&format!("{VMS}/bob2")).await;

    // A schedule every 2 s keeping the last 2: after 4 runs it is suspended; exactly its 2
    // newest backups remain, the older folders are gone, and what remains (built on the
    // removed ones) still verifies down to the manual backups.
    let schedules = "/apis/edgevirt.io/v1/namespaces/default/backupschedules";
    let (code, v) = a
        .post_yaml(
            schedules,
            r#"{"apiVersion": "edgevirt.io/v1", "kind": "BackupSchedule",
                "metadata": {"name": "often"},
                "spec": {"target": "nas", "vms": ["bob"], "every": "2s", "keep": {"last": 2}}}"#,
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let sched = wait_for("4 scheduled runs", BOOT, || async {
        let (_, s) = a.get(&format!("{schedules}/often")).await;
        (s["status"]["runs"].as_u64().unwrap_or(0) >= 4).then_some(s)
    })
    .await;
    let mut suspended = sched.clone();
    suspended["spec"]["suspend"] = json!(true);
    let (code, v) = a.put_json(&format!("{schedules}/often"), &suspended).await;
    assert_eq!(code, 200, "{v}");
    let done = |b: &serde_json::Value| {
        b["status"]["conditions"].as_array().is_some_and(|l| {
            l.iter()
                .any(|c| c["type"] == "Done" && c["status"] == "True")
        })
    };
    let kept = wait_for(
        "the schedule's retention to leave its 2 newest",
        BOOT,
        || async {
            let (_, l) = a
                .get(&format!(
                    "{BACKUPS}?labelSelector=edgevirt.io/backup-schedule%3Doften"
                ))
                .await;
            let l = l["items"].as_array().cloned().unwrap_or_default();
            (l.len() == 2 && l.iter().all(done)).then_some(l)
        },
    )
    .await;
    let (_, s) = a.get(&format!("{schedules}/often")).await;
    let runs = s["status"]["runs"].as_u64().unwrap();
    assert!(runs >= 4, "{s}");
    let mut kept_folders: Vec<String> = kept
        .iter()
        .map(|b| {
            let p = b["status"]["path"].as_str().unwrap();
            p.rsplit('/').next().unwrap().to_string()
        })
        .collect();
    kept_folders.sort();
    let mut expect = vec![
        full["name"].as_str().unwrap().to_string(),
        inc["name"].as_str().unwrap().to_string(),
    ];
    expect.extend(kept_folders.clone());
    expect.sort();
    let on_target = wait_for("the pruned folders to go", BOOT, || async {
        let mut names: Vec<String> = std::fs::read_dir(vm_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        (names == expect).then_some(names)
    })
    .await;
    println!("schedule: {runs} runs, kept {kept_folders:?}; on the target {on_target:?}");
    let newest = vm_dir.join(kept_folders.last().unwrap());
    let (ok, out) = ev_cli(&a, &["backup", "verify", newest.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("4 backup(s) in its chain"), "{out}");

    // A target that fills up mid-backup: that backup fails with the reason and leaves no
    // half folder; the earlier backup there still verifies; the guest runs on.
    let (ok, out) = ev_cli(
        &a,
        &[
            "backup", "create", "bob", "--target", "small", "--name", "s1",
        ],
    );
    assert!(ok, "{out}");
    let (_, s1) = a.get(&format!("{BACKUPS}/s1")).await;
    assert_eq!(s1["status"]["type"], "Full", "{s1}");
    let s1_dir = small.path.join(s1["status"]["path"].as_str().unwrap());
    let filler = small.path.join("filler");
    let _ = std::process::Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", filler.display()))
        .args(["bs=1M", "status=none"])
        .status();
    write(&dom, 0, 8);
    let (ok, out) = ev_cli(
        &a,
        &[
            "backup", "create", "bob", "--target", "small", "--name", "s2",
        ],
    );
    assert!(!ok, "a backup onto a full target must fail: {out}");
    assert!(out.contains("the backup target is full"), "{out}");
    let bob_small = s1_dir.parent().unwrap().to_path_buf();
    let leftovers = |dir: &std::path::Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".part-"))
            .collect()
    };
    assert_eq!(leftovers(&bob_small), Vec::<String>::new());
    let (ok, out) = ev_cli(&a, &["backup", "verify", s1_dir.to_str().unwrap()]);
    assert!(ok, "{out}");
    std::fs::remove_file(&filler).unwrap();

    // kill -9 of the appliance while a backup is being written: the guest runs on, thawed;
    // after the restart the backup is taken again, from the last whole one, and is correct
    // (its chain reads as the guest's disk).
    write(&dom, 24, 24);
    let now_sum = data_sum(&dom);
    let (ok, out) = ev_cli(
        &a,
        &[
            "backup",
            "create",
            "bob",
            "--target",
            "small",
            "--name",
            "s3",
            "--no-wait",
        ],
    );
    assert!(ok, "{out}");
    // The backup's folder exists for a fraction of a second (the handover takes up to the
    // node's 2 s round): look for it every 5 ms, and kill the moment it is there.
    let asked = std::time::Instant::now();
    while leftovers(&bob_small).is_empty() {
        assert!(
            asked.elapsed() < Duration::from_secs(60),
            "the backup never started writing"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    a.kill9();
    assert!(
        domid(&dom).is_some(),
        "the guest must outlive the appliance"
    );
    a.spawn().await;
    let s3 = wait_for("the interrupted backup to be taken again", BOOT, || async {
        let (_, b) = a.get(&format!("{BACKUPS}/s3")).await;
        done(&b).then_some(b)
    })
    .await;
    assert_eq!(s3["status"]["type"], "Incremental", "{s3}");
    let s1_name = s1_dir.file_name().unwrap().to_str().unwrap();
    assert_eq!(s3["status"]["parent"], s1_name, "{s3}");
    let s3_dir = small.path.join(s3["status"]["path"].as_str().unwrap());
    let (ok, out) = ev_cli(&a, &["backup", "verify", s3_dir.to_str().unwrap()]);
    assert!(ok, "{out}");
    // The data disk as a backup's chain reads it, whole.
    let chain_sum = |dir: &std::path::Path| {
        let raw = target.path().join("data.raw");
        assert!(
            std::process::Command::new("qemu-img")
                .args(["convert", "-f", "qcow2", "-O", "raw"])
                .arg(dir.join("1.qcow2"))
                .arg(&raw)
                .status()
                .unwrap()
                .success()
        );
        let out = std::process::Command::new("sha256sum")
            .arg(&raw)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&raw);
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        chain_sum(&s3_dir),
        now_sum,
        "the backup taken after the kill reads as the guest's disk"
    );
    let fs = virsh(&[
        "qemu-agent-command",
        &dom,
        r#"{"execute":"guest-fsfreeze-status"}"#,
    ])
    .1;
    assert!(fs.contains("\"thawed\""), "the guest is thawed: {fs}");
    assert_eq!(leftovers(&bob_small), Vec::<String>::new());

    // The original ran on throughout.
    assert_eq!(domid(&dom).as_deref(), Some(id.as_str()));
    assert!(guest_uptime(&dom).unwrap() > up_before);

    // A restart: the new domain knows no checkpoint, while the disk keeps the last one's
    // bitmap. The next backup defines that checkpoint again and counts from it: an
    // incremental on s3, as small as what was written, that reads as the guest's disk.
    let uid = a.vmi("bob").await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(a.action("bob", "restart").await, 202);
    let vmi = a.wait_running("bob", Some(&uid), BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    wait_for("the restarted guest's agent", BOOT, || async {
        Some(sh(&dom, "echo up")).filter(|s| s.trim() == "up")
    })
    .await;
    write(&dom, 48, 8);
    let now_sum = data_sum(&dom);
    let (ok, out) = ev_cli(
        &a,
        &[
            "backup", "create", "bob", "--target", "small", "--name", "s4",
        ],
    );
    assert!(ok, "{out}");
    let (_, s4) = a.get(&format!("{BACKUPS}/s4")).await;
    assert_eq!(s4["status"]["type"], "Incremental", "{s4}");
    let s3_name = s3_dir.file_name().unwrap().to_str().unwrap();
    assert_eq!(s4["status"]["parent"], s3_name, "{s4}");
    let size = s4["status"]["sizeBytes"].as_u64().unwrap();
    assert!(
        size < 40 << 20,
        "8 MiB written, {size} bytes backed up: {s4}"
    );
    let s4_dir = small.path.join(s4["status"]["path"].as_str().unwrap());
    let (ok, out) = ev_cli(&a, &["backup", "verify", s4_dir.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert_eq!(
        chain_sum(&s4_dir),
        now_sum,
        "the backup taken after the restart reads as the guest's disk"
    );
    a.delete(&format!("{VMS}/bob")).await;
}

/// A tmpfs mounted for a test, unmounted when dropped.
struct Tmpfs {
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(prefix: &str, size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/var/tmp")
            .unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a tmpfs on {}", dir.path().display());
        Tmpfs {
            path: dir.path().to_path_buf(),
            _dir: dir,
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

/// `edgevirt ARGS` against the appliance: whether it succeeded, and all it printed.
fn ev_cli(a: &Appliance, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgevirt"))
        .args(args)
        .env("EDGEVIRT_SERVER", &a.url)
        .env("EDGEVIRT_TOKEN", &a.token)
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
