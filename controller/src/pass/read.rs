//! The read step of a pass: resolve the source kind, check that the CR's recorded author may read
//! the source (and where the author may create copies), register what wakes the CR, make sure the
//! source's watches run, read it and check that it may be projected. A problem on the way is reported, and withdraws the copies when it
//! calls for that.

use crate::{
    author_access::Answer,
    cache::copy_store::CopyStore,
    context::CopyCluster,
    context::SourceAccess,
    discovery::Resolved,
    error::{describe_status, forbidden_message, resource_name},
    namespace_watch::Namespaces,
    pass::interest::Rule,
    watches::WatchError,
};
use futures::StreamExt;
use kube::{
    Api,
    api::{ApiResource, DynamicObject},
};
use shared::{
    api::{
        crd::SourceRef,
        kind::{CrView, Scope},
        reason::Reason,
        source::GroupKind,
    },
    pass::{
        interest::Reached,
        not_found::{NotFound, classify_not_found, kind_not_served_message},
        source::{author_questions, check_read, missing, read_denied, secret_denied},
        status::Stop,
        tally::CopyWrite,
        targets::Targets,
    },
    policy::{
        author::{AccessQuestion, Author, denial_message},
        kind_policy::check_kind,
        kubeconfig::KubeconfigSecret,
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

/// Resolves the kind of `source` and checks the platform allows it, saying how far that got.
async fn resolve(sources: &SourceAccess, source: &SourceRef) -> Result<Resolved, (Stop, Reached)> {
    let resolved = match sources.discovery.resolve(source).await {
        Ok(r) => r,
        Err(crate::discovery::ResolveError::Unusable(message)) => {
            let stop = Stop::Source {
                reason: Reason::SourceResolutionFailed,
                message,
                transient: false,
            };
            return Err((stop, Reached::KindUnusable));
        }
        Err(crate::discovery::ResolveError::Api(e)) => {
            let stop = Stop::Source {
                reason: Reason::SourceResolutionFailed,
                message: format!("discovery failed: {}", crate::error::describe(&e)),
                transient: true,
            };
            return Err((stop, Reached::DiscoveryFailed));
        }
    };
    // Kinds that are never copied, or only when the platform allows them: refused before any
    // watch of the kind starts; copies made before the refusal go.
    if let Err(message) = check_kind(&source.group_kind(), &sources.allowed_power_kinds) {
        let stop = Stop::Withdraw {
            reason: Reason::SourceNotProjectable,
            message,
            resource: Box::new(resolved.resource),
            removal: None,
        };
        return Err((stop, Reached::Refused));
    }
    Ok(resolved)
}

/// A source whose kind resolved and whose author may read it (and the kubeconfig Secret its
/// copies are written with, if any).
pub struct Checked {
    resolved: Resolved,
    author: Option<AuthorGrant>,
}

impl Checked {
    /// The `SourceResolved` message.
    pub fn resolved_message(&self) -> &str {
        &self.resolved.message
    }
}

/// Resolves the kind of the source of `cr` and checks its recorded author (who must also be
/// allowed to read `secret`, the kubeconfig the copies go to another cluster with), saying how far
/// that got. The author comes first, and nothing of the source is touched for an author who may not
/// read it: whether it exists, has opted in or is a token must not show in the status, the events
/// or the timing of passes (no watch of it wakes the CR) of someone who could not have read it by
/// hand. Only the kind is resolved before: what kinds a cluster serves is no secret. A grant is
/// cached (`--author-grant-ttl`), so a source edit reaches its copies without a round trip to the
/// authorizer; an uncached one costs that round trip before the read.
pub async fn check(
    sources: &SourceAccess,
    cr: &CrView<'_>,
    secret: Option<&KubeconfigSecret>,
) -> Result<Checked, (Stop, Reached)> {
    let resolved = resolve(sources, cr.source).await?;
    let author = check_author(sources, cr, &resolved, secret).await?;
    Ok(Checked { resolved, author })
}

/// Watches, reads and checks the source of `cr`, once checked, and makes sure the copies' watch
/// runs in the cluster they go to (`destination`). A source missing is `SourceDeleted` once it was
/// projected, `SourceNotFound` before.
pub async fn fetch(
    sources: &SourceAccess,
    cr: &CrView<'_>,
    checked: Checked,
    destination: &CopyCluster,
) -> Result<Source, Stop> {
    let source = cr.source;
    let Checked { resolved, author } = checked;
    let resource = resolved.resource;
    let group_kind = source.group_kind();
    let copies = sources
        .watches
        .ensure(&group_kind, &resource, cr.scope)
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
            return Err(missing(source, resource, cr.ever_projected()));
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
    let copies = if destination.is_remote() {
        remote_copies(destination, (&group_kind, &resource), cr.scope, &resolved.message).await?
    } else {
        copies
    };
    Ok(Source {
        resource,
        group_kind,
        object,
        resolved_message: resolved.message,
        copies,
        author,
    })
}

/// Our copies of `cr`'s kind in another cluster: their watch there, started unless it runs. That
/// cluster refusing or not answering stops the pass for this CR only, and it is retried.
async fn remote_copies(
    destination: &CopyCluster,
    (group_kind, resource): (&GroupKind, &ApiResource),
    scope: Scope,
    resolved: &str,
) -> Result<CopyStore, Stop> {
    destination
        .watches
        .ensure(group_kind, resource, scope)
        .await
        .map_err(|e| {
            let (reason, message) = match e {
                WatchError::Forbidden(refusal) => (
                    Reason::DestinationClusterForbidden,
                    format!(
                        "the destination cluster refused to list and watch {}: {refusal}",
                        resource_name(resource)
                    ),
                ),
                WatchError::NotServed(message) => (
                    Reason::DestinationClusterInvalid,
                    format!("the destination cluster does not serve the kind: {message}"),
                ),
                WatchError::NotSynced(message) => (
                    Reason::DestinationClusterUnreachable,
                    format!("the destination cluster did not answer: {message}"),
                ),
            };
            Stop::Destination {
                reason,
                message,
                resolved: resolved.to_owned(),
            }
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
/// When the copies go to another cluster, the second question is whether the author may get the
/// kubeconfig `secret` instead: there the kubeconfig's identity is the only authority.
///
/// The two questions are asked at once, before the source is read.
async fn check_author(
    sources: &SourceAccess,
    cr: &CrView<'_>,
    resolved: &Resolved,
    secret: Option<&KubeconfigSecret>,
) -> Result<Option<AuthorGrant>, (Stop, Reached)> {
    let resource = &resolved.resource;
    if !sources.author_access.enforced() {
        return Ok(None);
    }
    let author = Author::recorded_in(cr.meta.annotations.as_ref()).map_err(|problem| {
        let stop = Stop::Source {
            reason: Reason::SourceForbidden,
            message: problem.to_string(),
            transient: false,
        };
        (stop, Reached::Refused)
    })?;
    let (read, create) = author_questions(cr, resource);
    let create = secret.map_or(create, KubeconfigSecret::question);
    let ask = |question| sources.author_access.ask(&sources.client, &author, question);
    let (may_read, may_create) = futures::join!(ask(&read), ask(&create));
    let failed = |e: kube::Error| {
        let stop = Stop::Source {
            reason: Reason::SourceForbidden,
            message: format!(
                "cannot check the author's access ({}); retrying",
                crate::error::describe(&e)
            ),
            transient: true,
        };
        (stop, Reached::AuthorUnanswered)
    };
    if let Answer::Denied(why) = may_read.map_err(failed)? {
        let stop = read_denied(&author, &read, why.as_deref(), resource);
        return Err((stop, Reached::Refused));
    }
    if let Some(secret) = secret {
        if let Answer::Denied(why) = may_create.map_err(failed)? {
            let stop = secret_denied(&author, (&create, secret), why.as_deref(), &resolved.message);
            return Err((stop, Reached::Refused));
        }
        return Ok(Some(AuthorGrant {
            author,
            everywhere: true,
        }));
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

/// Where the copies of `cr` go now: a Projection's own namespace, or the namespaces a
/// ClusterProjection's destination names or selects (its `rule`, registered before the read) among
/// `namespaces`, those of the cluster the copies go to. In another cluster (`remote`) no copy can be
/// the source itself. `Err` is the `TargetResolutionFailed` message.
pub async fn targets(
    namespaces: Option<&Namespaces>,
    cr: &CrView<'_>,
    rule: Rule,
    remote: bool,
) -> Result<Targets, String> {
    let source = (!remote).then_some(cr.source);
    match (rule, namespaces) {
        (None, _) => {
            let home = cr.home().unwrap_or_default();
            Ok(Targets::own_namespace(home, source, cr.copy_name))
        }
        (Some(Err(refused)), _) => Err(refused.0),
        (Some(Ok(rule)), Some(namespaces)) => {
            namespaces.synced().await;
            Ok(namespaces.resolve(&rule, source, cr.copy_name))
        }
        (Some(Ok(_)), None) => Err("the destination cluster's namespaces are not known".into()),
    }
}
