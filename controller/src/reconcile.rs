//! What both reconcilers share: the first half of every reconcile (resolve the source kind, make sure
//! its watches run, read the source, check it may be projected), how failures are retried, and the
//! bookkeeping at the end of a pass.

use crate::{
    author_access::Answer,
    context::Context,
    copy_store::CopyStore,
    error::{Error, api_error, describe_status, forbidden_message},
    index::CrRef,
    metrics::{E2eLabels, KindLabels, ReconcileLabels},
    runtime_metrics::{ControllerMetrics, ReconcileEnd, RuntimeMetrics, queue_key},
    watches::{Tier, WatchError},
    writer::FIELD_MANAGER,
};
use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::ObjectReference,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
    runtime::{
        controller::Action,
        finalizer::{Event as Finalizer, finalizer},
    },
};
use serde::{Serialize, de::DeserializeOwned};
use shared::{
    author::{AccessQuestion, Author, denial_message},
    crd::{CopyControls, SourceRef, WrittenDestination},
    kind_policy::{check_kind, check_object},
    lifecycle::{Release, is_suspended, on_cr_deletion, on_source_loss},
    ownership::Owner,
    projectable::check_projectable,
    reason::{Reason, Retry},
    source::{GroupKind, SourceKey},
    status::{Copies, Failure, Outcome, source_failure},
    stored_cr::StoredCr,
};
use std::{fmt::Debug, future::Future, sync::Arc, time::Instant};

/// A source that may be projected, with what is needed to write its copies.
pub struct Source {
    /// Its API resource (group, version, plural).
    pub resource: ApiResource,
    /// Its group and kind.
    pub group_kind: GroupKind,
    /// The object as read.
    pub object: DynamicObject,
    /// The `SourceResolved` message.
    pub resolved_message: String,
    /// Our copies of this kind for the reconciling tier (a synced cache).
    pub copies: CopyStore,
    /// The CR's author and what it was found allowed, when authors are checked.
    pub author: Option<AuthorGrant>,
}

/// The recorded author of a CR whose access to the source was checked.
pub struct AuthorGrant {
    /// The author.
    pub author: Author,
    /// Whether the author may create the kind in every namespace (asked once for a
    /// ClusterProjection; when not, each target namespace is asked).
    pub everywhere: bool,
}

/// Why there is nothing to project.
pub enum Problem {
    /// Report and retry; copies stay as they are. `transient` when an API call failed.
    Report {
        reason: Reason,
        message: String,
        transient: bool,
    },
    /// The source is gone or vetoes projection: every copy must go.
    Withdraw {
        reason: Reason,
        message: String,
        resource: ApiResource,
    },
}

