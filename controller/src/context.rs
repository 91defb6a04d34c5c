//! What every reconcile shares, split by the pass step that uses it: reading sources, writing
//! copies, reporting; with the settings from the command line.

use crate::{
    author_access::{AuthorAccess, AuthorAccessMode},
    discovery::Discovery,
    events::Events,
    impersonation::AuthorClients,
    metrics::Metrics,
    namespace_watch::Namespaces,
    remote::{RemoteClusters, Unusable},
    wake::Wake,
    watches::WatchRegistry,
    write_journal::WriteJournal,
};
use shared::{
    api::kind::{CrView, Scope},
    copy::ownership::Owner,
    pass::status::Status,
    policy::{
        kind_policy::AllowedPowerKinds, kubeconfig::KubeconfigSecret, projectable::SourceMode,
        write_as::CopyWriter,
    },
};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// Settings from the command line.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Which sources may be projected.
    pub source_mode: SourceMode,
    /// Cap of the retry backoff.
    pub requeue_cap: Duration,
    /// Parallel writes of one ClusterProjection's fan-out.
    pub write_concurrency: usize,
    /// Reconciles running at once.
    pub reconcile_concurrency: u16,
    /// How every watch receives its initial objects.
    pub initial_list: crate::initial_list::InitialList,
    /// Whether each CR's recorded author is checked where the copies are made.
    pub author_access: AuthorAccessMode,
    /// How long an author's grant is reused.
    pub author_grant_ttl: Duration,
    /// How often every CR's author is asked again with nothing changed (zero: never).
    pub author_recheck_interval: Duration,
    /// The kinds that grant power the platform lets be projected.
    pub allowed_power_kinds: AllowedPowerKinds,
    /// Kinds recreated when an update is refused as immutable, beyond ConfigMaps and Secrets.
    pub recreate_on_immutable: shared::copy::recreate::RecreateKinds,
    /// Who creates and updates copies, as decided at start-up.
    pub copy_writer: CopyWriter,
    /// The controller's namespace, where a ClusterProjection's kubeconfig Secret is.
    pub controller_namespace: String,
    /// The duration of the Lease it holds (the leader's or its member Lease): the source changes
    /// a takeover looks at are those of twice it.
    pub lease_duration: Duration,
}

/// Shared by every reconcile, in the parts the pass's steps use: each step takes its part, not
/// the whole.
pub struct Context {
    /// Where sources are resolved, read and checked (the read step).
    pub sources: Arc<SourceAccess>,
    /// Where copies are written and removed in this cluster (the apply step).
    pub copies: Arc<CopyCluster>,
    /// The other clusters copies go to (`spec.destination.kubeConfig`).
    pub remotes: RemoteClusters,
    /// Status, events, metrics and the retry backoff (the report step).
    pub report: Report,
    /// The watches of every kind read or written: sources, copies, and who waits on what.
    pub watches: Arc<WatchRegistry>,
    /// The namespaces and their labels, which ClusterProjections select.
    pub namespaces: Arc<Namespaces>,
    /// This replica's part of the CRs when every replica reconciles (`--shard-by-lease`).
    pub shard: Option<Arc<crate::shard::Shard>>,
    /// How many passes have begun here (what tells that CRs sent ahead of others have started).
    pub passes_begun: tokio::sync::watch::Sender<u64>,
}

