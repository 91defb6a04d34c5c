//! `kubectl projection preview`: what a pass of a CR would do now, per namespace, from the plan the
//! controller makes (`pass::plan`) and the decision its writer makes for each copy
//! (`copy::write_plan::decide`). Nothing here writes.

use crate::{api::kind::Scope, copy::write_plan::WriteDecision, pass::plan::Plan};
use serde::Serialize;
use serde_json::Value;

/// What the pass would do in one namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Create the copy.
    Create,
    /// Patch our copy.
    Update,
    /// Leave our copy: it is current, or `ApplyOnce` keeps it.
    Unchanged,
    /// Take over an object whose owner consented.
    Adopt,
    /// Leave a stranger's object and report `DestinationConflict`.
    Conflict,
    /// Delete a copy no longer wanted.
    Remove,
    /// Write nothing there (terminating, the source's own namespace, suspended, ApplyOnce, not
    /// created yet).
    Skipped,
    /// Refused before writing (the author may not create the kind there, or the whole pass).
    Refused,
}

/// One line of a preview.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    /// The namespace.
    pub namespace: String,
    /// The copy's name.
    pub name: String,
    /// What would happen.
    pub action: Action,
    /// Why, or what changes.
    pub detail: String,
}

impl Row {
    fn new(namespace: &str, name: &str, action: Action, detail: impl Into<String>) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            action,
            detail: detail.into(),
        }
    }
}

/// The message of a suspended CR's rows.
pub const SUSPENDED: &str = "spec.suspend is true: nothing is written or deleted";

/// The rows of a preview: `decisions` are the writer's decisions in each namespace the plan writes;
/// a `suspended` CR does none of it (each row says what it would do once resumed).
pub fn rows(plan: &Plan, decisions: &[(String, WriteDecision)], suspended: bool) -> Vec<Row> {
    let name = plan.copies.name.as_str();
    let mut rows: Vec<Row> = decisions
        .iter()
        .map(|(namespace, decision)| {
            let (action, detail) = match decision {
                WriteDecision::Create => (Action::Create, String::new()),
                WriteDecision::UpToDate => (Action::Unchanged, "current".to_owned()),
                WriteDecision::Kept => (
                    Action::Unchanged,
                    "syncPolicy ApplyOnce: an existing copy is never updated".to_owned(),
                ),
                WriteDecision::Update(patch) => (Action::Update, changed_fields(patch).join(", ")),
                WriteDecision::Adopt(_) => (
                    Action::Adopt,
                    "its owner consented (projection.sh/adopt-by)".to_owned(),
                ),
                WriteDecision::Conflict(message) => (Action::Conflict, message.clone()),
            };
            Row::new(namespace, name, action, detail)
        })
        .collect();
    rows.extend(
        plan.refused
            .iter()
            .map(|f| Row::new(&f.namespace, name, Action::Refused, f.message.clone())),
    );
    if let Some((_, once)) = &plan.once {
        rows.extend(once.kept.iter().map(|n| {
            Row::new(
                n,
                name,
                Action::Skipped,
                "syncPolicy ApplyOnce: created once, left as it is",
            )
        }));
        rows.extend(once.left_deleted.iter().map(|n| {
            Row::new(
                n,
                name,
                Action::Skipped,
                "syncPolicy ApplyOnce: created once and deleted since, not created again",
            )
        }));
    }
    let targets = &plan.targets;
    rows.extend(targets.terminating.iter().map(|n| {
        Row::new(
            n,
            name,
            Action::Skipped,
            "namespace is terminating: its copy is kept",
        )
    }));
    rows.extend(targets.pending.iter().map(|n| {
        Row::new(
            n,
            name,
            Action::Skipped,
            "namespace does not exist: written when it is created",
        )
    }));
    if let (Scope::Namespaces, Some(own)) = (plan.scope, &targets.skipped_source) {
        rows.push(Row::new(
            &own.namespace,
            name,
            Action::Skipped,
            "the source's own namespace: the copy would be the source itself",
        ));
    }
    rows.extend(
        plan.remove
            .iter()
            .map(|at| Row::new(&at.namespace, &at.name, Action::Remove, "no longer wanted")),
    );
    if let Some(old) = &plan.earlier {
        rows.push(Row::new(
            "*",
            &old.name,
            Action::Remove,
            format!("every {} copy an earlier spec wrote", old.kind),
        ));
    }
    if suspended {
        for row in rows.iter_mut().filter(|r| r.action != Action::Skipped) {
            row.detail = format!("{SUSPENDED}; once resumed: {}", action_word(row.action));
            row.action = Action::Skipped;
        }
    }
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows
}

/// A refused pass as its one row (a Projection onto its own source).
pub fn refused(namespace: &str, name: &str, message: &str) -> Vec<Row> {
    vec![Row::new(namespace, name, Action::Refused, message)]
}

/// Whether a preview shows something a person must act on: a conflict or a refusal.
pub fn needs_attention(rows: &[Row]) -> bool {
    rows.iter()
        .any(|r| matches!(r.action, Action::Conflict | Action::Refused))
}

/// The word of an action, as the table prints it.
pub fn action_word(action: Action) -> &'static str {
    match action {
        Action::Create => "create",
        Action::Update => "update",
        Action::Unchanged => "unchanged",
        Action::Adopt => "adopt",
        Action::Conflict => "conflict",
        Action::Remove => "remove",
        Action::Skipped => "skipped",
        Action::Refused => "refused",
    }
}

