//! The runtime both services share, kept out of the pure `shared` crate: the metrics and health
//! endpoints, the Kubernetes client and its errors as people read them, logs, the shutdown signal,
//! the crypto provider, process metrics and the retry backoff.

pub mod api_error;
pub mod backoff;
pub mod cidr;
pub mod cluster_identity;
pub mod crypto;
pub mod http;
pub mod kube_client;
pub mod logs;
pub mod metrics_doc;
pub mod metrics_format;
pub mod process_metrics;
pub mod rest_client_metrics;
pub mod serve;
pub mod signals;
pub mod tls;
