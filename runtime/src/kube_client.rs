//! The Kubernetes client both services (and the benchmark) use: kube's, with `TCP_NODELAY` on its
//! connections. kube's default connector leaves Nagle's algorithm on, and a request written in
//! more than one segment then waits for the server's delayed acknowledgement (about 40 ms on Linux)
//! before its last segment leaves: every write would cost that much latency.

use hyper_util::{client::legacy::connect::HttpConnector, rt::TokioExecutor};
use kube::{
    Client, Config,
    client::{Body, ConfigExt},
};
use tower::{BoxError, ServiceBuilder};

/// A client for `config` whose connections send small requests at once.
pub fn client_for(config: Config) -> Result<Client, kube::Error> {
    let mut connector = HttpConnector::new();
    connector.enforce_http(false);
    connector.set_nodelay(true);
    let https = config.rustls_https_connector_with_connector(connector)?;
    let http: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http);
    Ok(Client::new(service, config.default_namespace))
}

/// The client from the environment (in-cluster ServiceAccount, `KUBECONFIG` or `~/.kube/config`).
pub async fn infer() -> anyhow::Result<Client> {
    Ok(client_for(Config::infer().await?)?)
}
