//! The two-way strategic merge patch from the Node the kubelet fetched to
//! the one it computed (upstream `PatchNodeStatus`: a diff, so only what
//! changed travels and fields others own are left alone).
//!
//! Hand-written, and only for `NodeStatus`: no maintained Rust crate
//! computes strategic-merge diffs, and the kubelet needs the rules of a
//! handful of fields only. From the NodeStatus schema (`patchStrategy` /
//! `patchMergeKey`, k8s-openapi's `DeepMerge`): `conditions` merge by
//! `type`; `addresses` are declared the same way, but upstream replaces them
//! whole when they change (the key is not unique: two InternalIPs on a
//! dual-stack node); `capacity`, `allocatable`, `nodeInfo`,
//! `daemonEndpoints` merge as maps; every other list (`images`,
//! `volumesInUse`, `volumesAttached`, `runtimeHandlers`) is atomic.

use k8s_openapi::api::core::v1::NodeStatus;
use serde_json::{json, Map, Value};

/// Lists of NodeStatus merged by a key; every other list is replaced.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" | "addresses" => Some("type"),
        _ => None,
    }
}

/// The patch taking `old` to `new`: `{"status": {...}}`, or `{}` when they
/// are the same.
pub fn status_patch(old: &NodeStatus, new: &NodeStatus) -> Value {
    let as_map = |s: &NodeStatus| match prune(serde_json::to_value(s).unwrap_or(Value::Null)) {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    let (mut old, mut new) = (as_map(old), as_map(new));
    // Upstream's fixup for addresses: when set before and changed, the
    // whole new list with a `$patch: replace` marker.
    let replaced = match (old.get("addresses"), new.get("addresses")) {
        (Some(o), n) if Some(o) != n => {
            let mut list = n.and_then(Value::as_array).cloned().unwrap_or_default();
            list.push(json!({"$patch": "replace"}));
            old.remove("addresses");
            new.remove("addresses");
            Some(list)
        }
        _ => None,
    };
    let mut status = diff_map(&old, &new);
    if let Some(list) = replaced {
        status.insert("addresses".into(), Value::Array(list));
    }
    if status.is_empty() {
        json!({})
    } else {
        json!({ "status": status })
    }
}

/// Go's `omitempty`: nulls and empty lists are absent, so `[]` against a
/// missing field is no change.
fn prune(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
                .map(|(k, v)| (k, prune(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(prune).collect()),
        other => other,
    }
}

fn diff_map(old: &Map<String, Value>, new: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, nv) in new {
        let Some(ov) = old.get(k) else {
            out.insert(k.clone(), nv.clone());
            continue;
        };
        if ov == nv {
            continue;
        }
        match (ov, nv, merge_key(k)) {
            (Value::Object(o), Value::Object(n), _) => {
                let d = diff_map(o, n);
                if !d.is_empty() {
                    out.insert(k.clone(), Value::Object(d));
                }
            }
            (Value::Array(o), Value::Array(n), Some(key)) => {
                let (list, order) = diff_keyed_list(o, n, key);
                if !list.is_empty() {
                    out.insert(k.clone(), Value::Array(list));
                }
                if let Some(order) = order {
                    out.insert(format!("$setElementOrder/{k}"), Value::Array(order));
                }
            }
            _ => {
                out.insert(k.clone(), nv.clone());
            }
        }
    }
    for k in old.keys() {
        if !new.contains_key(k) {
            out.insert(k.clone(), Value::Null);
        }
    }
    out
}

/// The changed and added elements (changed ones carry only what changed
/// plus the key), then deletions; and the new order when anything changed
/// or the order did (as upstream's `diffLists` with `SetElementOrder`).
fn diff_keyed_list(old: &[Value], new: &[Value], key: &str) -> (Vec<Value>, Option<Vec<Value>>) {
    let k = |v: &Value| v.get(key).cloned().unwrap_or(Value::Null);
    let mut list = Vec::new();
    for n in new {
        match old.iter().find(|o| k(o) == k(n)) {
            None => list.push(n.clone()),
            Some(o) if o == n => {}
            Some(o) => {
                let (Value::Object(om), Value::Object(nm)) = (o, n) else {
                    list.push(n.clone());
                    continue;
                };
                let mut d = diff_map(om, nm);
                d.insert(key.into(), k(n));
                list.push(Value::Object(d));
            }
        }
    }
    for o in old {
        if !new.iter().any(|n| k(n) == k(o)) {
            list.push(json!({ key: k(o), "$patch": "delete" }));
        }
    }
    let same_order = old.len() == new.len() && old.iter().zip(new).all(|(o, n)| k(o) == k(n));
    let order = (!list.is_empty() || !same_order)
        .then(|| new.iter().map(|n| json!({ key: k(n) })).collect());
    (list, order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerImage, NodeAddress, NodeCondition};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    fn cond(kind: &str, status: &str, beat: i64, moved: i64) -> NodeCondition {
        NodeCondition {
            type_: kind.into(),
            status: status.into(),
            reason: Some(format!("{kind}{status}")),
            message: Some("m".into()),
            last_heartbeat_time: Some(at(beat)),
            last_transition_time: Some(at(moved)),
        }
    }

    fn status(conds: Vec<NodeCondition>) -> NodeStatus {
        NodeStatus {
            conditions: Some(conds),
            capacity: Some([("cpu".to_string(), Quantity("2".into()))].into()),
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: "10.0.0.5".into(),
            }]),
            images: Some(vec![ContainerImage {
                names: Some(vec!["busybox".into()]),
                size_bytes: Some(1),
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn nothing_changed_is_an_empty_patch() {
        let s = status(vec![cond("Ready", "True", 1, 1)]);
        assert_eq!(status_patch(&s, &s), json!({}));
        // An empty list against a missing one is no change (omitempty).
        let mut none = s.clone();
        none.images = None;
        let mut empty = s.clone();
        empty.images = Some(vec![]);
        assert_eq!(status_patch(&none, &empty), json!({}));
    }

    #[test]
    fn conditions_merge_by_type_with_only_what_changed() {
        let net = cond("NetworkUnavailable", "False", 5, 5);
        let old = status(vec![
            cond("MemoryPressure", "False", 10, 1),
            net.clone(),
            cond("Ready", "True", 10, 1),
        ]);
        let mut new = old.clone();
        let cs = new.conditions.as_mut().unwrap();
        cs[0].last_heartbeat_time = Some(at(20));
        cs[2] = cond("Ready", "False", 20, 20);
        let p = status_patch(&old, &new);
        assert_eq!(
            p,
            json!({"status": {
                "conditions": [
                    {"type": "MemoryPressure", "lastHeartbeatTime": "1970-01-01T00:00:20Z"},
                    {"type": "Ready", "status": "False", "reason": "ReadyFalse",
                     "lastHeartbeatTime": "1970-01-01T00:00:20Z",
                     "lastTransitionTime": "1970-01-01T00:00:20Z"},
                ],
                "$setElementOrder/conditions": [
                    {"type": "MemoryPressure"}, {"type": "NetworkUnavailable"}, {"type": "Ready"}
                ],
            }})
        );
        // The condition someone else owns is not in the patch at all, and
        // neither are the unchanged fields.
        let text = p.to_string();
        assert!(!text.contains("NetworkUnavailable\","), "{text}");
        for f in ["capacity", "addresses", "images"] {
            assert!(p["status"].get(f).is_none(), "{f} unchanged: {p}");
        }
    }

    #[test]
    fn a_removed_condition_is_deleted_by_key_and_maps_diff_per_key() {
        let old = status(vec![cond("A", "True", 1, 1), cond("B", "True", 1, 1)]);
        let mut new = status(vec![cond("B", "True", 1, 1)]);
        new.capacity = Some(
            [
                ("cpu".to_string(), Quantity("2".into())),
                ("pods".to_string(), Quantity("110".into())),
            ]
            .into(),
        );
        new.images = Some(vec![ContainerImage {
            names: Some(vec!["nginx".into()]),
            size_bytes: Some(2),
        }]);
        let p = status_patch(&old, &new);
        assert_eq!(
            p["status"]["conditions"],
            json!([{"type": "A", "$patch": "delete"}])
        );
        assert_eq!(
            p["status"]["$setElementOrder/conditions"],
            json!([{"type": "B"}])
        );
        assert_eq!(p["status"]["capacity"], json!({"pods": "110"}));
        // Images are atomic: the whole new list.
        assert_eq!(
            p["status"]["images"],
            json!([{"names": ["nginx"], "sizeBytes": 2}])
        );
    }

    #[test]
    fn changed_addresses_replace_the_list() {
        let old = status(vec![]);
        let mut new = old.clone();
        new.addresses = Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: "10.0.0.6".into(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: "n1".into(),
            },
        ]);
        let p = status_patch(&old, &new);
        assert_eq!(
            p["status"]["addresses"],
            json!([
                {"type": "InternalIP", "address": "10.0.0.6"},
                {"type": "Hostname", "address": "n1"},
                {"$patch": "replace"}
            ])
        );
        assert!(p["status"].get("$setElementOrder/addresses").is_none());
        // Not set before: a plain keyed merge.
        let mut bare = old.clone();
        bare.addresses = None;
        let p = status_patch(&bare, &new);
        assert_eq!(p["status"]["addresses"].as_array().unwrap().len(), 2);
    }
}
