//! subPath mounts that cannot leave their volume, and pod-directory removal
//! that cannot leave the pod directory (upstream
//! `pkg/volume/util/subpath/subpath_linux.go`, `pkg/kubelet/kubelet_volumes.go`).
//!
//! A container can write into its volume, so by the time a subPath is
//! mounted a component of it may be a symlink to anywhere on the host.
//! Joining strings and handing the path to the runtime would let the
//! runtime follow it. Instead each component is opened relative to the one
//! before with `O_NOFOLLOW`, and the opened file itself (through
//! `/proc/self/fd`) is bind-mounted onto a directory rkubelet owns; that
//! mount is what the runtime gets.
//!
//! These are blocking system calls: callers run them off the async threads.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SubPathError {
    #[error("subPath {sub_path:?} must be a relative path without \"..\"")]
    Invalid { sub_path: String },
    #[error("subPath {sub_path:?} escapes its volume: {component:?} is a symbolic link")]
    Symlink { sub_path: String, component: String },
    #[error("subPath {sub_path:?}: {component:?} is not a directory")]
    NotDirectory { sub_path: String, component: String },
    #[error("subPath {sub_path:?}: {what}: {source}")]
    Io {
        sub_path: String,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing to remove {path}: a mount is still there")]
    MountedInside { path: PathBuf },
}

fn cstr(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))
}

fn check_fd(fd: libc::c_int) -> std::io::Result<OwnedFd> {
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor the kernel just returned; we own it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_path(dir: Option<&OwnedFd>, name: &Path, follow: bool) -> std::io::Result<OwnedFd> {
    let c = cstr(name)?;
    let mut flags = libc::O_PATH | libc::O_CLOEXEC;
    if !follow {
        flags |= libc::O_NOFOLLOW;
    }
    let at = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: valid NUL-terminated path and a live directory descriptor.
    check_fd(unsafe { libc::openat(at, c.as_ptr(), flags) })
}

fn fstat_mode(fd: &OwnedFd) -> std::io::Result<libc::mode_t> {
    // SAFETY: `st` is plain data the kernel fills in.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let at = c"";
    // SAFETY: AT_EMPTY_PATH stats the descriptor itself.
    let r = unsafe { libc::fstatat(fd.as_raw_fd(), at.as_ptr(), &mut st, libc::AT_EMPTY_PATH) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.st_mode & libc::S_IFMT)
}

/// Checks a subPath (or an expanded subPathExpr) as upstream's validation
/// does: relative, and no `..` component.
pub fn validate(sub_path: &str) -> Result<&Path, SubPathError> {
    let rel = Path::new(sub_path);
    if sub_path.is_empty()
        || rel.is_absolute()
        || rel.components().any(|c| matches!(c, Component::ParentDir))
    {
        return Err(SubPathError::Invalid {
            sub_path: sub_path.into(),
        });
    }
    Ok(rel)
}

/// Opens `sub_path` inside `volume_root` without following any symlink in
/// it (creating missing directories, as upstream does), and bind-mounts
/// what it opened onto `target`. Returns `target`, the path to give CRI.
pub fn bind_subpath(
    volume_root: &Path,
    sub_path: &str,
    target: &Path,
) -> Result<PathBuf, SubPathError> {
    let rel = validate(sub_path)?;
    let io = |what: String| {
        let sub_path = sub_path.to_string();
        move |source| SubPathError::Io {
            sub_path,
            what,
            source,
        }
    };
    // The volume root itself is rkubelet's (emptyDir) or the admin's
    // (hostPath): it may be reached through links; what is below may not.
    let mut cur = open_path(None, volume_root, true)
        .map_err(io(format!("open volume {}", volume_root.display())))?;
    // Links that stay inside the volume are followed, as upstream's
    // EvalSymlinks-then-check does (a configMap's `key -> ..data/key`);
    // the kernel refuses any resolution that leaves it (RESOLVE_BENEATH:
    // absolute links, `..` above the root, /proc magic links).
    match open_beneath(&cur, rel) {
        Ok(fd) => return bind_fd(fd, sub_path, target),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EXDEV) | Some(libc::ELOOP)) => {
            return Err(SubPathError::Symlink {
                sub_path: sub_path.into(),
                component: sub_path.into(),
            })
        }
        // Missing parts are created below, one component at a time.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => return Err(io("open".into())(e)),
    }
    let parts: Vec<_> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p),
            _ => None,
        })
        .collect();
    for (i, part) in parts.iter().enumerate() {
        let name = Path::new(part);
        let shown = || {
            parts[..=i]
                .iter()
                .map(|p| p.to_string_lossy())
                .collect::<Vec<_>>()
                .join("/")
        };
        let next = match open_path(Some(&cur), name, false) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let c = cstr(name).map_err(io(shown()))?;
                // SAFETY: a live directory descriptor and a NUL-terminated name.
                let r = unsafe { libc::mkdirat(cur.as_raw_fd(), c.as_ptr(), 0o755) };
                if r < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::EEXIST) {
                        return Err(io(format!("create {}", shown()))(e));
                    }
                }
                open_path(Some(&cur), name, false).map_err(io(shown()))?
            }
            Err(e) => return Err(io(shown())(e)),
        };
        let mode = fstat_mode(&next).map_err(io(shown()))?;
        if mode == libc::S_IFLNK {
            return Err(SubPathError::Symlink {
                sub_path: sub_path.into(),
                component: shown(),
            });
        }
        if i + 1 < parts.len() && mode != libc::S_IFDIR {
            return Err(SubPathError::NotDirectory {
                sub_path: sub_path.into(),
                component: shown(),
            });
        }
        cur = next;
    }
    bind_fd(cur, sub_path, target)
}

