//! Scale-out by Leases (`--shard-by-lease`, SPEC §12): every replica reconciles, each the CRs the
//! ring of live members gives it. This is the I/O around `shared::shard::membership`: the
//! replica's own Lease (renewed, carrying the ring version it acknowledges), the others' Leases
//! read every second, the passes running, and the fence: no pass starts once the Lease may have
//! expired in the others' eyes.

use crate::events::Events;
use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::ObjectReference,
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use shared::{
    api::reason::Reason,
    shard::{
        membership::{MEMBER_LABEL, MemberLease, View},
        ring::{HashRange, Ring, gained},
        selector::{ShardFilter, shard_selector},
    },
};
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};
use tokio_util::sync::CancellationToken;

const FIELD_MANAGER: &str = "projection-controller";

/// The longest a stop waits for each of its two tries to delete the member Lease: the pod is killed
/// 15 s after SIGTERM (the chart's grace period), and the passes' drain takes up to 5 s of it.
const STOP_DELETE_TRY: Duration = Duration::from_secs(3);

/// This replica's membership.
pub struct Shard {
    me: String,
    lease_name: String,
    namespace: String,
    duration: Duration,
    view: RwLock<View>,
    /// Until when this replica may start passes: its last renewal plus two thirds of the Lease, so
    /// it stops well before the others could see the Lease expire.
    valid_until: Mutex<Option<Instant>>,
    /// The passes running, by CR uid.
    running: Mutex<HashMap<String, usize>>,
    /// The CRs whose pass was cut short, or not started, because the Lease was not valid: run
    /// again once it is, if this replica may then (nothing else would send them).
    held: Mutex<HashSet<String>>,
    /// The version of the ring of live members and when this replica first saw it (where the
    /// time a takeover took is counted from).
    ring_since: Mutex<Option<(String, Instant)>>,
    /// The settlement of the ring (`View::settlement`) and the CRs taken over in it whose first
    /// pass here began (each takeover is told once; the same members settling again, after one
    /// left and came back, move the same CRs anew).
    taken_over: Mutex<(u64, HashSet<String>)>,
    /// Ticks whenever what this replica may reconcile can have changed.
    changed: tokio::sync::watch::Sender<()>,
    /// The `shardSelector` of this replica's ranges in the current ring, for its CR watches (which
    /// restart, to list anew, whenever it changes).
    selector: tokio::sync::watch::Sender<ShardFilter>,
    /// This replica's ranges in the current ring, and those of them the last change added to what
    /// it held before (listed first, ahead of all of its ranges: `shard_watch::gained_first`).
    ranges: Mutex<(Vec<HashRange>, Vec<HashRange>)>,
    /// Whether the apiserver has sent CRs outside the ranges asked for (its feature gate is off):
    /// then the ranges gained are not listed on their own, since every CR would come.
    selector_ignored: AtomicBool,
    /// Whether the apiserver refused a field selector on the CRs' source fields (CRDs from before
    /// they were declared selectable): then the CRs of sources changed lately are not listed ahead.
    source_fields_refused: AtomicBool,
    /// `projection_shard_members`, `projection_shard_ring_changes_total`,
    /// `projection_shard_fenced_passes_total`, `projection_shard_takeover_seconds`.
    metrics: (
        prometheus_client::metrics::gauge::Gauge,
        prometheus_client::metrics::counter::Counter,
        prometheus_client::metrics::counter::Counter,
        prometheus_client::metrics::histogram::Histogram,
    ),
    /// `projection_shard_sent_first_total`.
    sent_first: prometheus_client::metrics::counter::Counter,
}

/// A pass under way; ends (for the acknowledgement) when dropped.
pub struct Running {
    shard: Arc<Shard>,
    uid: String,
    /// Set on the first pass of a CR the ring moved to this replica.
    pub takeover: Option<Takeover>,
}

/// The first pass of a CR on the replica the ring moved it to.
pub struct Takeover {
    /// The replica that reconciled it before.
    pub from: String,
    /// The version of the ring that moved it.
    pub ring: String,
    /// When this replica saw the ring of members that moved it.
    pub since: Instant,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.shard.running.lock().expect("running passes");
        if let Some(count) = running.get_mut(&self.uid) {
            *count -= 1;
            if *count == 0 {
                running.remove(&self.uid);
            }
        }
    }
}

