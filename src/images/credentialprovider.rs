//! Image credential provider plugins (upstream `pkg/credentialprovider/plugin`:
//! config.go, plugin.go, plugins.go): executables named in a
//! CredentialProviderConfig, run with a CredentialProviderRequest on stdin
//! for the images their `matchImages` cover, whose CredentialProviderResponse
//! logins join the node's keyring after the docker config files. A provider
//! with `tokenAttributes` (service-account-token mode) also sends the pod's
//! service account token, bound to the pod, and chosen annotations of its
//! ServiceAccount.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::keyring::{urls_match, Credential, Keyring};
use crate::objects::ObjectError;

/// The CredentialProviderConfig group and the versions upstream registers.
const CONFIG_GROUP: &str = "kubelet.config.k8s.io";
const CONFIG_VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha1"];
const CONFIG_KIND: &str = "CredentialProviderConfig";

/// The request/response API versions a provider may speak (upstream's
/// `apiVersions` map).
const PLUGIN_API_VERSIONS: [&str; 3] = [
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
];

/// Upstream's catch-all exec timeout: room for a plugin to retry a failed
/// request, but a plugin never runs forever.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// Upstream buffers a plugin's whole stdout; a response is a few logins, so
/// anything past this is a broken plugin, not credentials.
const MAX_STDOUT: usize = 1 << 20;

/// How much of a failing plugin's stderr goes into the error (upstream adds
/// all of it); the rest is read and dropped so the plugin never blocks.
const MAX_STDERR: usize = 4 << 10;

/// Expired cache entries nobody asks for again are dropped this often
/// (upstream's cachePurgeInterval).
const CACHE_PURGE_INTERVAL: Duration = Duration::from_secs(15 * 60);

/// The only request version that carries a service account token.
const TOKEN_API_VERSION: &str = "credentialprovider.kubelet.k8s.io/v1";

/// The feature gate of service-account-token mode: beta and on by default
/// in 1.34. Off, a config with `tokenAttributes` fails validation.
pub const SA_TOKEN_GATE: &str = "KubeletServiceAccountTokenForCredentialProviders";

/// Why the plugins could not be registered: start-up fails, as upstream's
/// RegisterCredentialProviderPlugins makes the kubelet exit.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("plugin binary directory {0} did not exist")]
    BinDirMissing(PathBuf),
    #[error("error inspecting binary directory {path}: {source}")]
    BinDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("credential provider config path is empty")]
    EmptyPath,
    #[error("unable to access path {path:?}: {source}")]
    Access {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unable to read {path:?}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no configuration files found in directory {0:?}")]
    NoFiles(PathBuf),
    #[error("error decoding config {path:?}: {message}")]
    Decode { path: PathBuf, message: String },
    #[error("duplicate provider name {0:?} found in configuration file(s)")]
    DuplicateName(String),
    /// Upstream's field.ErrorList aggregate: one error as is, several
    /// bracketed.
    #[error("failed to validate credential provider config: {0}")]
    Invalid(String),
    #[error("plugin binary executable {0} did not exist")]
    ExecutableMissing(PathBuf),
    #[error("error inspecting binary executable {path}: {source}")]
    Executable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why one plugin call gave no credentials. Logged; the pull goes on with
/// the other credentials, as upstream.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("error execing credential provider plugin {name} for image {image}: {source}")]
    Spawn {
        name: String,
        image: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "error execing credential provider plugin {name} for image {image}: {status}: {stderr}"
    )]
    Failed {
        name: String,
        image: String,
        /// As Go words it: `exit status 1`.
        status: String,
        stderr: String,
    },
    #[error("error execing credential provider plugin {name} for image {image}: context deadline exceeded (after {after:?})")]
    Timeout {
        name: String,
        image: String,
        after: Duration,
    },
    #[error("credential provider plugin {name} wrote more than {limit} bytes to stdout")]
    TooMuchOutput { name: String, limit: usize },
    #[error("error reading GVK from response: {0}")]
    Gvk(String),
    #[error("apiVersion from credential plugin response did not match expected apiVersion:{expected}, actual apiVersion:{actual}")]
    ApiVersion { expected: String, actual: String },
    /// The decoder's message is left out: it may quote credentials.
    #[error("error decoding credential provider plugin response from stdout")]
    Decode,
    #[error("failed to decode CredentialProviderResponse, unexpected Kind: {0:?}")]
    Kind(String),
    #[error("credential provider plugin did not return a valid cacheKeyType: {0:?}")]
    CacheKeyType(String),
    /// requireServiceAccount and a pod without one: the plugin is not run.
    #[error("service account name is empty for pod {namespace}/{pod}")]
    NoServiceAccount { namespace: String, pod: String },
    /// A workload that did not opt in (upstream logs it at V(5)).
    #[error("required annotation {0} not found")]
    RequiredAnnotation(String),
    #[error("failed to get service account {namespace}/{name}: {source}")]
    ServiceAccount {
        namespace: String,
        name: String,
        #[source]
        source: ObjectError,
    },
    #[error("error getting service account token {namespace}/{name}: {source}")]
    Token {
        namespace: String,
        name: String,
        #[source]
        source: ObjectError,
    },
    /// A plugin handing the token back as the registry password makes the
    /// login live only as long as the token: only the Token cache type may
    /// keep it.
    #[error("credential provider plugin returned the service account token as the password for image {0:?}, which is not allowed when service account cache type is not set to 'Token'")]
    TokenEchoed(String),
}

impl PluginError {
    /// Upstream's runPlugin counts these in
    /// kubelet_credential_provider_plugin_errors_total: the plugin could
    /// not be run, failed or timed out; a bad answer is not counted.
    fn is_run_failure(&self) -> bool {
        matches!(
            self,
            PluginError::Spawn { .. } | PluginError::Failed { .. } | PluginError::Timeout { .. }
        )
    }

    /// The pod did not opt in: upstream logs these at V(5) only, since
    /// they come with every pull of such a pod.
    fn is_opt_out(&self) -> bool {
        matches!(
            self,
            PluginError::NoServiceAccount { .. } | PluginError::RequiredAnnotation(_)
        )
    }
}

// ---------------------------------------------------------------------------
// The config file (staging/src/k8s.io/kubelet/config/v1/types.go).
// Decoding is strict, as upstream's codec (serializer.EnableStrict): unknown
// and duplicate fields are errors.
// ---------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    #[allow(dead_code)]
    kind: Option<String>,
    #[allow(dead_code)]
    api_version: Option<String>,
    providers: Option<Vec<RawProvider>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawProvider {
    #[serde(default)]
    name: String,
    match_images: Option<Vec<String>>,
    default_cache_duration: Option<String>,
    #[serde(default)]
    api_version: String,
    args: Option<Vec<String>>,
    env: Option<Vec<RawEnvVar>>,
    token_attributes: Option<RawTokenAttributes>,
}

/// A provider's `tokenAttributes` (ServiceAccountTokenAttributes).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawTokenAttributes {
    #[serde(default)]
    service_account_token_audience: String,
    #[serde(default)]
    cache_type: String,
    require_service_account: Option<bool>,
    required_service_account_annotation_keys: Option<Vec<String>>,
    optional_service_account_annotation_keys: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnvVar {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
}

/// One validated provider from the config.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
    pub name: String,
    pub match_images: Vec<String>,
    pub default_cache_duration: Duration,
    pub api_version: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Service-account-token mode.
    pub token_attributes: Option<TokenAttributes>,
}

/// How a provider in service-account-token mode gets its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenAttributes {
    /// The one audience of the token requested for the pod.
    pub audience: String,
    pub cache_type: TokenCacheType,
    /// Without a service account the plugin is not run; else it runs
    /// without a token.
    pub require_service_account: bool,
    /// The plugin is not run unless the ServiceAccount has all of these.
    pub required_annotation_keys: Vec<String>,
    /// Passed when present.
    pub optional_annotation_keys: Vec<String>,
}

/// What a service-account-mode answer is cached under, besides the
/// image/registry/global key: the account (and its annotations), or also
/// the very token sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenCacheType {
    ServiceAccount,
    Token,
}

/// The cacheType values, sorted as upstream lists them.
const TOKEN_CACHE_TYPES: [&str; 2] = ["ServiceAccount", "Token"];

/// Decodes one config document (YAML or JSON), checking its kind and
/// apiVersion as upstream's decoder does.
fn decode(text: &str) -> Result<Vec<RawProvider>, String> {
    let value: serde_json::Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| e.to_string())?
    } else {
        crate::yaml::from_str(text).map_err(|e| e.to_string())?
    };
    let field = |k: &str| value.get(k).and_then(|v| v.as_str()).unwrap_or_default();
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    if kind.is_empty() {
        return Err("Object 'Kind' is missing".into());
    }
    if api_version.is_empty() {
        return Err("Object 'apiVersion' is missing".into());
    }
    let known = api_version
        .split_once('/')
        .is_some_and(|(g, v)| g == CONFIG_GROUP && CONFIG_VERSIONS.contains(&v));
    if !known {
        return Err(format!(
            "no kind {kind:?} is registered for version {api_version:?}"
        ));
    }
    if kind != CONFIG_KIND {
        return Err(format!("failed to decode {kind:?} (wrong Kind)"));
    }
    let is_v1 = api_version == format!("{CONFIG_GROUP}/v1");
    let raw: RawConfig = serde_json::from_value(value).map_err(|e| e.to_string())?;
    let providers = raw.providers.unwrap_or_default();
    // Only the v1 config type has tokenAttributes: in v1beta1 and v1alpha1
    // it is an unknown field to upstream's strict decoder.
    if !is_v1 {
        if let Some(i) = providers.iter().position(|p| p.token_attributes.is_some()) {
            return Err(format!(
                "strict decoding error: unknown field \"providers[{i}].tokenAttributes\""
            ));
        }
    }
    Ok(providers)
}

