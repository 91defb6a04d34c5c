//! projection-webhook: the admission webhook for `projection.sh` resources, as a library so the
//! handler can be tested in-process and benchmarked.

pub mod access_cache;
pub mod certs;
pub mod claim_watch;
pub mod cli;
pub mod cluster_view;
pub mod content_check;
pub mod error;
pub mod handler;
pub mod metrics;
pub mod policy;
pub mod review;
pub mod self_managed;
pub mod selftest;
pub mod server;
pub mod source_cache;
/// The served certificates, hot-reloaded (shared with the controller's metrics endpoint).
pub use runtime::tls;

use anyhow::Context as _;
use prometheus_client::registry::Registry;
use runtime::{
    backoff::Backoff,
    http::{Readiness, bind_address},
};
use std::{sync::Arc, time::Duration};
use tokio_util::sync::CancellationToken;

/// How often the discovery snapshot is refreshed in the background (misses refresh at once).
const DISCOVERY_REFRESH: Duration = Duration::from_secs(60);

/// At most this many SubjectAccessReview grants are kept (a few hundred bytes each; the total is
/// bounded in bytes too, by --access-review-cache-bytes).
const ACCESS_REVIEW_CACHE_CAPACITY: usize = 10_000;

/// At most this many sources' metadata reads are kept (about 150 bytes each).
const SOURCE_METADATA_CACHE_CAPACITY: usize = 10_000;

