//! The static CPU manager policy on real containerd (needs root, containerd
//! with the CRI plugin, and at least 2 CPUs with the cpuset controller of
//! cgroup v1 at /sys/fs/cgroup/cpuset or cgroup v2's unified hierarchy).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

/// The container's cgroup directory in the cpuset hierarchy (its last
/// component is the container ID under the cgroupfs driver).
fn cgroup_of(id: &str) -> Option<PathBuf> {
    let roots = ["/sys/fs/cgroup/cpuset", "/sys/fs/cgroup"];
    let root = roots
        .iter()
        .map(Path::new)
        .find(|r| r.join("cpuset.cpus").exists() || r.join("cgroup.controllers").exists())?;
    let mut stack = vec![(root.to_path_buf(), 0)];
    while let Some((dir, depth)) = stack.pop() {
        if dir.file_name().is_some_and(|n| n == id) {
            return Some(dir);
        }
        if depth >= 6 {
            continue;
        }
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    None
}

/// What the kernel holds the container to (`cpuset.cpus`).
fn cpuset_of(id: &str) -> Option<String> {
    let dir = cgroup_of(id)?;
    std::fs::read_to_string(dir.join("cpuset.cpus"))
        .ok()
        .map(|s| s.trim().to_string())
}

fn sleeper(name: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sh, -c, 'exec sleep 3600']\n{resources}"
    )
}

fn state_file(k: &Kubelet) -> String {
    std::fs::read_to_string(k.dir.join("root/cpu_manager_state")).unwrap_or_default()
}

#[test]
fn static_policy_pins_a_guaranteed_pod_and_shrinks_the_shared_pool() {
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    assert_eq!(cpus.trim(), "0-1", "this test is written for a 2-CPU host");
    let mut k = Kubelet::new("it-cpu");
    k.extra_config =
        "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\ncpuManagerReconcilePeriod: 1s\n"
            .into();
    k.spawn();
    let file = k.dir.join("root/cpu_manager_state");
    wait_for("the state file", T, || {
        state_file(&k)
            .starts_with(r#"{"policyName":"static","defaultCpuSet":"0-1","#)
            .then_some(())
    });

    // Started first, a BestEffort pod gets the whole shared pool.
    k.write_manifest("shared.yaml", &sleeper("shared", ""));
    let p = k.wait_pod("shared", "running", T, |p| running(p, "main"));
    let shared = runtime_id(container_status(&p, "main").unwrap());
    assert_eq!(
        wait_for("shared cgroup", T, || cpuset_of(&shared)).as_str(),
        "0-1"
    );

    // A Guaranteed pod with one whole CPU gets CPU 1 (0 is reserved).
    let guaranteed = "    resources:\n      requests: {cpu: \"1\", memory: 32Mi}\n      limits: {cpu: \"1\", memory: 32Mi}\n";
    k.write_manifest("pinned.yaml", &sleeper("pinned", guaranteed));
    let p = k.wait_pod("pinned", "running", T, |p| running(p, "main"));
    assert_eq!(p["status"]["qosClass"], "Guaranteed");
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let pinned = runtime_id(container_status(&p, "main").unwrap());
    assert_eq!(
        wait_for("pinned cgroup", T, || cpuset_of(&pinned)).as_str(),
        "1"
    );
    // The reconcile moves the shared container off CPU 1.
    wait_for("shared container shrunk to 0", T, || {
        (cpuset_of(&shared).as_deref() == Some("0")).then_some(())
    });
    // The checkpoint, in upstream's format with a valid checksum.
    let text = wait_for("the entry in the state file", T, || {
        let t = state_file(&k);
        t.contains(&format!(r#""entries":{{"{uid}":{{"main":"1"}}}}"#))
            .then_some(t)
    });
    assert!(
        text.starts_with(r#"{"policyName":"static","defaultCpuSet":"0","#),
        "{text}"
    );
    let cp = rkubelet::cm::cpumanager::state::Checkpoint::decode(&text).unwrap();
    assert_eq!(cp.checksum, cp.compute_checksum());

    // A second whole CPU cannot be had: refused as upstream.
    k.write_manifest("greedy.yaml", &sleeper("greedy", guaranteed));
    let p = k.wait_pod("greedy", "refused", T, |p| phase(p) == "Failed");
    assert_eq!(p["status"]["reason"], "UnexpectedAdmissionError", "{p}");
    assert!(
        p["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Pod was rejected: Allocate failed due to not enough cpus available to satisfy request: requested=1, available=0"),
        "{p}"
    );
    k.remove_manifest("greedy.yaml");

    // The Guaranteed pod goes: CPU 1 returns to the shared pool.
    k.remove_manifest("pinned.yaml");
    wait_for("pinned pod gone", T, || {
        k.pod("pinned").is_none().then_some(())
    });
    wait_for("CPU 1 back in the default set", T, || {
        let t = state_file(&k);
        (t.starts_with(r#"{"policyName":"static","defaultCpuSet":"0-1","checksum":"#)).then_some(())
    });
    wait_for("shared container back on 0-1", T, || {
        (cpuset_of(&shared).as_deref() == Some("0-1")).then_some(())
    });
    assert!(file.exists());
}
