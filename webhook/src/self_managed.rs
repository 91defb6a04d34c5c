//! The self-managed certificate mode's I/O: keeps the CA and serving pair in one Secret that every
//! replica converges on, serves its pair, and keeps the caBundle of the webhook configurations in
//! step with its CA. The decisions are made by the pure functions of `certs`.
//!
//! Apiserver calls, all by name: the Secret is watched (list and watch with a `metadata.name` field
//! selector), created (POST, `AlreadyExists` means another replica won: read its Secret with get),
//! and updated (PUT with the resourceVersion read, `Conflict` means another replica wrote first:
//! read again with get). It is never deleted, and never written unless it carries the ownership
//! label. Each webhook configuration is watched by name and patched (JSON patch of the caBundle
//! fields only).

use crate::{
    certs::{self, Assessment, CaPlan, Material, ServingPlan, WebhookEntry},
    cli::SelfManagedArgs,
    error::SelfManagedError,
    metrics::{IssueLabels, Metrics, WriteLabels},
    tls::CertStore,
};
use futures::{Stream, StreamExt};
use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
        core::v1::Secret,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use runtime::{
    api_error::{describe, describe_watch_error},
    backoff::Backoff,
};
use serde::de::DeserializeOwned;
use std::{
    collections::BTreeMap,
    fmt::Debug,
    sync::Arc,
    time::{Duration, SystemTime},
};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

/// The label that marks the Secret as ours. A Secret of that name without it is never written.
pub const MANAGED_BY_LABEL: &str = "projection.sh/managed-by";
/// The value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "projection-webhook";

/// The field manager of every write (so `managedFields` say who set the caBundle).
pub const FIELD_MANAGER: &str = "projection-webhook";

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

/// The Secret is re-examined at least this often even when nothing changes.
const MAX_WAKE: Duration = Duration::from_secs(3600);
/// Tries of one reconciliation against other writers before backing off.
const MAX_ATTEMPTS: usize = 5;

/// Runs the mode until `stop`: the Secret keeper, and one caBundle publisher per configuration.
pub async fn run(
    client: Client,
    settings: SelfManagedArgs,
    store: Arc<CertStore>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let (bundle_tx, _) = watch::channel(None::<Vec<u8>>);
    if let Some(name) = settings.validating_configuration.clone() {
        tokio::spawn(publish_bundle::<ValidatingWebhookConfiguration>(
            Api::all(client.clone()),
            name,
            bundle_tx.subscribe(),
            metrics.clone(),
            stop.clone(),
        ));
    }
    if let Some(name) = settings.mutating_configuration.clone() {
        tokio::spawn(publish_bundle::<MutatingWebhookConfiguration>(
            Api::all(client.clone()),
            name,
            bundle_tx.subscribe(),
            metrics.clone(),
            stop.clone(),
        ));
    }
    let api = Api::<Secret>::namespaced(client, &settings.namespace);
    let secrets = watch_one(api.clone(), &settings.secret);
    let keeper = SecretKeeper {
        api,
        settings,
        store,
        metrics,
        bundle_tx,
        installed: None,
    };
    keeper.run(secrets, stop).await;
}

/// The object named `name` as it changes: its state after the first complete list, then after
/// every change (`None` while it does not exist). Watch errors are logged and retried with backoff.
fn watch_one<K>(api: Api<K>, name: &str) -> impl Stream<Item = Option<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let what = format!("{} {name}", K::kind(&()));
    watcher(api, config)
        .default_backoff()
        .scan(None::<Option<K>>, move |listing, event| {
            let state = match event {
                Ok(watcher::Event::Init) => {
                    *listing = Some(None);
                    None
                }
                Ok(watcher::Event::InitApply(object)) => {
                    *listing = Some(Some(object));
                    None
                }
                Ok(watcher::Event::InitDone) => Some(listing.take().flatten()),
                Ok(watcher::Event::Apply(object)) => Some(Some(object)),
                Ok(watcher::Event::Delete(_)) => Some(None),
                Err(e) => {
                    tracing::warn!(object = %what, error = %describe_watch_error(&e), "watch failed; retrying");
                    None
                }
            };
            futures::future::ready(Some(state))
        })
        .filter_map(futures::future::ready)
}

