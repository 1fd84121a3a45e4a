//! A `Snapshot` as the statsapi Summary (upstream
//! `pkg/kubelet/server/stats/summary.go` and the CRI/cAdvisor stats
//! providers' field mapping).

use super::cgroup::{CgroupSample, Psi, PsiPair};
use super::procfs::{FsFigures, Interface};
use super::provider::{NodeRaw, Snapshot};
use super::types::*;

fn psi(p: Option<PsiPair>) -> Option<PsiStats> {
    let d = |l: super::cgroup::PsiLine| PsiData {
        total: l.total,
        avg10: l.avg10,
        avg60: l.avg60,
        avg300: l.avg300,
    };
    p.map(|p| PsiStats {
        some: d(p.some),
        full: d(p.full),
    })
}

fn cpu_stats(t: i64, s: &CgroupSample, nano_cores: Option<u64>) -> Option<CpuStats> {
    let c = s.cpu?;
    Some(CpuStats {
        time: time_from_ns(t),
        // Upstream starts it at 0 and fills it once a rate is known (a
        // first sample has none): present, as old metrics-server needs.
        usage_nano_cores: Some(nano_cores.unwrap_or(0)),
        usage_core_nano_seconds: Some(c.usage_ns),
        psi: psi(s.psi.and_then(|p: Psi| p.cpu)),
    })
}

/// `availableBytes` only where a limit is set, as upstream.
fn memory_stats(t: i64, s: &CgroupSample, capacity: Option<u64>) -> Option<MemoryStats> {
    let m = s.memory?;
    let limit = m.limit.filter(|l| *l < (1 << 62)).or(capacity);
    Some(MemoryStats {
        time: time_from_ns(t),
        available_bytes: limit.map(|l| l.saturating_sub(m.working_set)),
        usage_bytes: Some(m.usage),
        working_set_bytes: Some(m.working_set),
        rss_bytes: Some(m.rss),
        page_faults: Some(m.pgfault),
        major_page_faults: Some(m.pgmajfault),
        psi: psi(s.psi.and_then(|p| p.memory)),
    })
}

/// Upstream's cadvisorInfoToSwapStats: the usage, and what the swap limit
/// leaves when there is one (on v1 the limit is memory and swap together,
/// as cAdvisor reads it).
fn swap_stats(t: i64, s: &CgroupSample) -> Option<SwapStats> {
    let m = s.memory?;
    let usage = m.swap.unwrap_or(0);
    Some(SwapStats {
        time: time_from_ns(t),
        swap_available_bytes: m
            .swap_limit
            .filter(|l| *l <= 1 << 62)
            .map(|l| l.saturating_sub(usage)),
        swap_usage_bytes: Some(usage),
    })
}

fn io_stats(t: i64, s: &CgroupSample) -> Option<IoStats> {
    let p = s.psi.and_then(|p| p.io)?;
    Some(IoStats {
        time: time_from_ns(t),
        psi: psi(Some(p)),
    })
}

fn network(t: i64, ifs: &[Interface]) -> Option<NetworkStats> {
    if ifs.is_empty() {
        return None;
    }
    let conv = |i: &Interface| InterfaceStats {
        name: i.name.clone(),
        rx_bytes: Some(i.rx_bytes),
        rx_errors: Some(i.rx_errors),
        tx_bytes: Some(i.tx_bytes),
        tx_errors: Some(i.tx_errors),
    };
    // Upstream's default interface is eth0; otherwise the first one.
    let default = ifs.iter().find(|i| i.name == "eth0").unwrap_or(&ifs[0]);
    Some(NetworkStats {
        time: time_from_ns(t),
        default: conv(default),
        interfaces: ifs.iter().map(conv).collect(),
    })
}

fn fs_stats(t: i64, f: Option<&FsFigures>, used: Option<u64>, inodes_used: Option<u64>) -> FsStats {
    FsStats {
        time: time_from_ns(t),
        available_bytes: f.map(|f| f.available),
        capacity_bytes: f.map(|f| f.capacity),
        used_bytes: used,
        inodes_free: f.map(|f| f.inodes_free),
        inodes: f.map(|f| f.inodes),
        inodes_used,
    }
}

fn node_cpu_memory(n: &NodeRaw, t: i64) -> (Option<CpuStats>, Option<MemoryStats>) {
    let mut root = n.root.clone();
    if root.cpu.is_none() {
        root.cpu = n.busy_ns.map(|u| super::cgroup::CpuSample {
            usage_ns: u,
            ..Default::default()
        });
    }
    // A v2 root cgroup whose memory.stat could not be read either (its
    // figures come from there, see read_v2): /proc/meminfo.
    if root.memory.is_none() && n.meminfo.total > 0 {
        let usage = n.meminfo.total - n.meminfo.free;
        root.memory = Some(super::cgroup::MemorySample {
            usage,
            working_set: usage.saturating_sub(n.meminfo.inactive_file),
            ..Default::default()
        });
    }
    let cap = (n.meminfo.total > 0).then_some(n.meminfo.total);
    (
        cpu_stats(t, &root, n.cpu_nano_cores),
        memory_stats(t, &root, cap),
    )
}

