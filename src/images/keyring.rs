//! Registry credentials from a pod's imagePullSecrets (upstream
//! `pkg/credentialprovider` keyring.go and config.go, and
//! `credentialprovider/secrets` MakeDockerKeyring): which credentials to try
//! for an image, most specific registry path first.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine;
use k8s_openapi::api::core::v1::{Pod, Secret};
use serde_json::{Map, Value};

use crate::cri::v1;
use crate::objects::ObjectManager;

/// Docker Hub's key in the keyring, as `https://index.docker.io/v1/` and
/// `index.docker.io` both end up.
const DEFAULT_REGISTRY_KEY: &str = "index.docker.io";

#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    #[error("image pull secret {secret:?}: {source}")]
    Json {
        secret: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("image pull secret {secret:?}: {message}")]
    Entry { secret: String, message: String },
}

/// One registry login. Upstream's keyring carries only these two from a
/// docker config; the CRI's other auth fields stay empty.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credential {
    // Passwords stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Credential {
    pub fn auth_config(&self) -> v1::AuthConfig {
        v1::AuthConfig {
            username: self.username.clone(),
            password: self.password.clone(),
            ..Default::default()
        }
    }
}

/// Credentials by registry location (`host[:port][/path]`, the host may
/// hold `*` globs), looked up in reverse-sorted order so that
/// `quay.io/team` is tried before `quay.io`.
#[derive(Debug, Default)]
pub struct Keyring {
    index: Vec<String>,
    creds: HashMap<String, Vec<Credential>>,
}

/// A JSON object field, matched case-insensitively as Go's encoding/json
/// does.
fn field<'a>(m: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    m.get(name).or_else(|| {
        m.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

/// The `auths` map of a docker `config.json` document (empty when absent).
fn auths(doc: Value) -> Map<String, Value> {
    match doc {
        Value::Object(m) => match field(&m, "auths") {
            Some(Value::Object(a)) => a.clone(),
            _ => Map::new(),
        },
        _ => Map::new(),
    }
}

fn string_field(m: &Map<String, Value>, name: &str) -> Result<String, String> {
    match field(m, name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("{name}: expected a string, got {other}")),
    }
}

/// One docker config entry: username and password, or `auth`
/// (base64 `user:password`), which wins when set.
fn entry(v: &Value) -> Result<Credential, String> {
    let Value::Object(m) = v else {
        return Err(format!("expected an object, got {v}"));
    };
    let mut c = Credential {
        username: string_field(m, "username")?,
        password: string_field(m, "password")?,
    };
    let auth = string_field(m, "auth")?;
    if !auth.is_empty() {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(auth.as_bytes())
            .map_err(|e| e.to_string())?;
        let s = String::from_utf8_lossy(&raw);
        let (u, p) = s
            .split_once(':')
            .ok_or_else(|| "unable to parse auth field".to_string())?;
        c.username = u.to_string();
        c.password = p.to_string();
    }
    Ok(c)
}

