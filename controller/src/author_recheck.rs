//! Authors' access asked again on a schedule, with nothing changed: a grant revoked while no
//! source, copy or CR changes must still end the copies it allowed. Each round (one
//! `--author-recheck-interval`) lists the CRs this replica reconciles, and at each author's moment
//! of the round (`shared::policy::recheck`) asks the authorizer the two questions of a pass (read
//! the source; create its kind where the copies go) through the grant cache, so one author and
//! question cost one SubjectAccessReview per round however many CRs share them. A denial not yet
//! reported wakes a full pass of the CR, which withdraws its copies; nothing else is read or
//! written here.

use crate::{
    author_access::Answer,
    cache::stored_cr::StoredCr,
    context::Context,
    index::CrRef,
    metrics::RecheckLabels,
    pass::kind::{KindStatus, ProjectionKind},
    wake::Wake,
};
use kube::runtime::reflector::Store;
use shared::{
    api::crd::{ClusterProjection, Projection, SourceRef},
    policy::{
        author::{AccessQuestion, Author},
        recheck::{recheck_offset, wakes_pass},
    },
};
use std::{sync::Arc, time::Duration};
use tokio::time::Instant;

/// One CR to recheck in a round.
struct Due {
    /// When in the round.
    offset: Duration,
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

/// Rechecks every CR of `projections` and `clusters` once per `interval`, until dropped.
pub async fn run(
    ctx: Arc<Context>,
    (projections, clusters): (Store<StoredCr<Projection>>, Store<StoredCr<ClusterProjection>>),
    wake: Wake,
    interval: Duration,
) {
    loop {
        let round = Instant::now();
        let mut due: Vec<Due> = projections
            .state()
            .iter()
            .filter_map(|cr| due_of(cr, interval))
            .chain(clusters.state().iter().filter_map(|cr| due_of(cr, interval)))
            .collect();
        due.sort_by_key(|d| d.offset);
        tracing::debug!(crs = due.len(), "author recheck round");
        for cr in due {
            tokio::time::sleep_until(round + cr.offset).await;
            recheck(&ctx, &wake, cr).await;
        }
        tokio::time::sleep_until(round + interval).await;
    }
}

/// What a round needs of a stored CR; `None` for a CR being deleted or without a readable author
/// record (a pass reports that one, and nothing it could be allowed is there to revoke).
fn due_of<K: ProjectionKind>(stored: &Arc<StoredCr<K>>, interval: Duration) -> Option<Due> {
    let cr = stored.expand().ok()?;
    let meta = cr.meta();
    if meta.deletion_timestamp.is_some() {
        return None;
    }
    let author = Author::recorded_in(meta.annotations.as_ref()).ok()?;
    let status = cr.status();
    let ready_reason = status
        .conditions()
        .iter()
        .find(|c| c.r#type == "Ready")
        .map(|c| c.reason.clone());
    Some(Due {
        offset: recheck_offset(&author.record(), interval),
        kind: K::KIND,
        cr: cr.waker(),
        name: crate::queue_metrics::queue_key(
            meta.namespace.as_deref(),
            meta.name.as_deref().unwrap_or_default(),
        ),
        author,
        source: cr.source().clone(),
        copies_in: meta.namespace.clone().unwrap_or_default(),
        ready_reason,
    })
}

/// Asks the two questions for one CR and wakes its pass on a denial it does not yet report.
async fn recheck(ctx: &Context, wake: &Wake, due: Due) {
    let sources = &ctx.sources;
    // A kind that does not resolve is its pass's problem; its cached resolution costs nothing.
    let Ok(resolved) = sources.discovery.resolve(&due.source).await else {
        return;
    };
    let resource = &resolved.resource;
    let questions = [
        AccessQuestion::read_source(
            &resource.group,
            &resource.plural,
            &due.source.namespace,
            &due.source.name,
        ),
        AccessQuestion::create_copies(&resource.group, &resource.plural, &due.copies_in),
    ];
    let mut denied = false;
    for question in &questions {
        let result = match sources
            .author_access
            .ask(&sources.client, &due.author, question)
            .await
        {
            Ok(Answer::Allowed) => "allowed",
            Ok(Answer::Denied(_)) => {
                denied = true;
                "denied"
            }
            Err(e) => {
                tracing::warn!(kind = due.kind, error = %e, "cannot recheck an author's access");
                "error"
            }
        };
        ctx.report
            .metrics
            .author_rechecks_total
            .get_or_create(&RecheckLabels {
                kind: due.kind,
                result,
            })
            .inc();
    }
    if wakes_pass(denied, due.ready_reason.as_deref()) {
        tracing::info!(
            kind = due.kind,
            name = due.name,
            "author access lost; reconciling"
        );
        wake.send(due.cr);
    }
}
