//! Metadata hygiene: which of a source's labels and annotations never travel to a copy by default,
//! and how `spec.metadata` keeps one of them (`include`) or drops more (`exclude`).
//!
//! Another tool's tracking or ownership keys on a copy make that tool act on the copy: GitOps tools
//! prune it or fight over it, cert-manager looks for a Certificate that does not exist, another
//! mirror mirrors it again. [`NEVER_TRAVELS`] is the one list of them (SPEC §10).

use crate::{
    api::copy_spec::MetadataKeyFilter,
    api::keys::{LAST_APPLIED, RESERVED_PREFIX},
    copy::globs::matches_any,
};
use wildmatch::WildMatch;

/// Whether a hygiene entry is about labels, annotations or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetadataField {
    /// `metadata.labels`.
    Labels,
    /// `metadata.annotations`.
    Annotations,
}

/// One key (or glob of keys) that never travels unless `spec.metadata.<field>.include` says so.
#[derive(Clone, Copy, Debug)]
pub struct NeverTravels {
    /// The key, or a glob (`*`) of keys.
    pub glob: &'static str,
    /// Labels, annotations, or both.
    pub fields: &'static [MetadataField],
    /// Only on sources of this core kind (`None`: any kind).
    pub only_kind: Option<&'static str>,
    /// Whose key it is and what it would do on a copy.
    pub why: &'static str,
}

const LABELS: &[MetadataField] = &[MetadataField::Labels];
const ANNOTATIONS: &[MetadataField] = &[MetadataField::Annotations];
const BOTH: &[MetadataField] = &[MetadataField::Labels, MetadataField::Annotations];

/// What never travels from a source to its copies by default.
pub const NEVER_TRAVELS: &[NeverTravels] = &[
    NeverTravels {
        glob: "argocd.argoproj.io/tracking-id",
        fields: ANNOTATIONS,
        only_kind: None,
        why: "Argo CD's tracking: Argo CD would prune the copy as an orphan of the source's application",
    },
    NeverTravels {
        glob: "argocd.argoproj.io/instance",
        fields: LABELS,
        only_kind: None,
        why: "Argo CD's tracking label (label tracking mode): same as the tracking id",
    },
    NeverTravels {
        glob: "kustomize.toolkit.fluxcd.io/*",
        fields: BOTH,
        only_kind: None,
        why: "Flux's Kustomization ownership: Flux would garbage-collect or fight over the copy",
    },
    NeverTravels {
        glob: "helm.toolkit.fluxcd.io/*",
        fields: BOTH,
        only_kind: None,
        why: "Flux's HelmRelease ownership: same as Kustomization",
    },
    NeverTravels {
        glob: "meta.helm.sh/release-name",
        fields: ANNOTATIONS,
        only_kind: None,
        why: "Helm's release ownership: an upgrade of that release would adopt or refuse the copy",
    },
    NeverTravels {
        glob: "meta.helm.sh/release-namespace",
        fields: ANNOTATIONS,
        only_kind: None,
        why: "Helm's release ownership, with the release name",
    },
    NeverTravels {
        glob: "cert-manager.io/*",
        fields: ANNOTATIONS,
        only_kind: Some("Secret"),
        why: "cert-manager's issuance record: cert-manager would look for a Certificate that does not exist",
    },
    NeverTravels {
        glob: "controller.cert-manager.io/*",
        fields: LABELS,
        only_kind: Some("Secret"),
        why: "cert-manager's label on the Secrets it manages",
    },
    NeverTravels {
        glob: "reflector.v1.k8s.emberstack.com/*",
        fields: ANNOTATIONS,
        only_kind: None,
        why: "Reflector's markers: Reflector would mirror the copy again",
    },
    NeverTravels {
        glob: "replicator.v1.mittwald.de/*",
        fields: BOTH,
        only_kind: None,
        why: "kubernetes-replicator's markers: it would replicate the copy again",
    },
    NeverTravels {
        glob: "kubed.appscode.com/*",
        fields: BOTH,
        only_kind: None,
        why: "kubed's sync markers: kubed would sync the copy again",
    },
    NeverTravels {
        glob: LAST_APPLIED,
        fields: ANNOTATIONS,
        only_kind: None,
        why: "describes the source as applied by kubectl, not the copy",
    },
];

/// Whether the hygiene list drops `key` of `field` on a source of core kind `kind` (`kind` is
/// empty outside the core group).
pub fn dropped_by_default(field: MetadataField, core_kind: &str, key: &str) -> bool {
    NEVER_TRAVELS.iter().any(|entry| {
        entry.fields.contains(&field)
            && entry.only_kind.is_none_or(|k| k == core_kind)
            && WildMatch::new(entry.glob).matches(key)
    })
}

/// Whether the source's `key` of `field` travels to the copy: never a `projection.sh/` key; a key
/// of `filter.exclude` never; a key of the hygiene list only when `filter.include` names it;
/// anything else always. The overlay is applied after this and wins.
pub fn travels(field: MetadataField, core_kind: &str, key: &str, filter: Option<&MetadataKeyFilter>) -> bool {
    if key.starts_with(RESERVED_PREFIX) {
        return false;
    }
    let listed = |globs: Option<&Vec<String>>| globs.is_some_and(|g| matches_any(g, key));
    if listed(filter.and_then(|f| f.exclude.as_ref())) {
        return false;
    }
    !dropped_by_default(field, core_kind, key) || listed(filter.and_then(|f| f.include.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_is_a_valid_glob_of_a_foreign_prefix() {
        for entry in NEVER_TRAVELS {
            assert!(!entry.glob.starts_with(RESERVED_PREFIX), "{}", entry.glob);
            assert!(!entry.fields.is_empty(), "{}", entry.glob);
            assert!(!entry.why.is_empty(), "{}", entry.glob);
        }
    }
}
