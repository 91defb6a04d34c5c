//! Types and pure logic of projection.sh, shared by `projection-controller` and
//! `projection-webhook`: no network, process or server dependency (the services' runtime lives in
//! the `runtime` crate, the generated files' generators in `codegen`). One folder per domain.

pub mod admission;
pub mod api;
pub mod copy;
pub mod inspect;
pub mod pass;
pub mod policy;
pub mod shard;
