//! A CSI volume's figures from its driver (upstream `csi_metrics.go`
//! GetMetrics): NodeGetCapabilities, and with GET_VOLUME_STATS a
//! NodeGetVolumeStats for the published target. A driver without the
//! capability gives no figures (upstream's NotSupported error, which the
//! stats calculator skips without a log).

use std::time::Duration;

use tracing::debug;

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
}

/// The volume's figures, None when the driver does not offer them.
/// `timeout` bounds each call (the stats task measures every pod in turn,
/// so a hung driver must not hold the others back for upstream's 2 min
/// csiTimeout).
pub async fn volume_stats(
    registry: &Registry,
    p: &Published,
    timeout: Duration,
) -> Result<Option<VolumeStats>, MetricsError> {
    let d = registry
        .get(&p.driver)
        .ok_or_else(|| MetricsError::NotRegistered(p.driver.clone()))?;
    let service = NodeService::new(&d.endpoint, timeout);
    let caps = service
        .capabilities()
        .await
        .map_err(MetricsError::Capabilities)?;
    if !caps.volume_stats() {
        return Ok(None);
    }
    let s = service
        .volume_stats(&p.volume_id, &p.target.to_string_lossy())
        .await
        .map_err(MetricsError::Stats)?;
    // The volume condition is upstream's CSIVolumeHealth (alpha, off by
    // default): with the gate off it is not acted on.
    if let Some((true, msg)) = &s.condition {
        debug!(driver = %p.driver, volume_id = %p.volume_id, message = %msg, "CSI driver reports the volume abnormal");
    }
    Ok(Some(s))
}
