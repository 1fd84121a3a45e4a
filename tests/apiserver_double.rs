//! Tests of the Kubernetes API server test double (tests/common/apiserver),
//! each against the upstream rule it follows. No containerd needed.

mod common;

use std::time::{Duration, Instant};

use common::apiserver::{ApiServer, ApiServerOptions, Client};
use serde_json::{json, Value};

fn plain() -> ApiServer {
    ApiServer::start(ApiServerOptions {
        tls: false,
        ..Default::default()
    })
}

fn pod(name: &str, node: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    p
}

fn rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .parse()
        .expect("numeric resourceVersion")
}

const PODS: &str = "/api/v1/namespaces/default/pods";

// k8s.io/apiserver generic registry: create sets uid, creationTimestamp and
// resourceVersion; GET of a missing object is 404 with a NotFound Status.
#[test]
fn create_get_and_not_found() {
    let s = plain();
    let c = s.client();
    let r = c.post(PODS, &pod("a", None)).unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert!(r.body["metadata"]["uid"].as_str().unwrap().len() == 36);
    assert!(r.body["metadata"]["creationTimestamp"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    assert_eq!(r.body["metadata"]["generation"], 1);
    assert_eq!(r.body["status"]["phase"], "Pending");
    let g = c.get(&format!("{PODS}/a")).unwrap();
    assert_eq!(g.status, 200);
    assert_eq!(g.body["metadata"]["uid"], r.body["metadata"]["uid"]);
    let missing = c.get(&format!("{PODS}/nope")).unwrap();
    assert_eq!(missing.status, 404);
    assert_eq!(missing.body["kind"], "Status");
    assert_eq!(missing.body["reason"], "NotFound");
    assert_eq!(missing.body["message"], "pods \"nope\" not found");
    assert_eq!(missing.body["code"], 404);
}

// k8s.io/apiserver storage: Create of an existing key fails with
// AlreadyExists (409).
#[test]
fn create_twice_is_already_exists() {
    let s = plain();
    let c = s.client();
    assert_eq!(c.post(PODS, &pod("a", None)).unwrap().status, 201);
    let r = c.post(PODS, &pod("a", None)).unwrap();
    assert_eq!(r.status, 409);
    assert_eq!(r.body["reason"], "AlreadyExists");
    // generateName: the server picks the name.
    let r = c
        .post(
            PODS,
            &json!({"metadata": {"generateName": "gen-"}, "spec": {}}),
        )
        .unwrap();
    assert_eq!(r.status, 201);
    assert!(r.body["metadata"]["name"]
        .as_str()
        .unwrap()
        .starts_with("gen-"));
}

// k8s.io/apiserver storage GuaranteedUpdate: an update whose
// resourceVersion is not the stored one is a Conflict (409).
#[test]
fn update_with_stale_resource_version_conflicts() {
    let s = plain();
    let c = s.client();
    let created = c.post(PODS, &pod("a", None)).unwrap().body;
    let mut first = created.clone();
    first["metadata"]["labels"]["x"] = json!("1");
    let r = c.put(&format!("{PODS}/a"), &first).unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert!(rv(&r.body) > rv(&created));
    let mut stale = created.clone();
    stale["metadata"]["labels"]["x"] = json!("2");
    let r = c.put(&format!("{PODS}/a"), &stale).unwrap();
    assert_eq!(r.status, 409);
    assert_eq!(r.body["reason"], "Conflict");
    assert!(r.body["message"]
        .as_str()
        .unwrap()
        .contains("the object has been modified"));
    // Missing object: 404.
    let mut other = created;
    other["metadata"]["name"] = json!("b");
    assert_eq!(c.put(&format!("{PODS}/b"), &other).unwrap().status, 404);
}

// Pod strategy: the main resource ignores status changes; /status resets
// spec and ownerReferences to the stored ones and keeps the rest, labels
// included (registry/core/pod/strategy.go podStatusStrategy.PrepareForUpdate:
// `newPod.Spec = oldPod.Spec`, `newPod.OwnerReferences = oldPod.OwnerReferences`).
#[test]
fn status_subresource_splits_spec_and_status() {
    let s = plain();
    let c = s.client();
    let mut p = c.post(PODS, &pod("a", Some("n1"))).unwrap().body;
    p["status"]["phase"] = json!("Running");
    p["metadata"]["labels"]["via"] = json!("main");
    let r = c.put(&format!("{PODS}/a"), &p).unwrap().body;
    assert_eq!(r["status"]["phase"], "Pending");
    assert_eq!(r["metadata"]["labels"]["via"], "main");
    let mut q = r.clone();
    q["status"]["phase"] = json!("Running");
    q["metadata"]["labels"]["via"] = json!("status");
    q["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "x"}]);
    q["spec"]["activeDeadlineSeconds"] = json!(5);
    let r = c.put(&format!("{PODS}/a/status"), &q).unwrap().body;
    assert_eq!(r["status"]["phase"], "Running");
    assert_eq!(r["metadata"]["labels"]["via"], "status");
    assert!(r["metadata"].get("ownerReferences").is_none(), "{r:#}");
    assert!(r["spec"].get("activeDeadlineSeconds").is_none(), "{r:#}");
}

// Node status strategy resets only spec, so a kubelet's status patch may
// carry labels (registry/core/node/strategy.go nodeStatusStrategy
// .PrepareForUpdate; upstream's kubelet restores kubernetes.io/os and
// kubernetes.io/arch that way, through nodeutil.PatchNodeStatus).
#[test]
fn node_status_patch_takes_labels_and_leaves_spec() {
    let s = plain();
    let c = s.client();
    s.create(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "labels": {"team": "a"}},
        "spec": {"unschedulable": true}}));
    let r = c
        .patch(
            "/api/v1/nodes/n1/status",
            "application/strategic-merge-patch+json",
            &json!({"metadata": {"labels": {"kubernetes.io/os": "linux"}},
                "spec": {"unschedulable": false},
                "status": {"phase": "Running"}}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.body["metadata"]["labels"],
        json!({"team": "a", "kubernetes.io/os": "linux"})
    );
    assert_eq!(r.body["spec"]["unschedulable"], true);
    assert_eq!(r.body["status"]["phase"], "Running");
}

// List with fieldSelector spec.nodeName (pods' selectable field, how the
// kubelet lists its own pods); list metadata.resourceVersion is current;
// list items have no kind/apiVersion (kubernetes/kubernetes#3030).
#[test]
fn list_with_field_selector_returns_only_that_nodes_pods() {
    let s = plain();
    let c = s.client();
    for (n, node) in [("a", "n1"), ("b", "n2"), ("c", "n1")] {
        s.create(pod(n, Some(node)));
    }
    s.create(pod("d", None));
    let r = c
        .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1")
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["kind"], "PodList");
    let names: Vec<&str> = r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "c"]);
    // Items of a JSON list carry no kind/apiVersion (kubernetes#3030).
    assert!(r.body["items"][0].get("kind").is_none());
    assert_eq!(
        r.body["metadata"]["resourceVersion"],
        s.resource_version().to_string()
    );
    // Unscheduled pods: spec.nodeName= (empty), and != with a label selector.
    let r = c
        .get(&format!("{PODS}?fieldSelector=spec.nodeName%3D"))
        .unwrap();
    assert_eq!(r.body["items"].as_array().unwrap().len(), 1);
    let r = c
        .get(&format!(
            "{PODS}?fieldSelector=spec.nodeName!%3Dn1,metadata.name!%3Dd&labelSelector=app%3Db"
        ))
        .unwrap();
    assert_eq!(r.body["items"][0]["metadata"]["name"], "b");
    assert_eq!(r.body["items"].as_array().unwrap().len(), 1);
}

// List pagination: limit returns a continue token; a token from before a
// compaction is 410 Expired (storage: "continue parameter is too old").
#[test]
fn list_limit_continue_and_expired_token() {
    let s = plain();
    let c = s.client();
    for n in ["a", "b", "c"] {
        s.create(pod(n, None));
    }
    let r = c.get(&format!("{PODS}?limit=2")).unwrap().body;
    assert_eq!(r["items"].as_array().unwrap().len(), 2);
    let token = r["metadata"]["continue"].as_str().unwrap().to_string();
    let enc = token.replace('/', "%2F");
    let r2 = c
        .get(&format!("{PODS}?limit=2&continue={enc}"))
        .unwrap()
        .body;
    assert_eq!(r2["items"][0]["metadata"]["name"], "c");
    assert!(r2["metadata"].get("continue").is_none());
    s.create(pod("d", None));
    s.compact();
    let r3 = c.get(&format!("{PODS}?limit=2&continue={enc}")).unwrap();
    assert_eq!(r3.status, 410);
    assert_eq!(r3.body["reason"], "Expired");
}

// Watch from a list's resourceVersion: every later change, in order, as
// ADDED, MODIFIED, DELETED (k8s.io/apiserver watch semantics). Deleting a
// pod is two writes upstream even when immediate (the pod strategy is
// graceful, so the store first writes deletionTimestamp with grace 0, then
// deletes): MODIFIED then DELETED.
#[test]
fn watch_from_list_rv_sees_changes_in_order() {
    let s = plain();
    let c = s.client();
    s.create(pod("before", None));
    let list = c.get(PODS).unwrap().body;
    let list_rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut w = c
        .watch(&format!("{PODS}?watch=true&resourceVersion={list_rv}"))
        .unwrap();
    let created = s.create(pod("a", None));
    let mut p = created.clone();
    p["metadata"]["labels"]["x"] = json!("y");
    s.update(p);
    s.delete("pods", Some("default"), "a", None);
    let mut rvs = Vec::new();
    for want in ["ADDED", "MODIFIED", "MODIFIED", "DELETED"] {
        let e = w.next_event().unwrap().unwrap();
        assert_eq!(e["type"], want, "{e}");
        assert_eq!(e["object"]["metadata"]["name"], "a");
        rvs.push(rv(&e["object"]));
    }
    assert!(rvs.windows(2).all(|w| w[0] < w[1]), "{rvs:?}");
    assert!(rvs[0] > list_rv.parse::<u64>().unwrap());
    // resourceVersion=0: the current state as ADDED, then live.
    let mut w0 = c
        .watch(&format!("{PODS}?watch=1&resourceVersion=0"))
        .unwrap();
    let e = w0.next_event().unwrap().unwrap();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("before"))
    );
}

// Watch bookmarks (KEP-956): with allowWatchBookmarks the server sends
// BOOKMARK events carrying only kind, apiVersion and a resourceVersion that
// does not go backwards.
#[test]
fn watch_bookmarks_carry_increasing_resource_versions() {
    let s = ApiServer::start(ApiServerOptions {
        tls: false,
        bookmark_interval: Duration::from_millis(200),
        ..Default::default()
    });
    let c = s.client();
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&allowWatchBookmarks=true&resourceVersion={}",
            s.resource_version()
        ))
        .unwrap();
    let first = loop {
        let e = w.next_event().unwrap().unwrap();
        if e["type"] == "BOOKMARK" {
            break e;
        }
    };
    assert_eq!(first["object"]["kind"], "Pod");
    assert_eq!(first["object"]["apiVersion"], "v1");
    assert!(first["object"].get("spec").is_none());
    s.create(pod("a", None));
    let mut saw_added = false;
    let second = loop {
        let e = w.next_event().unwrap().unwrap();
        if e["type"] == "ADDED" {
            saw_added = true;
        } else if e["type"] == "BOOKMARK" && saw_added {
            break e;
        }
    };
    assert!(rv(&second["object"]) > rv(&first["object"]));
    assert_eq!(rv(&second["object"]), s.resource_version());
}

// k8s.io/apiserver storage (watch cache): a watch from a resourceVersion
// older than the retained history gets an ERROR event with a 410 Expired
// Status ("too old resource version"), then the stream ends.
#[test]
fn watch_from_compacted_rv_gets_410_expired() {
    let s = plain();
    let c = s.client();
    let old = s.resource_version();
    s.create(pod("a", None));
    s.create(pod("b", None));
    s.compact();
    let mut w = c
        .watch(&format!("{PODS}?watch=true&resourceVersion={old}"))
        .unwrap();
    let e = w.next_event().unwrap().unwrap();
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["kind"], "Status");
    assert_eq!(e["object"]["code"], 410);
    assert_eq!(e["object"]["reason"], "Expired");
    assert!(e["object"]["message"]
        .as_str()
        .unwrap()
        .starts_with(&format!("too old resource version: {old} (")));
    assert!(w.next_event().unwrap().is_none(), "stream must end");
    // From the compaction point on it works.
    let now = s.resource_version();
    let mut w = c
        .watch(&format!("{PODS}?watch=true&resourceVersion={now}"))
        .unwrap();
    s.create(pod("c", None));
    assert_eq!(w.next_event().unwrap().unwrap()["type"], "ADDED");
}

// Watch cache (cacheWatcher.convertToWatchEvent): an object that stops
// matching a watch's selector is sent as DELETED; one that starts matching
// as ADDED.
#[test]
fn field_selected_watch_sees_deleted_when_object_stops_matching() {
    let s = plain();
    let c = s.client();
    let mut w = c
        .watch(&format!(
            "/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dn1&resourceVersion={}",
            s.resource_version()
        ))
        .unwrap();
    s.create(pod("other", Some("n2")));
    let p = s.create(pod("a", Some("n1")));
    let e = w.next_event().unwrap().unwrap();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("a"))
    );
    let mut moved = p.clone();
    moved["spec"]["nodeName"] = json!("n2");
    let after = s.update(moved);
    let e = w.next_event().unwrap().unwrap();
    assert_eq!(e["type"], "DELETED");
    assert_eq!(
        e["object"]["spec"]["nodeName"], "n1",
        "the last matching state"
    );
    assert_eq!(rv(&e["object"]), rv(&after));
    let mut back = after.clone();
    back["spec"]["nodeName"] = json!("n1");
    s.update(back);
    assert_eq!(w.next_event().unwrap().unwrap()["type"], "ADDED");
}

// timeoutSeconds: the server ends the watch cleanly after it.
#[test]
fn watch_timeout_seconds_ends_the_stream() {
    let s = plain();
    let c = s.client();
    let t0 = Instant::now();
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&timeoutSeconds=1&resourceVersion={}",
            s.resource_version()
        ))
        .unwrap();
    assert!(w.next_event().unwrap().is_none());
    assert!(t0.elapsed() >= Duration::from_millis(900));
}

// RFC 7386 JSON merge patch: objects merge, null deletes a key, lists are
// replaced.
#[test]
fn merge_patch_null_deletes_a_key() {
    let s = plain();
    let c = s.client();
    let mut p = pod("a", None);
    p["metadata"]["labels"] = json!({"keep": "1", "drop": "2"});
    s.create(p);
    let r = c
        .patch(
            &format!("{PODS}/a"),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"drop": null, "new": "3"}}}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.body["metadata"]["labels"],
        json!({"keep": "1", "new": "3"})
    );
    // JSON patch (RFC 6902) too.
    let r = c
        .patch(
            &format!("{PODS}/a"),
            "application/json-patch+json",
            &json!([{"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}},
                    {"op": "test", "path": "/metadata/labels/keep", "value": "1"}]),
        )
        .unwrap();
    assert_eq!(r.body["metadata"]["annotations"]["k"], "v");
    // Server-side apply is not implemented: 415.
    let r = c
        .patch(
            &format!("{PODS}/a"),
            "application/apply-patch+yaml",
            &json!({}),
        )
        .unwrap();
    assert_eq!(r.status, 415);
}