impl Shard {
    pub fn new(
        me: &str,
        namespace: &str,
        duration: Duration,
        metrics: &crate::metrics::Metrics,
    ) -> Arc<Self> {
        Arc::new(Self {
            me: me.to_owned(),
            lease_name: lease_name(me),
            namespace: namespace.to_owned(),
            duration,
            view: RwLock::default(),
            valid_until: Mutex::default(),
            running: Mutex::default(),
            held: Mutex::default(),
            ring_since: Mutex::default(),
            taken_over: Mutex::default(),
            changed: tokio::sync::watch::Sender::new(()),
            selector: tokio::sync::watch::Sender::new(ShardFilter::Nothing),
            ranges: Mutex::default(),
            selector_ignored: AtomicBool::new(false),
            source_fields_refused: AtomicBool::new(false),
            metrics: (
                metrics.shard_members.clone(),
                metrics.shard_ring_changes_total.clone(),
                metrics.shard_fenced_passes_total.clone(),
                metrics.shard_takeover_seconds.clone(),
            ),
            sent_first: metrics.shard_sent_first_total.clone(),
        })
    }

    /// Whether the current ring gives this replica the CR with this uid (what its CR stores keep).
    pub fn owns(&self, uid: &str) -> bool {
        self.view
            .read()
            .expect("view")
            .current()
            .is_some_and(|ring| ring.owner_of(uid) == Some(self.me.as_str()))
    }

    /// Whether the current ring gives the CR with this uid to another replica.
    pub fn owned_by_another(&self, uid: &str) -> bool {
        self.view
            .read()
            .expect("view")
            .current()
            .is_some_and(|ring| ring.owner_of(uid).is_some_and(|owner| owner != self.me))
    }

    /// Whether a pass of the CR with this uid runs on this replica.
    pub fn running(&self, uid: &str) -> bool {
        self.running.lock().expect("running passes").contains_key(uid)
    }

    /// The selector of this replica's ranges, and its changes.
    pub fn selector(&self) -> tokio::sync::watch::Receiver<ShardFilter> {
        self.selector.subscribe()
    }

    fn lease_valid(&self) -> bool {
        self.valid_until
            .lock()
            .expect("lease validity")
            .is_some_and(|until| Instant::now() < until)
    }

    /// Resolves once this replica's Lease validity has lapsed (not renewed in time, or stopping):
    /// the fence a pass runs within. A renewal meanwhile pushes it further.
    async fn lapsed(&self) {
        loop {
            let until = *self.valid_until.lock().expect("lease validity");
            match until {
                Some(until) if Instant::now() < until => tokio::time::sleep_until(until.into()).await,
                _ => return,
            }
        }
    }

    /// Runs `pass` (of the CR `cr`) within the fence: `None` when it was cut short because this
    /// replica's Lease lapsed first. No request of the pass (a copy's write or removal, the
    /// finalizer, the status) starts after that, since the others may take the CR once they see the
    /// Lease expire; its owner then (this replica, renewed, or another) runs the pass anew: a copy
    /// is written only where it differs, and a finalizer's cleanup is redone. A request already sent
    /// may still land: the fence lapses at two thirds of the Lease, a third before the others act.
    pub async fn within_fence<T>(
        &self,
        pass: impl std::future::Future<Output = T>,
        (uid, cr): (&str, &str),
    ) -> Option<T> {
        // The fence first: a pass whose fence has lapsed does not take one more step.
        tokio::select! {
            biased;
            () = self.lapsed() => {
                self.metrics.2.inc();
                self.hold(uid);
                tracing::warn!(cr, "a pass was cut short: this replica's member Lease lapsed before it ended");
                None
            }
            ended = pass => Some(ended),
        }
    }

    /// The ranges the last change of the ring added to this replica's, to list ahead of all of
    /// them, with their selector; `None` when there are none, or the apiserver ignores selectors.
    pub fn gained_first(&self) -> Option<(ShardFilter, Vec<HashRange>)> {
        let added = self.ranges.lock().expect("ranges").1.clone();
        (!added.is_empty() && !self.selector_ignored.load(Ordering::Acquire))
            .then(|| (shard_selector(&added), added))
    }

    /// The apiserver sent CRs outside the ranges asked for: it ignores selectors.
    pub fn selector_ignored(&self) {
        self.selector_ignored.store(true, Ordering::Release);
    }

    /// Whether the CRs' source fields may be selected on (no list by them was refused yet).
    pub fn source_fields_selectable(&self) -> bool {
        !self.source_fields_refused.load(Ordering::Acquire)
    }

