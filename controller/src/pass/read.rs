//! The read step of a pass: resolve the source kind, check that the CR's recorded author may read
//! the source (and where the author may create copies), make sure its watches run, read it and
//! check that it may be projected. A problem on the way is reported, and withdraws the copies when it
//! calls for that.

use crate::{
    author_access::Answer,
    cache::copy_store::CopyStore,
    context::SourceAccess,
    discovery::Resolved,
    error::{describe_status, forbidden_message, resource_name},
    index::CrRef,
    namespace_watch::Namespaces,
    watches::WatchError,
};
use futures::StreamExt;
use kube::{
    Api,
    api::{ApiResource, DynamicObject},
    runtime::reflector::ObjectRef,
};
use shared::{
    api::{
        crd::{ClusterProjection, SourceRef},
        kind::{CrView, Scope},
        reason::Reason,
        source::{GroupKind, SourceKey},
    },
    pass::{
        not_found::{NotFound, classify_not_found, kind_not_served_message},
        source::{author_questions, check_read, missing, read_denied},
        status::Stop,
        tally::CopyWrite,
        targets::{TargetRule, Targets},
    },
    policy::{
        author::{AccessQuestion, Author, denial_message},
        kind_policy::check_kind,
    },
};
use std::sync::Arc;

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

/// Resolves the kind of the source of `waker` and checks the platform allows it.
async fn resolve(sources: &SourceAccess, source: &SourceRef, waker: &CrRef) -> Result<Resolved, Stop> {
    let resolved = match sources.discovery.resolve(source).await {
        Ok(r) => {
            // An unpinned source follows its group's preferred version as discovery changes.
            let follows = source.version.is_empty().then_some(source.group.as_str());
            sources.watches.follow_discovery(waker, follows);
            r
        }
        Err(crate::discovery::ResolveError::Unusable(message)) => {
            sources.watches.follow_discovery(waker, Some(&source.group));
            return Err(Stop::Source {
                reason: Reason::SourceResolutionFailed,
                message,
                transient: false,
            });
        }
        Err(crate::discovery::ResolveError::Api(e)) => {
            return Err(Stop::Source {
                reason: Reason::SourceResolutionFailed,
                message: format!("discovery failed: {}", crate::error::describe(&e)),
                transient: true,
            });
        }
    };
    // Kinds that are never copied, or only when the platform allows them: refused before any
    // watch of the kind starts; copies made before the refusal go.
    if let Err(message) = check_kind(&source.group_kind(), &sources.allowed_power_kinds) {
        return Err(Stop::Withdraw {
            reason: Reason::SourceNotProjectable,
            message,
            resource: Box::new(resolved.resource),
            removal: None,
        });
    }
    Ok(resolved)
}

/// Watches, reads and checks the source of `waker` (a CR of `scope`), of the `resolved` kind.
/// `ever_projected` tells `SourceDeleted` from `SourceNotFound`.
async fn fetch(
    sources: &SourceAccess,
    (source, resolved): (&SourceRef, Resolved),
    (waker, scope): (&CrRef, Scope),
    ever_projected: bool,
) -> Result<Source, Stop> {
    let resource = resolved.resource;
    let group_kind = source.group_kind();
    sources.watches.set_reads(waker, SourceKey::of(source));
    let copies = sources
        .watches
        .ensure(&group_kind, &resource, scope)
        .await
        // The one place a failed watch becomes the reason a pass stops.
        .map_err(|e| match e {
            WatchError::Forbidden(refusal) => Stop::Source {
                reason: Reason::SourceForbidden,
                message: forbidden_message("list and watch", &resource, None, &refusal),
                transient: true,
            },
            WatchError::NotServed(message) => Stop::Source {
                reason: Reason::SourceResolutionFailed,
                message,
                transient: true,
            },
            WatchError::NotSynced(message) => Stop::Source {
                reason: Reason::SourceFetchFailed,
                message,
                transient: true,
            },
        })?;

    let api = Api::<DynamicObject>::namespaced_with(sources.client.clone(), &source.namespace, &resource);
    let object = match api.get(&source.name).await {
        Ok(o) => o,
        // Only a 404 that names the object says it is gone (`shared::pass::not_found`).
        Err(kube::Error::Api(s)) if classify_not_found(&s, &source.name) == Some(NotFound::Object) => {
            return Err(missing(source, resource, ever_projected));
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            // The kind is not served (any more): the copies stay, and the kind is resolved afresh.
            sources.discovery.forget(source);
            let object = format!("{}/{}", source.namespace, source.name);
            return Err(Stop::Source {
                reason: Reason::SourceResolutionFailed,
                message: kind_not_served_message(&resource_name(&resource), &object, &describe_status(&s)),
                transient: true,
            });
        }
        Err(kube::Error::Api(s)) if s.code == 403 => {
            let object = format!("{}/{}", source.namespace, source.name);
            return Err(Stop::Source {
                reason: Reason::SourceForbidden,
                message: forbidden_message("get", &resource, Some(&object), &describe_status(&s)),
                transient: true,
            });
        }
        Err(e) => {
            return Err(Stop::Source {
                reason: Reason::SourceFetchFailed,
                message: crate::error::describe(&e),
                transient: true,
            });
        }
    };
    check_read(
        source,
        (&object, &resource),
        (sources.source_mode, &sources.allowed_power_kinds),
    )?;
    Ok(Source {
        resource,
        group_kind,
        object,
        resolved_message: resolved.message,
        copies,
        author: None,
    })
}

