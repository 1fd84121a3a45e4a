//! Log files left behind by pods that are gone, removed at housekeeping at
//! most once a minute (upstream's containerGC, `kuberuntime_gc.go`
//! evictPodLogsDirectories, every ContainerGCPeriod):
//! - a pod's directory under `podLogsDir` (`<namespace>_<name>_<uid>`,
//!   which the runtime fills and never removes) once no pod with that UID
//!   is wanted or still being stopped;
//! - a link in `/var/log/containers` whose log file is gone, unless the
//!   runtime says its container has not exited.
//!
//! Without this every pod ever run leaves its directory and its logs, and
//! a node running many short jobs fills its disk with them. Links are
//! never followed: a directory entry that is a link is removed as a link.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cri::{ContainerState, RuntimeService};

/// Upstream's ContainerGCPeriod.
pub const PERIOD: Duration = Duration::from_secs(60);

/// How long one pass's file-system work may take.
const DEADLINE: Duration = Duration::from_secs(30);

/// Runs a pass at housekeeping on a tracked task, one at a time, at most
/// once a `PERIOD`.
#[derive(Clone)]
pub struct Cleaner {
    pod_logs_dir: PathBuf,
    container_logs_dir: PathBuf,
    runtime: Arc<dyn RuntimeService>,
    busy: Arc<AtomicBool>,
    last: Arc<Mutex<Option<Instant>>>,
    tasks: TaskTracker,
    token: CancellationToken,
    /// Runs first in each pass (upstream's GC removes containers and
    /// sandboxes before pod logs).
    first: Option<Hook>,
}

/// Work a pass begins with.
pub type Hook = Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

impl Cleaner {
    pub fn new(
        pod_logs_dir: PathBuf,
        container_logs_dir: PathBuf,
        runtime: Arc<dyn RuntimeService>,
        tasks: TaskTracker,
        token: CancellationToken,
    ) -> Self {
        Cleaner {
            pod_logs_dir,
            container_logs_dir,
            runtime,
            busy: Arc::default(),
            last: Arc::default(),
            tasks,
            token,
            first: None,
        }
    }

    /// Runs `hook` at the start of each pass.
    pub fn with_first(mut self, hook: Hook) -> Self {
        self.first = Some(hook);
        self
    }

    /// One pass, unless one ran less than a `PERIOD` ago or is still
    /// running. `known` says which pod UIDs are wanted or not yet
    /// terminated; it is asked only when all sources are ready, as
    /// upstream removes pod logs only then.
    pub fn run(&self, known: impl Fn(&str) -> bool + Send + 'static) {
        {
            let mut last = self.last.lock();
            if last.is_some_and(|t| t.elapsed() < PERIOD)
                || self.token.is_cancelled()
                || self.busy.swap(true, Ordering::AcqRel)
            {
                return;
            }
            *last = Some(Instant::now());
        }
        let this = self.clone();
        self.tasks.spawn(tracing::Instrument::instrument(
            async move {
                this.pass(known).await;
                this.busy.store(false, Ordering::Release);
            },
            tracing::info_span!("pod_log_cleanup"),
        ));
    }

    async fn pass(&self, known: impl Fn(&str) -> bool + Send + 'static) {
        if let Some(first) = &self.first {
            first().await;
        }
        let (pods, links) = (self.pod_logs_dir.clone(), self.container_logs_dir.clone());
        let found = crate::blocking::run("pod log cleanup".into(), DEADLINE, move || {
            (remove_pod_dirs(&pods, &known), dangling_links(&links))
        })
        .await;
        let (removed, dangling) = match found {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "pod log cleanup");
                return;
            }
        };
        for name in removed {
            tracing::debug!(dir = %name, "Removed pod logs");
        }
        let mut gone = Vec::new();
        for (link, id) in dangling {
            // A container still running may be between a rotation's rename
            // and its reopen (upstream keeps the link then); any error
            // asking, as upstream, lets the link go.
            if let Some(id) = id {
                if not_exited(&self.runtime.container_status(&id).await) {
                    continue;
                }
            }
            gone.push(link);
        }
        if gone.is_empty() {
            return;
        }
        let r = crate::blocking::run("container log link cleanup".into(), DEADLINE, move || {
            for link in gone {
                if let Err(e) = std::fs::remove_file(&link) {
                    tracing::info!(link = %link.display(), error = %e, "Failed to remove container log dead symlink");
                }
            }
        })
        .await;
        if let Err(e) = r {
            tracing::warn!(error = %e, "container log link cleanup");
        }
    }
}

/// Whether the runtime's answer says the container has not exited (an
/// error says nothing, and the link goes).
fn not_exited(status: &crate::cri::CriResult<crate::cri::ContainerStatus>) -> bool {
    status
        .as_ref()
        .is_ok_and(|s| s.state != ContainerState::ContainerExited as i32)
}

/// The pod UID a pod log directory's name ends in (upstream
/// parsePodUIDFromLogsDirectory: what follows the last `_`).
fn pod_uid_of(dir_name: &str) -> &str {
    dir_name.rsplit('_').next().unwrap_or(dir_name)
}

