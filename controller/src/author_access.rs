//! The author's access, checked where the copies are made: before a pass writes anything, the CR's
//! recorded author (`projection.sh/author`, see `shared::policy::author`) must be allowed to `get` the
//! source and to `create` its kind where the copies go, as the apiserver's authorizer answers a
//! SubjectAccessReview for that author. So tenancy does not rest on the webhook: a CR admitted with
//! the webhook down or bypassed, of a kind not served at admission, or edited to show more, copies
//! only what its author could have copied by hand.
//!
//! Grants are reused for `--author-grant-ttl` (default 60 s; denials never), as the
//! webhook does: a source edit reaches its copies without a round trip to the authorizer; a
//! revoked grant takes effect at the first pass of the CR past the TTL, which the periodic recheck
//! (`crate::author_recheck`) makes happen without anything changing.
//!
//! A question about one source is asked first about every object of its kind in its namespace
//! (`AccessQuestion::widened`): granted, it answers for all of them, so the CRs of one author that
//! read one namespace cost one review per TTL, not one each (a replica taking over thousands of
//! CRs asked thousands). Not granted, the source itself is asked, and the wide question is not
//! asked again for that author within the TTL.
//!
//! Passes that ask one question at the same time share one review: the first sends it, the others
//! wait for its answer (a replica taking over CRs starts a pass in each reconciler slot at once,
//! and each asked before the first answer was in). An answer counts for every pass that began
//! asking before it came, so none of them gets an answer older than its own question.

use crate::metrics::ReviewLabels;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::{Api, Client, api::PostParams};
use prometheus_client::metrics::{counter::Counter, family::Family};
use quick_cache::sync::Cache;
use shared::policy::author::{AccessQuestion, Author};
use std::time::{Duration, Instant};

/// Most grants kept (each a few hundred bytes: the author's record and the question).
const GRANTS_KEPT: usize = 10_000;

/// `--author-access`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum AuthorAccessMode {
    /// The recorded author must be allowed to read the source and create the copies.
    #[default]
    Enforce,
    /// The Go operator's behaviour: the controller's own access is all that counts; only the
    /// webhook checks the author, at admission, and only for callers it authenticates.
    Trusted,
}

/// The authorizer's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Allowed.
    Allowed,
    /// Denied, with the authorizer's reason if it gave one.
    Denied(Option<String>),
}

/// Asks the apiserver's authorizer about authors, reusing grants.
pub struct AuthorAccess {
    mode: AuthorAccessMode,
    /// How long a grant is reused.
    grant_ttl: Duration,
    grants: Cache<(String, AccessQuestion), Instant>,
    /// Wide questions an author was not granted, until when they are not asked again: the question
    /// about the one object is asked instead (a hint, never an answer).
    not_wide: Cache<(String, AccessQuestion), Instant>,
    /// The last answer to each question and when it came: a question asked while another pass's
    /// review of it is on its way waits for that review (the cache's placeholder) and takes its
    /// answer.
    answers: Cache<(String, AccessQuestion), (Instant, Answer)>,
    /// `projection_author_access_reviews_total`.
    reviews: Family<ReviewLabels, Counter>,
}

impl AuthorAccess {
    /// Checks in `mode`, reusing grants for `grant_ttl`, counting the reviews in `reviews`.
    pub fn new(mode: AuthorAccessMode, grant_ttl: Duration, reviews: Family<ReviewLabels, Counter>) -> Self {
        Self {
            mode,
            grant_ttl,
            grants: Cache::new(GRANTS_KEPT),
            not_wide: Cache::new(GRANTS_KEPT),
            answers: Cache::new(GRANTS_KEPT),
            reviews,
        }
    }

    /// Whether authors are checked at all.
    pub fn enforced(&self) -> bool {
        self.mode == AuthorAccessMode::Enforce
    }

