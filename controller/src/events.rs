//! Kubernetes events (`events.k8s.io/v1`) about our CRs, with the Go operator's reasons and action
//! verbs. One recorder for the whole process, so repeats are folded into a series.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Publishes events; failures to publish are logged, never fatal.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

/// The verb of an event (`action`).
#[derive(Clone, Copy, Debug)]
pub enum Action {
    Create,
    Update,
    Delete,
    Get,
    Validate,
    Resolve,
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Self::Create => "Create",
            Self::Update => "Update",
            Self::Delete => "Delete",
            Self::Get => "Get",
            Self::Validate => "Validate",
            Self::Resolve => "Resolve",
        }
    }
}

impl Events {
    /// Events reported as `projection-controller` (the Go operator's reporting controller name).
    pub fn new(client: kube::Client) -> Self {
        let instance = std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok());
        Self {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "projection-controller".into(),
                    instance,
                },
            ),
        }
    }

    /// A Normal event.
    pub async fn normal(&self, about: &ObjectReference, reason: &str, action: Action, note: String) {
        self.publish(about, EventType::Normal, reason, action, note).await;
    }

    /// A Warning event.
    pub async fn warning(&self, about: &ObjectReference, reason: &str, action: Action, note: String) {
        self.publish(about, EventType::Warning, reason, action, note)
            .await;
    }

    async fn publish(
        &self,
        about: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: Action,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.as_str().to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, about).await {
            tracing::warn!(reason, error = %e, "could not publish event");
        }
    }
}
