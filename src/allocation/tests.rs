use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;

fn with_requests(cpu: &str, memory: &str) -> Pod {
    let mut p = crate::testutil::named_pod("web", "u-web");
    let q = |cpu: &str, memory: &str| {
        BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity(memory.into())),
        ])
    };
    p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
        requests: Some(q(cpu, memory)),
        limits: Some(q(cpu, memory)),
        ..Default::default()
    });
    p
}

fn node(cpu_milli: i128, memory: i128) -> crate::lifecycle::NodeFacts {
    crate::lifecycle::NodeFacts {
        name: "n1".into(),
        cpu_milli,
        memory_milli: memory * 1000,
        ephemeral_milli: 1 << 60,
        pods: 110,
        ..Default::default()
    }
}

#[test]
fn infeasible_as_upstreams_can_resize_pod() {
    // Memory is looked at first; cpu in millicores, memory in bytes.
    let n = node(2000, 1 << 30);
    assert_eq!(infeasible(&with_requests("1", "512Mi"), &n), None);
    assert_eq!(
        infeasible(&with_requests("3", "512Mi"), &n),
        Some(Pending {
            reason: INFEASIBLE,
            message: "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000"
                .into()
        })
    );
    assert_eq!(
        infeasible(&with_requests("3", "2Gi"), &n).unwrap().message,
        "Node didn't have enough capacity: memory, requested: 2147483648, capacity: 1073741824"
    );
}

#[test]
fn a_lagging_allocation_is_run_and_kept_across_a_restart() {
    let root = std::env::temp_dir().join(format!("rkubelet-alloc-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let m = AllocationManager::load(&root);
    let old = with_requests("1", "512Mi");
    let new = with_requests("3", "512Mi");
    let alloc = m.allocation("u-web", &old);
    assert_eq!(
        alloc,
        resources_of(&old),
        "no record: the pod as last granted"
    );

    m.defer(
        "u-web",
        alloc,
        Pending {
            reason: DEFERRED,
            message: "no room".into(),
        },
    );
    // The worker runs the old resources while the spec asks for more.
    let run = m.granted(Arc::new(new.clone()));
    assert_eq!(resources_of(&run), resources_of(&old));
    assert!(m.lags("u-web"));

    // A restart reads the record back: the pod keeps its old grant.
    let again = AllocationManager::load(&root);
    assert_eq!(
        resources_of(&again.granted(Arc::new(new.clone()))),
        resources_of(&old)
    );
    assert_eq!(again.pending("u-web"), None, "why it waits is decided anew");

    // Granted: the spec runs, nothing is kept, the resize is in progress.
    m.grant(&new, true);
    assert!(!m.lags("u-web") && m.pending("u-web").is_none());
    assert!(m.in_progress("u-web"));
    assert_eq!(
        resources_of(&m.granted(Arc::new(new.clone()))),
        resources_of(&new)
    );
    assert!(!m.done("u-web", &old), "a copy synced before the grant");
    assert!(m.done("u-web", &new) && !m.in_progress("u-web"));
    let reloaded = AllocationManager::load(&root);
    assert!(!reloaded.lags("u-web"), "the record is gone from the file");
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn an_unreadable_checkpoint_is_no_record() {
    let root = std::env::temp_dir().join(format!("rkubelet-alloc-bad-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join(STATE_FILE), b"{not json").unwrap();
    let m = AllocationManager::load(&root);
    assert!(!m.lags("u-web"));
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(start_paused = true)]
async fn deferred_resizes_are_retried_in_upstreams_order() {
    // Old code: retries came in a hash map's order, so which of two
    // resizes took freed room was chance (upstream sortPendingResizes).
    let m = AllocationManager::default();
    let deferred = |why: &'static str| Pending {
        reason: why,
        message: String::new(),
    };
    let named = |uid: &str, cpu: &str| {
        let mut p = with_requests(cpu, "512Mi");
        p.metadata.uid = Some(uid.into());
        p
    };
    // Age: the longest waiting first; waiting again for the same reason
    // keeps a pod's place, a new reason starts it anew.
    for uid in ["u-a", "u-b", "u-c"] {
        m.defer(uid, resources_of(&named(uid, "1")), deferred(DEFERRED));
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
    }
    assert_eq!(m.deferred_uids(), ["u-a", "u-b", "u-c"]);
    m.defer("u-a", resources_of(&named("u-a", "1")), deferred(DEFERRED));
    assert_eq!(m.deferred_uids(), ["u-a", "u-b", "u-c"]);
    m.defer(
        "u-a",
        resources_of(&named("u-a", "1")),
        deferred(INFEASIBLE),
    );
    m.defer("u-a", resources_of(&named("u-a", "1")), deferred(DEFERRED));
    assert_eq!(m.deferred_uids(), ["u-b", "u-c", "u-a"]);

    // Rank: a resize asking for no more comes first, then priority, then
    // Guaranteed before Burstable.
    let mut shrinking = named("u-a", "500m");
    shrinking.spec.as_mut().unwrap().priority = Some(-5);
    let mut high = named("u-b", "2");
    high.spec.as_mut().unwrap().priority = Some(1000);
    let guaranteed = named("u-c", "2");
    let mut burstable = named("u-d", "2");
    m.defer("u-d", resources_of(&named("u-d", "1")), deferred(DEFERRED));
    burstable.spec.as_mut().unwrap().containers[0]
        .resources
        .as_mut()
        .unwrap()
        .limits = None;
    let mut ranked = [&burstable, &guaranteed, &high, &shrinking];
    ranked.sort_by_key(|p| m.retry_rank(p));
    let uids: Vec<_> = ranked
        .iter()
        .map(|p| p.metadata.uid.as_deref().unwrap())
        .collect();
    assert_eq!(uids, ["u-a", "u-b", "u-c", "u-d"]);
}