/// Resolves, watches, reads and checks the source of `waker` (a CR of `tier`). `ever_projected`
/// tells `SourceDeleted` from `SourceNotFound`.
pub async fn read_source(
    ctx: &Context,
    source: &SourceRef,
    waker: &CrRef,
    tier: Tier,
    ever_projected: bool,
) -> Result<Source, Problem> {
    let resolved = match ctx.discovery.resolve(source).await {
        Ok(r) => {
            // An unpinned source follows its group's preferred version as discovery changes.
            let follows = source.version.is_empty().then_some(source.group.as_str());
            ctx.watches.follow_discovery(waker, follows);
            r
        }
        Err(crate::discovery::ResolveError::Unusable(message)) => {
            ctx.watches.follow_discovery(waker, Some(&source.group));
            return Err(Problem::Report {
                reason: Reason::SourceResolutionFailed,
                message,
                transient: false,
            });
        }
        Err(crate::discovery::ResolveError::Api(e)) => {
            return Err(Problem::Report {
                reason: Reason::SourceResolutionFailed,
                message: format!("discovery failed: {}", crate::error::describe(&e)),
                transient: true,
            });
        }
    };
    let resource = resolved.resource;
    let group_kind = source.group_kind();
    // Kinds that are never copied, or only when the platform allows them: refused before any
    // watch of the kind starts; copies made before the refusal go.
    if let Err(message) = check_kind(&group_kind, &ctx.settings.allowed_power_kinds) {
        return Err(Problem::Withdraw {
            reason: Reason::SourceNotProjectable,
            message,
            resource,
        });
    }
    ctx.watches.set_reads(waker, SourceKey::of(source));
    let copies = ctx
        .watches
        .ensure(&group_kind, &resource, tier)
        .await
        .map_err(|e| match e {
            WatchError::Forbidden(refusal) => Problem::Report {
                reason: Reason::SourceForbidden,
                message: forbidden_message("list and watch", &resource, None, &refusal),
                transient: true,
            },
            WatchError::NotServed(message) => Problem::Report {
                reason: Reason::SourceResolutionFailed,
                message,
                transient: true,
            },
            WatchError::NotSynced(message) => Problem::Report {
                reason: Reason::SourceFetchFailed,
                message,
                transient: true,
            },
        })?;

    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &source.namespace, &resource);
    let object = match api.get_opt(&source.name).await {
        Ok(Some(o)) => o,
        Ok(None) => {
            let (reason, message) = if ever_projected {
                (
                    Reason::SourceDeleted,
                    format!("source {}/{} has been deleted", source.namespace, source.name),
                )
            } else {
                (
                    Reason::SourceNotFound,
                    format!("source {}/{} not found", source.namespace, source.name),
                )
            };
            return Err(Problem::Withdraw {
                reason,
                message,
                resource,
            });
        }
        Err(kube::Error::Api(s)) if s.code == 403 => {
            let object = format!("{}/{}", source.namespace, source.name);
            return Err(Problem::Report {
                reason: Reason::SourceForbidden,
                message: forbidden_message("get", &resource, Some(&object), &describe_status(&s)),
                transient: true,
            });
        }
        Err(e) => {
            return Err(Problem::Report {
                reason: Reason::SourceFetchFailed,
                message: crate::error::describe(&e),
                transient: true,
            });
        }
    };
    if let Err(blocked) = check_projectable(
        ctx.settings.source_mode,
        object.metadata.annotations.as_ref(),
        &source.namespace,
        &source.name,
    ) {
        return Err(Problem::Withdraw {
            reason: blocked.reason,
            message: blocked.message,
            resource,
        });
    }
    let secret_type = object.data.get("type").and_then(|t| t.as_str());
    if let Err(message) = check_object(&group_kind, secret_type, &ctx.settings.allowed_power_kinds) {
        return Err(Problem::Withdraw {
            reason: Reason::SourceNotProjectable,
            message,
            resource,
        });
    }
    Ok(Source {
        resource,
        group_kind,
        object,
        resolved_message: resolved.message,
        copies,
        author: None,
    })
}

/// Checks the author recorded on a CR (`meta`) against `source`: may they get it? For a
/// ClusterProjection, also whether they may create its kind in every namespace at once (when not,
/// [`forbidden_namespaces`] asks target by target, as it does for a Projection's own namespace). No
/// recorded author: nothing is written and nothing removed. A denied read withdraws the copies: their
/// author could not have made them.
async fn check_author(ctx: &Context, meta: &ObjectMeta, source: &mut Source) -> Result<(), Problem> {
    if !ctx.author_access.enforced() {
        return Ok(());
    }
    let author = Author::recorded_in(meta.annotations.as_ref()).map_err(|problem| Problem::Report {
        reason: Reason::SourceForbidden,
        message: problem.to_string(),
        transient: false,
    })?;
    let resource = &source.resource;
    let (namespace, name) = (
        source.object.metadata.namespace.as_deref().unwrap_or_default(),
        source.object.metadata.name.as_deref().unwrap_or_default(),
    );
    let failed = |e: kube::Error| Problem::Report {
        reason: Reason::SourceForbidden,
        message: format!(
            "cannot check the author's access ({}); retrying",
            crate::error::describe(&e)
        ),
        transient: true,
    };
    let read = AccessQuestion::read_source(&resource.group, &resource.plural, namespace, name);
    if let Answer::Denied(why) = ctx
        .author_access
        .ask(&ctx.client, &author, &read)
        .await
        .map_err(failed)?
    {
        return Err(Problem::Withdraw {
            reason: Reason::SourceForbidden,
            message: denial_message(&author, &read, why.as_deref()),
            resource: resource.clone(),
        });
    }
    let cluster_scoped = meta.namespace.is_none();
    let everywhere = cluster_scoped && {
        let create = AccessQuestion::create_copies(&resource.group, &resource.plural, "");
        ctx.author_access
            .ask(&ctx.client, &author, &create)
            .await
            .map_err(failed)?
            == Answer::Allowed
    };
    source.author = Some(AuthorGrant { author, everywhere });
    Ok(())
}

