//! The CRI client over gRPC on a Unix socket (upstream `cri/remote`). Every
//! call carries a deadline (runtimeRequestTimeout); the channel connects
//! lazily and reconnects on the next call after containerd restarts.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::v1::runtime_service_client::RuntimeServiceClient;
use super::v1::{self, image_service_client::ImageServiceClient};
use super::*;

/// Upstream caps CRI messages at 16 MiB (`maxMsgSize` in cri/remote).
const MAX_MSG_SIZE: usize = 16 * 1024 * 1024;

/// Image pulls can legitimately take much longer than other calls.
const PULL_TIMEOUT: Duration = Duration::from_secs(30 * 60);

#[derive(Clone)]
pub struct RemoteRuntime {
    /// For calls decoded as lean messages (`relist`).
    channel: Channel,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    timeout: Duration,
}

/// Turns `unix:///run/containerd/containerd.sock` (or a bare path) into a path.
pub fn socket_path(endpoint: &str) -> CriResult<PathBuf> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if !path.starts_with('/') {
        return Err(CriError::Endpoint {
            endpoint: endpoint.to_string(),
            reason: "only unix socket endpoints are supported".into(),
        });
    }
    Ok(PathBuf::from(path))
}

/// A channel to the unix socket of `endpoint` that connects at its first
/// call.
fn lazy_channel(endpoint: &str) -> CriResult<Channel> {
    let path = socket_path(endpoint)?;
    // The URI is a placeholder: the connector below ignores it.
    Ok(Endpoint::from_static("http://[::]:0")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        })))
}

impl RemoteRuntime {
    /// Builds a lazily-connecting client; no I/O happens until the first call.
    pub fn connect_lazy(endpoint: &str, timeout: Duration) -> CriResult<Self> {
        let channel = lazy_channel(endpoint)?;
        let runtime = RuntimeServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MSG_SIZE)
            .max_encoding_message_size(MAX_MSG_SIZE);
        let images = ImageServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MSG_SIZE)
            .max_encoding_message_size(MAX_MSG_SIZE);
        Ok(RemoteRuntime {
            channel,
            runtime,
            images,
            timeout,
        })
    }

    /// The ImageService on its own endpoint (`imageServiceEndpoint`;
    /// upstream uses the runtime's when it is empty).
    pub fn with_image_endpoint(mut self, endpoint: &str) -> CriResult<Self> {
        if !endpoint.is_empty() {
            self.images = ImageServiceClient::new(lazy_channel(endpoint)?)
                .max_decoding_message_size(MAX_MSG_SIZE)
                .max_encoding_message_size(MAX_MSG_SIZE);
        }
        Ok(self)
    }

    /// A unary RuntimeService call, as the generated client makes it, whose
    /// answer is decoded as `Resp`: a lean view of the generated message
    /// (see `relist`).
    async fn lean<Req, Resp>(
        &self,
        method: &'static str,
        path: &'static str,
        req: Req,
    ) -> Result<tonic::Response<Resp>, tonic::Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone())
            .max_decoding_message_size(MAX_MSG_SIZE)
            .max_encoding_message_size(MAX_MSG_SIZE);
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
        let mut req = tonic::Request::new(req);
        req.extensions_mut()
            .insert(tonic::GrpcMethod::new("runtime.v1.RuntimeService", method));
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
        let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
        grpc.unary(req, path, codec).await
    }

    async fn call<T, F>(&self, op: &'static str, timeout: Duration, fut: F) -> CriResult<T>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let start = tokio::time::Instant::now();
        let r = match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) => Err(CriError::from_status(op, status)),
            Err(_) => Err(CriError::DeadlineExceeded { op }),
        };
        crate::metrics::runtime_operation(op, start.elapsed(), r.is_ok());
        r
    }
}

#[async_trait]
impl RuntimeService for RemoteRuntime {
    async fn version(&self) -> CriResult<v1::VersionResponse> {
        let mut c = self.runtime.clone();
        let req = v1::VersionRequest {
            version: "v1".into(),
        };
        self.call("Version", self.timeout, c.version(req)).await
    }

