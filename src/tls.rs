//! TLS: the rustls crypto provider (ring), and the self-signed certificate generated into the
//! data dir on first start when the appliance listens beyond loopback without one configured.

use std::path::{Path, PathBuf};

/// Install ring as the process-wide rustls provider (idempotent).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Paths of the certificate and key to serve, generating a self-signed pair if none exists.
pub fn ensure_self_signed(data_dir: &Path, hosts: &[String]) -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = data_dir.join("tls");
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    std::fs::create_dir_all(&dir)?;
    let mut names = vec!["localhost".to_string()];
    names.extend(hosts.iter().cloned());
    let ck = rcgen::generate_simple_self_signed(names)?;
    std::fs::write(&cert, ck.cert.pem())?;
    write_private(&key, ck.signing_key.serialize_pem().as_bytes())?;
    tracing::info!(cert = %cert.display(), "generated a self-signed TLS certificate");
    Ok((cert, key))
}

/// Write a file only its owner can read.
pub fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(data)?;
    f.sync_all()
}
