//! The `static` policy (upstream `policy_static.go`) and its options
//! (`policy_options.go`).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::assign::{take_by_topology, TakeError};
use super::cpuset::CpuSet;
use super::state::State;
use super::topology::CpuTopology;

pub const FULL_PCPUS_ONLY: &str = "full-pcpus-only";
pub const DISTRIBUTE_CPUS_ACROSS_NUMA: &str = "distribute-cpus-across-numa";
pub const ALIGN_BY_SOCKET: &str = "align-by-socket";
pub const DISTRIBUTE_CPUS_ACROSS_CORES: &str = "distribute-cpus-across-cores";
pub const STRICT_CPU_RESERVATION: &str = "strict-cpu-reservation";
pub const PREFER_ALIGN_BY_UNCORE_CACHE: &str = "prefer-align-cpus-by-uncorecache";

const ALPHA: &[&str] = &[ALIGN_BY_SOCKET, DISTRIBUTE_CPUS_ACROSS_CORES];
const BETA: &[&str] = &[
    STRICT_CPU_RESERVATION,
    DISTRIBUTE_CPUS_ACROSS_NUMA,
    PREFER_ALIGN_BY_UNCORE_CACHE,
];
const STABLE: &[&str] = &[FULL_PCPUS_ONLY];

/// Options rkubelet validates but whose allocation strategies it does not
/// follow (the packed best fit is used instead).
pub const NOT_FOLLOWED: &[&str] = &[
    DISTRIBUTE_CPUS_ACROSS_NUMA,
    ALIGN_BY_SOCKET,
    DISTRIBUTE_CPUS_ACROSS_CORES,
    PREFER_ALIGN_BY_UNCORE_CACHE,
];

/// Upstream StaticPolicyOptions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    pub full_pcpus_only: bool,
    pub distribute_cpus_across_numa: bool,
    pub align_by_socket: bool,
    pub distribute_cpus_across_cores: bool,
    pub strict_cpu_reservation: bool,
    pub prefer_align_by_uncore_cache: bool,
}

/// Go's strconv.ParseBool.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

impl Options {
    /// Upstream NewStaticPolicyOptions (with CheckPolicyOptionAvailable):
    /// `gate` answers whether a feature gate is on.
    pub fn parse(
        options: &BTreeMap<String, String>,
        gate: impl Fn(&str) -> bool,
    ) -> Result<Options, String> {
        let mut o = Options::default();
        for (name, value) in options {
            let name = name.as_str();
            if !ALPHA.contains(&name) && !BETA.contains(&name) && !STABLE.contains(&name) {
                return Err(format!("unknown CPU Manager Policy option: {name:?}"));
            }
            if ALPHA.contains(&name) && !gate("CPUManagerPolicyAlphaOptions") {
                return Err(format!(
                    "CPU Manager Policy Alpha-level Options not enabled, but option {name:?} provided"
                ));
            }
            if BETA.contains(&name) && !gate("CPUManagerPolicyBetaOptions") {
                return Err(format!(
                    "CPU Manager Policy Beta-level Options not enabled, but option {name:?} provided"
                ));
            }
            // Go's error text for a bad bool.
            let v = parse_bool(value).ok_or_else(|| {
                format!(
                    "bad value for option {name:?}: strconv.ParseBool: parsing {value:?}: invalid syntax"
                )
            })?;
            match name {
                FULL_PCPUS_ONLY => o.full_pcpus_only = v,
                DISTRIBUTE_CPUS_ACROSS_NUMA => o.distribute_cpus_across_numa = v,
                ALIGN_BY_SOCKET => o.align_by_socket = v,
                DISTRIBUTE_CPUS_ACROSS_CORES => o.distribute_cpus_across_cores = v,
                STRICT_CPU_RESERVATION => o.strict_cpu_reservation = v,
                _ => o.prefer_align_by_uncore_cache = v,
            }
        }
        let both = |a: &str, b: &str| {
            Err(format!(
                "static policy options {a} and {b} can not be used at the same time"
            ))
        };
        if o.full_pcpus_only && o.distribute_cpus_across_cores {
            return both(FULL_PCPUS_ONLY, DISTRIBUTE_CPUS_ACROSS_CORES);
        }
        if o.distribute_cpus_across_numa && o.distribute_cpus_across_cores {
            return both(DISTRIBUTE_CPUS_ACROSS_NUMA, DISTRIBUTE_CPUS_ACROSS_CORES);
        }
        if o.prefer_align_by_uncore_cache && o.distribute_cpus_across_cores {
            return both(PREFER_ALIGN_BY_UNCORE_CACHE, DISTRIBUTE_CPUS_ACROSS_CORES);
        }
        if o.prefer_align_by_uncore_cache && o.distribute_cpus_across_numa {
            return both(PREFER_ALIGN_BY_UNCORE_CACHE, DISTRIBUTE_CPUS_ACROSS_NUMA);
        }
        Ok(o)
    }

