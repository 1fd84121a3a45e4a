//! The runtime manager: turns a pod spec into CRI calls and reads back what
//! the runtime runs (upstream `pkg/kubelet/kuberuntime`).

pub mod actions;
pub mod backoff;
pub mod container;
pub mod envvars;
pub mod gc;
pub mod hash;
pub mod labels;
pub mod lifecycle;
pub mod pod_status;
pub mod sandbox;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::events;
use parking_lot::Mutex;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::cri::{self, CriError, RuntimeService};
use crate::images::ImageManager;
use crate::volume;

pub use pod_status::{CState, ContainerInfo, RuntimePod, SandboxInfo};

use backoff::Backoff;

/// Settings from the kubelet configuration that shape CRI requests.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    /// Where the `<pod>_<ns>_<container>-<id>.log` symlinks that log
    /// collectors read live (upstream ContainerLogsDir).
    pub container_logs_dir: PathBuf,
    pub cgroup_root: String,
    pub systemd_cgroups: bool,
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    pub resolv_conf: PathBuf,
    pub node_ip: String,
    pub memory_capacity: i64,
    /// Containers' swap limit and OOM group.
    pub memory_policy: crate::cm::node::MemoryPolicy,
    /// The node's allocatable cpu (millicores), memory and
    /// ephemeral-storage (bytes): what the downward API shows for a limit
    /// nobody set.
    pub allocatable: Allocatable,
    pub runtime_handler: String,
    /// seccompDefault: RuntimeDefault instead of Unconfined when a pod sets none.
    pub seccomp_default: bool,
    /// The PodObservedGenerationTracking gate: statuses carry the pod's
    /// generation as `observedGeneration`.
    pub track_observed_generation: bool,
}

/// The node's allocatable resources (its Node's `status.allocatable`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Allocatable {
    pub cpu_milli: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
}

impl Allocatable {
    /// From admission's node facts (milli-units).
    pub fn of(f: &crate::lifecycle::NodeFacts) -> Self {
        let clamp = |v: i128| v.clamp(0, i64::MAX as i128) as i64;
        Allocatable {
            cpu_milli: clamp(f.cpu_milli),
            memory: clamp(f.memory_milli / 1000),
            ephemeral_storage: clamp(f.ephemeral_milli / 1000),
        }
    }
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            root_dir: PathBuf::from("/var/lib/kubelet"),
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            container_logs_dir: PathBuf::from("/var/log/containers"),
            cgroup_root: String::new(),
            systemd_cgroups: false,
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            node_ip: String::new(),
            memory_capacity: 1 << 30,
            memory_policy: Default::default(),
            allocatable: Allocatable {
                cpu_milli: std::thread::available_parallelism()
                    .map(|n| n.get() as i64 * 1000)
                    .unwrap_or(1000),
                memory: 1 << 30,
                ephemeral_storage: 1 << 40,
            },
            runtime_handler: String::new(),
            seccomp_default: false,
            track_observed_generation: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error("pod log directory {path}: {source}")]
    LogDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why a container is waiting, as the status manager reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

/// The outcome of one sync of a pod.
#[derive(Debug, Default)]
pub struct SyncResult {
    /// Container name → why it is not running (CrashLoopBackOff, ErrImagePull, ...).
    pub waiting: HashMap<String, Waiting>,
    /// Sync again after this long (backoff expiry, or a retry after an error).
    pub requeue_after: Option<Duration>,
    pub errors: Vec<String>,
    /// Whether this sync asked the runtime to change anything; if not, the
    /// runtime view read before it is still current.
    pub changed: bool,
}

impl SyncResult {
    fn requeue(&mut self, after: Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(after, |d| d.min(after)));
    }
}

/// How long one blocking file-system step of a sync may take.
const FS_DEADLINE: Duration = Duration::from_secs(30);
/// Termination messages are small files: a status read waits this long
/// for them, then goes on without.
const TERMINATION_READ_DEADLINE: Duration = Duration::from_secs(5);

pub fn wall_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

fn ns_to_duration(ns: i64) -> Duration {
    Duration::from_nanos(ns.max(0) as u64)
}

pub struct RuntimeManager {
    pub runtime: Arc<dyn RuntimeService>,
    pub images: ImageManager,
    pub opts: RuntimeOptions,
    /// ConfigMaps, Secrets, tokens and Services the pod's env and volumes read.
    pub objects: crate::objects::ObjectManager,
    /// Sets up the pods' volumes; pod syncs wait for it.
    pub volumes: volume::manager::VolumeManager,
    /// The resources each pod was granted (in-place resize).
    pub allocation: crate::allocation::AllocationManager,
    /// The runtime's last Status answer (its handlers' features).
    pub runtime_state: crate::runtimestate::RuntimeState,
    /// The pods' cgroups (disabled unless the kubelet starts it).
    pub cgroups: crate::cm::manager::ContainerManager,
    /// The containers' cpusets (pins nothing unless the kubelet starts it).
    pub cpu: crate::cm::cpumanager::CpuManager,
    /// How many dead containers are kept (the deprecated GC flags).
    pub container_gc: gc::Policy,
    backoff: Mutex<Backoff>,
    /// The last actions computed per pod UID and when, for `/debug/pods`.
    last_actions: Mutex<HashMap<String, (std::time::SystemTime, actions::PodActions)>>,
    /// The last in-place resize that failed, per pod UID: its message
    /// (upstream's PodResizeInProgress condition with reason Error).
    resize_errors: Mutex<HashMap<String, String>>,
}

fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

impl RuntimeManager {
    pub fn new(
        runtime: Arc<dyn RuntimeService>,
        images: ImageManager,
        opts: RuntimeOptions,
    ) -> Self {
        RuntimeManager {
            runtime,
            images,
            opts: opts.clone(),
            objects: crate::objects::ObjectManager::default(),
            volumes: volume::manager::VolumeManager::new(
                crate::objects::ObjectManager::default(),
                opts.clone(),
            ),
            allocation: Default::default(),
            runtime_state: Default::default(),
            cgroups: Default::default(),
            cpu: Default::default(),
            container_gc: Default::default(),
            backoff: Mutex::new(Backoff::container()),
            last_actions: Mutex::new(HashMap::new()),
            resize_errors: Mutex::new(HashMap::new()),
        }
    }

    /// Restarts crashed containers after `initial`, doubling up to `max`.
    pub fn with_crash_loop_backoff(self, initial: Duration, max: Duration) -> Self {
        *self.backoff.lock() = Backoff::new(initial, max);
        self
    }

    /// Reads API objects through `objects` (cluster mode).
    pub fn with_objects(mut self, objects: crate::objects::ObjectManager) -> Self {
        self.volumes = volume::manager::VolumeManager::new(objects.clone(), self.opts.clone());
        self.objects = objects;
        self
    }