// podStrategy.PrepareForCreate sets status.qosClass = ComputePodQOS(pod)
// (pkg/apis/core/v1/helper/qos: pod-level resources decide when set), after
// defaultPodRequests (pkg/apis/core/v1/defaults.go) gave pod-level limits
// their requests; ValidatePodStatusUpdate keeps the class immutable.
#[test]
fn pods_get_their_qos_class_at_create_and_keep_it() {
    let s = plain();
    let c = s.client();
    let with = |name: &str, spec_resources: Option<Value>, container: Option<Value>| {
        let mut p = pod(name, Some("n1"));
        if let Some(r) = spec_resources {
            p["spec"]["resources"] = r;
        }
        if let Some(r) = container {
            p["spec"]["containers"][0]["resources"] = r;
        }
        s.create(p)
    };
    let qos = |p: &Value| p["status"]["qosClass"].as_str().unwrap().to_string();
    assert_eq!(qos(&with("be", None, None)), "BestEffort");
    let both = json!({"cpu": "500m", "memory": "64Mi"});
    assert_eq!(
        qos(&with("g", None, Some(json!({"limits": both.clone()})))),
        "Guaranteed"
    );
    // Pod-level limits alone: requests default to them, Guaranteed.
    let pl = with("pl", Some(json!({"limits": both.clone()})), None);
    assert_eq!(qos(&pl), "Guaranteed");
    assert_eq!(pl["spec"]["resources"]["requests"]["cpu"], "500m");
    // Pod-level limits with a container's smaller request: the pod-level
    // request defaults to the containers' sum, Burstable.
    let small = with(
        "pb",
        Some(json!({"limits": both.clone()})),
        Some(json!({"requests": {"cpu": "100m"}})),
    );
    assert_eq!(small["spec"]["resources"]["requests"]["cpu"], "100m");
    assert_eq!(small["spec"]["resources"]["requests"]["memory"], "67108864");
    assert_eq!(qos(&small), "Burstable");
    // Pod-level resources decide over the containers'.
    let over = with(
        "po",
        Some(json!({"requests": {"cpu": "1"}})),
        Some(json!({"limits": both})),
    );
    assert_eq!(qos(&over), "Burstable");

    // A status write with another class is refused; one without the field
    // in a patch keeps it.
    let r = c
        .patch(
            &format!("{PODS}/pb/status"),
            "application/strategic-merge-patch+json",
            &json!({"status": {"qosClass": "BestEffort", "phase": "Running"}}),
        )
        .unwrap();
    assert_eq!(r.status, 422, "{:#}", r.body);
    assert_eq!(
        r.body["message"],
        "Pod \"pb\" is invalid: status.qosClass: Invalid value: \"BestEffort\": field is immutable"
    );
    let r = c
        .patch(
            &format!("{PODS}/pb/status"),
            "application/strategic-merge-patch+json",
            &json!({"status": {"phase": "Running"}}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert_eq!(r.body["status"]["qosClass"], "Burstable");
}

// Strategic merge patch (apimachinery strategicpatch): PodStatus.conditions
// has patchMergeKey "type", so conditions not in the patch stay, those in it
// merge by type, and $setElementOrder/conditions orders the result.
#[test]
fn strategic_merge_of_pod_status_conditions() {
    let s = plain();
    let c = s.client();
    let p = s.create(pod("a", Some("n1")));
    let mut st = p.clone();
    st["status"]["conditions"] = json!([
        {"type": "PodScheduled", "status": "True"},
        {"type": "Initialized", "status": "True"},
        {"type": "Ready", "status": "False"},
    ]);
    st["status"]["containerStatuses"] = json!([{"name": "c", "ready": false, "restartCount": 0}]);
    s.update_status(st);
    let patch = json!({
        "metadata": {"uid": p["metadata"]["uid"]},
        "status": {
            "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "PodScheduled"}, {"type": "Initialized"}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "c", "ready": true}],
            "phase": "Running",
        }
    });
    let r = c
        .patch(
            &format!("{PODS}/a/status"),
            "application/strategic-merge-patch+json",
            &patch,
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    let conds = &r.body["status"]["conditions"];
    assert_eq!(conds.as_array().unwrap().len(), 3);
    assert_eq!(conds[0], json!({"type": "Ready", "status": "True"}));
    assert_eq!(conds[1]["type"], "PodScheduled");
    assert_eq!(conds[2]["type"], "Initialized");
    assert_eq!(
        r.body["status"]["containerStatuses"][0],
        json!({"name": "c", "ready": true, "restartCount": 0})
    );
    assert_eq!(r.body["status"]["phase"], "Running");
    // $patch: delete on an element, $deleteFromPrimitiveList on finalizers.
    let r = c
        .patch(
            &format!("{PODS}/a/status"),
            "application/strategic-merge-patch+json",
            &json!({"status": {"conditions": [{"type": "Initialized", "$patch": "delete"}]}}),
        )
        .unwrap();
    assert_eq!(r.body["status"]["conditions"].as_array().unwrap().len(), 2);
    c.patch(
        &format!("{PODS}/a"),
        "application/strategic-merge-patch+json",
        &json!({"metadata": {"finalizers": ["a/x", "a/y"]}}),
    )
    .unwrap();
    let r = c.patch(&format!("{PODS}/a"), "application/strategic-merge-patch+json",
        &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a/x"], "finalizers": ["a/z"]}})).unwrap();
    assert_eq!(r.body["metadata"]["finalizers"], json!(["a/y", "a/z"]));
}

// Patch preconditions: a patch carrying metadata.uid (the kubelet's status
// manager does) or metadata.resourceVersion that differs from the stored
// object is a Conflict (409).
#[test]
fn patch_with_wrong_uid_conflicts() {
    let s = plain();
    let c = s.client();
    let p = s.create(pod("a", Some("n1")));
    let r = c
        .patch(
            &format!("{PODS}/a/status"),
            "application/strategic-merge-patch+json",
            &json!({"metadata": {"uid": "00000000-0000-0000-0000-000000000000"}, "status": {"phase": "Running"}}),
        )
        .unwrap();
    assert_eq!(r.status, 409);
    assert_eq!(r.body["reason"], "Conflict");
    assert!(r.body["message"]
        .as_str()
        .unwrap()
        .contains("Precondition failed: UID in precondition"));
    let r = c
        .patch(
            &format!("{PODS}/a"),
            "application/merge-patch+json",
            &json!({"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}}),
        )
        .unwrap();
    assert_eq!(r.status, 409);
    assert_eq!(s.get("pods", Some("default"), "a").unwrap(), p);
}

// Pod strategy CheckGracefulDelete + rest.BeforeDelete (k8s.io/apiserver
// registry/rest/delete.go): a bound pod deleted with grace > 0 (default
// spec.terminationGracePeriodSeconds, defaulted to 30) gets
// deletionTimestamp/deletionGracePeriodSeconds and a generation bump and
// stays (MODIFIED); a later delete may only shorten the period, counted from
// the first; grace 0 writes the object (MODIFIED) then deletes it (DELETED);
// an unbound pod goes at once.
#[test]
fn graceful_delete_of_bound_pod() {
    let s = plain();
    let c = s.client();
    s.create(pod("a", Some("n1")));
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={}",
            s.resource_version()
        ))
        .unwrap();
    let r = c.delete(&format!("{PODS}/a"), None).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["metadata"]["deletionGracePeriodSeconds"], 30);
    assert_eq!(r.body["metadata"]["generation"], 2);
    let first_ts = r.body["metadata"]["deletionTimestamp"]
        .as_str()
        .unwrap()
        .to_string();
    let first_ts: k8s_openapi::jiff::Timestamp = first_ts.parse().unwrap();
    assert!(s.get("pods", Some("default"), "a").is_some());
    assert_eq!(w.next_event().unwrap().unwrap()["type"], "MODIFIED");
    // Shrink to 10: the deadline moves 20 s earlier.
    let r = c
        .delete(&format!("{PODS}/a?gracePeriodSeconds=10"), None)
        .unwrap();
    assert_eq!(r.body["metadata"]["deletionGracePeriodSeconds"], 10);
    let ts: k8s_openapi::jiff::Timestamp = r.body["metadata"]["deletionTimestamp"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(first_ts.as_second() - ts.as_second(), 20);
    assert_eq!(r.body["metadata"]["generation"], 2);
    // Growing (or no grace period) is ignored: no write.
    let before = s.resource_version();
    let r = c
        .delete(
            &format!("{PODS}/a"),
            Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 60})),
        )
        .unwrap();
    assert_eq!(r.body["metadata"]["deletionGracePeriodSeconds"], 10);
    c.delete(&format!("{PODS}/a"), None).unwrap();
    assert_eq!(s.resource_version(), before);
    assert_eq!(w.next_event().unwrap().unwrap()["type"], "MODIFIED");
    let r = c
        .delete(
            &format!("{PODS}/a"),
            Some(&json!({"gracePeriodSeconds": 0})),
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(s.get("pods", Some("default"), "a").is_none());
    let e = w.next_event().unwrap().unwrap();
    assert_eq!(e["type"], "MODIFIED");
    assert_eq!(e["object"]["metadata"]["deletionGracePeriodSeconds"], 0);
    assert_eq!(w.next_event().unwrap().unwrap()["type"], "DELETED");
    // Unbound: at once.
    s.create(pod("b", None));
    c.delete(&format!("{PODS}/b"), None).unwrap();
    assert!(s.get("pods", Some("default"), "b").is_none());
    // Other kinds: at once, answered with a Success Status.
    let r = c
        .post(
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            &json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1"}}),
        )
        .unwrap();
    assert_eq!(r.status, 201);
    let r = c
        .delete(
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1",
            None,
        )
        .unwrap();
    assert_eq!(r.body["status"], "Success");
}

// DeleteOptions.preconditions: a uid (or resourceVersion) that does not
// match the stored object is a Conflict (409), nothing deleted.
#[test]
fn delete_with_wrong_precondition_uid_conflicts() {
    let s = plain();
    let c = s.client();
    s.create(pod("a", None));
    let r = c
        .delete(
            &format!("{PODS}/a"),
            Some(&json!({"preconditions": {"uid": "nope"}})),
        )
        .unwrap();
    assert_eq!(r.status, 409);
    assert_eq!(r.body["reason"], "Conflict");
    assert!(s.get("pods", Some("default"), "a").is_some());
    let uid = s.get("pods", Some("default"), "a").unwrap()["metadata"]["uid"].clone();
    let r = c
        .delete(
            &format!("{PODS}/a"),
            Some(&json!({"preconditions": {"uid": uid}})),
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(s.get("pods", Some("default"), "a").is_none());
}

// Finalizers (generic registry): deleting an object with finalizers only
// marks it; removing the last finalizer removes it.
#[test]
fn finalizers_hold_deletion() {
    let s = plain();
    let mut p = pod("a", None);
    p["metadata"]["finalizers"] = json!(["test/hold"]);
    s.create(p);
    let pending = s
        .delete("pods", Some("default"), "a", None)
        .expect("pending");
    assert!(pending["metadata"]["deletionTimestamp"].is_string());
    let mut next = pending.clone();
    next["metadata"]["finalizers"] = json!([]);
    s.update(next);
    assert!(s.get("pods", Some("default"), "a").is_none());
}

// A restarted API server keeps its data (etcd) and address; open watches
// end when it stops.
#[test]
fn stop_and_restart_keep_objects_and_port() {
    let s = plain();
    let c = s.client();
    s.create(pod("a", None));
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={}",
            s.resource_version()
        ))
        .unwrap();
    let url = s.url();
    s.stop();
    assert!(
        matches!(w.next_event(), Ok(None) | Err(_)),
        "watch must end"
    );
    assert!(c
        .clone()
        .with_timeout(Duration::from_secs(1))
        .get(PODS)
        .is_err());
    s.restart();
    assert_eq!(s.url(), url);
    let r = c.get(&format!("{PODS}/a")).unwrap();
    assert_eq!(r.status, 200);
}

// A network partition: requests are not answered (the client times out)
// and open watches end without an ERROR event or a clean end of stream;
// after it heals new requests work.
#[test]
fn partition_hangs_requests_until_healed() {
    let s = plain();
    let c = s.client().with_timeout(Duration::from_millis(500));
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={}",
            s.resource_version()
        ))
        .unwrap();
    s.partition(true);
    let t0 = Instant::now();
    let err = c.get(PODS).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "{err:?}"
    );
    assert!(t0.elapsed() >= Duration::from_millis(400));
    s.create(pod("a", None));
    let ended = w.next_event();
    assert!(ended.is_err(), "the watch must break, got {ended:?}");
    // The hung request was never read, let alone answered.
    assert!(!s
        .requests()
        .iter()
        .any(|r| r.method == "GET" && r.path == PODS));
    s.partition(false);
    assert_eq!(c.get(&format!("{PODS}/a")).unwrap().status, 200);
}

fn tls_server(require: bool, tokens: Vec<String>) -> ApiServer {
    ApiServer::start(ApiServerOptions {
        require_client_cert: require,
        bootstrap_tokens: tokens,
        ..Default::default()
    })
}

// x509 client-certificate authentication (k8s.io/apiserver
// authentication/request/x509): CN is the user, O the groups.
#[test]
fn client_certificate_authenticates_as_its_cn() {
    let s = tls_server(true, vec![]);
    let (cert, key) = s.issue_client_cert(
        "system:node:n1",
        &["system:nodes"],
        Duration::from_secs(3600),
    );
    let c = s.client().with_client_cert(&cert, &key);
    let r = c.get("/api/v1/nodes").unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    let last = s.requests().pop().unwrap();
    assert_eq!(last.user, "system:node:n1");
    assert!(s.url().starts_with("https://127.0.0.1:"));
}

// With anonymous auth off, a request without credentials is 401
// Unauthorized (a Status); an unknown bearer token is always 401.
#[test]
fn request_without_credentials_is_unauthorized() {
    let s = tls_server(true, vec![]);
    let r = s.client().get("/api/v1/nodes").unwrap();
    assert_eq!(r.status, 401);
    assert_eq!(r.body["reason"], "Unauthorized");
    let r = s
        .client()
        .with_token("abcdef.0123456789abcdef")
        .get("/api/v1/nodes")
        .unwrap();
    assert_eq!(r.status, 401);
}

// Bootstrap tokens (k8s.io/apiserver bootstrap token authenticator):
// user system:bootstrap:<id> in system:bootstrappers; RBAC
// (system:node-bootstrapper) allows CSRs only, 403 elsewhere.
#[test]
fn bootstrap_token_limited_to_csrs() {
    let token = "abcdef.0123456789abcdef";
    let s = tls_server(true, vec![token.to_string()]);
    let c = s.client().with_token(token);
    let r = c.get("/api/v1/nodes").unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(r.body["reason"], "Forbidden");
    let r = c
        .get("/apis/certificates.k8s.io/v1/certificatesigningrequests")
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(s.requests().pop().unwrap().user, "system:bootstrap:abcdef");
}

fn csr_request(cn: &str, org: &str) -> (String, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, cn);
    dn.push(rcgen::DnType::OrganizationName, org);
    params.distinguished_name = dn;
    let csr = params.serialize_request(&key).unwrap();
    (csr.pem().unwrap(), key)
}

fn cert_der(pem: &[u8]) -> rustls::pki_types::CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem).unwrap()
}

fn b64(s: &str) -> Value {
    serde_json::to_value(k8s_openapi::ByteString(s.as_bytes().to_vec())).unwrap()
}

