use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::*;
use crate::cri::fake::FakeRuntime;
use crate::cri::v1::{ContainerConfig, ContainerMetadata, ImageSpec, PodSandboxConfig};

const MIB: u64 = 1 << 20;

struct Env {
    fake: Arc<FakeRuntime>,
    gc: ImageGc,
    fs: Arc<Mutex<Result<FsFigures, String>>>,
}

fn env(node: &str, policy: Policy) -> Env {
    let fake = Arc::new(FakeRuntime::new());
    let fs = Arc::new(Mutex::new(Ok(FsFigures {
        capacity: 100 * MIB,
        available: 50 * MIB,
    })));
    let f = fs.clone();
    let gc = ImageGc::new(
        fake.clone(),
        fake.clone(),
        policy,
        Box::new(move || {
            let r = f.lock().clone();
            Box::pin(async move { r })
        }),
        node.into(),
    );
    Env { fake, gc, fs }
}

fn policy(high: i32, low: i32) -> Policy {
    Policy {
        high_threshold_percent: high,
        low_threshold_percent: low,
        min_age: Duration::from_secs(120),
        max_age: Duration::ZERO,
    }
}

/// A container (created, not started) made from `image`.
async fn use_image(fake: &FakeRuntime, image: &str) -> String {
    let sb = fake
        .run_pod_sandbox(PodSandboxConfig::default(), String::new())
        .await
        .unwrap();
    let config = ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: format!("uses-{image}"),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    fake.create_container(&sb, config, PodSandboxConfig::default())
        .await
        .unwrap()
}

async fn names(fake: &FakeRuntime) -> Vec<String> {
    let mut n: Vec<String> = fake
        .list_images()
        .await
        .unwrap()
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .collect();
    n.sort();
    n
}

fn collected(reason: &str) -> u64 {
    crate::metrics::image_garbage_collected_count(reason)
}

#[tokio::test(start_paused = true)]
async fn over_the_high_threshold_unused_images_go_least_recently_used_first_down_to_the_low() {
    // 50% used: over a 40% high threshold; down to 30% means freeing 20 MiB.
    let e = env("gc-order", policy(40, 30));
    e.fake.add_sized_image("old", 15 * MIB, false);
    e.fake.add_sized_image("used", 30 * MIB, false);
    e.fake.add_sized_image("pinned", 40 * MIB, true);
    e.fake.add_sized_image("newer", 10 * MIB, false);
    e.fake.add_sized_image("recent", 10 * MIB, false);
    let began = Instant::now();
    let c = use_image(&e.fake, "newer").await;
    // Nothing has been seen for the minimum age yet.
    let err = e.gc.garbage_collect(began).await.unwrap_err();
    assert!(matches!(err, GcError::NotEnough { freed: 0, .. }), "{err}");
    assert_eq!(names(&e.fake).await.len(), 5);
    e.fake.remove_container(&c).await.unwrap();
    tokio::time::advance(Duration::from_secs(60)).await;
    let c = use_image(&e.fake, "recent").await;
    e.gc.detect_images(Instant::now()).await.unwrap();
    e.fake.remove_container(&c).await.unwrap();
    e.fake.add_sized_image("fresh", 50 * MIB, false);
    use_image(&e.fake, "used").await;
    tokio::time::advance(Duration::from_secs(61)).await;
    let before = collected("space");

    // "old" (never used) goes first, "fresh" is too young, then "newer"
    // (used before "recent"): 25 MiB ≥ 20 MiB, so "recent" stays.
    let r = e.gc.garbage_collect(began).await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(names(&e.fake).await, ["fresh", "pinned", "recent", "used"]);
    assert!(collected("space") - before >= 2);
    assert_eq!(e.fake.count_calls("RemoveImage"), 2);
}