    /// Why the pod's last in-place resize failed, if it did.
    pub fn resize_error(&self, uid: &str) -> Option<String> {
        self.resize_errors.lock().get(uid).cloned()
    }

    /// The last actions computed for the pod, and when.
    pub fn last_actions(&self, uid: &str) -> Option<(std::time::SystemTime, actions::PodActions)> {
        self.last_actions.lock().get(uid).cloned()
    }

    /// The pod's container restart backoff entries: (container, window,
    /// time since the last restart).
    pub fn restart_backoff(&self, pod: &Pod) -> Vec<(String, Duration, Duration)> {
        let prefix = format!(
            "{}_{}_{}_",
            pod_name(pod),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.uid.as_deref().unwrap_or_default()
        );
        self.backoff
            .lock()
            .entries_with_prefix(&prefix, wall_now())
            .into_iter()
            .map(|(k, w, since)| {
                // The key ends in _<spec hash>; the container name is between.
                let rest = &k[prefix.len()..];
                let name = rest.rsplit_once('_').map_or(rest, |(n, _)| n).to_string();
                (name, w, since)
            })
            .collect()
    }

    /// Drops restart and pull backoff entries past their reset window
    /// (upstream backOff.GC() in housekeeping), so pod churn does not grow
    /// them.
    pub fn gc_backoff(&self) {
        let now = wall_now();
        self.backoff.lock().gc(now);
        self.images.gc_backoff(now);
    }

