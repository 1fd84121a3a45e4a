//! What the runtime knows about one pod: its sandboxes and containers as CRI
//! reports them, newest first (upstream `kubecontainer.PodStatus`).

use std::collections::HashMap;

use crate::cri::{self, ContainerState, PodSandboxState};

use super::labels;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CState {
    Created,
    Running,
    Exited,
    Unknown,
}

impl CState {
    pub fn from_cri(state: i32) -> Self {
        match ContainerState::try_from(state) {
            Ok(ContainerState::ContainerCreated) => CState::Created,
            Ok(ContainerState::ContainerRunning) => CState::Running,
            Ok(ContainerState::ContainerExited) => CState::Exited,
            _ => CState::Unknown,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ContainerInfo {
    pub id: String,
    pub name: String,
    pub sandbox_id: String,
    pub state: CState,
    pub init: bool,
    pub restart_count: i32,
    /// rkubelet's field-set hash and its version, if rkubelet created it.
    pub hash: Option<String>,
    pub spec_version: Option<String>,
    /// Upstream's hash (`io.kubernetes.container.hash`).
    pub upstream_hash: Option<String>,
    /// Nanoseconds since the epoch, as CRI reports them.
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub image: String,
    pub image_ref: String,
    /// The pod's terminationGracePeriodSeconds recorded at creation.
    pub pod_grace: Option<i64>,
    /// The preStop handler recorded at creation, for orphans.
    pub pre_stop: Option<k8s_openapi::api::core::v1::LifecycleHandler>,
    /// The cgroup settings the runtime reports it applied (containerd:
    /// those it was made with, as UpdateContainerResources changed them).
    pub resources: Option<crate::cri::v1::LinuxContainerResources>,
    /// The identity the runtime reports the container's process runs as
    /// (CRI ContainerStatus.user, containerd 2.0+).
    pub user: Option<crate::cri::v1::ContainerUser>,
}

impl ContainerInfo {
    pub fn from_cri(s: &cri::ContainerStatus, sandbox_id: &str) -> Self {
        let a = &s.annotations;
        ContainerInfo {
            id: s.id.clone(),
            name: s
                .labels
                .get(labels::CONTAINER_NAME)
                .cloned()
                .or_else(|| s.metadata.as_ref().map(|m| m.name.clone()))
                .unwrap_or_default(),
            sandbox_id: sandbox_id.to_string(),
            state: CState::from_cri(s.state),
            init: s
                .labels
                .get(labels::CONTAINER_TYPE)
                .is_some_and(|t| t == "init"),
            restart_count: a
                .get(labels::CONTAINER_RESTART_COUNT)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            hash: own_hash(a).cloned(),
            spec_version: a.get(labels::CONTAINER_SPEC_VERSION).cloned(),
            upstream_hash: a.get(labels::CONTAINER_HASH).cloned(),
            created_at: s.created_at,
            started_at: s.started_at,
            finished_at: s.finished_at,
            exit_code: s.exit_code,
            reason: s.reason.clone(),
            // The termination message, read from files, is added by
            // `with_termination_message` off the async threads.
            message: s.message.clone(),
            image: s
                .image
                .as_ref()
                .map(|i| i.image.clone())
                .unwrap_or_default(),
            image_ref: s.image_ref.clone(),
            pod_grace: a
                .get(labels::POD_TERMINATION_GRACE)
                .and_then(|v| v.parse().ok()),
            pre_stop: a
                .get(labels::CONTAINER_PRE_STOP_HANDLER)
                .and_then(|v| serde_json::from_str(v).ok()),
            resources: s.resources.as_ref().and_then(|r| r.linux.clone()),
            user: s.user.clone(),
        }
    }

    /// Where upstream's termination message of an exited container is
    /// read from: the file behind terminationMessagePath (at most 4 KiB),
    /// or with FallbackToLogsOnError and a failure, the last 80 log lines
    /// (2 KiB). None when there is nothing to read.
    pub fn termination_source(s: &cri::ContainerStatus) -> Option<TerminationSource> {
        if CState::from_cri(s.state) != CState::Exited {
            return None;
        }
        let path = s
            .annotations
            .get(labels::CONTAINER_TERMINATION_MESSAGE_PATH);
        let file = path
            .and_then(|p| s.mounts.iter().find(|m| &m.container_path == p))
            .map(|m| m.host_path.clone());
        let fallback = s
            .annotations
            .get(labels::CONTAINER_TERMINATION_MESSAGE_POLICY)
            .is_some_and(|p| p == "FallbackToLogsOnError");
        let log =
            (fallback && s.exit_code != 0 && !s.log_path.is_empty()).then(|| s.log_path.clone());
        (file.is_some() || log.is_some()).then_some(TerminationSource { file, log })
    }

    /// Joins the runtime's message and the termination message, as before
    /// the reads moved off the async threads.
    pub fn with_termination_message(&mut self, t: String) {
        if t.is_empty() {
            return;
        }
        self.message = if self.message.is_empty() {
            t
        } else {
            format!("{}: {t}", self.message)
        };
    }

    /// The hashes recorded on the container, for `hash::spec_changed`.
    pub fn recorded(&self) -> super::hash::Recorded<'_> {
        super::hash::Recorded {
            own: self.hash.as_deref(),
            version: self.spec_version.as_deref(),
            upstream: self.upstream_hash.as_deref(),
        }
    }

    pub fn failed(&self) -> bool {
        self.state == CState::Unknown || (self.state == CState::Exited && self.exit_code != 0)
    }
}

/// rkubelet's own hash: under its own key, or, on containers an earlier
/// rkubelet created, under upstream's key beside the field-set version.
fn own_hash(a: &HashMap<String, String>) -> Option<&String> {
    a.get(labels::RKUBELET_CONTAINER_HASH).or_else(|| {
        a.get(labels::CONTAINER_SPEC_VERSION)
            .and(a.get(labels::CONTAINER_HASH))
    })
}

/// The files one exited container's termination message comes from.
#[derive(Debug, Clone)]
pub struct TerminationSource {
    file: Option<String>,
    log: Option<String>,
}

impl TerminationSource {
    /// Reads the message. Blocking: call it on a blocking thread.
    pub fn read(&self) -> String {
        let msg = self
            .file
            .as_deref()
            .map(|h| read_tail(h, 4096))
            .unwrap_or_default();
        match &self.log {
            Some(log) if msg.is_empty() => last_log_lines(log, 80, 2048),
            _ => msg,
        }
    }
}

/// The last `max` bytes of a file, lossily decoded.
fn read_tail(path: &str, max: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.take(max).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// The message part of the last `lines` CRI log lines
/// (`<time> <stream> <P|F> <msg>`), within `max` bytes.
fn last_log_lines(path: &str, lines: usize, max: usize) -> String {
    let text = read_tail(path, 64 * 1024);
    let mut out: Vec<&str> = text
        .lines()
        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(l))
        .collect();
    if out.len() > lines {
        out.drain(..out.len() - lines);
    }
    let mut joined = out.join("\n");
    if joined.len() > max {
        let cut = joined.len() - max;
        let cut = (cut..joined.len())
            .find(|i| joined.is_char_boundary(*i))
            .unwrap_or(joined.len());
        joined.drain(..cut);
    }
    joined
}

#[derive(Debug, Clone)]
pub struct SandboxInfo {
    pub id: String,
    pub ready: bool,
    pub attempt: u32,
    pub created_at: i64,
    pub ips: Vec<String>,
    pub host_network: bool,
}

impl SandboxInfo {
    pub fn from_cri(s: &cri::PodSandboxStatus) -> Self {
        let mut ips = Vec::new();
        if let Some(n) = &s.network {
            if !n.ip.is_empty() {
                ips.push(n.ip.clone());
            }
            ips.extend(n.additional_ips.iter().map(|i| i.ip.clone()));
        }
        let host_network = s
            .linux
            .as_ref()
            .and_then(|l| l.namespaces.as_ref())
            .and_then(|n| n.options.as_ref())
            .is_some_and(|o| o.network == cri::v1::NamespaceMode::Node as i32);
        SandboxInfo {
            id: s.id.clone(),
            ready: s.state == PodSandboxState::SandboxReady as i32,
            attempt: s.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
            created_at: s.created_at,
            ips,
            host_network,
        }
    }
}

/// The runtime's view of one pod; both lists are newest first.
#[derive(Debug, Clone, Default)]
pub struct RuntimePod {
    pub uid: String,
    pub sandboxes: Vec<SandboxInfo>,
    pub containers: Vec<ContainerInfo>,
}

impl RuntimePod {
    /// The newest instance of the named container.
    pub fn latest(&self, name: &str) -> Option<&ContainerInfo> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// All instances of the named container, newest first.
    pub fn instances<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a ContainerInfo> + 'a {
        self.containers.iter().filter(move |c| c.name == name)
    }

    pub fn ips(&self) -> Vec<String> {
        self.sandboxes
            .first()
            .map(|s| s.ips.clone())
            .unwrap_or_default()
    }

    pub fn running_containers(&self) -> impl Iterator<Item = &ContainerInfo> {
        self.containers
            .iter()
            .filter(|c| matches!(c.state, CState::Running | CState::Unknown))
    }

    pub fn sort(&mut self) {
        self.sandboxes
            .sort_by_key(|s| std::cmp::Reverse(s.created_at));
        self.containers
            .sort_by_key(|c| std::cmp::Reverse(c.created_at));
    }

    pub fn is_empty(&self) -> bool {
        self.sandboxes.is_empty() && self.containers.is_empty()
    }

    /// Container name → newest instance, for quick lookups in status code.
    pub fn latest_by_name(&self) -> HashMap<&str, &ContainerInfo> {
        let mut m = HashMap::new();
        for c in &self.containers {
            m.entry(c.name.as_str()).or_insert(c);
        }
        m
    }
}