/// The keyring key of a docker config location: scheme dropped, a `/v1/`
/// or `/v2/` path prefix means the registry itself (as the docker client
/// treats it). `None` for entries with no host.
fn location_key(loc: &str) -> Option<String> {
    let rest = loc
        .strip_prefix("https://")
        .or_else(|| loc.strip_prefix("http://"))
        .unwrap_or(loc);
    let (host, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if host.is_empty() {
        return None;
    }
    let path = if path.starts_with("/v1/") || path.starts_with("/v2/") {
        &path[3..]
    } else {
        path
    };
    Some(if path.is_empty() || path == "/" {
        host.to_string()
    } else {
        format!("{host}{path}")
    })
}

impl Keyring {
    /// The keyring of a pod's pull secrets: `kubernetes.io/dockerconfigjson`
    /// (`.dockerconfigjson`, `{"auths": {...}}`) and `kubernetes.io/dockercfg`
    /// (`.dockercfg`, the bare map); other types are ignored. A malformed
    /// one fails, as upstream's MakeDockerKeyring does (the pull then fails).
    pub fn from_secrets(secrets: &[Arc<Secret>]) -> Result<Keyring, KeyringError> {
        let mut k = Keyring::default();
        for s in secrets {
            let name = s.metadata.name.clone().unwrap_or_default();
            let data = |key: &str| {
                s.data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|b| b.0.as_slice())
                    .filter(|b| !b.is_empty())
            };
            let json_err = |source| KeyringError::Json {
                secret: name.clone(),
                source,
            };
            let entries = match (
                s.type_.as_deref(),
                data(".dockerconfigjson"),
                data(".dockercfg"),
            ) {
                (Some("kubernetes.io/dockerconfigjson"), Some(b), _) => {
                    auths(serde_json::from_slice::<Value>(b).map_err(json_err)?)
                }
                (Some("kubernetes.io/dockercfg"), _, Some(b)) => {
                    serde_json::from_slice::<Map<String, Value>>(b).map_err(json_err)?
                }
                _ => continue,
            };
            k.add(&entries, &name)
                .map_err(|message| KeyringError::Entry {
                    secret: name.clone(),
                    message,
                })?;
        }
        k.finish();
        Ok(k)
    }

    /// Adds the entries of one docker config (location → login); `source`
    /// names it in logs.
    fn add(&mut self, entries: &Map<String, Value>, source: &str) -> Result<(), String> {
        for (loc, v) in entries {
            let cred = entry(v).map_err(|message| format!("{loc}: {message}"))?;
            self.insert(loc, cred, source);
        }
        Ok(())
    }

    /// Adds one login for a docker config location (credential provider
    /// plugins' `auth` keys are read as docker config locations upstream);
    /// [`Keyring::finish`] must follow before lookups.
    pub(crate) fn insert(&mut self, loc: &str, cred: Credential, source: &str) {
        let Some(key) = location_key(loc) else {
            tracing::warn!(source, entry = %loc, "docker config entry without a registry host, ignoring");
            return;
        };
        self.creds.entry(key.clone()).or_default().push(cred);
        self.index.push(key);
    }

    /// Sorts the index for lookups, most specific location first.
    pub(crate) fn finish(&mut self) {
        self.index.sort();
        self.index.dedup();
        self.index.reverse();
    }

    /// The credentials to try, in order, for a repository as
    /// [`repo_to_pull`] gives it; empty for an anonymous pull.
    pub fn lookup(&self, repo: &str) -> Vec<Credential> {
        let mut out = Vec::new();
        for k in &self.index {
            if urls_match(k, repo) {
                out.extend(self.creds[k].iter().cloned());
            }
        }
        if out.is_empty() && is_default_registry(repo) {
            if let Some(c) = self.creds.get(DEFAULT_REGISTRY_KEY) {
                out.extend(c.iter().cloned());
            }
        }
        out
    }
}

/// How long the node's docker config files are trusted before they are
/// read again (upstream's default provider caches for 5 minutes).
const NODE_CREDENTIALS_LIFETIME: std::time::Duration = std::time::Duration::from_secs(300);

/// Node-wide registry logins from docker config files (upstream's default
/// `.dockercfg` provider): the first `config.json` that reads and parses in
/// the kubelet's root dir, the working directory, `$HOME/.docker` and
/// `/.docker`; failing that, the first legacy `.dockercfg` in the root
/// dir, the working directory, `$HOME` and `/`. Tried after the pod's own
/// pull secrets.
pub struct NodeCredentials {
    json_paths: Vec<std::path::PathBuf>,
    legacy_paths: Vec<std::path::PathBuf>,
    cached: parking_lot::Mutex<Option<(tokio::time::Instant, Arc<Keyring>)>>,
}

impl NodeCredentials {
    /// Upstream's search order, with `root_dir` as the preferred path.
    pub fn new(root_dir: &std::path::Path) -> Self {
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
        let cwd = std::path::PathBuf::new();
        let mut json = vec![root_dir.to_path_buf(), cwd.clone()];
        let mut legacy = vec![root_dir.to_path_buf(), cwd];
        if let Some(h) = &home {
            json.push(h.join(".docker"));
            legacy.push(h.clone());
        }
        json.push("/.docker".into());
        legacy.push("/".into());
        Self::with_paths(
            json.into_iter().map(|d| d.join("config.json")).collect(),
            legacy.into_iter().map(|d| d.join(".dockercfg")).collect(),
        )
    }

