//! `kubectl projection check api`, decided without I/O: from what the apiserver answered, whether
//! the API is served, whether the admission webhook answers (it admits a valid Projection and
//! records its author, and refuses a copy of its own source, which only the webhook can tell),
//! whether a controller leads and renews its Lease, and whether the other clusters CRs write into
//! answer.

use crate::{
    api::{keys::LEADER_LEASE, reason::Reason},
    policy::author::AUTHOR,
};
use serde::Serialize;
use serde_json::Value;

/// One check's verdict: a line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// What was checked (`crds`, `webhook admits`, `webhook refuses`, `leader`, `author access`).
    pub check: String,
    /// Whether it holds.
    pub ok: bool,
    /// What was found, for a person.
    pub detail: String,
}

impl Verdict {
    fn new(check: &str, ok: bool, detail: impl Into<String>) -> Self {
        Self {
            check: check.to_owned(),
            ok,
            detail: detail.into(),
        }
    }
}

/// The kinds `projection.sh/v1` serves (their plural names), against the two it must.
pub fn crds(served: Option<&[String]>) -> Verdict {
    let Some(served) = served else {
        return Verdict::new(
            "crds",
            false,
            "the apiserver does not serve projection.sh/v1: install the CRDs (the chart does, with crds.install, its default; or apply charts/projection/crd-manifests/)",
        );
    };
    let missing: Vec<&str> = ["projections", "clusterprojections"]
        .into_iter()
        .filter(|r| !served.iter().any(|s| s == r))
        .collect();
    if missing.is_empty() {
        Verdict::new(
            "crds",
            true,
            "projection.sh/v1 serves projections and clusterprojections",
        )
    } else {
        Verdict::new(
            "crds",
            false,
            format!("projection.sh/v1 does not serve {}", missing.join(", ")),
        )
    }
}

/// A dry-run create of a valid Projection: `Ok(object)` as the apiserver returned it, or the
/// refusal's message. The webhook answered when the object carries the author it records.
pub fn admits(answer: Result<&Value, &str>) -> Verdict {
    match answer {
        Ok(object) if object["metadata"]["annotations"][AUTHOR].is_string() => Verdict::new(
            "webhook admits",
            true,
            format!(
                "a valid Projection is admitted and its author recorded ({AUTHOR}: {})",
                object["metadata"]["annotations"][AUTHOR]
                    .as_str()
                    .unwrap_or_default()
            ),
        ),
        Ok(_) => Verdict::new(
            "webhook admits",
            false,
            format!(
                "a valid Projection was admitted without the webhook (no {AUTHOR} recorded): its \
                 MutatingWebhookConfiguration is missing, so no author is recorded and, with \
                 --author-access=enforce, nothing is copied"
            ),
        ),
        Err(message) => Verdict::new(
            "webhook admits",
            false,
            format!("a valid Projection was refused: {message}"),
        ),
    }
}

/// A dry-run create of a Projection whose copy would be its own source, which only the webhook
/// refuses (no schema rule can see the Projection's namespace).
pub fn refuses(answer: Result<&Value, &str>) -> Verdict {
    match answer {
        Err(message) if message.contains("denied the request") => Verdict::new(
            "webhook refuses",
            true,
            "a Projection copying onto its own source is refused by the webhook",
        ),
        Err(message) => Verdict::new(
            "webhook refuses",
            false,
            format!("refused, but not by the webhook: {message}"),
        ),
        Ok(_) => Verdict::new(
            "webhook refuses",
            false,
            "a Projection copying onto its own source was admitted: the ValidatingWebhookConfiguration is missing",
        ),
    }
}

