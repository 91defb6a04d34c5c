//! Building a copy and writing it: what travels from the source (keys, fields, metadata), the
//! ownership stamp and source hash, adoption with consent, and what an update changes or recreates.

pub mod adoption;
pub mod content;
pub mod destination;
pub mod field_exclusion;
pub mod globs;
pub mod key_selection;
pub mod metadata_hygiene;
pub mod ownership;
pub mod recreate;
pub mod self_copy;
pub mod source_hash;
pub mod write_plan;
