//! The API objects a container's environment reads, fetched before its
//! config is built, and the service-link variables (upstream
//! `pkg/kubelet/envvars` and getServiceEnvVarMap in `kubelet_pods.go`).
//!
//! The config is built on a blocking thread (it writes files), so
//! everything it needs from the API server is fetched here first,
//! asynchronously, and handed over; a failed fetch is kept as its error so
//! the builder can report it only if the reference turns out to matter
//! (an optional reference to a missing object does not).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};

use crate::objects::{ObjectError, ObjectManager};

/// Services whose links every pod gets, whatever enableServiceLinks says
/// (upstream masterServices), when they live in `default`.
const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// What a container's env and envFrom reference, as fetched.
#[derive(Debug, Clone)]
pub struct EnvSources {
    pub config_maps: HashMap<String, Result<Arc<ConfigMap>, ObjectError>>,
    pub secrets: HashMap<String, Result<Arc<Secret>, ObjectError>>,
    /// The pod namespace's and `default`'s Services; empty without an API
    /// server (upstream's kubelet without a service lister sets no links).
    pub services: Result<Vec<Arc<Service>>, ObjectError>,
}

impl Default for EnvSources {
    fn default() -> Self {
        EnvSources {
            config_maps: HashMap::new(),
            secrets: HashMap::new(),
            services: Ok(Vec::new()),
        }
    }
}

/// Names of the ConfigMaps and Secrets the container's env and envFrom
/// reference, each once, in the order first referenced.
pub fn referenced(c: &Container) -> (Vec<String>, Vec<String>) {
    let (mut cms, mut secrets) = (Vec::<String>::new(), Vec::<String>::new());
    let add = |v: &mut Vec<String>, n: &str| {
        if !v.iter().any(|x| x == n) {
            v.push(n.to_string());
        }
    };
    for f in c.env_from.iter().flatten() {
        if let Some(r) = &f.config_map_ref {
            add(&mut cms, &r.name);
        } else if let Some(r) = &f.secret_ref {
            add(&mut secrets, &r.name);
        }
    }
    for e in c.env.iter().flatten() {
        let Some(from) = &e.value_from else { continue };
        // A literal value wins over valueFrom (upstream checks it first).
        if e.value.as_deref().is_some_and(|v| !v.is_empty()) {
            continue;
        }
        if let Some(r) = &from.config_map_key_ref {
            add(&mut cms, &r.name);
        } else if let Some(r) = &from.secret_key_ref {
            add(&mut secrets, &r.name);
        }
    }
    (cms, secrets)
}

/// Whether the pod wants links to all Services of its namespace (the API
/// defaults enableServiceLinks to true).
pub fn service_links_enabled(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.enable_service_links)
        .unwrap_or(true)
}

/// Fetches exactly what the container's env references, and the Services
/// for links: the namespace's and `default`'s, or only `default`'s (for
/// the master service) when the pod turned links off.
pub async fn fetch(objects: &ObjectManager, pod: &Pod, c: &Container) -> EnvSources {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let (cm_names, secret_names) = referenced(c);
    let cms = futures::future::join_all(cm_names.iter().map(|n| objects.config_map(ns, n)));
    let secrets = futures::future::join_all(secret_names.iter().map(|n| objects.secret(ns, n)));
    let list_ns = if service_links_enabled(pod) {
        ns
    } else {
        "default"
    };
    let (cms, secrets, services) = futures::join!(cms, secrets, objects.services(list_ns));
    let services = match services {
        Err(ObjectError::NoApiServer { .. }) => Ok(Vec::new()),
        other => other,
    };
    EnvSources {
        config_maps: cm_names.into_iter().zip(cms).collect(),
        secrets: secret_names.into_iter().zip(secrets).collect(),
        services,
    }
}

/// Whether the Service has a cluster IP to link to (headless Services and
/// those without an IP yet have none).
fn has_cluster_ip(s: &Service) -> bool {
    s.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty() && ip != "None")
}

/// `my-svc.v2` → `MY_SVC_V2`, with a leading `_` when it would start with a
/// digit.
fn env_name(s: &str) -> String {
    let n = s.replace(['.', '-'], "_").to_uppercase();
    if n.starts_with(|c: char| c.is_ascii_digit()) {
        format!("_{n}")
    } else {
        n
    }
}

