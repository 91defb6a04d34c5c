//! The author of a CR's spec: who last created or changed it, recorded at admission in the
//! annotation `projection.sh/author`, so the controller can check, where each copy is made, that the
//! author could itself read the source and create that kind in the destination namespace (a
//! SubjectAccessReview for the author, not for the controller's own account).
//!
//! The webhook's mutating endpoint writes the record from the request's userInfo; the chart's
//! ValidatingAdmissionPolicy (evaluated by the apiserver itself, so it holds with the webhook down
//! or bypassed) refuses any create or spec change whose record is not exactly the requesting user's.
//! The record is therefore a value the CEL of that policy can build: JSON with a fixed key order, and
//! names that need no escaping (no `"`, `\` or control characters, which [`Author::of`] refuses).
//! User uid and extra fields are not recorded: RBAC decides on the name and groups alone.

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use serde::Deserialize;
use std::fmt;

/// CR annotation holding the author's record.
pub const AUTHOR: &str = "projection.sh/author";

/// A user as the apiserver authenticated them: name and groups.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Deserialize)]
pub struct Author {
    /// The user name, e.g. `alice` or `system:serviceaccount:team-a:deployer`.
    pub username: String,
    /// The groups, in the order the apiserver gave them.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// Why a CR's author cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthorProblem {
    /// The CR carries no record (made before the record existed, or with the webhook bypassed).
    Missing,
    /// The record does not parse, or names a user that cannot be recorded.
    Invalid(String),
}

impl fmt::Display for AuthorProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing => write!(
                f,
                "no author is recorded (annotation {AUTHOR}, written at admission by the webhook), so \
                 nothing is copied: apply the spec again with the webhook running"
            ),
            Self::Invalid(why) => write!(f, "the annotation {AUTHOR} is not a valid author record: {why}"),
        }
    }
}

impl Author {
    /// The author of a request from `username` in `groups`; refused when a name holds a character
    /// the record cannot carry unescaped.
    pub fn of(username: &str, groups: &[String]) -> Result<Self, String> {
        for name in std::iter::once(username).chain(groups.iter().map(String::as_str)) {
            if let Some(c) = name.chars().find(|c| *c == '"' || *c == '\\' || c.is_control()) {
                return Err(format!(
                    "the user or group name {name:?} holds {c:?}, which an author record cannot carry"
                ));
            }
        }
        if username.is_empty() {
            return Err("the request has no user name".to_owned());
        }
        Ok(Self {
            username: username.to_owned(),
            groups: groups.to_vec(),
        })
    }

    /// The annotation value, byte for byte what the ValidatingAdmissionPolicy builds:
    /// `{"username":"alice","groups":["team-a","system:authenticated"]}`.
    pub fn record(&self) -> String {
        let groups: Vec<String> = self.groups.iter().map(|g| format!("\"{g}\"")).collect();
        format!(
            "{{\"username\":\"{}\",\"groups\":[{}]}}",
            self.username,
            groups.join(",")
        )
    }

    /// The author recorded in `annotations`.
    pub fn recorded_in(
        annotations: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Result<Self, AuthorProblem> {
        let value = annotations
            .and_then(|a| a.get(AUTHOR))
            .ok_or(AuthorProblem::Missing)?;
        let parsed: Self = serde_json::from_str(value).map_err(|e| AuthorProblem::Invalid(e.to_string()))?;
        // Only what the policy could have let through: the same checks, and the same bytes back.
        let checked = Self::of(&parsed.username, &parsed.groups).map_err(AuthorProblem::Invalid)?;
        if checked.record() != *value {
            return Err(AuthorProblem::Invalid(
                "it is not in the form the admission policy writes".to_owned(),
            ));
        }
        Ok(checked)
    }

    /// The SubjectAccessReview asking whether this author may `verb` the objects `attributes` name.
    pub fn access_review(&self, attributes: ResourceAttributes) -> SubjectAccessReview {
        SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(self.username.clone()),
                groups: Some(self.groups.clone()),
                resource_attributes: Some(attributes),
                ..Default::default()
            },
            ..Default::default()
        }
    }
}

