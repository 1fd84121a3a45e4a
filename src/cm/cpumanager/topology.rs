//! The machine's CPU topology (upstream `cpumanager/topology`, fed there by
//! cAdvisor): for each online CPU its core, socket and NUMA node, read from
//! `/sys/devices/system/cpu`. A core is named by its lowest CPU id
//! (upstream getUniqueCoreID), since sysfs's `core_id` repeats across
//! sockets.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::cpuset::CpuSet;

#[derive(Debug, Clone, thiserror::Error)]
pub enum TopologyError {
    #[error("could not detect number of cpus")]
    NoCpus,
    #[error("reading {path}: {message}")]
    Read { path: String, message: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuInfo {
    pub core: usize,
    pub socket: usize,
    pub numa: usize,
}

/// CPU id → where it sits; also a view of a subset of the machine (the
/// CPUs still available during an allocation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Details(pub BTreeMap<usize, CpuInfo>);

impl Details {
    pub fn cpus(&self) -> CpuSet {
        self.0.keys().copied().collect()
    }

    fn ids(&self, f: impl Fn(&CpuInfo) -> usize) -> Vec<usize> {
        let set: BTreeSet<usize> = self.0.values().map(f).collect();
        set.into_iter().collect()
    }

    fn cpus_where(&self, f: impl Fn(&CpuInfo) -> bool) -> CpuSet {
        self.0
            .iter()
            .filter(|(_, i)| f(i))
            .map(|(c, _)| *c)
            .collect()
    }

    pub fn numa_nodes(&self) -> Vec<usize> {
        self.ids(|i| i.numa)
    }

    pub fn sockets(&self) -> Vec<usize> {
        self.ids(|i| i.socket)
    }

    pub fn cpus_in_numa(&self, numa: usize) -> CpuSet {
        self.cpus_where(|i| i.numa == numa)
    }

    pub fn cpus_in_socket(&self, socket: usize) -> CpuSet {
        self.cpus_where(|i| i.socket == socket)
    }

    pub fn cpus_in_core(&self, core: usize) -> CpuSet {
        self.cpus_where(|i| i.core == core)
    }

    /// The cores of the given CPUs' (ascending).
    pub fn cores_of(&self, cpus: &CpuSet) -> Vec<usize> {
        let set: BTreeSet<usize> = cpus
            .iter()
            .filter_map(|c| self.0.get(&c).map(|i| i.core))
            .collect();
        set.into_iter().collect()
    }

    pub fn sockets_in_numa(&self, numa: usize) -> Vec<usize> {
        let set: BTreeSet<usize> = self
            .0
            .values()
            .filter(|i| i.numa == numa)
            .map(|i| i.socket)
            .collect();
        set.into_iter().collect()
    }

    pub fn numa_in_socket(&self, socket: usize) -> Vec<usize> {
        let set: BTreeSet<usize> = self
            .0
            .values()
            .filter(|i| i.socket == socket)
            .map(|i| i.numa)
            .collect();
        set.into_iter().collect()
    }

    pub fn cores_in_socket(&self, socket: usize) -> Vec<usize> {
        let set: BTreeSet<usize> = self
            .0
            .values()
            .filter(|i| i.socket == socket)
            .map(|i| i.core)
            .collect();
        set.into_iter().collect()
    }

    pub fn cores_in_numa(&self, numa: usize) -> Vec<usize> {
        let set: BTreeSet<usize> = self
            .0
            .values()
            .filter(|i| i.numa == numa)
            .map(|i| i.core)
            .collect();
        set.into_iter().collect()
    }

    /// Only the given CPUs (upstream KeepOnly).
    pub fn keep_only(&self, cpus: &CpuSet) -> Details {
        Details(
            self.0
                .iter()
                .filter(|(c, _)| cpus.contains(**c))
                .map(|(c, i)| (*c, *i))
                .collect(),
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuTopology {
    pub num_cpus: usize,
    pub num_sockets: usize,
    pub num_cores: usize,
    pub num_numa_nodes: usize,
    pub details: Details,
}

impl CpuTopology {
    /// From each CPU's place; the counts as upstream's Discover makes them.
    pub fn from_details(details: BTreeMap<usize, CpuInfo>) -> CpuTopology {
        let d = Details(details);
        CpuTopology {
            num_cpus: d.0.len(),
            num_sockets: d.sockets().len(),
            num_cores: d.ids(|i| i.core).len(),
            num_numa_nodes: d.numa_nodes().len(),
            details: d,
        }
    }

    pub fn cpus_per_core(&self) -> usize {
        self.num_cpus.checked_div(self.num_cores).unwrap_or(0)
    }

    pub fn cpus_per_socket(&self) -> usize {
        self.num_cpus.checked_div(self.num_sockets).unwrap_or(0)
    }

    pub fn all_cpus(&self) -> CpuSet {
        self.details.cpus()
    }

    /// Reads `<root>/devices/system/cpu` (root `/sys` on a host). Blocking.
    pub fn discover(sys: &Path) -> Result<CpuTopology, TopologyError> {
        let cpu_dir = sys.join("devices/system/cpu");
        let read = |p: &Path| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .map_err(|e| TopologyError::Read {
                    path: p.display().to_string(),
                    message: e.to_string(),
                })
        };
        let online_path = cpu_dir.join("online");
        let online = CpuSet::parse(&read(&online_path)?).map_err(|e| TopologyError::Read {
            path: online_path.display().to_string(),
            message: e.to_string(),
        })?;
        if online.is_empty() {
            return Err(TopologyError::NoCpus);
        }
        // A missing or odd topology file (some virtual machines and
        // containers) counts as `fallback` instead of stopping the kubelet;
        // physical_package_id is -1 on some virtual machines.
        let num = |p: &Path, fallback: usize| -> usize {
            read(p)
                .ok()
                .and_then(|t| t.parse::<i64>().ok())
                .map_or(fallback, |v| v.max(0) as usize)
        };
        // (socket, sysfs core_id) → CPUs, then each core named by its
        // lowest CPU.
        let mut places: BTreeMap<usize, (usize, usize, usize)> = BTreeMap::new();
        let mut groups: BTreeMap<(usize, usize), usize> = BTreeMap::new();
        for cpu in online.iter() {
            let dir = cpu_dir.join(format!("cpu{cpu}"));
            let socket = num(&dir.join("topology/physical_package_id"), 0);
            // Without core_id each CPU is a core of its own.
            let core_id = num(&dir.join("topology/core_id"), cpu);
            // The node<N> link in the CPU's directory; no NUMA in sysfs
            // means one node, 0 (as cAdvisor).
            let numa = std::fs::read_dir(&dir)
                .ok()
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_prefix("node"))
                        .and_then(|n| n.parse::<usize>().ok())
                })
                .min()
                .unwrap_or(0);
            places.insert(cpu, (socket, core_id, numa));
            let lowest = groups.entry((socket, core_id)).or_insert(cpu);
            *lowest = (*lowest).min(cpu);
        }
        let details = places
            .into_iter()
            .map(|(cpu, (socket, core_id, numa))| {
                let core = groups[&(socket, core_id)];
                (cpu, CpuInfo { core, socket, numa })
            })
            .collect();
        Ok(CpuTopology::from_details(details))
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// `n` sockets × `cores` cores × `threads` threads, numbered as Linux
    /// numbers them: all first threads, then all second threads (core c
    /// of socket s is CPUs s*cores+c + k*sockets*cores); one NUMA node per
    /// socket.
    pub fn synthetic(sockets: usize, cores: usize, threads: usize) -> CpuTopology {
        let per_thread = sockets * cores;
        let mut m = BTreeMap::new();
        for t in 0..threads {
            for s in 0..sockets {
                for c in 0..cores {
                    let first = s * cores + c;
                    m.insert(
                        first + t * per_thread,
                        CpuInfo {
                            core: first,
                            socket: s,
                            numa: s,
                        },
                    );
                }
            }
        }
        CpuTopology::from_details(m)
    }

    /// Upstream's test topologies (policy_test.go), with each CPU's place
    /// as (core, socket, numa).
    pub fn from_table(rows: &[(usize, usize, usize, usize)]) -> CpuTopology {
        CpuTopology::from_details(
            rows.iter()
                .map(|&(cpu, core, socket, numa)| (cpu, CpuInfo { core, socket, numa }))
                .collect(),
        )
    }

    #[test]
    fn discovers_cores_sockets_and_numa_nodes_from_sysfs() {
        let dir = crate::testutil::tempdir("cpu-topology");
        let cpu = dir.join("devices/system/cpu");
        // 1 socket, 2 cores, 2 threads: cpus 0,2 on core_id 0 and 1,3 on
        // core_id 1; cpu 4 is offline and not listed.
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cpu.join("online"), "0-3\n").unwrap();
        for (c, core) in [(0, 0), (1, 1), (2, 0), (3, 1), (4, 2)] {
            let t = cpu.join(format!("cpu{c}/topology"));
            std::fs::create_dir_all(&t).unwrap();
            std::fs::write(t.join("core_id"), format!("{core}\n")).unwrap();
            std::fs::write(t.join("physical_package_id"), "0\n").unwrap();
            std::fs::create_dir_all(cpu.join(format!("cpu{c}/node0"))).unwrap();
        }
        let topo = CpuTopology::discover(&dir).unwrap();
        assert_eq!(topo.num_cpus, 4);
        assert_eq!(topo.num_cores, 2);
        assert_eq!(topo.num_sockets, 1);
        assert_eq!(topo.num_numa_nodes, 1);
        assert_eq!(topo.cpus_per_core(), 2);
        assert_eq!(topo.details.cpus_in_core(0).to_string(), "0,2");
        assert_eq!(topo.details.cpus_in_core(1).to_string(), "1,3");
        // No topology files (some virtual machines): one core per CPU.
        std::fs::write(cpu.join("online"), "0-1,5\n").unwrap();
        let topo = CpuTopology::discover(&dir).unwrap();
        assert_eq!((topo.num_cpus, topo.num_cores), (3, 3));
        assert_eq!(topo.details.cpus_in_core(5).to_string(), "5");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn this_host_has_a_topology() {
        let topo = CpuTopology::discover(Path::new("/sys")).unwrap();
        assert!(topo.num_cpus >= 1);
        assert!(topo.cpus_per_core() >= 1);
    }
}
