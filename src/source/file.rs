//! The static pod file source: watches a manifest directory (or one file) and sends the full
//! set of its pods, mirroring upstream's pkg/kubelet/config/file.go and file_linux.go.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use inotify::{EventMask, EventOwned, Inotify, WatchDescriptor, WatchMask};
use md5::{Digest, Md5};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::static_pod::{decode_static_pod_adopting, read_manifest, Takeover};
use super::{pod_uid, Pod, PodOperation, PodUpdate, SourceError, FILE_SOURCE};

/// Upstream's default fileCheckFrequency.
pub const DEFAULT_FILE_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
/// How often to retry watching a path that does not exist yet (upstream retryPeriod).
const WATCH_RETRY: Duration = Duration::from_secs(1);
/// Events closer together than this are handled as one burst...
const DEBOUNCE_QUIET: Duration = Duration::from_millis(50);
/// ...but a burst is never held back longer than this.
const DEBOUNCE_MAX: Duration = Duration::from_millis(250);
const EVENT_BUFFER: usize = 16 * 1024;
/// A manifest this big is unusual enough to trim the heap after reading it.
const HEAVY_FILE_BYTES: usize = 64 * 1024;

/// Starts the file source: a `Set` with every pod of `path` right away and again whenever
/// that set changes, until `token` is cancelled or `out` is closed. Changes are seen through
/// inotify within a fraction of a second; `period` (upstream fileCheckFrequency) is the full
/// rescan that backs it up. A missing path yields an empty `Set` and is watched for.
pub fn spawn_file_source(
    path: PathBuf,
    node_name: String,
    period: Duration,
    out: mpsc::Sender<PodUpdate>,
    token: CancellationToken,
    takeover: Takeover,
) -> JoinHandle<()> {
    tokio::spawn(run(path, node_name, period, out, token, true, takeover))
}

/// What one manifest file last contributed.
#[derive(Debug, Clone)]
struct Entry {
    /// md5 of the bytes last read, so unchanged files are not decoded again (which also keeps
    /// their config.seen time).
    digest: [u8; 16],
    /// Whether those bytes decoded.
    decoded: bool,
    /// The pod this file contributes; after a failed decode triggered by a watch event this
    /// is still the last good pod, as upstream leaves its store alone then.
    pod: Option<Pod>,
}

/// The synchronous half of the source: reads manifests and keeps per-file state.
#[derive(Debug)]
struct Scanner {
    path: PathBuf,
    node_name: String,
    entries: BTreeMap<PathBuf, Entry>,
    /// Pods a previous kubelet left running, for uid-less manifests.
    takeover: Takeover,
    /// Set when a scan read a large file or rejected one: the heap is
    /// trimmed afterwards so a storm of bad manifests leaves no RSS behind.
    heavy: std::cell::Cell<bool>,
}

impl Scanner {
    fn new(path: PathBuf, node_name: String) -> Self {
        Self {
            path,
            node_name,
            entries: BTreeMap::new(),
            takeover: Takeover::default(),
            heavy: std::cell::Cell::new(false),
        }
    }

    /// The pods of the source, in file name order.
    fn pods(&self) -> Vec<Pod> {
        self.entries
            .values()
            .filter_map(|e| e.pod.clone())
            .collect()
    }

