//! Build steps outside Rust:
//! - sqlx::migrate! embeds `migrations/` at build time: rebuild when one is added;
//! - the dashboard embeds noVNC and xterm.js from their npm packages, pinned in
//!   `web/package-lock.json`: `npm ci` fetches them into `web/node_modules` when that is
//!   missing or older than the lock file. Nothing from npm is committed.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=web/package-lock.json");
    println!("cargo:rerun-if-changed=web/node_modules/.package-lock.json");
    let web = Path::new("web");
    let lock = web.join("package-lock.json");
    let installed = web.join("node_modules/.package-lock.json");
    let stale = match (mtime(&lock), mtime(&installed)) {
        (Some(l), Some(i)) => i < l,
        _ => true,
    };
    if stale {
        let status = Command::new("npm")
            .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
            .current_dir(web)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!(
                "`npm ci` in web/ failed ({s}); the dashboard embeds noVNC and xterm.js from \
                 npm. Check that the npm registry is reachable."
            ),
            Err(e) => panic!(
                "running `npm ci` in web/ failed: {e}. Install Node.js and npm \
                 (scripts/setup-host.sh does), the dashboard embeds noVNC and xterm.js from npm."
            ),
        }
    }
}

fn mtime(p: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}
