//! An in-memory runtime for unit tests: it keeps sandboxes, containers and
//! images in maps and records every call, so tests can assert what the
//! kubelet asked for. Never used against real pods.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use parking_lot::Mutex;

use super::*;

#[derive(Default)]
struct State {
    /// Where the streaming calls' URLs point (`None`: a closed port).
    stream_base: Option<String>,
    /// Scripted RuntimeConfig answers, first first: a driver (`None`: no
    /// Linux config) or an error code. Unscripted: Unimplemented.
    runtime_config: std::collections::VecDeque<Result<Option<v1::CgroupDriver>, tonic::Code>>,
    sandboxes: BTreeMap<String, (PodSandboxConfig, i32)>,
    containers: BTreeMap<String, FakeContainer>,
    images: BTreeMap<String, Image>,
    calls: Vec<String>,
    /// Scripted ExecSync outcomes by container ID: an exit code, or `None`
    /// for a runtime deadline (exec timeout). Unscripted containers exit 0.
    exec_results: BTreeMap<String, Option<i32>>,
    /// (container name, timeout) of every StopContainer call.
    stop_timeouts: Vec<(String, i64)>,
    /// Images the scripted registry serves only to this (user, password).
    pull_auth: BTreeMap<String, (String, String)>,
    /// (image, user or `None` for anonymous) of every PullImage call.
    pull_logins: Vec<(String, Option<String>)>,
    /// Scripted ListContainerStats figures by container ID: (cpu ns,
    /// working set bytes, writable layer bytes).
    container_stats: BTreeMap<String, (u64, u64, u64)>,
    /// ContainerStatus calls by container ID (not in `calls`, which tests
    /// compare whole).
    status_asks: BTreeMap<String, usize>,
    /// Every Attach request, whole.
    attach_requests: Vec<v1::AttachRequest>,
}

struct FakeContainer {
    sandbox_id: String,
    config: ContainerConfig,
    state: i32,
    created_at: i64,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
}

/// A fake CRI runtime. Clock values are a counter so ordering is stable.
#[derive(Default)]
pub struct FakeRuntime {
    state: Mutex<State>,
    seq: AtomicU64,
    last_ns: std::sync::atomic::AtomicI64,
}

impl FakeRuntime {
    pub fn new() -> Self {
        Self::default()
    }

    /// Points the streaming calls' URLs at `base` (`http://host:port`).
    pub fn set_stream_base(&self, base: &str) {
        self.state.lock().stream_base = Some(base.to_string());
    }

    fn stream_base(s: &State) -> &str {
        s.stream_base.as_deref().unwrap_or("http://127.0.0.1:9")
    }

    pub fn add_image(&self, name: &str) {
        self.add_sized_image(name, 0, false);
    }

    /// Adds an image of `size` bytes, pinned or not; its ID.
    pub fn add_sized_image(&self, name: &str, size: u64, pinned: bool) -> String {
        let img = Image {
            id: format!("sha256:{:064x}", self.next()),
            repo_tags: vec![name.to_string()],
            size,
            pinned,
            ..Default::default()
        };
        let id = img.id.clone();
        self.state.lock().images.insert(name.to_string(), img);
        id
    }

    /// The ID of the image a container was created from, as the runtime
    /// reports it (`image_ref`).
    fn image_ref(s: &State, image: Option<&ImageSpec>) -> String {
        image
            .and_then(|i| s.images.get(&i.image))
            .map_or_else(|| "sha256:fake".to_string(), |i| i.id.clone())
    }

    /// Makes pulls of `image` fail as unauthorized unless they log in as
    /// `user` with `password`.
    pub fn require_pull_auth(&self, image: &str, user: &str, password: &str) {
        self.state
            .lock()
            .pull_auth
            .insert(image.to_string(), (user.to_string(), password.to_string()));
    }

    /// (image, user or `None` for anonymous) of every PullImage call.
    pub fn pull_logins(&self) -> Vec<(String, Option<String>)> {
        self.state.lock().pull_logins.clone()
    }

    /// (container name, timeout seconds) of every StopContainer call.
    pub fn stop_timeouts(&self) -> Vec<(String, i64)> {
        self.state.lock().stop_timeouts.clone()
    }

