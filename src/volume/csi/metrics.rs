//! A CSI volume's figures from its driver (upstream `csi_metrics.go`
//! GetMetrics): NodeGetCapabilities, and with GET_VOLUME_STATS a
//! NodeGetVolumeStats for the published target, or for a raw block volume
//! the pod's bind under the global map path. A driver without the
//! capability gives no figures (upstream's NotSupported error, which the
//! stats calculator skips without a log).

use std::time::Duration;

use super::client::{NodeService, VolumeStats};
use super::mounter::Published;
use super::{log_msg, Registry};

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("{}", log_msg(Registry::not_found(.0)))]
    NotRegistered(String),
    #[error("NodeGetCapabilities: {0}")]
    Capabilities(super::client::CsiError),
    #[error("NodeGetVolumeStats: {0}")]
    Stats(super::client::CsiError),
    #[error("{0} is not a CSI block publish path")]
    BlockPath(String),
}

/// The volume's figures, None when the driver does not offer them.
/// `timeout` bounds each call (the stats task measures every pod in turn,
/// so a hung driver must not hold the others back for upstream's 2 min
/// csiTimeout). `health` is the CSIVolumeHealth gate (alpha, off by
/// default): with it on and a driver with VOLUME_CONDITION, the answer's
/// condition is the volume's health (an answer without one reads as
/// normal, as protobuf's getters give upstream); otherwise `condition` is
/// None (csi_client.go NodeGetVolumeStats).
pub async fn volume_stats(
    registry: &Registry,
    p: &Published,
    timeout: Duration,
    health: bool,
) -> Result<Option<VolumeStats>, MetricsError> {
    let d = registry
        .get(&p.driver)
        .ok_or_else(|| MetricsError::NotRegistered(p.driver.clone()))?;
    let path = if p.block {
        super::block::stats_path(p)
            .ok_or_else(|| MetricsError::BlockPath(p.target.display().to_string()))?
    } else {
        p.target.clone()
    };
    let service = NodeService::new(&d.endpoint, timeout);
    let caps = service
        .capabilities()
        .await
        .map_err(MetricsError::Capabilities)?;
    if !caps.volume_stats() {
        return Ok(None);
    }
    let mut s = service
        .volume_stats(&p.volume_id, &path.to_string_lossy())
        .await
        .map_err(MetricsError::Stats)?;
    s.condition = if health && caps.volume_condition() {
        Some(s.condition.take().unwrap_or_default())
    } else {
        None
    };
    Ok(Some(s))
}
