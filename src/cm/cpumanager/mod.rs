//! The CPU manager (upstream `pkg/kubelet/cm/cpumanager`): `cpuManagerPolicy`
//! `none` (nothing pinned; the state file still written) or `static`
//! (exclusive CPUs for the containers of Guaranteed pods with whole-CPU
//! requests, every other container on the shared pool).
//!
//! - admission (`admit`, upstream's topology manager admit handler with
//!   the `none` topology policy, which calls Allocate per container):
//!   exclusive CPUs are taken there, or the pod is refused;
//! - container creation (`cpuset_for`, upstream PreCreateContainer) sets the
//!   CRI `cpuset_cpus`; after creation `add_container` records what it got;
//! - the reconcile task (every `cpuManagerReconcilePeriod`) frees the CPUs
//!   of pods no longer active (upstream removeStaleState) and sends
//!   `UpdateContainerResources` to each running container whose cpuset
//!   differs from what was last applied (how shared containers shrink when
//!   a new exclusive assignment is made);
//! - the state is kept in `<root>/cpu_manager_state` (`state.rs`), written
//!   after every change by a writer task on the blocking pool (admission
//!   runs on the async thread and must not write files itself).

pub mod assign;
pub mod cpuset;
pub mod policy;
pub mod state;
pub mod topology;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};

use cpuset::CpuSet;
use policy::{Options, StaticPolicy};
use state::{State, StateError, StateFile};
use topology::CpuTopology;

#[derive(Debug, Clone, thiserror::Error)]
pub enum CpuManagerError {
    #[error(transparent)]
    Topology(#[from] topology::TopologyError),
    #[error("unknown policy: \"{0}\"")]
    UnknownPolicy(String),
    #[error("new none policy error: None policy: received unsupported options={0}")]
    NoneOptions(String),
    #[error("[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero")]
    NoReservation,
    #[error("new static policy error: {0}")]
    StaticPolicy(String),
    #[error("could not restore state from checkpoint: {source}, please drain this node and delete the CPU manager checkpoint file {path:?} before restarting Kubelet")]
    Restore { source: StateError, path: String },
    /// The policy's Start (upstream validateState).
    #[error("start cpu manager error: {0}")]
    Start(String),
    #[error(transparent)]
    Blocking(#[from] crate::blocking::BlockingError),
}

/// What the manager starts from (the configuration's fields).
#[derive(Debug, Clone)]
pub struct Config {
    pub policy: String,
    pub options: BTreeMap<String, String>,
    pub reconcile_period: Duration,
    /// `reservedSystemCPUs` (empty: none named).
    pub reserved_cpus: CpuSet,
    /// systemReserved.cpu + kubeReserved.cpu, in millicores.
    pub reserved_milli: i64,
    pub root_dir: PathBuf,
    pub alpha_options: bool,
    pub beta_options: bool,
    /// Whether to set the process-wide metrics (the kubelet does; unit
    /// tests do not, sharing the registry with the metrics tests).
    pub metrics: bool,
}

/// The active pods (upstream GetActivePods).
pub type ActivePods = Box<dyn Fn() -> Vec<Arc<Pod>> + Send + Sync>;
/// A pod's status by UID (upstream's podStatusProvider).
pub type PodStatuses = Box<dyn Fn(&str) -> Option<Arc<PodStatus>> + Send + Sync>;

/// The CPU manager; the default (tests, a kubelet that did not start one)
/// pins nothing.
#[derive(Clone, Default)]
pub struct CpuManager {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    policy_name: String,
    period: Duration,
    topo: CpuTopology,
    locked: Mutex<Locked>,
    active: OnceLock<ActivePods>,
    sources_ready: OnceLock<Box<dyn Fn() -> bool + Send + Sync>>,
    /// The latest checkpoint text for the writer task.
    persist: watch::Sender<Option<String>>,
}

struct Locked {
    policy: Option<StaticPolicy>,
    state: State,
    /// What each container was last given through the runtime (upstream
    /// lastUpdateState), by (pod UID, container name).
    last_update: HashMap<(String, String), CpuSet>,
}

/// One container the reconcile sends a cpuset to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub pod: String,
    pub container: String,
    pub id: String,
    pub cpus: CpuSet,
}

/// A running container as the reconcile sees it: (pod UID, name, ID).
pub type Running = (String, String, String);

/// Upstream reconcileState's decision, per running container: its cpuset
/// (exclusive, else the shared pool) unless empty, when it differs from
/// what was last applied.
pub fn plan(
    state: &State,
    last: &HashMap<(String, String), CpuSet>,
    running: &[Running],
) -> Vec<Update> {
    running
        .iter()
        .filter_map(|(pod, container, id)| {
            let cpus = state.cpu_set_or_default(pod, container);
            if cpus.is_empty() {
                return None;
            }
            let applied = last.get(&(pod.clone(), container.clone()));
            (applied != Some(&cpus)).then(|| Update {
                pod: pod.clone(),
                container: container.clone(),
                id: id.clone(),
                cpus,
            })
        })
        .collect()
}

/// The running containers of a pod from its status (upstream
/// findContainerIDByName / findContainerStatusByName: the first status of
/// that name; waiting and terminated ones are skipped).
fn running_containers(pod: &Pod, status: &PodStatus) -> Vec<Running> {
    let uid = crate::source::pod_uid(pod).to_string();
    let statuses: Vec<_> = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .collect();
    all_containers(pod)
        .filter_map(|c| {
            let st = statuses.iter().find(|s| s.name == c.name)?;
            let id = statuses
                .iter()
                .find(|s| {
                    s.name == c.name && s.container_id.as_deref().is_some_and(|i| !i.is_empty())
                })?
                .container_id
                .as_deref()?;
            let state = st.state.as_ref()?;
            if state.waiting.is_some() || state.running.is_none() {
                return None;
            }
            // "containerd://<id>" → "<id>".
            let id = id.split_once("://").map_or(id, |(_, i)| i);
            Some((uid.clone(), c.name.clone(), id.to_string()))
        })
        .collect()
}

fn all_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    })
}

