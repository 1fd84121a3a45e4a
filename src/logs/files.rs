//! `/logs/`: the files under /var/log, as upstream serves them with Go's
//! `http.FileServer` (a directory is an HTML listing), but never anything
//! outside that directory: `..` (encoded or not) is refused, and the file
//! actually opened is checked through /proc/self/fd, so a symlink that
//! leads out (or is swapped in between) is a 404.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path as FsPath, PathBuf};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};

use crate::server::ServerState;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

/// Upstream's root for `/logs/`.
pub const LOG_ROOT: &str = "/var/log";

/// Without `enableSystemLogHandler` upstream answers `/logs/` with a
/// refusal.
fn disabled() -> Response {
    crate::server::go_http_error(StatusCode::METHOD_NOT_ALLOWED, "logs endpoint is disabled.")
}

pub async fn root(State(s): State<ServerState>) -> Response {
    if !s.config.enable_system_log_handler {
        return disabled();
    }
    serve(PathBuf::from(LOG_ROOT), String::new()).await
}

pub async fn path(State(s): State<ServerState>, Path(rel): Path<String>) -> Response {
    if !s.config.enable_system_log_handler {
        return disabled();
    }
    serve(PathBuf::from(LOG_ROOT), rel).await
}

enum Found {
    Dir(Vec<(String, bool)>),
    File(std::fs::File),
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "404 page not found\n").into_response()
}

/// Resolves `rel` (already percent-decoded) under `root` and opens it,
/// refusing `..`, NULs and anything whose real path is not under the root.
fn open_beneath(root: &FsPath, rel: &str) -> Option<Found> {
    if rel.contains('\0') || rel.split('/').any(|c| c == "..") {
        return None;
    }
    let root = std::fs::canonicalize(root).ok()?;
    let target = root.join(rel.trim_start_matches('/'));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&target)
        .ok()?;
    // Where the opened file really is, whatever links led there.
    let real = std::fs::read_link(format!("/proc/self/fd/{}", {
        use std::os::fd::AsRawFd;
        file.as_raw_fd()
    }))
    .ok()?;
    if !real.starts_with(&root) {
        return None;
    }
    let meta = file.metadata().ok()?;
    if meta.is_dir() {
        let mut entries: Vec<(String, bool)> = std::fs::read_dir(&real)
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| {
                let dir = e.file_type().is_ok_and(|t| t.is_dir());
                (e.file_name().to_string_lossy().into_owned(), dir)
            })
            .collect();
        entries.sort();
        Some(Found::Dir(entries))
    } else if meta.is_file() {
        Some(Found::File(file))
    } else {
        // Devices, FIFOs and sockets are never read.
        None
    }
}

/// Go's html.EscapeString.
pub(crate) fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

fn href_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub async fn serve(root: PathBuf, rel: String) -> Response {
    let r = rel.clone();
    let found = tokio::task::spawn_blocking(move || open_beneath(&root, &r)).await;
    match found {
        Ok(Some(Found::Dir(entries))) => {
            // Go's FileServer listing.
            let mut body = String::from("<pre>\n");
            for (name, dir) in entries {
                let shown = if dir { format!("{name}/") } else { name };
                body.push_str(&format!(
                    "<a href=\"{}\">{}</a>\n",
                    href_escape(&shown),
                    html_escape(&shown)
                ));
            }
            body.push_str("</pre>\n");
            ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
        }
        Ok(Some(Found::File(mut f))) => {
            let (tx, rx) = mpsc::channel::<Bytes>(4);
            tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match f.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if tx.blocking_send(Bytes::copy_from_slice(&buf[..n])).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
            let body = Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
            }));
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
        }
        _ => not_found(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_files_beneath_the_root_are_served() {
        let base = std::env::temp_dir().join(format!("rkubelet-logs-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("log");
        std::fs::create_dir_all(root.join("pods")).unwrap();
        std::fs::write(root.join("syslog"), "hello\n").unwrap();
        std::fs::write(root.join("pods/a.log"), "pod\n").unwrap();
        std::fs::write(base.join("secret"), "no\n").unwrap();
        std::os::unix::fs::symlink(base.join("secret"), root.join("escape")).unwrap();
        std::os::unix::fs::symlink(root.join("pods/a.log"), root.join("inside")).unwrap();
        let body = |r: Response| async move {
            let code = r.status();
            let b = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
            (code, String::from_utf8_lossy(&b).into_owned())
        };
        let (c, b) = body(serve(root.clone(), "syslog".into()).await).await;
        assert_eq!((c, b.as_str()), (StatusCode::OK, "hello\n"));
        let (c, b) = body(serve(root.clone(), "inside".into()).await).await;
        assert_eq!(
            (c, b.as_str()),
            (StatusCode::OK, "pod\n"),
            "a link that stays inside"
        );
        let (c, b) = body(serve(root.clone(), String::new()).await).await;
        assert_eq!(c, StatusCode::OK);
        assert!(b.contains("<a href=\"pods/\">pods/</a>"), "{b}");
        for bad in [
            "../secret",
            "pods/../../secret",
            "escape",
            "/../secret",
            "a\0b",
        ] {
            let (c, _) = body(serve(root.clone(), bad.into()).await).await;
            assert_eq!(c, StatusCode::NOT_FOUND, "{bad:?}");
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}
