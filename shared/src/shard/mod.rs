//! Scale-out (SPEC §12): which controller replica owns which Projection and ClusterProjection.
//!
//! Every CR is placed by a hash of its `metadata.uid`, the same hash the apiserver's sharded list
//! and watch use (`shardRange(object.metadata.uid, start, end)`, KEP-5866: 64-bit FNV-1a of the
//! field's text, compared as a number in `[start, end)`). The live replicas form a [`Ring`]; each
//! owns some [`HashRange`]s of the 64-bit space, which become its
//! [`selector::shard_selector`] for the server and its own filter (the server may ignore the
//! parameter: an apiserver without the feature gate sends everything).

pub mod membership;
pub mod recent;
pub mod ring;
pub mod selector;

pub use ring::{HashRange, Ring};

use std::hash::Hasher;

/// The apiserver's hash of a shard field (`k8s.io/apimachinery/pkg/sharding.HashField`): 64-bit
/// FNV-1a of its bytes, nothing appended (so not `str`'s `Hash`, which adds a terminator).
pub fn field_hash(value: &str) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(value.as_bytes());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_hash_is_fnv_1a_64() {
        // The published FNV-1a 64 test vectors.
        assert_eq!(field_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(field_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(field_hash("foobar"), 0x8594_4171_f739_67e8);
    }
}
