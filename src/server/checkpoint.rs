//! `POST /checkpoint/{namespace}/{pod}/{container}`: upstream's checkpoint
//! handler (`pkg/kubelet/server/server.go`, installed with the default
//! handlers while the ContainerCheckpoint gate is on, beta and on by
//! default since 1.30) and `Kubelet.CheckpointContainer`. The runtime
//! writes the running container's checkpoint to
//! `<root-dir>/checkpoints/checkpoint-<name>_<namespace>-<container>-<time>.tar`
//! (the time in RFC 3339), and the answer names it:
//! `{"items":["<path>"]}`. containerd 1.7 does not implement the call, so
//! there the answer is upstream's 500 with the runtime's error.

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::streaming::{find_container, find_pod, StreamError};
use super::ServerState;
use crate::cri::{v1, CriError};

/// The directory under the root directory that upstream makes (0700) at
/// start while the gate is on.
pub const CHECKPOINTS_DIR: &str = "checkpoints";

/// go-restful's `WriteError`: the message as the body, no newline.
fn error(code: StatusCode, msg: String) -> Response {
    (code, msg).into_response()
}

/// A CRI error as Go's gRPC client prints it.
fn go_grpc(e: &CriError) -> String {
    match e {
        CriError::NotFound { message, .. } => {
            format!("rpc error: code = NotFound desc = {message}")
        }
        CriError::DeadlineExceeded { .. } => {
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded".into()
        }
        CriError::Unavailable { message, .. } => {
            format!("rpc error: code = Unavailable desc = {message}")
        }
        CriError::Status { code, message, .. } => {
            format!("rpc error: code = {code:?} desc = {message}")
        }
        other => other.to_string(),
    }
}

/// The checkpoint's file name, as `Kubelet.CheckpointContainer` makes it
/// (`time.Now().Format(time.RFC3339)`: local time, `Z` for UTC).
fn file_name(pod_full_name: &str, container: &str, now: &k8s_openapi::jiff::Zoned) -> String {
    let offset = now.offset();
    let zone = if offset.seconds() == 0 {
        "Z".to_string()
    } else {
        now.strftime("%:z").to_string()
    };
    format!(
        "checkpoint-{pod_full_name}-{container}-{}{zone}.tar",
        now.strftime("%Y-%m-%dT%H:%M:%S")
    )
}

