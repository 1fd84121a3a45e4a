//! Image manager: pull policies, pull backoff and pull serialization
//! (upstream `pkg/kubelet/images/image_manager.go`, `puller.go`); image
//! garbage collection in `gc.rs`.

pub mod credentialprovider;
pub mod gc;
pub mod keyring;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use parking_lot::Mutex;
use tokio::sync::Semaphore;

use crate::cri::{ImageService, PodSandboxConfig};
use crate::kuberuntime::backoff::Backoff;

/// Why a container's image is not ready, with upstream's waiting reasons.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct ImageError {
    pub reason: &'static str,
    pub message: String,
    /// When a retry may succeed; `None` for errors only a spec change fixes.
    pub retry_after: Option<Duration>,
}

/// The user an image runs as, from its config (upstream getImageUser).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageUser {
    Uid(i64),
    /// A non-numeric user name that cannot be checked before running.
    Name(String),
}

impl ImageUser {
    fn of(img: &crate::cri::Image) -> Self {
        match (&img.uid, img.username.as_str()) {
            (Some(uid), _) => ImageUser::Uid(uid.value),
            (None, name) if !name.is_empty() => ImageUser::Name(name.to_string()),
            // No user in the image config means root.
            (None, _) => ImageUser::Uid(0),
        }
    }
}

/// An image ready to create containers from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyImage {
    /// The reference to create the container with (the image ID).
    pub id: String,
    pub user: ImageUser,
}

pub struct ImageManager {
    svc: Arc<dyn ImageService>,
    backoff: Mutex<Backoff>,
    /// One permit when pulls are serialized, else maxParallelImagePulls or
    /// DEFAULT_PARALLEL_PULLS.
    pulls: Semaphore,
    /// The longest one pull may hold a slot.
    pull_deadline: Duration,
    /// Pulls waiting or running, by `<uid>_<image>`, since when.
    in_flight: Arc<Mutex<HashMap<String, std::time::Instant>>>,
    /// Node-wide logins, tried after the pod's pull secrets.
    node_credentials: Option<keyring::NodeCredentials>,
    /// Credential provider plugins, tried after the node's docker config.
    credential_providers: Option<Arc<credentialprovider::CredentialProviders>>,
    pull_qps: Option<crate::apiclient::RateLimiter>,
}

/// Marks a pull in flight for as long as it lives.
struct InFlight {
    map: Arc<Mutex<HashMap<String, std::time::Instant>>>,
    key: String,
}

impl InFlight {
    fn new(map: &Arc<Mutex<HashMap<String, std::time::Instant>>>, key: String) -> Self {
        map.lock().insert(key.clone(), std::time::Instant::now());
        InFlight {
            map: map.clone(),
            key,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.map.lock().remove(&self.key);
    }
}

/// Parallel pulls when neither serializeImagePulls nor maxParallelImagePulls
/// is set: a small bound, so one slow image never blocks other pods and a
/// burst of pods does not saturate the node's link and disk.
pub const DEFAULT_PARALLEL_PULLS: usize = 3;

/// How long one pull may take before it fails with ErrImagePull and backs
/// off. CRI reports no pull progress, so this is a whole-pull deadline:
/// generous (containerd cancels a pull that makes no progress for 5 min on
/// its own), but it bounds a runtime that never answers, which would
/// otherwise hold a pull slot forever.
pub const DEFAULT_PULL_DEADLINE: Duration = Duration::from_secs(15 * 60);

/// The container's pull policy, or upstream's default for pods that arrive
/// without one (the same rule the file source applies when defaulting).
pub fn pull_policy(c: &Container) -> &str {
    if let Some(p) = c.image_pull_policy.as_deref().filter(|p| !p.is_empty()) {
        return p;
    }
    crate::source::static_pod::default_pull_policy(c.image.as_deref().unwrap_or_default())
}

/// The fully qualified form a runtime reports: `busybox` becomes
/// `docker.io/library/busybox:latest` (upstream's docker reference
/// normalisation, as containerd applies it).
pub fn normalize_image(image: &str) -> String {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let (repo, tag) = match name.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r, Some(t)),
        _ => (name, None),
    };
    let first = repo.split('/').next().unwrap_or_default();
    let has_domain =
        repo.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut out = if has_domain {
        repo.to_string()
    } else if repo.contains('/') {
        format!("docker.io/{repo}")
    } else {
        format!("docker.io/library/{repo}")
    };
    match (tag, digest) {
        (Some(t), _) => {
            out.push(':');
            out.push_str(t);
        }
        (None, None) => out.push_str(":latest"),
        (None, Some(_)) => {}
    }
    if let Some(d) = digest {
        out.push('@');
        out.push_str(d);
    }
    out
}

