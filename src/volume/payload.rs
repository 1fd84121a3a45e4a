//! The files of configMap, secret, downwardAPI and projected volumes
//! (upstream `pkg/volume/configmap`, `secret`, `downwardapi`, `projected`
//! MakePayload/CollectData and `pkg/fieldpath`). The builders are pure; only
//! `build` talks to the object manager. `atomic_writer::write` puts the
//! result on disk.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, ProjectedVolumeSource, Secret,
    ServiceAccountTokenProjection, Volume,
};

use crate::kuberuntime::RuntimeOptions;
use crate::objects::podcert::{Credentials, PodCertError};
use crate::objects::trustbundle::TrustBundleError;
use crate::objects::{ObjectError, ObjectManager, Token};

/// The API's default for every `defaultMode` (420 in decimal).
pub const DEFAULT_MODE: u32 = 0o644;
/// A token's lifetime when the projection names none (the API default).
pub const DEFAULT_TOKEN_EXPIRATION_SECONDS: i64 = 3600;

/// One file of a volume: its bytes and permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Relative path inside the volume → file.
pub type Payload = BTreeMap<String, FileProjection>;

/// A volume's files and when they must be rebuilt regardless of API changes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Built {
    pub files: Payload,
    /// The earliest `Token::refresh_at` or pod certificate `recheck_at`
    /// (unix seconds) of what is in it.
    pub refresh_at: Option<i64>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum PayloadError {
    /// A fetch that failed, e.g. `configmap "x" not found`.
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error("configmap references non-existent config key: {0}")]
    MissingConfigMapKey(String),
    #[error("references non-existent secret key: {0}")]
    MissingSecretKey(String),
    /// A downward-API fieldRef upstream's fieldpath package refuses.
    #[error("{0}")]
    FieldPath(String),
    /// A resourceFieldRef naming no container of the pod or an unknown resource.
    #[error("{0}")]
    ResourceField(String),
    /// A clusterTrustBundle source the manager could not serve, in its words.
    #[error(transparent)]
    TrustBundle(#[from] TrustBundleError),
    /// A podCertificate source the manager could not serve (not issued
    /// yet, denied, ...), in its words.
    #[error(transparent)]
    PodCertificate(#[from] PodCertError),
    #[error("volume {0:?} is not a configMap, secret, downwardAPI or projected volume")]
    UnsupportedVolume(String),
    /// Several errors, shown as upstream's utilerrors aggregate:
    /// `[first, second]`, duplicates once.
    #[error("{}", format_aggregate(.0))]
    Aggregate(Vec<PayloadError>),
}

fn format_aggregate(errs: &[PayloadError]) -> String {
    let mut seen: Vec<String> = Vec::new();
    for e in errs {
        let m = e.to_string();
        if !seen.contains(&m) {
            seen.push(m);
        }
    }
    if seen.len() == 1 {
        return seen.remove(0);
    }
    format!("[{}]", seen.join(", "))
}

/// Upstream's NewAggregate: nothing → Ok, one error → itself, more → all
/// of them (nested aggregates flattened, as Go's visit does).
fn aggregate(errs: Vec<PayloadError>) -> Result<(), PayloadError> {
    let mut flat = Vec::with_capacity(errs.len());
    for e in errs {
        match e {
            PayloadError::Aggregate(inner) => flat.extend(inner),
            other => flat.push(other),
        }
    }
    match flat.len() {
        0 => Ok(()),
        1 => Err(flat.remove(0)),
        _ => Err(PayloadError::Aggregate(flat)),
    }
}

/// API modes are int32 bounded to 0777 by validation; masking keeps a
/// malformed static pod from passing file-type bits to chmod.
fn mode_of(m: Option<i32>, default: u32) -> u32 {
    m.map(|m| m as u32 & 0o7777).unwrap_or(default)
}

/// A fetched object as the plugins use it: a missing optional object reads
/// as an empty one (`None`), any other failure is the volume's error.
pub fn present<T>(
    fetched: Result<Arc<T>, ObjectError>,
    optional: bool,
) -> Result<Option<Arc<T>>, PayloadError> {
    match fetched {
        Ok(o) => Ok(Some(o)),
        Err(e) if e.is_not_found() && optional => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// configmap.MakePayload: every key of `data` and `binaryData` when no items,
/// else the items' keys at the items' paths. `cm` None is an empty object.
pub fn config_map_payload(
    items: &[KeyToPath],
    cm: Option<&ConfigMap>,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, PayloadError> {
    let empty = BTreeMap::new();
    let data = cm.and_then(|c| c.data.as_ref()).unwrap_or(&empty);
    let empty_bin = BTreeMap::new();
    let binary = cm
        .and_then(|c| c.binary_data.as_ref())
        .unwrap_or(&empty_bin);
    let mut out = Payload::new();
    if items.is_empty() {
        let text = data.iter().map(|(k, v)| (k, v.as_bytes()));
        for (k, v) in text.chain(binary.iter().map(|(k, v)| (k, v.0.as_slice()))) {
            out.insert(
                k.clone(),
                FileProjection {
                    data: v.to_vec(),
                    mode: default_mode,
                },
            );
        }
        return Ok(out);
    }
    for item in items {
        let bytes = match (data.get(&item.key), binary.get(&item.key)) {
            (Some(s), _) => s.as_bytes(),
            (None, Some(b)) => b.0.as_slice(),
            (None, None) if optional => continue,
            (None, None) => return Err(PayloadError::MissingConfigMapKey(item.key.clone())),
        };
        out.insert(
            item.path.clone(),
            FileProjection {
                data: bytes.to_vec(),
                mode: mode_of(item.mode, default_mode),
            },
        );
    }
    Ok(out)
}

/// secret.MakePayload: as for ConfigMaps, from the (decoded) `data`.
pub fn secret_payload(
    items: &[KeyToPath],
    secret: Option<&Secret>,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, PayloadError> {
    let empty = BTreeMap::new();
    let data = secret.and_then(|s| s.data.as_ref()).unwrap_or(&empty);
    let mut out = Payload::new();
    if items.is_empty() {
        for (k, v) in data {
            out.insert(
                k.clone(),
                FileProjection {
                    data: v.0.clone(),
                    mode: default_mode,
                },
            );
        }
        return Ok(out);
    }
    for item in items {
        let Some(v) = data.get(&item.key) else {
            if optional {
                continue;
            }
            return Err(PayloadError::MissingSecretKey(item.key.clone()));
        };
        out.insert(
            item.path.clone(),
            FileProjection {
                data: v.0.clone(),
                mode: mode_of(item.mode, default_mode),
            },
        );
    }
    Ok(out)
}

/// downwardapi.CollectData: each item's fieldRef or resourceFieldRef value
/// at its (cleaned) path; every failing item is reported, together.
pub fn downward_api_payload(
    items: &[DownwardAPIVolumeFile],
    pod: &Pod,
    opts: &RuntimeOptions,
    default_mode: u32,
) -> Result<Payload, PayloadError> {
    let mut out = Payload::new();
    let mut errs = Vec::new();
    for item in items {
        let value = if let Some(fr) = &item.field_ref {
            field_path_value(pod, &fr.field_path)
        } else if let Some(rr) = &item.resource_field_ref {
            let name = rr.container_name.as_deref().unwrap_or_default();
            resource_field_value(pod, opts, name, &rr.resource, rr.divisor.as_ref())
        } else {
            Ok(String::new())
        };
        match value {
            Ok(v) => {
                out.insert(
                    clean_path(&item.path),
                    FileProjection {
                        data: v.into_bytes(),
                        mode: mode_of(item.mode, default_mode),
                    },
                );
            }
            Err(e) => errs.push(e),
        }
    }
    aggregate(errs).map(|()| out)
}

/// Go's filepath.Clean for the relative paths the API admits (`..` elements
/// are left for the atomic writer to refuse).
fn clean_path(p: &str) -> String {
    let parts: Vec<&str> = p
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    if parts.is_empty() {
        return ".".into();
    }
    let joined = parts.join("/");
    if p.starts_with('/') {
        format!("/{joined}")
    } else {
        joined
    }
}

fn resource_field_value(
    pod: &Pod,
    opts: &RuntimeOptions,
    container: &str,
    resource: &str,
    divisor: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> Result<String, PayloadError> {
    let spec = pod.spec.as_ref();
    let c = spec
        .into_iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .find(|c| c.name == container)
        .ok_or_else(|| PayloadError::ResourceField(format!("container {container} not found")))?;
    crate::kuberuntime::container::resource_ref(
        opts,
        pod,
        c,
        resource,
        divisor.map(|q| q.0.as_str()),
    )
    .ok_or_else(|| {
        PayloadError::ResourceField(format!("unsupported container resource : {resource}"))
    })
}

/// fieldpath.ExtractFieldPathAsString for a pod: the metadata fields a
/// downwardAPI volume may show, whole label/annotation maps as FormatMap.
pub fn field_path_value(pod: &Pod, field_path: &str) -> Result<String, PayloadError> {
    let m = &pod.metadata;
    let empty = BTreeMap::new();
    let labels = m.labels.as_ref().unwrap_or(&empty);
    let annotations = m.annotations.as_ref().unwrap_or(&empty);
    if let Some((path, key)) = split_subscript(field_path) {
        let invalid = |errs: Vec<String>| {
            PayloadError::FieldPath(format!(
                "invalid key subscript in {field_path}: {}",
                errs.join(";")
            ))
        };
        return match path {
            "metadata.annotations" => {
                // Annotation keys are checked case-insensitively upstream.
                let errs = qualified_name_errors(&key.to_lowercase());
                if !errs.is_empty() {
                    return Err(invalid(errs));
                }
                Ok(annotations.get(key).cloned().unwrap_or_default())
            }
            "metadata.labels" => {
                let errs = qualified_name_errors(key);
                if !errs.is_empty() {
                    return Err(invalid(errs));
                }
                Ok(labels.get(key).cloned().unwrap_or_default())
            }
            _ => Err(PayloadError::FieldPath(format!(
                "fieldPath {field_path:?} does not support subscript"
            ))),
        };
    }
    Ok(match field_path {
        "metadata.annotations" => format_map(annotations),
        "metadata.labels" => format_map(labels),
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        _ => {
            return Err(PayloadError::FieldPath(format!(
                "unsupported fieldPath: {field_path}"
            )))
        }
    })
}

/// fieldpath.SplitMaybeSubscriptedPath: `a.b['k']` → (`a.b`, `k`).
fn split_subscript(p: &str) -> Option<(&str, &str)> {
    let inner = p.strip_suffix("']")?;
    let (path, key) = inner.split_once("['")?;
    (!path.is_empty()).then_some((path, key))
}

/// fieldpath.FormatMap: `key="value"` lines sorted by key, values quoted as
/// Go's %q, no trailing newline.
pub fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Go's strconv.Quote. Printable characters are kept; Go's unicode.IsPrint
/// is approximated by "not a control, a non-ASCII space or a common format
/// character", which covers what annotations carry in practice.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\x7f' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if is_go_printable(c) => out.push(c),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

fn is_go_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    let format_char = matches!(c as u32,
        0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e | 0x200b..=0x200f
        | 0x202a..=0x202e | 0x2060..=0x2064 | 0x2066..=0x206f | 0xfeff | 0xfff9..=0xfffb
        | 0xe000..=0xf8ff);
    !(c.is_control() || c.is_whitespace() || format_char)
}

/// validation.IsQualifiedName: `[prefix/]name`, the name 1-63 alphanumerics
/// with `-_.` inside, the prefix a DNS-1123 subdomain.
fn qualified_name_errors(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = v.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else if !is_dns1123_subdomain(prefix) {
                errs.push(
                    "prefix part a lowercase RFC 1123 subdomain must consist of lower case \
                     alphanumeric characters, '-' or '.', and must start and end with an \
                     alphanumeric character"
                        .to_string(),
                );
            }
            *name
        }
        _ => {
            errs.push(
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', \
                 and must start and end with an alphanumeric character, with an optional \
                 DNS subdomain prefix and '/'"
                    .to_string(),
            );
            return errs;
        }
    };
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".into());
    } else if !name.chars().all(ok_char)
        || !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        errs.push(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must \
             start and end with an alphanumeric character"
                .into(),
        );
    }
    errs
}

fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// The TokenRequest a serviceAccountToken projection asks for: its audience
/// (none → the API server's), its lifetime, bound to this pod.
pub fn token_request_spec(pod: &Pod, proj: &ServiceAccountTokenProjection) -> TokenRequestSpec {
    TokenRequestSpec {
        audiences: proj
            .audience
            .iter()
            .filter(|a| !a.is_empty())
            .cloned()
            .collect(),
        expiration_seconds: Some(
            proj.expiration_seconds
                .unwrap_or(DEFAULT_TOKEN_EXPIRATION_SECONDS),
        ),
        bound_object_ref: Some(BoundObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
        }),
    }
}