/// The files of the config at `path`: the file itself, or every `*.json`,
/// `*.yaml` and `*.yml` file of a directory in lexical order (upstream's
/// readCredentialProviderConfig).
pub(crate) fn config_files(path: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    if path.as_os_str().is_empty() {
        return Err(ConfigError::EmptyPath);
    }
    let meta = std::fs::metadata(path).map_err(|source| ConfigError::Access {
        path: path.into(),
        source,
    })?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let read_err = |source| ConfigError::Read {
        path: path.into(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        let p = entry.path();
        let ext = p.extension().and_then(|e| e.to_str()).unwrap_or_default();
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if !is_dir && matches!(ext, "json" | "yaml" | "yml") {
            files.push(p);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(ConfigError::NoFiles(path.into()));
    }
    Ok(files)
}

/// Reads the config (see `config_files`), merged; provider names must be
/// unique across files. Also the hash of the bytes read, for
/// `kubelet_credential_provider_config_info`.
fn read_config(path: &Path) -> Result<(Vec<RawProvider>, String), ConfigError> {
    let files = config_files(path)?;
    let mut texts = Vec::with_capacity(files.len());
    let mut providers: Vec<RawProvider> = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|source| ConfigError::Read {
            path: file.clone(),
            source,
        })?;
        let decoded = decode(&text).map_err(|message| ConfigError::Decode {
            path: file.clone(),
            message,
        })?;
        for p in decoded {
            if providers.iter().any(|q| q.name == p.name) {
                return Err(ConfigError::DuplicateName(p.name));
            }
            providers.push(p);
        }
        texts.push(text);
    }
    let hash = crate::metrics::v134::config_hash(texts.iter().map(|t| t.as_bytes()));
    Ok((providers, hash))
}

/// Upstream's validateCredentialProviderConfig, with field errors worded as
/// apimachinery's field.Error (paths without indexes, as upstream's are).
fn validate(
    raw: Vec<RawProvider>,
    sa_token_gate: bool,
) -> Result<Vec<ProviderConfig>, ConfigError> {
    let mut errs: Vec<String> = Vec::new();
    if raw.is_empty() {
        errs.push("providers: Required value: at least 1 item in plugins is required".into());
    }
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for p in raw {
        let invalid = |errs: &mut Vec<String>, field: &str, value: &str, detail: &str| {
            errs.push(format!(
                "providers.{field}: Invalid value: {value:?}: {detail}"
            ));
        };
        let name = p.name.as_str();
        if name.contains('/') {
            invalid(&mut errs, "name", name, "provider name cannot contain '/'");
        }
        if name.contains(' ') {
            invalid(
                &mut errs,
                "name",
                name,
                "provider name cannot contain spaces",
            );
        }
        if name == "." {
            invalid(&mut errs, "name", name, "provider name cannot be '.'");
        }
        if name == ".." {
            invalid(&mut errs, "name", name, "provider name cannot be '..'");
        }
        if seen.iter().any(|s| s == name) {
            errs.push(format!("providers.name: Duplicate value: {name:?}"));
        }
        seen.push(name.to_string());
        if p.api_version.is_empty() {
            errs.push("providers.apiVersion: Required value".into());
        } else if !PLUGIN_API_VERSIONS.contains(&p.api_version.as_str()) {
            let supported: Vec<String> = PLUGIN_API_VERSIONS
                .iter()
                .map(|v| format!("{v:?}"))
                .collect();
            errs.push(format!(
                "providers.apiVersion: Unsupported value: {:?}: supported values: {}",
                p.api_version,
                supported.join(", ")
            ));
        }
        let match_images = p.match_images.unwrap_or_default();
        if match_images.is_empty() {
            errs.push(
                "providers.matchImages: Required value: at least 1 item in matchImages is required"
                    .into(),
            );
        }
        for m in &match_images {
            if let Err(e) = check_schemeless_url(m) {
                invalid(
                    &mut errs,
                    "matchImages",
                    m,
                    &format!("match image is invalid: {e}"),
                );
            }
        }
        let default_cache_duration = match p.default_cache_duration.as_deref() {
            None => {
                errs.push("providers.defaultCacheDuration: Required value".into());
                Duration::ZERO
            }
            Some(d) => match parse_duration(d) {
                Ok(d) => d,
                Err(DurationError::Negative) => {
                    invalid(
                        &mut errs,
                        "defaultCacheDuration",
                        d,
                        "defaultCacheDuration must be greater than or equal to 0",
                    );
                    Duration::ZERO
                }
                Err(DurationError::Syntax(e)) => {
                    invalid(&mut errs, "defaultCacheDuration", d, &e);
                    Duration::ZERO
                }
            },
        };
        let token_attributes = p
            .token_attributes
            .map(|t| validate_token_attributes(&mut errs, t, &p.api_version, sa_token_gate));
        out.push(ProviderConfig {
            name: p.name,
            match_images,
            default_cache_duration,
            api_version: p.api_version,
            args: p.args.unwrap_or_default(),
            env: p
                .env
                .unwrap_or_default()
                .into_iter()
                .map(|e| (e.name, e.value))
                .collect(),
            token_attributes,
        });
    }
    match errs.len() {
        0 => Ok(out),
        1 => Err(ConfigError::Invalid(errs.remove(0))),
        _ => Err(ConfigError::Invalid(format!("[{}]", errs.join(", ")))),
    }
}

/// The tokenAttributes checks of upstream's validateCredentialProviderConfig,
/// in its order; returns what the provider runs with if they pass.
fn validate_token_attributes(
    errs: &mut Vec<String>,
    t: RawTokenAttributes,
    api_version: &str,
    gate: bool,
) -> TokenAttributes {
    const PATH: &str = "providers.tokenAttributes";
    if !gate {
        errs.push(format!("{PATH}: Forbidden: tokenAttributes is not supported when {SA_TOKEN_GATE} feature gate is disabled"));
    }
    if t.service_account_token_audience.is_empty() {
        errs.push(format!(
            "{PATH}.serviceAccountTokenAudience: Required value"
        ));
    }
    if t.require_service_account.is_none() {
        errs.push(format!("{PATH}.requireServiceAccount: Required value"));
    }
    if api_version != TOKEN_API_VERSION {
        errs.push(format!(
            "{PATH}: Forbidden: tokenAttributes is only supported for {TOKEN_API_VERSION} API version"
        ));
    }
    let required = t
        .required_service_account_annotation_keys
        .unwrap_or_default();
    let optional = t
        .optional_service_account_annotation_keys
        .unwrap_or_default();
    if t.require_service_account == Some(false) && !required.is_empty() {
        errs.push(format!("{PATH}.requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set"));
    }
    for (field, keys) in [
        ("requiredServiceAccountAnnotationKeys", &required),
        ("optionalServiceAccountAnnotationKeys", &optional),
    ] {
        let mut seen: Vec<&str> = Vec::new();
        for k in keys {
            // Annotation keys: qualified names, case aside (as ObjectMeta's).
            for msg in qualified_name_errors(&k.to_lowercase()) {
                errs.push(format!("{PATH}.{field}: Invalid value: {k:?}: {msg}"));
            }
            if seen.contains(&k.as_str()) {
                errs.push(format!("{PATH}.{field}: Duplicate value: {k:?}"));
            }
            seen.push(k);
        }
    }
    let mut both: Vec<&String> = required.iter().filter(|k| optional.contains(k)).collect();
    both.sort();
    both.dedup();
    if !both.is_empty() {
        // Go's %#v of a []string, as field.Invalid prints it.
        let list: Vec<String> = both.iter().map(|k| format!("{k:?}")).collect();
        errs.push(format!(
            "{PATH}: Invalid value: []string{{{}}}: annotation keys cannot be both required and optional",
            list.join(", ")
        ));
    }
    let cache_type = match t.cache_type.as_str() {
        "" => {
            errs.push(format!("{PATH}.cacheType: Required value: cacheType is required to be set when tokenAttributes is specified. Supported values are: {}", TOKEN_CACHE_TYPES.join(", ")));
            TokenCacheType::Token
        }
        "ServiceAccount" => TokenCacheType::ServiceAccount,
        "Token" => TokenCacheType::Token,
        other => {
            let supported: Vec<String> =
                TOKEN_CACHE_TYPES.iter().map(|v| format!("{v:?}")).collect();
            errs.push(format!(
                "{PATH}.cacheType: Unsupported value: {other:?}: supported values: {}",
                supported.join(", ")
            ));
            TokenCacheType::Token
        }
    };
    TokenAttributes {
        audience: t.service_account_token_audience,
        cache_type,
        require_service_account: t.require_service_account.unwrap_or(true),
        required_annotation_keys: required,
        optional_annotation_keys: optional,
    }
}

/// apimachinery's RegexError wording: the rule, examples, the regex.
fn regex_error(msg: &str, regex: &str, examples: &[&str]) -> String {
    let examples: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!(
        "{msg} (e.g. {}regex used for validation is '{regex}')",
        examples.join(" or ")
    )
}

/// validation.IsQualifiedName's messages, worded as upstream's.
fn qualified_name_errors(v: &str) -> Vec<String> {
    const NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
    const NAME_RE: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
    const EXAMPLES: [&str; 3] = ["MyName", "my.name", "123-abc"];
    let mut errs = Vec::new();
    let name = match v.split('/').collect::<Vec<_>>().as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                if prefix.len() > 253 {
                    errs.push("prefix part must be no more than 253 characters".to_string());
                }
                let label_ok = |l: &str| {
                    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
                    l.starts_with(alnum)
                        && l.ends_with(alnum)
                        && l.chars().all(|c| alnum(c) || c == '-')
                };
                if !prefix.split('.').all(label_ok) {
                    errs.push(format!(
                        "prefix part {}",
                        regex_error(
                            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
                            "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
                            &["example.com"],
                        )
                    ));
                }
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(NAME_MSG, NAME_RE, &EXAMPLES)
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    }
    let ext = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let valid = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(ext);
    if !valid {
        errs.push(format!(
            "name part {}",
            regex_error(NAME_MSG, NAME_RE, &EXAMPLES)
        ));
    }
    errs
}

enum DurationError {
    Negative,
    Syntax(String),
}

/// A metav1.Duration string; negative ones are told apart because upstream
/// parses them and then rejects them with its own message.
fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    match s.strip_prefix('-') {
        Some(rest) => match crate::config::parse_go_duration(rest) {
            Ok(d) if d.is_zero() => Ok(d),
            Ok(_) => Err(DurationError::Negative),
            Err(e) => Err(DurationError::Syntax(e.to_string())),
        },
        None => {
            crate::config::parse_go_duration(s).map_err(|e| DurationError::Syntax(e.to_string()))
        }
    }
}

