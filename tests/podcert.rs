//! podCertificate projected volume sources in cluster mode (gate
//! PodCertificateRequest on), against the in-process double of the API
//! server (`common::apiserver`: a double, not a real kube-apiserver) with
//! rkubelet on the machine's real containerd. The test plays the signer: it
//! writes the Issued (or Denied) condition and the chain into each
//! PodCertificateRequest's status.

mod common;

use std::time::Duration;

use base64::Engine;
use common::apiserver::trustbundle::ca_certificate_pem;
use common::apiserver::{ApiServer, ApiServerOptions};
use common::*;
use rkubelet::cri::RuntimeService;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(120);

fn kubelet(node: &str, api: &ApiServer) -> Kubelet {
    let mut k = Kubelet::new(node);
    let kc = api.node_kubeconfig(&k.dir, node);
    k.extra_args = vec!["--kubeconfig".into(), kc.display().to_string()];
    k.extra_config = "nodeStatusUpdateFrequency: 1s\nsyncFrequency: 5s\nfeatureGates:\n  PodCertificateRequest: true\n".into();
    k.spawn();
    k
}

fn pod(name: &str, node: &str, sources: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "serviceAccountName": "default",
            "volumes": [{"name": "cert", "projected": {"sources": sources}}],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "volumeMounts": [{"name": "cert", "mountPath": "/cert"}]
            }]
        }
    })
}

