//! The plan of one pass, for both kinds: given the resolved targets, the copies as they are and what
//! the status recorded, which namespaces get a copy written, which copies go, which targets are
//! refused before anything is written, and (with `syncPolicy: ApplyOnce`) which copies are only
//! created. A Projection is a pass whose only target is its own namespace.
//!
//! The plan is made before any write and read again after: [`Plan::conclude`] turns the results of
//! the writes and removals into the pass's outcome, retry, events, waits and `ApplyOnce` record.
//! The controller applies a plan through whichever client reaches the copies, and the kubectl
//! plugin's `preview` makes the same plan without applying it.

use crate::{
    api::{
        crd::{AppliedOnce, SyncPolicy, WrittenDestination},
        kind::{CrView, Scope},
        reason::{Reason, Retry},
    },
    pass::{
        apply_once::{self, OncePlan},
        status::{Concluded, Outcome, Stop},
        tally::{
            CopyFailure, CopyWrite, EventNote, Removal, Tally, name_first, note_for, summarize_failures,
        },
        targets::Targets,
    },
};
use std::collections::BTreeSet;

/// How a copy that exists already is treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Patched to match the source (`syncPolicy: Reconcile`).
    Update,
    /// Left as it is (`syncPolicy: ApplyOnce`); a stranger's object is still only adopted with
    /// consent.
    Keep,
}

/// One copy as the plan sees it: where it is, and whether the CR's ownership annotation names it
/// (the only proof that it is ours).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyView<'a> {
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
    /// Whether the CR's ownership annotation names it.
    pub ours: bool,
}

/// The coordinates of one copy.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CopyAt {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl CopyAt {
    /// `<namespace>/<name>`.
    pub fn path(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What a plan is made from: the CR, and what the cluster holds for it ([`PassInput::of`]).
#[derive(Clone, Copy, Debug)]
pub struct PassInput<'a> {
    /// Which kind of CR makes the pass.
    pub scope: Scope,
    /// The `SourceResolved` message.
    pub resolved: &'a str,
    /// The copies the current spec writes: their kind and name.
    pub copies: &'a WrittenDestination,
    /// The copies the status recorded (an earlier spec may have written another kind or name).
    pub recorded: Option<&'a WrittenDestination>,
    /// The resolved target namespaces.
    pub targets: &'a Targets,
    /// Target namespaces where the CR's author may not create the kind, with the denial.
    pub forbidden: &'a [(String, String)],
    /// The copies of the current kind that carry the CR's UID label (or its annotation), as they
    /// are now.
    pub existing: &'a [CopyView<'a>],
    /// `spec.syncPolicy`.
    pub sync_policy: Option<SyncPolicy>,
    /// `status.appliedOnce`.
    pub applied_once: Option<&'a AppliedOnce>,
    /// `status.sourceHash`: the hash of the content the last pass that reported wrote.
    pub reported_hash: Option<&'a str>,
}

impl<'a> PassInput<'a> {
    /// The input of a pass of `cr`, from what the cluster holds: the source's `resolved` message,
    /// the `copies` its spec writes now, the resolved `targets`, the targets where its author may
    /// not create the kind (`forbidden`) and its copies as they are (`existing`). The controller and
    /// the plugin's `preview` both plan from this.
    pub fn of(
        cr: &CrView<'a>,
        (resolved, copies): (&'a str, &'a WrittenDestination),
        targets: &'a Targets,
        forbidden: &'a [(String, String)],
        existing: &'a [CopyView<'a>],
    ) -> Self {
        Self {
            scope: cr.scope,
            resolved,
            copies,
            recorded: cr.status.and_then(|s| s.written_destination.as_ref()),
            targets,
            forbidden,
            existing,
            sync_policy: cr.controls.sync_policy,
            applied_once: cr.status.and_then(|s| s.applied_once.as_ref()),
            reported_hash: cr.status.and_then(|s| s.source_hash.as_deref()),
        }
    }
}

/// Everything a pass will do, decided before it does anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Which kind of CR makes the pass.
    pub scope: Scope,
    /// The `SourceResolved` message.
    pub resolved: String,
    /// The namespaces where the copy is written (created, or updated as `existing` says).
    pub write: Vec<String>,
    /// What a write does with a copy that exists already.
    pub existing: Existing,
    /// Copies of the current kind that go: ours, outside the targets kept or under another name.
    pub remove: Vec<CopyAt>,
    /// Copies an earlier spec wrote in another kind: every one of them goes.
    pub earlier: Option<WrittenDestination>,
    /// Targets not written, known before writing (the author may not create the kind there).
    pub refused: Vec<CopyFailure>,
    /// The copies the pass writes: their kind and name.
    pub copies: WrittenDestination,
    /// The resolved targets.
    pub targets: Targets,
    /// With `syncPolicy: ApplyOnce`: the record read from status and how the targets sort by it.
    pub once: Option<(BTreeSet<String>, OncePlan)>,
    /// `status.sourceHash` as the pass found it.
    pub reported_hash: Option<String>,
}

