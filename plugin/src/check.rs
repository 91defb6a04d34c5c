//! `kubectl projection check`: each projection controller installed in the cluster (its Deployment,
//! found by the chart's labels and its flags), whether it is ready, and who writes its copies: its
//! flags, the cluster's version and its RBAC, read as the controller's own start-up probe would
//! (`shared::policy::write_as::expected`); the controller's log line and its metric
//! `projection_copy_writer_info` say what the probe found.

use crate::{
    cli::{Global, Output},
    cluster::Cluster,
    exit::{Code, Failure},
    output::{or_none, structured, table},
};
use anyhow::Context as _;
use k8s_openapi::api::{
    apps::v1::Deployment,
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, Client, api::PostParams};
use serde::Serialize;
use shared::policy::write_as::{WriteCopiesAs, expected};

/// The label every component of the chart carries.
pub const CONTROLLER_COMPONENT: &str = "app.kubernetes.io/component=controller";
/// The first version that serves constrained impersonation by default.
const IMPERSONATION_MINOR: u32 = 36;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Line {
    namespace: String,
    name: String,
    ready: String,
    author_access: String,
    write_copies_as: String,
    /// `author`, `controller`, or empty when it cannot be told.
    copies_written_by: String,
    note: String,
}

/// Runs `check`.
pub async fn run(global: &Global) -> Result<Code, Failure> {
    let cluster = Cluster::connect(global).await?;
    let client = &cluster.client;
    let version = client
        .apiserver_version()
        .await
        .context("reading the cluster's version")?;
    let served = minor(&version.minor) >= IMPERSONATION_MINOR && version.major == "1";
    // Only who may read the controllers' Deployments can check them: for anyone else (a tenant)
    // there is nothing to report, which must not read as "no controller" (exit 3) nor as healthy.
    let Some(deployments) = cluster.deployments_everywhere(CONTROLLER_COMPONENT).await? else {
        return Err(anyhow::anyhow!(
            "`check` reads the controllers' Deployments, which you may not list (ask your platform team); \
             `kubectl projection check api` checks what you may: the CRDs and the webhook"
        )
        .into());
    };
    let mut lines = Vec::new();
    let mut attention = false;
    for deployment in &deployments {
        let Some(flags) = controller_flags(deployment) else {
            continue;
        };
        let namespace = deployment.metadata.namespace.clone().unwrap_or_default();
        let account = deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".to_owned());
        let user = format!("system:serviceaccount:{namespace}:{account}");
        let granted = may_impersonate(client, &user).await;
        let requested = flags.write_copies_as.parse().unwrap_or(WriteCopiesAs::Auto);
        let told = expected(requested, flags.author_access != "trusted", served, granted);
        let status = deployment.status.clone().unwrap_or_default();
        let wanted = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let ready = status.ready_replicas.unwrap_or(0);
        attention |= told.broken || ready < wanted;
        lines.push(Line {
            namespace,
            name: deployment.metadata.name.clone().unwrap_or_default(),
            ready: format!("{ready}/{wanted}"),
            author_access: flags.author_access,
            write_copies_as: flags.write_copies_as,
            copies_written_by: told.writer.map(|w| w.as_str().to_owned()).unwrap_or_default(),
            note: told.note,
        });
    }
    lines.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    match structured(&global.output, &lines)? {
        Some(text) => print!("{text}"),
        None if lines.is_empty() => {
            eprintln!(
                "No projection controller found (no Deployment labelled {CONTROLLER_COMPONENT} runs one)."
            );
            return Ok(Code::NotFound);
        }
        None => print!(
            "{}",
            render(&lines, global.output == Output::Wide, &version.git_version)
        ),
    }
    Ok(if attention { Code::Attention } else { Code::Ok })
}

/// The flags of a Deployment's `controller` container that runs projection-controller (one with
/// `--author-access`, which the chart always renders); `None` for any other Deployment.
pub struct Flags {
    pub author_access: String,
    pub write_copies_as: String,
}

pub fn controller_flags(deployment: &Deployment) -> Option<Flags> {
    let containers = &deployment.spec.as_ref()?.template.spec.as_ref()?.containers;
    let args = containers.iter().find_map(|c| {
        let args = c.args.as_ref()?;
        args.iter()
            .any(|a| a.starts_with("--author-access="))
            .then_some(args)
    })?;
    let flag = |name: &str, default: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .unwrap_or(default)
            .to_owned()
    };
    Some(Flags {
        author_access: flag("author-access", "enforce"),
        write_copies_as: flag("write-copies-as", "auto"),
    })
}

/// Whether RBAC grants `user` what the controller's probe needs to impersonate (`impersonate:user-info`
/// on users, and the probe's own `impersonate-on:user-info:create`); `None` when this user may not
/// ask.
async fn may_impersonate(client: &Client, user: &str) -> Option<bool> {
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let ask = |verb: &str, resource: &str| SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            resource_attributes: Some(ResourceAttributes {
                group: Some("authentication.k8s.io".to_owned()),
                resource: Some(resource.to_owned()),
                verb: Some(verb.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut all = true;
    for (verb, resource) in [
        ("impersonate:user-info", "users"),
        ("impersonate-on:user-info:create", "selfsubjectreviews"),
    ] {
        let answer = reviews
            .create(&PostParams::default(), &ask(verb, resource))
            .await
            .ok()?;
        all &= answer.status.is_some_and(|s| s.allowed);
    }
    Some(all)
}

/// The minor version as a number ("36+" on some distributions).
fn minor(text: &str) -> u32 {
    text.trim_end_matches('+').parse().unwrap_or(0)
}

fn render(lines: &[Line], wide: bool, version: &str) -> String {
    let mut headers = vec![
        "NAMESPACE",
        "NAME",
        "READY",
        "AUTHOR-ACCESS",
        "WRITE-COPIES-AS",
        "COPIES WRITTEN BY",
    ];
    if wide {
        headers.push("NOTE");
    }
    let rows: Vec<Vec<String>> = lines
        .iter()
        .map(|l| {
            let mut row = vec![
                l.namespace.clone(),
                l.name.clone(),
                l.ready.clone(),
                l.author_access.clone(),
                l.write_copies_as.clone(),
                or_none(&l.copies_written_by),
            ];
            if wide {
                row.push(format!("{} (Kubernetes {version})", l.note));
            }
            row
        })
        .collect();
    table(&headers, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_versions_with_a_plus_read_as_numbers() {
        assert_eq!(minor("36"), 36);
        assert_eq!(minor("36+"), 36);
        assert_eq!(minor(""), 0);
    }

    #[test]
    fn only_a_deployment_that_runs_the_controller_has_flags() {
        let deployment = |args: &[&str]| -> Deployment {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "d"},
                "spec": {"selector": {}, "template": {"spec": {"containers": [
                    {"name": "controller", "args": args}
                ]}}}
            }))
            .expect("a Deployment")
        };
        let ours = controller_flags(&deployment(&[
            "--author-access=enforce",
            "--write-copies-as=author",
        ]))
        .expect("ours");
        assert_eq!(
            (ours.author_access.as_str(), ours.write_copies_as.as_str()),
            ("enforce", "author")
        );
        let older = controller_flags(&deployment(&["--author-access=trusted"])).expect("ours, older");
        assert_eq!(older.write_copies_as, "auto");
        assert!(controller_flags(&deployment(&["--leader-elect"])).is_none());
    }
}
