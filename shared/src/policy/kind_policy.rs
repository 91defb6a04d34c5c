//! Which kinds may be copied at all, whatever RBAC the services have: a copy is a write made with
//! the operator's authority, so kinds whose objects grant power in the namespace they land in
//! (who may do what, whose identity pods run as, where a Service's traffic goes) are refused unless
//! a platform flag names them, and the operator's own CRs are never a source (a copy of a
//! Projection is a new Projection, reviewed as written by the controller: that would launder its
//! author's access check). Checked by the webhook at admission and by the controller at every
//! reconcile, from the same functions.

use crate::api::source::GroupKind;
use std::{collections::BTreeSet, fmt, str::FromStr};

/// The API group of the operator's own kinds.
pub const OWN_GROUP: &str = "projection.sh";

/// The Secret type whose objects hold a ServiceAccount's token.
pub const SERVICE_ACCOUNT_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";

/// Kinds refused unless named by `--allow-power-kinds`, as `(group, kind, why)`.
pub const POWER_KINDS: &[(&str, &str, &str)] = &[
    ("rbac.authorization.k8s.io", "Role", "grants permissions"),
    ("rbac.authorization.k8s.io", "RoleBinding", "grants permissions"),
    ("", "ServiceAccount", "is an identity pods and tokens act as"),
    ("", "Endpoints", "redirects a Service's traffic"),
    (
        "discovery.k8s.io",
        "EndpointSlice",
        "redirects a Service's traffic",
    ),
];

/// The power kinds a platform allows (`--allow-power-kinds`, e.g.
/// `RoleBinding.rbac.authorization.k8s.io,ServiceAccount`), plus `Secret/service-account-token` for
/// ServiceAccount token Secrets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedPowerKinds {
    kinds: BTreeSet<GroupKind>,
    service_account_tokens: bool,
}

/// The name `--allow-power-kinds` takes for ServiceAccount token Secrets.
pub const TOKEN_SECRETS_NAME: &str = "Secret/service-account-token";

impl FromStr for AllowedPowerKinds {
    type Err = String;

    /// A comma-separated list of `Kind.group` (`Kind` for the core group) from [`POWER_KINDS`], and
    /// `Secret/service-account-token`; empty allows none.
    fn from_str(list: &str) -> Result<Self, String> {
        let mut allowed = Self::default();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if item == TOKEN_SECRETS_NAME {
                allowed.service_account_tokens = true;
                continue;
            }
            let (kind, group) = item.split_once('.').unwrap_or((item, ""));
            let known = POWER_KINDS.iter().any(|(g, k, _)| *g == group && *k == kind);
            if !known {
                return Err(format!(
                    "{item:?} is not a kind this flag allows; it takes {} (comma-separated)",
                    power_kind_names().join(", ")
                ));
            }
            allowed.kinds.insert(GroupKind {
                group: group.to_owned(),
                kind: kind.to_owned(),
            });
        }
        Ok(allowed)
    }
}

impl fmt::Display for AllowedPowerKinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<String> = self.kinds.iter().map(kind_name).collect();
        if self.service_account_tokens {
            names.push(TOKEN_SECRETS_NAME.to_owned());
        }
        f.write_str(&names.join(","))
    }
}

/// Every name `--allow-power-kinds` takes.
pub fn power_kind_names() -> Vec<String> {
    POWER_KINDS
        .iter()
        .map(|(group, kind, _)| {
            kind_name(&GroupKind {
                group: (*group).to_owned(),
                kind: (*kind).to_owned(),
            })
        })
        .chain([TOKEN_SECRETS_NAME.to_owned()])
        .collect()
}

/// `Kind.group`, or `Kind` in the core group.
fn kind_name(kind: &GroupKind) -> String {
    if kind.group.is_empty() {
        kind.kind.clone()
    } else {
        format!("{}.{}", kind.kind, kind.group)
    }
}