/// Go's `%v` of a map[string]string.
fn go_map(m: &BTreeMap<String, String>) -> String {
    let inner: Vec<String> = m.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    format!("map[{}]", inner.join(" "))
}

/// Upstream getReservedCPUs: `reservedSystemCPUs` parsed, and within the
/// online CPUs.
pub fn reserved_cpus(text: &str, topo: &CpuTopology) -> Result<CpuSet, String> {
    if text.is_empty() {
        return Ok(CpuSet::new());
    }
    let set =
        CpuSet::parse(text).map_err(|e| format!("unable to parse reserved-cpus list: {e}"))?;
    let all = topo.all_cpus();
    if !set.is_subset(&all) {
        return Err(format!(
            "reserved-cpus: {text} is not a subset of online-cpus: {all}"
        ));
    }
    Ok(set)
}

/// Reads the machine's CPU topology on the blocking pool.
pub async fn discover_topology() -> Result<CpuTopology, CpuManagerError> {
    let t = crate::blocking::run("cpu topology".into(), Duration::from_secs(10), || {
        CpuTopology::discover(Path::new("/sys"))
    })
    .await??;
    Ok(t)
}

impl CpuManager {
    /// Upstream NewManager and Start: the policy from the configuration,
    /// then the stored state (written fresh when there is none), then the
    /// writer task (on `tasks`, ending with `token`).
    pub async fn start(
        cfg: Config,
        topo: CpuTopology,
        tasks: &TaskTracker,
        token: CancellationToken,
    ) -> Result<CpuManager, CpuManagerError> {
        let policy = match cfg.policy.as_str() {
            "none" => {
                if !cfg.options.is_empty() {
                    return Err(CpuManagerError::NoneOptions(go_map(&cfg.options)));
                }
                None
            }
            "static" => {
                info!(
                    cpus = topo.num_cpus,
                    cores = topo.num_cores,
                    sockets = topo.num_sockets,
                    numa_nodes = topo.num_numa_nodes,
                    "Detected CPU topology"
                );
                if cfg.reserved_milli <= 0 {
                    return Err(CpuManagerError::NoReservation);
                }
                let options = Options::parse(&cfg.options, |g| match g {
                    "CPUManagerPolicyAlphaOptions" => cfg.alpha_options,
                    _ => cfg.beta_options,
                })
                .map_err(CpuManagerError::StaticPolicy)?;
                for o in options.not_followed() {
                    warn!(option = o, "cpuManagerPolicyOptions {o} is accepted but not implemented: CPUs are allocated packed (upstream's default order)");
                }
                // Upstream: ceil of the reserved millicores.
                let n = ((cfg.reserved_milli + 999) / 1000) as usize;
                let mut p = StaticPolicy::new(topo.clone(), n, &cfg.reserved_cpus, options)
                    .map_err(CpuManagerError::StaticPolicy)?;
                p.metrics = cfg.metrics;
                info!(reserved = %p.reserved, "Reserved CPUs not available for exclusive assignment");
                Some(p)
            }
            other => return Err(CpuManagerError::UnknownPolicy(other.to_string())),
        };
        let policy_name = cfg.policy.clone();
        let file = StateFile::new(&cfg.root_dir);
        let path = file.path.display().to_string();
        let restore = |source| CpuManagerError::Restore {
            source,
            path: path.clone(),
        };
        let (f, name) = (file.clone(), policy_name.clone());
        let stored = crate::blocking::run(
            "cpu manager state".into(),
            Duration::from_secs(10),
            move || {
                match f.load(&name)? {
                    Some(s) => Ok(s),
                    None => {
                        // Upstream stores the empty state before the policy
                        // fills it (and again once it has).
                        let s = State::default();
                        f.store(&name, &s)?;
                        Ok(s)
                    }
                }
            },
        )
        .await?;
        let mut state = stored.map_err(restore)?;
        if let Some(p) = &policy {
            p.validate_state(&mut state)
                .map_err(CpuManagerError::Start)?;
            if p.metrics {
                crate::metrics::cpu_manager_alignment(None);
            }
        }
        info!(policy = %policy_name, reconcile_period = ?cfg.reconcile_period, "Starting CPU manager");
        let (persist, rx) = watch::channel(None);
        tasks.spawn(
            write_state(file, rx, token).instrument(tracing::info_span!("cpu-manager-state")),
        );
        let m = CpuManager {
            inner: Some(Arc::new(Inner {
                policy_name,
                period: cfg.reconcile_period,
                topo,
                locked: Mutex::new(Locked {
                    policy,
                    state,
                    last_update: HashMap::new(),
                }),
                active: OnceLock::new(),
                sources_ready: OnceLock::new(),
                persist,
            })),
        };
        m.changed(&m.inner.as_ref().expect("just made").locked.lock());
        Ok(m)
    }

