//! Image credential provider plugins in service-account-token mode, in
//! cluster mode against the in-process API server double (a double, not a
//! real kube-apiserver), with rkubelet on the machine's real containerd: a
//! pod's image pull runs the plugin with a TokenRequest-issued token for the
//! pod's ServiceAccount (the configured audience, bound to the pod) and the
//! ServiceAccount's chosen annotations. The image's registry is a closed
//! port on 127.0.0.1, so the pull itself fails and no traffic leaves the
//! machine; the plugin has run by then.

mod common;

use std::time::Duration;

use base64::Engine;
use common::apiserver::{ApiServer, ApiServerOptions};
use common::*;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(90);

/// The claims of a JWT-shaped token (the double's tokens are not signed).
fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("a JWT-shaped token");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url claims");
    serde_json::from_slice(&bytes).expect("JSON claims")
}

#[test]
fn a_pull_runs_a_token_mode_plugin_with_a_pod_bound_token() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-credsa";
    api.create(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "puller", "namespace": "default",
            "annotations": {"example.com/role": "reader", "example.com/unrelated": "x"}},
    }));
    let mut k = Kubelet::new(node);
    // A closed loopback port as the registry: the pull fails after the
    // credentials are looked up.
    let registry = format!("127.0.0.1:{}", free_port());

    // The plugin keeps its stdin and answers with a login for the registry.
    let bin = k.dir.join("plugins");
    std::fs::create_dir_all(&bin).unwrap();
    let plugin = bin.join("recorder");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\ncat > {}/request.tmp && mv {0}/request.tmp {0}/request\necho '{{\"apiVersion\": \"credentialprovider.kubelet.k8s.io/v1\", \"kind\": \"CredentialProviderResponse\", \"cacheKeyType\": \"Registry\", \"auth\": {{\"{registry}\": {{\"username\": \"u\", \"password\": \"p\"}}}}}}'\n",
            k.dir.display()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let config = k.dir.join("credential-providers.yaml");
    std::fs::write(
        &config,
        format!("apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: recorder\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  matchImages: [\"{registry}\"]\n  defaultCacheDuration: 1m\n  tokenAttributes:\n    serviceAccountTokenAudience: registry.test\n    cacheType: ServiceAccount\n    requireServiceAccount: true\n    requiredServiceAccountAnnotationKeys: [example.com/role]\n"),
    )
    .unwrap();
    let kc = api.node_kubeconfig(&k.dir, node);
    k.extra_args = vec![
        "--kubeconfig".into(),
        kc.display().to_string(),
        format!("--image-credential-provider-config={}", config.display()),
        format!("--image-credential-provider-bin-dir={}", bin.display()),
    ];
    k.extra_config = "nodeStatusUpdateFrequency: 1s\nsyncFrequency: 5s\n".into();
    k.spawn();
    wait_for("the Node to be registered", T, || {
        api.get("nodes", None, node)
    });

    let name = format!("pull-{node}");
    let pod = api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "puller",
            "containers": [{
                "name": "main",
                "image": format!("{registry}/rk/app:1"),
                "imagePullPolicy": "Always",
            }]
        }
    }));
    let pod_uid = pod["metadata"]["uid"].as_str().unwrap().to_string();

    let request = k.dir.join("request");
    let sent: Value = wait_for("the plugin to be run for the pull", T, || {
        let text = std::fs::read(&request).ok()?;
        serde_json::from_slice(&text).ok()
    });
    assert_eq!(sent["kind"], "CredentialProviderRequest");
    assert_eq!(sent["apiVersion"], "credentialprovider.kubelet.k8s.io/v1");
    assert_eq!(sent["image"], format!("{registry}/rk/app"));
    // Only the configured annotation keys.
    assert_eq!(
        sent["serviceAccountAnnotations"],
        json!({"example.com/role": "reader"})
    );
    // The token: issued by the API server's TokenRequest for the pod's
    // account, with the configured audience, bound to the pod.
    let token = sent["serviceAccountToken"].as_str().expect("a token");
    let c = claims(token);
    assert_eq!(c["aud"], json!(["registry.test"]));
    assert_eq!(c["sub"], "system:serviceaccount:default:puller");
    assert_eq!(c["kubernetes.io"]["pod"]["name"], name.as_str());
    assert_eq!(c["kubernetes.io"]["pod"]["uid"], pod_uid.as_str());
    let reqs = api.token_requests();
    let (ns, sa, spec) = reqs
        .iter()
        .find(|(_, _, s)| s["audiences"] == json!(["registry.test"]))
        .expect("a TokenRequest with the plugin's audience");
    assert_eq!((ns.as_str(), sa.as_str()), ("default", "puller"));
    assert_eq!(spec["boundObjectRef"]["kind"], "Pod");
    assert_eq!(spec["boundObjectRef"]["name"], name.as_str());
    assert_eq!(spec["boundObjectRef"]["uid"], pod_uid.as_str());

    // The pull, with the plugin's login, fails against the closed port.
    wait_for("the pull to fail", T, || {
        let p = api.get("pods", Some("default"), &name)?;
        let reason = p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
            .as_str()?
            .to_string();
        ["ErrImagePull", "ImagePullBackOff"]
            .contains(&reason.as_str())
            .then_some(())
    });
    drop(k);
}