    /// Reads the pod's sandboxes and containers from the runtime. Each call
    /// carries the CRI deadline, so a hung inspect delays only this pod.
    pub async fn pod_status(&self, uid: &str) -> Result<RuntimePod, RuntimeError> {
        let sandboxes = self
            .runtime
            .list_pod_sandbox(Some(cri::PodSandboxFilter {
                label_selector: labels::pod_selector(uid),
                ..Default::default()
            }))
            .await?;
        let containers = self
            .runtime
            .list_containers(Some(cri::ContainerFilter {
                label_selector: labels::pod_selector(uid),
                ..Default::default()
            }))
            .await?;
        let mut rt = RuntimePod {
            uid: uid.to_string(),
            ..Default::default()
        };
        for sb in &sandboxes {
            match self.runtime.pod_sandbox_status(&sb.id).await {
                Ok(s) => rt.sandboxes.push(SandboxInfo::from_cri(&s)),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut reads = Vec::new();
        for c in &containers {
            match self.runtime.container_status(&c.id).await {
                Ok(s) => {
                    if let Some(src) = ContainerInfo::termination_source(&s) {
                        reads.push((rt.containers.len(), src));
                    }
                    rt.containers
                        .push(ContainerInfo::from_cri(&s, &c.pod_sandbox_id));
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        if !reads.is_empty() {
            // Termination messages live in files of the pod (a volume may
            // sit on a hung mount): read them off the async threads.
            let (idx, srcs): (Vec<_>, Vec<_>) = reads.into_iter().unzip();
            let read = crate::blocking::run(
                format!("termination messages of pod {uid}"),
                TERMINATION_READ_DEADLINE,
                move || srcs.iter().map(|s| s.read()).collect::<Vec<_>>(),
            )
            .await;
            match read {
                Ok(msgs) => {
                    for (i, m) in idx.into_iter().zip(msgs) {
                        rt.containers[i].with_termination_message(m);
                    }
                }
                Err(e) => warn!(pod_uid = uid, error = %e, "unable to read termination messages"),
            }
        }
        rt.sort();
        Ok(rt)
    }

    /// Applies an in-place resize to the running containers that need one
    /// (upstream doPodResizeAction's UpdateContainerResources calls). A
    /// failure is kept for the pod's PodResizeInProgress condition and the
    /// sync is retried.
    async fn resize_in_place(
        &self,
        pod: &Pod,
        rt: &RuntimePod,
        a: &actions::PodActions,
        result: &mut SyncResult,
    ) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if a.containers_to_update.is_empty() {
            // Nothing left to apply: no failure stands.
            self.resize_errors.lock().remove(&uid);
            return;
        }
        let started = std::time::Instant::now();
        let mut failed = None;
        // As upstream's validatePodResizeAction: a memory limit is not
        // lowered below what the container uses (cgroup v2 would OOM-kill
        // it, v1 would fail half-way), and nothing is applied then, so the
        // pod is never left half resized.
        let to_update: &[(String, String)] = match self.check_memory_decrease(pod, rt, a).await {
            Ok(()) => &a.containers_to_update,
            Err(e) => {
                warn!(pod = pod_name(pod), error = %e, "in-place resize is not feasible now");
                result.errors.push(format!("ResizePodInPlace: {e}"));
                result.requeue(Duration::from_secs(2));
                failed = Some(e);
                &[]
            }
        };
        // The pod's cgroup first where the resize raises its limits (the
        // kernel refuses a container more cpu than its pod), and after the
        // containers where it lowers them (upstream doPodResizeAction).
        if !to_update.is_empty() {
            if let Err(e) = self.cgroups.resize_pod_before(pod).await {
                warn!(pod = pod_name(pod), error = %e, "in-place resize of the pod cgroup failed");
                result.errors.push(format!("ResizePodInPlace: {e}"));
                result.requeue(Duration::from_secs(2));
                failed = Some(e.to_string());
            }
        }
        let to_update = if failed.is_some() { &[] } else { to_update };
        for (id, name) in to_update {
            let Some(c) = container_spec(pod, name) else {
                continue;
            };
            let linux = container::linux_resources(pod, c, &self.opts);
            info!(pod = pod_name(pod), container = %name, cpu_quota = linux.cpu_quota, cpu_shares = linux.cpu_shares, memory_limit = linux.memory_limit_in_bytes, "resizing container in place");
            if let Err(e) = self.runtime.update_container_resources(id, linux).await {
                warn!(pod = pod_name(pod), container = %name, error = %e, "in-place resize failed");
                result
                    .errors
                    .push(format!("UpdateContainerResources {name}: {e}"));
                result.requeue(Duration::from_secs(2));
                failed = Some(e.to_string());
            }
        }
        if !to_update.is_empty() && failed.is_none() {
            if let Err(e) = self.cgroups.resize_pod_after(pod).await {
                warn!(pod = pod_name(pod), error = %e, "in-place resize of the pod cgroup failed");
                result.errors.push(format!("ResizePodInPlace: {e}"));
                result.requeue(Duration::from_secs(2));
                failed = Some(e.to_string());
            }
        }
        crate::metrics::resize_actuated(started.elapsed(), failed.is_none());
        crate::stats::cgroup::limits_changed();
        let mut errors = self.resize_errors.lock();
        match failed {
            Some(m) => {
                errors.insert(uid, m);
            }
            None => {
                errors.remove(&uid);
            }
        }
    }

    /// Upstream validateMemoryResizeAction: every container whose memory
    /// limit the resize lowers (or sets) must use less than the new limit
    /// now. The error is upstream's message.
    async fn check_memory_decrease(
        &self,
        pod: &Pod,
        rt: &RuntimePod,
        a: &actions::PodActions,
    ) -> Result<(), String> {
        let lowered: Vec<(&str, &str, i64)> = a
            .containers_to_update
            .iter()
            .filter_map(|(id, name)| {
                let want = crate::cm::container_resources(container_spec(pod, name)?).mem_limit?;
                let have = rt
                    .containers
                    .iter()
                    .find(|c| &c.id == id)
                    .and_then(|c| c.resources.as_ref())
                    .map_or(0, |r| r.memory_limit_in_bytes);
                (want > 0 && (have <= 0 || want < have)).then_some((
                    id.as_str(),
                    name.as_str(),
                    want,
                ))
            })
            .collect();
        if lowered.is_empty() {
            return Ok(());
        }
        let sandbox = rt
            .sandboxes
            .first()
            .map(|s| s.id.clone())
            .unwrap_or_default();
        let filter = cri::v1::ContainerStatsFilter {
            pod_sandbox_id: sandbox,
            ..Default::default()
        };
        let stats = self
            .runtime
            .list_container_stats(Some(filter))
            .await
            .map_err(|_| {
                format!(
                    "unable to read memory usage for pod \"{}_{}({})\"",
                    pod_name(pod),
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.uid.as_deref().unwrap_or_default()
                )
            })?;
        let mut errs: Vec<String> = Vec::new();
        for (id, name, want) in lowered {
            let usage = stats
                .iter()
                .find(|s| s.attributes.as_ref().is_some_and(|at| at.id == id))
                .and_then(|s| s.memory.as_ref()?.usage_bytes.as_ref())
                .map(|u| u.value);
            let e = match usage {
                None => format!("missing container \"{name}\" memory usage"),
                // Upstream prints the pod's usage here by mistake; the
                // container's is what the message means.
                Some(u) if u >= want as u64 => format!(
                    "attempting to set container \"{name}\" memory limit ({want}) below current usage ({u})"
                ),
                Some(_) => continue,
            };
            if !errs.contains(&e) {
                errs.push(e);
            }
        }
        match errs.len() {
            0 => Ok(()),
            // Go's aggregate error: one message bare, more in brackets.
            1 => Err(format!("cannot decrease memory limits: {}", errs[0])),
            _ => Err(format!(
                "cannot decrease memory limits: [{}]",
                errs.join(", ")
            )),
        }
    }

    /// Brings the runtime in line with the pod spec (upstream SyncPod).
    pub async fn sync_pod(
        self: &Arc<Self>,
        pod: &Pod,
        rt: &RuntimePod,
        probes: &actions::ProbeState,
    ) -> SyncResult {
        let mut result = SyncResult::default();
        let a = actions::compute_pod_actions(pod, rt, probes);
        self.last_actions.lock().insert(
            pod.metadata.uid.clone().unwrap_or_default(),
            (std::time::SystemTime::now(), a.clone()),
        );
        result.changed = a.kill_pod
            || a.create_sandbox
            || !a.containers_to_kill.is_empty()
            || !a.init_to_start.is_empty()
            || !a.containers_to_start.is_empty()
            || !a.ephemeral_to_start.is_empty()
            || !a.containers_to_update.is_empty();
        debug!(pod = pod_name(pod), actions = ?a, "computed pod actions");
        if a.create_sandbox && a.sandbox_id.is_some() {
            events::pod(
                pod,
                None,
                events::NORMAL,
                "SandboxChanged",
                "Pod sandbox changed, it will be killed and re-created.".into(),
            );
        }

        if a.kill_pod {
            if let Err(e) = self.kill_pod(Some(pod), rt, None).await {
                result.errors.push(format!("KillPod: {e}"));
                result.requeue(Duration::from_secs(1));
                return result;
            }
        } else {
            let pod_ip = rt.ips().into_iter().next().unwrap_or_default();
            for k in &a.containers_to_kill {
                info!(pod = pod_name(pod), container = %k.name, reason = %k.reason, "killing container");
                // Upstream: "Container X failed liveness probe, will be restarted" etc.
                events::pod(
                    pod,
                    Some((&k.name, is_init(pod, &k.name))),
                    events::NORMAL,
                    "Killing",
                    k.reason.clone(),
                );
                let grace = grace_period(Some(pod), None);
                if let Err(e) = self
                    .kill_container(
                        Some(pod),
                        container_spec(pod, &k.name),
                        &k.id,
                        &k.name,
                        &pod_ip,
                        grace,
                    )
                    .await
                {
                    result.errors.push(format!("KillContainer {}: {e}", k.name));
                }
            }
            self.resize_in_place(pod, rt, &a, &mut result).await;
        }

        // The pod's cgroup, with its limits, before its sandbox goes in it
        // (upstream SyncPod's EnsureExists).
        if a.create_sandbox {
            if let Err(e) = self.cgroups.ensure_pod(pod).await {
                warn!(pod = pod_name(pod), error = %e, "unable to ensure pod container exists");
                events::pod(
                    pod,
                    None,
                    events::WARNING,
                    "FailedToCreatePodContainer",
                    format!("unable to ensure pod container exists: {e}"),
                );
                result.errors.push(format!(
                    "failed to ensure that the pod: {} cgroups exist and are correctly applied: {e}",
                    pod.metadata.uid.as_deref().unwrap_or_default()
                ));
                result.requeue(Duration::from_secs(10));
                return result;
            }
        }

        // The volume manager sets them up; a hung mount or a missing object
        // delays this pod only, and a kill cancels the wait.
        let set_up = self.volumes.wait_for_attach_and_mount(pod).await;
        let volumes = match set_up {
            Ok(v) => v,
            Err(e) => {
                warn!(pod = pod_name(pod), error = %e, "unable to set up volumes");
                for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
                    result.waiting.insert(
                        c.name.clone(),
                        Waiting {
                            reason: "ContainerCreating".into(),
                            message: e.to_string(),
                        },
                    );
                }
                result.errors.push(format!("FailedMount: {e}"));
                result.requeue(Duration::from_secs(2));
                return result;
            }
        };

        // Reads the host's resolv.conf: on a blocking thread.
        let (opts, owned, attempt) = (self.opts.clone(), pod.clone(), a.attempt);
        let sandbox_cfg = match crate::blocking::run(
            format!(
                "sandbox config for {}",
                pod.metadata.uid.as_deref().unwrap_or_default()
            ),
            FS_DEADLINE,
            move || sandbox::sandbox_config(&opts, &owned, attempt),
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                sandbox_failed(pod, &e.to_string());
                result.errors.push(format!("CreatePodSandbox: {e}"));
                return result;
            }
        };
        let mut pod_ip = rt.ips().into_iter().next().unwrap_or_default();
        if a.create_sandbox {
            let handlers = self.runtime_state.handlers();
            let refusal =
                sandbox::user_namespace_refusal(pod, &handlers, &self.opts.runtime_handler);
            if let Some(msg) = refusal {
                warn!(pod = pod_name(pod), error = %msg, "CreatePodSandbox for pod failed");
                sandbox_failed(pod, &msg);
                result.errors.push(format!("CreatePodSandbox: {msg}"));
                result.requeue(Duration::from_secs(2));
                return result;
            }
        }
        let sandbox_id = if a.create_sandbox {
            let dir = PathBuf::from(&sandbox_cfg.log_directory);
            let d = dir.clone();
            let made = crate::blocking::try_run(
                format!("log directory {}", dir.display()),
                FS_DEADLINE,
                move || std::fs::create_dir_all(&d),
            )
            .await;
            if let Err(e) = made {
                let source = std::io::Error::other(e);
                result
                    .errors
                    .push(RuntimeError::LogDir { path: dir, source }.to_string());
                result.requeue(Duration::from_secs(2));
                return result;
            }
            info!(
                pod = pod_name(pod),
                attempt = a.attempt,
                "creating pod sandbox"
            );
            let created = self
                .runtime
                .run_pod_sandbox(sandbox_cfg.clone(), self.opts.runtime_handler.clone())
                .await;
            crate::metrics::started_pod(created.is_ok());
            match created {
                Ok(id) => match self.runtime.pod_sandbox_status(&id).await {
                    Ok(s) => {
                        pod_ip = SandboxInfo::from_cri(&s)
                            .ips
                            .into_iter()
                            .next()
                            .unwrap_or_default();
                        id
                    }
                    Err(e) => {
                        // Upstream fails the sync; the next one finds the
                        // sandbox.
                        warn!(pod = pod_name(pod), error = %e, "failed to get pod sandbox status");
                        events::pod(
                            pod,
                            None,
                            events::WARNING,
                            "FailedStatusPodSandBox",
                            format!("Unable to get pod sandbox status: {}", e.grpc_text()),
                        );
                        result.errors.push(format!("PodSandboxStatus: {e}"));
                        result.requeue(Duration::from_secs(2));
                        return result;
                    }
                },
                Err(e) => {
                    warn!(pod = pod_name(pod), error = %e, "failed to create pod sandbox");
                    sandbox_failed(pod, &e.grpc_text());
                    result.errors.push(format!("CreatePodSandbox: {e}"));
                    result.requeue(Duration::from_secs(2));
                    return result;
                }
            }
        } else {
            match a.sandbox_id.clone() {
                Some(id) => id,
                None => return result,
            }
        };

        let spec = pod.spec.as_ref();
        let inits = spec
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or(&[]);
        let apps = spec.map(|s| s.containers.as_slice()).unwrap_or(&[]);
        let ephemeral = if a.ephemeral_to_start.is_empty() {
            Vec::new()
        } else {
            actions::ephemeral_containers(pod)
        };
        // Upstream starts ephemeral containers first, so a debugger runs
        // even while an init container fails.
        let mut starts: Vec<(&Container, StartKind)> = Vec::new();
        starts.extend(
            a.ephemeral_to_start
                .iter()
                .filter_map(|&i| ephemeral.get(i))
                .map(|(c, target)| (c, StartKind::Ephemeral(target.as_deref()))),
        );
        starts.extend(
            a.init_to_start
                .iter()
                .map(|&i| (&inits[i], StartKind::Init)),
        );
        starts.extend(
            a.containers_to_start
                .iter()
                .map(|&i| (&apps[i], StartKind::Regular)),
        );
        for (c, kind) in starts {
            let init = kind == StartKind::Init;
            let ctx = StartContext {
                pod,
                rt,
                sandbox_id: &sandbox_id,
                sandbox_cfg: &sandbox_cfg,
                pod_ip: &pod_ip,
                volumes: &volumes,
            };
            if let Err(w) = self.start_container(&ctx, c, kind).await {
                let ev = Some((c.name.as_str(), init));
                match w.0.reason.as_str() {
                    "CrashLoopBackOff" => events::pod(
                        pod,
                        ev,
                        events::WARNING,
                        "BackOff",
                        format!(
                            "Back-off restarting failed container {} in pod {}_{}({})",
                            c.name,
                            pod_name(pod),
                            pod.metadata.namespace.as_deref().unwrap_or_default(),
                            pod.metadata.uid.as_deref().unwrap_or_default()
                        ),
                    ),
                    "ErrImagePull" | "ImagePullBackOff" | "ErrImageNeverPull"
                    | "InvalidImageName" => events::pod(
                        pod,
                        ev,
                        events::WARNING,
                        "Failed",
                        format!("Error: {}", w.0.reason),
                    ),
                    "PostStartHookError" => {}
                    _ => events::pod(
                        pod,
                        ev,
                        events::WARNING,
                        "Failed",
                        format!("Error: {}", w.0.message),
                    ),
                }
                // Upstream SyncPod: every start failure but the two backoffs
                // fails the sync, which the pod worker retries after its
                // backOffPeriod (10 s), not at once.
                if !matches!(w.0.reason.as_str(), "CrashLoopBackOff" | "ImagePullBackOff") {
                    result
                        .errors
                        .push(format!("{}: {}: {}", c.name, w.0.reason, w.0.message));
                }
                result.waiting.insert(c.name.clone(), w.0);
                if let Some(after) = w.1 {
                    result.requeue(after);
                }
            }
        }
        self.prune_dead(rt).await;
        result
    }

    async fn start_container(
        &self,
        ctx: &StartContext<'_>,
        c: &Container,
        kind: StartKind<'_>,
    ) -> Result<(), (Waiting, Option<Duration>)> {
        let pod = ctx.pod;
        let init = kind == StartKind::Init;
        // Upstream getTargetID: the target must be running now.
        let pid_target = match kind {
            StartKind::Init | StartKind::Regular | StartKind::Ephemeral(None) => None,
            StartKind::Ephemeral(Some(t)) => {
                match ctx.rt.latest(t).filter(|s| s.state == CState::Running) {
                    Some(s) => Some(s.id.clone()),
                    None => {
                        return Err((
                            Waiting {
                                reason: "CreateContainerConfigError".into(),
                                message: format!("unable to find target container {t}"),
                            },
                            Some(Duration::from_secs(2)),
                        ))
                    }
                }
            }
        };
        let latest = ctx.rt.latest(&c.name);
        let now = wall_now();
        // Upstream doBackOff: key on pod, container and spec hash.
        let key = format!(
            "{}_{}_{}_{}_{}",
            pod_name(pod),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.uid.as_deref().unwrap_or_default(),
            c.name,
            hash::container_hash(c)
        );
        if let Some(prev) = latest.filter(|l| l.state == CState::Exited) {
            let finished = ns_to_duration(prev.finished_at);
            let left = self.backoff.lock().remaining(&key, finished, now);
            if let Some(left) = left {
                let window = self.backoff.lock().current(&key).unwrap_or_default();
                let msg = format!(
                    "back-off {} restarting failed container={} pod={}_{}({})",
                    crate::config::duration::format_go_duration(window),
                    c.name,
                    pod_name(pod),
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.uid.as_deref().unwrap_or_default()
                );
                return Err((
                    Waiting {
                        reason: "CrashLoopBackOff".into(),
                        message: msg,
                    },
                    Some(left),
                ));
            }
            self.backoff.lock().next(&key, finished, now);
        }
        let pull_secrets = crate::images::keyring::fetch_pull_secrets(&self.objects, pod).await;
        let image_ref = self
            .images
            .ensure_image(pod, c, ctx.sandbox_cfg, &pull_secrets, now)
            .await
            .map_err(|e| {
                (
                    Waiting {
                        reason: e.reason.into(),
                        message: e.message.clone(),
                    },
                    e.retry_after,
                )
            })?;
        let restart_count = latest.map(|l| l.restart_count + 1).unwrap_or(0);
        let retry = Some(Duration::from_secs(2));
        // API objects are read here, off the blocking thread that builds
        // the config; a missing one fails the build with upstream's message.
        let env = envvars::fetch(&self.objects, pod, c).await;
        // Building the config writes files (hosts, termination log) and
        // binds subPaths: on a blocking thread, with a deadline.
        let (opts, owned_pod, owned_c) = (self.opts.clone(), pod.clone(), c.clone());
        let (image, pod_ip, volumes) = (
            image_ref.clone(),
            ctx.pod_ip.to_string(),
            ctx.volumes.clone(),
        );
        let built = crate::blocking::try_run(
            format!(
                "container config for {}/{}",
                pod.metadata.uid.as_deref().unwrap_or_default(),
                c.name
            ),
            FS_DEADLINE,
            move || {
                let cctx = container::ContainerContext {
                    pod: &owned_pod,
                    container: &owned_c,
                    init,
                    restart_count,
                    image: &image,
                    pod_ip: &pod_ip,
                    volumes: &volumes,
                    env: &env,
                    pid_target: pid_target.as_deref(),
                };
                container::container_config(&opts, &cctx)
            },
        )
        .await;
        let mut config = built.map_err(|message| {
            (
                Waiting {
                    reason: "CreateContainerConfigError".into(),
                    message,
                },
                retry,
            )
        })?;
        // Upstream PreCreateContainer: the CPU manager's cpuset (the
        // container's exclusive CPUs, else the shared pool).
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if let Some(cpus) = self.cpu.cpuset_for(uid, &c.name) {
            if let Some(r) = config.linux.as_mut().and_then(|l| l.resources.as_mut()) {
                r.cpuset_cpus = cpus;
            }
        }
        let id = self
            .runtime
            .create_container(ctx.sandbox_id, config, ctx.sandbox_cfg.clone())
            .await
            .inspect_err(|e| crate::metrics::started_container_result(kind.metric_type(), Err(e)))
            .map_err(|e| {
                (
                    Waiting {
                        reason: "CreateContainerError".into(),
                        message: e.to_string(),
                    },
                    retry,
                )
            })?;
        // Upstream PreStartContainer: the cpuset given at creation counts
        // as applied for the CPU manager's reconcile.
        self.cpu.add_container(uid, &c.name);
        let ev = Some((c.name.as_str(), init));
        events::pod(
            pod,
            ev,
            events::NORMAL,
            "Created",
            format!("Created container: {}", c.name),
        );
        let started = self.runtime.start_container(&id).await;
        crate::metrics::started_container_result(kind.metric_type(), started.as_ref().map(drop));
        if let Err(e) = started {
            warn!(pod = pod_name(pod), container = %c.name, error = %e, "failed to start container");
            return Err((
                Waiting {
                    reason: "RunContainerError".into(),
                    message: e.to_string(),
                },
                retry,
            ));
        }
        info!(pod = pod_name(pod), container = %c.name, id = %id, restart_count, "started container");
        events::pod(
            pod,
            ev,
            events::NORMAL,
            "Started",
            format!("Started container {}", c.name),
        );
        self.link_container_log(pod, ctx.sandbox_cfg, c, restart_count, &id)
            .await;
        if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            // Upstream runs postStart right after start and kills the
            // container when it fails; the restart policy and backoff apply.
            let timeout = Duration::from_secs(grace_period(Some(pod), None) as u64);
            if let Err(e) =
                lifecycle::run_handler(self.runtime.as_ref(), h, &id, c, ctx.pod_ip, timeout).await
            {
                warn!(pod = pod_name(pod), container = %c.name, error = %e, "FailedPostStartHook");
                events::pod(
                    pod,
                    ev,
                    events::WARNING,
                    "FailedPostStartHook",
                    e.to_string(),
                );
                let _ = self
                    .runtime
                    .stop_container(&id, grace_period(Some(pod), None))
                    .await;
                return Err((
                    Waiting {
                        reason: "PostStartHookError".into(),
                        message: e.to_string(),
                    },
                    Some(Duration::from_secs(1)),
                ));
            }
        }
        Ok(())
    }

    /// Stops one container: its preStop hook first, within the grace period,
    /// then StopContainer with what is left (upstream killContainer, with its
    /// 2 s floor). `spec` is the container's spec, or for an orphan one
    /// restored from its annotations.
    async fn kill_container(
        &self,
        pod: Option<&Pod>,
        spec: Option<&Container>,
        id: &str,
        name: &str,
        pod_ip: &str,
        grace: i64,
    ) -> Result<(), CriError> {
        let mut left = grace;
        if let Some((c, h)) = spec.and_then(|c| {
            c.lifecycle
                .as_ref()
                .and_then(|l| l.pre_stop.as_ref())
                .map(|h| (c, h))
        }) {
            let started = tokio::time::Instant::now();
            let budget = Duration::from_secs(grace.max(0) as u64);
            if let Err(e) =
                lifecycle::run_handler(self.runtime.as_ref(), h, id, c, pod_ip, budget).await
            {
                warn!(container = %name, error = %e, "PreStop hook failed");
                // Without the error: it may carry a secret (as upstream).
                if let Some(pod) = pod {
                    let ev = Some((name, is_init(pod, name)));
                    events::pod(
                        pod,
                        ev,
                        events::WARNING,
                        "FailedPreStopHook",
                        "PreStopHook failed".into(),
                    );
                }
            }
            left = (grace - started.elapsed().as_secs() as i64).max(2);
        }
        self.runtime
            .stop_container(id, left)
            .await
            .or_else(ignore_not_found)
    }

    /// Stops all containers (in parallel, each with the grace period) and
    /// then the sandboxes (upstream killPodWithSyncResult).
    pub async fn kill_pod(
        self: &Arc<Self>,
        pod: Option<&Pod>,
        rt: &RuntimePod,
        grace_override: Option<i64>,
    ) -> Result<(), RuntimeError> {
        let grace = grace_period(pod, grace_override);
        let pod_ip = rt.ips().into_iter().next().unwrap_or_default();
        // Sidecars stop after the app containers, in reverse order (upstream
        // KEP-753); everything else stops at once, in parallel.
        let sidecars: Vec<String> = pod
            .and_then(|p| p.spec.as_ref())
            .map(|s| {
                s.init_containers
                    .iter()
                    .flatten()
                    .filter(|c| actions::is_sidecar(c))
                    .map(|c| c.name.clone())
                    .collect()
            })
            .unwrap_or_default();
        let running: Vec<&ContainerInfo> = rt.running_containers().collect();
        let mut waves: Vec<Vec<&ContainerInfo>> = vec![running
            .iter()
            .copied()
            .filter(|c| !sidecars.contains(&c.name))
            .collect()];
        for name in sidecars.iter().rev() {
            waves.push(
                running
                    .iter()
                    .copied()
                    .filter(|c| &c.name == name)
                    .collect(),
            );
        }
        // One copy of the pod for all the stop tasks (their events).
        let owner = pod.map(|p| Arc::new(p.clone()));
        for wave in waves {
            let mut set = JoinSet::new();
            for c in wave {
                let this = self.clone();
                // Without a spec (an orphan), upstream restores the preStop
                // hook and the grace period from the container's annotations.
                let (spec, grace) = match pod {
                    Some(p) => (container_spec(p, &c.name).cloned(), grace),
                    None => (
                        c.pre_stop.clone().map(|h| Container {
                            name: c.name.clone(),
                            lifecycle: Some(k8s_openapi::api::core::v1::Lifecycle {
                                pre_stop: Some(h),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                        grace_override
                            .or(c.pod_grace)
                            .unwrap_or(DEFAULT_GRACE_SECONDS)
                            .max(MIN_GRACE_SECONDS),
                    ),
                };
                if let Some(p) = pod {
                    events::pod(
                        p,
                        Some((&c.name, is_init(p, &c.name))),
                        events::NORMAL,
                        "Killing",
                        format!("Stopping container {}", c.name),
                    );
                }
                let (id, name, ip) = (c.id.clone(), c.name.clone(), pod_ip.clone());
                let owner = owner.clone();
                set.spawn(async move {
                    debug!(container = %name, grace, "stopping container");
                    this.kill_container(owner.as_deref(), spec.as_ref(), &id, &name, &ip, grace)
                        .await
                });
            }
            while let Some(r) = set.join_next().await {
                if let Ok(Err(e)) = r {
                    return Err(e.into());
                }
            }
        }
        for sb in &rt.sandboxes {
            if sb.ready {
                self.runtime
                    .stop_pod_sandbox(&sb.id)
                    .await
                    .or_else(ignore_not_found)?;
            }
        }
        Ok(())
    }

    /// Removes a container and its /var/log/containers symlink.
    async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        self.runtime
            .remove_container(id)
            .await
            .or_else(ignore_not_found)?;
        let suffix = format!("-{id}.log");
        let dir = self.opts.container_logs_dir.clone();
        let unlinked = crate::blocking::run(format!("log link of {id}"), FS_DEADLINE, move || {
            if let Ok(dir) = std::fs::read_dir(&dir) {
                for e in dir.flatten() {
                    if e.file_name().to_string_lossy().ends_with(&suffix) {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        })
        .await;
        if let Err(e) = unlinked {
            warn!(container_id = id, error = %e, "unable to remove the container's log link");
        }
        Ok(())
    }

    /// Links the container's log into /var/log/containers, where log
    /// collectors look (upstream `<pod>_<ns>_<container>-<id>.log`).
    async fn link_container_log(
        &self,
        pod: &Pod,
        sandbox_cfg: &cri::PodSandboxConfig,
        c: &Container,
        restart_count: i32,
        id: &str,
    ) {
        let target = PathBuf::from(&sandbox_cfg.log_directory)
            .join(&c.name)
            .join(format!("{restart_count}.log"));
        let link = self.opts.container_logs_dir.join(format!(
            "{}_{}_{}-{id}.log",
            pod_name(pod),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            c.name
        ));
        let dir = self.opts.container_logs_dir.clone();
        let l = link.clone();
        let r = crate::blocking::run(format!("log link of {id}"), FS_DEADLINE, move || {
            let r =
                std::fs::create_dir_all(&dir).and_then(|_| std::os::unix::fs::symlink(&target, &l));
            match r {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                r => r,
            }
        })
        .await;
        let r = r
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        if let Err(e) = r {
            warn!(pod = pod_name(pod), container = %c.name, link = %link.display(), error = %e, "failed to link container log");
        }
    }

    /// Removes all containers and sandboxes of a pod that has been killed.
    pub async fn remove_pod(&self, rt: &RuntimePod) -> Result<(), RuntimeError> {
        self.last_actions.lock().remove(&rt.uid);
        self.resize_errors.lock().remove(&rt.uid);
        for c in &rt.containers {
            self.remove_container(&c.id).await?;
        }
        for sb in &rt.sandboxes {
            // StopPodSandbox is idempotent and required before removal.
            self.runtime
                .stop_pod_sandbox(&sb.id)
                .await
                .or_else(ignore_not_found)?;
            self.runtime
                .remove_pod_sandbox(&sb.id)
                .await
                .or_else(ignore_not_found)?;
        }
        Ok(())
    }

    /// The minute container GC's policy pass (`gc::evictions`): returns how
    /// many containers went.
    pub async fn collect_dead_containers(&self, policy: gc::Policy) -> Result<usize, CriError> {
        let list = self.runtime.list_containers(None).await?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let evict = gc::evictions(&list, policy, now);
        for e in &evict {
            if e.unknown {
                // It could be running: stopped first, as upstream.
                if let Err(err) = self.runtime.stop_container(&e.id, 0).await {
                    warn!(container_id = %e.id, error = %err, "failed to stop a container in an unknown state");
                    continue;
                }
            }
            debug!(container = %e.name, container_id = %e.id, "removing dead container");
            if let Err(err) = self.remove_container(&e.id).await {
                warn!(container_id = %e.id, error = %err, "failed to remove container");
            }
        }
        Ok(evict.len())
    }

    /// Per-pod container GC: keep the newest instance of each container and
    /// the dead ones before it the policy keeps (upstream
    /// maxPerPodContainer, 1 by default; the minute pass trims to exactly
    /// that), and drop dead sandboxes that no container uses any more.
    async fn prune_dead(&self, rt: &RuntimePod) {
        let policy = self.container_gc;
        // Created before this may go (upstream's MinAge).
        let newest = SystemTime::now()
            .checked_sub(policy.min_age)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i64);
        let keep = usize::try_from(policy.max_per_pod_container).map_or(usize::MAX, |n| n + 1);
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut used_sandboxes: Vec<&str> = Vec::new();
        for c in &rt.containers {
            let n = seen.entry(c.name.as_str()).or_default();
            *n += 1;
            if *n > keep && c.state == CState::Exited && c.created_at <= newest {
                if let Err(e) = self.remove_container(&c.id).await {
                    debug!(container = %c.name, error = %e, "failed to remove dead container");
                }
            } else {
                used_sandboxes.push(&c.sandbox_id);
            }
        }
        for sb in rt.sandboxes.iter().skip(1) {
            if !sb.ready && !used_sandboxes.contains(&sb.id.as_str()) {
                if let Err(e) = self.runtime.remove_pod_sandbox(&sb.id).await {
                    debug!(sandbox = %sb.id, error = %e, "failed to remove dead sandbox");
                }
            }
        }
    }
}

/// What a container is started as.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StartKind<'a> {
    Init,
    Regular,
    /// With the container whose process namespace it joins, if any.
    Ephemeral(Option<&'a str>),
}

impl StartKind<'_> {
    /// Upstream's `container_type` metric label.
    fn metric_type(self) -> &'static str {
        match self {
            StartKind::Init => "init_container",
            StartKind::Regular => "container",
            StartKind::Ephemeral(_) => "ephemeral_container",
        }
    }
}

struct StartContext<'a> {
    pod: &'a Pod,
    rt: &'a RuntimePod,
    sandbox_id: &'a str,
    sandbox_cfg: &'a cri::PodSandboxConfig,
    pod_ip: &'a str,
    volumes: &'a HashMap<String, PathBuf>,
}

fn ignore_not_found(e: CriError) -> Result<(), CriError> {
    if e.is_not_found() {
        Ok(())
    } else {
        Err(e)
    }
}

/// Upstream's default terminationGracePeriodSeconds.
pub const DEFAULT_GRACE_SECONDS: i64 = 30;
/// Upstream never stops a container with less (minimumGracePeriodInSeconds).
pub const MIN_GRACE_SECONDS: i64 = 2;

/// The grace period for stopping: an explicit override (deletion), the
/// pod's terminationGracePeriodSeconds, else upstream's default of 30 s.
pub fn grace_period(pod: Option<&Pod>, over: Option<i64>) -> i64 {
    let g = over
        .or_else(|| pod.and_then(|p| p.metadata.deletion_grace_period_seconds))
        .or_else(|| {
            pod.and_then(|p| p.spec.as_ref())
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(DEFAULT_GRACE_SECONDS);
    g.max(MIN_GRACE_SECONDS)
}

/// The spec of a container (app or init) by name.
/// Upstream's FailedCreatePodSandBox event.
fn sandbox_failed(pod: &Pod, why: &str) {
    events::pod(
        pod,
        None,
        events::WARNING,
        "FailedCreatePodSandBox",
        format!("Failed to create pod sandbox: {why}"),
    );
}

fn container_spec<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    pod.spec.as_ref().and_then(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .find(|c| c.name == name)
    })
}

/// Whether `name` is one of the pod's init containers (for event field paths).
pub fn is_init(pod: &Pod, name: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|i| i.iter().any(|c| c.name == name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::fake::FakeRuntime;
    use k8s_openapi::api::core::v1::PodSpec;

    /// A fake runtime with busybox, and a manager over it.
    fn fake_manager() -> (Arc<FakeRuntime>, Arc<RuntimeManager>) {
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let rm = manager(&fake);
        (fake, rm)
    }

    /// A preStop hook that runs `/bin/drain`.
    fn drain_hook() -> k8s_openapi::api::core::v1::Lifecycle {
        use k8s_openapi::api::core::v1::{ExecAction, Lifecycle, LifecycleHandler};
        Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec!["/bin/drain".into()]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn manager(fake: &Arc<FakeRuntime>) -> Arc<RuntimeManager> {
        let root = std::env::temp_dir().join(format!(
            "rkubelet-rm-{}-{}",
            std::process::id(),
            fake.calls().len()
        ));
        let opts = RuntimeOptions {
            root_dir: root.clone(),
            pod_logs_dir: root.join("logs"),
            container_logs_dir: root.join("containers"),
            resolv_conf: PathBuf::new(),
            ..RuntimeOptions::default()
        };
        Arc::new(RuntimeManager::new(
            fake.clone(),
            ImageManager::new(fake.clone(), true, None),
            opts,
        ))
    }

    fn pod(policy: &str) -> Pod {
        let mut p = Pod {
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                init_containers: Some(vec![Container {
                    name: "init".into(),
                    image: Some("busybox:1.36".into()),
                    ..Default::default()
                }]),
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("busybox:1.36".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.name = Some("p".into());
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some("uid-1".into());
        p
    }

    #[tokio::test]
    async fn sync_creates_the_sandbox_runs_init_then_app_and_backs_off_crashes() {
        let (fake, rm) = fake_manager();
        let p = pod("Always");

        let rt = rm.pod_status("uid-1").await.unwrap();
        let r = rm.sync_pod(&p, &rt, &Default::default()).await;
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(
            fake.calls(),
            vec![
                "RunPodSandbox p",
                "CreateContainer init",
                "StartContainer init"
            ]
        );

        // The init container finished: the app starts, init is not rerun.
        let rt = rm.pod_status("uid-1").await.unwrap();
        fake.exit_container(&rt.latest("init").unwrap().id, 0);
        fake.clear_calls();
        let rt = rm.pod_status("uid-1").await.unwrap();
        rm.sync_pod(&p, &rt, &Default::default()).await;
        assert_eq!(
            fake.calls(),
            vec!["CreateContainer app", "StartContainer app"]
        );

        // First crash restarts at once with restartCount 1.
        let rt = rm.pod_status("uid-1").await.unwrap();
        fake.exit_container(&rt.latest("app").unwrap().id, 1);
        let rt = rm.pod_status("uid-1").await.unwrap();
        rm.sync_pod(&p, &rt, &Default::default()).await;
        let rt = rm.pod_status("uid-1").await.unwrap();
        assert_eq!(rt.latest("app").unwrap().restart_count, 1);
        assert_eq!(rt.latest("app").unwrap().state, CState::Running);

        // Second crash within the window: CrashLoopBackOff, requeued, no start.
        fake.exit_container(&rt.latest("app").unwrap().id, 1);
        fake.clear_calls();
        let rt = rm.pod_status("uid-1").await.unwrap();
        let r = rm.sync_pod(&p, &rt, &Default::default()).await;
        assert_eq!(r.waiting["app"].reason, "CrashLoopBackOff");
        assert!(r.waiting["app"]
            .message
            .starts_with("back-off 10s restarting failed container=app pod=p_default(uid-1)"));
        assert!(r
            .requeue_after
            .is_some_and(|d| d <= Duration::from_secs(10)));
        assert!(!fake.calls().iter().any(|c| c.starts_with("StartContainer")));
    }

    #[tokio::test]
    async fn kill_and_remove_stop_containers_before_the_sandbox_and_leave_nothing() {
        let (fake, rm) = fake_manager();
        let mut p = pod("Always");
        p.spec.as_mut().unwrap().init_containers = None;
        let rt = rm.pod_status("uid-1").await.unwrap();
        rm.sync_pod(&p, &rt, &Default::default()).await;
        fake.clear_calls();
        let rt = rm.pod_status("uid-1").await.unwrap();
        rm.kill_pod(Some(&p), &rt, None).await.unwrap();
        let calls = fake.calls();
        assert_eq!(calls[0], "StopContainer app");
        assert!(calls[1].starts_with("StopPodSandbox"));
        let rt = rm.pod_status("uid-1").await.unwrap();
        rm.remove_pod(&rt).await.unwrap();
        assert!(rm.pod_status("uid-1").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_orphan_is_stopped_with_its_recorded_grace_and_prestop_hook() {
        // Old code: orphans got 30 s and no preStop hook.
        let (fake, rm) = fake_manager();
        let mut p = pod("Always");
        let spec = p.spec.as_mut().unwrap();
        spec.init_containers = None;
        spec.termination_grace_period_seconds = Some(7);
        spec.containers[0].lifecycle = Some(drain_hook());
        let rt = rm.pod_status("uid-1").await.unwrap();
        rm.sync_pod(&p, &rt, &Default::default()).await;
        fake.clear_calls();
        // rkubelet restarted and the manifest is gone: only the runtime knows.
        let rt = rm.pod_status("uid-1").await.unwrap();
        rm.kill_pod(None, &rt, None).await.unwrap();
        let calls = fake.calls();
        let hook = calls.iter().position(|c| c.ends_with("/bin/drain"));
        let stop = calls.iter().position(|c| c == "StopContainer app");
        assert!(
            matches!((hook, stop), (Some(h), Some(s)) if h < s),
            "preStop before stop: {calls:?}"
        );
        assert_eq!(fake.stop_timeouts(), vec![("app".to_string(), 7)]);
    }

    #[tokio::test]
    async fn sandbox_and_hook_failures_are_reported_as_upstreams_events() {
        // Old code: none of these events was sent, and a pod asking for its
        // own user namespace ran in the node's.
        use crate::events::captured;
        let (fake, rm) = fake_manager();
        let mut p = pod("Always");
        p.metadata.name = Some("ev-sandbox".into());
        let spec = p.spec.as_mut().unwrap();
        spec.init_containers = None;
        spec.containers[0].lifecycle = Some(drain_hook());
        let reasons =
            |name: &str| -> Vec<String> { captured(name).into_iter().map(|(_, r, _)| r).collect() };
        let rt = rm.pod_status("uid-1").await.unwrap();
        rm.sync_pod(&p, &rt, &Default::default()).await;
        assert!(!reasons("ev-sandbox").contains(&"SandboxChanged".to_string()));

        // The sandbox dies: SandboxChanged, a new one.
        let rt = rm.pod_status("uid-1").await.unwrap();
        fake.kill_sandbox(&rt.sandboxes[0].id);
        let rt = rm.pod_status("uid-1").await.unwrap();
        rm.sync_pod(&p, &rt, &Default::default()).await;
        let ev = captured("ev-sandbox");
        let changed = ev.iter().find(|e| e.1 == "SandboxChanged").unwrap();
        assert_eq!(
            (changed.0, changed.2.as_str()),
            (
                "Normal",
                "Pod sandbox changed, it will be killed and re-created."
            )
        );

        // A failing preStop hook: FailedPreStopHook, without its error.
        let rt = rm.pod_status("uid-1").await.unwrap();
        let app = rt.latest("app").unwrap().id.clone();
        fake.set_exec_result(&app, 1);
        rm.kill_pod(Some(&p), &rt, None).await.unwrap();
        let ev = captured("ev-sandbox");
        let hook = ev.iter().find(|e| e.1 == "FailedPreStopHook").unwrap();
        assert_eq!((hook.0, hook.2.as_str()), ("Warning", "PreStopHook failed"));

        // hostUsers: false on a runtime without user namespaces: no
        // sandbox, FailedCreatePodSandBox with upstream's words.
        let (fake, rm) = fake_manager();
        let mut own = pod("Always");
        own.metadata.name = Some("ev-userns".into());
        own.spec.as_mut().unwrap().host_users = Some(false);
        let rt = rm.pod_status("uid-1").await.unwrap();
        let r = rm.sync_pod(&own, &rt, &Default::default()).await;
        assert!(!r.errors.is_empty());
        assert_eq!(fake.count_calls("RunPodSandbox"), 0);
        assert_eq!(
            captured("ev-userns"),
            vec![(
                "Warning",
                "FailedCreatePodSandBox".to_string(),
                "Failed to create pod sandbox: can't set `spec.hostUsers: false`, \
                 runtime does not support user namespaces"
                    .to_string()
            )]
        );
    }

    #[test]
    fn grace_period_has_upstream_floor_and_default() {
        assert_eq!(grace_period(None, None), 30);
        assert_eq!(grace_period(None, Some(0)), 2);
        let mut p = pod("Always");
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(5);
        assert_eq!(grace_period(Some(&p), None), 5);
    }
}
