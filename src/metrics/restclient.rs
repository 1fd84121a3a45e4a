//! client-go's request metrics for the kube-rs client (component-base
//! `metrics/prometheus/restclient`, fed by client-go's `rest/request.go`
//! upstream): a tower layer around the client's whole stack, which also
//! applies the client-side rate limit per request, as client-go's
//! `tryThrottle` does.
//!
//! What client-go records, and so this layer:
//! - `rest_client_requests_total{code,host,method}` for every request,
//!   watches included (`<error>` when no response came);
//! - for requests other than watches (`Request.Watch` skips the rest):
//!   the rate limiter's wait, the request's size (its known length, 0
//!   without a body), its latency from before the wait to the end of the
//!   response body (request() around Do's body read), and the response
//!   body's size when it was read through or had bytes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::http::{Method, Request, Response, Uri};
use hyper::body::{Body, Frame, SizeHint};
use tower::{Layer, Service};

use crate::apiclient::RateLimiter;

/// Counts and times each API request by method and API server host, after
/// waiting for the rate limiter when there is one. `host` is the cluster
/// URL's authority: kube-rs sets the base URI inside its stack, below this
/// layer.
#[derive(Clone)]
pub struct RestClientLayer {
    host: Arc<str>,
    limiter: Option<Arc<RateLimiter>>,
}

impl RestClientLayer {
    pub fn new(host: &str, limiter: Option<Arc<RateLimiter>>) -> Self {
        RestClientLayer {
            host: host.into(),
            limiter,
        }
    }
}

impl<S> Layer<S> for RestClientLayer {
    type Service = RestClientMetrics<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RestClientMetrics {
            inner,
            host: self.host.clone(),
            limiter: self.limiter.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RestClientMetrics<S> {
    inner: S,
    host: Arc<str>,
    limiter: Option<Arc<RateLimiter>>,
}

/// A watch (`?watch=true`): client-go neither throttles nor times it.
fn is_watch(uri: &Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch=True"))
    })
}

impl<S, B, RB> Service<Request<B>> for RestClientMetrics<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    B: Body,
{
    type Response = Response<MeteredBody<RB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let start = Instant::now();
        let method = req.method().clone();
        let watch = is_watch(req.uri());
        // Go knows a request's length when its body is bytes (0 without
        // one); a body of unknown length is not observed.
        let size = req.body().size_hint().exact();
        let host = self.host.clone();
        let limiter = self.limiter.clone().filter(|_| !watch);
        // The stack's futures are lazy: nothing is sent before the wait
        // below is over and the future is polled.
        let fut = self.inner.call(req);
        Box::pin(async move {
            if let Some(l) = limiter {
                let t = Instant::now();
                l.acquire().await;
                super::rest_client_rate_limiter_duration(method.as_str(), &host, t.elapsed());
            }
            let r = fut.await;
            if !watch {
                if let Some(n) = size {
                    super::rest_client_request_size(method.as_str(), &host, n);
                }
            }
            match r {
                Ok(resp) => {
                    super::rest_client_request(resp.status().as_str(), method.as_str(), &host);
                    let pending = (!watch).then_some(Pending {
                        start,
                        method,
                        host,
                    });
                    Ok(resp.map(|inner| MeteredBody {
                        inner,
                        bytes: 0,
                        pending,
                    }))
                }
                Err(e) => {
                    // client-go's label for a request that got no response.
                    super::rest_client_request("<error>", method.as_str(), &host);
                    if !watch {
                        super::rest_client_request_duration(
                            method.as_str(),
                            &host,
                            start.elapsed(),
                        );
                    }
                    Err(e)
                }
            }
        })
    }
}

struct Pending {
    start: Instant,
    method: Method,
    host: Arc<str>,
}

impl Pending {
    /// The request is over: its latency, and the response's size when the
    /// body was read through or brought bytes (Do's `result.err == nil ||
    /// len(result.body) > 0`).
    fn finish(self, bytes: u64, complete: bool) {
        let verb = self.method.as_str();
        super::rest_client_request_duration(verb, &self.host, self.start.elapsed());
        if complete || bytes > 0 {
            super::rest_client_response_size(verb, &self.host, bytes);
        }
    }
}

/// A response body that counts its bytes and finishes the request's
/// figures at its end (or when dropped before it).
pub struct MeteredBody<B> {
    inner: B,
    bytes: u64,
    pending: Option<Pending>,
}

impl<B> MeteredBody<B> {
    fn finish(&mut self, complete: bool) {
        if let Some(p) = self.pending.take() {
            p.finish(self.bytes, complete);
        }
    }
}

impl<B> Drop for MeteredBody<B> {
    fn drop(&mut self) {
        self.finish(false);
    }
}