impl Author {
    /// The impersonation headers that make a request the author's (names in lower case, as HTTP/2
    /// sends them): `Impersonate-User`, and one `Impersonate-Group` per recorded group. A ServiceAccount is impersonated by name alone: the
    /// apiserver gives it its groups (the ones recorded: `system:serviceaccounts`, its namespace's,
    /// `system:authenticated`), and constrained impersonation grants a ServiceAccount only that way.
    /// `system:masters` is left out: the apiserver refuses to impersonate it (see [`Author::is_master`]).
    pub fn impersonation_headers(&self) -> Vec<(&'static str, &str)> {
        let mut headers = vec![("impersonate-user", self.username.as_str())];
        if !self.username.starts_with(SERVICE_ACCOUNT_PREFIX) {
            let impersonable = self.groups.iter().filter(|g| g.as_str() != MASTERS);
            headers.extend(impersonable.map(|g| ("impersonate-group", g.as_str())));
        }
        headers
    }

    /// Whether the author is in `system:masters`, which the apiserver lets nobody impersonate: such
    /// an author is impersonated without it, so only the RBAC of its name and other groups counts.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }
}

/// How the apiserver names a ServiceAccount user.
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";
/// The group that bypasses authorization, and that the apiserver refuses to impersonate.
const MASTERS: &str = "system:masters";

/// What a CR's author is asked, where each copy is made.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AccessQuestion {
    /// `get` (the source) or `create` (copies).
    pub verb: &'static str,
    /// API group of the kind.
    pub group: String,
    /// Resource (plural) of the kind.
    pub resource: String,
    /// The namespace; empty asks for every namespace at once.
    pub namespace: String,
    /// The object's name; empty for any.
    pub name: String,
}

impl AccessQuestion {
    /// May the author read the source object?
    pub fn read_source(group: &str, resource: &str, namespace: &str, name: &str) -> Self {
        Self {
            verb: "get",
            group: group.to_owned(),
            resource: resource.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    /// May the author create objects of the kind in `namespace` (empty: in every namespace)?
    pub fn create_copies(group: &str, resource: &str, namespace: &str) -> Self {
        Self {
            verb: "create",
            group: group.to_owned(),
            resource: resource.to_owned(),
            namespace: namespace.to_owned(),
            name: String::new(),
        }
    }

    /// The same question about every object of the kind in the namespace, for a question about one
    /// object; `None` for a question that names none. An empty name asks for all names, so a grant
    /// of the wider question answers the narrower one: one review covers every source an author's
    /// CRs read in a namespace, where a review per source cost each moved or rechecked CR a request.
    /// (An authorizer that allows all names and denies one contradicts the empty name's meaning.)
    pub fn widened(&self) -> Option<Self> {
        (!self.name.is_empty()).then(|| Self {
            name: String::new(),
            ..self.clone()
        })
    }

    /// What the question is about, as a metric label: `object` (one, named), `namespace` (every
    /// object of the kind in one namespace) or `cluster` (in every namespace).
    pub fn scope(&self) -> &'static str {
        match (self.namespace.as_str(), self.name.as_str()) {
            ("", _) => "cluster",
            (_, "") => "namespace",
            _ => "object",
        }
    }

    /// The review's resource attributes.
    pub fn attributes(&self) -> ResourceAttributes {
        let some = |s: &String| (!s.is_empty()).then(|| s.clone());
        ResourceAttributes {
            verb: Some(self.verb.to_owned()),
            group: Some(self.group.clone()),
            resource: Some(self.resource.clone()),
            namespace: some(&self.namespace),
            name: some(&self.name),
            ..Default::default()
        }
    }

    /// `get secrets platform/db` or `create configmaps in team-a`, for messages.
    pub fn describe(&self) -> String {
        let resource = if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        };
        match (self.namespace.as_str(), self.name.as_str()) {
            ("", _) => format!("{} {resource} in every namespace", self.verb),
            (ns, "") => format!("{} {resource} in {ns}", self.verb),
            (ns, name) => format!("{} {resource} {ns}/{name}", self.verb),
        }
    }
}