    /// The apiserver refused a field selector on the CRs' source fields; whether this is the first
    /// refusal (to tell once).
    pub fn source_fields_refused(&self) -> bool {
        !self.source_fields_refused.swap(true, Ordering::AcqRel)
    }

    /// Whether this replica may reconcile the CR with this uid now.
    pub fn may_reconcile(&self, uid: &str) -> bool {
        self.lease_valid() && self.view.read().expect("view").may_reconcile(&self.me, uid)
    }

    /// Starts a pass of the CR with this uid, if this replica may.
    pub fn begin(self: &Arc<Self>, uid: &str) -> Option<Running> {
        if !self.lease_valid() {
            self.hold(uid);
            return None;
        }
        if !self.may_reconcile(uid) {
            return None;
        }
        *self
            .running
            .lock()
            .expect("running passes")
            .entry(uid.to_owned())
            .or_default() += 1;
        Some(Running {
            shard: self.clone(),
            uid: uid.to_owned(),
            takeover: self.takeover_of(uid),
        })
    }

    /// Whether the CR with this uid moved here when the members last settled and its first pass
    /// here has not begun: the replica's resend hands those to the reconcilers (the ones reading a
    /// source changed meanwhile first), so its CR watch leaves them be.
    pub fn awaiting_takeover(&self, uid: &str) -> bool {
        let settlement = {
            let view = self.view.read().expect("view");
            if view.taken_over_from(&self.me, uid).is_none() {
                return false;
            }
            view.settlement()
        };
        let taken_over = self.taken_over.lock().expect("takeovers");
        taken_over.0 != settlement || !taken_over.1.contains(uid)
    }

    /// Counts CRs taken over and handed to the reconcilers first because their source changed
    /// lately.
    pub fn sent_first(&self, crs: usize) {
        self.sent_first.inc_by(crs as u64);
    }

    /// A CR watch has listed anew (its store now holds what the ranges gave it): the CRs that
    /// moved here are in it, for the resend to hand over.
    pub fn relisted(&self) {
        self.changed.send_replace(());
    }

    /// Whether this pass is the first of the CR with this uid here since the ring moved it to this
    /// replica, and from whom.
    fn takeover_of(&self, uid: &str) -> Option<Takeover> {
        let (from, ring, settlement) = {
            let view = self.view.read().expect("view");
            (
                view.taken_over_from(&self.me, uid)?.to_owned(),
                view.settled_version()?,
                view.settlement(),
            )
        };
        {
            let mut taken_over = self.taken_over.lock().expect("takeovers");
            if taken_over.0 != settlement {
                *taken_over = (settlement, HashSet::new());
            }
            if !taken_over.1.insert(uid.to_owned()) {
                return None;
            }
        }
        let since = match &*self.ring_since.lock().expect("ring since") {
            Some((version, at)) if *version == ring => *at,
            _ => Instant::now(),
        };
        Some(Takeover { from, ring, since })
    }

    /// Tells that the pass of a CR taken over ended: the event on the CR (who reconciles it now, and
    /// who did before), the time it took since the membership changed.
    pub async fn took_over(&self, takeover: Takeover, about: &ObjectReference, events: &Events) {
        let took = takeover.since.elapsed();
        self.metrics.3.observe(took.as_secs_f64());
        events
            .publish(
                about,
                Reason::OwnerChanged,
                format!(
                    "reconciled by replica {} now, taken over from {} (ring {}, {} ms after the membership changed)",
                    self.me,
                    takeover.from,
                    takeover.ring,
                    took.as_millis()
                ),
            )
            .await;
    }

    /// Remembers that the pass of the CR with this uid waits for the Lease to be valid again.
    fn hold(&self, uid: &str) {
        self.held.lock().expect("held passes").insert(uid.to_owned());
    }

    /// The held CRs (cut short or not started for want of a valid Lease) this replica may reconcile
    /// now, no longer held.
    pub fn release_held(&self) -> HashSet<String> {
        let mut held = self.held.lock().expect("held passes");
        let now: HashSet<String> = held
            .iter()
            .filter(|uid| self.may_reconcile(uid))
            .cloned()
            .collect();
        // A CR the ring gives another replica now is that one's to run.
        held.retain(|uid| !now.contains(uid) && self.owns(uid));
        now
    }

