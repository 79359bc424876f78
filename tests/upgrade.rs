//! The upgrade test: a guest running under a launcher of the previous release keeps running
//! while `edgevirt serve` (controller and agent) is replaced by the current release and
//! restarted. Needs root, libvirtd and the test guest. The previous release is the commit
//! recorded in `tests/previous-release`, built by `tests/previous-release.sh` (once per
//! commit, cached under `target/previous-release/`); `EDGEVIRT_PREVIOUS_BIN` names a binary
//! built elsewhere instead.

use std::path::{Path, PathBuf};
use std::time::Duration;

use edgevirt::launcher::client::LauncherClient;
use testkit::*;

/// The previous release: its release string (from `tests/previous-release`) and its binary.
fn previous_release() -> (String, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let record = std::fs::read_to_string(root.join("tests/previous-release")).unwrap();
    let field = |key: &str| {
        record
            .lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| panic!("no `{key}` line in tests/previous-release"))
    };
    let (commit, release) = (field("commit "), field("release "));
    if let Some(p) = std::env::var_os("EDGEVIRT_PREVIOUS_BIN") {
        return (release, PathBuf::from(p));
    }
    // Builds the commit unless its binary is cached; fails with a message naming the commit
    // when the repository does not have it.
    let out = std::process::Command::new(root.join("tests/previous-release.sh"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "building the previous release {release} ({commit}) failed: see above"
    );
    let bin = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert!(
        bin.ends_with(format!("{commit}/edgevirt")),
        "{}",
        bin.display()
    );
    (release, bin)
}

