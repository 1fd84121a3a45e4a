//! The `pods/{name}/resize` subresource, as upstream's podResizeStrategy
//! (pkg/registry/core/pod/strategy.go) and ValidatePodResize
//! (pkg/apis/core/validation/validation.go) in v1.34: a write keeps the
//! stored pod and takes only each container's and init container's
//! `resources` and `resizePolicy` (dropNonResizeUpdates; the whole body when
//! containers were added, removed, renamed or reordered, for validation to
//! refuse), a changed spec bumping the generation (updatePodGeneration);
//! then each refusal is a 422 Invalid with upstream's field errors. Also the
//! part of ValidatePodUpdate that keeps a plain pod write from changing
//! container resources ([`check_pod_update`]).
//!
//! The double stores pods as written (no defaulting at create), so both the
//! stored pod and the write are compared after SetDefaults_Pod's requests
//! from limits, as upstream holds them. Quantities compare by value.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::store::ApiError;

/// A quantity by value, in nano-units; one that does not parse compares as
/// written.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Quantity {
    Nanos(i128),
    Raw(String),
}

impl Quantity {
    fn parse(v: &Value) -> Quantity {
        let s = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        nanos(&s).map_or(Quantity::Raw(s), Quantity::Nanos)
    }

    fn compare(&self, other: &Quantity) -> Option<Ordering> {
        match (self, other) {
            (Quantity::Nanos(a), Quantity::Nanos(b)) => Some(a.cmp(b)),
            _ => None,
        }
    }
}

/// resource.Quantity's value ("500m", "1.5Gi", "2e3") in nano-units,
/// rounded up below that.
fn nanos(s: &str) -> Option<i128> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-')))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(end);
    let (neg, num) = match num.strip_prefix('-') {
        Some(n) => (true, n),
        None => (false, num.strip_prefix('+').unwrap_or(num)),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let digits = format!("{int}{frac}");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (mul, exp10): (i128, i32) = match suffix {
        "" => (1, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        e if e.starts_with(['e', 'E']) => (1, e[1..].parse().ok()?),
        _ => return None,
    };
    let mut v = digits.parse::<i128>().ok()?.checked_mul(mul)?;
    let exp = exp10 + 9 - frac.len() as i32;
    if exp >= 0 {
        v = v.checked_mul(10i128.checked_pow(exp as u32)?)?;
    } else {
        let d = 10i128.checked_pow(exp.unsigned_abs())?;
        v = (v + d - 1) / d;
    }
    Some(if neg { -v } else { v })
}

/// A ResourceList as Go decodes it: None when absent or null (a nil map),
/// Some (maybe empty) otherwise.
type List = Option<BTreeMap<String, Quantity>>;

fn list(v: Option<&Value>) -> List {
    let m = v?.as_object()?;
    Some(
        m.iter()
            .map(|(k, q)| (k.clone(), Quantity::parse(q)))
            .collect(),
    )
}

/// Semantic equality: a nil list and an empty one are equal.
fn same_list(a: &List, b: &List) -> bool {
    a.as_ref().filter(|m| !m.is_empty()) == b.as_ref().filter(|m| !m.is_empty())
}

/// A container's ResourceRequirements.
#[derive(Debug, Clone)]
struct Resources {
    limits: List,
    requests: List,
    claims: Vec<Value>,
}

impl Resources {
    /// As decoded and defaulted (SetDefaults_Pod: a limit without a
    /// request is also the request).
    fn of(c: &Value) -> Resources {
        let r = &c["resources"];
        let limits = list(r.get("limits"));
        let mut requests = list(r.get("requests"));
        if let Some(l) = &limits {
            let req = requests.get_or_insert_with(BTreeMap::new);
            for (k, q) in l {
                req.entry(k.clone()).or_insert_with(|| q.clone());
            }
        }
        let claims = r["claims"].as_array().cloned().unwrap_or_default();
        Resources {
            limits,
            requests,
            claims,
        }
    }

    fn same(&self, o: &Resources) -> bool {
        same_list(&self.limits, &o.limits)
            && same_list(&self.requests, &o.requests)
            && self.claims == o.claims
    }
}

fn policies(c: &Value) -> Vec<Value> {
    c["resizePolicy"].as_array().cloned().unwrap_or_default()
}

fn containers<'a>(p: &'a Value, key: &str) -> &'a [Value] {
    p["spec"][key].as_array().map_or(&[], Vec::as_slice)
}

