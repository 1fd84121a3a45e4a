//! `rest_client_requests_total{code,host,method}` for the kube-rs client
//! (component-base `metrics/prometheus/restclient`, fed by client-go's
//! request path upstream): a tower layer around the client's stack.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::{Request, Response};
use tower::{Layer, Service};

/// Counts each API request by status code, method and API server host.
/// `host` is the cluster URL's authority: kube-rs sets the base URI inside
/// its stack, below this layer.
#[derive(Clone)]
pub struct RestClientLayer {
    host: Arc<str>,
}

impl RestClientLayer {
    pub fn new(host: &str) -> Self {
        RestClientLayer { host: host.into() }
    }
}

impl<S> Layer<S> for RestClientLayer {
    type Service = RestClientMetrics<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RestClientMetrics {
            inner,
            host: self.host.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RestClientMetrics<S> {
    inner: S,
    host: Arc<str>,
}

impl<S, B, RB> Service<Request<B>> for RestClientMetrics<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let method = req.method().clone();
        let host = self.host.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            match &r {
                Ok(resp) => {
                    super::rest_client_request(resp.status().as_str(), method.as_str(), &host)
                }
                // client-go's label for a request that got no response.
                Err(_) => super::rest_client_request("<error>", method.as_str(), &host),
            }
            r
        })
    }
}