/// The target namespaces where the CR's author may not create the copies, with the denial's
/// message (or why it could not be asked: those are not written this pass either). Empty when
/// authors are not checked, or the author may create the kind everywhere.
pub async fn forbidden_namespaces(
    ctx: &Context,
    source: &Source,
    targets: &[String],
) -> Vec<(String, String)> {
    let Some(grant) = source.author.as_ref().filter(|g| !g.everywhere) else {
        return Vec::new();
    };
    let resource = &source.resource;
    let answers = futures::stream::iter(targets.iter().cloned())
        .map(|namespace| async move {
            let question = AccessQuestion::create_copies(&resource.group, &resource.plural, &namespace);
            let message = match ctx.author_access.ask(&ctx.client, &grant.author, &question).await {
                Ok(Answer::Allowed) => None,
                Ok(Answer::Denied(why)) => Some(denial_message(&grant.author, &question, why.as_deref())),
                Err(e) => Some(format!(
                    "cannot check the author's access to {} ({}); retrying",
                    question.describe(),
                    crate::error::describe(&e)
                )),
            };
            message.map(|m| (namespace, m))
        })
        .buffer_unordered(ctx.settings.write_concurrency.max(1));
    answers.filter_map(|answer| async move { answer }).collect().await
}

/// Reads the source of `cr` as [`read_source`] does. When there is nothing to project and the
/// problem calls for it, the copies are withdrawn (deleted or orphaned, as `sourceDeletionPolicy`
/// and the problem's reason decide), and the problem is reported. `recorded` is the copy the status
/// last recorded; `ever_projected` whether any pass ever wrote one.
pub async fn read_or_withdraw<K: ProjectionKind>(
    ctx: &Context,
    cr: &K,
    recorded: Option<&WrittenDestination>,
    ever_projected: bool,
) -> Result<Source, Failure> {
    let source = cr.source();
    let read = match read_source(ctx, source, &cr.waker(), K::TIER, ever_projected).await {
        Ok(mut read) => check_author(ctx, cr.meta(), &mut read).await.map(|()| read),
        Err(problem) => Err(problem),
    };
    match read {
        Ok(read) => Ok(read),
        Err(problem) => {
            let withdrawn = match &problem {
                Problem::Withdraw { resource, reason, .. } => {
                    let release = on_source_loss(cr.controls().source_deletion_policy, *reason);
                    let kind = source.group_kind();
                    cr.withdraw(ctx, recorded, Some((&kind, resource)), release).await
                }
                Problem::Report { .. } => false,
            };
            Err(problem
                .fail(ctx, &cr.object_ref(&()), recorded.cloned(), withdrawn)
                .await)
        }
    }
}

/// While `spec.suspend` is true nothing is read, written or deleted: the status keeps the last pass's
/// conditions and counts, with `Suspended`, and the pass ends there (`Some`).
pub async fn hold_if_suspended<K: ProjectionKind>(cr: &K, ctx: &Context) -> Result<Option<Action>, Error> {
    if !is_suspended(cr.controls().suspend) {
        return Ok(None);
    }
    let (current, next) = cr.suspended_statuses(&Time(Timestamp::now()));
    write_status(cr, ctx, &current, &next).await?;
    let uid = cr.uid().unwrap_or_default();
    let name = queue_key(cr.meta().namespace.as_deref(), &cr.name_any());
    Ok(Some(conclude_suspended(ctx, K::KIND, (&name, &uid))))
}

