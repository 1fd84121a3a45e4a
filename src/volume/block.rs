//! Raw block volumes (`volumeMode: Block`): upstream's
//! `util.MapBlockVolume` / `UnmapBlockVolume` and the volume path handler,
//! for the local plugin's BlockVolumeMapper (`kubernetes.io/local-volume`)
//! here and for CSI's (`csi/block.rs`, which stages and publishes first
//! and maps the driver's publish path the same way).
//!
//! Mapping a device for a pod: the device is bind-mounted onto the file
//! `<global map path>/<pod uid>` (the bind keeps a reference per pod and
//! marks the device in use; the local plugin's global map path is
//! `<root>/plugins/kubernetes.io~local-volume/volumeDevices/<pv>`), and a
//! symlink to the device is made in the pod's
//! `<root>/pods/<uid>/volumeDevices/<escaped plugin>/` directory, the path
//! CRI gets as the device's host path. Unmapping removes the symlink,
//! then unmounts the bind and removes its file, and the global directory
//! once no pod uses it; symlinks are never followed.
//!
//! Upstream also holds the device open with a read-only loop device on the
//! bind file (`AttachFileDevice`, "fd lock": `losetup`), so that a device
//! removed and replaced by another of the same name is not handed to a
//! container. rkubelet holds an open descriptor of the bind file instead,
//! for as long as the volume is mapped in this process: the same reference
//! on the block device, without a loop device per pod to leak or detach.
//! After a restart the descriptor is not there until the pod's volume is
//! set up again (which reopens it).

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, PersistentVolume, Pod};
use parking_lot::Mutex;

/// The local plugin's directory name (`kubernetes.io/local-volume`
/// escaped for the disk, as upstream's EscapeQualifiedName).
pub const LOCAL_PLUGIN_DIR: &str = "kubernetes.io~local-volume";
/// The CSI plugin's, for its pods' device links (upstream's
/// GetPodDeviceMapPath in csi_block.go).
pub const CSI_PLUGIN_DIR: &str = "kubernetes.io~csi";

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("PV {pv}: {} is not a block device", path.display())]
    NotBlockDevice { pv: String, path: PathBuf },
    #[error("invalid PV name {0:?}")]
    BadName(String),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BlockError {
    let path = path.to_path_buf();
    move |source| BlockError::Io { what, path, source }
}

/// `Filesystem` unless the PV says `Block` (upstream's GetVolumeMode: the
/// PV's `volumeMode`, defaulting to Filesystem).
pub fn is_block(pv: &PersistentVolume) -> bool {
    pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block")
}

fn containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    spec.into_iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
}

/// Upstream's populator check (createVolumeSpec): a claim's volume mode
/// must match how the pod's containers use it. The message is upstream's.
pub fn check_use(pod: &Pod, volume: &str, block: bool) -> Result<(), String> {
    let mode = if block { "Block" } else { "Filesystem" };
    let ephemeral = pod
        .spec
        .as_ref()
        .into_iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten());
    let mounted = containers(pod)
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .chain(
            ephemeral
                .clone()
                .flat_map(|c| c.volume_mounts.iter().flatten()),
        )
        .any(|m| m.name == volume);
    let mapped = containers(pod)
        .flat_map(|c| c.volume_devices.iter().flatten())
        .chain(ephemeral.flat_map(|c| c.volume_devices.iter().flatten()))
        .any(|d| d.name == volume);
    if mounted && block {
        return Err(format!(
            "volume {volume} has volumeMode {mode}, but is specified in volumeMounts"
        ));
    }
    if mapped && !block {
        return Err(format!(
            "volume {volume} has volumeMode {mode}, but is specified in volumeDevices"
        ));
    }
    Ok(())
}

/// PV names are DNS subdomains; anything that could leave the directory
/// is refused before a path is built from it.
pub(crate) fn check_name(pv: &str) -> Result<(), BlockError> {
    if pv.is_empty() || pv == "." || pv == ".." || pv.contains('/') || pv.contains('\0') {
        return Err(BlockError::BadName(pv.to_string()));
    }
    Ok(())
}

