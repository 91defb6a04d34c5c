//! A short-lived memory of the SubjectAccessReviews that said "allowed", so a burst of admission
//! requests from one author about one source asks the apiserver once. Only grants are kept: a
//! denial is asked again every time, so a new grant takes effect at once, while a revocation takes
//! effect at the latest when the kept grant expires (the TTL). The size is bounded in count and in
//! bytes (the user's groups and extra come from the request and can be large): when full, the grant
//! closest to expiring is forgotten first, and a question larger than [`MAX_QUESTION_BYTES`] is
//! never kept. Pure: the caller passes the clock.

use k8s_openapi::api::authentication::v1::UserInfo;
use kube::discovery::ApiResource;
use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

/// Everything one SubjectAccessReview asks: who (user, uid, groups, extra) may do what (verb) to
/// which object (group, resource, namespace, name). Two requests share an answer only when all of
/// it is equal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GrantKey {
    pub user: Option<String>,
    pub uid: Option<String>,
    pub groups: Option<Vec<String>>,
    pub extra: Option<BTreeMap<String, Vec<String>>>,
    pub group: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub verb: String,
}

/// A question larger than this (its strings, with the user's groups and extra) is never kept: a
/// real user's identity is far smaller, a forged one must not fill the cache.
pub const MAX_QUESTION_BYTES: usize = 4 * 1024;

/// What a kept grant costs besides its strings: the question's own struct, the `Arc`, the map and
/// queue entries (an estimate on the high side).
const ENTRY_OVERHEAD_BYTES: usize = std::mem::size_of::<GrantKey>() + 96;
/// What each string costs besides its bytes: the `String` itself in its `Vec` or map.
const STRING_OVERHEAD_BYTES: usize = std::mem::size_of::<String>();

impl GrantKey {
    /// The bytes keeping this question costs (its strings, the user's groups and extra included, and
    /// an estimate of the bookkeeping around them).
    pub fn size_bytes(&self) -> usize {
        let string = |s: &String| s.len() + STRING_OVERHEAD_BYTES;
        let optional = |s: &Option<String>| s.as_ref().map_or(0, string);
        let groups = self.groups.as_ref().map_or(0, |g| g.iter().map(string).sum());
        let extra = self.extra.as_ref().map_or(0, |extra| {
            extra
                .iter()
                // A BTreeMap entry: the key, its Vec and the node share (estimated).
                .map(|(k, v)| string(k) + 32 + v.iter().map(string).sum::<usize>())
                .sum()
        });
        ENTRY_OVERHEAD_BYTES
            + optional(&self.user)
            + optional(&self.uid)
            + groups
            + extra
            + [
                &self.group,
                &self.resource,
                &self.namespace,
                &self.name,
                &self.verb,
            ]
            .into_iter()
            .map(string)
            .sum::<usize>()
    }