// CSR API (certificates.k8s.io/v1): approval adds the Approved condition,
// then the signer sets status.certificate ([]byte, base64 in JSON), a
// certificate from the cluster CA for the CSR's key and subject; a
// metadata.name-selected watch sees it as MODIFIED.
#[test]
fn approved_csr_gets_a_certificate_signed_by_the_ca() {
    let token = "abcdef.0123456789abcdef";
    let s = tls_server(true, vec![token.to_string()]);
    let c = s.client().with_token(token);
    let (csr_pem, key) = csr_request("system:node:n1", "system:nodes");
    let path = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
    let r = c
        .post(path, &json!({
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": "csr-1"},
            "spec": {"request": b64(&csr_pem), "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                     "usages": ["digital signature", "client auth"]},
        }))
        .unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["spec"]["username"], "system:bootstrap:abcdef");
    let mut w = c
        .watch(&format!(
            "{path}?watch=true&fieldSelector=metadata.name%3Dcsr-1&resourceVersion={}",
            rv(&r.body)
        ))
        .unwrap();
    s.approve_csr("csr-1");
    let approved = w.next_event().unwrap().unwrap();
    assert_eq!(approved["type"], "MODIFIED");
    assert_eq!(
        approved["object"]["status"]["conditions"][0]["type"],
        "Approved"
    );
    let issued = w.next_event().unwrap().unwrap();
    assert_eq!(issued["type"], "MODIFIED");
    let cert: k8s_openapi::ByteString =
        serde_json::from_value(issued["object"]["status"]["certificate"].clone()).unwrap();
    let cert_pem = String::from_utf8(cert.0).unwrap();
    assert!(cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    // It verifies against the CA: the server accepts it as a client
    // certificate and authenticates its CN.
    let kc = s.client().with_client_cert(&cert_pem, &key.serialize_pem());
    assert_eq!(kc.get("/api/v1/nodes").unwrap().status, 200);
    let last = s.requests().pop().unwrap();
    assert_eq!(last.user, "system:node:n1");
    // And its subject is the CSR's.
    let der = cert_der(cert_pem.as_bytes());
    let (_, x) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert_eq!(
        x.subject()
            .iter_organization()
            .next()
            .unwrap()
            .as_str()
            .unwrap(),
        "system:nodes"
    );
}

// Auto-approval (csrapproving controller) and a short configured lifetime;
// kubelet-serving CSRs keep their SANs.
#[test]
fn auto_approved_serving_csr_with_short_lifetime() {
    let s = tls_server(false, vec![]);
    s.set_csr_auto_approve(true);
    s.set_issued_cert_lifetime(Duration::from_secs(120));
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["n1.example".to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:node:n1");
    let csr = params.serialize_request(&key).unwrap().pem().unwrap();
    s.create(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": "serving"},
        "spec": {"request": b64(&csr), "signerName": "kubernetes.io/kubelet-serving",
                 "usages": ["digital signature", "server auth"]},
    }));
    let csr = s
        .wait_for(
            "certificatesigningrequests",
            None,
            "serving",
            Duration::from_secs(5),
            |o| o.is_some_and(|o| o["status"]["certificate"].is_string()),
        )
        .unwrap();
    let cert: k8s_openapi::ByteString =
        serde_json::from_value(csr["status"]["certificate"].clone()).unwrap();
    let der = cert_der(&cert.0);
    let (_, x) = x509_parser::parse_x509_certificate(&der).unwrap();
    let v = x.validity();
    let secs = v.not_after.timestamp() - v.not_before.timestamp();
    assert!((115..=125).contains(&secs), "{secs}");
    let san = x.subject_alternative_name().unwrap().unwrap();
    assert!(format!("{:?}", san.value).contains("n1.example"));
}

// Discovery endpoints kube-rs and client-go call.
#[test]
fn discovery_and_version() {
    let s = plain();
    let c = Client::new(&s);
    assert_eq!(c.get("/version").unwrap().body["major"], "1");
    assert_eq!(c.get("/api").unwrap().body["versions"][0], "v1");
    let v1 = c.get("/api/v1").unwrap().body;
    assert!(v1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "pods/status"));
    let groups = c.get("/apis").unwrap().body;
    assert!(groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["name"] == "coordination.k8s.io"));
    assert_eq!(c.get("/apis/nope/v1/things").unwrap().status, 404);
}

// ---- The client the kubelet uses (kube-rs 5) against the double ----

mod kube_compat {
    use super::*;
    use common::apiserver::KubeconfigUser;
    use futures::StreamExt;
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
    use kube::config::{KubeConfigOptions, Kubeconfig};
    use kube::runtime::{watcher, WatchStreamExt};
    use kube::{Api, Client, Config};

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A fresh directory per call (tests run in parallel in one process).
    fn tmpdir(name: &str) -> std::path::PathBuf {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!(
            "apiserver-double-{name}-{}-{n}",
            std::process::id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    async fn client_from(s: &ApiServer, dir: &std::path::Path, user: KubeconfigUser) -> Client {
        let path = dir.join("kubeconfig");
        s.write_kubeconfig(&path, user);
        let kc = Kubeconfig::read_from(&path).unwrap();
        let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap();
        let client = Client::try_from(cfg).unwrap();
        // The client holds the files' contents now.
        let _ = std::fs::remove_dir_all(dir);
        client
    }

    async fn node_client(s: &ApiServer, name: &str) -> Client {
        let dir = tmpdir(name);
        let (cert, key) = s.issue_client_cert(
            &format!("system:node:{name}"),
            &["system:nodes"],
            Duration::from_secs(3600),
        );
        std::fs::write(dir.join("client.crt"), cert).unwrap();
        std::fs::write(dir.join("client.key"), key).unwrap();
        client_from(
            s,
            &dir,
            KubeconfigUser::ClientCert {
                cert: dir.join("client.crt"),
                key: dir.join("client.key"),
            },
        )
        .await
    }

    fn api_err(e: kube::Error) -> Box<kube::core::Status> {
        match e {
            kube::Error::Api(s) => s,
            other => panic!("not an API error: {other:?}"),
        }
    }

    // A kubeconfig with a client certificate (the kubelet's rotated
    // credentials) over TLS; typed create/get/list with a field selector;
    // 404/409 surface as kube::Error::Api with the Status reason.
    #[test]
    fn typed_crud_through_kubeconfig_with_client_cert() {
        let s = ApiServer::start(ApiServerOptions {
            require_client_cert: true,
            ..Default::default()
        });
        rt().block_on(async {
            let client = node_client(&s, "n1").await;
            let nodes: Api<Node> = Api::all(client.clone());
            let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
            let created = nodes.create(&PostParams::default(), &node).await.unwrap();
            assert!(created.metadata.uid.is_some());
            let again = api_err(nodes.create(&PostParams::default(), &node).await.unwrap_err());
            assert!(again.is_already_exists(), "{again:?}");
            let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
            for (n, node) in [("a", "n1"), ("b", "n2")] {
                let p: Pod = serde_json::from_value(pod(n, Some(node))).unwrap();
                pods.create(&PostParams::default(), &p).await.unwrap();
            }
            let mine = Api::<Pod>::all(client.clone())
                .list(&ListParams::default().fields("spec.nodeName=n1"))
                .await
                .unwrap();
            assert_eq!(mine.items.len(), 1);
            assert_eq!(mine.items[0].metadata.name.as_deref(), Some("a"));
            assert!(mine.metadata.resource_version.is_some());
            let missing = api_err(pods.get("nope").await.unwrap_err());
            assert!(missing.is_not_found());
            assert_eq!(pods.get_opt("nope").await.unwrap(), None);
            // Leases: replace with a stale resourceVersion is a Conflict.
            let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
            let l: Lease = serde_json::from_value(
                json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40}}),
            )
            .unwrap();
            let l = leases.create(&PostParams::default(), &l).await.unwrap();
            let mut l2 = l.clone();
            l2.spec.as_mut().unwrap().lease_duration_seconds = Some(41);
            leases.replace("n1", &PostParams::default(), &l2).await.unwrap();
            let stale = api_err(leases.replace("n1", &PostParams::default(), &l).await.unwrap_err());
            assert!(stale.is_conflict(), "{stale:?}");
        });
        assert!(s.requests().iter().all(|r| r.user == "system:node:n1"));
    }

    // The kubelet's status manager: a strategic merge patch of pods/status
    // with a metadata.uid precondition; a stale uid is a Conflict; deletion
    // with a uid precondition and grace 0 (how the kubelet finishes a
    // graceful deletion) removes the pod.
    #[test]
    fn status_patch_and_delete_as_the_kubelet_does() {
        let s = ApiServer::start(ApiServerOptions::default());
        rt().block_on(async {
            let client = node_client(&s, "n1").await;
            let pods: Api<Pod> = Api::namespaced(client, "default");
            let p: Pod = serde_json::from_value(pod("a", Some("n1"))).unwrap();
            let p = pods.create(&PostParams::default(), &p).await.unwrap();
            let uid = p.metadata.uid.clone().unwrap();
            let patch = json!({
                "metadata": {"uid": uid},
                "status": {"phase": "Running",
                    "$setElementOrder/conditions": [{"type": "Ready"}],
                    "conditions": [{"type": "Ready", "status": "True"}]},
            });
            let after = pods
                .patch_status("a", &PatchParams::default(), &Patch::Strategic(&patch))
                .await
                .unwrap();
            assert_eq!(after.status.unwrap().phase.as_deref(), Some("Running"));
            let wrong = json!({"metadata": {"uid": "other"}, "status": {"phase": "Failed"}});
            let e = api_err(
                pods.patch_status("a", &PatchParams::default(), &Patch::Strategic(&wrong))
                    .await
                    .unwrap_err(),
            );
            assert!(e.is_conflict(), "{e:?}");
            // Graceful deletion by a user, then the kubelet's final delete.
            let first = pods.delete("a", &DeleteParams::default()).await.unwrap();
            let pending = first.left().expect("the pod, still there");
            assert_eq!(pending.metadata.deletion_grace_period_seconds, Some(30));
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..Default::default()
            };
            pods.delete("a", &dp).await.unwrap();
            assert!(pods.get_opt("a").await.unwrap().is_none());
        });
    }

    // kube-runtime's watcher (list, then watch from the list's
    // resourceVersion with bookmarks) sees changes; when the API server
    // restarts after a compaction, its watch from the old resourceVersion
    // gets 410 Expired and it relists (client-go's reflector does the same).
    #[test]
    fn watcher_relists_after_restart_and_compaction() {
        let s = ApiServer::start(ApiServerOptions {
            bookmark_interval: Duration::from_millis(300),
            ..Default::default()
        });
        s.create(pod("a", Some("n1")));
        rt().block_on(async {
            let client = node_client(&s, "n1").await;
            let pods: Api<Pod> = Api::all(client);
            let cfg = watcher::Config::default().fields("spec.nodeName=n1");
            let mut stream = watcher(pods, cfg).default_backoff().boxed();
            let mut next_name = async |want: &str| loop {
                let ev = tokio::time::timeout(Duration::from_secs(20), stream.next())
                    .await
                    .expect("watcher event in time")
                    .expect("stream open");
                match ev {
                    Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p))
                        if p.metadata.name.as_deref() == Some(want) =>
                    {
                        return p;
                    }
                    _ => continue,
                }
            };
            next_name("a").await;
            s.create(pod("b", Some("n1")));
            next_name("b").await;
            let is_list = |r: &common::apiserver::RequestRecord| {
                r.path.starts_with("/api/v1/pods?") && !r.path.contains("watch=true")
            };
            let lists_before = s.requests().iter().filter(|r| is_list(r)).count();
            let old_rv = s.resource_version();
            s.stop();
            s.create(pod("c", Some("n1")));
            s.compact();
            s.restart();
            next_name("c").await;
            let after: Vec<_> = s.requests();
            // It watched again from the old resourceVersion (410), then
            // listed again.
            assert!(after.iter().any(|r| r.path.contains("watch=true")
                && r.path.ends_with(&format!("resourceVersion={old_rv}"))));
            assert!(after.iter().filter(|r| is_list(r)).count() > lists_before);
        });
    }

    // TLS bootstrap: a bootstrap-token kubeconfig may not read nodes, creates
    // a CSR, watches it by metadata.name and gets the certificate once
    // approved.
    #[test]
    fn csr_flow_with_bootstrap_token() {
        let token = "abcdef.0123456789abcdef";
        let s = ApiServer::start(ApiServerOptions {
            require_client_cert: true,
            bootstrap_tokens: vec![token.to_string()],
            ..Default::default()
        });
        s.set_csr_auto_approve(true);
        let (csr_pem, _key) = csr_request("system:node:n1", "system:nodes");
        rt().block_on(async {
            let dir = tmpdir("bootstrap");
            let client = client_from(&s, &dir, KubeconfigUser::Token(token.into())).await;
            let nodes = Api::<Node>::all(client.clone())
                .list(&ListParams::default())
                .await;
            assert!(api_err(nodes.unwrap_err()).is_forbidden());
            let csrs: Api<CertificateSigningRequest> = Api::all(client);
            let csr: CertificateSigningRequest = serde_json::from_value(json!({
                "metadata": {"generateName": "csr-"},
                "spec": {"request": b64(&csr_pem),
                         "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                         "usages": ["digital signature", "client auth"]},
            }))
            .unwrap();
            let created = csrs.create(&PostParams::default(), &csr).await.unwrap();
            let name = created.metadata.name.unwrap();
            let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
            let mut stream = watcher(csrs, cfg).boxed();
            let cert = loop {
                let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                if let watcher::Event::Apply(c) | watcher::Event::InitApply(c) = ev {
                    if let Some(cert) = c.status.and_then(|s| s.certificate) {
                        break cert;
                    }
                }
            };
            assert!(String::from_utf8(cert.0)
                .unwrap()
                .starts_with("-----BEGIN CERTIFICATE-----"));
        });
    }
}

// Strategic merge patch of NodeStatus (how the kubelet reports node
// status): conditions and addresses merge by "type", images (no patch
// strategy) are replaced; `$patch: replace` replaces a map, `$retainKeys`
// drops the keys it does not list.
#[test]
fn strategic_merge_of_node_status() {
    let s = plain();
    let c = s.client();
    let n = s.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
    assert!(n["metadata"].get("namespace").is_none());
    let mut st = n.clone();
    st["status"] = json!({
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "MemoryPressure", "status": "False"}],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "n1"}],
        "images": [{"names": ["a"]}, {"names": ["b"]}],
        "capacity": {"cpu": "2", "memory": "1Gi"},
        "nodeInfo": {"kubeletVersion": "v1.34.0", "osImage": "x"},
    });
    s.update_status(st);
    let patch = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True"}],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.2"}],
        "images": [{"names": ["c"]}],
        "capacity": {"$patch": "replace", "cpu": "4"},
        "nodeInfo": {"$retainKeys": ["kubeletVersion"], "kubeletVersion": "v1.34.1"},
    }});
    let r = c
        .patch(
            "/api/v1/nodes/n1/status",
            "application/strategic-merge-patch+json",
            &patch,
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    let st = &r.body["status"];
    assert_eq!(
        st["conditions"],
        json!([{"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}])
    );
    assert_eq!(
        st["addresses"],
        json!([{"type": "InternalIP", "address": "10.0.0.2"}, {"type": "Hostname", "address": "n1"}])
    );
    assert_eq!(st["images"], json!([{"names": ["c"]}]));
    assert_eq!(st["capacity"], json!({"cpu": "4"}));
    assert_eq!(st["nodeInfo"], json!({"kubeletVersion": "v1.34.1"}));
    // A patch of the main resource does not change status.
    let r = c
        .patch(
            "/api/v1/nodes/n1",
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"l": "v"}}, "status": {"images": []}}),
        )
        .unwrap();
    assert_eq!(r.body["status"]["images"], json!([{"names": ["c"]}]));
    assert_eq!(r.body["metadata"]["labels"]["l"], "v");
}

// The kubelet's node status diff (upstream PatchNodeStatus): a `$patch:
// replace` element makes the address list the patch's list alone (upstream
// fixupPatchForNodeStatusAddresses; strategicpatch's replace directive in a
// merging list), so two InternalIPs both go; a changed condition with
// `$setElementOrder/conditions` leaves a condition it does not touch (a
// CNI's) in place.
#[test]
fn strategic_merge_of_the_kubelets_node_status_diff() {
    let s = plain();
    let c = s.client();
    let n = s.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
    let mut st = n.clone();
    st["status"] = json!({
        "conditions": [
            {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"},
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"},
        ],
        "addresses": [
            {"type": "InternalIP", "address": "10.0.0.1"},
            {"type": "InternalIP", "address": "fd00::1"},
            {"type": "Hostname", "address": "n1"},
        ],
    });
    s.update_status(st);
    let patch = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        "$setElementOrder/conditions": [{"type": "NetworkUnavailable"}, {"type": "Ready"}],
        "addresses": [
            {"type": "InternalIP", "address": "10.0.0.2"},
            {"type": "Hostname", "address": "n1"},
            {"$patch": "replace"},
        ],
    }});
    let r = c
        .patch(
            "/api/v1/nodes/n1/status",
            "application/strategic-merge-patch+json",
            &patch,
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    let st = &r.body["status"];
    assert_eq!(
        st["conditions"],
        json!([
            {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"},
            {"type": "Ready", "status": "True", "reason": "KubeletReady"},
        ])
    );
    assert_eq!(
        st["addresses"],
        json!([{"type": "InternalIP", "address": "10.0.0.2"}, {"type": "Hostname", "address": "n1"}])
    );
}

// A write that changes nothing is not a write (GuaranteedUpdate skips
// no-op updates): same resourceVersion, no watch event. Creating an object
// with a resourceVersion is a BadRequest.
#[test]
fn no_op_update_keeps_resource_version() {
    let s = plain();
    let c = s.client();
    let p = s.create(pod("a", None));
    let r = c
        .patch(
            &format!("{PODS}/a"),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"app": "a"}}}),
        )
        .unwrap();
    assert_eq!(
        r.body["metadata"]["resourceVersion"],
        p["metadata"]["resourceVersion"]
    );
    let r = c.post(PODS, &r.body).unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.body["reason"], "BadRequest");
}