/// A light form of upstream's reference parsing: enough to turn obvious
/// garbage into InvalidImageName instead of a pull error.
fn valid_image_name(image: &str) -> bool {
    let name = image.split(['@']).next().unwrap_or_default();
    let repo = match name.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') => r,
        _ => name,
    };
    !repo.is_empty()
        && !image.chars().any(|c| c.is_whitespace())
        && repo
            .split('/')
            .skip(usize::from(repo.contains('/')))
            .all(|p| {
                !p.is_empty()
                    && p.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
            })
}

impl ImageManager {
    pub fn new(svc: Arc<dyn ImageService>, serialize: bool, max_parallel: Option<usize>) -> Self {
        let permits = if serialize {
            1
        } else {
            max_parallel.unwrap_or(DEFAULT_PARALLEL_PULLS).max(1)
        };
        ImageManager {
            svc,
            backoff: Mutex::new(Backoff::container()),
            pulls: Semaphore::new(permits),
            pull_deadline: DEFAULT_PULL_DEADLINE,
            in_flight: Default::default(),
            node_credentials: None,
            credential_providers: None,
            pull_qps: None,
        }
    }

    /// Upstream's throttleImagePulling: with `qps` > 0, a pull that finds
    /// the bucket (`burst` tokens) empty fails at once with "pull QPS
    /// exceeded" and backs off, rather than queueing; `qps` 0 throttles
    /// nothing (registryPullQPS, registryBurst).
    pub fn with_pull_qps(mut self, qps: i32, burst: i32) -> Self {
        self.pull_qps = (qps > 0)
            .then(|| crate::apiclient::RateLimiter::exact(qps as f64, burst.max(0) as u32));
        self
    }

    /// Also log in with the node's docker config files.
    pub fn with_node_credentials(mut self, c: keyring::NodeCredentials) -> Self {
        self.node_credentials = Some(c);
        self
    }

    /// Also log in with what credential provider plugins give.
    pub fn with_credential_providers(
        mut self,
        p: Option<Arc<credentialprovider::CredentialProviders>>,
    ) -> Self {
        self.credential_providers = p;
        self
    }

    pub fn with_pull_deadline(mut self, d: Duration) -> Self {
        self.pull_deadline = d;
        self
    }

    /// Drops pull-backoff entries past their reset window (upstream
    /// backOff.GC() in housekeeping), so churn does not grow the map.
    pub fn gc_backoff(&self, now: Duration) {
        self.backoff.lock().gc(now);
    }

    /// Pull backoff entries of a pod: (image, window, since the failure).
    pub fn pod_backoff(&self, uid: &str, now: Duration) -> Vec<(String, Duration, Duration)> {
        let prefix = format!("{uid}_");
        self.backoff
            .lock()
            .entries_with_prefix(&prefix, now)
            .into_iter()
            .map(|(k, w, since)| (k[prefix.len()..].to_string(), w, since))
            .collect()
    }

