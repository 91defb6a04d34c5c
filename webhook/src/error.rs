//! The webhook's errors, one enum per layer. Each has a fixed category for metric labels and logs.

use axum::http::StatusCode;
use runtime::api_error::describe;
use thiserror::Error;

/// Why a request could not be read as an AdmissionReview (answered with an HTTP 4xx).
#[derive(Debug, Error)]
pub enum RequestError {
    /// The body exceeds the limit.
    #[error("request body larger than {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The body holds more JSON values than any AdmissionReview of a Projection needs: its parsed
    /// form would cost many times its size in memory.
    #[error("request body holds more than {limit} JSON values")]
    TooComplex {
        /// The limit.
        limit: usize,
    },
    /// The body did not arrive in time.
    #[error("request body not received within {0:?}")]
    Timeout(std::time::Duration),
    /// The connection failed while the body was read.
    #[error("reading the request body: {0}")]
    Body(String),
    /// The body is not an admission.k8s.io/v1 AdmissionReview.
    #[error("request body is not an AdmissionReview: {0}")]
    Malformed(#[source] serde_json::Error),
    /// Another kind or version than admission.k8s.io/v1 AdmissionReview.
    #[error("expected an admission.k8s.io/v1 AdmissionReview, got {api_version:?} {kind:?}")]
    WrongType {
        /// The body's apiVersion.
        api_version: String,
        /// The body's kind.
        kind: String,
    },
    /// The AdmissionReview carries no request.
    #[error("AdmissionReview has no request")]
    NoRequest,
}

impl RequestError {
    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too_large",
            Self::TooComplex { .. } => "too_complex",
            Self::Timeout(_) => "timeout",
            Self::Body(_) => "body",
            Self::Malformed(_) => "malformed",
            Self::WrongType { .. } => "wrong_type",
            Self::NoRequest => "no_request",
        }
    }

    /// The HTTP status answered.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::TooLarge { .. } | Self::TooComplex { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Body(_) | Self::Malformed(_) | Self::WrongType { .. } | Self::NoRequest => {
                StatusCode::BAD_REQUEST
            }
        }
    }
}

/// Why an admission policy could not be checked (the request is denied: we fail closed, like the
/// webhook's `failurePolicy: Fail`).
#[derive(Debug, Error)]
pub enum PolicyError {
    /// Discovery of the source kind failed.
    #[error("discovery failed: {}", describe(.0))]
    Discovery(#[source] kube::Error),
    /// The SubjectAccessReview could not be made.
    #[error("the SubjectAccessReview failed: {}", describe(.0))]
    AccessReview(#[source] kube::Error),
    /// The source could not be read.
    #[error("reading the source failed: {}", describe(.0))]
    SourceRead(#[source] kube::Error),
}

impl PolicyError {
    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Discovery(_) => "discovery",
            Self::AccessReview(_) => "access_review",
            Self::SourceRead(_) => "source_read",
        }
    }
}

/// Why the serving certificate could not be (re)loaded (shared with the metrics endpoints).
pub use runtime::tls::TlsError;

/// A flag, or a combination of flags, the webhook cannot start with.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// A flag the self-managed certificate mode needs is missing.
    #[error("{flag} is required with --self-managed-certificate-secret")]
    Missing {
        /// The flag.
        flag: &'static str,
    },
    /// Neither webhook configuration is named.
    #[error(
        "--self-managed-certificate-secret needs --validating-webhook-configuration or \
         --mutating-webhook-configuration (or both): the webhook configurations whose caBundle it keeps"
    )]
    NoWebhookConfiguration,
    /// A certificate would be renewed as soon as it is issued.
    #[error("--certificate-renew-before ({renew_before:?}) must be shorter than {flag} ({validity:?})")]
    RenewBeforeTooLong {
        /// The validity flag.
        flag: &'static str,
        /// `--certificate-renew-before`.
        renew_before: std::time::Duration,
        /// The validity.
        validity: std::time::Duration,
    },
    /// A name that is not a valid DNS name, Kubernetes name or IP address.
    #[error("{flag}: {value:?} is not a valid name")]
    BadName {
        /// The flag.
        flag: &'static str,
        /// The value.
        value: String,
    },
}

/// Why a certificate could not be issued.
#[derive(Debug, Error)]
pub enum CertError {
    /// rcgen refused (a name it cannot encode, a key it cannot read).
    #[error("generating a certificate: {0}")]
    Generate(String),
    /// The material to build on contradicts itself.
    #[error("inconsistent certificate material: {0}")]
    Inconsistent(String),
}

/// Why the self-managed certificate Secret or a webhook configuration could not be brought up to
/// date (retried; the served pair stays).
#[derive(Debug, Error)]
pub enum SelfManagedError {
    /// The Secret exists but is not ours: it is never overwritten.
    #[error(
        "Secret {namespace}/{name} exists but was not created by projection-webhook (no label \
         {label}={value}); refusing to overwrite it: delete it, or choose another name with \
         --self-managed-certificate-secret"
    )]
    NotOurs {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The ownership label.
        label: &'static str,
        /// Its expected value.
        value: &'static str,
    },
    /// Issuing failed.
    #[error(transparent)]
    Cert(#[from] CertError),
    /// An apiserver call failed.
    #[error("{action}: {}", describe(source))]
    Api {
        /// What was attempted.
        action: &'static str,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// Another writer kept winning; retried later.
    #[error("the Secret kept changing under us ({0} attempts); retrying")]
    Contended(usize),
}

impl SelfManagedError {
    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Self::NotOurs { .. } => "not_ours",
            Self::Cert(_) => "generate",
            Self::Api { .. } => "api",
            Self::Contended(_) => "contended",
        }
    }
}
