//! Safety on real containerd: a subPath cannot be turned into a way out of
//! its volume by a symlink the pod plants itself.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

fn waiting_reason(p: &serde_json::Value, c: &str) -> Option<(String, String)> {
    let w = &container_status(p, c)?["state"]["waiting"];
    Some((
        w["reason"].as_str()?.to_string(),
        w["message"].as_str().unwrap_or_default().to_string(),
    ))
}

#[test]
fn a_sub_path_symlink_planted_in_an_empty_dir_is_refused() {
    let k = Kubelet::start("it-subpath");
    // The init container plants `esc -> /` in the emptyDir. Old code joined
    // the subPath to the volume directory and containerd followed the
    // link: the container got the host's root at /host.
    k.write_manifest(
        "sub.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: sub\nspec:\n  terminationGracePeriodSeconds: 2\n  volumes:\n  - name: vol\n    emptyDir: {{}}\n  initContainers:\n  - name: plant\n    image: {BUSYBOX}\n    command: [sh, -c, 'ln -s / /vol/esc && mkdir -p /vol/ok && echo fine > /vol/ok/f']\n    volumeMounts:\n    - {{name: vol, mountPath: /vol}}\n  containers:\n  - name: ok\n    image: {BUSYBOX}\n    command: [sh, -c, 'cat /data/f && exec sleep 3600']\n    volumeMounts:\n    - {{name: vol, mountPath: /data, subPath: ok}}\n  - name: esc\n    image: {BUSYBOX}\n    command: [sh, -c, 'exec sleep 3600']\n    volumeMounts:\n    - {{name: vol, mountPath: /host, subPath: esc}}\n"
        ),
    );
    let p = k.wait_pod(
        "sub",
        "the escape refused and the plain subPath running",
        T,
        |p| {
            let ok = container_status(p, "ok").is_some_and(|s| s["state"]["running"].is_object());
            let esc =
                waiting_reason(p, "esc").is_some_and(|(r, _)| r == "CreateContainerConfigError");
            ok && esc
        },
    );
    let (_, msg) = waiting_reason(&p, "esc").unwrap();
    assert!(msg.contains("symbolic link"), "{msg}");
    let esc = container_status(&p, "esc").unwrap();
    assert!(
        esc["containerID"].is_null(),
        "a container was created: {esc}"
    );
    // The plain subPath shows what the init container wrote.
    let uid = p["metadata"]["uid"].as_str().unwrap();
    assert_eq!(k.cri.count_for_uid(uid).1, 2, "init + ok only");
}