/// The service account whose tokens the pod's projections carry.
pub fn service_account(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
}

/// The mode of token and trust-bundle files, as upstream's projected
/// plugin: the volume's defaultMode, but 0600 when the volume will be owned by the pod's fsUser
/// or fsGroup (the ownership step then opens it to the group).
pub fn token_mode(pod: &Pod, default_mode: u32) -> u32 {
    let fs_group = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.fs_group);
    if fs_group.is_some() || fs_user(pod).is_some() {
        0o600
    } else {
        default_mode
    }
}

/// volume/util.FsUserFrom: the runAsUser every regular and init container
/// runs as, if they all name the same one (their own or the pod's).
fn fs_user(pod: &Pod) -> Option<i64> {
    let spec = pod.spec.as_ref()?;
    let pod_user = spec.security_context.as_ref().and_then(|sc| sc.run_as_user);
    let mut user = None;
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        let u = c
            .security_context
            .as_ref()
            .and_then(|sc| sc.run_as_user)
            .or(pod_user)?;
        match user {
            Some(prev) if prev != u => return None,
            _ => user = Some(u),
        }
    }
    user
}

/// What a projected volume's sources fetched: objects by name, tokens and
/// trust bundles by the index of their source. An entry left out reads as
/// "not fetched".
#[derive(Debug, Clone, Default)]
pub struct Fetched {
    pub config_maps: HashMap<String, Result<Arc<ConfigMap>, ObjectError>>,
    pub secrets: HashMap<String, Result<Arc<Secret>, ObjectError>>,
    pub tokens: HashMap<usize, Result<Token, ObjectError>>,
    pub trust_bundles: HashMap<usize, Result<Vec<u8>, TrustBundleError>>,
    pub pod_certificates: HashMap<usize, Result<Credentials, PodCertError>>,
}