    /// Queues the answer of the next RuntimeConfig call.
    pub fn push_runtime_config(&self, answer: Result<Option<v1::CgroupDriver>, tonic::Code>) {
        self.state.lock().runtime_config.push_back(answer);
    }

    /// How many times ContainerStatus was asked about container `id`.
    pub fn status_asks(&self, id: &str) -> usize {
        self.state.lock().status_asks.get(id).copied().unwrap_or(0)
    }

    /// A ready sandbox for pod `namespace/name` (UID `uid`) with its
    /// container `container` (image busybox) running, labelled as the
    /// kubelet labels them: (sandbox ID, container ID).
    pub async fn run_labelled(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        container: &str,
    ) -> (String, String) {
        use crate::kuberuntime::labels;
        let pod_labels: std::collections::HashMap<String, String> = [
            (labels::POD_NAME, name),
            (labels::POD_NAMESPACE, namespace),
            (labels::POD_UID, uid),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let sb_cfg = PodSandboxConfig {
            metadata: Some(v1::PodSandboxMetadata {
                name: name.into(),
                namespace: namespace.into(),
                uid: uid.into(),
                attempt: 0,
            }),
            labels: pod_labels.clone(),
            ..Default::default()
        };
        let sb = self
            .run_pod_sandbox(sb_cfg.clone(), String::new())
            .await
            .unwrap();
        let mut c_labels = pod_labels;
        c_labels.insert(labels::CONTAINER_NAME.into(), container.into());
        let cfg = ContainerConfig {
            metadata: Some(v1::ContainerMetadata {
                name: container.into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: "busybox".into(),
                ..Default::default()
            }),
            labels: c_labels,
            ..Default::default()
        };
        let cid = self.create_container(&sb, cfg, sb_cfg).await.unwrap();
        self.start_container(&cid).await.unwrap();
        (sb, cid)
    }

    /// Calls made so far, as "Op id-or-name" strings.
    pub fn calls(&self) -> Vec<String> {
        self.state.lock().calls.clone()
    }

    /// How many calls so far start with `prefix`.
    pub fn count_calls(&self, prefix: &str) -> usize {
        let s = self.state.lock();
        s.calls.iter().filter(|c| c.starts_with(prefix)).count()
    }

    /// Every Attach request so far.
    pub fn attach_requests(&self) -> Vec<v1::AttachRequest> {
        self.state.lock().attach_requests.clone()
    }

    pub fn clear_calls(&self) {
        self.state.lock().calls.clear();
    }

    /// Makes a running container exit with `code`, as if its process ended.
    pub fn exit_container(&self, id: &str, code: i32) {
        let now = self.now_ns();
        let mut s = self.state.lock();
        if let Some(c) = s.containers.get_mut(id) {
            c.state = ContainerState::ContainerExited as i32;
            c.exit_code = code;
            c.finished_at = now;
        }
    }

    /// Makes every later ExecSync in the container exit with `exit_code`.
    pub fn set_exec_result(&self, container_id: &str, exit_code: i32) {
        self.state
            .lock()
            .exec_results
            .insert(container_id.to_string(), Some(exit_code));
    }

    /// Makes every later ExecSync in the container fail with a deadline, as
    /// the runtime reports a command that outlived its timeout.
    pub fn set_exec_timeout(&self, container_id: &str) {
        self.state
            .lock()
            .exec_results
            .insert(container_id.to_string(), None);
    }

    /// Scripts the CRI stats of a container (ListContainerStats).
    pub fn set_container_stats(&self, id: &str, cpu_ns: u64, working_set: u64, rootfs: u64) {
        self.state
            .lock()
            .container_stats
            .insert(id.to_string(), (cpu_ns, working_set, rootfs));
    }

    /// Marks a sandbox not ready, as if its network or pause process died.
    pub fn kill_sandbox(&self, id: &str) {
        if let Some(sb) = self.state.lock().sandboxes.get_mut(id) {
            sb.1 = PodSandboxState::SandboxNotready as i32;
        }
    }

    /// Wall-clock nanoseconds, strictly increasing, as CRI timestamps are
    /// (backoff compares them with the real clock).
    fn now_ns(&self) -> i64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as i64;
        let prev = self.last_ns.fetch_max(wall, Ordering::SeqCst);
        if wall > prev {
            wall
        } else {
            self.last_ns.fetch_add(1, Ordering::SeqCst) + 1
        }
    }

