//! Volume ownership for a pod's fsGroup (upstream `pkg/volume/volume_linux.go`
//! SetVolumeOwnership): every file and directory of a volume the kubelet
//! manages goes to the fsGroup, gains group read (and write, unless the
//! volume is read-only), and directories gain set-gid and group execute,
//! so a non-root container whose supplementary groups include the fsGroup
//! can use it. Links are neither followed nor changed (their mode means
//! nothing); the walk stays on the volume's device.
//!
//! Blocking: callers run it off the async threads.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Upstream's masks: rw for writable volumes, r for read-only ones.
const RW_MASK: u32 = 0o660;
const RO_MASK: u32 = 0o440;
const EXEC_MASK: u32 = 0o110;

/// Applies the fsGroup to `dir` and everything below it. With
/// `on_root_mismatch` (fsGroupChangePolicy OnRootMismatch) nothing is done
/// when the root already has the group and the permissions. A walk is
/// upstream's `volume_fsgroup_recursive_apply` operation of volume plugin
/// `plugin` (VolumeOwnership.changePermissionsRecursively calls its
/// FSGroupCompleteHook after the walk; a skipped walk records nothing).
pub fn set_volume_ownership(
    dir: &Path,
    fs_group: u32,
    read_only: bool,
    on_root_mismatch: bool,
    plugin: &str,
) -> std::io::Result<()> {
    let root = std::fs::symlink_metadata(dir)?;
    let mask = if read_only { RO_MASK } else { RW_MASK };
    if on_root_mismatch {
        let want = mask | EXEC_MASK | libc::S_ISGID;
        if root.gid() == fs_group && root.mode() & want == want {
            return Ok(());
        }
    }
    let started = std::time::Instant::now();
    let r = walk(dir, root.dev(), fs_group, mask);
    crate::metrics::certvol::storage_operation(
        plugin,
        "volume_fsgroup_recursive_apply",
        started.elapsed(),
        r.is_ok(),
    );
    r
}

fn walk(path: &Path, dev: u64, gid: u32, mask: u32) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.dev() != dev {
        // Another file system mounted inside: not this volume's.
        return Ok(());
    }
    lchown_group(path, gid)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mut mode = meta.mode() & 0o7777 | mask;
    if meta.is_dir() {
        mode |= libc::S_ISGID | EXEC_MASK;
    }
    if mode != meta.mode() & 0o7777 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    if meta.is_dir() {
        for e in std::fs::read_dir(path)? {
            walk(&e?.path(), dev, gid, mask)?;
        }
    }
    Ok(())
}

fn lchown_group(path: &Path, gid: u32) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: a NUL-terminated path; uid -1 leaves the owner as it is.
    let r = unsafe { libc::lchown(c.as_ptr(), u32::MAX, gid) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin name no other test uses (the metrics are process-wide).
    const PLUGIN: &str = "kubernetes.io/test-ownership";

    #[test]
    fn files_go_to_the_fs_group_with_group_access_links_untouched() {
        let d = std::env::temp_dir().join(format!("rkubelet-own-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("vol/sub")).unwrap();
        std::fs::write(d.join("vol/sub/token"), "t").unwrap();
        std::fs::set_permissions(
            d.join("vol/sub/token"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::fs::write(d.join("outside"), "o").unwrap();
        std::os::unix::fs::symlink(d.join("outside"), d.join("vol/link")).unwrap();
        let applied = || {
            crate::metrics::certvol::storage_operation_count(
                PLUGIN,
                "volume_fsgroup_recursive_apply",
                "success",
            )
        };
        assert_eq!(applied(), 0);
        set_volume_ownership(&d.join("vol"), 4242, true, false, PLUGIN).unwrap();
        assert_eq!(applied(), 1, "a walk is one volume_fsgroup_recursive_apply");
        let m = std::fs::metadata(d.join("vol/sub/token")).unwrap();
        assert_eq!((m.gid(), m.mode() & 0o7777), (4242, 0o640));
        let m = std::fs::metadata(d.join("vol/sub")).unwrap();
        assert_eq!(m.gid(), 4242);
        assert_eq!(m.mode() & 0o7777, 0o2755 | 0o440 | 0o110);
        // The link's target outside the volume is not touched.
        let o = std::fs::metadata(d.join("outside")).unwrap();
        assert_ne!(o.gid(), 4242);
        // Writable volumes get group write.
        std::fs::write(d.join("vol/w"), "w").unwrap();
        set_volume_ownership(&d.join("vol"), 4242, false, false, PLUGIN).unwrap();
        let m = std::fs::metadata(d.join("vol/w")).unwrap();
        assert_eq!(m.mode() & 0o060, 0o060);
        // OnRootMismatch: a matching root means no walk (a new file keeps
        // the mode it was made with).
        std::fs::write(d.join("vol/late"), "l").unwrap();
        std::fs::set_permissions(d.join("vol/late"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        set_volume_ownership(&d.join("vol"), 4242, false, true, PLUGIN).unwrap();
        let late = std::fs::metadata(d.join("vol/late")).unwrap();
        assert_eq!(late.mode() & 0o777, 0o600);
        // Two walks timed; the skipped one is no operation.
        assert_eq!(applied(), 2);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