/// Keeps the Secret current and serves its pair.
struct SecretKeeper {
    api: Api<Secret>,
    settings: SelfManagedArgs,
    store: Arc<CertStore>,
    metrics: Arc<Metrics>,
    bundle_tx: watch::Sender<Option<Vec<u8>>>,
    /// The material whose pair is being served.
    installed: Option<Material>,
}

impl SecretKeeper {
    async fn run(mut self, secrets: impl Stream<Item = Option<Secret>>, stop: CancellationToken) {
        tokio::pin!(secrets);
        // `None` until the watch has listed the Secret once.
        let mut state: Option<Option<Secret>> = None;
        let mut wake = Instant::now() + MAX_WAKE;
        let mut backoff = Backoff::doubling(Duration::from_secs(2), Duration::from_secs(60));
        loop {
            tokio::select! {
                update = secrets.next() => match update {
                    Some(secret) => state = Some(secret),
                    None => return,
                },
                () = tokio::time::sleep_until(wake), if state.is_some() => {}
                () = stop.cancelled() => return,
            }
            let Some(current) = state.clone() else {
                continue;
            };
            match self.reconcile(current).await {
                Ok((written, next_check)) => {
                    if let Some(written) = written {
                        state = Some(Some(written));
                    }
                    backoff.reset();
                    let wait = next_check
                        .duration_since(SystemTime::now())
                        .unwrap_or_default()
                        .clamp(Duration::from_secs(1), MAX_WAKE);
                    wake = Instant::now() + wait;
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    if matches!(e, SelfManagedError::NotOurs { .. }) {
                        tracing::error!(category = e.category(), error = %e, "self-managed certificate Secret is not ours; not touching it");
                    } else {
                        tracing::warn!(category = e.category(), error = %e, ?delay, "self-managed certificate Secret not updated; retrying");
                    }
                    wake = Instant::now() + delay;
                }
            }
        }
    }

    /// Brings the Secret up to date (creating it if needed) and serves its pair. Returns the
    /// Secret written, if any, and when to look again.
    async fn reconcile(
        &mut self,
        mut current: Option<Secret>,
    ) -> Result<(Option<Secret>, SystemTime), SelfManagedError> {
        // Owned copies: `self` is borrowed mutably below.
        let (names, lifetimes) = (&self.settings.names.clone(), &{ self.settings.lifetimes });
        for _ in 0..MAX_ATTEMPTS {
            let now = SystemTime::now();
            let Some(secret) = current else {
                let assessment = certs::assess(now, &Material::default(), names, lifetimes);
                let material = certs::renew(now, &Material::default(), &assessment, names, lifetimes)?;
                let object = self.secret_object(None, &material);
                match self.api.create(&post_params(), &object).await {
                    Ok(created) => {
                        self.count_write("secret_create", "success");
                        self.count_issues(&assessment);
                        tracing::info!(
                            secret = %self.settings.secret,
                            namespace = %self.settings.namespace,
                            "created the self-managed certificate Secret (new CA and serving certificate)"
                        );
                        self.install(&material);
                        let next = certs::assess(now, &material, names, lifetimes).next_check;
                        return Ok((Some(created), next));
                    }
                    Err(kube::Error::Api(status)) if status.is_already_exists() => {
                        // Another replica created it first: use theirs.
                        self.count_write("secret_create", "conflict");
                        current = self.read().await?;
                        continue;
                    }
                    Err(source) => {
                        self.count_write("secret_create", "error");
                        return Err(SelfManagedError::Api {
                            action: "creating the certificate Secret",
                            source,
                        });
                    }
                }
            };
            if !is_ours(&secret) {
                return Err(SelfManagedError::NotOurs {
                    namespace: self.settings.namespace.clone(),
                    name: self.settings.secret.clone(),
                    label: MANAGED_BY_LABEL,
                    value: MANAGED_BY_VALUE,
                });
            }
            let material = material_of(&secret);
            let assessment = certs::assess(now, &material, names, lifetimes);
            if assessment.is_current() {
                self.install(&material);
                return Ok((None, assessment.next_check));
            }
            tracing::info!(
                ca = ?assessment.ca,
                serving = ?assessment.serving,
                "renewing the self-managed certificate"
            );
            let renewed = certs::renew(now, &material, &assessment, names, lifetimes)?;
            let object = self.secret_object(Some(&secret), &renewed);
            let name = self.settings.secret.clone();
            // The object carries the resourceVersion read: a write in between makes this a Conflict.
            match self.api.replace(&name, &post_params(), &object).await {
                Ok(written) => {
                    self.count_write("secret_update", "success");
                    self.count_issues(&assessment);
                    self.install(&renewed);
                    let next = certs::assess(now, &renewed, names, lifetimes).next_check;
                    return Ok((Some(written), next));
                }
                Err(kube::Error::Api(status)) if status.is_conflict() => {
                    self.count_write("secret_update", "conflict");
                    current = self.read().await?;
                }
                Err(source) => {
                    self.count_write("secret_update", "error");
                    // Serve what there is meanwhile, if it still works.
                    self.install_if_usable(now, &material);
                    return Err(SelfManagedError::Api {
                        action: "updating the certificate Secret",
                        source,
                    });
                }
            }
        }
        Err(SelfManagedError::Contended(MAX_ATTEMPTS))
    }