fn not_fetched<T>(kind: &'static str, name: &str) -> Result<T, ObjectError> {
    Err(ObjectError::NoApiServer {
        kind,
        name: name.to_string(),
    })
}

/// projected collectData: the sources in order, each with the volume's
/// defaultMode; a later source's path replaces an earlier one's (the API
/// rejects such duplicates; upstream's map assignment lets the last win).
/// Every failing source is reported, together.
pub fn projected_payload(
    pod: &Pod,
    opts: &RuntimeOptions,
    src: &ProjectedVolumeSource,
    fetched: &Fetched,
) -> Result<Built, PayloadError> {
    let default_mode = mode_of(src.default_mode, DEFAULT_MODE);
    let mut built = Built::default();
    let mut errs = Vec::new();
    for (i, p) in src.sources.iter().flatten().enumerate() {
        let files = if let Some(s) = &p.secret {
            let optional = s.optional.unwrap_or(false);
            let got = fetched
                .secrets
                .get(&s.name)
                .cloned()
                .unwrap_or_else(|| not_fetched("secret", &s.name));
            present(got, optional).and_then(|o| {
                secret_payload(
                    s.items.as_deref().unwrap_or_default(),
                    o.as_deref(),
                    default_mode,
                    optional,
                )
            })
        } else if let Some(c) = &p.config_map {
            let optional = c.optional.unwrap_or(false);
            let got = fetched
                .config_maps
                .get(&c.name)
                .cloned()
                .unwrap_or_else(|| not_fetched("configmap", &c.name));
            present(got, optional).and_then(|o| {
                config_map_payload(
                    c.items.as_deref().unwrap_or_default(),
                    o.as_deref(),
                    default_mode,
                    optional,
                )
            })
        } else if let Some(d) = &p.downward_api {
            downward_api_payload(
                d.items.as_deref().unwrap_or_default(),
                pod,
                opts,
                default_mode,
            )
        } else if let Some(t) = &p.service_account_token {
            let got = fetched
                .tokens
                .get(&i)
                .cloned()
                .unwrap_or_else(|| not_fetched("serviceaccount", service_account(pod)));
            got.map_err(PayloadError::from).map(|tok| {
                built.refresh_at = Some(
                    built
                        .refresh_at
                        .map_or(tok.refresh_at, |r| r.min(tok.refresh_at)),
                );
                Payload::from([(
                    t.path.clone(),
                    FileProjection {
                        data: tok.token.into_bytes(),
                        mode: token_mode(pod, default_mode),
                    },
                )])
            })
        } else if let Some(c) = &p.cluster_trust_bundle {
            // The manager already applied `optional` (an empty file) and the
            // name/signer rules; the file takes the token's mode rule.
            let got = fetched
                .trust_bundles
                .get(&i)
                .cloned()
                .unwrap_or(Err(TrustBundleError::Unsupported));
            got.map_err(PayloadError::from).map(|pem| {
                Payload::from([(
                    c.path.clone(),
                    FileProjection {
                        data: pem,
                        mode: token_mode(pod, default_mode),
                    },
                )])
            })
        } else if let Some(pc) = &p.pod_certificate {
            let got = fetched
                .pod_certificates
                .get(&i)
                .cloned()
                .unwrap_or(Err(PodCertError::Unsupported));
            got.map_err(PayloadError::from).map(|cred| {
                built.refresh_at = Some(
                    built
                        .refresh_at
                        .map_or(cred.recheck_at, |r| r.min(cred.recheck_at)),
                );
                pod_certificate_files(pc, &cred, token_mode(pod, default_mode))
            })
        } else {
            Ok(Payload::new())
        };
        match files {
            Ok(f) => built.files.extend(f),
            Err(e) => errs.push(e),
        }
    }
    aggregate(errs).map(|()| built)
}

