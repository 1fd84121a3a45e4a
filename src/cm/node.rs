//! Node setup done before pods run, and the memory knobs each container
//! gets, as upstream's container manager and runtime manager do them:
//! the swap check (`NewContainerManager`), the kernel tunables
//! (`setupKernelTunables`), and containers' swap limit and OOM group
//! (`kuberuntime_container_linux.go`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::cri::v1::LinuxContainerResources;

/// Whether `/sys/fs/cgroup` is the cgroup2 file system (libcontainer's
/// IsCgroup2UnifiedMode, which upstream asks). A hybrid host (v1 with a
/// cgroup2 mount elsewhere) is v1.
pub fn cgroup_v2_unified() -> bool {
    static V2: OnceLock<bool> = OnceLock::new();
    *V2.get_or_init(|| {
        // CGROUP2_SUPER_MAGIC, as in linux/magic.h.
        const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
        let path = c"/sys/fs/cgroup";
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is NUL-terminated and `st` is a valid out pointer.
        let rc = unsafe { libc::statfs(path.as_ptr(), &mut st) };
        rc == 0 && st.f_type as i64 == CGROUP2_SUPER_MAGIC
    })
}

// ------------------------------------------------------------------ swap

/// Upstream's text when swap is on and `failSwapOn` holds.
pub const SWAP_ON_ERROR: &str =
    "running with swap on is not supported, please disable swap or set --fail-swap-on flag to false";

/// Whether `/proc/swaps` lists a device (upstream
/// isSwapOnAccordingToProcSwaps: any non-empty line after the header).
pub fn swap_on_in(proc_swaps: &str) -> bool {
    proc_swaps.lines().skip(1).any(|l| !l.trim().is_empty())
}

/// Whether swap is on; a missing `/proc/swaps` means off, as upstream.
pub fn swap_on() -> std::io::Result<bool> {
    match std::fs::read_to_string("/proc/swaps") {
        Ok(s) => Ok(swap_on_in(&s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Swap was on when rkubelet started (with `failSwapOn: false`).
static SWAP_ON: OnceLock<bool> = OnceLock::new();

/// Records what the start's swap check found.
pub fn note_swap_on(on: bool) {
    let _ = SWAP_ON.set(on);
}

/// Upstream's Node event text when swap is on and tmpfs cannot be kept out
/// of it.
pub const MEMORY_BACKED_VOLUMES_ON_DISK: &str = "The tmpfs noswap option is not supported. \
     Memory-backed volumes (e.g. secrets, emptyDirs, etc.) might be swapped to disk and should no longer be considered secure.";

/// Whether the Node gets upstream's `PossibleMemoryBackedVolumesOnDisk`
/// warning: swap on, and tmpfs without `noswap` (call off the async
/// threads: it may try a mount).
pub fn memory_backed_volumes_on_disk() -> bool {
    SWAP_ON.get().copied().unwrap_or(false) && !tmpfs_noswap_supported()
}

/// Whether tmpfs takes the `noswap` option (upstream
/// IsTmpfsNoswapOptionSupported): kernels from 6.4 do; older ones are
/// asked with a trial mount in a temporary directory. Decided once.
pub fn tmpfs_noswap_supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        if kernel_at_least(&release, (6, 4)) {
            return true;
        }
        let dir = std::env::temp_dir().join(format!("tmpfs-noswap-test-{}", std::process::id()));
        if std::fs::create_dir_all(&dir).is_err() {
            return false;
        }
        let ok = mount_tmpfs_with(&dir, "noswap").is_ok();
        if ok {
            // SAFETY: a NUL-terminated path that outlives the call.
            if let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) {
                unsafe { libc::umount2(c.as_ptr(), 0) };
            }
        }
        let _ = std::fs::remove_dir(&dir);
        ok
    })
}

/// Whether a `uname -r` release is at least `want` (major, minor).
fn kernel_at_least(release: &str, want: (u32, u32)) -> bool {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= want
}

/// Mounts a tmpfs with `data` as its options (nosuid, nodev).
pub fn mount_tmpfs_with(dir: &Path, data: &str) -> std::io::Result<()> {
    let target = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))?;
    let data = std::ffi::CString::new(data)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in options"))?;
    // SAFETY: NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `SwapTotal` of a `/proc/meminfo` text, in bytes (cAdvisor's
