//! The CPU manager's state and its checkpoint, `<root>/cpu_manager_state`
//! (upstream `cpumanager/state`: checkpoint.go, state_checkpoint.go), in
//! upstream's v2 format so either kubelet reads the other's file:
//!
//! ```text
//! {"policyName":"static","defaultCpuSet":"0","entries":{"<podUID>":{"<container>":"1"}},"checksum":N}
//! ```
//!
//! `checksum` is upstream's checkpointmanager checksum: FNV-32a over
//! go-spew's `%#v` rendering of the checkpoint struct (a pointer to it)
//! with the checksum field zeroed, with the config of
//! `apimachinery/pkg/util/dump.ForHash` (SortKeys, DisableMethods,
//! SpewKeys, no pointer addresses, no capacities). For this struct that
//! rendering is
//!
//! ```text
//! (*state.CPUManagerCheckpoint){PolicyName:(string)P DefaultCPUSet:(string)D Entries:(map[string]map[string]string)map[K1:map[C1:S1 C2:S2] K2:map[...]] Checksum:(checksum.Checksum)0}
//! ```
//!
//! spew's rules that give it: a pointer prints `(*type)` and then its
//! pointee without a second type; a struct prints `{Field:value ...}`,
//! fields separated by one space, each value with its `(type)` in front
//! (`#` flag); map keys and values nested in a map print without types,
//! `key:value`, entries space-separated in sorted key order (byte-wise for
//! strings); a nil map prints `<nil>` (upstream makes the map before
//! decoding, so only an explicit `"entries":null` gives that).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cpuset::CpuSet;

/// Upstream's cpuManagerStateFileName.
pub const STATE_FILE: &str = "cpu_manager_state";

#[derive(Debug, Clone, thiserror::Error)]
pub enum StateError {
    /// Upstream's CorruptCheckpointError text.
    #[error("checkpoint is corrupted")]
    Corrupt { expected: u64, actual: u64 },
    #[error("{0}")]
    Decode(String),
    #[error("configured policy {configured:?} differs from state checkpoint policy {found:?}")]
    PolicyDiffers { configured: String, found: String },
    #[error("could not parse default cpu set {0:?}: {1}")]
    DefaultSet(String, String),
    #[error(
        "could not parse cpuset {set:?} for container {container:?} in pod {pod:?}: {message}"
    )]
    ContainerSet {
        set: String,
        container: String,
        pod: String,
        message: String,
    },
    #[error("error migrating v1 checkpoint state to v2 checkpoint state: containerID '{0}' not found in initial containers list")]
    V1Entry(String),
    #[error("writing {path}: {message}")]
    Write { path: String, message: String },
}

/// Exclusive assignments: pod UID → container name → CPUs.
pub type Assignments = BTreeMap<String, BTreeMap<String, CpuSet>>;

/// What the policy keeps (upstream's memory state): the shared pool and
/// the exclusive assignments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    pub default_set: CpuSet,
    pub assignments: Assignments,
}

impl State {
    pub fn cpu_set(&self, pod: &str, container: &str) -> Option<&CpuSet> {
        self.assignments.get(pod).and_then(|m| m.get(container))
    }

    /// Upstream GetCPUSetOrDefault.
    pub fn cpu_set_or_default(&self, pod: &str, container: &str) -> CpuSet {
        self.cpu_set(pod, container)
            .cloned()
            .unwrap_or_else(|| self.default_set.clone())
    }

    pub fn set_cpu_set(&mut self, pod: &str, container: &str, cpus: CpuSet) {
        self.assignments
            .entry(pod.to_string())
            .or_default()
            .insert(container.to_string(), cpus);
    }

    pub fn delete(&mut self, pod: &str, container: &str) {
        if let Some(m) = self.assignments.get_mut(pod) {
            m.remove(container);
            if m.is_empty() {
                self.assignments.remove(pod);
            }
        }
    }
}

/// The file's fields (upstream CPUManagerCheckpoint, JSON names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    #[serde(rename = "policyName")]
    pub policy_name: String,
    #[serde(rename = "defaultCpuSet")]
    pub default_cpu_set: String,
    /// None only for an explicit `null` in the file (see the module doc).
    #[serde(
        rename = "entries",
        default = "some_empty",
        skip_serializing_if = "entries_empty"
    )]
    pub entries: Option<BTreeMap<String, BTreeMap<String, String>>>,
    pub checksum: u64,
}

fn some_empty() -> Option<BTreeMap<String, BTreeMap<String, String>>> {
    Some(BTreeMap::new())
}

/// `omitempty`: a nil or empty map is left out.
fn entries_empty(e: &Option<BTreeMap<String, BTreeMap<String, String>>>) -> bool {
    e.as_ref().is_none_or(|m| m.is_empty())
}

