//! `edgevirt serve` as a process, without libvirt (controller role): TLS beyond loopback,
//! the first-start credentials file, and refusing a database from a newer edgevirt.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use testkit::serve;

/// serve, controller role, on `dir`, through the test kit (ready once `/healthz` answers).
fn start(dir: &std::path::Path, listen: &str) -> serve::Server {
    let mut cmd = serve::command(testkit::exe(), dir);
    cmd.args([
        "--role",
        "controller",
        "--listen",
        listen,
        "--node-name",
        "t",
    ]);
    serve::start(cmd, dir)
}

#[tokio::test]
async fn beyond_loopback_serves_tls_with_a_generated_certificate() {
    edgevirt::tls::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), "0.0.0.0:0");
    let url = server.url.clone();
    assert!(url.starts_with("https://"), "{url}");
    let port = url.rsplit(':').next().unwrap();
    let cert = dir.path().join("tls/server.crt");
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&cert).unwrap()).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .unwrap();
    let r = client
        .get(format!("https://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // Plain HTTP is not served there.
    assert!(
        reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
            .await
            .is_err()
    );
    // The first admin's credentials, readable by the owner only.
    let creds = dir.path().join("initial-admin");
    assert_eq!(
        std::fs::metadata(&creds).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let text = std::fs::read_to_string(&creds).unwrap();
    let token = text.lines().find_map(|l| l.strip_prefix("token=")).unwrap();
    assert!(text.starts_with("username=admin\npassword="));
    let r = client
        .get(format!(
            "https://127.0.0.1:{port}/apis/kubevirt.io/v1/virtualmachines"
        ))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        std::fs::metadata(dir.path().join("tls/server.key"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    server.kill9();
}

#[test]
fn refuses_a_database_from_a_newer_edgevirt() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), "127.0.0.1:0");
    assert!(server.url.starts_with("http://"));
    server.kill9();
    let db = dir.path().join("edgevirt.db");
    let ok = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import sqlite3; c=sqlite3.connect('{}'); c.execute(\"INSERT INTO _sqlx_migrations (version, description, installed_on, success, checksum, execution_time) VALUES (99999, 'future', CURRENT_TIMESTAMP, 1, x'00', 0)\"); c.commit()",
            db.display()
        ))
        .status()
        .unwrap();
    assert!(ok.success());
    let out = Command::new(env!("CARGO_BIN_EXE_edgevirt"))
        .args([
            "serve",
            "--role",
            "controller",
            "--listen",
            "127.0.0.1:0",
            "--node-name",
            "t",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("newer than this edgevirt"), "{err}");
}

#[test]
fn refuses_a_migration_address_that_is_not_one() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["host.example", "10.0.0.300", "tunnels"] {
        let out = Command::new(env!("CARGO_BIN_EXE_edgevirt"))
            .args(["serve", "--role", "agent", "--migration-address", bad])
            .arg("--data-dir")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("migration address \"{bad}\"")) && err.contains("`tunnel`"),
            "{bad}: {err}"
        );
    }
}

/// Under systemd (`Type=notify`, `WatchdogSec=`): READY=1 once the API listens, WATCHDOG=1
/// pings at half the interval, STOPPING=1 on SIGTERM. The test plays systemd's notify socket.
#[test]
fn tells_systemd_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_edgevirt"))
        .args(["serve", "--role", "controller", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "400000")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // Killed on the way out if an assertion fails before SIGTERM.
    struct Guard(u32);
    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = Command::new("kill")
                .args(["-9", &self.0.to_string()])
                .status();
        }
    }
    let _guard = Guard(child.id());
    let mut buf = [0u8; 256];
    let mut recv = || {
        let n = sock.recv(&mut buf).expect("no notification from serve");
        String::from_utf8_lossy(&buf[..n]).to_string()
    };
    assert_eq!(recv().trim(), "READY=1");
    // By then serve has said where the API listens (stdout keeps being drained).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let said: Vec<String> = rx.iter().take(3).collect();
    assert!(
        said.iter().any(|l| l.contains("serving the API on")),
        "READY before the API listens: {said:?}"
    );
    assert!(
        said.iter()
            .any(|l| l.starts_with("dashboard: http://127.0.0.1:") && l.contains("/ui/")),
        "the dashboard's URL is printed: {said:?}"
    );
    let start = std::time::Instant::now();
    for _ in 0..3 {
        assert_eq!(recv().trim(), "WATCHDOG=1");
    }
    // Three pings at 0.2 s intervals: well under the 0.4 s watchdog each.
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    loop {
        let m = recv();
        if m.trim() == "STOPPING=1" {
            break;
        }
        assert_eq!(m.trim(), "WATCHDOG=1", "unexpected notification {m}");
    }
    child.wait().unwrap();
    std::mem::forget(_guard);
}