/// A podCertificate source's files (the projected plugin's podCertificate
/// case): the credential bundle is the private key's PEM block followed by
/// the chain, so one read gets a matching pair; keyPath and
/// certificateChainPath get the two apart. Each takes the token's mode rule.
pub fn pod_certificate_files(
    pc: &k8s_openapi::api::core::v1::PodCertificateProjection,
    cred: &Credentials,
    mode: u32,
) -> Payload {
    let mut files = Payload::new();
    let file = |data: Vec<u8>| FileProjection { data, mode };
    if let Some(p) = pc
        .credential_bundle_path
        .as_deref()
        .filter(|p| !p.is_empty())
    {
        let mut bundle = cred.private_key.clone();
        bundle.extend_from_slice(&cred.chain);
        files.insert(p.to_string(), file(bundle));
    }
    if let Some(p) = pc.key_path.as_deref().filter(|p| !p.is_empty()) {
        files.insert(p.to_string(), file(cred.private_key.clone()));
    }
    if let Some(p) = pc
        .certificate_chain_path
        .as_deref()
        .filter(|p| !p.is_empty())
    {
        files.insert(p.to_string(), file(cred.chain.clone()));
    }
    files
}

/// The ConfigMaps and Secrets a volume reads, by name, each once.
pub fn refs(volume: &Volume) -> (Vec<String>, Vec<String>) {
    let (mut cms, mut secrets) = (Vec::new(), Vec::new());
    let add = |v: &mut Vec<String>, n: &str| {
        if !v.iter().any(|x| x == n) {
            v.push(n.to_string());
        }
    };
    if let Some(c) = &volume.config_map {
        add(&mut cms, &c.name);
    }
    if let Some(n) = volume
        .secret
        .as_ref()
        .and_then(|s| s.secret_name.as_deref())
    {
        add(&mut secrets, n);
    }
    for p in volume
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten())
    {
        if let Some(c) = &p.config_map {
            add(&mut cms, &c.name);
        }
        if let Some(s) = &p.secret {
            add(&mut secrets, &s.name);
        }
    }
    (cms, secrets)
}

