//! Image manager: pull policies, pull backoff and pull serialization
//! (upstream `pkg/kubelet/images/image_manager.go`, `puller.go`).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
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
    /// One permit when pulls are serialized (upstream default), else
    /// maxParallelImagePulls.
    pulls: Semaphore,
}

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
            max_parallel.unwrap_or(Semaphore::MAX_PERMITS).max(1)
        };
        ImageManager {
            svc,
            backoff: Mutex::new(Backoff::container()),
            pulls: Semaphore::new(permits),
        }
    }

    /// Makes sure the container's image is present; returns the image
    /// reference to create the container from.
    pub async fn ensure_image(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox: &PodSandboxConfig,
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
        if let Some(img) = &present {
            if policy != "Always" {
                return Ok(ReadyImage {
                    id: img.id.clone(),
                    user: ImageUser::of(img),
                });
            }
        } else if policy == "Never" {
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
        if let Some(left) = self.backoff.lock().remaining(&key, now, now) {
            return Err(ImageError {
                reason: "ImagePullBackOff",
                message: format!("Back-off pulling image {image:?}"),
                retry_after: Some(left),
            });
        }
        let _permit = self.pulls.acquire().await.expect("semaphore never closed");
        tracing::info!(
            image,
            pod = pod.metadata.name.as_deref().unwrap_or_default(),
            "pulling image"
        );
        match self.svc.pull_image(image, Some(sandbox.clone())).await {
            Ok(image_ref) => {
                self.backoff.lock().reset(&key);
                // The pulled image's config says which user it runs as.
                let user = match self.svc.image_status(&image_ref).await {
                    Ok(Some(img)) => ImageUser::of(&img),
                    _ => ImageUser::Uid(0),
                };
                Ok(ReadyImage {
                    id: image_ref,
                    user,
                })
            }
            Err(e) => {
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
            .ensure_image(&pod, &ctr("busybox:1.36", Some("Never")), &sb, now)
            .await
            .is_ok());
        let e = m
            .ensure_image(&pod, &ctr("other:1", Some("Never")), &sb, now)
            .await
            .unwrap_err();
        assert_eq!(e.reason, "ErrImageNeverPull");
        let e = m
            .ensure_image(&pod, &ctr("missing:1", None), &sb, now)
            .await
            .unwrap_err();
        assert_eq!(e.reason, "ErrImagePull");
        let e = m
            .ensure_image(
                &pod,
                &ctr("missing:1", None),
                &sb,
                now + Duration::from_secs(1),
            )
            .await
            .unwrap_err();
        assert_eq!(e.reason, "ImagePullBackOff");
        assert!(!fake.calls().contains(&"PullImage busybox:1.36".to_string()));
    }
}
