//! Service accounts in the API server double: the `token` subresource
//! (TokenRequest), TokenReview of the tokens it issued, the ServiceAccount
//! admission plugin (opt-in) and the root CA publisher's ConfigMap.
//!
//! Upstream: pkg/registry/core/serviceaccount/storage/token.go,
//! pkg/apis/authentication/validation, pkg/serviceaccount/claims.go,
//! plugin/pkg/admission/serviceaccount/admission.go,
//! pkg/controller/certificates/rootcacertpublisher/publisher.go.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde_json::{json, Value};

use super::store::{self, by_name, ApiError, Store};

/// The API server's audiences (`--api-audiences`, which defaults to the
/// issuer) and issuer (`--service-account-issuer`).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// serviceaccount.WarnOnlyBoundTokenExpirationSeconds: what the admission
/// plugin's projected token asks for, and the trigger of the extension.
pub const WARN_ONLY_EXPIRATION: i64 = 3607;
/// `--service-account-max-extended-token-expiration` default
/// (ExpirationExtensionSeconds, one year).
const EXTENDED_EXPIRATION: i64 = 24 * 365 * 3600;

pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";
const ROOT_CA_DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const VOLUME_PREFIX: &str = "kube-api-access-";
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What a token the double issued stands for (its claims).
#[derive(Debug, Clone)]
pub struct Issued {
    pub ns: String,
    pub sa: String,
    pub sa_uid: String,
    pub audiences: Vec<String>,
    /// Seconds since the epoch.
    pub exp: i64,
    /// ("pods" | "secrets" | "nodes", name, uid) of the bound object.
    pub bound: Option<(&'static str, String, String)>,
    /// The node of a pod-bound token (name, uid; uid "" if not found).
    pub node: Option<(String, String)>,
    pub jti: String,
}

/// Token state: test knobs, the requests seen and the tokens issued.
#[derive(Debug, Default)]
pub struct Tokens {
    /// `--service-account-max-token-expiration`, seconds (None: no cap).
    pub max_expiration: Option<i64>,
    /// (namespace, service account, spec as sent) of every TokenRequest.
    pub requests: Vec<(String, String, Value)>,
    pub issued: HashMap<String, Issued>,
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

/// errors.NewInvalid for one field error of a TokenRequest.
fn invalid(name: &str, field: &str, value: &Value, detail: &str) -> ApiError {
    let shown = match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    };
    let cause = format!("Invalid value: {shown}: {detail}");
    let mut e = ApiError::new(
        422,
        "Invalid",
        format!("TokenRequest.authentication.k8s.io {name:?} is invalid: {field}: {cause}"),
    );
    e.details = Some(
        json!({"name": name, "group": "authentication.k8s.io", "kind": "TokenRequest",
        "causes": [{"reason": "FieldValueInvalid", "message": cause, "field": field}]}),
    );
    e
}

/// The `create` of `serviceaccounts/{name}/token`, in upstream's order
/// (TokenREST.Create): body name/namespace must match the URL, the
/// ServiceAccount must exist, audiences default to the API server's,
/// static validation (expirationSeconds defaults to 3600 when decoding,
/// then must be 600..=2^32), the bound object (Pod, Secret or Node) must
/// exist with the given uid, the max-expiration cap (with a warning), and
/// the pod-bound 3607 s extension. Returns the TokenRequest and the
/// warning, if any. Nothing is stored; the token is registered for
/// TokenReview.
pub fn token_request(
    st: &mut Store,
    ns: &str,
    name: &str,
    mut req: Value,
) -> Result<(Value, Option<String>), ApiError> {
    if !req.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request was not an object",
        ));
    }
    st.tokens
        .requests
        .push((ns.into(), name.into(), req["spec"].clone()));
    let body_name = str_at(&req, "/metadata/name").to_string();
    if !body_name.is_empty() && body_name != name {
        return Err(invalid(
            name,
            "metadata.name",
            &json!(body_name),
            "must match the service account name if specified",
        ));
    }
    let body_ns = str_at(&req, "/metadata/namespace").to_string();
    if !body_ns.is_empty() && body_ns != ns {
        return Err(invalid(
            name,
            "metadata.namespace",
            &json!(body_ns),
            "must match the service account namespace if specified",
        ));
    }
    let sa = st
        .get(by_name("serviceaccounts"), ns, name)
        .ok_or_else(|| ApiError::not_found(by_name("serviceaccounts"), name))?;
    let sa_uid = str_at(&sa, "/metadata/uid").to_string();
    if !req["spec"].is_object() {
        req["spec"] = json!({});
    }
    // SetDefaults_TokenRequestSpec: expirationSeconds 3600.
    if req["spec"]["expirationSeconds"].is_null() {
        req["spec"]["expirationSeconds"] = json!(3600);
    }
    let audiences: Vec<String> = match req["spec"]["audiences"].as_array() {
        Some(a) if !a.is_empty() => a
            .iter()
            .map(|v| v.as_str().unwrap_or("").to_string())
            .collect(),
        _ => vec![API_AUDIENCE.to_string()],
    };
    req["spec"]["audiences"] = json!(audiences);
    let now = now_secs();
    req["metadata"] = json!({"name": name, "namespace": ns, "uid": sa_uid,
        "creationTimestamp": store::rfc3339_secs(now)});
    let exp_value = req["spec"]["expirationSeconds"].clone();
    let mut exp_secs = exp_value.as_i64().ok_or_else(|| {
        ApiError::bad_request("spec.expirationSeconds: expected an integer".to_string())
    })?;
    // ValidateTokenRequest (errors.NewInvalid with an empty name).
    if exp_secs < 600 {
        return Err(invalid(
            "",
            "spec.expirationSeconds",
            &exp_value,
            "may not specify a duration less than 10 minutes",
        ));
    }
    if exp_secs > 1 << 32 {
        return Err(invalid(
            "",
            "spec.expirationSeconds",
            &exp_value,
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    let mut bound = None;
    let mut node = None;
    let mut pod_bound = false;
    if let Some(r) = req["spec"].get("boundObjectRef").filter(|r| r.is_object()) {
        let api_version = str_at(r, "/apiVersion");
        let kind = str_at(r, "/kind");
        let ref_name = str_at(r, "/name").to_string();
        let ref_uid = str_at(r, "/uid");
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let plural = match (group, kind) {
            ("", "Pod") => "pods",
            ("", "Secret") => "secrets",
            ("", "Node") => "nodes",
            _ => {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token to object of type {group}/{version}, Kind={kind}"
                )))
            }
        };
        let res = by_name(plural);
        let obj_ns = if res.namespaced { ns } else { "" };
        let obj = st
            .get(res, obj_ns, &ref_name)
            .ok_or_else(|| ApiError::not_found(res, &ref_name))?;
        if plural == "pods" {
            pod_bound = true;
            if str_at(&obj, "/spec/serviceAccountName") != name {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount {name:?} to pod running with different serviceaccount name."
                )));
            }
            // ServiceAccountTokenPodNodeInfo: the pod's node, its uid if
            // the Node exists.
            let node_name = str_at(&obj, "/spec/nodeName");
            if !node_name.is_empty() {
                let uid = st
                    .get(by_name("nodes"), "", node_name)
                    .map(|n| str_at(&n, "/metadata/uid").to_string())
                    .unwrap_or_default();
                node = Some((node_name.to_string(), uid));
            }
        }
        let uid = str_at(&obj, "/metadata/uid").to_string();
        if !ref_uid.is_empty() && ref_uid != uid {
            let mut e = ApiError::new(
                409,
                "Conflict",
                format!("Operation cannot be fulfilled on {kind} {ref_name:?}: the UID in the bound object reference ({ref_uid}) does not match the UID in record. The object might have been deleted and then recreated"),
            );
            e.details = Some(json!({"name": ref_name, "kind": kind}));
            return Err(e);
        }
        if plural == "nodes" {
            node = Some((ref_name.clone(), uid.clone()));
        }
        bound = Some((plural, ref_name, uid));
    }
    let mut warning = None;
    if let Some(max) = st.tokens.max_expiration.filter(|m| *m > 0) {
        if exp_secs > max {
            warning = Some(format!(
                "requested expiration of {exp_secs} seconds shortened to {max} seconds"
            ));
            exp_secs = max;
            req["spec"]["expirationSeconds"] = json!(max);
        }
    }
    // --service-account-extend-token-expiration (default true): a
    // pod-bound token asked for 3607 s with only the API server's
    // audiences lives a year, with `warnafter` at 3607 s; the status still
    // says 3607 s.
    let mut token_exp = exp_secs;
    let mut warnafter = None;
    if pod_bound && exp_secs == WARN_ONLY_EXPIRATION && audiences.iter().all(|a| a == API_AUDIENCE)
    {
        warnafter = Some(now + exp_secs);
        token_exp = EXTENDED_EXPIRATION;
    }
    let jti = store::new_uid();
    let mut k8s = json!({"namespace": ns, "serviceaccount": {"name": name, "uid": sa_uid}});
    match &bound {
        Some(("pods", n, u)) => k8s["pod"] = json!({"name": n, "uid": u}),
        Some(("secrets", n, u)) => k8s["secret"] = json!({"name": n, "uid": u}),
        _ => {}
    }
    if let Some((n, u)) = &node {
        k8s["node"] = if u.is_empty() {
            json!({"name": n})
        } else {
            json!({"name": n, "uid": u})
        };
    }
    if let Some(w) = warnafter {
        k8s["warnafter"] = json!(w);
    }
    let claims = json!({
        "aud": audiences, "exp": now + token_exp, "iat": now, "nbf": now,
        "iss": ISSUER, "jti": jti,
        "sub": format!("system:serviceaccount:{ns}:{name}"),
        "kubernetes.io": k8s,
    });
    // JWT-shaped (base64url header.payload.signature) but NOT signed: the
    // "signature" is random bytes and no key can verify it. The double
    // authenticates its tokens by lookup (TokenReview), not by signature.
    let header = json!({"alg": "RS256", "kid": "apiserver-double"});
    let sig = store::new_uid().replace('-', "") + &store::new_uid().replace('-', "");
    let token = format!(
        "{}.{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes()),
        b64url(sig.as_bytes())
    );
    st.tokens.issued.insert(
        token.clone(),
        Issued {
            ns: ns.into(),
            sa: name.into(),
            sa_uid,
            audiences,
            exp: now + token_exp,
            bound,
            node,
            jti,
        },
    );
    req["kind"] = json!("TokenRequest");
    req["apiVersion"] = json!("authentication.k8s.io/v1");
    req["status"] = json!({"token": token,
        "expirationTimestamp": store::rfc3339_secs(now + exp_secs)});
    Ok((req, warning))
}

