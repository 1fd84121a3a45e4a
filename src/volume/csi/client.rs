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
    /// An answer that breaks the protocol's rules.
    #[error("{0}")]
    Invalid(String),
}

impl CsiError {
    /// Whether the driver may still be working on it (upstream
    /// `isFinalError` is false for these codes): the target directory is
    /// then left for the next attempt.
    pub fn is_final(&self) -> bool {
        use tonic::Code::*;
        match self {
            CsiError::Timeout => false,
            CsiError::Invalid(_) => true,
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

/// What NodeGetCapabilities listed (RPC types).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities(Vec<i32>);

impl Capabilities {
    fn has(&self, t: proto::node_service_capability::rpc::Type) -> bool {
        self.0.contains(&(t as i32))
    }
    pub fn stage_unstage(&self) -> bool {
        self.has(proto::node_service_capability::rpc::Type::StageUnstageVolume)
    }
    pub fn volume_stats(&self) -> bool {
        self.has(proto::node_service_capability::rpc::Type::GetVolumeStats)
    }
    pub fn volume_mount_group(&self) -> bool {
        self.has(proto::node_service_capability::rpc::Type::VolumeMountGroup)
    }
    pub fn expand_volume(&self) -> bool {
        self.has(proto::node_service_capability::rpc::Type::ExpandVolume)
    }
    pub fn volume_condition(&self) -> bool {
        self.has(proto::node_service_capability::rpc::Type::VolumeCondition)
    }
}

/// NodeGetVolumeStats' answer, by unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeStats {
    pub capacity: u64,
    pub available: u64,
    pub used: u64,
    pub inodes: u64,
    pub inodes_free: u64,
    pub inodes_used: u64,
    /// The driver's volume condition (abnormal, message), when it sent one.
    pub condition: Option<(bool, String)>,
}

/// One driver's node service.
#[derive(Clone)]
pub struct NodeService {
    client: NodeClient<Channel>,
    timeout: Duration,
    /// Names the driver in `csi_operations_seconds`.
    endpoint: String,
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
    /// The pod's fsGroup, for a driver with VOLUME_MOUNT_GROUP (upstream
    /// hands the group to the driver instead of changing ownership).
    pub volume_mount_group: Option<i64>,
    /// A raw block volume (`volumeMode: Block`): a Block access type
    /// instead of a mount (upstream's fsType "block", csi_client.go).
    pub block: bool,
}

impl VolumeRequest {
    /// A mounted file system, or a raw block device for a block volume
    /// (upstream's csi_client.go: fsType "block" selects the Block access
    /// type, with neither fsType nor mount flags), with upstream's access
    /// mode mapping (`asCSIAccessModeV1`, without the
    /// SINGLE_NODE_MULTI_WRITER capability).
    fn capability(&self) -> proto::VolumeCapability {
        use proto::volume_capability::{
            access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume,
        };
        let mode = match self.access_mode.as_str() {
            "ReadOnlyMany" => Mode::MultiNodeReaderOnly,
            "ReadWriteMany" => Mode::MultiNodeMultiWriter,
            _ => Mode::SingleNodeWriter,
        };
        let access_type = if self.block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume {
                fs_type: self.fs_type.clone(),
                mount_flags: self.mount_flags.clone(),
                volume_mount_group: self
                    .volume_mount_group
                    .map(|g| g.to_string())
                    .unwrap_or_default(),
            })
        };
        proto::VolumeCapability {
            access_type: Some(access_type),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }
}

impl NodeService {
    pub fn new(endpoint: &str, timeout: Duration) -> Self {
        NodeService {
            client: NodeClient::new(unix_channel(endpoint)),
            timeout,
            endpoint: endpoint.to_string(),
        }
    }