/// `<root>/plugins/kubernetes.io~local-volume/volumeDevices/<pv>`.
pub fn global_map_path(root: &Path, pv: &str) -> PathBuf {
    root.join("plugins")
        .join(LOCAL_PLUGIN_DIR)
        .join("volumeDevices")
        .join(pv)
}

/// `<root>/pods/<uid>/volumeDevices/kubernetes.io~local-volume`.
pub fn pod_device_map_dir(root: &Path, uid: &str) -> PathBuf {
    plugin_device_map_dir(root, uid, LOCAL_PLUGIN_DIR)
}

/// `<root>/pods/<uid>/volumeDevices/<escaped plugin name>`.
pub fn plugin_device_map_dir(root: &Path, uid: &str, plugin_dir: &str) -> PathBuf {
    super::pod_dir(root, uid)
        .join("volumeDevices")
        .join(plugin_dir)
}

/// Whether `path` is a device symlink of the pod (what CRI gets as a
/// device's host path) of the local or the CSI plugin: upstream's
/// GetPodDeviceMapPath.
pub fn is_pod_device_path(root: &Path, uid: &str, path: &Path) -> bool {
    [LOCAL_PLUGIN_DIR, CSI_PLUGIN_DIR]
        .iter()
        .any(|p| path.parent() == Some(plugin_device_map_dir(root, uid, p).as_path()))
}

/// A device mapped for a pod.
#[derive(Debug)]
pub struct Mapped {
    pub pv: String,
    /// The pod's symlink (what containers get).
    pub link: PathBuf,
    /// The bind-mounted file `<global map path>/<uid>`.
    pub bind: PathBuf,
    /// The open descriptor that keeps the device referenced (see the
    /// module's note); closed before the bind is unmounted.
    hold: Mutex<Option<std::fs::File>>,
}

fn is_device(p: &Path) -> std::io::Result<bool> {
    match std::fs::symlink_metadata(p) {
        Ok(m) => Ok(m.file_type().is_block_device() || m.file_type().is_char_device()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

fn cstr(p: &Path) -> std::io::Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))
}

/// Maps `device` (the local PV's path) for pod `uid`: upstream's
/// MapBlockVolume. Idempotent: a bind or link already there is kept.
/// Blocking: run it off the async threads.
pub fn map(root: &Path, uid: &str, pv: &str, device: &Path) -> Result<Mapped, BlockError> {
    check_name(pv)?;
    check_name(uid)?;
    map_at(
        &global_map_path(root, pv),
        &pod_device_map_dir(root, uid),
        uid,
        pv,
        device,
    )
}

/// Upstream's MapBlockVolume with a plugin's paths: `device` bound onto
/// `<global>/<uid>` and linked as `<link_dir>/<name>`. The caller has
/// checked `uid` and `name` with [`check_name`]. Blocking.
pub(crate) fn map_at(
    global: &Path,
    link_dir: &Path,
    uid: &str,
    name: &str,
    device: &Path,
) -> Result<Mapped, BlockError> {
    let pv = name;
    // The plugin hands a path over as the device (the local PV's, or the
    // CSI driver's publish path); only a block device can be bound onto
    // the map file.
    let meta = std::fs::metadata(device).map_err(io("stat", device))?;
    if !meta.file_type().is_block_device() {
        return Err(BlockError::NotBlockDevice {
            pv: pv.to_string(),
            path: device.to_path_buf(),
        });
    }
    std::fs::create_dir_all(global).map_err(io("mkdir", global))?;
    let bind = global.join(uid);
    if !is_device(&bind).map_err(io("stat", &bind))? {
        // An empty file to bind the device onto (a bind of a device needs a
        // file, not a directory, as its target).
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&bind)
            .map_err(io("create", &bind))?;
        let (src, dst) = (
            cstr(device).map_err(io("bind", device))?,
            cstr(&bind).map_err(io("bind", &bind))?,
        );
        // SAFETY: NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            let _ = std::fs::remove_file(&bind);
            return Err(BlockError::Io {
                what: "bind-mount the device onto",
                path: bind,
                source: e,
            });
        }
    }
    std::fs::create_dir_all(link_dir).map_err(io("mkdir", link_dir))?;
    let link = link_dir.join(pv);
    match std::fs::read_link(&link) {
        Ok(t) if t == device => {}
        Ok(_) => {
            // A link to another device (the PV changed): made again.
            std::fs::remove_file(&link).map_err(io("remove", &link))?;
            std::os::unix::fs::symlink(device, &link).map_err(io("symlink", &link))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::os::unix::fs::symlink(device, &link).map_err(io("symlink", &link))?;
        }
        Err(e) => return Err(io("readlink", &link)(e)),
    }
    // O_NOFOLLOW: the bind file is ours; never open through a link.
    let hold = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&bind)
        .map_err(io("open", &bind))?;
    Ok(Mapped {
        pv: pv.to_string(),
        link,
        bind,
        hold: Mutex::new(Some(hold)),
    })
}

