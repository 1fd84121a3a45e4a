//! Streaming through rkubelet's proxy to containerd's streaming server:
//! exec over WebSocket (`v4.channel.k8s.io`, `v5.channel.k8s.io`) and
//! port-forward over WebSocket, against a pod a real rkubelet runs; and a
//! real `kubectl exec`, `attach` and `port-forward` over SPDY through a
//! stand-in for the API server's proxying (the double serves kubectl's
//! other requests).
//!
//! The routes are served in-process over a `RemoteRuntime` (the :10250
//! server with its authn/authz is built elsewhere); the pod is registered
//! in the test's pod manager from the running rkubelet's `/pods`.
//!
//! The WebSocket client is a minimal one written here (RFC 6455 framing,
//! masked client frames, no fragmentation: the kubelet protocols' frames
//! are whole messages), so the test needs no new crate.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use common::*;
use rkubelet::cri::client::RemoteRuntime;
use rkubelet::cri::{v1, RuntimeService};
use rkubelet::server::{streaming, ServerState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const T: Duration = Duration::from_secs(60);
/// Bound on any single read in the client, so a hung stream fails the test.
const READ: Duration = Duration::from_secs(20);

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

struct Ws {
    s: Box<dyn Io>,
    protocol: String,
}

impl Ws {
    /// Opens `path` on `addr` as a WebSocket offering `protocols`; panics
    /// unless the answer is 101.
    async fn connect(addr: &str, path: &str, protocols: &str) -> Ws {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        Self::handshake(Box::new(s), addr, path, protocols).await
    }

    /// As `connect`, over TLS to the kubelet's :10250, verifying its
    /// self-signed serving certificate (chain in `kubelet.crt`) for `name`.
    async fn connect_tls(
        addr: &str,
        crt: &std::path::Path,
        name: &str,
        path: &str,
        protocols: &str,
    ) -> Ws {
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_file_iter(crt).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(
                rustls::pki_types::ServerName::try_from(name.to_string()).unwrap(),
                tcp,
            )
            .await
            .expect("TLS to :10250 with the kubelet's own certificate");
        Self::handshake(Box::new(tls), addr, path, protocols).await
    }

    async fn handshake(mut s: Box<dyn Io>, addr: &str, path: &str, protocols: &str) -> Ws {
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: {protocols}\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        // Read the head byte by byte so no frame byte is consumed with it.
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            let n = tokio::time::timeout(READ, s.read(&mut b))
                .await
                .expect("handshake answer")
                .unwrap();
            assert!(
                n == 1,
                "closed during handshake: {:?}",
                String::from_utf8_lossy(&head)
            );
            head.push(b[0]);
            assert!(head.len() < 16384);
        }
        let head = String::from_utf8(head).unwrap();
        assert!(head.starts_with("HTTP/1.1 101"), "not upgraded: {head}");
        let protocol = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("sec-websocket-protocol")
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_default();
        Ws { s, protocol }
    }

    /// Sends one binary message (client frames are masked).
    async fn send(&mut self, payload: &[u8]) {
        let mut f = vec![0x82u8];
        let len = payload.len();
        if len < 126 {
            f.push(0x80 | len as u8);
        } else {
            assert!(len <= 0xffff);
            f.push(0x80 | 126);
            f.extend_from_slice(&(len as u16).to_be_bytes());
        }
        let mask = [0x37u8, 0xfa, 0x21, 0x3d];
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.s.write_all(&f).await.unwrap();
    }

    /// Sends `data` on kubelet channel `ch`.
    async fn send_on(&mut self, ch: u8, data: &[u8]) {
        let mut p = vec![ch];
        p.extend_from_slice(data);
        self.send(&p).await;
    }

    /// The next data message, or None once the server closed.
    async fn recv(&mut self) -> Option<Vec<u8>> {
        loop {
            let mut h = [0u8; 2];
            match tokio::time::timeout(READ, self.s.read_exact(&mut h))
                .await
                .expect("a message within the read bound")
            {
                Ok(_) => {}
                Err(_) => return None,
            }
            let op = h[0] & 0x0f;
            let mut len = u64::from(h[1] & 0x7f);
            if len == 126 {
                let mut b = [0u8; 2];
                self.s.read_exact(&mut b).await.ok()?;
                len = u64::from(u16::from_be_bytes(b));
            } else if len == 127 {
                let mut b = [0u8; 8];
                self.s.read_exact(&mut b).await.ok()?;
                len = u64::from_be_bytes(b);
            }
            assert!(h[1] & 0x80 == 0, "server frames are not masked");
            assert!(len < 1 << 20);
            let mut p = vec![0u8; len as usize];
            self.s.read_exact(&mut p).await.ok()?;
            match op {
                0x1 | 0x2 => return Some(p),
                0x8 => return None,
                _ => continue, // ping/pong
            }
        }
    }

    /// Every message until the server closes, gathered per channel.
    async fn drain(&mut self) -> [Vec<u8>; 5] {
        let mut out: [Vec<u8>; 5] = Default::default();
        while let Some(m) = self.recv().await {
            if let Some((&ch, data)) = m.split_first() {
                if (ch as usize) < out.len() {
                    out[ch as usize].extend_from_slice(data);
                }
            }
        }
        out
    }
}

