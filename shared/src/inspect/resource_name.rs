//! kubectl's names for a kind: `configmap`, `configmaps`, `cm`, `ConfigMap`, `deployments.apps`,
//! `deploy.v1.apps`, matched against what discovery serves.

/// One served resource, as discovery lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    /// API group ("" for the core group).
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Plural resource name.
    pub plural: String,
    /// Singular resource name (may be empty: then the lowercase kind).
    pub singular: String,
    /// Short names (`cm`).
    pub short_names: Vec<String>,
    /// Whether its objects live in namespaces.
    pub namespaced: bool,
}

impl Served {
    /// Whether `name` names this resource (case-insensitive: plural, singular, kind or short name).
    fn is_named(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        let singular = if self.singular.is_empty() {
            self.kind.to_ascii_lowercase()
        } else {
            self.singular.to_ascii_lowercase()
        };
        name == self.plural.to_ascii_lowercase()
            || name == singular
            || name == self.kind.to_ascii_lowercase()
            || self.short_names.iter().any(|s| s.eq_ignore_ascii_case(&name))
    }
}

/// `KIND/NAME` split in two; `Err` says what is expected.
pub fn split_reference(reference: &str) -> Result<(&str, &str), String> {
    match reference.split_once('/') {
        Some((kind, name)) if !kind.is_empty() && !name.is_empty() && !name.contains('/') => Ok((kind, name)),
        _ => Err(format!(
            "{reference:?} is not KIND/NAME (e.g. configmap/settings or deployments.apps/web)"
        )),
    }
}

/// The served resource `name` means: `resource`, `resource.group` or `resource.version.group`.
/// Sub-resources are never meant. When several groups serve the name, the core group wins, then the
/// first in discovery's order (kubectl's preference).
pub fn resolve<'a>(name: &str, served: &'a [Served]) -> Result<&'a Served, String> {
    let mut candidates: Vec<&Served> = Vec::new();
    let mut forms = vec![(name, None, None)];
    if let Some((resource, rest)) = name.split_once('.') {
        forms.push((resource, None, Some(rest)));
        if let Some((version, group)) = rest.split_once('.') {
            forms.push((resource, Some(version), Some(group)));
        }
    }
    for (resource, version, group) in forms {
        candidates.extend(served.iter().filter(|s| {
            s.is_named(resource)
                && group.is_none_or(|g| g.eq_ignore_ascii_case(&s.group))
                && version.is_none_or(|v| v == s.version)
                && (group.is_some() || version.is_some() || !resource.contains('.'))
        }));
        if !candidates.is_empty() {
            break;
        }
    }
    candidates.sort_by_key(|s| !s.group.is_empty());
    candidates
        .first()
        .copied()
        .ok_or_else(|| format!("the server doesn't have a resource type {name:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(group: &str, version: &str, kind: &str, plural: &str, short: &[&str]) -> Served {
        Served {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            singular: String::new(),
            short_names: short.iter().map(|s| (*s).to_owned()).collect(),
            namespaced: true,
        }
    }

    #[test]
    fn kubectl_names_resolve_like_kubectl() {
        let all = [
            served("", "v1", "ConfigMap", "configmaps", &["cm"]),
            served("", "v1", "Event", "events", &["ev"]),
            served("events.k8s.io", "v1", "Event", "events", &["ev"]),
            served("apps", "v1", "Deployment", "deployments", &["deploy"]),
            served("example.com", "v1alpha1", "Widget", "widgets", &[]),
        ];
        /// The name typed, and the (group, kind) it means, if any.
        type Case<'a> = (&'a str, Option<(&'a str, &'a str)>);
        #[rustfmt::skip]
        let cases: &[Case<'_>] = &[
            ("configmap", Some(("", "ConfigMap"))),
            ("configmaps", Some(("", "ConfigMap"))),
            ("cm", Some(("", "ConfigMap"))),
            ("ConfigMap", Some(("", "ConfigMap"))),
            ("deploy", Some(("apps", "Deployment"))),
            ("deployments.apps", Some(("apps", "Deployment"))),
            ("deployment.v1.apps", Some(("apps", "Deployment"))),
            ("deployment.v2.apps", None),
            ("events", Some(("", "Event"))),
            ("events.events.k8s.io", Some(("events.k8s.io", "Event"))),
            ("widget.example.com", Some(("example.com", "Widget"))),
            ("widgets.other.com", None),
            ("gadget", None),
        ];
        for (name, expected) in cases {
            let got = resolve(name, &all)
                .ok()
                .map(|s| (s.group.as_str(), s.kind.as_str()));
            assert_eq!(got, *expected, "{name}");
        }
        assert_eq!(
            resolve("gadget", &all).unwrap_err(),
            "the server doesn't have a resource type \"gadget\""
        );
    }

    #[test]
    fn a_reference_is_kind_slash_name() {
        assert_eq!(split_reference("cm/settings"), Ok(("cm", "settings")));
        for bad in ["settings", "cm/", "/settings", "cm/a/b"] {
            assert!(split_reference(bad).is_err(), "{bad}");
        }
    }
}
