//! `--exec N`: exec latency through rkubelet's :10250 beside a direct CRI
//! exec (crictl's path: CRI Exec, then the runtime's streaming URL), both
//! over WebSocket with `v4.channel.k8s.io`:
//! - a whole exec of `true` (connect, upgrade, run, exit status), N times,
//!   p50/p99; the direct one includes its CRI Exec call, as crictl's does;
//! - the echo round trip of one line through an open `cat` session, mean
//!   of N.
//!
//! A minimal WebSocket client of its own (masked client frames, the head
//! read byte by byte), as the bench has no WebSocket crate to lean on.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rkubelet::cri::client::RemoteRuntime;
use rkubelet::cri::{v1, RuntimeService};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bound on any single read, so a hung stream fails the bench.
const READ: Duration = Duration::from_secs(20);

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

struct Ws {
    s: Box<dyn Io>,
}

/// Where to reach the kubelet's :10250: address, its self-signed serving
/// certificate and the name it is issued for.
pub struct Tls<'a> {
    pub addr: &'a str,
    pub crt: &'a Path,
    pub name: &'a str,
}

impl Ws {
    async fn plain(addr: &str, path: &str) -> Result<Ws> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Self::handshake(Box::new(s), addr, path).await
    }

    async fn tls(t: &Tls<'_>, cfg: &Arc<rustls::ClientConfig>, path: &str) -> Result<Ws> {
        let tcp = TcpStream::connect(t.addr).await?;
        tcp.set_nodelay(true)?;
        let name = rustls::pki_types::ServerName::try_from(t.name.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(cfg.clone())
            .connect(name, tcp)
            .await
            .context("TLS to :10250")?;
        Self::handshake(Box::new(tls), t.addr, path).await
    }

    async fn handshake(mut s: Box<dyn Io>, addr: &str, path: &str) -> Result<Ws> {
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await?;
        // Byte by byte, so no frame byte is taken with the head.
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            if tokio::time::timeout(READ, s.read(&mut b)).await?? == 0 {
                bail!("closed during the upgrade");
            }
            head.push(b[0]);
            if head.len() > 16384 {
                bail!("upgrade answer too long");
            }
        }
        if !head.starts_with(b"HTTP/1.1 101") {
            bail!("not upgraded: {}", String::from_utf8_lossy(&head));
        }
        Ok(Ws { s })
    }

    /// One binary message on channel `ch` (client frames are masked).
    async fn send_on(&mut self, ch: u8, data: &[u8]) -> Result<()> {
        let len = data.len() + 1;
        if len >= 126 {
            bail!("message too long for this client");
        }
        let mask = [0x37u8, 0xfa, 0x21, 0x3d];
        let mut f = vec![0x82u8, 0x80 | len as u8];
        f.extend_from_slice(&mask);
        f.extend(
            std::iter::once(ch)
                .chain(data.iter().copied())
                .enumerate()
                .map(|(i, b)| b ^ mask[i % 4]),
        );
        self.s.write_all(&f).await?;
        Ok(())
    }

    /// The next data message, or None once the server closed.
    async fn recv(&mut self) -> Result<Option<Vec<u8>>> {
        loop {
            let mut h = [0u8; 2];
            if tokio::time::timeout(READ, self.s.read_exact(&mut h))
                .await?
                .is_err()
            {
                return Ok(None);
            }
            let mut len = u64::from(h[1] & 0x7f);
            if len == 126 {
                let mut b = [0u8; 2];
                self.s.read_exact(&mut b).await?;
                len = u64::from(u16::from_be_bytes(b));
            } else if len == 127 {
                let mut b = [0u8; 8];
                self.s.read_exact(&mut b).await?;
                len = u64::from_be_bytes(b);
            }
            if len >= 1 << 20 {
                bail!("message of {len} bytes");
            }
            let mut p = vec![0u8; len as usize];
            self.s.read_exact(&mut p).await?;
            match h[0] & 0x0f {
                0x1 | 0x2 => return Ok(Some(p)),
                0x8 => return Ok(None),
                _ => continue,
            }
        }
    }

    /// Reads until the exit status (channel 3) or the close; errors unless
    /// the status says Success.
    async fn until_exit(&mut self) -> Result<()> {
        while let Some(m) = self.recv().await? {
            if m.first() == Some(&3) {
                let status = String::from_utf8_lossy(&m[1..]).to_string();
                if !status.contains("Success") {
                    bail!("exec failed: {status}");
                }
                return Ok(());
            }
        }
        bail!("closed without an exit status")
    }

    /// `n` one-line echo round trips through a `cat`: their mean.
    async fn echo(&mut self, n: u32) -> Result<Duration> {
        let start = Instant::now();
        for i in 0..n {
            let line = format!("{i}\n");
            self.send_on(0, line.as_bytes()).await?;
            let mut got = Vec::new();
            while got.len() < line.len() {
                let m = self.recv().await?.context("closed while echoing")?;
                if m.first() == Some(&1) {
                    got.extend_from_slice(&m[1..]);
                }
            }
            if got != line.as_bytes() {
                bail!("echo gave {:?}", String::from_utf8_lossy(&got));
            }
        }
        Ok(start.elapsed() / n.max(1))
    }
}

