//! What both reconcilers share: the first half of every reconcile (resolve the source kind, make sure
//! its watches run, read the source, check it may be projected), how failures are retried, and the
//! bookkeeping at the end of a pass.

use crate::{
    context::Context,
    error::{Error, api_error, describe_status, forbidden_message},
    events::Action as Verb,
    metrics::{KindLabels, ReconcileLabels},
    watches::{Tier, Waker, WatchError},
    writer::FIELD_MANAGER,
};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Api, Resource, ResourceExt,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
    runtime::{
        controller::Action,
        finalizer::{Event as Finalizer, finalizer},
        reflector::Store,
    },
};
use serde::{Serialize, de::DeserializeOwned};
use shared::{
    crd::{SourceRef, WrittenDestination},
    projectable::check_projectable,
    source::{GroupKind, SourceKey},
    status::Outcome,
};
use std::{fmt::Debug, future::Future, sync::Arc, time::Instant};

/// How a failed reconcile is retried.
pub enum Retry {
    /// Only a watch event can change the outcome (source created, stranger gone, CRD installed, spec
    /// edited): no timer.
    OnChange,
    /// A transient failure: retry with backoff.
    Backoff,
}

/// A reconcile that could not put every copy in place; its events are already published.
pub struct Failure {
    /// The conditions to report.
    pub outcome: Outcome,
    /// When to try again.
    pub retry: Retry,
    /// The copies the status should record afterwards (`None` once they were removed).
    pub written: Option<WrittenDestination>,
}

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
    pub copies: Store<DynamicObject>,
}

/// Why there is nothing to project.
pub enum Problem {
    /// Report and retry; copies stay as they are.
    Report {
        reason: &'static str,
        message: String,
        verb: Verb,
        retry: Retry,
    },
    /// The source is gone or vetoes projection: every copy must go.
    Withdraw {
        reason: &'static str,
        message: String,
        verb: Verb,
        resource: ApiResource,
    },
}

/// Resolves, watches, reads and checks the source of `waker` (a CR of `tier`). `ever_projected`
/// tells `SourceDeleted` from `SourceNotFound`.
pub async fn read_source(
    ctx: &Context,
    source: &SourceRef,
    waker: &Waker,
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
                reason: "SourceResolutionFailed",
                message,
                verb: Verb::Resolve,
                retry: Retry::OnChange,
            });
        }
        Err(crate::discovery::ResolveError::Api(e)) => {
            return Err(Problem::Report {
                reason: "SourceResolutionFailed",
                message: format!("discovery failed: {}", crate::error::describe(&e)),
                verb: Verb::Resolve,
                retry: Retry::Backoff,
            });
        }
    };
    let resource = resolved.resource;
    let group_kind = source.group_kind();
    ctx.watches.set_reads(waker, SourceKey::of(source));
    let copies = ctx
        .watches
        .ensure(&group_kind, &resource, tier)
        .await
        .map_err(|e| match e {
            WatchError::Forbidden(refusal) => Problem::Report {
                reason: "SourceForbidden",
                message: forbidden_message("list and watch", &resource, None, &refusal),
                verb: Verb::Get,
                retry: Retry::Backoff,
            },
            WatchError::NotSynced(message) => Problem::Report {
                reason: "SourceFetchFailed",
                message,
                verb: Verb::Get,
                retry: Retry::Backoff,
            },
        })?;

    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &source.namespace, &resource);
    let object = match api.get_opt(&source.name).await {
        Ok(Some(o)) => o,
        Ok(None) => {
            let (reason, message) = if ever_projected {
                (
                    "SourceDeleted",
                    format!("source {}/{} has been deleted", source.namespace, source.name),
                )
            } else {
                (
                    "SourceNotFound",
                    format!("source {}/{} not found", source.namespace, source.name),
                )
            };
            return Err(Problem::Withdraw {
                reason,
                message,
                verb: Verb::Get,
                resource,
            });
        }
        Err(kube::Error::Api(s)) if s.code == 403 => {
            let object = format!("{}/{}", source.namespace, source.name);
            return Err(Problem::Report {
                reason: "SourceForbidden",
                message: forbidden_message("get", &resource, Some(&object), &describe_status(&s)),
                verb: Verb::Get,
                retry: Retry::Backoff,
            });
        }
        Err(e) => {
            return Err(Problem::Report {
                reason: "SourceFetchFailed",
                message: crate::error::describe(&e),
                verb: Verb::Get,
                retry: Retry::Backoff,
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
            verb: Verb::Validate,
            resource,
        });
    }
    Ok(Source {
        resource,
        group_kind,
        object,
        resolved_message: resolved.message,
        copies,
    })
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
        let (reason, message, verb, retry, written) = match self {
            Self::Report {
                reason,
                message,
                verb,
                retry,
            } => (reason, message, verb, retry, recorded),
            Self::Withdraw {
                reason,
                message,
                verb,
                ..
            } if withdrawn => (reason, message, verb, Retry::OnChange, None),
            // Keep the record of copies that could not be removed yet, and retry.
            Self::Withdraw {
                reason,
                message,
                verb,
                ..
            } => (reason, message, verb, Retry::Backoff, recorded),
        };
        ctx.events.warning(about, reason, verb, message.clone()).await;
        Failure {
            outcome: Outcome::SourceFailed {
                reason: reason.to_owned(),
                message,
            },
            retry,
            written,
        }
    }
}

