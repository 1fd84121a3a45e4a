//! A storm of malformed manifests dropped into the manifest folder and
//! removed again: rkubelet stays healthy, the canary pod keeps its
//! container, every rejected file is logged with its path. (Memory during a
//! storm is measured by `rkubelet-bench --storm`, not asserted here.)

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

/// The hostile manifest number `i`: a rotation over the kinds users hit.
fn hostile(i: usize) -> Vec<u8> {
    match i % 7 {
        0 => {
            let mut s = String::from("a: &a [x, x, x, x, x, x, x, x, x]\n");
            for j in 1..10u8 {
                let (n, p) = ((b'a' + j) as char, (b'a' + j - 1) as char);
                s.push_str(&format!("{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"));
            }
            s.into_bytes()
        }
        1 => format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes(),
        2 if i % 500 == 2 => format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {}\nspec:\n  containers: []\n",
            "x".repeat(3 << 20)
        )
        .into_bytes(),
        2 => b"apiVersion: v1\nkind: Pod\nkind: Pod\nmetadata: {name: d}\nspec: {containers: []}\n".to_vec(),
        3 => (0..4096u32)
            .map(|k| (k.wrapping_mul(2654435761).wrapping_add(i as u32) >> 11) as u8)
            .collect(),
        4 => format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: n{i}}}\nspec:\n  activeDeadlineSeconds: 1{}\n  containers: []\n",
            "0".repeat(400)
        )
        .into_bytes(),
        // The same key two hundred times.
        5 => "a:\n  x: 1\n".repeat(200).into_bytes(),
        _ => b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: \xff\xfe\nspec: [\n".to_vec(),
    }
}

#[test]
fn a_storm_of_malformed_manifests_leaves_rkubelet_and_the_canary_alone() {
    let k = Kubelet::start("it-storm");
    k.write_manifest(
        "canary.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: canary\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sleep, \"3600\"]\n"
        ),
    );
    let p = k.wait_pod("canary", "running", T, |p| {
        container_status(p, "main").is_some_and(|s| s["state"]["running"].is_object())
    });
    let id = container_status(&p, "main").unwrap()["containerID"].clone();

    let n = 2000;
    for i in 0..n {
        let tmp = k.dir.join(format!(".storm-{i}.tmp"));
        std::fs::write(&tmp, hostile(i)).unwrap();
        std::fs::rename(&tmp, k.manifests.join(format!("storm-{i}.yaml"))).unwrap();
    }
    // The last file written has been read and rejected with its path.
    let last = format!("storm-{}.yaml", n - 1);
    wait_for("the storm to be processed", T, || {
        k.log().contains(&last).then_some(())
    });
    assert_eq!(
        http_get(&k.healthz, "/healthz").map(|r| r.0),
        Some(200),
        "healthy during the storm"
    );
    for i in 0..n {
        std::fs::remove_file(k.manifests.join(format!("storm-{i}.yaml"))).unwrap();
    }
    let p = k.wait_pod("canary", "still running after the storm", T, |p| {
        container_status(p, "main").is_some_and(|s| s["state"]["running"].is_object())
    });
    assert_eq!(
        container_status(&p, "main").unwrap()["containerID"],
        id,
        "canary restarted"
    );
    assert_eq!(k.pods().len(), 1, "only the canary is a pod");
    assert_eq!(http_get(&k.healthz, "/healthz").map(|r| r.0), Some(200));
    let log = k.log();
    // No log line carries a hostile manifest's bulk.
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 4096, "a log line of {longest} bytes");
}