/// SwapCapacity).
pub fn swap_capacity_in(meminfo: &str) -> i64 {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("SwapTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Whether the kernel accounts swap per cgroup (upstream
/// checkSwapControllerAvailability): v1's `memory.memsw.limit_in_bytes`
/// in the memory hierarchy's root, v2's `memory.swap.max` in rkubelet's
/// own cgroup (the root has none).
fn swap_controller(cgroup_v2: bool) -> bool {
    let path = if cgroup_v2 {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let Some(rel) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
            return false;
        };
        PathBuf::from("/sys/fs/cgroup")
            .join(rel.trim_start_matches('/'))
            .join("memory.swap.max")
    } else {
        PathBuf::from("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
    };
    path.exists()
}

/// How containers' memory is set beyond their limit: swap (upstream
/// configureContainerSwapResources) and the OOM group
/// (`singleProcessOOMKill`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryPolicy {
    pub cgroup_v2: bool,
    /// The kernel accounts swap per cgroup.
    pub swap_controller: bool,
    /// `memorySwap.swapBehavior: LimitedSwap`.
    pub limited_swap: bool,
    pub memory_capacity: i64,
    pub swap_capacity: i64,
    /// Kill a container's whole cgroup on OOM (v2's `memory.oom.group`):
    /// upstream's default on v2 unless `singleProcessOOMKill` is true.
    pub oom_group: bool,
}

impl MemoryPolicy {
    /// From the configuration and the host (reads /proc and /sys: call
    /// off the async threads).
    pub fn detect(
        swap_behavior: &str,
        single_process_oom_kill: Option<bool>,
        memory_capacity: i64,
    ) -> Self {
        let cgroup_v2 = cgroup_v2_unified();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        MemoryPolicy {
            cgroup_v2,
            swap_controller: swap_controller(cgroup_v2),
            limited_swap: swap_behavior == "LimitedSwap",
            memory_capacity,
            swap_capacity: swap_capacity_in(&meminfo),
            // v1 always kills a single process, as upstream forces there.
            oom_group: cgroup_v2 && single_process_oom_kill != Some(true),
        }
    }

    /// Sets `r`'s swap limit and OOM group for `c` of `pod`, whose memory
    /// limit is already in `r`.
    pub fn apply(&self, pod: &Pod, c: &Container, r: &mut LinuxContainerResources) {
        if self.swap_controller {
            match self.limited_swap_bytes(pod, c) {
                Some(bytes) => self.set_swap(r, bytes),
                None if self.cgroup_v2 => self.set_swap(r, 0),
                // v1 NoSwap: memory+swap capped at the memory limit (0, no
                // limit, leaves it unset, as upstream).
                None => r.memory_swap_limit_in_bytes = r.memory_limit_in_bytes,
            }
        }
        if self.oom_group {
            r.unified
                .insert("memory.oom.group".to_string(), "1".to_string());
        }
    }

    fn set_swap(&self, r: &mut LinuxContainerResources, bytes: i64) {
        r.unified
            .insert("memory.swap.max".to_string(), bytes.to_string());
    }

    /// The swap a container may use under LimitedSwap (upstream
    /// GetContainerSwapBehavior and calcSwapForBurstablePods): only v2,
    /// only Burstable containers of non-critical pods whose memory request
    /// is set and below their limit, in proportion of the node's memory.
    /// `None` means NoSwap.
    fn limited_swap_bytes(&self, pod: &Pod, c: &Container) -> Option<i64> {
        if !self.limited_swap || !self.cgroup_v2 || super::is_critical(pod) {
            return None;
        }
        if super::pod_qos(pod) != super::QosClass::Burstable {
            return None;
        }
        let res = super::container_resources(c);
        let (request, limit) = (res.mem_request.unwrap_or(0), res.mem_limit.unwrap_or(0));
        if (request == 0 && limit == 0) || request == limit {
            return None;
        }
        if self.memory_capacity <= 0 || request > self.memory_capacity {
            tracing::error!(
                container = %c.name,
                request,
                memory_capacity = self.memory_capacity,
                "Cannot calculate swap allocation amount; disallowing swap"
            );
            return Some(0);
        }
        let share = request as f64 / self.memory_capacity as f64;
        Some((share * self.swap_capacity as f64) as i64)
    }
}

// ------------------------------------------------------------------ sysctls

/// The kernel settings upstream's kubelet wants (component-helpers
/// sysctl.go), in a fixed order so its errors read the same each time.
pub const KERNEL_TUNABLES: [(&str, i64); 6] = [
    ("vm/overcommit_memory", 1),
    ("vm/panic_on_oom", 0),
    ("kernel/panic", 10),
    ("kernel/panic_on_oops", 1),
    ("kernel/keys/root_maxkeys", 1_000_000),
    ("kernel/keys/root_maxbytes", 25_000_000),
];

/// Makes the kernel settings under `root` (`/proc/sys`) as upstream wants
/// them, or with `protect` (`protectKernelDefaults`) only checks them.
/// Errors are joined as upstream's aggregate prints them.
pub fn setup_kernel_tunables(root: &Path, protect: bool) -> Result<(), String> {
    let mut errs = Vec::new();
    for (name, want) in KERNEL_TUNABLES {
        let path = root.join(name);
        let have = match std::fs::read_to_string(&path) {
            Ok(s) => match s.trim_matches([' ', '\n']).parse::<i64>() {
                Ok(v) => v,
                Err(e) => {
                    errs.push(format!("strconv.Atoi: parsing {:?}: {e}", s.trim()));
                    continue;
                }
            },
            Err(e) => {
                errs.push(format!("open {}: {e}", path.display()));
                continue;
            }
        };
        if have == want {
            continue;
        }
        if protect {
            errs.push(format!(
                "invalid kernel flag: {name}, expected value: {want}, actual value: {have}"
            ));
            continue;
        }
        tracing::debug!(
            flag = name,
            expected = want,
            actual = have,
            "Updating kernel flag"
        );
        if let Err(e) = std::fs::write(&path, want.to_string()) {
            errs.push(format!("open {}: {e}", path.display()));
        }
    }
    match errs.len() {
        0 => Ok(()),
        1 => Err(errs.remove(0)),
        _ => Err(format!("[{}]", errs.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn pod_with(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> (Pod, Container) {
        let list = |l: &[(&str, &str)]| {
            Some(
                l.iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
            )
        };
        let c = Container {
            name: "app".into(),
            resources: Some(ResourceRequirements {
                requests: list(requests),
                limits: list(limits),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![c.clone()],
                ..Default::default()
            }),
            ..Default::default()
        };
        (pod, c)
    }

    #[test]
    fn noswap_needs_kernel_6_4() {
        assert!(kernel_at_least("6.18.44-fc-v782\n", (6, 4)));
        assert!(kernel_at_least("6.4.0", (6, 4)));
        assert!(!kernel_at_least("6.1.0-28-amd64", (6, 4)));
        assert!(!kernel_at_least("5.19.2", (6, 4)));
        assert!(!kernel_at_least("", (6, 4)));
    }

    #[test]
    fn proc_swaps_with_a_device_means_swap_is_on() {
        let header = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";
        assert!(!swap_on_in(header));
        assert!(!swap_on_in(""));
        assert!(swap_on_in(&format!(
            "{header}/swapfile                               file\t\t1048572\t\t0\t\t-2\n"
        )));
        assert_eq!(
            swap_capacity_in("MemTotal: 10 kB\nSwapTotal:     2048 kB\n"),
            2 << 20
        );
    }

    /// Old code: no swap limit was sent, so on a v1 host with swap
    /// accounting a container could swap past its memory limit.
    #[test]
    fn no_swap_caps_memory_and_swap_at_the_limit_on_v1_and_zero_on_v2() {
        let (pod, c) = pod_with(&[("memory", "32Mi")], &[("memory", "64Mi")]);
        let v1 = MemoryPolicy {
            swap_controller: true,
            memory_capacity: 1 << 30,
            swap_capacity: 1 << 30,
            ..Default::default()
        };
        let mut r = LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            ..Default::default()
        };
        v1.apply(&pod, &c, &mut r);
        assert_eq!(r.memory_swap_limit_in_bytes, 64 << 20);
        assert!(r.unified.is_empty());
        // No swap accounting: nothing is asked of the runtime.
        let mut bare = LinuxContainerResources::default();
        MemoryPolicy::default().apply(&pod, &c, &mut bare);
        assert_eq!(bare, LinuxContainerResources::default());
        // v2 NoSwap (the default, and LimitedSwap's fallback on v1).
        let v2 = MemoryPolicy {
            cgroup_v2: true,
            oom_group: true,
            ..v1
        };
        let mut r = LinuxContainerResources::default();
        v2.apply(&pod, &c, &mut r);
        assert_eq!(
            r.unified.get("memory.swap.max").map(String::as_str),
            Some("0")
        );
        assert_eq!(
            r.unified.get("memory.oom.group").map(String::as_str),
            Some("1")
        );
        assert_eq!(r.memory_swap_limit_in_bytes, 0);
        let mut r = LinuxContainerResources::default();
        MemoryPolicy {
            limited_swap: true,
            ..v1
        }
        .apply(&pod, &c, &mut r);
        assert_eq!(r.memory_swap_limit_in_bytes, 0, "no limit in r: left unset");
    }

    #[test]
    fn limited_swap_is_the_requests_share_of_swap_for_burstable_containers_only() {
        let v2 = MemoryPolicy {
            cgroup_v2: true,
            swap_controller: true,
            limited_swap: true,
            memory_capacity: 1 << 30,
            swap_capacity: 512 << 20,
            oom_group: false,
        };
        let swap = |req: &[(&str, &str)], lim: &[(&str, &str)]| {
            let (pod, c) = pod_with(req, lim);
            let mut r = LinuxContainerResources::default();
            v2.apply(&pod, &c, &mut r);
            r.unified
                .get("memory.swap.max")
                .cloned()
                .unwrap_or_default()
        };
        // 256Mi of 1Gi requested: a quarter of 512Mi.
        assert_eq!(
            swap(&[("memory", "256Mi")], &[("memory", "512Mi")]),
            (128 << 20).to_string()
        );
        // Request equal to limit, no memory asked, Guaranteed, BestEffort: none.
        assert_eq!(
            swap(&[("memory", "256Mi"), ("cpu", "1")], &[("memory", "256Mi")]),
            "0"
        );
        assert_eq!(swap(&[("cpu", "100m")], &[]), "0");
        assert_eq!(swap(&[], &[]), "0");
        assert_eq!(
            swap(
                &[("memory", "256Mi"), ("cpu", "1")],
                &[("memory", "256Mi"), ("cpu", "1")]
            ),
            "0"
        );
        // A request over the node's memory: no swap, as upstream.
        assert_eq!(swap(&[("memory", "2Gi")], &[("memory", "3Gi")]), "0");
    }

    /// Old code: the kernel settings were never looked at.
    #[test]
    fn kernel_tunables_are_set_or_with_protection_reported() {
        let dir = std::env::temp_dir().join(format!("rkubelet-sysctl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (name, want) in KERNEL_TUNABLES {
            let p = dir.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, format!("{want}\n")).unwrap();
        }
        assert_eq!(setup_kernel_tunables(&dir, true), Ok(()));
        std::fs::write(dir.join("kernel/panic"), "1\n").unwrap();
        std::fs::write(dir.join("vm/overcommit_memory"), "0\n").unwrap();
        assert_eq!(
            setup_kernel_tunables(&dir, true),
            Err(
                "[invalid kernel flag: vm/overcommit_memory, expected value: 1, actual value: 0, \
                 invalid kernel flag: kernel/panic, expected value: 10, actual value: 1]"
                    .to_string()
            )
        );
        std::fs::write(dir.join("vm/overcommit_memory"), "1\n").unwrap();
        assert_eq!(
            setup_kernel_tunables(&dir, true),
            Err("invalid kernel flag: kernel/panic, expected value: 10, actual value: 1".into())
        );
        assert_eq!(setup_kernel_tunables(&dir, false), Ok(()));
        assert_eq!(
            std::fs::read_to_string(dir.join("kernel/panic")).unwrap(),
            "10"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