impl Context {
    /// Builds the parts from one client (the cluster the CRs live in, whose sources are read and
    /// whose namespaces receive the copies).
    pub fn new(
        client: &kube::Client,
        settings: &Settings,
        (watches, namespaces, wake): (Arc<WatchRegistry>, Arc<Namespaces>, Wake),
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            remotes: RemoteClusters::new(
                client.clone(),
                settings.controller_namespace.clone(),
                metrics.clone(),
                wake,
                settings.clone(),
            ),
            sources: Arc::new(SourceAccess {
                client: client.clone(),
                discovery: Discovery::new(client.clone()),
                watches: watches.clone(),
                source_mode: settings.source_mode,
                allowed_power_kinds: settings.allowed_power_kinds.clone(),
                author_access: AuthorAccess::new(
                    settings.author_access,
                    settings.author_grant_ttl,
                    metrics.author_access_reviews_total.clone(),
                ),
                concurrency: settings.write_concurrency.max(1),
            }),
            copies: Arc::new(CopyCluster {
                client: client.clone(),
                journal: watches.journal(),
                watches: watches.clone(),
                concurrency: settings.write_concurrency.max(1),
                recreate_on_immutable: settings.recreate_on_immutable.clone(),
                writer: settings.copy_writer,
                author_clients: AuthorClients::new(client.clone()),
                source_cluster: None,
            }),
            report: Report {
                client: client.clone(),
                events: Events::new(client.clone()),
                metrics,
                statuses: WrittenStatuses::default(),
                backoff: FailureBackoff::default(),
                requeue_cap: settings.requeue_cap,
            },
            watches,
            namespaces,
            shard: None,
            passes_begun: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Where the copies of `cr` go: this cluster, or the one its kubeconfig Secret names.
    pub async fn destination(&self, cr: &CrView<'_>) -> Result<Destination, Unusable> {
        match KubeconfigSecret::of(cr, self.remotes.controller_namespace()) {
            None => Ok(Destination {
                copies: self.copies.clone(),
                namespaces: (cr.scope == Scope::Namespaces).then(|| self.namespaces.clone()),
                cluster: None,
                cluster_identity: None,
            }),
            Some(secret) => {
                let recorded = cr.recorded().and_then(|r| r.cluster.as_deref());
                self.remotes.destination(&cr.name(), &secret, recorded).await
            }
        }
    }
}

/// Where a CR's copies go: the cluster's [`CopyCluster`], and for a ClusterProjection the
/// namespaces there it selects among.
pub struct Destination {
    /// Every write and removal of the CR's copies goes through this.
    pub copies: Arc<CopyCluster>,
    /// A ClusterProjection's candidate namespaces (`None` for a Projection).
    pub namespaces: Option<Arc<Namespaces>>,
    /// Another cluster's apiserver (`RemoteAccess::server_id`), recorded with the copies; `None`
    /// for this cluster.
    pub cluster: Option<String>,
    /// That cluster's identity, when its credentials may read it (recorded for admission).
    pub cluster_identity: Option<String>,
}

/// What the read step needs: discovery, the watches that hold the sources, the platform's policy
/// on what may be projected, and the author checks.
pub struct SourceAccess {
    pub client: kube::Client,
    pub discovery: Discovery,
    pub watches: Arc<WatchRegistry>,
    /// Which sources may be projected.
    pub source_mode: SourceMode,
    /// The kinds that grant power the platform lets be projected.
    pub allowed_power_kinds: AllowedPowerKinds,
    pub author_access: AuthorAccess,
    /// Author checks asked at once (one per target namespace at most).
    pub concurrency: usize,
}

/// What the apply step needs: the cluster the copies are written to, the journal of our own writes
/// there, and the caches of our copies. Every write and removal of a copy goes through this handle,
/// so copies in another cluster need only another `CopyCluster`.
pub struct CopyCluster {
    pub client: kube::Client,
    pub journal: WriteJournal,
    pub watches: Arc<WatchRegistry>,
    /// Writes and removals in flight at once for one CR.
    pub concurrency: usize,
    /// Kinds recreated when an update is refused as immutable, beyond ConfigMaps and Secrets.
    pub recreate_on_immutable: shared::copy::recreate::RecreateKinds,
    /// Who creates and updates copies: their author (impersonated) or the controller.
    pub writer: CopyWriter,
    /// The controller's client once per author, for writes as the author.
    pub author_clients: AuthorClients,
    /// In another cluster, the identity of the CRs' own (the copies there carry it); `None` here.
    pub source_cluster: Option<String>,
}

impl CopyCluster {
    /// The owner stamped on `cr`'s copies in this cluster.
    pub fn owner_of(&self, cr: &CrView<'_>) -> Owner {
        let owner = Owner::of_cr(cr);
        match &self.source_cluster {
            Some(cluster) => owner.from_cluster(cluster),
            None => owner,
        }
    }

