//! Every watch of the controller starts here, streaming or listing its initial objects as
//! `--initial-list` says ([`crate::initial_list::mode`]). With `auto`, a watch the apiserver refuses to
//! stream lists instead, from then on: the refusal is not passed on, so nothing records it as a
//! failed watch.

use crate::watch_errors::status_of;
use futures::{Stream, StreamExt, stream::BoxStream};
use kube::{Api, Resource, runtime::watcher};
use serde::de::DeserializeOwned;
use std::fmt::Debug;

pub mod mode;

pub use mode::InitialList;

/// `kube::runtime::watcher` for `api`. `config` describes the watch as it lists; streaming adds
/// `sendInitialEvents` to it (its list semantic and page size then do not apply).
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    initial: InitialList,
) -> BoxStream<'static, watcher::Result<watcher::Event<K>>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    match initial {
        InitialList::List => watcher::watcher(api, config).boxed(),
        InitialList::Stream => watcher::watcher(api, config.streaming_lists()).boxed(),
        InitialList::Auto => {
            let streamed = watcher::watcher(api.clone(), config.clone().streaming_lists());
            let resource = api.resource_url().to_owned();
            fall_back(streamed, move || {
                // Said once: on a cluster with the feature off, every watch falls back.
                static EXPLAINED: std::sync::Once = std::sync::Once::new();
                let mut first = false;
                EXPLAINED.call_once(|| first = true);
                if first {
                    tracing::warn!(
                        resource = %resource,
                        "the apiserver does not stream a watch's initial objects (its WatchList feature is off); listing them instead, for this watch and any other it refuses"
                    );
                } else {
                    tracing::debug!(resource = %resource, "listing this watch's initial objects: the apiserver does not stream them");
                }
                watcher::watcher(api, config)
            })
            .boxed()
        }
    }
}

/// `streamed` until it fails with the apiserver's refusal to stream, then `listed()` for good.
fn fall_back<T, S, L>(
    streamed: S,
    listed: impl FnOnce() -> L + Send + 'static,
) -> impl Stream<Item = watcher::Result<T>> + Send
where
    T: Send + 'static,
    S: Stream<Item = watcher::Result<T>> + Send + 'static,
    L: Stream<Item = watcher::Result<T>> + Send + 'static,
{
    enum Phase<T, F> {
        Streaming(BoxStream<'static, watcher::Result<T>>, F),
        Listing(BoxStream<'static, watcher::Result<T>>),
    }
    futures::stream::unfold(Phase::Streaming(streamed.boxed(), listed), |phase| async move {
        match phase {
            Phase::Streaming(mut stream, listed) => match stream.next().await {
                Some(Err(e)) if refuses_streaming(&e) => {
                    let mut stream = listed().boxed();
                    let item = stream.next().await?;
                    Some((item, Phase::Listing(stream)))
                }
                Some(item) => Some((item, Phase::Streaming(stream, listed))),
                None => None,
            },
            Phase::Listing(mut stream) => {
                let item = stream.next().await?;
                Some((item, Phase::Listing(stream)))
            }
        }
    })
}

fn refuses_streaming(error: &watcher::Error) -> bool {
    status_of(error).is_some_and(|s| InitialList::Auto.falls_back(s.code, &s.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: u16, message: &str) -> watcher::Error {
        let status = kube::core::Status::failure(message, "Invalid")
            .with_code(code)
            .boxed();
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
    }

    const GATE_OFF: &str = "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: \
                            sendInitialEvents is forbidden for watch unless the WatchList feature \
                            gate is enabled";

    async fn seen(streamed: Vec<watcher::Result<u8>>) -> Vec<Result<u8, u16>> {
        let listed = || futures::stream::iter([Ok(10), Err(answer(500, "later")), Ok(11)]);
        fall_back(futures::stream::iter(streamed), listed)
            .map(|item| item.map_err(|e| status_of(&e).map_or(0, |s| s.code)))
            .collect()
            .await
    }

    #[tokio::test]
    async fn a_refusal_to_stream_switches_to_the_list_without_passing_the_refusal_on() {
        assert_eq!(
            seen(vec![Err(answer(422, GATE_OFF)), Ok(1)]).await,
            [Ok(10), Err(500), Ok(11)]
        );
        // Later, too: the watch restarting after a failure is refused the same way.
        assert_eq!(
            seen(vec![Ok(1), Err(answer(422, GATE_OFF)), Ok(2)]).await,
            [Ok(1), Ok(10), Err(500), Ok(11)]
        );
    }

    #[tokio::test]
    async fn any_other_error_is_passed_on_and_the_stream_goes_on() {
        assert_eq!(
            seen(vec![
                Err(answer(403, "forbidden")),
                Ok(1),
                Err(answer(422, "labelSelector"))
            ])
            .await,
            [Err(403), Ok(1), Err(422)]
        );
        assert_eq!(seen(vec![Ok(1), Ok(2)]).await, [Ok(1), Ok(2)]);
    }
}