    /// Files to search, in order: docker `config.json`s, then legacy
    /// `.dockercfg`s.
    pub fn with_paths(json: Vec<std::path::PathBuf>, legacy: Vec<std::path::PathBuf>) -> Self {
        NodeCredentials {
            json_paths: json,
            legacy_paths: legacy,
            cached: parking_lot::Mutex::new(None),
        }
    }

    /// The node's keyring, read again when older than 5 minutes.
    pub async fn keyring(&self) -> Arc<Keyring> {
        let now = tokio::time::Instant::now();
        if let Some((at, k)) = self.cached.lock().as_ref() {
            if now.duration_since(*at) < NODE_CREDENTIALS_LIFETIME {
                return k.clone();
            }
        }
        let k = Arc::new(self.read().await);
        *self.cached.lock() = Some((now, k.clone()));
        k
    }

    async fn read(&self) -> Keyring {
        // A docker config file is small; anything huge is not one.
        const MAX_BYTES: u64 = 1 << 20;
        let candidates = self
            .json_paths
            .iter()
            .map(|p| (p, true))
            .chain(self.legacy_paths.iter().map(|p| (p, false)));
        for (path, json) in candidates {
            let Ok(meta) = tokio::fs::metadata(path).await else {
                continue;
            };
            if !meta.is_file() || meta.len() > MAX_BYTES {
                continue;
            }
            let Ok(bytes) = tokio::fs::read(path).await else {
                continue;
            };
            let entries = if json {
                match serde_json::from_slice::<Value>(&bytes) {
                    Ok(v @ Value::Object(_)) => auths(v),
                    _ => continue,
                }
            } else {
                match serde_json::from_slice::<Map<String, Value>>(&bytes) {
                    Ok(m) => m,
                    Err(_) => continue,
                }
            };
            let source = path.display().to_string();
            let mut k = Keyring::default();
            match k.add(&entries, &source) {
                Ok(()) => {
                    k.finish();
                    tracing::debug!(path = %source, registries = k.index.len(), "node registry credentials read");
                    return k;
                }
                Err(e) => {
                    tracing::warn!(path = %source, error = %e, "docker config file not usable, ignoring");
                }
            }
        }
        Keyring::default()
    }
}

/// The repository an image pulls from, without tag or digest, normalised
/// as docker references are (`busybox:1` → `docker.io/library/busybox`).
pub fn repo_to_pull(image: &str) -> String {
    let full = super::normalize_image(image);
    let name = full.split('@').next().unwrap_or_default();
    match name.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo.to_string(),
        _ => name.to_string(),
    }
}

/// Whether the repository is on Docker Hub: no registry host in front, or
/// docker.io's own names (upstream isDefaultRegistryMatch).
fn is_default_registry(repo: &str) -> bool {
    let first = repo.split('/').next().unwrap_or_default();
    if first.is_empty() {
        return false;
    }
    if !repo.contains('/') || first == "docker.io" || first == "index.docker.io" {
        return true;
    }
    !first.contains(['.', ':'])
}

/// `host[:port]` and path of a scheme-less location.
fn split_location(s: &str) -> (&str, &str, &str) {
    let (authority, path) = match s.find('/') {
        Some(i) => s.split_at(i),
        None => (s, ""),
    };
    // Go's net.SplitHostPort: one colon, or a bracketed IPv6 address.
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        match rest.split_once("]:") {
            Some((h, p)) => (h, p),
            None => (authority, ""),
        }
    } else if authority.matches(':').count() == 1 {
        authority.split_once(':').unwrap_or((authority, ""))
    } else {
        (authority, "")
    };
    (host, port, path)
}

/// Upstream URLsMatch: same port, same number of host labels each
/// matching the glob's label (`*.example.com`), and the glob's path a
/// prefix of the target's.
pub(crate) fn urls_match(glob: &str, target: &str) -> bool {
    let (gh, gp, gpath) = split_location(glob);
    let (th, tp, tpath) = split_location(target);
    if gp != tp || !tpath.starts_with(gpath) {
        return false;
    }
    let (g, t): (Vec<&str>, Vec<&str>) = (gh.split('.').collect(), th.split('.').collect());
    g.len() == t.len()
        && g.iter()
            .zip(&t)
            .all(|(g, t)| glob_match(g.as_bytes(), t.as_bytes()).unwrap_or(false))
}