/// The pod's PodCertificateRequests, oldest first.
fn requests(api: &ApiServer, pod: &str) -> Vec<Value> {
    let mut v: Vec<Value> = api
        .list("podcertificaterequests")
        .into_iter()
        .filter(|r| r["spec"]["podName"] == pod)
        .collect();
    v.sort_by_key(|r| {
        r["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    });
    v
}

fn rfc3339(unix: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(unix)
        .unwrap()
        .to_string()
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The signer's status write: Issued with `chain`, refresh due at
/// `begin_refresh_at`.
fn issue(api: &ApiServer, req: &Value, chain: &str, begin_refresh_at: i64) {
    let mut r = req.clone();
    let now = unix_now();
    r["status"] = json!({
        "conditions": [{"type": "Issued", "status": "True", "reason": "Issued",
            "message": "", "lastTransitionTime": rfc3339(now)}],
        "certificateChain": chain,
        "notBefore": rfc3339(now - 3600),
        "beginRefreshAt": rfc3339(begin_refresh_at),
        "notAfter": rfc3339(now + 86400),
    });
    api.update_status(r);
}

fn deny(api: &ApiServer, req: &Value) {
    let mut r = req.clone();
    r["status"] = json!({
        "conditions": [{"type": "Denied", "status": "True", "reason": "NotAllowed",
            "message": "this signer does not serve that pod", "lastTransitionTime": rfc3339(unix_now())}],
    });
    api.update_status(r);
}

/// Waits for pod `name`'s first container to run; its CRI ID.
fn running_container_id(api: &ApiServer, name: &str) -> String {
    let p = wait_for("the pod Running", T, || {
        api.get("pods", Some("default"), name)
            .filter(|p| p["status"]["containerStatuses"][0]["state"]["running"].is_object())
    });
    container_id(&p)
}

fn container_id(p: &Value) -> String {
    p["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string()
}

fn cat(k: &Kubelet, id: &str, file: &str) -> String {
    let r = k
        .cri
        .rt
        .block_on(
            k.cri
                .client
                .exec_sync(id, vec!["cat".into(), format!("/cert/{file}")], 10),
        )
        .unwrap();
    String::from_utf8_lossy(&r.stdout).to_string()
}

/// The DER of the first PEM block labelled `label` in `text`.
fn pem_der(text: &str, label: &str) -> Vec<u8> {
    let begin = format!("-----BEGIN {label}-----\n");
    let end = format!("-----END {label}-----\n");
    let start = text.find(&begin).expect("block") + begin.len();
    let stop = start + text[start..].find(&end).expect("end");
    let body: String = text[start..stop].lines().collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

fn spki(req: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(req["spec"]["pkixPublicKey"].as_str().unwrap())
        .unwrap()
}

/// The public key of a PKCS#8 private key, as the request's SPKI ends.
fn public_of(key_type: &str, pkcs8: &[u8]) -> Vec<u8> {
    use ring::signature::KeyPair;
    match key_type {
        "ED25519" => ring::signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8)
            .unwrap()
            .public_key()
            .as_ref()
            .to_vec(),
        // DER RSAPublicKey, the SPKI's BIT STRING.
        "RSA3072" => ring::signature::RsaKeyPair::from_pkcs8(pkcs8)
            .unwrap()
            .public()
            .as_ref()
            .to_vec(),
        // ring has no P-521: the point of the PKCS#8 document's scalar,
        // by the p521 crate.
        "ECDSAP521" => {
            let info = rsa::pkcs8::PrivateKeyInfo::try_from(pkcs8).unwrap();
            // ECPrivateKey: SEQUENCE (3 bytes), version 1, OCTET STRING of
            // the 66-byte scalar.
            assert_eq!(&info.private_key[3..8], &[0x02, 0x01, 0x01, 0x04, 0x42]);
            let d = p521::ecdsa::SigningKey::from_slice(&info.private_key[8..74]).unwrap();
            p521::ecdsa::VerifyingKey::from(&d)
                .to_encoded_point(false)
                .as_bytes()
                .to_vec()
        }
        "ECDSAP384" => ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P384_SHA384_ASN1_SIGNING,
            pkcs8,
            &ring::rand::SystemRandom::new(),
        )
        .unwrap()
        .public_key()
        .as_ref()
        .to_vec(),
        _ => ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            pkcs8,
            &ring::rand::SystemRandom::new(),
        )
        .unwrap()
        .public_key()
        .as_ref()
        .to_vec(),
    }
}

/// An API server with the default service account, a kubelet on `node`
/// and a pod there with the projected `sources`, once it has as many
/// PodCertificateRequests: (api, kubelet, pod name, requests).
fn pod_with_sources(node: &str, sources: Value) -> (ApiServer, Kubelet, String, Vec<Value>) {
    let api = ApiServer::start(ApiServerOptions::default());
    api.create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": "default"}}));
    let k = kubelet(node, &api);
    let name = format!("pcert-{node}");
    let n = sources.as_array().map_or(0, Vec::len);
    api.create(pod(&name, node, sources));
    let reqs = wait_for("the PodCertificateRequests", T, || {
        let r = requests(&api, &name);
        (r.len() == n).then_some(r)
    });
    (api, k, name, reqs)
}

/// `pod_with_sources` with the one `source`: its one request.
fn one_source_pod(node: &str, source: Value) -> (ApiServer, Kubelet, String, Value) {
    let (api, k, name, mut reqs) = pod_with_sources(node, json!([source]));
    (api, k, name, reqs.remove(0))
}

/// Deletes pod `name` at once and waits until the API has it no more.
fn delete_pod(api: &ApiServer, name: &str) {
    api.delete("pods", Some("default"), name, Some(0));
    wait_for("the pod gone", T, || {
        api.get("pods", Some("default"), name)
            .is_none()
            .then_some(())
    });
}

/// A pod whose projected volume has a credential bundle (ED25519) and a
/// key and chain apart (ECDSAP256) waits, with upstream's "not issued yet",
/// until the signer issues both requests; then it runs with the keys whose
/// public halves the requests carry and the issued chains. At
/// beginRefreshAt a new key is requested, the old credentials served until
/// the new request is issued. The old code refused the source
/// ("podCertificate projections are not supported yet").
#[test]
fn a_pod_waits_for_its_certificates_then_reads_key_and_chain_and_they_refresh() {
    let api = ApiServer::start(ApiServerOptions::default());
    let sa = api.create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": "default"}}));
    let node = "it-pcert";
    let k = kubelet(node, &api);
    let name = format!("pcert-{node}");
    let created = api.create(pod(
        &name,
        node,
        json!([
            {"podCertificate": {"signerName": "example.com/s", "keyType": "ED25519",
                "maxExpirationSeconds": 3600, "credentialBundlePath": "bundle.pem"}},
            {"podCertificate": {"signerName": "example.com/s", "keyType": "ECDSAP256",
                "keyPath": "tls.key", "certificateChainPath": "tls.crt"}}
        ]),
    ));
    let reqs = wait_for("two PodCertificateRequests", T, || {
        let r = requests(&api, &name);
        (r.len() == 2).then_some(r)
    });
    let node_obj = api.get("nodes", None, node).unwrap();
    for r in &reqs {
        let s = &r["spec"];
        assert!(r["metadata"]["name"].as_str().unwrap().starts_with("req-"));
        assert_eq!(r["metadata"]["ownerReferences"][0]["kind"], "Pod");
        assert_eq!(
            r["metadata"]["ownerReferences"][0]["uid"],
            created["metadata"]["uid"]
        );
        assert_eq!(s["podUID"], created["metadata"]["uid"]);
        assert_eq!(s["serviceAccountName"], "default");
        assert_eq!(s["serviceAccountUID"], sa["metadata"]["uid"]);
        assert_eq!(s["nodeName"], node);
        assert_eq!(s["nodeUID"], node_obj["metadata"]["uid"]);
        assert_eq!(s["signerName"], "example.com/s");
    }
    // Which request is which source: by key length (Ed25519's SPKI is 44
    // bytes).
    let (ed, ec) = if spki(&reqs[0]).len() == 44 {
        (&reqs[0], &reqs[1])
    } else {
        (&reqs[1], &reqs[0])
    };
    assert_eq!(ed["spec"]["maxExpirationSeconds"], 3600);
    // Waiting, in upstream's words.
    wait_for("a FailedMount event saying not issued yet", T, || {
        api.list("events").into_iter().find(|e| {
            e["reason"] == "FailedMount"
                && e["involvedObject"]["name"] == name.as_str()
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("credential bundle is not issued yet"))
        })
    });
    let p = api.get("pods", Some("default"), &name).unwrap();
    assert_ne!(p["status"]["phase"], "Running");

    let (chain_ed, chain_ec) = (ca_certificate_pem("ed"), ca_certificate_pem("ec"));
    // The bundle's certificate is due for refresh soon, the other not. The
    // kubelet refreshes at beginRefreshAt plus up to 5 minutes of jitter
    // (upstream's jitterDuration): a beginRefreshAt 292 s ago is due within
    // 8 s at the latest.
    issue(&api, ed, &chain_ed, unix_now() - 300 + 8);
    issue(&api, ec, &chain_ec, unix_now() + 86400);
    let id = running_container_id(&api, &name);
    let bundle = cat(&k, &id, "bundle.pem");
    assert!(
        bundle.starts_with("-----BEGIN PRIVATE KEY-----\n"),
        "{bundle}"
    );
    assert!(bundle.ends_with(&chain_ed), "key then chain: {bundle}");
    let key = pem_der(&bundle, "PRIVATE KEY");
    assert_eq!(public_of("ED25519", &key), spki(ed)[12..]);
    assert_eq!(cat(&k, &id, "tls.crt"), chain_ec);
    let ec_key = pem_der(&cat(&k, &id, "tls.key"), "PRIVATE KEY");
    assert_eq!(public_of("ECDSAP256", &ec_key), spki(ec)[26..]);

    // beginRefreshAt passed: a third request, for a new key of the bundle's
    // source; meanwhile the old bundle stays.
    let refresh = wait_for("a refresh PodCertificateRequest", T, || {
        let r = requests(&api, &name);
        (r.len() == 3).then(|| r[2].clone())
    });
    assert_eq!(spki(&refresh).len(), 44);
    assert_ne!(spki(&refresh), spki(ed));
    assert_eq!(cat(&k, &id, "bundle.pem"), bundle);
    let chain2 = ca_certificate_pem("ed2");
    issue(&api, &refresh, &chain2, unix_now() + 86400);
    let renewed = wait_for("the bundle rewritten with the new key", T, || {
        let b = cat(&k, &id, "bundle.pem");
        b.ends_with(&chain2).then_some(b)
    });
    let key2 = pem_der(&renewed, "PRIVATE KEY");
    assert_eq!(public_of("ED25519", &key2), spki(&refresh)[12..]);
    // The split files were not refreshed.
    assert_eq!(cat(&k, &id, "tls.crt"), chain_ec);
    assert_eq!(requests(&api, &name).len(), 3);

    delete_pod(&api, &name);
    drop(k);
}

/// An ECDSAP384 source (upstream's generateKeyAndProof: a P-384 key, the
/// proof ECDSA over SHA-256 of the pod UID): the request passes the API
/// server double's proof check (the validation's `ecdsa.VerifyASN1` over
/// that digest), and once issued the pod reads a PKCS#8 P-384 key whose
/// public half is the request's. The old code refused the key type.
#[test]
fn an_ecdsa_p384_key_is_requested_with_its_proof_and_served() {
    let (api, k, name, req) = one_source_pod(
        "it-pcert-p384",
        json!({"podCertificate": {"signerName": "example.com/s", "keyType": "ECDSAP384",
            "keyPath": "tls.key", "certificateChainPath": "tls.crt"}}),
    );
    let key_spki = spki(&req);
    // secp384r1 SubjectPublicKeyInfo: 23 bytes of header, the point.
    assert_eq!((key_spki.len(), key_spki[23]), (120, 4));
    let chain = ca_certificate_pem("p384");
    issue(&api, &req, &chain, unix_now() + 86400);
    let id = running_container_id(&api, &name);
    assert_eq!(cat(&k, &id, "tls.crt"), chain);
    let key = pem_der(&cat(&k, &id, "tls.key"), "PRIVATE KEY");
    assert_eq!(public_of("ECDSAP384", &key), key_spki[23..]);
    delete_pod(&api, &name);
    drop(k);
}

/// RSA3072 and ECDSAP521 sources, each a credential bundle (upstream's
/// generateKeyAndProof: an RSA key with an RSASSA-PSS proof, a P-521 key
/// with ECDSA over SHA-256 of the pod UID): both requests pass the API
/// server double's proof checks (`rsa.VerifyPSS` with nil options,
/// `ecdsa.VerifyASN1`), and once issued the pod reads bundles of a PKCS#8
/// key whose public half is its request's, then the chain. The old code
/// refused both key types.
#[test]
fn rsa3072_and_p521_keys_are_requested_with_their_proofs_and_served_as_bundles() {
    let (api, k, name, reqs) = pod_with_sources(
        "it-pcert-rsa",
        json!([
            {"podCertificate": {"signerName": "example.com/s", "keyType": "RSA3072",
                "credentialBundlePath": "rsa.pem"}},
            {"podCertificate": {"signerName": "example.com/s", "keyType": "ECDSAP521",
                "credentialBundlePath": "p521.pem"}}
        ]),
    );
    // By key length: a 3072-bit rsaEncryption SPKI is 422 bytes (24 of
    // header), a secp521r1 one 158 (25 of header).
    let (rsa_req, ec_req) = if spki(&reqs[0]).len() == 422 {
        (&reqs[0], &reqs[1])
    } else {
        (&reqs[1], &reqs[0])
    };
    assert_eq!(
        (spki(rsa_req).len(), spki(ec_req).len()),
        (422, 158),
        "{reqs:?}"
    );
    let (chain_rsa, chain_ec) = (ca_certificate_pem("rsa"), ca_certificate_pem("p521"));
    issue(&api, rsa_req, &chain_rsa, unix_now() + 86400);
    issue(&api, ec_req, &chain_ec, unix_now() + 86400);
    let id = running_container_id(&api, &name);
    for (file, key_type, req, chain, header) in [
        ("rsa.pem", "RSA3072", rsa_req, &chain_rsa, 24),
        ("p521.pem", "ECDSAP521", ec_req, &chain_ec, 25),
    ] {
        let bundle = cat(&k, &id, file);
        assert!(
            bundle.starts_with("-----BEGIN PRIVATE KEY-----\n"),
            "{bundle}"
        );
        assert!(bundle.ends_with(chain.as_str()), "key then chain: {bundle}");
        let key = pem_der(&bundle, "PRIVATE KEY");
        assert_eq!(public_of(key_type, &key), spki(req)[header..], "{key_type}");
    }
    delete_pod(&api, &name);
    drop(k);
}

/// A denied request is final (upstream's credStateDenied): the volume fails
/// with the signer's reason and message, the pod never starts, and no new
/// request is made.
#[test]
fn a_denied_request_leaves_the_pod_waiting_with_the_reason() {
    let (api, k, name, req) = one_source_pod(
        "it-pcert-deny",
        json!({"podCertificate": {"signerName": "example.com/s", "keyType": "ED25519",
            "credentialBundlePath": "bundle.pem"}}),
    );
    deny(&api, &req);
    let want = "MountVolume.SetUp failed for volume \"cert\" : PodCertificateRequest was permanently denied: reason=\"NotAllowed\" message=\"this signer does not serve that pod\"";
    wait_for("a FailedMount event with the denial", T, || {
        api.list("events").into_iter().find(|e| {
            e["reason"] == "FailedMount"
                && e["involvedObject"]["name"] == name.as_str()
                && e["message"] == want
        })
    });
    let p = api.get("pods", Some("default"), &name).unwrap();
    assert_ne!(p["status"]["phase"], "Running");
    assert_eq!(
        requests(&api, &name).len(),
        1,
        "no new request after a denial"
    );
    delete_pod(&api, &name);
    drop(k);
}

/// PodCertificateRequest is alpha and off by default in 1.34: upstream's
/// kubelet then uses its no-op manager, the volume fails with its
/// `unimplemented`, and no request is made.
#[test]
fn without_the_feature_gate_no_request_is_made_and_the_volume_fails() {
    let api = ApiServer::start(ApiServerOptions::default());
    api.create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": "default"}}));
    let node = "it-pcert-off";
    let mut k = Kubelet::new(node);
    let kc = api.node_kubeconfig(&k.dir, node);
    k.extra_args = vec!["--kubeconfig".into(), kc.display().to_string()];
    k.extra_config = "nodeStatusUpdateFrequency: 1s\nsyncFrequency: 5s\n".into();
    k.spawn();
    let name = format!("pcert-{node}");
    api.create(pod(
        &name,
        node,
        json!([{"podCertificate": {"signerName": "example.com/s", "keyType": "ED25519",
            "credentialBundlePath": "bundle.pem"}}]),
    ));
    wait_for("a FailedMount event from the no-op manager", T, || {
        api.list("events").into_iter().find(|e| {
            e["reason"] == "FailedMount"
                && e["involvedObject"]["name"] == name.as_str()
                && e["message"] == "MountVolume.SetUp failed for volume \"cert\" : unimplemented"
        })
    });
    assert!(requests(&api, &name).is_empty());
    assert_eq!(api.count_requests("POST", "podcertificaterequests"), 0);
    let p = api.get("pods", Some("default"), &name).unwrap();
    assert_ne!(p["status"]["phase"], "Running");
    delete_pod(&api, &name);
    drop(k);
}

/// A `/debug/pods` duration (Go's format: "1m2.5s", "31.5s", "500ms").
fn go_duration(s: &str) -> Option<Duration> {
    if let Some(ms) = s.strip_suffix("ms") {
        return ms
            .parse::<f64>()
            .ok()
            .map(|v| Duration::from_secs_f64(v / 1000.0));
    }
    let s = s.strip_suffix('s')?;
    let (m, secs) = match s.split_once('m') {
        Some((m, rest)) => (m.parse::<f64>().ok()?, rest),
        None => (0.0, s),
    };
    let secs = if secs.is_empty() {
        0.0
    } else {
        secs.parse::<f64>().ok()?
    };
    Some(Duration::from_secs_f64(m * 60.0 + secs))
}

/// The kubelet watches its node's PodCertificateRequests (as upstream's
/// informer: `spec.nodeName=<node>`), and the issuance of a request a
/// volume waits on sets that volume up at once: the test lets the volume's
/// retry backoff grow to 25 s or more (read from /debug/pods), issues the
/// request, and sees the pod running before that retry could have come.
#[test]
fn issuance_wakes_the_volume_before_its_backoff_retry() {
    let api = ApiServer::start(ApiServerOptions::default());
    api.create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": "default"}}));
    let node = "it-pcert-wake";
    let k = kubelet(node, &api);
    let name = format!("pcert-{node}");
    api.create(pod(
        &name,
        node,
        json!([{"podCertificate": {"signerName": "example.com/s", "keyType": "ED25519",
            "credentialBundlePath": "bundle.pem"}}]),
    ));
    let req = wait_for("a PodCertificateRequest", T, || {
        requests(&api, &name).into_iter().next()
    });
    assert!(
        api.requests().iter().any(|r| r.method == "GET"
            && r.path
                .starts_with("/apis/certificates.k8s.io/v1alpha1/podcertificaterequests?")
            && r.path.contains("watch=true")
            && r.path
                .contains(&format!("fieldSelector=spec.nodeName%3D{node}"))),
        "a watch of the node's requests"
    );
    let url = format!("https://{}/debug/pods/default/{name}", k.api);
    // The volume keeps failing with "not issued yet"; its backoff doubles
    // from 0.5 s. The retry cannot come before `sent + next attempt`.
    let retry_not_before = wait_for("a volume retry 25 s or more away", T, || {
        let sent = std::time::Instant::now();
        let out = std::process::Command::new("curl")
            .args(["-sk", &url])
            .output()
            .ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        let w = v["volumesWaitedOn"]
            .as_array()?
            .iter()
            .find(|w| w["name"] == "cert")?
            .clone();
        assert!(
            w["error"]
                .as_str()
                .is_some_and(|e| e.contains("credential bundle is not issued yet")),
            "{w}"
        );
        let next = go_duration(w["nextAttemptIn"].as_str()?)?;
        (next >= Duration::from_secs(25)).then_some(sent + next)
    });
    let chain = ca_certificate_pem("wake");
    issue(&api, &req, &chain, unix_now() + 86400);
    let id = running_container_id(&api, &name);
    let seen_running = std::time::Instant::now();
    assert!(
        seen_running < retry_not_before,
        "the pod started only at the volume's backoff retry: the watch did not wake it"
    );
    assert!(cat(&k, &id, "bundle.pem").ends_with(&chain));
    delete_pod(&api, &name);
    drop(k);
}