/// The local plugin's name in the storage operation metrics.
const LOCAL_PLUGIN: &str = "kubernetes.io/local-volume";

/// Undoes [`map`]: upstream's UnmapBlockVolume, then UnmapDevice's removal
/// of the global map path once no pod has a bind there (timed as the local
/// plugin's `unmap_device`). Blocking.
pub fn unmap(m: &Mapped) -> Result<(), BlockError> {
    unmap_for(m, Some(LOCAL_PLUGIN))
}

/// [`unmap`] with the plugin whose `unmap_device` the removal of the
/// global map path is (None: the caller times its own, as the CSI plugin's
/// covers its TearDownDevice). Blocking.
pub(crate) fn unmap_for(m: &Mapped, device_plugin: Option<&str>) -> Result<(), BlockError> {
    drop(m.hold.lock().take());
    unmap_paths(&m.link, &m.bind, device_plugin)
}

/// Undoes a mapping found on disk (after a restart): the pod's `link`,
/// then the `bind` file and its directory once empty (timed as
/// `device_plugin`'s `unmap_device`, if given). Blocking.
pub(crate) fn unmap_paths(
    link: &Path,
    bind: &Path,
    device_plugin: Option<&str>,
) -> Result<(), BlockError> {
    // The pod's link first: containers are gone, nothing resolves it now.
    match std::fs::symlink_metadata(link) {
        Ok(md) if md.file_type().is_symlink() => {
            std::fs::remove_file(link).map_err(io("remove", link))?
        }
        _ => {}
    }
    if let Some(dir) = link.parent() {
        // Empty parents of the link go too (not the pod directory).
        let _ = std::fs::remove_dir(dir);
        if let Some(up) = dir.parent() {
            let _ = std::fs::remove_dir(up);
        }
    }
    if is_device(bind).map_err(io("stat", bind))? {
        let c = cstr(bind).map_err(io("unmount", bind))?;
        // SAFETY: a NUL-terminated path. UMOUNT_NOFOLLOW: the bind file
        // itself, never what a link there would name.
        if unsafe { libc::umount2(c.as_ptr(), libc::UMOUNT_NOFOLLOW) } != 0 {
            return Err(io("unmount", bind)(std::io::Error::last_os_error()));
        }
    }
    match std::fs::symlink_metadata(bind) {
        Ok(md) if md.file_type().is_file() => {
            std::fs::remove_file(bind).map_err(io("remove", bind))?
        }
        Ok(_) => {
            // Still a device (stacked binds) or something else: left, and
            // reported, rather than removed with what it holds.
            return Err(io("remove", bind)(std::io::Error::new(
                std::io::ErrorKind::ResourceBusy,
                "still mounted",
            )));
        }
        Err(_) => {}
    }
    if let Some(global) = bind.parent() {
        // Only when no other pod maps it: upstream's UnmapDevice
        // (GenerateUnmapDeviceFunc), timed as its `unmap_device`; a
        // directory other pods still bind is no operation yet.
        let started = std::time::Instant::now();
        match std::fs::remove_dir(global) {
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            r => {
                if let Some(plugin) = device_plugin {
                    crate::metrics::certvol::storage_operation(
                        plugin,
                        "unmap_device",
                        started.elapsed(),
                        r.is_ok(),
                    )
                }
            }
        }
    }
    Ok(())
}