    /// May `user` `verb` the object `name` of `resource` in `namespace`?
    pub fn new(user: &UserInfo, resource: &ApiResource, namespace: &str, name: &str, verb: &str) -> Self {
        Self {
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            group: resource.group.clone(),
            resource: resource.plural.clone(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            verb: verb.to_owned(),
        }
    }
}

/// Grants kept for `ttl` each, at most `capacity` of them and `max_bytes` in all.
#[derive(Debug)]
pub struct AllowedAnswers {
    ttl: Duration,
    capacity: usize,
    max_bytes: usize,
    /// The sum of `size_bytes` of the kept questions.
    bytes: usize,
    expiry: HashMap<Arc<GrantKey>, Instant>,
    /// The kept grants in the order they were kept, which (one TTL for all) is the order they
    /// expire in: expired and evicted grants leave from the front.
    order: VecDeque<(Arc<GrantKey>, Instant)>,
}

impl AllowedAnswers {
    /// Keeps grants for `ttl`, at most `capacity` at a time and `max_bytes` in all (see
    /// [`GrantKey::size_bytes`]); a zero `ttl`, `capacity` or `max_bytes` keeps nothing.
    pub fn new(ttl: Duration, capacity: usize, max_bytes: usize) -> Self {
        Self {
            ttl,
            capacity,
            max_bytes,
            bytes: 0,
            expiry: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Whether anything is ever kept.
    pub fn enabled(&self) -> bool {
        !self.ttl.is_zero() && self.capacity > 0 && self.max_bytes > 0
    }

    /// Whether `question` was granted less than the TTL before `now`.
    pub fn is_granted(&self, question: &GrantKey, now: Instant) -> bool {
        self.expiry.get(question).is_some_and(|expires| now < *expires)
    }

    /// Keeps the grant of `question`, given at `now`. A grant still kept keeps its first expiry, so
    /// a grant asked about without a pause is still asked again once per TTL.
    pub fn remember(&mut self, question: GrantKey, now: Instant) {
        let size = question.size_bytes();
        if !self.enabled() || size > MAX_QUESTION_BYTES.min(self.max_bytes) {
            return;
        }
        self.forget_expired(now);
        match self.expiry.get(&question) {
            Some(expires) if now < *expires => return,
            // Expired but not yet at the front (the caller's clock went back): replace it; its old
            // place in `order` no longer matches and is skipped when it reaches the front.
            Some(_) => {
                self.expiry.remove(&question);
                self.bytes -= size;
            }
            None => {}
        }
        while !self.expiry.is_empty()
            && (self.expiry.len() >= self.capacity || self.bytes + size > self.max_bytes)
        {
            self.pop_front();
        }
        let (question, expires) = (Arc::new(question), now + self.ttl);
        self.expiry.insert(question.clone(), expires);
        self.bytes += size;
        self.order.push_back((question, expires));
    }

    /// How many grants are kept.
    pub fn len(&self) -> usize {
        self.expiry.len()
    }

    /// The bytes the kept grants cost (see [`GrantKey::size_bytes`]).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether no grant is kept.
    pub fn is_empty(&self) -> bool {
        self.expiry.is_empty()
    }

    fn forget_expired(&mut self, now: Instant) {
        while self.order.front().is_some_and(|(_, expires)| *expires <= now) {
            self.pop_front();
        }
    }

    /// Forgets the oldest kept grant (unless its key was kept again since, with a new expiry).
    fn pop_front(&mut self) {
        if let Some((question, expires)) = self.order.pop_front()
            && self.expiry.get(&question) == Some(&expires)
        {
            self.expiry.remove(&question);
            self.bytes -= question.size_bytes();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(5);
    const MIB: usize = 1024 * 1024;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            username: Some(name.to_owned()),
            uid: Some(format!("{name}-uid")),
            groups: Some(groups.iter().map(|g| (*g).to_owned()).collect()),
            extra: None,
        }
    }

    fn secrets() -> ApiResource {
        ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "Secret".into(),
            plural: "secrets".into(),
        }
    }

    fn question(user: &UserInfo, name: &str) -> GrantKey {
        GrantKey::new(user, &secrets(), "platform", name, "get")
    }

    #[test]
    fn a_grant_is_kept_for_the_ttl_and_no_longer() {
        let t0 = Instant::now();
        let alice = question(&user("alice", &["tenants"]), "db");
        let mut answers = AllowedAnswers::new(TTL, 10, MIB);
        assert!(!answers.is_granted(&alice, t0), "nothing kept yet");
        answers.remember(alice.clone(), t0);
        for (after, granted) in [
            (Duration::ZERO, true),
            (Duration::from_millis(4999), true),
            (TTL, false),
            (Duration::from_secs(60), false),
        ] {
            assert_eq!(answers.is_granted(&alice, t0 + after), granted, "after {after:?}");
        }
    }

    #[test]
    fn every_part_of_the_question_is_in_the_key() {
        let t0 = Instant::now();
        let alice = user("alice", &["tenants"]);
        let granted = question(&alice, "db");
        let mut answers = AllowedAnswers::new(TTL, 10, MIB);
        answers.remember(granted.clone(), t0);
        let with_extra = UserInfo {
            extra: Some(BTreeMap::from([("scopes".to_owned(), vec!["read".to_owned()])])),
            ..alice.clone()
        };
        let other_uid = UserInfo {
            uid: Some("recreated-alice".into()),
            ..alice.clone()
        };
        let other_group = ApiResource {
            group: "example.com".into(),
            ..secrets()
        };
        let cases = [
            ("user", question(&user("mallory", &["tenants"]), "db")),
            ("uid", question(&other_uid, "db")),
            ("groups", question(&user("alice", &["tenants", "admins"]), "db")),
            ("extra", question(&with_extra, "db")),
            ("name", question(&alice, "other")),
            (
                "namespace",
                GrantKey::new(&alice, &secrets(), "elsewhere", "db", "get"),
            ),
            (
                "group",
                GrantKey::new(&alice, &other_group, "platform", "db", "get"),
            ),
            (
                "resource",
                GrantKey::new(
                    &alice,
                    &ApiResource {
                        plural: "configmaps".into(),
                        ..secrets()
                    },
                    "platform",
                    "db",
                    "get",
                ),
            ),
            (
                "verb",
                GrantKey::new(&alice, &secrets(), "platform", "db", "list"),
            ),
        ];
        assert!(answers.is_granted(&granted, t0));
        for (differs, other) in cases {
            assert!(
                !answers.is_granted(&other, t0),
                "a different {differs} is another question"
            );
        }
    }

    #[test]
    fn a_grant_asked_about_again_keeps_its_first_expiry() {
        let t0 = Instant::now();
        let alice = question(&user("alice", &[]), "db");
        let mut answers = AllowedAnswers::new(TTL, 10, MIB);
        answers.remember(alice.clone(), t0);
        answers.remember(alice.clone(), t0 + Duration::from_secs(3));
        assert!(!answers.is_granted(&alice, t0 + TTL));
        assert_eq!(answers.len(), 1);
        // Once expired, a new grant is kept for a new TTL.
        answers.remember(alice.clone(), t0 + TTL);
        assert!(answers.is_granted(&alice, t0 + TTL + Duration::from_secs(4)));
        assert_eq!(answers.len(), 1);
    }

    #[test]
    fn when_full_the_grant_closest_to_expiring_goes_first() {
        let t0 = Instant::now();
        let mut answers = AllowedAnswers::new(TTL, 3, MIB);
        let alice = user("alice", &[]);
        let names = ["a", "b", "c", "d", "e"];
        for (i, name) in names.iter().enumerate() {
            answers.remember(question(&alice, name), t0 + Duration::from_millis(i as u64));
            assert!(answers.len() <= 3);
        }
        let now = t0 + Duration::from_millis(10);
        let kept: Vec<&str> = names
            .into_iter()
            .filter(|name| answers.is_granted(&question(&alice, name), now))
            .collect();
        assert_eq!(kept, ["c", "d", "e"]);
        assert_eq!(answers.order.len(), 3, "no stale entries left behind");
    }

    #[test]
    fn expired_grants_are_forgotten_when_the_next_is_kept() {
        let t0 = Instant::now();
        let alice = user("alice", &[]);
        let mut answers = AllowedAnswers::new(TTL, 100, MIB);
        for name in ["a", "b", "c"] {
            answers.remember(question(&alice, name), t0);
        }
        answers.remember(question(&alice, "d"), t0 + TTL);
        assert_eq!(answers.len(), 1);
        assert_eq!(answers.order.len(), 1);
    }

    #[test]
    fn a_clock_going_back_never_serves_an_expired_grant_nor_grows_past_the_bound() {
        let t0 = Instant::now() + Duration::from_secs(100);
        let alice = user("alice", &[]);
        let mut answers = AllowedAnswers::new(TTL, 2, MIB);
        answers.remember(question(&alice, "a"), t0);
        answers.remember(question(&alice, "b"), t0 - Duration::from_secs(10));
        // "b" expired before "a" although kept after it; keeping it again replaces it.
        answers.remember(question(&alice, "b"), t0);
        assert!(answers.is_granted(&question(&alice, "b"), t0));
        answers.remember(question(&alice, "c"), t0);
        assert!(answers.len() <= 2);
        assert!(!answers.is_granted(&question(&alice, "a"), t0 + TTL));
    }

    #[test]
    fn a_zero_ttl_or_capacity_keeps_nothing() {
        let t0 = Instant::now();
        let alice = question(&user("alice", &[]), "db");
        for (ttl, capacity, bytes) in [(Duration::ZERO, 10, MIB), (TTL, 0, MIB), (TTL, 10, 0)] {
            let mut answers = AllowedAnswers::new(ttl, capacity, bytes);
            assert!(!answers.enabled());
            answers.remember(alice.clone(), t0);
            assert!(!answers.is_granted(&alice, t0), "{ttl:?}, {capacity}");
            assert!(answers.is_empty());
        }
    }

    fn with_extra(name: &str, extra_bytes: usize) -> UserInfo {
        UserInfo {
            extra: Some(BTreeMap::from([("k".to_owned(), vec!["x".repeat(extra_bytes)])])),
            ..user(name, &["tenants"])
        }
    }

    #[test]
    fn the_size_counts_every_string_of_the_question() {
        let plain = question(&user("alice", &["tenants"]), "db");
        let base = plain.size_bytes();
        assert!(base > 100 && base < 1024, "{base}");
        let more_groups = question(&user("alice", &["tenants", "a-long-group-name"]), "db");
        assert!(more_groups.size_bytes() >= base + "a-long-group-name".len());
        let extra = question(&with_extra("alice", 3000), "db");
        assert!(extra.size_bytes() >= base + 3000);
        let longer_name = question(&user("alice", &["tenants"]), &"n".repeat(200));
        assert!(longer_name.size_bytes() >= base + 198);
    }

    #[test]
    fn an_oversized_question_is_never_kept() {
        let t0 = Instant::now();
        let forged = question(&with_extra("mallory", MAX_QUESTION_BYTES), "db");
        assert!(forged.size_bytes() > MAX_QUESTION_BYTES);
        let mut answers = AllowedAnswers::new(TTL, 10, MIB);
        answers.remember(forged.clone(), t0);
        assert!(!answers.is_granted(&forged, t0));
        assert!(answers.is_empty());
        assert_eq!(answers.bytes(), 0);
        // Just under the bound is kept.
        let large = question(&with_extra("alice", 3000), "db");
        assert!(large.size_bytes() <= MAX_QUESTION_BYTES);
        answers.remember(large.clone(), t0);
        assert!(answers.is_granted(&large, t0));
        assert_eq!(answers.bytes(), large.size_bytes());
    }

    #[test]
    fn the_byte_budget_holds_and_the_oldest_grants_go_first() {
        let t0 = Instant::now();
        let size = question(&with_extra("u0", 3000), "db").size_bytes();
        // Room for three such grants, not four; far more by count.
        let mut answers = AllowedAnswers::new(TTL, 1000, 3 * size + size / 2);
        for i in 0..10u64 {
            answers.remember(
                question(&with_extra(&format!("u{i}"), 3000), "db"),
                t0 + Duration::from_millis(i),
            );
            assert!(
                answers.bytes() <= 3 * size + size / 2,
                "after {i}: {}",
                answers.bytes()
            );
        }
        assert_eq!(answers.len(), 3);
        let now = t0 + Duration::from_millis(20);
        let kept: Vec<u64> = (0..10)
            .filter(|i| answers.is_granted(&question(&with_extra(&format!("u{i}"), 3000), "db"), now))
            .collect();
        assert_eq!(kept, [7, 8, 9]);
        // Small grants fill what large ones leave; expiry gives every byte back.
        answers.remember(question(&user("alice", &[]), "db"), now);
        answers.remember(question(&user("alice", &[]), "x"), t0 + TTL + TTL);
        assert_eq!(answers.len(), 1);
        assert_eq!(
            answers.bytes(),
            question(&user("alice", &[]), "x").size_bytes(),
            "the accounting matches what is kept"
        );
    }
}