    async fn status(&self) -> CriResult<v1::StatusResponse> {
        let mut c = self.runtime.clone();
        let req = v1::StatusRequest { verbose: false };
        self.call("Status", self.timeout, c.status(req)).await
    }

    async fn runtime_config(&self) -> CriResult<Option<v1::CgroupDriver>> {
        let mut c = self.runtime.clone();
        let r = self
            .call(
                "RuntimeConfig",
                self.timeout,
                c.runtime_config(v1::RuntimeConfigRequest {}),
            )
            .await?;
        let Some(linux) = r.linux else {
            return Ok(None);
        };
        v1::CgroupDriver::try_from(linux.cgroup_driver)
            .map(Some)
            .map_err(|_| CriError::Status {
                op: "RuntimeConfig",
                code: tonic::Code::Internal,
                message: format!(
                    "runtime returned an unknown cgroup driver {}",
                    linux.cgroup_driver
                ),
            })
    }

    async fn update_runtime_config(&self, pod_cidr: &str) -> CriResult<()> {
        let mut c = self.runtime.clone();
        let req = v1::UpdateRuntimeConfigRequest {
            runtime_config: Some(v1::RuntimeConfig {
                network_config: Some(v1::NetworkConfig {
                    pod_cidr: pod_cidr.to_string(),
                }),
            }),
        };
        self.call(
            "UpdateRuntimeConfig",
            self.timeout,
            c.update_runtime_config(req),
        )
        .await
        .map(|_| ())
    }

    async fn run_pod_sandbox(
        &self,
        config: PodSandboxConfig,
        handler: String,
    ) -> CriResult<String> {
        let mut c = self.runtime.clone();
        let req = v1::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: handler.clone(),
        };
        let start = tokio::time::Instant::now();
        // Upstream doubles the deadline for sandbox creation (network setup).
        let r = self
            .call("RunPodSandbox", self.timeout * 2, c.run_pod_sandbox(req))
            .await;
        crate::metrics::run_podsandbox(&handler, start.elapsed(), r.is_ok());
        let r = r?;
        Ok(r.pod_sandbox_id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> CriResult<()> {
        let mut c = self.runtime.clone();
        let req = v1::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call("StopPodSandbox", self.timeout, c.stop_pod_sandbox(req))
            .await
            .map(drop)
    }

    async fn remove_pod_sandbox(&self, id: &str) -> CriResult<()> {
        let mut c = self.runtime.clone();
        let req = v1::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call("RemovePodSandbox", self.timeout, c.remove_pod_sandbox(req))
            .await
            .map(drop)
    }

    async fn pod_sandbox_status(&self, id: &str) -> CriResult<PodSandboxStatus> {
        let mut c = self.runtime.clone();
        let req = v1::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        };
        let r = self
            .call("PodSandboxStatus", self.timeout, c.pod_sandbox_status(req))
            .await?;
        r.status.ok_or(CriError::NotFound {
            op: "PodSandboxStatus",
            message: id.into(),
        })
    }

    async fn list_pod_sandbox(
        &self,
        filter: Option<PodSandboxFilter>,
    ) -> CriResult<Vec<PodSandbox>> {
        let mut c = self.runtime.clone();
        let req = v1::ListPodSandboxRequest { filter };
        Ok(self
            .call("ListPodSandbox", self.timeout, c.list_pod_sandbox(req))
            .await?
            .items)
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: ContainerConfig,
        sandbox_config: PodSandboxConfig,
    ) -> CriResult<String> {
        let mut c = self.runtime.clone();
        let req = v1::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        Ok(self
            .call("CreateContainer", self.timeout, c.create_container(req))
            .await?
            .container_id)
    }

    async fn start_container(&self, id: &str) -> CriResult<()> {
        let mut c = self.runtime.clone();
        let req = v1::StartContainerRequest {
            container_id: id.into(),
        };
        self.call("StartContainer", self.timeout, c.start_container(req))
            .await
            .map(drop)
    }

