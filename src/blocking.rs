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

/// Keys whose call missed its deadline and has not returned yet.
static STUCK: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Default::default);

/// One call's state, shared by the caller and the blocking thread, so that
/// "timed out" and "returned" are decided under one lock (no key is left
/// marked stuck by a call that returned just as its deadline passed).
#[derive(Default)]
struct Call {
    done: bool,
    timed_out: bool,
}

/// Keys whose call missed its deadline and has not returned yet (work that
/// hangs, e.g. a mount that never answers), for `/debug/pods`.
pub fn stuck_keys() -> Vec<String> {
    let mut v: Vec<String> = STUCK.lock().iter().cloned().collect();
    v.sort();
    v
}

/// Runs `f` on the blocking pool and waits at most `deadline` for it.
/// `key` names the work (e.g. `volumes/<pod uid>`): once a call with that
/// key has missed its deadline, further calls are refused until it really
/// returns, so one hung pod holds at most one blocking thread however often
/// it retries. Calls that are merely in flight do not block each other.
pub async fn run<T: Send + 'static>(
    key: String,
    deadline: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BlockingError> {
    if STUCK.lock().contains(&key) {
        return Err(BlockingError::StillStuck { what: key });
    }
    let call = Arc::new(Mutex::new(Call::default()));
    let (held, k) = (call.clone(), key.clone());
    let task = tokio::task::spawn_blocking(move || {
        // Marks the call done even if `f` panics.
        struct Done(Arc<Mutex<Call>>, String);
        impl Drop for Done {
            fn drop(&mut self) {
                let mut c = self.0.lock();
                c.done = true;
                if c.timed_out {
                    STUCK.lock().remove(&self.1);
                }
            }
        }
        let _done = Done(held, k);
        f()
    });
    match tokio::time::timeout(deadline, task).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(BlockingError::Panicked {
            what: key,
            message: e.to_string(),
        }),
        Err(_) => {
            let mut c = call.lock();
            if !c.done {
                c.timed_out = true;
                STUCK.lock().insert(key.clone());
            }
            Err(BlockingError::Timeout {
                what: key,
                deadline,
            })
        }
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

/// Runs `here` on this thread and `there` on a scoped thread at the same
/// time (a large scrape's two halves), and answers both results and
/// whether `there` had a thread of its own (its CPU is then not this
/// thread's). The helper thread is kept off this thread's CPU: a thread
/// started for a short burst is woken on its parent's CPU, and schedulers
/// that pack work onto few CPUs leave it there, time-sliced with its
/// parent, so the two halves would take as long as one thread doing both.
/// When no thread starts, `there` runs here after `here`. A panic in
/// either is passed on.
pub fn halves<A, B>(
    name: &'static str,
    here: impl FnOnce() -> A,
    there: impl FnOnce() -> B + Send,
) -> (A, B, bool)
where
    B: Send,
{
    // Taken by the helper thread, or by this one when none starts.
    let slot = Mutex::new(Some(there));
    let take = || slot.lock().take();
    let cpu = this_cpu();
    let span = tracing::debug_span!("second_half", what = name);
    std::thread::scope(|s| {
        let helper = std::thread::Builder::new()
            .name(name.into())
            .spawn_scoped(s, || {
                let _g = span.enter();
                off_cpu(cpu);
                take().map(|f| f())
            });
        let a = here();
        let joined = match helper {
            Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            Err(e) => {
                tracing::debug!(error = %e, what = name, "no thread for the second half");
                None
            }
        };
        match joined {
            Some(b) => (a, b, true),
            None => {
                let f = take().expect("the second half runs once");
                (a, f(), false)
            }
        }
    })
}

/// Where to cut `items` so both parts weigh about the same: after the
/// first item at which the running weight reaches half the total.
pub fn half_point<T>(items: &[T], weight: impl Fn(&T) -> usize) -> usize {
    half_point_after(0, items, weight)
}

/// `half_point` for a first part that carries `lead` of other work
/// besides its items.
pub fn half_point_after<T>(lead: usize, items: &[T], weight: impl Fn(&T) -> usize) -> usize {
    let total: usize = lead + items.iter().map(&weight).sum::<usize>();
    if lead > 0 && lead * 2 >= total {
        return 0;
    }
    let mut acc = lead;
    items
        .iter()
        .position(|i| {
            acc += weight(i);
            acc * 2 >= total
        })
        .map_or(items.len(), |i| i + 1)
}

/// The CPU the calling thread runs on (-1 when unknown).
fn this_cpu() -> i32 {
    // SAFETY: sched_getcpu takes no arguments.
    unsafe { libc::sched_getcpu() }
}

/// Keeps the calling thread off CPU `cpu` (when it may run elsewhere).
fn off_cpu(cpu: i32) {
    let Ok(cpu) = usize::try_from(cpu) else {
        return;
    };
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the calls get its
    // size and a pointer to it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(0, size, &mut set) != 0 || !libc::CPU_ISSET(cpu, &set) {
            return;
        }
        libc::CPU_CLR(cpu, &mut set);
        if libc::CPU_COUNT(&set) > 0 {
            libc::sched_setaffinity(0, size, &set);
        }
    }
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

    #[tokio::test]
    async fn calls_in_flight_with_one_key_do_not_refuse_each_other() {
        // Old rule: a second call with a key in flight was refused as
        // "still stuck" though nothing had missed a deadline.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
        let first = tokio::spawn(run("k/busy".into(), Duration::from_secs(5), move || {
            let _ = started_tx.send(());
            let _ = rx.recv();
            1
        }));
        started.await.unwrap();
        assert_eq!(
            run("k/busy".into(), Duration::from_secs(5), || 2)
                .await
                .unwrap(),
            2
        );
        tx.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
    }
}
