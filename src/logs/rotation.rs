//! Container log rotation, as upstream's `pkg/kubelet/logs`
//! container_log_manager: every `containerLogMonitorInterval` each running
//! container's log is checked; one at or over `containerLogMaxSize` is
//! renamed to `<log>.<YYYYMMDD-hhmmss>` and the runtime asked to reopen it
//! (ReopenContainerLog). Before that, leftovers are cleaned, older rotated
//! files beyond `containerLogMaxFiles - 2` are removed and the rotated ones
//! compressed (`.gz`). `containerLogMaxWorkers` containers at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cri::RuntimeService;

/// The rotation policy from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub max_size: u64,
    pub max_files: usize,
    pub workers: usize,
    pub period: Duration,
}

impl Policy {
    /// From `containerLogMaxSize` (a quantity), `containerLogMaxFiles`,
    /// `containerLogMaxWorkers` and `containerLogMonitorInterval`; `None`
    /// when rotation is off (a size below 1, fewer than two files). A size
    /// that does not parse is an error, as upstream's
    /// NewContainerLogManager fails the kubelet's start with it: silently
    /// not rotating would let the logs fill the disk.
    pub fn from_config(
        cfg: &crate::config::KubeletConfiguration,
    ) -> Result<Option<Policy>, String> {
        let max_size =
            crate::cm::quantity::parse_bytes(&cfg.container_log_max_size).map_err(|e| {
                format!(
                    "failed to parse container log max size {:?}: {e}",
                    cfg.container_log_max_size
                )
            })?;
        Ok(
            (max_size > 0 && cfg.container_log_max_files >= 2).then(|| Policy {
                max_size: max_size as u64,
                max_files: cfg.container_log_max_files as usize,
                workers: cfg.container_log_max_workers.max(1) as usize,
                period: cfg
                    .container_log_monitor_interval
                    .0
                    .max(Duration::from_secs(1)),
            }),
        )
    }
}

const SUFFIX_GZ: &str = ".gz";
const SUFFIX_TMP: &str = ".tmp";

/// Runs until cancelled.
pub async fn run(runtime: Arc<dyn RuntimeService>, policy: Policy, token: CancellationToken) {
    let mut tick = tokio::time::interval(policy.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut paths = LogPaths::new();
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let running = crate::cri::ContainerFilter {
            state: Some(crate::cri::v1::ContainerStateValue {
                state: crate::cri::ContainerState::ContainerRunning as i32,
            }),
            ..Default::default()
        };
        let containers = match runtime.list_containers(Some(running)).await {
            Ok(c) => c,
            Err(e) => {
                debug!(error = %e, "log rotation: listing containers");
                continue;
            }
        };
        let ids: Vec<String> = containers.into_iter().map(|c| c.id).collect();
        tokio::select! {
            _ = token.cancelled() => return,
            _ = check(&runtime, policy, ids, &mut paths) => {}
        }
    }
}

/// Log paths by container id (`None`: the container has no log). A
/// container's log path is set when it is created and never changes, so it
/// is asked for once rather than at every check (upstream asks
/// ContainerStatus for each running container every 10 s).
type LogPaths = std::collections::HashMap<String, Option<PathBuf>>;

