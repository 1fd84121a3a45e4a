//! CRI client: the generated `runtime.v1` protocol, the runtime/image service
//! traits the rest of rkubelet codes against, and the typed CRI errors.
//! Mirrors upstream's `pkg/kubelet/cri/remote` plus `internalapi`.

pub mod client;
pub mod fake;
pub mod relist;

use async_trait::async_trait;

/// Generated protobuf and gRPC client code for CRI `runtime.v1`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("runtime.v1");
}

pub use v1::{
    Container, ContainerConfig, ContainerFilter, ContainerState, ContainerStatus, Image, ImageSpec,
    PodSandbox, PodSandboxConfig, PodSandboxFilter, PodSandboxState, PodSandboxStatus,
};

/// Errors from a CRI call, with the gRPC codes callers act on kept as
/// variants so nobody matches on message text.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("cri {op}: not found: {message}")]
    NotFound { op: &'static str, message: String },
    #[error("cri {op}: deadline exceeded")]
    DeadlineExceeded { op: &'static str },
    #[error("cri {op}: runtime unavailable: {message}")]
    Unavailable { op: &'static str, message: String },
    #[error("cri {op} failed ({code:?}): {message}")]
    Status {
        op: &'static str,
        code: tonic::Code,
        message: String,
    },
    #[error("invalid runtime endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
}

impl CriError {
    pub fn from_status(op: &'static str, status: tonic::Status) -> Self {
        let message = status.message().to_string();
        match status.code() {
            tonic::Code::NotFound => CriError::NotFound { op, message },
            tonic::Code::DeadlineExceeded => CriError::DeadlineExceeded { op },
            tonic::Code::Unavailable => CriError::Unavailable { op, message },
            code => CriError::Status { op, code, message },
        }
    }

    /// The error as Go's gRPC prints a status (`rpc error: code = X desc
    /// = …`), the text upstream passes on to clients of the streaming
    /// endpoints.
    pub fn grpc_text(&self) -> String {
        let (code, desc) = match self {
            CriError::NotFound { message, .. } => (tonic::Code::NotFound, message.as_str()),
            CriError::DeadlineExceeded { .. } => {
                (tonic::Code::DeadlineExceeded, "context deadline exceeded")
            }
            CriError::Unavailable { message, .. } => (tonic::Code::Unavailable, message.as_str()),
            CriError::Status { code, message, .. } => (*code, message.as_str()),
            CriError::Endpoint { .. } => return self.to_string(),
        };
        format!("rpc error: code = {code:?} desc = {desc}")
    }

    pub fn is_unimplemented(&self) -> bool {
        matches!(
            self,
            CriError::Status {
                code: tonic::Code::Unimplemented,
                ..
            }
        )
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, CriError::NotFound { .. })
    }
}

pub type CriResult<T> = Result<T, CriError>;

/// The CRI RuntimeService, reduced to what the kubelet calls. Implemented by
/// the tonic client and by the recording fake used in unit tests.
#[async_trait]
pub trait RuntimeService: Send + Sync + 'static {
    async fn version(&self) -> CriResult<v1::VersionResponse>;
    async fn status(&self) -> CriResult<v1::StatusResponse>;
    /// CRI UpdateRuntimeConfig with the node's pod CIDR.
    async fn update_runtime_config(&self, pod_cidr: &str) -> CriResult<()>;
    /// CRI RuntimeConfig: the runtime's cgroup driver, `None` when it gives
    /// no Linux configuration. Unimplemented unless a runtime overrides it
    /// (older runtimes, and the fakes).
    async fn runtime_config(&self) -> CriResult<Option<v1::CgroupDriver>> {
        Err(CriError::Status {
            op: "RuntimeConfig",
            code: tonic::Code::Unimplemented,
            message: "RuntimeConfig is not implemented".into(),
        })
    }
    async fn run_pod_sandbox(&self, config: PodSandboxConfig, handler: String)
        -> CriResult<String>;
    async fn stop_pod_sandbox(&self, id: &str) -> CriResult<()>;
    async fn remove_pod_sandbox(&self, id: &str) -> CriResult<()>;
    async fn pod_sandbox_status(&self, id: &str) -> CriResult<PodSandboxStatus>;
    async fn list_pod_sandbox(
        &self,
        filter: Option<PodSandboxFilter>,
    ) -> CriResult<Vec<PodSandbox>>;
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: ContainerConfig,
        sandbox_config: PodSandboxConfig,
    ) -> CriResult<String>;
    async fn start_container(&self, id: &str) -> CriResult<()>;
    /// `timeout` is the grace period in seconds before the runtime kills.
    async fn stop_container(&self, id: &str, timeout: i64) -> CriResult<()>;
    async fn remove_container(&self, id: &str) -> CriResult<()>;
    /// Applies new cgroup settings to a running container (in-place
    /// resize).
    async fn update_container_resources(
        &self,
        _id: &str,
        _linux: v1::LinuxContainerResources,
    ) -> CriResult<()> {
        Err(unimplemented("UpdateContainerResources"))
    }
    async fn list_containers(&self, filter: Option<ContainerFilter>) -> CriResult<Vec<Container>>;
    /// The PLEG's relist: every sandbox and every container (no filter),
    /// each cut to its id, state and pod UID label. The gRPC client decodes
    /// only those (see `relist`); this default cuts the full lists.
    async fn relist(&self) -> CriResult<(Vec<relist::RelistItem>, Vec<relist::RelistItem>)> {
        let item = |id: String, state: i32, labels: &std::collections::HashMap<String, String>| {
            relist::RelistItem {
                pod_uid: labels.get(crate::kuberuntime::labels::POD_UID).cloned(),
                id,
                state,
            }
        };
        let sandboxes = self.list_pod_sandbox(None).await?;
        let sandboxes = sandboxes
            .into_iter()
            .map(|s| item(s.id, s.state, &s.labels))
            .collect();
        let containers = self.list_containers(None).await?;
        let containers = containers
            .into_iter()
            .map(|c| item(c.id, c.state, &c.labels))
            .collect();
        Ok((sandboxes, containers))
    }
    async fn container_status(&self, id: &str) -> CriResult<ContainerStatus>;
    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout_secs: i64,
    ) -> CriResult<v1::ExecSyncResponse>;
    /// Streams container events (GetContainerEvents) into `tx` until the
    /// stream ends or fails. Runtimes without it answer Unimplemented.
    async fn container_events(
        &self,
        tx: tokio::sync::mpsc::Sender<v1::ContainerEventResponse>,
    ) -> CriResult<()>;
    /// Exec/Attach/PortForward return the runtime's streaming URL, which
    /// the kubelet's server proxies the client's upgraded connection to.
    async fn exec(&self, _req: v1::ExecRequest) -> CriResult<String> {
        Err(unimplemented("Exec"))
    }
    async fn attach(&self, _req: v1::AttachRequest) -> CriResult<String> {
        Err(unimplemented("Attach"))
    }
    async fn port_forward(&self, _req: v1::PortForwardRequest) -> CriResult<String> {
        Err(unimplemented("PortForward"))
    }
    async fn list_container_stats(
        &self,
        _filter: Option<v1::ContainerStatsFilter>,
    ) -> CriResult<Vec<v1::ContainerStats>> {
        Err(unimplemented("ListContainerStats"))
    }
    async fn list_pod_sandbox_stats(
        &self,
        _filter: Option<v1::PodSandboxStatsFilter>,
    ) -> CriResult<Vec<v1::PodSandboxStats>> {
        Err(unimplemented("ListPodSandboxStats"))
    }
    /// Asks the runtime to reopen a container's log file after rotation.
    async fn reopen_container_log(&self, _id: &str) -> CriResult<()> {
        Err(unimplemented("ReopenContainerLog"))
    }
    /// Checkpoints a running container to `req.location` (the
    /// `/checkpoint` endpoint). `req.timeout` is in seconds.
    async fn checkpoint_container(&self, _req: v1::CheckpointContainerRequest) -> CriResult<()> {
        Err(unimplemented("CheckpointContainer"))
    }
}

