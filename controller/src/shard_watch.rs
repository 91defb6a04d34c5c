//! The CR watches of a replica with shards (`--shard-by-lease`): they ask the apiserver for this
//! replica's ranges only (`shardSelector`, KEP-5866; kube's list and watch parameters lack it, so a
//! client of our own adds it to the CR collections' requests), keep only the CRs the current ring
//! gives this replica (an apiserver without the feature gate ignores the parameter), and list anew
//! whenever the ranges change, so a CR that moved here arrives and one that moved away leaves.

use crate::shard::Shard;
use crate::wake::RecentSources;
use futures::{StreamExt, stream::BoxStream};
use kube::{
    Api, Client, Resource,
    api::ListParams,
    runtime::watcher::{self, Event},
};
use prometheus_client::metrics::counter::Counter;
use shared::{
    api::crd::{ClusterProjection, Projection},
    shard::{field_hash, recent::source_field_selectors, selector::ShardFilter},
};
use std::sync::Arc;
use tokio::sync::watch;

/// What is sent when this replica owns no range: a selector of the one hash 0, so the server sends
/// (next to) nothing; the replica's own filter drops the rest.
const NO_RANGE: &str = "shardRange(object.metadata.uid, '0x0000000000000000', '0x0000000000000001')";

/// `client` with the replica's `shardSelector` on every list and watch of the CRs' collections.
pub fn sharded_client(client: &Client, selector: watch::Receiver<ShardFilter>) -> Client {
    let inner = client.clone();
    let collections = [
        Projection::url_path(&(), None),
        ClusterProjection::url_path(&(), None),
    ];
    let service = tower::service_fn(move |mut request: http::Request<kube::client::Body>| {
        if request.method() == http::Method::GET && collections.iter().any(|c| c == request.uri().path()) {
            let value = match &*selector.borrow() {
                ShardFilter::Everything => None,
                ShardFilter::Nothing => Some(NO_RANGE.to_owned()),
                ShardFilter::Ranges(ranges) => Some(ranges.clone()),
            };
            if let Some(value) = value {
                add_query(&mut request, "shardSelector", &value);
            }
        }
        let inner = inner.clone();
        async move { inner.send(request).await }
    });
    Client::new(service, client.default_namespace())
}

fn add_query<B>(request: &mut http::Request<B>, key: &str, value: &str) {
    let pair = form_urlencoded::Serializer::new(String::new())
        .append_pair(key, value)
        .finish();
    let uri = request.uri();
    let with = match uri.query() {
        Some(query) => format!("{}?{query}&{pair}", uri.path()),
        None => format!("{}?{pair}", uri.path()),
    };
    if let Ok(uri) = http::Uri::try_from(with) {
        *request.uri_mut() = uri;
    }
}

/// The stream `make` gives, made anew each time the selector changes (a new watch lists what
/// the new ranges hold; the reflector replaces its store with that list), after the one `first`
/// gives then, if any.
pub fn restarting<T: Send + 'static>(
    (mut make, first): (
        impl FnMut() -> BoxStream<'static, T> + Send + 'static,
        impl FnMut() -> Option<BoxStream<'static, T>> + Send + 'static,
    ),
    mut changes: watch::Receiver<ShardFilter>,
) -> BoxStream<'static, T> {
    changes.mark_unchanged();
    let current = make();
    futures::stream::unfold(
        (current, Some(changes), make, first),
        |(mut current, mut changes, mut make, mut first)| async move {
            loop {
                tokio::select! {
                    item = current.next() => return item.map(|item| (item, (current, changes, make, first))),
                    alive = async {
                        match changes.as_mut() {
                            Some(changes) => changes.changed().await.is_ok(),
                            None => std::future::pending().await,
                        }
                    } => {
                        if alive {
                            current = match first() {
                                Some(ahead) => ahead.chain(make()).boxed(),
                                None => make(),
                            };
                        } else {
                            changes = None;
                        }
                    }
                }
            }
        },
    )
    .boxed()
}