/// Upstream's v1 format: entries by container ID.
#[derive(Debug, Deserialize)]
struct CheckpointV1 {
    #[serde(rename = "policyName")]
    policy_name: String,
    #[serde(rename = "defaultCpuSet")]
    default_cpu_set: String,
    #[serde(default)]
    entries: Option<BTreeMap<String, String>>,
    checksum: u64,
}

fn fnv32a(data: &[u8]) -> u64 {
    let mut h: u32 = 0x811c_9dc5;
    for b in data {
        h ^= *b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h as u64
}

/// go-spew's rendering of a map without types (sorted keys).
fn spew_map<V>(m: &BTreeMap<String, V>, value: impl Fn(&V) -> String) -> String {
    let inner: Vec<String> = m.iter().map(|(k, v)| format!("{k}:{}", value(v))).collect();
    format!("map[{}]", inner.join(" "))
}

impl Checkpoint {
    /// The spew text upstream hashes (checksum zeroed).
    pub fn spew(&self) -> String {
        let entries = match &self.entries {
            None => "<nil>".to_string(),
            Some(e) => spew_map(e, |c| spew_map(c, |s| s.clone())),
        };
        format!(
            "(*state.CPUManagerCheckpoint){{PolicyName:(string){} DefaultCPUSet:(string){} Entries:(map[string]map[string]string){} Checksum:(checksum.Checksum)0}}",
            self.policy_name, self.default_cpu_set, entries
        )
    }

    pub fn compute_checksum(&self) -> u64 {
        fnv32a(self.spew().as_bytes())
    }

    pub fn from_state(policy: &str, s: &State) -> Checkpoint {
        let entries = s
            .assignments
            .iter()
            .map(|(pod, m)| {
                (
                    pod.clone(),
                    m.iter()
                        .map(|(c, set)| (c.clone(), set.to_string()))
                        .collect(),
                )
            })
            .collect();
        let mut cp = Checkpoint {
            policy_name: policy.to_string(),
            default_cpu_set: s.default_set.to_string(),
            entries: Some(entries),
            checksum: 0,
        };
        cp.checksum = cp.compute_checksum();
        cp
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Decodes and verifies a file as upstream's restoreState: the v1
    /// format first (entries by container ID; rkubelet has no map of IDs
    /// from before, so only a v1 file without entries is taken), then v2.
    /// A checksum of 0 is accepted unchecked, as upstream.
    pub fn decode(text: &str) -> Result<Checkpoint, StateError> {
        if let Ok(v1) = serde_json::from_str::<CheckpointV1>(text) {
            let entries = v1.entries.clone().unwrap_or_default();
            let spew = format!(
                "(*state.CPUManagerCheckpoint){{PolicyName:(string){} DefaultCPUSet:(string){} Entries:(map[string]string){} Checksum:(checksum.Checksum)0}}",
                v1.policy_name,
                v1.default_cpu_set,
                match &v1.entries {
                    None if text_has_null_entries(text) => "<nil>".to_string(),
                    _ => spew_map(&entries, |s| s.clone()),
                }
            );
            if v1.checksum == 0 || fnv32a(spew.as_bytes()) == v1.checksum {
                if let Some(id) = entries.keys().next() {
                    return Err(StateError::V1Entry(id.clone()));
                }
                return Ok(Checkpoint {
                    policy_name: v1.policy_name,
                    default_cpu_set: v1.default_cpu_set,
                    entries: Some(BTreeMap::new()),
                    checksum: v1.checksum,
                });
            }
        }
        let cp: Checkpoint =
            serde_json::from_str(text).map_err(|e| StateError::Decode(e.to_string()))?;
        if cp.checksum != 0 {
            let actual = cp.compute_checksum();
            if actual != cp.checksum {
                return Err(StateError::Corrupt {
                    expected: cp.checksum,
                    actual,
                });
            }
        }
        Ok(cp)
    }

    /// The state it holds, for `policy` (upstream restoreState's checks).
    pub fn into_state(self, policy: &str) -> Result<State, StateError> {
        if self.policy_name != policy {
            return Err(StateError::PolicyDiffers {
                configured: policy.to_string(),
                found: self.policy_name,
            });
        }
        let default_set = CpuSet::parse(&self.default_cpu_set)
            .map_err(|e| StateError::DefaultSet(self.default_cpu_set.clone(), e.to_string()))?;
        let mut assignments = Assignments::new();
        for (pod, m) in self.entries.unwrap_or_default() {
            for (container, text) in m {
                let set = CpuSet::parse(&text).map_err(|e| StateError::ContainerSet {
                    set: text.clone(),
                    container: container.clone(),
                    pod: pod.clone(),
                    message: e.to_string(),
                })?;
                assignments
                    .entry(pod.clone())
                    .or_default()
                    .insert(container, set);
            }
        }
        Ok(State {
            default_set,
            assignments,
        })
    }
}

/// serde gives None for both a missing and a null `entries` in the v1
/// decode; only a literal null makes Go's map nil.
fn text_has_null_entries(text: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v.get("entries").map(|e| e.is_null()))
        .unwrap_or(false)
}

/// The checkpoint file; reads and writes are blocking (callers run them
/// on the blocking pool).
#[derive(Debug, Clone)]
pub struct StateFile {
    pub path: PathBuf,
}

impl StateFile {
    pub fn new(root_dir: &Path) -> StateFile {
        StateFile {
            path: root_dir.join(STATE_FILE),
        }
    }

    /// The stored state for `policy`, or None when there is no file yet.
    pub fn load(&self, policy: &str) -> Result<Option<State>, StateError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StateError::Decode(e.to_string())),
        };
        Checkpoint::decode(&text)?.into_state(policy).map(Some)
    }

    /// Writes atomically (a temporary file renamed over the old one, as
    /// upstream's file store).
    pub fn store(&self, policy: &str, s: &State) -> Result<(), StateError> {
        let text = Checkpoint::from_state(policy, s).to_json();
        write_atomic(&self.path, &text).map_err(|e| StateError::Write {
            path: self.path.display().to_string(),
            message: e.to_string(),
        })
    }
}

