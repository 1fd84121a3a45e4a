//! The kubelet's and the system's cgroups (`kubeletCgroups`,
//! `systemCgroups`; upstream setupNode's system containers, checked every
//! minute): rkubelet's own process is kept in the first, and every
//! process left in the root cgroup, but for pid 1 and kernel threads, is
//! moved into the second. Both are made where missing, in every hierarchy,
//! whatever the cgroup driver (upstream uses its cgroupfs manager here
//! too). The summary's `kubelet` system container follows, as it reads
//! rkubelet's cgroup from /proc/self/cgroup.

use std::time::Duration;

use cgroups_rs::cgroup::Cgroup;
use cgroups_rs::CgroupPid;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

/// How often the processes are checked (upstream's minute).
pub const PERIOD: Duration = Duration::from_secs(60);
const DEADLINE: Duration = Duration::from_secs(30);

/// The cgroups to keep processes in, as paths below each hierarchy's root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SystemContainers {
    pub kubelet: Option<String>,
    pub system: Option<String>,
}

impl SystemContainers {
    /// From `kubeletCgroups` and `systemCgroups` (empty: not managed).
    /// A root system cgroup is upstream's start error.
    pub fn from_config(kubelet: &str, system: &str) -> Result<Self, String> {
        if system == "/" {
            return Err("system container cannot be root (\"/\")".into());
        }
        let name = |n: &str| {
            (!n.is_empty())
                .then(|| super::manager::relative(n).map_err(|e| e.to_string()))
                .transpose()
        };
        Ok(SystemContainers {
            kubelet: name(kubelet)?,
            system: name(system)?,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.kubelet.is_none() && self.system.is_none()
    }

    /// Checks now and then every `PERIOD` until `token` is cancelled;
    /// failures are logged, as upstream's "Failed to ensure state".
    pub async fn run(self, token: CancellationToken) {
        loop {
            for (name, kubelet) in [(&self.system, false), (&self.kubelet, true)] {
                let Some(rel) = name.clone() else { continue };
                let key = format!("cgroups/system/{rel}");
                let r = crate::blocking::try_run(key, DEADLINE, move || {
                    if kubelet {
                        ensure_kubelet(&rel)
                    } else {
                        ensure_system(&rel)
                    }
                })
                .await;
                if let Err(e) = r {
                    info!(container_name = %format!("/{}", name.as_deref().unwrap_or_default()), error = %e, "Failed to ensure state");
                }
            }
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(PERIOD) => {}
            }
        }
    }
}

/// Whether this process shares the host's pid namespace (upstream
/// isProcessRunningInHost): a kubelet inside a container leaves its
/// cgroups alone.
fn in_host_pid_namespace() -> Result<bool, String> {
    let own = std::fs::read_link("/proc/self/ns/pid")
        .map_err(|e| format!("failed to find pid namespace of process self: {e}"))?;
    match std::fs::read_link("/proc/1/ns/pid") {
        Ok(init) => Ok(init == own),
        // Pid 1's link may be closed to us (no ptrace access to init, as in
        // some sandboxes); the initial namespace's inode is fixed
        // (PROC_PID_INIT_INO).
        Err(_) => Ok(own.as_os_str() == "pid:[4026531836]"),
    }
}

/// The cgroup a process's cpu accounting is in, as upstream getContainer
/// reads /proc/<pid>/cgroup ("" for the root).
fn cpu_cgroup_of(proc_cgroup: &str) -> Option<String> {
    proc_cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let v2 = controllers.is_empty() && l.starts_with("0::");
        (v2 || controllers.split(',').any(|c| c == "cpu"))
            .then(|| path.trim_matches('/').to_string())
    })
}

fn cgroup(rel: &str) -> Result<Cgroup, String> {
    Cgroup::new(cgroups_rs::hierarchies::auto(), rel).map_err(|e| format!("{rel}: {e}"))
}

