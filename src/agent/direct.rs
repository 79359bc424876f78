//! The direct migration path: the source node's agent carries libvirtd's connection (and a
//! block migration's QEMU streams) straight to the target node's agent, instead of through
//! the controller's websocket relay, which doubles every byte's trip and adds two rounds of
//! TLS and websocket framing in the controller.
//!
//! The target listens, for one migration only, on its migration address (by default the
//! address it reaches the controller from), behind a certificate made for that migration and
//! never written to disk. It publishes the address and port in the migration's status
//! (`targetNodeAddress`, `targetDirectMigrationNodePorts`, as KubeVirt does), but not how to
//! get in: the source asks for that through the relay, which only the migration's own two
//! agents may use, and receives an [`Offer`]: the certificate's SHA-256, which it pins, and a
//! random key, which every connection presents before anything reaches libvirtd. Whatever
//! cannot get through (a firewall, a NAT between the hosts, an older agent on either side)
//! goes through the relay as before.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// How a source gets in: where, the certificate to pin, and the key to present.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Offer {
    pub address: SocketAddr,
    pub sha256: String,
    pub key: String,
}

/// The stream name a source asks the relay for to receive the [`Offer`].
pub const OFFER_STREAM: &str = "direct";

/// What `--migration-address` says to turn the direct path off.
pub const TUNNEL_ONLY: &str = "tunnel";

/// How long a connection may take to present its key and stream.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Buffer per direction for the relayed bytes: migration streams are bulk.
const BUF: usize = 256 * 1024;

