//! The plain-HTTP endpoints (`/metrics`, `/healthz`, `/readyz`), shared with the webhook.

pub use shared::http::{Readiness, serve};
