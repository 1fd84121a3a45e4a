//! A small blocking HTTP/1.1 client for tests of the API server double:
//! one connection per request (`Connection: close`), TLS through rustls'
//! blocking API, optional client certificate or bearer token, and watch
//! streams read line by line from the chunked body.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;

use super::ApiServer;

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// A client of one API server double.
#[derive(Clone)]
pub struct Client {
    port: u16,
    tls: Option<Arc<rustls::ClientConfig>>,
    ca_pem: String,
    token: Option<String>,
    timeout: Duration,
}

/// A response: status and body (JSON, or Null if the body is not JSON).
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub body: Value,
}

fn tls_config(ca_pem: &str, cert: Option<(&str, &str)>) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA PEM")).expect("CA root");
    }
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots);
    let cfg = match cert {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .expect("client certificate PEM");
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("client key PEM");
            b.with_client_auth_cert(chain, key)
                .expect("client certificate")
        }
        None => b.with_no_client_auth(),
    };
    Arc::new(cfg)
}

impl Client {
    /// An anonymous client (the server's CA trusted when it uses TLS), 10 s
    /// timeout.
    pub fn new(server: &ApiServer) -> Client {
        let ca_pem = server.ca_pem();
        Client {
            port: server.port(),
            tls: server.is_tls().then(|| tls_config(&ca_pem, None)),
            ca_pem,
            token: None,
            timeout: Duration::from_secs(10),
        }
    }

    /// Presents this client certificate (PEM) and key.
    pub fn with_client_cert(mut self, cert_pem: &str, key_pem: &str) -> Client {
        self.tls = Some(tls_config(&self.ca_pem, Some((cert_pem, key_pem))));
        self
    }

    /// Sends `Authorization: Bearer <token>`.
    pub fn with_token(mut self, token: &str) -> Client {
        self.token = Some(token.to_string());
        self
    }

    /// Connect, read and write timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    fn connect(&self) -> io::Result<Box<dyn Stream>> {
        let addr = ([127, 0, 0, 1], self.port).into();
        let tcp = TcpStream::connect_timeout(&addr, self.timeout)?;
        tcp.set_read_timeout(Some(self.timeout))?;
        tcp.set_write_timeout(Some(self.timeout))?;
        Ok(match &self.tls {
            Some(cfg) => {
                let name = ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
                let conn =
                    rustls::ClientConnection::new(cfg.clone(), name).map_err(io::Error::other)?;
                Box::new(rustls::StreamOwned::new(conn, tcp))
            }
            None => Box::new(tcp),
        })
    }

    /// Sends a request and reads the status line and headers.
    fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&Value>,
    ) -> io::Result<Head> {
        let mut s = self.connect()?;
        let body = body.map(|b| serde_json::to_vec(b).expect("json"));
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAccept: application/json\r\nConnection: close\r\n",
            self.port
        );
        if let Some(t) = &self.token {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        if let Some(b) = &body {
            head.push_str(&format!(
                "Content-Type: {}\r\nContent-Length: {}\r\n",
                content_type.unwrap_or("application/json"),
                b.len()
            ));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())?;
        if let Some(b) = &body {
            s.write_all(b)?;
        }
        s.flush()?;
        let mut r = BufReader::new(s);
        let mut status_line = String::new();
        r.read_line(&mut status_line)?;
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::other(format!("bad status line {status_line:?}")))?;
        let mut chunked = false;
        let mut length = None;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                    chunked = true;
                } else if k == "content-length" {
                    length = v.parse().ok();
                }
            }
        }
        Ok(Head {
            status,
            chunked,
            length,
            r,
        })
    }

    /// A request with an optional JSON body (`content_type` defaults to
    /// application/json).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&Value>,
    ) -> io::Result<Response> {
        let Head {
            status,
            chunked,
            length,
            mut r,
        } = self.send(method, path, content_type, body)?;
        let mut buf = Vec::new();
        if chunked {
            let mut c = Chunked {
                r,
                left: 0,
                done: false,
            };
            c.read_to_end(&mut buf)?;
        } else if let Some(n) = length {
            buf.resize(n, 0);
            r.read_exact(&mut buf)?;
        } else {
            r.read_to_end(&mut buf)?;
        }
        Ok(Response {
            status,
            body: serde_json::from_slice(&buf).unwrap_or(Value::Null),
        })
    }

    pub fn get(&self, path: &str) -> io::Result<Response> {
        self.request("GET", path, None, None)
    }

    pub fn post(&self, path: &str, body: &Value) -> io::Result<Response> {
        self.request("POST", path, None, Some(body))
    }

    pub fn put(&self, path: &str, body: &Value) -> io::Result<Response> {
        self.request("PUT", path, None, Some(body))
    }

    /// PATCH with `content_type` (merge, strategic merge, JSON patch).
    pub fn patch(&self, path: &str, content_type: &str, body: &Value) -> io::Result<Response> {
        self.request("PATCH", path, Some(content_type), Some(body))
    }

    pub fn delete(&self, path: &str, options: Option<&Value>) -> io::Result<Response> {
        self.request("DELETE", path, None, options)
    }

    /// Starts a watch (`path` should carry `watch=true` and its query).
    pub fn watch(&self, path: &str) -> io::Result<WatchStream> {
        let Head {
            status, chunked, r, ..
        } = self.send("GET", path, None, None)?;
        if status != 200 || !chunked {
            return Err(io::Error::other(format!("watch got HTTP {status}")));
        }
        Ok(WatchStream {
            lines: BufReader::new(Chunked {
                r,
                left: 0,
                done: false,
            }),
        })
    }
}

/// A response's status line and headers; `r` is at the body.
struct Head {
    status: u16,
    chunked: bool,
    length: Option<usize>,
    r: BufReader<Box<dyn Stream>>,
}

/// A chunked transfer-encoded body.
struct Chunked {
    r: BufReader<Box<dyn Stream>>,
    left: usize,
    done: bool,
}

impl Read for Chunked {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut size = String::new();
            loop {
                size.clear();
                if self.r.read_line(&mut size)? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                if !size.trim().is_empty() {
                    break;
                }
            }
            let hex = size.trim().split(';').next().unwrap_or("");
            self.left = usize::from_str_radix(hex, 16)
                .map_err(|_| io::Error::other(format!("bad chunk size {size:?}")))?;
            if self.left == 0 {
                self.done = true;
                return Ok(0);
            }
        }
        let n = buf.len().min(self.left);
        let n = self.r.read(&mut buf[..n])?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.left -= n;
        if self.left == 0 {
            let mut crlf = [0u8; 2];
            self.r.read_exact(&mut crlf)?;
        }
        Ok(n)
    }
}

/// An open watch: one event per line.
pub struct WatchStream {
    lines: BufReader<Chunked>,
}

impl WatchStream {
    /// The next event (`{"type", "object"}`); Ok(None) when the server ended
    /// the stream; Err on a read timeout or a broken connection.
    pub fn next_event(&mut self) -> io::Result<Option<Value>> {
        let mut line = String::new();
        if self.lines.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        serde_json::from_str(&line)
            .map(Some)
            .map_err(|e| io::Error::other(format!("bad watch line {line:?}: {e}")))
    }

    /// The next event that is not a BOOKMARK.
    pub fn next_non_bookmark(&mut self) -> io::Result<Option<Value>> {
        loop {
            match self.next_event()? {
                Some(e) if e["type"] == "BOOKMARK" => continue,
                other => return Ok(other),
            }
        }
    }
}