/// How many of the sources changed lately have their CRs listed ahead of the ranges gained (the
/// latest changed first): an edit made while a departed replica's Lease ran out is among the latest,
/// and each is one small list the apiserver filters from its cache.
const SOURCES_LISTED_FIRST: usize = 16;

/// How many of those lists are sent at once.
const SOURCE_LISTS_AT_ONCE: usize = 4;

/// The CRs of the ranges the ring just added to this replica's, listed on their own ahead of the
/// new watch's list of all its ranges: a replica taking over a departed one's CRs holds a fraction
/// of its ranges anew, and has those CRs in its store (to hand over, the stale ones first) without
/// waiting for the list of everything it holds. Ahead of them still, the CRs of those ranges that
/// read a source changed lately (by the source fields the CRDs declare selectable): at 100,000
/// Projections the list of the ranges gained takes seconds, and these are the CRs whose copies an
/// edit made stale meanwhile. They come as `Apply` events, so the store keeps what it has until
/// the new watch's list replaces it, and the hand-over is told each time some are in. An
/// apiserver that sends CRs outside the ranges ignores selectors: this is not done again.
pub fn gained_first<K>(
    client: &Client,
    (shard, recent): (Arc<Shard>, Arc<RecentSources>),
    kind: &'static str,
) -> Option<BoxStream<'static, watcher::Result<Event<K>>>>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let (filter, ranges) = shard.gained_first()?;
    let client = sharded_client(client, watch::channel(filter).1);
    let in_ranges = Arc::new(move |cr: &K| {
        let hash = field_hash(cr.meta().uid.as_deref().unwrap_or_default());
        ranges.iter().any(|range| range.contains(hash))
    });
    let stale = shard
        .source_fields_selectable()
        .then(|| source_field_selectors(&recent.newest_first(), SOURCES_LISTED_FIRST))
        .filter(|selectors| !selectors.is_empty())
        .map(|selectors| {
            let listed = stale_first(client.clone(), shard.clone(), selectors, in_ranges.clone(), kind);
            futures::stream::once(listed)
                .flatten()
                .chain(told(shard.clone()))
                .boxed()
        });
    let listed = {
        let shard = shard.clone();
        async move {
            let started = std::time::Instant::now();
            let crs = match Api::<K>::all(client).list(&ListParams::default()).await {
                Ok(list) => list.items,
                Err(e) => {
                    tracing::warn!(kind, error = %e, "could not list the ranges gained first; the new watch lists them");
                    Vec::new()
                }
            };
            if crs.iter().all(|cr| in_ranges(cr)) {
                tracing::info!(
                    kind,
                    crs = crs.len(),
                    ms = started.elapsed().as_millis(),
                    "listed first the CRs of the ranges this replica gained"
                );
            } else {
                shard.selector_ignored();
                tracing::info!(
                    kind,
                    "the apiserver ignores shardSelector: the ranges gained are listed with the rest from now on"
                );
            }
            futures::stream::iter(crs.into_iter().map(|cr| Ok(Event::Apply(cr))))
        }
    };
    let gained = futures::stream::once(listed).flatten().chain(told(shard));
    Some(match stale {
        Some(stale) => stale.chain(gained).boxed(),
        None => gained.boxed(),
    })
}