/// One check of the running containers `ids`: their log paths (asked only
/// for containers not seen before), their sizes in one pass on the blocking
/// pool, then the logs at or over the limit rotated and the missing ones
/// reopened, `workers` at a time.
async fn check(
    runtime: &Arc<dyn RuntimeService>,
    policy: Policy,
    ids: Vec<String>,
    paths: &mut LogPaths,
) {
    let live: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
    paths.retain(|id, _| live.contains(id.as_str()));
    let unknown: Vec<String> = ids
        .iter()
        .filter(|id| !paths.contains_key(*id))
        .cloned()
        .collect();
    let found: Vec<(String, Option<Option<PathBuf>>)> = futures::stream::iter(unknown)
        .map(|id| async move {
            // An error is not remembered: asked again at the next check.
            let path = runtime
                .container_status(&id)
                .await
                .ok()
                .map(|st| (!st.log_path.is_empty()).then(|| PathBuf::from(st.log_path)));
            (id, path)
        })
        .buffer_unordered(policy.workers)
        .collect()
        .await;
    paths.extend(found.into_iter().filter_map(|(id, path)| Some((id, path?))));
    let logs: Vec<(String, PathBuf)> = ids
        .into_iter()
        .filter_map(|id| {
            let path = paths.get(&id)?.clone()?;
            Some((id, path))
        })
        .collect();
    let sized = crate::blocking::run("log sizes".into(), Duration::from_secs(10), move || {
        logs.into_iter()
            .map(|(id, path)| {
                let size = std::fs::metadata(&path).map(|m| m.len());
                (id, path, size)
            })
            .collect::<Vec<_>>()
    })
    .await;
    let sized = match sized {
        Ok(s) => s,
        Err(e) => {
            debug!(error = %e, "log rotation: sizing the logs");
            return;
        }
    };
    futures::stream::iter(sized)
        .map(|(id, path, size)| async move {
            match size {
                Ok(n) if n < policy.max_size => {}
                Ok(_) => rotate_one(runtime.as_ref(), &id, path, policy).await,
                // The file is gone (a failed rotation): ask for it back, as
                // upstream.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let _ = runtime.reopen_container_log(&id).await;
                }
                Err(_) => {}
            }
        })
        .buffer_unordered(policy.workers)
        .collect::<Vec<()>>()
        .await;
}

/// Rotates the log at `path` (at or over the size limit) of container `id`.
async fn rotate_one(runtime: &dyn RuntimeService, id: &str, path: PathBuf, policy: Policy) {
    let p = path.clone();
    let prepared = crate::blocking::run(
        format!("log rotate {id}"),
        Duration::from_secs(60),
        move || prepare(&p, policy.max_files),
    )
    .await;
    // As upstream's rotateLog: no new rotated file while the old ones
    // could not be pruned or compressed, so containerLogMaxFiles holds
    // (the live log grows meanwhile, and the next pass tries again).
    let failed = match prepared {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(e) => Some(e.to_string()),
    };
    if let Some(e) = failed {
        warn!(container = %id, error = %e, "log rotation: tidying rotated files failed; not rotating");
        return;
    }
    let stamp = k8s_openapi::jiff::Zoned::now()
        .strftime("%Y%m%d-%H%M%S")
        .to_string();
    let rotated = PathBuf::from(format!("{}.{stamp}", path.display()));
    let (from, to) = (path.clone(), rotated.clone());
    let renamed = crate::blocking::run(
        format!("log rename {id}"),
        Duration::from_secs(10),
        move || std::fs::rename(&from, &to),
    )
    .await;
    if !matches!(renamed, Ok(Ok(()))) {
        warn!(container = %id, "log rotation: renaming the log failed");
        return;
    }
    if let Err(e) = runtime.reopen_container_log(id).await {
        // Put it back so the runtime keeps writing where we read.
        warn!(container = %id, error = %e, "log rotation: ReopenContainerLog failed; renaming back");
        let (from, to) = (rotated.clone(), path.clone());
        let back = crate::blocking::run(
            format!("log rename {id}"),
            Duration::from_secs(10),
            move || std::fs::rename(&from, &to),
        )
        .await;
        if !matches!(back, Ok(Ok(()))) {
            tracing::error!(container = %id, rotated = %rotated.display(), log = %path.display(), "Failed to rename rotated log");
        }
        return;
    }
    info!(container = %id, "rotated container log");
}

