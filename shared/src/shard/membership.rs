//! Who is a member, and when a replica may reconcile a CR, from the members' Leases.
//!
//! Each replica holds a Lease of its own and writes in it the ring version it has applied and
//! drained (no pass of a CR it no longer owns still running): its acknowledgement. A CR that moves
//! is taken up by its new owner only once every live member has acknowledged the ring that moved
//! it, so the old owner has stopped first; a CR that stays where it was never waits. A member whose
//! Lease expired is no longer live: its CRs move without its acknowledgement.

use super::ring::Ring;
use k8s_openapi::api::coordination::v1::Lease;
use std::time::{Duration, SystemTime};

/// The label every member Lease carries (how members, and `kubectl projection status`, find them).
pub const MEMBER_LABEL: &str = "projection.sh/controller-member";
/// The annotation in which a member says the ring version it has applied and drained.
pub const ACKNOWLEDGED_ANNOTATION: &str = "projection.sh/ring-version";
/// The annotation in which a member lists, as a JSON array, the members of the last ring it saw
/// every live member acknowledge: what tells a replica that joins while the others have not yet
/// settled (a pod replacing one just deleted) who had the CRs it takes.
pub const SETTLED_MEMBERS_ANNOTATION: &str = "projection.sh/ring-settled-members";

/// What a replica reads in one member's Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberLease {
    pub identity: String,
    /// `spec.renewTime`.
    pub renewed: SystemTime,
    /// `spec.leaseDurationSeconds`.
    pub duration: Duration,
    /// The ring version it has applied and drained, if it said one.
    pub acknowledged: Option<String>,
    /// The members of the last ring it saw settled, if it said them (and they parse).
    pub settled_members: Option<Vec<String>>,
}

impl MemberLease {
    /// What the ring needs of a member Lease; `None` for one without a holder or a renewal.
    pub fn of(lease: &Lease) -> Option<Self> {
        let spec = lease.spec.as_ref()?;
        let annotation = |key: &str| lease.metadata.annotations.as_ref()?.get(key);
        Some(Self {
            identity: spec.holder_identity.clone()?,
            renewed: SystemTime::from(spec.renew_time.as_ref()?.0),
            duration: Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?),
            acknowledged: annotation(ACKNOWLEDGED_ANNOTATION).cloned(),
            settled_members: annotation(SETTLED_MEMBERS_ANNOTATION)
                .and_then(|members| serde_json::from_str(members).ok()),
        })
    }

    /// The annotations a member writes in its Lease: the ring version it acknowledges and the
    /// members of the ring it saw settled last.
    pub fn annotations(
        acknowledged: Option<&str>,
        settled: Option<&Ring>,
    ) -> Option<std::collections::BTreeMap<String, String>> {
        let mut annotations = std::collections::BTreeMap::new();
        if let Some(version) = acknowledged {
            annotations.insert(ACKNOWLEDGED_ANNOTATION.to_owned(), version.to_owned());
        }
        if let Some(ring) = settled {
            let members = serde_json::to_string(ring.members()).expect("strings serialize");
            annotations.insert(SETTLED_MEMBERS_ANNOTATION.to_owned(), members);
        }
        (!annotations.is_empty()).then_some(annotations)
    }

    pub fn is_live(&self, now: SystemTime) -> bool {
        self.renewed + self.duration > now
    }
}

/// A replica's view of the membership: the ring of the live members now, the last ring every
/// live member had acknowledged, and the settled ring before that one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    current: Option<Ring>,
    settled: Option<Ring>,
    previous: Option<Ring>,
    /// How many times the members have settled on a ring: the same members again (one leaves and
    /// comes back) make the same ring version, but a new settlement, whose moves are told anew.
    settlements: u64,
}

impl View {
    /// Takes the Leases read at `now`; says whether what a replica may reconcile can have changed.
    pub fn observe(&mut self, leases: &[MemberLease], now: SystemTime) -> bool {
        let live: Vec<&MemberLease> = leases.iter().filter(|lease| lease.is_live(now)).collect();
        let current = Ring::new(live.iter().map(|lease| lease.identity.clone()));
        let version = current.version();
        let everyone_acknowledged = !live.is_empty()
            && live
                .iter()
                .all(|lease| lease.acknowledged.as_deref() == Some(version.as_str()));
        let before = self.clone();
        if self.settlements == 0 && self.settled.is_none() && self.previous.is_none() {
            self.previous = Self::settled_by_all(&live);
        }
        if everyone_acknowledged && self.settled.as_ref() != Some(&current) {
            // After a lapse there is no settled ring: the one before it stays the previous.
            let before = self.settled.replace(current.clone());
            self.previous = before.or(self.previous.take());
            self.settlements += 1;
        }
        self.current = Some(current);
        *self != before
    }

