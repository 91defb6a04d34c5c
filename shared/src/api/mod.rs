//! The wire API: the CRD types and what both kinds say alike (`kind`), the well-known keys, how a source is named, and every reason with
//! its verb, retry class and metric category.

pub mod copy_spec;
pub mod crd;
pub mod keys;
pub mod kind;
pub mod reason;
pub mod source;
