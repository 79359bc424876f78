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

/// Compare secrets without leaking where they differ through timing (nor their lengths:
/// both are hashed first). The dashboard's CSRF tokens and the direct migration path's
/// keys are checked with it.
pub fn same_secret(a: &str, b: &str) -> bool {
    use sha2::Digest;
    let (a, b) = (
        sha2::Sha256::digest(a.as_bytes()),
        sha2::Sha256::digest(b.as_bytes()),
    );
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// SHA-256 of a certificate's DER bytes, in hex: what a join token pins.
pub fn cert_sha256(der: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(der))
}

/// The SHA-256 pin of the first certificate in a PEM file.
pub fn pem_sha256(pem: &[u8]) -> anyhow::Result<String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let der = CertificateDer::pem_slice_iter(pem)
        .next()
        .ok_or_else(|| anyhow::anyhow!("no certificate in the PEM data"))??;
    Ok(cert_sha256(der.as_ref()))
}

/// Accepts exactly one server certificate, named by its SHA-256: the controller's, pinned
/// when the agent joined. Host names and CAs do not matter, the certificate itself does; the
/// handshake signatures are still checked against its key.
#[derive(Debug)]
struct PinnedCert {
    sha256: String,
    provider: std::sync::Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let got = cert_sha256(end_entity.as_ref());
        if same_hex(&got, &self.sha256) {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the server's certificate (sha256 {got}) is not the pinned controller certificate \
                 (sha256 {})",
                self.sha256
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn same_hex(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// A client TLS configuration that trusts only the certificate with this SHA-256 (hex),
/// offering `alpn` (e.g. `h2`, `http/1.1`).
pub fn pinned_client_config(sha256: &str, alpn: &[&str]) -> anyhow::Result<rustls::ClientConfig> {
    let sha256 = sha256.trim().to_ascii_lowercase();
    anyhow::ensure!(
        sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit()),
        "a certificate pin is 64 hex digits (a SHA-256)"
    );
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(PinnedCert { sha256, provider }))
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Ok(cfg)
}

/// A throwaway server identity: a fresh self-signed certificate for `names`, kept only in
/// memory, and its SHA-256 pin (for a peer told the pin over a channel it already trusts).
pub fn ephemeral_server_config(
    names: Vec<String>,
) -> anyhow::Result<(std::sync::Arc<rustls::ServerConfig>, String)> {
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let ck = rcgen::generate_simple_self_signed(names)?;
    let der = ck.cert.der().clone();
    let pin = cert_sha256(der.as_ref());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![der], key)?;
    Ok((std::sync::Arc::new(cfg), pin))
}

/// The API's server configuration from a PEM certificate chain and key, offering HTTP/2
/// and HTTP/1.1 by ALPN.
pub fn server_config(
    cert: &Path,
    key: &Path,
) -> anyhow::Result<std::sync::Arc<rustls::ServerConfig>> {
    use anyhow::Context as _;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading the certificate {}", cert.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "{}: no certificate in it",
        cert.display()
    );
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the key {}", key.display()))?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("loading the TLS certificate")?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(std::sync::Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abcd", "abcd"));
        assert!(!same_secret("abcd", "abce"));
        assert!(!same_secret("abc", "abcd"));
        assert!(!same_secret("", "a"));
    }
}