/// Keeps rkubelet's process in `rel`.
fn ensure_kubelet(rel: &str) -> Result<(), String> {
    if !in_host_pid_namespace()? {
        debug!("PID is not running in the host namespace");
        return Ok(());
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
    if cpu_cgroup_of(&own).as_deref() == Some(rel) {
        return Ok(());
    }
    let cg = cgroup(rel)?;
    let pid = std::process::id() as u64;
    cg.add_task_by_tgid(CgroupPid::from(pid))
        .map_err(|e| format!("failed to move PID {pid} to \"/{rel}\": {e}"))
}

/// The processes directly in the root cgroup (v1: the devices hierarchy's,
/// as upstream's GetPids).
fn root_pids() -> Result<Vec<u64>, String> {
    let path = if super::node::cgroup_v2_unified() {
        "/sys/fs/cgroup/cgroup.procs"
    } else {
        "/sys/fs/cgroup/devices/cgroup.procs"
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("failed to list PIDs for root: {e}"))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Kernel threads have no executable.
fn is_kernel_pid(pid: u64) -> bool {
    matches!(std::fs::read_link(format!("/proc/{pid}/exe")), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

/// The processes of `pids` to move: not pid 1 (init stays where the
/// system put it), not kernel threads.
fn movable(pids: Vec<u64>, is_kernel: impl Fn(u64) -> bool) -> Vec<u64> {
    pids.into_iter()
        .filter(|p| *p != 1 && !is_kernel(*p))
        .collect()
}

/// Moves every process but pid 1 and kernel threads from the root cgroup
/// into `rel`, over up to 11 passes (processes come and go meanwhile);
/// the last pass's error is returned, as upstream's ensureSystemCgroups.
fn ensure_system(rel: &str) -> Result<(), String> {
    let cg = cgroup(rel)?;
    let mut last = Ok(());
    for _ in 0..=10 {
        let pids = match root_pids() {
            Ok(p) => movable(p, is_kernel_pid),
            Err(e) => {
                last = Err(e);
                continue;
            }
        };
        if pids.is_empty() {
            return Ok(());
        }
        debug!(?pids, "Moving non-kernel processes");
        for pid in pids {
            if let Err(e) = cg.add_task_by_tgid(CgroupPid::from(pid)) {
                last = Err(format!(
                    "failed to move PID {pid} into the system container \"/{rel}\": {e}"
                ));
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_root_is_refused_for_the_system() {
        assert_eq!(
            SystemContainers::from_config("/kubelet.slice", "/system.slice").unwrap(),
            SystemContainers {
                kubelet: Some("kubelet.slice".into()),
                system: Some("system.slice".into()),
            }
        );
        assert!(SystemContainers::from_config("", "").unwrap().is_empty());
        let root = SystemContainers::from_config("", "/").unwrap_err();
        assert!(root
            .to_string()
            .contains("system container cannot be root (\"/\")"));
        assert!(SystemContainers::from_config("/a/../..", "").is_err());
    }

    #[test]
    fn init_and_kernel_threads_stay_in_the_root() {
        assert_eq!(movable(vec![1, 2, 300, 301], |p| p == 2), vec![300, 301]);
        // This process has an executable; pid 2 (kthreadd) has none.
        assert!(!is_kernel_pid(std::process::id() as u64));
        assert!(is_kernel_pid(2));
    }

    #[test]
    fn the_cpu_cgroup_is_read_from_either_layout() {
        let v1 = "12:pids:/x\n4:cpu,cpuacct:/kubelet.slice\n1:name=systemd:/\n";
        assert_eq!(cpu_cgroup_of(v1).as_deref(), Some("kubelet.slice"));
        assert_eq!(
            cpu_cgroup_of("0::/system.slice/k.service\n").as_deref(),
            Some("system.slice/k.service")
        );
        assert_eq!(cpu_cgroup_of("3:cpuset:/\n2:cpu:/\n").as_deref(), Some(""));
    }
}