/// Makes the plan of a pass. `Err` when the pass is refused as a whole: a Projection whose copy
/// would be the source itself.
pub fn plan(input: &PassInput<'_>) -> Result<Plan, Stop> {
    let PassInput {
        scope,
        resolved,
        copies,
        recorded,
        targets,
        forbidden,
        existing,
        sync_policy,
        applied_once,
        reported_hash,
    } = *input;
    if scope == Scope::OwnNamespace
        && let Some(found) = &targets.skipped_source
    {
        return Err(Stop::Destination {
            reason: Reason::DestinationConflict,
            message: found.projection_message(),
            resolved: resolved.to_owned(),
        });
    }
    let is_forbidden = |namespace: &str| forbidden.iter().any(|(f, _)| f == namespace);
    let allowed: Vec<String> = targets
        .write
        .iter()
        .filter(|n| !is_forbidden(n))
        .cloned()
        .collect();
    let mut keep = targets.keep();
    keep.retain(|n| !is_forbidden(n));
    let mut remove: Vec<CopyAt> = existing
        .iter()
        .filter(|c| c.ours && (!keep.contains(c.namespace) || c.name != copies.name))
        .map(|c| CopyAt {
            namespace: c.namespace.to_owned(),
            name: c.name.to_owned(),
        })
        .collect();
    // A Projection knows where its earlier copy of the same kind is, found or not by its label.
    if scope == Scope::OwnNamespace
        && let Some(old) = recorded.filter(|old| same_kind(old, copies) && old.name != copies.name)
        && let Some(home) = targets.write.first()
    {
        let at = CopyAt {
            namespace: home.clone(),
            name: old.name.clone(),
        };
        if !remove.contains(&at) {
            remove.push(at);
        }
    }
    remove.sort();
    let earlier = recorded.filter(|old| !same_kind(old, copies)).cloned();
    let refused = forbidden
        .iter()
        .map(|(namespace, message)| CopyFailure {
            namespace: namespace.clone(),
            reason: Reason::DestinationForbidden,
            message: message.clone(),
        })
        .collect();
    let (write, existing_copy, once) = if apply_once::is_apply_once(sync_policy) {
        let record = apply_once::recorded(applied_once, copies);
        let exist: BTreeSet<String> = existing
            .iter()
            .filter(|c| c.ours && c.name == copies.name)
            .map(|c| c.namespace.to_owned())
            .collect();
        let sorted = apply_once::plan(&allowed, &record, &exist);
        (sorted.create.clone(), Existing::Keep, Some((record, sorted)))
    } else {
        (allowed, Existing::Update, None)
    };
    Ok(Plan {
        scope,
        resolved: resolved.to_owned(),
        write,
        existing: existing_copy,
        remove,
        earlier,
        refused,
        copies: copies.clone(),
        targets: targets.clone(),
        once,
        reported_hash: reported_hash.map(str::to_owned),
    })
}

/// Whether two records name copies of the same kind (a version change moves nothing: copies are
/// the same objects).
fn same_kind(a: &WrittenDestination, b: &WrittenDestination) -> bool {
    a.group == b.group && a.kind == b.kind
}

impl Plan {
    /// The end of the applied plan: `writes` are the per-namespace results, `removed` what the
    /// removals of copies of the current kind did and `earlier` those of an earlier kind, `hash` the
    /// source hash every copy carries; `gvk` and `from` (`<ns>/<name>`) name the source in events.
    pub fn conclude(
        &self,
        writes: Vec<(String, CopyWrite)>,
        (removed, earlier): (Removal, Removal),
        hash: String,
        (gvk, from): (&str, &str),
    ) -> Concluded {
        let mut tally = Tally::of(self.unreported_as_updated(writes, &hash));
        tally.failures.extend(self.refused.iter().cloned());
        tally.failures.sort_by(|a, b| a.namespace.cmp(&b.namespace));
        let earlier_gone = earlier.all_gone();
        let removals = removed.and(earlier);
        let mut events = self.write_events(&tally, gvk, from);
        events.extend(removals.events.iter().cloned());
        let waiting = tally.conflicts().map(str::to_owned).collect();
        let (outcome, retry) = self.verdict(&tally, removals.all_gone());
        let (outcome, holding, applied_once) = match &self.once {
            Some((record, sorted)) => {
                let failed: BTreeSet<&String> = tally.failures.iter().map(|f| &f.namespace).collect();
                let placed = sorted.create.iter().filter(|n| !failed.contains(n));
                let next = apply_once::next_record(record, &self.targets.write, placed);
                let holding = self.targets.write.len() - sorted.left_deleted.len();
                let outcome = apply_once::with_note(outcome, sorted);
                (outcome, holding, Some(apply_once::record(&self.copies, &next)))
            }
            None => (outcome, self.targets.write.len(), None),
        };
        let record = match &self.earlier {
            Some(old) if !earlier_gone => old.clone(),
            _ => self.copies.clone(),
        };
        Concluded {
            outcome,
            retry,
            tally,
            events,
            waiting,
            record,
            holding,
            applied_once,
            hash,
        }
    }