pub async fn checkpoint(
    State(s): State<ServerState>,
    Path((namespace, name, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let Ok(pod) = find_pod(&s, &namespace, &name) else {
        return error(StatusCode::NOT_FOUND, "pod does not exist".into());
    };
    let in_spec = pod.spec.as_ref().is_some_and(|spec| {
        spec.containers.iter().any(|c| c.name == container)
            || spec
                .init_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
            || spec
                .ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
    });
    if !in_spec {
        return error(
            StatusCode::NOT_FOUND,
            format!("container {container} does not exist"),
        );
    }
    // The last `timeout` given, in seconds (upstream answers a bad one
    // with a 404).
    let mut timeout = 0i64;
    let pairs = url::form_urlencoded::parse(query.as_deref().unwrap_or_default().as_bytes());
    if let Some(last) = pairs.filter(|(k, _)| k == "timeout").last() {
        match last.1.parse() {
            Ok(t) => timeout = t,
            Err(_) => {
                return error(
                    StatusCode::NOT_FOUND,
                    "cannot parse value of timeout parameter".into(),
                )
            }
        }
    }
    let failed = |why: String| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("checkpointing of {namespace}/{name}/{container} failed ({why})"),
        )
    };
    if timeout < 0 {
        return failed("CheckpointContainer requires the timeout value to be > 0".into());
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let id = match find_container(&*s.runtime, &uid, &container).await {
        Ok(id) => id,
        Err(StreamError::ContainerNotFound(_)) => {
            return failed(format!("container {container} not found"))
        }
        Err(StreamError::Cri(e)) => return failed(go_grpc(&e)),
        Err(e) => return failed(e.to_string()),
    };
    let pod_full_name = format!("{name}_{namespace}");
    let location = s
        .root_dir
        .join(CHECKPOINTS_DIR)
        .join(file_name(
            &pod_full_name,
            &container,
            &k8s_openapi::jiff::Zoned::now(),
        ))
        .display()
        .to_string();
    let req = v1::CheckpointContainerRequest {
        container_id: id,
        location: location.clone(),
        timeout,
    };
    if let Err(e) = s.runtime.checkpoint_container(req).await {
        tracing::warn!(pod = %pod_full_name, %container, error = %e, "CheckpointContainer from runtime service failed");
        return failed(go_grpc(&e));
    }
    let body = serde_json::json!({ "items": [location] }).to_string();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header;

    #[test]
    fn file_names_carry_the_pod_container_and_rfc3339_time() {
        use k8s_openapi::jiff::tz::{Offset, TimeZone};
        let at: k8s_openapi::jiff::Timestamp = "2026-11-25T02:10:05Z".parse().unwrap();
        let utc = at.to_zoned(TimeZone::UTC);
        let cet = at.to_zoned(TimeZone::fixed(Offset::constant(1)));
        assert_eq!(
            file_name("web_ns", "app", &utc),
            "checkpoint-web_ns-app-2026-11-25T02:10:05Z.tar"
        );
        assert_eq!(
            file_name("web_ns", "app", &cet),
            "checkpoint-web_ns-app-2026-11-25T03:10:05+01:00.tar"
        );
    }

    /// The handler's answers, as upstream's: the runtime asked with the
    /// running container, the path under the root directory and the
    /// timeout; 404s for an unknown pod or container and a bad timeout; a
    /// 500 naming the container when it is not running.
    #[tokio::test]
    async fn a_running_container_is_checkpointed_under_the_root_directory() {
        use crate::cri::fake::FakeRuntime;
        use std::sync::Arc;
        use tower::ServiceExt;
        let fake = Arc::new(FakeRuntime::new());
        let (_, cid) = fake.run_labelled("ns", "web", "u1", "app").await;
        let (state, token) = ServerState::for_tests(fake.clone());
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "app"}, {"name": "idle"}],
                     "initContainers": [{"name": "setup"}]}
        }))
        .unwrap();
        state.pods.upsert(pod);
        let root = state.root_dir.clone();
        let router = super::super::default_routes().with_state(state);
        let post = |path: &str| {
            let req = axum::http::Request::post(path)
                .body(axum::body::Body::empty())
                .unwrap();
            let router = router.clone();
            async move {
                let resp = router.oneshot(req).await.unwrap();
                let code = resp.status();
                let ct = resp.headers().get(header::CONTENT_TYPE).cloned();
                let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
                    .await
                    .unwrap();
                (code, ct, String::from_utf8_lossy(&body).into_owned())
            }
        };
        let (code, ct, body) = post("/checkpoint/ns/web/app?timeout=5&timeout=30").await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert_eq!(ct.unwrap(), "application/json");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let path = v["items"][0].as_str().unwrap().to_string();
        let dir = root.join("checkpoints").display().to_string();
        assert!(
            path.starts_with(&format!("{dir}/checkpoint-web_ns-app-")),
            "{path}"
        );
        assert!(path.ends_with(".tar"), "{path}");
        assert!(
            fake.calls()
                .contains(&format!("CheckpointContainer {cid} {path} 30")),
            "{:?}",
            fake.calls()
        );
        for (path, want) in [
            ("/checkpoint/ns/nope/app", "pod does not exist"),
            ("/checkpoint/other/web/app", "pod does not exist"),
            ("/checkpoint/ns/web/nope", "container nope does not exist"),
            (
                "/checkpoint/ns/web/app?timeout=soon",
                "cannot parse value of timeout parameter",
            ),
        ] {
            let (code, _, body) = post(path).await;
            assert_eq!(
                (code, body.as_str()),
                (StatusCode::NOT_FOUND, want),
                "{path}"
            );
        }
        // In the spec but not running (an init container done, a container
        // not started).
        let (code, _, body) = post("/checkpoint/ns/web/setup").await;
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            body,
            "checkpointing of ns/web/setup failed (container setup not found)"
        );
        token.cancel();
    }
}