impl<B> Body for MeteredBody<B>
where
    B: Body<Data = hyper::body::Bytes> + Unpin,
{
    type Data = hyper::body::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.bytes += d.len() as u64;
                }
            }
            Poll::Ready(None) => this.finish(true),
            Poll::Ready(Some(Err(_))) => this.finish(false),
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    fn count_of(text: &str, series: &str) -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as u64
    }

    fn scrape() -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &super::super::REGISTRY).unwrap();
        super::super::to_prometheus_text(&out)
    }

    #[test]
    fn watches_are_told_from_requests_by_their_query() {
        let u = |s: &str| s.parse::<Uri>().unwrap();
        assert!(is_watch(&u("/api/v1/pods?fieldSelector=x&watch=true")));
        assert!(is_watch(&u("/api/v1/pods?watch=1")));
        assert!(!is_watch(&u("/api/v1/pods?watch=false")));
        assert!(!is_watch(&u("/api/v1/namespaces/a/pods/b")));
        assert!(!is_watch(&u("/api/v1/pods?allowWatchBookmarks=true")));
    }

    /// A request is timed to the end of its body with its sizes; a watch
    /// only counted, as client-go's Watch records no latency or size.
    #[tokio::test]
    async fn requests_are_timed_to_their_bodys_end_and_watches_only_counted() {
        let host = "rc-test.invalid:6443";
        let svc = tower::service_fn(|req: Request<Full<hyper::body::Bytes>>| async move {
            let body = if req.method() == Method::POST {
                "x".repeat(300)
            } else {
                String::new()
            };
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(hyper::body::Bytes::from(
                body,
            ))))
        });
        let limiter = Arc::new(RateLimiter::new(50, 100));
        let mut s = RestClientLayer::new(host, Some(limiter)).layer(svc);
        let series =
            |family: &str, verb: &str| format!("{family}{{host=\"{host}\",verb=\"{verb}\"}}");
        let before = scrape();
        assert_eq!(
            count_of(
                &before,
                &series("rest_client_request_duration_seconds_count", "POST")
            ),
            0
        );

        let post = Request::post("/api/v1/namespaces/a/events")
            .body(Full::new(hyper::body::Bytes::from(vec![b'{'; 100])))
            .unwrap();
        let resp = s.call(post).await.unwrap();
        // Not over until the body is read.
        assert_eq!(
            count_of(
                &scrape(),
                &series("rest_client_request_duration_seconds_count", "POST")
            ),
            0
        );
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), 300);
        let text = scrape();
        assert_eq!(
            count_of(
                &text,
                &series("rest_client_request_duration_seconds_count", "POST")
            ),
            1
        );
        assert_eq!(
            count_of(&text, &series("rest_client_request_size_bytes_sum", "POST")),
            100
        );
        assert_eq!(
            count_of(
                &text,
                &series("rest_client_response_size_bytes_sum", "POST")
            ),
            300
        );
        assert_eq!(
            count_of(
                &text,
                &series("rest_client_rate_limiter_duration_seconds_count", "POST")
            ),
            1
        );

        let watch = Request::get("/api/v1/pods?watch=true&resourceVersion=1")
            .body(Full::new(hyper::body::Bytes::new()))
            .unwrap();
        let resp = s.call(watch).await.unwrap();
        drop(resp.into_body().collect().await.unwrap());
        let get = Request::get("/api/v1/nodes/n")
            .body(Full::new(hyper::body::Bytes::new()))
            .unwrap();
        let resp = s.call(get).await.unwrap();
        drop(resp.into_body().collect().await.unwrap());
        let text = scrape();
        // Both counted by code; only the GET timed, sized 0 both ways.
        assert_eq!(
            count_of(
                &text,
                &format!(
                    "rest_client_requests_total{{code=\"200\",host=\"{host}\",method=\"GET\"}}"
                )
            ),
            2
        );
        assert_eq!(
            count_of(
                &text,
                &series("rest_client_request_duration_seconds_count", "GET")
            ),
            1
        );
        assert_eq!(
            count_of(
                &text,
                &series("rest_client_request_size_bytes_count", "GET")
            ),
            1
        );
        assert_eq!(
            count_of(
                &text,
                &series("rest_client_response_size_bytes_count", "GET")
            ),
            1
        );
        assert_eq!(
            count_of(
                &text,
                &series("rest_client_rate_limiter_duration_seconds_count", "GET")
            ),
            1
        );
    }

    /// The limiter's tokens are taken per request, watches excepted.
    #[tokio::test(start_paused = true)]
    async fn the_rate_limit_applies_per_request_and_not_to_watches() {
        let svc = tower::service_fn(|_req: Request<Full<hyper::body::Bytes>>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(hyper::body::Bytes::new())))
        });
        let limiter = Arc::new(RateLimiter::exact(1.0, 1));
        let mut s = RestClientLayer::new("rl-test.invalid", Some(limiter.clone())).layer(svc);
        let req = |uri: &str| {
            Request::get(uri)
                .body(Full::new(hyper::body::Bytes::new()))
                .unwrap()
        };
        for _ in 0..3 {
            s.call(req("/api/v1/pods?watch=true")).await.unwrap();
        }
        assert!(limiter.try_accept(), "watches took no token");
        let t0 = tokio::time::Instant::now();
        s.call(req("/api/v1/nodes/n")).await.unwrap();
        assert_eq!(
            t0.elapsed(),
            std::time::Duration::from_secs(1),
            "waited for the next token"
        );
    }
}