// Watch with a label selector and sendInitialEvents=true (KEP-3157
// streaming lists): the matching current objects as ADDED, then a BOOKMARK
// annotated k8s.io/initial-events-end, then live events.
#[test]
fn watch_with_send_initial_events_and_label_selector() {
    let s = plain();
    let c = s.client();
    s.create(pod("a", None));
    s.create(pod("b", None));
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&labelSelector=app%3Da"
        ))
        .unwrap();
    let e = w.next_event().unwrap().unwrap();
    assert_eq!(e["type"], "ADDED");
    assert_eq!(e["object"]["metadata"]["name"], "a");
    let b = w.next_event().unwrap().unwrap();
    assert_eq!(b["type"], "BOOKMARK");
    assert_eq!(
        b["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    s.create(pod("c", None));
    let mut p = s.get("pods", Some("default"), "a").unwrap();
    p["metadata"]["labels"]["x"] = json!("1");
    s.update(p);
    let e = w.next_non_bookmark().unwrap().unwrap();
    assert_eq!(e["type"], "MODIFIED");
    assert_eq!(e["object"]["metadata"]["name"], "a");
}

// CSR approval through the /approval subresource (what `kubectl
// certificate approve` does) issues a certificate; a Denied CSR is never
// signed; an unknown signer gets a Failed condition.
#[test]
fn csr_approval_subresource_and_denial() {
    let s = plain();
    let c = s.client();
    let path = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
    let mk = |name: &str, signer: &str| {
        let (pem, _) = csr_request("system:node:n1", "system:nodes");
        json!({"metadata": {"name": name},
               "spec": {"request": b64(&pem), "signerName": signer, "usages": ["client auth"]}})
    };
    for (name, signer) in [
        ("ok", "kubernetes.io/kube-apiserver-client-kubelet"),
        ("no", "kubernetes.io/kube-apiserver-client-kubelet"),
        ("odd", "example.com/other"),
    ] {
        assert_eq!(c.post(path, &mk(name, signer)).unwrap().status, 201);
    }
    let cond = |t: &str| json!({"status": {"conditions": [{"type": t, "status": "True", "reason": "Test"}]}});
    let r = c
        .put(&format!("{path}/ok/approval"), &cond("Approved"))
        .unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    let ok = s.get("certificatesigningrequests", None, "ok").unwrap();
    assert!(ok["status"]["certificate"].is_string());
    c.put(&format!("{path}/no/approval"), &cond("Denied"))
        .unwrap();
    let no = s.get("certificatesigningrequests", None, "no").unwrap();
    assert!(no["status"].get("certificate").is_none());
    c.put(&format!("{path}/odd/approval"), &cond("Approved"))
        .unwrap();
    let odd = s.get("certificatesigningrequests", None, "odd").unwrap();
    assert!(odd["status"].get("certificate").is_none());
    assert!(odd["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "Failed"));
}

// pkg/registry/authentication/tokenreview: a TokenReview is answered, not
// stored (201 with status); an empty token is a 400; an unknown token is
// authenticated: false with an error.
#[test]
fn token_reviews_are_answered_not_stored() {
    let s = plain();
    s.add_token("good", "alice", &["devs"]);
    let c = s.client();
    let path = "/apis/authentication.k8s.io/v1/tokenreviews";
    let review = |t: &str| json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": t}});
    let r = c.post(path, &review("good")).unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["status"]["authenticated"], true);
    assert_eq!(r.body["status"]["user"]["username"], "alice");
    assert_eq!(r.body["status"]["user"]["groups"], json!(["devs"]));
    let r = c.post(path, &review("bad")).unwrap();
    assert_eq!(r.status, 201);
    assert!(
        r.body["status"].get("authenticated").is_none()
            || r.body["status"]["authenticated"] == false
    );
    assert!(r.body["status"]["error"].as_str().is_some());
    assert_eq!(c.post(path, &review("")).unwrap().status, 400);
    assert_eq!(c.get(path).unwrap().status, 404, "not a stored resource");
}

// pkg/registry/authorization/subjectaccessreview and its validation: a
// SubjectAccessReview needs a user or groups and exactly one of
// resourceAttributes/nonResourceAttributes (422 otherwise); 201 with
// status.allowed.
#[test]
fn subject_access_reviews_follow_the_rules_and_validation() {
    let s = plain();
    s.allow("alice", "get", "nodes", "stats");
    let c = s.client();
    let path = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    let sar = |user: &str, sub: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "resourceAttributes": {"verb": "get", "resource": "nodes", "subresource": sub, "name": "n1", "version": "v1"}}})
    };
    let r = c.post(path, &sar("alice", "stats")).unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["status"]["allowed"], true);
    let r = c.post(path, &sar("alice", "proxy")).unwrap();
    assert_eq!(r.body["status"]["allowed"], false);
    let r = c.post(path, &sar("", "stats")).unwrap();
    assert_eq!(r.status, 422, "{:?}", r.body);
    let both =
        json!({"spec": {"user": "a", "resourceAttributes": {}, "nonResourceAttributes": {}}});
    assert_eq!(c.post(path, &both).unwrap().status, 422);
}

// --- Service accounts, tokens, volumes ---

fn sa(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": ns}})
}

fn token_path(ns: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token")
}

fn token_request(spec: Value) -> Value {
    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
}

/// The JWT payload of a token (base64url, no padding).
fn claims(token: &str) -> Value {
    use base64::Engine;
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "JWT shape: {token}");
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header: Value = serde_json::from_slice(&b64.decode(parts[0]).unwrap()).unwrap();
    assert_eq!(header["alg"], "RS256");
    assert!(!parts[2].is_empty());
    serde_json::from_slice(&b64.decode(parts[1]).unwrap()).unwrap()
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn ts(v: &Value) -> i64 {
    v.as_str()
        .unwrap()
        .parse::<k8s_openapi::jiff::Timestamp>()
        .unwrap()
        .as_second()
}

// pkg/registry/core/serviceaccount/storage/token.go (TokenREST.Create): a
// create on serviceaccounts/{name}/token answers 201 with the TokenRequest
// (metadata from the ServiceAccount, audiences defaulted to the API
// server's, expirationSeconds defaulted to 3600 by
// pkg/apis/authentication/v1 SetDefaults_TokenRequestSpec) and
// status.token/expirationTimestamp; nothing is stored; a missing
// ServiceAccount is the Get's 404. Claims as pkg/serviceaccount/claims.go.
#[test]
fn token_request_issues_a_token_for_an_existing_service_account() {
    let s = plain();
    let c = s.client();
    let created = s.create(sa("default", "builder"));
    let rv_before = s.resource_version();
    let t0 = unix_now();
    let r = c
        .post(&token_path("default", "builder"), &token_request(json!({})))
        .unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["kind"], "TokenRequest");
    assert_eq!(r.body["apiVersion"], "authentication.k8s.io/v1");
    assert_eq!(r.body["metadata"]["name"], "builder");
    assert_eq!(r.body["metadata"]["namespace"], "default");
    assert_eq!(r.body["spec"]["expirationSeconds"], 3600);
    assert_eq!(
        r.body["spec"]["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    let exp = ts(&r.body["status"]["expirationTimestamp"]);
    assert!((t0 + 3600..=unix_now() + 3600).contains(&exp), "{exp}");
    let cl = claims(r.body["status"]["token"].as_str().unwrap());
    assert_eq!(cl["sub"], "system:serviceaccount:default:builder");
    assert_eq!(
        cl["aud"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    assert!(cl["iss"].as_str().unwrap().starts_with("https://"));
    assert_eq!(cl["iat"], cl["nbf"]);
    assert_eq!(
        cl["exp"].as_i64().unwrap() - cl["iat"].as_i64().unwrap(),
        3600
    );
    assert_eq!(cl["kubernetes.io"]["namespace"], "default");
    assert_eq!(cl["kubernetes.io"]["serviceaccount"]["name"], "builder");
    assert_eq!(
        cl["kubernetes.io"]["serviceaccount"]["uid"],
        created["metadata"]["uid"]
    );
    assert!(cl["kubernetes.io"].get("pod").is_none());
    // Not stored: no write happened.
    assert_eq!(s.resource_version(), rv_before);
    // Audiences as asked.
    let r = c
        .post(
            &token_path("default", "builder"),
            &token_request(json!({"audiences": ["vault"], "expirationSeconds": 7200})),
        )
        .unwrap();
    assert_eq!(
        claims(r.body["status"]["token"].as_str().unwrap())["aud"],
        json!(["vault"])
    );
    assert_eq!(r.body["spec"]["expirationSeconds"], 7200);
    // Missing ServiceAccount: 404 NotFound.
    let r = c
        .post(&token_path("default", "nope"), &token_request(json!({})))
        .unwrap();
    assert_eq!(r.status, 404, "{:?}", r.body);
    assert_eq!(r.body["message"], "serviceaccounts \"nope\" not found");
    // Every request is recorded, failed ones too.
    let reqs = s.token_requests();
    assert_eq!(reqs.len(), 3);
    assert_eq!(
        (reqs[1].0.as_str(), reqs[1].1.as_str()),
        ("default", "builder")
    );
    assert_eq!(reqs[1].2["audiences"], json!(["vault"]));
    assert_eq!(reqs[2].1, "nope");
}

// pkg/apis/authentication/validation ValidateTokenRequest: expirationSeconds
// under 10 minutes (or over 2^32) is 422 Invalid, named "" (token.go calls
// errors.NewInvalid(gvk.GroupKind(), "", errs)); a body name or namespace
// other than the URL's is Invalid too (token.go).
#[test]
fn token_request_validation() {
    let s = plain();
    let c = s.client();
    s.create(sa("default", "builder"));
    let path = token_path("default", "builder");
    let r = c
        .post(&path, &token_request(json!({"expirationSeconds": 599})))
        .unwrap();
    assert_eq!(r.status, 422, "{:?}", r.body);
    assert_eq!(r.body["reason"], "Invalid");
    assert_eq!(
        r.body["message"],
        "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"
    );
    assert_eq!(
        r.body["details"]["causes"][0]["field"],
        "spec.expirationSeconds"
    );
    let r = c
        .post(&path, &token_request(json!({"expirationSeconds": 600})))
        .unwrap();
    assert_eq!(r.status, 201, "600 s is the minimum: {:?}", r.body);
    let r = c
        .post(
            &path,
            &token_request(json!({"expirationSeconds": (1i64 << 32) + 1})),
        )
        .unwrap();
    assert_eq!(r.status, 422);
    assert!(r.body["message"]
        .as_str()
        .unwrap()
        .ends_with("may not specify a duration larger than 2^32 seconds"));
    let mut other = token_request(json!({}));
    other["metadata"] = json!({"name": "someone-else"});
    let r = c.post(&path, &other).unwrap();
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["message"],
        "TokenRequest.authentication.k8s.io \"builder\" is invalid: metadata.name: Invalid value: \"someone-else\": must match the service account name if specified"
    );
}

// token.go boundObjectRef: Pod, Secret or Node (core group) must exist (the
// Get's 404); a pod must run as this ServiceAccount (400); a given uid must
// match (409 Conflict); other kinds are 400. claims.go: the pod (and its
// node, ServiceAccountTokenPodNodeInfo), secret or node go into the
// kubernetes.io claim.
#[test]
fn token_request_bound_objects() {
    let s = plain();
    let c = s.client();
    s.create(sa("default", "builder"));
    let node = s.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
    let mut p = pod("web", Some("n1"));
    p["spec"]["serviceAccountName"] = json!("builder");
    let p = s.create(p);
    let path = token_path("default", "builder");
    let bound = |kind: &str, name: &str, uid: Option<&Value>| {
        let mut r = json!({"apiVersion": "v1", "kind": kind, "name": name});
        if let Some(u) = uid {
            r["uid"] = u.clone();
        }
        token_request(json!({"boundObjectRef": r}))
    };
    let r = c
        .post(&path, &bound("Pod", "web", Some(&p["metadata"]["uid"])))
        .unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    let k = &claims(r.body["status"]["token"].as_str().unwrap())["kubernetes.io"];
    assert_eq!(
        k["pod"],
        json!({"name": "web", "uid": p["metadata"]["uid"]})
    );
    assert_eq!(
        k["node"],
        json!({"name": "n1", "uid": node["metadata"]["uid"]})
    );
    assert_eq!(r.body["spec"]["boundObjectRef"]["name"], "web");

    let r = c.post(&path, &bound("Pod", "gone", None)).unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.body["message"], "pods \"gone\" not found");
    let r = c
        .post(&path, &bound("Pod", "web", Some(&json!("not-the-uid"))))
        .unwrap();
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert_eq!(
        r.body["message"],
        "Operation cannot be fulfilled on Pod \"web\": the UID in the bound object reference (not-the-uid) does not match the UID in record. The object might have been deleted and then recreated"
    );
    s.create(pod("other-sa", None));
    let r = c.post(&path, &bound("Pod", "other-sa", None)).unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["message"],
        "cannot bind token for serviceaccount \"builder\" to pod running with different serviceaccount name."
    );
    let r = c.post(&path, &bound("ConfigMap", "x", None)).unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["message"],
        "cannot bind token to object of type /v1, Kind=ConfigMap"
    );
    let sec = s.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s1", "namespace": "default"}}));
    let r = c.post(&path, &bound("Secret", "s1", None)).unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    let k = &claims(r.body["status"]["token"].as_str().unwrap())["kubernetes.io"];
    assert_eq!(k["secret"]["uid"], sec["metadata"]["uid"]);
    let r = c.post(&path, &bound("Node", "n1", None)).unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    let k = &claims(r.body["status"]["token"].as_str().unwrap())["kubernetes.io"];
    assert_eq!(k["node"]["uid"], node["metadata"]["uid"]);
    assert!(k.get("pod").is_none());
}

// token.go: --service-account-max-token-expiration caps
// spec.expirationSeconds (and so status.expirationTimestamp and exp); and
// with --service-account-extend-token-expiration (default on) a pod-bound
// token asked for 3607 s (WarnOnlyBoundTokenExpirationSeconds) with the
// API server's audiences lives a year, with warnafter at 3607 s, while the
// status says 3607 s.
#[test]
fn token_expiration_cap_and_extension() {
    let s = plain();
    let c = s.client();
    s.create(sa("default", "default"));
    s.create(pod("web", Some("n1")));
    let mut p = s.get("pods", Some("default"), "web").unwrap();
    p["spec"]["serviceAccountName"] = json!("default");
    s.update(p);
    let path = token_path("default", "default");
    let pod_ref = json!({"apiVersion": "v1", "kind": "Pod", "name": "web"});

    let t0 = unix_now();
    let r = c
        .post(
            &path,
            &token_request(json!({"expirationSeconds": 3607, "boundObjectRef": pod_ref})),
        )
        .unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    let exp = ts(&r.body["status"]["expirationTimestamp"]);
    assert!((t0 + 3607..=unix_now() + 3607).contains(&exp));
    let cl = claims(r.body["status"]["token"].as_str().unwrap());
    let iat = cl["iat"].as_i64().unwrap();
    assert_eq!(cl["exp"].as_i64().unwrap() - iat, 24 * 365 * 3600);
    assert_eq!(
        cl["kubernetes.io"]["warnafter"].as_i64().unwrap() - iat,
        3607
    );

    s.set_max_token_expiration(Duration::from_secs(120));
    let t0 = unix_now();
    let r = c
        .post(
            &path,
            &token_request(json!({"expirationSeconds": 3607, "boundObjectRef": pod_ref})),
        )
        .unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["spec"]["expirationSeconds"], 120);
    let exp = ts(&r.body["status"]["expirationTimestamp"]);
    assert!((t0 + 120..=unix_now() + 120).contains(&exp));
    let cl = claims(r.body["status"]["token"].as_str().unwrap());
    assert_eq!(
        cl["exp"].as_i64().unwrap() - cl["iat"].as_i64().unwrap(),
        120
    );
    assert!(cl["kubernetes.io"].get("warnafter").is_none());
    // The cap applies after validation: asking under 600 s is still 422.
    let r = c
        .post(&path, &token_request(json!({"expirationSeconds": 60})))
        .unwrap();
    assert_eq!(r.status, 422, "validation comes before the cap");
}