/// The leader Lease in `namespace` as read (`None`: not there), judged at `now` (Unix seconds):
/// held, and renewed within its duration (a leader renews it well before).
pub fn leader(namespace: &str, lease: Option<&Value>, now: i64) -> Verdict {
    let Some(lease) = lease else {
        return Verdict::new(
            "leader",
            false,
            format!("no Lease {namespace}/{LEADER_LEASE}: no controller has led here"),
        );
    };
    let spec = &lease["spec"];
    let holder = spec["holderIdentity"].as_str().unwrap_or_default();
    let duration = spec["leaseDurationSeconds"].as_i64().unwrap_or(0);
    let renewed = spec["renewTime"]
        .as_str()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(|t| t.as_second());
    match renewed {
        _ if holder.is_empty() => Verdict::new(
            "leader",
            false,
            format!("Lease {namespace}/{LEADER_LEASE} is held by no one"),
        ),
        Some(at) if now - at <= duration.max(1) => Verdict::new(
            "leader",
            true,
            format!("{holder} leads ({namespace}), renewed {}s ago", (now - at).max(0)),
        ),
        Some(at) => Verdict::new(
            "leader",
            false,
            format!(
                "{holder} last renewed Lease {namespace}/{LEADER_LEASE} {}s ago, past its {duration}s: no controller is leading",
                now - at
            ),
        ),
        None => Verdict::new(
            "leader",
            false,
            format!("Lease {namespace}/{LEADER_LEASE} was never renewed"),
        ),
    }
}

/// Another cluster CRs write into (`spec.destination.kubeConfig`), through the Secret at
/// `secret` (`<namespace>/<name>`, used by `crs` CRs): whether it answered, with its version, or
/// the reason and message a pass would report.
pub fn other_cluster(secret: &str, crs: usize, answer: Result<&str, (Reason, &str)>) -> Verdict {
    let check = format!("cluster of {secret}");
    match answer {
        Ok(version) => Verdict::new(
            &check,
            true,
            format!("answers (Kubernetes {version}); {crs} CR(s) write there"),
        ),
        Err((reason, message)) => Verdict::new(
            &check,
            false,
            format!("{reason}: {message}; {crs} CR(s) write there"),
        ),
    }
}

/// The controller's `--author-access`, as its Deployment runs it.
pub fn author_access(namespace: &str, mode: &str) -> Verdict {
    let detail = match mode {
        "trusted" => format!(
            "{namespace}: trusted: no author checks (the Go operator's behaviour); any Projection author can copy what the controller may read"
        ),
        _ => format!(
            "{namespace}: {mode}: each CR's author must be allowed to read its source and create its copies"
        ),
    };
    Verdict::new("author access", true, detail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_check_tells_ok_from_failing() {
        let both = ["projections".to_owned(), "clusterprojections".to_owned()];
        assert!(crds(Some(&both)).ok);
        assert!(!crds(Some(&both[..1])).ok);
        assert!(crds(Some(&both[..1])).detail.contains("clusterprojections"));
        assert!(!crds(None).ok);

        let recorded = json!({"metadata": {"annotations": {AUTHOR: "alice"}}});
        assert!(admits(Ok(&recorded)).ok);
        assert!(!admits(Ok(&json!({"metadata": {}}))).ok);
        assert!(!admits(Err("boom")).ok);
        assert!(
            refuses(Err(
                "admission webhook \"validate.projection.sh\" denied the request: spec.source: ..."
            ))
            .ok
        );
        assert!(!refuses(Err("the server is unavailable")).ok);
        assert!(!refuses(Ok(&recorded)).ok);

        let lease = |holder: &str, renewed: &str| json!({"spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed}});
        let now = "2026-11-26T12:00:20Z"
            .parse::<k8s_openapi::jiff::Timestamp>()
            .unwrap()
            .as_second();
        // (lease, ok)
        let table = [
            (Some(lease("pod-a", "2026-11-26T12:00:10.000000Z")), true),
            (Some(lease("pod-a", "2026-11-26T11:59:00.000000Z")), false),
            (Some(lease("", "2026-11-26T12:00:10.000000Z")), false),
            (Some(json!({"spec": {"holderIdentity": "pod-a"}})), false),
            (None, false),
        ];
        for (l, ok) in table {
            assert_eq!(leader("ops", l.as_ref(), now).ok, ok, "{l:?}");
        }
        assert!(
            author_access("ops", "trusted")
                .detail
                .contains("no author checks")
        );
        let answered = other_cluster("team-a/eu", 2, Ok("v1.36.3"));
        assert!(answered.ok && answered.check == "cluster of team-a/eu");
        let unreachable = other_cluster(
            "team-a/eu",
            1,
            Err((Reason::DestinationClusterUnreachable, "connection refused")),
        );
        assert!(!unreachable.ok);
        assert!(
            unreachable
                .detail
                .starts_with("DestinationClusterUnreachable: connection refused")
        );
    }
}
