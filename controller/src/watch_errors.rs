//! Watch errors: a refusal by the apiserver (HTTP 403: the controller's RBAC does not cover the
//! kind; HTTP 404: the kind is not served, its CRD was deleted) is recorded for the reconcile waiting
//! on the watch, every error is logged with the
//! apiserver's message rather than the dump of its answer, and a watch whose resourceVersion the
//! apiserver no longer knows (HTTP 410) relists at once instead of waiting out a backoff.

use futures::Stream;
use kube::runtime::{
    utils::{Backoff, StreamBackoff},
    watcher::{self, DefaultBackoff},
};
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

/// Why the apiserver will not serve a kind's watch, with its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// HTTP 403: the controller's RBAC does not cover the kind.
    Forbidden(String),
    /// HTTP 404: the kind is not served (its CRD was deleted, perhaps while discovery still
    /// listed it): retrying the watch cannot help until the kind is served again.
    NotServed(String),
}

/// Where a watch task records that the apiserver refused it.
pub type Refusal = Arc<Mutex<Option<Refused>>>;

/// The apiserver's refusal, if a watch error is one (HTTP 403 or 404).
fn refusal(error: &watcher::Error) -> Option<Refused> {
    let status = status_of(error)?;
    let message = crate::error::describe_status(status);
    match status.code {
        // 401: credentials the apiserver does not accept (another cluster's, revoked or expired).
        401 | 403 => Some(Refused::Forbidden(message)),
        404 => Some(Refused::NotServed(message)),
        _ => None,
    }
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

/// The apiserver's answer to a failed watch step, if it answered.
pub(crate) fn status_of(error: &watcher::Error) -> Option<&kube::core::Status> {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => Some(s),
        _ => None,
    }
}

/// kube's default watch backoff, except that the step after a 410 Gone is not delayed: the watcher
/// has already dropped its resourceVersion and relists, and nothing is gained by waiting (a kind
/// whose CRD was deleted and created again answers the old resourceVersion with a 410 once it is
/// served again, by which time the exponential backoff has usually reached its cap).
pub struct RelistAtOnce {
    backoff: DefaultBackoff,
    gone: Arc<AtomicBool>,
}

impl Iterator for RelistAtOnce {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.gone.swap(false, Ordering::AcqRel) {
            return Some(Duration::ZERO);
        }
        self.backoff.next()
    }
}

impl Backoff for RelistAtOnce {
    fn reset(&mut self) {
        self.backoff.reset();
    }
}

/// `watch` with the [`RelistAtOnce`] backoff.
pub fn watch_backoff<S, T>(watch: S) -> impl Stream<Item = Result<T, watcher::Error>> + Send
where
    S: Stream<Item = Result<T, watcher::Error>> + Send,
{
    let gone = Arc::new(AtomicBool::new(false));
    let seen = gone.clone();
    let watch = futures::StreamExt::inspect(watch, move |step| {
        if let Err(e) = step
            && status_of(e).is_some_and(|status| status.code == 410)
        {
            seen.store(true, Ordering::Release);
        }
    });
    StreamBackoff::new(
        watch,
        RelistAtOnce {
            backoff: DefaultBackoff::default(),
            gone,
        },
    )
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
            *refused.lock().unwrap(),
            Some(Refused::Forbidden(
                "secrets is forbidden: User \"u\" cannot list resource \"secrets\"".into()
            ))
        );
        // Another failure does not clear it, a success does.
        record(
            &refused,
            Some(&watcher::Error::WatchFailed(kube::Error::Api(status(500)))),
        );
        assert!(refused.lock().unwrap().is_some());
        record(&refused, None);
        assert!(refused.lock().unwrap().is_none());
        // Only a 403 or a 404 is a refusal.
        record(
            &refused,
            Some(&watcher::Error::InitialListFailed(kube::Error::Api(status(500)))),
        );
        assert!(refused.lock().unwrap().is_none());
        record(&refused, Some(&watcher::Error::WatchError(status(403))));
        assert!(matches!(*refused.lock().unwrap(), Some(Refused::Forbidden(_))));
        record(&refused, None);
        record(
            &refused,
            Some(&watcher::Error::InitialListFailed(kube::Error::Api(status(404)))),
        );
        assert!(matches!(*refused.lock().unwrap(), Some(Refused::NotServed(_))));
    }

    #[test]
    fn only_the_step_after_a_gone_is_not_delayed() {
        let gone = Arc::new(AtomicBool::new(true));
        let mut backoff = RelistAtOnce {
            backoff: DefaultBackoff::default(),
            gone: gone.clone(),
        };
        assert_eq!(backoff.next(), Some(Duration::ZERO));
        let after_another_error = backoff.next().expect("the default backoff never ends");
        assert!(after_another_error > Duration::ZERO);
        gone.store(true, Ordering::Release);
        assert_eq!(backoff.next(), Some(Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn a_gone_answer_is_retried_at_once_any_other_error_after_a_backoff() {
        use futures::StreamExt;
        let steps =
            |code| futures::stream::iter([Err::<u8, _>(watcher::Error::WatchError(status(code))), Ok(1)]);
        // The clock is paused: it moves only by the backoff's sleeps.
        let started = tokio::time::Instant::now();
        let seen: Vec<bool> = watch_backoff(steps(410)).map(|step| step.is_ok()).collect().await;
        assert_eq!(seen, [false, true]);
        assert_eq!(started.elapsed(), Duration::ZERO, "no wait after a 410");

        let started = tokio::time::Instant::now();
        let seen: Vec<bool> = watch_backoff(steps(500)).map(|step| step.is_ok()).collect().await;
        assert_eq!(seen, [false, true]);
        assert!(started.elapsed() > Duration::ZERO, "a backoff after a 500");
    }
}