    /// The ring the live members say they last saw settled, when that tells who had each CR: every
    /// member that says one names the same ring and still acknowledges it, so none has moved on to
    /// a later ring that may have settled since. This is for a replica that has seen no settlement
    /// of its own: one that joined while the others had not yet settled without a member that left
    /// (a pod replaced right after its deletion), whose ring it cannot rebuild from the live
    /// members. Otherwise (a member has acknowledged a later ring, or they disagree) nobody can
    /// tell which of two rings had a moved CR, and the move is not named.
    fn settled_by_all(live: &[&MemberLease]) -> Option<Ring> {
        let saying: Vec<&MemberLease> = live
            .iter()
            .copied()
            .filter(|lease| lease.settled_members.is_some())
            .collect();
        let members = saying.first()?.settled_members.as_ref()?;
        let ring = Ring::new(members.iter().cloned());
        let version = ring.version();
        saying
            .iter()
            .all(|lease| {
                lease.settled_members.as_ref() == Some(members)
                    && lease.acknowledged.as_deref() == Some(version.as_str())
            })
            .then_some(ring)
    }

    /// The last ring every live member had acknowledged, as this replica saw it: what it publishes
    /// for a replica that joins later.
    pub fn settled(&self) -> Option<&Ring> {
        self.settled.as_ref()
    }

    /// This replica's own Lease lapsed (it could not renew it in time): the others may have seen it
    /// expire, taken its CRs and settled on rings it never saw, and the members may be the same
    /// again when it is back (the same ring version, a stale proof). So the settled ring it knew
    /// is no proof any more: it reconciles nothing until every live member has acknowledged the
    /// current ring, by which time whoever held its CRs meanwhile has drained them.
    pub fn lapsed(&mut self) {
        if let Some(before) = self.settled.take() {
            self.previous = Some(before);
        }
    }

    /// The ring of the live members (none before the first `observe`).
    pub fn current(&self) -> Option<&Ring> {
        self.current.as_ref()
    }

    /// Whether `me` may reconcile the CR with this uid: it owns it in the current ring, and either
    /// every live member has acknowledged that ring or it owned the CR in the last ring they had.
    pub fn may_reconcile(&self, me: &str, uid: &str) -> bool {
        let Some(current) = &self.current else {
            return false;
        };
        if current.owner_of(uid) != Some(me) {
            return false;
        }
        match &self.settled {
            Some(settled) if settled == current => true,
            Some(settled) => settled.owner_of(uid) == Some(me),
            None => false,
        }
    }

    /// The member that reconciled the CR with this uid before the settled ring gave it to `me`:
    /// `Some` only for a CR that moved to `me` when the members last settled (not for one `me`
    /// kept, nor on the first ring a replica sees, when it cannot know who had its CRs).
    pub fn taken_over_from(&self, me: &str, uid: &str) -> Option<&str> {
        let (settled, previous) = (self.settled.as_ref()?, self.previous.as_ref()?);
        if settled.owner_of(uid) != Some(me) {
            return None;
        }
        previous.owner_of(uid).filter(|&before| before != me)
    }

    /// The version of the ring every live member last acknowledged.
    pub fn settled_version(&self) -> Option<String> {
        self.settled.as_ref().map(Ring::version)
    }

    /// Which settlement the settled ring is (the count of rings the members have settled on so
    /// far): what tells one settlement from a later one of the same members, whose version is the
    /// same.
    pub fn settlement(&self) -> u64 {
        self.settlements
    }