    async fn stop_container(&self, id: &str, timeout: i64) -> CriResult<()> {
        let mut c = self.runtime.clone();
        let req = v1::StopContainerRequest {
            container_id: id.into(),
            timeout,
        };
        // The runtime waits up to `timeout` seconds before SIGKILL, so the
        // deadline must cover the grace period (upstream adds it too).
        let deadline = self.timeout + Duration::from_secs(timeout.max(0) as u64);
        self.call("StopContainer", deadline, c.stop_container(req))
            .await
            .map(drop)
    }

    async fn update_container_resources(
        &self,
        id: &str,
        linux: v1::LinuxContainerResources,
    ) -> CriResult<()> {
        let mut c = self.runtime.clone();
        let req = v1::UpdateContainerResourcesRequest {
            container_id: id.into(),
            linux: Some(linux),
            ..Default::default()
        };
        self.call(
            "UpdateContainerResources",
            self.timeout,
            c.update_container_resources(req),
        )
        .await
        .map(drop)
    }

    async fn remove_container(&self, id: &str) -> CriResult<()> {
        let mut c = self.runtime.clone();
        let req = v1::RemoveContainerRequest {
            container_id: id.into(),
        };
        self.call("RemoveContainer", self.timeout, c.remove_container(req))
            .await
            .map(drop)
    }

    async fn list_containers(&self, filter: Option<ContainerFilter>) -> CriResult<Vec<Container>> {
        let mut c = self.runtime.clone();
        let req = v1::ListContainersRequest { filter };
        Ok(self
            .call("ListContainers", self.timeout, c.list_containers(req))
            .await?
            .containers)
    }

    async fn relist(&self) -> CriResult<(Vec<relist::RelistItem>, Vec<relist::RelistItem>)> {
        let req = v1::ListPodSandboxRequest { filter: None };
        let sandboxes: relist::SandboxList = self
            .call(
                "ListPodSandbox",
                self.timeout,
                self.lean(
                    "ListPodSandbox",
                    "/runtime.v1.RuntimeService/ListPodSandbox",
                    req,
                ),
            )
            .await?;
        let req = v1::ListContainersRequest { filter: None };
        let containers: relist::ContainerList = self
            .call(
                "ListContainers",
                self.timeout,
                self.lean(
                    "ListContainers",
                    "/runtime.v1.RuntimeService/ListContainers",
                    req,
                ),
            )
            .await?;
        Ok((sandboxes.items, containers.items))
    }

