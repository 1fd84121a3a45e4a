//! Pod-worker lifecycle on real containerd: a kill cancels the sync in
//! flight, and a static pod whose manifest changes never runs beside its
//! previous instance (upstream `pod_workers.go`).

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(60);

fn running(p: &serde_json::Value, c: &str) -> bool {
    container_status(p, c).is_some_and(|s| s["state"]["running"].is_object())
}

#[test]
fn an_edited_static_pod_never_runs_beside_its_previous_instance() {
    let k = Kubelet::start("it-gate");
    // PID 1 ignores SIGTERM, so the old instance lives its whole grace
    // period: old code started the new UID at once, beside it.
    let manifest = |gen: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\n  labels:\n    gen: \"{gen}\"\nspec:\n  terminationGracePeriodSeconds: 4\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [sleep, \"3600\"]\n"
        )
    };
    k.write_manifest("etcd.yaml", &manifest("1"));
    let p = k.wait_pod("etcd", "running", T, |p| running(p, "main"));
    let old_uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let full = format!("etcd-{}", k.node);
    k.write_manifest("etcd.yaml", &manifest("2"));
    let deadline = Instant::now() + T;
    loop {
        let (sandboxes, containers) = k.cri.count_labelled("io.kubernetes.pod.name", &full, true);
        assert!(
            sandboxes <= 1 && containers <= 1,
            "two instances of {full} at once: {sandboxes} sandboxes, {containers} containers"
        );
        if let Some(p) = k.pod("etcd") {
            if p["metadata"]["uid"] != old_uid.as_str() && running(&p, "main") {
                break;
            }
        }
        assert!(Instant::now() < deadline, "new instance never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        k.cri.count_for_uid(&old_uid),
        (0, 0),
        "old instance removed"
    );
}

/// A registry on loopback that accepts connections and never answers.
struct SilentRegistry {
    port: u16,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SilentRegistry {
    fn start() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((c, _)) => {
                        a.fetch_add(1, Ordering::Relaxed);
                        c.set_nonblocking(true).ok();
                        held.push(c);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
                // Drain what clients send, answer nothing.
                for c in &mut held {
                    let mut buf = [0u8; 4096];
                    let _ = c.read(&mut buf);
                }
            }
        });
        SilentRegistry {
            port,
            accepted,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for SilentRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn deleting_a_pod_whose_image_pull_hangs_stops_it_within_its_grace() {
    let registry = SilentRegistry::start();
    let k = Kubelet::start("it-hangpull");
    let grace = 2;
    k.write_manifest(
        "hang.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hang\nspec:\n  terminationGracePeriodSeconds: {grace}\n  containers:\n  - name: main\n    image: 127.0.0.1:{}/hang/busybox:1\n    imagePullPolicy: Always\n",
            registry.port
        ),
    );
    let p = k.wait_pod("hang", "listed", T, |_| true);
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    wait_for("the pull to reach the registry", T, || {
        (registry.accepted.load(Ordering::Relaxed) > 0).then_some(())
    });
    assert_eq!(k.cri.count_for_uid(&uid).0, 1, "sandbox while pulling");
    let removed_at = Instant::now();
    k.remove_manifest("hang.yaml");
    // Old code: the termination queued behind the pull, which containerd
    // gives up on only after minutes without progress.
    let limit = Duration::from_secs(grace + 5);
    wait_for("the pod to be stopped and removed", limit, || {
        (k.cri.count_for_uid(&uid) == (0, 0)).then_some(())
    });
    assert!(removed_at.elapsed() < limit);
    assert!(k.pod("hang").is_none());
}