    /// The pod's pulls waiting for a slot or in flight: (image, for how long).
    pub fn pod_pulls(&self, uid: &str) -> Vec<(String, Duration)> {
        let prefix = format!("{uid}_");
        let mut v: Vec<_> = self
            .in_flight
            .lock()
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(k, t)| (k[prefix.len()..].to_string(), t.elapsed()))
            .collect();
        v.sort();
        v
    }

    /// The logins to try for an image, in upstream's union keyring order:
    /// the pod's pull secrets, the node's docker config, then credential
    /// provider plugins. A malformed pull secret fails the pull, as
    /// upstream's MakeDockerKeyring does.
    async fn credentials(
        &self,
        image: &str,
        pod: &Pod,
        pull_secrets: &[Arc<Secret>],
    ) -> Result<Vec<keyring::Credential>, String> {
        let ring = keyring::Keyring::from_secrets(pull_secrets).map_err(|e| e.to_string())?;
        let repo = keyring::repo_to_pull(image);
        let mut creds = ring.lookup(&repo);
        if let Some(node) = &self.node_credentials {
            creds.extend(node.keyring().await.lookup(&repo));
        }
        if let Some(plugins) = &self.credential_providers {
            // The pod's identity: plugins in service-account-token mode
            // get a token bound to it.
            let pod = credentialprovider::PodRef::of(pod);
            creds.extend(plugins.lookup(&repo, &pod).await);
        }
        Ok(creds)
    }

    /// One pull as upstream's PullImage: anonymous when there are no
    /// credentials for the image's registry, else each in turn until one
    /// works (no anonymous attempt after them); the errors of all attempts
    /// when none does.
    async fn pull(
        &self,
        image: &str,
        creds: &[keyring::Credential],
        sandbox: &PodSandboxConfig,
    ) -> Result<String, String> {
        if creds.is_empty() {
            return self
                .svc
                .pull_image(image, None, Some(sandbox.clone()))
                .await
                .map_err(|e| e.to_string());
        }
        let mut errs = Vec::new();
        for cred in creds {
            match self
                .svc
                .pull_image(image, Some(cred.auth_config()), Some(sandbox.clone()))
                .await
            {
                Ok(r) => return Ok(r),
                Err(e) => errs.push(e.to_string()),
            }
        }
        // Upstream's error aggregate: one error as is, several bracketed.
        Err(if errs.len() == 1 {
            errs.remove(0)
        } else {
            format!("[{}]", errs.join(", "))
        })
    }

    pub fn backoff_entries(&self) -> usize {
        self.backoff.lock().len()
    }

    /// Makes sure the container's image is present; returns the image
    /// reference to create the container from. `pull_secrets` are the pod's
    /// imagePullSecrets as fetched (missing ones already left out).
    pub async fn ensure_image(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox: &PodSandboxConfig,
        pull_secrets: &[Arc<Secret>],
        now: Duration,
    ) -> Result<ReadyImage, ImageError> {
        let image = c.image.as_deref().unwrap_or_default();
        if !valid_image_name(image) {
            return Err(ImageError {
                reason: "InvalidImageName",
                message: format!(
                    "Failed to apply default image tag {image:?}: couldn't parse image name"
                ),
                retry_after: None,
            });
        }
        let policy = pull_policy(c);
        let present = match self.svc.image_status(image).await {
            Ok(found) => found,
            Err(e) => {
                return Err(ImageError {
                    reason: "ErrImageInspect",
                    message: format!("Failed to inspect image {image:?}: {e}"),
                    retry_after: Some(Duration::from_secs(1)),
                })
            }
        };
        let ev = Some((c.name.as_str(), crate::kuberuntime::is_init(pod, &c.name)));
        if let Some(img) = &present {
            if policy != "Always" {
                crate::events::pod(
                    pod,
                    ev,
                    crate::events::NORMAL,
                    "Pulled",
                    format!("Container image {image:?} already present on machine"),
                );
                return Ok(ReadyImage {
                    id: img.id.clone(),
                    user: ImageUser::of(img),
                });
            }
        } else if policy == "Never" {
            crate::events::pod(
                pod,
                ev,
                crate::events::WARNING,
                "ErrImageNeverPull",
                format!("Container image {image:?} is not present with pull policy of Never"),
            );
            return Err(ImageError {
                reason: "ErrImageNeverPull",
                message: format!(
                    "Container image {image:?} is not present with pull policy of Never"
                ),
                retry_after: None,
            });
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let key = format!("{uid}_{image}");
        let left = self.backoff.lock().remaining_since_update(&key, now);
        if let Some(left) = left {
            crate::events::pod(
                pod,
                ev,
                crate::events::NORMAL,
                "BackOff",
                format!("Back-off pulling image {image:?}"),
            );
            return Err(ImageError {
                reason: "ImagePullBackOff",
                message: format!("Back-off pulling image {image:?}"),
                retry_after: Some(left),
            });
        }
        // Dropping this future (a kill cancels the pod's sync) releases the
        // slot and cancels the CRI call: nothing here is spawned.
        let queued = tokio::time::Instant::now();
        crate::metrics::startup::image_started_pulling(uid);
        // Shown by /debug/pods while it waits or pulls; removed when this
        // future ends, cancelled or not.
        let _shown = InFlight::new(&self.in_flight, key.clone());
        // Before taking a pull slot, as upstream looks credentials up
        // before its puller: a slow plugin (up to its 1-minute timeout)
        // must not hold a slot other pods' pulls wait for.
        let creds = self.credentials(image, pod, pull_secrets).await;
        let _permit = self.pulls.acquire().await.expect("semaphore never closed");
        tracing::info!(
            image,
            pod = pod.metadata.name.as_deref().unwrap_or_default(),
            "pulling image"
        );
        crate::events::pod(
            pod,
            ev,
            crate::events::NORMAL,
            "Pulling",
            format!("Pulling image {image:?}"),
        );
        let started = tokio::time::Instant::now();
        let pulled = match creds {
            // Upstream's throttle sits in the image service's PullImage,
            // after the credentials were looked up.
            Ok(_) if self.pull_qps.as_ref().is_some_and(|l| !l.try_accept()) => {
                Err("pull QPS exceeded".to_string())
            }
            Ok(creds) => {
                tokio::time::timeout(self.pull_deadline, self.pull(image, &creds, sandbox))
                    .await
                    .unwrap_or_else(|_| {
                        Err(crate::cri::CriError::Status {
                            op: "PullImage",
                            code: tonic::Code::DeadlineExceeded,
                            message: format!(
                                "pull did not finish within {}",
                                crate::config::duration::format_go_duration(self.pull_deadline)
                            ),
                        }
                        .to_string())
                    })
            }
            Err(e) => Err(e),
        };
        match pulled {
            Ok(image_ref) => {
                self.backoff.lock().reset(&key);
                let took = crate::config::duration::format_go_duration(started.elapsed());
                let total = crate::config::duration::format_go_duration(queued.elapsed());
                crate::events::pod(
                    pod,
                    ev,
                    crate::events::NORMAL,
                    "Pulled",
                    format!(
                        "Successfully pulled image {image:?} in {took} ({total} including waiting)"
                    ),
                );
                // The pulled image's config says which user it runs as.
                let (user, size) = match self.svc.image_status(&image_ref).await {
                    Ok(Some(img)) => (ImageUser::of(&img), img.size),
                    _ => (ImageUser::Uid(0), 0),
                };
                crate::metrics::image_pulled(size, queued.elapsed());
                crate::metrics::startup::image_finished_pulling(uid);
                Ok(ReadyImage {
                    id: image_ref,
                    user,
                })
            }
            Err(e) => {
                crate::events::pod(
                    pod,
                    ev,
                    crate::events::WARNING,
                    "Failed",
                    format!("Failed to pull image {image:?}: {e}"),
                );
                let mut b = self.backoff.lock();
                b.next(&key, now, now);
                Err(ImageError {
                    reason: "ErrImagePull",
                    message: format!("failed to pull image {image:?}: {e}"),
                    retry_after: b.current(&key),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::fake::FakeRuntime;

    fn ctr(image: &str, policy: Option<&str>) -> Container {
        Container {
            name: "a".into(),
            image: Some(image.into()),
            image_pull_policy: policy.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn default_pull_policy_follows_the_tag() {
        assert_eq!(pull_policy(&ctr("busybox", None)), "Always");
        assert_eq!(pull_policy(&ctr("busybox:latest", None)), "Always");
        assert_eq!(pull_policy(&ctr("busybox:1.36", None)), "IfNotPresent");
        assert_eq!(pull_policy(&ctr("localhost:5000/busybox", None)), "Always");
        assert_eq!(
            pull_policy(&ctr("busybox@sha256:abc", None)),
            "IfNotPresent"
        );
    }

    #[test]
    fn image_names_normalise_like_docker_references() {
        assert_eq!(
            normalize_image("busybox"),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(
            normalize_image("busybox:1.36"),
            "docker.io/library/busybox:1.36"
        );
        assert_eq!(normalize_image("team/app"), "docker.io/team/app:latest");
        assert_eq!(
            normalize_image("registry.k8s.io/pause:3.10"),
            "registry.k8s.io/pause:3.10"
        );
        assert_eq!(
            normalize_image("localhost:5000/a"),
            "localhost:5000/a:latest"
        );
        assert_eq!(
            normalize_image("busybox@sha256:ab"),
            "docker.io/library/busybox@sha256:ab"
        );
    }

    #[test]
    fn image_names_are_checked() {
        assert!(valid_image_name("docker.io/library/busybox:1.36"));
        assert!(valid_image_name("localhost:5000/a/b"));
        assert!(!valid_image_name("Busy Box"));
        assert!(!valid_image_name(""));
    }

    #[tokio::test]
    async fn never_policy_reports_err_image_never_pull_and_pull_failures_back_off() {
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let m = ImageManager::new(fake.clone(), true, None);
        let pod = Pod::default();
        let sb = PodSandboxConfig::default();
        let now = Duration::from_secs(1000);
        assert!(m
            .ensure_image(&pod, &ctr("busybox:1.36", Some("Never")), &sb, &[], now)
            .await
            .is_ok());
        let e = m
            .ensure_image(&pod, &ctr("other:1", Some("Never")), &sb, &[], now)
            .await
            .unwrap_err();
        assert_eq!(e.reason, "ErrImageNeverPull");
        let e = m
            .ensure_image(&pod, &ctr("missing:1", None), &sb, &[], now)
            .await
            .unwrap_err();
        assert_eq!(e.reason, "ErrImagePull");
        let e = m
            .ensure_image(
                &pod,
                &ctr("missing:1", None),
                &sb,
                &[],
                now + Duration::from_secs(1),
            )
            .await
            .unwrap_err();
        assert_eq!(e.reason, "ImagePullBackOff");
        assert!(!fake.calls().contains(&"PullImage busybox:1.36".to_string()));
    }

    fn pulls(fake: &FakeRuntime, image: &str) -> usize {
        let call = format!("PullImage {image}");
        fake.calls().iter().filter(|c| **c == call).count()
    }

    #[tokio::test(start_paused = true)]
    async fn pulls_past_the_registry_qps_fail_at_once_and_back_off() {
        // Old code accepted registryPullQPS/registryBurst and throttled nothing.
        let fake = Arc::new(FakeRuntime::new());
        let m = ImageManager::new(fake.clone(), false, None).with_pull_qps(1, 2);
        let (pod, sb) = (Pod::default(), PodSandboxConfig::default());
        let now = Duration::from_secs(1000);
        for image in ["a:1", "b:1"] {
            m.ensure_image(&pod, &ctr(image, None), &sb, &[], now)
                .await
                .expect("within the burst");
        }
        let e = m
            .ensure_image(&pod, &ctr("c:1", None), &sb, &[], now)
            .await
            .unwrap_err();
        assert_eq!(e.reason, "ErrImagePull");
        assert!(e.message.ends_with("pull QPS exceeded"), "{}", e.message);
        assert_eq!(e.retry_after, Some(Duration::from_secs(10)));
        assert_eq!(pulls(&fake, "c:1"), 0, "the runtime is not asked");
        // A token a second: the next image pulls after one.
        tokio::time::advance(Duration::from_secs(1)).await;
        m.ensure_image(&pod, &ctr("d:1", None), &sb, &[], now)
            .await
            .expect("refilled");
        // Zero QPS throttles nothing (upstream: no limiter at all).
        let m = ImageManager::new(fake.clone(), false, None).with_pull_qps(0, 0);
        for i in 0..20 {
            m.ensure_image(&pod, &ctr(&format!("e{i}:1"), None), &sb, &[], now)
                .await
                .expect("unthrottled");
        }
    }

    #[tokio::test]
    async fn pull_backoff_expires_after_its_window() {
        // Old code measured the window from `now`, so the image stayed in
        // back-off for the whole 10-minute reset window.
        let fake = Arc::new(FakeRuntime::new());
        let m = ImageManager::new(fake.clone(), false, None);
        let (pod, sb) = (Pod::default(), PodSandboxConfig::default());
        let c = ctr("missing:1", None);
        let t0 = Duration::from_secs(1000);
        let e = m.ensure_image(&pod, &c, &sb, &[], t0).await.unwrap_err();
        assert_eq!(
            (e.reason, e.retry_after),
            ("ErrImagePull", Some(Duration::from_secs(10)))
        );
        let e = m
            .ensure_image(&pod, &c, &sb, &[], t0 + Duration::from_secs(9))
            .await
            .unwrap_err();
        assert_eq!(e.reason, "ImagePullBackOff");
        assert_eq!(e.retry_after, Some(Duration::from_secs(1)));
        assert_eq!(pulls(&fake, "missing:1"), 1);
        // Past the first window: a second attempt, and the window doubles.
        let t1 = t0 + Duration::from_secs(11);
        let e = m.ensure_image(&pod, &c, &sb, &[], t1).await.unwrap_err();
        assert_eq!(e.reason, "ErrImagePull");
        assert_eq!(pulls(&fake, "missing:1"), 2);
        assert_eq!(e.retry_after, Some(Duration::from_secs(20)));
        // GC forgets it once quiet for twice the max (10 min).
        assert_eq!(m.backoff_entries(), 1);
        m.gc_backoff(t1 + Duration::from_secs(601));
        assert_eq!(m.backoff_entries(), 0);
    }

    #[tokio::test]
    async fn a_dropped_pull_frees_its_slot_and_a_hung_pull_times_out() {
        let fake = Arc::new(FakeRuntime::new());
        let m = Arc::new(
            ImageManager::new(fake.clone(), true, None).with_pull_deadline(Duration::from_secs(60)),
        );
        let (pod, sb) = (Pod::default(), PodSandboxConfig::default());
        let now = Duration::from_secs(1000);
        // A pull that never finishes holds the only slot...
        let m2 = m.clone();
        let (p2, s2) = (pod.clone(), sb.clone());
        let hung = tokio::spawn(async move {
            let c = ctr("registry.example/hang:1", None);
            m2.ensure_image(&p2, &c, &s2, &[], now).await
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while pulls(&fake, "registry.example/hang:1") == 0 {
            assert!(tokio::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // ...until the sync that waits on it is cancelled.
        hung.abort();
        let _ = hung.await;
        let ok = tokio::time::timeout(
            Duration::from_secs(10),
            m.ensure_image(&pod, &ctr("other:1", None), &sb, &[], now),
        )
        .await
        .expect("the slot was released");
        assert!(ok.is_ok());
        // A pull that hangs past the deadline fails and backs off.
        tokio::time::pause();
        let e = m
            .ensure_image(&pod, &ctr("registry.example/hang:2", None), &sb, &[], now)
            .await
            .unwrap_err();
        assert_eq!(e.reason, "ErrImagePull");
        assert!(
            e.message.contains("did not finish within 1m0s"),
            "{}",
            e.message
        );
    }

    #[tokio::test]
    async fn the_nodes_docker_config_logs_in_after_the_pods_secrets() {
        use keyring::{test_pull_secret, NodeCredentials};
        let dir = std::env::temp_dir().join(format!("rkubelet-nodecreds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bad")).unwrap();
        std::fs::create_dir_all(dir.join("good")).unwrap();
        std::fs::create_dir_all(dir.join("legacy")).unwrap();
        // Search order: a missing file, an unparsable one, then the first
        // that parses; the legacy file is never reached.
        std::fs::write(dir.join("bad/config.json"), "{not json").unwrap();
        std::fs::write(
            dir.join("good/config.json"),
            r#"{"auths": {"https://reg.example.com/v1/": {"auth": "bm9kZTpucHc="}}}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("legacy/.dockercfg"),
            r#"{"reg.example.com": {"username": "legacy", "password": "x"}}"#,
        )
        .unwrap();
        let node = NodeCredentials::with_paths(
            vec![
                dir.join("missing/config.json"),
                dir.join("bad/config.json"),
                dir.join("good/config.json"),
            ],
            vec![dir.join("legacy/.dockercfg")],
        );
        let fake = Arc::new(FakeRuntime::new());
        fake.require_pull_auth("reg.example.com/app:1", "node", "npw");
        let m = ImageManager::new(fake.clone(), true, None).with_node_credentials(node);
        let (pod, sb) = (Pod::default(), PodSandboxConfig::default());
        let now = Duration::from_secs(1000);
        // No pull secret: the node's login.
        m.ensure_image(&pod, &ctr("reg.example.com/app:1", None), &sb, &[], now)
            .await
            .unwrap();
        let image = "reg.example.com/app:1".to_string();
        assert_eq!(
            fake.pull_logins(),
            vec![(image.clone(), Some("node".to_string()))]
        );
        // With a (stale) pull secret: the pod's first, then the node's.
        fake.require_pull_auth("reg.example.com/app:2", "node", "npw");
        let secrets = [test_pull_secret(
            "regcred",
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            r#"{"auths": {"reg.example.com": {"username": "pod", "password": "old"}}}"#,
        )];
        m.ensure_image(
            &pod,
            &ctr("reg.example.com/app:2", None),
            &sb,
            &secrets,
            now,
        )
        .await
        .unwrap();
        let image = "reg.example.com/app:2".to_string();
        assert_eq!(
            fake.pull_logins()[1..],
            [
                (image.clone(), Some("pod".to_string())),
                (image.clone(), Some("node".to_string())),
            ]
        );
        // Only the legacy file: it is used.
        let only_legacy = NodeCredentials::with_paths(
            vec![dir.join("missing/config.json")],
            vec![dir.join("legacy/.dockercfg")],
        );
        let users: Vec<_> = only_legacy
            .keyring()
            .await
            .lookup("reg.example.com/app")
            .into_iter()
            .map(|c| c.username)
            .collect();
        assert_eq!(users, ["legacy"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn plugin_logins_reach_pull_image_after_the_pods_and_the_nodes() {
        use keyring::{test_pull_secret, NodeCredentials};
        let dir = std::env::temp_dir().join(format!("rkubelet-pluginpull-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            r#"{"auths": {"reg.example.com": {"username": "node", "password": "stale"}}}"#,
        )
        .unwrap();
        let node = NodeCredentials::with_paths(vec![dir.join("config.json")], vec![]);
        // The plugin answers for the registry it is asked about, and saves
        // the request to show which image it was asked for.
        let plugins = credentialprovider::test_providers(
            &dir,
            "registry-login",
            r#"cat > "$DIR/request"
echo '{"apiVersion": "credentialprovider.kubelet.k8s.io/v1", "kind": "CredentialProviderResponse", "cacheKeyType": "Registry", "auth": {"reg.example.com": {"username": "plugin", "password": "ppw"}}}'"#,
            "  matchImages: [\"*.example.com\"]\n  defaultCacheDuration: 1h\n",
        )
        .unwrap();
        let fake = Arc::new(FakeRuntime::new());
        fake.require_pull_auth("reg.example.com/team/app:1", "plugin", "ppw");
        let m = ImageManager::new(fake.clone(), true, None)
            .with_node_credentials(node)
            .with_credential_providers(Some(Arc::new(plugins)));
        let (pod, sb) = (Pod::default(), PodSandboxConfig::default());
        let secrets = [test_pull_secret(
            "regcred",
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            r#"{"auths": {"reg.example.com": {"username": "pod", "password": "old"}}}"#,
        )];
        let c = ctr("reg.example.com/team/app:1", None);
        let now = Duration::from_secs(1000);
        m.ensure_image(&pod, &c, &sb, &secrets, now).await.unwrap();
        // Upstream's union keyring: pull secrets, node files, plugins.
        let image = "reg.example.com/team/app:1".to_string();
        assert_eq!(
            fake.pull_logins(),
            vec![
                (image.clone(), Some("pod".to_string())),
                (image.clone(), Some("node".to_string())),
                (image.clone(), Some("plugin".to_string())),
            ]
        );
        let request: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("request")).unwrap()).unwrap();
        assert_eq!(request["image"], "reg.example.com/team/app");
        // An image no matchImages covers pulls without the plugin.
        let c = ctr("quay.io/team/app:1", None);
        m.ensure_image(&pod, &c, &sb, &[], now).await.unwrap();
        assert_eq!(
            fake.pull_logins().last(),
            Some(&("quay.io/team/app:1".to_string(), None))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn pulls_log_in_with_each_matching_pull_secret_in_turn() {
        use keyring::test_pull_secret;
        let fake = Arc::new(FakeRuntime::new());
        fake.require_pull_auth("reg.example.com/team/app:1", "good", "pw");
        let m = ImageManager::new(fake.clone(), true, None);
        let (pod, sb) = (Pod::default(), PodSandboxConfig::default());
        let json = r#"{"auths": {
            "reg.example.com": {"username": "good", "password": "pw"},
            "reg.example.com/team": {"username": "stale", "password": "old"},
            "other.example.com": {"username": "unrelated", "password": "x"}
        }}"#;
        let secrets = [test_pull_secret(
            "regcred",
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            json,
        )];
        let now = Duration::from_secs(1000);
        let c = ctr("reg.example.com/team/app:1", None);
        m.ensure_image(&pod, &c, &sb, &secrets, now).await.unwrap();
        // The most specific location first, then the registry's own.
        let image = "reg.example.com/team/app:1".to_string();
        assert_eq!(
            fake.pull_logins(),
            vec![
                (image.clone(), Some("stale".to_string())),
                (image.clone(), Some("good".to_string())),
            ]
        );

        // No matching credential: one anonymous pull.
        let c = ctr("public.example.com/app:1", None);
        m.ensure_image(&pod, &c, &sb, &secrets, now).await.unwrap();
        assert_eq!(
            fake.pull_logins().last(),
            Some(&("public.example.com/app:1".to_string(), None))
        );

        // All matching credentials rejected: the pull fails with every
        // error, and no anonymous attempt follows (upstream).
        fake.require_pull_auth("reg.example.com/team/locked:1", "nobody", "-");
        let before = fake.pull_logins().len();
        let e = m
            .ensure_image(
                &pod,
                &ctr("reg.example.com/team/locked:1", None),
                &sb,
                &secrets,
                now,
            )
            .await
            .unwrap_err();
        assert_eq!(e.reason, "ErrImagePull");
        assert!(
            e.message.contains(": [") && e.message.matches("unauthorized").count() == 2,
            "{}",
            e.message
        );
        assert_eq!(fake.pull_logins().len() - before, 2);
    }
}
