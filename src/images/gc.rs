//! Image garbage collection, as upstream's `images/image_gc_manager.go`:
//! every 5 minutes the images are listed with the containers using them,
//! and when the image file system is at or above
//! `imageGCHighThresholdPercent` the unused ones go, least recently used
//! first, until it is back to `imageGCLowThresholdPercent`; images unused
//! for longer than `imageMaximumGCAge` go whatever the disk. Images seen
//! for less than `imageMinimumGCAge`, pinned ones and those any container
//! (running or not) was made from stay. The eviction manager asks for every
//! unused image at once under disk pressure (`delete_unused_images`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

use crate::cri::{CriError, ImageService, RuntimeService};

/// Upstream's ImageGCPeriod.
pub const GC_PERIOD: Duration = Duration::from_secs(5 * 60);

/// The `reason` label of `kubelet_image_garbage_collected_total`.
const REASON_AGE: &str = "age";
const REASON_SPACE: &str = "space";

/// Upstream's ImageGCPolicy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub high_threshold_percent: i32,
    pub low_threshold_percent: i32,
    pub min_age: Duration,
    /// Zero turns collection by age off.
    pub max_age: Duration,
}

impl Policy {
    /// Upstream stubs the collector when the high threshold is 100 and no
    /// maximum age is set (StartGarbageCollection); images are still
    /// watched, for the eviction manager's reclaim.
    pub fn collects(&self) -> bool {
        self.high_threshold_percent < 100 || !self.max_age.is_zero()
    }
}

/// The image file system's size and free bytes (upstream ImageFsStats).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsFigures {
    pub capacity: u64,
    pub available: u64,
}

/// Gets the image file system's figures; the error is the reason as text.
pub type FsSource = Box<dyn Fn() -> BoxFuture<'static, Result<FsFigures, String>> + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error("{}", .0.grpc_text())]
    Runtime(#[from] CriError),
    #[error("failed to get the image filesystem's stats: {0}")]
    Stats(String),
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    #[error("Failed to garbage collect required amount of images. Attempted to free {to_free} bytes, but only found {freed} bytes eligible to free.")]
    NotEnough { to_free: i64, freed: i64 },
    #[error("wanted to free {to_free} bytes, but freed {freed} bytes space with errors in image deletion: {errors}")]
    Deletion {
        to_free: i64,
        freed: i64,
        errors: String,
    },
    #[error("wanted to free images older than {max_age}, encountered errors in image deletion: {errors}")]
    OldImages { max_age: String, errors: String },
}

/// What is known of one image (upstream imageRecord).
#[derive(Clone, Debug)]
struct Record {
    first_detected: Instant,
    /// `None` until a container is seen using it (upstream's zero time,
    /// older than any other).
    last_used: Option<Instant>,
    size: u64,
    pinned: bool,
}

pub struct ImageGc {
    runtime: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    policy: Policy,
    fs: FsSource,
    node_name: String,
    /// By image ID.
    records: Mutex<HashMap<String, Record>>,
}

impl ImageGc {
    pub fn new(
        runtime: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        policy: Policy,
        fs: FsSource,
        node_name: String,
    ) -> Self {
        ImageGc {
            runtime,
            images,
            policy,
            fs,
            node_name,
            records: Mutex::default(),
        }
    }