/// Before a rotation (blocking): temporary leftovers and uncompressed
/// copies of compressed files go, rotated files beyond `max_files - 2` go
/// (oldest first), the rest are compressed.
fn prepare(log: &Path, max_files: usize) -> std::io::Result<()> {
    let dir = log.parent().unwrap_or(Path::new("/"));
    let prefix = format!(
        "{}.",
        log.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    );
    let mut rotated: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    rotated.sort();
    // cleanupUnusedLogs.
    let compressed: Vec<String> = rotated
        .iter()
        .filter(|n| n.ends_with(SUFFIX_GZ))
        .cloned()
        .collect();
    let mut unused = Vec::new();
    rotated.retain(|n| {
        let u = n.ends_with(SUFFIX_TMP)
            || (!n.ends_with(SUFFIX_GZ) && compressed.contains(&format!("{n}{SUFFIX_GZ}")));
        if u {
            unused.push(n.clone());
        }
        !u
    });
    for n in unused {
        std::fs::remove_file(dir.join(&n))?;
    }
    // removeExcessLogs: the names sort by time; keep the newest.
    let keep = max_files.saturating_sub(2);
    if rotated.len() > keep {
        for n in rotated.drain(..rotated.len() - keep) {
            std::fs::remove_file(dir.join(&n))?;
        }
    }
    for n in rotated.iter().filter(|n| !n.ends_with(SUFFIX_GZ)) {
        compress(&dir.join(n))?;
    }
    Ok(())
}