/// The errors Go's `url.Parse("https://" + s)` gives a match image
/// (upstream's ParseSchemelessURL): control characters, a port that is not
/// digits, characters a host may not hold, bad `%` escapes.
fn check_schemeless_url(s: &str) -> Result<(), String> {
    let wrap = |reason: String| format!("parse \"https://{s}\": {reason}");
    if s.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err(wrap("net/url: invalid control character in URL".into()));
    }
    let rest = s.split(['#', '?']).next().unwrap_or_default();
    let authority = rest.split('/').next().unwrap_or_default();
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (name, port) = if let Some(inner) = host.strip_prefix('[') {
        match inner.split_once(']') {
            Some((_, after)) => ("", after),
            None => return Err(wrap("missing ']' in host".into())),
        }
    } else {
        match host.rsplit_once(':') {
            Some((h, _)) => (h, &host[h.len()..]),
            None => (host, ""),
        }
    };
    let valid_port =
        port.is_empty() || (port.starts_with(':') && port[1..].bytes().all(|b| b.is_ascii_digit()));
    if !valid_port {
        return Err(wrap(format!("invalid port {port:?} after host")));
    }
    let bytes = name.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'%' {
            let hex = |j: usize| bytes.get(j).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(i + 1) && hex(i + 2)) {
                let esc: String = name[i..].chars().take(3).collect();
                return Err(wrap(format!("invalid URL escape {esc:?}")));
            }
            i += 3;
            continue;
        }
        let allowed =
            c >= 0x80 || c.is_ascii_alphanumeric() || b"-_.~!$&'()*+,;=:[]<>\"".contains(&c);
        if !allowed {
            return Err(wrap(format!(
                "invalid character {:?} in host name",
                (c as char).to_string()
            )));
        }
        i += 1;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The exec protocol (staging/src/k8s.io/kubelet/pkg/apis/credentialprovider).
// ---------------------------------------------------------------------------

/// What the plugin reads on stdin. Field order as Go's encoder writes it
/// (TypeMeta first); the service-account fields are omitted when empty
/// (`omitempty`), map keys sorted as Go sorts them.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    kind: &'static str,
    api_version: &'a str,
    image: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    service_account_token: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    service_account_annotations: &'a BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Response {
    #[allow(dead_code)]
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    cache_key_type: String,
    cache_duration: Option<String>,
    /// Only meaningful in service-account-token mode.
    #[allow(dead_code)]
    service_account_token_cache_type: Option<String>,
    auth: Option<BTreeMap<String, AuthConfig>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthConfig {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

/// A plugin's logins by docker config location (sorted; the keyring orders them).
type Logins = Arc<[(String, Credential)]>;

/// What a plugin answered, decoded and checked.
#[derive(Debug, Clone)]
struct Answer {
    key_type: CacheKeyType,
    /// `None`: the provider's defaultCacheDuration.
    cache_duration: Option<Duration>,
    auth: Logins,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CacheKeyType {
    Image,
    Registry,
    Global,
}

/// The response checks of upstream's ExecPlugin and decodeResponse: the
/// apiVersion first (from a loose read), then a strict decode.
fn parse_response(data: &[u8], expected_api_version: &str) -> Result<Answer, PluginError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct TypeMeta {
        #[serde(default)]
        api_version: String,
    }
    let meta: TypeMeta = serde_json::from_slice(data).map_err(|e| {
        // serde's message may quote the input; keep only where it broke.
        PluginError::Gvk(format!(
            "invalid JSON at line {} column {}",
            e.line(),
            e.column()
        ))
    })?;
    if meta.api_version != expected_api_version {
        return Err(PluginError::ApiVersion {
            expected: expected_api_version.into(),
            actual: meta.api_version,
        });
    }
    let r: Response = serde_json::from_slice(data).map_err(|_| PluginError::Decode)?;
    let kind = r.kind.unwrap_or_default();
    if kind != "CredentialProviderResponse" {
        return Err(PluginError::Kind(kind));
    }
    let key_type = match r.cache_key_type.as_str() {
        "Image" => CacheKeyType::Image,
        "Registry" => CacheKeyType::Registry,
        "Global" => CacheKeyType::Global,
        other => return Err(PluginError::CacheKeyType(other.into())),
    };
    let cache_duration = match r.cache_duration {
        None => None,
        Some(d) => match parse_duration(&d) {
            Ok(d) => Some(d),
            // Upstream caches it with an expiry already past: never used.
            Err(DurationError::Negative) => Some(Duration::ZERO),
            Err(DurationError::Syntax(_)) => return Err(PluginError::Decode),
        },
    };
    let auth = r
        .auth
        .unwrap_or_default()
        .into_iter()
        .map(|(k, a)| {
            (
                k,
                Credential {
                    username: a.username,
                    password: a.password,
                },
            )
        })
        .collect();
    Ok(Answer {
        key_type,
        cache_duration,
        auth,
    })
}

// ---------------------------------------------------------------------------
// Providers.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum BaseKey {
    Image(String),
    Registry(String),
    Global,
}

/// A cache entry's key: the answer's cacheKeyType key and, in
/// service-account-token mode, the account it was asked for (upstream's
/// generateCacheKey of the base key and the service account cache key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    base: BaseKey,
    sa: Option<Arc<SaKey>>,
}

/// Upstream's service account cache key: namespace, name, UID and the
/// annotations sent; with cacheType Token, the token too, so each token's
/// answer stands alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SaKey {
    namespace: String,
    name: String,
    uid: String,
    annotations: BTreeMap<String, String>,
    token: Option<String>,
}

/// What concurrent callers share one plugin run by: the image and, in
/// service-account-token mode, the token and annotations sent (upstream's
/// singleflight key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FlightKey {
    image: String,
    sa: Option<(String, BTreeMap<String, String>)>,
}

/// What a service-account-mode call sends and is cached under.
#[derive(Debug, Clone)]
struct SaContext {
    token: String,
    annotations: BTreeMap<String, String>,
    key: Arc<SaKey>,
}

/// The pod an image is pulled for (upstream's perPodPluginProvider).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.serviceAccountName`; empty for pods without one.
    pub service_account: String,
}

impl PodRef {
    pub fn of(pod: &Pod) -> Self {
        PodRef {
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            service_account: pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
        }
    }
}

/// Where service-account-token mode reads the pod's ServiceAccount and
/// gets its token: the object manager in cluster mode, a fake in tests.
#[async_trait::async_trait]
pub trait ServiceAccountSource: Send + Sync {
    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<ServiceAccount>, ObjectError>;

    /// A TokenRequest for `name` in `namespace`, the account's UID as its
    /// `metadata.uid`; the token.
    async fn token(
        &self,
        namespace: &str,
        name: &str,
        sa_uid: &str,
        spec: TokenRequestSpec,
    ) -> Result<String, ObjectError>;
}

#[async_trait::async_trait]
impl ServiceAccountSource for crate::objects::ObjectManager {
    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<ServiceAccount>, ObjectError> {
        crate::objects::ObjectManager::service_account(self, namespace, name).await
    }

    async fn token(
        &self,
        namespace: &str,
        name: &str,
        sa_uid: &str,
        spec: TokenRequestSpec,
    ) -> Result<String, ObjectError> {
        self.service_account_token_for_uid(namespace, name, sa_uid, spec)
            .await
            .map(|t| t.token)
    }
}

/// The registry of an image: its first path element, port included
/// (upstream's parseRegistry).
fn registry(image: &str) -> &str {
    image.split('/').next().unwrap_or_default()
}

type Flight = Arc<OnceCell<Result<Answer, Arc<PluginError>>>>;

#[derive(Default)]
struct State {
    cache: HashMap<CacheKey, (Instant, Logins)>,
    last_purge: Option<Instant>,
    /// Plugin calls under way, shared by concurrent callers (upstream's
    /// singleflight.Group).
    in_flight: HashMap<FlightKey, Flight>,
}

struct Provider {
    cfg: ProviderConfig,
    bin: PathBuf,
    timeout: Duration,
    state: parking_lot::Mutex<State>,
}

impl Provider {
    fn matches(&self, image: &str) -> bool {
        self.cfg.match_images.iter().any(|m| urls_match(m, image))
    }

    /// A live cache entry for the image, by image, then registry, then
    /// global key, each with the service account part if any (upstream
    /// getCachedCredentials); expired entries are purged every 15 minutes.
    fn cached(&self, image: &str, sa: Option<&Arc<SaKey>>, now: Instant) -> Option<Logins> {
        let mut st = self.state.lock();
        let due = st
            .last_purge
            .is_none_or(|t| now.duration_since(t) >= CACHE_PURGE_INTERVAL);
        if due {
            st.cache.retain(|_, (expires, _)| now <= *expires);
            st.last_purge = Some(now);
        }
        [
            BaseKey::Image(image.to_string()),
            BaseKey::Registry(registry(image).to_string()),
            BaseKey::Global,
        ]
        .into_iter()
        .map(|base| CacheKey {
            base,
            sa: sa.cloned(),
        })
        .find_map(|k| match st.cache.get(&k) {
            // Upstream's IsExpired: now.After(expiresAt).
            Some((expires, creds)) if now <= *expires => Some(creds.clone()),
            _ => None,
        })
    }