/// Deletion of a CR: its copies go first, or are orphaned with `deletionPolicy: Orphan` (the
/// finalizer holds the CR until then; a suspended CR follows its policy too).
async fn cleanup<K: ProjectionKind>(cr: &K, ctx: &Context) -> Result<Action, Error> {
    let current = resolved_kind(ctx, cr.source()).await;
    let release = on_cr_deletion(cr.controls().deletion_policy);
    let current = current.as_ref().map(|(gk, r)| (gk, r));
    if !cr.withdraw(ctx, cr.recorded(), current, release).await {
        return Err(copies_remain());
    }
    cr.forget(ctx);
    // The backoff is reset by `reconcile` once the finalizer is removed too.
    Ok(Action::await_change())
}

impl Problem {
    /// Publishes the problem as a Warning event and turns it into a failure; `withdrawn` says
    /// whether every copy could be removed (only asked of a withdrawal).
    pub async fn fail(
        self,
        ctx: &Context,
        about: &ObjectReference,
        recorded: Option<WrittenDestination>,
        withdrawn: bool,
    ) -> Failure {
        let (reason, message, transient, copies) = match self {
            Self::Report {
                reason,
                message,
                transient,
            } => (reason, message, transient, Copies::Kept),
            Self::Withdraw { reason, message, .. } => {
                (reason, message, false, Copies::Withdrawn { all_gone: withdrawn })
            }
        };
        ctx.events.publish(about, reason, message.clone()).await;
        source_failure(reason, message, transient, copies, recorded)
    }
}

/// Counts the reconcile and tells the runtime what to do next.
pub fn conclude(
    ctx: &Context,
    kind: &'static str,
    object: (&str, &str),
    outcome: &Outcome,
    retry: Retry,
) -> Result<Action, Error> {
    let (name, uid) = object;
    let result = outcome.category().as_str();
    ctx.metrics
        .reconcile_total
        .get_or_create(&ReconcileLabels { kind, result })
        .inc();
    tracing::info!(
        kind,
        name,
        result,
        reason = %outcome.reason(),
        message = outcome.message(),
        "reconciled"
    );
    match retry {
        Retry::OnChange => {
            ctx.backoff.reset(uid);
            Ok(Action::await_change())
        }
        Retry::Backoff => Err(Error::Retry {
            reason: outcome.reason(),
            message: outcome.message().to_owned(),
        }),
    }
}

/// Counts and logs a pass of a suspended CR, which wrote nothing; only a change of the CR wakes it.
pub fn conclude_suspended(ctx: &Context, kind: &'static str, object: (&str, &str)) -> Action {
    let (name, uid) = object;
    let reason = Reason::Suspended;
    let result = reason.category().as_str();
    ctx.metrics
        .reconcile_total
        .get_or_create(&ReconcileLabels { kind, result })
        .inc();
    tracing::info!(kind, name, result, %reason, message = shared::lifecycle::SUSPENDED_MESSAGE, "reconciled");
    ctx.backoff.reset(uid);
    Action::await_change()
}

/// Observes the time from the creation of `cr` to its first copy.
pub fn observe_first_copy<K: ProjectionKind>(cr: &K, ctx: &Context) {
    if let Some(created) = cr.meta().creation_timestamp.as_ref() {
        let seconds = Timestamp::now().duration_since(created.0).as_secs_f64();
        ctx.metrics
            .e2e_seconds
            .get_or_create(&E2eLabels {
                kind: K::KIND,
                event: "create",
            })
            .observe(seconds.max(0.0));
    }
}

/// The kind of a CR's source as it resolves now, so a cleanup removes the copies of that kind too
/// (`None` when it no longer resolves: then only the recorded copies go).
pub async fn resolved_kind(ctx: &Context, source: &SourceRef) -> Option<(GroupKind, ApiResource)> {
    let resolved = ctx.discovery.resolve(source).await.ok()?;
    Some((source.group_kind(), resolved.resource))
}