/// Checks the author recorded on a CR (`meta`) against its `source` of kind `resource`: may they
/// get it, and create its kind where the copies go: in every namespace at once for a
/// ClusterProjection, in its own namespace (its only target) for a Projection. When that second
/// answer is not a grant, [`forbidden_namespaces`] asks target by target. `None` when authors are
/// not checked. No recorded author (a CR made before records existed): nothing is written and
/// nothing removed, and nothing about the source is reported either. A denied read withdraws the
/// copies: their author could not have made them.
///
/// The two questions are asked at once; [`read`] asks them before it reads the source.
async fn check_author(
    sources: &SourceAccess,
    cr: &CrView<'_>,
    resource: &ApiResource,
) -> Result<Option<AuthorGrant>, Stop> {
    if !sources.author_access.enforced() {
        return Ok(None);
    }
    let author = Author::recorded_in(cr.meta.annotations.as_ref()).map_err(|problem| Stop::Source {
        reason: Reason::SourceForbidden,
        message: problem.to_string(),
        transient: false,
    })?;
    let (read, create) = author_questions(cr, resource);
    let ask = |question| sources.author_access.ask(&sources.client, &author, question);
    let (may_read, may_create) = futures::join!(ask(&read), ask(&create));
    let failed = |e: kube::Error| Stop::Source {
        reason: Reason::SourceForbidden,
        message: format!(
            "cannot check the author's access ({}); retrying",
            crate::error::describe(&e)
        ),
        transient: true,
    };
    if let Answer::Denied(why) = may_read.map_err(failed)? {
        return Err(read_denied(&author, &read, why.as_deref(), resource));
    }
    let everywhere = match may_create {
        Ok(answer) => answer == Answer::Allowed,
        // A ClusterProjection's question must be answered; a Projection's namespace is asked
        // again, and a failure reported as its target's.
        Err(e) if cr.home().is_none() => return Err(failed(e)),
        Err(_) => false,
    };
    Ok(Some(AuthorGrant { author, everywhere }))
}

/// The target namespaces where the CR's author may not create the copies, with the denial's
/// message (or why it could not be asked: those are not written this pass either). Empty when
/// authors are not checked, or the author may create the kind everywhere.
pub async fn forbidden_namespaces(
    sources: &SourceAccess,
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
            let message = match sources
                .author_access
                .ask(&sources.client, &grant.author, &question)
                .await
            {
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
        .buffer_unordered(sources.concurrency);
    answers.filter_map(|answer| async move { answer }).collect().await
}

/// Forgets the author's grants to create copies in the namespaces where the apiserver refused a
/// copy written as the author (`writes`): the next pass asks the authorizer afresh, and withdraws
/// the copy there if it says no.
pub fn forget_refused_grants(sources: &SourceAccess, source: &Source, writes: &[(String, CopyWrite)]) {
    let Some(grant) = source.author.as_ref() else {
        return;
    };
    let resource = &source.resource;
    let mut refused: Vec<AccessQuestion> = writes
        .iter()
        .filter(|(_, write)| {
            matches!(write, CopyWrite::Failed { reason, .. } if *reason == Reason::DestinationForbidden)
        })
        .map(|(namespace, _)| AccessQuestion::create_copies(&resource.group, &resource.plural, namespace))
        .collect();
    if refused.is_empty() {
        return;
    }
    // With the grant for every namespace at once, which a ClusterProjection asks first.
    refused.push(AccessQuestion::create_copies(
        &resource.group,
        &resource.plural,
        "",
    ));
    sources.author_access.forget(&grant.author, &refused);
}

/// Resolves the kind of the source of `cr`, checks its recorded author, then watches, reads and
/// checks the source. The author comes first, and nothing of the source is touched for an author
/// who may not read it: whether it exists, has opted in or is a token must not show in the status,
/// the events or the timing of passes (no watch of it wakes the CR) of someone who could not have
/// read it by hand. Only the kind is resolved before: what kinds a cluster serves is no secret.
/// A grant is cached (`--author-grant-ttl`), so a source edit reaches its
/// copies without a round trip to the authorizer; an uncached one costs that round trip before
/// the read.
pub async fn read(sources: &SourceAccess, cr: &CrView<'_>) -> Result<Source, Stop> {
    let source = cr.source;
    let waker = CrRef::named(&cr.name());
    let resolved = resolve(sources, source, &waker).await?;
    let author = check_author(sources, cr, &resolved.resource).await?;
    let mut read = fetch(
        sources,
        (source, resolved),
        (&waker, cr.scope),
        cr.ever_projected(),
    )
    .await?;
    read.author = author;
    Ok(read)
}

/// Where the copies of `cr` go now: a Projection's own namespace, or the namespaces a
/// ClusterProjection's destination names or selects, as the namespace watch knows them (its rule is
/// registered first, so that namespace events wake it, as `read` registers the source's watch
/// before it reads). `Err` is the `TargetResolutionFailed` message.
pub async fn targets(namespaces: &Namespaces, cr: &CrView<'_>) -> Result<Targets, String> {
    let Some(destination) = cr.namespaces else {
        let home = cr.home().unwrap_or_default();
        return Ok(Targets::own_namespace(home, cr.source, cr.copy_name));
    };
    let name = ObjectRef::<ClusterProjection>::new(cr.meta.name.as_deref().unwrap_or_default());
    let rule = match TargetRule::of(destination) {
        Ok(rule) => Arc::new(rule),
        Err(e) => {
            namespaces.forget(&name);
            return Err(e.0);
        }
    };
    namespaces.set_rule(&name, rule.clone());
    namespaces.synced().await;
    Ok(namespaces.resolve(&rule, cr.source, cr.copy_name))
}