/// The address this node offers for direct migrations: `setting` when it is an IP address,
/// none when it is [`TUNNEL_ONLY`]; otherwise the local address of the route to the
/// controller (the one other nodes most likely reach too), unless that is loopback.
pub async fn migration_ip(setting: Option<&str>, controller_url: &str) -> Option<IpAddr> {
    match setting.map(str::trim) {
        Some(TUNNEL_ONLY) => return None,
        Some(s) if !s.is_empty() => return s.parse().ok(),
        _ => {}
    }
    let url = reqwest::Url::parse(controller_url).ok()?;
    let host = url
        .host_str()?
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = url.port_or_known_default()?;
    let peer = tokio::net::lookup_host((host, port)).await.ok()?.next()?;
    let bind: SocketAddr = if peer.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    // A UDP "connection" sends nothing: it only asks the kernel which source address the
    // route to the controller uses.
    let udp = tokio::net::UdpSocket::bind(bind).await.ok()?;
    udp.connect(peer).await.ok()?;
    let ip = udp.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// The target's listener for one migration.
pub struct Listener {
    tcp: TcpListener,
    tls: tokio_rustls::TlsAcceptor,
    offer: Offer,
}

impl Listener {
    /// Listen on `ip`, any free port, with a new certificate and key.
    pub async fn bind(ip: IpAddr) -> anyhow::Result<Listener> {
        let tcp = TcpListener::bind((ip, 0)).await?;
        let address = tcp.local_addr()?;
        let (cfg, sha256) = crate::tls::ephemeral_server_config(vec![ip.to_string()])?;
        let key = hex::encode(rand::random::<[u8; 32]>());
        Ok(Listener {
            tcp,
            tls: tokio_rustls::TlsAcceptor::from(cfg),
            offer: Offer {
                address,
                sha256,
                key,
            },
        })
    }

    pub fn offer(&self) -> &Offer {
        &self.offer
    }

    /// Accept until dropped (the migration ended): each connection that presents the key
    /// and names a stream `route` knows is joined to that local unix socket.
    pub async fn serve<F>(self, route: F)
    where
        F: Fn(&str) -> Option<PathBuf> + Send + Sync + 'static,
    {
        let route = Arc::new(route);
        let key = Arc::new(self.offer.key.clone());
        loop {
            let (tcp, peer) = match self.tcp.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors, say: the source's next try may get through.
                    tracing::warn!(error = %e, "accepting a direct migration connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (tls, route, key) = (self.tls.clone(), route.clone(), key.clone());
            tokio::spawn(async move {
                if let Err(e) = accept_one(tls, tcp, &key, &*route).await {
                    tracing::warn!(%peer, error = %format!("{e:#}"), "direct migration connection refused or ended");
                }
            });
        }
    }
}

async fn accept_one(
    tls: tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    key: &str,
    route: &(dyn Fn(&str) -> Option<PathBuf> + Send + Sync),
) -> anyhow::Result<()> {
    let (mut conn, stream) = tokio::time::timeout(HEADER_TIMEOUT, async {
        let conn = tls.accept(tcp).await?;
        let mut conn = BufReader::with_capacity(BUF, conn);
        let mut line = Vec::new();
        (&mut conn).take(128).read_until(b'\n', &mut line).await?;
        let text = std::str::from_utf8(&line).unwrap_or("");
        let (got, stream) = text
            .trim_end()
            .split_once(' ')
            .ok_or_else(|| anyhow::anyhow!("no key and stream before the data"))?;
        anyhow::ensure!(crate::tls::same_secret(got, key), "a wrong key");
        anyhow::Ok((conn, stream.to_string()))
    })
    .await
    .map_err(|_| anyhow::anyhow!("no key within {HEADER_TIMEOUT:?}"))??;
    let local = route(&stream).ok_or_else(|| anyhow::anyhow!("an unknown stream {stream:?}"))?;
    let mut sock = tokio::net::UnixStream::connect(&local)
        .await
        .map_err(|e| anyhow::anyhow!("connecting to {}: {e}", local.display()))?;
    join(&mut conn, &mut sock).await
}

/// Open a connection to the target for `stream` (`libvirt`, `memory`, `disks`).
pub async fn connect(
    offer: &Offer,
    stream: &str,
) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let cfg = crate::tls::pinned_client_config(&offer.sha256, &[])?;
    let tcp = TcpStream::connect(offer.address).await?;
    let _ = tcp.set_nodelay(true);
    let name = rustls::pki_types::ServerName::IpAddress(offer.address.ip().into());
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await?;
    tls.write_all(format!("{} {stream}\n", offer.key).as_bytes())
        .await?;
    Ok(tls)
}

/// Carry bytes both ways until both sides are done.
pub async fn join<A, B>(a: &mut A, b: &mut B) -> anyhow::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    tokio::io::copy_bidirectional_with_sizes(a, b, BUF, BUF).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A unix socket that answers each connection with what it read, upper-cased, and
    /// counts its connections.
    fn upper_server(dir: &std::path::Path) -> (PathBuf, Arc<std::sync::atomic::AtomicUsize>) {
        let path = dir.join("local.sock");
        let l = tokio::net::UnixListener::bind(&path).unwrap();
        let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let n2 = n.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                n2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(k) = s.read(&mut buf).await {
                        if k == 0 {
                            break;
                        }
                        let up = buf[..k].to_ascii_uppercase();
                        if s.write_all(&up).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        (path, n)
    }

    async fn listener(dir: &std::path::Path) -> (Offer, Arc<std::sync::atomic::AtomicUsize>) {
        crate::tls::install_crypto_provider();
        let (sock, n) = upper_server(dir);
        let l = Listener::bind("127.0.0.1".parse().unwrap()).await.unwrap();
        let offer = l.offer().clone();
        tokio::spawn(l.serve(move |s| (s == "libvirt").then(|| sock.clone())));
        (offer, n)
    }

    #[tokio::test]
    async fn the_key_holder_reaches_the_local_socket() {
        let dir = tempfile::tempdir().unwrap();
        let (offer, n) = listener(dir.path()).await;
        let mut c = connect(&offer, "libvirt").await.unwrap();
        c.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"HELLO");
        assert_eq!(n.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// The connection ends without an answer from the local socket (a plain TCP client
    /// gets the TLS alert, nothing more).
    async fn refused(mut c: impl AsyncRead + AsyncWrite + Unpin) {
        let _ = c.write_all(b"hello").await;
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut got))
            .await
            .expect("the listener closes the connection");
        assert!(!got.windows(5).any(|w| w == b"HELLO"), "got {got:?}");
    }

    #[tokio::test]
    async fn a_wrong_key_an_unknown_stream_or_another_pin_never_reach_it() {
        let dir = tempfile::tempdir().unwrap();
        let (offer, n) = listener(dir.path()).await;
        let mut wrong = offer.clone();
        wrong.key = hex::encode([7u8; 32]);
        refused(connect(&wrong, "libvirt").await.unwrap()).await;
        let mut short = offer.clone();
        short.key = "00".into();
        refused(connect(&short, "libvirt").await.unwrap()).await;
        refused(connect(&offer, "disks").await.unwrap()).await;
        // A client that pins another certificate does not even finish the handshake.
        let mut other = offer.clone();
        other.sha256 = crate::tls::cert_sha256(b"another certificate");
        assert!(connect(&other, "libvirt").await.is_err());
        // Plain TCP, no TLS: the handshake fails.
        let tcp = TcpStream::connect(offer.address).await.unwrap();
        refused(tcp).await;
        assert_eq!(n.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn the_address_is_the_route_to_the_controller_unless_set() {
        assert_eq!(
            migration_ip(Some("10.1.2.3"), "https://127.0.0.1:1").await,
            Some("10.1.2.3".parse().unwrap())
        );
        assert_eq!(
            migration_ip(Some("tunnel"), "https://10.1.2.3:1").await,
            None
        );
        // A controller on loopback: other nodes could not reach this one at that address.
        assert_eq!(migration_ip(None, "https://127.0.0.1:8443").await, None);
        assert_eq!(migration_ip(None, "not a url").await, None);
    }
}