    /// Whether this is another cluster than the CRs' own (no copy there can be the source).
    pub fn is_remote(&self) -> bool {
        self.source_cluster.is_some()
    }
}

/// What the report step needs: the CR's cluster for status and events, the metrics, what we last
/// wrote to each CR's status, and the per-CR failure backoff.
pub struct Report {
    pub client: kube::Client,
    pub events: Events,
    pub metrics: Arc<Metrics>,
    pub statuses: WrittenStatuses,
    pub backoff: FailureBackoff,
    /// Cap of the retry backoff.
    pub requeue_cap: Duration,
}

/// The status the controller last wrote to each CR (by the digest of its uid), as a digest (only
/// equality is asked of it), and when. The reflector's copy of a CR can lag behind our own last
/// status write (a source deleted and recreated within milliseconds gives two reconciles in a row),
/// so "unchanged" must hold against both it and this record; and a pass must not act on a copy
/// older than that write (`behind`).
#[derive(Default)]
pub struct WrittenStatuses {
    written: Mutex<HashMap<u64, ([u8; 32], Instant)>>,
}

/// How long after our own status write a cached CR that does not show it yet is taken to be behind
/// (its watch event on the way) rather than changed by someone else since, whom a pass must not
/// wait for any longer.
const CATCH_UP_WINDOW: Duration = Duration::from_secs(5);

/// When to look again at a cached CR that is still behind our write of `since` ago: soon at first
/// (a watch event usually takes milliseconds), then less often; `None` once the window is over.
pub fn catch_up_delay(since: Duration) -> Option<Duration> {
    (since < CATCH_UP_WINDOW)
        .then(|| (since / 2).clamp(Duration::from_millis(10), Duration::from_millis(500)))
}

impl WrittenStatuses {
    /// Whether `next` equals what we last wrote to `uid` (true when we wrote nothing yet: then the
    /// CR's own status is all there is to compare with).
    pub fn matches(&self, uid: &str, next: &serde_json::Value) -> bool {
        let next = crate::cache::cache_trim::digest(next);
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&crate::cache::verified::digest(&uid))
            .is_none_or(|(last, _)| *last == next)
    }

    /// How long to wait before running the pass of `uid`, whose cached status `cached` gives, when
    /// that is not what we wrote to it a moment ago (at `now`): the status is the pass's memory (the
    /// copies recorded for cleanup, whether a copy was ever written), so a pass on a copy of the CR
    /// from before our own write would decide from what is no longer so. The cached status is only
    /// built and digested for a write still inside the window: most passes skip that work.
    pub fn behind(&self, uid: &str, cached: impl FnOnce() -> Status, now: Instant) -> Option<Duration> {
        let (last, at) = *self
            .written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&crate::cache::verified::digest(&uid))?;
        let delay = catch_up_delay(now.saturating_duration_since(at))?;
        let cached = crate::cache::cache_trim::digest(&serde_json::to_value(cached()).ok()?);
        (cached != last).then_some(delay)
    }

    /// Records a status written to `uid` (at `now`).
    pub fn record(&self, uid: &str, status: &serde_json::Value, now: Instant) {
        self.written.lock().unwrap_or_else(|e| e.into_inner()).insert(
            crate::cache::verified::digest(&uid),
            (crate::cache::cache_trim::digest(status), now),
        );
    }

    /// Forgets a CR that is gone.
    pub fn forget(&self, uid: &str) {
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&crate::cache::verified::digest(&uid));
    }
}

/// Per-object exponential backoff: 500 ms, 1 s, 2 s, ... up to the cap; reset on success.
#[derive(Default)]
pub struct FailureBackoff {
    failing: Mutex<HashMap<String, runtime::backoff::Backoff>>,
}

const FIRST_RETRY: Duration = Duration::from_millis(500);