    /// The version `me` may acknowledge, given the uids of the passes it has running: the current
    /// ring's once none of them is a CR it lost.
    pub fn acknowledgeable<'a>(
        &self,
        me: &str,
        mut running: impl Iterator<Item = &'a str>,
    ) -> Option<String> {
        let current = self.current.as_ref()?;
        running
            .all(|uid| current.owner_of(uid) == Some(me))
            .then(|| current.version())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
    }

    fn lease(identity: &str, renewed: u64, acknowledged: Option<&str>) -> MemberLease {
        MemberLease {
            identity: identity.into(),
            renewed: at(renewed),
            duration: LEASE,
            acknowledged: acknowledged.map(Into::into),
            settled_members: None,
        }
    }

    /// A uid `owner` owns in `ring`, that `other` owned in `before`.
    fn moved_uid(before: &Ring, ring: &Ring, other: &str, owner: &str) -> String {
        (0..10_000)
            .map(|i| format!("uid-{i}"))
            .find(|uid| before.owner_of(uid) == Some(other) && ring.owner_of(uid) == Some(owner))
            .expect("some uid moved")
    }

    #[test]
    fn expired_leases_are_not_members() {
        let mut view = View::default();
        view.observe(&[lease("a", 0, None), lease("b", 10, None)], at(20));
        assert_eq!(view.current().map(Ring::members), Some(&["b".to_string()][..]));
    }

    #[test]
    fn a_moved_cr_waits_for_every_live_acknowledgement_and_a_staying_one_does_not() {
        let one = Ring::new(["a"]);
        let two = Ring::new(["a", "b"]);
        let mut view = View::default();
        view.observe(&[lease("a", 0, Some(&one.version()))], at(1));
        let moving = moved_uid(&one, &two, "a", "b");
        let staying = (0..10_000)
            .map(|i| format!("uid-{i}"))
            .find(|uid| two.owner_of(uid) == Some("a"))
            .expect("a keeps some");
        assert!(view.may_reconcile("a", &moving) && view.may_reconcile("a", &staying));

        // b joins: a stops on what it lost at once; b waits for a's acknowledgement.
        assert!(view.observe(&[lease("a", 0, Some(&one.version())), lease("b", 1, None)], at(2)));
        assert!(!view.may_reconcile("a", &moving));
        assert!(view.may_reconcile("a", &staying));
        assert!(!view.may_reconcile("b", &moving));
        // a may acknowledge only once its pass of the moved CR has ended.
        assert_eq!(view.acknowledgeable("a", [moving.as_str()].into_iter()), None);
        assert_eq!(
            view.acknowledgeable("a", [staying.as_str()].into_iter()),
            Some(two.version())
        );
        view.observe(
            &[
                lease("a", 2, Some(&two.version())),
                lease("b", 2, Some(&two.version())),
            ],
            at(3),
        );
        assert!(view.may_reconcile("b", &moving));
        assert!(!view.may_reconcile("a", &moving));
        // b took the moved CR over from a; a kept the other; a's first ring moved nothing.
        assert_eq!(view.taken_over_from("b", &moving), Some("a"));
        assert_eq!(view.taken_over_from("a", &moving), None);
        assert_eq!(view.taken_over_from("a", &staying), None);
        assert_eq!(view.settled_version(), Some(two.version()));
    }

    #[test]
    fn the_same_members_settling_again_is_a_new_settlement() {
        let two = Ring::new(["a", "b"]);
        let one = Ring::new(["b"]);
        let mut view = View::default();
        let settle = |view: &mut View, ring: &Ring, members: &[&str], t: u64| {
            let leases: Vec<MemberLease> = members
                .iter()
                .map(|m| lease(m, t, Some(&ring.version())))
                .collect();
            view.observe(&leases, at(t));
        };
        settle(&mut view, &two, &["a", "b"], 0);
        let moving = moved_uid(&two, &one, "a", "b");
        // a leaves (its Lease expired), b takes its CRs; a comes back and takes them again; a
        // leaves once more: b's ring has the version of the first time, and the move is new.
        settle(&mut view, &one, &["b"], 20);
        let first = view.settlement();
        assert_eq!(view.taken_over_from("b", &moving), Some("a"));
        settle(&mut view, &two, &["a", "b"], 40);
        assert_eq!(view.taken_over_from("b", &moving), None);
        settle(&mut view, &one, &["b"], 60);
        assert_eq!(view.settled_version(), Some(one.version()));
        assert_eq!(view.taken_over_from("b", &moving), Some("a"));
        assert_ne!(view.settlement(), first);
    }

    #[test]
    fn a_departed_members_crs_move_once_its_lease_expired_without_its_acknowledgement() {
        let two = Ring::new(["a", "b"]);
        let one = Ring::new(["a"]);
        let mut view = View::default();
        let both = [
            lease("a", 0, Some(&two.version())),
            lease("b", 0, Some(&two.version())),
        ];
        view.observe(&both, at(1));
        let orphaned = moved_uid(&two, &one, "b", "a");
        assert!(!view.may_reconcile("a", &orphaned));
        // b stops renewing; while its Lease lasts, its CRs stay with it.
        view.observe(
            &[
                lease("a", 10, Some(&two.version())),
                lease("b", 0, Some(&two.version())),
            ],
            at(14),
        );
        assert!(!view.may_reconcile("a", &orphaned));
        // Expired: a is alone, acknowledges, and takes them.
        view.observe(
            &[
                lease("a", 15, Some(&two.version())),
                lease("b", 0, Some(&two.version())),
            ],
            at(16),
        );
        assert!(
            !view.may_reconcile("a", &orphaned),
            "not before a's own acknowledgement"
        );
        view.observe(
            &[
                lease("a", 16, Some(&one.version())),
                lease("b", 0, Some(&two.version())),
            ],
            at(17),
        );
        assert!(view.may_reconcile("a", &orphaned));
        assert_eq!(view.taken_over_from("a", &orphaned), Some("b"));
        // Read again with nothing changed, the ring before stays the one b was in.
        view.observe(
            &[
                lease("a", 17, Some(&one.version())),
                lease("b", 0, Some(&two.version())),
            ],
            at(18),
        );
        assert_eq!(view.taken_over_from("a", &orphaned), Some("b"));
    }

    #[test]
    fn a_member_back_from_a_lapse_waits_for_everyone_to_acknowledge_even_the_same_ring_again() {
        let two = Ring::new(["a", "b"]);
        let one = Ring::new(["a"]);
        let both = |at_b: u64, ack_a: &Ring, ack_b: &Ring| {
            [
                lease("a", at_b, Some(&ack_a.version())),
                lease("b", at_b, Some(&ack_b.version())),
            ]
        };
        let mut view = View::default();
        view.observe(&both(0, &two, &two), at(1));
        let mine = (0..10_000)
            .map(|i| format!("uid-{i}"))
            .find(|uid| two.owner_of(uid) == Some("b"))
            .expect("b owns some");
        assert!(view.may_reconcile("b", &mine));
        // b is cut off past its Lease: a alone settles on the ring of one and takes b's CRs (b sees
        // none of it). b comes back and renews: the members are a and b again, as b last saw them.
        view.lapsed();
        view.observe(&both(20, &one, &two), at(21));
        assert!(
            !view.may_reconcile("b", &mine),
            "not while a, which held b's CRs meanwhile, has not acknowledged the ring of two"
        );
        view.observe(&both(22, &two, &two), at(23));
        assert!(view.may_reconcile("b", &mine));
        // Taking its CRs back from a, which b cannot name: b never saw the ring of one.
        assert_eq!(view.taken_over_from("b", &mine), None);
    }

    #[test]
    fn nothing_is_reconciled_before_the_first_settled_ring() {
        let mut view = View::default();
        assert!(!view.may_reconcile("a", "uid-1"));
        view.observe(&[lease("a", 0, None)], at(1));
        assert!(!view.may_reconcile("a", "uid-1"));
        assert!(!view.may_reconcile("stranger", "uid-1"));
        // The first settled ring takes nothing over from anyone.
        let alone = Ring::new(["a"]).version();
        view.observe(&[lease("a", 1, Some(&alone))], at(2));
        assert!(view.may_reconcile("a", "uid-1"));
        assert_eq!(view.taken_over_from("a", "uid-1"), None);
    }

    /// A member Lease that acknowledged `acknowledged` and saw `settled` settle last.
    fn saying(identity: &str, renewed: u64, acknowledged: &Ring, settled: &Ring) -> MemberLease {
        MemberLease {
            settled_members: Some(settled.members().to_vec()),
            ..lease(identity, renewed, Some(&acknowledged.version()))
        }
    }

    #[test]
    fn a_replacement_joining_before_the_others_settled_names_the_member_it_replaces() {
        let before = Ring::new(["a", "b", "d"]);
        let after = Ring::new(["a", "b", "n"]);
        let taken = moved_uid(&before, &after, "d", "n");
        // d was deleted; a and b still acknowledge the ring with d when its replacement n looks.
        let others = |t| [saying("a", t, &before, &before), saying("b", t, &before, &before)];
        let mut view = View::default();
        view.observe(&others(10), at(10));
        assert_eq!(view.settled_version(), None, "the ring of a and b is not settled");
        let mut joined = others(11).to_vec();
        joined.push(lease("n", 11, None));
        view.observe(&joined, at(11));
        assert_eq!(view.taken_over_from("n", &taken), None, "not settled yet");
        let settled: Vec<MemberLease> = ["a", "b", "n"]
            .iter()
            .map(|m| saying(m, 12, &after, &before))
            .collect();
        view.observe(&settled, at(12));
        assert_eq!(view.settled_version(), Some(after.version()));
        assert_eq!(view.taken_over_from("n", &taken), Some("d"));
        // What the members now say they saw settle does not rewrite a move already known.
        let later: Vec<MemberLease> = ["a", "b", "n"]
            .iter()
            .map(|m| saying(m, 13, &after, &after))
            .collect();
        view.observe(&later, at(13));
        assert_eq!(view.taken_over_from("n", &taken), Some("d"));
    }

    #[test]
    fn a_replica_names_no_move_when_the_others_disagree_on_the_settled_ring_or_say_none() {
        let before = Ring::new(["a", "b", "d"]);
        let between = Ring::new(["a", "b"]);
        let after = Ring::new(["a", "b", "n"]);
        let taken = moved_uid(&before, &after, "d", "n");
        let settle = |view: &mut View, first: Vec<MemberLease>| {
            view.observe(&first, at(10));
            let all: Vec<MemberLease> = ["a", "b", "n"]
                .iter()
                .map(|m| lease(m, 11, Some(&after.version())))
                .collect();
            view.observe(&all, at(11));
            assert_eq!(view.settled_version(), Some(after.version()));
        };
        // a acknowledges the ring without d, b not yet: the ring with d may be the last they all
        // had, or the one without it, if b acknowledges it before a has said it settled.
        let mut view = View::default();
        settle(
            &mut view,
            vec![
                saying("a", 10, &between, &before),
                saying("b", 10, &before, &before),
            ],
        );
        assert_eq!(view.taken_over_from("n", &taken), None);
        // Both acknowledge the ring without d: it is settled, whatever they said before, and the
        // CR was its owner's there.
        let mut view = View::default();
        settle(
            &mut view,
            vec![
                saying("a", 10, &between, &before),
                saying("b", 10, &between, &before),
            ],
        );
        assert_eq!(view.taken_over_from("n", &taken), between.owner_of(&taken));
        // Replicas starting together: none has seen a settlement, so none moved anything.
        let mut view = View::default();
        settle(&mut view, vec![lease("a", 10, None), lease("b", 10, None)]);
        assert_eq!(view.taken_over_from("n", &taken), None);
    }

    #[test]
    fn a_lease_says_its_acknowledgement_and_settled_members_and_reads_them_back() {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
        let ring = Ring::new(["pod-b", "pod-a"]);
        let annotations = MemberLease::annotations(Some("ring-1"), Some(&ring));
        let written = Lease {
            metadata: ObjectMeta {
                annotations: annotations.clone(),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("pod-a".into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                ..LeaseSpec::default()
            }),
        };
        let read = MemberLease::of(&written).expect("a member Lease");
        assert_eq!(read.acknowledged.as_deref(), Some("ring-1"));
        assert_eq!(read.settled_members, Some(vec!["pod-a".into(), "pod-b".into()]));
        assert_eq!(
            annotations.expect("two")[SETTLED_MEMBERS_ANNOTATION],
            r#"["pod-a","pod-b"]"#
        );
        assert_eq!(MemberLease::annotations(None, None), None);
        // A value that is not a JSON list of names is ignored, not an error.
        let mut garbled = written;
        garbled.metadata.annotations =
            Some([(SETTLED_MEMBERS_ANNOTATION.to_owned(), "a,b".to_owned())].into());
        assert_eq!(
            MemberLease::of(&garbled).expect("a member Lease").settled_members,
            None
        );
    }
}