    async fn read(&self) -> Result<Option<Secret>, SelfManagedError> {
        self.api
            .get_opt(&self.settings.secret)
            .await
            .map_err(|source| SelfManagedError::Api {
                action: "reading the certificate Secret",
                source,
            })
    }

    /// `base` (ours, with its resourceVersion) or a new Secret, holding `material`.
    fn secret_object(&self, base: Option<&Secret>, material: &Material) -> Secret {
        let mut secret = base.cloned().unwrap_or_else(|| Secret {
            metadata: ObjectMeta {
                name: Some(self.settings.secret.clone()),
                namespace: Some(self.settings.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY_LABEL.to_owned(),
                    MANAGED_BY_VALUE.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            ..Secret::default()
        });
        secret.metadata.managed_fields = None;
        let data = secret.data.get_or_insert_with(BTreeMap::new);
        for (key, value) in [
            (certs::TLS_CRT, &material.tls_crt),
            (certs::TLS_KEY, &material.tls_key),
            (certs::CA_CRT, &material.ca_crt),
            (certs::CA_KEY, &material.ca_key),
        ] {
            data.insert(key.to_owned(), ByteString(value.clone()));
        }
        secret
    }

    /// Publishes the CA bundle of `material` and serves its pair (once per distinct material).
    fn install(&mut self, material: &Material) {
        if self.installed.as_ref() == Some(material) {
            return;
        }
        match certs::ca_bundle(&material.ca_crt) {
            Ok(bundle) => {
                self.bundle_tx.send_if_modified(|current| {
                    let changed = current.as_ref() != Some(&bundle);
                    *current = Some(bundle);
                    changed
                });
            }
            Err(e) => tracing::error!(error = %e, "no CA bundle in the certificate Secret"),
        }
        match self.store.install(&material.tls_crt, &material.tls_key) {
            Ok(()) => {
                tracing::info!(
                    secret = %self.settings.secret,
                    "serving the certificate of the self-managed Secret"
                );
                self.installed = Some(material.clone());
            }
            Err(e) => tracing::error!(error = %e, "the certificate Secret's pair is unusable"),
        }
    }

    /// Serves `material` if its serving certificate has not expired yet (while a renewal cannot be
    /// written).
    fn install_if_usable(&mut self, now: SystemTime, material: &Material) {
        let alive = certs::pem_certificates(&material.tls_crt)
            .ok()
            .and_then(|ders| certs::cert_facts(&ders[0]).ok())
            .is_some_and(|leaf| leaf.not_before <= now && now < leaf.not_after);
        if alive {
            self.install(material);
        }
    }

    fn count_write(&self, target: &'static str, result: &'static str) {
        self.metrics
            .self_managed_writes_total
            .get_or_create(&WriteLabels { target, result })
            .inc();
    }

    fn count_issues(&self, assessment: &Assessment) {
        let count = |certificate, reason: &certs::IssueReason| {
            self.metrics
                .certificates_issued_total
                .get_or_create(&IssueLabels {
                    certificate,
                    reason: reason.category(),
                })
                .inc();
        };
        if let CaPlan::Rotate(reason) | CaPlan::Replace(reason) = &assessment.ca {
            count("ca", reason);
        }
        if let ServingPlan::Issue(reason) = &assessment.serving {
            count("serving", reason);
        }
    }
}

/// Whether the Secret carries our ownership label.
pub fn is_ours(secret: &Secret) -> bool {
    secret
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(MANAGED_BY_LABEL))
        .is_some_and(|value| value == MANAGED_BY_VALUE)
}

/// The four values of the Secret (a missing key is empty).
pub fn material_of(secret: &Secret) -> Material {
    let data = secret.data.as_ref();
    let get = |key: &str| {
        data.and_then(|d| d.get(key))
            .map(|v| v.0.clone())
            .unwrap_or_default()
    };
    Material {
        tls_crt: get(certs::TLS_CRT),
        tls_key: get(certs::TLS_KEY),
        ca_crt: get(certs::CA_CRT),
        ca_key: get(certs::CA_KEY),
    }
}

/// A Validating- or MutatingWebhookConfiguration, as far as the caBundle goes.
pub trait WebhookConfiguration:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    /// The metric target of its patches.
    const TARGET: &'static str;
    /// Its webhook entries, in order.
    fn entries(&self) -> Vec<WebhookEntry<'_>>;
}

