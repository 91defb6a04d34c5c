//! The `shardSelector` list and watch parameter a replica sends for its ranges (KEP-5866): a CEL
//! text the apiserver parses but never evaluates, `shardRange(object.metadata.uid, '0x…', '0x…')`
//! terms joined by `||`. The server compares bounds as hex text, shorter first, so every bound is
//! written with 16 digits (the width of its hash), the top of the space as `0x1` and 16 zeros.

use super::ring::{HashRange, SPACE_END};

/// The field the CRs are placed by (the server also accepts `object.metadata.namespace`).
pub const UID_FIELD: &str = "object.metadata.uid";

/// What a replica asks the server for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardFilter {
    /// The whole space: no parameter at all (the server refuses an empty selector).
    Everything,
    /// No range: nothing to list or watch.
    Nothing,
    /// The `shardSelector` parameter's value.
    Ranges(String),
}

pub fn shard_selector(ranges: &[HashRange]) -> ShardFilter {
    match ranges {
        [] => ShardFilter::Nothing,
        [only] if only.start == 0 && only.end == SPACE_END => ShardFilter::Everything,
        _ => ShardFilter::Ranges(
            ranges
                .iter()
                .map(|range| {
                    format!(
                        "shardRange({UID_FIELD}, '{}', '{}')",
                        bound(u128::from(range.start)),
                        bound(range.end)
                    )
                })
                .collect::<Vec<_>>()
                .join(" || "),
        ),
    }
}

fn bound(value: u128) -> String {
    format!("0x{value:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_sixteen_digits_and_the_top_is_two_to_the_sixty_fourth() {
        let ranges = [
            HashRange { start: 0, end: 0xff },
            HashRange {
                start: 0x8000_0000_0000_0000,
                end: SPACE_END,
            },
        ];
        assert_eq!(
            shard_selector(&ranges),
            ShardFilter::Ranges(
                "shardRange(object.metadata.uid, '0x0000000000000000', '0x00000000000000ff') || \
                 shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')"
                    .into()
            )
        );
    }

    #[test]
    fn the_whole_space_sends_no_parameter_and_no_range_lists_nothing() {
        assert_eq!(
            shard_selector(&[HashRange {
                start: 0,
                end: SPACE_END
            }]),
            ShardFilter::Everything
        );
        assert_eq!(shard_selector(&[]), ShardFilter::Nothing);
    }
}
