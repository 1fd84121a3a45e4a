//! Atomic projection of a set of files into a directory (upstream
//! `pkg/volume/util/atomic_writer.go`), for configMap, secret, downwardAPI
//! and projected volumes.
//!
//! The real files live in a hidden timestamped directory; `..data` is a
//! symlink to it and every user-visible top-level name is a symlink through
//! `..data`. An update writes a fresh timestamped directory and renames a
//! new `..data_tmp` symlink over `..data`, so a reader sees either the whole
//! old payload or the whole new one, and can watch `..data` for changes.
//! Names starting with `..` at the top level are reserved for the writer.
//!
//! Everything here is blocking file-system work: call it on a blocking
//! thread. The writer assumes a single caller per target directory at a time,
//! as upstream.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::{self, DirBuilder, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use super::payload::Payload;

const MAX_FILE_NAME_LENGTH: usize = 255;
const MAX_PATH_LENGTH: usize = 4096;
const DATA_DIR_NAME: &str = "..data";
const NEW_DATA_DIR_NAME: &str = "..data_tmp";

#[derive(Debug, thiserror::Error)]
pub enum AtomicWriteError {
    /// Upstream validatePath's messages, e.g. `invalid path: must not
    /// contain '..': a/../b`.
    #[error("invalid path: {0}")]
    InvalidPath(String),
    #[error("target directory {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> AtomicWriteError + '_ {
    move |source| AtomicWriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Projects `payload` into `target_dir`, which must already exist (the
/// volume's directory, made by the caller). Returns whether anything on disk
/// changed: false when `..data` already holds exactly these files with these
/// bytes and modes.
pub fn write(target_dir: &Path, payload: &Payload) -> Result<bool, AtomicWriteError> {
    let files = validate_payload(payload)?;
    let meta = fs::symlink_metadata(target_dir).map_err(io_err(target_dir))?;
    if !meta.is_dir() {
        return Err(AtomicWriteError::NotADirectory(target_dir.to_path_buf()));
    }

    let data_dir = target_dir.join(DATA_DIR_NAME);
    let old_ts = current_ts_dir(target_dir)?;

    let mut stale = Vec::new();
    let mut should_write = true;
    if let Some(old) = &old_ts {
        let old_path = target_dir.join(old);
        stale = stale_paths(&files, &old_path)?;
        should_write = payload_differs(&files, &old_path)?;
    }

    if should_write || !stale.is_empty() {
        let ts_dir = new_ts_dir(target_dir)?;
        let swapped = write_files(&files, &ts_dir).and_then(|()| {
            let tmp = target_dir.join(NEW_DATA_DIR_NAME);
            // A crash between creating and renaming `..data_tmp` leaves it
            // behind; it is always ours, so replace it.
            if fs::symlink_metadata(&tmp).is_ok_and(|m| m.file_type().is_symlink()) {
                fs::remove_file(&tmp).map_err(io_err(&tmp))?;
            }
            let ts_name = ts_dir.file_name().unwrap_or_default();
            std::os::unix::fs::symlink(ts_name, &tmp).map_err(io_err(&tmp))?;
            fs::rename(&tmp, &data_dir).map_err(|e| {
                let _ = fs::remove_file(&tmp);
                io_err(&data_dir)(e)
            })
        });
        if let Err(e) = swapped {
            let _ = fs::remove_dir_all(&ts_dir);
            return Err(e);
        }
    }

    // Done even when nothing was rewritten: a restart after the swap but
    // before this step would otherwise leave new names invisible for good
    // (upstream issue 121472).
    create_user_visible(&files, target_dir)?;

    if should_write || !stale.is_empty() {
        remove_user_visible(&stale, target_dir)?;
        if let Some(old) = old_ts {
            let old_path = target_dir.join(old);
            if fs::symlink_metadata(&old_path).is_ok_and(|m| m.is_dir()) {
                fs::remove_dir_all(&old_path).map_err(io_err(&old_path))?;
            }
        }
        return Ok(true);
    }
    Ok(false)
}

/// Checks every path as upstream validatePath does and cleans it (`a//b`,
/// `./a` → `a/b`, `a`); returns the files keyed by their cleaned paths.
fn validate_payload(
    payload: &Payload,
) -> Result<Vec<(PathBuf, &super::payload::FileProjection)>, AtomicWriteError> {
    let mut out = Vec::with_capacity(payload.len());
    for (p, f) in payload {
        out.push((validate_path(p)?, f));
    }
    Ok(out)
}

fn validate_path(p: &str) -> Result<PathBuf, AtomicWriteError> {
    let bad = |m: String| Err(AtomicWriteError::InvalidPath(m));
    if p.is_empty() {
        return bad(format!("must not be empty: {p:?}"));
    }
    if p.starts_with('/') {
        return bad(format!("must be relative path: {p}"));
    }
    if p.len() > MAX_PATH_LENGTH {
        return bad(format!(
            "must be less than or equal to {MAX_PATH_LENGTH} characters"
        ));
    }
    for item in p.split('/') {
        if item == ".." {
            return bad(format!("must not contain '..': {p}"));
        }
        if item.len() > MAX_FILE_NAME_LENGTH {
            return bad(format!(
                "filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters"
            ));
        }
    }
    // Only the first element matters: the reserved `..data` and timestamped
    // names live at the top level, and the API accepts `a/..b`.
    let first = p.split('/').next().unwrap_or_default();
    if first.starts_with("..") && first.len() > 2 {
        return bad(format!("must not start with '..': {p}"));
    }
    let clean: PathBuf = Path::new(p)
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    if clean.as_os_str().is_empty() {
        return bad(format!("must not be empty: {p:?}"));
    }
    Ok(clean)
}

/// The basename `..data` points at, if it is one of ours: a symlink to a
/// `..`-prefixed sibling. Anything else is not followed or deleted; the
/// rename will replace the link itself.
fn current_ts_dir(target_dir: &Path) -> Result<Option<OsString>, AtomicWriteError> {
    let data_dir = target_dir.join(DATA_DIR_NAME);
    let link = match fs::read_link(&data_dir) {
        Ok(l) => l,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(&data_dir)(e)),
    };
    let mut comps = link.components();
    let ours = match (comps.next(), comps.next()) {
        (Some(Component::Normal(name)), None) => {
            let s = name.to_string_lossy();
            s.starts_with("..") && s != DATA_DIR_NAME && s != NEW_DATA_DIR_NAME
        }
        _ => false,
    };
    Ok(ours.then(|| link.into_os_string()))
}

/// Relative paths present in the old data directory that the payload no
/// longer has (neither as a file nor as a parent directory of one).
fn stale_paths(
    files: &[(PathBuf, &super::payload::FileProjection)],
    old_dir: &Path,
) -> Result<Vec<PathBuf>, AtomicWriteError> {
    let mut wanted = BTreeSet::new();
    for (p, _) in files {
        wanted.extend(p.ancestors().filter(|a| !a.as_os_str().is_empty()));
    }
    let mut present = Vec::new();
    walk(old_dir, Path::new(""), &mut present)?;
    Ok(present
        .into_iter()
        .filter(|p| !wanted.contains(p.as_path()))
        .collect())
}

/// Every entry under `dir` as a path relative to it, not entering symlinks.
fn walk(dir: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<(), AtomicWriteError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_err(dir))?;
        let kind = entry.file_type().map_err(io_err(&entry.path()))?;
        let rel = rel.join(entry.file_name());
        if kind.is_dir() {
            walk(&entry.path(), &rel, out)?;
        }
        out.push(rel);
    }
    Ok(())
}