    /// The writes with every copy found current counted as updated when the status reports other
    /// content (`status.sourceHash`, present: the CR was reported on before) than the copies carry
    /// now. Only a pass that wrote them and ended before it reported (its replica's Lease lapsed
    /// and the fence cut it, or the process was killed) leaves copies newer than the status; its
    /// `Updated` event is published by this pass instead of being lost. A status write that failed
    /// after the events may repeat one: an event told twice rather than never. With ApplyOnce a copy
    /// left as it is may be older than the source, so nothing is counted.
    fn unreported_as_updated(
        &self,
        writes: Vec<(String, CopyWrite)>,
        hash: &str,
    ) -> Vec<(String, CopyWrite)> {
        let stale =
            self.existing == Existing::Update && self.reported_hash.as_deref().is_some_and(|r| r != hash);
        if !stale {
            return writes;
        }
        writes
            .into_iter()
            .map(|(namespace, write)| match write {
                CopyWrite::Unchanged => (namespace, CopyWrite::Updated),
                other => (namespace, other),
            })
            .collect()
    }

    /// How the pass ends: its outcome and how it is retried. `cleaned` says whether every copy no
    /// longer wanted is gone.
    fn verdict(&self, tally: &Tally, cleaned: bool) -> (Outcome, Retry) {
        let resolved = self.resolved.clone();
        if let Some(summary) = summarize_failures(&tally.failures) {
            // A stranger's object only leaves through a watch event; anything else is retried.
            let retry = if tally
                .failures
                .iter()
                .all(|f| crate::api::reason::retry_after(f.reason, false, cleaned) == Retry::OnChange)
            {
                Retry::OnChange
            } else {
                Retry::Backoff
            };
            let (reason, message) = match (self.scope, tally.failures.as_slice()) {
                (Scope::OwnNamespace, [only]) => (only.reason, only.message.clone()),
                _ => (summary.reason, summary.message),
            };
            let outcome = Outcome::DestinationFailed {
                resolved,
                reason,
                message,
            };
            return (outcome, retry);
        }
        if !cleaned {
            let outcome = Outcome::DestinationFailed {
                resolved,
                reason: Reason::DestinationDeleteFailed,
                message: "copies no longer wanted could not be removed yet".into(),
            };
            return (outcome, Retry::Backoff);
        }
        let note = match self.scope {
            Scope::OwnNamespace => String::new(),
            Scope::Namespaces => note_for(&self.targets),
        };
        (Outcome::Projected { resolved, note }, Retry::OnChange)
    }

    /// The events of the writes: one per recreated copy and per failed namespace, then one naming
    /// the created copies, one the updated and one the adopted.
    fn write_events(&self, tally: &Tally, gvk: &str, from: &str) -> Vec<EventNote> {
        let name = &self.copies.name;
        let mut events: Vec<EventNote> = tally
            .recreated
            .iter()
            .map(|(namespace, why)| EventNote {
                reason: Reason::DestinationRecreated,
                note: format!("recreated {namespace}/{name} because an in-place update was refused: {why}"),
            })
            .collect();
        events.extend(tally.failures.iter().map(|f| EventNote {
            reason: f.reason,
            note: match self.scope {
                Scope::OwnNamespace => f.message.clone(),
                Scope::Namespaces => format!("{}/{name}: {}", f.namespace, f.message),
            },
        }));
        let copies =
            |namespaces: &[String]| name_first(namespaces.iter().map(|ns| format!("{ns}/{name}")).collect());
        if !tally.created.is_empty() {
            events.push(EventNote {
                reason: Reason::Projected,
                note: format!("projected {gvk} {from} to {}", copies(&tally.created)),
            });
        }
        if !tally.updated.is_empty() {
            events.push(EventNote {
                reason: Reason::Updated,
                note: format!("updated {gvk} {from} to {}", copies(&tally.updated)),
            });
        }
        if !tally.adopted.is_empty() {
            events.push(EventNote {
                reason: Reason::DestinationAdopted,
                note: format!("adopted {} as the copy of {from}", copies(&tally.adopted)),
            });
        }
        events
    }
}