fn name_of(c: &Value) -> &str {
    c["name"].as_str().unwrap_or_default()
}

/// A restartable init container (a sidecar): restartPolicy Always.
fn sidecar(c: &Value) -> bool {
    c["restartPolicy"] == "Always"
}

/// Whether `c` differs from `old` in anything but cpu and memory
/// (dropCPUMemoryResourcesFromContainer, then a semantic DeepEqual; the
/// strategy took nothing else than resources and the resize policy). The
/// masked resources keep only limits and requests, and a list the old
/// container did not have is dropped whole, as upstream v1.34 does.
fn changed_beyond_cpu_memory(c: &Value, old: &Value) -> bool {
    let mask = |new: &List, old: &List| -> List {
        let old = old.as_ref()?;
        let mut m = new.clone().unwrap_or_default();
        for k in ["cpu", "memory"] {
            m.remove(k);
            if let Some(q) = old.get(k) {
                m.insert(k.into(), q.clone());
            }
        }
        Some(m)
    };
    let (n, o) = (Resources::of(c), Resources::of(old));
    let masked = Resources {
        limits: mask(&n.limits, &o.limits),
        requests: mask(&n.requests, &o.requests),
        claims: Vec::new(),
    };
    !masked.same(&o) || policies(c) != policies(old)
}

