//! Authors' access asked again on a schedule, with nothing changed: a grant revoked while no
//! source, copy or CR changes must still end the copies it allowed. Each round (one
//! `--author-recheck-interval`) lists the CRs this replica reconciles and the two questions of
//! their passes (read the source; create its kind where the copies go), and asks each distinct
//! question of each author once, afresh, at its moment of the round (`shared::policy::recheck`):
//! one SubjectAccessReview per author and question per round however many CRs share them, spread
//! over the round. The sources of one kind in one namespace are asked as one question (every object
//! of the kind there, `AccessQuestion::widened`), and one by one only where that is not granted.
//! A denial drops the cached grant and wakes a full pass of every CR that asked it and does not yet
//! report it, which withdraws their copies; nothing else is read or written here.

use crate::{
    author_access::Answer, cache::stored_cr::StoredCr, context::SourceAccess, index::CrRef, metrics::Metrics,
    metrics::RecheckLabels, pass::kind::ProjectionKind, wake::Wake,
};
use futures::StreamExt;
use kube::runtime::reflector::Store;
use shared::{
    api::crd::{ClusterProjection, Projection, SourceRef},
    policy::{
        author::{AccessQuestion, Author},
        recheck::{recheck_offset, wakes_pass},
    },
};
use std::{collections::HashMap, sync::Arc, time::Duration};
use tokio::time::Instant;

/// A CR whose author is rechecked this round.
struct Recheck {
    kind: &'static str,
    cr: CrRef,
    /// `<namespace>/<name>`, or the name of a ClusterProjection, for the log.
    name: String,
    author: Author,
    source: SourceRef,
    /// Where its copies go: the Projection's namespace, or "" (every namespace) for a
    /// ClusterProjection.
    copies_in: String,
    ready_reason: Option<String>,
}

/// One question of one author, at its moment of the round, with the CRs that ask it or a narrower
/// form of it (each with its own question).
struct Due {
    offset: Duration,
    author: Author,
    question: AccessQuestion,
    of: Vec<(Arc<Recheck>, AccessQuestion)>,
}

/// Rechecks every CR of `projections` and `clusters` once per `interval`, asking at most
/// `concurrency` questions at once, until dropped.
pub async fn run(
    (sources, metrics): (Arc<SourceAccess>, Arc<Metrics>),
    (projections, clusters): (Store<StoredCr<Projection>>, Store<StoredCr<ClusterProjection>>),
    wake: Wake,
    (interval, concurrency): (Duration, usize),
) {
    loop {
        let round = Instant::now();
        let crs: Vec<Recheck> = projections
            .state()
            .iter()
            .filter_map(recheck_of)
            .chain(clusters.state().iter().filter_map(recheck_of))
            .collect();
        let mut due: HashMap<(String, AccessQuestion), Due> = HashMap::new();
        for cr in crs {
            // A kind that does not resolve is its pass's problem; a cached resolution costs nothing.
            let Ok(resolved) = sources.discovery.resolve(&cr.source).await else {
                continue;
            };
            let resource = &resolved.resource;
            let source = &cr.source;
            let questions = [
                AccessQuestion::read_source(
                    &resource.group,
                    &resource.plural,
                    &source.namespace,
                    &source.name,
                ),
                AccessQuestion::create_copies(&resource.group, &resource.plural, &cr.copies_in),
            ];
            let cr = Arc::new(cr);
            let record = cr.author.record();
            for question in questions {
                let asked = question.widened().unwrap_or_else(|| question.clone());
                due.entry((record.clone(), asked.clone()))
                    .or_insert_with(|| Due {
                        offset: recheck_offset(&record, &asked.describe(), interval),
                        author: cr.author.clone(),
                        question: asked,
                        of: Vec::new(),
                    })
                    .of
                    .push((cr.clone(), question));
            }
        }
        let mut due: Vec<Due> = due.into_values().collect();
        due.sort_by_key(|d| d.offset);
        tracing::debug!(questions = due.len(), "author recheck round");
        futures::stream::iter(due)
            .for_each_concurrent(concurrency, |due| {
                let (sources, metrics, wake) = (&*sources, &*metrics, &wake);
                async move {
                    tokio::time::sleep_until(round + due.offset).await;
                    ask((sources, metrics), wake, &due).await;
                }
            })
            .await;
        tokio::time::sleep_until(round + interval).await;
    }
}

/// What a round needs of a stored CR; `None` for a CR being deleted or without a readable author
/// record (a pass reports that one, and nothing it could be allowed is there to revoke).
fn recheck_of<K: ProjectionKind>(stored: &Arc<StoredCr<K>>) -> Option<Recheck> {
    let expanded = stored.expand().ok()?;
    let cr = expanded.view();
    let meta = cr.meta;
    if meta.deletion_timestamp.is_some() {
        return None;
    }
    let author = Author::recorded_in(meta.annotations.as_ref()).ok()?;
    let ready_reason = cr
        .status
        .and_then(|s| s.conditions.iter().find(|c| c.r#type == "Ready"))
        .map(|c| c.reason.clone());
    Some(Recheck {
        kind: K::SCOPE.kind(),
        cr: CrRef::named(&cr.name()),
        name: crate::queue_metrics::queue_key(
            meta.namespace.as_deref(),
            meta.name.as_deref().unwrap_or_default(),
        ),
        author,
        source: cr.source.clone(),
        copies_in: meta.namespace.clone().unwrap_or_default(),
        ready_reason,
    })
}

/// Asks one question afresh and wakes the pass of each CR that asked it on a denial it does not
/// yet report; a wide question not granted is asked again about each object its CRs read.
async fn ask(sources: (&SourceAccess, &Metrics), wake: &Wake, due: &Due) {
    let Some((first, _)) = due.of.first() else {
        return;
    };
    let mut denied: HashMap<&AccessQuestion, bool> = HashMap::new();
    let wide_denied = ask_one(sources, &due.author, &due.question, first.kind).await;
    denied.insert(&due.question, wide_denied);
    if wide_denied {
        for (cr, question) in &due.of {
            if !denied.contains_key(question) {
                denied.insert(question, ask_one(sources, &due.author, question, cr.kind).await);
            }
        }
    }
    for (cr, question) in &due.of {
        // Not asked: the wide question was granted (or could not be asked), which answers it.
        let denied = denied.get(question).copied().unwrap_or(false);
        if wakes_pass(denied, cr.ready_reason.as_deref()) {
            tracing::info!(kind = cr.kind, name = cr.name, "author access lost; reconciling");
            wake.send(cr.cr.clone());
        }
    }
}

/// Asks `question` of the authorizer for a CR of `kind`, counts the answer; whether it was denied
/// (not on an error).
async fn ask_one(
    (sources, metrics): (&SourceAccess, &Metrics),
    author: &Author,
    question: &AccessQuestion,
    kind: &'static str,
) -> bool {
    let (result, denied) = match sources
        .author_access
        .ask_afresh(&sources.client, author, question)
        .await
    {
        Ok(Answer::Allowed) => ("allowed", false),
        Ok(Answer::Denied(_)) => ("denied", true),
        Err(e) => {
            let error = crate::error::describe(&e);
            tracing::warn!(kind, error, "cannot recheck an author's access");
            ("error", false)
        }
    };
    metrics
        .author_rechecks_total
        .get_or_create(&RecheckLabels { kind, result })
        .inc();
    denied
}