    /// Service-account-token mode's inputs for this pod (upstream's
    /// getServiceAccountData and getServiceAccountToken): `None` when the
    /// provider is not in that mode, or the pod has no service account and
    /// none is required.
    async fn service_account_context(
        &self,
        pod: &PodRef,
        source: Option<&dyn ServiceAccountSource>,
    ) -> Result<Option<SaContext>, PluginError> {
        let Some(attrs) = &self.cfg.token_attributes else {
            return Ok(None);
        };
        if pod.service_account.is_empty() {
            if attrs.require_service_account {
                return Err(PluginError::NoServiceAccount {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                });
            }
            // Allowed to run without a token (e.g. static pods).
            return Ok(None);
        }
        let (ns, name) = (pod.namespace.as_str(), pod.service_account.as_str());
        let sa_err = |source| PluginError::ServiceAccount {
            namespace: ns.into(),
            name: name.into(),
            source,
        };
        // Standalone: no API server to read the account from.
        let source = source.ok_or_else(|| {
            sa_err(ObjectError::NoApiServer {
                kind: "serviceaccount",
                name: name.into(),
            })
        })?;
        let sa = source.service_account(ns, name).await.map_err(sa_err)?;
        let have = sa.metadata.annotations.clone().unwrap_or_default();
        let mut annotations = BTreeMap::new();
        for k in &attrs.required_annotation_keys {
            let v = have
                .get(k)
                .ok_or_else(|| PluginError::RequiredAnnotation(k.clone()))?;
            annotations.insert(k.clone(), v.clone());
        }
        for k in &attrs.optional_annotation_keys {
            if let Some(v) = have.get(k) {
                annotations.insert(k.clone(), v.clone());
            }
        }
        let uid = sa.metadata.uid.clone().unwrap_or_default();
        // One audience, bound to the pod; expirationSeconds left to the
        // server's default, as upstream.
        let spec = TokenRequestSpec {
            audiences: vec![attrs.audience.clone()],
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.clone()),
                uid: Some(pod.uid.clone()),
            }),
            expiration_seconds: None,
        };
        let token =
            source
                .token(ns, name, &uid, spec)
                .await
                .map_err(|source| PluginError::Token {
                    namespace: ns.into(),
                    name: name.into(),
                    source,
                })?;
        let key = Arc::new(SaKey {
            namespace: ns.into(),
            name: name.into(),
            uid,
            annotations: annotations.clone(),
            token: (attrs.cache_type == TokenCacheType::Token).then(|| token.clone()),
        });
        Ok(Some(SaContext {
            token,
            annotations,
            key,
        }))
    }

    /// Upstream's pluginProvider.provide: cached logins, else one plugin
    /// call shared by concurrent callers for the same request; a failure
    /// is logged and gives nothing.
    async fn provide(
        &self,
        image: &str,
        pod: &PodRef,
        source: Option<&dyn ServiceAccountSource>,
    ) -> Logins {
        match self.provide_result(image, pod, source).await {
            Ok(logins) => logins,
            Err(e) => {
                let (provider, ns, name) = (&self.cfg.name, &pod.namespace, &pod.name);
                if e.is_opt_out() {
                    tracing::debug!(provider = %provider, image, pod = %name, namespace = %ns, error = %e, "credential provider plugin not run for this pod");
                } else {
                    tracing::error!(provider = %provider, image, pod = %name, namespace = %ns, error = %e, "Failed getting credential from external registry credential provider");
                }
                Arc::from(Vec::new())
            }
        }
    }

    async fn provide_result(
        &self,
        image: &str,
        pod: &PodRef,
        source: Option<&dyn ServiceAccountSource>,
    ) -> Result<Logins, Arc<PluginError>> {
        let sa = self
            .service_account_context(pod, source)
            .await
            .map_err(Arc::new)?;
        let sa_key = sa.as_ref().map(|c| &c.key);
        if let Some(c) = self.cached(image, sa_key, Instant::now()) {
            return Ok(c);
        }
        let fkey = FlightKey {
            image: image.to_string(),
            sa: sa
                .as_ref()
                .map(|c| (c.token.clone(), c.annotations.clone())),
        };
        let flight = self
            .state
            .lock()
            .in_flight
            .entry(fkey.clone())
            .or_default()
            .clone();
        // A caller that is cancelled mid-call hands the call over to the
        // next waiter (OnceCell), and its dropped child is killed.
        let answer = flight
            .get_or_init(|| self.call(image, sa.as_ref()))
            .await
            .clone();
        {
            let mut st = self.state.lock();
            if st
                .in_flight
                .get(&fkey)
                .is_some_and(|f| Arc::ptr_eq(f, &flight))
            {
                st.in_flight.remove(&fkey);
            }
        }
        let answer = answer?;
        if let (Some(c), Some(attrs)) = (&sa, &self.cfg.token_attributes) {
            let echoed = !c.token.is_empty()
                && attrs.cache_type != TokenCacheType::Token
                && answer.auth.iter().any(|(_, cred)| cred.password == c.token);
            if echoed {
                return Err(Arc::new(PluginError::TokenEchoed(image.into())));
            }
        }
        let ttl = answer
            .cache_duration
            .unwrap_or(self.cfg.default_cache_duration);
        // Zero, from the response or the default, means not cached.
        if !ttl.is_zero() {
            let base = match answer.key_type {
                CacheKeyType::Image => BaseKey::Image(image.to_string()),
                CacheKeyType::Registry => BaseKey::Registry(registry(image).to_string()),
                CacheKeyType::Global => BaseKey::Global,
            };
            let key = CacheKey {
                base,
                sa: sa_key.cloned(),
            };
            let expires = Instant::now() + ttl;
            self.state
                .lock()
                .cache
                .insert(key, (expires, answer.auth.clone()));
        }
        Ok(answer.auth)
    }

    async fn call(&self, image: &str, sa: Option<&SaContext>) -> Result<Answer, Arc<PluginError>> {
        tracing::debug!(provider = %self.cfg.name, image, "getting image credentials from external exec plugin");
        let started = Instant::now();
        let out = match tokio::time::timeout(self.timeout, self.exec(image, sa)).await {
            Ok(r) => r,
            Err(_) => Err(PluginError::Timeout {
                name: self.cfg.name.clone(),
                image: image.into(),
                after: self.timeout,
            }),
        };
        crate::metrics::credential_provider_plugin_run(
            &self.cfg.name,
            started.elapsed(),
            out.as_ref().is_err_and(PluginError::is_run_failure),
        );
        out.and_then(|stdout| parse_response(&stdout, &self.cfg.api_version))
            .map_err(Arc::new)
    }

    /// `ENV=... <bin-dir>/<name> args... <<< request`, the host's
    /// environment with the config's variables over it, as upstream.
    async fn exec(&self, image: &str, sa: Option<&SaContext>) -> Result<Vec<u8>, PluginError> {
        let spawn_err = |source| PluginError::Spawn {
            name: self.cfg.name.clone(),
            image: image.into(),
            source,
        };
        let no_annotations = BTreeMap::new();
        let mut request = serde_json::to_vec(&Request {
            kind: "CredentialProviderRequest",
            api_version: &self.cfg.api_version,
            image,
            service_account_token: sa.map_or("", |c| c.token.as_str()),
            service_account_annotations: sa.map_or(&no_annotations, |c| &c.annotations),
        })
        .expect("a request always encodes");
        // Go's JSON encoder ends the document with a newline.
        request.push(b'\n');
        let mut child = tokio::process::Command::new(&self.bin)
            .args(&self.cfg.args)
            .envs(self.cfg.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            // A timed-out or abandoned call must not leave the plugin running.
            .kill_on_drop(true)
            .spawn()
            .map_err(spawn_err)?;
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let write = async move {
            // A plugin that exits without reading its input is not an
            // error (Go's exec ignores EPIPE on stdin too).
            let _ = stdin.write_all(&request).await;
            drop(stdin);
        };
        let (_, out, err, status) = tokio::join!(
            write,
            read_bounded(stdout, MAX_STDOUT),
            read_bounded(stderr, MAX_STDERR),
            child.wait()
        );
        let status = status.map_err(spawn_err)?;
        let (out, overflow) = out.map_err(spawn_err)?;
        if !status.success() {
            let (err, _) = err.unwrap_or_default();
            return Err(PluginError::Failed {
                name: self.cfg.name.clone(),
                image: image.into(),
                status: go_exit_status(status),
                stderr: String::from_utf8_lossy(&err).trim_end().to_string(),
            });
        }
        if overflow {
            return Err(PluginError::TooMuchOutput {
                name: self.cfg.name.clone(),
                limit: MAX_STDOUT,
            });
        }
        Ok(out)
    }
}

/// An exit status as Go's os/exec error words it.
fn go_exit_status(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("signal: {sig}"),
        _ => s.to_string(),
    }
}

/// Reads a pipe to its end, keeping at most `limit` bytes (and whether
/// more came); the rest is drained so the writer never blocks on it.
async fn read_bounded<R: AsyncRead + Unpin>(
    mut r: R,
    limit: usize,
) -> std::io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let mut overflow = false;
    let mut buf = [0u8; 8192];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok((kept, overflow));
        }
        let room = limit - kept.len();
        if n > room {
            overflow = true;
        }
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// The registered plugins, in config order (upstream's plugin registry and
/// externalCredentialProviderKeyring).
pub struct CredentialProviders {
    providers: Vec<Provider>,
    /// Set in cluster mode: service-account-token mode reads the pod's
    /// ServiceAccount and gets tokens through it.
    service_accounts: std::sync::OnceLock<Arc<dyn ServiceAccountSource>>,
}

impl std::fmt::Debug for CredentialProviders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.providers.iter().map(|p| &p.cfg.name))
            .finish()
    }
}

impl CredentialProviders {
    /// Upstream's RegisterCredentialProviderPlugins: the bin dir must
    /// exist, the config read and valid, and each provider's executable
    /// present. Runs once at start-up, before any pod, so its few file
    /// reads are synchronous.
    pub fn load(config: &Path, bin_dir: &Path) -> Result<Self, ConfigError> {
        Self::load_gated(config, bin_dir, true)
    }

    /// [`Self::load`] with the service-account-token feature gate as given.
    pub fn load_gated(
        config: &Path,
        bin_dir: &Path,
        sa_token_gate: bool,
    ) -> Result<Self, ConfigError> {
        if let Err(source) = std::fs::metadata(bin_dir) {
            return Err(if source.kind() == std::io::ErrorKind::NotFound {
                ConfigError::BinDirMissing(bin_dir.into())
            } else {
                ConfigError::BinDir {
                    path: bin_dir.into(),
                    source,
                }
            });
        }
        let (raw, hash) = read_config(config)?;
        let providers = validate(raw, sa_token_gate)?;
        crate::metrics::register_credential_provider_metrics();
        crate::metrics::v134::set_credential_provider_config_hash(hash);
        let mut out = Vec::new();
        for cfg in providers {
            let bin = bin_dir.join(&cfg.name);
            check_executable(&bin)?;
            tracing::info!(provider = %cfg.name, bin = %bin.display(), "registered credential provider");
            out.push(Provider {
                cfg,
                bin,
                timeout: EXEC_TIMEOUT,
                state: Default::default(),
            });
        }
        Ok(CredentialProviders {
            providers: out,
            service_accounts: Default::default(),
        })
    }

    /// The plugins `--image-credential-provider-config` and
    /// `--image-credential-provider-bin-dir` name; `None` when neither is
    /// set (upstream registers plugins when either is).
    pub fn from_flags(
        cfg: &crate::config::KubeletConfiguration,
    ) -> Result<Option<Arc<Self>>, ConfigError> {
        let (config, bin_dir) = (
            &cfg.image_credential_provider_config,
            &cfg.image_credential_provider_bin_dir,
        );
        if config.is_empty() && bin_dir.is_empty() {
            return Ok(None);
        }
        let gate = cfg.feature_gate(SA_TOKEN_GATE);
        Self::load_gated(Path::new(config), Path::new(bin_dir), gate).map(|p| Some(Arc::new(p)))
    }

    /// Where service-account-token mode gets ServiceAccounts and tokens
    /// (cluster mode; set once). Without it such providers get an error
    /// for pods with a service account, as upstream's standalone kubelet.
    pub fn set_service_accounts(&self, source: Arc<dyn ServiceAccountSource>) {
        let _ = self.service_accounts.set(source);
    }