/// Whether any file of the payload is missing from `old_dir` or differs in
/// bytes or mode. Anything that isn't a plain file reached through plain
/// directories counts as different, so nothing is read through a symlink.
fn payload_differs(
    files: &[(PathBuf, &super::payload::FileProjection)],
    old_dir: &Path,
) -> Result<bool, AtomicWriteError> {
    for (rel, f) in files {
        let path = old_dir.join(rel);
        let mut plain = true;
        let mut at = old_dir.to_path_buf();
        let comps: Vec<_> = rel.components().collect();
        for (i, c) in comps.iter().enumerate() {
            at.push(c);
            let meta = match fs::symlink_metadata(&at) {
                Ok(m) => m,
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(true),
                Err(e) => return Err(io_err(&at)(e)),
            };
            let last = i + 1 == comps.len();
            if (last && !meta.is_file()) || (!last && !meta.is_dir()) {
                plain = false;
                break;
            }
            if last
                && (meta.permissions().mode() & 0o7777 != f.mode & 0o7777
                    || meta.len() != f.data.len() as u64)
            {
                return Ok(true);
            }
        }
        if !plain {
            return Ok(true);
        }
        let mut on_disk = Vec::with_capacity(f.data.len());
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|mut file| file.read_to_end(&mut on_disk))
            .map_err(io_err(&path))?;
        if on_disk != f.data {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Makes `..<UTC time>.<random>` in `target_dir` with mode 0755, like Go's
/// os.MkdirTemp with upstream's prefix.
fn new_ts_dir(target_dir: &Path) -> Result<PathBuf, AtomicWriteError> {
    let now = crate::kuberuntime::wall_now();
    let stamp = k8s_openapi::jiff::Timestamp::from_second(now.as_secs() as i64)
        .map(|t| t.strftime("%Y_%m_%d_%H_%M_%S").to_string())
        .unwrap_or_else(|_| "1970_01_01_00_00_00".into());
    // RandomState is seeded randomly per process and differs per instance:
    // enough to make collisions with a concurrent name unlikely; a collision
    // is retried anyway.
    let state = std::collections::hash_map::RandomState::new();
    for attempt in 0u32..10_000 {
        let mut h = state.build_hasher();
        h.write_u128(now.as_nanos());
        h.write_u32(attempt);
        let name = format!("..{stamp}.{}", h.finish() as u32);
        let dir = target_dir.join(name);
        match fs::create_dir(&dir) {
            Ok(()) => {
                // Explicit chmod: group and other must be able to traverse
                // whatever the kubelet's umask is.
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
                    .map_err(io_err(&dir))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err(&dir)(e)),
        }
    }
    Err(io_err(target_dir)(std::io::Error::new(
        ErrorKind::AlreadyExists,
        "no free name for a new data directory",
    )))
}

fn write_files(
    files: &[(PathBuf, &super::payload::FileProjection)],
    dir: &Path,
) -> Result<(), AtomicWriteError> {
    for (rel, f) in files {
        let full = dir.join(rel);
        let mut at = dir.to_path_buf();
        for c in rel.parent().into_iter().flat_map(|p| p.components()) {
            at.push(c);
            match DirBuilder::new().mode(0o755).create(&at) {
                Ok(()) => fs::set_permissions(&at, fs::Permissions::from_mode(0o755))
                    .map_err(io_err(&at))?,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(&at)(e)),
            }
        }
        let mode = f.mode & 0o7777;
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&full)
            .map_err(io_err(&full))?;
        file.write_all(&f.data).map_err(io_err(&full))?;
        // open(2) applied the umask; the payload's mode is what counts.
        fs::set_permissions(&full, fs::Permissions::from_mode(mode)).map_err(io_err(&full))?;
    }
    Ok(())
}

