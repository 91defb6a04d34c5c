//! Who the author checks are asked as, and what the authorizer lets them do. `preview` makes the
//! author checks of the controller's `--author-access=enforce` as the user who runs it, who becomes
//! the CR's recorded author by applying the manifest, or (`--as-author`) as the author recorded on
//! the CR, impersonated when the user may.

use crate::{cluster::Cluster, exit::Failure};
use anyhow::Context as _;
use k8s_openapi::api::{
    authentication::v1::SelfSubjectReview,
    authorization::v1::{SelfSubjectAccessReview, SelfSubjectAccessReviewSpec},
};
use kube::{Api, api::PostParams};
use shared::policy::author::{AccessQuestion, Author};

/// The user the plugin runs as, and the client that asks as them.
pub struct Asker {
    client: kube::Client,
    /// The user, as the apiserver authenticated the plugin.
    pub author: Author,
}

impl Asker {
    /// Who the apiserver says the plugin runs as (a SelfSubjectReview, which reads and writes
    /// nothing).
    pub async fn whoami(client: &kube::Client) -> Result<Self, Failure> {
        let review = Api::<SelfSubjectReview>::all(client.clone())
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .context("asking the apiserver who runs the plugin (SelfSubjectReview)")?;
        let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
        Ok(Self {
            client: client.clone(),
            author: Author {
                username: user.username.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
            },
        })
    }

    /// Asks as `author`, impersonated (`Author::impersonation_headers`: a ServiceAccount by name,
    /// without `system:masters`, as the controller impersonates authors).
    pub fn impersonating(cluster: &Cluster, author: &Author) -> Result<Self, Failure> {
        let mut config = cluster.config.clone();
        let mut groups = Vec::new();
        for (header, value) in author.impersonation_headers() {
            match header {
                "impersonate-user" => config.auth_info.impersonate = Some(value.to_owned()),
                _ => groups.push(value.to_owned()),
            }
        }
        config.auth_info.impersonate_groups = (!groups.is_empty()).then_some(groups);
        let client = runtime::kube_client::client_for(config).context("cannot build the client")?;
        Ok(Self {
            client,
            author: author.clone(),
        })
    }

    /// Whether the user may do what `question` asks (a SelfSubjectAccessReview): `Ok(None)` when
    /// allowed, else the authorizer's reason, if it gave one.
    pub async fn denied(&self, question: &AccessQuestion) -> Result<Option<Option<String>>, Failure> {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(question.attributes()),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SelfSubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .with_context(|| format!("asking whether you may {}", question.describe()))?;
        let status = answer.status.unwrap_or_default();
        Ok((!status.allowed).then_some(status.reason))
    }
}