/// Put `src` at `dst` the way dpkg does: a new file renamed over the old one, so processes
/// still running the old file keep their copy.
fn install_binary(src: &Path, dst: &Path) {
    let tmp = dst.with_extension("dpkg-new");
    std::fs::copy(src, &tmp).unwrap();
    std::fs::rename(&tmp, dst).unwrap();
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test]
#[ignore = "needs root, libvirtd, the test guest and the previous release: run scripts/test.sh"]
async fn upgrade_keeps_running_vms_and_old_launchers() {
    let (release, previous) = previous_release();
    // Where the package would install the binary: `serve` and the launchers it starts run
    // from this path.
    let bindir = tempfile::Builder::new()
        .prefix("evtest-bin-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let exe_path = bindir.path().join("edgevirt");
    install_binary(&previous, &exe_path);

    let mut app = Appliance::start_with_exe(exe_path.clone(), &[]).await;
    app.import_guest().await;
    let (code, v) = app.post_yaml(VMS, &Vm::guest("upg").yaml()).await;
    assert_eq!(code, 201, "{v}");
    let vmi = app
        .wait_running("upg", None, Duration::from_secs(120))
        .await;
    let uid = vmi["metadata"]["uid"].as_str().unwrap().to_string();
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();

    // Before: everything on the previous release, as it was released: its own release
    // string, no agent protocol (counts as 1.0), launcher protocol 1, and an agent that does
    // not report launcher versions yet.
    let (_, info) = app.get("/apis/edgevirt.io/v1/info").await;
    let old_release = info["version"].as_str().unwrap().to_string();
    assert_eq!(old_release, release, "{info}");
    assert!(info.get("agentProtocol").is_none(), "{info}");
    let vmi = app.vmi("upg").await.unwrap();
    assert_eq!(vmi["status"]["phase"], "Running");
    assert!(vmi["status"].get("launcherVersion").is_none(), "{vmi}");
    let sock = app.dir.join(format!("run/launchers/{uid}.sock"));
    let mut old = LauncherClient::connect(&sock).await.unwrap();
    assert_eq!(
        old.info.versions,
        vec![1],
        "the previous launcher speaks protocol 1 only"
    );
    assert_eq!(old.info.launcher_version, release);
    let old_pid = old.info.pid;
    let domid_before = domid(&dom).expect("domain runs");
    let uptime_before = wait_for("the guest agent", Duration::from_secs(90), || async {
        guest_uptime(&dom)
    })
    .await;

    // The upgrade: stop serve as systemd would, replace the binary, start the new one.
    app.stop();
    assert!(pid_alive(old_pid), "stopping serve stopped the launcher");
    install_binary(Path::new(exe()), &exe_path);
    app.spawn().await;
    let (_, info) = app.get("/apis/edgevirt.io/v1/info").await;
    assert_eq!(info["version"], edgevirt::version::RELEASE);

    // The node reports the new release; the VM's launcher is still the old one.
    wait_for(
        "the node on the new release",
        Duration::from_secs(60),
        || async {
            let (_, n) = app.get("/apis/edgevirt.io/v1/nodes/testnode").await;
            (n["status"]["version"] == edgevirt::version::RELEASE).then_some(())
        },
    )
    .await;
    // The new agent reports the old launcher's release; the rollout counts it as pending
    // unless this tree still carries the previous release's version (nothing tells them
    // apart then: a release bumps the version, docs/compatibility.md).
    wait_for(
        "the old launcher's release on the VMI",
        Duration::from_secs(60),
        || async {
            app.vmi("upg")
                .await
                .filter(|v| v["status"]["launcherVersion"] == old_release.as_str())
        },
    )
    .await;
    let pending = usize::from(old_release != edgevirt::version::RELEASE);
    let (code, r) = app.get("/apis/edgevirt.io/v1/rollout").await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["desiredVersion"], edgevirt::version::RELEASE, "{r}");
    assert_eq!(r["nodesPending"], 0, "{r}");
    assert_eq!(r["launchersPending"], pending, "{r}");
    assert_eq!(r["state"], ["RolledOver", "Progressing"][pending], "{r}");
    assert_eq!(r["launchers"][0]["version"], old_release.as_str(), "{r}");

    // For a while: the VMI stays Running, the same launcher serves it, the domain is the
    // same. Release 0.1.0's launcher reports no guest CPU: nothing to show, nothing broken.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        let v = app.vmi("upg").await.unwrap();
        assert_eq!(v["status"]["phase"], "Running", "{v}");
        assert_eq!(v["metadata"]["uid"], uid.as_str());
        assert_eq!(v["status"]["launcherVersion"], old_release.as_str());
        assert!(v["status"].get("currentCPUTopology").is_none(), "{v}");
        assert!(pid_alive(old_pid), "the old launcher went away");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        domid(&dom).as_deref(),
        Some(domid_before.as_str()),
        "the domain restarted"
    );
    let st = old
        .status()
        .await
        .expect("the old launcher keeps answering");
    assert_eq!(
        st.state,
        Some(edgevirt::hypervisor::DomainState::Running),
        "{st:?}"
    );
    assert!(st.cpu.is_none(), "protocol 1 has no CPU: {:?}", st.cpu);
    drop(old);
    let uptime_after = guest_uptime(&dom).expect("guest agent after the upgrade");
    eprintln!(
        "upgrade {old_release} -> {}: launcher pid {old_pid} kept, domain id {domid_before} kept, \
         guest uptime {uptime_before:.1}s -> {uptime_after:.1}s",
        edgevirt::version::RELEASE,
    );
    assert!(
        uptime_after > uptime_before,
        "the guest's uptime went from {uptime_before} to {uptime_after}: it rebooted"
    );

    // A restart of the VM brings it up under a launcher of the new release.
    assert_eq!(app.action("upg", "restart").await, 202);
    let new_vmi = app
        .wait_running("upg", Some(&uid), Duration::from_secs(120))
        .await;
    let new_uid = new_vmi["metadata"]["uid"].as_str().unwrap().to_string();
    wait_for(
        "the new launcher version",
        Duration::from_secs(60),
        || async {
            app.vmi("upg")
                .await
                .filter(|v| v["status"]["launcherVersion"] == edgevirt::version::RELEASE)
        },
    )
    .await;
    let new_sock = app.dir.join(format!("run/launchers/{new_uid}.sock"));
    let new = LauncherClient::connect(&new_sock).await.unwrap();
    assert_eq!(new.info.launcher_version, edgevirt::version::RELEASE);
    assert_eq!(
        new.version,
        *edgevirt::launcher::protocol::VERSIONS.last().unwrap()
    );
    drop(new);
    wait_for(
        "the old launcher to exit",
        Duration::from_secs(60),
        || async { (!pid_alive(old_pid)).then_some(()) },
    )
    .await;
    let (_, r) = app.get("/apis/edgevirt.io/v1/rollout").await;
    assert_eq!(r["state"], "RolledOver", "{r}");

    // A launcher outside the protocol window is refused and its VM left alone: stand in for
    // one by killing the launcher (the VM keeps running) and answering on its socket.
    let new_dom = new_vmi["status"]["domainName"]
        .as_str()
        .unwrap()
        .to_string();
    let domid_new = domid(&new_dom).unwrap();
    let launcher_pid = LauncherClient::connect(&new_sock).await.unwrap().info.pid;
    // Stop the agent first so it cannot start a replacement before the impostor is bound.
    app.stop();
    std::process::Command::new("kill")
        .args(["-9", &launcher_pid.to_string()])
        .status()
        .unwrap();
    wait_for("the launcher to die", Duration::from_secs(10), || async {
        (!pid_alive(launcher_pid)).then_some(())
    })
    .await;
    let _ = std::fs::remove_file(&new_sock);
    let impostor = tokio::net::UnixListener::bind(&new_sock).unwrap();
    let uid2 = new_uid.clone();
    let serve = tokio::spawn(async move {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        while let Ok((s, _)) = impostor.accept().await {
            let uid2 = uid2.clone();
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(_)) = lines.next_line().await {
                    let info = serde_json::json!({"ok": true, "result": {"versions": [99],
                        "launcherVersion": "9.0.0", "vmiUid": uid2, "pid": 1}});
                    let _ = w.write_all(format!("{info}\n").as_bytes()).await;
                }
            });
        }
    });
    app.spawn().await;
    let msg = wait_for(
        "the agent to refuse the launcher",
        Duration::from_secs(60),
        || async {
            std::fs::read_to_string(app.dir.join("serve.log"))
                .ok()?
                .lines()
                .find(|l| l.contains("refusing an incompatible launcher"))
                .map(str::to_string)
        },
    )
    .await;
    assert!(msg.contains("[99]") && msg.contains("9.0.0"), "{msg}");
    eprintln!("refused: {msg}");
    let ours = format!("{:?}", edgevirt::launcher::protocol::VERSIONS);
    assert!(
        msg.contains(&ours) && msg.contains(edgevirt::version::RELEASE),
        "{msg}"
    );
    // Untouched for a while: same domain, no new launcher, the VMI as it was.
    let before = app.vmi("upg").await.unwrap();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(domid(&new_dom).as_deref(), Some(domid_new.as_str()));
        assert!(
            launcher_pids(&app.dir).is_empty(),
            "the agent started a launcher beside the refused one"
        );
        let v = app.vmi("upg").await.unwrap();
        assert_eq!(v["status"]["phase"], "Running");
        assert_eq!(
            v["metadata"]["resourceVersion"],
            before["metadata"]["resourceVersion"]
        );
    }
    assert!(
        new_sock.exists(),
        "the agent removed the refused launcher's socket"
    );
    // Once the impostor goes, the agent adopts the domain with a launcher of its own.
    serve.abort();
    let _ = std::fs::remove_file(&new_sock);
    wait_for(
        "a new launcher adopting the domain",
        Duration::from_secs(90),
        || async {
            LauncherClient::connect(&new_sock)
                .await
                .ok()
                .filter(|c| c.info.launcher_version == edgevirt::version::RELEASE)
        },
    )
    .await;
    assert_eq!(
        domid(&new_dom).as_deref(),
        Some(domid_new.as_str()),
        "adoption restarted the VM"
    );
}
