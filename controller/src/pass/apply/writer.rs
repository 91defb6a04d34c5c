//! Writing and deleting copies: the only code that changes objects we do not own the CR of. Every
//! write is guarded: a copy is created only where nothing exists, updated only when its ownership
//! annotation names us (with a resourceVersion precondition), deleted only when it does (with uid
//! and resourceVersion preconditions).

use crate::{
    cache::{copy_store::CopyStore, verified},
    index::ObjectKey,
    write_journal::WriteJournal,
};
use backon::{ConstantBuilder, Retryable};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions},
};
use serde_json::Value;
use shared::pass::tally::{CopyWrite, Removed};
use shared::{
    api::keys::FIELD_MANAGER,
    api::reason::Reason,
    api::source::GroupKind,
    copy::ownership::Owner,
    copy::recreate::{immutable_fields, immutable_message, is_immutable_refusal},
    copy::write_plan::{WriteDecision, WritePlan, decide, plan_update},
    pass::lifecycle::{AfterDeleteConflict, Release, after_delete_conflict, orphan_patch},
    pass::plan::Existing,
    policy::author::Author,
};
use std::{sync::Arc, time::Duration};

/// Why a write failed, as the plan's conclusion reads it.
fn failed(reason: Reason, message: String) -> CopyWrite {
    CopyWrite::Failed { reason, message }
}

/// The copies of one kind in one namespace, owned by one CR: as the controller (reads, deletions,
/// releases: its own acts on its own copies) and as their writer (creates and updates: the CR's
/// author, impersonated, or the controller again; `shared::policy::write_as`). Every write and
/// removal of a copy goes through here.
pub struct Writer<'a> {
    /// Remembers our writes, so their watch events wake nothing.
    pub journal: &'a WriteJournal,
    /// The copies' group and kind.
    pub group_kind: &'a GroupKind,
    /// The CR whose copies they are.
    pub owner: &'a Owner,
    /// As the controller.
    pub own: Api<DynamicObject>,
    /// As whoever writes the copies, and that author when it is not the controller.
    pub writer: (Api<DynamicObject>, Option<&'a Author>),
    /// Whether the copies are in another cluster than the CR's.
    pub remote: bool,
}