/// The record of copies named `name` of `resource`, as the status keeps it for cleanup.
pub fn written_destination(resource: &ApiResource, name: &str) -> WrittenDestination {
    WrittenDestination {
        group: resource.group.clone(),
        version: resource.version.clone(),
        kind: resource.kind.clone(),
        name: name.to_owned(),
    }
}

/// A cleanup that could not remove every copy yet: retried with backoff, the finalizer kept.
pub fn copies_remain() -> Error {
    Error::Retry {
        reason: Reason::DestinationDeleteFailed,
        message: "copies could not be removed yet".into(),
    }
}

/// `<group>/<version>, Kind=<Kind>` as the Go operator prints a GVK (`/v1, Kind=ConfigMap`).
pub fn gvk_display(resource: &ApiResource) -> String {
    format!("{}/{}, Kind={}", resource.group, resource.version, resource.kind)
}

/// One of the two CR kinds, as the controller runtime drives it.
pub trait ProjectionKind:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static
{
    /// `Projection` or `ClusterProjection` (also the metric label).
    const KIND: &'static str;
    /// The finalizer that holds the CR until its copies are gone.
    const FINALIZER: &'static str;
    /// Which copy caches hold this kind's copies.
    const TIER: Tier;
    /// The kind's status.
    type Status: Serialize + PartialEq + Send + Sync;
    /// The status as it is, and as it becomes while suspended: the last pass's, with the
    /// `Suspended` condition (`now` its transition time when it is new).
    fn suspended_statuses(&self, now: &Time) -> (Self::Status, Self::Status);
    /// How the watch indexes name this CR.
    fn waker(&self) -> CrRef;
    /// The owner stamped on this CR's copies.
    fn owner(&self) -> Owner;
    /// `spec.source`.
    fn source(&self) -> &SourceRef;
    /// The spec fields both kinds share.
    fn controls(&self) -> &CopyControls;
    /// The API the CR itself is read and written through.
    fn api(&self, client: kube::Client) -> Api<Self>;
    /// This kind's controller-runtime metrics.
    fn runtime_metrics(metrics: &RuntimeMetrics) -> &ControllerMetrics;
    /// Puts the copies in place and reports.
    fn apply(&self, ctx: &Context) -> impl Future<Output = Result<Action, Error>> + Send;
    /// Releases (deletes or orphans, as `release` says) every copy this CR may have written, of
    /// the `recorded` kind and of the `current` one; true when none is left in our hands.
    fn withdraw(
        &self,
        ctx: &Context,
        recorded: Option<&WrittenDestination>,
        current: Option<(&GroupKind, &ApiResource)>,
        release: Release,
    ) -> impl Future<Output = bool> + Send;
    /// Drops what the indexes keep about this CR, once its copies are gone.
    fn forget(&self, ctx: &Context);
    /// The kind and name of the copies the status last recorded.
    fn recorded(&self) -> Option<&WrittenDestination>;
}

/// [`ProjectionKind::source`], [`ProjectionKind::controls`], [`ProjectionKind::recorded`],
/// [`ProjectionKind::apply`] and [`ProjectionKind::withdraw`] (the module's own `apply` and
/// `withdraw_copies`), alike for both kinds because their specs and statuses name these fields the
/// same.
macro_rules! spec_fields {
    () => {
        fn source(&self) -> &shared::crd::SourceRef {
            &self.spec.source
        }

        fn controls(&self) -> &shared::crd::CopyControls {
            &self.spec.controls
        }

        fn suspended_statuses(
            &self,
            now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
        ) -> (Self::Status, Self::Status) {
            let current = self.status.clone().unwrap_or_default();
            let mut next = current.clone();
            next.conditions =
                shared::lifecycle::suspended_conditions(&current.conditions, self.meta().generation, now);
            (current, next)
        }

        fn recorded(&self) -> Option<&shared::crd::WrittenDestination> {
            self.status
                .as_ref()
                .and_then(|s| s.written_destination.as_ref())
        }

        fn apply(&self, ctx: &Context) -> impl Future<Output = Result<Action, Error>> + Send {
            apply(self, ctx)
        }

        fn withdraw(
            &self,
            ctx: &Context,
            recorded: Option<&shared::crd::WrittenDestination>,
            current: Option<(&shared::source::GroupKind, &kube::api::ApiResource)>,
            release: shared::lifecycle::Release,
        ) -> impl Future<Output = bool> + Send {
            withdraw_copies(self, ctx, recorded, current, release)
        }
    };
}
pub(crate) use spec_fields;

