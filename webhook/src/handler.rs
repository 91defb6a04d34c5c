//! The HTTP edge of admission: read a bounded body in bounded time, parse the AdmissionReview, call
//! [`review`], encode the answer, count it. Unreadable input gets an HTTP 4xx whose body is still a
//! well-formed AdmissionReview carrying the reason.

use crate::{
    cluster_view::ClusterView,
    error::RequestError,
    metrics::{CategoryLabels, EndpointLabels, Metrics, RequestLabels},
    review::{Endpoint, ReviewSettings, Verdict, operation_label, resource_label, review},
    server::Caller,
};
use axum::{
    Json, Router,
    body::Body,
    extract::{Request, State},
    http::{
        StatusCode,
        header::{CONTENT_LENGTH, RETRY_AFTER},
    },
    response::{IntoResponse, Response},
    routing::post,
};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionResponse, AdmissionReview},
    response::Status,
};
use std::{borrow::Cow, sync::Arc, time::Duration, time::Instant};

/// Largest accepted request body. An AdmissionReview holds the object and its old version; etcd
/// refuses objects over 1.5 MiB, so twice that plus framing is generous.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Most JSON values a body may hold. Parsed, each value costs tens of bytes however short its text
/// (`[0,0,...]` takes two bytes a value), so this, not the byte limit, bounds what parsing a body
/// costs: about 100,000 values of at most ~100 bytes each. An AdmissionReview of a Projection holds a
/// few hundred (its managedFields included).
pub const MAX_JSON_VALUES: usize = 100_000;
/// Most bytes of an oversized body read (and dropped) before it is answered; past this, or past the
/// body timeout, the answer goes out while the client is still sending.
const DISCARD_LIMIT_BYTES: usize = 8 * MAX_BODY_BYTES;
/// Default longest wait for a whole request body: the apiserver sends a review in one go, so a
/// client still sending after a few seconds is cut off rather than left to hold a stream.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(3);
/// Bodies announced at most this long are read before they take room in the in-flight limit
/// (an AdmissionReview of a Projection is a few KiB): a client that sends them slowly holds no
/// room. Their memory while being read is bounded by the connection cap, the HTTP/2 streams per
/// connection and this size (256 connections × 8 streams × 32 KiB = 64 MiB at the defaults).
pub const READ_FIRST_BODY_BYTES: u64 = 32 * 1024;

/// A review's weight in the in-flight limit grows by one per this many bytes of its body.
pub const WEIGHT_UNIT_BYTES: u64 = 256 * 1024;
/// The message of a review shed because the webhook is at its in-flight limit.
pub const OVERLOADED: &str = "webhook overloaded, retry";

/// Everything a request handler needs.
pub struct App<C> {
    /// Review settings from the flags.
    pub settings: ReviewSettings,
    /// The cluster, for the source policy.
    pub cluster: C,
    /// Request metrics.
    pub metrics: Arc<Metrics>,
    /// The reviews handled at once.
    pub in_flight: InFlightLimit,
    /// Longest wait for a whole request body.
    pub body_timeout: Duration,
}

/// How many reviews are handled at once, weighted by body size so the bodies buffered and parsed
/// at once stay bounded in bytes, not only in number (a review of a 4 MiB body holds that body and
/// its parsed form until it is answered). Reviews of large bodies (more than one unit) may hold at
/// most half of the units between them, so a flood of large bodies cannot take the room of the
/// small reviews an apiserver sends (a Projection is a few KiB). A small body
/// ([`READ_FIRST_BODY_BYTES`]) takes its unit once it has arrived whole, so slow senders hold none;
/// a larger one, or one of unknown length, takes its units before it is read, as its memory is
/// what the limit bounds, and counts as large whatever its weight. A review that finds no room is
/// answered at once with HTTP 429 (shed).
#[derive(Clone, Debug)]
pub struct InFlightLimit {
    all: Arc<tokio::sync::Semaphore>,
    large: Arc<tokio::sync::Semaphore>,
    total: u32,
    large_total: u32,
}