// pkg/serviceaccount/claims.go validator + the TokenReview REST: an issued
// token authenticates as system:serviceaccount:<ns>:<name> in
// system:serviceaccounts, system:serviceaccounts:<ns> and
// system:authenticated, with the pod in extra; it stops authenticating
// when its bound pod is gone or the audiences do not meet.
#[test]
fn token_review_authenticates_issued_tokens() {
    let s = plain();
    let c = s.client();
    let account = s.create(sa("kube-system", "robot"));
    let mut p = pod("web", None);
    p["metadata"]["namespace"] = json!("kube-system");
    p["spec"]["serviceAccountName"] = json!("robot");
    let p = s.create(p);
    let r = c
        .post(
            &token_path("kube-system", "robot"),
            &token_request(
                json!({"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web"}}),
            ),
        )
        .unwrap();
    let token = r.body["status"]["token"].as_str().unwrap().to_string();
    let review = |token: &str, auds: Value| {
        c.post(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": auds}}),
        )
        .unwrap()
        .body
    };
    let r = review(&token, json!([]));
    assert_eq!(r["status"]["authenticated"], true, "{r}");
    let user = &r["status"]["user"];
    assert_eq!(user["username"], "system:serviceaccount:kube-system:robot");
    assert_eq!(user["uid"], account["metadata"]["uid"]);
    assert_eq!(
        user["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:kube-system",
            "system:authenticated"
        ])
    );
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["web"])
    );
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/pod-uid"],
        json!([p["metadata"]["uid"]])
    );
    assert_eq!(
        r["status"]["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    let r = review(&token, json!(["vault"]));
    assert_ne!(r["status"]["authenticated"], true);
    assert!(r["status"]["error"].as_str().unwrap().contains("audiences"));
    s.delete("pods", Some("kube-system"), "web", Some(0));
    let r = review(&token, json!([]));
    assert_ne!(r["status"]["authenticated"], true, "{r}");
    assert!(r["status"]["error"]
        .as_str()
        .unwrap()
        .contains("service account token has been invalidated"));
}

// pkg/registry/core/persistentvolume and persistentvolumeclaim strategies
// with pkg/apis/core/v1 defaults: PVs are cluster-scoped, PVCs namespaced,
// both with a status subresource; create resets status to phase Pending
// (PVs with lastPhaseTransitionTime), defaults reclaim policy Retain and
// volumeMode Filesystem; a PV status write that changes the phase without
// a new transition time gets one (PersistentVolumeLastPhaseTransitionTime).
#[test]
fn persistent_volumes_and_claims() {
    let s = plain();
    let c = s.client();
    let r = c
        .post(
            "/api/v1/persistentvolumes",
            &json!({"metadata": {"name": "pv1"},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "hostPath": {"path": "/tmp/pv1"}},
                "status": {"phase": "Bound"}}),
        )
        .unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    let pv = r.body;
    assert_eq!(pv["kind"], "PersistentVolume");
    assert!(pv["metadata"].get("namespace").is_none());
    assert_eq!(pv["status"]["phase"], "Pending");
    assert!(pv["status"]["lastPhaseTransitionTime"].is_string());
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    assert_eq!(pv["spec"]["volumeMode"], "Filesystem");
    // Main resource writes keep the status; /status writes only status.
    let mut upd = pv.clone();
    upd["status"]["phase"] = json!("Available");
    upd["metadata"]["labels"] = json!({"a": "b"});
    let r = c.put("/api/v1/persistentvolumes/pv1", &upd).unwrap().body;
    assert_eq!(r["status"]["phase"], "Pending");
    let mut st = r.clone();
    st["status"] = json!({"phase": "Available", "lastPhaseTransitionTime": "2020-01-01T00:00:00Z"});
    let r = c
        .put("/api/v1/persistentvolumes/pv1/status", &st)
        .unwrap()
        .body;
    assert_eq!(r["status"]["phase"], "Available");
    assert_eq!(
        r["status"]["lastPhaseTransitionTime"],
        "2020-01-01T00:00:00Z"
    );
    // Same phase, no time: the stored time stays.
    let mut st = r.clone();
    st["status"] = json!({"phase": "Available", "message": "m"});
    let r = c
        .put("/api/v1/persistentvolumes/pv1/status", &st)
        .unwrap()
        .body;
    assert_eq!(
        r["status"]["lastPhaseTransitionTime"],
        "2020-01-01T00:00:00Z"
    );
    // New phase, same time as stored: now.
    let mut st = r.clone();
    st["status"]["phase"] = json!("Bound");
    let r = c
        .put("/api/v1/persistentvolumes/pv1/status", &st)
        .unwrap()
        .body;
    assert!(ts(&r["status"]["lastPhaseTransitionTime"]) >= unix_now() - 5);

    let claims_path = "/api/v1/namespaces/default/persistentvolumeclaims";
    let r = c
        .post(
            claims_path,
            &json!({"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                "status": {"phase": "Bound"}}),
        )
        .unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["kind"], "PersistentVolumeClaim");
    assert_eq!(r.body["status"], json!({"phase": "Pending"}));
    assert_eq!(r.body["spec"]["volumeMode"], "Filesystem");
    let mut st = r.body.clone();
    st["status"] = json!({"phase": "Bound", "capacity": {"storage": "1Gi"}});
    st["spec"]["volumeName"] = json!("pv1");
    let r = c
        .put(&format!("{claims_path}/data/status"), &st)
        .unwrap()
        .body;
    assert_eq!(r["status"]["phase"], "Bound");
    assert!(
        r["spec"].get("volumeName").is_none(),
        "status writes keep spec"
    );
    assert_eq!(s.list("persistentvolumeclaims").len(), 1);
    let d = c.get("/api/v1").unwrap().body;
    let names: Vec<&str> = d["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for n in [
        "persistentvolumes",
        "persistentvolumes/status",
        "persistentvolumeclaims",
        "persistentvolumeclaims/status",
    ] {
        assert!(names.contains(&n), "{n} in {names:?}");
    }
}

// pkg/controller/certificates/rootcacertpublisher (syncNamespace): the
// ConfigMap kube-root-ca.crt holds the CA bundle under ca.crt with the
// kubernetes.io/description annotation; a changed one is put back; an
// unchanged one is not written again.
#[test]
fn root_ca_configmap_is_published() {
    let s = plain();
    let cm = s.publish_root_ca("default");
    assert_eq!(cm["metadata"]["name"], "kube-root-ca.crt");
    assert_eq!(cm["data"], json!({"ca.crt": s.ca_pem()}));
    assert!(cm["metadata"]["annotations"]["kubernetes.io/description"]
        .as_str()
        .unwrap()
        .starts_with("Contains a CA bundle"));
    let got = s
        .get("configmaps", Some("default"), "kube-root-ca.crt")
        .unwrap();
    assert_eq!(got["data"]["ca.crt"], s.ca_pem());
    let rv_now = s.resource_version();
    s.publish_root_ca("default");
    assert_eq!(s.resource_version(), rv_now, "no write when unchanged");
    let mut changed = got.clone();
    changed["data"]["ca.crt"] = json!("tampered");
    s.update(changed);
    let back = s.publish_root_ca("default");
    assert_eq!(back["data"]["ca.crt"], s.ca_pem());
    assert_eq!(
        s.publish_root_ca("kube-system")["metadata"]["namespace"],
        "kube-system"
    );
}

fn admission_server() -> ApiServer {
    ApiServer::start(ApiServerOptions {
        tls: false,
        service_account_admission: true,
        ..Default::default()
    })
}

// plugin/pkg/admission/serviceaccount/admission.go: off by default (the
// double runs no admission); on, a pod without serviceAccountName gets
// "default"; a missing ServiceAccount is 403 Forbidden ("error looking up
// service account ns/name: serviceaccount "name" not found"); otherwise
// the kube-api-access-<5 chars> projected volume (TokenVolumeSource:
// token 3607 s, kube-root-ca.crt's ca.crt, the namespace, mode 0644) and a
// read-only mount at /var/run/secrets/kubernetes.io/serviceaccount in
// every init container and container that has nothing mounted there; the
// ServiceAccount's imagePullSecrets when the pod has none.
#[test]
fn service_account_admission_mounts_the_token_volume() {
    let off = plain();
    let p = off.create(pod("a", None));
    assert!(p["spec"].get("serviceAccountName").is_none());
    assert!(p["spec"].get("volumes").is_none());

    let s = admission_server();
    let c = s.client();
    let r = c.post(PODS, &pod("a", None)).unwrap();
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert_eq!(r.body["reason"], "Forbidden");
    assert_eq!(
        r.body["message"],
        "pods \"a\" is forbidden: error looking up service account default/default: serviceaccount \"default\" not found"
    );
    let mut account = sa("default", "default");
    account["imagePullSecrets"] = json!([{"name": "regcred"}]);
    s.create(account);
    let mut p = pod("a", None);
    p["spec"]["initContainers"] = json!([{"name": "init", "image": "busybox"}]);
    p["spec"]["containers"] = json!([
        {"name": "c", "image": "busybox"},
        {"name": "own", "image": "busybox", "volumeMounts": [
            {"name": "mine", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]},
    ]);
    p["spec"]["volumes"] = json!([{"name": "mine", "emptyDir": {}}]);
    let r = c.post(PODS, &p).unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    let spec = &r.body["spec"];
    assert_eq!(spec["serviceAccountName"], "default");
    assert_eq!(spec["imagePullSecrets"], json!([{"name": "regcred"}]));
    let vols = spec["volumes"].as_array().unwrap();
    assert_eq!(vols.len(), 2);
    let name = vols[1]["name"].as_str().unwrap();
    let suffix = name.strip_prefix("kube-api-access-").expect(name);
    assert_eq!(suffix.len(), 5);
    assert!(suffix
        .chars()
        .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit()));
    assert_eq!(
        vols[1]["projected"],
        json!({"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]})
    );
    let mount = json!({"name": name, "readOnly": true,
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"});
    assert_eq!(spec["initContainers"][0]["volumeMounts"], json!([mount]));
    assert_eq!(spec["containers"][0]["volumeMounts"], json!([mount]));
    assert_eq!(
        spec["containers"][1]["volumeMounts"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "a container with its own mount at the path is left alone"
    );
}

// admission.go shouldAutomount (the pod's automountServiceAccountToken
// wins, then the ServiceAccount's, default true) and the mirror pod rules
// (not mutated; may not name a service account or reference secrets).
#[test]
fn service_account_admission_automount_and_mirror_pods() {
    let s = admission_server();
    let c = s.client();
    let mut quiet = sa("default", "quiet");
    quiet["automountServiceAccountToken"] = json!(false);
    s.create(quiet);
    s.create(sa("default", "default"));
    let mut p = pod("pod-off", None);
    p["spec"]["automountServiceAccountToken"] = json!(false);
    let r = c.post(PODS, &p).unwrap().body;
    assert_eq!(r["spec"]["serviceAccountName"], "default");
    assert!(r["spec"].get("volumes").is_none(), "{r}");
    let mut p = pod("sa-off", None);
    p["spec"]["serviceAccountName"] = json!("quiet");
    let r = c.post(PODS, &p).unwrap().body;
    assert!(r["spec"].get("volumes").is_none(), "{r}");
    let mut p = pod("pod-wins", None);
    p["spec"]["serviceAccountName"] = json!("quiet");
    p["spec"]["automountServiceAccountToken"] = json!(true);
    let r = c.post(PODS, &p).unwrap().body;
    assert_eq!(r["spec"]["volumes"].as_array().unwrap().len(), 1, "{r}");
    let mut p = pod("missing-sa", None);
    p["spec"]["serviceAccountName"] = json!("ghost");
    let r = c.post(PODS, &p).unwrap();
    assert_eq!(r.status, 403);
    assert!(r.body["message"].as_str().unwrap().ends_with(
        "error looking up service account default/ghost: serviceaccount \"ghost\" not found"
    ));

    let mirror = |name: &str| {
        let mut p = pod(name, Some("n1"));
        p["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "hash"});
        p
    };
    let r = c.post(PODS, &mirror("static-n1")).unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert!(r.body["spec"].get("serviceAccountName").is_none());
    assert!(r.body["spec"].get("volumes").is_none());
    let mut m = mirror("static-sa");
    m["spec"]["serviceAccountName"] = json!("default");
    let r = c.post(PODS, &m).unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(
        r.body["message"],
        "pods \"static-sa\" is forbidden: a mirror pod may not reference service accounts"
    );
    let mut m = mirror("static-secret");
    m["spec"]["volumes"] = json!([{"name": "s", "secret": {"secretName": "x"}}]);
    let r = c.post(PODS, &m).unwrap();
    assert_eq!(r.status, 403);
    assert!(r.body["message"]
        .as_str()
        .unwrap()
        .ends_with("a mirror pod may not reference secrets"));
}

// Single-object watches as the kubelet's ConfigMap/Secret managers use them
// (k8s.io/apiserver watch with fieldSelector metadata.name, via the watch
// cache's per-event filter): only that object, from its creation after the
// watch started, through updates, to its deletion; lists with the same
// selector.
#[test]
fn single_object_watches_on_configmaps_and_secrets() {
    let s = plain();
    let c = s.client();
    for (plural, kind) in [("configmaps", "ConfigMap"), ("secrets", "Secret")] {
        let base = format!("/api/v1/namespaces/default/{plural}");
        let obj = |name: &str, v: &str| {
            json!({"apiVersion": "v1", "kind": kind,
                "metadata": {"name": name, "namespace": "default"}, "data": {"k": v}})
        };
        let mut w = c
            .watch(&format!(
                "{base}?watch=true&fieldSelector=metadata.name%3Dx&resourceVersion={}",
                s.resource_version()
            ))
            .unwrap();
        s.create(obj("y", "eXk="));
        let x = s.create(obj("x", "MQ=="));
        let e = w.next_event().unwrap().unwrap();
        assert_eq!(
            (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
            (Some("ADDED"), Some("x")),
            "{plural}"
        );
        let mut y = s.get(plural, Some("default"), "y").unwrap();
        y["data"]["k"] = json!("eXl5");
        s.update(y);
        let mut x2 = x.clone();
        x2["data"]["k"] = json!("Mg==");
        s.update(x2);
        let e = w.next_event().unwrap().unwrap();
        assert_eq!(e["type"], "MODIFIED", "{plural}: {e}");
        assert_eq!(e["object"]["metadata"]["name"], "x");
        assert_eq!(e["object"]["data"]["k"], "Mg==");
        s.delete(plural, Some("default"), "y", None);
        s.delete(plural, Some("default"), "x", None);
        let e = w.next_event().unwrap().unwrap();
        assert_eq!(e["type"], "DELETED", "{plural}: {e}");
        assert_eq!(e["object"]["metadata"]["name"], "x");
        // Recreated: seen again.
        s.create(obj("x", "Mw=="));
        assert_eq!(w.next_event().unwrap().unwrap()["type"], "ADDED");
        // Lists with the same selector; resourceVersion=0 watches start
        // with it.
        s.create(obj("z", "eg=="));
        let l = c
            .get(&format!("{base}?fieldSelector=metadata.name%3Dx"))
            .unwrap()
            .body;
        assert_eq!(l["items"].as_array().unwrap().len(), 1, "{l}");
        assert_eq!(l["items"][0]["metadata"]["name"], "x");
        let mut w0 = c
            .watch(&format!(
                "{base}?watch=true&fieldSelector=metadata.name%3Dx&resourceVersion=0"
            ))
            .unwrap();
        let e = w0.next_event().unwrap().unwrap();
        assert_eq!(e["object"]["metadata"]["name"], "x");
    }
}

// Field selectors are checked against the kind's field labels before
// listing or watching (handlers ListResource: FieldSelector.Transform with
// Scheme.ConvertFieldLabel, error as 400 BadRequest): Secret, Pod, Node...
// have conversion funcs in pkg/apis/core/v1/conversion.go ("field label
// not supported: X"); ConfigMap has none, so
// runtime.DefaultMetaV1FieldSelectorConversion answers ("\"X\" is not a
// known field selector: only \"metadata.name\", \"metadata.namespace\"").
// Pods' legacy spec.host means spec.nodeName.
#[test]
fn unsupported_field_labels_are_bad_requests() {
    let s = plain();
    let c = s.client();
    let r = c
        .get("/api/v1/namespaces/default/configmaps?fieldSelector=data.k%3Dv")
        .unwrap();
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["reason"], "BadRequest");
    assert_eq!(
        r.body["message"],
        "\"data.k\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
    );
    let r = c
        .get("/api/v1/namespaces/default/secrets?watch=true&fieldSelector=data.k%3Dv")
        .unwrap();
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["message"], "field label not supported: data.k");
    s.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "t", "namespace": "default"}, "type": "kubernetes.io/tls"}));
    let r = c
        .get("/api/v1/secrets?fieldSelector=type%3Dkubernetes.io%2Ftls")
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["items"].as_array().unwrap().len(), 1);
    let r = c.get("/api/v1/pods?fieldSelector=spec.foo%3Dx").unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.body["message"], "field label not supported: spec.foo");
    let r = c
        .get("/api/v1/nodes?fieldSelector=metadata.namespace%3Dx")
        .unwrap();
    assert_eq!(r.status, 400, "nodes have no metadata.namespace label");
    s.create(pod("a", Some("n1")));
    s.create(pod("b", Some("n2")));
    let r = c.get("/api/v1/pods?fieldSelector=spec.host%3Dn1").unwrap();
    assert_eq!(r.status, 200);
    let items = r.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["metadata"]["name"], "a");
}

