//! ContainerConfig from a container spec (upstream `kuberuntime_container.go`
//! generateContainerConfig and `kuberuntime_container_linux.go`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::cm;
use crate::cri::v1;
use crate::objects::ObjectError;
use crate::volume;

use super::envvars::{self, EnvSources};
use super::{hash, labels, sandbox, RuntimeOptions};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Volume(#[from] volume::VolumeError),
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsUserRoot { pod: String, container: String },
    #[error("container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})")]
    RunAsRoot { pod: String, container: String },
    #[error("container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root (pod: {pod:?}, container: {container})")]
    NonNumericUser {
        user: String,
        pod: String,
        container: String,
    },
    #[error("couldn't resolve env {name}: {reason}")]
    Env { name: String, reason: String },
    /// A referenced object that is missing or unreadable: upstream's own
    /// message (`configmap "x" not found`).
    #[error(transparent)]
    Object(#[from] ObjectError),
    /// Static pods (no API server) cannot read API objects.
    #[error("couldn't get {kind} {namespace}/{name}, no kubeClient defined")]
    NoApiServer {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("couldn't find key {key} in {kind} {namespace}/{name}")]
    MissingKey {
        kind: &'static str,
        key: String,
        namespace: String,
        name: String,
    },
    #[error("failed to list services when setting up env vars")]
    ServiceList {
        #[source]
        source: ObjectError,
    },
    #[error("kubelet-managed file {path}: {source}")]
    ManagedFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Expands `$(VAR)` references from the container's env, `$$` escaping,
/// unknown references left as written (upstream `expansion.Expand`).
/// The cgroup settings a container is made with, and an in-place resize
/// sends (upstream generateLinuxContainerResources): shares from the cpu
/// request, quota over the CFS period (100 ms) from the cpu limit unless
/// `cpuCFSQuota` is off, the memory limit, then swap and the OOM group as
/// the node's memory policy says.
pub fn linux_resources(
    pod: &Pod,
    c: &Container,
    opts: &super::RuntimeOptions,
) -> v1::LinuxContainerResources {
    let res = cm::container_resources(c);
    let (cpu_period, cpu_quota) = cm::cfs().period_and_quota(res.cpu_limit);
    let mut r = v1::LinuxContainerResources {
        cpu_period,
        cpu_quota,
        cpu_shares: cm::cpu_shares(res.cpu_request),
        memory_limit_in_bytes: res.mem_limit.unwrap_or(0),
        oom_score_adj: cm::oom_score_adj(pod, c, opts.memory_capacity),
        ..Default::default()
    };
    opts.memory_policy.apply(pod, c, &mut r);
    r
}

pub fn expand(input: &str, env: &HashMap<String, String>) -> String {
    expand_with(input, &mut |name| env.get(name).cloned())
}

/// A subPathExpr expanded as upstream ExpandContainerVolumeMounts
/// (pkg/kubelet/container/helpers.go): a reference to a variable that is
/// unset or empty fails with `missing value for A, B` (names sorted).
pub fn expand_sub_path_expr(expr: &str, env: &HashMap<String, String>) -> Result<String, String> {
    let mut missing = std::collections::BTreeSet::new();
    let out = expand_with(expr, &mut |name| {
        let v = env.get(name).filter(|v| !v.is_empty()).cloned();
        if v.is_none() {
            missing.insert(name.to_string());
        }
        v
    });
    if missing.is_empty() {
        return Ok(out);
    }
    let names: Vec<String> = missing.into_iter().collect();
    Err(format!("missing value for {}", names.join(", ")))
}

fn expand_with(input: &str, lookup: &mut dyn FnMut(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('(') {
            match tail.find(')') {
                Some(end) => {
                    let name = &tail[..end];
                    match lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &tail[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = tail;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A downward-API fieldRef value (upstream podFieldSelectorRuntimeValue).
pub(crate) fn field_ref(pod: &Pod, path: &str, pod_ip: &str, host_ip: &str) -> Option<String> {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    // metadata.labels['key'] / metadata.annotations['key']
    let subscript = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix("['"))
            .and_then(|r| r.strip_suffix("']"))
    };
    if let Some(k) = subscript("metadata.labels") {
        return Some(
            m.labels
                .as_ref()
                .and_then(|l| l.get(k))
                .cloned()
                .unwrap_or_default(),
        );
    }
    if let Some(k) = subscript("metadata.annotations") {
        return Some(
            m.annotations
                .as_ref()
                .and_then(|a| a.get(k))
                .cloned()
                .unwrap_or_default(),
        );
    }
    Some(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" => pod_ip.to_string(),
        "status.hostIP" | "status.hostIPs" => host_ip.to_string(),
        _ => return None,
    })
}

/// A resourceFieldRef value (upstream ExtractContainerResourceValue): the
/// container's limit or request divided by the divisor and rounded up. A
/// cpu, memory or ephemeral-storage limit left unset (or zero) reads as the
/// pod-level limit, else the node's allocatable
/// (defaultPodLimitsForDownwardAPI); an unset request reads as 0.
pub(crate) fn resource_ref(
    opts: &RuntimeOptions,
    pod: &k8s_openapi::api::core::v1::Pod,
    c: &Container,
    resource: &str,
    divisor: Option<&str>,
) -> Option<String> {
    let (kind, name) = resource.split_once('.')?;
    let hugepages = name.starts_with("hugepages-");
    if !matches!(name, "cpu" | "memory" | "ephemeral-storage") && !hugepages {
        return None;
    }
    let is_cpu = name == "cpu";
    let parse = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        if is_cpu {
            cm::quantity::parse_cpu_millis(&q.0).ok()
        } else {
            cm::quantity::parse_bytes(&q.0).ok()
        }
    };
    let own = |list: Option<&std::collections::BTreeMap<_, _>>| list?.get(name).and_then(parse);
    let r = c.resources.as_ref();
    let value = match kind {
        "limits" => {
            let pod_level = || {
                let limits = pod.spec.as_ref()?.resources.as_ref()?.limits.as_ref();
                // Upstream replaces only the allocatable cpu and memory
                // with pod-level limits; huge pages get no default.
                own(limits).filter(|v| *v != 0 && matches!(name, "cpu" | "memory"))
            };
            let node = || match name {
                "cpu" => Some(opts.allocatable.cpu_milli),
                "memory" => Some(opts.allocatable.memory),
                "ephemeral-storage" => Some(opts.allocatable.ephemeral_storage),
                // Huge pages are never overcommitted: no default.
                _ => None,
            };
            own(r.and_then(|r| r.limits.as_ref()))
                .filter(|v| *v != 0)
                .or_else(pod_level)
                .or_else(node)
                .unwrap_or(0)
        }
        "requests" => {
            // A request left unset takes its limit (the API server's
            // defaulting; static pods get it from the file source).
            own(r.and_then(|r| r.requests.as_ref()))
                .or_else(|| own(r.and_then(|r| r.limits.as_ref())))
                .unwrap_or(0)
        }
        _ => return None,
    };
    let div = divisor.filter(|d| !d.is_empty() && *d != "0");
    let d = if is_cpu {
        // Millicores over the divisor in millicores (default 1 core).
        div.and_then(|d| cm::quantity::parse_cpu_millis(d).ok())
            .filter(|d| *d > 0)
            .unwrap_or(1000)
    } else {
        div.and_then(|d| cm::quantity::parse_bytes(d).ok())
            .filter(|d| *d > 0)
            .unwrap_or(1)
    };
    Some(((value + d - 1) / d).to_string())
}

/// A container's environment as built, with what upstream reports as
/// events rather than errors.
#[derive(Debug, Default)]
pub(crate) struct Env {
    pub pairs: Vec<(String, String)>,
    /// InvalidEnvironmentVariableNames messages, one per envFrom source.
    pub invalid_names: Vec<String>,
}

/// Upstream's relaxed env var name rule (RelaxedEnvironmentVariableValidation,
/// locked on since 1.34): printable ASCII but `=`.
fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b'=')
}

/// A referenced ConfigMap or Secret from what was fetched: `None` when it
/// is missing and the reference is optional (upstream skips it then).
fn fetched<'s, T>(
    map: &'s HashMap<String, Result<Arc<T>, ObjectError>>,
    kind: &'static str,
    ns: &str,
    name: &str,
    optional: bool,
) -> Result<Option<&'s T>, ConfigError> {
    let no_api = || ConfigError::NoApiServer {
        kind,
        namespace: ns.to_string(),
        name: name.to_string(),
    };
    match map.get(name) {
        Some(Ok(v)) => Ok(Some(v)),
        // Upstream fails before looking at `optional` without a client.
        Some(Err(ObjectError::NoApiServer { .. })) | None => Err(no_api()),
        Some(Err(e)) if e.is_not_found() && optional => Ok(None),
        Some(Err(e)) => Err(e.clone().into()),
    }
}