/// The room a review holds until it is answered.
#[derive(Debug)]
pub struct InFlightSlot {
    _all: tokio::sync::OwnedSemaphorePermit,
    _large: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl InFlightLimit {
    /// `total` units: that many small reviews at once, or fewer large ones (see [`review_weight`]).
    pub fn new(total: u32) -> Self {
        let total = total.max(1);
        let large_total = (total / 2).max(1);
        Self {
            all: Arc::new(tokio::sync::Semaphore::new(total as usize)),
            large: Arc::new(tokio::sync::Semaphore::new(large_total as usize)),
            total,
            large_total,
        }
    }

    /// Room for a review whose body announces (or, once read, has) `content_length` bytes, or
    /// `None` when there is none.
    fn try_enter(&self, content_length: Option<u64>) -> Option<InFlightSlot> {
        let weight = review_weight(content_length, self.total);
        let large = if !read_first(content_length) {
            Some(
                self.large
                    .clone()
                    .try_acquire_many_owned(weight.min(self.large_total))
                    .ok()?,
            )
        } else {
            None
        };
        let all = self.all.clone().try_acquire_many_owned(weight).ok()?;
        Some(InFlightSlot {
            _all: all,
            _large: large,
        })
    }
}

/// What a review counts against a limit of `total`: one, plus one per [`WEIGHT_UNIT_BYTES`] of its
/// announced body (a body without `Content-Length` may grow to [`MAX_BODY_BYTES`] and counts so);
/// never more than `total`, so a review of a large body is not refused for ever.
pub fn review_weight(content_length: Option<u64>, total: u32) -> u32 {
    let bytes = content_length.map_or(MAX_BODY_BYTES as u64, |l| l.min(MAX_BODY_BYTES as u64));
    let weight = 1 + bytes / WEIGHT_UNIT_BYTES;
    u32::try_from(weight).unwrap_or(u32::MAX).min(total.max(1))
}

/// Whether a body announced as `content_length` bytes is read before it takes room in the
/// in-flight limit: only a small one of known length.
pub fn read_first(content_length: Option<u64>) -> bool {
    content_length.is_some_and(|l| l <= READ_FIRST_BODY_BYTES)
}

/// `POST /validate` and `POST /mutate`.
pub fn router<C: ClusterView>(app: Arc<App<C>>) -> Router {
    Router::new()
        .route("/validate", post(validate::<C>))
        .route("/mutate", post(mutate::<C>))
        .with_state(app)
}

async fn validate<C: ClusterView>(State(app): State<Arc<App<C>>>, request: Request) -> Response {
    handle(&app, Endpoint::Validate, request).await
}

async fn mutate<C: ClusterView>(State(app): State<Arc<App<C>>>, request: Request) -> Response {
    handle(&app, Endpoint::Mutate, request).await
}

async fn handle<C: ClusterView>(app: &App<C>, endpoint: Endpoint, request: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    // Who the connection's TLS handshake proved the caller to be (the server sets it on every
    // request; a router called without the server keeps the settings' value).
    let caller = parts.extensions.get::<Caller>().copied();
    let content_length = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // Held until the answer is built: the body and its parsed form live that long. A small body
    // takes it once read whole, so a slow sender holds none; a large one before, for its memory.
    let early = if read_first(content_length) {
        None
    } else {
        let Some(slot) = app.in_flight.try_enter(content_length) else {
            return shed(app, endpoint);
        };
        Some(slot)
    };
    let read = match read_body(body, app.body_timeout).await {
        Ok(bytes) => {
            let slot = match early {
                Some(slot) => slot,
                None => match app.in_flight.try_enter(Some(bytes.len() as u64)) {
                    Some(slot) => slot,
                    None => return shed(app, endpoint),
                },
            };
            parse_request(&bytes).map(|request| (request, slot))
        }
        Err(e) => Err(e),
    };
    let (response, labels) = match read {
        Ok((request, _slot)) => {
            let settings = settings_for(&app.settings, caller);
            let (answer, verdict) = review(endpoint, &settings, &app.cluster, &request).await;
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

/// The settings for a request from `caller`: the app's, with whether the caller is authenticated
/// taken from its connection (copied only when that differs, which it does not when every
/// connection is alike, with or without `--client-ca-file`).
fn settings_for(settings: &ReviewSettings, caller: Option<Caller>) -> Cow<'_, ReviewSettings> {
    match caller {
        Some(caller) if caller.verified != settings.policy.caller_authenticated => {
            let mut copy = settings.clone();
            copy.policy.caller_authenticated = caller.verified;
            Cow::Owned(copy)
        }
        _ => Cow::Borrowed(settings),
    }
}

/// The answer to a review over the in-flight limit, sent without parsing its body (nor reading a
/// large one): HTTP 429 with `Retry-After`, and a well-formed AdmissionReview denying with code
/// 429 (its uid is empty: the body was not parsed).
fn shed<C>(app: &App<C>, endpoint: Endpoint) -> Response {
    app.metrics
        .shed_total
        .get_or_create(&EndpointLabels {
            endpoint: endpoint.label(),
        })
        .inc();
    tracing::debug!(
        endpoint = endpoint.label(),
        "in-flight limit reached; review shed"
    );
    let mut answer = AdmissionResponse::invalid(OVERLOADED);
    answer.result = Status::failure(OVERLOADED, "TooManyRequests").with_code(429);
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(RETRY_AFTER, "1")],
        Json(answer.into_review()),
    )
        .into_response()
}

/// The whole body, within `timeout` and [`MAX_BODY_BYTES`].
async fn read_body(mut body: Body, timeout: Duration) -> Result<axum::body::Bytes, RequestError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let collected = tokio::time::timeout_at(deadline, Limited::new(&mut body, MAX_BODY_BYTES).collect())
        .await
        .map_err(|_| RequestError::Timeout(timeout))?;
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
    Ok(collected.to_bytes())
}