// ---- ClusterTrustBundles (certificates.k8s.io/v1beta1) ----

const CTBS: &str = "/apis/certificates.k8s.io/v1beta1/clustertrustbundles";

fn ctb(name: &str, signer: &str, labels: Value, bundle: &str) -> Value {
    json!({"apiVersion": "certificates.k8s.io/v1beta1", "kind": "ClusterTrustBundle",
        "metadata": {"name": name, "labels": labels},
        "spec": {"signerName": signer, "trustBundle": bundle}})
}

// Discovery as a 1.34 server with the beta API on: the group lists v1 and
// v1beta1 (v1 preferred), and /apis/certificates.k8s.io/v1beta1 names the
// cluster-scoped clustertrustbundles the kubelet looks for
// (clusterTrustBundlesAvailable). v1alpha1 is served as with the
// PodCertificateRequest gate and runtime-config on, for
// podcertificaterequests only (a real server would also list its v1alpha1
// clustertrustbundles; the kubelet asks for v1beta1 first).
#[test]
fn cluster_trust_bundles_are_discovered_at_v1beta1() {
    let s = plain();
    let c = s.client();
    let groups = c.get("/apis").unwrap().body;
    let certs = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "certificates.k8s.io")
        .unwrap()
        .clone();
    assert_eq!(certs["preferredVersion"]["version"], "v1");
    let versions: Vec<&str> = certs["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_str().unwrap())
        .collect();
    assert_eq!(versions, ["v1", "v1beta1", "v1alpha1"]);
    let list = c.get("/apis/certificates.k8s.io/v1beta1").unwrap().body;
    let r = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "clustertrustbundles")
        .expect("clustertrustbundles served");
    assert_eq!(r["namespaced"], false);
    assert_eq!(r["kind"], "ClusterTrustBundle");
    let alpha = c.get("/apis/certificates.k8s.io/v1alpha1").unwrap().body;
    let r = alpha["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "podcertificaterequests")
        .expect("podcertificaterequests served");
    assert_eq!(r["namespaced"], true);
}

// pkg/apis/certificates/validation ValidateClusterTrustBundle(Update): a
// signer's bundle is named with the signer as prefix ('/' as ':'), an
// unsigned one has no ':'; the bundle holds CA certificates, at least one,
// none twice; signerName is immutable.
#[test]
fn cluster_trust_bundles_are_validated_as_upstream_does() {
    let s = plain();
    let c = s.client();
    let ca = common::apiserver::trustbundle::ca_certificate_pem("a");
    let cases = [
        (
            ctb("wrong", "example.com/s", json!({}), &ca),
            "metadata.name: Invalid value: \"wrong\": ClusterTrustBundle for signerName example.com/s must be named with prefix example.com:s:",
        ),
        (
            ctb("a:b", "", json!({}), &ca),
            "ClusterTrustBundle without signer name must not have \":\" in its name",
        ),
        (
            ctb("empty", "", json!({}), ""),
            "spec.trustBundle: Invalid value: \"<value omitted>\": at least one trust anchor must be provided",
        ),
        (
            ctb("twice", "", json!({}), &format!("{ca}{ca}")),
            "duplicate trust anchor (indices [0 1])",
        ),
    ];
    for (obj, want) in cases {
        let r = c.post(CTBS, &obj).unwrap();
        assert_eq!(r.status, 422, "{:?}", r.body);
        assert_eq!(r.body["reason"], "Invalid");
        let msg = r.body["message"].as_str().unwrap();
        assert!(msg.contains(want), "{msg}");
    }
    let r = c
        .post(
            CTBS,
            &ctb("example.com:s:one", "example.com/s", json!({}), &ca),
        )
        .unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert!(
        r.body["metadata"].get("namespace").is_none(),
        "cluster-scoped"
    );
    let mut moved = r.body.clone();
    moved["spec"]["signerName"] = json!("example.com/t");
    let r = c.put(&format!("{CTBS}/example.com:s:one"), &moved).unwrap();
    assert_eq!(r.status, 422, "{:?}", r.body);
    assert!(r.body["message"]
        .as_str()
        .unwrap()
        .contains("spec.signerName: Invalid value: \"example.com/t\": field is immutable"));
}

// The registry's selectable fields for ClusterTrustBundles are
// metadata.name and spec.signerName (getAttrs; the v1beta1 field label
// conversion refuses others: "field label not supported"); label
// selectors filter lists and watches as for every kind. A watch from the
// list's resourceVersion sees the update of a bundle.
#[test]
fn cluster_trust_bundles_list_and_watch_by_signer_and_labels() {
    let s = plain();
    let c = s.client();
    let (a, b) = (
        common::apiserver::trustbundle::ca_certificate_pem("a"),
        common::apiserver::trustbundle::ca_certificate_pem("b"),
    );
    for o in [
        ctb(
            "example.com:s:x",
            "example.com/s",
            json!({"env": "prod"}),
            &a,
        ),
        ctb(
            "example.com:s:y",
            "example.com/s",
            json!({"env": "dev"}),
            &b,
        ),
        ctb(
            "example.com:t:x",
            "example.com/t",
            json!({"env": "prod"}),
            &a,
        ),
        ctb("plain", "", json!({}), &b),
    ] {
        assert_eq!(c.post(CTBS, &o).unwrap().status, 201);
    }
    let names = |path: &str| -> Vec<String> {
        let r = c.get(path).unwrap();
        assert_eq!(r.status, 200, "{path}: {:?}", r.body);
        r.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(CTBS).len(), 4);
    assert_eq!(
        names(&format!(
            "{CTBS}?fieldSelector=spec.signerName%3Dexample.com%2Fs"
        )),
        ["example.com:s:x", "example.com:s:y"]
    );
    assert_eq!(
        names(&format!(
            "{CTBS}?fieldSelector=spec.signerName%3Dexample.com%2Fs&labelSelector=env%3Dprod"
        )),
        ["example.com:s:x"]
    );
    let r = c
        .get(&format!("{CTBS}?fieldSelector=spec.trustBundle%3Dx"))
        .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["message"],
        "field label not supported: spec.trustBundle"
    );
    let g = c.get(&format!("{CTBS}/plain")).unwrap();
    assert_eq!(
        (g.status, g.body["spec"]["trustBundle"].as_str()),
        (200, Some(b.as_str()))
    );
    assert_eq!(
        c.get(&format!("{CTBS}/nope")).unwrap().body["message"],
        "clustertrustbundles.certificates.k8s.io \"nope\" not found"
    );
    let list_rv = c.get(CTBS).unwrap().body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut w = c
        .watch(&format!("{CTBS}?watch=true&resourceVersion={list_rv}"))
        .unwrap();
    let mut obj = s
        .get("clustertrustbundles", None, "example.com:s:y")
        .unwrap();
    obj["spec"]["trustBundle"] = json!(format!("{b}{a}"));
    s.update(obj);
    let e = w.next_non_bookmark().unwrap().unwrap();
    assert_eq!(e["type"], "MODIFIED");
    assert_eq!(e["object"]["metadata"]["name"], "example.com:s:y");
}

// pkg/registry/storage/csidriver and csinode: CSIDriver and CSINode are
// cluster-scoped storage.k8s.io/v1 resources without a status
// subresource; a missing one is NotFound with the group-qualified
// resource in the message (what the kubelet's CSI plugin tells apart from
// other errors); an update with a stale resourceVersion conflicts (the
// kubelet's nodeinfomanager retries on it).
#[test]
fn csidrivers_and_csinodes_are_cluster_scoped_storage_objects() {
    const CSIDRIVERS: &str = "/apis/storage.k8s.io/v1/csidrivers";
    let s = plain();
    let c = s.client();
    let d = json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": "fake.csi.example.com"},
        "spec": {"podInfoOnMount": true, "volumeLifecycleModes": ["Ephemeral"]}
    });
    let r = c.post(CSIDRIVERS, &d).unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    let g = c
        .get(&format!("{CSIDRIVERS}/fake.csi.example.com"))
        .unwrap();
    assert_eq!(g.status, 200);
    assert_eq!(g.body["spec"]["podInfoOnMount"], true);
    assert!(g.body["metadata"].get("namespace").is_none());
    assert_eq!(g.body["spec"]["volumeLifecycleModes"], json!(["Ephemeral"]));
    let missing = c.get(&format!("{CSIDRIVERS}/nope")).unwrap();
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.body["message"],
        "csidrivers.storage.k8s.io \"nope\" not found"
    );
    // Discovery lists the group version.
    let v = c.get("/apis/storage.k8s.io/v1").unwrap();
    assert_eq!(v.status, 200);
    assert!(v.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "csidrivers" && r["namespaced"] == false));
    const CSINODES: &str = "/apis/storage.k8s.io/v1/csinodes";
    let n = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": "node-1"},
        "spec": {"drivers": [{"name": "d", "nodeID": "n1", "topologyKeys": ["zone"]}]}
    });
    let r = c.post(CSINODES, &n).unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    let mut stale = r.body.clone();
    let mut upd = r.body.clone();
    upd["spec"]["drivers"] = json!([]);
    assert_eq!(
        c.put(&format!("{CSINODES}/node-1"), &upd).unwrap().status,
        200
    );
    stale["spec"]["drivers"][0]["nodeID"] = json!("n2");
    let r = c.put(&format!("{CSINODES}/node-1"), &stale).unwrap();
    assert_eq!(r.status, 409);
    assert_eq!(r.body["reason"], "Conflict");
    let g = c.get(&format!("{CSINODES}/node-1")).unwrap();
    assert_eq!(g.body["spec"]["drivers"], json!([]));
}

// pkg/apis/storage/v1/defaults.go SetDefaults_CSIDriver: a CSIDriver
// written without them gets attachRequired true, podInfoOnMount,
// storageCapacity, requiresRepublish and seLinuxMount false, fsGroupPolicy
// ReadWriteOnceWithFSType and volumeLifecycleModes [Persistent]; set
// fields are kept, on create and on update (defaulting runs on every
// decoded write).
#[test]
fn csidrivers_are_defaulted_as_the_api_server_does() {
    const CSIDRIVERS: &str = "/apis/storage.k8s.io/v1/csidrivers";
    let s = plain();
    let c = s.client();
    let r = c
        .post(
            CSIDRIVERS,
            &json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                "metadata": {"name": "d.example.com"}, "spec": {}}),
        )
        .unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(
        r.body["spec"],
        json!({"attachRequired": true, "podInfoOnMount": false, "storageCapacity": false,
            "fsGroupPolicy": "ReadWriteOnceWithFSType", "requiresRepublish": false,
            "seLinuxMount": false, "volumeLifecycleModes": ["Persistent"]})
    );
    let mut upd = r.body.clone();
    upd["spec"] = json!({"fsGroupPolicy": "File", "requiresRepublish": true});
    let r = c.put(&format!("{CSIDRIVERS}/d.example.com"), &upd).unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["spec"]["fsGroupPolicy"], "File");
    assert_eq!(r.body["spec"]["requiresRepublish"], true);
    assert_eq!(r.body["spec"]["attachRequired"], true);
    assert_eq!(
        r.body["spec"]["volumeLifecycleModes"],
        json!(["Persistent"])
    );
}