/// Both configuration kinds have the same `webhooks[].clientConfig.caBundle` shape.
macro_rules! webhook_configuration {
    ($kind:ty, $target:literal) => {
        impl WebhookConfiguration for $kind {
            const TARGET: &'static str = $target;
            fn entries(&self) -> Vec<WebhookEntry<'_>> {
                self.webhooks
                    .iter()
                    .flatten()
                    .map(|w| WebhookEntry {
                        name: &w.name,
                        ca_bundle: w.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()),
                    })
                    .collect()
            }
        }
    };
}
webhook_configuration!(ValidatingWebhookConfiguration, "validating_configuration");
webhook_configuration!(MutatingWebhookConfiguration, "mutating_configuration");

/// A patch needed within this long of the previous one means someone keeps resetting the bundle:
/// the next patch waits (1 s, doubling, up to a minute) so the two writers do not hot-loop.
const CONTESTED_WITHIN: Duration = Duration::from_secs(10);
/// A failed patch is tried again this soon; repeated failures are paced by the contested backoff
/// (each attempt counts as a patch).
const RETRY_FAILED_PATCH: Duration = Duration::from_secs(2);

/// Keeps the caBundle of every entry of configuration `name` equal to the current bundle: patches
/// when the bundle changes and when the configuration is changed (or created) with another one.
async fn publish_bundle<K: WebhookConfiguration>(
    api: Api<K>,
    name: String,
    mut bundle: watch::Receiver<Option<Vec<u8>>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let configurations = watch_one(api.clone(), &name);
    tokio::pin!(configurations);
    let mut configuration: Option<K> = None;
    let mut listed = false;
    let mut retry: Option<Instant> = None;
    let mut last_patch: Option<Instant> = None;
    let mut contested = Backoff::doubling(Duration::from_secs(1), Duration::from_secs(60));
    let mut backoff = Duration::ZERO;
    let mut not_before = Instant::now();
    let kind = K::kind(&());
    loop {
        tokio::select! {
            update = configurations.next() => match update {
                Some(update) => {
                    if update.is_none() && (configuration.is_some() || !listed) {
                        tracing::warn!(%kind, %name, "webhook configuration not found; its caBundle is set once it exists");
                    }
                    configuration = update;
                    listed = true;
                }
                None => return,
            },
            changed = bundle.changed() => if changed.is_err() { return },
            () = sleep_until_some(retry) => retry = None,
            () = stop.cancelled() => return,
        }
        let Some(wanted) = bundle.borrow().clone() else {
            continue;
        };
        let Some(current) = &configuration else {
            continue;
        };
        let Some(patch) = certs::ca_bundle_patch(&current.entries(), &wanted) else {
            continue;
        };
        let now = Instant::now();
        if now < not_before {
            if retry.is_none() {
                tracing::warn!(%kind, %name, ?backoff, "caBundle reset again soon after our patch; backing off");
            }
            retry = Some(not_before);
            continue;
        }
        backoff = if last_patch.is_some_and(|last| now.duration_since(last) < CONTESTED_WITHIN) {
            contested.next_delay()
        } else {
            contested.reset();
            Duration::ZERO
        };
        last_patch = Some(now);
        not_before = now + backoff;
        match api
            .patch(
                &name,
                &PatchParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..PatchParams::default()
                },
                &Patch::<()>::Json(patch),
            )
            .await
        {
            Ok(patched) => {
                count(&metrics, K::TARGET, "success");
                tracing::info!(%kind, %name, "caBundle set on every webhook");
                configuration = Some(patched);
            }
            Err(e) => {
                let conflict = matches!(&e, kube::Error::Api(s) if s.is_invalid() || s.is_conflict());
                count(&metrics, K::TARGET, if conflict { "conflict" } else { "error" });
                // A failed guard (the list changed) or a conflict: the watch brings the new state;
                // anything else is retried.
                tracing::warn!(%kind, %name, error = %describe(&e), "patching the caBundle failed; retrying");
                retry = Some(Instant::now() + RETRY_FAILED_PATCH);
            }
        }
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn count(metrics: &Metrics, target: &'static str, result: &'static str) {
    metrics
        .self_managed_writes_total
        .get_or_create(&WriteLabels { target, result })
        .inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_secret_with_our_label_is_ours() {
        let mut secret = Secret::default();
        assert!(!is_ours(&secret));
        secret.metadata.labels = Some(BTreeMap::from([(MANAGED_BY_LABEL.into(), "helm".into())]));
        assert!(!is_ours(&secret));
        secret.metadata.labels = Some(BTreeMap::from([(
            MANAGED_BY_LABEL.into(),
            MANAGED_BY_VALUE.into(),
        )]));
        assert!(is_ours(&secret));
    }

    #[test]
    fn material_reads_the_four_keys() {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "data": {"tls.crt": "YQ==", "tls.key": "Yg==", "ca.crt": "Yw==", "other": "ZA=="}
        }))
        .expect("secret");
        assert_eq!(
            material_of(&secret),
            Material {
                tls_crt: b"a".to_vec(),
                tls_key: b"b".to_vec(),
                ca_crt: b"c".to_vec(),
                ca_key: Vec::new(),
            }
        );
    }

    #[test]
    fn entries_of_both_configuration_kinds() {
        let validating: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "v"},
            "webhooks": [
                {"name": "a", "clientConfig": {"caBundle": "QQ=="}, "admissionReviewVersions": ["v1"], "sideEffects": "None"},
                {"name": "b", "clientConfig": {}, "admissionReviewVersions": ["v1"], "sideEffects": "None"}
            ]
        }))
        .expect("configuration");
        assert_eq!(
            validating.entries(),
            [
                WebhookEntry {
                    name: "a",
                    ca_bundle: Some(b"A".as_slice())
                },
                WebhookEntry {
                    name: "b",
                    ca_bundle: None
                }
            ]
        );
        let mutating: MutatingWebhookConfiguration =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "m"}})).expect("configuration");
        assert!(mutating.entries().is_empty());
    }
}
