//! The first step of every request, as Go's `http.ServeMux` takes it in
//! front of upstream's handlers: a path no handler is registered under is
//! `404 page not found` before any authentication; a subtree's root named
//! without its slash (`/logs`, `/stats`, `/runningpods`) and an unclean
//! path (`//`, `.`, `..`) are redirected (301). Only then do the
//! authentication filter and the handlers see the request, so the
//! filter's checks are made on the path that is served.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The patterns registered on one server: exact paths, and subtrees
/// (ending in `/`) that match every path beneath them.
#[derive(Debug, Default, Clone)]
pub struct GoMux {
    exact: HashSet<String>,
    subtrees: Vec<String>,
}

/// What the mux does with a path.
#[derive(Debug, PartialEq, Eq)]
pub enum Routed {
    /// A handler is registered for it.
    Handled,
    /// 301 to this path.
    Redirect(String),
    /// Go's `404 page not found`.
    NotFound,
}

/// The `/healthz/<check>` paths (upstream's three checks, then rkubelet's
/// own: see `health_checks`).
const HEALTH_CHECKS: [&str; 5] = ["ping", "log", "syncloop", "pleg", "runtime"];

impl GoMux {
    fn exact<S: Into<String>>(mut self, paths: impl IntoIterator<Item = S>) -> Self {
        self.exact.extend(paths.into_iter().map(Into::into));
        self
    }

    fn subtrees<S: Into<String>>(mut self, paths: impl IntoIterator<Item = S>) -> Self {
        self.subtrees.extend(paths.into_iter().map(Into::into));
        self
    }

    /// go-restful registers a web service rooted at `/x` both as `/x` and
    /// as the subtree `/x/`.
    fn services(self, roots: &[&str]) -> Self {
        self.exact(roots.iter().copied())
            .subtrees(roots.iter().map(|r| format!("{r}/")))
    }

    /// `/healthz` and its checks.
    fn health(self) -> Self {
        self.exact(["/healthz"])
            .exact(HEALTH_CHECKS.iter().map(|c| format!("/healthz/{c}")))
    }

    /// Upstream's default handlers (both the authenticated and the
    /// read-only port).
    fn defaults(cfg: &crate::config::KubeletConfiguration) -> Self {
        let mux = GoMux::default()
            .health()
            .services(&["/pods"])
            .subtrees(["/stats/"])
            .exact([
                "/metrics",
                "/metrics/cadvisor",
                "/metrics/resource",
                "/metrics/probes",
                "/metrics/slis",
            ]);
        if cfg.feature_gate("ContainerCheckpoint") {
            mux.subtrees(["/checkpoint/"])
        } else {
            mux
        }
    }

    /// Where the debugging handlers are not served, upstream refuses under
    /// their prefixes (405).
    fn debugging_disabled(self) -> Self {
        self.subtrees(super::DEBUG_PREFIXES)
    }

    /// The authenticated port's patterns.
    pub fn api(cfg: &crate::config::KubeletConfiguration) -> Self {
        let mux = Self::defaults(cfg);
        if !cfg.enable_debugging_handlers {
            return mux.debugging_disabled();
        }
        mux.services(&["/run", "/exec", "/attach", "/portForward", "/containerLogs"])
            .subtrees(["/logs/", "/runningpods/", "/debug/pprof/", "/debug/pods/"])
            .exact(["/configz", "/debug/flags/v"])
    }

    /// The read-only port's patterns.
    pub fn read_only(cfg: &crate::config::KubeletConfiguration) -> Self {
        Self::defaults(cfg).debugging_disabled()
    }

    /// The healthz port's patterns.
    pub fn healthz() -> Self {
        GoMux::default().health()
    }

    /// Go's ServeMux on the request's path (`raw`, percent-decoded as
    /// Go's URL.Path is): an exact pattern, else the longest subtree; a
    /// subtree root without its slash is redirected to it; an unclean
    /// path is redirected to its clean form first.
    pub fn route(&self, raw: &str) -> Routed {
        let decoded = percent_encoding::percent_decode_str(raw).decode_utf8_lossy();
        let path = decoded.as_ref();
        let clean = clean_path(path);
        if clean != path {
            return Routed::Redirect(escape_path(&clean));
        }
        if self.exact.contains(path) || self.subtrees.iter().any(|t| path.starts_with(t.as_str())) {
            return Routed::Handled;
        }
        let with_slash = format!("{path}/");
        if self.subtrees.contains(&with_slash) {
            return Routed::Redirect(escape_path(&with_slash));
        }
        Routed::NotFound
    }
}