    /// The options set that rkubelet does not follow.
    pub fn not_followed(&self) -> Vec<&'static str> {
        [
            (
                self.distribute_cpus_across_numa,
                DISTRIBUTE_CPUS_ACROSS_NUMA,
            ),
            (self.align_by_socket, ALIGN_BY_SOCKET),
            (
                self.distribute_cpus_across_cores,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                self.prefer_align_by_uncore_cache,
                PREFER_ALIGN_BY_UNCORE_CACHE,
            ),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| n)
        .collect()
    }
}

/// Why an exclusive allocation failed. `reason` is the pod's rejection
/// reason (upstream's admission.Error Type()).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    /// Upstream SMTAlignmentError (reason `SMTAlignmentError`).
    #[error(
        "SMT Alignment Error: requested {requested} cpus not multiple cpus per core = {per_core}"
    )]
    NotMultiple { requested: usize, per_core: usize },
    #[error("SMT Alignment Error: not enough free physical CPUs: available physical CPUs = {available}, requested CPUs = {requested}, CPUs per core = {per_core}")]
    NoPhysical {
        requested: usize,
        per_core: usize,
        available: usize,
    },
    #[error(transparent)]
    Take(#[from] TakeError),
}

impl AllocateError {
    /// The rejection's reason and message as upstream's
    /// admission.GetPodAdmitResult makes them.
    pub fn rejection(&self) -> (&'static str, String) {
        match self {
            AllocateError::Take(e) => (
                "UnexpectedAdmissionError",
                format!("Allocate failed due to {e}, which is unexpected"),
            ),
            _ => ("SMTAlignmentError", self.to_string()),
        }
    }
}

