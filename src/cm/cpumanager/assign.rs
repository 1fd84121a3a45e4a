//! Upstream's topology-aware best fit (`cpu_assignment.go`,
//! takeByTopologyNUMAPacked with the packed sorting): whole NUMA nodes and
//! sockets first, then whole cores, then single threads that fill cores
//! already partly used. The spread, NUMA-distributed and uncore-cache
//! variants (policy options not followed here) are left out.

use super::cpuset::CpuSet;
use super::topology::{CpuTopology, Details};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TakeError {
    #[error("not enough cpus available to satisfy request: requested={requested}, available={available}")]
    NotEnough { requested: usize, available: usize },
    #[error("failed to allocate cpus")]
    Failed,
}

struct Acc<'a> {
    topo: &'a CpuTopology,
    /// What is still available.
    details: Details,
    needed: i64,
    result: CpuSet,
    /// NUMA nodes hold one or more sockets: take NUMA nodes first
    /// (upstream numaFirst); else sockets first.
    numa_first: bool,
}

impl<'a> Acc<'a> {
    /// Upstream's sort: fewest available CPUs first, then lowest id.
    fn sort(&self, ids: &mut [usize], cpus: impl Fn(&Details, usize) -> CpuSet) {
        ids.sort_by_key(|id| (cpus(&self.details, *id).len(), *id));
    }

    fn sorted_numa_nodes(&self) -> Vec<usize> {
        if self.numa_first {
            let mut v = self.details.numa_nodes();
            self.sort(&mut v, Details::cpus_in_numa);
            v
        } else {
            let mut out = Vec::new();
            for s in self.sorted_sockets() {
                let mut v = self.details.numa_in_socket(s);
                self.sort(&mut v, Details::cpus_in_numa);
                out.extend(v);
            }
            out
        }
    }

    fn sorted_sockets(&self) -> Vec<usize> {
        if self.numa_first {
            let mut out = Vec::new();
            for n in self.sorted_numa_nodes() {
                let mut v = self.details.sockets_in_numa(n);
                self.sort(&mut v, Details::cpus_in_socket);
                out.extend(v);
            }
            out
        } else {
            let mut v = self.details.sockets();
            self.sort(&mut v, Details::cpus_in_socket);
            v
        }
    }

    fn sorted_cores(&self) -> Vec<usize> {
        let mut out = Vec::new();
        if self.numa_first {
            for s in self.sorted_sockets() {
                let mut v = self.details.cores_in_socket(s);
                self.sort(&mut v, Details::cpus_in_core);
                out.extend(v);
            }
        } else {
            for n in self.sorted_numa_nodes() {
                let mut v = self.details.cores_in_numa(n);
                self.sort(&mut v, Details::cpus_in_core);
                out.extend(v);
            }
        }
        out
    }

    /// Packed order: core by core in sorted core order, each core's CPUs
    /// ascending.
    fn sorted_cpus_packed(&self) -> Vec<usize> {
        self.sorted_cores()
            .into_iter()
            .flat_map(|c| self.details.cpus_in_core(c).iter().collect::<Vec<_>>())
            .collect()
    }

    fn take(&mut self, cpus: &CpuSet) {
        self.result = self.result.union(cpus);
        self.details = self
            .details
            .keep_only(&self.details.cpus().difference(&self.result));
        self.needed -= cpus.len() as i64;
    }

    fn needs_at_least(&self, n: usize) -> bool {
        self.needed >= n as i64
    }

    fn satisfied(&self) -> bool {
        self.needed < 1
    }

    fn take_full_numa_nodes(&mut self) {
        let free: Vec<usize> = self
            .sorted_numa_nodes()
            .into_iter()
            .filter(|n| {
                self.details.cpus_in_numa(*n).len() == self.topo.details.cpus_in_numa(*n).len()
            })
            .collect();
        for n in free {
            let cpus = self.topo.details.cpus_in_numa(n);
            if self.needs_at_least(cpus.len()) {
                self.take(&cpus);
            }
        }
    }

    fn take_full_sockets(&mut self) {
        let per_socket = self.topo.cpus_per_socket();
        let free: Vec<usize> = self
            .sorted_sockets()
            .into_iter()
            .filter(|s| self.details.cpus_in_socket(*s).len() == per_socket)
            .collect();
        for s in free {
            let cpus = self.topo.details.cpus_in_socket(s);
            if self.needs_at_least(cpus.len()) {
                self.take(&cpus);
            }
        }
    }

    fn take_full_cores(&mut self) {
        let per_core = self.topo.cpus_per_core();
        let free: Vec<usize> = self
            .sorted_cores()
            .into_iter()
            .filter(|c| self.details.cpus_in_core(*c).len() == per_core)
            .collect();
        for c in free {
            let cpus = self.topo.details.cpus_in_core(c);
            if self.needs_at_least(cpus.len()) {
                self.take(&cpus);
            }
        }
    }

    fn take_remaining_cpus(&mut self) {
        for cpu in self.sorted_cpus_packed() {
            self.take(&[cpu].into_iter().collect());
            if self.satisfied() {
                return;
            }
        }
    }
}