/// Go's filepath.Match for one host label: `*`, `?`, `[...]` classes
/// (with `^` negation and ranges) and `\` escapes; `None` for a malformed
/// pattern, which upstream treats as no match.
fn glob_match(p: &[u8], s: &[u8]) -> Option<bool> {
    match p.first() {
        None => Some(s.is_empty()),
        Some(b'*') => {
            let rest = &p[1..];
            for i in 0..=s.len() {
                if glob_match(rest, &s[i..])? {
                    return Some(true);
                }
            }
            Some(false)
        }
        Some(b'?') => match s.first() {
            Some(_) => glob_match(&p[1..], &s[1..]),
            None => Some(false),
        },
        Some(b'[') => {
            let (matched, used) = class(&p[1..], *s.first()?)?;
            if matched {
                glob_match(&p[1 + used..], &s[1..])
            } else {
                Some(false)
            }
        }
        Some(b'\\') => {
            let c = *p.get(1)?;
            if s.first() == Some(&c) {
                glob_match(&p[2..], &s[1..])
            } else {
                Some(false)
            }
        }
        Some(&c) => {
            if s.first() == Some(&c) {
                glob_match(&p[1..], &s[1..])
            } else {
                Some(false)
            }
        }
    }
}

/// A `[...]` class after its `[`: whether `c` is in it, and how many
/// pattern bytes it took (through the `]`).
fn class(p: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut i = 0;
    let negate = p.first() == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    loop {
        let b = *p.get(i)?;
        if b == b']' && !first {
            return Some((hit != negate, i + 1));
        }
        first = false;
        let lo = if b == b'\\' {
            i += 1;
            *p.get(i)?
        } else {
            b
        };
        i += 1;
        let hi = if p.get(i) == Some(&b'-') && p.get(i + 1).is_some_and(|&n| n != b']') {
            i += 1;
            let mut h = *p.get(i)?;
            if h == b'\\' {
                i += 1;
                h = *p.get(i)?;
            }
            i += 1;
            h
        } else {
            lo
        };
        if lo <= c && c <= hi {
            hit = true;
        }
    }
}

/// The pod's imagePullSecrets as they can be read; missing ones are left
/// out with a warning and one FailedToRetrieveImagePullSecret event, as
/// upstream does (the pull may still work anonymously).
pub async fn fetch_pull_secrets(objects: &ObjectManager, pod: &Pod) -> Vec<Arc<Secret>> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let names: Vec<&str> = pod
        .spec
        .as_ref()
        .and_then(|s| s.image_pull_secrets.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.name.as_str())
        // The API once let empty names through; upstream ignores them.
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() {
        return Vec::new();
    }
    let got = futures::future::join_all(names.iter().map(|n| objects.secret(ns, n))).await;
    let mut secrets = Vec::new();
    let mut failed = Vec::new();
    for (name, r) in names.iter().zip(got) {
        match r {
            Ok(s) => secrets.push(s),
            Err(e) => {
                tracing::warn!(
                    pod = pod.metadata.name.as_deref().unwrap_or_default(),
                    namespace = ns,
                    secret = name,
                    error = %e,
                    "unable to retrieve pull secret, the image pull may not succeed"
                );
                failed.push(*name);
            }
        }
    }
    if !failed.is_empty() {
        crate::events::pod(
            pod,
            None,
            crate::events::WARNING,
            "FailedToRetrieveImagePullSecret",
            format!(
                "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                failed.join(", ")
            ),
        );
    }
    secrets
}