/// The fields a merge patch sets or removes, as dotted paths (two levels under `metadata`, one
/// elsewhere; the resourceVersion precondition aside), e.g. `data.b`, `metadata.labels.team`.
pub fn changed_fields(patch: &Value) -> Vec<String> {
    let mut fields = Vec::new();
    let Some(top) = patch.as_object() else {
        return fields;
    };
    for (key, value) in top {
        let depth = if key == "metadata" { 2 } else { 1 };
        collect(key, value, depth, &mut fields);
    }
    fields.retain(|f| f != "metadata.resourceVersion");
    fields
}

fn collect(path: &str, value: &Value, depth: usize, out: &mut Vec<String>) {
    match value.as_object() {
        Some(map) if depth > 0 && !map.is_empty() => {
            for (key, child) in map {
                collect(&format!("{path}.{key}"), child, depth - 1, out);
            }
        }
        _ => out.push(path.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        api::{crd::WrittenDestination, reason::Reason},
        copy::self_copy::SelfCopy,
        pass::{
            apply_once::OncePlan,
            plan::{CopyAt, Existing},
            tally::CopyFailure,
            targets::Targets,
        },
    };
    use serde_json::json;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn plan_of(targets: Targets) -> Plan {
        Plan {
            scope: Scope::Namespaces,
            resolved: String::new(),
            write: targets.write.clone(),
            existing: Existing::Update,
            remove: Vec::new(),
            earlier: None,
            refused: Vec::new(),
            copies: WrittenDestination {
                group: String::new(),
                version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "cfg".into(),
                cluster: None,
                cluster_identity: None,
            },
            targets,
            once: None,
            reported_hash: None,
        }
    }

    fn row(namespace: &str, action: Action, detail: &str) -> Row {
        Row::new(namespace, "cfg", action, detail)
    }

    #[test]
    fn every_namespace_says_what_the_pass_would_do_there() {
        let mut plan = plan_of(Targets {
            write: names(&["a", "b", "c", "d", "e"]),
            pending: names(&["later"]),
            terminating: names(&["going"]),
            skipped_source: Some(SelfCopy {
                kind: "ConfigMap".into(),
                namespace: "src".into(),
                name: "cfg".into(),
            }),
        });
        plan.remove = vec![CopyAt {
            namespace: "old".into(),
            name: "cfg".into(),
        }];
        plan.refused = vec![CopyFailure {
            namespace: "locked".into(),
            reason: Reason::DestinationForbidden,
            message: "may not create".into(),
        }];
        let decisions = vec![
            ("a".to_owned(), WriteDecision::Create),
            ("b".to_owned(), WriteDecision::UpToDate),
            (
                "c".to_owned(),
                WriteDecision::Update(
                    json!({"data": {"x": "1"}, "metadata": {"resourceVersion": "4", "labels": {"t": null}}}),
                ),
            ),
            ("d".to_owned(), WriteDecision::Conflict("not ours".into())),
            ("e".to_owned(), WriteDecision::Adopt(json!({}))),
        ];
        let rows = rows(&plan, &decisions, false);
        #[rustfmt::skip]
        let expected = vec![
            row("a", Action::Create, ""),
            row("b", Action::Unchanged, "current"),
            row("c", Action::Update, "data.x, metadata.labels.t"),
            row("d", Action::Conflict, "not ours"),
            row("e", Action::Adopt, "its owner consented (projection.sh/adopt-by)"),
            row("going", Action::Skipped, "namespace is terminating: its copy is kept"),
            row("later", Action::Skipped, "namespace does not exist: written when it is created"),
            row("locked", Action::Refused, "may not create"),
            row("old", Action::Remove, "no longer wanted"),
            row("src", Action::Skipped, "the source's own namespace: the copy would be the source itself"),
        ];
        assert_eq!(rows, expected);
        assert!(needs_attention(&rows));
        assert!(!needs_attention(&rows[..3]));
    }

    #[test]
    fn apply_once_and_suspension_skip_with_their_reasons() {
        let mut plan = plan_of(Targets {
            write: names(&["a", "b", "c"]),
            ..Targets::default()
        });
        plan.write = names(&["a"]);
        plan.existing = Existing::Keep;
        plan.once = Some((
            ["b", "c"].iter().map(|s| (*s).to_owned()).collect(),
            OncePlan {
                create: names(&["a"]),
                kept: names(&["b"]),
                left_deleted: names(&["c"]),
            },
        ));
        let decisions = vec![("a".to_owned(), WriteDecision::Kept)];
        let rows = rows(&plan, &decisions, false);
        #[rustfmt::skip]
        assert_eq!(rows, vec![
            row("a", Action::Unchanged, "syncPolicy ApplyOnce: an existing copy is never updated"),
            row("b", Action::Skipped, "syncPolicy ApplyOnce: created once, left as it is"),
            row("c", Action::Skipped, "syncPolicy ApplyOnce: created once and deleted since, not created again"),
        ]);

        let plan = plan_of(Targets {
            write: names(&["a"]),
            ..Targets::default()
        });
        let suspended = super::rows(&plan, &[("a".to_owned(), WriteDecision::Create)], true);
        assert_eq!(
            suspended,
            vec![row(
                "a",
                Action::Skipped,
                &format!("{SUSPENDED}; once resumed: create")
            )]
        );
    }
}