    /// Ticks whenever what this replica may reconcile can have changed.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Starts the membership on a thread of its own, with a runtime and an apiserver client of its
    /// own (made by `connect`): under load, thousands of passes queued on the controller's runtime,
    /// and their requests on its connections, delayed a renewal past the fence (a Lease lapsed with
    /// a 15 s duration on two busy cores, and the passes it cut short lost their events). The
    /// handle ends once the Lease is deleted (see [`Shard::run`]).
    pub fn start<F>(
        self: Arc<Self>,
        connect: impl FnOnce() -> F + Send + 'static,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()>
    where
        F: std::future::Future<Output = anyhow::Result<Client>>,
    {
        tokio::task::spawn_blocking(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => {
                    tracing::error!(error = %e, "could not start the member Lease's runtime; stopping");
                    stop.cancel();
                    return;
                }
            };
            runtime.block_on(async move {
                match connect().await {
                    Ok(client) => self.run(client, stop).await,
                    Err(e) => {
                        tracing::error!(error = %e, "could not make the member Lease's apiserver client; stopping");
                        stop.cancel();
                    }
                }
            });
        })
    }

    /// Reads the members and renews this replica's Lease until `stop`, side by side (a slow read of
    /// the members never delays a renewal), then deletes the Lease so its CRs move at once.
    pub async fn run(self: Arc<Self>, client: Client, stop: CancellationToken) {
        let api: Api<Lease> = Api::namespaced(client, &self.namespace);
        let members = ListParams::default().labels(&format!("{MEMBER_LABEL}=true"));
        // The members first, as they are before this replica's Lease joins them: the ring that held
        // its CRs until now, whom it tells it took them from.
        self.observe_members_in_time(&api, &members).await;
        tokio::join!(
            self.keep_observing(&api, &members, &stop),
            self.renew(&api, &stop)
        );
        // No pass starts any more; those running end (the controller drains them) before the Lease
        // goes and another replica may take their CRs.
        *self.valid_until.lock().expect("lease validity") = None;
        let drained = Instant::now() + self.duration;
        while !self.running.lock().expect("running passes").is_empty() && Instant::now() < drained {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Bounded: a stop must not wait on a connection that fell silent (the others take the CRs
        // once the Lease expires anyway). A try that hangs is given up and the second goes out as a
        // new request, as a renewal's does.
        for attempt in 1..=2 {
            match tokio::time::timeout(
                self.request_limit().min(STOP_DELETE_TRY),
                api.delete(&self.lease_name, &DeleteParams::default()),
            )
            .await
            {
                Ok(Ok(_)) => {
                    tracing::info!(
                        lease = self.lease_name,
                        "member Lease deleted: the others take its CRs"
                    );
                    return;
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, lease = self.lease_name, "could not delete the member Lease");
                    return;
                }
                Err(_) if attempt == 1 => {}
                Err(_) => tracing::warn!(
                    lease = self.lease_name,
                    "could not delete the member Lease in time: the others take its CRs once it expires"
                ),
            }
        }
    }

    /// How long a request of the membership may take before it is given up (the next goes out as a
    /// new request): a third of the Lease, so that a renewal stuck on a connection that fell silent
    /// still leaves time for another before the fence lapses.
    fn request_limit(&self) -> Duration {
        self.duration / 3
    }

    /// Reads the member Leases, giving the read up after [`Shard::request_limit`]: a read stuck on a
    /// connection that fell silent would otherwise freeze this replica's view of the ring until the
    /// client's own timeout (a minute), and hold up its stop.
    async fn observe_members_in_time(&self, api: &Api<Lease>, members: &ListParams) {
        if tokio::time::timeout(self.request_limit(), self.observe_members(api, members))
            .await
            .is_err()
        {
            tracing::warn!(
                "a read of the member Leases took over a third of the Lease's duration; reading again"
            );
        }
    }

    /// Reads the member Leases every second until `stop`.
    async fn keep_observing(&self, api: &Api<Lease>, members: &ListParams, stop: &CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return,
            }
            // A stop does not wait for the read in flight.
            tokio::select! {
                () = self.observe_members_in_time(api, members) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// Reads the member Leases: the ring, this replica's ranges and selector follow them.
    async fn observe_members(&self, api: &Api<Lease>, members: &ListParams) {
        let list = match api.list(members).await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the member Leases");
                return;
            }
        };
        self.delete_long_expired(api, &list.items).await;
        let leases: Vec<MemberLease> = list.items.iter().filter_map(MemberLease::of).collect();
        let changed = self
            .view
            .write()
            .expect("view")
            .observe(&leases, SystemTime::now());
        if changed {
            self.follow_ring();
        }
    }

    /// After the members changed: this replica's selector, the ring's metrics, and a tick to those
    /// that decide what it may reconcile.
    fn follow_ring(&self) {
        let view = self.view.read().expect("view");
        let ranges = view
            .current()
            .map(|ring| ring.ranges_of(&self.me))
            .unwrap_or_default();
        let selector = shard_selector(&ranges);
        {
            let mut held = self.ranges.lock().expect("ranges");
            let added = gained(&ranges, &held.0);
            // Only a part of the new ranges is worth a list of its own (not at the start, when it
            // is all of them).
            let part = if added == ranges { Vec::new() } else { added };
            *held = (ranges, part);
        }
        let moved = self.selector.send_if_modified(|current| {
            let modified = *current != selector;
            *current = selector;
            modified
        });
        if let Some(version) = view.current().map(|ring| ring.version()) {
            let mut since = self.ring_since.lock().expect("ring since");
            if since.as_ref().is_none_or(|(seen, _)| *seen != version) {
                *since = Some((version, Instant::now()));
            }
        }
        let members = view.current().map_or(0, |ring| ring.members().len());
        self.metrics.0.set(i64::try_from(members).unwrap_or(i64::MAX));
        if moved {
            self.metrics.1.inc();
        }
        tracing::info!(
            identity = self.me,
            members,
            ring = view.current().map(|ring| ring.version()).unwrap_or_default(),
            "shard membership changed"
        );
        self.changed.send_replace(());
    }

    /// Renews this replica's Lease every third of its duration until `stop`, and at once when there
    /// is a ring version to acknowledge (checked every second and whenever the members change).
    async fn renew(&self, api: &Api<Lease>, stop: &CancellationToken) {
        let mut published: Option<String> = None;
        let mut published_settled: Option<Ring> = None;
        let mut renewed: Option<Instant> = None;
        let mut changed = self.subscribe();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = changed.changed() => {}
                () = stop.cancelled() => return,
            }
            let (acknowledgeable, settled) = {
                let running = self.running.lock().expect("running passes");
                let view = self.view.read().expect("view");
                (
                    view.acknowledgeable(&self.me, running.keys().map(String::as_str)),
                    view.settled().cloned(),
                )
            };
            let due = renewed.is_none_or(|at| at.elapsed() >= self.duration / 3);
            let acknowledging = acknowledgeable.is_some() && acknowledgeable != published;
            // A settlement is said at once: a replica joining meanwhile reads in it who had the CRs
            // it takes (until then, the others' Leases name a ring that may be past).
            let settling = settled != published_settled;
            if !(due || acknowledging || settling) {
                continue;
            }
            let acknowledged = acknowledgeable.or_else(|| published.clone());
            let sent = Instant::now();
            let lease = self.lease(acknowledged.as_deref(), settled.as_ref());
            // A renewal that hangs is given up in time for the next one (on a new request) to still
            // keep the fence: one stuck on a silent connection would otherwise hold the loop.
            let patched = tokio::time::timeout(
                self.request_limit(),
                api.patch(
                    &self.lease_name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&lease),
                ),
            )
            .await;
            match patched {
                Ok(Ok(_)) => {
                    let was_valid = self.lease_valid();
                    if !was_valid {
                        // Back from a lapse (or starting): trust no ring settled before it.
                        self.view.write().expect("view").lapsed();
                    }
                    *self.valid_until.lock().expect("lease validity") = Some(sent + self.duration * 2 / 3);
                    renewed = Some(sent);
                    published = acknowledged;
                    published_settled = settled;
                    if !was_valid {
                        self.changed.send_replace(());
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, lease = self.lease_name, "could not renew the member Lease")
                }
                Err(_) => tracing::warn!(
                    lease = self.lease_name,
                    "a renewal of the member Lease took over a third of its duration; trying again"
                ),
            }
        }
    }

    /// Deletes the Leases of members gone for three of their durations (a replaced pod's name never
    /// comes back), each only as it was read: one renewed meanwhile stays.
    async fn delete_long_expired(&self, api: &Api<Lease>, leases: &[Lease]) {
        let now = SystemTime::now();
        for lease in leases {
            let Some(member) = MemberLease::of(lease) else {
                continue;
            };
            if member.renewed + member.duration * 4 > now {
                continue;
            }
            let (Some(name), Some(version)) = (&lease.metadata.name, &lease.metadata.resource_version) else {
                continue;
            };
            let only_as_read = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    resource_version: Some(version.clone()),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(name, &only_as_read).await {
                Ok(_) => tracing::info!(
                    lease = name,
                    identity = member.identity,
                    "deleted the Lease of a member gone"
                ),
                Err(e) => tracing::debug!(error = %e, lease = name, "did not delete a gone member's Lease"),
            }
        }
    }

    fn lease(&self, acknowledged: Option<&str>, settled: Option<&Ring>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.lease_name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([(MEMBER_LABEL.to_owned(), "true".to_owned())])),
                annotations: MemberLease::annotations(acknowledged, settled),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.me.clone()),
                lease_duration_seconds: Some(i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX)),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..LeaseSpec::default()
            }),
        }
    }
}

