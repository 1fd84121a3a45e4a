//! OOM kills from the kernel log (`/dev/kmsg`), counted per memory cgroup
//! of the killed task, for cAdvisor's `container_oom_events_total`
//! (cAdvisor's `utils/oomparser`), and system OOMs (no memory cgroup limit
//! hit) as `SystemOOM` Warning events on the Node, as upstream's
//! `pkg/kubelet/oom/oom_watcher_linux.go` records them.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::sync::Arc;

use parking_lot::Mutex;

/// One `oom-kill:` line: the cgroup whose limit was hit and the cgroup of
/// the killed task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomKill {
    pub oom_memcg: String,
    pub task_memcg: String,
    pub task: String,
    pub pid: u32,
}

/// Parses a `/dev/kmsg` record (`prio,seq,usec,flags;message`) or a bare
/// message. The kernel (4.19+) writes, on v1 and v2 alike:
/// `oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=...,
/// mems_allowed=0,oom_memcg=/kubepods/...,task_memcg=/kubepods/...,
/// task=stress,pid=1234,uid=0`.
pub fn parse_oom_kill(record: &str) -> Option<OomKill> {
    let msg = record.split_once(';').map_or(record, |(_, m)| m);
    let rest = msg.trim().strip_prefix("oom-kill:")?;
    let mut kill = OomKill {
        oom_memcg: String::new(),
        task_memcg: String::new(),
        task: String::new(),
        pid: 0,
    };
    for kv in rest.split(',') {
        match kv.split_once('=') {
            Some(("oom_memcg", v)) => kill.oom_memcg = v.to_string(),
            Some(("task_memcg", v)) => kill.task_memcg = v.to_string(),
            Some(("task", v)) => kill.task = v.to_string(),
            Some(("pid", v)) => kill.pid = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    (!kill.task_memcg.is_empty()).then_some(kill)
}

impl OomKill {
    /// A kill not caused by a cgroup's limit: the kernel writes
    /// `global_oom` instead of `oom_memcg=`, or the limit was the root's.
    /// cAdvisor then reports the victim container as "/", which is what
    /// upstream's watcher turns into a SystemOOM event.
    pub fn is_system(&self) -> bool {
        self.oom_memcg.is_empty() || self.oom_memcg == "/"
    }

    /// Upstream's SystemOOM message.
    pub fn event_message(&self) -> String {
        if self.task.is_empty() || self.pid == 0 {
            "System OOM encountered".into()
        } else {
            format!(
                "System OOM encountered, victim process: {}, pid: {}",
                self.task, self.pid
            )
        }
    }
}

/// OOM kills counted by the killed task's cgroup since the watcher began.
#[derive(Clone, Default)]
pub struct OomCounts(Arc<Mutex<HashMap<String, u64>>>);

impl OomCounts {
    pub fn record(&self, kill: &OomKill) {
        *self.0.lock().entry(kill.task_memcg.clone()).or_default() += 1;
    }

    pub fn get(&self, cgroup: &str) -> u64 {
        self.0.lock().get(cgroup).copied().unwrap_or(0)
    }

    /// Forgets cgroups that no longer exist (bounded memory).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.0.lock().retain(|k, _| keep(k));
    }
}

/// Starts a thread that follows `/dev/kmsg` from its end (kills from before
/// rkubelet started are not counted) for as long as the process lives: a
/// blocking read of a character device cannot be cancelled, so it is a
/// plain thread, not a task. Returns false when /dev/kmsg cannot be read.
pub fn watch(counts: OomCounts, node_name: String) -> bool {
    let Ok(mut f) = std::fs::File::open("/dev/kmsg") else {
        tracing::info!("cannot read /dev/kmsg; OOM kills are not counted");
        return false;
    };
    let _ = f.seek(SeekFrom::End(0));
    let spawned = std::thread::Builder::new()
        .name("oom-watcher".into())
        .spawn(move || {
            // Each read returns one record; EPIPE means records were
            // overwritten before we read them, and reading goes on.
            let mut r = BufReader::new(f);
            let mut line = String::new();
            loop {
                line.clear();
                match r.read_line(&mut line) {
                    Ok(0) => return,
                    Ok(_) => {
                        if let Some(kill) = parse_oom_kill(&line) {
                            tracing::info!(
                                cgroup = %kill.task_memcg,
                                task = %kill.task,
                                pid = kill.pid,
                                "OOM kill"
                            );
                            counts.record(&kill);
                            if kill.is_system() {
                                crate::events::record(
                                    crate::events::node_ref(&node_name),
                                    crate::events::WARNING,
                                    "SystemOOM",
                                    kill.event_message(),
                                );
                            }
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "reading /dev/kmsg failed; OOM watcher stops");
                        return;
                    }
                }
            }
        });
    spawned.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kill_records_are_parsed() {
        let rec = "6,1234,5678901,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=abc,mems_allowed=0,oom_memcg=/kubepods/burstable/podu/c1,task_memcg=/kubepods/burstable/podu/c1,task=stress,pid=4242,uid=0\n";
        let k = parse_oom_kill(rec).unwrap();
        assert_eq!(k.oom_memcg, "/kubepods/burstable/podu/c1");
        assert_eq!(k.task_memcg, "/kubepods/burstable/podu/c1");
        assert_eq!(k.task, "stress");
        assert_eq!(k.pid, 4242);
        assert!(parse_oom_kill("6,1,2,-;Memory cgroup out of memory: Killed process 1").is_none());
        assert!(parse_oom_kill("4,1,2,-;eth0: link up").is_none());
        let c = OomCounts::default();
        c.record(&k);
        c.record(&k);
        assert_eq!(c.get("/kubepods/burstable/podu/c1"), 2);
        assert!(!k.is_system());
        let global = parse_oom_kill("oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/system.slice/x.service,task=big,pid=7,uid=0").unwrap();
        assert!(global.is_system());
        assert_eq!(
            global.event_message(),
            "System OOM encountered, victim process: big, pid: 7"
        );
        c.retain(|_| false);
        assert_eq!(c.get("/kubepods/burstable/podu/c1"), 0);
    }
}
