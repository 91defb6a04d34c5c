//! client-go's `rest_client_requests_total{code,host,method}`: every request a client sent to the
//! apiserver, each retry included, by the answer's status code (`<error>` when none came), the
//! apiserver's `host:port` and the HTTP method. All three labels are bounded: one apiserver, a
//! handful of methods and codes.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};
use tower::{Layer, Service};

/// Labels of `rest_client_requests_total`, in client-go's (sorted) order.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The status code, or `<error>` when the request got no answer.
    pub code: String,
    /// The apiserver, as `host:port`.
    pub host: String,
    /// `GET`, `POST`, `PUT`, `PATCH`, `DELETE`.
    pub method: String,
}

/// The requests a client sent, by answer.
#[derive(Clone, Debug, Default)]
pub struct RestClientMetrics {
    requests: Family<RequestLabels, Counter>,
}

impl RestClientMetrics {
    /// Creates the family and registers it into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let this = Self::default();
        registry.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            this.requests.clone(),
        );
        this
    }

    /// The layer that counts the requests of a client talking to `host`.
    pub fn layer(&self, host: String) -> CountRequests {
        CountRequests {
            metrics: self.clone(),
            host,
        }
    }

    /// Counts one request to `host` with `method`, answered `code`.
    pub fn count(&self, code: String, host: &str, method: String) {
        self.requests
            .get_or_create(&RequestLabels {
                code,
                host: host.to_owned(),
                method,
            })
            .inc();
    }
}

/// Counts each request that passes, once its answer (or its failure) is known.
#[derive(Clone, Debug)]
pub struct CountRequests {
    metrics: RestClientMetrics,
    host: String,
}

impl<S> Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Counted {
            inner,
            counter: self.clone(),
        }
    }
}

/// A service whose requests are counted.
#[derive(Clone, Debug)]
pub struct Counted<S> {
    inner: S,
    counter: CountRequests,
}

impl<S, B, R> Service<http::Request<B>> for Counted<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.method().as_str().to_owned();
        let counter = self.counter.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let result = answer.await;
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            counter.metrics.count(code, &counter.host, method);
            result
        })
    }
}
