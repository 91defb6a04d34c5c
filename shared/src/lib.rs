//! Types and pure logic shared by `projection-controller` and `projection-webhook`.

pub mod api_reference;
pub mod client;
pub mod crd;
pub mod crdgen;
pub mod destination;
pub mod fan_out;
pub mod http;
pub mod keys;
pub mod ownership;
pub mod policy;
pub mod process;
pub mod reason;
pub mod self_copy;
pub mod source;
pub mod status;
pub mod targets;
pub mod unwanted;
pub mod validation;
pub mod write_plan;