/// openat2 with RESOLVE_BENEATH: `rel` resolved inside `root` or not at all.
fn open_beneath(root: &OwnedFd, rel: &Path) -> std::io::Result<OwnedFd> {
    let c = cstr(rel)?;
    // SAFETY: plain data; zeroed is a valid open_how.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: a live descriptor, a NUL-terminated path and a valid open_how
    // of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    check_fd(fd as libc::c_int)
}

/// Bind-mounts what `cur` opened onto `target` (through /proc/self/fd, so
/// no path is resolved again).
fn bind_fd(cur: OwnedFd, sub_path: &str, target: &Path) -> Result<PathBuf, SubPathError> {
    let io = |what: String| {
        let sub_path = sub_path.to_string();
        move |source| SubPathError::Io {
            sub_path,
            what,
            source,
        }
    };
    let is_dir = fstat_mode(&cur).map_err(io("stat".into()))? == libc::S_IFDIR;
    // A mount left by an earlier start of the container goes: the subPath
    // is resolved afresh each time.
    unmount(target);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(io(format!("create {}", parent.display())))?;
    }
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() == is_dir && !m.file_type().is_symlink() => {}
        Ok(m) => {
            let r = if m.is_dir() {
                std::fs::remove_dir(target)
            } else {
                std::fs::remove_file(target)
            };
            r.map_err(io(format!("replace {}", target.display())))?;
            make_target(target, is_dir).map_err(io(format!("create {}", target.display())))?;
        }
        Err(_) => {
            make_target(target, is_dir).map_err(io(format!("create {}", target.display())))?
        }
    }
    let src = cstr(Path::new(&format!("/proc/self/fd/{}", cur.as_raw_fd())))
        .map_err(io("source".into()))?;
    let dst = cstr(target).map_err(io("target".into()))?;
    // SAFETY: NUL-terminated paths; a bind mount takes no fs type or data.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if r < 0 {
        return Err(io(format!("bind onto {}", target.display()))(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(target.to_path_buf())
}

fn make_target(target: &Path, is_dir: bool) -> std::io::Result<()> {
    if is_dir {
        std::fs::create_dir(target)
    } else {
        std::fs::File::create(target).map(drop)
    }
}

/// Detaches whatever is mounted on `path` (nothing happens if nothing is).
fn unmount(path: &Path) {
    if let Ok(c) = cstr(path) {
        // SAFETY: a NUL-terminated path.
        unsafe {
            libc::umount2(c.as_ptr(), libc::MNT_DETACH);
        }
    }
}

/// Detaches every mount at or below `dir`, deepest first; the count. For
/// test and benchmark harnesses that drop a kubelet's whole root directory
/// after killing it (its pods' tmpfs and bind mounts would stay on the host).
pub fn detach_all_below(dir: &Path) -> usize {
    let found = mounts_below(dir);
    for m in &found {
        unmount(m);
    }
    found.len()
}

/// Mount points at or below `dir`, deepest first (from /proc/self/mountinfo).
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(crate::stats::procfs::unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Removes `dir` and everything in it: first every mount below it is
/// detached (subPath binds), then the tree is removed without following a
/// symlink and without entering another file system — if something is
/// still mounted there, that part is left alone and reported.
pub fn remove_tree(dir: &Path) -> Result<(), SubPathError> {
    let root = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(SubPathError::Io {
                sub_path: String::new(),
                what: format!("stat {}", dir.display()),
                source,
            })
        }
    };
    if root.file_type().is_symlink() {
        // The directory itself replaced by a link: remove the link only.
        return std::fs::remove_file(dir).map_err(|source| SubPathError::Io {
            sub_path: String::new(),
            what: format!("remove {}", dir.display()),
            source,
        });
    }
    for m in mounts_below(dir) {
        unmount(&m);
    }
    // Stat again: when `dir` itself was a mount (a tmpfs volume), the
    // device to stay on is the one under it.
    let dev = match std::fs::symlink_metadata(dir) {
        Ok(m) => m.dev(),
        Err(_) => root.dev(),
    };
    remove_same_dev(dir, dev)
}

