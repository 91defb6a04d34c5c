//! The HTTP edge of admission: read a bounded body in bounded time, parse the AdmissionReview, call
//! [`review`], encode the answer, count it. Unreadable input gets an HTTP 4xx whose body is still a
//! well-formed AdmissionReview carrying the reason.

use crate::{
    cluster_view::ClusterView,
    error::RequestError,
    metrics::{CategoryLabels, Metrics, RequestLabels},
    review::{Endpoint, ReviewSettings, Verdict, operation_label, resource_label, review},
};
use axum::{
    Json, Router,
    body::Body,
    extract::State,
    response::{IntoResponse, Response},
    routing::post,
};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionResponse, AdmissionReview},
};
use std::{sync::Arc, time::Duration, time::Instant};

/// Largest accepted request body. An AdmissionReview holds the object and its old version; etcd
/// refuses objects over 1.5 MiB, so twice that plus framing is generous.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Most bytes of an oversized body read (and dropped) before it is answered; past this, or past the
/// body timeout, the answer goes out while the client is still sending.
const DISCARD_LIMIT_BYTES: usize = 8 * MAX_BODY_BYTES;
/// Longest wait for a request body (the apiserver's own timeout is a few seconds).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything a request handler needs.
pub struct App<C> {
    /// Review settings from the flags.
    pub settings: ReviewSettings,
    /// The cluster, for the source policy.
    pub cluster: C,
    /// Request metrics.
    pub metrics: Arc<Metrics>,
}

/// `POST /validate` and `POST /mutate`.
pub fn router<C: ClusterView>(app: Arc<App<C>>) -> Router {
    Router::new()
        .route("/validate", post(validate::<C>))
        .route("/mutate", post(mutate::<C>))
        .with_state(app)
}

async fn validate<C: ClusterView>(State(app): State<Arc<App<C>>>, body: Body) -> Response {
    handle(&app, Endpoint::Validate, body).await
}

async fn mutate<C: ClusterView>(State(app): State<Arc<App<C>>>, body: Body) -> Response {
    handle(&app, Endpoint::Mutate, body).await
}

async fn handle<C: ClusterView>(app: &App<C>, endpoint: Endpoint, body: Body) -> Response {
    let started = Instant::now();
    let (response, labels) = match read_request(body).await {
        Ok(request) => {
            let (answer, verdict) = review(endpoint, &app.settings, &app.cluster, &request).await;
            log_outcome(endpoint, &request, &answer, verdict);
            if let Verdict::Error(category) = verdict {
                app.metrics
                    .errors_total
                    .get_or_create(&CategoryLabels { category })
                    .inc();
            }
            let labels = RequestLabels {
                endpoint: endpoint.label(),
                resource: resource_label(&request),
                operation: operation_label(&request),
                verdict: verdict.label(),
            };
            (Json(answer.into_review()).into_response(), labels)
        }
        Err(error) => {
            tracing::warn!(endpoint = endpoint.label(), category = error.category(), error = %error, "unreadable admission request");
            app.metrics
                .errors_total
                .get_or_create(&CategoryLabels {
                    category: error.category(),
                })
                .inc();
            let body = Json(AdmissionResponse::invalid(&error).into_review());
            let labels = RequestLabels {
                endpoint: endpoint.label(),
                resource: "unknown",
                operation: "unknown",
                verdict: "bad_request",
            };
            ((error.status(), body).into_response(), labels)
        }
    };
    app.metrics.requests_total.get_or_create(&labels).inc();
    app.metrics
        .request_duration_seconds
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    response
}

async fn read_request(mut body: Body) -> Result<AdmissionRequest<DynamicObject>, RequestError> {
    let deadline = tokio::time::Instant::now() + BODY_TIMEOUT;
    let collected = tokio::time::timeout_at(deadline, Limited::new(&mut body, MAX_BODY_BYTES).collect())
        .await
        .map_err(|_| RequestError::Timeout(BODY_TIMEOUT))?;
    let collected = match collected {
        Ok(collected) => collected,
        Err(e) if e.is::<LengthLimitError>() => {
            // Answer only once the client has finished sending: over HTTP/2 an answer before the
            // end of the request comes with a reset of the stream, and some clients then drop the
            // answer and report only the reset.
            let _ = tokio::time::timeout_at(deadline, discard(&mut body, DISCARD_LIMIT_BYTES)).await;
            return Err(RequestError::TooLarge {
                limit: MAX_BODY_BYTES,
            });
        }
        Err(e) => return Err(RequestError::Body(e.to_string())),
    };
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(&collected.to_bytes()).map_err(RequestError::Malformed)?;
    if review.types.api_version != "admission.k8s.io/v1" || review.types.kind != "AdmissionReview" {
        return Err(RequestError::WrongType {
            api_version: review.types.api_version,
            kind: review.types.kind,
        });
    }
    review.try_into().map_err(|_| RequestError::NoRequest)
}

/// Reads and drops the rest of `body`, up to `limit` bytes.
async fn discard(body: &mut Body, limit: usize) {
    let mut read = 0;
    while read <= limit {
        match body.frame().await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, |data| data.len()),
            _ => return,
        }
    }
}

fn log_outcome(
    endpoint: Endpoint,
    request: &AdmissionRequest<DynamicObject>,
    answer: &AdmissionResponse,
    verdict: Verdict,
) {
    if verdict == Verdict::Allowed {
        tracing::debug!(endpoint = endpoint.label(), uid = %request.uid, namespace = ?request.namespace, name = %request.name, "admitted");
    } else {
        tracing::info!(
            endpoint = endpoint.label(),
            uid = %request.uid,
            namespace = ?request.namespace,
            name = %request.name,
            verdict = verdict.label(),
            message = %answer.result.message,
            "denied"
        );
    }
}
