//! The read step of a pass: resolve the source kind, make sure its watches run, read the source,
//! check that it may be projected and that the CR's recorded author may read it (and where the
//! author may create copies). A problem on the way is reported, and withdraws the copies when it
//! calls for that.

use crate::{
    author_access::Answer,
    cache::copy_store::CopyStore,
    context::Context,
    error::{describe_status, forbidden_message, resource_name},
    index::CrRef,
    pass::kind::{KindStatus, ProjectionKind},
    watches::{Tier, WatchError},
};
use futures::StreamExt;
use k8s_openapi::{api::core::v1::ObjectReference, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{
    Api,
    api::{ApiResource, DynamicObject},
};
use shared::{
    api::{
        crd::{SourceRef, WrittenDestination},
        reason::Reason,
        source::{GroupKind, SourceKey},
    },
    pass::{
        not_found::{NotFound, classify_not_found, kind_not_served_message},
        status::{Copies, Failure, source_failure},
    },
    policy::{
        author::{AccessQuestion, Author, denial_message},
        kind_policy::{check_kind, check_object},
        projectable::check_projectable,
    },
};

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
    let object = match api.get(&source.name).await {
        Ok(o) => o,
        // Only a 404 that names the object says it is gone (`shared::pass::not_found`).
        Err(kube::Error::Api(s)) if classify_not_found(&s, &source.name) == Some(NotFound::Object) => {
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
        Err(kube::Error::Api(s)) if s.code == 404 => {
            // The kind is not served (any more): the copies stay, and the kind is resolved afresh.
            ctx.discovery.forget(source);
            let object = format!("{}/{}", source.namespace, source.name);
            return Err(Problem::Report {
                reason: Reason::SourceResolutionFailed,
                message: kind_not_served_message(&resource_name(&resource), &object, &describe_status(&s)),
                transient: true,
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

/// Reads the source of `cr` as [`read_source`] does, and checks its recorded author.
pub async fn read<K: ProjectionKind>(ctx: &Context, cr: &K, status: &K::Status) -> Result<Source, Problem> {
    let mut read = read_source(ctx, cr.source(), &cr.waker(), K::TIER, status.ever_projected()).await?;
    check_author(ctx, cr.meta(), &mut read).await?;
    Ok(read)
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
