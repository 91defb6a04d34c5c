//! Requests made as a CR's author (`shared::policy::write_as`): a client that adds the author's
//! impersonation headers to every request and sends it through the controller's own client (one
//! connection pool, one set of credentials), and the start-up probe that tells whether the apiserver
//! lets this controller impersonate at all.

use futures::future::BoxFuture;
use http::{HeaderName, HeaderValue, Request, Response};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::{Api, Client, api::PostParams, client::Body};
use quick_cache::sync::Cache;
use shared::policy::{
    author::Author,
    write_as::{PROBE_GROUP, PROBE_USER, Probe},
};
use std::{
    sync::Arc,
    task::{Context, Poll},
};

/// Authors whose clients are kept (each a small task and a few headers).
const AUTHOR_CLIENTS_KEPT: usize = 1_000;

/// The controller's client, once per author: every request it sends carries the author's
/// impersonation headers.
pub struct AuthorClients {
    client: Client,
    by_author: Cache<String, Client>,
}

impl AuthorClients {
    /// Clients over `client`'s connections.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            by_author: Cache::new(AUTHOR_CLIENTS_KEPT),
        }
    }

    /// A client whose requests are `author`'s; an error names a user or group name that cannot
    /// travel in a header.
    pub fn of(&self, author: &Author) -> Result<Client, String> {
        let record = author.record();
        if let Some(client) = self.by_author.get(&record) {
            return Ok(client);
        }
        let client = impersonating(&self.client, &author.impersonation_headers())?;
        self.by_author.insert(record, client.clone());
        Ok(client)
    }
}

/// `client` with `headers` added to every request.
fn impersonating(client: &Client, headers: &[(&'static str, &str)]) -> Result<Client, String> {
    let headers = headers
        .iter()
        .map(|(name, value)| {
            let value = HeaderValue::from_str(value)
                .map_err(|_| format!("the name {value:?} cannot be sent in the {name} header"))?;
            Ok((HeaderName::from_static(name), value))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let service = AddHeaders {
        client: client.clone(),
        headers: Arc::new(headers),
    };
    Ok(Client::new(service, client.default_namespace()))
}

/// Sends each request through `client` with `headers` added.
#[derive(Clone)]
struct AddHeaders {
    client: Client,
    headers: Arc<Vec<(HeaderName, HeaderValue)>>,
}

impl tower::Service<Request<Body>> for AddHeaders {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        // The inner client buffers and waits for its own readiness in `send`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        for (name, value) in self.headers.iter() {
            request.headers_mut().append(name.clone(), value.clone());
        }
        let client = self.client.clone();
        Box::pin(async move { client.send(request).await })
    }
}

/// Asks the apiserver who a request made as the probe user is (a SelfSubjectReview, which reads and
/// writes nothing): the probe user when constrained impersonation is served and granted to us.
pub async fn probe(client: &Client) -> Probe {
    let as_probe = match impersonating(
        client,
        &[
            ("impersonate-user", PROBE_USER),
            ("impersonate-group", PROBE_GROUP),
        ],
    ) {
        Ok(c) => c,
        Err(e) => return Probe::Refused(e),
    };
    let reviews: Api<SelfSubjectReview> = Api::all(as_probe);
    match reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
    {
        Ok(review) => {
            let username = review
                .status
                .and_then(|s| s.user_info)
                .and_then(|u| u.username)
                .unwrap_or_default();
            Probe::answered_as(&username)
        }
        Err(e) => Probe::Refused(crate::error::describe(&e)),
    }
}