fn remove_same_dev(path: &Path, dev: u64) -> Result<(), SubPathError> {
    let io = |what: &str, p: &Path| {
        let what = format!("{what} {}", p.display());
        move |source| SubPathError::Io {
            sub_path: String::new(),
            what,
            source,
        }
    };
    let m = std::fs::symlink_metadata(path).map_err(io("stat", path))?;
    if !m.is_dir() {
        return std::fs::remove_file(path).map_err(io("remove", path));
    }
    if m.dev() != dev {
        return Err(SubPathError::MountedInside {
            path: path.to_path_buf(),
        });
    }
    let mut first_err = None;
    for e in std::fs::read_dir(path).map_err(io("read", path))?.flatten() {
        if let Err(e) = remove_same_dev(&e.path(), dev) {
            first_err.get_or_insert(e);
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    std::fs::remove_dir(path).map_err(io("remove", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("rkubelet-subpath-{name}-{}", std::process::id()));
        let _ = remove_tree(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn invalid_sub_paths_are_refused() {
        for bad in ["", "/etc", "a/../../x", ".."] {
            assert!(
                matches!(validate(bad), Err(SubPathError::Invalid { .. })),
                "{bad}"
            );
        }
        assert!(validate("a/b").is_ok());
    }

    #[test]
    fn a_symlink_anywhere_in_the_sub_path_is_refused() {
        // Old code joined the strings, and the runtime followed the link
        // to the host's root.
        let d = tmp("link");
        let vol = d.join("vol");
        std::fs::create_dir_all(vol.join("a")).unwrap();
        std::os::unix::fs::symlink("/", vol.join("esc")).unwrap();
        std::os::unix::fs::symlink("/etc", vol.join("a/etc")).unwrap();
        let target = d.join("target");
        for sub in ["esc", "esc/etc", "a/etc", "a/etc/passwd"] {
            let e = bind_subpath(&vol, sub, &target).unwrap_err();
            assert!(matches!(e, SubPathError::Symlink { .. }), "{sub}: {e}");
        }
        assert!(!target.exists() || std::fs::read_dir(&target).unwrap().next().is_none());
        remove_tree(&d).unwrap();
    }

    #[test]
    fn links_inside_the_volume_are_followed_links_out_are_not() {
        // A configMap volume: `key -> ..data/key`, `..data -> ..2026_x`.
        let d = tmp("inner");
        let vol = d.join("vol");
        std::fs::create_dir_all(vol.join("..2026_x")).unwrap();
        std::fs::write(vol.join("..2026_x/key"), "v1").unwrap();
        std::os::unix::fs::symlink("..2026_x", vol.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/key", vol.join("key")).unwrap();
        std::os::unix::fs::symlink("../../..", vol.join("up")).unwrap();
        let target = d.join("pod/t");
        bind_subpath(&vol, "key", &target).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "v1");
        for sub in ["up", "up/etc/passwd"] {
            let e = bind_subpath(&vol, sub, &d.join("pod/t2")).unwrap_err();
            assert!(matches!(e, SubPathError::Symlink { .. }), "{sub}: {e}");
        }
        remove_tree(&d.join("pod")).unwrap();
        remove_tree(&d).unwrap();
    }

    #[test]
    fn a_plain_sub_path_is_bound_and_removal_unmounts_it_first() {
        let d = tmp("bind");
        let vol = d.join("vol");
        std::fs::create_dir_all(vol.join("data")).unwrap();
        std::fs::write(vol.join("data/file"), "hello").unwrap();
        let pod = d.join("pod");
        let target = pod.join("volume-subpaths/vol/c/0");
        bind_subpath(&vol, "data", &target).unwrap();
        assert_eq!(
            std::fs::read_to_string(target.join("file")).unwrap(),
            "hello"
        );
        // A missing directory is created inside the volume.
        let t2 = pod.join("volume-subpaths/vol/c/1");
        bind_subpath(&vol, "new/dir", &t2).unwrap();
        assert!(vol.join("new/dir").is_dir());
        // Removing the pod directory detaches the binds and leaves the
        // volume's content alone.
        remove_tree(&pod).unwrap();
        assert!(!pod.exists());
        assert_eq!(
            std::fs::read_to_string(vol.join("data/file")).unwrap(),
            "hello"
        );
        remove_tree(&d).unwrap();
    }

    #[test]
    fn removal_never_follows_a_symlink_out_of_the_tree() {
        let d = tmp("rm");
        let outside = d.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        let pod = d.join("pod");
        std::fs::create_dir_all(pod.join("volumes")).unwrap();
        std::os::unix::fs::symlink(&outside, pod.join("volumes/link")).unwrap();
        remove_tree(&pod).unwrap();
        assert!(!pod.exists());
        assert!(outside.join("keep").exists());
        remove_tree(&d).unwrap();
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        use crate::stats::procfs::unescape_mountinfo;
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }
}
