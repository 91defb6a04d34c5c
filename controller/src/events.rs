//! Kubernetes events (`events.k8s.io/v1`) about our CRs, with the Go operator's reasons; each
//! reason gives its event's type (Normal or Warning) and action verb. A repeat of the same event (same object, type, reason, action and note) within a few
//! minutes updates the existing event's series instead of creating another. Unlike kube's
//! `Recorder`, the note is part of that identity: a conflict in another namespace is a new event, not
//! a count on the first one.

use futures::StreamExt;
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event as K8sEvent, events::v1::EventSeries},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use shared::{api::reason::Reason, pass::tally::EventNote};
use std::{
    collections::HashMap,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

/// How long a published event can be continued as a series.
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);
const REPORTING_CONTROLLER: &str = "projection-controller";
/// How many events of one pass are published at once.
const CONCURRENT_PUBLISHES: usize = 8;

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    regarding_uid: String,
    reason: Reason,
    note: String,
}

/// An event published recently, by the digest of its [`Key`]: one is kept per event for the
/// series window, so each holds only what continuing its series needs.
struct Published {
    /// `<namespace>/<name>` of the event object.
    event: Box<str>,
    count: i32,
    last: Timestamp,
}

/// Publishes events; failures to publish are logged, never fatal.
pub struct Events {
    client: Client,
    instance: String,
    published: Mutex<HashMap<u64, Published>>,
    sequence: AtomicU64,
}

impl Events {
    /// Events reported as `projection-controller` (the Go operator's reporting controller name).
    pub fn new(client: Client) -> Self {
        let instance = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| REPORTING_CONTROLLER.to_owned());
        Self {
            client,
            instance,
            published: Mutex::default(),
            sequence: AtomicU64::new(0),
        }
    }

    /// Publishes the events of one pass about `about`, a few at a time: a fan-out that failed in
    /// hundreds of namespaces does not wait for hundreds of requests in a row.
    pub async fn publish_all(&self, about: &ObjectReference, events: Vec<EventNote>) {
        futures::stream::iter(events)
            .for_each_concurrent(CONCURRENT_PUBLISHES, |e| self.publish(about, e.reason, e.note))
            .await;
    }

    /// Publishes an event with `reason` about `about`.
    pub async fn publish(&self, about: &ObjectReference, reason: Reason, note: String) {
        if reason.verb().is_none() {
            tracing::warn!(%reason, "not an event reason; nothing published");
            return;
        }
        // The API refuses notes over 1 kB.
        let note: String = note.chars().take(1000).collect();
        let key = Key {
            regarding_uid: about.uid.clone().unwrap_or_default(),
            reason,
            note,
        };
        let id = crate::cache::verified::digest(&key);
        let now = Timestamp::now();
        let repeat = {
            let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
            published.retain(|_, p| now.duration_since(p.last) < SERIES_WINDOW);
            published.get(&id).and_then(|p| {
                let (namespace, name) = p.event.split_once('/')?;
                Some((namespace.to_owned(), name.to_owned(), p.count + 1))
            })
        };
        let continued = match repeat {
            Some((namespace, name, count)) => match self.continue_series(&namespace, &name, count, now).await
            {
                // The event expired on the server: start a new one.
                Err(kube::Error::Api(s)) if s.is_not_found() => None,
                other => Some(other.map(|()| (namespace, name, count))),
            },
            None => None,
        };
        let result = match continued {
            Some(result) => result,
            None => self
                .create(about, &key, now)
                .await
                .map(|(namespace, name)| (namespace, name, 1)),
        };
        match result {
            Ok((namespace, name, count)) => {
                let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
                published.insert(
                    id,
                    Published {
                        event: format!("{namespace}/{name}").into(),
                        count,
                        last: now,
                    },
                );
            }
            // Expected while a namespace goes away: nothing to warn anyone about.
            Err(e) if runtime::api_error::is_namespace_terminating(&e) => {
                tracing::debug!(%reason, error = %crate::error::describe(&e), "event not published: its namespace is being deleted")
            }
            Err(e) => tracing::warn!(%reason, error = %crate::error::describe(&e), "could not publish event"),
        }
    }

    async fn create(
        &self,
        about: &ObjectReference,
        key: &Key,
        now: Timestamp,
    ) -> Result<(String, String), kube::Error> {
        // Events about cluster-scoped objects live in `default`, as with every Kubernetes component.
        let namespace = about.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let n = self.sequence.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "{}.{:x}{:x}",
            about.name.clone().unwrap_or_default(),
            now.as_nanosecond() as u64,
            n
        );
        let event = K8sEvent {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            action: key.reason.verb().map(|verb| verb.as_str().to_owned()),
            reason: Some(key.reason.as_str().to_owned()),
            note: Some(key.note.clone()),
            type_: Some(
                if key.reason.is_warning() {
                    "Warning"
                } else {
                    "Normal"
                }
                .to_owned(),
            ),
            regarding: Some(about.clone()),
            reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        Api::<K8sEvent>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await?;
        Ok((namespace, name))
    }

    async fn continue_series(
        &self,
        namespace: &str,
        name: &str,
        count: i32,
        now: Timestamp,
    ) -> Result<(), kube::Error> {
        let series = EventSeries {
            count,
            last_observed_time: MicroTime(now),
        };
        let patch = serde_json::json!({"series": series});
        Api::<K8sEvent>::namespaced(self.client.clone(), namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }
}