    /// Full re-read (upstream listConfig). In a directory, a file that fails to decode
    /// contributes nothing; a single-file path keeps its last good pod, as upstream does
    /// not replace its store when that one file fails.
    fn relist(&mut self) {
        match std::fs::metadata(&self.path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !self.entries.is_empty() {
                    tracing::info!(path = %self.path.display(), "static pod path no longer exists");
                }
                self.entries.clear();
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "unable to read static pod path");
            }
            Ok(meta) if meta.is_dir() => self.relist_dir(),
            Ok(meta) if meta.is_file() => {
                let path = self.path.clone();
                self.entries.retain(|p, _| *p == path);
                self.refresh(&path);
            }
            Ok(_) => {
                tracing::warn!(path = %self.path.display(), "static pod path is not a directory or file");
            }
        }
    }

    fn relist_dir(&mut self) {
        let dir = match std::fs::read_dir(&self.path) {
            Ok(dir) => dir,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "unable to list static pod directory");
                return;
            }
        };
        let mut files: Vec<PathBuf> = dir
            .filter_map(|entry| entry.ok())
            .filter(|entry| !is_hidden(&entry.file_name()))
            .map(|entry| entry.path())
            .collect();
        files.sort();

        let mut next = BTreeMap::new();
        for file in files {
            // Follows symlinks, like upstream's os.Stat.
            match std::fs::metadata(&file) {
                Err(e) => {
                    if e.kind() != io::ErrorKind::NotFound {
                        tracing::warn!(path = %file.display(), error = %e, "could not get metadata of manifest");
                    }
                }
                Ok(meta) if meta.is_file() => {
                    let previous = self.entries.remove(&file);
                    if let Some(entry) = self.load(&file, previous, false) {
                        next.insert(file, entry);
                    }
                }
                Ok(meta) if meta.is_dir() => {
                    tracing::debug!(path = %file.display(), "not recursing into manifest subdirectory");
                }
                Ok(_) => {
                    tracing::debug!(path = %file.display(), "manifest path is not a regular file");
                }
            }
        }
        self.entries = next;
    }

    /// Re-reads one file after a watch event (upstream consumeWatchEvent): a vanished file
    /// drops its pod, one that fails to decode keeps its last good pod.
    fn refresh(&mut self, file: &Path) {
        match std::fs::metadata(file) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Dropping what a file contributed frees memory too.
                if self.entries.remove(file).is_some() {
                    self.heavy.set(true);
                }
            }
            Err(e) => {
                tracing::warn!(path = %file.display(), error = %e, "could not get metadata of manifest");
            }
            Ok(meta) if meta.is_file() => {
                let previous = self.entries.remove(file);
                if let Some(entry) = self.load(file, previous, true) {
                    self.entries.insert(file.to_path_buf(), entry);
                }
            }
            Ok(_) => {
                self.entries.remove(file);
            }
        }
    }

    /// Reads and decodes `file` unless its bytes are those already known. `None` when the
    /// file vanished meanwhile.
    fn load(&self, file: &Path, previous: Option<Entry>, keep_last_good: bool) -> Option<Entry> {
        let bytes = match read_manifest(file) {
            Ok(bytes) => bytes,
            Err(SourceError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return None;
            }
            Err(e) => {
                tracing::warn!(path = %file.display(), error = %e, "could not read manifest file");
                return if keep_last_good { previous } else { None };
            }
        };
        if bytes.len() > HEAVY_FILE_BYTES {
            self.heavy.set(true);
        }
        let digest: [u8; 16] = Md5::digest(&bytes).into();
        if let Some(previous) = previous.as_ref().filter(|p| p.digest == digest) {
            let mut same = previous.clone();
            if !same.decoded && !keep_last_good {
                same.pod = None;
            }
            return Some(same);
        }
        let adopt = |ns: &str, name: &str| {
            if self.takeover.is_empty() {
                return None;
            }
            let mtime = std::fs::metadata(file).and_then(|m| m.modified()).ok()?;
            let uid = self.takeover.claim(ns, name, mtime)?;
            tracing::info!(pod = name, namespace = ns, pod_uid = %uid, path = %file.display(), "taking over the running static pod with its UID");
            Some(uid)
        };
        match decode_static_pod_adopting(&bytes, file, &self.node_name, SystemTime::now(), adopt) {
            Ok(pod) => {
                tracing::info!(
                    pod = pod.metadata.name.as_deref().unwrap_or(""),
                    namespace = pod.metadata.namespace.as_deref().unwrap_or(""),
                    pod_uid = pod_uid(&pod),
                    path = %file.display(),
                    "read static pod manifest"
                );
                Some(Entry {
                    digest,
                    decoded: true,
                    pod: Some(pod),
                })
            }
            Err(e) => {
                self.heavy.set(true);
                tracing::warn!(path = %file.display(), error = %e, "could not process manifest file");
                let pod = if keep_last_good {
                    previous.and_then(|p| p.pod)
                } else {
                    None
                };
                Some(Entry {
                    digest,
                    decoded: false,
                    pod,
                })
            }
        }
    }
}

