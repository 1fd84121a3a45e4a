//! The gRPC client to a CSI driver's node service over its Unix socket
//! (upstream `csi_client.go`), and the channel helper the plugin
//! registration uses too. Every call carries a deadline.

use std::collections::HashMap;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::proto::{self, node_client::NodeClient};

/// Upstream's csiTimeout for a node operation.
pub const CSI_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    #[error("rpc error: code = {code:?} desc = {message}")]
    Status { code: tonic::Code, message: String },
    #[error("rpc error: code = DeadlineExceeded desc = context deadline exceeded")]
    Timeout,
}

impl CsiError {
    /// Whether the driver may still be working on it (upstream
    /// `isFinalError` is false for these codes): the target directory is
    /// then left for the next attempt.
    pub fn is_final(&self) -> bool {
        use tonic::Code::*;
        match self {
            CsiError::Timeout => false,
            CsiError::Status { code, .. } => !matches!(
                code,
                Cancelled | DeadlineExceeded | Unavailable | ResourceExhausted | Aborted
            ),
        }
    }
}

impl From<tonic::Status> for CsiError {
    fn from(s: tonic::Status) -> Self {
        CsiError::Status {
            code: s.code(),
            message: s.message().to_string(),
        }
    }
}

/// A lazily connecting channel to a plugin's Unix socket (`unix://` prefix
/// optional, as drivers report either form).
pub fn unix_channel(endpoint: &str) -> Channel {
    let path = endpoint
        .strip_prefix("unix://")
        .unwrap_or(endpoint)
        .to_string();
    // The URI is a placeholder: the connector ignores it.
    Endpoint::from_static("http://[::]:0")
        .connect_timeout(Duration::from_secs(10))
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
}

pub(crate) async fn with_deadline<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, CsiError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(s.into()),
        Err(_) => Err(CsiError::Timeout),
    }
}

/// One driver's node service.
#[derive(Clone)]
pub struct NodeService {
    client: NodeClient<Channel>,
    timeout: Duration,
}

/// What NodePublishVolume / NodeStageVolume need besides the paths.
#[derive(Debug, Clone, Default)]
pub struct VolumeRequest {
    pub volume_id: String,
    pub read_only: bool,
    pub fs_type: String,
    pub mount_flags: Vec<String>,
    /// The Kubernetes access mode (ReadWriteOnce, ReadOnlyMany, ...).
    pub access_mode: String,
    pub publish_context: HashMap<String, String>,
    pub volume_context: HashMap<String, String>,
    pub secrets: HashMap<String, String>,
}

impl VolumeRequest {
    /// A mounted file system (block volumes are not supported), with
    /// upstream's access mode mapping (`asCSIAccessModeV1`, without the
    /// SINGLE_NODE_MULTI_WRITER capability).
    fn capability(&self) -> proto::VolumeCapability {
        use proto::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
        let mode = match self.access_mode.as_str() {
            "ReadOnlyMany" => Mode::MultiNodeReaderOnly,
            "ReadWriteMany" => Mode::MultiNodeMultiWriter,
            _ => Mode::SingleNodeWriter,
        };
        proto::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: self.fs_type.clone(),
                mount_flags: self.mount_flags.clone(),
                volume_mount_group: String::new(),
            })),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }
}

impl NodeService {
    pub fn new(endpoint: &str, timeout: Duration) -> Self {
        NodeService {
            client: NodeClient::new(unix_channel(endpoint)),
            timeout,
        }
    }

    pub async fn get_info(&self) -> Result<proto::NodeGetInfoResponse, CsiError> {
        let mut c = self.client.clone();
        with_deadline(self.timeout, c.node_get_info(proto::NodeGetInfoRequest {})).await
    }

    /// Whether the driver stages volumes (the STAGE_UNSTAGE_VOLUME node
    /// capability).
    pub async fn supports_stage_unstage(&self) -> Result<bool, CsiError> {
        use proto::node_service_capability::{rpc::Type, Type as Cap};
        let mut c = self.client.clone();
        let caps = with_deadline(
            self.timeout,
            c.node_get_capabilities(proto::NodeGetCapabilitiesRequest {}),
        )
        .await?;
        Ok(caps.capabilities.iter().any(|cap| {
            matches!(&cap.r#type, Some(Cap::Rpc(r)) if r.r#type == Type::StageUnstageVolume as i32)
        }))
    }

    pub async fn publish(
        &self,
        req: &VolumeRequest,
        staging_path: &str,
        target_path: &str,
    ) -> Result<(), CsiError> {
        let mut c = self.client.clone();
        let r = proto::NodePublishVolumeRequest {
            volume_id: req.volume_id.clone(),
            publish_context: req.publish_context.clone(),
            staging_target_path: staging_path.to_string(),
            target_path: target_path.to_string(),
            volume_capability: Some(req.capability()),
            readonly: req.read_only,
            secrets: req.secrets.clone(),
            volume_context: req.volume_context.clone(),
        };
        with_deadline(self.timeout, c.node_publish_volume(r))
            .await
            .map(drop)
    }

    pub async fn unpublish(&self, volume_id: &str, target_path: &str) -> Result<(), CsiError> {
        let mut c = self.client.clone();
        let r = proto::NodeUnpublishVolumeRequest {
            volume_id: volume_id.to_string(),
            target_path: target_path.to_string(),
        };
        with_deadline(self.timeout, c.node_unpublish_volume(r))
            .await
            .map(drop)
    }

    pub async fn stage(&self, req: &VolumeRequest, staging_path: &str) -> Result<(), CsiError> {
        let mut c = self.client.clone();
        let r = proto::NodeStageVolumeRequest {
            volume_id: req.volume_id.clone(),
            publish_context: req.publish_context.clone(),
            staging_target_path: staging_path.to_string(),
            volume_capability: Some(req.capability()),
            secrets: req.secrets.clone(),
            volume_context: req.volume_context.clone(),
        };
        with_deadline(self.timeout, c.node_stage_volume(r))
            .await
            .map(drop)
    }

    pub async fn unstage(&self, volume_id: &str, staging_path: &str) -> Result<(), CsiError> {
        let mut c = self.client.clone();
        let r = proto::NodeUnstageVolumeRequest {
            volume_id: volume_id.to_string(),
            staging_target_path: staging_path.to_string(),
        };
        with_deadline(self.timeout, c.node_unstage_volume(r))
            .await
            .map(drop)
    }
}