/// Upstream IsRestartableInitContainer.
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Whether the pod sets pod-level cpu or memory (upstream
/// IsPodLevelResourcesSet; the static policy leaves such pods shared).
fn pod_level_resources_set(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .is_some_and(|r| {
            [r.requests.as_ref(), r.limits.as_ref()]
                .into_iter()
                .flatten()
                .any(|m| m.keys().any(|k| crate::cm::is_pod_level_resource(k)))
        })
}

/// Upstream guaranteedCPUs: the whole CPUs a container of a Guaranteed
/// pod requests; 0 for anything else (other classes, fractions).
pub fn guaranteed_cpus(pod: &Pod, c: &Container) -> usize {
    if crate::cm::pod_qos(pod) != crate::cm::QosClass::Guaranteed {
        return 0;
    }
    match crate::cm::container_resources(c).cpu_request {
        Some(m) if m > 0 && m % 1000 == 0 => (m / 1000) as usize,
        _ => 0,
    }
}

pub struct StaticPolicy {
    pub topo: CpuTopology,
    pub reserved: CpuSet,
    /// The whole cores of the reserved CPUs (full-pcpus-only counts
    /// around them).
    reserved_physical: CpuSet,
    pub options: Options,
    /// Per pod, what its init containers held that its later containers
    /// may take again (upstream cpusToReuse; only the pod being admitted
    /// is kept).
    cpus_to_reuse: HashMap<String, CpuSet>,
    /// Whether to count into the process-wide metrics (off in unit tests,
    /// which share the registry with the metrics tests).
    pub metrics: bool,
}

impl StaticPolicy {
    /// Upstream NewStaticPolicy: `specific` (reservedSystemCPUs) when set,
    /// else `num_reserved` CPUs taken by topology.
    pub fn new(
        topo: CpuTopology,
        num_reserved: usize,
        specific: &CpuSet,
        options: Options,
    ) -> Result<StaticPolicy, String> {
        let all = topo.all_cpus();
        let reserved = if !specific.is_empty() {
            specific.clone()
        } else {
            take_by_topology(&topo, &all, num_reserved).unwrap_or_default()
        };
        if reserved.len() != num_reserved {
            return Err(format!(
                "[cpumanager] unable to reserve the required amount of CPUs (size of {reserved} did not equal {num_reserved})"
            ));
        }
        let mut reserved_physical = CpuSet::new();
        for core in topo.details.cores_of(&reserved) {
            reserved_physical = reserved_physical.union(&topo.details.cpus_in_core(core));
        }
        Ok(StaticPolicy {
            topo,
            reserved,
            reserved_physical,
            options,
            cpus_to_reuse: HashMap::new(),
            metrics: false,
        })
    }

    /// Upstream validateState (the policy's Start): a fresh state gets
    /// every CPU (less the reserved ones with strict-cpu-reservation); a
    /// stored one must account for the same CPUs.
    pub fn validate_state(&self, s: &mut State) -> Result<(), String> {
        let mut all = self.topo.all_cpus();
        if self.options.strict_cpu_reservation {
            all = all.difference(&self.reserved);
        }
        if s.default_set.is_empty() {
            if !s.assignments.is_empty() {
                return Err("default cpuset cannot be empty".into());
            }
            s.default_set = all;
            return Ok(());
        }
        let d = &s.default_set;
        if self.options.strict_cpu_reservation {
            let overlap = self.reserved.intersection(d);
            if !overlap.is_empty() {
                return Err(format!(
                    "some of strictly reserved cpus: \"{overlap}\" are present in defaultCpuSet: \"{d}\""
                ));
            }
        } else if self.reserved.intersection(d) != self.reserved {
            return Err(format!(
                "not all reserved cpus: \"{}\" are present in defaultCpuSet: \"{d}\"",
                self.reserved
            ));
        }
        let mut known = d.clone();
        for (pod, m) in &s.assignments {
            for (container, set) in m {
                if !d.intersection(set).is_empty() {
                    return Err(format!(
                        "pod: {pod}, container: {container} cpuset: \"{set}\" overlaps with default cpuset \"{d}\""
                    ));
                }
                known = known.union(set);
            }
        }
        // Upstream compares with every CPU, strict reservation or not.
        let available = self.topo.all_cpus();
        if known != available {
            return Err(format!(
                "current set of available CPUs \"{available}\" doesn't match with CPUs in state \"{known}\""
            ));
        }
        Ok(())
    }

    /// The CPUs exclusive allocations come from (upstream
    /// GetAvailableCPUs).
    fn available(&self, s: &State) -> CpuSet {
        s.default_set.difference(&self.reserved)
    }

    /// Upstream updateCPUsToReuse.
    fn update_cpus_to_reuse(&mut self, pod: &Pod, c: &Container, set: &CpuSet) {
        let uid = crate::source::pod_uid(pod).to_string();
        self.cpus_to_reuse.retain(|k, _| *k == uid);
        let reuse = self.cpus_to_reuse.entry(uid).or_default();
        let inits = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or_default();
        if let Some(init) = inits.iter().find(|i| i.name == c.name) {
            // A sidecar keeps its CPUs for the pod's life.
            if !is_sidecar(init) {
                *reuse = reuse.union(set);
                return;
            }
        }
        *reuse = reuse.difference(set);
    }

    /// Upstream Allocate: Ok(Some(set)) when the container got exclusive
    /// CPUs now, Ok(None) when it needs none or already has them.
    pub fn allocate(
        &mut self,
        s: &mut State,
        pod: &Pod,
        c: &Container,
    ) -> Result<Option<CpuSet>, AllocateError> {
        let num = guaranteed_cpus(pod, c);
        if num == 0 || pod_level_resources_set(pod) {
            return Ok(None);
        }
        let result = self.allocate_inner(s, pod, c, num);
        if self.metrics {
            crate::metrics::cpu_manager_pinning_request();
            if result.is_err() {
                crate::metrics::cpu_manager_pinning_error();
            }
            if self.options.full_pcpus_only {
                crate::metrics::cpu_manager_alignment(Some(result.is_ok()));
            }
        }
        result
    }

    fn allocate_inner(
        &mut self,
        s: &mut State,
        pod: &Pod,
        c: &Container,
        num: usize,
    ) -> Result<Option<CpuSet>, AllocateError> {
        let per_core = self.topo.cpus_per_core().max(1);
        if self.options.full_pcpus_only {
            if num % per_core != 0 {
                return Err(AllocateError::NotMultiple {
                    requested: num,
                    per_core,
                });
            }
            let available = s.default_set.difference(&self.reserved_physical).len();
            if num > available {
                return Err(AllocateError::NoPhysical {
                    requested: num,
                    per_core,
                    available,
                });
            }
        }
        let uid = crate::source::pod_uid(pod).to_string();
        if let Some(set) = s.cpu_set(&uid, &c.name).cloned() {
            self.update_cpus_to_reuse(pod, c, &set);
            return Ok(None);
        }
        let reusable = self.cpus_to_reuse.get(&uid).cloned().unwrap_or_default();
        let allocatable = self.available(s).union(&reusable);
        let set = take_by_topology(&self.topo, &allocatable, num)?;
        s.default_set = s.default_set.difference(&set);
        s.set_cpu_set(&uid, &c.name, set.clone());
        self.update_cpus_to_reuse(pod, c, &set);
        Ok(Some(set))
    }

    /// Upstream RemoveContainer: the CPUs go back to the shared pool unless
    /// a sibling container of the pod still holds them (reused from an
    /// init container).
    pub fn remove_container(&self, s: &mut State, pod: &str, container: &str) {
        let in_use = s
            .assignments
            .get(pod)
            .into_iter()
            .flatten()
            .filter(|(name, _)| name.as_str() != container)
            .fold(CpuSet::new(), |acc, (_, set)| acc.union(set));
        if let Some(set) = s.cpu_set(pod, container).cloned() {
            s.delete(pod, container);
            s.default_set = s.default_set.union(&set.difference(&in_use));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::assign::tests::{dual_socket_ht, dual_socket_no_ht, single_socket_ht};
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap()
    }

    fn container(name: &str, cpu: &str) -> Container {
        let m: BTreeMap<String, Quantity> = [
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity("1G".into())),
        ]
        .into();
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                requests: Some(m.clone()),
                limits: Some(m),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// upstream's makePod: one container, requests and limits.
    fn pod(uid: &str, containers: Vec<Container>, inits: Vec<Container>) -> Pod {
        let mut p = Pod {
            spec: Some(PodSpec {
                containers,
                init_containers: Some(inits),
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.uid = Some(uid.into());
        p
    }

    fn policy(topo: CpuTopology, reserved: usize, options: Options) -> StaticPolicy {
        StaticPolicy::new(topo, reserved, &CpuSet::new(), options).unwrap()
    }

    #[test]
    fn allocates_as_upstreams_static_policy_tests() {
        // policy_static_test.go TestStaticPolicyAdd, the cases with a
        // pre-filled state: (topology, assigned elsewhere, default set,
        // request, expected exclusive set).
        let cases = [
            (
                "DualSocketHT one socket",
                dual_socket_ht(),
                "2",
                "0-1,3-11",
                "6",
                "1,3,5,7,9,11",
            ),
            (
                "DualSocketHT three cores",
                dual_socket_ht(),
                "1,5",
                "0,2-4,6-11",
                "6",
                "2-4,8-10",
            ),
            (
                "DualSocketNoHT one socket",
                dual_socket_no_ht(),
                "",
                "0-1,3-7",
                "4",
                "4-7",
            ),
            (
                "DualSocketNoHT four cores",
                dual_socket_no_ht(),
                "4-5",
                "0-1,3,6-7",
                "4",
                "1,3,6-7",
            ),
            (
                "DualSocketHT socket and core",
                dual_socket_ht(),
                "2",
                "0-1,3-11",
                "8",
                "1,3-5,7,9-11",
            ),
            (
                "SingleSocketHT one cpu",
                single_socket_ht(),
                "",
                "0-7",
                "1",
                "4",
            ),
        ];
        for (name, topo, taken, default, cpu, want) in cases {
            let mut p = policy(topo, 1, Options::default());
            assert_eq!(p.reserved, set("0"), "{name}");
            let mut s = State {
                default_set: set(default),
                ..Default::default()
            };
            if !taken.is_empty() {
                s.set_cpu_set("fakePod", "fakeContainer100", set(taken));
            }
            let pd = pod("fakePod", vec![container("c", cpu)], vec![]);
            let got = p.allocate(&mut s, &pd, &pd.spec.as_ref().unwrap().containers[0]);
            assert_eq!(got, Ok(Some(set(want))), "{name}");
            assert!(s.default_set.intersection(&set(want)).is_empty(), "{name}");
        }
        // Non-integer and non-Guaranteed containers stay shared.
        let mut p = policy(single_socket_ht(), 1, Options::default());
        let mut s = State {
            default_set: set("0-7"),
            ..Default::default()
        };
        let frac = pod("p", vec![container("c", "977m")], vec![]);
        let c = frac.spec.as_ref().unwrap().containers[0].clone();
        assert_eq!(p.allocate(&mut s, &frac, &c), Ok(None));
        // Too many: upstream's error, counted without the reserved CPU.
        let big = pod("p", vec![container("c", "8")], vec![]);
        let c = big.spec.as_ref().unwrap().containers[0].clone();
        let err = p.allocate(&mut s, &big, &c).unwrap_err();
        assert_eq!(
            err.rejection(),
            (
                "UnexpectedAdmissionError",
                "Allocate failed due to not enough cpus available to satisfy request: requested=8, available=7, which is unexpected".to_string()
            )
        );
    }

    #[test]
    fn init_containers_cpus_are_reused_and_released_once() {
        // An init container's CPUs go to the app container (upstream
        // cpusToReuse); removing the init container does not return CPUs
        // the app container holds.
        let mut p = policy(single_socket_ht(), 1, Options::default());
        let mut s = State::default();
        p.validate_state(&mut s).unwrap();
        assert_eq!(s.default_set, set("0-7"));
        let pd = pod(
            "u",
            vec![container("app", "2")],
            vec![container("init", "2")],
        );
        let spec = pd.spec.as_ref().unwrap();
        let init = spec.init_containers.as_ref().unwrap()[0].clone();
        let app = spec.containers[0].clone();
        let a = p.allocate(&mut s, &pd, &init).unwrap().unwrap();
        let b = p.allocate(&mut s, &pd, &app).unwrap().unwrap();
        assert_eq!(a, b, "the app container reuses the init container's CPUs");
        p.remove_container(&mut s, "u", "init");
        assert!(s.default_set.intersection(&b).is_empty());
        p.remove_container(&mut s, "u", "app");
        assert_eq!(s.default_set, set("0-7"));
        // A sidecar's CPUs are its own for the pod's life.
        let mut side = container("side", "1");
        side.restart_policy = Some("Always".into());
        let pd = pod("v", vec![container("app", "1")], vec![side.clone()]);
        let app = pd.spec.as_ref().unwrap().containers[0].clone();
        let a = p.allocate(&mut s, &pd, &side).unwrap().unwrap();
        let b = p.allocate(&mut s, &pd, &app).unwrap().unwrap();
        assert!(a.intersection(&b).is_empty());
    }

    #[test]
    fn full_pcpus_only_rejects_with_smt_alignment_errors() {
        let o = Options {
            full_pcpus_only: true,
            ..Default::default()
        };
        let mut p = policy(single_socket_ht(), 1, o);
        let mut s = State::default();
        p.validate_state(&mut s).unwrap();
        let odd = pod("p", vec![container("c", "1")], vec![]);
        let c = odd.spec.as_ref().unwrap().containers[0].clone();
        let (reason, msg) = p.allocate(&mut s, &odd, &c).unwrap_err().rejection();
        assert_eq!(reason, "SMTAlignmentError");
        assert_eq!(
            msg,
            "SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2"
        );
        // The reserved CPU 0 blocks its whole core (0,4): 6 physical left.
        let big = pod("p", vec![container("c", "8")], vec![]);
        let c = big.spec.as_ref().unwrap().containers[0].clone();
        assert_eq!(
            p.allocate(&mut s, &big, &c).unwrap_err().to_string(),
            "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 6, requested CPUs = 8, CPUs per core = 2"
        );
        let two = pod("p", vec![container("c", "2")], vec![]);
        let c = two.spec.as_ref().unwrap().containers[0].clone();
        assert_eq!(p.allocate(&mut s, &two, &c), Ok(Some(set("1,5"))));
    }

    #[test]
    fn stored_state_is_validated_as_upstream() {
        let p = policy(single_socket_ht(), 1, Options::default());
        let mut s = State {
            default_set: set("1-7"),
            ..Default::default()
        };
        assert_eq!(
            p.validate_state(&mut s).unwrap_err(),
            "not all reserved cpus: \"0\" are present in defaultCpuSet: \"1-7\""
        );
        let mut s = State {
            default_set: set("0-6"),
            ..Default::default()
        };
        assert_eq!(
            p.validate_state(&mut s).unwrap_err(),
            "current set of available CPUs \"0-7\" doesn't match with CPUs in state \"0-6\""
        );
        // Strict reservation: the reserved CPU leaves the shared pool.
        let strict = policy(
            single_socket_ht(),
            1,
            Options {
                strict_cpu_reservation: true,
                ..Default::default()
            },
        );
        let mut s = State::default();
        strict.validate_state(&mut s).unwrap();
        assert_eq!(s.default_set, set("1-7"));
    }

    #[test]
    fn options_are_checked_as_upstream() {
        let on = |_: &str| true;
        let m = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            Options::parse(&m(&[("bogus", "true")]), on).unwrap_err(),
            "unknown CPU Manager Policy option: \"bogus\""
        );
        assert_eq!(
            Options::parse(&m(&[(ALIGN_BY_SOCKET, "true")]), |g| g != "CPUManagerPolicyAlphaOptions")
                .unwrap_err(),
            "CPU Manager Policy Alpha-level Options not enabled, but option \"align-by-socket\" provided"
        );
        assert!(Options::parse(&m(&[(FULL_PCPUS_ONLY, "yes")]), on)
            .unwrap_err()
            .starts_with("bad value for option \"full-pcpus-only\""));
        assert_eq!(
            Options::parse(
                &m(&[(FULL_PCPUS_ONLY, "true"), (DISTRIBUTE_CPUS_ACROSS_CORES, "true")]),
                on
            )
            .unwrap_err(),
            "static policy options full-pcpus-only and distribute-cpus-across-cores can not be used at the same time"
        );
        let o = Options::parse(
            &m(&[
                (FULL_PCPUS_ONLY, "true"),
                (DISTRIBUTE_CPUS_ACROSS_NUMA, "true"),
            ]),
            on,
        )
        .unwrap();
        assert!(o.full_pcpus_only);
        assert_eq!(o.not_followed(), vec![DISTRIBUTE_CPUS_ACROSS_NUMA]);
    }
}