/// `<name> -> ..data/<name>` for each new first path element; an existing
/// entry of that name is left as it is.
fn create_user_visible(
    files: &[(PathBuf, &super::payload::FileProjection)],
    target_dir: &Path,
) -> Result<(), AtomicWriteError> {
    let firsts: BTreeSet<_> = files
        .iter()
        .filter_map(|(p, _)| p.components().next())
        .collect();
    for first in firsts {
        let visible = target_dir.join(first);
        match fs::symlink_metadata(&visible) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                std::os::unix::fs::symlink(Path::new(DATA_DIR_NAME).join(first), &visible)
                    .map_err(io_err(&visible))?
            }
            Err(e) => return Err(io_err(&visible)(e)),
        }
    }
    Ok(())
}

/// Removes the top-level names that left the payload, but only where the
/// entry is still the symlink this writer made for it.
fn remove_user_visible(stale: &[PathBuf], target_dir: &Path) -> Result<(), AtomicWriteError> {
    for rel in stale {
        let mut comps = rel.components();
        let (Some(Component::Normal(name)), None) = (comps.next(), comps.next()) else {
            continue;
        };
        let visible = target_dir.join(name);
        let ours = fs::read_link(&visible).is_ok_and(|l| l == Path::new(DATA_DIR_NAME).join(name));
        if ours {
            match fs::remove_file(&visible) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&visible)(e)),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::payload::FileProjection;

    /// A scratch directory removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let p =
                std::env::temp_dir().join(format!("rkubelet-atomic-{}-{name}", std::process::id()));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            Scratch(p)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(p, d, m)| {
                (
                    p.to_string(),
                    FileProjection {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    fn ts_dirs(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != DATA_DIR_NAME)
            .collect();
        v.sort();
        v
    }

    fn data_link(dir: &Path) -> PathBuf {
        fs::read_link(dir.join(DATA_DIR_NAME)).unwrap()
    }

    #[test]
    fn first_write_links_names_through_data_to_a_timestamped_dir() {
        let s = Scratch::new("first");
        let changed = write(&s.0, &payload(&[("a", "1", 0o644), ("b", "2", 0o644)])).unwrap();
        assert!(changed);
        assert_eq!(fs::read_to_string(s.0.join("a")).unwrap(), "1");
        assert_eq!(fs::read_link(s.0.join("b")).unwrap(), Path::new("..data/b"));
        let ts = ts_dirs(&s.0);
        assert_eq!(ts.len(), 1, "{ts:?}");
        assert_eq!(data_link(&s.0), Path::new(&ts[0]));
        // ..YYYY_MM_DD_HH_MM_SS.<random>
        let name = &ts[0];
        assert_eq!(&name[6..7], "_", "{name}");
        assert_eq!(&name[21..22], ".", "{name}");
        assert!(name[2..21].chars().all(|c| c.is_ascii_digit() || c == '_'));
        assert!(!s.0.join(NEW_DATA_DIR_NAME).exists());
        let mode = fs::metadata(s.0.join(name)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
    }

    #[test]
    fn an_identical_payload_is_a_no_op() {
        let s = Scratch::new("noop");
        let p = payload(&[("a", "1", 0o644), ("d/e", "2", 0o600)]);
        assert!(write(&s.0, &p).unwrap());
        let before = data_link(&s.0);
        assert!(!write(&s.0, &p).unwrap());
        assert_eq!(data_link(&s.0), before);
        assert_eq!(ts_dirs(&s.0).len(), 1);
    }

    #[test]
    fn a_missing_visible_link_is_restored_without_a_rewrite() {
        let s = Scratch::new("relink");
        let p = payload(&[("a", "1", 0o644)]);
        write(&s.0, &p).unwrap();
        fs::remove_file(s.0.join("a")).unwrap();
        assert!(!write(&s.0, &p).unwrap());
        assert_eq!(fs::read_to_string(s.0.join("a")).unwrap(), "1");
    }

    #[test]
    fn an_update_swaps_contents_and_drops_vanished_names() {
        let s = Scratch::new("update");
        write(
            &s.0,
            &payload(&[("a", "1", 0o644), ("gone", "x", 0o644), ("d/x", "y", 0o644)]),
        )
        .unwrap();
        let old = data_link(&s.0);
        let changed = write(&s.0, &payload(&[("a", "2", 0o644), ("new", "n", 0o644)])).unwrap();
        assert!(changed);
        assert_ne!(data_link(&s.0), old);
        assert_eq!(fs::read_to_string(s.0.join("a")).unwrap(), "2");
        assert_eq!(fs::read_to_string(s.0.join("new")).unwrap(), "n");
        assert!(fs::symlink_metadata(s.0.join("gone")).is_err());
        assert!(fs::symlink_metadata(s.0.join("d")).is_err());
        assert!(!s.0.join(&old).exists(), "old data dir removed");
        assert_eq!(ts_dirs(&s.0).len(), 1);
    }

    #[test]
    fn a_removed_nested_file_alone_forces_a_rewrite() {
        let s = Scratch::new("nested-rm");
        write(&s.0, &payload(&[("d/a", "1", 0o644), ("d/b", "2", 0o644)])).unwrap();
        assert!(write(&s.0, &payload(&[("d/a", "1", 0o644)])).unwrap());
        assert!(s.0.join("d/a").exists());
        assert!(!s.0.join("d/b").exists());
    }

    #[test]
    fn nested_paths_are_reached_through_the_first_element() {
        let s = Scratch::new("nested");
        write(
            &s.0,
            &payload(&[("a/b/c", "deep", 0o644), ("a//b/./d", "d", 0o644)]),
        )
        .unwrap();
        assert_eq!(fs::read_link(s.0.join("a")).unwrap(), Path::new("..data/a"));
        assert_eq!(fs::read_to_string(s.0.join("a/b/c")).unwrap(), "deep");
        assert_eq!(fs::read_to_string(s.0.join("a/b/d")).unwrap(), "d");
        assert!(fs::symlink_metadata(s.0.join("a/b/c"))
            .unwrap()
            .file_type()
            .is_file());
    }

    #[test]
    fn modes_are_applied_and_a_mode_change_rewrites() {
        let s = Scratch::new("modes");
        write(&s.0, &payload(&[("r", "1", 0o400), ("x", "2", 0o755)])).unwrap();
        let mode = |n: &str| fs::metadata(s.0.join(n)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode("r"), 0o400);
        assert_eq!(mode("x"), 0o755);
        assert!(write(&s.0, &payload(&[("r", "1", 0o440), ("x", "2", 0o755)])).unwrap());
        assert_eq!(mode("r"), 0o440);
    }

    #[test]
    fn bad_paths_are_rejected_before_anything_is_written() {
        let s = Scratch::new("bad");
        let long_name = "n".repeat(256);
        let long_path = "a/".repeat(2049);
        for bad in [
            "",
            ".",
            "/abs",
            "..",
            "../x",
            "a/../b",
            "a/..",
            "..data",
            "..foo/x",
            "...",
            long_name.as_str(),
            long_path.as_str(),
        ] {
            let err = write(&s.0, &payload(&[("ok", "1", 0o644), (bad, "x", 0o644)]));
            assert!(
                matches!(err, Err(AtomicWriteError::InvalidPath(_))),
                "{bad:?}: {err:?}"
            );
        }
        assert_eq!(fs::read_dir(&s.0).unwrap().count(), 0);
        // Only the first element is reserved, as upstream.
        assert!(write(&s.0, &payload(&[("a/..b", "1", 0o644)])).unwrap());
    }

    #[test]
    fn foreign_entries_are_neither_followed_nor_removed() {
        let s = Scratch::new("foreign");
        let outside = Scratch::new("foreign-outside");
        fs::write(outside.0.join("keep"), "k").unwrap();
        // ..data pointing out of the volume: replaced, never read or deleted.
        std::os::unix::fs::symlink(&outside.0, s.0.join(DATA_DIR_NAME)).unwrap();
        assert!(write(&s.0, &payload(&[("a", "1", 0o644), ("b", "2", 0o644)])).unwrap());
        assert!(outside.0.join("keep").exists());
        assert_eq!(fs::read_to_string(s.0.join("a")).unwrap(), "1");
        // A visible name that is no longer our symlink stays when dropped.
        fs::remove_file(s.0.join("b")).unwrap();
        fs::write(s.0.join("b"), "mine").unwrap();
        assert!(write(&s.0, &payload(&[("a", "1", 0o644)])).unwrap());
        assert_eq!(fs::read_to_string(s.0.join("b")).unwrap(), "mine");
    }

    #[test]
    fn a_missing_or_non_directory_target_is_an_error() {
        let s = Scratch::new("target");
        let p = payload(&[("a", "1", 0o644)]);
        assert!(matches!(
            write(&s.0.join("nope"), &p),
            Err(AtomicWriteError::Io { .. })
        ));
        fs::write(s.0.join("file"), "").unwrap();
        assert!(matches!(
            write(&s.0.join("file"), &p),
            Err(AtomicWriteError::NotADirectory(_))
        ));
    }
}