/// The error a runtime (or the fake) gives for a call it does not serve.
pub fn unimplemented(op: &'static str) -> CriError {
    CriError::Status {
        op,
        code: tonic::Code::Unimplemented,
        message: "not implemented".into(),
    }
}

/// The CRI ImageService, reduced to what the kubelet calls.
#[async_trait]
pub trait ImageService: Send + Sync + 'static {
    async fn list_images(&self) -> CriResult<Vec<Image>>;
    /// `None` when the image is not present.
    async fn image_status(&self, image: &str) -> CriResult<Option<Image>>;
    /// Returns the image reference (digest) the runtime pulled; `auth` is
    /// the registry login to use, `None` for an anonymous pull.
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<v1::AuthConfig>,
        sandbox: Option<PodSandboxConfig>,
    ) -> CriResult<String>;
    async fn remove_image(&self, image: &str) -> CriResult<()>;
    /// The image filesystems' usage (CRI ImageFsInfo).
    async fn image_fs_info(&self) -> CriResult<v1::ImageFsInfoResponse> {
        Err(unimplemented("ImageFsInfo"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's status.Error text, which kubectl shows after "unable to
    /// upgrade connection:".
    #[test]
    fn errors_print_as_go_grpc_statuses() {
        let e = CriError::from_status("Exec", tonic::Status::unknown("container is stopped"));
        assert_eq!(
            e.grpc_text(),
            "rpc error: code = Unknown desc = container is stopped"
        );
        let e = CriError::from_status("Exec", tonic::Status::not_found("no such container"));
        assert_eq!(
            e.grpc_text(),
            "rpc error: code = NotFound desc = no such container"
        );
        let e = CriError::DeadlineExceeded { op: "Exec" };
        assert_eq!(
            e.grpc_text(),
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
        );
    }
}