/// TokenReview of a token the double issued, as the service account token
/// authenticator (pkg/serviceaccount/claims.go validator): not expired,
/// an audience in common with the review's (or the API server's), the
/// ServiceAccount and the bound object still there with the same uid.
/// None: not a token the double issued.
pub fn review(st: &Store, token: &str, want_auds: &[String]) -> Option<Value> {
    let t = st.tokens.issued.get(token)?;
    let fail = |why: &str| json!({"user": {}, "error": format!("[invalid bearer token, {why}]")});
    let want: Vec<String> = if want_auds.is_empty() {
        vec![API_AUDIENCE.to_string()]
    } else {
        want_auds.to_vec()
    };
    let common: Vec<&String> = t.audiences.iter().filter(|a| want.contains(a)).collect();
    if common.is_empty() {
        return Some(fail(&format!(
            "token audiences {:?} is invalid for the target audiences {:?}",
            t.audiences, want
        )));
    }
    if now_secs() >= t.exp {
        return Some(fail("service account token has expired"));
    }
    let Some(sa) = st.get(by_name("serviceaccounts"), &t.ns, &t.sa) else {
        return Some(fail(&format!("serviceaccounts {:?} not found", t.sa)));
    };
    let uid = str_at(&sa, "/metadata/uid");
    if uid != t.sa_uid {
        return Some(fail(&format!(
            "service account UID ({uid}) does not match claim ({})",
            t.sa_uid
        )));
    }
    let mut extra = serde_json::Map::new();
    if let Some((plural, name, uid)) = &t.bound {
        let res = by_name(plural);
        let ns = if res.namespaced { t.ns.as_str() } else { "" };
        match st.get(res, ns, name) {
            Some(o) if str_at(&o, "/metadata/uid") == uid => {}
            _ => return Some(fail("service account token has been invalidated")),
        }
        if *plural == "pods" {
            extra.insert(
                "authentication.kubernetes.io/pod-name".into(),
                json!([name]),
            );
            extra.insert("authentication.kubernetes.io/pod-uid".into(), json!([uid]));
        }
    }
    if let Some((name, uid)) = &t.node {
        extra.insert(
            "authentication.kubernetes.io/node-name".into(),
            json!([name]),
        );
        if !uid.is_empty() {
            extra.insert("authentication.kubernetes.io/node-uid".into(), json!([uid]));
        }
    }
    extra.insert(
        "authentication.kubernetes.io/credential-id".into(),
        json!([format!("JTI={}", t.jti)]),
    );
    Some(json!({
        "authenticated": true,
        "user": {
            "username": format!("system:serviceaccount:{}:{}", t.ns, t.sa),
            "uid": t.sa_uid,
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{}", t.ns),
                "system:authenticated"],
            "extra": extra,
        },
        "audiences": common,
    }))
}