    fn next(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn record(&self, s: &mut State, call: String) {
        s.calls.push(call);
    }
}

fn container_name(s: &State, id: &str) -> String {
    s.containers
        .get(id)
        .and_then(|c| c.config.metadata.as_ref())
        .map(|m| m.name.clone())
        .unwrap_or_default()
}

fn labels_match(
    want: &std::collections::HashMap<String, String>,
    have: &std::collections::HashMap<String, String>,
) -> bool {
    want.iter().all(|(k, v)| have.get(k) == Some(v))
}

#[async_trait]
impl RuntimeService for FakeRuntime {
    async fn version(&self) -> CriResult<v1::VersionResponse> {
        Ok(v1::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "0".into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn runtime_config(&self) -> CriResult<Option<v1::CgroupDriver>> {
        let mut s = self.state.lock();
        self.record(&mut s, "RuntimeConfig".to_string());
        let code = match s.runtime_config.pop_front() {
            Some(Ok(d)) => return Ok(d),
            Some(Err(code)) => code,
            None => tonic::Code::Unimplemented,
        };
        Err(CriError::Status {
            op: "RuntimeConfig",
            code,
            message: "scripted".into(),
        })
    }

    async fn update_runtime_config(&self, pod_cidr: &str) -> CriResult<()> {
        let mut s = self.state.lock();
        self.record(&mut s, format!("UpdateRuntimeConfig {pod_cidr}"));
        Ok(())
    }

    async fn status(&self) -> CriResult<v1::StatusResponse> {
        let cond = |t: &str| v1::RuntimeCondition {
            r#type: t.into(),
            status: true,
            ..Default::default()
        };
        Ok(v1::StatusResponse {
            status: Some(v1::RuntimeStatus {
                conditions: vec![cond("RuntimeReady"), cond("NetworkReady")],
            }),
            ..Default::default()
        })
    }

    async fn run_pod_sandbox(&self, config: PodSandboxConfig, _h: String) -> CriResult<String> {
        let id = format!("sb{}", self.next());
        let mut s = self.state.lock();
        self.record(
            &mut s,
            format!(
                "RunPodSandbox {}",
                config
                    .metadata
                    .as_ref()
                    .map(|m| m.name.as_str())
                    .unwrap_or("")
            ),
        );
        // Scripted by name: a pod called "broken..." cannot get a sandbox.
        if config
            .metadata
            .as_ref()
            .is_some_and(|m| m.name.starts_with("broken"))
        {
            return Err(CriError::Status {
                op: "RunPodSandbox",
                code: tonic::Code::Unknown,
                message: "scripted sandbox failure".into(),
            });
        }
        s.sandboxes
            .insert(id.clone(), (config, PodSandboxState::SandboxReady as i32));
        Ok(id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> CriResult<()> {
        let mut s = self.state.lock();
        self.record(&mut s, format!("StopPodSandbox {id}"));
        let now = self.now_ns();
        for c in s.containers.values_mut().filter(|c| c.sandbox_id == id) {
            if c.state == ContainerState::ContainerRunning as i32 {
                c.state = ContainerState::ContainerExited as i32;
                c.exit_code = 137;
                c.finished_at = now;
            }
        }
        if let Some(sb) = s.sandboxes.get_mut(id) {
            sb.1 = PodSandboxState::SandboxNotready as i32;
        }
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> CriResult<()> {
        let mut s = self.state.lock();
        self.record(&mut s, format!("RemovePodSandbox {id}"));
        s.sandboxes.remove(id);
        s.containers.retain(|_, c| c.sandbox_id != id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: &str) -> CriResult<PodSandboxStatus> {
        let s = self.state.lock();
        let (cfg, state) = s.sandboxes.get(id).ok_or(CriError::NotFound {
            op: "PodSandboxStatus",
            message: id.into(),
        })?;
        Ok(PodSandboxStatus {
            id: id.into(),
            metadata: cfg.metadata.clone(),
            state: *state,
            network: Some(v1::PodSandboxNetworkStatus {
                ip: "10.88.0.5".into(),
                additional_ips: vec![],
            }),
            labels: cfg.labels.clone(),
            annotations: cfg.annotations.clone(),
            ..Default::default()
        })
    }

    async fn list_pod_sandbox(
        &self,
        filter: Option<PodSandboxFilter>,
    ) -> CriResult<Vec<PodSandbox>> {
        let s = self.state.lock();
        let want = filter.map(|f| f.label_selector).unwrap_or_default();
        Ok(s.sandboxes
            .iter()
            .filter(|(_, (cfg, _))| labels_match(&want, &cfg.labels))
            .map(|(id, (cfg, state))| PodSandbox {
                id: id.clone(),
                metadata: cfg.metadata.clone(),
                state: *state,
                created_at: id.trim_start_matches("sb").parse().unwrap_or(0),
                labels: cfg.labels.clone(),
                annotations: cfg.annotations.clone(),
                runtime_handler: String::new(),
            })
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: ContainerConfig,
        _sb: PodSandboxConfig,
    ) -> CriResult<String> {
        let n = self.next();
        let id = format!("c{n}");
        let created = self.now_ns();
        let mut s = self.state.lock();
        if !s.sandboxes.contains_key(sandbox_id) {
            return Err(CriError::NotFound {
                op: "CreateContainer",
                message: sandbox_id.into(),
            });
        }
        self.record(
            &mut s,
            format!(
                "CreateContainer {}",
                config
                    .metadata
                    .as_ref()
                    .map(|m| m.name.as_str())
                    .unwrap_or("")
            ),
        );
        s.containers.insert(
            id.clone(),
            FakeContainer {
                sandbox_id: sandbox_id.into(),
                config,
                state: ContainerState::ContainerCreated as i32,
                created_at: created,
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
            },
        );
        Ok(id)
    }

    async fn start_container(&self, id: &str) -> CriResult<()> {
        let now = self.now_ns();
        let mut s = self.state.lock();
        let name = container_name(&s, id);
        self.record(&mut s, format!("StartContainer {name}"));
        let c = s.containers.get_mut(id).ok_or(CriError::NotFound {
            op: "StartContainer",
            message: id.into(),
        })?;
        c.state = ContainerState::ContainerRunning as i32;
        c.started_at = now;
        Ok(())
    }

    async fn stop_container(&self, id: &str, timeout: i64) -> CriResult<()> {
        let name = {
            let mut s = self.state.lock();
            let name = container_name(&s, id);
            self.record(&mut s, format!("StopContainer {name}"));
            s.stop_timeouts.push((name.clone(), timeout));
            name
        };
        // Scripted by name: a "stubborn..." container ignores SIGTERM and
        // dies only when the timeout runs out.
        if name.starts_with("stubborn") {
            tokio::time::sleep(std::time::Duration::from_secs(timeout.max(0) as u64)).await;
        }
        let now = self.now_ns();
        let mut s = self.state.lock();
        if let Some(c) = s.containers.get_mut(id) {
            if c.state == ContainerState::ContainerRunning as i32 {
                c.state = ContainerState::ContainerExited as i32;
                c.exit_code = 137;
                c.finished_at = now;
            }
        }
        Ok(())
    }

    async fn update_container_resources(
        &self,
        id: &str,
        linux: v1::LinuxContainerResources,
    ) -> CriResult<()> {
        let mut s = self.state.lock();
        let name = container_name(&s, id);
        self.record(
            &mut s,
            format!(
                "UpdateContainerResources {name} quota={} shares={} memory={}",
                linux.cpu_quota, linux.cpu_shares, linux.memory_limit_in_bytes
            ),
        );
        let c = s.containers.get_mut(id).ok_or(CriError::NotFound {
            op: "UpdateContainerResources",
            message: id.into(),
        })?;
        if let Some(l) = c.config.linux.as_mut() {
            l.resources = Some(linux);
        }
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> CriResult<()> {
        let mut s = self.state.lock();
        self.record(&mut s, format!("RemoveContainer {id}"));
        s.containers.remove(id);
        Ok(())
    }

    async fn list_containers(&self, filter: Option<ContainerFilter>) -> CriResult<Vec<Container>> {
        let s = self.state.lock();
        let want = filter.map(|f| f.label_selector).unwrap_or_default();
        Ok(s.containers
            .iter()
            .filter(|(_, c)| labels_match(&want, &c.config.labels))
            .map(|(id, c)| Container {
                id: id.clone(),
                pod_sandbox_id: c.sandbox_id.clone(),
                metadata: c.config.metadata.clone(),
                image: c.config.image.clone(),
                image_ref: Self::image_ref(&s, c.config.image.as_ref()),
                state: c.state,
                created_at: c.created_at,
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
                ..Default::default()
            })
            .collect())
    }

    async fn list_container_stats(
        &self,
        _filter: Option<v1::ContainerStatsFilter>,
    ) -> CriResult<Vec<v1::ContainerStats>> {
        let mut s = self.state.lock();
        self.record(&mut s, "ListContainerStats".into());
        let u = |value| Some(v1::UInt64Value { value });
        Ok(s.container_stats
            .iter()
            .filter_map(|(id, (cpu, ws, rootfs))| {
                let c = s.containers.get(id)?;
                Some(v1::ContainerStats {
                    attributes: Some(v1::ContainerAttributes {
                        id: id.clone(),
                        metadata: c.config.metadata.clone(),
                        labels: c.config.labels.clone(),
                        annotations: c.config.annotations.clone(),
                    }),
                    cpu: Some(v1::CpuUsage {
                        usage_core_nano_seconds: u(*cpu),
                        ..Default::default()
                    }),
                    // The fake keeps one memory figure: usage is the
                    // working set (no page cache).
                    memory: Some(v1::MemoryUsage {
                        working_set_bytes: u(*ws),
                        usage_bytes: u(*ws),
                        ..Default::default()
                    }),
                    writable_layer: Some(v1::FilesystemUsage {
                        used_bytes: u(*rootfs),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
            })
            .collect())
    }

    async fn container_status(&self, id: &str) -> CriResult<ContainerStatus> {
        let mut s = self.state.lock();
        *s.status_asks.entry(id.to_string()).or_default() += 1;
        // As containerd: the sandbox's log directory joined with the
        // container's relative log path, when both are set.
        let log_path = s.containers.get(id).and_then(|c| {
            let (sb, _) = s.sandboxes.get(&c.sandbox_id)?;
            (!sb.log_directory.is_empty() && !c.config.log_path.is_empty()).then(|| {
                std::path::Path::new(&sb.log_directory)
                    .join(&c.config.log_path)
                    .to_string_lossy()
                    .into_owned()
            })
        });
        let c = s.containers.get(id).ok_or(CriError::NotFound {
            op: "ContainerStatus",
            message: id.into(),
        })?;
        let exited = c.state == ContainerState::ContainerExited as i32;
        Ok(ContainerStatus {
            id: id.into(),
            metadata: c.config.metadata.clone(),
            state: c.state,
            created_at: c.created_at,
            started_at: c.started_at,
            finished_at: c.finished_at,
            exit_code: c.exit_code,
            image: c.config.image.clone(),
            image_ref: "sha256:fake".into(),
            reason: if exited {
                if c.exit_code == 0 {
                    "Completed".into()
                } else {
                    "Error".into()
                }
            } else {
                String::new()
            },
            labels: c.config.labels.clone(),
            annotations: c.config.annotations.clone(),
            log_path: log_path.unwrap_or_default(),
            // As containerd: the settings the container was made with, as
            // UpdateContainerResources last changed them.
            resources: c
                .config
                .linux
                .as_ref()
                .and_then(|l| l.resources.clone())
                .map(|linux| v1::ContainerResources {
                    linux: Some(linux),
                    ..Default::default()
                }),
            ..Default::default()
        })
    }

    async fn reopen_container_log(&self, id: &str) -> CriResult<()> {
        let mut s = self.state.lock();
        self.record(&mut s, format!("ReopenContainerLog {id}"));
        Ok(())
    }

    async fn checkpoint_container(&self, req: v1::CheckpointContainerRequest) -> CriResult<()> {
        let mut s = self.state.lock();
        self.record(
            &mut s,
            format!(
                "CheckpointContainer {} {} {}",
                req.container_id, req.location, req.timeout
            ),
        );
        Ok(())
    }

    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        _t: i64,
    ) -> CriResult<v1::ExecSyncResponse> {
        let mut s = self.state.lock();
        self.record(&mut s, format!("ExecSync {id} {}", cmd.join(" ")));
        match s.exec_results.get(id).copied() {
            Some(None) => Err(CriError::DeadlineExceeded { op: "ExecSync" }),
            Some(Some(exit_code)) => Ok(v1::ExecSyncResponse {
                exit_code,
                ..Default::default()
            }),
            None => Ok(v1::ExecSyncResponse::default()),
        }
    }

    /// Streaming calls answer a URL on a closed port unless a base is set:
    /// handler tests check the call and what the proxy sends or answers.
    async fn exec(&self, req: v1::ExecRequest) -> CriResult<String> {
        let mut s = self.state.lock();
        self.record(
            &mut s,
            format!("Exec {} {}", req.container_id, req.cmd.join(" ")),
        );
        Ok(format!(
            "{}/exec/{}",
            Self::stream_base(&s),
            req.container_id
        ))
    }

    async fn attach(&self, req: v1::AttachRequest) -> CriResult<String> {
        let mut s = self.state.lock();
        self.record(&mut s, format!("Attach {}", req.container_id));
        s.attach_requests.push(req.clone());
        Ok(format!(
            "{}/attach/{}",
            Self::stream_base(&s),
            req.container_id
        ))
    }

    async fn port_forward(&self, req: v1::PortForwardRequest) -> CriResult<String> {
        let mut s = self.state.lock();
        self.record(
            &mut s,
            format!("PortForward {} {:?}", req.pod_sandbox_id, req.port),
        );
        Ok(format!(
            "{}/portforward/{}",
            Self::stream_base(&s),
            req.pod_sandbox_id
        ))
    }

    async fn container_events(
        &self,
        _tx: tokio::sync::mpsc::Sender<v1::ContainerEventResponse>,
    ) -> CriResult<()> {
        // Like containerd 1.6: the generic relist is the only source.
        Err(CriError::Status {
            op: "GetContainerEvents",
            code: tonic::Code::Unimplemented,
            message: "fake".into(),
        })
    }
}

#[async_trait]
impl ImageService for FakeRuntime {
    async fn list_images(&self) -> CriResult<Vec<Image>> {
        Ok(self.state.lock().images.values().cloned().collect())
    }

    async fn image_status(&self, image: &str) -> CriResult<Option<Image>> {
        Ok(self.state.lock().images.get(image).cloned())
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<v1::AuthConfig>,
        _sb: Option<PodSandboxConfig>,
    ) -> CriResult<String> {
        {
            let mut s = self.state.lock();
            self.record(&mut s, format!("PullImage {image}"));
            let login = auth.map(|a| (a.username, a.password));
            s.pull_logins
                .push((image.to_string(), login.as_ref().map(|l| l.0.clone())));
            if let Some(want) = s.pull_auth.get(image) {
                if login.as_ref() != Some(want) {
                    return Err(CriError::Status {
                        op: "PullImage",
                        code: tonic::Code::Unknown,
                        message: format!("{image}: unauthorized"),
                    });
                }
            }
            if !s.images.contains_key(image) && image.contains("missing") {
                return Err(CriError::NotFound {
                    op: "PullImage",
                    message: format!("{image}: not found"),
                });
            }
        }
        // Scripted by name: "hang" never finishes (a registry that stops
        // answering), "panic" panics (a bug deep in a sync).
        if image.contains("hang") {
            std::future::pending::<()>().await;
        }
        if image.contains("panic") {
            panic!("scripted panic pulling {image}");
        }
        if !self.state.lock().images.contains_key(image) {
            self.add_image(image);
        }
        Ok(self.state.lock().images[image].id.clone())
    }

    async fn remove_image(&self, image: &str) -> CriResult<()> {
        let mut s = self.state.lock();
        self.record(&mut s, format!("RemoveImage {image}"));
        // By name or by ID, as containerd takes either.
        s.images.retain(|name, i| name != image && i.id != image);
        Ok(())
    }
}