/// Reconciles one CR (the entry point handed to the kube controller runtime): decoded back from
/// the store's compact form, then the finalizer decides between applying and cleaning up.
pub async fn reconcile<K: ProjectionKind>(
    stored: Arc<StoredCr<K>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let object = Arc::new(stored.expand().map_err(Error::Cache)?);
    let started = Instant::now();
    let queue = K::runtime_metrics(&ctx.metrics.runtime);
    queue.started(&queue_key(object.meta().namespace.as_deref(), &object.name_any()));
    let api = object.api(ctx.client.clone());
    let deleting = object.meta().deletion_timestamp.is_some();
    let uid = object.uid().unwrap_or_default();
    let result = finalizer(&api, K::FINALIZER, object, |event| async {
        match event {
            Finalizer::Apply(o) => o.apply(&ctx).await,
            Finalizer::Cleanup(o) => cleanup(o.as_ref(), &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    if deleting && result.is_ok() {
        ctx.statuses.forget(&uid);
        // The copies are gone and so is the finalizer: nothing of this CR is left to retry. Reset
        // only now, not in `cleanup`: when removing the finalizer fails (e.g. an admission webhook
        // is down), the retries must keep backing off.
        ctx.backoff.reset(&uid);
    }
    ctx.metrics
        .reconcile_duration_seconds
        .get_or_create(&KindLabels { kind: K::KIND })
        .observe(started.elapsed().as_secs_f64());
    queue.finished(
        started,
        match &result {
            Err(_) => ReconcileEnd::Error,
            Ok(action) if *action == Action::await_change() => ReconcileEnd::Success,
            Ok(_) => ReconcileEnd::RequeueAfter,
        },
    );
    result
}

/// Decides when to retry after an error (capped exponential backoff per object).
pub fn error_policy<K: ProjectionKind>(object: Arc<StoredCr<K>>, error: &Error, ctx: Arc<Context>) -> Action {
    let name = match object.meta().namespace.as_deref() {
        Some(namespace) => format!("{namespace}/{}", object.name_any()),
        None => object.name_any(),
    };
    backoff_after(&ctx, K::KIND, &object.uid().unwrap_or_default(), &name, error)
}

/// Decides when to retry after an error (capped exponential backoff per object).
fn backoff_after(ctx: &Context, kind: &'static str, uid: &str, name: &str, error: &Error) -> Action {
    ctx.metrics
        .reconcile_errors_total
        .get_or_create(&crate::metrics::ErrorLabels {
            kind,
            category: error.category(),
        })
        .inc();
    let delay = ctx.backoff.next_delay(uid, ctx.settings.requeue_cap);
    tracing::info!(kind, name, error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Writes `next` as the status of `object` (server-side apply of the status only), unless it equals
/// both the status the object carries (`current`, from the reflector, which may lag) and the status
/// we last wrote to it.
pub async fn write_status<K: ProjectionKind, S: Serialize + PartialEq>(
    object: &K,
    ctx: &Context,
    current: &S,
    next: &S,
) -> Result<(), Error> {
    let uid = object.uid().unwrap_or_default();
    let value = serde_json::to_value(next).unwrap_or_default();
    if next == current && ctx.statuses.matches(&uid, &value) {
        return Ok(());
    }
    let body = serde_json::json!({"apiVersion": "projection.sh/v1", "kind": K::KIND, "status": value});
    object
        .api(ctx.client.clone())
        .patch_status(
            &object.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(api_error("writing status"))?;
    ctx.statuses.record(&uid, &value);
    Ok(())
}