/// The `result` label of `projection_reconcile_total` for an outcome.
pub fn result_label(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Projected { .. } => "success",
        Outcome::DestinationFailed { reason, .. } if reason == "DestinationConflict" => "conflict",
        Outcome::DestinationFailed { .. } => "destination_error",
        Outcome::SourceFailed { .. } => "source_error",
    }
}

/// Counts the reconcile and tells the runtime what to do next.
pub fn conclude(
    ctx: &Context,
    kind: &'static str,
    object: (&str, &str),
    outcome: &Outcome,
    retry: Option<Retry>,
) -> Result<Action, Error> {
    let (name, uid) = object;
    let result = result_label(outcome);
    ctx.metrics
        .reconcile_total
        .get_or_create(&ReconcileLabels { kind, result })
        .inc();
    tracing::info!(
        kind,
        name,
        result,
        reason = outcome.reason(),
        message = outcome.message(),
        "reconciled"
    );
    match retry {
        None | Some(Retry::OnChange) => {
            ctx.backoff.reset(uid);
            Ok(Action::await_change())
        }
        Some(Retry::Backoff) => Err(Error::Retry {
            reason: outcome.reason().to_owned(),
            message: outcome.message().to_owned(),
        }),
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
    /// The API the CR itself is read and written through.
    fn api(&self, client: kube::Client) -> Api<Self>;
    /// Puts the copies in place and reports.
    fn apply(&self, ctx: &Context) -> impl Future<Output = Result<Action, Error>> + Send;
    /// Removes every copy before the CR goes.
    fn cleanup(&self, ctx: &Context) -> impl Future<Output = Result<Action, Error>> + Send;
}

/// Reconciles one CR (the entry point handed to the kube controller runtime): the finalizer decides
/// between applying and cleaning up.
pub async fn reconcile<K: ProjectionKind>(object: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let api = object.api(ctx.client.clone());
    let deleting = object.meta().deletion_timestamp.is_some();
    let uid = object.uid().unwrap_or_default();
    let result = finalizer(&api, K::FINALIZER, object, |event| async {
        match event {
            Finalizer::Apply(o) => o.apply(&ctx).await,
            Finalizer::Cleanup(o) => o.cleanup(&ctx).await,
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
    result
}

/// Decides when to retry after an error (capped exponential backoff per object).
pub fn error_policy<K: ProjectionKind>(object: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
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
    ctx.statuses.record(&uid, value);
    Ok(())
}
