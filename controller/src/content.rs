//! The content of a CR's copies, built once per pass from the source and the spec
//! (`shared::copy`); a spec that cannot make a valid copy of this source is reported as
//! `DestinationInvalid` with an event, and nothing is written.

use crate::context::Context;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::DynamicObject;
use shared::{
    copy::{BuiltContent, CopyRules},
    reason::Reason,
    status::Failure,
};

/// Builds the content of the copies of `source` under `rules`; `failed` makes the pass's failure
/// from a reason and a message.
pub async fn build_or_report(
    ctx: &Context,
    about: &ObjectReference,
    source: &DynamicObject,
    rules: &CopyRules<'_>,
    failed: impl Fn(Reason, String) -> Failure,
) -> Result<BuiltContent, Failure> {
    let source =
        serde_json::to_value(source).map_err(|e| failed(Reason::DestinationCreateFailed, e.to_string()))?;
    match BuiltContent::build(&source, rules) {
        Ok(built) => Ok(built),
        Err(refused) => {
            ctx.events
                .publish(about, Reason::DestinationInvalid, refused.message.clone())
                .await;
            Err(failed(Reason::DestinationInvalid, refused.message))
        }
    }
}
