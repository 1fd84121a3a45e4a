//! Container lifecycle hooks, postStart and preStop, with the exec, httpGet
//! and sleep handlers (upstream `pkg/kubelet/lifecycle/handlers.go`).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler};

use crate::prober::{http_probe, HttpTarget, Outcome};

use crate::cri::RuntimeService;

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("command {command:?} exited with {code}: {output}")]
    Exec {
        command: Vec<String>,
        code: i32,
        output: String,
    },
    #[error("exec failed: {0}")]
    Runtime(#[from] crate::cri::CriError),
    #[error("http lifecycle hook ({url}) for Container \"{container}\" failed: {reason}")]
    Http {
        url: String,
        container: String,
        reason: String,
    },
    #[error("hook timed out after {0:?}")]
    Timeout(Duration),
    #[error("invalid hook: {0}")]
    Invalid(String),
}

/// Runs one handler against a running container, bounded by `timeout`.
pub async fn run_handler(
    runtime: &dyn RuntimeService,
    h: &LifecycleHandler,
    container_id: &str,
    c: &Container,
    pod_ip: &str,
    timeout: Duration,
) -> Result<(), HookError> {
    let work = async {
        if let Some(exec) = &h.exec {
            let command = exec.command.clone().unwrap_or_default();
            let r = runtime
                .exec_sync(container_id, command.clone(), timeout.as_secs() as i64)
                .await?;
            if r.exit_code != 0 {
                let mut output = String::from_utf8_lossy(&r.stdout).into_owned();
                output.push_str(&String::from_utf8_lossy(&r.stderr));
                return Err(HookError::Exec {
                    command,
                    code: r.exit_code,
                    output,
                });
            }
            return Ok(());
        }
        if let Some(http) = &h.http_get {
            // The prober's client: same ports, headers, redirects and TLS.
            let mut target =
                HttpTarget::from_action(http, c, pod_ip).map_err(HookError::Invalid)?;
            for (k, v) in target.headers.iter_mut() {
                if k == "User-Agent" && v.starts_with("kube-probe/") {
                    *v = "kube-lifecycle/1.34".into();
                }
            }
            let fail = |reason: String| HookError::Http {
                url: target.url.to_string(),
                container: c.name.clone(),
                reason,
            };
            return match http_probe(&target, timeout).await {
                Ok(Outcome::Success(_) | Outcome::Warning(_)) => Ok(()),
                Ok(Outcome::Failure(reason)) | Err(reason) => Err(fail(reason)),
            };
        }
        if let Some(sleep) = &h.sleep {
            tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64)).await;
            return Ok(());
        }
        Err(HookError::Invalid("no handler set".into()))
    };
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| {
            if h.sleep.is_some() {
                crate::metrics::sleep_action_terminated_early();
            }
            Err(HookError::Timeout(timeout))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::fake::FakeRuntime;
    use k8s_openapi::api::core::v1::{ExecAction, SleepAction};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn exec_hook_succeeds_or_reports_exit_code() {
        let fake = FakeRuntime::new();
        let h = LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(vec!["true".into()]),
            }),
            ..Default::default()
        };
        let c = Container::default();
        assert!(run_handler(&fake, &h, "c1", &c, "", Duration::from_secs(5))
            .await
            .is_ok());
        fake.set_exec_result("c1", 7);
        let e = run_handler(&fake, &h, "c1", &c, "", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(e, HookError::Exec { code: 7, .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_hook_is_cut_by_the_timeout() {
        let fake = FakeRuntime::new();
        let h = LifecycleHandler {
            sleep: Some(SleepAction { seconds: 100 }),
            ..Default::default()
        };
        let cut = &crate::metrics::METRICS.rare.sleep_action_terminated_early;
        let before = cut.get();
        let e = run_handler(
            &fake,
            &h,
            "c1",
            &Container::default(),
            "",
            Duration::from_secs(3),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, HookError::Timeout(_)));
        // kubelet_sleep_action_terminated_early_total (counters only grow,
        // whatever other tests do meanwhile).
        assert!(cut.get() > before);
    }

    #[tokio::test]
    async fn http_hook_succeeds_on_2xx_and_fails_otherwise() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            for status in ["200 OK", "500 Internal Server Error"] {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        let h = LifecycleHandler {
            http_get: Some(k8s_openapi::api::core::v1::HTTPGetAction {
                port: IntOrString::Int(port as i32),
                path: Some("/hook".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = Container::default();
        assert!(run_handler(
            &FakeRuntime::new(),
            &h,
            "c",
            &c,
            "127.0.0.1",
            Duration::from_secs(5)
        )
        .await
        .is_ok());
        assert!(run_handler(
            &FakeRuntime::new(),
            &h,
            "c",
            &c,
            "127.0.0.1",
            Duration::from_secs(5)
        )
        .await
        .is_err());
    }
}