fn q(s: &str) -> String {
    s.replace(' ', "%20")
        .replace('$', "%24")
        .replace(';', "%3B")
        .replace('>', "%3E")
        .replace('&', "%26")
        .replace('"', "%22")
}

/// The exec path for `cmd` (each word a `command` parameter).
fn exec_path(pod: &str, container: &str, cmd: &[&str], extra: &str) -> String {
    let c: Vec<String> = cmd.iter().map(|w| format!("command={}", q(w))).collect();
    format!("/exec/default/{pod}/{container}?{}&{extra}", c.join("&"))
}

/// Writes `req` and reads the answer: the head only for a 101 (the
/// connection then stays open for frames), else until the server closes.
async fn raw(addr: &str, req: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    loop {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(READ, s.read(&mut b))
            .await
            .expect("answer")
            .unwrap();
        if n == 0 {
            break;
        }
        buf.push(b[0]);
        if buf.ends_with(b"\r\n\r\n") && buf.starts_with(b"HTTP/1.1 101") {
            break;
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

struct Served {
    addr: String,
    runtime: Arc<RemoteRuntime>,
    streams: rkubelet::server::Streams,
    _token: tokio_util::sync::CancellationToken,
}

/// Serves the streaming routes on a loopback port, with `pod` (as /pods
/// shows it) in the pod manager.
async fn serve(pod: &serde_json::Value, idle: Option<Duration>) -> Served {
    let runtime = Arc::new(RemoteRuntime::connect_lazy(ENDPOINT, Duration::from_secs(10)).unwrap());
    let (mut state, token) = ServerState::for_tests(runtime.clone());
    if let Some(idle) = idle {
        let mut c = (*state.config).clone();
        c.streaming_connection_idle_timeout = idle.into();
        state.config = Arc::new(c);
    }
    state
        .pods
        .upsert(serde_json::from_value(pod.clone()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let streams = state.streams.clone();
    let app: Router = streaming::routes().with_state(state);
    let stop = token.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .unwrap();
    });
    Served {
        addr,
        runtime,
        streams,
        _token: token,
    }
}

/// Mean time of `n` one-byte-ish echo round trips through a `cat` exec.
async fn echo_round_trips(ws: &mut Ws, n: u32) -> Duration {
    let start = Instant::now();
    for i in 0..n {
        let msg = format!("{i}\n");
        ws.send_on(0, msg.as_bytes()).await;
        let mut got = Vec::new();
        while got.len() < msg.len() {
            let m = ws.recv().await.expect("echo");
            if m.first() == Some(&1) {
                got.extend_from_slice(&m[1..]);
            }
        }
        assert_eq!(got, msg.as_bytes());
    }
    start.elapsed() / n
}

#[test]
fn exec_and_port_forward_through_the_proxy() {
    let k = Kubelet::start("it-stream");
    k.write_manifest(
        "s.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: s\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n  - name: att\n    image: {BUSYBOX}\n    stdin: true\n    command: [cat]\n  - name: echo\n    image: {BUSYBOX}\n    command: [sh, -c, 'printf \"#!/bin/sh\\nread x\\necho pong \\$x\\n\" > /pong; chmod +x /pong; while true; do nc -l -p 8080 -e /pong; done']\n"
        ),
    );
    let pod = k.wait_pod("s", "running", T, |p| {
        running(p, "main") && running(p, "echo")
    });
    let name = format!("s-{}", k.node);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let sv = serve(&pod, None).await;

        // v4: stdin → stdout, stderr on channel 2, exit status on channel 3.
        let path = exec_path(
            &name,
            "main",
            &["sh", "-c", "read l; echo \"got $l\"; echo oops >&2; exit 3"],
            "input=1&output=1&error=1",
        );
        let mut ws = Ws::connect(&sv.addr, &path, "v4.channel.k8s.io").await;
        assert_eq!(ws.protocol, "v4.channel.k8s.io");
        ws.send_on(0, b"hello\n").await;
        let out = ws.drain().await;
        assert_eq!(String::from_utf8_lossy(&out[1]), "got hello\n");
        assert_eq!(String::from_utf8_lossy(&out[2]), "oops\n");
        let status: serde_json::Value = serde_json::from_slice(&out[3]).unwrap();
        assert_eq!(status["status"], "Failure", "{status}");
        assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
        let cause = &status["details"]["causes"][0];
        assert_eq!((cause["reason"].as_str(), cause["message"].as_str()), (Some("ExitCode"), Some("3")), "{status}");

        // The same through the kubelet's own :10250 (TLS, the auth filter
        // and the accept loop's upgrade handling).
        let crt = k.dir.join("pki/kubelet.crt");
        let mut ws = Ws::connect_tls(&k.api, &crt, &k.node, &path, "v4.channel.k8s.io").await;
        ws.send_on(0, b"tls\n").await;
        let out = ws.drain().await;
        assert_eq!(String::from_utf8_lossy(&out[1]), "got tls\n");
        let status: serde_json::Value = serde_json::from_slice(&out[3]).unwrap();
        assert_eq!(status["reason"], "NonZeroExitCode", "{status}");

        // A zero exit: Success on channel 3.
        let path = exec_path(&name, "main", &["true"], "output=1");
        let mut ws = Ws::connect(&sv.addr, &path, "v4.channel.k8s.io").await;
        let out = ws.drain().await;
        let status: serde_json::Value = serde_json::from_slice(&out[3]).unwrap();
        assert_eq!(status["status"], "Success", "{status}");

        // v5 offered first: what containerd 1.7 picks.
        let path = exec_path(&name, "main", &["cat"], "input=1&output=1");
        let mut ws = Ws::connect(&sv.addr, &path, "v5.channel.k8s.io, v4.channel.k8s.io").await;
        eprintln!("offered v5 and v4; containerd chose {:?}", ws.protocol);
        assert!(ws.protocol.starts_with("v5.") || ws.protocol.starts_with("v4."), "{}", ws.protocol);
        if ws.protocol == "v5.channel.k8s.io" {
            ws.send_on(0, b"abc").await;
            ws.send(&[255, 0]).await; // close stdin
            let out = ws.drain().await;
            assert_eq!(out[1], b"abc");
        }
        drop(ws);

        // Latency: cat echo round trips, through the proxy and direct.
        let path = exec_path(&name, "main", &["cat"], "input=1&output=1");
        let mut ws = Ws::connect(&sv.addr, &path, "v4.channel.k8s.io").await;
        let proxied = echo_round_trips(&mut ws, 200).await;
        drop(ws);
        let id = sv
            .runtime
            .list_containers(None)
            .await
            .unwrap()
            .into_iter()
            .find(|c| {
                c.labels.get("io.kubernetes.pod.name") == Some(&name)
                    && c.labels.get("io.kubernetes.container.name").map(String::as_str) == Some("main")
                    && c.state == v1::ContainerState::ContainerRunning as i32
            })
            .unwrap()
            .id;
        let url = sv
            .runtime
            .exec(v1::ExecRequest {
                container_id: id,
                cmd: vec!["cat".into()],
                stdin: true,
                stdout: true,
                ..Default::default()
            })
            .await
            .unwrap();
        let rest = url.strip_prefix("http://").unwrap();
        let (host, p) = rest.split_at(rest.find('/').unwrap());
        let mut ws = Ws::connect(host, p, "v4.channel.k8s.io").await;
        let direct = echo_round_trips(&mut ws, 200).await;
        drop(ws);
        eprintln!("exec echo round trip (mean of 200): through the proxy {proxied:?}, direct to containerd {direct:?}");

        // Attach to a container started with stdin: its `cat` echoes.
        let path = format!("/attach/default/{name}/att?input=1&output=1");
        let mut ws = Ws::connect(&sv.addr, &path, "v4.channel.k8s.io").await;
        ws.send_on(0, b"attached\n").await;
        let mut got = Vec::new();
        while !got.ends_with(b"\n") {
            let m = ws.recv().await.expect("attach output");
            if m.first() == Some(&1) {
                got.extend_from_slice(&m[1..]);
            }
        }
        assert_eq!(got, b"attached\n");
        drop(ws);

        // SPDY: the upgrade and the runtime's protocol choice pass through
        // the proxy (SPDY framing itself is not exercised here).
        let path = exec_path(&name, "main", &["true"], "output=1");
        let head = raw(
            &sv.addr,
            &format!("POST {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nX-Stream-Protocol-Version: v3.channel.k8s.io\r\nContent-Length: 0\r\n\r\n"),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        let lower = head.to_ascii_lowercase();
        assert!(lower.contains("upgrade: spdy/3.1"), "{head}");
        assert!(lower.contains("x-stream-protocol-version: v4.channel.k8s.io"), "{head}");

        // A refused upgrade (neither WebSocket nor SPDY) is the runtime's
        // own answer, relayed.
        let path = exec_path(&name, "main", &["true"], "output=1");
        let head = raw(
            &sv.addr,
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close, Upgrade\r\nUpgrade: foo\r\n\r\n"),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 400"), "{head}");
        assert!(head.contains("unable to upgrade"), "{head}");

        // /run: ExecSync, the output as the body; a failure is a 500.
        let head = raw(&sv.addr, &format!("POST /run/default/{name}/main?cmd=echo%20run%20ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.ends_with("\r\n\r\nrun ok\n"), "{head}");
        let head = raw(&sv.addr, &format!("POST /run/default/{name}/main?cmd=false HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")).await;
        assert!(head.starts_with("HTTP/1.1 500"), "{head}");
        assert!(head.contains("command 'false' exited with 1"), "{head}");

        // streamingConnectionIdleTimeout: a silent session is closed.
        let short = serve(&pod, Some(Duration::from_secs(1))).await;
        let path = exec_path(&name, "main", &["cat"], "input=1&output=1");
        let mut ws = Ws::connect(&short.addr, &path, "v4.channel.k8s.io").await;
        ws.send_on(0, b"x\n").await;
        // The server opens each channel with an empty message first.
        let mut m = ws.recv().await.expect("echo");
        while m.len() == 1 {
            m = ws.recv().await.expect("echo");
        }
        assert_eq!(m, b"\x01x\n");
        let idle_from = Instant::now();
        assert_eq!(ws.recv().await, None, "closed once idle");
        eprintln!("idle session closed after {:?}", idle_from.elapsed());
        drop(ws);

        // Port-forward over WebSocket: per port a data and an error channel,
        // each opened by the server with the port number (little endian).
        let path = format!("/portForward/default/{name}?port=8080");
        let mut ws = Ws::connect(&sv.addr, &path, "v4.channel.k8s.io").await;
        let mut opened = Vec::new();
        for _ in 0..2 {
            let m = ws.recv().await.expect("channel opening");
            opened.push(m);
        }
        opened.sort();
        assert_eq!(opened, vec![vec![0u8, 0x90, 0x1f], vec![1u8, 0x90, 0x1f]]);
        ws.send_on(0, b"ping\n").await;
        let mut got = Vec::new();
        while !got.ends_with(b"\n") {
            let m = ws.recv().await.expect("data back from the pod");
            assert_eq!(m[0], 0, "error channel: {:?}", String::from_utf8_lossy(&m[1..]));
            got.extend_from_slice(&m[1..]);
        }
        assert_eq!(String::from_utf8_lossy(&got), "pong ping\n");
        drop(ws);

        // Shutdown ends the spliced sessions still open and awaits them.
        let path = exec_path(&name, "main", &["cat"], "input=1&output=1");
        let mut ws = Ws::connect(&sv.addr, &path, "v4.channel.k8s.io").await;
        ws.send_on(0, b"y\n").await;
        let mut m = ws.recv().await.expect("echo");
        while m.len() == 1 {
            m = ws.recv().await.expect("echo");
        }
        assert_eq!(m, b"\x01y\n");
        assert!(sv.streams.shut_down(Duration::from_secs(5)).await, "the session's task ended");
        let closed = tokio::time::timeout(Duration::from_secs(5), ws.recv()).await;
        assert_eq!(closed, Ok(None), "the client's connection closed");
    });
}

/// What the API server does with `pods/<name>/exec` (ExecLocation and
/// streamParams in pkg/registry/core/pod/strategy.go): the kubelet's
/// `/exec/<ns>/<pod>/<container>`, each `command` kept, and stdin, stdout,
/// stderr and tty turned into `input`, `output`, `error` and `tty` = 1.
fn kubelet_exec_path(api_path: &str) -> Option<String> {
    let (path, query) = api_path.split_once('?').unwrap_or((api_path, ""));
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let (ns, rest) = rest.split_once("/pods/")?;
    if let Some(pod) = rest.strip_suffix("/portforward") {
        // PortForwardLocation: SPDY carries the ports in stream headers.
        return Some(format!("/portForward/{ns}/{pod}"));
    }
    // AttachLocation is ExecLocation's twin (no command).
    let (pod, verb) = match rest.strip_suffix("/exec") {
        Some(pod) => (pod, "exec"),
        None => (rest.strip_suffix("/attach")?, "attach"),
    };
    let mut container = "";
    let mut params = Vec::new();
    for kv in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match (k, v) {
            ("container", c) => container = c,
            ("command", _) => params.push(kv.to_string()),
            ("stdin", "true") => params.push("input=1".into()),
            ("stdout", "true") => params.push("output=1".into()),
            ("stderr", "true") => params.push("error=1".into()),
            ("tty", "true") => params.push("tty=1".into()),
            _ => {}
        }
    }
    Some(format!(
        "/{verb}/{ns}/{pod}/{container}?{}",
        params.join("&")
    ))
}

/// Stands in for the API server's side of `kubectl exec`: exec requests go,
/// rewritten as the API server rewrites them, to the kubelet's routes at
/// `kubelet`, and the upgraded connection is spliced; every other request
/// (kubectl's discovery and its GET of the pod) goes to the API double at
/// `api`, one request per connection.
async fn front(
    listener: tokio::net::TcpListener,
    api: String,
    kubelet: String,
    upgrades: Arc<parking_lot::Mutex<Vec<String>>>,
) {
    loop {
        let Ok((mut client, _)) = listener.accept().await else {
            return;
        };
        let (api, kubelet, upgrades) = (api.clone(), kubelet.clone(), upgrades.clone());
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let mut chunk = [0u8; 4096];
                match client.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
                if buf.len() > 64 << 10 {
                    return;
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
            let mut lines = head.split("\r\n");
            let first = lines.next().unwrap_or_default();
            let mut words = first.split(' ');
            let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            let headers: Vec<&str> = lines.filter(|l| !l.is_empty()).collect();
            let (to, head) = match kubelet_exec_path(path) {
                Some(p) => {
                    let upgrade = headers.iter().find_map(|h| {
                        h.split_once(':')
                            .filter(|(n, _)| n.eq_ignore_ascii_case("upgrade"))
                    });
                    upgrades
                        .lock()
                        .push(upgrade.map_or("", |(_, v)| v.trim()).to_string());
                    (
                        kubelet,
                        format!("{method} {p} HTTP/1.1\r\n{}\r\n\r\n", headers.join("\r\n")),
                    )
                }
                None => {
                    let kept: Vec<&str> = headers
                        .iter()
                        .copied()
                        .filter(|h| !h.to_ascii_lowercase().starts_with("connection:"))
                        .collect();
                    (
                        api,
                        format!(
                            "{first}\r\n{}\r\nConnection: close\r\n\r\n",
                            kept.join("\r\n")
                        ),
                    )
                }
            };
            let Ok(mut up) = TcpStream::connect(&to).await else {
                return;
            };
            if up.write_all(head.as_bytes()).await.is_err()
                || up.write_all(&buf[head_end..]).await.is_err()
            {
                return;
            }
            let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
        });
    }
}