/// The controller copies its database to the backup target on its schedule; a fresh
/// controller started on a copy (and the TLS files beside it, as docs/guide/snapshots-and-backups.md says) is the
/// same controller: the same VMs, the same admin token, the same certificate.
#[tokio::test]
async fn a_database_backup_rebuilds_a_controller_with_the_same_vms() {
    edgevirt::tls::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let mut cmd = serve::command(testkit::exe(), dir.path());
    cmd.args([
        "--role",
        "controller",
        "--listen",
        "0.0.0.0:0",
        "--node-name",
        "t",
    ])
    .arg("--backup-target")
    .arg(format!("nas={}", target.path().display()))
    .args(["--database-backup-interval", "1"]);
    let mut server = serve::start(cmd, dir.path());
    let token = server.initial("token");
    let vms = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";
    for name in ["shop-till", "shop-nvr"] {
        let vm = serde_json::json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name},
            "spec": {"runStrategy": "Halted", "template": {"spec": {
                "domain": {"memory": {"guest": "64Mi"}, "devices": {}}}}}});
        let r = server
            .http
            .post(format!("{}{vms}", server.url))
            .bearer_auth(&token)
            .json(&vm)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
    }
    // Wait for a copy that holds both VMs (copies made before they existed do not).
    let copies = target.path().join("_controller");
    let names = |db: &std::path::Path| {
        let db = db.to_path_buf();
        async move {
            let probe = tempfile::tempdir().unwrap();
            let file = probe.path().join("probe.db");
            std::fs::copy(&db, &file).ok()?;
            let store = edgevirt::store::Store::open(&file).await.ok()?;
            let vms: Vec<edgevirt::types::VirtualMachine> = store.all().await.ok()?;
            let mut n: Vec<String> = vms
                .iter()
                .map(|v| edgevirt::types::Meta::name(v).to_string())
                .collect();
            n.sort();
            Some(n)
        }
    };
    let copy = testkit::wait_for(
        "a database copy with both VMs",
        Duration::from_secs(30),
        || async {
            let mut files: Vec<_> = std::fs::read_dir(&copies)
                .ok()?
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| e == "db"))
                .collect();
            files.sort();
            let newest = files.pop()?;
            (names(&newest).await? == ["shop-nvr", "shop-till"]).then_some(newest)
        },
    )
    .await;
    assert!(
        copies.join("tls/server.crt").is_file(),
        "the certificate is kept beside"
    );
    let cert = std::fs::read(dir.path().join("tls/server.crt")).unwrap();
    server.stop();

    // A fresh controller: the copy as its database, the TLS files in place.
    let fresh = tempfile::tempdir().unwrap();
    std::fs::copy(&copy, fresh.path().join("edgevirt.db")).unwrap();
    std::fs::create_dir_all(fresh.path().join("tls")).unwrap();
    for f in ["server.crt", "server.key"] {
        std::fs::copy(copies.join("tls").join(f), fresh.path().join("tls").join(f)).unwrap();
    }
    let mut rebuilt = start(fresh.path(), "0.0.0.0:0");
    assert_eq!(
        std::fs::read(fresh.path().join("tls/server.crt")).unwrap(),
        cert
    );
    let r = rebuilt
        .http
        .get(format!("{}{vms}", rebuilt.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "the old admin token still works");
    let list: serde_json::Value = r.json().await.unwrap();
    let mut got: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["metadata"]["name"].as_str().unwrap())
        .collect();
    got.sort();
    assert_eq!(got, ["shop-nvr", "shop-till"]);
    rebuilt.stop();
}
