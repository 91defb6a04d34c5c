//! Who may copy what, decided alike by the webhook at admission and by the controller at every
//! pass: projectability of a source, kinds never copied or copied only when the platform allows
//! them, the author record with the access questions asked of it, when those are asked again,
//! whose identity writes the copies, and what of a kubeconfig another cluster is reached with.

pub mod author;
pub mod kind_policy;
pub mod kubeconfig;
pub mod projectable;
pub mod recheck;
pub mod write_as;