pub fn build(snap: &Snapshot, node_name: &str, only_cpu_and_memory: bool) -> Summary {
    let t = snap.time_ns;
    let n = &snap.node;
    let full = snap.full && !only_cpu_and_memory;
    let (cpu, memory) = node_cpu_memory(n, t);
    let system_containers = snap
        .system
        .iter()
        .map(|(name, c)| ContainerStats {
            name: name.clone(),
            start_time: time_from_ns(n.boot_ns),
            cpu: cpu_stats(t, &c.sample, c.cpu_nano_cores),
            memory: memory_stats(t, &c.sample, None),
            rootfs: None,
            logs: None,
            swap: None,
            io: None,
        })
        .collect();
    let imagefs_figs = n.imagefs.as_ref().and_then(|(f, _, _)| *f);
    let node = NodeStats {
        node_name: node_name.to_string(),
        system_containers,
        start_time: time_from_ns(n.boot_ns),
        cpu,
        memory,
        network: if full {
            network(t, &n.interfaces)
        } else {
            None
        },
        fs: full.then(|| {
            let f = n.rootfs.as_ref();
            FsStats {
                used_bytes: f.map(|f| f.capacity - f.free),
                inodes_used: f.map(|f| f.inodes - f.inodes_free),
                ..fs_stats(t, f, None, None)
            }
        }),
        runtime: full.then(|| {
            let image_fs = n
                .imagefs
                .as_ref()
                .map(|(f, used, inodes)| fs_stats(t, f.as_ref(), *used, *inodes));
            // Upstream's CRI stats provider: a runtime that reports no
            // separate container filesystem (containerd 1.7 reports none)
            // writes containers where its images are, so containerFs is
            // the image filesystem.
            RuntimeStats {
                container_fs: image_fs.clone(),
                image_fs,
            }
        }),
        rlimit: full.then(|| RlimitStats {
            time: time_from_ns(t),
            maxpid: n.maxpid,
            curproc: n.curproc,
        }),
        swap: Some(SwapStats {
            time: time_from_ns(t),
            swap_available_bytes: Some(n.meminfo.swap_free),
            swap_usage_bytes: Some(n.meminfo.swap_total.saturating_sub(n.meminfo.swap_free)),
        }),
        io: if only_cpu_and_memory {
            None
        } else {
            io_stats(t, &n.root)
        },
    };
    // Upstream's CRI stats provider lists a pod for its running
    // containers: one without any (pulling, crash-looping, completed) is
    // not in the summary.
    let pods = snap
        .pods
        .iter()
        .filter(|p| !p.containers.is_empty())
        .map(|p| {
            let containers: Vec<ContainerStats> = p
                .containers
                .iter()
                .map(|c| ContainerStats {
                    name: c.name.clone(),
                    start_time: time_from_ns(c.created_ns),
                    cpu: cpu_stats(t, &c.sample, c.cpu_nano_cores),
                    memory: memory_stats(t, &c.sample, None),
                    rootfs: full
                        .then(|| {
                            c.rootfs
                                .map(|(u, i)| fs_stats(t, imagefs_figs.as_ref(), u, i))
                        })
                        .flatten(),
                    logs: full
                        .then(|| {
                            c.logs
                                .map(|(u, i)| fs_stats(t, n.logs_fs.as_ref(), Some(u), Some(i)))
                        })
                        .flatten(),
                    swap: swap_stats(t, &c.sample),
                    io: if full { io_stats(t, &c.sample) } else { None },
                })
                .collect();
            // Without a pod cgroup (another layout, or no cgroups at all),
            // the pod's figures are its containers' sums, as upstream's CRI
            // provider does.
            let (pcpu, pmem) = if p.cgroup.is_some() {
                (
                    cpu_stats(t, &p.sample, p.cpu_nano_cores),
                    memory_stats(t, &p.sample, None),
                )
            } else {
                sum_containers(t, &containers)
            };
            let ephemeral = full.then(|| {
                let used: u64 = containers
                    .iter()
                    .flat_map(|c| [&c.rootfs, &c.logs])
                    .filter_map(|f| f.as_ref().and_then(|f| f.used_bytes))
                    .sum();
                let inodes: u64 = containers
                    .iter()
                    .flat_map(|c| [&c.rootfs, &c.logs])
                    .filter_map(|f| f.as_ref().and_then(|f| f.inodes_used))
                    .sum();
                let (hosts_used, hosts_inodes) = p.etc_hosts.unwrap_or_default();
                fs_stats(
                    t,
                    n.rootfs.as_ref(),
                    Some(used + hosts_used),
                    Some(inodes + hosts_inodes),
                )
            });
            PodStats {
                pod_ref: PodReference {
                    name: p.name.clone(),
                    namespace: p.namespace.clone(),
                    uid: p.uid.clone(),
                },
                start_time: time_from_ns(p.created_ns),
                containers,
                cpu: pcpu,
                memory: pmem,
                network: if full {
                    network(t, &p.interfaces)
                } else {
                    None
                },
                volume_stats: Vec::new(),
                ephemeral_storage: ephemeral,
                // Upstream's addProcessStats: the containers' process
                // counts summed (not threads, and not the pause process).
                process_stats: if full {
                    let counts: Vec<u64> = p
                        .containers
                        .iter()
                        .filter_map(|c| c.sample.processes)
                        .collect();
                    (!counts.is_empty()).then(|| ProcessStats {
                        process_count: Some(counts.iter().sum()),
                    })
                } else {
                    None
                },
                swap: if p.cgroup.is_some() {
                    swap_stats(t, &p.sample)
                } else {
                    None
                },
                io: if full { io_stats(t, &p.sample) } else { None },
            }
        })
        .collect();
    Summary { node, pods }
}

