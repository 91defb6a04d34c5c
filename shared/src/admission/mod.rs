//! What the admission webhook decides about a spec: field validation with messages naming the
//! field, and the claims of CRs on destinations (overlaps, loops).

pub mod claims;
pub mod validation;