impl Writer<'_> {
    /// A failed API call of a write, described; in another cluster, one that got no answer (or a
    /// refusal of the credentials) is that cluster's failure.
    fn failed_call(&self, reason: Reason) -> impl Fn(kube::Error) -> CopyWrite {
        let remote = self.remote;
        move |e| {
            let reason = if remote {
                let answered = match &e {
                    kube::Error::Api(s) => Some(s.code),
                    _ => None,
                };
                reason.in_other_cluster(answered)
            } else {
                reason
            };
            failed(reason, crate::error::describe(&e))
        }
    }

    /// A failed create or update: `DestinationForbidden` naming the author when the apiserver refused
    /// the author (its RBAC, or an admission webhook answering Forbidden), else `other`.
    fn refused(&self, error: kube::Error, other: Reason) -> CopyWrite {
        match (self.writer.1, &error) {
            (Some(author), kube::Error::Api(s)) if s.code == 403 => {
                let masters = if author.is_master() {
                    "; the apiserver lets nobody impersonate system:masters, so this author is \
                     impersonated without that group: bind its user or another of its groups with RBAC, \
                     or write the CR as a user whose rights RBAC grants"
                } else {
                    ""
                };
                failed(
                    Reason::DestinationForbidden,
                    format!(
                        "the apiserver refused the copy written as its author {} (the author is whoever \
                         last created or changed the spec): {}{masters}",
                        author.username, s.message
                    ),
                )
            }
            _ => self.failed_call(other)(error),
        }
    }

    /// Writes `desired` (a built copy) so that the object at its coordinates matches it, if it is
    /// ours (or only creates it, when `existing` says to keep what exists); `copies` are our cached
    /// copies of the kind. An update refused as immutable deletes and recreates the copy only when
    /// `recreatable` (`shared::copy::recreate::RecreateKinds`).
    pub async fn write(
        &self,
        copies: &CopyStore,
        desired: &Value,
        existing: Existing,
        recreatable: bool,
    ) -> CopyWrite {
        self.try_write(copies, desired, existing, recreatable)
            .await
            .unwrap_or_else(|failed| failed)
    }

    /// [`Writer::write`], a failure as `Err`.
    async fn try_write(
        &self,
        copies: &CopyStore,
        desired: &Value,
        existing_copy: Existing,
        recreatable: bool,
    ) -> Result<CopyWrite, CopyWrite> {
        let (journal, group_kind, owner) = (self.journal, self.group_kind, self.owner);
        let writer = &self.writer.0;
        let text = |field: &str| desired["metadata"][field].as_str().unwrap_or_default().to_owned();
        let (namespace, name) = (text("namespace"), text("name"));
        let key = ObjectKey {
            group_kind: group_kind.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
        };
        let fingerprint = verified::fingerprint(desired);
        let cached = copies.get(&namespace, &name);
        // Our own copy, kept or verified up to date at the resourceVersion cached: nothing to decode.
        if let Some(copy) = cached.as_ref().filter(|c| c.is_owned_by(owner)) {
            let verified = || {
                copy.resource_version()
                    .zip(fingerprint)
                    .is_some_and(|(rv, fingerprint)| journal.is_verified(&key, rv, fingerprint))
            };
            if existing_copy == Existing::Keep || verified() {
                return Ok(CopyWrite::Unchanged);
            }
        }
        let mut existing = match cached.map(|c| c.object()) {
            Some(Some(object)) => Some(Arc::new(object)),
            // Undecodable (never expected): read it instead.
            Some(None) => self
                .own
                .get_opt(&name)
                .await
                .map_err(self.failed_call(Reason::DestinationFetchFailed))?
                .map(Arc::new),
            None => None,
        };
        // The object as it is now, read by the controller (a stale cache, or someone writing too).
        let read_again = || async {
            let object = self
                .own
                .get_opt(&name)
                .await
                .map_err(self.failed_call(Reason::DestinationFetchFailed))?;
            Ok::<_, CopyWrite>(object.map(Arc::new))
        };
        let mut last_error = None;
        // A stale cache costs one retry with a fresh read; a third round means someone keeps writing.
        for _ in 0..3 {
            let Some(current) = existing.take() else {
                match create_copy(journal, writer, &key, owner, &desired_object(desired)?).await {
                    Ok(created) => {
                        remember_if_current(journal, &key, &created, desired, fingerprint);
                        return Ok(CopyWrite::Created);
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        existing = read_again().await?;
                        last_error = Some(kube::Error::Api(s));
                        continue;
                    }
                    Err(e) => return Err(self.refused(e, Reason::DestinationCreateFailed)),
                }
            };
            let adopting = !owner.owns(current.metadata.annotations.as_ref());
            // Remembered as up to date only with a resourceVersion and a fingerprint of the desired copy.
            let stored_at = current.metadata.resource_version.as_deref().zip(fingerprint);
            if !adopting
                && stored_at.is_some_and(|(rv, fingerprint)| journal.is_verified(&key, rv, fingerprint))
            {
                return Ok(CopyWrite::Unchanged);
            }
            let current_value = serde_json::to_value(&*current)
                .map_err(|e| failed(Reason::DestinationConflict, e.to_string()))?;
            // What to do is `shared`'s decision; the rest is I/O.
            let patch = match decide(Some(&current_value), desired, owner, existing_copy) {
                // Never for an object that exists (`existing` is empty now: the next round creates).
                WriteDecision::Create => continue,
                WriteDecision::Conflict(message) => return Err(failed(Reason::DestinationConflict, message)),
                WriteDecision::Kept => return Ok(CopyWrite::Unchanged),
                WriteDecision::UpToDate => {
                    if let Some((rv, fingerprint)) = stored_at {
                        journal.remember_verified(&key, rv, fingerprint);
                    }
                    return Ok(CopyWrite::Unchanged);
                }
                WriteDecision::Update(patch) | WriteDecision::Adopt(patch) => patch,
            };
            journal.begin_write(key.clone());
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            let patched = writer.patch(&name, &params, &Patch::Merge(&patch)).await;
            journal.finish_write(
                key.clone(),
                owner,
                patched.as_ref().ok().and_then(|p| p.resource_version()),
            );
            match patched {
                Ok(_) if adopting => return Ok(CopyWrite::Adopted),
                Ok(updated) => {
                    remember_if_current(journal, &key, &updated, desired, fingerprint);
                    return Ok(CopyWrite::Updated);
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    existing = read_again().await?;
                    last_error = Some(kube::Error::Api(s));
                }
                Err(kube::Error::Api(s)) if is_immutable_refusal(&s) && !recreatable => {
                    let copy = format!("{namespace}/{name}");
                    let fields = immutable_fields(&s);
                    return Err(failed(
                        Reason::DestinationImmutable,
                        immutable_message(&copy, group_kind, &fields, &s.message),
                    ));
                }
                Err(kube::Error::Api(s)) if is_immutable_refusal(&s) => {
                    // The first line: a PersistentVolumeClaim's refusal goes on with a diff of its spec.
                    let reason = s.message.lines().next().unwrap_or_default().to_owned();
                    return self
                        .recreate(&key, &current, &desired_object(desired)?)
                        .await
                        .map(|()| CopyWrite::Recreated(reason));
                }
                Err(e) => return Err(self.refused(e, Reason::DestinationUpdateFailed)),
            }
        }
        Err(match last_error {
            Some(e) => self.failed_call(Reason::DestinationUpdateFailed)(e),
            None => failed(
                Reason::DestinationConflict,
                format!("destination {namespace}/{name} kept changing while being written"),
            ),
        })
    }
}