// PodCertificateRequests (certificates.k8s.io/v1alpha1 in 1.34):
// pkg/registry/certificates/podcertificaterequest strategy PrepareForCreate
// clears the status (a requester cannot issue itself a certificate) and
// the status subresource is the signer's; pkg/apis/certificates/validation
// ValidatePodCertificateRequestCreate verifies proofOfPossession against
// pkixPublicKey over the pod UID's bytes (Ed25519: the bytes; ECDSA: their
// SHA-256 digest, P-384 keys included: hashBytes is sha256.Sum256), else
// 422 "could not verify proof-of-possession signature".
#[test]
fn pod_certificate_requests_clear_status_and_verify_the_proof_of_possession() {
    use base64::Engine;
    use ring::signature::{
        EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING,
        ECDSA_P384_SHA384_ASN1_SIGNING,
    };
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let rng = ring::rand::SystemRandom::new();
    let ed =
        Ed25519KeyPair::from_pkcs8(Ed25519KeyPair::generate_pkcs8(&rng).unwrap().as_ref()).unwrap();
    let mut ed_spki = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    ed_spki.extend_from_slice(ed.public_key().as_ref());
    let uid = "11111111-2222-4333-8444-555555555555";
    let pcr = |spki: &[u8], proof: &[u8]| {
        json!({"apiVersion": "certificates.k8s.io/v1alpha1", "kind": "PodCertificateRequest",
            "metadata": {"generateName": "req-", "namespace": "default"},
            "spec": {"signerName": "example.com/s", "podName": "p", "podUID": uid,
                "serviceAccountName": "default", "serviceAccountUID": "sa",
                "nodeName": "n1", "nodeUID": "nu",
                "pkixPublicKey": b64(spki), "proofOfPossession": b64(proof)},
            "status": {"certificateChain": "forged"}})
    };
    const PCRS: &str =
        "/apis/certificates.k8s.io/v1alpha1/namespaces/default/podcertificaterequests";
    let s = plain();
    let c = s.client();
    let r = c
        .post(PCRS, &pcr(&ed_spki, ed.sign(uid.as_bytes()).as_ref()))
        .unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    let name = r.body["metadata"]["name"].as_str().unwrap().to_string();
    assert!(name.starts_with("req-"));
    assert_eq!(r.body["status"], json!({}), "status cleared at create");
    // A proof over another UID does not verify.
    let r = c
        .post(PCRS, &pcr(&ed_spki, ed.sign(b"other").as_ref()))
        .unwrap();
    assert_eq!(r.status, 422, "{:?}", r.body);
    assert!(r.body["message"]
        .as_str()
        .unwrap()
        .contains("could not verify proof-of-possession signature"));
    // ECDSA P-256: the signature of the SHA-256 digest of the UID.
    let p256 = EcdsaKeyPair::from_pkcs8(
        &ECDSA_P256_SHA256_ASN1_SIGNING,
        EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .unwrap()
            .as_ref(),
        &rng,
    )
    .unwrap();
    let mut p_spki = vec![
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08,
        0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ];
    p_spki.extend_from_slice(p256.public_key().as_ref());
    let good = p256.sign(&rng, uid.as_bytes()).unwrap();
    assert_eq!(
        c.post(PCRS, &pcr(&p_spki, good.as_ref())).unwrap().status,
        201
    );
    let bad = p256.sign(&rng, b"other").unwrap();
    assert_eq!(
        c.post(PCRS, &pcr(&p_spki, bad.as_ref())).unwrap().status,
        422
    );
    // ECDSA P-384: also over the SHA-256 digest (signed here with the
    // p384 crate over that prehash); ring's SHA-384 signature of the same
    // UID does not verify.
    let p384_key = loop {
        let mut d = [0u8; 48];
        ring::rand::SecureRandom::fill(&rng, &mut d).unwrap();
        if let Ok(k) = p384::ecdsa::SigningKey::from_slice(&d) {
            break k;
        }
    };
    let mut q_spki = vec![
        0x30, 0x76, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05,
        0x2b, 0x81, 0x04, 0x00, 0x22, 0x03, 0x62, 0x00,
    ];
    q_spki.extend_from_slice(p384_key.verifying_key().to_encoded_point(false).as_bytes());
    let p384_proof = |msg: &[u8]| {
        use p384::ecdsa::signature::hazmat::PrehashSigner;
        let digest = ring::digest::digest(&ring::digest::SHA256, msg);
        let sig: p384::ecdsa::Signature = p384_key.sign_prehash(digest.as_ref()).unwrap();
        // ASN.1 SEQUENCE of two minimal INTEGERs (at most 98 bytes: a
        // short length).
        let (r, s) = sig.split_bytes();
        let mut body = Vec::new();
        for v in [&r[..], &s[..]] {
            let v = &v[v.iter().position(|b| *b != 0).unwrap_or(47)..];
            let pad = usize::from(v[0] >= 0x80);
            body.extend_from_slice(&[0x02, (v.len() + pad) as u8]);
            body.extend(std::iter::repeat_n(0u8, pad));
            body.extend_from_slice(v);
        }
        let mut der = vec![0x30, body.len() as u8];
        der.extend(body);
        der
    };
    assert_eq!(
        c.post(PCRS, &pcr(&q_spki, &p384_proof(uid.as_bytes())))
            .unwrap()
            .status,
        201
    );
    assert_eq!(
        c.post(PCRS, &pcr(&q_spki, &p384_proof(b"other")))
            .unwrap()
            .status,
        422
    );
    let sha384 = EcdsaKeyPair::from_pkcs8(
        &ECDSA_P384_SHA384_ASN1_SIGNING,
        EcdsaKeyPair::generate_pkcs8(&ECDSA_P384_SHA384_ASN1_SIGNING, &rng)
            .unwrap()
            .as_ref(),
        &rng,
    )
    .unwrap();
    let mut r_spki = q_spki[..23].to_vec();
    r_spki.extend_from_slice(sha384.public_key().as_ref());
    let wrong_hash = sha384.sign(&rng, uid.as_bytes()).unwrap();
    assert_eq!(
        c.post(PCRS, &pcr(&r_spki, wrong_hash.as_ref()))
            .unwrap()
            .status,
        422
    );
    // The signer writes status through /status; a write to the main
    // resource keeps it.
    let mut got = s
        .get("podcertificaterequests", Some("default"), &name)
        .unwrap();
    got["status"] = json!({"certificateChain": "CHAIN", "conditions": [{"type": "Issued",
        "status": "True", "reason": "Issued", "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    let after = s.update_status(got.clone());
    assert_eq!(after["status"]["certificateChain"], "CHAIN");
    let mut main = after.clone();
    main["status"] = json!({});
    main["metadata"]["labels"] = json!({"x": "y"});
    let after = s.update(main);
    assert_eq!(after["status"]["certificateChain"], "CHAIN");
}

// ValidatePodCertificateRequestCreate (pkg/apis/certificates/validation)
// for the kubelet's RSA3072, RSA4096 and ECDSAP521 keys
// (pkg/kubelet/podcertificate generateKeyAndProof): an RSA key needs a
// 3072- or 4096-bit modulus (else 422 "RSA keys must have modulus size
// 3072 or 4096"), and its proof is checked with rsa.VerifyPSS(pub, SHA256,
// sha256(podUID), proof, nil), whose nil options find the salt length: the
// kubelet's SignPSS(nil) proof (the longest salt) and a digest-sized salt
// both verify; a PKCS#1 v1.5 signature, or a proof over another pod's UID,
// is 422 "could not verify proof-of-possession signature". A P-521 key's
// proof is ecdsa.VerifyASN1 over the SHA-256 digest, as for the other
// curves. A key type ParsePKIXPublicKey reads but the validation does not
// take (X25519) is "unknown public key type".
#[test]
fn pod_certificate_requests_verify_rsa_pss_and_p521_proofs() {
    use base64::Engine;
    use rkubelet::objects::podcert::generate_key_and_proof;
    use rsa::pkcs8::EncodePublicKey;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let uid = "11111111-2222-4333-8444-555555555555";
    let pcr = |pod_uid: &str, spki: &[u8], proof: &[u8]| {
        json!({"apiVersion": "certificates.k8s.io/v1alpha1", "kind": "PodCertificateRequest",
            "metadata": {"generateName": "req-", "namespace": "default"},
            "spec": {"signerName": "example.com/s", "podName": "p", "podUID": pod_uid,
                "serviceAccountName": "default", "serviceAccountUID": "sa",
                "nodeName": "n1", "nodeUID": "nu",
                "pkixPublicKey": b64(spki), "proofOfPossession": b64(proof)}})
    };
    const PCRS: &str =
        "/apis/certificates.k8s.io/v1alpha1/namespaces/default/podcertificaterequests";
    const BAD_PROOF: &str = "could not verify proof-of-possession signature";
    let s = plain();
    let c = s.client();
    let post = |body: Value| {
        let r = c.post(PCRS, &body).unwrap();
        let msg = r.body["message"].as_str().unwrap_or("").to_string();
        (r.status, msg)
    };
    let refused = |body: Value| {
        let (status, msg) = post(body);
        assert_eq!(status, 422, "{msg}");
        assert!(msg.contains(BAD_PROOF), "{msg}");
    };
    let rng = ring::rand::SystemRandom::new();
    for key_type in ["RSA3072", "RSA4096"] {
        let k = generate_key_and_proof(key_type, uid).unwrap();
        assert_eq!(
            post(pcr(uid, &k.pkix_public_key, &k.proof_of_possession)).0,
            201,
            "{key_type}: the kubelet's max-salt proof"
        );
        refused(pcr(
            "another-uid",
            &k.pkix_public_key,
            &k.proof_of_possession,
        ));
        // The same key signing with ring: PSS with a digest-sized salt
        // verifies too; PKCS#1 v1.5 does not.
        let text = String::from_utf8(k.private_key_pem.clone()).unwrap();
        let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
        let pkcs8 = base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap();
        let kp = ring::signature::RsaKeyPair::from_pkcs8(&pkcs8).unwrap();
        let mut sig = vec![0u8; kp.public().modulus_len()];
        kp.sign(
            &ring::signature::RSA_PSS_SHA256,
            &rng,
            uid.as_bytes(),
            &mut sig,
        )
        .unwrap();
        assert_eq!(
            post(pcr(uid, &k.pkix_public_key, &sig)).0,
            201,
            "{key_type}"
        );
        kp.sign(
            &ring::signature::RSA_PKCS1_SHA256,
            &rng,
            uid.as_bytes(),
            &mut sig,
        )
        .unwrap();
        refused(pcr(uid, &k.pkix_public_key, &sig));
    }
    // A 2048-bit modulus is refused before any proof is looked at.
    let n = (rsa::BigUint::from(1u8) << 2047usize) + rsa::BigUint::from(1u8);
    let small = rsa::RsaPublicKey::new(n, 65537u32.into())
        .unwrap()
        .to_public_key_der()
        .unwrap();
    let (status, msg) = post(pcr(uid, small.as_bytes(), &[0u8; 256]));
    assert_eq!(status, 422, "{msg}");
    assert!(
        msg.contains("spec.pkixPublicKey: Invalid value: \"2048-bit modulus\": RSA keys must have modulus size 3072 or 4096"),
        "{msg}"
    );
    // P-521.
    let k = generate_key_and_proof("ECDSAP521", uid).unwrap();
    assert_eq!(
        post(pcr(uid, &k.pkix_public_key, &k.proof_of_possession)).0,
        201
    );
    refused(pcr(
        "another-uid",
        &k.pkix_public_key,
        &k.proof_of_possession,
    ));
    let mut trailing = k.proof_of_possession.clone();
    trailing.push(0);
    refused(pcr(uid, &k.pkix_public_key, &trailing));
    // X25519: parsed by Go, taken by no branch.
    let mut x25519 = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x03, 0x21, 0x00,
    ];
    x25519.extend([9u8; 32]);
    let (status, msg) = post(pcr(uid, &x25519, b"x"));
    assert_eq!(status, 422, "{msg}");
    assert!(
        msg.contains("unknown public key type; supported types are Ed25519, ECDSA, and RSA"),
        "{msg}"
    );
}

// A kubelet watches the PodCertificateRequests of its node
// (pkg/kubelet/kubelet.go: an informer with fieldSelector
// spec.nodeName=<node>, all namespaces). The field labels are those of
// pkg/apis/certificates/v1alpha1 conversion.go (metadata.name,
// spec.signerName, spec.podName, spec.nodeName; anything else, even
// metadata.namespace, is 400 "field label not supported"); the watch
// follows the generic rules (from a resourceVersion, bookmarks, only the
// objects the selector matches).
#[test]
fn pod_certificate_requests_list_and_watch_by_node_name() {
    use base64::Engine;
    use ring::signature::{Ed25519KeyPair, KeyPair};
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let rng = ring::rand::SystemRandom::new();
    let ed =
        Ed25519KeyPair::from_pkcs8(Ed25519KeyPair::generate_pkcs8(&rng).unwrap().as_ref()).unwrap();
    let mut spki = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    spki.extend_from_slice(ed.public_key().as_ref());
    let uid = "11111111-2222-4333-8444-555555555555";
    let pcr = |node: &str, ns: &str| {
        json!({"apiVersion": "certificates.k8s.io/v1alpha1", "kind": "PodCertificateRequest",
            "metadata": {"generateName": "req-", "namespace": ns},
            "spec": {"signerName": "example.com/s", "podName": "p", "podUID": uid,
                "serviceAccountName": "default", "serviceAccountUID": "sa",
                "nodeName": node, "nodeUID": "nu",
                "pkixPublicKey": b64(&spki),
                "proofOfPossession": b64(ed.sign(uid.as_bytes()).as_ref())}})
    };
    const ALL: &str = "/apis/certificates.k8s.io/v1alpha1/podcertificaterequests";
    let s = plain();
    let c = s.client();
    let mut w = c
        .watch(&format!(
            "{ALL}?watch=true&allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dn1&resourceVersion={}",
            s.resource_version()
        ))
        .unwrap();
    let other = s.create(pcr("n2", "default"));
    let mine = s.create(pcr("n1", "team"));
    let e = w.next_non_bookmark().unwrap().unwrap();
    assert_eq!(e["type"], "ADDED");
    assert_eq!(e["object"]["metadata"]["name"], mine["metadata"]["name"]);
    // The signer's status writes: only n1's request is seen.
    let issued = |mut r: Value| {
        r["status"] = json!({"certificateChain": "CHAIN", "conditions": [{"type": "Issued",
            "status": "True", "reason": "Issued", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        r
    };
    s.update_status(issued(other.clone()));
    s.update_status(issued(mine.clone()));
    let e = w.next_non_bookmark().unwrap().unwrap();
    assert_eq!(e["type"], "MODIFIED", "{e}");
    assert_eq!(e["object"]["metadata"]["name"], mine["metadata"]["name"]);
    assert_eq!(e["object"]["status"]["certificateChain"], "CHAIN");
    // Bookmarks carry the kind and a resourceVersion.
    let b = loop {
        let e = w.next_event().unwrap().unwrap();
        if e["type"] == "BOOKMARK" {
            break e;
        }
    };
    assert_eq!(b["object"]["kind"], "PodCertificateRequest");
    assert!(b["object"]["metadata"]["resourceVersion"].is_string());
    s.delete(
        "podcertificaterequests",
        Some("team"),
        mine["metadata"]["name"].as_str().unwrap(),
        None,
    );
    assert_eq!(w.next_non_bookmark().unwrap().unwrap()["type"], "DELETED");
    // Lists with the same selector, across namespaces.
    let l = c
        .get(&format!("{ALL}?fieldSelector=spec.nodeName%3Dn2"))
        .unwrap()
        .body;
    assert_eq!(l["items"].as_array().unwrap().len(), 1, "{l}");
    assert_eq!(l["items"][0]["metadata"]["name"], other["metadata"]["name"]);
    for label in ["spec.podUID", "metadata.namespace"] {
        let r = c.get(&format!("{ALL}?fieldSelector={label}%3Dx")).unwrap();
        assert_eq!(r.status, 400, "{label}: {:?}", r.body);
        assert_eq!(
            r.body["message"],
            format!("field label not supported: {label}")
        );
    }
}

// pkg/registry/storage/volumeattachment/strategy.go: VolumeAttachments
// are cluster-scoped storage.k8s.io/v1 objects with a status subresource;
// PrepareForCreate clears the status (only the external-attacher sets it,
// through /status); the main resource's PrepareForUpdate keeps the stored
// status; the status strategy keeps the stored spec and resets metadata
// (ResetObjectMetaForStatus: labels and annotations written through
// /status are dropped). A missing one is NotFound with the
// group-qualified resource (the kubelet's WaitForAttach error quotes it).
#[test]
fn volumeattachments_clear_status_at_create_and_take_it_through_status_only() {
    const VAS: &str = "/apis/storage.k8s.io/v1/volumeattachments";
    let s = plain();
    let c = s.client();
    let va = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": "csi-abc"},
        "spec": {"attacher": "d.csi", "nodeName": "n1",
            "source": {"persistentVolumeName": "pv-1"}},
        "status": {"attached": true, "attachmentMetadata": {"forged": "yes"}}
    });
    let r = c.post(VAS, &va).unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert!(r.body.get("status").is_none(), "{}", r.body);
    assert!(r.body["metadata"].get("namespace").is_none());
    // The attacher's write through /status: status taken, spec and
    // metadata kept.
    let mut w = r.body.clone();
    w["status"] = json!({"attached": true, "attachmentMetadata": {"devicePath": "/dev/xvdf"}});
    w["spec"]["nodeName"] = json!("other");
    w["metadata"]["labels"] = json!({"x": "y"});
    let r = c.put(&format!("{VAS}/csi-abc/status"), &w).unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["status"]["attached"], true);
    assert_eq!(
        r.body["status"]["attachmentMetadata"]["devicePath"],
        "/dev/xvdf"
    );
    assert_eq!(r.body["spec"]["nodeName"], "n1");
    assert!(r.body["metadata"].get("labels").is_none(), "{}", r.body);
    // A write to the main resource keeps the status.
    let mut m = r.body.clone();
    m["status"] = json!({"attached": false});
    m["metadata"]["labels"] = json!({"a": "b"});
    let r = c.put(&format!("{VAS}/csi-abc"), &m).unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["status"]["attached"], true);
    assert_eq!(r.body["metadata"]["labels"]["a"], "b");
    let missing = c.get(&format!("{VAS}/nope")).unwrap();
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.body["message"],
        "volumeattachments.storage.k8s.io \"nope\" not found"
    );
}

// pkg/registry/core/pod/strategy.go podEphemeralContainersStrategy: a
// write to pods/{name}/ephemeralcontainers (kubectl debug's strategic-merge
// patch; ValidatePodCreate refuses them on create) keeps the stored pod but
// for spec.ephemeralContainers
// (dropNonEphemeralContainerUpdates); ValidatePodEphemeralContainersUpdate
// refuses removing or changing one, validateEphemeralContainers a name
// already used, a target that is no container and fields an ephemeral
// container may not set; static pods take none. Each refusal is a 422.
#[test]
fn ephemeral_containers_are_added_through_their_subresource() {
    let s = plain();
    let c = s.client();
    let mut p = pod("dbg", Some("n1"));
    p["spec"]["initContainers"] = json!([{"name": "setup", "image": "busybox"}]);
    // ValidatePodCreate: not on create.
    let mut early = p.clone();
    early["spec"]["ephemeralContainers"] = json!([{"name": "d0", "image": "busybox"}]);
    let r = c.post(PODS, &early).unwrap();
    assert_eq!(r.status, 422, "{:#}", r.body);
    assert_eq!(
        r.body["message"],
        "Pod \"dbg\" is invalid: spec.ephemeralContainers: Forbidden: cannot be set on create"
    );
    assert_eq!(c.post(PODS, &p).unwrap().status, 201);
    let path = format!("{PODS}/dbg/ephemeralcontainers");
    let smp = "application/strategic-merge-patch+json";
    let debugger = |name: &str, target: &str| json!({"name": name, "image": "busybox", "targetContainerName": target});
    // Only the ephemeral containers are taken: the image change is dropped.
    let r = c
        .patch(
            &path,
            smp,
            &json!({"spec": {"containers": [{"name": "c", "image": "nginx"}],
                "ephemeralContainers": [debugger("d1", "c")]}}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert_eq!(r.body["spec"]["containers"][0]["image"], "busybox");
    assert_eq!(r.body["spec"]["ephemeralContainers"][0]["name"], "d1");
    assert_eq!(r.body["metadata"]["generation"], 2, "a new spec generation");
    let g = c.get(&path).unwrap();
    assert_eq!(g.status, 200);
    assert_eq!(
        g.body["spec"]["ephemeralContainers"][0]["targetContainerName"],
        "c"
    );

    let refused = |body: Value| {
        let mut full = c.get(&path).unwrap().body;
        full["spec"]["ephemeralContainers"] = body;
        let r = c.put(&path, &full).unwrap();
        assert_eq!(r.status, 422, "{:#}", r.body);
        assert_eq!(r.body["reason"], "Invalid");
        r.body["message"].as_str().unwrap().to_string()
    };
    assert_eq!(
        refused(json!([])),
        "Pod \"dbg\" is invalid: spec.ephemeralContainers: Forbidden: existing ephemeral containers \"d1\" may not be removed\n"
    );
    let mut changed = debugger("d1", "c");
    changed["image"] = json!("nginx");
    assert!(refused(json!([changed])).contains(
        "spec.ephemeralContainers.d1: Forbidden: existing ephemeral containers \"d1\" may not be changed"
    ));
    assert_eq!(
        refused(json!([debugger("d1", "c"), debugger("setup", "nope")])),
        "Pod \"dbg\" is invalid: [spec.ephemeralContainers[1].name: Duplicate value: \"setup\", spec.ephemeralContainers[1].targetContainerName: Not found: \"nope\"]"
    );
    let ported = json!({"name": "d2", "image": "busybox", "ports": [{"containerPort": 80}]});
    assert!(refused(json!([debugger("d1", "c"), ported])).ends_with(
        "spec.ephemeralContainers[1].ports: Forbidden: cannot be set for an Ephemeral Container"
    ));
    // Resources are forbidden only when set: the zero value (which kubectl
    // always sends, as `{}`) passes validateFieldAllowList.
    let limited = json!({"name": "d2", "image": "busybox", "resources": {"limits": {"cpu": "1"}}});
    assert!(refused(json!([debugger("d1", "c"), limited])).ends_with(
        "spec.ephemeralContainers[1].resources: Forbidden: cannot be set for an Ephemeral Container"
    ));
    // A second one is added beside the first.
    let mut second = debugger("d2", "");
    second["resources"] = json!({});
    let r = c
        .patch(
            &path,
            smp,
            &json!({"spec": {"ephemeralContainers": [second]}}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert_eq!(
        r.body["spec"]["ephemeralContainers"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // A mirror pod (a static pod's) takes none.
    let mut m = pod("mirror", Some("n1"));
    m["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "hash"});
    assert_eq!(c.post(PODS, &m).unwrap().status, 201);
    let r = c
        .patch(
            &format!("{PODS}/mirror/ephemeralcontainers"),
            smp,
            &json!({"spec": {"ephemeralContainers": [debugger("d1", "c")]}}),
        )
        .unwrap();
    assert_eq!(r.status, 422, "{:#}", r.body);
    assert_eq!(
        r.body["message"],
        "Pod \"mirror\" is invalid: : Forbidden: static pods do not support ephemeral containers"
    );
}

// pods/{name}/resize, as v1.34's podResizeStrategy (only container and init
// container resources and resizePolicy are taken, a new generation) and
// ValidatePodResize; a plain pod write may not change resources
// (ValidatePodUpdate).
#[test]
fn container_resources_change_through_the_resize_subresource() {
    let s = plain();
    let c = s.client();
    let smp = "application/strategic-merge-patch+json";
    let res = |cpu: &str, mem: &str| json!({"requests": {"cpu": cpu, "memory": mem}, "limits": {"cpu": cpu, "memory": mem}});
    let mut p = pod("rs", Some("n1"));
    p["spec"]["containers"][0]["resources"] = res("500m", "128Mi");
    p["spec"]["containers"][0]["resizePolicy"] =
        json!([{"resourceName": "memory", "restartPolicy": "NotRequired"}]);
    p["spec"]["initContainers"] = json!([
        {"name": "setup", "image": "busybox", "resources": res("100m", "16Mi")},
        {"name": "side", "image": "busybox", "restartPolicy": "Always", "resources": res("100m", "16Mi")},
    ]);
    assert_eq!(c.post(PODS, &p).unwrap().status, 201);
    // PrepareForCreate sets the class; the double does not, so set it.
    let mut st = s.get("pods", Some("default"), "rs").unwrap();
    st["status"]["qosClass"] = json!("Guaranteed");
    s.update_status(st);
    let path = format!("{PODS}/rs/resize");
    let msg = |r: common::apiserver::Response| {
        assert_eq!(r.status, 422, "{:#}", r.body);
        assert_eq!(r.body["reason"], "Invalid");
        r.body["message"].as_str().unwrap().to_string()
    };
    let resize = |patch: Value| {
        c.patch(&path, smp, &json!({"spec": {"containers": [patch]}}))
            .unwrap()
    };

    // ResizeREST.Get: the pod.
    assert_eq!(c.get(&path).unwrap().body["metadata"]["name"], "rs");

    // ValidatePodUpdate: a plain write may not change resources or the
    // resize policy (not among updatablePodSpecFields).
    let forbidden = "Pod \"rs\" is invalid: spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`";
    let r = c
        .patch(
            &format!("{PODS}/rs"),
            smp,
            &json!({"spec": {"containers": [{"name": "c", "resources": res("1", "128Mi")}]}}),
        )
        .unwrap();
    assert!(msg(r).starts_with(forbidden));
    let mut whole = c.get(&format!("{PODS}/rs")).unwrap().body;
    whole["spec"]["containers"][0]["resizePolicy"] = json!([]);
    assert!(msg(c.put(&format!("{PODS}/rs"), &whole).unwrap()).starts_with(forbidden));
    // A limit's default request (SetDefaults_Pod) and "0.5" for "500m" are
    // no change.
    whole = c.get(&format!("{PODS}/rs")).unwrap().body;
    whole["spec"]["containers"][0]["resources"] =
        json!({"limits": {"cpu": "0.5", "memory": "128Mi"}});
    whole["spec"]["containers"][0]["image"] = json!("nginx");
    assert_eq!(c.put(&format!("{PODS}/rs"), &whole).unwrap().status, 200);

    // dropNonResizeUpdates: resources taken, the image and labels not;
    // updatePodGeneration: a new generation.
    let before = c.get(&path).unwrap().body;
    let r = c
        .patch(
            &path,
            smp,
            &json!({"metadata": {"labels": {"x": "y"}},
                "spec": {"containers": [{"name": "c", "image": "busybox", "resources": res("1", "256Mi")}]}}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:#}", r.body);
    assert_eq!(
        r.body["spec"]["containers"][0]["resources"],
        res("1", "256Mi")
    );
    assert_eq!(r.body["spec"]["containers"][0]["image"], "nginx");
    assert!(r.body["metadata"]["labels"].get("x").is_none());
    assert_eq!(
        r.body["metadata"]["generation"],
        before["metadata"]["generation"].as_i64().unwrap() + 1
    );
    // The same values again, as other strings: not a write.
    let again = resize(json!({"name": "c", "resources": res("1000m", "256Mi")}));
    assert_eq!(
        again.body["metadata"]["resourceVersion"],
        r.body["metadata"]["resourceVersion"]
    );
    // JSON patch and JSON merge patch too. v1.34 lets a memory limit go
    // down with NotRequired (#133012; the kubelet checks usage).
    let r = c
        .patch(
            &path,
            "application/json-patch+json",
            &json!([{"op": "replace", "path": "/spec/containers/0/resources", "value": res("1", "200Mi")}]),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:#}", r.body);
    let mut merged = c.get(&path).unwrap().body["spec"]["containers"].clone();
    merged[0]["resources"] = res("2", "200Mi");
    let r = c
        .patch(
            &path,
            "application/merge-patch+json",
            &json!({"spec": {"containers": merged}}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:#}", r.body);
    // A restartable init container (a sidecar) resizes too.
    let r = c
        .patch(&path, smp, &json!({"spec": {"initContainers": [{"name": "side", "resources": res("200m", "32Mi")}]}}))
        .unwrap();
    assert_eq!(r.status, 200, "{:#}", r.body);

    // The QOS class may not change (Guaranteed to Burstable here).
    let r = resize(
        json!({"name": "c", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "200Mi"}}}),
    );
    assert_eq!(
        msg(r),
        "Pod \"rs\" is invalid: spec: Invalid value: \"Guaranteed\": Pod QOS Class may not change as a result of resizing"
    );
    // validateResourceRequirements on the resized pod.
    let mut over = res("2", "200Mi");
    over["requests"]["cpu"] = json!("3");
    assert_eq!(
        msg(resize(json!({"name": "c", "resources": over}))),
        "Pod \"rs\" is invalid: [spec.containers[0].resources.requests: Invalid value: \"3\": must be less than or equal to cpu limit of 2, spec: Invalid value: \"Guaranteed\": Pod QOS Class may not change as a result of resizing]"
    );
    // Only cpu and memory change.
    let mut disk = res("2", "200Mi");
    disk["requests"]["ephemeral-storage"] = json!("1Gi");
    disk["limits"]["ephemeral-storage"] = json!("1Gi");
    assert_eq!(
        msg(resize(json!({"name": "c", "resources": disk}))),
        "Pod \"rs\" is invalid: spec: Forbidden: only cpu and memory resources are mutable"
    );
    // The resize policy is taken but immutable since v1.33 (#130183).
    assert_eq!(
        msg(resize(
            json!({"name": "c", "resizePolicy": [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]})
        )),
        "Pod \"rs\" is invalid: spec: Forbidden: only cpu and memory resources are mutable"
    );
    // validateContainerResize: limits may not be removed.
    assert_eq!(
        msg(c.patch(&path, "application/json-patch+json", &json!([{"op": "remove", "path": "/spec/containers/0/resources/limits"}])).unwrap()),
        "Pod \"rs\" is invalid: [spec: Invalid value: \"Guaranteed\": Pod QOS Class may not change as a result of resizing, spec.containers[0].resources.limits: Forbidden: resource limits cannot be removed]"
    );
    // Init containers: a sidecar's other resources and a plain init
    // container's resources stay.
    let init = |name: &str, r: Value| {
        c.patch(
            &path,
            smp,
            &json!({"spec": {"initContainers": [{"name": name, "resources": r}]}}),
        )
        .unwrap()
    };
    let mut side_disk = res("200m", "32Mi");
    side_disk["limits"]["ephemeral-storage"] = json!("1Gi");
    side_disk["requests"]["ephemeral-storage"] = json!("1Gi");
    assert_eq!(
        msg(init("side", side_disk)),
        "Pod \"rs\" is invalid: spec: Forbidden: only cpu and memory resources for sidecar containers are mutable"
    );
    assert_eq!(
        msg(init("setup", res("200m", "16Mi"))),
        "Pod \"rs\" is invalid: spec: Forbidden: resources for non-sidecar init containers are immutable"
    );
    // validatePodResizeContainerOrdering: none added, removed or renamed.
    let mut renamed = c.get(&path).unwrap().body["spec"]["containers"].clone();
    renamed[0]["name"] = json!("d");
    assert_eq!(
        msg(c.patch(&path, "application/merge-patch+json", &json!({"spec": {"containers": renamed}})).unwrap()),
        "Pod \"rs\" is invalid: spec.containers[0].name: Forbidden: containers may not be renamed or reordered on resize"
    );
    assert_eq!(
        msg(c.patch(&path, "application/merge-patch+json", &json!({"spec": {"initContainers": []}})).unwrap()),
        "Pod \"rs\" is invalid: spec.initContainers: Forbidden: initContainers may not be added or removed on resize"
    );

    // Pods that cannot be resized at all.
    let refused = |name: &str, tweak: &dyn Fn(&mut Value)| {
        let mut p = pod(name, Some("n1"));
        p["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m"}});
        tweak(&mut p);
        assert_eq!(c.post(PODS, &p).unwrap().status, 201);
        let r = c
            .patch(
                &format!("{PODS}/{name}/resize"),
                smp,
                &json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "200m"}}}]}}),
            )
            .unwrap();
        msg(r)
    };
    assert_eq!(
        refused("mirror", &|p| p["metadata"]["annotations"] =
            json!({"kubernetes.io/config.mirror": "h"})),
        "Pod \"mirror\" is invalid: : Forbidden: static pods cannot be resized"
    );
    assert_eq!(
        refused("win", &|p| p["spec"]["os"] = json!({"name": "windows"})),
        "Pod \"win\" is invalid: : Forbidden: windows pods cannot be resized"
    );
    assert_eq!(
        refused("podlevel", &|p| p["spec"]["resources"] =
            json!({"limits": {"cpu": "1"}})),
        "Pod \"podlevel\" is invalid: : Forbidden: pods with pod-level resources cannot be resized"
    );
    // isPodResizeRequestSupported: a running container whose status has no
    // resources is on a kubelet without in-place resize.
    let mut p = pod("old-node", Some("n1"));
    p["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m"}});
    assert_eq!(c.post(PODS, &p).unwrap().status, 201);
    let mut st = s.get("pods", Some("default"), "old-node").unwrap();
    st["status"]["containerStatuses"] = json!([{"name": "c", "state": {"running": {}}}]);
    s.update_status(st);
    let r = c
        .patch(
            &format!("{PODS}/old-node/resize"),
            smp,
            &json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "200m"}}}]}}),
        )
        .unwrap();
    assert_eq!(
        msg(r),
        "Pod \"old-node\" is invalid: spec: Forbidden: Pod running on node without support for resize"
    );
    // validateContainerResize: requests may not be removed either.
    let mut st = s.get("pods", Some("default"), "old-node").unwrap();
    st["status"]["containerStatuses"][0]["resources"] = json!({"requests": {"cpu": "100m"}});
    s.update_status(st);
    let r = c
        .patch(
            &format!("{PODS}/old-node/resize"),
            "application/json-patch+json",
            &json!([{"op": "replace", "path": "/spec/containers/0/resources", "value": {"requests": {"memory": "1Gi"}}}]),
        )
        .unwrap();
    assert_eq!(
        msg(r),
        "Pod \"old-node\" is invalid: spec.containers[0].resources.requests: Forbidden: resource requests cannot be removed"
    );
}