/// The link variables of one Service: `_SERVICE_HOST`, `_SERVICE_PORT`
/// (the first port) and one per named port, then the Docker-link style
/// `_PORT` and `_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]` (upstream
/// FromServices and makeLinkVariables).
fn service_vars(s: &Service, out: &mut Vec<(String, String)>) {
    let Some(spec) = s.spec.as_ref() else { return };
    let ip = spec.cluster_ip.clone().unwrap_or_default();
    let prefix = env_name(s.metadata.name.as_deref().unwrap_or_default());
    let ports = spec.ports.as_deref().unwrap_or_default();
    out.push((format!("{prefix}_SERVICE_HOST"), ip.clone()));
    let Some(first) = ports.first() else { return };
    let port_var = format!("{prefix}_SERVICE_PORT");
    out.push((port_var.clone(), first.port.to_string()));
    for p in ports {
        if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
            out.push((format!("{port_var}_{}", env_name(name)), p.port.to_string()));
        }
    }
    for (i, p) in ports.iter().enumerate() {
        let proto = p
            .protocol
            .as_deref()
            .filter(|p| !p.is_empty())
            .unwrap_or("TCP");
        let lower = proto.to_lowercase();
        let url = format!("{lower}://{ip}:{}", p.port);
        if i == 0 {
            // Docker special-cases the first port.
            out.push((format!("{prefix}_PORT"), url.clone()));
        }
        let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
        out.push((pp.clone(), url));
        out.push((format!("{pp}_PROTO"), lower));
        out.push((format!("{pp}_PORT"), p.port.to_string()));
        out.push((format!("{pp}_ADDR"), ip.clone()));
    }
}

/// The service-link variables a pod in `ns` sees (upstream
/// getServiceEnvVarMap): the master service `kubernetes` from `default`
/// always, and with links enabled every Service of `ns` with a cluster IP;
/// a Service of `ns` wins over `default`'s of the same name. Ordered by
/// Service name so the container's env is stable.
pub fn service_env(ns: &str, links: bool, services: &[Arc<Service>]) -> Vec<(String, String)> {
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for s in services {
        if !has_cluster_ip(s) {
            continue;
        }
        let name = s.metadata.name.as_deref().unwrap_or_default();
        let sns = s.metadata.namespace.as_deref().unwrap_or_default();
        if sns == "default" && MASTER_SERVICES.contains(&name) {
            chosen.entry(name).or_insert(s);
        } else if sns == ns && links {
            chosen.insert(name, s);
        }
    }
    let mut out = Vec::new();
    for s in chosen.values() {
        service_vars(s, &mut out);
    }
    out
}

