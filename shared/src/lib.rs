//! Types and pure logic shared by `projection-controller` and `projection-webhook`: no network,
//! process or server dependency (the services' runtime lives in the `runtime` crate, the generated
//! files' generators in `codegen`).

pub mod adoption;
pub mod apply_once;
pub mod author;
pub mod cache_trim;
pub mod cached_copy;
pub mod claims;
pub mod copy;
pub mod copy_spec;
pub mod crd;
pub mod destination;
pub mod fan_out;
pub mod field_exclusion;
pub mod globs;
pub mod initial_list;
pub mod key_selection;
pub mod keys;
pub mod kind_policy;
pub mod lifecycle;
pub mod metadata_hygiene;
pub mod ownership;
pub mod packed_text;
pub mod projectable;
pub mod reason;
pub mod relevance;
pub mod self_copy;
pub mod source;
pub mod source_hash;
pub mod status;
pub mod stored_cr;
pub mod targets;
pub mod unwanted;
pub mod validation;
pub mod verified;
pub mod write_plan;
