//! The decisions of one reconcile pass, for both kinds: where the copies go (targets), what the
//! pass writes and removes (plan), what the results add up to (tally), the conditions and status,
//! `ApplyOnce`, the lifecycle controls, what wakes the next pass, and what a 404 means.

pub mod apply_once;
pub mod interest;
pub mod lifecycle;
pub mod not_found;
pub mod plan;
pub mod source;
pub mod status;
pub mod tally;
pub mod targets;