#[cfg(test)]
pub(crate) fn test_pull_secret(name: &str, type_: &str, key: &str, json: &str) -> Arc<Secret> {
    let mut s = Secret {
        type_: Some(type_.into()),
        data: Some(
            [(
                key.to_string(),
                k8s_openapi::ByteString(json.as_bytes().to_vec()),
            )]
            .into(),
        ),
        ..Default::default()
    };
    s.metadata.name = Some(name.into());
    Arc::new(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn users(k: &Keyring, image: &str) -> Vec<String> {
        k.lookup(&repo_to_pull(image))
            .into_iter()
            .map(|c| c.username)
            .collect()
    }

    #[test]
    fn both_secret_types_parse_and_auth_wins_over_username() {
        let json = format!(
            r#"{{"auths": {{"reg.example.com": {{"username": "u", "password": "p", "auth": "{}"}}}}}}"#,
            b64("alice:s3:cret")
        );
        let cfg = r#"{"https://old.example.com": {"Username": "bob", "Password": "pw"}}"#;
        let k = Keyring::from_secrets(&[
            test_pull_secret(
                "a",
                "kubernetes.io/dockerconfigjson",
                ".dockerconfigjson",
                &json,
            ),
            test_pull_secret("b", "kubernetes.io/dockercfg", ".dockercfg", cfg),
            // Wrong type for its key: ignored.
            test_pull_secret("c", "Opaque", ".dockerconfigjson", &json),
        ])
        .unwrap();
        assert_eq!(
            k.lookup("reg.example.com/app"),
            vec![Credential {
                username: "alice".into(),
                password: "s3:cret".into()
            }]
        );
        assert_eq!(users(&k, "old.example.com/x/y:1"), ["bob"]);
        assert!(users(&k, "other.example.com/app").is_empty());

        let bad = format!(
            r#"{{"auths": {{"r.io": {{"auth": "{}"}}}}}}"#,
            b64("nocolon")
        );
        let e = Keyring::from_secrets(&[test_pull_secret(
            "bad",
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            &bad,
        )])
        .unwrap_err();
        assert!(e.to_string().contains("unable to parse auth field"), "{e}");
        assert!(Keyring::from_secrets(&[test_pull_secret(
            "bad",
            "kubernetes.io/dockercfg",
            ".dockercfg",
            "{not json"
        )])
        .is_err());
    }

    #[test]
    fn lookup_matches_hosts_paths_globs_and_docker_hub_most_specific_first() {
        let json = r#"{"auths": {
            "quay.io": {"username": "host"},
            "quay.io/team": {"username": "team"},
            "https://quay.io/v2/other": {"username": "other"},
            "*.example.com": {"username": "wild"},
            "reg.local:5000": {"username": "port"},
            "https://index.docker.io/v1/": {"username": "hub"}
        }}"#;
        let k = Keyring::from_secrets(&[test_pull_secret(
            "s",
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            json,
        )])
        .unwrap();
        assert_eq!(users(&k, "quay.io/team/app:1"), ["team", "host"]);
        assert_eq!(users(&k, "quay.io/other/app"), ["other", "host"]);
        assert_eq!(users(&k, "quay.io/solo/app"), ["host"]);
        assert_eq!(users(&k, "a.example.com/x"), ["wild"]);
        // A glob covers one label only.
        assert!(users(&k, "a.b.example.com/x").is_empty());
        assert_eq!(users(&k, "reg.local:5000/x"), ["port"]);
        assert!(users(&k, "reg.local/x").is_empty());
        for hub in [
            "busybox",
            "library/busybox:1",
            "team/app",
            "docker.io/team/app",
        ] {
            assert_eq!(users(&k, hub), ["hub"], "{hub}");
        }
        assert!(users(&k, "localhost:5000/x").is_empty());
    }

    #[test]
    fn globs_follow_go_filepath_match() {
        let m = |p: &str, s: &str| glob_match(p.as_bytes(), s.as_bytes());
        assert_eq!(m("*", "abc"), Some(true));
        assert_eq!(m("a?c", "abc"), Some(true));
        assert_eq!(m("reg[0-9]", "reg7"), Some(true));
        assert_eq!(m("reg[^0-9]", "reg7"), Some(false));
        assert_eq!(m("a*", "b"), Some(false));
        assert_eq!(m("[a", "a"), None);
        assert!(repo_to_pull("registry.k8s.io/pause:3.10") == "registry.k8s.io/pause");
        assert_eq!(
            repo_to_pull("busybox@sha256:ab"),
            "docker.io/library/busybox"
        );
    }
}