/// upstream's compressLog: through `<log>.tmp` (removed whatever happens),
/// with the log's own mode (a log readable only by its group stays so
/// compressed), then the original goes.
fn compress(src: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let tmp = PathBuf::from(format!("{}{SUFFIX_TMP}", src.display()));
    let dst = PathBuf::from(format!("{}{SUFFIX_GZ}", src.display()));
    let written = (|| {
        let mut input = std::fs::File::open(src)?;
        let mode = input.metadata()?.permissions().mode() & 0o7777;
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        // The mode given to open is masked by the umask: set it whole.
        out.set_permissions(std::fs::Permissions::from_mode(mode))?;
        let mut enc = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        std::io::copy(&mut input, &mut enc)?;
        enc.finish()?.sync_all()?;
        std::fs::rename(&tmp, &dst)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    std::fs::remove_file(src)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn old_rotated_files_are_pruned_and_compressed_as_upstream() {
        let dir = std::env::temp_dir().join(format!("rkubelet-rotation-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("0.log");
        std::fs::write(&log, "current\n").unwrap();
        for (n, body) in [
            ("0.log.20261120-000000.gz", "x"),
            ("0.log.20261121-000000.gz", "x"),
            ("0.log.20261122-000000", "day 22\n"),
            ("0.log.20261123-000000", "day 23\n"),
            ("0.log.20261123-000000.gz.tmp", "leftover"),
            ("other.log", "not ours"),
        ] {
            std::fs::write(dir.join(n), body).unwrap();
        }
        // maxFiles 5: at most 3 rotated files, the newest kept.
        prepare(&log, 5).unwrap();
        assert_eq!(
            names(&dir),
            [
                "0.log",
                "0.log.20261121-000000.gz",
                "0.log.20261122-000000.gz",
                "0.log.20261123-000000.gz",
                "other.log"
            ]
        );
        let gz = std::fs::File::open(dir.join("0.log.20261123-000000.gz")).unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(gz), &mut text).unwrap();
        assert_eq!(text, "day 23\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// upstream's compressLog: the compressed file keeps the log's mode (it
    /// was 0644 whatever the log's), and its temporary file goes on a
    /// failure (it stayed until the next rotation).
    #[test]
    fn compression_keeps_the_mode_and_leaves_nothing_behind() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("rkubelet-compress-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("0.log.20261123-000000");
        std::fs::write(&log, "secret\n").unwrap();
        std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o640)).unwrap();
        compress(&log).unwrap();
        let gz = dir.join("0.log.20261123-000000.gz");
        let mode = std::fs::metadata(&gz).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        assert_eq!(names(&dir), ["0.log.20261123-000000.gz"]);
        // The compressed name taken (a directory): the compression fails
        // after writing its temporary file, which goes; the log stays.
        let again = dir.join("1.log.20261123-000000");
        std::fs::write(&again, "x\n").unwrap();
        let taken = dir.join("1.log.20261123-000000.gz");
        std::fs::create_dir(&taken).unwrap();
        std::fs::write(taken.join("f"), "").unwrap();
        assert!(compress(&again).is_err());
        assert!(again.exists());
        assert!(!dir.join("1.log.20261123-000000.tmp").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn log_paths_are_asked_once_and_logs_over_the_limit_rotated() {
        use crate::cri::v1;
        let dir = std::env::temp_dir().join(format!("rkubelet-rotcheck-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("main")).unwrap();
        let fake = Arc::new(crate::cri::fake::FakeRuntime::new());
        let rt: Arc<dyn RuntimeService> = fake.clone();
        let sb_cfg = v1::PodSandboxConfig {
            log_directory: dir.to_string_lossy().into_owned(),
            ..Default::default()
        };
        let sb = rt
            .run_pod_sandbox(sb_cfg.clone(), String::new())
            .await
            .unwrap();
        let cfg = |name: &str, log: &str| v1::ContainerConfig {
            metadata: Some(v1::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            log_path: log.into(),
            ..Default::default()
        };
        let big = rt
            .create_container(&sb, cfg("main", "main/0.log"), sb_cfg.clone())
            .await
            .unwrap();
        let small = rt
            .create_container(&sb, cfg("side", "side.log"), sb_cfg.clone())
            .await
            .unwrap();
        let quiet = rt
            .create_container(&sb, cfg("quiet", ""), sb_cfg)
            .await
            .unwrap();
        std::fs::write(dir.join("main/0.log"), "x".repeat(100)).unwrap();
        std::fs::write(dir.join("side.log"), "x").unwrap();
        let policy = Policy {
            max_size: 10,
            max_files: 5,
            workers: 2,
            period: Duration::from_secs(10),
        };
        let ids = vec![big.clone(), small.clone(), quiet.clone()];
        let mut paths = LogPaths::new();
        check(&rt, policy, ids.clone(), &mut paths).await;
        // The big log was renamed and the runtime asked to reopen it; the
        // small one was left.
        assert!(!dir.join("main/0.log").exists());
        let rotated: Vec<String> = names(&dir.join("main"));
        assert_eq!(rotated.len(), 1);
        assert!(rotated[0].starts_with("0.log."), "{rotated:?}");
        assert!(dir.join("side.log").exists());
        let reopened = |f: &crate::cri::fake::FakeRuntime| {
            f.calls()
                .iter()
                .filter(|c| c.starts_with("ReopenContainerLog"))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(reopened(&fake), [format!("ReopenContainerLog {big}")]);
        // Next check: no ContainerStatus again (a container without a log
        // is remembered too); the fake does not recreate the log, so it is
        // asked to reopen it again, as upstream asks for a missing log.
        check(&rt, policy, ids, &mut paths).await;
        for id in [&big, &small, &quiet] {
            assert_eq!(fake.status_asks(id), 1, "{id}");
        }
        assert_eq!(reopened(&fake).len(), 2);
        // Containers no longer running are forgotten.
        check(&rt, policy, vec![small.clone()], &mut paths).await;
        assert_eq!(paths.keys().collect::<Vec<_>>(), [&small]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_policy_follows_the_configuration() {
        let c = crate::config::KubeletConfiguration::default();
        let p = Policy::from_config(&c).unwrap().unwrap();
        assert_eq!(p.max_size, 10 * 1024 * 1024);
        assert_eq!(p.max_files, 5);
        assert_eq!(p.period, Duration::from_secs(10));
        // A size that does not parse stops the start (it disabled rotation
        // silently before); a size of 0 turns rotation off.
        let mut bad = c.clone();
        bad.container_log_max_size = "10MB".into();
        let e = Policy::from_config(&bad).unwrap_err();
        assert!(
            e.starts_with("failed to parse container log max size \"10MB\""),
            "{e}"
        );
        let mut off = c;
        off.container_log_max_size = "0".into();
        assert!(Policy::from_config(&off).unwrap().is_none());
    }
}