/// The built copy as the object the API takes.
fn desired_object(desired: &Value) -> Result<DynamicObject, CopyWrite> {
    serde_json::from_value(desired.clone())
        .map_err(|e| failed(Reason::DestinationConflict, format!("unbuildable copy: {e}")))
}

/// Remembers a copy as the apiserver answered our write (after any admission changes) when it is up
/// to date, so the next pass need not compare it.
fn remember_if_current(
    journal: &WriteJournal,
    key: &ObjectKey,
    written: &DynamicObject,
    desired: &Value,
    fingerprint: Option<u64>,
) {
    let Some((rv, fingerprint)) = written.metadata.resource_version.as_deref().zip(fingerprint) else {
        return;
    };
    let Ok(written_value) = serde_json::to_value(written) else {
        return;
    };
    if plan_update(&written_value, desired, FIELD_MANAGER) == WritePlan::UpToDate {
        journal.remember_verified(key, rv, fingerprint);
    }
}

/// Creates a copy, telling the journal so that the resulting watch event wakes nothing.
async fn create_copy(
    journal: &WriteJournal,
    api: &Api<DynamicObject>,
    key: &ObjectKey,
    owner: &Owner,
    desired: &DynamicObject,
) -> Result<DynamicObject, kube::Error> {
    journal.begin_write(key.clone());
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let created = api.create(&params, desired).await;
    journal.finish_write(
        key.clone(),
        owner,
        created.as_ref().ok().and_then(|c| c.resource_version()),
    );
    created
}