#[tokio::test(start_paused = true)]
async fn not_enough_to_free_is_an_error_and_a_free_disk_space_failed_event() {
    let e = env("gc-short", policy(40, 0));
    e.fake.add_sized_image("small", 5 * MIB, false);
    let began = Instant::now();
    tokio::time::advance(Duration::from_secs(1)).await;
    e.gc.detect_images(Instant::now()).await.unwrap();
    tokio::time::advance(Duration::from_secs(200)).await;
    // 50 MiB used, all of it to free: only the 5 MiB image can go.
    let err = e.gc.garbage_collect(began).await.unwrap_err();
    let want = format!(
        "Failed to garbage collect required amount of images. Attempted to free {} bytes, but only found {} bytes eligible to free.",
        50 * MIB,
        5 * MIB
    );
    assert_eq!(err.to_string(), want);
    assert!(names(&e.fake).await.is_empty());
    let events = crate::events::captured("gc-short");
    assert!(
        events.contains(&("Warning", "FreeDiskSpaceFailed".into(), want)),
        "{events:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn under_the_high_threshold_nothing_goes() {
    let e = env("gc-under", policy(85, 80));
    e.fake.add_sized_image("a", 10 * MIB, false);
    let began = Instant::now();
    tokio::time::advance(Duration::from_secs(600)).await;
    e.gc.garbage_collect(began).await.unwrap();
    e.gc.garbage_collect(began).await.unwrap();
    assert_eq!(names(&e.fake).await, ["a"]);
}

#[tokio::test(start_paused = true)]
async fn a_zero_capacity_is_refused_with_an_invalid_disk_capacity_event() {
    let e = env("gc-zero", policy(85, 80));
    *e.fs.lock() = Ok(FsFigures {
        capacity: 0,
        available: 0,
    });
    let err = e.gc.garbage_collect(Instant::now()).await.unwrap_err();
    assert_eq!(err.to_string(), "invalid capacity 0 on image filesystem");
    assert!(crate::events::captured("gc-zero").contains(&(
        "Warning",
        "InvalidDiskCapacity".into(),
        "invalid capacity 0 on image filesystem".into()
    )));
}

#[tokio::test(start_paused = true)]
async fn images_unused_past_the_maximum_age_go_once_the_collector_has_run_that_long() {
    let mut p = policy(100, 80);
    p.max_age = Duration::from_secs(600);
    assert!(p.collects());
    let e = env("gc-age", p);
    e.fake.add_sized_image("idle", MIB, false);
    e.fake.add_sized_image("busy", MIB, false);
    let busy = use_image(&e.fake, "busy").await;
    let began = Instant::now();
    e.gc.garbage_collect(began).await.unwrap();
    e.fake.remove_container(&busy).await.unwrap();
    // The collector has not run for the maximum age yet: nothing by age.
    tokio::time::advance(Duration::from_secs(300)).await;
    e.gc.garbage_collect(began).await.unwrap();
    assert_eq!(names(&e.fake).await.len(), 2);
    let before = collected("age");
    // 601 s since it began: "idle" was never used; "busy" was last seen in
    // use at the first pass, 601 s ago too.
    tokio::time::advance(Duration::from_secs(301)).await;
    e.gc.garbage_collect(began).await.unwrap();
    assert!(names(&e.fake).await.is_empty());
    assert!(collected("age") - before >= 2);
}

#[tokio::test(start_paused = true)]
async fn an_image_used_recently_is_kept_by_the_maximum_age() {
    let mut p = policy(100, 80);
    p.max_age = Duration::from_secs(600);
    let e = env("gc-age-kept", p);
    e.fake.add_sized_image("idle", MIB, false);
    e.fake.add_sized_image("recent", MIB, false);
    let began = Instant::now();
    tokio::time::advance(Duration::from_secs(500)).await;
    let c = use_image(&e.fake, "recent").await;
    e.gc.garbage_collect(began).await.unwrap();
    e.fake.remove_container(&c).await.unwrap();
    tokio::time::advance(Duration::from_secs(200)).await;
    e.gc.garbage_collect(began).await.unwrap();
    assert_eq!(names(&e.fake).await, ["recent"]);
}

#[tokio::test(start_paused = true)]
async fn delete_unused_images_takes_every_unused_image_old_enough() {
    let e = env("gc-reclaim", policy(100, 80));
    assert!(!e.gc.policy.collects());
    e.fake.add_sized_image("a", MIB, false);
    e.fake.add_sized_image("b", MIB, false);
    e.fake.add_sized_image("pause", MIB, true);
    e.fake.add_sized_image("running", MIB, false);
    use_image(&e.fake, "running").await;
    e.gc.detect_images(Instant::now()).await.unwrap();
    tokio::time::advance(Duration::from_secs(121)).await;
    e.fake.add_sized_image("just-pulled", MIB, false);
    e.gc.delete_unused_images().await.unwrap();
    assert_eq!(names(&e.fake).await, ["just-pulled", "pause", "running"]);
}

#[tokio::test(start_paused = true)]
async fn the_loop_reports_a_second_failure_in_a_row_as_image_gc_failed() {
    let e = env("gc-loop", policy(85, 80));
    *e.fs.lock() = Err("no image filesystem yet".into());
    let gc = Arc::new(e.gc);
    let token = CancellationToken::new();
    let task = tokio::spawn(gc.clone().run(token.clone()));
    let failed = || {
        crate::events::captured("gc-loop")
            .iter()
            .filter(|(_, r, _)| r == "ImageGCFailed")
            .count()
    };
    // The first failure is logged only (stats may not be ready).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(failed(), 0);
    tokio::time::sleep(GC_PERIOD).await;
    assert_eq!(failed(), 1);
    let events = crate::events::captured("gc-loop");
    assert!(events.contains(&(
        "Warning",
        "ImageGCFailed".into(),
        "failed to get the image filesystem's stats: no image filesystem yet".into()
    )));
    token.cancel();
    task.await.unwrap();
}

#[test]
fn several_errors_read_as_apimachinerys_aggregate() {
    assert_eq!(aggregate(&["a".into()]), "a");
    assert_eq!(aggregate(&["a".into(), "b".into(), "a".into()]), "[a, b]");
}
