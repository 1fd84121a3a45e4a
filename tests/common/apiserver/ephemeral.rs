//! The `pods/{name}/ephemeralcontainers` subresource, as upstream's
//! podEphemeralContainersStrategy (pkg/registry/core/pod/strategy.go): a
//! write keeps the stored pod and takes only `spec.ephemeralContainers`
//! from the body (dropNonEphemeralContainerUpdates), a changed spec bumping
//! the generation (updatePodGeneration), then
//! ValidatePodEphemeralContainersUpdate and the ephemeral part of
//! validatePodSpec (validateEphemeralContainers) decide, each refusal a 422
//! Invalid with upstream's field errors.

use serde_json::Value;

use super::store::ApiError;

/// Fields an ephemeral container may not set (validateEphemeralContainers:
/// "cannot be set for an Ephemeral Container").
const FORBIDDEN: [&str; 6] = [
    "lifecycle",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "ports",
    "resources",
];

/// Whether `v`, decoded into the Go field `f`, is its zero value, which
/// validateFieldAllowList (reflect.DeepEqual with the zero value) lets
/// through. `resources` is a struct, zero when each of its members is
/// (kubectl always sends it, as `{}`); the others are pointers or slices,
/// zero only when null (an empty list decodes to a non-nil slice).
fn go_zero(f: &str, v: &Value) -> bool {
    match (f, v) {
        (_, Value::Null) => true,
        ("resources", Value::Object(m)) => m.values().all(Value::is_null),
        _ => false,
    }
}

/// The pod to store after a write of `new` over `old`, or upstream's 422.
pub fn update(name: &str, old: &Value, new: &Value) -> Result<Value, ApiError> {
    let list = |p: &Value, key: &str| -> Vec<Value> {
        p.pointer(&format!("/spec/{key}"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let mirror = old
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some();
    if mirror {
        return Err(invalid(
            name,
            vec![": Forbidden: static pods do not support ephemeral containers".into()],
        ));
    }
    let (old_eph, new_eph) = (
        list(old, "ephemeralContainers"),
        list(new, "ephemeralContainers"),
    );
    let name_of = |c: &Value| c["name"].as_str().unwrap_or_default().to_string();
    let mut errs = Vec::new();
    // validateEphemeralContainers: names unique across every container,
    // targets among the regular and init containers, no forbidden field.
    let others: Vec<String> = list(old, "containers")
        .iter()
        .chain(list(old, "initContainers").iter())
        .map(name_of)
        .collect();
    let mut seen = others.clone();
    for (i, c) in new_eph.iter().enumerate() {
        let at = format!("spec.ephemeralContainers[{i}]");
        let n = name_of(c);
        if seen.contains(&n) {
            errs.push(format!("{at}.name: Duplicate value: {n:?}"));
        }
        seen.push(n);
        if let Some(t) = c["targetContainerName"].as_str().filter(|t| !t.is_empty()) {
            if !others.iter().any(|o| o == t) {
                errs.push(format!("{at}.targetContainerName: Not found: {t:?}"));
            }
        }
        for f in FORBIDDEN {
            if c.get(f).is_some_and(|v| !go_zero(f, v)) {
                errs.push(format!(
                    "{at}.{f}: Forbidden: cannot be set for an Ephemeral Container"
                ));
            }
        }
    }
    // ValidatePodEphemeralContainersUpdate: the ones there stay as they are.
    for o in &old_eph {
        let n = name_of(o);
        match new_eph.iter().find(|c| name_of(c) == n) {
            None => errs.push(format!(
                "spec.ephemeralContainers: Forbidden: existing ephemeral containers {n:?} may not be removed\n"
            )),
            Some(c) if c != o => errs.push(format!(
                "spec.ephemeralContainers.{n}: Forbidden: existing ephemeral containers {n:?} may not be changed\n"
            )),
            Some(_) => {}
        }
    }
    if !errs.is_empty() {
        return Err(invalid(name, errs));
    }
    let mut next = old.clone();
    if new_eph.is_empty() {
        if let Some(spec) = next["spec"].as_object_mut() {
            spec.remove("ephemeralContainers");
        }
    } else {
        next["spec"]["ephemeralContainers"] = Value::Array(new_eph);
    }
    // updatePodGeneration: a changed spec is a new generation.
    if next["spec"] != old["spec"] {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        next["metadata"]["generation"] = g.into();
    }
    Ok(next)
}

/// errors.NewInvalid's message: one error as it is, several in brackets.
pub(super) fn invalid(name: &str, errs: Vec<String>) -> ApiError {
    let body = match errs.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    ApiError::new(422, "Invalid", format!("Pod {name:?} is invalid: {body}"))
}
