//! `spec.keys` against the source as it is now: a spec whose copy would be an invalid object (a
//! Secret type left without the keys it requires, two keys under one name) is refused at admission
//! when the source can be read, with the controller's own message (`shared::copy::content`). A source that
//! cannot be read now, or does not exist yet, is left to the controller, which reports
//! `DestinationInvalid`; so is a source with none of the selected keys (a warning here).

use crate::cluster_view::{ClusterView, KindScope};
use shared::{
    api::crd::SourceRef,
    copy::content::{BuiltContent, CopyRules},
};

/// What admission makes of the spec's content rules for this source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContentVerdict {
    /// Nothing to say.
    Fine,
    /// Admit, with this warning.
    Warn(String),
    /// Deny with this message.
    Deny(String),
}

/// Builds the copy's content from the current source under `rules`, when the spec selects keys.
pub async fn check_content<C: ClusterView>(
    cluster: &C,
    source: &SourceRef,
    rules: &CopyRules<'_>,
) -> ContentVerdict {
    if rules.keys.is_none() {
        return ContentVerdict::Fine;
    }
    let unchecked = |why: String| {
        ContentVerdict::Warn(format!(
            "spec.keys could not be checked against the source now ({why}); the controller reports \
             DestinationInvalid if the copy cannot be built"
        ))
    };
    let resource = match cluster.resolve(source).await {
        Ok(KindScope::Namespaced(resource)) => resource,
        Ok(_) => return ContentVerdict::Fine,
        Err(e) => return unchecked(e.to_string()),
    };
    let object = match cluster.object(&resource, &source.namespace, &source.name).await {
        Ok(Some(object)) => object,
        Ok(None) => return ContentVerdict::Fine,
        Err(e) => return unchecked(e.to_string()),
    };
    let at = format!("{} {}/{}", source.kind, source.namespace, source.name);
    match BuiltContent::build(&object, rules) {
        Ok(_) => ContentVerdict::Fine,
        Err(refused) if refused.invalid_object => ContentVerdict::Deny(format!("{refused} (source {at})")),
        Err(refused) => ContentVerdict::Warn(format!("{refused} (source {at} as it is now)")),
    }
}
