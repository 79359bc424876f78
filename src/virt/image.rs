//! What a disk file is, by `qemu-img info`, and whether edgevirt lets QEMU open it. A file
//! with a backing file or an external data file is refused: opening it could make QEMU
//! read any file on the host.

use std::path::Path;

use serde_json::Value;

/// The format (`qcow2` or `raw`) and virtual size of a disk file. With `format`, the file is
/// read as that format and never probed (a guest can write any header into a raw disk).
/// Files in use by a running QEMU are read without taking its lock (`-U`).
pub async fn inspect(path: &Path, format: Option<&str>) -> Result<(String, u64), String> {
    let mut cmd = tokio::process::Command::new("qemu-img");
    cmd.args(["info", "--output=json", "-U"]);
    if let Some(f) = format {
        cmd.args(["-f", f]);
    }
    let out = cmd
        .arg(path)
        .output()
        .await
        .map_err(|e| format!("running qemu-img: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "qemu-img cannot read the image: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let info: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("qemu-img output: {e}"))?;
    if info.get("backing-filename").is_some() || info.get("full-backing-filename").is_some() {
        return Err("the image has a backing file; flatten it first (qemu-img convert)".into());
    }
    if info["format-specific"]["data"].get("data-file").is_some() {
        return Err(
            "the image uses an external data file; convert it to a self-contained image first"
                .into(),
        );
    }
    let format = info["format"].as_str().unwrap_or("").to_string();
    if format != "qcow2" && format != "raw" {
        return Err(format!(
            "image format {format:?} is not supported; use qcow2 or raw"
        ));
    }
    Ok((format, info["virtual-size"].as_u64().unwrap_or(0)))
}