/// Runs the webhook until SIGTERM/SIGINT: ready once the certificate is loaded (from the files, or
/// in the self-managed mode from its Secret, which may take until the Secret is usable), discovery is warm
/// and the HTTPS listener is bound; on the signal, not ready, keep serving for the shutdown delay,
/// then drain in-flight requests.
pub async fn run(args: cli::Args) -> anyhow::Result<()> {
    let self_managed = args.self_managed()?;
    let metrics_addr = bind_address(&args.metrics_bind_address).context("--metrics-bind-address")?;
    let probe_addr = bind_address(&args.health_probe_bind_address).context("--health-probe-bind-address")?;
    let mut registry = Registry::default();
    let metrics = Arc::new(metrics::Metrics::register(&mut registry));
    let readiness = Readiness::default();

    // `stop_accepting` ends the admission server; `stop_all` the rest, once it has drained.
    let (stop_accepting, stop_all) = (CancellationToken::new(), CancellationToken::new());
    let metrics_tls = args.metrics_tls.server_config(
        (metrics_addr, probe_addr),
        (&mut registry, metrics::SERVICE),
        stop_all.clone().cancelled_owned(),
    )?;
    let probes = tokio::spawn(
        runtime::http::serve(
            (metrics_addr, metrics_tls),
            probe_addr,
            Arc::new(registry),
            readiness.clone(),
            stop_all.clone().cancelled_owned(),
        )
        .await?,
    );
    {
        let (readiness, stop_accepting, delay) =
            (readiness.clone(), stop_accepting.clone(), args.shutdown_delay);
        tokio::spawn(async move {
            let signal = runtime::signals::shutdown_signal().await;
            tracing::info!(
                signal,
                ?delay,
                "projection-webhook shutting down: not ready, draining"
            );
            readiness.set(false);
            tokio::time::sleep(delay).await;
            stop_accepting.cancel();
        });
    }

    let certs = tls::CertStore::new(metrics.serving_certificate.clone());
    let client_ca = match &args.client_ca_file {
        Some(path) => {
            let ca = tls::ClientCa::load(path).context("--client-ca-file")?;
            tokio::spawn(
                ca.clone()
                    .watch(args.tls_reload_interval, stop_all.clone().cancelled_owned()),
            );
            Some(ca as Arc<dyn rustls::server::danger::ClientCertVerifier>)
        }
        None => {
            tracing::warn!(
                "no --client-ca-file: callers are not authenticated, so reviews skip every check that reads the cluster (access, projectability, content, other CRs)"
            );
            None
        }
    };
    if client_ca.is_some() && !args.check_source_access {
        tracing::warn!(
            "--check-source-access=false: reviews skip every check that reads the cluster (access, projectability, content, other CRs), as for an unauthenticated caller"
        );
    }
    let tls_config = certs.server_config(client_ca)?;
    if self_managed.is_none() {
        let files = tls::CertFiles::new(&args.tls_cert_file, &args.tls_key_file);
        files
            .load_into(&certs)
            .context("loading the serving certificate")?;
        tokio::spawn(files.watch(
            certs.clone(),
            args.tls_reload_interval,
            stop_all.clone().cancelled_owned(),
        ));
    }
    let client = runtime::kube_client::infer()
        .await
        .context("building the Kubernetes client")?;
    if let Some(settings) = self_managed {
        tracing::info!(
            secret = %settings.secret,
            namespace = %settings.namespace,
            "self-managed certificate: waiting for the Secret's pair"
        );
        tokio::spawn(self_managed::run(
            client.clone(),
            settings,
            certs.clone(),
            metrics.clone(),
            stop_all.clone(),
        ));
        tokio::select! {
            () = certs.wait_loaded() => {}
            () = stop_accepting.cancelled() => {
                stop_all.cancel();
                return probes.await?;
            }
        }
    }

    let cluster = cluster_view::KubeCluster::new(
        client.clone(),
        access_cache::AllowedAnswers::new(
            args.access_review_cache_ttl,
            ACCESS_REVIEW_CACHE_CAPACITY,
            args.access_review_cache_bytes,
        ),
        metrics.access_review_cache_lookups_total.clone(),
        source_cache::SourceMetadataCache::new(
            args.source_metadata_cache_ttl,
            SOURCE_METADATA_CACHE_CAPACITY,
            args.source_mode,
        ),
        metrics.source_metadata_cache_lookups_total.clone(),
    );
    cluster.know_claims(claim_watch::ClaimWatch::start(
        client,
        stop_all.clone().cancelled_owned(),
    ));
    tokio::select! {
        warmed = warm_discovery(&cluster) => warmed,
        () = stop_accepting.cancelled() => {
            stop_all.cancel();
            return probes.await?;
        }
    }
    tokio::spawn(
        cluster
            .clone()
            .refresh_every(DISCOVERY_REFRESH, stop_all.clone().cancelled_owned()),
    );

    let hits = metrics.connection_limit_hits_total.clone();
    let app = Arc::new(handler::App {
        settings: review::ReviewSettings {
            tenant_mode: args.tenant_mode,
            policy: policy::PolicySettings {
                source_mode: args.source_mode,
                check_source_access: args.check_source_access,
                // Every connection carries its own answer; this is what a request without one gets.
                caller_authenticated: args.client_ca_file.is_some(),
            },
            allowed_power_kinds: args.allow_power_kinds.clone(),
        },
        cluster,
        metrics,
        in_flight: handler::InFlightLimit::new(args.max_in_flight_reviews),
        body_timeout: args.body_timeout,
    });
    let listener = tokio::net::TcpListener::bind(args.bind_address)
        .await
        .with_context(|| format!("binding {}", args.bind_address))?;
    tracing::info!(address = %listener.local_addr()?, "serving admission over HTTPS");
    readiness.set(true);
    server::serve_tls(
        listener,
        tls_config,
        args.server_limits(),
        hits,
        handler::router(app),
        stop_accepting.cancelled_owned(),
        args.drain_timeout,
    )
    .await;
    stop_all.cancel();
    probes.await?
}

/// Takes the first discovery snapshot, retrying with capped backoff (the apiserver may come up after
/// the webhook).
async fn warm_discovery(cluster: &cluster_view::KubeCluster) {
    let mut backoff = Backoff::doubling(Duration::from_millis(200), Duration::from_secs(10));
    while let Err(e) = cluster.refresh().await {
        let delay = backoff.next_delay();
        tracing::warn!(error = %runtime::api_error::describe(&e), ?delay, "discovery failed; not ready, retrying");
        tokio::time::sleep(delay).await;
    }
}