impl FailureBackoff {
    /// Records a failure of `uid` and returns how long to wait before the next attempt.
    pub fn next_delay(&self, uid: &str, cap: Duration) -> Duration {
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        failing
            .entry(uid.to_owned())
            .or_insert_with(|| runtime::backoff::Backoff::doubling(FIRST_RETRY, cap))
            .next_delay()
    }

    /// Whether `uid` failed since its last success.
    pub fn is_failing(&self, uid: &str) -> bool {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(uid)
    }

    /// Forgets the failures of `uid` after a success.
    pub fn reset(&self, uid: &str) {
        self.failing.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_status_is_unchanged_only_against_what_we_last_wrote() {
        let statuses = WrittenStatuses::default();
        let ready = serde_json::json!({"conditions": [{"type": "Ready", "status": "True"}]});
        let deleted = serde_json::json!({"conditions": [{"type": "Ready", "status": "False"}]});
        assert!(
            statuses.matches("uid", &ready),
            "nothing written yet: the CR's status decides"
        );
        statuses.record("uid", &deleted, Instant::now());
        // The reflector may still show Ready (stale), but we last wrote SourceDeleted: write again.
        assert!(!statuses.matches("uid", &ready));
        assert!(statuses.matches("uid", &deleted));
        statuses.forget("uid");
        assert!(statuses.matches("uid", &ready));
    }

    fn status(reason: &str) -> Status {
        let copy = serde_json::from_value(serde_json::json!({
            "conditions": [{"type": "Ready", "status": "False", "reason": reason, "message": "",
                            "lastTransitionTime": "2026-11-27T22:30:45Z"}],
            "destinationName": "cfg",
        }))
        .expect("a status");
        Status { copy, counts: None }
    }

    #[test]
    fn a_cached_cr_without_our_last_status_write_is_waited_for_a_while() {
        let statuses = WrittenStatuses::default();
        let (ready, deleted) = (status("Projected"), status("SourceDeleted"));
        let written = Instant::now();
        assert_eq!(
            statuses.behind("uid", || ready.clone(), written),
            None,
            "nothing written yet"
        );
        statuses.record("uid", &serde_json::to_value(&deleted).unwrap(), written);
        assert_eq!(
            statuses.behind("uid", || deleted.clone(), written),
            None,
            "the cache shows our write"
        );
        assert_eq!(
            statuses.behind("uid", || ready.clone(), written + Duration::from_millis(4)),
            Some(Duration::from_millis(10)),
            "looked at again soon at first"
        );
        assert_eq!(
            statuses.behind("uid", || ready.clone(), written + Duration::from_secs(2)),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            statuses.behind("uid", || ready.clone(), written + CATCH_UP_WINDOW),
            None,
            "someone else wrote the status since: the pass runs on what is there"
        );
        assert_eq!(statuses.behind("other", || ready.clone(), written), None);
        statuses.forget("uid");
        assert_eq!(statuses.behind("uid", || ready.clone(), written), None);
    }

    #[test]
    fn the_wait_for_the_cache_grows_with_the_time_since_the_write_and_ends() {
        let ms = Duration::from_millis;
        let delays: Vec<_> = [0, 30, 400, 3_000, 4_999, 5_000]
            .map(|since| catch_up_delay(ms(since)))
            .to_vec();
        assert_eq!(
            delays,
            [
                Some(ms(10)),
                Some(ms(15)),
                Some(ms(200)),
                Some(ms(500)),
                Some(ms(500)),
                None
            ]
        );
    }

    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let b = FailureBackoff::default();
        let cap = Duration::from_secs(3);
        let delays: Vec<_> = (0..5).map(|_| b.next_delay("u", cap)).collect();
        assert_eq!(delays, [500, 1000, 2000, 3000, 3000].map(Duration::from_millis));
        assert!(b.is_failing("u"));
        b.reset("u");
        assert!(!b.is_failing("u"));
        assert_eq!(b.next_delay("u", cap), Duration::from_millis(500));
    }
}