fn sum_containers(t: i64, cs: &[ContainerStats]) -> (Option<CpuStats>, Option<MemoryStats>) {
    let cpus: Vec<&CpuStats> = cs.iter().filter_map(|c| c.cpu.as_ref()).collect();
    let mems: Vec<&MemoryStats> = cs.iter().filter_map(|c| c.memory.as_ref()).collect();
    let sum = |v: Vec<Option<u64>>| -> Option<u64> {
        v.iter()
            .all(|x| x.is_some())
            .then(|| v.iter().flatten().sum())
    };
    let cpu = (!cpus.is_empty()).then(|| CpuStats {
        time: time_from_ns(t),
        usage_nano_cores: sum(cpus.iter().map(|c| c.usage_nano_cores).collect()),
        usage_core_nano_seconds: sum(cpus.iter().map(|c| c.usage_core_nano_seconds).collect()),
        psi: None,
    });
    let memory = (!mems.is_empty()).then(|| MemoryStats {
        time: time_from_ns(t),
        available_bytes: None,
        usage_bytes: sum(mems.iter().map(|m| m.usage_bytes).collect()),
        working_set_bytes: sum(mems.iter().map(|m| m.working_set_bytes).collect()),
        rss_bytes: sum(mems.iter().map(|m| m.rss_bytes).collect()),
        page_faults: sum(mems.iter().map(|m| m.page_faults).collect()),
        major_page_faults: sum(mems.iter().map(|m| m.major_page_faults).collect()),
        psi: None,
    });
    (cpu, memory)
}

/// A pod's volumes into its summary entry, as upstream's
/// calcEphemeralStorage counts them: the local ephemeral ones (emptyDir
/// on disk, configMap, gitRepo) are part of its ephemeral storage.
pub fn add_volumes(p: &mut PodStats, volumes: &[super::volumes::VolumeFigures]) {
    p.volume_stats = volumes.iter().map(|v| v.to_stats()).collect();
    let Some(eph) = p.ephemeral_storage.as_mut() else {
        return;
    };
    for v in volumes.iter().filter(|v| v.local_ephemeral) {
        eph.used_bytes = Some(eph.used_bytes.unwrap_or(0) + v.used);
        eph.inodes_used = Some(eph.inodes_used.unwrap_or(0) + v.inodes_used);
        let t = time_from_ns(v.time);
        if t > eph.time {
            eph.time = t;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::provider::{NodeRaw, Snapshot};

    #[test]
    fn image_fs_usage_is_kept_when_its_file_system_cannot_be_looked_at() {
        // Upstream's ImageFsStats: the image filesystem's usage from the
        // runtime is reported even when its mountpoint gives no figures
        // (a best-effort partial result). Old code dropped imageFs.
        let snap = Snapshot {
            time_ns: 1,
            full: true,
            node: NodeRaw {
                imagefs: Some((None, Some(4096), Some(7))),
                ..Default::default()
            },
            ..Default::default()
        };
        let s = build(&snap, "n1", false);
        let image_fs = s.node.runtime.unwrap().image_fs.unwrap();
        assert_eq!(image_fs.used_bytes, Some(4096));
        assert_eq!(image_fs.inodes_used, Some(7));
        assert_eq!(image_fs.capacity_bytes, None);
        assert_eq!(image_fs.available_bytes, None);
    }
}