/// Which copies a CR releases when they all go (its deletion, or its source gone or vetoing): per
/// kind, every copy carrying the CR's UID label, and for a Projection also the copies at the
/// coordinates it knows (its own namespace, under the recorded and the current name), found or not
/// by their label. Each is released only if the CR's ownership annotation still names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Withdrawal {
    /// Per kind (its recorded or current copies), the coordinates known besides the labelled ones.
    pub kinds: Vec<(WrittenDestination, Vec<CopyAt>)>,
}

/// The [`Withdrawal`] of a CR of `scope` living in `home` (a Projection's namespace), whose status
/// recorded `recorded` and whose spec writes `current` now (`None` when its kind does not resolve).
pub fn withdrawal(
    scope: Scope,
    home: Option<&str>,
    recorded: Option<&WrittenDestination>,
    current: Option<&WrittenDestination>,
) -> Withdrawal {
    let mut kinds: Vec<(WrittenDestination, Vec<CopyAt>)> = Vec::new();
    for copies in current.into_iter().chain(recorded) {
        let named = match (scope, home) {
            (Scope::OwnNamespace, Some(home)) => vec![CopyAt {
                namespace: home.to_owned(),
                name: copies.name.clone(),
            }],
            _ => Vec::new(),
        };
        match kinds.iter_mut().find(|(k, _)| same_kind(k, copies)) {
            Some((_, known)) => {
                for at in named {
                    if !known.contains(&at) {
                        known.push(at);
                    }
                }
            }
            None => kinds.push((copies.clone(), named)),
        }
    }
    Withdrawal { kinds }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::self_copy::SelfCopy;

    fn copies(kind: &str, name: &str) -> WrittenDestination {
        WrittenDestination {
            group: String::new(),
            version: "v1".into(),
            kind: kind.into(),
            name: name.into(),
            cluster: None,
            cluster_identity: None,
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn targets(write: &[&str]) -> Targets {
        Targets {
            write: names(write),
            ..Targets::default()
        }
    }

    fn at(namespace: &str, name: &str) -> CopyAt {
        CopyAt {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn view<'a>(namespace: &'a str, name: &'a str, ours: bool) -> CopyView<'a> {
        CopyView {
            namespace,
            name,
            ours,
        }
    }

    /// A pass of `scope` writing ConfigMaps named `cfg` to `targets`, nothing recorded, Reconcile.
    fn input<'a>(scope: Scope, now: &'a WrittenDestination, targets: &'a Targets) -> PassInput<'a> {
        PassInput {
            scope,
            resolved: "r",
            copies: now,
            recorded: None,
            targets,
            forbidden: &[],
            existing: &[],
            sync_policy: None,
            applied_once: None,
            reported_hash: None,
        }
    }

    fn written(results: &[(&str, CopyWrite)]) -> Vec<(String, CopyWrite)> {
        results
            .iter()
            .map(|(ns, w)| ((*ns).to_owned(), w.clone()))
            .collect()
    }

    fn failed(reason: Reason) -> CopyWrite {
        CopyWrite::Failed {
            reason,
            message: format!("m {reason}"),
        }
    }

    /// Removals that left nothing.
    fn clean() -> (Removal, Removal) {
        (Removal::default(), Removal::default())
    }

    /// A removal that left a copy.
    fn left() -> Removal {
        Removal {
            events: Vec::new(),
            left: vec!["ConfigMap x/cfg: refused".into()],
        }
    }
    const SOURCE: (&str, &str) = ("/v1, Kind=ConfigMap", "src/cfg");

    #[test]
    fn a_projection_writes_its_own_namespace_and_reports_in_the_copys_words() {
        let now = copies("ConfigMap", "cfg");
        let own = Targets::own_namespace("team", Some(&source()), "cfg");
        let plan = plan(&input(Scope::OwnNamespace, &now, &own)).unwrap();
        assert_eq!(plan.write, ["team"]);
        assert_eq!(plan.existing, Existing::Update);
        assert!(plan.remove.is_empty() && plan.earlier.is_none() && plan.once.is_none());

        let done = plan.conclude(
            written(&[("team", CopyWrite::Created)]),
            clean(),
            "h".into(),
            SOURCE,
        );
        assert_eq!(
            done.outcome,
            Outcome::Projected {
                resolved: "r".into(),
                note: String::new()
            }
        );
        assert_eq!(done.retry, Retry::OnChange);
        assert_eq!(done.events.len(), 1);
        assert_eq!(
            done.events[0].note,
            "projected /v1, Kind=ConfigMap src/cfg to team/cfg"
        );
        assert_eq!(done.record, now);
        assert!(done.tally.first_copy(false));

        let conflict = plan.conclude(
            written(&[("team", failed(Reason::DestinationConflict))]),
            clean(),
            "h".into(),
            SOURCE,
        );
        assert_eq!(conflict.outcome.reason(), Reason::DestinationConflict);
        assert_eq!(
            conflict.outcome.message(),
            "m DestinationConflict",
            "the copy's own words"
        );
        assert_eq!(conflict.events[0].note, "m DestinationConflict");
        assert_eq!(conflict.waiting, ["team"], "woken when the stranger goes");
        assert_eq!(conflict.retry, Retry::OnChange);
        // In another cluster no watch sees the stranger go: the pass polls for it.
        let elsewhere = conflict.clone().where_strangers_are_unwatched();
        assert_eq!(
            (elsewhere.retry, elsewhere.outcome),
            (Retry::Backoff, conflict.outcome)
        );
        assert_eq!(
            done.clone().where_strangers_are_unwatched().retry,
            done.retry,
            "nothing awaited"
        );
    }

    fn source() -> crate::api::crd::SourceRef {
        serde_json::from_value(serde_json::json!({"kind": "ConfigMap", "namespace": "src", "name": "cfg"}))
            .expect("source")
    }

    #[test]
    fn a_projection_onto_its_source_is_refused_and_a_cluster_projection_skips_that_namespace() {
        let now = copies("ConfigMap", "cfg");
        let own = Targets::own_namespace("src", Some(&source()), "cfg");
        let refused = plan(&input(Scope::OwnNamespace, &now, &own)).unwrap_err();
        assert_eq!(refused.reason(), Reason::DestinationConflict);
        assert!(
            refused.message().contains("set spec.destination.name"),
            "{}",
            refused.message()
        );

        let fan = Targets {
            write: names(&["a"]),
            skipped_source: Some(SelfCopy {
                kind: "ConfigMap".into(),
                namespace: "src".into(),
                name: "cfg".into(),
            }),
            ..Targets::default()
        };
        let plan = plan(&input(Scope::Namespaces, &now, &fan)).unwrap();
        assert_eq!(plan.write, ["a"]);
        let done = plan.conclude(
            written(&[("a", CopyWrite::Unchanged)]),
            clean(),
            "h".into(),
            SOURCE,
        );
        assert!(done.events.is_empty(), "an unchanged copy says nothing");
        assert_eq!(done.outcome.message(), "", "Ready carries no message on success");
        match done.outcome {
            Outcome::Projected { note, .. } => {
                assert!(note.starts_with("1 namespaces; skipped src"), "{note}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_rename_removes_the_old_copy_even_without_its_label() {
        let now = copies("ConfigMap", "new");
        let old = copies("ConfigMap", "old");
        let own = Targets::own_namespace("team", Some(&source()), "new");
        // The old copy is found by its label, or known from the status when its label is gone.
        for existing in [vec![view("team", "old", true)], Vec::new()] {
            let input = PassInput {
                recorded: Some(&old),
                existing: &existing,
                ..input(Scope::OwnNamespace, &now, &own)
            };
            let plan = plan(&input).unwrap();
            assert_eq!(plan.remove, [at("team", "old")]);
            assert_eq!(plan.earlier, None, "the same kind: nothing else to sweep");
        }
        // A ClusterProjection finds its renamed copies by their label.
        let fan = targets(&["a", "b"]);
        let existing = [
            view("a", "old", true),
            view("b", "new", true),
            view("b", "old", false),
        ];
        let input = PassInput {
            recorded: Some(&old),
            existing: &existing,
            ..input(Scope::Namespaces, &now, &fan)
        };
        assert_eq!(
            plan(&input).unwrap().remove,
            [at("a", "old")],
            "never a copy not ours"
        );
    }

    #[test]
    fn a_kind_change_sweeps_the_earlier_kind_and_keeps_its_record_until_it_is_gone() {
        let now = copies("Secret", "cfg");
        let old = copies("ConfigMap", "cfg");
        let fan = targets(&["a"]);
        let input = PassInput {
            recorded: Some(&old),
            ..input(Scope::Namespaces, &now, &fan)
        };
        let plan = plan(&input).unwrap();
        assert_eq!(plan.earlier.as_ref(), Some(&old));
        let partly = (Removal::default(), left());
        let done = plan.conclude(written(&[("a", CopyWrite::Created)]), partly, "h".into(), SOURCE);
        assert_eq!(done.record, old, "recorded until every earlier copy is gone");
        assert_eq!(done.outcome.reason(), Reason::DestinationDeleteFailed);
        assert_eq!(done.retry, Retry::Backoff);
        let done = plan.conclude(
            written(&[("a", CopyWrite::Unchanged)]),
            clean(),
            "h".into(),
            SOURCE,
        );
        assert_eq!(done.record, now);
        // A version change alone moves nothing: copies are the same objects.
        let other_version = WrittenDestination {
            version: "v2".into(),
            ..now.clone()
        };
        let input = PassInput {
            recorded: Some(&other_version),
            ..input
        };
        assert_eq!(super::plan(&input).unwrap().earlier, None);
    }

    #[test]
    fn namespaces_leaving_the_list_or_the_selector_lose_their_copy_and_terminating_ones_keep_it() {
        let now = copies("ConfigMap", "cfg");
        let fan = Targets {
            write: names(&["a", "c"]),
            terminating: names(&["b"]),
            pending: names(&["later"]),
            ..Targets::default()
        };
        let existing = [
            view("a", "cfg", true),
            view("b", "cfg", true),
            view("d", "cfg", true),
            view("e", "cfg", false),
        ];
        let input = PassInput {
            existing: &existing,
            ..input(Scope::Namespaces, &now, &fan)
        };
        let plan = plan(&input).unwrap();
        assert_eq!(
            plan.write,
            ["a", "c"],
            "terminating and pending namespaces are not written"
        );
        assert_eq!(plan.remove, [at("d", "cfg")], "b is terminating: its copy stays");
        let done = plan.conclude(
            written(&[("a", CopyWrite::Unchanged), ("c", CopyWrite::Created)]),
            clean(),
            "h".into(),
            SOURCE,
        );
        match &done.outcome {
            Outcome::Projected { note, .. } => assert_eq!(
                note,
                "2 namespaces; pending until created: later; skipped while terminating: b"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(done.holding, 2);
    }

    #[test]
    fn failures_roll_up_per_namespace_and_only_strangers_wait_for_a_watch_event() {
        use Reason::*;
        let now = copies("ConfigMap", "cfg");
        let fan = targets(&["ns-0", "ns-1"]);
        let plan = plan(&input(Scope::Namespaces, &now, &fan)).unwrap();
        // (failure reasons, cleaned, ready reason or None for Projected, retry)
        let table: [(&[Reason], bool, Option<Reason>, Retry); 7] = [
            (&[], true, None, Retry::OnChange),
            (&[], false, Some(DestinationDeleteFailed), Retry::Backoff),
            (
                &[DestinationConflict],
                true,
                Some(DestinationConflict),
                Retry::OnChange,
            ),
            (
                &[DestinationConflict, DestinationConflict],
                false,
                Some(DestinationConflict),
                Retry::Backoff,
            ),
            (
                &[DestinationCreateFailed],
                true,
                Some(DestinationCreateFailed),
                Retry::Backoff,
            ),
            (
                &[DestinationConflict, DestinationUpdateFailed],
                true,
                Some(DestinationWriteFailed),
                Retry::Backoff,
            ),
            (
                &[DestinationFetchFailed],
                false,
                Some(DestinationFetchFailed),
                Retry::Backoff,
            ),
        ];
        for (reasons, cleaned, ready, retry) in table {
            let results = reasons
                .iter()
                .enumerate()
                .map(|(i, r)| (format!("ns-{i}"), failed(*r)))
                .collect();
            let removed = if cleaned { Removal::default() } else { left() };
            let done = plan.conclude(results, (removed, Removal::default()), "h".into(), SOURCE);
            match ready {
                None => assert_eq!(
                    done.outcome,
                    Outcome::Projected {
                        resolved: "r".into(),
                        note: "2 namespaces".into()
                    }
                ),
                Some(reason) => assert_eq!(done.outcome.reason(), reason, "{reasons:?}"),
            }
            assert_eq!(done.retry, retry, "{reasons:?} {cleaned}");
        }
        let done = plan.conclude(
            written(&[
                ("ns-1", failed(DestinationConflict)),
                ("ns-0", CopyWrite::Created),
            ]),
            clean(),
            "h".into(),
            SOURCE,
        );
        assert_eq!(
            done.outcome.message(),
            "write failed in 1 namespace: ns-1 (DestinationConflict)"
        );
        assert_eq!(done.waiting, ["ns-1"]);
        let notes: Vec<(Reason, &str)> = done.events.iter().map(|e| (e.reason, e.note.as_str())).collect();
        assert_eq!(
            notes,
            [
                (DestinationConflict, "ns-1/cfg: m DestinationConflict"),
                (Projected, "projected /v1, Kind=ConfigMap src/cfg to ns-0/cfg"),
            ]
        );
    }

    #[test]
    fn events_name_recreated_updated_and_adopted_copies() {
        let now = copies("ConfigMap", "cfg");
        let fan = targets(&["a", "b", "c", "e", "f"]);
        let plan = plan(&input(Scope::Namespaces, &now, &fan)).unwrap();
        let done = plan.conclude(
            written(&[
                ("b", CopyWrite::Created),
                ("a", CopyWrite::Created),
                ("c", CopyWrite::Recreated("field is immutable".into())),
                ("f", CopyWrite::Adopted),
                ("e", CopyWrite::Adopted),
            ]),
            clean(),
            "h".into(),
            SOURCE,
        );
        let got: Vec<(Reason, &str)> = done.events.iter().map(|e| (e.reason, e.note.as_str())).collect();
        assert_eq!(
            got,
            [
                (
                    Reason::DestinationRecreated,
                    "recreated c/cfg because an in-place update was refused: field is immutable"
                ),
                (
                    Reason::Projected,
                    "projected /v1, Kind=ConfigMap src/cfg to a/cfg, b/cfg"
                ),
                (Reason::Updated, "updated /v1, Kind=ConfigMap src/cfg to c/cfg"),
                (
                    Reason::DestinationAdopted,
                    "adopted e/cfg, f/cfg as the copy of src/cfg"
                ),
            ]
        );
    }

    #[test]
    fn copies_written_by_a_pass_that_never_reported_are_told_as_updated_by_the_next() {
        let now = copies("ConfigMap", "cfg");
        let fan = targets(&["a", "b", "c"]);
        let writes = || {
            written(&[
                ("a", CopyWrite::Unchanged),
                ("b", CopyWrite::Updated),
                ("c", CopyWrite::Unchanged),
            ])
        };
        let updated = |reported: Option<&str>| {
            let input = PassInput {
                reported_hash: reported,
                ..input(Scope::Namespaces, &now, &fan)
            };
            let done = plan(&input)
                .unwrap()
                .conclude(writes(), clean(), "h".into(), SOURCE);
            let notes: Vec<String> = done
                .events
                .into_iter()
                .filter(|e| e.reason == Reason::Updated)
                .map(|e| e.note)
                .collect();
            (notes, done.tally.updated)
        };
        // The status reports other content than the copies found current carry: a pass wrote
        // them and was cut short before its events.
        assert_eq!(
            updated(Some("g")),
            (
                names(&["updated /v1, Kind=ConfigMap src/cfg to a/cfg, b/cfg, c/cfg"]),
                names(&["a", "b", "c"])
            )
        );
        // The same content reported, or never any (a new CR, or one the Go operator made): only
        // what this pass wrote.
        for reported in [Some("h"), None] {
            assert_eq!(
                updated(reported),
                (
                    names(&["updated /v1, Kind=ConfigMap src/cfg to b/cfg"]),
                    names(&["b"])
                ),
                "{reported:?}"
            );
        }
        // ApplyOnce leaves copies as they are, however old: nothing is told of them.
        let input = PassInput {
            sync_policy: Some(SyncPolicy::ApplyOnce),
            reported_hash: Some("g"),
            ..input(Scope::Namespaces, &now, &fan)
        };
        let done = plan(&input).unwrap().conclude(
            written(&[("a", CopyWrite::Unchanged)]),
            clean(),
            "h".into(),
            SOURCE,
        );
        assert!(
            done.tally.updated.is_empty() && done.events.is_empty(),
            "{:?}",
            done.events
        );
    }

    #[test]
    fn where_the_author_may_not_create_nothing_is_written_and_the_copy_goes() {
        let now = copies("ConfigMap", "cfg");
        let forbidden = [(
            "b".to_owned(),
            "the author may not create configmaps in b".to_owned(),
        )];
        let existing = [view("a", "cfg", true), view("b", "cfg", true)];
        let fan = targets(&["a", "b"]);
        let own = Targets::own_namespace("b", Some(&source()), "cfg");
        for (scope, targets, message) in [
            (
                Scope::Namespaces,
                &fan,
                "write failed in 1 namespace: b (DestinationForbidden)",
            ),
            (
                Scope::OwnNamespace,
                &own,
                "the author may not create configmaps in b",
            ),
        ] {
            let input = PassInput {
                forbidden: &forbidden,
                existing: &existing,
                ..input(scope, &now, targets)
            };
            let plan = plan(&input).unwrap();
            assert!(!plan.write.contains(&"b".to_owned()), "{scope:?}");
            assert!(plan.remove.contains(&at("b", "cfg")), "{scope:?}");
            let done = plan.conclude(Vec::new(), clean(), "h".into(), SOURCE);
            assert_eq!(done.outcome.reason(), Reason::DestinationForbidden);
            assert_eq!(done.outcome.message(), message);
            assert_eq!(done.retry, Retry::Backoff, "a grant wakes no watch");
        }
    }

    #[test]
    fn apply_once_creates_each_copy_once_and_never_again() {
        let now = copies("ConfigMap", "cfg");
        let fan = targets(&["a", "b", "c"]);
        // a: created once and still there; b: created once and deleted since; c: new.
        let record = apply_once::record(&now, &BTreeSet::from(["a".to_owned(), "b".to_owned()]));
        let existing = [view("a", "cfg", true)];
        for scope in [Scope::Namespaces, Scope::OwnNamespace] {
            let input = PassInput {
                existing: &existing,
                sync_policy: Some(SyncPolicy::ApplyOnce),
                applied_once: Some(&record),
                ..input(scope, &now, &fan)
            };
            let plan = plan(&input).unwrap();
            assert_eq!(plan.write, ["c"], "{scope:?}");
            assert_eq!(plan.existing, Existing::Keep);
            let done = plan.conclude(written(&[("c", CopyWrite::Created)]), clean(), "h".into(), SOURCE);
            let recorded = done.applied_once.expect("record");
            assert_eq!(
                apply_once::decode(&recorded.namespaces),
                BTreeSet::from(["a".to_owned(), "b".to_owned(), "c".to_owned()])
            );
            assert_eq!(done.holding, 2, "b stays deleted");
            match done.outcome {
                Outcome::Projected { note, .. } => {
                    assert!(note.contains("deleted since, not created again: b"), "{note}")
                }
                other => panic!("{other:?}"),
            }
        }
        // A failed create is not recorded: it is tried again.
        let input = PassInput {
            sync_policy: Some(SyncPolicy::ApplyOnce),
            ..input(Scope::Namespaces, &now, &fan)
        };
        let plan = plan(&input).unwrap();
        let done = plan.conclude(
            written(&[
                ("a", CopyWrite::Created),
                ("b", CopyWrite::Created),
                ("c", failed(Reason::DestinationCreateFailed)),
            ]),
            clean(),
            "h".into(),
            SOURCE,
        );
        assert_eq!(
            apply_once::decode(&done.applied_once.expect("record").namespaces),
            BTreeSet::from(["a".to_owned(), "b".to_owned()])
        );
    }

    #[test]
    fn adopted_copies_are_placed_and_reported() {
        let now = copies("ConfigMap", "cfg");
        let own = Targets::own_namespace("team", Some(&source()), "cfg");
        let plan = plan(&input(Scope::OwnNamespace, &now, &own)).unwrap();
        let done = plan.conclude(
            written(&[("team", CopyWrite::Adopted)]),
            clean(),
            "h".into(),
            SOURCE,
        );
        assert!(done.outcome.is_ready());
        assert_eq!(done.events[0].reason, Reason::DestinationAdopted);
        assert_eq!(done.events[0].note, "adopted team/cfg as the copy of src/cfg");
        assert!(!done.tally.first_copy(false), "adopted, not created");
    }

    #[test]
    fn a_withdrawal_names_every_kind_and_a_projections_known_coordinates() {
        let now = copies("Secret", "new");
        let old = copies("ConfigMap", "old");
        let same_kind_old = copies("Secret", "old");
        assert_eq!(
            withdrawal(Scope::OwnNamespace, Some("team"), Some(&old), Some(&now)),
            Withdrawal {
                kinds: vec![
                    (now.clone(), vec![at("team", "new")]),
                    (old.clone(), vec![at("team", "old")])
                ]
            }
        );
        assert_eq!(
            withdrawal(
                Scope::OwnNamespace,
                Some("team"),
                Some(&same_kind_old),
                Some(&now)
            ),
            Withdrawal {
                kinds: vec![(now.clone(), vec![at("team", "new"), at("team", "old")])]
            }
        );
        assert_eq!(
            withdrawal(Scope::Namespaces, None, Some(&old), None),
            Withdrawal {
                kinds: vec![(old.clone(), Vec::new())]
            },
            "a kind that no longer resolves: the recorded copies only"
        );
        assert_eq!(withdrawal(Scope::Namespaces, None, None, None).kinds, []);
    }

    #[test]
    fn removals_are_reported_by_what_happened() {
        let results = [
            ("a/cfg".to_owned(), crate::pass::tally::Removed::Deleted),
            ("b/cfg".to_owned(), crate::pass::tally::Removed::Orphaned),
            ("c/cfg".to_owned(), crate::pass::tally::Removed::LeftAlone),
            ("d/cfg".to_owned(), crate::pass::tally::Removed::Absent),
            ("e/cfg".to_owned(), crate::pass::tally::Removed::Deleted),
        ];
        let got: Vec<(Reason, String)> = crate::pass::tally::removal_events(&results)
            .into_iter()
            .map(|e| (e.reason, e.note))
            .collect();
        assert_eq!(
            got,
            [
                (Reason::DestinationLeftAlone, "c/cfg (not owned)".to_owned()),
                (Reason::DestinationDeleted, "a/cfg, e/cfg".to_owned()),
                (
                    Reason::DestinationOrphaned,
                    "b/cfg left in place, no longer managed".to_owned()
                ),
            ]
        );
        assert!(crate::pass::tally::removal_events(&[]).is_empty());
    }
}