/// A TLS client trusting only the kubelet's own certificate.
fn client_config(crt: &Path) -> Result<Arc<rustls::ClientConfig>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(crt)? {
        roots.add(c?)?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// The runtime's streaming URL for `cmd` in `container` (CRI Exec), split
/// into its address and path.
async fn cri_exec(
    cri: &RemoteRuntime,
    container: &str,
    cmd: &[&str],
    stdin: bool,
) -> Result<(String, String)> {
    let url = cri
        .exec(v1::ExecRequest {
            container_id: container.to_string(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            stdin,
            stdout: true,
            stderr: !stdin,
            tty: false,
        })
        .await?;
    let u = url::Url::parse(&url)?;
    let addr = format!(
        "{}:{}",
        u.host_str().context("no host in the streaming URL")?,
        u.port_or_known_default().unwrap_or(80)
    );
    let mut path = u.path().to_string();
    if let Some(q) = u.query() {
        path = format!("{path}?{q}");
    }
    Ok((addr, path))
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(((v.len() as f64 - 1.0) * p / 100.0).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// Times `n` whole execs of `true` and `n` echo round trips each way, for
/// pod `pod` (namespace default) whose container `main` is `container`.
pub async fn run(
    cri: &RemoteRuntime,
    t: &Tls<'_>,
    pod: &str,
    container: &str,
    n: u32,
) -> Result<()> {
    let cfg = client_config(t.crt)?;
    let true_path = format!("/exec/default/{pod}/main?command=true&output=1&error=1");
    let cat_path = format!("/exec/default/{pod}/main?command=cat&input=1&output=1");
    // One of each first: connections, the runtime's streaming server.
    Ws::tls(t, &cfg, &true_path).await?.until_exit().await?;
    let (a, p) = cri_exec(cri, container, &["true"], false).await?;
    Ws::plain(&a, &p).await?.until_exit().await?;

    let (mut proxied, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let s = Instant::now();
        Ws::tls(t, &cfg, &true_path).await?.until_exit().await?;
        proxied.push(s.elapsed().as_secs_f64() * 1000.0);
        let s = Instant::now();
        let (a, p) = cri_exec(cri, container, &["true"], false).await?;
        Ws::plain(&a, &p).await?.until_exit().await?;
        direct.push(s.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "exec `true` (connect, run, exit status), {n} each: through rkubelet :10250 (TLS) p50 {:.2} ms  p99 {:.2} ms; direct CRI Exec + runtime stream (crictl's path, no TLS) p50 {:.2} ms  p99 {:.2} ms",
        pct(&mut proxied, 50.0),
        pct(&mut proxied, 99.0),
        pct(&mut direct, 50.0),
        pct(&mut direct, 99.0),
    );

    let mut ws = Ws::tls(t, &cfg, &cat_path).await?;
    let through = ws.echo(n).await?;
    let (a, p) = cri_exec(cri, container, &["cat"], true).await?;
    let mut ws = Ws::plain(&a, &p).await?;
    let plain = ws.echo(n).await?;
    println!(
        "echo round trip in an open exec session (mean of {n}): through rkubelet {:.3} ms; direct to the runtime {:.3} ms",
        through.as_secs_f64() * 1000.0,
        plain.as_secs_f64() * 1000.0
    );
    Ok(())
}
