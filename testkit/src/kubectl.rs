//! kubectl against an appliance: the binary, a kubeconfig `edgevirt kubeconfig` writes, and
//! a private discovery cache per run.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::appliance::Appliance;
use crate::exe;

/// A kubectl binary with a kubeconfig for an appliance.
pub struct Kubectl {
    pub bin: PathBuf,
    pub config: PathBuf,
}

/// What a kubectl run printed.
pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Kubectl {
    pub fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Out {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig").arg(&self.config).args(args);
        // a private discovery cache per run
        c.env("HOME", self.config.parent().unwrap());
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.output().expect("running kubectl");
        Out {
            ok: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
    pub fn run(&self, args: &[&str]) -> Out {
        self.run_env(args, &[])
    }
    /// Run and insist on success; stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(o.ok, "kubectl {args:?} failed: {}{}", o.stdout, o.stderr);
        o.stdout
    }
}

/// A kubeconfig for `a` with `token`, as `edgevirt kubeconfig` prints it.
pub fn kubeconfig_yaml(a: &Appliance, token: &str) -> String {
    let out = Command::new(exe())
        .args([
            "kubeconfig",
            "--server",
            &a.url,
            "--token",
            token,
            "--ca-cert",
        ])
        .arg(a.dir.join("tls/server.crt"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Write a kubeconfig for `a` with `token` to `file` (`edgevirt kubeconfig`).
pub fn kubeconfig(a: &Appliance, token: &str, file: &Path) {
    std::fs::write(file, kubeconfig_yaml(a, token)).unwrap();
}