/// The Lease of a member: `projection-member-<identity>`, cut to a valid name.
fn lease_name(identity: &str) -> String {
    let mut name = format!("projection-member-{identity}").to_lowercase();
    name.truncate(253);
    name.trim_end_matches(['-', '.']).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_valid_for_any_pod_name() {
        assert_eq!(
            lease_name("Projection-Controller-7c9d-x2"),
            "projection-member-projection-controller-7c9d-x2"
        );
        assert!(lease_name(&"a-".repeat(200)).len() <= 253);
        assert!(!lease_name(&"a-".repeat(200)).ends_with('-'));
    }

    #[tokio::test]
    async fn a_pass_outliving_the_lease_is_cut_short_and_one_within_it_ends() {
        let metrics =
            crate::metrics::Metrics::register(&mut prometheus_client::registry::Registry::default());
        let shard = Shard::new("replica-1", "ns", Duration::from_secs(3), &metrics);
        let valid_for = |d: Duration| *shard.valid_until.lock().expect("validity") = Some(Instant::now() + d);
        // Never renewed: the fence is closed, nothing of a pass runs.
        let ran = std::sync::atomic::AtomicBool::new(false);
        let pass = async { ran.store(true, std::sync::atomic::Ordering::SeqCst) };
        assert_eq!(shard.within_fence(pass, ("u1", "a/never")).await, None);
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst), "not a step of it");
        // A pass that ends within the validity ends.
        valid_for(Duration::from_secs(5));
        assert_eq!(shard.within_fence(async { 7 }, ("u2", "a/quick")).await, Some(7));
        // One still waiting (on a slow apiserver) when the validity lapses stops there: what would
        // follow the wait (a write) never starts.
        valid_for(Duration::from_millis(100));
        let wrote = std::sync::atomic::AtomicBool::new(false);
        let slow = async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            wrote.store(true, std::sync::atomic::Ordering::SeqCst);
        };
        let started = Instant::now();
        assert_eq!(shard.within_fence(slow, ("u3", "a/slow")).await, None);
        assert!(started.elapsed() < Duration::from_millis(400));
        assert!(!wrote.load(std::sync::atomic::Ordering::SeqCst));
        // A renewal during the pass pushes the fence further: the pass ends.
        valid_for(Duration::from_millis(100));
        let renewing = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            valid_for(Duration::from_secs(5));
            tokio::time::sleep(Duration::from_millis(200)).await;
            "ended"
        };
        assert_eq!(
            shard.within_fence(renewing, ("u4", "a/renewed")).await,
            Some("ended")
        );
        assert_eq!(metrics.shard_fenced_passes_total.get(), 2);
        // The two cut short are held for when the Lease is valid again (and the ring gives them).
        assert_eq!(
            shard.held.lock().expect("held").clone(),
            HashSet::from(["u1".to_owned(), "u3".to_owned()])
        );
    }

    #[test]
    fn a_lease_round_trips_into_what_the_ring_reads() {
        let metrics =
            crate::metrics::Metrics::register(&mut prometheus_client::registry::Registry::default());
        let shard = Shard::new("replica-1", "ns", Duration::from_secs(15), &metrics);
        let settled = Ring::new(["replica-2", "replica-1"]);
        let lease = shard.lease(Some("ring-0123456789ab"), Some(&settled));
        let member = MemberLease::of(&lease).expect("a member");
        assert_eq!(member.identity, "replica-1");
        assert_eq!(member.duration, Duration::from_secs(15));
        assert_eq!(member.acknowledged.as_deref(), Some("ring-0123456789ab"));
        assert_eq!(member.settled_members.as_deref(), Some(settled.members()));
        assert!(member.is_live(SystemTime::now()));
        assert!(
            !shard.may_reconcile("any"),
            "nothing before its Lease is renewed and the ring settled"
        );
    }
}