fn is_hidden(name: &OsStr) -> bool {
    name.as_encoded_bytes().starts_with(b".")
}

/// The inotify watch on the manifest directory (for a single-file path: on its parent, so
/// editors that replace the file by renaming keep being seen).
struct Watcher {
    fd: AsyncFd<Inotify>,
    current: Option<Watched>,
}

struct Watched {
    wd: WatchDescriptor,
    dir: PathBuf,
    /// The one file name that matters when the path is a file.
    only: Option<OsString>,
}

impl Watcher {
    fn new() -> io::Result<Self> {
        let inotify = Inotify::init()?;
        // SAFETY: `Inotify` owns its descriptor (closed only when the `Inotify` is dropped)
        // and always reports that same descriptor, which is what `register` requires.
        let fd = unsafe { AsyncFd::register(inotify) }.map_err(io::Error::from)?;
        Ok(Self { fd, current: None })
    }

    fn watching(&self) -> bool {
        self.current.is_some()
    }

    /// Watches what `path` needs now; true when a new watch was set up (the caller then
    /// re-reads everything, since changes before it were not seen).
    fn ensure(&mut self, path: &Path) -> bool {
        let (dir, only) = match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => (path.to_path_buf(), None),
            Ok(_) => {
                let parent = path
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                (
                    parent.to_path_buf(),
                    path.file_name().map(OsStr::to_os_string),
                )
            }
            Err(_) => return false,
        };
        if let Some(current) = self.current.as_ref() {
            if current.dir == dir && current.only == only {
                return false;
            }
        }
        self.forget();
        let mask = WatchMask::CREATE
            | WatchMask::MODIFY
            | WatchMask::CLOSE_WRITE
            | WatchMask::DELETE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::ATTRIB
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF;
        match self.fd.get_ref().watches().add(&dir, mask) {
            Ok(wd) => {
                tracing::debug!(path = %dir.display(), "watching static pod path");
                self.current = Some(Watched { wd, dir, only });
                true
            }
            Err(e) => {
                tracing::debug!(path = %dir.display(), error = %e, "unable to watch static pod path, will retry");
                false
            }
        }
    }

    fn forget(&mut self) {
        if let Some(old) = self.current.take() {
            // Fails harmlessly when the kernel already dropped the watch.
            let _ = self.fd.get_ref().watches().remove(old.wd);
        }
    }

    async fn read(&mut self, buf: &mut [u8]) -> io::Result<Vec<EventOwned>> {
        loop {
            let mut guard = self.fd.readable_mut().await?;
            let read = guard.try_io(|inner| {
                inner
                    .get_mut()
                    .read_events(buf)
                    .map(|events| events.map(|e| e.to_owned()).collect::<Vec<_>>())
            });
            if let Ok(result) = read {
                return result;
            }
        }
    }

    /// Sorts a burst of events into "re-read everything" or a set of files to re-read.
    fn classify(&mut self, events: Vec<EventOwned>, path: &Path) -> (bool, BTreeSet<PathBuf>) {
        let mut full = false;
        let mut changed = BTreeSet::new();
        for event in events {
            if event.mask.contains(EventMask::Q_OVERFLOW) {
                full = true;
                continue;
            }
            let Some(current) = self.current.as_ref() else {
                continue;
            };
            if event.wd != current.wd {
                continue;
            }
            if event.mask.intersects(
                EventMask::IGNORED
                    | EventMask::DELETE_SELF
                    | EventMask::MOVE_SELF
                    | EventMask::UNMOUNT,
            ) {
                // The watched directory itself went away: rewatch once it is back.
                self.forget();
                full = true;
                continue;
            }
            let Some(name) = event.name else {
                continue;
            };
            if is_hidden(&name) {
                continue;
            }
            match current.only.as_ref() {
                Some(only) if *only == name => {
                    changed.insert(path.to_path_buf());
                }
                Some(_) => {}
                None => {
                    changed.insert(current.dir.join(name));
                }
            }
        }
        (full, changed)
    }
}