    /// Every `GC_PERIOD`, starting now: a collection when the policy asks
    /// for one, else a look at the images (upstream's Start and
    /// StartGarbageCollection loops, which run at the same period).
    pub async fn run(self: Arc<Self>, token: CancellationToken) {
        let collects = self.policy.collects();
        if !collects {
            info!("ImageGCHighThresholdPercent is set 100 and ImageMaximumGCAge is 0, Disable image GC");
        }
        let began = Instant::now();
        let mut failed_before = false;
        loop {
            if collects {
                match self.garbage_collect(began).await {
                    Err(e) if failed_before => {
                        error!(error = %e, "Image garbage collection failed multiple times in a row");
                        crate::events::record(
                            crate::events::node_ref(&self.node_name),
                            crate::events::WARNING,
                            "ImageGCFailed",
                            e.to_string(),
                        );
                    }
                    Err(e) => {
                        error!(error = %e, "Image garbage collection failed once. Stats initialization may not have completed yet");
                        failed_before = true;
                    }
                    Ok(()) if failed_before => {
                        info!("Image garbage collection succeeded");
                        failed_before = false;
                    }
                    Ok(()) => debug!("Image garbage collection succeeded"),
                }
            } else if let Err(e) = self.detect_images(Instant::now()).await {
                info!(error = %e, "Failed to monitor images");
            }
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(GC_PERIOD) => {}
            }
        }
    }

    /// Records the images there are and which ones containers use; the IDs
    /// of those used.
    async fn detect_images(&self, detected: Instant) -> Result<HashSet<String>, GcError> {
        let images = self.images.list_images().await?;
        let containers = self.runtime.list_containers(None).await?;
        // Upstream's toKubeContainer: the image ID where the runtime gives
        // one (CRI 1.30), else the image reference. Upstream also counts
        // images mounted as image volumes, which rkubelet refuses.
        let in_use: HashSet<String> = containers
            .into_iter()
            .map(|c| {
                if c.image_id.is_empty() {
                    c.image_ref
                } else {
                    c.image_id
                }
            })
            .collect();
        let now = Instant::now();
        let mut records = self.records.lock();
        let current: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        records.retain(|id, _| current.contains(id.as_str()));
        for image in &images {
            let r = records.entry(image.id.clone()).or_insert(Record {
                first_detected: detected,
                last_used: None,
                size: 0,
                pinned: false,
            });
            if in_use.contains(&image.id) {
                r.last_used = Some(now);
            }
            r.size = image.size;
            r.pinned = image.pinned;
        }
        Ok(in_use)
    }

    /// The images that may go, least recently used first (ties: first
    /// detected first), leaving out used and pinned ones.
    async fn in_eviction_order(&self, at: Instant) -> Result<Vec<(String, Record)>, GcError> {
        let in_use = self.detect_images(at).await?;
        let mut out: Vec<(String, Record)> = self
            .records
            .lock()
            .iter()
            .filter(|(id, r)| !in_use.contains(*id) && !r.pinned)
            .map(|(id, r)| (id.clone(), r.clone()))
            .collect();
        out.sort_by(|(ia, a), (ib, b)| {
            (a.last_used, a.first_detected, ia).cmp(&(b.last_used, b.first_detected, ib))
        });
        Ok(out)
    }

    /// One collection (upstream GarbageCollect): by age, then by space.
    pub async fn garbage_collect(&self, began: Instant) -> Result<(), GcError> {
        let at = Instant::now();
        let images = self.in_eviction_order(at).await?;
        let images = self.free_old_images(images, at, began).await?;
        let fs = (self.fs)().await.map_err(GcError::Stats)?;
        let capacity = fs.capacity as i64;
        let mut available = fs.available as i64;
        if available > capacity {
            info!(available, capacity, "Availability is larger than capacity");
            available = capacity;
        }
        if capacity == 0 {
            let e = GcError::InvalidCapacity;
            self.node_event("InvalidDiskCapacity", e.to_string());
            return Err(e);
        }
        let usage = 100 - (available * 100 / capacity) as i32;
        let p = &self.policy;
        if usage >= p.high_threshold_percent {
            let to_free = capacity * i64::from(100 - p.low_threshold_percent) / 100 - available;
            info!(
                usage,
                high_threshold = p.high_threshold_percent,
                amount_to_free = to_free,
                low_threshold = p.low_threshold_percent,
                "Disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold"
            );
            let freed = self.free_space(to_free, at, &images).await?;
            if freed < to_free {
                let e = GcError::NotEnough { to_free, freed };
                self.node_event("FreeDiskSpaceFailed", e.to_string());
                return Err(e);
            }
        }
        Ok(())
    }

    /// Every unused image that is old enough (upstream DeleteUnusedImages,
    /// the eviction manager's reclaim).
    pub async fn delete_unused_images(&self) -> Result<(), GcError> {
        info!("Attempting to delete unused images");
        let at = Instant::now();
        let images = self.in_eviction_order(at).await?;
        self.free_space(i64::MAX, at, &images).await.map(|_| ())
    }

    /// Removes the images unused for longer than the maximum age, once the
    /// collector has run that long (so a restart does not take images
    /// whose use it has not seen yet); the others are returned.
    async fn free_old_images(
        &self,
        images: Vec<(String, Record)>,
        at: Instant,
        began: Instant,
    ) -> Result<Vec<(String, Record)>, GcError> {
        let max_age = self.policy.max_age;
        if max_age.is_zero() || at.duration_since(began) <= max_age {
            return Ok(images);
        }
        let mut errors = Vec::new();
        let mut left = Vec::new();
        for (id, r) in images {
            let unused_for = r.last_used.map(|u| at.duration_since(u));
            if unused_for.is_none_or(|d| d > max_age) {
                if let Err(e) = self.free_image(&id, &r, REASON_AGE).await {
                    errors.push(e.grpc_text());
                    left.push((id, r));
                }
                continue;
            }
            left.push((id, r));
        }
        if !errors.is_empty() {
            return Err(GcError::OldImages {
                max_age: crate::config::GoDuration(max_age).to_string(),
                errors: aggregate(&errors),
            });
        }
        Ok(left)
    }

    /// Removes images in order until `to_free` bytes are freed; the bytes
    /// freed.
    async fn free_space(
        &self,
        to_free: i64,
        at: Instant,
        images: &[(String, Record)],
    ) -> Result<i64, GcError> {
        let mut freed = 0i64;
        let mut errors = Vec::new();
        for (id, r) in images {
            // (Images in use, which upstream also skips here by their
            // last use, are not in `images`: `in_eviction_order` left them
            // out.) Perhaps just pulled, for a container about to start.
            if at.duration_since(r.first_detected) < self.policy.min_age {
                debug!(image = %id, "image younger than imageMinimumGCAge, kept");
                continue;
            }
            if let Err(e) = self.free_image(id, r, REASON_SPACE).await {
                errors.push(e.grpc_text());
                continue;
            }
            freed = freed.saturating_add(r.size as i64);
            if freed >= to_free {
                break;
            }
        }
        if !errors.is_empty() {
            return Err(GcError::Deletion {
                to_free,
                freed,
                errors: aggregate(&errors),
            });
        }
        Ok(freed)
    }

    async fn free_image(&self, id: &str, r: &Record, reason: &str) -> Result<(), CriError> {
        info!(image = %id, size = r.size, "Removing image to free bytes");
        self.images.remove_image(id).await?;
        self.records.lock().remove(id);
        crate::metrics::image_garbage_collected(reason);
        Ok(())
    }

    fn node_event(&self, reason: &str, message: String) {
        crate::events::record(
            crate::events::node_ref(&self.node_name),
            crate::events::WARNING,
            reason,
            message,
        );
    }
}

/// apimachinery's aggregate error text: one message alone, several
/// (duplicates dropped) in brackets.
fn aggregate(errors: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [one] => one.to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

#[cfg(test)]
mod tests;