    /// The plugins' logins for an image (as [`super::keyring::repo_to_pull`]
    /// gives it, the form upstream sends plugins), most specific location
    /// first: every matching provider's `auth` map goes into one keyring,
    /// in config order, as upstream's externalCredentialProviderKeyring.
    pub async fn lookup(&self, image: &str, pod: &PodRef) -> Vec<Credential> {
        let mut ring = Keyring::default();
        let source = self.service_accounts.get().map(|s| s.as_ref());
        for p in self.providers.iter().filter(|p| p.matches(image)) {
            for (loc, cred) in p.provide(image, pod, source).await.iter() {
                ring.insert(loc, cred.clone(), &p.cfg.name);
            }
        }
        ring.finish();
        ring.lookup(image)
    }
}

/// Go's exec.LookPath on a path: a file with an execute bit.
fn check_executable(bin: &Path) -> Result<(), ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(bin) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(ConfigError::ExecutableMissing(bin.into()))
        }
        Err(source) => Err(ConfigError::Executable {
            path: bin.into(),
            source,
        }),
        Ok(m) if m.is_dir() || m.permissions().mode() & 0o111 == 0 => {
            Err(ConfigError::Executable {
                path: bin.into(),
                source: std::io::ErrorKind::PermissionDenied.into(),
            })
        }
        Ok(_) => Ok(()),
    }
}