/// Writes `text` to `path` through a temporary file renamed over it, so a
/// crash leaves the old file or the new one. Blocking.
pub fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_upstreams() {
        // The spew text of the `none` policy's first file, derived from
        // go-spew's rules in the module doc: a pointer's `(*T)`, each field
        // `Name:(type)value`, the empty (non-nil) map as `map[]`. Its
        // FNV-32a is 1353318690, the value upstream kubelets write on
        // every node with the default policy.
        let none = Checkpoint::from_state("none", &State::default());
        assert_eq!(
            none.spew(),
            "(*state.CPUManagerCheckpoint){PolicyName:(string)none DefaultCPUSet:(string) \
             Entries:(map[string]map[string]string)map[] Checksum:(checksum.Checksum)0}"
        );
        assert_eq!(none.checksum, 1353318690);
        assert_eq!(
            none.to_json(),
            r#"{"policyName":"none","defaultCpuSet":"","checksum":1353318690}"#
        );
        // Files written by upstream kubelets (published in issues and
        // docs), each checked here against the same rendering: nested
        // maps in sorted key order, no types inside the map.
        for text in [
            r#"{"policyName":"static","defaultCpuSet":"0-1","checksum":1636926438}"#,
            r#"{"policyName":"static","defaultCpuSet":"0-63","checksum":1058907510}"#,
            r#"{"policyName":"static","defaultCpuSet":"0,2-95,97-191","entries":{"823ca0b5-ed9e-421a-bfca-76fa078f3195":{"ubuntu-netutils":"96"},"b8292fdc-57b1-4bc4-937b-34cd3dd1bcb8":{"ubuntu-netutils":"1"}},"checksum":4076905443}"#,
            r#"{"policyName":"static","defaultCpuSet":"0-1,6-13,18-23","entries":{"28c11c89-3493-4972-bb67-7090b9d75e0d":{"mytestclient":"2-3,14-15","mytestclient2":"4-5,16-17"}},"checksum":1684933537}"#,
        ] {
            let cp = Checkpoint::decode(text).unwrap();
            let state = cp.clone().into_state("static").unwrap();
            // Written back from the state: the same bytes.
            assert_eq!(Checkpoint::from_state("static", &state).to_json(), text);
        }
    }

    #[test]
    fn a_wrong_checksum_or_policy_is_refused_with_upstreams_words() {
        let bad = r#"{"policyName":"static","defaultCpuSet":"0-1","checksum":1636926439}"#;
        assert_eq!(
            Checkpoint::decode(bad).unwrap_err().to_string(),
            "checkpoint is corrupted"
        );
        let none = r#"{"policyName":"none","defaultCpuSet":"","checksum":1353318690}"#;
        let err = Checkpoint::decode(none)
            .unwrap()
            .into_state("static")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"configured policy "static" differs from state checkpoint policy "none""#
        );
        // A zero checksum is not checked (upstream's old file backend).
        let zero = r#"{"policyName":"static","defaultCpuSet":"0-1","checksum":0}"#;
        assert!(Checkpoint::decode(zero).is_ok());
    }

    #[test]
    fn the_file_round_trips() {
        let dir = crate::testutil::tempdir("cpu-state");
        let f = StateFile::new(&dir);
        assert!(f.load("static").unwrap().is_none());
        let mut s = State {
            default_set: CpuSet::parse("0,2-3").unwrap(),
            ..Default::default()
        };
        s.set_cpu_set("pod-1", "app", CpuSet::parse("1").unwrap());
        f.store("static", &s).unwrap();
        let text = std::fs::read_to_string(&f.path).unwrap();
        assert!(
            text.starts_with(
                r#"{"policyName":"static","defaultCpuSet":"0,2-3","entries":{"pod-1":{"app":"1"}},"checksum":"#
            ),
            "{text}"
        );
        assert_eq!(f.load("static").unwrap(), Some(s));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