/// Removes each entry of `dir` whose pod UID `known` does not name
/// (blocking); the names removed.
pub fn remove_pod_dirs(dir: &Path, known: &dyn Fn(&str) -> bool) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if known(pod_uid_of(&name)) {
            continue;
        }
        let path = e.path();
        // remove_dir_all removes a link itself, never what it points to.
        let r = match e.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        match r {
            Ok(()) => removed.push(name),
            Err(err) => {
                tracing::info!(path = %path.display(), error = %err, "Failed to remove pod logs directory")
            }
        }
    }
    removed
}

/// The `*.log` links in `dir` whose target is gone, each with the
/// container ID its name ends in (`<pod>_<ns>_<container>-<id>.log`;
/// upstream getContainerIDFromLegacyLogSymlink: at least 6 characters)
/// (blocking).
pub fn dangling_links(dir: &Path) -> Vec<(PathBuf, Option<String>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".log") else {
            continue;
        };
        let path = e.path();
        // `metadata` follows the link: NotFound when its target is gone.
        match std::fs::metadata(&path) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            _ => continue,
        }
        let id = stem
            .rsplit('-')
            .next()
            .filter(|id| id.len() >= 6)
            .map(String::from);
        out.push((path, id));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::fake::FakeRuntime;

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rk-podlogs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn directories_of_pods_no_longer_known_are_removed_and_links_not_followed() {
        // Old code: nothing removed pod log directories; every pod ever run
        // left its logs behind.
        let root = tempdir("dirs");
        let logs = root.join("pods");
        let kept = logs.join("default_web_u-kept/main");
        std::fs::create_dir_all(&kept).unwrap();
        std::fs::write(kept.join("0.log"), "x").unwrap();
        let gone = logs.join("default_job_u-gone/main");
        std::fs::create_dir_all(&gone).unwrap();
        std::fs::write(gone.join("0.log"), "x").unwrap();
        // A link named like a pod's directory, to something that must stay.
        let outside = root.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, logs.join("default_evil_u-evil")).unwrap();

        let mut removed = remove_pod_dirs(&logs, &|uid| uid == "u-kept");
        removed.sort();
        assert_eq!(removed, ["default_evil_u-evil", "default_job_u-gone"]);
        assert!(kept.join("0.log").exists());
        assert!(!logs.join("default_job_u-gone").exists());
        assert!(
            outside.join("keep").exists(),
            "a link's target is never touched"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn dead_links_go_unless_their_container_still_runs() {
        let root = tempdir("links");
        let (pods, links) = (root.join("pods"), root.join("containers"));
        std::fs::create_dir_all(&pods).unwrap();
        std::fs::create_dir_all(&links).unwrap();
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox");
        let sb = fake
            .run_pod_sandbox(Default::default(), String::new())
            .await
            .unwrap();
        let config = crate::cri::ContainerConfig {
            image: Some(crate::cri::ImageSpec {
                image: "busybox".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let running = fake
            .create_container(&sb, config.clone(), Default::default())
            .await
            .unwrap();
        fake.start_container(&running).await.unwrap();
        // The fake's IDs are shorter than the 6 characters a link's name
        // must carry: its answer for a running container is checked here.
        assert!(not_exited(&fake.container_status(&running).await));
        let exited = fake
            .create_container(&sb, config, Default::default())
            .await
            .unwrap();
        fake.start_container(&exited).await.unwrap();
        fake.exit_container(&exited, 0);
        let live_target = pods.join("live.log");
        std::fs::write(&live_target, "x").unwrap();
        let link = |name: &str, to: &Path| {
            let l = links.join(name);
            std::os::unix::fs::symlink(to, &l).unwrap();
            l
        };
        assert!(!not_exited(&fake.container_status(&exited).await));
        assert!(!not_exited(
            &fake.container_status("no-such-container").await
        ));
        let live = link("p_default_a-aaaaaaaaaaaa.log", &live_target);
        let unknown = link("p_default_d-0123456789ab.log", &pods.join("gone"));
        let unparsable = link("p_default_e-x.log", &pods.join("gone"));

        let c = Cleaner::new(
            pods,
            links,
            fake,
            TaskTracker::new(),
            CancellationToken::new(),
        );
        c.pass(|_| true).await;
        assert!(live.exists());
        for l in [unknown, unparsable] {
            assert!(l.symlink_metadata().is_err(), "{} kept", l.display());
        }
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn passes_come_at_most_once_a_period() {
        let root = tempdir("period");
        let pods = root.join("pods");
        let fake = Arc::new(FakeRuntime::new());
        let tasks = TaskTracker::new();
        let c = Cleaner::new(
            pods.clone(),
            root.join("containers"),
            fake,
            tasks.clone(),
            CancellationToken::new(),
        );
        std::fs::create_dir_all(pods.join("ns_a_u1")).unwrap();
        c.run(|_| false);
        tasks.close();
        tasks.wait().await;
        assert!(!pods.join("ns_a_u1").exists());
        // Within the period, nothing more is removed.
        std::fs::create_dir_all(pods.join("ns_b_u2")).unwrap();
        c.run(|_| false);
        assert!(pods.join("ns_b_u2").exists());
        let _ = std::fs::remove_dir_all(&root);
    }
}
