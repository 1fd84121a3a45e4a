//! Safety on real containerd: a subPath cannot be turned into a way out of
//! its volume by a symlink the pod plants itself.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

fn waiting_reason(p: &serde_json::Value, c: &str) -> Option<(String, String)> {
    let w = &container_status(p, c)?["state"]["waiting"];
    Some((
        w["reason"].as_str()?.to_string(),
        w["message"].as_str().unwrap_or_default().to_string(),
    ))
}

#[test]
fn a_sub_path_symlink_planted_in_an_empty_dir_is_refused() {
    let k = Kubelet::start("it-subpath");
    // The init container plants `esc -> /` in the emptyDir. Old code joined
    // the subPath to the volume directory and containerd followed the
    // link: the container got the host's root at /host.
    k.write_manifest(
        "sub.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: sub\nspec:\n  terminationGracePeriodSeconds: 2\n  volumes:\n  - name: vol\n    emptyDir: {{}}\n  initContainers:\n  - name: plant\n    image: {BUSYBOX}\n    command: [sh, -c, 'ln -s / /vol/esc && mkdir -p /vol/ok && echo fine > /vol/ok/f']\n    volumeMounts:\n    - {{name: vol, mountPath: /vol}}\n  containers:\n  - name: ok\n    image: {BUSYBOX}\n    command: [sh, -c, 'cat /data/f && exec sleep 3600']\n    volumeMounts:\n    - {{name: vol, mountPath: /data, subPath: ok}}\n  - name: esc\n    image: {BUSYBOX}\n    command: [sh, -c, 'exec sleep 3600']\n    volumeMounts:\n    - {{name: vol, mountPath: /host, subPath: esc}}\n"
        ),
    );
    let p = k.wait_pod(
        "sub",
        "the escape refused and the plain subPath running",
        T,
        |p| {
            let ok = container_status(p, "ok").is_some_and(|s| s["state"]["running"].is_object());
            let esc =
                waiting_reason(p, "esc").is_some_and(|(r, _)| r == "CreateContainerConfigError");
            ok && esc
        },
    );
    let (_, msg) = waiting_reason(&p, "esc").unwrap();
    assert!(msg.contains("symbolic link"), "{msg}");
    let esc = container_status(&p, "esc").unwrap();
    assert!(
        esc["containerID"].is_null(),
        "a container was created: {esc}"
    );
    // The plain subPath shows what the init container wrote.
    let uid = p["metadata"]["uid"].as_str().unwrap();
    assert_eq!(k.cri.count_for_uid(uid).1, 2, "init + ok only");
}

/// A FUSE mount whose server never answers: every access below it blocks
/// until the connection is aborted (when this is dropped).
struct HungMount {
    dir: std::path::PathBuf,
    fd: std::os::fd::OwnedFd,
}

impl HungMount {
    fn new(dir: &std::path::Path) -> Self {
        use std::ffi::CString;
        use std::os::fd::{AsRawFd, FromRawFd};
        std::fs::create_dir_all(dir).unwrap();
        // SAFETY: plain syscalls on paths we own; the fd is owned below.
        let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        assert!(
            fd >= 0,
            "open /dev/fuse: {}",
            std::io::Error::last_os_error()
        );
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let target = CString::new(dir.to_str().unwrap()).unwrap();
        let opts = CString::new(format!(
            "fd={},rootmode=40000,user_id=0,group_id=0",
            fd.as_raw_fd()
        ))
        .unwrap();
        let r = unsafe {
            libc::mount(
                c"rkubelet-hung".as_ptr(),
                target.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            )
        };
        assert_eq!(r, 0, "mount fuse: {}", std::io::Error::last_os_error());
        HungMount {
            dir: dir.to_path_buf(),
            fd,
        }
    }
}

impl Drop for HungMount {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.dir.to_str().unwrap()).unwrap();
        // Detach first, then closing the device aborts the connection and
        // every thread stuck on it wakes with an error.
        unsafe {
            libc::umount2(target.as_ptr(), libc::MNT_DETACH);
        }
        let _ = &self.fd;
    }
}

#[test]
fn a_host_path_on_a_file_system_that_never_answers_stalls_only_its_pod() {
    let mut k = Kubelet::start("it-hungfs");
    let hung = HungMount::new(&k.dir.join("hung"));
    // Old code stat'ed the hostPath on rkubelet's only async thread: the
    // whole kubelet, /healthz included, stopped with it.
    k.write_manifest(
        "stuck.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: stuck\nspec:\n  terminationGracePeriodSeconds: 2\n  volumes:\n  - name: nfs\n    hostPath: {{path: {}/data, type: Directory}}\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sleep, \"3600\"]\n    volumeMounts:\n    - {{name: nfs, mountPath: /data}}\n",
            hung.dir.display()
        ),
    );
    k.wait_pod("stuck", "listed", T, |_| true);
    k.write_manifest(
        "other.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: other\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sleep, \"3600\"]\n"
        ),
    );
    k.wait_pod("other", "running beside the stuck pod", T, |p| {
        container_status(p, "main").is_some_and(|s| s["state"]["running"].is_object())
    });
    for _ in 0..5 {
        assert_eq!(
            http_get(&k.healthz, "/healthz").map(|r| r.0),
            Some(200),
            "healthz while a hostPath hangs"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let p = k.pod("stuck").unwrap();
    assert!(
        container_status(&p, "main").is_none_or(|s| !s["state"]["running"].is_object()),
        "the stuck pod cannot have started"
    );
    // SIGTERM still ends rkubelet although a thread is stuck on the mount
    // (the runtime's drop would wait for it forever); the fallback SIGKILL
    // in stop() comes only after 15 s.
    let t0 = std::time::Instant::now();
    k.stop();
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(12),
        "rkubelet took {:?} to exit",
        t0.elapsed()
    );
    drop(hung);
}