    /// Whether the static policy runs (exclusive CPUs, the reconcile).
    pub fn is_static(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|i| i.locked.lock().policy.is_some())
    }

    pub fn set_active_pods(&self, f: ActivePods) {
        if let Some(i) = &self.inner {
            let _ = i.active.set(f);
        }
    }

    /// Stale assignments are removed only once every pod source has been
    /// seen (upstream sourcesReady).
    pub fn set_sources_ready(&self, f: Box<dyn Fn() -> bool + Send + Sync>) {
        if let Some(i) = &self.inner {
            let _ = i.sources_ready.set(f);
        }
    }

    /// After a change of the state: the checkpoint to the writer and the
    /// gauges.
    fn changed(&self, l: &Locked) {
        let Some(i) = &self.inner else {
            return;
        };
        let cp = state::Checkpoint::from_state(&i.policy_name, &l.state);
        i.persist.send_replace(Some(cp.to_json()));
        if let Some(p) = l.policy.as_ref().filter(|p| p.metrics) {
            let exclusive = l
                .state
                .assignments
                .values()
                .flat_map(|m| m.values())
                .fold(CpuSet::new(), |a, s| a.union(s));
            let mut per_numa: BTreeMap<usize, usize> = BTreeMap::new();
            for cpu in exclusive.iter() {
                if let Some(info) = i.topo.details.0.get(&cpu) {
                    *per_numa.entry(info.numa).or_default() += 1;
                }
            }
            let shared = l.state.default_set.difference(&p.reserved).len();
            let per_numa: Vec<(usize, usize)> = per_numa.into_iter().collect();
            crate::metrics::cpu_manager_pool(shared, exclusive.len(), &per_numa);
        }
    }

    /// Upstream removeStaleState: the assignments (and last applied
    /// cpusets) of containers no pod that is active has. `admitting` is
    /// the pod being admitted, active though not in the pod manager yet.
    fn remove_stale_state(&self, admitting: Option<&Pod>) {
        let Some(i) = &self.inner else {
            return;
        };
        // Unset (before the kubelet has its sources) is not ready: the
        // pods of a restart are not known yet, and their CPUs must stay.
        if !i.sources_ready.get().is_some_and(|f| f()) {
            return;
        }
        let Some(active) = i.active.get() else {
            return;
        };
        let pods = active();
        let mut live: HashSet<(String, String)> = HashSet::new();
        for pod in pods.iter().map(|p| p.as_ref()).chain(admitting) {
            let uid = crate::source::pod_uid(pod);
            for c in all_containers(pod) {
                live.insert((uid.to_string(), c.name.clone()));
            }
        }
        let mut l = i.locked.lock();
        let stale: Vec<(String, String)> = l
            .state
            .assignments
            .iter()
            .flat_map(|(pod, m)| m.keys().map(move |c| (pod.clone(), c.clone())))
            .filter(|k| !live.contains(k))
            .collect();
        let mut changed = false;
        for (pod, container) in &stale {
            info!(pod_uid = %pod, container = %container, "RemoveStaleState: removing container");
            let Locked { policy, state, .. } = &mut *l;
            if let Some(p) = policy {
                p.remove_container(state, pod, container);
                changed = true;
            }
        }
        l.last_update.retain(|k, _| live.contains(k));
        if changed {
            self.changed(&l);
        }
    }

    /// Upstream's admission through the topology manager (policy `none`):
    /// Allocate for each init and app container in turn; the first failure
    /// refuses the pod with upstream's reason and message.
    pub fn admit(&self, pod: &Pod) -> Result<(), (String, String)> {
        let Some(i) = &self.inner else {
            return Ok(());
        };
        if !self.is_static() {
            return Ok(());
        }
        self.remove_stale_state(Some(pod));
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let uid = crate::source::pod_uid(pod);
        for c in all_containers(pod) {
            let mut l = i.locked.lock();
            let Locked { policy, state, .. } = &mut *l;
            let Some(p) = policy else {
                return Ok(());
            };
            match p.allocate(state, pod, c) {
                Ok(Some(cpus)) => {
                    info!(pod = name, pod_uid = %uid, container = %c.name, cpuset = %cpus, "Allocated exclusive CPUs");
                    self.changed(&l);
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(pod = name, pod_uid = %uid, container = %c.name, error = %e, "Allocate error");
                    let (reason, message) = e.rejection();
                    return Err((reason.to_string(), message));
                }
            }
        }
        Ok(())
    }

    /// The cpuset a new container is created with (upstream
    /// PreCreateContainer over GetCPUAffinity): its exclusive CPUs, else
    /// the shared pool; None under `none` (nothing set).
    pub fn cpuset_for(&self, pod_uid: &str, container: &str) -> Option<String> {
        let i = self.inner.as_ref()?;
        let l = i.locked.lock();
        let set = l.state.cpu_set_or_default(pod_uid, container);
        (!set.is_empty()).then(|| set.to_string())
    }

    /// Upstream AddContainer (PreStartContainer): an exclusive set given at
    /// creation counts as applied.
    pub fn add_container(&self, pod_uid: &str, container: &str) {
        let Some(i) = &self.inner else {
            return;
        };
        let mut l = i.locked.lock();
        if let Some(set) = l.state.cpu_set(pod_uid, container).cloned() {
            l.last_update
                .insert((pod_uid.to_string(), container.to_string()), set);
        }
    }

    /// The exclusive CPUs of a container, if any (tests, debugging).
    pub fn exclusive(&self, pod_uid: &str, container: &str) -> Option<CpuSet> {
        let i = self.inner.as_ref()?;
        let l = i.locked.lock();
        l.state.cpu_set(pod_uid, container).cloned()
    }

    /// One reconcile pass (upstream reconcileState); returns how many
    /// containers were updated and how many updates failed.
    pub async fn reconcile(
        &self,
        runtime: &dyn crate::cri::RuntimeService,
        statuses: &PodStatuses,
    ) -> (usize, usize) {
        let Some(i) = &self.inner else {
            return (0, 0);
        };
        self.remove_stale_state(None);
        let pods = i.active.get().map(|f| f()).unwrap_or_default();
        let running: Vec<Running> = pods
            .iter()
            .filter_map(|p| statuses(crate::source::pod_uid(p)).map(|s| (p, s)))
            .flat_map(|(p, s)| running_containers(p, &s))
            .collect();
        let updates = {
            let l = i.locked.lock();
            plan(&l.state, &l.last_update, &running)
        };
        let (mut ok, mut failed) = (0, 0);
        for u in updates {
            let res = crate::cri::v1::LinuxContainerResources {
                cpuset_cpus: u.cpus.to_string(),
                ..Default::default()
            };
            match runtime.update_container_resources(&u.id, res).await {
                Ok(()) => {
                    debug!(pod_uid = %u.pod, container = %u.container, container_id = %u.id, cpuset = %u.cpus, "ReconcileState: updated container");
                    i.locked
                        .lock()
                        .last_update
                        .insert((u.pod, u.container), u.cpus);
                    ok += 1;
                }
                Err(e) => {
                    warn!(pod_uid = %u.pod, container = %u.container, container_id = %u.id, cpuset = %u.cpus, error = %e, "ReconcileState: failed to update container");
                    failed += 1;
                }
            }
        }
        (ok, failed)
    }

    /// The reconcile loop, every `cpuManagerReconcilePeriod`, under the
    /// static policy only (upstream starts none for `none`).
    pub fn spawn_reconcile(
        &self,
        runtime: Arc<dyn crate::cri::RuntimeService>,
        statuses: PodStatuses,
        tasks: &TaskTracker,
        token: CancellationToken,
    ) {
        let Some(i) = &self.inner else {
            return;
        };
        if !self.is_static() || i.period.is_zero() {
            return;
        }
        let (m, period) = (self.clone(), i.period);
        tasks.spawn(
            async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = m.reconcile(runtime.as_ref(), &statuses) => {}
                    }
                }
            }
            .instrument(tracing::info_span!("cpu-manager-reconcile")),
        );
    }
}

/// Writes each new checkpoint text (the latest wins) on the blocking pool;
/// at cancellation, the last one not yet written.
async fn write_state(
    file: StateFile,
    mut rx: watch::Receiver<Option<String>>,
    token: CancellationToken,
) {
    loop {
        let last = tokio::select! {
            r = rx.changed() => r.is_err(),
            _ = token.cancelled() => true,
        };
        if last && !rx.has_changed().unwrap_or(false) {
            return;
        }
        let Some(text) = rx.borrow_and_update().clone() else {
            continue;
        };
        let path = file.path.clone();
        let wrote = crate::blocking::run(
            "cpu manager state".into(),
            Duration::from_secs(10),
            move || state::write_atomic(&path, &text),
        )
        .await;
        match wrote {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "Failed to save checkpoint"),
            Err(e) => warn!(error = %e, "Failed to save checkpoint"),
        }
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