/// The AdmissionReview's request in `bytes`, within [`MAX_JSON_VALUES`].
fn parse_request(bytes: &[u8]) -> Result<AdmissionRequest<DynamicObject>, RequestError> {
    if json_values_at_most(bytes) > MAX_JSON_VALUES {
        return Err(RequestError::TooComplex {
            limit: MAX_JSON_VALUES,
        });
    }
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(bytes).map_err(RequestError::Malformed)?;
    if review.types.api_version != "admission.k8s.io/v1" || review.types.kind != "AdmissionReview" {
        return Err(RequestError::WrongType {
            api_version: review.types.api_version,
            kind: review.types.kind,
        });
    }
    review.try_into().map_err(|_| RequestError::NoRequest)
}

/// An upper bound of the number of JSON values in `text`: one, plus one per `,`, `[` and `{`
/// outside strings (every value but the first follows one of them). Malformed text gets some
/// number; the parser refuses it afterwards.
pub fn json_values_at_most(text: &[u8]) -> usize {
    let (mut count, mut in_string, mut escaped) = (1, false, false);
    for &byte in text {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match byte {
                b'"' => in_string = true,
                b',' | b'[' | b'{' => count += 1,
                _ => {}
            }
        }
    }
    count
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
    // The namespace as its name ("" for a ClusterProjection), not `Some("…")`; the answer's text
    // as `detail`, since `message` is the log line's own key.
    let namespace = request.namespace.as_deref().unwrap_or_default();
    if verdict == Verdict::Allowed {
        tracing::debug!(endpoint = endpoint.label(), uid = %request.uid, namespace, name = %request.name, "admitted");
    } else {
        tracing::info!(
            endpoint = endpoint.label(),
            uid = %request.uid,
            namespace,
            name = %request.name,
            verdict = verdict.label(),
            detail = %answer.result.message,
            "denied"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_weighs_one_plus_its_body_in_quarter_mebibytes_within_the_limit() {
        let mib = 1024 * 1024;
        for (length, total, weight) in [
            (Some(0), 64, 1),
            (Some(2_000), 64, 1),
            (Some(256 * 1024), 64, 2),
            (Some(mib), 64, 5),
            (Some(4 * mib), 64, 17),
            (Some(100 * mib), 64, 17), // refused at the body limit anyway
            (None, 64, 17),            // no Content-Length: it may grow to the limit
            (Some(4 * mib), 4, 4),     // never more than the whole limit
            (Some(0), 0, 1),
        ] {
            assert_eq!(review_weight(length, total), weight, "{length:?} of {total}");
        }
    }

    #[test]
    fn the_limit_sheds_what_does_not_fit_and_takes_it_again_once_released() {
        let mib = 1024 * 1024;
        let limit = InFlightLimit::new(40);
        let large = limit
            .try_enter(Some(4 * mib))
            .expect("17 of 40, 17 of the large 20");
        assert!(
            limit.try_enter(None).is_none(),
            "large reviews hold at most half the units"
        );
        let medium = limit.try_enter(Some(256 * 1024)).expect("2 more large: 19 of 20");
        let small: Vec<_> = (0..21).map(|_| limit.try_enter(Some(100))).collect();
        assert!(
            small.iter().all(Option::is_some),
            "small reviews use the rest: 40 of 40"
        );
        assert!(limit.try_enter(Some(0)).is_none(), "full");
        drop((large, small));
        assert!(limit.try_enter(None).is_some(), "room again once answered");
        drop(medium);
    }

    #[test]
    fn json_values_are_counted_outside_strings_only() {
        for (text, at_most) in [
            (r#"{}"#, 2),
            (r#"0"#, 1),
            (r#"[0,0,0]"#, 4),
            (r#"{"a":[1,2],"b":{"c":"x"}}"#, 6),
            (r#"{"a":"[,{,[,\",{"}"#, 2),
            (r#"["\\",1]"#, 3),
        ] {
            assert_eq!(json_values_at_most(text.as_bytes()), at_most, "{text}");
        }
        // Never fewer than the values there are.
        let dense = format!("[{}0]", "0,".repeat(1000));
        assert!(json_values_at_most(dense.as_bytes()) >= 1001);
        let review = include_str!("../tests/fixtures/projection-create.json");
        let values = json_values_at_most(review.as_bytes());
        assert!(values < 100, "{values}");
    }

    #[test]
    fn only_small_bodies_of_known_length_are_read_before_taking_room() {
        assert!(read_first(Some(0)));
        assert!(read_first(Some(READ_FIRST_BODY_BYTES)));
        assert!(!read_first(Some(READ_FIRST_BODY_BYTES + 1)));
        assert!(
            !read_first(None),
            "a body of unknown length may grow to the limit"
        );
        // A body above it counts as large even at one unit: slow senders of such bodies can hold
        // at most the large half.
        let limit = InFlightLimit::new(4);
        let _medium = limit
            .try_enter(Some(READ_FIRST_BODY_BYTES + 1))
            .expect("1 of 4, 1 of 2 large");
        let _medium = limit
            .try_enter(Some(READ_FIRST_BODY_BYTES + 1))
            .expect("2 of 4, 2 of 2 large");
        assert!(
            limit.try_enter(Some(READ_FIRST_BODY_BYTES + 1)).is_none(),
            "the large half is full"
        );
        let _small = limit
            .try_enter(Some(2_000))
            .expect("the small keep the other half");
    }

    #[test]
    fn a_limit_too_small_for_a_large_review_still_takes_one() {
        let limit = InFlightLimit::new(3);
        let large = limit.try_enter(None).expect("3 of 3, capped to the large share");
        assert!(limit.try_enter(Some(0)).is_none());
        drop(large);
        let _small = limit.try_enter(Some(0)).expect("1 of 3");
        let _small = limit.try_enter(Some(0)).expect("2 of 3");
    }
}