/// admission.NewForbidden for a pod.
fn forbidden(pod: &Value, why: &str) -> ApiError {
    let mut name = str_at(pod, "/metadata/name");
    if name.is_empty() {
        name = str_at(pod, "/metadata/generateName");
    }
    if name.is_empty() {
        name = "Unknown";
    }
    let mut e = ApiError::new(
        403,
        "Forbidden",
        format!("pods {name:?} is forbidden: {why}"),
    );
    e.details = Some(json!({"name": name, "kind": "pods"}));
    e
}

/// Every container list of a pod spec (init containers first, as the
/// plugin walks them).
const CONTAINER_LISTS: [&str; 3] = ["initContainers", "containers", "ephemeralContainers"];

/// Whether a mirror pod references a secret (podutil.VisitPodSecretNames:
/// image pull secrets, secret and projected-secret volumes, env and envFrom
/// of every container; the volume plugins' own secretRefs are not checked).
fn references_secrets(spec: &Value) -> bool {
    let nonempty = |v: Option<&Value>| v.and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    if nonempty(spec.get("imagePullSecrets")) {
        return true;
    }
    let volumes = spec.get("volumes").and_then(Value::as_array);
    if volumes.into_iter().flatten().any(|v| {
        v.get("secret").is_some()
            || v.pointer("/projected/sources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|s| s.get("secret").is_some())
    }) {
        return true;
    }
    CONTAINER_LISTS.iter().any(|l| {
        spec.get(*l)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| {
                c.get("env")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .any(|e| e.pointer("/valueFrom/secretKeyRef").is_some())
                    || c.get("envFrom")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .any(|e| e.get("secretRef").is_some())
            })
    })
}

