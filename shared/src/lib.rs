//! Types and pure logic shared by `projection-controller` and `projection-webhook`.

pub mod crd;
pub mod crdgen;
pub mod keys;
pub mod process;