/// The message of a denied question: who may not do what, the authorizer's reason if it gave one,
/// and what follows.
pub fn denial_message(author: &Author, question: &AccessQuestion, reason: Option<&str>) -> String {
    let because = reason
        .filter(|r| !r.is_empty())
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    let consequence = if question.verb == "get" {
        "a copy would show the source to whoever reads its namespace, so its author must be able to read it"
    } else {
        "a copy is only made where its author could create it"
    };
    format!(
        "the author {} may not {}{because}; {consequence} (the author is whoever last created or changed the spec)",
        author.username,
        question.describe()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn annotations(value: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(AUTHOR.to_owned(), value.to_owned())])
    }

    #[test]
    fn the_record_is_the_policys_json_and_reads_back() {
        let alice = Author::of("alice", &["team-a".to_owned(), "system:authenticated".to_owned()]).unwrap();
        let record = alice.record();
        assert_eq!(
            record,
            r#"{"username":"alice","groups":["team-a","system:authenticated"]}"#
        );
        assert_eq!(Author::recorded_in(Some(&annotations(&record))), Ok(alice));
        let nobody = Author::of("system:anonymous", &[]).unwrap();
        assert_eq!(nobody.record(), r#"{"username":"system:anonymous","groups":[]}"#);
    }

    #[test]
    fn a_missing_or_foreign_record_is_no_author() {
        assert_eq!(Author::recorded_in(None), Err(AuthorProblem::Missing));
        assert_eq!(
            Author::recorded_in(Some(&BTreeMap::new())),
            Err(AuthorProblem::Missing)
        );
        for bad in [
            "alice",
            r#"{"username":"alice"}"#,
            r#"{"groups":[],"username":"alice"}"#,
            r#"{"username":"alice","groups":["a"], "x":1}"#,
            r#"{"username":"al\"ice","groups":[]}"#,
            r#"{"username":"","groups":[]}"#,
        ] {
            assert!(
                matches!(
                    Author::recorded_in(Some(&annotations(bad))),
                    Err(AuthorProblem::Invalid(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn an_author_is_impersonated_with_its_groups_and_a_service_account_by_name() {
        let alice = Author::of("alice", &["team-a".to_owned(), "system:authenticated".to_owned()]).unwrap();
        assert_eq!(
            alice.impersonation_headers(),
            [
                ("impersonate-user", "alice"),
                ("impersonate-group", "team-a"),
                ("impersonate-group", "system:authenticated")
            ]
        );
        let admin = Author::of(
            "admin",
            &["system:masters".to_owned(), "system:authenticated".to_owned()],
        )
        .unwrap();
        assert!(admin.is_master() && !alice.is_master());
        assert_eq!(
            admin.impersonation_headers(),
            [
                ("impersonate-user", "admin"),
                ("impersonate-group", "system:authenticated")
            ]
        );
        let deployer = Author::of(
            "system:serviceaccount:team-a:deployer",
            &[
                "system:serviceaccounts".to_owned(),
                "system:authenticated".to_owned(),
            ],
        )
        .unwrap();
        assert_eq!(
            deployer.impersonation_headers(),
            [("impersonate-user", "system:serviceaccount:team-a:deployer")]
        );
    }

    #[test]
    fn names_the_record_cannot_carry_are_refused() {
        assert!(Author::of("a\"b", &[]).is_err());
        assert!(Author::of("alice", &["x\\y".to_owned()]).is_err());
        assert!(Author::of("alice", &["line\nbreak".to_owned()]).is_err());
        assert!(Author::of("", &[]).is_err());
        assert!(Author::of("cn=alice,ou=people", &["o=team, a".to_owned()]).is_ok());
    }

    #[test]
    fn questions_describe_themselves_and_become_reviews() {
        let get = AccessQuestion::read_source("", "secrets", "platform", "db");
        assert_eq!(get.describe(), "get secrets platform/db");
        let everywhere = AccessQuestion::create_copies("apps", "deployments", "");
        assert_eq!(
            everywhere.describe(),
            "create deployments.apps in every namespace"
        );
        assert_eq!(everywhere.attributes().namespace, None);
        let alice = Author::of("alice", &["g".to_owned()]).unwrap();
        let review = alice.access_review(get.attributes());
        assert_eq!(review.spec.user.as_deref(), Some("alice"));
        let attributes = review.spec.resource_attributes.unwrap();
        assert_eq!(
            (attributes.verb.as_deref(), attributes.name.as_deref()),
            (Some("get"), Some("db"))
        );
        let message = denial_message(&alice, &get, Some("no RBAC policy matched"));
        assert!(
            message.starts_with("the author alice may not get secrets platform/db (no RBAC policy matched)")
        );
    }

    #[test]
    fn a_question_about_one_object_widens_to_its_namespace_and_no_further() {
        let get = AccessQuestion::read_source("", "secrets", "platform", "db");
        let wide = get.widened().unwrap();
        assert_eq!(wide.describe(), "get secrets in platform");
        assert_eq!(
            (
                wide.verb,
                wide.attributes().namespace.as_deref(),
                wide.attributes().name
            ),
            ("get", Some("platform"), None)
        );
        assert_eq!(wide.widened(), None);
        assert_eq!((get.scope(), wide.scope()), ("object", "namespace"));
        assert_eq!(
            AccessQuestion::create_copies("", "configmaps", "").scope(),
            "cluster"
        );
        assert_eq!(
            AccessQuestion::create_copies("", "configmaps", "team-a").widened(),
            None
        );
    }
}