    async fn container_status(&self, id: &str) -> CriResult<ContainerStatus> {
        let mut c = self.runtime.clone();
        let req = v1::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        let r = self
            .call("ContainerStatus", self.timeout, c.container_status(req))
            .await?;
        r.status.ok_or(CriError::NotFound {
            op: "ContainerStatus",
            message: id.into(),
        })
    }

    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout_secs: i64,
    ) -> CriResult<v1::ExecSyncResponse> {
        let mut c = self.runtime.clone();
        let req = v1::ExecSyncRequest {
            container_id: id.into(),
            cmd,
            timeout: timeout_secs,
        };
        // 0: no deadline at all, as upstream's client (the kubelet's /run
        // asks for none; the request ends when its client goes).
        let deadline = if timeout_secs <= 0 {
            Duration::MAX
        } else {
            self.timeout + Duration::from_secs(timeout_secs as u64)
        };
        self.call("ExecSync", deadline, c.exec_sync(req)).await
    }

    async fn container_events(
        &self,
        tx: tokio::sync::mpsc::Sender<v1::ContainerEventResponse>,
    ) -> CriResult<()> {
        let mut c = self.runtime.clone();
        // No deadline, on the stream or on opening it: containerd sends the
        // response headers with the first event, so on a quiet node the
        // open waits as long as the node stays quiet (upstream's client
        // opens it with no deadline either). With one, the open timed out
        // and the stream was dropped for the backoff, with a warning each
        // time.
        let start = tokio::time::Instant::now();
        let opened = c.get_container_events(v1::GetEventsRequest {}).await;
        crate::metrics::runtime_operation("GetContainerEvents", start.elapsed(), opened.is_ok());
        let mut stream = opened
            .map_err(|status| CriError::from_status("GetContainerEvents", status))?
            .into_inner();
        loop {
            match stream.message().await {
                Ok(Some(ev)) => {
                    if tx.send(ev).await.is_err() {
                        return Ok(());
                    }
                }
                Ok(None) => return Ok(()),
                Err(status) => return Err(CriError::from_status("GetContainerEvents", status)),
            }
        }
    }

    async fn exec(&self, req: v1::ExecRequest) -> CriResult<String> {
        let mut c = self.runtime.clone();
        Ok(self.call("Exec", self.timeout, c.exec(req)).await?.url)
    }

    async fn attach(&self, req: v1::AttachRequest) -> CriResult<String> {
        let mut c = self.runtime.clone();
        Ok(self.call("Attach", self.timeout, c.attach(req)).await?.url)
    }

    async fn port_forward(&self, req: v1::PortForwardRequest) -> CriResult<String> {
        let mut c = self.runtime.clone();
        Ok(self
            .call("PortForward", self.timeout, c.port_forward(req))
            .await?
            .url)
    }

    async fn list_container_stats(
        &self,
        filter: Option<v1::ContainerStatsFilter>,
    ) -> CriResult<Vec<v1::ContainerStats>> {
        let mut c = self.runtime.clone();
        let req = v1::ListContainerStatsRequest { filter };
        Ok(self
            .call(
                "ListContainerStats",
                self.timeout,
                c.list_container_stats(req),
            )
            .await?
            .stats)
    }

    async fn list_pod_sandbox_stats(
        &self,
        filter: Option<v1::PodSandboxStatsFilter>,
    ) -> CriResult<Vec<v1::PodSandboxStats>> {
        let mut c = self.runtime.clone();
        let req = v1::ListPodSandboxStatsRequest { filter };
        Ok(self
            .call(
                "ListPodSandboxStats",
                self.timeout,
                c.list_pod_sandbox_stats(req),
            )
            .await?
            .stats)
    }

    async fn reopen_container_log(&self, id: &str) -> CriResult<()> {
        let mut c = self.runtime.clone();
        let req = v1::ReopenContainerLogRequest {
            container_id: id.into(),
        };
        self.call(
            "ReopenContainerLog",
            self.timeout,
            c.reopen_container_log(req),
        )
        .await
        .map(|_| ())
    }

    async fn checkpoint_container(&self, mut req: v1::CheckpointContainerRequest) -> CriResult<()> {
        // Upstream's remote runtime: a timeout above the CRI default is
        // the caller's; anything less becomes the default, sent along.
        let default = self.timeout.as_secs() as i64;
        let timeout = if req.timeout > default {
            Duration::from_secs(req.timeout as u64)
        } else {
            req.timeout = default;
            self.timeout
        };
        let mut c = self.runtime.clone();
        self.call("CheckpointContainer", timeout, c.checkpoint_container(req))
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl ImageService for RemoteRuntime {
    async fn list_images(&self) -> CriResult<Vec<Image>> {
        let mut c = self.images.clone();
        let req = v1::ListImagesRequest { filter: None };
        Ok(self
            .call("ListImages", self.timeout, c.list_images(req))
            .await?
            .images)
    }

    async fn image_status(&self, image: &str) -> CriResult<Option<Image>> {
        let mut c = self.images.clone();
        let req = v1::ImageStatusRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        };
        Ok(self
            .call("ImageStatus", self.timeout, c.image_status(req))
            .await?
            .image)
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<v1::AuthConfig>,
        sandbox: Option<PodSandboxConfig>,
    ) -> CriResult<String> {
        let mut c = self.images.clone();
        let req = v1::PullImageRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            auth,
            sandbox_config: sandbox,
        };
        Ok(self
            .call("PullImage", PULL_TIMEOUT, c.pull_image(req))
            .await?
            .image_ref)
    }

    async fn remove_image(&self, image: &str) -> CriResult<()> {
        let mut c = self.images.clone();
        let req = v1::RemoveImageRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
        };
        self.call("RemoveImage", self.timeout, c.remove_image(req))
            .await
            .map(drop)
    }

    async fn image_fs_info(&self) -> CriResult<v1::ImageFsInfoResponse> {
        let mut c = self.images.clone();
        self.call(
            "ImageFsInfo",
            self.timeout,
            c.image_fs_info(v1::ImageFsInfoRequest {}),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gRPC server on `sock` that answers every call Unimplemented and
    /// records the paths it was asked for.
    fn recording_server(sock: &std::path::Path) -> std::sync::Arc<parking_lot::Mutex<Vec<String>>> {
        let listener = tokio::net::UnixListener::bind(sock).unwrap();
        let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let s2 = seen.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let seen = s2.clone();
                let svc = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    seen.lock().push(req.uri().path().to_string());
                    // A trailers-only answer: grpc-status 12, Unimplemented.
                    let resp = hyper::Response::builder()
                        .header("content-type", "application/grpc")
                        .header("grpc-status", "12")
                        .body(axum::body::Body::empty())
                        .unwrap();
                    async move { Ok::<_, std::convert::Infallible>(resp) }
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(TokioIo::new(s), svc),
                );
            }
        });
        seen
    }

    /// Old code: `imageServiceEndpoint` was accepted unread, so image calls
    /// went to the runtime's endpoint.
    #[tokio::test]
    async fn image_calls_go_to_the_image_service_endpoint_when_one_is_set() {
        let dir = std::env::temp_dir().join(format!("rk-cri-images-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (rsock, isock) = (dir.join("runtime.sock"), dir.join("images.sock"));
        let (runtime_seen, images_seen) = (recording_server(&rsock), recording_server(&isock));
        let endpoint = |p: &std::path::Path| format!("unix://{}", p.display());
        let rt = RemoteRuntime::connect_lazy(&endpoint(&rsock), Duration::from_secs(5))
            .unwrap()
            .with_image_endpoint(&endpoint(&isock))
            .unwrap();
        assert!(rt.list_images().await.is_err());
        assert!(rt.version().await.is_err());
        assert_eq!(
            images_seen.lock().clone(),
            ["/runtime.v1.ImageService/ListImages"]
        );
        assert_eq!(
            runtime_seen.lock().clone(),
            ["/runtime.v1.RuntimeService/Version"]
        );
        // Unset: the runtime's endpoint serves both, as upstream.
        let same = RemoteRuntime::connect_lazy(&endpoint(&rsock), Duration::from_secs(5))
            .unwrap()
            .with_image_endpoint("")
            .unwrap();
        assert!(same.image_fs_info().await.is_err());
        assert_eq!(
            runtime_seen.lock().last().map(String::as_str),
            Some("/runtime.v1.ImageService/ImageFsInfo")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A runtime that, like containerd, answers a GetContainerEvents call
    /// with nothing (no headers either) until an event happens.
    #[tokio::test]
    async fn opening_the_event_stream_waits_for_a_quiet_runtime_past_the_request_deadline() {
        let dir = std::env::temp_dir().join(format!("rk-cri-events-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("cri.sock");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let asked = std::sync::Arc::new(tokio::sync::Notify::new());
        let a = asked.clone();
        tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let svc = hyper::service::service_fn(move |_req| {
                a.notify_one();
                std::future::pending::<
                    Result<hyper::Response<axum::body::Body>, std::convert::Infallible>,
                >()
            });
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(TokioIo::new(s), svc)
                .await;
        });
        let rt = RemoteRuntime::connect_lazy(
            &format!("unix://{}", sock.display()),
            Duration::from_millis(100),
        )
        .unwrap();
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let call = tokio::spawn(async move { rt.container_events(tx).await });
        asked.notified().await;
        // Ten times the request deadline later, still waiting for an event.
        let r = tokio::time::timeout(Duration::from_secs(1), call).await;
        assert!(r.is_err(), "the stream ended: {r:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
