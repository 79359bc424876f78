//! What a disk file is, by `qemu-img info`, and whether edgevirt lets QEMU open it. A file
//! with a backing file or an external data file is refused: opening it could make QEMU
//! read any file on the host.

use std::path::Path;

use serde_json::Value;

/// The format (`qcow2` or `raw`) and virtual size of a disk file. With `format`, the file is
/// read as that format and never probed (a guest can write any header into a raw disk).
/// Files in use by a running QEMU are read without taking its lock (`-U`).
pub async fn inspect(path: &Path, format: Option<&str>) -> Result<(String, u64), String> {
    let info = info(path, format).await?;
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

/// What `qemu-img info --output=json` says of a file, read as `format` when given (never
/// probed then), without taking a running QEMU's lock (`-U`). The error does not name the
/// path: callers that may show it to users add what they choose.
pub async fn info(path: &Path, format: Option<&str>) -> Result<Value, String> {
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
    serde_json::from_slice(&out.stdout).map_err(|e| format!("qemu-img output: {e}"))
}

/// Where a CD or DVD image's volume descriptors start: sector 16 of 2048 bytes. Its first
/// byte is the descriptor's type; the five after it name the standard.
const VOLUME_DESCRIPTORS: u64 = 16 * 2048;

/// Whether the file at `path` is a CD/DVD image: ISO 9660 (`CD001`, what Linux installers
/// and hybrid images are) or UDF (`BEA01`, the start of UDF's volume recognition sequence,
/// as some DVD images have without an ISO 9660 bridge). Reads 6 bytes; a file too short or
/// unreadable is not one.
pub fn is_iso(path: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let mut id = [0u8; 6];
    let read = std::fs::File::open(path).and_then(|mut f| {
        f.seek(SeekFrom::Start(VOLUME_DESCRIPTORS))?;
        f.read_exact(&mut id)
    });
    read.is_ok() && (&id[1..] == b"CD001" || &id[1..] == b"BEA01")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_images_are_told_by_their_volume_descriptors() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, at: u64, id: &[u8]| {
            let p = dir.path().join(name);
            let mut data = vec![0u8; at as usize];
            data.extend_from_slice(id);
            data.resize(data.len().max(40_000), 0);
            std::fs::write(&p, data).unwrap();
            p
        };
        assert!(is_iso(&write(
            "iso9660",
            VOLUME_DESCRIPTORS,
            b"\x01CD001\x01"
        )));
        assert!(is_iso(&write("udf", VOLUME_DESCRIPTORS, b"\x00BEA01\x01")));
        // The marker one sector off, a disk image, a short file, no file: not ISOs.
        assert!(!is_iso(&write(
            "off",
            VOLUME_DESCRIPTORS + 2048,
            b"\x01CD001"
        )));
        assert!(!is_iso(&write("disk", 0, b"QFI\xfb")));
        let short = dir.path().join("short");
        std::fs::write(&short, b"\x01CD001").unwrap();
        assert!(!is_iso(&short));
        assert!(!is_iso(&dir.path().join("missing")));
    }
}
