//! Who runs the plugin, and what the authorizer lets them do. `preview` makes the author checks of
//! the controller's `--author-access=enforce` as this user, who becomes the CR's recorded author by
//! applying the manifest; `--as` and `--as-group` (kubectl's flags) ask as someone else, e.g. the
//! author recorded on a CR in the cluster, when the user may impersonate them.

use crate::exit::Failure;
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
