//! The controller's errors. Each has a fixed category, used as a metric label and in logs.

use thiserror::Error;

/// What can make a reconcile fail (and be retried with backoff).
#[derive(Debug, Error)]
pub enum Error {
    /// A call to the apiserver failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done, e.g. `patching status`.
        action: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The finalizer helper failed (adding, removing, or the cleanup it ran).
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The reconcile ended with a handled failure that is already in status; retry with backoff.
    #[error("{reason}: {message}")]
    Retry {
        /// The condition reason.
        reason: String,
        /// The condition message.
        message: String,
    },
}

impl Error {
    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Api { .. } => "api",
            Self::Finalizer(_) => "finalizer",
            Self::Retry { .. } => "handled",
        }
    }
}

/// Shorthand for a failed API call.
pub fn api_error(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api { action, source }
}