/// Events from the watcher; never ready while nothing is watched.
async fn next_events(watcher: &mut Option<Watcher>, buf: &mut [u8]) -> io::Result<Vec<EventOwned>> {
    match watcher {
        Some(w) if w.watching() => w.read(buf).await,
        _ => std::future::pending().await,
    }
}

/// Runs scanner work on the blocking pool; `None` only when the runtime is shutting down.
async fn blocking(
    mut scanner: Scanner,
    work: impl FnOnce(&mut Scanner) + Send + 'static,
) -> Option<Scanner> {
    match tokio::task::spawn_blocking(move || {
        work(&mut scanner);
        scanner
    })
    .await
    {
        Ok(scanner) => Some(scanner),
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => None,
        },
    }
}

async fn run(
    path: PathBuf,
    node_name: String,
    period: Duration,
    out: mpsc::Sender<PodUpdate>,
    token: CancellationToken,
    use_inotify: bool,
    takeover: Takeover,
) {
    tracing::info!(path = %path.display(), "watching static pod path");
    let mut scanner = Scanner::new(path.clone(), node_name);
    scanner.takeover = takeover;
    let mut watcher = match use_inotify.then(Watcher::new).transpose() {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "inotify unavailable, static pods are only rescanned periodically");
            None
        }
    };
    let mut buf = vec![0u8; EVENT_BUFFER];
    // A zero period would make the rescan interval panic; anything this short is a test.
    let period = period.max(Duration::from_millis(100));
    let mut last_sent: Option<Vec<Pod>> = None;
    let mut rescan = tokio::time::interval_at(Instant::now() + period, period);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry = tokio::time::interval_at(Instant::now() + WATCH_RETRY, WATCH_RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    if let Some(w) = watcher.as_mut() {
        w.ensure(&path);
    }
    let mut relist = true;
    let mut changed: BTreeSet<PathBuf> = BTreeSet::new();
    loop {
        // Scan as asked, then send the set if it differs from the last one sent.
        if relist || !changed.is_empty() {
            let files = std::mem::take(&mut changed);
            let full = std::mem::take(&mut relist);
            scanner = match blocking(scanner, move |s| {
                let before = s.entries.len();
                if full {
                    s.relist();
                } else {
                    for file in &files {
                        s.refresh(file);
                    }
                }
                if s.heavy.replace(false) || s.entries.len() < before {
                    crate::memtrim::trim();
                }
            })
            .await
            {
                Some(scanner) => scanner,
                None => return,
            };
            let pods = scanner.pods();
            if last_sent.as_ref() != Some(&pods) {
                let update = PodUpdate {
                    pods: pods.clone(),
                    op: PodOperation::Set,
                    source: FILE_SOURCE.to_string(),
                };
                tokio::select! {
                    _ = token.cancelled() => return,
                    sent = out.send(update) => if sent.is_err() {
                        tracing::debug!("pod update receiver dropped, stopping the file source");
                        return;
                    },
                }
                last_sent = Some(pods);
            }
        }

        let can_retry = watcher.as_ref().is_some_and(|w| !w.watching());
        tokio::select! {
            _ = token.cancelled() => break,
            _ = rescan.tick() => {
                // Also notices a path that turned from file into directory or back.
                if let Some(w) = watcher.as_mut() {
                    w.ensure(&path);
                }
                relist = true;
            }
            _ = retry.tick(), if can_retry => {
                relist = watcher.as_mut().is_some_and(|w| w.ensure(&path));
            }
            read = next_events(&mut watcher, &mut buf) => match read {
                Ok(mut events) => {
                    // Coalesce the rest of the burst.
                    let deadline = Instant::now() + DEBOUNCE_MAX;
                    loop {
                        let quiet = (Instant::now() + DEBOUNCE_QUIET).min(deadline);
                        tokio::select! {
                            _ = token.cancelled() => return,
                            more = tokio::time::timeout_at(quiet, next_events(&mut watcher, &mut buf)) => match more {
                                Ok(Ok(more)) => events.extend(more),
                                Ok(Err(e)) => {
                                    tracing::warn!(error = %e, "error reading inotify events");
                                    break;
                                }
                                Err(_elapsed) => break,
                            },
                        }
                    }
                    if let Some(w) = watcher.as_mut() {
                        let (full, files) = w.classify(events, &path);
                        relist = full;
                        changed = files;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "error reading inotify events, restarting the watch");
                    watcher = Watcher::new().ok();
                    relist = true;
                }
            },
        }
    }
    tracing::debug!(path = %path.display(), "file source stopped");
}

