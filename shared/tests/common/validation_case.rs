//! One case of the validation fixtures (`tests/fixtures/validation/*.yaml`): read by this crate's
//! fixture test, and (through `#[path]`) by the webhook's admission test, which applies the same
//! cases through the apiserver.

use serde::Deserialize;
use serde_json::Value;

/// A spec of `kind` and the exact errors expected of it (none for a good spec).
#[derive(Deserialize)]
pub struct Case {
    pub description: String,
    pub kind: String,
    pub spec: Value,
    #[serde(default)]
    pub errors: Vec<String>,
}