/// Ordered name/value pairs where a later value for a name replaces the
/// earlier one in place (upstream keeps a map; this keeps it stable).
#[derive(Default)]
struct OrderedEnv {
    pairs: Vec<(String, String)>,
    index: HashMap<String, usize>,
    /// What `$(VAR)` expands from: the pairs so far over the service links.
    ctx: HashMap<String, String>,
}

impl OrderedEnv {
    fn set(&mut self, name: String, value: String) {
        self.ctx.insert(name.clone(), value.clone());
        match self.index.get(&name) {
            Some(&i) => self.pairs[i].1 = value,
            None => {
                self.index.insert(name.clone(), self.pairs.len());
                self.pairs.push((name, value));
            }
        }
    }

    /// A service link, unless the container already set that name.
    fn add_unset(&mut self, name: String, value: String) {
        if !self.index.contains_key(&name) {
            self.index.insert(name.clone(), self.pairs.len());
            self.pairs.push((name, value));
        }
    }
}

/// The container's env in upstream makeEnvironmentVariables' order and
/// precedence: envFrom sources first, then `env` entries (replacing
/// envFrom values of the same name), then service-link variables for
/// names still unset. `$(VAR)` in values expands from what is set so far,
/// then from the service links.
pub(crate) fn env_pairs(
    opts: &RuntimeOptions,
    pod: &Pod,
    c: &Container,
    pod_ip: &str,
    sources: &EnvSources,
) -> Result<Env, ConfigError> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let services = sources
        .services
        .as_ref()
        .map_err(|e| ConfigError::ServiceList { source: e.clone() })?;
    let service_env = envvars::service_env(ns, envvars::service_links_enabled(pod), services);
    let mut env = OrderedEnv::default();
    // Service links are expandable but shadowed by anything the container
    // sets; the first of duplicate link names wins, as when adding them.
    for (k, v) in service_env.iter().rev() {
        env.ctx.insert(k.clone(), v.clone());
    }
    let mut invalid_names = Vec::new();

    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let (what, name, data): (&str, &str, Vec<(&String, String)>) =
            if let Some(r) = &from.config_map_ref {
                let Some(cm) = fetched(
                    &sources.config_maps,
                    "configMap",
                    ns,
                    &r.name,
                    r.optional.unwrap_or(false),
                )?
                else {
                    continue;
                };
                let data = cm.data.iter().flatten().map(|(k, v)| (k, v.clone()));
                ("configMap", &r.name, data.collect())
            } else if let Some(r) = &from.secret_ref {
                let Some(s) = fetched(
                    &sources.secrets,
                    "secret",
                    ns,
                    &r.name,
                    r.optional.unwrap_or(false),
                )?
                else {
                    continue;
                };
                let data = s
                    .data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()));
                ("secret", &r.name, data.collect())
            } else {
                continue;
            };
        let mut invalid = Vec::new();
        for (k, v) in data {
            let k = format!("{prefix}{k}");
            if valid_env_name(&k) {
                env.set(k, v);
            } else {
                invalid.push(k);
            }
        }
        if !invalid.is_empty() {
            invalid.sort();
            invalid_names.push(format!(
                "Keys [{}] from the EnvFrom {what} {ns}/{name} were skipped since they are considered invalid environment variable names.",
                invalid.join(", ")
            ));
        }
    }

    for e in c.env.iter().flatten() {
        let from = e.value_from.as_ref();
        let value = if let Some(v) = e.value.as_deref().filter(|v| !v.is_empty()) {
            expand(v, &env.ctx)
        } else if let Some(fr) = from.and_then(|vf| vf.field_ref.as_ref()) {
            field_ref(pod, &fr.field_path, pod_ip, &opts.node_ip).ok_or_else(|| {
                ConfigError::Env {
                    name: e.name.clone(),
                    reason: format!("unsupported fieldPath {:?}", fr.field_path),
                }
            })?
        } else if let Some(rr) = from.and_then(|vf| vf.resource_field_ref.as_ref()) {
            resource_ref(
                opts,
                pod,
                c,
                &rr.resource,
                rr.divisor.as_ref().map(|q| q.0.as_str()),
            )
            .ok_or_else(|| ConfigError::Env {
                name: e.name.clone(),
                reason: format!("unsupported resource {:?}", rr.resource),
            })?
        } else if let Some(r) = from.and_then(|vf| vf.config_map_key_ref.as_ref()) {
            let optional = r.optional.unwrap_or(false);
            let Some(cm) = fetched(&sources.config_maps, "configMap", ns, &r.name, optional)?
            else {
                continue;
            };
            match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
                Some(v) => v.clone(),
                None if optional => continue,
                None => {
                    return Err(ConfigError::MissingKey {
                        kind: "ConfigMap",
                        key: r.key.clone(),
                        namespace: ns.to_string(),
                        name: r.name.clone(),
                    })
                }
            }
        } else if let Some(r) = from.and_then(|vf| vf.secret_key_ref.as_ref()) {
            let optional = r.optional.unwrap_or(false);
            let Some(s) = fetched(&sources.secrets, "secret", ns, &r.name, optional)? else {
                continue;
            };
            match s.data.as_ref().and_then(|d| d.get(&r.key)) {
                Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                None if optional => continue,
                None => {
                    return Err(ConfigError::MissingKey {
                        kind: "Secret",
                        key: r.key.clone(),
                        namespace: ns.to_string(),
                        name: r.name.clone(),
                    })
                }
            }
        } else {
            // No value and no source upstream knows (or none at all): set
            // empty, as upstream does.
            String::new()
        };
        env.set(e.name.clone(), value);
    }

    for (k, v) in service_env {
        env.add_unset(k, v);
    }
    Ok(Env {
        pairs: env.pairs,
        invalid_names,
    })
}