/// A provider directory for tests: `<dir>/bin/<name>` runs `body` (sh)
/// with `$DIR` set to `dir` by the config's env, and the config names it
/// with `extra` YAML lines for the provider.
#[cfg(test)]
pub(crate) fn test_providers(
    dir: &Path,
    name: &str,
    body: &str,
    extra: &str,
) -> Result<CredentialProviders, ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = bin.join(name);
    std::fs::write(&script, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: {name}\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  env:\n  - name: DIR\n    value: {}\n{extra}",
            dir.display()
        ),
    )
    .unwrap();
    CredentialProviders::load(&config, &bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(name: &str) -> PathBuf {
        crate::testutil::tempdir(&format!("credprov-{name}"))
    }

    /// The plugin of most tests: counts its runs, keeps each request and
    /// its arguments, and answers `$DIR/response`.
    const RECORDING: &str = r#"n=$(( $(cat "$DIR/count" 2>/dev/null || echo 0) + 1 ))
echo $n > "$DIR/count"
cat > "$DIR/request.$n"
echo "$@" > "$DIR/args"
cat "$DIR/response""#;

    fn runs(dir: &Path) -> u32 {
        std::fs::read_to_string(dir.join("count"))
            .map(|s| s.trim().parse().unwrap())
            .unwrap_or(0)
    }

    fn response(key_type: &str, duration: Option<&str>, auth: &str) -> String {
        let d = duration.map_or(String::new(), |d| format!(r#""cacheDuration": "{d}","#));
        format!(
            r#"{{"apiVersion": "credentialprovider.kubelet.k8s.io/v1", "kind": "CredentialProviderResponse", "cacheKeyType": "{key_type}", {d} "auth": {auth}}}"#
        )
    }

    fn users(creds: &[Credential]) -> Vec<&str> {
        creds.iter().map(|c| c.username.as_str()).collect()
    }

    /// A pod without a service account.
    static NO_POD: PodRef = PodRef {
        namespace: String::new(),
        name: String::new(),
        uid: String::new(),
        service_account: String::new(),
    };

    const MATCH_ALL_IO: &str = "  matchImages: [\"*.io\"]\n  defaultCacheDuration: 1h\n";

    #[test]
    fn config_is_decoded_and_validated_as_upstream() {
        let dir = tempdir("config");
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for name in ["ecr", "gcr"] {
            use std::os::unix::fs::PermissionsExt;
            let p = bin.join(name);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::write(bin.join("plain"), "").unwrap();
        let load = |text: &str| {
            let path = dir.join("c.yaml");
            std::fs::write(&path, text).unwrap();
            CredentialProviders::load(&path, &bin)
                .map(|p| p.providers.into_iter().map(|p| p.cfg).collect::<Vec<_>>())
        };
        let head = "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\n";
        let ok = load(&format!(
            "{head}providers:\n- name: ecr\n  matchImages: [\"*.dkr.ecr.*.amazonaws.com\", \"registry.io:8080/path\"]\n  defaultCacheDuration: 12h\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  args: [get-credentials]\n  env: [{{name: AWS_PROFILE, value: nodes}}]\n"
        ))
        .unwrap();
        assert_eq!(
            ok,
            vec![ProviderConfig {
                name: "ecr".into(),
                match_images: vec![
                    "*.dkr.ecr.*.amazonaws.com".into(),
                    "registry.io:8080/path".into()
                ],
                default_cache_duration: Duration::from_secs(12 * 3600),
                api_version: "credentialprovider.kubelet.k8s.io/v1".into(),
                args: vec!["get-credentials".into()],
                env: vec![("AWS_PROFILE".into(), "nodes".into())],
                token_attributes: None,
            }]
        );
        // JSON and the older config versions decode too.
        let json = r#"{"apiVersion": "kubelet.config.k8s.io/v1alpha1", "kind": "CredentialProviderConfig",
            "providers": [{"name": "gcr", "matchImages": ["gcr.io"], "defaultCacheDuration": "0s",
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1alpha1"}]}"#;
        assert_eq!(
            load(json).unwrap()[0].default_cache_duration,
            Duration::ZERO
        );

        let provider = |body: &str| format!("{head}providers:\n- {body}\n");
        let good = "matchImages: [gcr.io]\n  defaultCacheDuration: 1m\n  apiVersion: credentialprovider.kubelet.k8s.io/v1";
        let cases: Vec<(String, &str)> = vec![
            (
                "apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n".into(),
                "(wrong Kind)",
            ),
            (
                "apiVersion: kubelet.config.k8s.io/v2\nkind: CredentialProviderConfig\n".into(),
                "no kind \"CredentialProviderConfig\" is registered for version \"kubelet.config.k8s.io/v2\"",
            ),
            ("kind: CredentialProviderConfig\n".into(), "'apiVersion' is missing"),
            (format!("{head}provider: []\n"), "unknown field `provider`"),
            (
                format!("{head}providers: []\n"),
                "failed to validate credential provider config: providers: Required value: at least 1 item in plugins is required",
            ),
            (
                provider(&format!("name: a/b\n  {good}")),
                "providers.name: Invalid value: \"a/b\": provider name cannot contain '/'",
            ),
            (
                provider("name: ecr\n  matchImages: [gcr.io]\n  defaultCacheDuration: 1m"),
                "validate credential provider config: providers.apiVersion: Required value",
            ),
            (
                provider("name: ecr\n  matchImages: [gcr.io]\n  defaultCacheDuration: 1m\n  apiVersion: credentialprovider.kubelet.k8s.io/v2"),
                "providers.apiVersion: Unsupported value: \"credentialprovider.kubelet.k8s.io/v2\": supported values: \"credentialprovider.kubelet.k8s.io/v1\", \"credentialprovider.kubelet.k8s.io/v1alpha1\", \"credentialprovider.kubelet.k8s.io/v1beta1\"",
            ),
            (
                provider("name: ecr\n  defaultCacheDuration: 1m\n  apiVersion: credentialprovider.kubelet.k8s.io/v1"),
                "providers.matchImages: Required value: at least 1 item in matchImages is required",
            ),
            (
                provider("name: ecr\n  matchImages: [\"reg.io:http\"]\n  defaultCacheDuration: 1m\n  apiVersion: credentialprovider.kubelet.k8s.io/v1"),
                "providers.matchImages: Invalid value: \"reg.io:http\": match image is invalid: parse \"https://reg.io:http\": invalid port \":http\" after host",
            ),
            (
                provider("name: ecr\n  matchImages: [gcr.io]\n  apiVersion: credentialprovider.kubelet.k8s.io/v1"),
                "providers.defaultCacheDuration: Required value",
            ),
            (
                provider("name: ecr\n  matchImages: [gcr.io]\n  defaultCacheDuration: -1m\n  apiVersion: credentialprovider.kubelet.k8s.io/v1"),
                "defaultCacheDuration must be greater than or equal to 0",
            ),
            (
                provider(&format!("name: ecr\n  {good}\n  tokenAttributes: {{serviceAccountTokenAudience: x, requireServiceAccount: true}}")),
                "providers.tokenAttributes.cacheType: Required value: cacheType is required to be set when tokenAttributes is specified. Supported values are: ServiceAccount, Token",
            ),
            (
                format!("{head}providers:\n- name: ecr\n  {good}\n- name: ecr\n  {good}\n"),
                "duplicate provider name \"ecr\" found in configuration file(s)",
            ),
            // Several errors: bracketed, as Go's aggregate.
            (
                provider("name: ..\n  matchImages: []"),
                "config: [providers.name: Invalid value: \"..\": provider name cannot be '..', providers.apiVersion: Required value, providers.matchImages: Required value",
            ),
            (
                provider(&format!("name: missing\n  {good}")),
                "plugin binary executable",
            ),
            (provider(&format!("name: plain\n  {good}")), "permission denied"),
        ];
        for (text, want) in cases {
            let e = load(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}\n got: {e}\nwant: {want}");
        }

        // A directory: its .json/.yaml/.yml files in lexical order; names
        // unique across them.
        let cdir = dir.join("conf.d");
        std::fs::create_dir_all(&cdir).unwrap();
        std::fs::write(
            cdir.join("b.yaml"),
            provider(&format!("name: ecr\n  {good}")),
        )
        .unwrap();
        std::fs::write(
            cdir.join("a.yml"),
            provider(&format!("name: gcr\n  {good}")),
        )
        .unwrap();
        std::fs::write(cdir.join("notes.txt"), "not a config").unwrap();
        let names: Vec<String> = CredentialProviders::load(&cdir, &bin)
            .unwrap()
            .providers
            .into_iter()
            .map(|p| p.cfg.name)
            .collect();
        assert_eq!(names, ["gcr", "ecr"]);
        std::fs::write(
            cdir.join("c.json"),
            provider(&format!("name: gcr\n  {good}")),
        )
        .unwrap();
        let e = CredentialProviders::load(&cdir, &bin).unwrap_err();
        assert!(
            matches!(e, ConfigError::DuplicateName(ref n) if n == "gcr"),
            "{e}"
        );

        let e = CredentialProviders::load(&dir.join("c.yaml"), &dir.join("nowhere")).unwrap_err();
        assert!(e.to_string().ends_with("nowhere did not exist"), "{e}");
        let e = CredentialProviders::load(Path::new(""), &bin).unwrap_err();
        assert_eq!(e.to_string(), "credential provider config path is empty");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn flags_set_neither_means_no_plugins_and_either_alone_fails_as_upstream() {
        let mut cfg = crate::config::KubeletConfiguration::default();
        assert!(CredentialProviders::from_flags(&cfg).unwrap().is_none());
        cfg.image_credential_provider_config = "/nonexistent/config.yaml".into();
        let e = CredentialProviders::from_flags(&cfg).unwrap_err();
        assert_eq!(e.to_string(), "plugin binary directory  did not exist");
    }

    #[test]
    fn match_images_follow_upstreams_documented_rules() {
        let m = urls_match;
        // staging/src/k8s.io/kubelet/config/v1/types.go, matchImages.
        assert!(m(
            "123456789.dkr.ecr.us-east-1.amazonaws.com",
            "123456789.dkr.ecr.us-east-1.amazonaws.com/app"
        ));
        assert!(m("*.azurecr.io", "team.azurecr.io/app"));
        assert!(!m("*.azurecr.io", "azurecr.io/app"));
        assert!(m("gcr.io", "gcr.io/project/app"));
        assert!(!m("gcr.io", "eu.gcr.io/project/app"));
        assert!(m("*.*.registry.io", "a.b.registry.io/x"));
        assert!(!m("*.*.registry.io", "b.registry.io/x"));
        assert!(m("registry.io:8080/path", "registry.io:8080/path/app"));
        assert!(!m("registry.io:8080/path", "registry.io/path/app"));
        assert!(!m("registry.io:8080/path", "registry.io:8080/other/app"));
        // Globs in a label, a whole TLD, one label each.
        assert!(m("k8s.*.io", "k8s.registry.io/x"));
        assert!(m("k8s.*", "k8s.io/x"));
        assert!(m("app*.k8s.io", "app1.k8s.io/x"));
        assert!(!m("*.io", "a.k8s.io/x"));
        // A port in the image must be in the pattern too.
        assert!(!m("registry.io", "registry.io:5000/x"));

        for ok in [
            "*.azurecr.io",
            "registry.io:8080/path",
            "[::1]:5000",
            "k8s.*",
        ] {
            assert_eq!(check_schemeless_url(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("reg.io:8o80", "invalid port \":8o80\" after host"),
            ("reg io", "invalid character \" \" in host name"),
            ("reg%zz.io", "invalid URL escape \"%zz\""),
            ("reg.io\n", "invalid control character"),
        ] {
            let e = check_schemeless_url(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn a_plugin_gets_upstreams_request_and_its_logins_are_looked_up() {
        let dir = tempdir("exec");
        let p = test_providers(
            &dir,
            "recorder",
            RECORDING,
            "  matchImages: [\"registry.io\"]\n  defaultCacheDuration: 1h\n  args: [get-credentials, --verbose]\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("response"),
            response(
                "Image",
                None,
                r#"{"registry.io": {"username": "host", "password": "h"},
                    "https://registry.io/v2/team": {"username": "team", "password": "t"},
                    "other.io": {"username": "other", "password": "o"}}"#,
            ),
        )
        .unwrap();
        let creds = p.lookup("registry.io/team/app", &NO_POD).await;
        // Most specific location first; other registries' logins not used.
        assert_eq!(users(&creds), ["team", "host"]);
        assert_eq!(creds[0].password, "t");
        let request = std::fs::read_to_string(dir.join("request.1")).unwrap();
        assert_eq!(
            request,
            "{\"kind\":\"CredentialProviderRequest\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"image\":\"registry.io/team/app\"}\n"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("args")).unwrap().trim(),
            "get-credentials --verbose"
        );
        // Not in matchImages: the plugin is not run.
        assert!(p.lookup("quay.io/team/app", &NO_POD).await.is_empty());
        assert_eq!(runs(&dir), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn answers_are_cached_by_cache_key_type_and_duration() {
        let auth = r#"{"*.io": {"username": "u", "password": "p"}}"#;
        // (response cacheKeyType, cacheDuration, defaultCacheDuration,
        // images looked up in turn, plugin runs expected after each).
        let cases = [
            (
                "Image",
                Some("1h"),
                "1h",
                ["reg.io/a", "reg.io/a", "reg.io/b", "other.io/a"],
                [1, 1, 2, 3],
            ),
            (
                "Registry",
                Some("1h"),
                "1h",
                ["reg.io/a", "reg.io/a", "reg.io/b", "other.io/a"],
                [1, 1, 1, 2],
            ),
            (
                "Global",
                Some("1h"),
                "1h",
                ["reg.io/a", "reg.io/a", "reg.io/b", "other.io/a"],
                [1, 1, 1, 1],
            ),
            // Zero in the response: not cached.
            (
                "Global",
                Some("0s"),
                "1h",
                ["reg.io/a", "reg.io/a", "reg.io/a", "reg.io/a"],
                [1, 2, 3, 4],
            ),
            // None in the response: the provider's default, zero or not.
            (
                "Image",
                None,
                "0s",
                ["reg.io/a", "reg.io/a", "reg.io/a", "reg.io/a"],
                [1, 2, 3, 4],
            ),
            (
                "Image",
                None,
                "1h",
                ["reg.io/a", "reg.io/a", "reg.io/a", "reg.io/a"],
                [1, 1, 1, 1],
            ),
        ];
        for (i, (key_type, duration, default, images, want)) in cases.into_iter().enumerate() {
            let dir = tempdir(&format!("cache{i}"));
            let p = test_providers(
                &dir,
                "recorder",
                RECORDING,
                &format!("  matchImages: [\"*.io\"]\n  defaultCacheDuration: {default}\n"),
            )
            .unwrap();
            std::fs::write(dir.join("response"), response(key_type, duration, auth)).unwrap();
            for (image, want) in images.into_iter().zip(want) {
                assert_eq!(
                    users(&p.lookup(image, &NO_POD).await),
                    ["u"],
                    "case {i} {image}"
                );
                assert_eq!(
                    runs(&dir),
                    want,
                    "case {i}: {key_type} {duration:?} {image}"
                );
            }
            let _ = std::fs::remove_dir_all(&dir);
        }

        // An entry serves until its duration has passed, not after.
        let dir = tempdir("expiry");
        let p = test_providers(&dir, "recorder", RECORDING, MATCH_ALL_IO).unwrap();
        std::fs::write(
            dir.join("response"),
            response("Registry", Some("10m"), auth),
        )
        .unwrap();
        p.lookup("reg.io/a", &NO_POD).await;
        let provider = &p.providers[0];
        let now = Instant::now();
        assert!(provider
            .cached("reg.io/b", None, now + Duration::from_secs(599))
            .is_some());
        assert!(provider
            .cached("reg.io/b", None, now + Duration::from_secs(601))
            .is_none());
        assert_eq!(provider.state.lock().cache.len(), 1);
        // Expired entries nobody asks for go at the next 15-minute purge.
        provider.cached("elsewhere.io/x", None, now + Duration::from_secs(16 * 60));
        assert!(provider.state.lock().cache.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn concurrent_lookups_of_one_image_share_one_plugin_run() {
        let dir = tempdir("flight");
        // The plugin waits on a FIFO the test opens only once both lookups
        // have started, so they overlap for certain.
        let body = format!("{RECORDING}\ncat \"$DIR/go\" > /dev/null");
        let p = test_providers(&dir, "slow", &body, MATCH_ALL_IO).unwrap();
        let auth = r#"{"reg.io": {"username": "u", "password": "p"}}"#;
        // Not cached: only the shared run can explain a single run.
        std::fs::write(dir.join("response"), response("Image", Some("0s"), auth)).unwrap();
        let fifo = std::ffi::CString::new(dir.join("go").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let release = || {
            let go = dir.join("go");
            tokio::task::spawn_blocking(move || {
                // Blocks until the plugin opens the FIFO to read.
                std::fs::write(go, "go\n").unwrap();
            })
        };
        // join! polls in order: both lookups have joined the flight
        // before the release starts.
        let (a, b, released) = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::join!(
                p.lookup("reg.io/app", &NO_POD),
                p.lookup("reg.io/app", &NO_POD),
                async { release().await }
            )
        })
        .await
        .expect("the plugin ran and was released");
        released.unwrap();
        assert_eq!((users(&a), users(&b)), (vec!["u"], vec!["u"]));
        assert_eq!(runs(&dir), 1);
        assert!(p.providers[0].state.lock().in_flight.is_empty());
        // A later lookup runs the plugin again.
        let (c, released) = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::join!(p.lookup("reg.io/app", &NO_POD), release())
        })
        .await
        .expect("the plugin ran and was released");
        released.unwrap();
        assert_eq!(users(&c), ["u"]);
        assert_eq!(runs(&dir), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_plugin_times_out_after_upstreams_minute() {
        let dir = tempdir("hang");
        let p = test_providers(&dir, "hang", "exec sleep 600", MATCH_ALL_IO).unwrap();
        let started = Instant::now();
        let e = p.providers[0].call("reg.io/app", None).await.unwrap_err();
        assert!(matches!(*e, PluginError::Timeout { .. }), "{e}");
        assert_eq!(started.elapsed(), EXEC_TIMEOUT);
        assert!(p.lookup("reg.io/app", &NO_POD).await.is_empty());
        // Both timed-out runs are errors in the metrics.
        assert_eq!(plugin_metrics("hang"), (2, 2));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn failing_and_garbled_plugins_give_no_logins() {
        let ok = response(
            "Image",
            None,
            r#"{"reg.io": {"username": "u", "password": "p"}}"#,
        );
        let cases: Vec<(String, &str)> = vec![
            ("echo boom >&2; exit 3".into(), "exit status 3: boom"),
            ("echo not json".into(), "error reading GVK from response"),
            (
                format!("echo '{}'", ok.replace("/v1\"", "/v1beta1\"")),
                "did not match expected apiVersion:credentialprovider.kubelet.k8s.io/v1, actual apiVersion:credentialprovider.kubelet.k8s.io/v1beta1",
            ),
            (
                format!("echo '{}'", ok.replace("Response\"", "Request\"")),
                "unexpected Kind: \"CredentialProviderRequest\"",
            ),
            (
                format!("echo '{}'", ok.replace("\"auth\"", "\"extra\": 1, \"auth\"")),
                "error decoding credential provider plugin response from stdout",
            ),
            (
                format!("echo '{}'", ok.replace("\"Image\"", "\"Pod\"")),
                "did not return a valid cacheKeyType: \"Pod\"",
            ),
            ("head -c 2000000 /dev/zero".into(), "wrote more than 1048576 bytes"),
        ];
        for (i, (body, want)) in cases.into_iter().enumerate() {
            let dir = tempdir(&format!("bad{i}"));
            let p = test_providers(&dir, "bad", &body, MATCH_ALL_IO).unwrap();
            let e = p.providers[0].call("reg.io/app", None).await.unwrap_err();
            assert!(e.to_string().contains(want), "{body}: {e}");
            assert!(p.lookup("reg.io/app", &NO_POD).await.is_empty());
            let _ = std::fs::remove_dir_all(&dir);
        }
        // The same answer from a working plugin is used (the cases above
        // fail for their flaw only).
        let dir = tempdir("good");
        let p = test_providers(&dir, "good", &format!("echo '{ok}'"), MATCH_ALL_IO).unwrap();
        assert_eq!(users(&p.lookup("reg.io/app", &NO_POD).await), ["u"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    // ---------------------------------------------------------------
    // Service-account-token mode.
    // ---------------------------------------------------------------

    /// ServiceAccounts by (namespace, name); tokens are
    /// `tok-<account>-<pod uid>`, so one pod always gets the same token
    /// and two pods different ones. Records every TokenRequest.
    #[derive(Default)]
    struct FakeAccounts {
        accounts: parking_lot::Mutex<HashMap<(String, String), Arc<ServiceAccount>>>,
        requests: parking_lot::Mutex<Vec<(String, String, String, TokenRequestSpec)>>,
    }

    impl FakeAccounts {
        fn add(&self, ns: &str, name: &str, uid: &str, annotations: &[(&str, &str)]) {
            let mut sa = ServiceAccount::default();
            sa.metadata.name = Some(name.into());
            sa.metadata.namespace = Some(ns.into());
            sa.metadata.uid = Some(uid.into());
            sa.metadata.annotations = Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            self.accounts
                .lock()
                .insert((ns.into(), name.into()), Arc::new(sa));
        }
    }

    #[async_trait::async_trait]
    impl ServiceAccountSource for FakeAccounts {
        async fn service_account(
            &self,
            namespace: &str,
            name: &str,
        ) -> Result<Arc<ServiceAccount>, ObjectError> {
            self.accounts
                .lock()
                .get(&(namespace.to_string(), name.to_string()))
                .cloned()
                .ok_or_else(|| ObjectError::NotFound {
                    kind: "serviceaccount",
                    name: name.into(),
                })
        }

        async fn token(
            &self,
            namespace: &str,
            name: &str,
            sa_uid: &str,
            spec: TokenRequestSpec,
        ) -> Result<String, ObjectError> {
            let pod_uid = spec
                .bound_object_ref
                .as_ref()
                .and_then(|r| r.uid.clone())
                .unwrap_or_default();
            self.requests
                .lock()
                .push((namespace.into(), name.into(), sa_uid.into(), spec));
            Ok(format!("tok-{name}-{pod_uid}"))
        }
    }

    fn pod(ns: &str, name: &str, uid: &str, sa: &str) -> PodRef {
        PodRef {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
            service_account: sa.into(),
        }
    }

    /// A recording provider in service-account-token mode with `attrs`
    /// (YAML flow mapping body), wired to a fresh fake.
    fn sa_providers(
        dir: &Path,
        name: &str,
        attrs: &str,
    ) -> (CredentialProviders, Arc<FakeAccounts>) {
        let p = test_providers(
            dir,
            name,
            RECORDING,
            &format!("{MATCH_ALL_IO}  tokenAttributes: {{{attrs}}}\n"),
        )
        .unwrap();
        let fake = Arc::new(FakeAccounts::default());
        p.set_service_accounts(fake.clone());
        (p, fake)
    }

    const SA_ATTRS: &str = "serviceAccountTokenAudience: registry.example, cacheType: ServiceAccount, requireServiceAccount: true, requiredServiceAccountAnnotationKeys: [example.com/role], optionalServiceAccountAnnotationKeys: [example.com/tier, example.com/absent]";

    #[test]
    fn token_attributes_are_validated_as_upstream() {
        let dir = tempdir("sa-config");
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            let p = bin.join("ecr");
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let load = |attrs: &str, api_version: &str, gate: bool| {
            let path = dir.join("c.yaml");
            std::fs::write(
                &path,
                format!("apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: ecr\n  matchImages: [\"*.io\"]\n  defaultCacheDuration: 1m\n  apiVersion: {api_version}\n  tokenAttributes: {{{attrs}}}\n"),
            )
            .unwrap();
            CredentialProviders::load_gated(&path, &bin, gate)
                .map(|p| p.providers.into_iter().map(|p| p.cfg).collect::<Vec<_>>())
        };
        const V1: &str = "credentialprovider.kubelet.k8s.io/v1";
        // Accepted: annotation keys are checked in lower case, as
        // ObjectMeta's.
        let ok = load(
            "serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: false, optionalServiceAccountAnnotationKeys: [Example.com/Role]",
            V1,
            true,
        )
        .unwrap();
        assert_eq!(
            ok[0].token_attributes,
            Some(TokenAttributes {
                audience: "aud".into(),
                cache_type: TokenCacheType::Token,
                require_service_account: false,
                required_annotation_keys: vec![],
                optional_annotation_keys: vec!["Example.com/Role".into()],
            })
        );
        let full = load(SA_ATTRS, V1, true).unwrap();
        let t = full[0].token_attributes.as_ref().unwrap();
        assert_eq!(t.cache_type, TokenCacheType::ServiceAccount);
        assert_eq!(t.required_annotation_keys, ["example.com/role"]);

        let name_rule = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
        let cases: Vec<(&str, &str, bool, String)> = vec![
            // The gate off refuses the mode (upstream's 1.34 default is on).
            (
                "serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: true",
                V1,
                false,
                "failed to validate credential provider config: providers.tokenAttributes: Forbidden: tokenAttributes is not supported when KubeletServiceAccountTokenForCredentialProviders feature gate is disabled".into(),
            ),
            (
                "cacheType: Token, requireServiceAccount: true",
                V1,
                true,
                "failed to validate credential provider config: providers.tokenAttributes.serviceAccountTokenAudience: Required value".into(),
            ),
            (
                "serviceAccountTokenAudience: aud, cacheType: Token",
                V1,
                true,
                "providers.tokenAttributes.requireServiceAccount: Required value".into(),
            ),
            (
                "serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: true",
                "credentialprovider.kubelet.k8s.io/v1beta1",
                true,
                "providers.tokenAttributes: Forbidden: tokenAttributes is only supported for credentialprovider.kubelet.k8s.io/v1 API version".into(),
            ),
            (
                "serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: false, requiredServiceAccountAnnotationKeys: [a.io/x]",
                V1,
                true,
                "providers.tokenAttributes.requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set".into(),
            ),
            (
                "serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: true, requiredServiceAccountAnnotationKeys: [\"bad key!\"]",
                V1,
                true,
                format!("providers.tokenAttributes.requiredServiceAccountAnnotationKeys: Invalid value: \"bad key!\": {name_rule}"),
            ),
            (
                "serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: true, optionalServiceAccountAnnotationKeys: [\"-x.io/a\"]",
                V1,
                true,
                "providers.tokenAttributes.optionalServiceAccountAnnotationKeys: Invalid value: \"-x.io/a\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into(),
            ),
            (
                "serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: true, optionalServiceAccountAnnotationKeys: [a.io/x, a.io/x]",
                V1,
                true,
                "providers.tokenAttributes.optionalServiceAccountAnnotationKeys: Duplicate value: \"a.io/x\"".into(),
            ),
            (
                "serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: true, requiredServiceAccountAnnotationKeys: [b.io/y, a.io/x], optionalServiceAccountAnnotationKeys: [a.io/x, b.io/y]",
                V1,
                true,
                "providers.tokenAttributes: Invalid value: []string{\"a.io/x\", \"b.io/y\"}: annotation keys cannot be both required and optional".into(),
            ),
            (
                "serviceAccountTokenAudience: aud, cacheType: Pod, requireServiceAccount: true",
                V1,
                true,
                "providers.tokenAttributes.cacheType: Unsupported value: \"Pod\": supported values: \"ServiceAccount\", \"Token\"".into(),
            ),
            // Strict decoding: unknown fields are errors.
            (
                "serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: true, audiences: [x]",
                V1,
                true,
                "unknown field `audiences`".into(),
            ),
            // Several errors: one bracketed aggregate.
            (
                "requireServiceAccount: true",
                "credentialprovider.kubelet.k8s.io/v1alpha1",
                true,
                "config: [providers.tokenAttributes.serviceAccountTokenAudience: Required value, providers.tokenAttributes: Forbidden: tokenAttributes is only supported for credentialprovider.kubelet.k8s.io/v1 API version, providers.tokenAttributes.cacheType: Required value".into(),
            ),
        ];
        for (attrs, api_version, gate, want) in cases {
            let e = load(attrs, api_version, gate).unwrap_err().to_string();
            assert!(e.contains(&want), "{attrs}\n got: {e}\nwant: {want}");
        }
        // Only the v1 config type has tokenAttributes: an unknown field in
        // the older ones.
        let path = dir.join("old.yaml");
        std::fs::write(
            &path,
            format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: CredentialProviderConfig\nproviders:\n- name: ecr\n  matchImages: [\"*.io\"]\n  defaultCacheDuration: 1m\n  apiVersion: {V1}\n  tokenAttributes: {{{SA_ATTRS}}}\n"),
        )
        .unwrap();
        let e = CredentialProviders::load(&path, &bin)
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("strict decoding error: unknown field \"providers[0].tokenAttributes\""),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_token_mode_plugin_gets_a_pod_bound_token_and_the_chosen_annotations() {
        let dir = tempdir("sa-request");
        let (p, fake) = sa_providers(&dir, "wi", SA_ATTRS);
        fake.add(
            "team",
            "builder",
            "sa-uid-1",
            &[
                ("example.com/role", "puller"),
                ("example.com/tier", "gold"),
                ("example.com/other", "not sent"),
            ],
        );
        std::fs::write(
            dir.join("response"),
            response(
                "Image",
                None,
                r#"{"reg.io": {"username": "oauth", "password": "from-token"}}"#,
            ),
        )
        .unwrap();
        let web = pod("team", "web", "pod-1", "builder");
        assert_eq!(users(&p.lookup("reg.io/app", &web).await), ["oauth"]);
        assert_eq!(
            std::fs::read_to_string(dir.join("request.1")).unwrap(),
            "{\"kind\":\"CredentialProviderRequest\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"image\":\"reg.io/app\",\"serviceAccountToken\":\"tok-builder-pod-1\",\"serviceAccountAnnotations\":{\"example.com/role\":\"puller\",\"example.com/tier\":\"gold\"}}\n"
        );
        // One TokenRequest: the configured audience, bound to the pod, the
        // account's UID as precondition, the server's default expiry.
        let reqs = fake.requests.lock().clone();
        assert_eq!(reqs.len(), 1);
        let (ns, name, uid, spec) = &reqs[0];
        assert_eq!(
            (ns.as_str(), name.as_str(), uid.as_str()),
            ("team", "builder", "sa-uid-1")
        );
        assert_eq!(spec.audiences, ["registry.example"]);
        assert_eq!(spec.expiration_seconds, None);
        assert_eq!(
            spec.bound_object_ref,
            Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some("web".into()),
                uid: Some("pod-1".into()),
            })
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn without_the_required_account_or_annotation_the_plugin_is_not_run() {
        let dir = tempdir("sa-optout");
        let (p, fake) = sa_providers(&dir, "wi", SA_ATTRS);
        fake.add("team", "plain", "sa-uid-2", &[("example.com/tier", "gold")]);
        std::fs::write(
            dir.join("response"),
            response(
                "Image",
                Some("0s"),
                r#"{"reg.io": {"username": "u", "password": "p"}}"#,
            ),
        )
        .unwrap();
        let provider = &p.providers[0];
        let source: &dyn ServiceAccountSource = fake.as_ref();
        let err = |pod: PodRef| async move {
            provider
                .provide_result("reg.io/app", &pod, Some(source))
                .await
                .unwrap_err()
                .to_string()
        };
        // The account lacks a required annotation: upstream's error, no
        // token asked for, no plugin run.
        assert_eq!(
            err(pod("team", "web", "pod-1", "plain")).await,
            "required annotation example.com/role not found"
        );
        assert!(fake.requests.lock().is_empty());
        // requireServiceAccount and a pod without one.
        assert_eq!(
            err(pod("team", "static", "pod-2", "")).await,
            "service account name is empty for pod team/static"
        );
        // The account does not exist.
        assert_eq!(
            err(pod("team", "web", "pod-1", "ghost")).await,
            "failed to get service account team/ghost: serviceaccount \"ghost\" not found"
        );
        assert!(p
            .lookup("reg.io/app", &pod("team", "web", "pod-1", "plain"))
            .await
            .is_empty());
        assert_eq!(runs(&dir), 0);

        // requireServiceAccount false: a pod without an account gets the
        // plugin run without a token.
        let dir2 = tempdir("sa-optional");
        let (p2, _) = sa_providers(
            &dir2,
            "wi",
            "serviceAccountTokenAudience: aud, cacheType: ServiceAccount, requireServiceAccount: false",
        );
        std::fs::write(
            dir2.join("response"),
            response(
                "Image",
                None,
                r#"{"reg.io": {"username": "anon", "password": "p"}}"#,
            ),
        )
        .unwrap();
        assert_eq!(
            users(
                &p2.lookup("reg.io/app", &pod("kube-system", "etcd", "s1", ""))
                    .await
            ),
            ["anon"]
        );
        assert_eq!(
            std::fs::read_to_string(dir2.join("request.1")).unwrap(),
            "{\"kind\":\"CredentialProviderRequest\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"image\":\"reg.io/app\"}\n"
        );

        // Standalone (no API server): a pod with an account gets nothing.
        let dir3 = tempdir("sa-standalone");
        let p3 = test_providers(
            &dir3,
            "wi",
            RECORDING,
            &format!("{MATCH_ALL_IO}  tokenAttributes: {{{SA_ATTRS}}}\n"),
        )
        .unwrap();
        let e = p3.providers[0]
            .provide_result("reg.io/app", &pod("team", "web", "pod-1", "builder"), None)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no API server"), "{e}");
        assert_eq!(runs(&dir3), 0);
        for d in [dir, dir2, dir3] {
            let _ = std::fs::remove_dir_all(&d);
        }
    }

    #[tokio::test]
    async fn token_mode_answers_are_cached_per_account_or_per_token() {
        let auth = r#"{"reg.io": {"username": "u", "password": "p"}}"#;
        // (cacheType, pods looked up in turn, plugin runs after each).
        let cases = [
            (
                "ServiceAccount",
                // Two pods of one account share an answer; another
                // account, or the same name in another namespace, does not.
                [
                    ("team", "a", "builder"),
                    ("team", "b", "builder"),
                    ("team", "a", "deployer"),
                    ("other", "a", "builder"),
                    ("team", "c", "builder"),
                ],
                [1, 1, 2, 3, 3],
            ),
            (
                "Token",
                // Each token has its own answer: a pod's second pull (same
                // token) is cached, another pod's is not.
                [
                    ("team", "a", "builder"),
                    ("team", "a", "builder"),
                    ("team", "b", "builder"),
                    ("team", "b", "builder"),
                    ("team", "a", "builder"),
                ],
                [1, 1, 2, 2, 2],
            ),
        ];
        for (i, (cache_type, pods, want)) in cases.into_iter().enumerate() {
            let dir = tempdir(&format!("sa-cache{i}"));
            let (p, fake) = sa_providers(
                &dir,
                "wi",
                &format!("serviceAccountTokenAudience: aud, cacheType: {cache_type}, requireServiceAccount: true, optionalServiceAccountAnnotationKeys: [example.com/tier]"),
            );
            for ns in ["team", "other"] {
                fake.add(ns, "builder", &format!("{ns}-builder-uid"), &[]);
                fake.add(ns, "deployer", &format!("{ns}-deployer-uid"), &[]);
            }
            std::fs::write(dir.join("response"), response("Registry", Some("1h"), auth)).unwrap();
            for ((ns, name, sa), want) in pods.into_iter().zip(want) {
                let podref = pod(ns, name, &format!("{ns}-{name}"), sa);
                assert_eq!(users(&p.lookup("reg.io/app", &podref).await), ["u"]);
                assert_eq!(runs(&dir), want, "{cache_type}: {ns}/{name} as {sa}");
            }
            // A changed annotation is a different key: the plugin runs again.
            fake.add(
                "team",
                "builder",
                "team-builder-uid",
                &[("example.com/tier", "gold")],
            );
            let before = runs(&dir);
            p.lookup("reg.io/app", &pod("team", "a", "team-a", "builder"))
                .await;
            assert_eq!(runs(&dir), before + 1, "{cache_type}: annotation change");
            // So is a recreated account (new UID).
            fake.add(
                "team",
                "builder",
                "team-builder-uid-2",
                &[("example.com/tier", "gold")],
            );
            p.lookup("reg.io/app", &pod("team", "a", "team-a", "builder"))
                .await;
            assert_eq!(runs(&dir), before + 2, "{cache_type}: new account UID");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[tokio::test]
    async fn a_token_echoed_as_password_is_used_only_with_cache_type_token() {
        for (cache_type, used) in [("ServiceAccount", false), ("Token", true)] {
            let dir = tempdir(&format!("sa-echo-{cache_type}"));
            let (p, fake) = sa_providers(
                &dir,
                "wi",
                &format!("serviceAccountTokenAudience: aud, cacheType: {cache_type}, requireServiceAccount: true"),
            );
            fake.add("team", "builder", "uid", &[]);
            // The fake's token for this pod, handed back as the password.
            std::fs::write(
                dir.join("response"),
                response(
                    "Image",
                    None,
                    r#"{"reg.io": {"username": "t", "password": "tok-builder-pod-1"}}"#,
                ),
            )
            .unwrap();
            let web = pod("team", "web", "pod-1", "builder");
            let got = p.lookup("reg.io/app", &web).await;
            assert_eq!(!got.is_empty(), used, "{cache_type}");
            if !used {
                let e = p.providers[0]
                    .provide_result("reg.io/app", &web, Some(fake.as_ref()))
                    .await
                    .unwrap_err();
                assert!(e.to_string().starts_with("credential provider plugin returned the service account token as the password for image \"reg.io/app\""), "{e}");
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// (duration observations, errors) of `plugin` in the process-wide
    /// metrics.
    fn plugin_metrics(plugin: &str) -> (u64, u64) {
        let mut reg = prometheus_client::registry::Registry::default();
        let m = &*crate::metrics::METRICS;
        reg.register("d", "d", m.credential_provider_plugin_duration.clone());
        reg.register("e", "e", m.credential_provider_plugin_errors.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        let value = |prefix: &str| {
            let want = format!("{prefix}{{plugin_name=\"{plugin}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&want))
                .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
        };
        (value("d_count"), value("e_total"))
    }

    #[tokio::test]
    async fn plugin_runs_are_timed_and_failed_runs_counted() {
        let dir = tempdir("metrics");
        let ok = response(
            "Image",
            Some("0s"),
            r#"{"reg.io": {"username": "u", "password": "p"}}"#,
        );
        let p = test_providers(&dir, "metrics-ok", &format!("echo '{ok}'"), MATCH_ALL_IO).unwrap();
        p.lookup("reg.io/app", &NO_POD).await;
        p.lookup("reg.io/app", &NO_POD).await;
        assert_eq!(plugin_metrics("metrics-ok"), (2, 0));
        // A failing run: timed and counted. A garbled answer from a run
        // that succeeded is not a run failure (upstream counts in runPlugin).
        let dir2 = tempdir("metrics-bad");
        let bad = test_providers(&dir2, "metrics-fail", "exit 2", MATCH_ALL_IO).unwrap();
        assert!(bad.lookup("reg.io/app", &NO_POD).await.is_empty());
        assert_eq!(plugin_metrics("metrics-fail"), (1, 1));
        let dir3 = tempdir("metrics-garbled");
        let garbled =
            test_providers(&dir3, "metrics-garbled", "echo nonsense", MATCH_ALL_IO).unwrap();
        assert!(garbled.lookup("reg.io/app", &NO_POD).await.is_empty());
        assert_eq!(plugin_metrics("metrics-garbled"), (1, 0));
        for d in [dir, dir2, dir3] {
            let _ = std::fs::remove_dir_all(&d);
        }
    }

    #[test]
    fn a_pods_identity_is_its_namespace_name_uid_and_service_account() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "team", "uid": "u1"},
            "spec": {"serviceAccountName": "builder", "containers": []}
        }))
        .unwrap();
        assert_eq!(PodRef::of(&p), pod("team", "web", "u1", "builder"));
        // A static pod as read from a file: no account.
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "etcd"}, "spec": {"containers": []}
        }))
        .unwrap();
        assert_eq!(PodRef::of(&p), pod("default", "etcd", "", ""));
    }
}