/// The CRs within the ranges gained that read one of the sources `selectors` select, as `Apply`
/// events; none when the apiserver refuses the selectors (CRDs without the selectable fields).
async fn stale_first<K>(
    client: Client,
    shard: Arc<Shard>,
    selectors: Vec<String>,
    in_ranges: Arc<impl Fn(&K) -> bool + Send + Sync + 'static>,
    kind: &'static str,
) -> BoxStream<'static, watcher::Result<Event<K>>>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let started = std::time::Instant::now();
    let sources = selectors.len();
    let lists: Vec<Result<Vec<K>, kube::Error>> = futures::stream::iter(selectors)
        .map(|selector| {
            let api = Api::<K>::all(client.clone());
            async move {
                api.list(&ListParams::default().fields(&selector))
                    .await
                    .map(|list| list.items)
            }
        })
        .buffer_unordered(SOURCE_LISTS_AT_ONCE)
        .collect()
        .await;
    let mut crs = Vec::new();
    for list in lists {
        match list {
            Ok(items) => crs.extend(items),
            Err(kube::Error::Api(status)) if status.code == 400 => {
                if shard.source_fields_refused() {
                    tracing::info!(
                        kind,
                        error = %status.message,
                        "the CRDs declare no selectable source fields (installed before they did): the CRs of the sources changed lately come with the ranges gained"
                    );
                }
                return futures::stream::empty().boxed();
            }
            Err(e) => {
                tracing::warn!(kind, error = %e, "could not list first the CRs of a source changed lately; the ranges gained bring them");
            }
        }
    }
    // An apiserver that ignores shardSelector sent the CRs of every range (it honours the field
    // selector still).
    crs.retain(|cr| in_ranges(cr));
    tracing::info!(
        kind,
        crs = crs.len(),
        sources,
        ms = started.elapsed().as_millis(),
        "listed first the CRs reading the sources changed lately"
    );
    futures::stream::iter(crs.into_iter().map(|cr| Ok(Event::Apply(cr)))).boxed()
}

/// Tells the hand-over, once polled (after the CRs before it reached the store), that CRs moved
/// here are in the store; yields nothing.
fn told<K: Send + 'static>(shard: Arc<Shard>) -> BoxStream<'static, watcher::Result<Event<K>>> {
    futures::stream::once(async move { shard.relisted() })
        .filter_map(|()| std::future::ready(None))
        .boxed()
}

/// Only the events of CRs the current ring gives this replica; the others counted in `dropped`.
pub fn owned_only<K: Resource + Send + 'static>(
    events: BoxStream<'static, watcher::Result<Event<K>>>,
    shard: Arc<Shard>,
    dropped: Counter,
) -> BoxStream<'static, watcher::Result<Event<K>>> {
    events
        .filter(move |event| {
            let keep = match event {
                Ok(Event::Apply(cr) | Event::InitApply(cr) | Event::Delete(cr)) => {
                    shard.owns(cr.meta().uid.as_deref().unwrap_or_default())
                }
                _ => true,
            };
            if !keep {
                dropped.inc();
            }
            std::future::ready(keep)
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_is_added_to_the_query_encoded() {
        let mut request = http::Request::get("/apis/projection.sh/v1/projections?watch=true")
            .body(())
            .unwrap();
        add_query(
            &mut request,
            "shardSelector",
            "shardRange(object.metadata.uid, '0x0', '0x1')",
        );
        assert_eq!(
            request.uri().to_string(),
            "/apis/projection.sh/v1/projections?watch=true&shardSelector=\
             shardRange%28object.metadata.uid%2C+%270x0%27%2C+%270x1%27%29"
        );
    }

    #[tokio::test]
    async fn a_change_of_the_selector_starts_the_stream_anew() {
        let (tx, rx) = watch::channel(ShardFilter::Nothing);
        let mut round = 0;
        let mut ahead = 0;
        let mut stream = restarting(
            (
                move || {
                    round += 1;
                    futures::stream::iter([round])
                        .chain(futures::stream::pending())
                        .boxed()
                },
                move || {
                    ahead += 1;
                    (ahead == 1).then(|| futures::stream::iter([100]).boxed())
                },
            ),
            rx,
        );
        assert_eq!(stream.next().await, Some(1));
        tx.send_replace(ShardFilter::Everything);
        assert_eq!(
            stream.next().await,
            Some(100),
            "what comes first, at the first change"
        );
        assert_eq!(stream.next().await, Some(2));
        tx.send_replace(ShardFilter::Nothing);
        assert_eq!(stream.next().await, Some(3), "nothing first at the second");
        drop(tx);
        let pending = tokio::time::timeout(std::time::Duration::from_millis(50), stream.next()).await;
        assert!(
            pending.is_err(),
            "the last stream goes on once nobody changes the selector"
        );
    }
}
