//! A lost container runtime: rkubelet keeps running, reports it on /healthz,
//! reconnects when containerd is back, and never kills the running pods.
//! This test stops and restarts the machine's containerd (started by
//! scripts/setup.sh); a guard restarts it whatever happens.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use rkubelet::cri::RuntimeService;

const PIDFILE: &str = "/run/rkubelet/containerd.pid";
const T: Duration = Duration::from_secs(60);

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

/// Restarts containerd with the command line it had, if it is not running.
struct ContainerdGuard {
    cmdline: Vec<String>,
    pid: u32,
}

impl ContainerdGuard {
    fn stop() -> Self {
        let pid: u32 = std::fs::read_to_string(PIDFILE)
            .expect("containerd pidfile from scripts/setup.sh")
            .trim()
            .parse()
            .unwrap();
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let cmdline: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        assert!(cmdline[0].ends_with("containerd"), "{cmdline:?}");
        Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .unwrap();
        wait_for("containerd to exit", T, || (!alive(pid)).then_some(()));
        ContainerdGuard { cmdline, pid }
    }

    // containerd must outlive this test process, so it is never waited for.
    #[allow(clippy::zombie_processes)]
    fn start(&mut self) {
        if alive(self.pid) {
            return;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open("/var/log/rkubelet-containerd.log")
            .unwrap();
        // The daemon must not inherit this process's descriptors beyond
        // stdio: an inherited lock file (a `flock` around the test run)
        // would otherwise stay locked for as long as containerd runs.
        Command::new("bash")
            .arg("-c")
            .arg(
                r#"for fd in /proc/$$/fd/*; do n=${fd##*/}; [ "$n" -gt 2 ] 2>/dev/null && eval "exec $n>&-" 2>/dev/null; done; exec setsid "$@""#,
            )
            .arg("bash")
            .args(&self.cmdline)
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let pid = wait_for("containerd restarted", T, || {
            let out = Command::new("pgrep")
                .args(["-n", "-x", "containerd"])
                .output()
                .ok()?;
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|p| *p != self.pid && alive(*p))
        });
        std::fs::write(PIDFILE, format!("{pid}\n")).unwrap();
        self.pid = pid;
    }
}

impl Drop for ContainerdGuard {
    fn drop(&mut self) {
        self.start();
    }
}

#[test]
fn containerd_restart_keeps_pods_running_and_rkubelet_reconnects() {
    let k = Kubelet::start("it-crirestart");
    k.write_manifest(
        "steady.yaml",
        &simple_pod("steady", "exec sleep 3600", "Always"),
    );
    let p = k.wait_pod("steady", "running", T, |p| running(p, "main"));
    let id = container_status(&p, "main").unwrap()["containerID"].clone();

    let mut guard = ContainerdGuard::stop();
    let body = wait_for("healthz to report the runtime", T, || {
        http_get(&k.healthz, "/healthz")
            .filter(|(s, _)| *s == 500)
            .map(|(_, b)| b)
    });
    assert!(body.contains("runtime failed"), "{body}");
    // Still serving, still listing the pod, which it did not kill.
    let p = k
        .pod("steady")
        .expect("pod still listed while the runtime is away");
    assert_eq!(container_status(&p, "main").unwrap()["containerID"], id);

    guard.start();
    wait_for("healthz ok again", T, || {
        http_get(&k.healthz, "/healthz").filter(|(s, _)| *s == 200)
    });
    let cri = Cri::new();
    let p = k.wait_pod("steady", "running after the restart", T, |p| {
        running(p, "main")
    });
    assert_eq!(
        container_status(&p, "main").unwrap()["containerID"],
        id,
        "the same container survived"
    );

    // And rkubelet acts on the runtime again: a killed container comes back.
    let cid = id
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string();
    cri.rt.block_on(cri.client.stop_container(&cid, 0)).unwrap();
    k.wait_pod("steady", "restarted after the kill", T, |p| {
        running(p, "main") && container_status(p, "main").unwrap()["restartCount"] == 1
    });
}