/// The file behind terminationMessagePath: one per container instance under
/// the pod's directory, world-writable so any container user can write it
/// (upstream makes it 0666 too). Skipped when a volume already covers the path.
fn termination_message_mount(
    opts: &RuntimeOptions,
    pod: &Pod,
    c: &Container,
    mounts: &[v1::Mount],
) -> Result<Option<v1::Mount>, ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    let path = c
        .termination_message_path
        .as_deref()
        .unwrap_or("/dev/termination-log");
    if path.is_empty() || mounts.iter().any(|m| m.container_path == path) {
        return Ok(None);
    }
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let dir = volume::pod_dir(&opts.root_dir, uid)
        .join("containers")
        .join(&c.name);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let file = dir.join(format!("{stamp:x}"));
    let io = |source| ConfigError::ManagedFile {
        path: file.clone(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(io)?;
    std::fs::File::create(&file).map_err(io)?;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).map_err(io)?;
    Ok(Some(v1::Mount {
        container_path: path.to_string(),
        host_path: file.to_string_lossy().into_owned(),
        ..Default::default()
    }))
}

/// Upstream verifyRunAsNonRoot: an explicit runAsUser decides; otherwise
/// the image's user must be a known non-zero uid.
fn verify_non_root(
    pod: &Pod,
    c: &Container,
    run_as_user: Option<i64>,
    image_user: &crate::images::ImageUser,
) -> Result<(), ConfigError> {
    use crate::images::ImageUser;
    let pod_ref = format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default()
    );
    let (pod, container) = (pod_ref, c.name.clone());
    match (run_as_user, image_user) {
        (Some(0), _) => Err(ConfigError::RunAsUserRoot { pod, container }),
        (Some(_), _) => Ok(()),
        (None, ImageUser::Uid(0)) => Err(ConfigError::RunAsRoot { pod, container }),
        (None, ImageUser::Uid(_)) => Ok(()),
        (None, ImageUser::Name(user)) => Err(ConfigError::NonNumericUser {
            user: user.clone(),
            pod,
            container,
        }),
    }
}