/// Whether objects of `kind` may be sources and copies; the message says why not and how to allow
/// it where a platform can.
pub fn check_kind(kind: &GroupKind, allowed: &AllowedPowerKinds) -> Result<(), String> {
    if kind.group == OWN_GROUP {
        return Err(format!(
            "spec.source: {} kinds cannot be projected: a copy of a Projection would be a new \
             Projection made with the operator's authority instead of its author's",
            OWN_GROUP
        ));
    }
    let power = POWER_KINDS
        .iter()
        .find(|(g, k, _)| *g == kind.group && *k == kind.kind);
    match power {
        Some((_, _, why)) if !allowed.kinds.contains(kind) => Err(format!(
            "spec.source.kind: {name} {why}, so it is not projected unless the platform allows it \
             (controller and webhook flag --allow-power-kinds={name}, Helm value allowPowerKinds)",
            name = kind_name(kind)
        )),
        _ => Ok(()),
    }
}

/// Whether this source object may be copied: ServiceAccount token Secrets only when allowed.
/// `secret_type` is the object's `type` for a core Secret, `None` for other kinds.
pub fn check_object(
    kind: &GroupKind,
    secret_type: Option<&str>,
    allowed: &AllowedPowerKinds,
) -> Result<(), String> {
    let token =
        kind.group.is_empty() && kind.kind == "Secret" && secret_type == Some(SERVICE_ACCOUNT_TOKEN_TYPE);
    if token && !allowed.service_account_tokens {
        return Err(format!(
            "the source is a ServiceAccount token Secret (type {SERVICE_ACCOUNT_TOKEN_TYPE}): a copy \
             would let every reader of its namespace act as that ServiceAccount, so it is not projected \
             unless the platform allows it (--allow-power-kinds={TOKEN_SECRETS_NAME})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gk(group: &str, kind: &str) -> GroupKind {
        GroupKind {
            group: group.to_owned(),
            kind: kind.to_owned(),
        }
    }

    #[test]
    fn the_operators_own_kinds_are_never_sources_whatever_is_allowed() {
        let everything: AllowedPowerKinds = power_kind_names().join(",").parse().unwrap();
        for kind in ["Projection", "ClusterProjection", "Anything"] {
            let message = check_kind(&gk(OWN_GROUP, kind), &everything).unwrap_err();
            assert!(message.starts_with("spec.source:"), "{message}");
        }
    }

    #[test]
    fn power_kinds_are_refused_until_named() {
        let none = AllowedPowerKinds::default();
        for (group, kind, _) in POWER_KINDS {
            let message = check_kind(&gk(group, kind), &none).unwrap_err();
            assert!(message.contains("--allow-power-kinds="), "{message}");
        }
        let some: AllowedPowerKinds = "RoleBinding.rbac.authorization.k8s.io, ServiceAccount"
            .parse()
            .unwrap();
        assert_eq!(
            check_kind(&gk("rbac.authorization.k8s.io", "RoleBinding"), &some),
            Ok(())
        );
        assert_eq!(check_kind(&gk("", "ServiceAccount"), &some), Ok(()));
        assert!(check_kind(&gk("rbac.authorization.k8s.io", "Role"), &some).is_err());
        assert_eq!(
            some.to_string(),
            "ServiceAccount,RoleBinding.rbac.authorization.k8s.io"
        );
    }

    #[test]
    fn ordinary_kinds_pass() {
        let none = AllowedPowerKinds::default();
        for (group, kind) in [
            ("", "ConfigMap"),
            ("", "Secret"),
            ("apps", "Deployment"),
            ("example.com", "Role"),
        ] {
            assert_eq!(check_kind(&gk(group, kind), &none), Ok(()));
        }
    }

    #[test]
    fn token_secrets_need_their_own_name() {
        let secret = gk("", "Secret");
        let none = AllowedPowerKinds::default();
        assert!(check_object(&secret, Some(SERVICE_ACCOUNT_TOKEN_TYPE), &none).is_err());
        assert_eq!(check_object(&secret, Some("Opaque"), &none), Ok(()));
        assert_eq!(check_object(&secret, None, &none), Ok(()));
        let tokens: AllowedPowerKinds = TOKEN_SECRETS_NAME.parse().unwrap();
        assert_eq!(
            check_object(&secret, Some(SERVICE_ACCOUNT_TOKEN_TYPE), &tokens),
            Ok(())
        );
    }

    #[test]
    fn unknown_names_are_refused_listing_the_known_ones() {
        let message = "ConfigMap".parse::<AllowedPowerKinds>().unwrap_err();
        assert!(
            message.contains("RoleBinding.rbac.authorization.k8s.io"),
            "{message}"
        );
        assert_eq!("".parse::<AllowedPowerKinds>(), Ok(AllowedPowerKinds::default()));
    }
}