/// The ServiceAccount admission plugin on a pod create (Admit, then
/// Validate): mirror pods are not changed but may not name a service
/// account, reference secrets or project tokens; other pods get
/// `serviceAccountName: default` if unset, must name an existing
/// ServiceAccount (403 otherwise), get the `kube-api-access-<suffix>`
/// projected volume and its read-only mount in every (init) container
/// that has nothing at the mount path, unless automounting is off (pod
/// first, then ServiceAccount), and the ServiceAccount's image pull
/// secrets if they have none. (Upstream retries a missing `default`
/// ServiceAccount for up to ~2 s; the double does not wait.)
pub fn admit_pod(st: &Store, ns: &str, pod: &mut Value) -> Result<(), ApiError> {
    if !pod["spec"].is_object() {
        pod["spec"] = json!({});
    }
    let mirror = pod
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .is_some();
    if mirror {
        let spec = &pod["spec"];
        if !str_at(spec, "/serviceAccountName").is_empty() {
            return Err(forbidden(
                pod,
                "a mirror pod may not reference service accounts",
            ));
        }
        if references_secrets(spec) {
            return Err(forbidden(pod, "a mirror pod may not reference secrets"));
        }
        let projects_token = spec
            .get("volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.pointer("/projected/sources").and_then(Value::as_array))
            .flatten()
            .any(|s| s.get("serviceAccountToken").is_some());
        if projects_token {
            return Err(forbidden(
                pod,
                "a mirror pod may not use ServiceAccountToken volume projections",
            ));
        }
        return Ok(());
    }
    if str_at(pod, "/spec/serviceAccountName").is_empty() {
        pod["spec"]["serviceAccountName"] = json!("default");
    }
    let sa_name = str_at(pod, "/spec/serviceAccountName").to_string();
    let Some(sa) = st.get(by_name("serviceaccounts"), ns, &sa_name) else {
        return Err(forbidden(
            pod,
            &format!("error looking up service account {ns}/{sa_name}: serviceaccount {sa_name:?} not found"),
        ));
    };
    let automount = pod["spec"]
        .get("automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| {
            sa.get("automountServiceAccountToken")
                .and_then(Value::as_bool)
        })
        .unwrap_or(true);
    if automount {
        mount_token(&mut pod["spec"]);
    }
    let has_pull = pod["spec"]
        .get("imagePullSecrets")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if !has_pull {
        if let Some(s) = sa
            .get("imagePullSecrets")
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty())
        {
            let names: Vec<Value> = s.iter().map(|r| json!({"name": r["name"]})).collect();
            pod["spec"]["imagePullSecrets"] = json!(names);
        }
    }
    Ok(())
}