/// The kubelet-managed /etc/hosts, written into the pod's directory and
/// bind-mounted, unless a volume already mounts /etc/hosts (upstream).
fn hosts_mount(
    opts: &RuntimeOptions,
    pod: &Pod,
    pod_ip: &str,
    mounts: &[v1::Mount],
) -> Result<Option<v1::Mount>, ConfigError> {
    if mounts.iter().any(|m| m.container_path == "/etc/hosts") {
        return Ok(None);
    }
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let path = volume::pod_dir(&opts.root_dir, uid).join("etc-hosts");
    let ips: Vec<String> = if pod_ip.is_empty() {
        vec![]
    } else {
        vec![pod_ip.to_string()]
    };
    let io = |source| ConfigError::ManagedFile {
        path: path.clone(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    std::fs::write(&path, sandbox::hosts_file(opts, pod, &ips)).map_err(io)?;
    Ok(Some(v1::Mount {
        container_path: "/etc/hosts".into(),
        host_path: path.to_string_lossy().into_owned(),
        ..Default::default()
    }))
}

pub struct ContainerContext<'a> {
    pub pod: &'a Pod,
    pub container: &'a Container,
    pub init: bool,
    pub restart_count: i32,
    pub image: &'a crate::images::ReadyImage,
    pub pod_ip: &'a str,
    pub volumes: &'a HashMap<String, PathBuf>,
    /// The ConfigMaps, Secrets and Services the env reads, fetched before.
    pub env: &'a EnvSources,
    /// An ephemeral container's target: the ID of the running container
    /// whose process namespace it joins (CRI NamespaceMode TARGET).
    pub pid_target: Option<&'a str>,
}

pub fn container_config(
    opts: &RuntimeOptions,
    ctx: &ContainerContext<'_>,
) -> Result<v1::ContainerConfig, ConfigError> {
    let (pod, c) = (ctx.pod, ctx.container);
    let Env {
        pairs: envs,
        invalid_names,
    } = env_pairs(opts, pod, c, ctx.pod_ip, ctx.env)?;
    for message in invalid_names {
        crate::events::pod(
            pod,
            None,
            crate::events::WARNING,
            "InvalidEnvironmentVariableNames",
            message,
        );
    }
    let env_map: HashMap<String, String> = envs.iter().cloned().collect();
    let ex = |v: &Option<Vec<String>>| {
        v.iter()
            .flatten()
            .map(|s| expand(s, &env_map))
            .collect::<Vec<_>>()
    };
    let sc = c.security_context.as_ref();
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let run_as_user = sc
        .and_then(|s| s.run_as_user)
        .or(psc.and_then(|s| s.run_as_user));
    let run_as_group = sc
        .and_then(|s| s.run_as_group)
        .or(psc.and_then(|s| s.run_as_group));
    let non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or(psc.and_then(|s| s.run_as_non_root))
        .unwrap_or(false);
    if non_root {
        verify_non_root(pod, c, run_as_user, &ctx.image.user)?;
    }
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let mut mounts = volume::container_mounts(
        pod,
        c,
        ctx.volumes,
        &volume::subpaths_dir(&opts.root_dir, uid),
        &|s| expand_sub_path_expr(s, &env_map),
    )?;
    if let Some(m) = termination_message_mount(opts, pod, c, &mounts)? {
        mounts.push(m);
    }
    if let Some(m) = hosts_mount(opts, pod, ctx.pod_ip, &mounts)? {
        mounts.push(m);
    }
    mounts.sort_by(|a, b| a.container_path.cmp(&b.container_path));
    let devices = volume::container_devices(&opts.root_dir, pod, c, ctx.volumes)?;
    Ok(v1::ContainerConfig {
        devices,
        metadata: Some(v1::ContainerMetadata {
            name: c.name.clone(),
            attempt: ctx.restart_count as u32,
        }),
        image: Some(v1::ImageSpec {
            image: ctx.image.id.clone(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: ex(&c.command),
        args: ex(&c.args),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: envs
            .into_iter()
            .map(|(key, value)| v1::KeyValue { key, value })
            .collect(),
        mounts,
        labels: labels::container_labels(pod, c, ctx.init),
        annotations: labels::container_annotations(
            pod,
            c,
            ctx.restart_count,
            &hash::container_hash(c),
        ),
        log_path: format!("{}/{}.log", c.name, ctx.restart_count),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(v1::LinuxContainerConfig {
            resources: Some(linux_resources(pod, c, opts)),
            security_context: Some(v1::LinuxContainerSecurityContext {
                capabilities: caps.map(|k| v1::Capability {
                    add_capabilities: k.add.clone().unwrap_or_default(),
                    drop_capabilities: k.drop.clone().unwrap_or_default(),
                    ..Default::default()
                }),
                privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
                namespace_options: Some({
                    let mut ns = sandbox::namespace_options(pod);
                    if let Some(target) = ctx.pid_target {
                        ns.pid = v1::NamespaceMode::Target as i32;
                        ns.target_id = target.to_string();
                    }
                    ns
                }),
                run_as_user: run_as_user.map(|value| v1::Int64Value { value }),
                run_as_group: run_as_group.map(|value| v1::Int64Value { value }),
                readonly_rootfs: sc
                    .and_then(|s| s.read_only_root_filesystem)
                    .unwrap_or(false),
                // Upstream determineEffectiveSecurityContext: the fsGroup
                // joins them, so the container can use its volumes.
                supplemental_groups: sandbox::supplemental_groups(psc),
                supplemental_groups_policy: sandbox::supplemental_groups_policy(psc),
                no_new_privs: sc
                    .and_then(|s| s.allow_privilege_escalation)
                    .map(|a| !a)
                    .unwrap_or(false),
                ..Default::default()
            }),
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_follows_upstream_rules() {
        let env: HashMap<String, String> = [("A".to_string(), "x".to_string())].into();
        assert_eq!(expand("$(A)-$(B)", &env), "x-$(B)");
        assert_eq!(expand("$$(A)", &env), "$(A)");
        assert_eq!(expand("a$b", &env), "a$b");
        assert_eq!(expand("$(A", &env), "$(A");
    }

    /// Upstream ExpandContainerVolumeMounts: unset or empty variables fail
    /// the subPathExpr, all of them named, sorted. The old code left
    /// `$(B)` in the path and created a directory of that name.
    #[test]
    fn a_sub_path_expr_with_an_unset_or_empty_variable_fails_as_upstream() {
        let env: HashMap<String, String> = [
            ("A".to_string(), "x".to_string()),
            ("E".to_string(), String::new()),
        ]
        .into();
        assert_eq!(expand_sub_path_expr("$(A)/y", &env).as_deref(), Ok("x/y"));
        assert_eq!(expand_sub_path_expr("$$(B)", &env).as_deref(), Ok("$(B)"));
        assert_eq!(
            expand_sub_path_expr("$(B)/$(E)/$(A)", &env),
            Err("missing value for B, E".to_string())
        );
    }

    #[test]
    fn downward_api_fields_and_resources_resolve() {
        use k8s_openapi::api::core::v1::{
            EnvVar, EnvVarSource, ObjectFieldSelector, ResourceFieldSelector, ResourceRequirements,
        };
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        let field = |n: &str, path: &str| EnvVar {
            name: n.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let res = |n: &str, r: &str, d: Option<&str>| EnvVar {
            name: n.into(),
            value_from: Some(EnvVarSource {
                resource_field_ref: Some(ResourceFieldSelector {
                    resource: r.into(),
                    divisor: d.map(|d| Quantity(d.into())),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = Container {
            name: "c".into(),
            env: Some(vec![
                field("APP", "metadata.labels['app']"),
                field("NAME", "metadata.name"),
                res("CPU", "limits.cpu", Some("1m")),
                res("MEM", "limits.memory", Some("1Mi")),
                EnvVar {
                    name: "X".into(),
                    value: Some("$(NAME)-$(APP)".into()),
                    ..Default::default()
                },
            ]),
            resources: Some(ResourceRequirements {
                limits: Some(
                    [
                        ("cpu".to_string(), Quantity("250m".into())),
                        ("memory".to_string(), Quantity("64Mi".into())),
                    ]
                    .into(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let none = EnvSources::default();
        let env = env_pairs(&RuntimeOptions::default(), &pod, &c, "10.0.0.1", &none)
            .unwrap()
            .pairs;
        let get = |k: &str| env.iter().find(|(n, _)| n == k).unwrap().1.clone();
        assert_eq!(
            (get("APP"), get("NAME"), get("CPU"), get("MEM"), get("X")),
            (
                "web".into(),
                "p".into(),
                "250".into(),
                "64".into(),
                "p-web".into()
            )
        );
        // Unset limits read as the pod-level limit, else the node's
        // allocatable (not its capacity); unset requests as 0. Old code:
        // capacity, no pod-level limits, no ephemeral-storage or huge pages.
        let opts = RuntimeOptions {
            allocatable: crate::kuberuntime::Allocatable {
                cpu_milli: 3500,
                memory: 900 << 20,
                ephemeral_storage: 10 << 30,
            },
            ..Default::default()
        };
        let bare = Container {
            name: "c".into(),
            ..Default::default()
        };
        let value = |pod: &Pod, r: &str, d: Option<&str>| resource_ref(&opts, pod, &bare, r, d);
        assert_eq!(value(&pod, "limits.cpu", None).as_deref(), Some("4"));
        assert_eq!(
            value(&pod, "limits.cpu", Some("1m")).as_deref(),
            Some("3500")
        );
        assert_eq!(
            value(&pod, "limits.memory", Some("1Mi")).as_deref(),
            Some("900")
        );
        assert_eq!(
            value(&pod, "limits.ephemeral-storage", Some("1Gi")).as_deref(),
            Some("10")
        );
        assert_eq!(value(&pod, "requests.memory", None).as_deref(), Some("0"));
        assert_eq!(
            value(&pod, "limits.hugepages-2Mi", None).as_deref(),
            Some("0")
        );
        assert_eq!(value(&pod, "limits.nvidia.com/gpu", None), None);
        let mut sized = pod.clone();
        sized.spec.get_or_insert_with(Default::default).resources = Some(ResourceRequirements {
            limits: Some(
                [
                    ("cpu".to_string(), Quantity("1500m".into())),
                    ("memory".to_string(), Quantity("256Mi".into())),
                    ("hugepages-2Mi".to_string(), Quantity("4Mi".into())),
                ]
                .into(),
            ),
            ..Default::default()
        });
        assert_eq!(
            value(&sized, "limits.cpu", Some("1m")).as_deref(),
            Some("1500")
        );
        assert_eq!(
            value(&sized, "limits.memory", Some("1Mi")).as_deref(),
            Some("256")
        );
        // Old code: a pod-level huge pages limit was the default too.
        assert_eq!(
            value(&sized, "limits.hugepages-2Mi", None).as_deref(),
            Some("0")
        );
        // The container's own limit still comes first.
        assert_eq!(
            resource_ref(&opts, &sized, &c, "limits.memory", Some("1Mi")).as_deref(),
            Some("64")
        );

        let bad = Container {
            name: "c".into(),
            env: Some(vec![field("Y", "spec.nope")]),
            ..Default::default()
        };
        assert!(matches!(
            env_pairs(&RuntimeOptions::default(), &pod, &bad, "", &none),
            Err(ConfigError::Env { .. })
        ));
    }

    #[test]
    fn run_as_non_root_checks_the_explicit_user_then_the_image_user() {
        use crate::images::ImageUser;
        let pod = Pod::default();
        let c = Container {
            name: "c".into(),
            ..Default::default()
        };
        assert!(matches!(
            verify_non_root(&pod, &c, Some(0), &ImageUser::Uid(1000)),
            Err(ConfigError::RunAsUserRoot { .. })
        ));
        assert!(verify_non_root(&pod, &c, Some(1000), &ImageUser::Uid(0)).is_ok());
        assert!(matches!(
            verify_non_root(&pod, &c, None, &ImageUser::Uid(0)),
            Err(ConfigError::RunAsRoot { .. })
        ));
        assert!(verify_non_root(&pod, &c, None, &ImageUser::Uid(65534)).is_ok());
        assert!(matches!(
            verify_non_root(&pod, &c, None, &ImageUser::Name("app".into())),
            Err(ConfigError::NonNumericUser { .. })
        ));
    }

    mod sources {
        use super::super::*;
        use crate::kuberuntime::envvars::test_service;
        use k8s_openapi::api::core::v1::{
            ConfigMap, ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, EnvVar,
            EnvVarSource, PodSpec, Secret, SecretEnvSource, SecretKeySelector,
        };
        use k8s_openapi::ByteString;

        fn pod(links: Option<bool>) -> Pod {
            let mut p = Pod {
                spec: Some(PodSpec {
                    enable_service_links: links,
                    ..Default::default()
                }),
                ..Default::default()
            };
            p.metadata.namespace = Some("ns".into());
            p
        }

        fn cm(data: &[(&str, &str)]) -> Result<Arc<ConfigMap>, ObjectError> {
            Ok(Arc::new(ConfigMap {
                data: Some(
                    data.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            }))
        }

        fn secret(data: &[(&str, &str)]) -> Result<Arc<Secret>, ObjectError> {
            Ok(Arc::new(Secret {
                data: Some(
                    data.iter()
                        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                        .collect(),
                ),
                ..Default::default()
            }))
        }

        fn missing(kind: &'static str, name: &str) -> ObjectError {
            ObjectError::NotFound {
                kind,
                name: name.into(),
            }
        }

        fn from_cm(name: &str, prefix: Option<&str>, optional: bool) -> EnvFromSource {
            EnvFromSource {
                prefix: prefix.map(String::from),
                config_map_ref: Some(ConfigMapEnvSource {
                    name: name.into(),
                    optional: Some(optional),
                }),
                ..Default::default()
            }
        }

        fn from_secret(name: &str, prefix: Option<&str>, optional: bool) -> EnvFromSource {
            EnvFromSource {
                prefix: prefix.map(String::from),
                secret_ref: Some(SecretEnvSource {
                    name: name.into(),
                    optional: Some(optional),
                }),
                ..Default::default()
            }
        }

        fn val(name: &str, v: &str) -> EnvVar {
            EnvVar {
                name: name.into(),
                value: Some(v.into()),
                ..Default::default()
            }
        }

        fn cm_key(name: &str, cm: &str, key: &str, optional: bool) -> EnvVar {
            EnvVar {
                name: name.into(),
                value_from: Some(EnvVarSource {
                    config_map_key_ref: Some(ConfigMapKeySelector {
                        name: cm.into(),
                        key: key.into(),
                        optional: Some(optional),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }
        }

        fn secret_key(name: &str, s: &str, key: &str, optional: bool) -> EnvVar {
            EnvVar {
                name: name.into(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: s.into(),
                        key: key.into(),
                        optional: Some(optional),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }
        }

        fn container(env_from: Vec<EnvFromSource>, env: Vec<EnvVar>) -> Container {
            Container {
                name: "c".into(),
                env_from: Some(env_from),
                env: Some(env),
                ..Default::default()
            }
        }

        fn run(pod: &Pod, c: &Container, src: &EnvSources) -> Result<Env, ConfigError> {
            env_pairs(&RuntimeOptions::default(), pod, c, "10.1.0.5", src)
        }

        #[test]
        fn env_from_then_env_then_service_links_with_upstream_precedence() {
            let src = EnvSources {
                config_maps: [("cfg".to_string(), cm(&[("b", "cm-b"), ("a", "cm-a")]))].into(),
                secrets: [(
                    "sec".to_string(),
                    secret(&[("a", "secret-a"), ("tok", "t0k")]),
                )]
                .into(),
                services: Ok(vec![
                    test_service(
                        "default",
                        "kubernetes",
                        "10.96.0.1",
                        &[(Some("https"), 443, "")],
                    ),
                    test_service("ns", "web", "10.0.0.2", &[(None, 80, "")]),
                ]),
            };
            let c = container(
                vec![
                    from_cm("cfg", None, false),
                    from_secret("sec", Some("S_"), false),
                ],
                vec![
                    // Replaces the envFrom value in place.
                    val("a", "env-a:$(b):$(S_tok)"),
                    val("WEB_SERVICE_HOST", "mine"),
                    val(
                        "URL",
                        "http://$(WEB_SERVICE_HOST):$(WEB_SERVICE_PORT)/$(LATER)",
                    ),
                    cm_key("FROM_CM", "cfg", "b", false),
                    secret_key("FROM_SECRET", "sec", "tok", false),
                    val("LATER", "x"),
                ],
            );
            let env = run(&pod(None), &c, &src).unwrap();
            assert!(env.invalid_names.is_empty());
            let names: Vec<&str> = env.pairs.iter().map(|(k, _)| k.as_str()).collect();
            // envFrom keys in source order, env entries after, then links.
            assert_eq!(
                &names[..8],
                [
                    "a",
                    "b",
                    "S_a",
                    "S_tok",
                    "WEB_SERVICE_HOST",
                    "URL",
                    "FROM_CM",
                    "FROM_SECRET"
                ]
            );
            assert_eq!(names[8], "LATER");
            let get = |k: &str| {
                env.pairs
                    .iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v.as_str())
            };
            assert_eq!(get("a"), Some("env-a:cm-b:t0k"));
            assert_eq!(get("S_a"), Some("secret-a"));
            // Set by the container: kept, and what $(…) sees; an unset
            // later entry is not expanded; other links expand.
            assert_eq!(get("WEB_SERVICE_HOST"), Some("mine"));
            assert_eq!(get("URL"), Some("http://mine:80/$(LATER)"));
            assert_eq!(get("FROM_CM"), Some("cm-b"));
            assert_eq!(get("FROM_SECRET"), Some("t0k"));
            assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
            assert_eq!(get("WEB_PORT_80_TCP_ADDR"), Some("10.0.0.2"));
            assert_eq!(
                names.iter().filter(|n| **n == "WEB_SERVICE_HOST").count(),
                1,
                "{names:?}"
            );

            // Links off: the master service's variables stay.
            let env = run(&pod(Some(false)), &c, &src).unwrap();
            let get = |k: &str| {
                env.pairs
                    .iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v.as_str())
            };
            assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("443"));
            assert_eq!(get("WEB_SERVICE_PORT"), None);
        }

        #[test]
        fn missing_objects_and_keys_fail_with_upstream_messages_unless_optional() {
            let src = EnvSources {
                config_maps: [
                    ("cfg".to_string(), cm(&[("k", "v")])),
                    ("gone".to_string(), Err(missing("configmap", "gone"))),
                ]
                .into(),
                secrets: [
                    ("sec".to_string(), secret(&[("k", "v")])),
                    ("nosec".to_string(), Err(missing("secret", "nosec"))),
                ]
                .into(),
                services: Ok(vec![]),
            };
            let msg = |c: Container| run(&pod(None), &c, &src).unwrap_err().to_string();
            assert_eq!(
                msg(container(vec![from_cm("gone", None, false)], vec![])),
                r#"configmap "gone" not found"#
            );
            assert_eq!(
                msg(container(
                    vec![],
                    vec![secret_key("X", "nosec", "k", false)]
                )),
                r#"secret "nosec" not found"#
            );
            assert_eq!(
                msg(container(vec![], vec![cm_key("X", "cfg", "nope", false)])),
                "couldn't find key nope in ConfigMap ns/cfg"
            );
            assert_eq!(
                msg(container(
                    vec![],
                    vec![secret_key("X", "sec", "nope", false)]
                )),
                "couldn't find key nope in Secret ns/sec"
            );

            // Optional: the variable is left out, nothing fails.
            let c = container(
                vec![
                    from_cm("gone", None, true),
                    from_secret("nosec", None, true),
                ],
                vec![
                    cm_key("A", "gone", "k", true),
                    cm_key("B", "cfg", "nope", true),
                    secret_key("C", "nosec", "k", true),
                    secret_key("D", "sec", "nope", true),
                    cm_key("E", "cfg", "k", true),
                ],
            );
            let env = run(&pod(None), &c, &src).unwrap();
            assert_eq!(env.pairs, vec![("E".to_string(), "v".to_string())]);

            // An API error other than NotFound fails even when optional.
            let src = EnvSources {
                config_maps: [(
                    "cfg".to_string(),
                    Err(ObjectError::Api {
                        kind: "configmap",
                        name: "cfg".into(),
                        message: "forbidden".into(),
                    }),
                )]
                .into(),
                ..Default::default()
            };
            let e = run(
                &pod(None),
                &container(vec![from_cm("cfg", None, true)], vec![]),
                &src,
            );
            assert_eq!(e.unwrap_err().to_string(), r#"configmap "cfg": forbidden"#);
        }

        #[test]
        fn without_an_api_server_references_report_it_and_service_errors_fail() {
            // A static pod: nothing could be fetched, optional or not.
            let src = EnvSources {
                config_maps: [(
                    "cfg".to_string(),
                    Err(ObjectError::NoApiServer {
                        kind: "configmap",
                        name: "cfg".into(),
                    }),
                )]
                .into(),
                ..Default::default()
            };
            let e = run(
                &pod(None),
                &container(vec![from_cm("cfg", None, true)], vec![]),
                &src,
            );
            assert_eq!(
                e.unwrap_err().to_string(),
                "couldn't get configMap ns/cfg, no kubeClient defined"
            );
            let e = run(
                &pod(None),
                &container(vec![], vec![secret_key("X", "s", "k", false)]),
                &EnvSources::default(),
            );
            assert_eq!(
                e.unwrap_err().to_string(),
                "couldn't get secret ns/s, no kubeClient defined"
            );
            let src = EnvSources {
                services: Err(ObjectError::Api {
                    kind: "service",
                    name: "ns".into(),
                    message: "timeout".into(),
                }),
                ..Default::default()
            };
            let e = run(&pod(None), &container(vec![], vec![val("A", "1")]), &src);
            assert_eq!(
                e.unwrap_err().to_string(),
                "failed to list services when setting up env vars"
            );
        }

        #[test]
        fn env_from_prefixes_keys_and_skips_invalid_names_with_a_report() {
            let src = EnvSources {
                config_maps: [(
                    "cfg".to_string(),
                    cm(&[("ok", "1"), ("b=d", "2"), ("1st.key-x", "3"), ("a=c", "4")]),
                )]
                .into(),
                secrets: [("sec".to_string(), secret(&[("tab\tkey", "5"), ("s", "6")]))].into(),
                services: Ok(vec![]),
            };
            let c = container(
                vec![
                    from_cm("cfg", Some("P_"), false),
                    from_secret("sec", None, false),
                ],
                vec![],
            );
            let env = run(&pod(None), &c, &src).unwrap();
            assert_eq!(
                env.pairs,
                vec![
                    ("P_1st.key-x".to_string(), "3".to_string()),
                    ("P_ok".to_string(), "1".to_string()),
                    ("s".to_string(), "6".to_string()),
                ]
            );
            assert_eq!(
                env.invalid_names,
                vec![
                    "Keys [P_a=c, P_b=d] from the EnvFrom configMap ns/cfg were skipped since they are considered invalid environment variable names.".to_string(),
                    "Keys [tab\tkey] from the EnvFrom secret ns/sec were skipped since they are considered invalid environment variable names.".to_string(),
                ]
            );
        }
    }
}
