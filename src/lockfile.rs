//! `--lock-file` and `--exit-on-lock-contention`: upstream's `pkg/util/flock`
//! and `watchForLockfileContention` (`cmd/kubelet/app/server_linux.go`). A
//! kubelet started in "bootstrap" mode holds the lock and exits as soon as
//! another process opens the file, so the next kubelet can take the lock over.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use tokio::sync::oneshot;

/// Opens `path` (created with mode 0600) and takes an exclusive flock on it,
/// waiting while another process holds it, as upstream's `flock.Acquire`. The
/// lock lasts while the returned file is open; upstream keeps it until exit.
/// Blocks: call it before the async runtime starts.
pub fn acquire(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    loop {
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(file);
        }
        let e = io::Error::last_os_error();
        // Go's runtime restarts the call after a signal (SA_RESTART).
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Watches `path` for an open or its deletion (`IN_OPEN|IN_DELETE_SELF`) from
/// a thread of its own; the receiver gets a description of the first event,
/// or of the error that ended the watch (upstream exits on either).
pub fn watch_for_contention(path: &Path) -> io::Result<oneshot::Receiver<String>> {
    use inotify::{EventMask, Inotify, WatchMask};
    let mut ino = Inotify::init()?;
    ino.watches()
        .add(path, WatchMask::OPEN | WatchMask::DELETE_SELF)?;
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("lock-file-watch".into())
        .spawn(move || {
            let mut buf = [0u8; 4096];
            let said = loop {
                match ino.read_events_blocking(&mut buf) {
                    Ok(mut events) => {
                        let Some(e) = events.next() else { continue };
                        let name = if e.mask.contains(EventMask::OPEN) {
                            "IN_OPEN"
                        } else if e.mask.contains(EventMask::DELETE_SELF) {
                            "IN_DELETE_SELF"
                        } else {
                            "IN_IGNORED"
                        };
                        break format!("inotify event {name}");
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => break format!("inotify watcher error: {e}"),
                }
            };
            let _ = tx.send(said);
        })?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_is_exclusive_and_an_open_is_noticed() {
        let path = std::env::temp_dir().join(format!("rkubelet-lock-{}.lock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let held = acquire(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        // flock locks belong to the open file description: a second open
        // cannot take it while `held` is open.
        let other = File::open(&path).unwrap();
        // SAFETY: flock on a descriptor the test owns.
        let r = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(r, -1);
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::EWOULDBLOCK)
        );

        let mut rx = watch_for_contention(&path).unwrap();
        assert!(rx.try_recv().is_err(), "no event before an open");
        let _contender = File::open(&path).unwrap();
        let event = rx.blocking_recv().unwrap();
        assert!(event.contains("IN_OPEN"), "{event}");

        drop(held);
        // SAFETY: as above.
        assert_eq!(
            unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
            0
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn watching_a_missing_file_fails() {
        let path = std::env::temp_dir().join("rkubelet-lock-missing/none.lock");
        assert!(watch_for_contention(&path).is_err());
    }
}