    /// One call with the deadline, timed as upstream's
    /// RecordMetricsInterceptor (`csi_operations_seconds`).
    async fn timed<T>(
        &self,
        method: &'static str,
        fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CsiError> {
        let started = tokio::time::Instant::now();
        let r = with_deadline(self.timeout, fut).await;
        let code = match &r {
            Ok(_) => tonic::Code::Ok,
            Err(CsiError::Status { code, .. }) => *code,
            Err(_) => tonic::Code::DeadlineExceeded,
        };
        crate::metrics::certvol::csi_operation(&self.endpoint, method, code, started.elapsed());
        r
    }

    pub async fn get_info(&self) -> Result<proto::NodeGetInfoResponse, CsiError> {
        let mut c = self.client.clone();
        self.timed(
            "/csi.v1.Node/NodeGetInfo",
            c.node_get_info(proto::NodeGetInfoRequest {}),
        )
        .await
    }

    /// The node service's RPC capabilities (NodeGetCapabilities).
    pub async fn capabilities(&self) -> Result<Capabilities, CsiError> {
        use proto::node_service_capability::Type as Cap;
        let mut c = self.client.clone();
        let caps = self
            .timed(
                "/csi.v1.Node/NodeGetCapabilities",
                c.node_get_capabilities(proto::NodeGetCapabilitiesRequest {}),
            )
            .await?;
        Ok(Capabilities(
            caps.capabilities
                .iter()
                .filter_map(|cap| cap.r#type.as_ref().map(|Cap::Rpc(r)| r.r#type))
                .collect(),
        ))
    }

    /// Whether the driver stages volumes (the STAGE_UNSTAGE_VOLUME node
    /// capability).
    pub async fn supports_stage_unstage(&self) -> Result<bool, CsiError> {
        Ok(self.capabilities().await?.stage_unstage())
    }

    /// NodeGetVolumeStats for a published volume (upstream's
    /// `NodeGetVolumeStats`: bytes and inodes from the usage entries by
    /// unit, zero for a unit the driver did not report; unknown units are
    /// skipped; no usage at all is an error).
    pub async fn volume_stats(
        &self,
        volume_id: &str,
        target_path: &str,
    ) -> Result<VolumeStats, CsiError> {
        use proto::volume_usage::Unit;
        let mut c = self.client.clone();
        let r = proto::NodeGetVolumeStatsRequest {
            volume_id: volume_id.to_string(),
            volume_path: target_path.to_string(),
            staging_target_path: String::new(),
        };
        let resp = self
            .timed(
                "/csi.v1.Node/NodeGetVolumeStats",
                c.node_get_volume_stats(r),
            )
            .await?;
        if resp.usage.is_empty() {
            // Upstream's check (an empty list decodes as nil in Go).
            return Err(CsiError::Invalid(
                "failed to get usage from response. usage is nil".into(),
            ));
        }
        let mut s = VolumeStats::default();
        for u in &resp.usage {
            // Negative figures from a broken driver count as zero.
            let (a, t, used) = (
                u.available.max(0) as u64,
                u.total.max(0) as u64,
                u.used.max(0) as u64,
            );
            match Unit::try_from(u.unit) {
                Ok(Unit::Bytes) => (s.available, s.capacity, s.used) = (a, t, used),
                Ok(Unit::Inodes) => (s.inodes_free, s.inodes, s.inodes_used) = (a, t, used),
                _ => {
                    tracing::warn!(volume_id = %volume_id, unit = u.unit, "unknown unit in NodeGetVolumeStats usage")
                }
            }
        }
        s.condition = resp.volume_condition.map(|c| (c.abnormal, c.message));
        Ok(s)
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
        self.timed("/csi.v1.Node/NodePublishVolume", c.node_publish_volume(r))
            .await
            .map(drop)
    }

    pub async fn unpublish(&self, volume_id: &str, target_path: &str) -> Result<(), CsiError> {
        let mut c = self.client.clone();
        let r = proto::NodeUnpublishVolumeRequest {
            volume_id: volume_id.to_string(),
            target_path: target_path.to_string(),
        };
        self.timed(
            "/csi.v1.Node/NodeUnpublishVolume",
            c.node_unpublish_volume(r),
        )
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
        self.timed("/csi.v1.Node/NodeStageVolume", c.node_stage_volume(r))
            .await
            .map(drop)
    }

    /// NodeExpandVolume of a published volume to `required_bytes`
    /// (upstream's csi_expander: the published path, the staging path of
    /// a driver that stages, a mount capability with the PV's fsType and
    /// mount options, always ReadWriteOnce).
    pub async fn expand(
        &self,
        req: &VolumeRequest,
        volume_path: &str,
        staging_path: &str,
        required_bytes: i64,
    ) -> Result<i64, CsiError> {
        let mut c = self.client.clone();
        let mut rwo = req.clone();
        rwo.access_mode = "ReadWriteOnce".into();
        let r = proto::NodeExpandVolumeRequest {
            volume_id: req.volume_id.clone(),
            volume_path: volume_path.to_string(),
            capacity_range: Some(proto::CapacityRange {
                required_bytes,
                limit_bytes: 0,
            }),
            staging_target_path: staging_path.to_string(),
            volume_capability: Some(rwo.capability()),
            secrets: req.secrets.clone(),
        };
        self.timed("/csi.v1.Node/NodeExpandVolume", c.node_expand_volume(r))
            .await
            .map(|r| r.capacity_bytes)
    }

    pub async fn unstage(&self, volume_id: &str, staging_path: &str) -> Result<(), CsiError> {
        let mut c = self.client.clone();
        let r = proto::NodeUnstageVolumeRequest {
            volume_id: volume_id.to_string(),
            staging_target_path: staging_path.to_string(),
        };
        self.timed("/csi.v1.Node/NodeUnstageVolume", c.node_unstage_volume(r))
            .await
            .map(drop)
    }
}
