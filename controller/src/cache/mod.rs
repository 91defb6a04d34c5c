//! What the controller keeps in memory, compact: the CRs as stored by their watches, our copies by
//! kind, the digests of copies found up to date. Pure data structures and encodings, each with its
//! tests; the watches fill them and the pass reads them.

pub mod cache_trim;
pub mod cached_copy;
pub mod copy_store;
pub mod packed_text;
pub mod stored_cr;
pub mod verified;