/// A decoded path as a URL carries it (Go's EscapedPath).
fn escape_path(p: &str) -> String {
    const PATH: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
        .add(b' ')
        .add(b'"')
        .add(b'#')
        .add(b'%')
        .add(b'<')
        .add(b'>')
        .add(b'?')
        .add(b'`')
        .add(b'{')
        .add(b'}');
    percent_encoding::utf8_percent_encode(p, PATH).to_string()
}

/// Go's cleanPath: `.` and `..` resolved, repeated slashes joined, a
/// trailing slash kept.
pub fn clean_path(p: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    let mut clean = format!("/{}", out.join("/"));
    if p.ends_with('/') && clean != "/" {
        clean.push('/');
    }
    clean
}

/// The middleware in front of a server's router.
pub async fn filter(State(mux): State<Arc<GoMux>>, req: Request, next: Next) -> Response {
    match mux.route(req.uri().path()) {
        Routed::Handled => next.run(req).await,
        Routed::NotFound => super::go_http_error(StatusCode::NOT_FOUND, "404 page not found"),
        Routed::Redirect(to) => {
            let location = match req.uri().query() {
                Some(q) => format!("{to}?{q}"),
                None => to,
            };
            // http.Redirect: a short HTML note for GET and HEAD only.
            let body = if matches!(*req.method(), Method::GET | Method::HEAD) {
                format!(
                    "<a href=\"{}\">Moved Permanently</a>.\n\n",
                    crate::logs::files::html_escape(&location)
                )
            } else {
                String::new()
            };
            let html = !body.is_empty();
            let mut r = (StatusCode::MOVED_PERMANENTLY, body).into_response();
            if let Ok(v) = location.parse() {
                r.headers_mut().insert(header::LOCATION, v);
            }
            if html {
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static("text/html; charset=utf-8"),
                );
            }
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::kubelet_config as cfg;

    /// Go's ServeMux in front of upstream's handlers.
    #[test]
    fn paths_are_routed_as_go_serve_mux() {
        let api = GoMux::api(&cfg("enableDebuggingHandlers: true\n"));
        for p in [
            "/pods",
            "/pods/",
            "/stats/summary",
            "/metrics/cadvisor",
            "/healthz",
            "/healthz/syncloop",
            "/logs/syslog",
            "/containerLogs/ns/p/c",
            "/exec/ns/p/c",
            "/runningpods/",
            "/configz",
            "/debug/pods/ns/p",
            "/checkpoint/ns/p/c",
            "/%70ods",
        ] {
            assert_eq!(api.route(p), Routed::Handled, "{p}");
        }
        for p in [
            "/",
            "/spec",
            "/spec/",
            "/metrics/foo",
            "/healthz/foo",
            "/configz/x",
        ] {
            assert_eq!(api.route(p), Routed::NotFound, "{p}");
        }
        for (p, to) in [
            ("/logs", "/logs/"),
            ("/stats", "/stats/"),
            ("/runningpods", "/runningpods/"),
            ("/pods/../stats/summary", "/stats/summary"),
            ("//pods", "/pods"),
            ("/logs/./syslog", "/logs/syslog"),
            ("/logs/..", "/"),
            // Decoded first, as Go's URL.Path.
            ("/logs/%2e%2e/etc/passwd", "/etc/passwd"),
            ("/logs/..%2Fsecret", "/secret"),
            ("/pods/../a%20b", "/a%20b"),
        ] {
            assert_eq!(api.route(p), Routed::Redirect(to.into()), "{p}");
        }
        // The debugging handlers' places refuse on the read-only port, and
        // the rest of them is not there.
        let ro = GoMux::read_only(&cfg(""));
        assert_eq!(ro.route("/exec/ns/p/c"), Routed::Handled);
        assert_eq!(ro.route("/configz"), Routed::NotFound);
        let off = cfg("featureGates:\n  ContainerCheckpoint: false\n");
        assert_eq!(
            GoMux::api(&off).route("/checkpoint/a/b/c"),
            Routed::NotFound
        );
        assert_eq!(GoMux::healthz().route("/pods"), Routed::NotFound);
    }

    #[test]
    fn paths_are_cleaned_as_go() {
        for (p, want) in [
            ("/", "/"),
            ("/a/b", "/a/b"),
            ("/a/b/", "/a/b/"),
            ("/a//b", "/a/b"),
            ("/a/./b/", "/a/b/"),
            ("/a/../../b", "/b"),
            ("/a/b/..", "/a"),
            ("/a/b/.", "/a/b"),
            ("/..", "/"),
        ] {
            assert_eq!(clean_path(p), want, "{p}");
        }
    }
}
