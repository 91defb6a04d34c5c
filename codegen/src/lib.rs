//! The files generated from the Rust types of `shared`: the CRD manifests in the chart and the API
//! reference. Each has a binary that writes it and a test that fails while the committed copy is
//! stale.

pub mod api_reference;
pub mod crds;