/// The files of a configMap, secret, downwardAPI or projected volume, with
/// what they need fetched through `objects`.
pub async fn build(
    objects: &ObjectManager,
    opts: &RuntimeOptions,
    pod: &Pod,
    volume: &Volume,
) -> Result<Built, PayloadError> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    if let Some(c) = &volume.config_map {
        let optional = c.optional.unwrap_or(false);
        let cm = present(objects.config_map(ns, &c.name).await, optional)?;
        let files = config_map_payload(
            c.items.as_deref().unwrap_or_default(),
            cm.as_deref(),
            mode_of(c.default_mode, DEFAULT_MODE),
            optional,
        )?;
        return Ok(Built {
            files,
            refresh_at: None,
        });
    }
    if let Some(s) = &volume.secret {
        let optional = s.optional.unwrap_or(false);
        let name = s.secret_name.as_deref().unwrap_or_default();
        let secret = present(objects.secret(ns, name).await, optional)?;
        let files = secret_payload(
            s.items.as_deref().unwrap_or_default(),
            secret.as_deref(),
            mode_of(s.default_mode, DEFAULT_MODE),
            optional,
        )?;
        return Ok(Built {
            files,
            refresh_at: None,
        });
    }
    if let Some(d) = &volume.downward_api {
        let files = downward_api_payload(
            d.items.as_deref().unwrap_or_default(),
            pod,
            opts,
            mode_of(d.default_mode, DEFAULT_MODE),
        )?;
        return Ok(Built {
            files,
            refresh_at: None,
        });
    }
    if let Some(p) = &volume.projected {
        let mut fetched = Fetched::default();
        for (i, src) in p.sources.iter().flatten().enumerate() {
            // Same precedence as projected_payload (upstream's switch).
            if let Some(s) = &src.secret {
                if !fetched.secrets.contains_key(&s.name) {
                    let got = objects.secret(ns, &s.name).await;
                    fetched.secrets.insert(s.name.clone(), got);
                }
            } else if let Some(c) = &src.config_map {
                if !fetched.config_maps.contains_key(&c.name) {
                    let got = objects.config_map(ns, &c.name).await;
                    fetched.config_maps.insert(c.name.clone(), got);
                }
            } else if let Some(t) = &src.service_account_token {
                let spec = token_request_spec(pod, t);
                let got = objects
                    .service_account_token(ns, service_account(pod), spec)
                    .await;
                fetched.tokens.insert(i, got);
            } else if let Some(c) = &src.cluster_trust_bundle {
                fetched
                    .trust_bundles
                    .insert(i, objects.trust_anchors(c).await);
            } else if let Some(pc) = &src.pod_certificate {
                let got = objects.pod_certificate(pod, &volume.name, i, pc).await;
                fetched.pod_certificates.insert(i, got);
            }
        }
        return projected_payload(pod, opts, p, &fetched);
    }
    Err(PayloadError::UnsupportedVolume(volume.name.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapProjection, ConfigMapVolumeSource, Container, DownwardAPIProjection,
        DownwardAPIVolumeSource, ObjectFieldSelector, PodSecurityContext, PodSpec,
        ResourceFieldSelector, ResourceRequirements, SecretProjection, SecretVolumeSource,
        SecurityContext, VolumeProjection,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::ByteString;

    fn file(data: &str, mode: u32) -> FileProjection {
        FileProjection {
            data: data.as_bytes().to_vec(),
            mode,
        }
    }

    fn kp(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
        }
    }

    fn cm() -> ConfigMap {
        ConfigMap {
            data: Some(BTreeMap::from([
                ("a".to_string(), "1".to_string()),
                ("b".to_string(), "2".to_string()),
            ])),
            binary_data: Some(BTreeMap::from([(
                "bin".to_string(),
                ByteString(vec![0, 159, 255]),
            )])),
            ..Default::default()
        }
    }

    fn secret() -> Secret {
        Secret {
            data: Some(BTreeMap::from([(
                "pw".to_string(),
                ByteString(b"hunter2".to_vec()),
            )])),
            ..Default::default()
        }
    }

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("prod".into()),
                uid: Some("u-1".into()),
                labels: Some(BTreeMap::from([
                    ("app".to_string(), "web".to_string()),
                    ("tier".to_string(), "front".to_string()),
                ])),
                annotations: Some(BTreeMap::from([(
                    "note".to_string(),
                    "say \"hi\"\n\tbye\\".to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    resources: Some(ResourceRequirements {
                        limits: Some(BTreeMap::from([(
                            "memory".to_string(),
                            Quantity("64Mi".into()),
                        )])),
                        requests: Some(BTreeMap::from([(
                            "cpu".to_string(),
                            Quantity("250m".into()),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn field(path: &str, fp: &str, mode: Option<i32>) -> DownwardAPIVolumeFile {
        DownwardAPIVolumeFile {
            path: path.into(),
            field_ref: Some(ObjectFieldSelector {
                field_path: fp.into(),
                ..Default::default()
            }),
            mode,
            ..Default::default()
        }
    }

    fn token(t: &str, refresh_at: i64) -> Token {
        Token {
            token: t.into(),
            expires_at: refresh_at + 100,
            refresh_at,
        }
    }

    #[test]
    fn config_map_without_items_projects_data_and_binary_data_at_the_default_mode() {
        let p = config_map_payload(&[], Some(&cm()), 0o644, false).unwrap();
        assert_eq!(
            p,
            Payload::from([
                ("a".to_string(), file("1", 0o644)),
                ("b".to_string(), file("2", 0o644)),
                (
                    "bin".to_string(),
                    FileProjection {
                        data: vec![0, 159, 255],
                        mode: 0o644
                    }
                ),
            ])
        );
    }

    #[test]
    fn config_map_items_select_keys_paths_and_modes() {
        let items = [kp("a", "x/one", Some(0o400)), kp("bin", "raw", None)];
        let p = config_map_payload(&items, Some(&cm()), 0o600, false).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p["x/one"], file("1", 0o400));
        assert_eq!(p["raw"].data, vec![0, 159, 255]);
        assert_eq!(p["raw"].mode, 0o600);
    }

    #[test]
    fn a_missing_config_map_key_fails_unless_optional() {
        let items = [kp("a", "a", None), kp("nope", "n", None)];
        let err = config_map_payload(&items, Some(&cm()), 0o644, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "configmap references non-existent config key: nope"
        );
        let p = config_map_payload(&items, Some(&cm()), 0o644, true).unwrap();
        assert_eq!(p.keys().collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn a_missing_object_is_empty_when_optional_and_the_fetch_error_otherwise() {
        let nf = || {
            Err::<Arc<ConfigMap>, _>(ObjectError::NotFound {
                kind: "configmap",
                name: "x".into(),
            })
        };
        assert!(present(nf(), true).unwrap().is_none());
        assert_eq!(
            present(nf(), false).unwrap_err().to_string(),
            "configmap \"x\" not found"
        );
        // Only "not found" is forgiven by optional.
        let down = Err::<Arc<ConfigMap>, _>(ObjectError::NoApiServer {
            kind: "configmap",
            name: "x".into(),
        });
        assert!(present(down, true).is_err());
        let items = [kp("a", "a", None)];
        assert!(config_map_payload(&items, None, 0o644, true)
            .unwrap()
            .is_empty());
        assert!(secret_payload(&[], None, 0o644, true).unwrap().is_empty());
    }

    #[test]
    fn secret_payload_follows_the_same_rules_with_its_own_message() {
        let all = secret_payload(&[], Some(&secret()), 0o640, false).unwrap();
        assert_eq!(all["pw"], file("hunter2", 0o640));
        let items = [kp("pw", "creds/pw", Some(0o400))];
        let sel = secret_payload(&items, Some(&secret()), 0o644, false).unwrap();
        assert_eq!(sel["creds/pw"], file("hunter2", 0o400));
        let missing = [kp("token", "t", None)];
        assert_eq!(
            secret_payload(&missing, Some(&secret()), 0o644, false)
                .unwrap_err()
                .to_string(),
            "references non-existent secret key: token"
        );
        assert!(secret_payload(&missing, Some(&secret()), 0o644, true)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn downward_api_fields_and_maps_as_upstream_formats_them() {
        let items = [
            field("name", "metadata.name", None),
            field("ns", "metadata.namespace", None),
            field("uid", "metadata.uid", Some(0o400)),
            field("labels", "metadata.labels", None),
            field("ann", "metadata.annotations", None),
            field("app", "metadata.labels['app']", None),
            field("none", "metadata.labels['missing']", None),
            field("./d//note", "metadata.annotations['note']", None),
        ];
        let p = downward_api_payload(&items, &pod(), &RuntimeOptions::default(), 0o644).unwrap();
        let s = |k: &str| String::from_utf8(p[k].data.clone()).unwrap();
        assert_eq!(s("name"), "web");
        assert_eq!(s("ns"), "prod");
        assert_eq!(p["uid"], file("u-1", 0o400));
        assert_eq!(s("labels"), "app=\"web\"\ntier=\"front\"");
        assert_eq!(s("ann"), r#"note="say \"hi\"\n\tbye\\""#);
        assert_eq!(s("app"), "web");
        assert_eq!(s("none"), "");
        assert_eq!(s("d/note"), "say \"hi\"\n\tbye\\");
        assert_eq!(p["name"].mode, 0o644);
    }

    #[test]
    fn go_quoting_escapes_what_go_escapes() {
        assert_eq!(go_quote("é ü"), "\"é ü\"");
        assert_eq!(go_quote("\u{1}\u{7f}"), "\"\\x01\\x7f\"");
        assert_eq!(go_quote("a\u{a0}b\u{200b}"), "\"a\\u00a0b\\u200b\"");
        assert_eq!(format_map(&BTreeMap::new()), "");
    }

    #[test]
    fn bad_field_paths_are_reported_together() {
        let items = [
            field("a", "spec.nodeName", None),
            field("b", "metadata.name['x']", None),
            field("c", "metadata.labels['bad key']", None),
            field("ok", "metadata.name", None),
        ];
        let err =
            downward_api_payload(&items, &pod(), &RuntimeOptions::default(), 0o644).unwrap_err();
        let PayloadError::Aggregate(errs) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(errs.len(), 3);
        let msg = err.to_string();
        assert!(
            msg.starts_with(
                "[unsupported fieldPath: spec.nodeName, \
                 fieldPath \"metadata.name['x']\" does not support subscript, \
                 invalid key subscript in metadata.labels['bad key']: "
            ),
            "{msg}"
        );
        assert!(msg.ends_with(']'));
        // Annotation keys are validated lower-cased, so capitals pass.
        assert!(field_path_value(&pod(), "metadata.annotations['Example.COM/Note']").is_ok());
        assert!(field_path_value(&pod(), "metadata.labels['example.com/app']").is_ok());
        assert!(field_path_value(&pod(), "metadata.labels['Example.com/app']").is_err());
    }

    #[test]
    fn resource_field_refs_read_the_named_container() {
        let rf = |path: &str, container: Option<&str>, res: &str, div: Option<&str>| {
            DownwardAPIVolumeFile {
                path: path.into(),
                resource_field_ref: Some(ResourceFieldSelector {
                    container_name: container.map(Into::into),
                    resource: res.into(),
                    divisor: div.map(|d| Quantity(d.into())),
                }),
                ..Default::default()
            }
        };
        let opts = RuntimeOptions::default();
        let items = [
            rf("mem", Some("app"), "limits.memory", Some("1Mi")),
            rf("cpu", Some("app"), "requests.cpu", Some("1m")),
        ];
        let p = downward_api_payload(&items, &pod(), &opts, 0o644).unwrap();
        assert_eq!(p["mem"].data, b"64");
        assert_eq!(p["cpu"].data, b"250");
        let err = downward_api_payload(
            &[rf("x", Some("nope"), "limits.cpu", None)],
            &pod(),
            &opts,
            0o644,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "container nope not found");
        let err = downward_api_payload(
            &[rf("x", Some("app"), "limits.gpu", None)],
            &pod(),
            &opts,
            0o644,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsupported container resource : limits.gpu"
        );
    }

    #[test]
    fn token_requests_carry_audience_lifetime_and_the_bound_pod() {
        let proj = ServiceAccountTokenProjection {
            audience: Some("vault".into()),
            expiration_seconds: None,
            path: "token".into(),
        };
        let spec = token_request_spec(&pod(), &proj);
        assert_eq!(spec.audiences, ["vault"]);
        assert_eq!(spec.expiration_seconds, Some(3600));
        let b = spec.bound_object_ref.unwrap();
        assert_eq!(
            (b.api_version, b.kind, b.name, b.uid),
            (
                Some("v1".into()),
                Some("Pod".into()),
                Some("web".into()),
                Some("u-1".into())
            )
        );
        let proj = ServiceAccountTokenProjection {
            audience: Some(String::new()),
            expiration_seconds: Some(7200),
            path: "token".into(),
        };
        let spec = token_request_spec(&pod(), &proj);
        assert!(spec.audiences.is_empty());
        assert_eq!(spec.expiration_seconds, Some(7200));
        assert_eq!(service_account(&pod()), "default");
    }

    #[test]
    fn the_token_is_0600_only_when_the_volume_gets_an_owner() {
        let mut p = pod();
        assert_eq!(token_mode(&p, 0o644), 0o644);
        p.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            fs_group: Some(2000),
            ..Default::default()
        });
        assert_eq!(token_mode(&p, 0o644), 0o600);
        // fsUser: every container runs as the same user (its own or the pod's).
        let mut p = pod();
        let spec = p.spec.as_mut().unwrap();
        spec.security_context = Some(PodSecurityContext {
            run_as_user: Some(1000),
            ..Default::default()
        });
        spec.init_containers = Some(vec![Container {
            name: "init".into(),
            security_context: Some(SecurityContext {
                run_as_user: Some(1000),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        assert_eq!(token_mode(&p, 0o644), 0o600);
        p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].security_context =
            Some(SecurityContext {
                run_as_user: Some(0),
                ..Default::default()
            });
        assert_eq!(token_mode(&p, 0o644), 0o644);
    }

    fn projection() -> ProjectedVolumeSource {
        ProjectedVolumeSource {
            default_mode: Some(0o440),
            sources: Some(vec![
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "cfg".into(),
                        items: Some(vec![kp("a", "shared", None), kp("b", "b", Some(0o600))]),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    secret: Some(SecretProjection {
                        name: "sec".into(),
                        items: Some(vec![kp("pw", "shared", None)]),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![field("name", "metadata.name", None)]),
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token2".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]),
        }
    }

    fn fetched() -> Fetched {
        Fetched {
            config_maps: HashMap::from([("cfg".to_string(), Ok(Arc::new(cm())))]),
            secrets: HashMap::from([("sec".to_string(), Ok(Arc::new(secret())))]),
            tokens: HashMap::from([(3, Ok(token("t1", 500))), (4, Ok(token("t2", 300)))]),
            trust_bundles: HashMap::new(),
            pod_certificates: HashMap::new(),
        }
    }

    #[test]
    fn projected_combines_sources_with_its_default_mode_and_last_path_wins() {
        let opts = RuntimeOptions::default();
        let b = projected_payload(&pod(), &opts, &projection(), &fetched()).unwrap();
        assert_eq!(
            b.files.keys().collect::<Vec<_>>(),
            ["b", "name", "shared", "token", "token2"]
        );
        assert_eq!(b.files["shared"], file("hunter2", 0o440));
        assert_eq!(b.files["b"], file("2", 0o600));
        assert_eq!(b.files["name"], file("web", 0o440));
        assert_eq!(b.files["token"], file("t1", 0o440));
        assert_eq!(b.refresh_at, Some(300));
    }

    #[test]
    fn projected_reports_every_failing_source_and_forgives_optional_ones() {
        let opts = RuntimeOptions::default();
        let mut f = fetched();
        f.secrets.insert(
            "sec".into(),
            Err(ObjectError::NotFound {
                kind: "secret",
                name: "sec".into(),
            }),
        );
        f.tokens.insert(
            4,
            Err(ObjectError::Api {
                kind: "serviceaccount",
                name: "default".into(),
                message: "forbidden".into(),
            }),
        );
        let err = projected_payload(&pod(), &opts, &projection(), &f).unwrap_err();
        assert_eq!(
            err.to_string(),
            "[secret \"sec\" not found, serviceaccount \"default\": forbidden]"
        );
        let mut src = projection();
        let sources = src.sources.as_mut().unwrap();
        sources[1].secret.as_mut().unwrap().optional = Some(true);
        sources.truncate(4);
        let b = projected_payload(&pod(), &opts, &src, &f).unwrap();
        // The optional secret left nothing; the ConfigMap's "shared" stays.
        assert_eq!(b.files["shared"], file("1", 0o440));
        assert_eq!(b.refresh_at, Some(500));
    }

    #[test]
    fn cluster_trust_bundles_are_projected_at_their_path_with_the_token_mode_rule() {
        use crate::objects::trustbundle::TrustBundleError;
        use k8s_openapi::api::core::v1::ClusterTrustBundleProjection;
        let opts = RuntimeOptions::default();
        let ctb = |path: &str| VolumeProjection {
            cluster_trust_bundle: Some(ClusterTrustBundleProjection {
                name: Some("b".into()),
                path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let src = ProjectedVolumeSource {
            default_mode: Some(0o444),
            sources: Some(vec![ctb("ca.pem"), ctb("other/ca.pem")]),
        };
        let pem = b"-----BEGIN CERTIFICATE-----\nAQID\n-----END CERTIFICATE-----\n".to_vec();
        let mut f = Fetched::default();
        f.trust_bundles.insert(0, Ok(pem.clone()));
        f.trust_bundles.insert(1, Ok(Vec::new()));
        let b = projected_payload(&pod(), &opts, &src, &f).unwrap();
        assert_eq!(b.files["ca.pem"].data, pem);
        assert_eq!(b.files["ca.pem"].mode, 0o444);
        assert!(b.files["other/ca.pem"].data.is_empty(), "optional, missing");
        let mut owned = pod();
        owned.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            fs_group: Some(2000),
            ..Default::default()
        });
        let b = projected_payload(&owned, &opts, &src, &f).unwrap();
        assert_eq!(b.files["ca.pem"].mode, 0o600);
        // The manager's errors are the volume's, in its words.
        f.trust_bundles
            .insert(1, Err(TrustBundleError::NotFound("b".into())));
        f.trust_bundles.remove(&0);
        let e = projected_payload(&pod(), &opts, &src, &f).unwrap_err();
        assert_eq!(
            e.to_string(),
            "[ClusterTrustBundle projection is not supported in static kubelet mode, while getting ClusterTrustBundle: clustertrustbundle.certificates.k8s.io \"b\" not found]"
        );
    }

    #[tokio::test]
    async fn build_projects_a_trust_bundle_as_static_mode_refuses_it() {
        use k8s_openapi::api::core::v1::ClusterTrustBundleProjection;
        let objects = ObjectManager::default().with_cluster_trust_bundle_projection(true);
        let v = Volume {
            name: "v".into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    cluster_trust_bundle: Some(ClusterTrustBundleProjection {
                        signer_name: Some("example.com/s".into()),
                        path: "ca.pem".into(),
                        optional: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = build(&objects, &RuntimeOptions::default(), &pod(), &v)
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "ClusterTrustBundle projection is not supported in static kubelet mode"
        );
    }

    #[test]
    fn pod_certificates_are_a_bundle_or_split_files_with_the_token_mode_rule() {
        use k8s_openapi::api::core::v1::PodCertificateProjection;
        let cred = Credentials {
            private_key: b"KEY\n".to_vec(),
            chain: b"LEAF\nCA\n".to_vec(),
            recheck_at: 700,
        };
        let bundle = PodCertificateProjection {
            signer_name: "example.com/s".into(),
            key_type: "ED25519".into(),
            credential_bundle_path: Some("creds.pem".into()),
            ..Default::default()
        };
        let split = PodCertificateProjection {
            key_path: Some("tls.key".into()),
            certificate_chain_path: Some("tls.crt".into()),
            ..bundle.clone()
        };
        let split = PodCertificateProjection {
            credential_bundle_path: None,
            ..split
        };
        let src = ProjectedVolumeSource {
            sources: Some(vec![
                VolumeProjection {
                    pod_certificate: Some(bundle),
                    ..Default::default()
                },
                VolumeProjection {
                    pod_certificate: Some(split),
                    ..Default::default()
                },
            ]),
            default_mode: Some(0o440),
        };
        let mut f = Fetched::default();
        f.pod_certificates.insert(0, Ok(cred.clone()));
        f.pod_certificates.insert(
            1,
            Ok(Credentials {
                recheck_at: 500,
                ..cred
            }),
        );
        let opts = RuntimeOptions::default();
        let built = projected_payload(&pod(), &opts, &src, &f).unwrap();
        assert_eq!(
            built.files,
            Payload::from([
                ("creds.pem".to_string(), file("KEY\nLEAF\nCA\n", 0o440)),
                ("tls.key".to_string(), file("KEY\n", 0o440)),
                ("tls.crt".to_string(), file("LEAF\nCA\n", 0o440)),
            ])
        );
        // The volume is written again at the earliest recheck.
        assert_eq!(built.refresh_at, Some(500));
        // fsGroup: 0600, as tokens.
        let mut p = pod();
        p.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            fs_group: Some(2000),
            ..Default::default()
        });
        let built = projected_payload(&p, &opts, &src, &f).unwrap();
        assert!(built.files.values().all(|f| f.mode == 0o600));
        // Not issued yet / denied: the manager's words, every source's.
        f.pod_certificates.insert(0, Err(PodCertError::NotIssued));
        f.pod_certificates.insert(
            1,
            Err(PodCertError::Denied {
                reason: "R".into(),
                message: "M".into(),
            }),
        );
        let e = projected_payload(&pod(), &opts, &src, &f).unwrap_err();
        assert_eq!(
            e.to_string(),
            "[credential bundle is not issued yet, PodCertificateRequest was permanently denied: reason=\"R\" message=\"M\"]"
        );
        // Nothing fetched (static pods): the NoOpManager's error.
        let e = projected_payload(&pod(), &opts, &src, &Fetched::default()).unwrap_err();
        assert_eq!(e.to_string(), "unimplemented");
    }

    #[test]
    fn refs_list_each_object_a_volume_reads_once() {
        let v = Volume {
            name: "v".into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![
                    VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: "c1".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        secret: Some(SecretProjection {
                            name: "s1".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: "c1".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(refs(&v), (vec!["c1".to_string()], vec!["s1".to_string()]));
        let v = Volume {
            name: "v".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some("s2".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(refs(&v), (vec![], vec!["s2".to_string()]));
        let v = Volume {
            name: "v".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: "c2".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(refs(&v), (vec!["c2".to_string()], vec![]));
    }

    #[tokio::test]
    async fn build_serves_downward_api_volumes_without_an_api_server() {
        let objects = ObjectManager::default();
        let opts = RuntimeOptions::default();
        let v = Volume {
            name: "info".into(),
            downward_api: Some(DownwardAPIVolumeSource {
                default_mode: Some(0o400),
                items: Some(vec![field("labels", "metadata.labels", None)]),
            }),
            ..Default::default()
        };
        let b = build(&objects, &opts, &pod(), &v).await.unwrap();
        assert_eq!(
            b.files["labels"],
            file("app=\"web\"\ntier=\"front\"", 0o400)
        );
        assert_eq!(b.refresh_at, None);
        // Projected downwardAPI-only needs no fetch either.
        let v = Volume {
            name: "p".into(),
            projected: Some(ProjectedVolumeSource {
                default_mode: None,
                sources: Some(vec![VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![field("n", "metadata.name", None)]),
                    }),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        };
        let b = build(&objects, &opts, &pod(), &v).await.unwrap();
        assert_eq!(b.files["n"], file("web", 0o644));
        // A ConfigMap without an API server: the fetch error, even if optional.
        let v = Volume {
            name: "c".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: "cfg".into(),
                optional: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(matches!(
            build(&objects, &opts, &pod(), &v).await,
            Err(PayloadError::Object(ObjectError::NoApiServer { .. }))
        ));
        let v = Volume {
            name: "e".into(),
            empty_dir: Some(Default::default()),
            ..Default::default()
        };
        assert_eq!(
            build(&objects, &opts, &pod(), &v)
                .await
                .unwrap_err()
                .to_string(),
            "volume \"e\" is not a configMap, secret, downwardAPI or projected volume"
        );
    }
}