/// `kubectl exec` over SPDY (websockets turned off, as against an API
/// server older than 1.30 or one without the stream translator) through a
/// stand-in for the API server's proxying: stdin reaches the process,
/// stdout and stderr come back apart, and kubectl exits with the process's
/// exit code.
#[test]
fn kubectl_exec_attach_and_port_forward_over_spdy() {
    let k = Kubelet::start("it-spdy");
    k.write_manifest(
        "x.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n  - name: att\n    image: {BUSYBOX}\n    stdin: true\n    command: [cat]\n  - name: echo\n    image: {BUSYBOX}\n    command: [sh, -c, 'printf \"#!/bin/sh\\nread x\\necho pong \\$x\\n\" > /pong; chmod +x /pong; while true; do nc -l -p 8080 -e /pong; done']\n"
        ),
    );
    let pod = k.wait_pod("x", "running", T, |p| {
        running(p, "main") && running(p, "echo") && running(p, "att")
    });
    let name = format!("x-{}", k.node);
    let api = common::apiserver::ApiServer::start(common::apiserver::ApiServerOptions {
        tls: false,
        ..Default::default()
    });
    let mut obj = api.create(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": pod["spec"].clone(),
    }));
    // kubectl port-forward refuses a pod the API does not show Running.
    obj["status"] = pod["status"].clone();
    api.update_status(obj);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sv = rt.block_on(serve(&pod, None));
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let front_addr = listener.local_addr().unwrap().to_string();
    let upgrades = Arc::new(parking_lot::Mutex::new(Vec::new()));
    rt.spawn(front(
        listener,
        api.url().trim_start_matches("http://").to_string(),
        sv.addr.clone(),
        upgrades.clone(),
    ));
    let kubeconfig = k.dir.join("kubectl-front.conf");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{front_addr}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user: {{}}\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new("kubectl")
        .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["exec", "-i", "-n", "default", &name, "-c", "main", "--"])
        .args(["sh", "-c", "read l; echo \"got $l\"; echo oops >&2; exit 3"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let deadline = Instant::now() + T;
    let out = loop {
        if child.try_wait().unwrap().is_some() {
            break child.wait_with_output().unwrap();
        }
        assert!(Instant::now() < deadline, "kubectl exec did not finish");
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(stdout, "got hello\n", "stderr: {stderr}");
    assert!(stderr.contains("oops"), "{stderr}");
    assert_eq!(out.status.code(), Some(3), "stderr: {stderr}");
    assert_eq!(*upgrades.lock(), ["SPDY/3.1"], "one exec, over SPDY");

    // kubectl port-forward over SPDY: bytes both ways to the pod's port.
    let local = free_port();
    let mut pf = std::process::Command::new("kubectl")
        .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "port-forward",
            "-n",
            "default",
            &name,
            &format!("{local}:8080"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(k.dir.join("port-forward.err")).unwrap())
        .spawn()
        .expect("kubectl port-forward");
    let err_file = k.dir.join("port-forward.err");
    let answer = poll_pong(local, &err_file, || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", local)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(b"ping\n").ok()?;
        let mut got = String::new();
        s.read_to_string(&mut got).ok()?;
        (!got.is_empty()).then_some(got)
    });
    let _ = pf.kill();
    let _ = pf.wait();
    assert_eq!(answer, "pong ping\n");
    assert_eq!(upgrades.lock().last().map(String::as_str), Some("SPDY/3.1"));

    // kubectl attach over SPDY: what goes to the running `cat`'s stdin
    // comes back on its stdout.
    let mut at = std::process::Command::new("kubectl")
        .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["attach", "-i", "-n", "default", &name, "-c", "att"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kubectl attach");
    let mut to_cat = at.stdin.take().unwrap();
    let stdout = at.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // Written until it comes back: the stream may open after the first line.
    let deadline = Instant::now() + T;
    let echoed = loop {
        to_cat.write_all(b"through attach\n").unwrap();
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(l) => break l,
            Err(_) => assert!(
                Instant::now() < deadline,
                "nothing back through kubectl attach"
            ),
        }
    };
    let _ = at.kill();
    let _ = at.wait();
    assert_eq!(echoed, "through attach");
    assert_eq!(upgrades.lock().last().map(String::as_str), Some("SPDY/3.1"));
    drop(sv);
}

/// Polls `f` for up to a minute; on timeout fails with kubectl's stderr.
fn poll_pong(port: u16, err: &std::path::Path, mut f: impl FnMut() -> Option<String>) -> String {
    let deadline = Instant::now() + T;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "no pong through kubectl port-forward on {port}: {}",
            std::fs::read_to_string(err).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