/// A Service for tests: namespace, name, cluster IP, (port name, port,
/// protocol or "").
#[cfg(test)]
pub(crate) fn test_service(
    ns: &str,
    name: &str,
    ip: &str,
    ports: &[(Option<&str>, i32, &str)],
) -> Arc<Service> {
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    let mut s = Service {
        spec: Some(ServiceSpec {
            cluster_ip: Some(ip.into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p, proto)| ServicePort {
                        name: n.map(String::from),
                        port: *p,
                        protocol: (!proto.is_empty()).then(|| proto.to_string()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some(ns.into());
    Arc::new(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_service as svc;

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn link_vars_follow_upstream_names_including_docker_links() {
        let s = svc(
            "ns",
            "my-db.v2",
            "10.0.0.7",
            &[(Some("sql"), 5432, ""), (Some("metrics-http"), 9187, "UDP")],
        );
        let env = service_env("ns", true, &[s]);
        let expect = [
            ("MY_DB_V2_SERVICE_HOST", "10.0.0.7"),
            ("MY_DB_V2_SERVICE_PORT", "5432"),
            ("MY_DB_V2_SERVICE_PORT_SQL", "5432"),
            ("MY_DB_V2_SERVICE_PORT_METRICS_HTTP", "9187"),
            ("MY_DB_V2_PORT", "tcp://10.0.0.7:5432"),
            ("MY_DB_V2_PORT_5432_TCP", "tcp://10.0.0.7:5432"),
            ("MY_DB_V2_PORT_5432_TCP_PROTO", "tcp"),
            ("MY_DB_V2_PORT_5432_TCP_PORT", "5432"),
            ("MY_DB_V2_PORT_5432_TCP_ADDR", "10.0.0.7"),
            ("MY_DB_V2_PORT_9187_UDP", "udp://10.0.0.7:9187"),
            ("MY_DB_V2_PORT_9187_UDP_PROTO", "udp"),
            ("MY_DB_V2_PORT_9187_UDP_PORT", "9187"),
            ("MY_DB_V2_PORT_9187_UDP_ADDR", "10.0.0.7"),
        ];
        for (k, v) in expect {
            assert_eq!(get(&env, k), Some(v), "{k} in {env:?}");
        }
        assert_eq!(env.len(), expect.len(), "{env:?}");
        // A name starting with a digit gets a leading underscore.
        let env = service_env(
            "ns",
            true,
            &[svc("ns", "3d", "10.0.0.8", &[(None, 80, "")])],
        );
        assert_eq!(get(&env, "_3D_SERVICE_HOST"), Some("10.0.0.8"));
    }

    #[test]
    fn headless_and_foreign_services_are_skipped_and_the_namespace_wins() {
        let services = [
            svc(
                "default",
                "kubernetes",
                "10.96.0.1",
                &[(Some("https"), 443, "")],
            ),
            svc("default", "other", "10.96.0.9", &[(None, 80, "")]),
            svc("ns", "headless", "None", &[(None, 80, "")]),
            svc("ns", "pending", "", &[(None, 80, "")]),
            svc("ns", "web", "10.0.0.2", &[(None, 8080, "")]),
        ];
        let env = service_env("ns", true, &services);
        assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get(&env, "KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get(&env, "WEB_SERVICE_PORT"), Some("8080"));
        // default's other Services are not the pod's; headless ones have
        // nothing to link to.
        assert_eq!(get(&env, "OTHER_SERVICE_HOST"), None);
        assert_eq!(get(&env, "HEADLESS_SERVICE_HOST"), None);
        assert_eq!(get(&env, "PENDING_SERVICE_HOST"), None);

        // The pod namespace's own `kubernetes` wins, whichever comes first.
        let mine = svc("ns", "kubernetes", "10.0.0.3", &[(None, 443, "")]);
        for list in [
            vec![services[0].clone(), mine.clone()],
            vec![mine.clone(), services[0].clone()],
        ] {
            let env = service_env("ns", true, &list);
            assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.0.0.3"));
        }

        // Links off: only the master service is left.
        let env = service_env("ns", false, &services);
        assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get(&env, "WEB_SERVICE_HOST"), None);
    }

    #[test]
    fn referenced_objects_are_listed_once_and_literal_values_need_none() {
        use k8s_openapi::api::core::v1::{
            ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, EnvVar, EnvVarSource,
            SecretKeySelector,
        };
        let c = Container {
            env_from: Some(vec![EnvFromSource {
                config_map_ref: Some(ConfigMapEnvSource {
                    name: "a".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            env: Some(vec![
                EnvVar {
                    name: "X".into(),
                    value_from: Some(EnvVarSource {
                        config_map_key_ref: Some(ConfigMapKeySelector {
                            name: "a".into(),
                            key: "k".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                EnvVar {
                    name: "Y".into(),
                    value: Some("literal".into()),
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "unused".into(),
                            key: "k".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                },
                EnvVar {
                    name: "Z".into(),
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "s".into(),
                            key: "k".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        assert_eq!(
            referenced(&c),
            (vec!["a".to_string()], vec!["s".to_string()])
        );
    }

    #[tokio::test]
    async fn without_an_api_server_references_fail_and_services_are_empty() {
        use k8s_openapi::api::core::v1::{EnvFromSource, PodSpec, SecretEnvSource};
        let pod = Pod {
            spec: Some(PodSpec::default()),
            ..Default::default()
        };
        let c = Container {
            env_from: Some(vec![EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: "s".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let got = fetch(&ObjectManager::default(), &pod, &c).await;
        assert!(got.config_maps.is_empty());
        assert!(matches!(
            got.secrets.get("s"),
            Some(Err(ObjectError::NoApiServer { .. }))
        ));
        assert!(got.services.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_missing_reference_leaves_the_container_waiting_with_its_message() {
        use crate::cri::fake::FakeRuntime;
        use k8s_openapi::api::core::v1::{ConfigMapKeySelector, EnvVar, EnvVarSource, PodSpec};
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let rm = crate::testutil::runtime_manager(&fake);
        let mut pod = Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("busybox:1.36".into()),
                    env: Some(vec![EnvVar {
                        name: "X".into(),
                        value_from: Some(EnvVarSource {
                            config_map_key_ref: Some(ConfigMapKeySelector {
                                name: "cfg".into(),
                                key: "k".into(),
                                optional: Some(true),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.uid = Some("uid-env".into());
        let rt = rm.pod_status("uid-env").await.unwrap();
        let r = rm.sync_pod(&pod, &rt, &Default::default()).await;
        let w = &r.waiting["app"];
        assert_eq!(w.reason, "CreateContainerConfigError");
        assert_eq!(
            w.message,
            "couldn't get configMap ns/cfg, no kubeClient defined"
        );
        assert!(r.requeue_after.is_some());
        assert!(!fake
            .calls()
            .iter()
            .any(|c| c.starts_with("CreateContainer")));
    }
}
