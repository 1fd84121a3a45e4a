//! The three patch formats of the API server: JSON merge patch (RFC 7386),
//! strategic merge patch (k8s.io/apimachinery/pkg/util/strategicpatch, for
//! the fields the kubelet writes), and JSON patch (RFC 6902).

use serde_json::{Map, Value};

/// RFC 7386: objects merge recursively, `null` removes a key, anything else
/// (lists included) replaces.
pub fn merge_patch(target: &Value, patch: &Value) -> Value {
    match patch {
        Value::Object(p) => {
            let mut out = match target {
                Value::Object(t) => t.clone(),
                _ => Map::new(),
            };
            for (k, v) in p {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = merge_patch(out.get(k).unwrap_or(&Value::Null), v);
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// How a list field merges in a strategic merge patch: by the key of its
/// elements (`patchMergeKey`), as a set of primitives, or (absent here)
/// replaced whole.
enum ListStrategy {
    MergeKey(&'static str),
    PrimitiveSet,
}

/// The `patchStrategy:"merge"` lists of the objects the kubelet writes, by
/// field path (list elements do not add a path segment).
fn list_strategy(path: &str) -> Option<ListStrategy> {
    use ListStrategy::*;
    Some(match path {
        "metadata.ownerReferences" => MergeKey("uid"),
        "metadata.finalizers" => PrimitiveSet,
        "status.conditions" => MergeKey("type"),
        "status.containerStatuses"
        | "status.initContainerStatuses"
        | "status.ephemeralContainerStatuses"
        | "status.resourceClaimStatuses" => MergeKey("name"),
        "status.podIPs" | "status.hostIPs" => MergeKey("ip"),
        "status.addresses" => MergeKey("type"),
        "spec.containers" | "spec.initContainers" | "spec.ephemeralContainers" => MergeKey("name"),
        "spec.volumes" | "spec.imagePullSecrets" => MergeKey("name"),
        "spec.containers.env" | "spec.initContainers.env" => MergeKey("name"),
        "spec.containers.ports" | "spec.initContainers.ports" => MergeKey("containerPort"),
        "spec.containers.volumeMounts" | "spec.initContainers.volumeMounts" => {
            MergeKey("mountPath")
        }
        _ => return None,
    })
}

const SET_ORDER: &str = "$setElementOrder/";
const DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList/";

/// Applies a strategic merge patch to `target`.
pub fn strategic_merge(target: &Value, patch: &Value) -> Result<Value, String> {
    merge_map(target, patch, "")
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn merge_map(target: &Value, patch: &Value, path: &str) -> Result<Value, String> {
    let Value::Object(p) = patch else {
        return Ok(patch.clone());
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut out = p.clone();
            out.remove("$patch");
            return Ok(Value::Object(out));
        }
        Some("delete") => return Ok(Value::Null),
        Some(other) => return Err(format!("unknown patch directive {other:?}")),
        None => {}
    }
    let mut out = match target {
        Value::Object(t) => t.clone(),
        _ => Map::new(),
    };
    for (k, v) in p {
        if k == "$patch" || k == "$retainKeys" || k.starts_with(SET_ORDER) {
            continue;
        }
        if let Some(field) = k.strip_prefix(DELETE_PRIMITIVE) {
            let remove = v.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(list)) = out.get_mut(field) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        let sub = join(path, k);
        if v.is_null() {
            out.remove(k);
            continue;
        }
        let cur = out.get(k).cloned().unwrap_or(Value::Null);
        let merged = match (v, list_strategy(&sub)) {
            (Value::Array(pl), Some(ListStrategy::MergeKey(mk))) => {
                let cl = cur.as_array().cloned().unwrap_or_default();
                let order = p.get(&format!("{SET_ORDER}{k}")).and_then(Value::as_array);
                merge_keyed_list(&cl, pl, mk, order, &sub)?
            }
            (Value::Array(pl), Some(ListStrategy::PrimitiveSet)) => {
                let mut cl = cur.as_array().cloned().unwrap_or_default();
                for x in pl {
                    if !cl.contains(x) {
                        cl.push(x.clone());
                    }
                }
                if let Some(order) = p.get(&format!("{SET_ORDER}{k}")).and_then(Value::as_array) {
                    sort_by_order(&mut cl, order, |x| Some(x.clone()));
                }
                Value::Array(cl)
            }
            (Value::Object(_), _) => {
                let m = merge_map(&cur, v, &sub)?;
                if m.is_null() {
                    out.remove(k);
                    continue;
                }
                m
            }
            _ => v.clone(),
        };
        out.insert(k.clone(), merged);
    }
    // `$setElementOrder` alone (no list in the patch) still reorders.
    for (k, order) in p {
        if let Some(field) = k.strip_prefix(SET_ORDER) {
            if p.contains_key(field) {
                continue;
            }
            let (Some(Value::Array(list)), Some(order)) = (out.get_mut(field), order.as_array())
            else {
                continue;
            };
            match list_strategy(&join(path, field)) {
                Some(ListStrategy::MergeKey(mk)) => {
                    sort_by_order(list, &order_keys(order, mk), |x| x.get(mk).cloned())
                }
                _ => sort_by_order(list, order, |x| Some(x.clone())),
            }
        }
    }
    if let Some(keep) = p.get("$retainKeys").and_then(Value::as_array) {
        out.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k)));
    }
    Ok(Value::Object(out))
}

fn merge_keyed_list(
    cur: &[Value],
    patch: &[Value],
    mk: &str,
    order: Option<&Vec<Value>>,
    path: &str,
) -> Result<Value, String> {
    // `{"$patch": "replace"}` as an element: the rest of the patch list is
    // the whole new list.
    if patch
        .iter()
        .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace") && e.get(mk).is_none())
    {
        let rest: Vec<Value> = patch
            .iter()
            .filter(|e| e.get("$patch").is_none())
            .cloned()
            .collect();
        return Ok(Value::Array(rest));
    }
    let mut out: Vec<Value> = cur.to_vec();
    for pe in patch {
        let Some(k) = pe.get(mk) else {
            return Err(format!(
                "map: {pe} does not contain declared merge key: {mk}"
            ));
        };
        let pos = out.iter().position(|e| e.get(mk) == Some(k));
        if pe.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(i) = pos {
                out.remove(i);
            }
            continue;
        }
        match pos {
            Some(i) => out[i] = merge_map(&out[i], pe, path)?,
            None => out.push(merge_map(&Value::Null, pe, path)?),
        }
    }
    if let Some(order) = order {
        sort_by_order(&mut out, &order_keys(order, mk), |x| x.get(mk).cloned());
    }
    Ok(Value::Array(out))
}

/// The merge keys a `$setElementOrder` list names (its elements are maps
/// holding only the merge key).
fn order_keys(order: &[Value], mk: &str) -> Vec<Value> {
    order.iter().filter_map(|o| o.get(mk).cloned()).collect()
}

/// Puts the elements named in `order` in that order; the others keep their
/// relative order after them. (Upstream interleaves server-only elements by
/// their original positions; the double puts them last.)
fn sort_by_order(list: &mut [Value], order: &[Value], key: impl Fn(&Value) -> Option<Value>) {
    let rank = |x: &Value| {
        key(x)
            .and_then(|k| {
                order
                    .iter()
                    .position(|o| *o == k || o.get("$key") == Some(&k))
            })
            .unwrap_or(usize::MAX)
    };
    list.sort_by_key(rank);
}

fn pointer_tokens(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err(format!("invalid JSON pointer {p:?}"));
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn parent_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Result<&'a mut Value, String> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(m) => m
                .get_mut(t)
                .ok_or_else(|| format!("missing path at {t:?}"))?,
            Value::Array(a) => {
                let i: usize = t.parse().map_err(|_| format!("bad index {t:?}"))?;
                a.get_mut(i)
                    .ok_or_else(|| format!("index {i} out of range"))?
            }
            _ => return Err(format!("cannot descend into {t:?}")),
        };
    }
    Ok(cur)
}

