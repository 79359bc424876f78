//! The `edgevirt` client commands against a real server (controller role, no libvirt):
//! image import with its progress output, apply (create, then unchanged), list, get,
//! start/stop, delete; settings from the environment.

use std::process::Command;
use std::time::Duration;

use serde_json::json;
use testkit::Vm;

fn edgevirt(url: &str, token: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_edgevirt"))
        .args(args)
        .env("EDGEVIRT_SERVER", url)
        .env("EDGEVIRT_TOKEN", token)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn client_commands_work_against_a_real_server() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("edgevirt.toml");
    // Settings from a TOML file; the environment overrides it (an agent role from the file
    // would fail to start without a controller).
    std::fs::write(
        &cfg,
        format!(
            "role = \"agent\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nnode_name = \"from-file\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(testkit::exe());
    cmd.args(["serve", "--config"])
        .arg(&cfg)
        .env("EDGEVIRT_ROLE", "controller");
    // Ended when dropped, also when an assertion below fails (one was left running).
    let server = testkit::serve::start(cmd, dir.path());
    let url = server.url.clone();
    assert!(
        dir.path().join("edgevirt.db").exists(),
        "data_dir from the file was not used"
    );
    let token = server.initial("token");

    let kernel = dir.path().join("kernel.bin");
    std::fs::write(&kernel, vec![7u8; 300_000]).unwrap();
    let (ok, out, err) = edgevirt(
        &url,
        &token,
        &["image", "import", "k1", kernel.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("image/k1 imported: raw format, 300000 bytes"),
        "{out}"
    );
    let (ok, out, _) = edgevirt(&url, &token, &["image", "list"]);
    assert!(ok && out.contains("k1") && out.contains("raw"), "{out}");

    let vm = dir.path().join("vm.yaml");
    std::fs::write(
        &vm,
        // The older `running` field instead of runStrategy.
        Vm::halted("cli-vm", "k1")
            .label("app", "cli")
            .with(|v| {
                v["spec"].as_object_mut().unwrap().remove("runStrategy");
                v["spec"]["running"] = json!(false);
                Vm::domain_of(v)["devices"] = json!({});
                Vm::domain_of(v)["firmware"]["kernelBoot"]["container"]["image"] = json!("x");
            })
            .yaml(),
    )
    .unwrap();
    let (ok, out, err) = edgevirt(&url, &token, &["vm", "apply", "-f", vm.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "virtualmachine/cli-vm created");
    let (ok, out, _) = edgevirt(&url, &token, &["vm", "apply", "-f", vm.to_str().unwrap()]);
    assert!(ok);
    assert_eq!(out.trim(), "virtualmachine/cli-vm unchanged");
    let (ok, out, _) = edgevirt(&url, &token, &["vm", "list", "-l", "app=cli"]);
    assert!(
        ok && out.starts_with("NAME") && out.contains("cli-vm"),
        "{out}"
    );
    let (ok, out, _) = edgevirt(&url, &token, &["vm", "list", "-l", "app=other"]);
    assert!(ok && !out.contains("cli-vm"), "{out}");
    // The older `running` field: start flips it, as KubeVirt does.
    let (ok, _, err) = edgevirt(&url, &token, &["vm", "start", "cli-vm"]);
    assert!(ok, "{err}");
    let (ok, out, _) = edgevirt(&url, &token, &["vm", "get", "cli-vm", "-o", "json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["spec"]["running"], true);
    assert!(v["spec"].get("runStrategy").is_none());
    let (ok, _, err) = edgevirt(&url, &token, &["vm", "rename", "cli-vm", "Bad_Name"]);
    assert!(!ok && err.contains("RFC 1123"), "{err}");
    let (ok, _, err) = edgevirt(&url, "wrong-token", &["vm", "list"]);
    assert!(!ok && err.contains("401"), "{err}");
    // Server and token from ~/.config/edgevirt/client.toml when no flag or variable is set.
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".config/edgevirt")).unwrap();
    std::fs::write(
        home.join(".config/edgevirt/client.toml"),
        format!("server = \"{url}\"\ntoken = \"{token}\"\n"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_edgevirt"))
        .args(["vm", "list"])
        .env("HOME", &home)
        .env_remove("EDGEVIRT_SERVER")
        .env_remove("EDGEVIRT_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("cli-vm"));
    // export: a clean KubeVirt manifest that applies back unchanged, and recreates the VM
    // as it was once deleted.
    let (ok, exported, err) = edgevirt(&url, &token, &["export", "--namespace", "default"]);
    assert!(ok, "{err}");
    assert!(
        exported.contains("name: cli-vm") && !exported.contains("status:"),
        "{exported}"
    );
    assert!(
        !exported.contains("uid:") && !exported.contains("edgevirt.io/"),
        "{exported}"
    );
    let file = dir.path().join("exported.yaml");
    std::fs::write(&file, &exported).unwrap();
    let (ok, out, err) = edgevirt(&url, &token, &["vm", "apply", "-f", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "virtualmachine/cli-vm unchanged");
    let (_, before, _) = edgevirt(&url, &token, &["vm", "get", "cli-vm", "-o", "json"]);
    let before: serde_json::Value = serde_json::from_str(&before).unwrap();
    // crds: valid YAML documents, one per kind
    let (ok, crds, _) = edgevirt(&url, &token, &["crds"]);
    assert!(
        ok && crds.matches("kind: CustomResourceDefinition").count() == 5,
        "{crds}"
    );
    // kubeconfig: server and token for kubectl
    let (ok, kc, _) = edgevirt(&url, &token, &["kubeconfig"]);
    assert!(
        ok && kc.contains(&format!("server: {url}")) && kc.contains(&token),
        "{kc}"
    );

    let (ok, out, _) = edgevirt(&url, &token, &["vm", "delete", "cli-vm"]);
    assert!(ok && out.contains("deleted"), "{out}");
    // Deletion completes once the controller has released the VM (no volumes to clean).
    let start = std::time::Instant::now();
    loop {
        let (ok, _, err) = edgevirt(&url, &token, &["vm", "get", "cli-vm"]);
        if !ok && err.contains("not found") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "VM still there: {err}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (ok, out, err) = edgevirt(&url, &token, &["vm", "apply", "-f", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "virtualmachine/cli-vm created");
    let (_, after, _) = edgevirt(&url, &token, &["vm", "get", "cli-vm", "-o", "json"]);
    let after: serde_json::Value = serde_json::from_str(&after).unwrap();
    assert_eq!(
        after["spec"], before["spec"],
        "the exported VM comes back the same"
    );
    assert_eq!(after["metadata"]["labels"], before["metadata"]["labels"]);

    // The install strategy: show, decode (from the server and from a ConfigMap file),
    // set-version, and a refused version.
    let release = edgevirt::version::RELEASE;
    let (ok, out, err) = edgevirt(&url, &token, &["strategy", "show"]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("desired version {release}")) && out.contains("RolledOver"),
        "{out}"
    );
    assert!(
        out.contains("NODE") && out.contains("LAUNCHER-VERSION"),
        "{out}"
    );
    let (ok, yaml, err) = edgevirt(&url, &token, &["strategy", "decode"]);
    assert!(ok, "{err}");
    let m: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    assert_eq!(m["version"], release);
    assert_eq!(
        m["roles"]["controller"]["settings"]["listen"],
        "127.0.0.1:0"
    );
    let (_, json_out, _) = edgevirt(&url, &token, &["strategy", "show", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json_out).unwrap();
    let cm_file = dir.path().join("strategy-cm.json");
    std::fs::write(&cm_file, v["configMap"].to_string()).unwrap();
    let (ok, from_file, err) = edgevirt(
        &url,
        &token,
        &["strategy", "decode", "-f", cm_file.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    assert_eq!(from_file, yaml);
    let (ok, out, err) = edgevirt(&url, &token, &["strategy", "set-version", "0.0.1"]);
    assert!(ok, "{err}");
    assert!(out.contains("desired version 0.0.1"), "{out}");
    let (ok, _, err) = edgevirt(&url, &token, &["strategy", "set-version", "newest"]);
    assert!(!ok && err.contains("newest"), "{err}");
    let (_, out, _) = edgevirt(&url, &token, &["strategy", "show"]);
    assert!(out.contains("desired version 0.0.1"), "{out}");
    drop(server);
}
