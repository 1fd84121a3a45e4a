//! Blocking file-system work off the async threads, with a deadline.
//!
//! A hostPath on a hung NFS or FUSE mount blocks `stat` in the kernel for
//! as long as the server is away. Run on rkubelet's (by default single)
//! async thread, that would stop every pod, the relist and `/healthz`; run
//! here, it stalls only the pod that asked. A call that misses its
//! deadline is abandoned (a thread stuck in the kernel cannot be
//! cancelled), and while it is still stuck the same key is refused, so one
//! hung pod holds at most one blocking thread however often it retries.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use parking_lot::Mutex;

#[derive(Debug, Clone, thiserror::Error)]
pub enum BlockingError {
    #[error("{what} did not finish within {deadline:?} (a file system not answering?)")]
    Timeout { what: String, deadline: Duration },
    #[error("{what} is still stuck from an earlier attempt")]
    StillStuck { what: String },
    #[error("{what} failed: {message}")]
    Panicked { what: String, message: String },
}

static IN_FLIGHT: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Default::default);

struct Release(String);

impl Drop for Release {
    fn drop(&mut self) {
        IN_FLIGHT.lock().remove(&self.0);
    }
}

/// Runs `f` on the blocking pool and waits at most `deadline` for it.
/// `key` names the work (e.g. `volumes/<pod uid>`): at most one call per
/// key is in flight, stuck or not.
pub async fn run<T: Send + 'static>(
    key: String,
    deadline: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BlockingError> {
    if !IN_FLIGHT.lock().insert(key.clone()) {
        return Err(BlockingError::StillStuck { what: key });
    }
    // Released when `f` returns, on the blocking thread: an abandoned call
    // keeps its key until it really ends.
    let release = Arc::new(Release(key.clone()));
    let held = release.clone();
    let task = tokio::task::spawn_blocking(move || {
        let r = f();
        drop(held);
        r
    });
    drop(release);
    match tokio::time::timeout(deadline, task).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(BlockingError::Panicked {
            what: key,
            message: e.to_string(),
        }),
        Err(_) => Err(BlockingError::Timeout {
            what: key,
            deadline,
        }),
    }
}

/// `run` for work that itself can fail: both failures as one message.
pub async fn try_run<T: Send + 'static, E: std::fmt::Display>(
    key: String,
    deadline: Duration,
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, String> {
    let r = run(key, deadline, move || f().map_err(|e| e.to_string())).await;
    r.map_err(|e| e.to_string()).and_then(|r| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stuck_call_times_out_and_blocks_only_its_own_key() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let e = run("k/stuck".into(), Duration::from_millis(50), move || {
            let _ = rx.recv();
        })
        .await
        .unwrap_err();
        assert!(matches!(e, BlockingError::Timeout { .. }), "{e}");
        // Retrying the same work while it is still stuck starts nothing.
        let e = run("k/stuck".into(), Duration::from_secs(5), || ())
            .await
            .unwrap_err();
        assert!(matches!(e, BlockingError::StillStuck { .. }), "{e}");
        // Other keys are unaffected.
        assert_eq!(
            run("k/other".into(), Duration::from_secs(5), || 7)
                .await
                .unwrap(),
            7
        );
        // Once the stuck call ends, its key is free again.
        tx.send(()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match run("k/stuck".into(), Duration::from_secs(5), || 1).await {
                Ok(v) => break assert_eq!(v, 1),
                Err(_) => assert!(std::time::Instant::now() < deadline),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