impl Writer<'_> {
    /// Replaces an owned copy whose update the apiserver refuses as immutable.
    async fn recreate(
        &self,
        key: &ObjectKey,
        current: &DynamicObject,
        desired: &DynamicObject,
    ) -> Result<(), CopyWrite> {
        let (journal, owner) = (self.journal, self.owner);
        journal.record_delete(key.clone());
        let preconditions = Preconditions {
            uid: current.uid(),
            resource_version: current.resource_version(),
        };
        let params = DeleteParams {
            preconditions: Some(preconditions),
            ..Default::default()
        };
        match self.own.delete(&key.name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(self.failed_call(Reason::DestinationUpdateFailed)(e)),
        }
        // The delete may still be in progress (finalizers of others): try the create again every
        // 100 ms, 50 tries in all, while the name is still taken.
        let name_taken = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 409);
        let while_deleting = ConstantBuilder::new()
            .with_delay(Duration::from_millis(100))
            .with_max_times(49);
        match (|| create_copy(journal, &self.writer.0, key, owner, desired))
            .retry(while_deleting)
            .when(name_taken)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if name_taken(&e) => Err(failed(
                Reason::DestinationConflict,
                format!(
                    "destination {}/{} is still being deleted; it will be recreated on the next attempt",
                    key.namespace, key.name
                ),
            )),
            Err(e) => Err(self.refused(e, Reason::DestinationCreateFailed)),
        }
    }

    /// Deletes `current` (a copy as last seen) if we own it, with uid and resourceVersion
    /// preconditions; a copy that changed meanwhile is read again once (`after_delete_conflict`), and
    /// a second conflict is returned as the error, so the pass backs off instead of looping.
    async fn remove(&self, current: &DynamicObject) -> Result<Removed, kube::Error> {
        let (journal, api, group_kind, owner) = (self.journal, &self.own, self.group_kind, self.owner);
        let name = current.name_any();
        let mut fresh: Option<DynamicObject> = None;
        let mut reads = 0;
        loop {
            let seen = fresh.as_ref().unwrap_or(current);
            if !owner.owns(seen.metadata.annotations.as_ref()) {
                return Ok(Removed::LeftAlone);
            }
            if seen.metadata.deletion_timestamp.is_some() {
                return Ok(Removed::Deleted);
            }
            journal.record_delete(ObjectKey::of(group_kind, seen));
            let preconditions = Preconditions {
                uid: seen.uid(),
                resource_version: seen.resource_version(),
            };
            let params = DeleteParams {
                preconditions: Some(preconditions),
                ..Default::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => return Ok(Removed::Deleted),
                Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(Removed::Absent),
                Err(kube::Error::Api(s)) if s.code == 409 => match after_delete_conflict(reads) {
                    AfterDeleteConflict::ReadAgain => {
                        reads += 1;
                        match api.get_opt(&name).await? {
                            None => return Ok(Removed::Absent),
                            Some(object) => fresh = Some(object),
                        }
                    }
                    AfterDeleteConflict::GiveUp => return Err(kube::Error::Api(s)),
                },
                Err(e) => return Err(e),
            }
        }
    }

    /// Orphans `current` (a copy as last seen) if we own it: our ownership annotation, UID label,
    /// source hash and request stamp are removed (resourceVersion precondition); a copy that changed
    /// meanwhile is read again once.
    async fn orphan(&self, current: &DynamicObject) -> Result<Removed, kube::Error> {
        let (api, owner) = (&self.own, self.owner);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let name = current.name_any();
        let mut seen = current.clone();
        for attempt in 0..2 {
            let Some(patch) = orphan_patch(&seen.metadata, owner) else {
                return Ok(Removed::LeftAlone);
            };
            match api.patch(&name, &params, &Patch::Merge(&patch)).await {
                Ok(_) => return Ok(Removed::Orphaned),
                Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(Removed::Absent),
                Err(kube::Error::Api(s)) if s.code == 409 && attempt == 0 => {
                    match api.get_opt(&name).await? {
                        None => return Ok(Removed::Absent),
                        Some(fresh) => seen = fresh,
                    }
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the second attempt returns")
    }

    /// Deletes or orphans `current` (a copy as last seen), as `release` says.
    pub async fn release(&self, current: &DynamicObject, release: Release) -> Result<Removed, kube::Error> {
        match release {
            Release::Delete => self.remove(current).await,
            Release::Orphan => self.orphan(current).await,
        }
    }

    /// Deletes or orphans the copy named `name`, as `release` says, if we own it.
    pub async fn release_named(&self, name: &str, release: Release) -> Result<Removed, kube::Error> {
        match self.own.get_opt(name).await? {
            None => Ok(Removed::Absent),
            Some(current) => self.release(&current, release).await,
        }
    }
}