#[cfg(test)]
mod tests {
    use super::super::{PodConfig, CONFIG_FIRST_SEEN_ANNOTATION};
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

    /// A fresh, empty directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!(
                "rkubelet-file-source-{}-{name}-{n}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn manifest(name: &str, image: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: {image}\n"
        )
    }

    fn names(pods: &[Pod]) -> Vec<String> {
        pods.iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn relist_reads_good_files_skips_garbage_hidden_and_subdirs() {
        let dir = TempDir::new("relist");
        std::fs::write(dir.0.join("a.yaml"), manifest("a", "nginx")).unwrap();
        std::fs::write(
            dir.0.join("b.json"),
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"b"},"spec":{"containers":[{"name":"c","image":"x"}]}}"#,
        )
        .unwrap();
        std::fs::write(dir.0.join("broken.yaml"), "{{{ not yaml").unwrap();
        std::fs::write(dir.0.join(".hidden.yaml"), manifest("hidden", "x")).unwrap();
        std::fs::create_dir(dir.0.join("sub")).unwrap();
        std::fs::write(dir.0.join("sub/c.yaml"), manifest("c", "x")).unwrap();

        let mut scanner = Scanner::new(dir.0.clone(), "node".to_string());
        scanner.relist();
        let pods = scanner.pods();
        assert_eq!(names(&pods), vec!["a-node", "b-node"]);

        // An unchanged rescan decodes nothing again: the config.seen times stay.
        std::thread::sleep(Duration::from_millis(5));
        scanner.relist();
        assert_eq!(scanner.pods(), pods);
        assert_eq!(
            scanner.pods()[0].metadata.annotations.as_ref().unwrap()[CONFIG_FIRST_SEEN_ANNOTATION],
            pods[0].metadata.annotations.as_ref().unwrap()[CONFIG_FIRST_SEEN_ANNOTATION]
        );
    }

    #[test]
    fn broken_file_keeps_last_good_on_event_and_drops_on_relist() {
        let dir = TempDir::new("broken");
        let file = dir.0.join("a.yaml");
        std::fs::write(&file, manifest("a", "nginx")).unwrap();
        let mut scanner = Scanner::new(dir.0.clone(), "node".to_string());
        scanner.relist();
        let good = scanner.pods();
        assert_eq!(good.len(), 1);

        std::fs::write(&file, "garbage: [").unwrap();
        scanner.refresh(&file);
        assert_eq!(
            scanner.pods(),
            good,
            "a watch event keeps the last good pod"
        );
        scanner.relist();
        assert!(scanner.pods().is_empty(), "a relist drops the broken file");

        std::fs::write(&file, manifest("a", "nginx")).unwrap();
        scanner.refresh(&file);
        assert_eq!(names(&scanner.pods()), vec!["a-node"]);
        std::fs::remove_file(&file).unwrap();
        scanner.refresh(&file);
        assert!(scanner.pods().is_empty());
    }

    #[test]
    fn single_file_path_and_missing_path() {
        let dir = TempDir::new("single");
        let file = dir.0.join("only.yaml");
        let mut scanner = Scanner::new(file.clone(), "node".to_string());
        scanner.relist();
        assert!(scanner.pods().is_empty());
        std::fs::write(&file, manifest("only", "nginx")).unwrap();
        scanner.relist();
        assert_eq!(names(&scanner.pods()), vec!["only-node"]);
        // Upstream keeps the last good pod of a single-file path that breaks.
        std::fs::write(&file, "garbage: [").unwrap();
        scanner.relist();
        assert_eq!(names(&scanner.pods()), vec!["only-node"]);
        std::fs::remove_file(&file).unwrap();
        scanner.relist();
        assert!(scanner.pods().is_empty());
    }

    async fn recv(rx: &mut mpsc::Receiver<PodUpdate>) -> PodUpdate {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("timed out waiting for a pod update")
            .expect("channel closed")
    }

    /// Long enough that only inotify can explain a prompt reaction.
    const NO_RESCAN: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn sends_sets_on_start_create_edit_and_remove() {
        let dir = TempDir::new("watch");
        std::fs::write(dir.0.join("a.yaml"), manifest("a", "nginx")).unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let token = CancellationToken::new();
        let task = spawn_file_source(
            dir.0.clone(),
            "node".into(),
            NO_RESCAN,
            tx,
            token.clone(),
            Takeover::default(),
        );

        let first = recv(&mut rx).await;
        assert_eq!(
            (first.op, first.source.as_str()),
            (PodOperation::Set, FILE_SOURCE)
        );
        assert_eq!(names(&first.pods), vec!["a-node"]);

        std::fs::write(dir.0.join("b.yaml"), manifest("b", "busybox")).unwrap();
        let second = recv(&mut rx).await;
        assert_eq!(names(&second.pods), vec!["a-node", "b-node"]);

        // Editing changes the content hash, hence the UID.
        std::fs::write(dir.0.join("b.yaml"), manifest("b", "busybox:1.36")).unwrap();
        let third = recv(&mut rx).await;
        assert_eq!(names(&third.pods), vec!["a-node", "b-node"]);
        assert_ne!(pod_uid(&third.pods[1]), pod_uid(&second.pods[1]));
        assert_eq!(third.pods[0], second.pods[0]);

        // A broken edit is logged and the last good pod stays; hidden files are ignored.
        std::fs::write(dir.0.join(".swap"), "junk").unwrap();
        std::fs::write(dir.0.join("a.yaml"), "not: [valid").unwrap();
        std::fs::remove_file(dir.0.join("b.yaml")).unwrap();
        let fourth = recv(&mut rx).await;
        assert_eq!(names(&fourth.pods), vec!["a-node"]);
        assert_eq!(fourth.pods[0], first.pods[0]);

        std::fs::remove_file(dir.0.join("a.yaml")).unwrap();
        let fifth = recv(&mut rx).await;
        assert!(fifth.pods.is_empty());

        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("file source did not stop")
            .unwrap();
    }

    #[tokio::test]
    async fn file_source_through_pod_config_gives_add_update_remove() {
        let dir = TempDir::new("merge");
        let file = dir.0.join("web.yaml");
        let with_uid = |image: &str| {
            manifest("web", image).replace("  name: web\n", "  name: web\n  uid: web-uid\n")
        };
        let (out_tx, mut out) = mpsc::channel(16);
        let config = PodConfig::new(out_tx);
        let token = CancellationToken::new();
        let task = spawn_file_source(
            dir.0.clone(),
            "node".into(),
            NO_RESCAN,
            config.channel(FILE_SOURCE),
            token.clone(),
            Takeover::default(),
        );

        // The empty directory still reports, so the source counts as seen.
        let ready = recv(&mut out).await;
        assert_eq!((ready.op, ready.pods.len()), (PodOperation::Add, 0));

        std::fs::write(&file, with_uid("nginx:1.25")).unwrap();
        let add = recv(&mut out).await;
        assert_eq!(
            (add.op, names(&add.pods)),
            (PodOperation::Add, vec!["web-node".to_string()])
        );
        assert!(config.seen_all_sources(&[FILE_SOURCE]));

        std::fs::write(&file, with_uid("nginx:1.26")).unwrap();
        let update = recv(&mut out).await;
        assert_eq!(update.op, PodOperation::Update);
        assert_eq!(
            update.pods[0].spec.as_ref().unwrap().containers[0]
                .image
                .as_deref(),
            Some("nginx:1.26")
        );
        // The merger keeps the first-seen time across the update.
        let seen = |p: &Pod| {
            p.metadata.annotations.as_ref().unwrap()[CONFIG_FIRST_SEEN_ANNOTATION].clone()
        };
        assert_eq!(seen(&update.pods[0]), seen(&add.pods[0]));

        std::fs::remove_file(&file).unwrap();
        let remove = recv(&mut out).await;
        assert_eq!(
            (remove.op, pod_uid(&remove.pods[0])),
            (PodOperation::Remove, "web-uid")
        );

        token.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn missing_directory_reports_empty_then_picks_up_its_creation() {
        let parent = TempDir::new("late");
        let dir = parent.0.join("manifests");
        let (tx, mut rx) = mpsc::channel(16);
        let token = CancellationToken::new();
        let task = spawn_file_source(
            dir.clone(),
            "node".into(),
            NO_RESCAN,
            tx,
            token.clone(),
            Takeover::default(),
        );
        assert!(recv(&mut rx).await.pods.is_empty());

        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("a.yaml"), manifest("a", "nginx")).unwrap();
        let found = recv(&mut rx).await;
        assert_eq!(names(&found.pods), vec!["a-node"]);

        // Removing the whole directory empties the set; recreating it is seen again.
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(recv(&mut rx).await.pods.is_empty());
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("b.yaml"), manifest("b", "nginx")).unwrap();
        assert_eq!(names(&recv(&mut rx).await.pods), vec!["b-node"]);

        token.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn watches_a_single_file_replaced_by_rename() {
        let dir = TempDir::new("rename");
        let file = dir.0.join("pod.yaml");
        std::fs::write(&file, manifest("p", "nginx:1")).unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let token = CancellationToken::new();
        let task = spawn_file_source(
            file.clone(),
            "node".into(),
            NO_RESCAN,
            tx,
            token.clone(),
            Takeover::default(),
        );
        let first = recv(&mut rx).await;
        assert_eq!(names(&first.pods), vec!["p-node"]);

        // Editors write a temp file and rename it over the original; other files do not count.
        std::fs::write(dir.0.join("other.yaml"), manifest("other", "x")).unwrap();
        let tmp = dir.0.join(".pod.yaml.tmp");
        std::fs::write(&tmp, manifest("p", "nginx:2")).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        let second = recv(&mut rx).await;
        assert_eq!(names(&second.pods), vec!["p-node"]);
        assert_eq!(
            second.pods[0].spec.as_ref().unwrap().containers[0]
                .image
                .as_deref(),
            Some("nginx:2")
        );

        token.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn periodic_rescan_without_events() {
        let dir = TempDir::new("period");
        let (tx, mut rx) = mpsc::channel(16);
        let token = CancellationToken::new();
        // Without inotify, only the periodic rescan can find the files.
        let task = tokio::spawn(run(
            dir.0.clone(),
            "node".into(),
            Duration::from_millis(100),
            tx,
            token.clone(),
            false,
            Takeover::default(),
        ));
        assert!(recv(&mut rx).await.pods.is_empty());
        // A broken file that a relist sees is simply absent from the set.
        std::fs::write(dir.0.join("bad.yaml"), "nope: [").unwrap();
        std::fs::write(dir.0.join("good.yaml"), manifest("good", "x")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let update = recv(&mut rx).await;
            if names(&update.pods) == vec!["good-node"] {
                break;
            }
            assert!(Instant::now() < deadline, "never saw the good pod");
        }
        token.cancel();
        task.await.unwrap();
    }
}