/// The block volumes of pod `uid` left from before a restart (not in the
/// volume manager's state): every `<global map path>/<uid>` bind and the
/// pod's links are undone, each timed as the local plugin's `unmap_volume`
/// (upstream's reconciler unmaps a reconstructed volume with
/// GenerateUnmapVolumeFunc, as any other). Blocking; for the orphaned-pod
/// cleanup.
pub fn unmap_orphaned(root: &Path, uid: &str) -> Result<(), BlockError> {
    check_name(uid)?;
    let base = root
        .join("plugins")
        .join(LOCAL_PLUGIN_DIR)
        .join("volumeDevices");
    let entries = match std::fs::read_dir(&base) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("list", &base)(e)),
    };
    let dir = pod_device_map_dir(root, uid);
    for e in entries {
        let e = e.map_err(io("list", &base))?;
        // Directories only, never through a link.
        if !e.file_type().map_err(io("stat", &e.path()))?.is_dir() {
            continue;
        }
        let pv = e.file_name();
        let bind = e.path().join(uid);
        let link = dir.join(&pv);
        if std::fs::symlink_metadata(&bind).is_ok() || std::fs::symlink_metadata(&link).is_ok() {
            let started = std::time::Instant::now();
            let r = unmap_paths(&link, &bind, Some(LOCAL_PLUGIN));
            crate::metrics::certvol::storage_operation(
                LOCAL_PLUGIN,
                "unmap_volume",
                started.elapsed(),
                r.is_ok(),
            );
            r?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, VolumeDevice, VolumeMount};

    fn pod(mounts: &[&str], devices: &[&str]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    volume_mounts: Some(
                        mounts
                            .iter()
                            .map(|n| VolumeMount {
                                name: n.to_string(),
                                mount_path: "/m".into(),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    volume_devices: Some(
                        devices
                            .iter()
                            .map(|n| VolumeDevice {
                                name: n.to_string(),
                                device_path: "/dev/xvda".into(),
                            })
                            .collect(),
                    ),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_volume_mode_must_match_how_containers_use_the_claim() {
        assert_eq!(
            check_use(&pod(&["v"], &[]), "v", true).unwrap_err(),
            "volume v has volumeMode Block, but is specified in volumeMounts"
        );
        assert_eq!(
            check_use(&pod(&[], &["v"]), "v", false).unwrap_err(),
            "volume v has volumeMode Filesystem, but is specified in volumeDevices"
        );
        check_use(&pod(&[], &["v"]), "v", true).unwrap();
        check_use(&pod(&["v"], &[]), "v", false).unwrap();
        // Another volume's use does not count.
        check_use(&pod(&["w"], &[]), "v", true).unwrap();
    }

    #[test]
    fn upstreams_paths() {
        let root = Path::new("/var/lib/kubelet");
        assert_eq!(
            global_map_path(root, "pv1"),
            Path::new("/var/lib/kubelet/plugins/kubernetes.io~local-volume/volumeDevices/pv1")
        );
        let dir = pod_device_map_dir(root, "u1");
        assert_eq!(
            dir,
            Path::new("/var/lib/kubelet/pods/u1/volumeDevices/kubernetes.io~local-volume")
        );
        assert!(is_pod_device_path(root, "u1", &dir.join("pv1")));
        assert!(!is_pod_device_path(root, "u2", &dir.join("pv1")));
        assert!(!is_pod_device_path(
            root,
            "u1",
            Path::new("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~local-volume/pv1")
        ));
    }

    #[test]
    fn names_that_could_leave_the_directory_are_refused_and_non_devices_too() {
        let root = std::env::temp_dir().join(format!("rkubelet-blk-{}", std::process::id()));
        for bad in ["..", "a/b", ""] {
            assert!(matches!(
                map(&root, "u", bad, Path::new("/dev/null")),
                Err(BlockError::BadName(_))
            ));
        }
        // A regular file (or /dev/null, a character device) is no block
        // device; nothing is made for it.
        let f = root.join("file");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(&f, "x").unwrap();
        for p in [f.as_path(), Path::new("/dev/null")] {
            let e = map(&root, "u", "pv", p).unwrap_err();
            assert!(matches!(e, BlockError::NotBlockDevice { .. }), "{e}");
        }
        assert!(!global_map_path(&root, "pv").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A loop device on a backing file, detached when dropped (also when
    /// the test fails).
    struct Loop(PathBuf);

    impl Loop {
        fn new(backing: &Path) -> Option<Loop> {
            std::fs::write(backing, vec![0u8; 1 << 20]).unwrap();
            let out = std::process::Command::new("losetup")
                .args(["-f", "--show"])
                .arg(backing)
                .output()
                .ok()?;
            let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (out.status.success() && !dev.is_empty()).then(|| Loop(PathBuf::from(dev)))
        }
    }

    impl Drop for Loop {
        fn drop(&mut self) {
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(&self.0)
                .status();
        }
    }

    fn mounted(p: &Path) -> bool {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(4) == p.to_str())
    }

    #[test]
    fn a_block_device_is_bound_per_pod_linked_and_unmapped_without_leftovers() {
        use std::os::unix::fs::MetadataExt;
        let root = std::env::temp_dir().join(format!("rkubelet-blk3-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let Some(dev) = Loop::new(&root.join("backing")) else {
            // No loop devices here (not root, or no loop module): nothing
            // to map.
            eprintln!("skipped: losetup failed");
            return;
        };
        let rdev = std::fs::metadata(&dev.0).unwrap().rdev();
        let first = map(&root, "u1", "pv", &dev.0).unwrap();
        // Mapping again (a set-up after a restart) keeps what is there.
        let a = map(&root, "u1", "pv", &dev.0).unwrap();
        assert_eq!(first.bind, a.bind);
        drop(first);
        let b = map(&root, "u2", "pv", &dev.0).unwrap();
        let global = global_map_path(&root, "pv");
        for (m, uid) in [(&a, "u1"), (&b, "u2")] {
            assert_eq!(m.bind, global.join(uid));
            assert!(mounted(&m.bind), "{} bind-mounted", m.bind.display());
            let md = std::fs::symlink_metadata(&m.bind).unwrap();
            assert!(md.file_type().is_block_device());
            assert_eq!(md.rdev(), rdev, "the bind is the device");
            assert_eq!(m.link, pod_device_map_dir(&root, uid).join("pv"));
            assert_eq!(std::fs::read_link(&m.link).unwrap(), dev.0);
        }
        let unmapped_devices = || {
            crate::metrics::certvol::storage_operation_count(
                "kubernetes.io/local-volume",
                "unmap_device",
                "success",
            )
        };
        let before = unmapped_devices();
        unmap(&a).unwrap();
        assert!(!mounted(&a.bind) && !a.bind.exists());
        assert!(std::fs::symlink_metadata(&a.link).is_err());
        // The other pod's mapping stays, and with it the global directory:
        // no UnmapDevice yet.
        assert!(mounted(&b.bind) && global.is_dir());
        assert_eq!(unmapped_devices(), before);
        unmap(&b).unwrap();
        assert_eq!(
            unmapped_devices(),
            before + 1,
            "the last pod's unmap_device"
        );
        assert!(!mounted(&b.bind));
        assert!(
            !global.exists(),
            "the global map path goes with its last pod"
        );
        assert!(!pod_device_map_dir(&root, "u2").exists());
        drop(dev);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn unmap_removes_links_and_files_but_never_follows_a_link() {
        let root = std::env::temp_dir().join(format!("rkubelet-blk2-{}", std::process::id()));
        let outside = root.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "k").unwrap();
        // A left-over (not mounted) bind file and the pod's link.
        let global = global_map_path(&root, "pv");
        std::fs::create_dir_all(&global).unwrap();
        std::fs::write(global.join("u"), "").unwrap();
        let dir = pod_device_map_dir(&root, "u");
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(outside.join("keep"), dir.join("pv")).unwrap();
        // Another pod's bind file stays, and so does the global directory.
        std::fs::write(global.join("other"), "").unwrap();
        let unmapped = || {
            crate::metrics::certvol::storage_operation_count(
                LOCAL_PLUGIN,
                "unmap_volume",
                "success",
            )
        };
        let before = unmapped();
        unmap_orphaned(&root, "u").unwrap();
        // Timed as the reconciler's unmap of a reconstructed volume (other
        // tests may add theirs meanwhile).
        assert!(unmapped() > before);
        assert!(std::fs::symlink_metadata(dir.join("pv")).is_err());
        assert!(!global.join("u").exists());
        assert!(global.join("other").exists());
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "k");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