/// mountServiceAccountToken + TokenVolumeSource.
fn mount_token(spec: &mut Value) {
    let existing = spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .find(|n| n.starts_with(VOLUME_PREFIX))
        .map(str::to_string);
    let name = existing
        .clone()
        .unwrap_or_else(|| format!("{VOLUME_PREFIX}{}", store::random_suffix()));
    let mount = json!({"name": name, "readOnly": true, "mountPath": MOUNT_PATH});
    let mut needs_volume = false;
    for list in ["initContainers", "containers"] {
        let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in cs {
            let has = c
                .get("volumeMounts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(MOUNT_PATH));
            if has {
                continue;
            }
            if !c.get("volumeMounts").is_some_and(Value::is_array) {
                c["volumeMounts"] = json!([]);
            }
            c["volumeMounts"]
                .as_array_mut()
                .expect("volumeMounts")
                .push(mount.clone());
            needs_volume = true;
        }
    }
    if existing.is_none() && needs_volume {
        if !spec.get("volumes").is_some_and(Value::is_array) {
            spec["volumes"] = json!([]);
        }
        spec["volumes"]
            .as_array_mut()
            .expect("volumes")
            .push(json!({
                "name": name,
                "projected": {
                    // v1.ProjectedVolumeSourceDefaultMode (0644).
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": WARN_ONLY_EXPIRATION, "path": "token"}},
                        {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                    ],
                },
            }));
    }
}

/// The root CA publisher's sync of one namespace: create `kube-root-ca.crt`
/// (the CA bundle under `ca.crt`, the description annotation), or bring
/// its data and annotation back if they differ.
pub fn publish_root_ca(st: &mut Store, ns: &str) -> Result<Value, ApiError> {
    let res = by_name("configmaps");
    let ca = st.pki.ca_pem().to_string();
    let data = json!({"ca.crt": ca});
    match st.get(res, ns, ROOT_CA_CONFIGMAP) {
        None => st.create(
            res,
            ns,
            json!({"metadata": {"name": ROOT_CA_CONFIGMAP,
                "annotations": {"kubernetes.io/description": ROOT_CA_DESCRIPTION}},
                "data": data}),
            None,
        ),
        Some(cm) => {
            let annotated =
                !str_at(&cm, "/metadata/annotations/kubernetes.io~1description").is_empty();
            if cm.get("data") == Some(&data) && annotated {
                return Ok(cm);
            }
            let mut next = cm.clone();
            next["data"] = data;
            if !next["metadata"]["annotations"].is_object() {
                next["metadata"]["annotations"] = json!({});
            }
            next["metadata"]["annotations"]["kubernetes.io/description"] =
                json!(ROOT_CA_DESCRIPTION);
            st.update(res, ns, ROOT_CA_CONFIGMAP, next, store::Sub::Main)
        }
    }
}

/// A duration as whole seconds, at least 1.
pub fn secs(d: Duration) -> i64 {
    (d.as_secs() as i64).max(1)
}