    /// Whether `author` may do what `question` asks: a grant of the last TTL (of it, or of its wide
    /// form), or the authorizer (about the wide form first).
    pub async fn ask(
        &self,
        client: &Client,
        author: &Author,
        question: &AccessQuestion,
    ) -> Result<Answer, kube::Error> {
        let record = author.record();
        let now = Instant::now();
        let granted = |q: &AccessQuestion| {
            self.grants
                .get(&(record.clone(), q.clone()))
                .is_some_and(|until| until > now)
        };
        let wide = question.widened();
        if granted(question) || wide.as_ref().is_some_and(granted) {
            return Ok(Answer::Allowed);
        }
        if let Some(wide) = wide {
            let key = (record.clone(), wide);
            if self.not_wide.get(&key).is_none_or(|until| until <= now) {
                if self.answer(client, author, &key).await? == Answer::Allowed {
                    return Ok(Answer::Allowed);
                }
                self.not_wide.insert(key, Instant::now() + self.grant_ttl);
            }
        }
        self.answer(client, author, &(record, question.clone())).await
    }

    /// Forgets the grants of `questions` to `author`: the apiserver refused a write they allowed
    /// (as the author, when copies are written as their author), so the next pass asks afresh.
    pub fn forget(&self, author: &Author, questions: &[AccessQuestion]) {
        let record = author.record();
        for question in questions
            .iter()
            .flat_map(|q| [Some(q.clone()), q.widened()])
            .flatten()
        {
            self.grants.remove(&(record.clone(), question));
        }
    }

    /// Whether `author` may do what `question` asks, asked of the authorizer whatever is cached
    /// (the periodic recheck, and the passes once no grant answers): a grant is kept for the
    /// passes; a denial drops the cached grant, so the pass it wakes sees the denial too. Asked
    /// while a review of the same question is on its way, it takes that review's answer.
    pub async fn ask_afresh(
        &self,
        client: &Client,
        author: &Author,
        question: &AccessQuestion,
    ) -> Result<Answer, kube::Error> {
        self.answer(client, author, &(author.record(), question.clone()))
            .await
    }

    /// The answer to `key` (the author's record and the question) from a review sent after this
    /// call began: its own, or one another pass sent meanwhile.
    async fn answer(
        &self,
        client: &Client,
        author: &Author,
        key: &(String, AccessQuestion),
    ) -> Result<Answer, kube::Error> {
        let asked = Instant::now();
        // Bounded: an answer older than this question is dropped and the question asked (it loops
        // again only when another pass's fresh answer was dropped with it in between).
        for _ in 0..3 {
            match self.answers.get_value_or_guard_async(key).await {
                Ok((came, answer)) if came >= asked => return Ok(answer),
                Ok(_) => {
                    self.answers.remove(key);
                }
                Err(sending) => {
                    // A failed review leaves no answer: the next waiter sends its own.
                    let answer = self.review(client, author, key).await?;
                    let _ = sending.insert((Instant::now(), answer.clone()));
                    return Ok(answer);
                }
            }
        }
        self.review(client, author, key).await
    }

    /// One SubjectAccessReview of `key`'s question for `author`, counted, its grant cached.
    async fn review(
        &self,
        client: &Client,
        author: &Author,
        key: &(String, AccessQuestion),
    ) -> Result<Answer, kube::Error> {
        let question = &key.1;
        let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
        let review = author.access_review(question.attributes());
        self.reviews
            .get_or_create(&ReviewLabels {
                scope: question.scope(),
            })
            .inc();
        let answer = reviews.create(&PostParams::default(), &review).await?;
        let status = answer.status.unwrap_or_default();
        if status.allowed && status.denied != Some(true) {
            self.grants.insert(key.clone(), Instant::now() + self.grant_ttl);
            Ok(Answer::Allowed)
        } else {
            self.grants.remove(key);
            Ok(Answer::Denied(status.reason.filter(|r| !r.is_empty())))
        }
    }
}