fn remove_at(doc: &mut Value, path: &str) -> Result<Value, String> {
    let tokens = pointer_tokens(path)?;
    let (last, parents) = tokens.split_last().ok_or("cannot remove the root")?;
    match parent_mut(doc, parents)? {
        Value::Object(m) => m
            .remove(last)
            .ok_or_else(|| format!("missing path {path:?}")),
        Value::Array(a) => {
            let i: usize = last.parse().map_err(|_| format!("bad index {last:?}"))?;
            if i < a.len() {
                Ok(a.remove(i))
            } else {
                Err(format!("index {i} out of range"))
            }
        }
        _ => Err(format!("cannot remove {path:?}")),
    }
}

fn add_at(doc: &mut Value, path: &str, v: Value, replace: bool) -> Result<(), String> {
    let tokens = pointer_tokens(path)?;
    let Some((last, parents)) = tokens.split_last() else {
        *doc = v;
        return Ok(());
    };
    match parent_mut(doc, parents)? {
        Value::Object(m) => {
            if replace && !m.contains_key(last) {
                return Err(format!("missing path {path:?}"));
            }
            m.insert(last.clone(), v);
        }
        Value::Array(a) => {
            if last == "-" && !replace {
                a.push(v);
            } else {
                let i: usize = last.parse().map_err(|_| format!("bad index {last:?}"))?;
                if replace {
                    *a.get_mut(i)
                        .ok_or_else(|| format!("index {i} out of range"))? = v;
                } else if i <= a.len() {
                    a.insert(i, v);
                } else {
                    return Err(format!("index {i} out of range"));
                }
            }
        }
        _ => return Err(format!("cannot add at {path:?}")),
    }
    Ok(())
}

/// RFC 6902: add, remove, replace, move, copy, test; all or nothing.
pub fn json_patch(target: &Value, patch: &Value) -> Result<Value, String> {
    let ops = patch
        .as_array()
        .ok_or("a JSON patch is a list of operations")?;
    let mut doc = target.clone();
    for op in ops {
        let path = op["path"].as_str().ok_or("operation without a path")?;
        let value = || op.get("value").cloned().ok_or("operation without a value");
        match op["op"].as_str().unwrap_or("") {
            "add" => add_at(&mut doc, path, value()?, false)?,
            "replace" => add_at(&mut doc, path, value()?, true)?,
            "remove" => {
                remove_at(&mut doc, path)?;
            }
            "move" => {
                let from = op["from"].as_str().ok_or("move without from")?;
                let v = remove_at(&mut doc, from)?;
                add_at(&mut doc, path, v, false)?;
            }
            "copy" => {
                let from = op["from"].as_str().ok_or("copy without from")?;
                let v = doc
                    .pointer(from)
                    .cloned()
                    .ok_or("copy from a missing path")?;
                add_at(&mut doc, path, v, false)?;
            }
            "test" => {
                if doc.pointer(path) != Some(&value()?) {
                    return Err(format!("testing value {path} failed"));
                }
            }
            other => return Err(format!("unknown operation {other:?}")),
        }
    }
    Ok(doc)
}