/// `num` CPUs out of `available`, upstream's takeByTopologyNUMAPacked with
/// the packed strategy.
pub fn take_by_topology(
    topo: &CpuTopology,
    available: &CpuSet,
    num: usize,
) -> Result<CpuSet, TakeError> {
    let mut acc = Acc {
        topo,
        details: topo.details.keep_only(available),
        needed: num as i64,
        result: CpuSet::new(),
        numa_first: topo.num_sockets >= topo.num_numa_nodes,
    };
    if acc.satisfied() {
        return Ok(acc.result);
    }
    if acc.needed > acc.details.cpus().len() as i64 {
        return Err(TakeError::NotEnough {
            requested: num,
            available: available.len(),
        });
    }
    if acc.numa_first {
        acc.take_full_numa_nodes();
        if acc.satisfied() {
            return Ok(acc.result);
        }
        acc.take_full_sockets();
    } else {
        acc.take_full_sockets();
        if acc.satisfied() {
            return Ok(acc.result);
        }
        acc.take_full_numa_nodes();
    }
    if acc.satisfied() {
        return Ok(acc.result);
    }
    acc.take_full_cores();
    if acc.satisfied() {
        return Ok(acc.result);
    }
    acc.take_remaining_cpus();
    if acc.satisfied() {
        return Ok(acc.result);
    }
    Err(TakeError::Failed)
}

#[cfg(test)]
pub mod tests {
    use super::super::topology::tests::from_table;
    use super::*;

    /// policy_test.go's topoSingleSocketHT: 4 cores, CPU c and c+4 siblings.
    pub fn single_socket_ht() -> CpuTopology {
        from_table(&(0..8).map(|c| (c, c % 4, 0, 0)).collect::<Vec<_>>())
    }

    /// topoDualSocketHT: 12 CPUs; even ids socket 0, odd ids socket 1;
    /// core c%6.
    pub fn dual_socket_ht() -> CpuTopology {
        from_table(
            &(0..12)
                .map(|c| (c, c % 6, c % 2, c % 2))
                .collect::<Vec<_>>(),
        )
    }

    /// topoDualSocketNoHT: 8 CPUs, 0-3 socket 0, 4-7 socket 1.
    pub fn dual_socket_no_ht() -> CpuTopology {
        from_table(&(0..8).map(|c| (c, c, c / 4, c / 4)).collect::<Vec<_>>())
    }

    /// topoDualSocketMultiNumaPerSocketHT: 80 CPUs, 2 sockets, 4 NUMA
    /// nodes of 10 cores; CPU c and c+40 siblings.
    fn dual_socket_multi_numa_ht() -> CpuTopology {
        from_table(
            &(0..80)
                .map(|c| (c, c % 40, (c % 40) / 20, (c % 40) / 10))
                .collect::<Vec<_>>(),
        )
    }

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap()
    }

    #[test]
    fn takes_as_upstreams_common_test_cases() {
        // cpu_assignment_test.go commonTakeByTopologyTestCases.
        // (name, topology, available, request, expected set or error).
        type Case = (
            &'static str,
            CpuTopology,
            &'static str,
            usize,
            Result<&'static str, &'static str>,
        );
        let cases: &[Case] = &[
            (
                "more than available",
                single_socket_ht(),
                "0,2,4,6",
                5,
                Err("not enough cpus available to satisfy request: requested=5, available=4"),
            ),
            ("zero", single_socket_ht(), "0-7", 0, Ok("")),
            ("one", single_socket_ht(), "0-7", 1, Ok("0")),
            ("one, some taken", single_socket_ht(), "1,3,5-7", 1, Ok("6")),
            ("two", single_socket_ht(), "0-7", 2, Ok("0,4")),
            ("all", single_socket_ht(), "0-7", 8, Ok("0-7")),
            (
                "two, one core free",
                single_socket_ht(),
                "0-3,6",
                2,
                Ok("2,6"),
            ),
            ("a socket", dual_socket_ht(), "0-11", 6, Ok("0,2,4,6,8,10")),
            (
                "a socket, multi-NUMA",
                dual_socket_multi_numa_ht(),
                "0-79",
                40,
                Ok("0-19,40-59"),
            ),
            (
                "a NUMA node",
                dual_socket_multi_numa_ht(),
                "0-79",
                20,
                Ok("0-9,40-49"),
            ),
            (
                "a NUMA node, one taken",
                dual_socket_multi_numa_ht(),
                "10-39,50-79",
                20,
                Ok("10-19,50-59"),
            ),
            (
                "socket and NUMA node",
                dual_socket_multi_numa_ht(),
                "0-79",
                60,
                Ok("0-29,40-69"),
            ),
            (
                "socket and NUMA node, a core taken",
                dual_socket_multi_numa_ht(),
                "1-39,41-79",
                60,
                Ok("10-39,50-79"),
            ),
        ];
        for (name, topo, avail, n, want) in cases {
            let got = take_by_topology(topo, &set(avail), *n);
            match want {
                Ok(w) => assert_eq!(got, Ok(set(w)), "{name}"),
                Err(e) => assert_eq!(got.unwrap_err().to_string(), *e, "{name}"),
            }
        }
    }

    #[test]
    fn a_synthetic_two_by_two_by_two_machine() {
        // 2 sockets × 2 cores × 2 threads: socket 0 has cores {0,4} and
        // {1,5}, socket 1 {2,6} and {3,7}.
        let topo = super::super::topology::tests::synthetic(2, 2, 2);
        assert_eq!(topo.cpus_per_core(), 2);
        // A whole socket, the first.
        assert_eq!(take_by_topology(&topo, &set("0-7"), 4), Ok(set("0-1,4-5")));
        // A whole core from the socket with fewer CPUs left, before a
        // whole socket is broken.
        assert_eq!(take_by_topology(&topo, &set("1-7"), 2), Ok(set("1,5")));
        // One thread: the sibling of a core already partly used (CPU 0's).
        assert_eq!(take_by_topology(&topo, &set("1-7"), 1), Ok(set("4")));
        // Three: a whole socket's core first, then the lone thread.
        assert_eq!(take_by_topology(&topo, &set("1-7"), 3), Ok(set("1,4-5")));
    }
}
