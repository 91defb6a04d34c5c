//! `projection-webhook test`: what `helm test` runs, in a pod of the webhook's own image (scratch:
//! no shell, no kubectl, and nothing else can be pulled in a cluster that only runs the release's
//! images). As the test pod's ServiceAccount, through the apiserver:
//!
//! 1. a server-side dry-run create of a Projection whose spec only the webhook refuses (its copy
//!    would be its source itself: the CRD's schema cannot see that, the webhook's rules do, before
//!    reading anything): the answer must be a refusal of one of our two webhooks (the mutating one
//!    checks the spec too, and the apiserver calls it first), named by the apiserver, so the
//!    apiserver reaches the webhook through its Service and the webhook answers.
//!    Nothing is stored (dry run).
//! 2. the controller's Deployment has a ready replica: its readiness probe (`/readyz`) passed.
//!
//! Each is retried until `--timeout`: the test may start while a rollout finishes.

use anyhow::{Context as _, bail};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client,
    api::{DynamicObject, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use std::time::{Duration, Instant};

/// Flags of `projection-webhook test`.
#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "projection-webhook test",
    about = "Checks an installed release: what `helm test` runs"
)]
pub struct TestArgs {
    /// The namespace of the release (where the dry-run Projection would be created).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// The names our webhooks have in their configurations (`webhooks[].name`), comma-separated: a
    /// refusal by any of them passes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "mutate.projection.sh,validate.projection.sh"
    )]
    pub webhook_names: Vec<String>,
    /// The controller's Deployment, in the same namespace.
    #[arg(long)]
    pub controller_deployment: String,
    /// How long each check may take, retries included.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// The Projection the webhook refuses: a ConfigMap of its own namespace copied there under the same
/// name, which would be the source itself.
fn refused_projection(namespace: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "projection.sh/v1",
        "kind": "Projection",
        "metadata": {"name": "helm-test-refused", "namespace": namespace},
        "spec": {"source": {"kind": "ConfigMap", "namespace": namespace, "name": "helm-test"}},
    }))?)
}

/// Whether the apiserver's answer is a refusal by one of `webhook_names`.
pub fn refused_by_webhook(message: &str, webhook_names: &[String]) -> bool {
    webhook_names
        .iter()
        .any(|name| message.contains(&format!("admission webhook \"{name}\" denied the request")))
}

/// Runs both checks; the error says which failed and what was seen last.
pub async fn run(args: TestArgs) -> anyhow::Result<()> {
    let client = runtime::kube_client::infer()
        .await
        .context("connecting to the apiserver")?;
    check_webhook(&client, &args).await?;
    println!("ok: the apiserver called the webhook and it refused the bad spec");
    check_controller(&client, &args).await?;
    println!(
        "ok: the controller {} has a ready replica",
        args.controller_deployment
    );
    Ok(())
}

async fn check_webhook(client: &Client, args: &TestArgs) -> anyhow::Result<()> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("projection.sh", "v1", "Projection"));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &args.namespace, &resource);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let object = refused_projection(&args.namespace)?;
    retry("refusal from the webhook", args.timeout, || async {
        match api.create(&dry_run, &object).await {
            Ok(_) => Err(format!(
                "the dry-run create of a spec {} refuse was admitted: are the webhook configurations installed?",
                args.webhook_names.join(" and ")
            )),
            Err(kube::Error::Api(status)) if refused_by_webhook(&status.message, &args.webhook_names) => {
                Ok(())
            }
            Err(e) => Err(format!("{e}")),
        }
    })
    .await
}

async fn check_controller(client: &Client, args: &TestArgs) -> anyhow::Result<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), &args.namespace);
    retry("ready controller", args.timeout, || async {
        let deployment = api
            .get(&args.controller_deployment)
            .await
            .map_err(|e| format!("{e}"))?;
        let ready = deployment.status.and_then(|s| s.ready_replicas).unwrap_or(0);
        if ready > 0 {
            Ok(())
        } else {
            Err(format!(
                "Deployment {} has no ready replica",
                args.controller_deployment
            ))
        }
    })
    .await
}

/// Calls `attempt` every second until it succeeds or `timeout` has passed.
async fn retry<F, Fut>(what: &str, timeout: Duration, mut attempt: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match attempt().await {
            Ok(()) => return Ok(()),
            Err(last) if Instant::now() >= deadline => {
                bail!("no {what} within {}: {last}", humantime::format_duration(timeout))
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_webhooks_refusal_passes() {
        let ours = [
            "mutate.projection.sh".to_owned(),
            "validate.projection.sh".to_owned(),
        ];
        let refused = |by: &str| {
            format!(
                "admission webhook \"{by}\" denied the request: spec.source: the copy would be the \
                 source itself (ConfigMap ns/helm-test): ..."
            )
        };
        assert!(refused_by_webhook(&refused("mutate.projection.sh"), &ours));
        assert!(refused_by_webhook(&refused("validate.projection.sh"), &ours));
        assert!(!refused_by_webhook(&refused("validate.other.example"), &ours));
        let unreachable = "Internal error occurred: failed calling webhook \"mutate.projection.sh\": \
                           failed to call webhook: Post \"https://...\": connection refused";
        assert!(!refused_by_webhook(unreachable, &ours));
        let schema = "Projection.projection.sh \"x\" is invalid: spec.source.name: Required value";
        assert!(!refused_by_webhook(schema, &ours));
    }
}
