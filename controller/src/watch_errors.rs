//! Watch errors: a refusal by the apiserver (HTTP 403: the controller's RBAC does not cover the
//! kind) is recorded for the reconcile waiting on the watch, and every error is logged with the
//! apiserver's message rather than the dump of its answer.

use kube::runtime::watcher;
use std::sync::{Arc, Mutex};

/// Where a watch task records that the apiserver refused it.
pub type Refusal = Arc<Mutex<Option<String>>>;

/// The apiserver's message if a watch error is a refusal (HTTP 403).
fn refusal(error: &watcher::Error) -> Option<String> {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => s,
        _ => return None,
    };
    (status.code == 403).then(|| crate::error::describe_status(status))
}

/// A watch error for the log, with the apiserver's message instead of the dump of its answer.
pub use runtime::api_error::describe_watch_error;

/// Records the outcome of one watch step: a refusal is kept until the watch succeeds again.
pub fn record(refused: &Refusal, error: Option<&watcher::Error>) {
    let mut slot = refused.lock().unwrap_or_else(|e| e.into_inner());
    match error {
        Some(e) => {
            if let Some(message) = refusal(e) {
                *slot = Some(message);
            }
        }
        None => {
            if slot.is_some() {
                *slot = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> Box<kube::core::Status> {
        kube::core::Status::failure(
            "secrets is forbidden: User \"u\" cannot list resource \"secrets\"",
            "Forbidden",
        )
        .with_code(code)
        .boxed()
    }

    #[test]
    fn a_refusal_is_kept_until_the_watch_succeeds() {
        let refused = Refusal::default();
        let forbidden = watcher::Error::InitialListFailed(kube::Error::Api(status(403)));
        record(&refused, Some(&forbidden));
        assert_eq!(
            refused.lock().unwrap().as_deref(),
            Some("secrets is forbidden: User \"u\" cannot list resource \"secrets\"")
        );
        // Another failure does not clear it, a success does.
        record(
            &refused,
            Some(&watcher::Error::WatchFailed(kube::Error::Api(status(500)))),
        );
        assert!(refused.lock().unwrap().is_some());
        record(&refused, None);
        assert!(refused.lock().unwrap().is_none());
        // Only a 403 is a refusal.
        record(
            &refused,
            Some(&watcher::Error::InitialListFailed(kube::Error::Api(status(500)))),
        );
        assert!(refused.lock().unwrap().is_none());
        record(&refused, Some(&watcher::Error::WatchError(status(403))));
        assert!(refused.lock().unwrap().is_some());
    }
}