fn empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// qos.ComputePodQOS (pkg/apis/core/v1/helper/qos): from the pod-level
/// resources when `spec.resources` is set (PodLevelResources, on in 1.34),
/// else from the containers and init containers.
pub fn compute_qos(p: &Value) -> &'static str {
    let mut requests: BTreeMap<String, i128> = BTreeMap::new();
    let mut limits: BTreeMap<String, i128> = BTreeMap::new();
    let mut guaranteed = true;
    let pod_level = p["spec"]["resources"].is_object();
    let all = containers(p, "containers")
        .iter()
        .chain(containers(p, "initContainers"))
        .filter(|_| !pod_level);
    // Sums the positive cpu and memory quantities; returns how many of the
    // two were there.
    let add = |sum: &mut BTreeMap<String, i128>, l: &List| {
        let mut found = 0;
        for (k, q) in l.iter().flatten() {
            if let ("cpu" | "memory", Quantity::Nanos(n @ 1..)) = (k.as_str(), q) {
                *sum.entry(k.clone()).or_default() += n;
                found += 1;
            }
        }
        found
    };
    for c in all {
        let r = Resources::of(c);
        add(&mut requests, &r.requests);
        if add(&mut limits, &r.limits) < 2 {
            guaranteed = false;
        }
    }
    if pod_level {
        let r = &p["spec"]["resources"];
        add(&mut requests, &list(r.get("requests")));
        let l = list(r.get("limits"));
        if l.as_ref().is_some_and(|l| !l.is_empty()) && add(&mut limits, &l) < 2 {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    let matching = requests.iter().all(|(k, v)| limits.get(k) == Some(v));
    if guaranteed && matching && requests.len() == limits.len() {
        return "Guaranteed";
    }
    "Burstable"
}

/// defaultPodRequests (pkg/apis/core/v1/defaults.go): with pod-level
/// limits, each unset pod-level cpu or memory request defaults to what the
/// containers request together (AggregateContainerRequests), then any
/// still unset to the pod-level limit.
pub fn default_pod_requests(p: &mut Value) {
    let limits = list(p["spec"]["resources"].get("limits"));
    let Some(limits) = limits.filter(|l| !l.is_empty()) else {
        return;
    };
    let mut requests = list(p["spec"]["resources"].get("requests")).unwrap_or_default();
    for k in ["cpu", "memory"] {
        if !requests.contains_key(k) {
            if let Some(n) = aggregate_request(p, k) {
                requests.insert(k.to_string(), Quantity::Nanos(n));
            }
        }
    }
    for (k, q) in &limits {
        let supported = k == "cpu" || k == "memory" || k.starts_with("hugepages-");
        if supported && !requests.contains_key(k) {
            requests.insert(k.clone(), q.clone());
        }
    }
    if requests.is_empty() {
        return;
    }
    let out: serde_json::Map<String, Value> = requests
        .into_iter()
        .map(|(k, q)| {
            let v = match q {
                // Whole units as integers, else millis (cpu) or nanos.
                Quantity::Nanos(n) if n % 1_000_000_000 == 0 => (n / 1_000_000_000).to_string(),
                Quantity::Nanos(n) if n % 1_000_000 == 0 => format!("{}m", n / 1_000_000),
                Quantity::Nanos(n) => format!("{n}n"),
                Quantity::Raw(r) => r,
            };
            (k, Value::String(v))
        })
        .collect();
    p["spec"]["resources"]["requests"] = Value::Object(out);
}

/// AggregateContainerRequests for one resource, in nano-units: the regular
/// containers and sidecars together, or an init container with the
/// sidecars before it, whichever is more; None when nobody requests it.
fn aggregate_request(p: &Value, k: &str) -> Option<i128> {
    let req = |c: &Value| match Resources::of(c).requests.and_then(|r| r.get(k).cloned()) {
        Some(Quantity::Nanos(n)) => Some(n),
        _ => None,
    };
    let mut any = false;
    let mut apps: i128 = 0;
    for c in containers(p, "containers") {
        if let Some(n) = req(c) {
            any = true;
            apps += n;
        }
    }
    let (mut sidecars, mut init_max) = (0i128, 0i128);
    for c in containers(p, "initContainers") {
        let n = req(c);
        any |= n.is_some();
        let n = n.unwrap_or(0);
        if sidecar(c) {
            sidecars += n;
            init_max = init_max.max(sidecars);
        } else {
            init_max = init_max.max(sidecars + n);
        }
    }
    any.then(|| (apps + sidecars).max(init_max))
}

/// qos.GetPodQOS: the class set at create, else computed.
fn pod_qos(p: &Value) -> String {
    match p["status"]["qosClass"].as_str().filter(|q| !q.is_empty()) {
        Some(q) => q.to_string(),
        None => compute_qos(p).to_string(),
    }
}

/// isPodResizeRequestSupported: the first running container must report
/// its resources (a kubelet without in-place resize does not).
fn node_supports_resize(p: &Value) -> bool {
    let statuses = p["status"]["containerStatuses"].as_array();
    match statuses
        .into_iter()
        .flatten()
        .find(|s| s["state"]["running"].is_object())
    {
        Some(s) => !s["resources"].is_null(),
        None => true,
    }
}

/// validatePodResizeContainerOrdering: no container added, removed,
/// renamed or reordered.
fn ordering_errors(new: &Value, old: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    for (key, what) in [
        ("containers", "containers"),
        ("initContainers", "initContainers"),
    ] {
        let (n, o) = (containers(new, key), containers(old, key));
        if n.len() != o.len() {
            errs.push(format!(
                "spec.{key}: Forbidden: {what} may not be added or removed on resize"
            ));
            continue;
        }
        for (i, (nc, oc)) in n.iter().zip(o).enumerate() {
            if name_of(nc) != name_of(oc) {
                errs.push(format!(
                    "spec.{key}[{i}].name: Forbidden: {what} may not be renamed or reordered on resize"
                ));
            }
        }
    }
    errs
}

/// validateContainerResize: requests and limits may change, not go.
fn removal_errors(new: &Value, old: &Value, at: &str) -> Vec<String> {
    let (n, o) = (Resources::of(new), Resources::of(old));
    let removed = |n: &List, o: &List| {
        o.iter()
            .flatten()
            .any(|(k, _)| !n.as_ref().is_some_and(|n| n.contains_key(k)))
    };
    let mut errs = Vec::new();
    if removed(&n.requests, &o.requests) {
        errs.push(format!(
            "{at}.requests: Forbidden: resource requests cannot be removed"
        ));
    }
    if removed(&n.limits, &o.limits) {
        errs.push(format!(
            "{at}.limits: Forbidden: resource limits cannot be removed"
        ));
    }
    errs
}

/// The request-within-limit part of validateResourceRequirements, run on
/// the resized pod as validatePodMetadataAndSpec does (quantities printed
/// as written).
fn request_errors(p: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    for key in ["containers", "initContainers"] {
        for (i, c) in containers(p, key).iter().enumerate() {
            let r = &c["resources"];
            let (Some(req), Some(lim)) = (r["requests"].as_object(), r["limits"].as_object())
            else {
                continue;
            };
            for (k, q) in req {
                let Some(l) = lim.get(k) else { continue };
                if Quantity::parse(q).compare(&Quantity::parse(l)) == Some(Ordering::Greater) {
                    let text = |v: &Value| v.as_str().map_or(v.to_string(), str::to_string);
                    errs.push(format!(
                        "spec.{key}[{i}].resources.requests: Invalid value: {:?}: must be less than or equal to {k} limit of {}",
                        text(q),
                        text(l)
                    ));
                }
            }
        }
    }
    errs
}

/// SetDefaults_Pod's requests from limits on every container of a copy.
fn defaulted(p: &Value) -> Value {
    let mut p = p.clone();
    for key in ["containers", "initContainers"] {
        let Some(list) = p["spec"][key].as_array_mut() else {
            continue;
        };
        for c in list {
            let Some(lim) = c["resources"]["limits"].as_object().cloned() else {
                continue;
            };
            if !c["resources"]["requests"].is_object() {
                c["resources"]["requests"] = Value::Object(Map::new());
            }
            let req = c["resources"]["requests"]
                .as_object_mut()
                .expect("requests");
            for (k, q) in lim {
                req.entry(k).or_insert(q);
            }
        }
    }
    p
}

/// dropNonResizeUpdates: the stored pod with each container's resources
/// and resizePolicy from the write. A container whose resources (or
/// policy) are the stored ones by value keeps them as stored.
fn take_resize_fields(old: &Value, new: &Value) -> Value {
    let mut next = old.clone();
    for key in ["containers", "initContainers"] {
        let written = containers(new, key).to_vec();
        let Some(list) = next["spec"][key].as_array_mut() else {
            continue;
        };
        for (c, w) in list.iter_mut().zip(&written) {
            let Some(c) = c.as_object_mut() else { continue };
            let stored = Value::Object(c.clone());
            if !Resources::of(w).same(&Resources::of(&stored)) {
                match w.get("resources") {
                    Some(r) => c.insert("resources".into(), r.clone()),
                    None => c.remove("resources"),
                };
            }
            if policies(w) != policies(&stored) {
                match w.get("resizePolicy") {
                    Some(r) => c.insert("resizePolicy".into(), r.clone()),
                    None => c.remove("resizePolicy"),
                };
            }
        }
    }
    next
}

/// The pod to store after a resize write of `new` over `old`, or upstream's
/// 422.
pub fn update(name: &str, old: &Value, new: &Value) -> Result<Value, ApiError> {
    let new = defaulted(new);
    let order = ordering_errors(&new, old);
    // With the containers out of order the strategy hands the write on as
    // it is, for validation to refuse.
    let next = if order.is_empty() {
        take_resize_fields(old, &new)
    } else {
        new.clone()
    };
    let (old_d, next_d) = (defaulted(old), defaulted(&next));
    // validatePodMetadataAndSpec (requests within limits only).
    let mut errs = request_errors(&next_d);
    let pod_level = |p: &Value| {
        let r = &p["spec"]["resources"];
        !empty(&r["requests"]) || !empty(&r["limits"])
    };
    if pod_level(old) || pod_level(&next) {
        return Err(invalid(
            name,
            vec![": Forbidden: pods with pod-level resources cannot be resized".into()],
        ));
    }
    if old
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some()
    {
        return Err(invalid(
            name,
            vec![": Forbidden: static pods cannot be resized".into()],
        ));
    }
    if old["spec"]["os"]["name"] == "windows" {
        return Err(invalid(
            name,
            vec![": Forbidden: windows pods cannot be resized".into()],
        ));
    }
    if pod_qos(&old_d) != compute_qos(&next_d) {
        // The value shown is the class in the resized pod's status, which
        // the strategy keeps as stored.
        let shown = next["status"]["qosClass"].as_str().unwrap_or_default();
        errs.push(format!(
            "spec: Invalid value: {shown:?}: Pod QOS Class may not change as a result of resizing"
        ));
    }
    if !node_supports_resize(old) {
        errs.push("spec: Forbidden: Pod running on node without support for resize".into());
    }
    if !order.is_empty() {
        errs.extend(order);
        return Err(invalid(name, errs));
    }
    let pairs = |key: &str| -> Vec<(usize, Value, Value)> {
        containers(&next_d, key)
            .iter()
            .zip(containers(&old_d, key))
            .enumerate()
            .map(|(i, (n, o))| (i, n.clone(), o.clone()))
            .collect()
    };
    for (i, n, o) in pairs("initContainers")
        .into_iter()
        .filter(|(_, _, o)| sidecar(o))
    {
        errs.extend(removal_errors(
            &n,
            &o,
            &format!("spec.initContainers[{i}].resources"),
        ));
    }
    for (i, n, o) in pairs("containers") {
        errs.extend(removal_errors(
            &n,
            &o,
            &format!("spec.containers[{i}].resources"),
        ));
    }
    for (_, n, o) in pairs("containers") {
        if changed_beyond_cpu_memory(&n, &o) {
            errs.push("spec: Forbidden: only cpu and memory resources are mutable".into());
        }
    }
    for (_, n, o) in pairs("initContainers") {
        if sidecar(&n) {
            if changed_beyond_cpu_memory(&n, &o) {
                errs.push(
                    "spec: Forbidden: only cpu and memory resources for sidecar containers are mutable"
                        .into(),
                );
            }
        } else if !Resources::of(&n).same(&Resources::of(&o)) || policies(&n) != policies(&o) {
            errs.push(
                "spec: Forbidden: resources for non-sidecar init containers are immutable".into(),
            );
        }
    }
    // (The last check, a spec differing beyond the masked containers,
    // cannot fire: the strategy took nothing else.)
    if !errs.is_empty() {
        return Err(invalid(name, errs));
    }
    let mut next = next;
    // updatePodGeneration: a changed spec is a new generation.
    if next["spec"] != old["spec"] {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        next["metadata"]["generation"] = g.into();
    }
    Ok(next)
}

/// ValidatePodUpdate for a plain pod write, as far as the double checks it:
/// container and init container resources (by value) and resize policies
/// may not change; they change through `resize`. Upstream's cmp.Diff after
/// the message is left out.
pub fn check_pod_update(name: &str, old: &Value, next: &Value) -> Result<(), ApiError> {
    let changed = ["containers", "initContainers"].iter().any(|key| {
        let (n, o) = (containers(next, key), containers(old, key));
        n.len() == o.len()
            && n.iter().zip(o).any(|(n, o)| {
                !Resources::of(n).same(&Resources::of(o)) || policies(n) != policies(o)
            })
    });
    if !changed {
        return Ok(());
    }
    Err(invalid(
        name,
        vec!["spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)\n".into()],
    ))
}

/// errors.NewInvalid's message: ErrorList.ToAggregate drops repeated
/// messages; one error as it is, several in brackets.
fn invalid(name: &str, mut errs: Vec<String>) -> ApiError {
    let mut seen = Vec::new();
    errs.retain(|e| {
        let fresh = !seen.contains(e);
        seen.push(e.clone());
        fresh
    });
    super::ephemeral::invalid(name, errs)
}
