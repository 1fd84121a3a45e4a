//! Container lifecycle hooks, postStart and preStop, with the exec, httpGet
//! and sleep handlers (upstream `pkg/kubelet/lifecycle/handlers.go`).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

/// Resolves a named or numbered port against the container's ports.
pub fn resolve_port(port: &IntOrString, c: &Container) -> Option<u16> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).ok(),
        IntOrString::String(name) => name.parse().ok().or_else(|| {
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .and_then(|p| u16::try_from(p.container_port).ok())
        }),
    }
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
            let host = http
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| pod_ip.to_string());
            let port = resolve_port(&http.port, c)
                .ok_or_else(|| HookError::Invalid(format!("port {:?}", http.port)))?;
            let path = http
                .path
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "/".into());
            let url = format!("http://{host}:{port}{path}");
            let fail = |reason: String| HookError::Http {
                url: url.clone(),
                container: c.name.clone(),
                reason,
            };
            let mut s = tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|e| fail(e.to_string()))?;
            let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-lifecycle/1.34\r\nConnection: close\r\n");
            for hdr in http.http_headers.iter().flatten() {
                req.push_str(&format!("{}: {}\r\n", hdr.name, hdr.value));
            }
            req.push_str("\r\n");
            s.write_all(req.as_bytes())
                .await
                .map_err(|e| fail(e.to_string()))?;
            let mut head = vec![0u8; 512];
            let n = s.read(&mut head).await.map_err(|e| fail(e.to_string()))?;
            let line = String::from_utf8_lossy(&head[..n])
                .lines()
                .next()
                .unwrap_or_default()
                .to_string();
            let code: u16 = line
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            // Upstream treats any 2xx/3xx answer as success.
            return if (200..400).contains(&code) {
                Ok(())
            } else {
                Err(fail(format!("HTTP status {code}")))
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
        .unwrap_or(Err(HookError::Timeout(timeout)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::fake::FakeRuntime;
    use k8s_openapi::api::core::v1::{ExecAction, SleepAction};

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

    #[test]
    fn named_ports_resolve_against_the_container() {
        let c = Container {
            ports: Some(vec![k8s_openapi::api::core::v1::ContainerPort {
                name: Some("web".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(
            resolve_port(&IntOrString::String("web".into()), &c),
            Some(8080)
        );
        assert_eq!(resolve_port(&IntOrString::Int(81), &c), Some(81));
        assert_eq!(resolve_port(&IntOrString::String("nope".into()), &c), None);
    }
}
