//! The consistent-hash ring: the live members (one Lease each) in, each member's part of the
//! 64-bit hash space out. Deterministic for a member set (order and duplicates do not matter), so
//! every replica computes the same split from the same Leases; a member joining or leaving moves
//! only the arcs it gains or loses, about 1/N of the CRs.

use sha2::{Digest, Sha256};

/// Points each member places on the ring. Many small arcs average out: with 512, every member of
/// 2 to 8 holds its share within ±15 % (the tests below), at the price of a selector of up to a few
/// hundred ranges (tens of kilobytes, far under the apiserver's limits).
pub const VIRTUAL_NODES: u32 = 512;

/// The top of the hash space, exclusive: what the apiserver writes `'0x10000000000000000'`.
pub const SPACE_END: u128 = 1 << 64;

/// `[start, end)` of the 64-bit hash space; `end` may be [`SPACE_END`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HashRange {
    pub start: u64,
    pub end: u128,
}

impl HashRange {
    pub fn contains(&self, hash: u64) -> bool {
        hash >= self.start && u128::from(hash) < self.end
    }

    /// The fraction of the whole space it covers.
    pub fn share(&self) -> f64 {
        (self.end - u128::from(self.start)) as f64 / SPACE_END as f64
    }
}

/// The members and their points, sorted by position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    members: Vec<String>,
    /// (position, index into `members`); a point owns `[position, next position)`, the last one
    /// also `[0, first position)`.
    points: Vec<(u64, usize)>,
}

impl Ring {
    pub fn new<I, S>(members: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut members: Vec<String> = members.into_iter().map(Into::into).collect();
        members.sort();
        members.dedup();
        let mut points: Vec<(u64, usize)> = members
            .iter()
            .enumerate()
            .flat_map(|(index, member)| {
                (0..VIRTUAL_NODES).map(move |point| (point_position(member, point), index))
            })
            .collect();
        points.sort_unstable();
        Self { members, points }
    }

    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// Who owns a hash; `None` only for a ring without members.
    pub fn owner_of_hash(&self, hash: u64) -> Option<&str> {
        let after = self.points.partition_point(|&(position, _)| position <= hash);
        let (_, index) = if after == 0 {
            *self.points.last()?
        } else {
            self.points[after - 1]
        };
        Some(&self.members[index])
    }

    /// Who owns the CR with this `metadata.uid`.
    pub fn owner_of(&self, uid: &str) -> Option<&str> {
        self.owner_of_hash(super::field_hash(uid))
    }

    /// A member's arcs, sorted and merged where they touch; empty for a stranger.
    pub fn ranges_of(&self, member: &str) -> Vec<HashRange> {
        let Ok(wanted) = self.members.binary_search_by(|m| m.as_str().cmp(member)) else {
            return Vec::new();
        };
        let mut ranges: Vec<HashRange> = Vec::new();
        let mut add = |start: u64, end: u128| {
            if u128::from(start) >= end {
                return; // two points at one position: the first owns nothing
            }
            match ranges.last_mut() {
                Some(last) if last.end == u128::from(start) => last.end = end,
                _ => ranges.push(HashRange { start, end }),
            }
        };
        if let (Some(&(first, _)), Some(&(_, last_owner))) = (self.points.first(), self.points.last())
            && last_owner == wanted
        {
            add(0, u128::from(first));
        }
        for (i, &(position, owner)) in self.points.iter().enumerate() {
            if owner != wanted {
                continue;
            }
            let end = self
                .points
                .get(i + 1)
                .map_or(SPACE_END, |&(next, _)| u128::from(next));
            add(position, end);
        }
        ranges
    }

    /// A short name of the member set: equal on every replica that sees the same members, so each
    /// can say which split it has applied.
    pub fn version(&self) -> String {
        let digest = Sha256::digest(self.members.join("\n").as_bytes());
        let hex: String = digest.iter().take(6).map(|byte| format!("{byte:02x}")).collect();
        format!("ring-{hex}")
    }
}

/// The parts of `new` outside `old` (both sorted and disjoint, as [`Ring::ranges_of`] gives them):
/// what a member gains when the ring changes, the ranges whose CRs it has not listed yet.
pub fn gained(new: &[HashRange], old: &[HashRange]) -> Vec<HashRange> {
    let mut out = Vec::new();
    let mut first_old = 0;
    for range in new {
        let mut start = u128::from(range.start);
        while old.get(first_old).is_some_and(|o| o.end <= start) {
            first_old += 1;
        }
        let mut next_old = first_old;
        while start < range.end {
            match old.get(next_old) {
                Some(o) if u128::from(o.start) < range.end => {
                    if u128::from(o.start) > start {
                        out.push(HashRange::between(start, u128::from(o.start)));
                    }
                    start = start.max(o.end);
                    next_old += 1;
                }
                _ => {
                    out.push(HashRange::between(start, range.end));
                    start = range.end;
                }
            }
        }
    }
    out
}

impl HashRange {
    /// `[start, end)` for `start < end <= SPACE_END` (so `start` fits 64 bits).
    fn between(start: u128, end: u128) -> Self {
        Self {
            start: u64::try_from(start).unwrap_or(u64::MAX),
            end,
        }
    }
}

/// Where a member's `point`-th virtual node sits: FNV-1a of `member#point`, then SplitMix64's
/// finaliser, because FNV-1a of names that differ only in their last characters differs mostly in
/// its low bits and would bunch one member's points together.
fn point_position(member: &str, point: u32) -> u64 {
    let mut z = super::field_hash(&format!("{member}#{point}"));
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Pod-like member names, as a Deployment's replicas have.
    fn members(n: usize) -> Vec<String> {
        let suffixes = [
            "x7k2p", "9fq4m", "b2c8w", "t5n1z", "h3d6r", "m8v0s", "q1j9e", "w4g7a",
        ];
        suffixes[..n]
            .iter()
            .map(|suffix| format!("projection-controller-6d8f9b7c5-{suffix}"))
            .collect()
    }

    /// 10 000 UUIDs of a fixed pseudo-random sequence (SplitMix64), formatted as the apiserver's.
    fn uids() -> Vec<String> {
        let mut state: u64 = 0x5eed;
        let mut next = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        (0..10_000)
            .map(|_| {
                let (a, b) = (next(), next());
                format!(
                    "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
                    a >> 32,
                    (a >> 16) & 0xffff,
                    a & 0xfff,
                    0x8000 | (b >> 48) & 0x3fff,
                    b & 0xffff_ffff_ffff
                )
            })
            .collect()
    }

    fn owners(ring: &Ring, uids: &[String]) -> Vec<String> {
        uids.iter()
            .map(|uid| ring.owner_of(uid).expect("a member").to_string())
            .collect()
    }

    #[test]
    fn every_member_holds_its_share_within_fifteen_percent() {
        let uids = uids();
        for n in 2..=8 {
            let ring = Ring::new(members(n));
            let mut counts: BTreeMap<String, usize> = BTreeMap::new();
            for owner in owners(&ring, &uids) {
                *counts.entry(owner).or_default() += 1;
            }
            let fair = uids.len() as f64 / n as f64;
            for member in ring.members() {
                let count = counts.get(member).copied().unwrap_or(0) as f64;
                assert!(
                    (count / fair - 1.0).abs() <= 0.15,
                    "{n} members: {member} owns {count} of {} UIDs, its share is {fair:.0}",
                    uids.len()
                );
                let share: f64 = ring.ranges_of(member).iter().map(HashRange::share).sum();
                assert!(
                    (share * n as f64 - 1.0).abs() <= 0.15,
                    "{n} members: {member} holds {share:.3} of the hash space"
                );
            }
        }
    }

    #[test]
    fn a_member_joining_or_leaving_moves_at_most_one_and_a_half_shares() {
        let uids = uids();
        for n in 2..=7 {
            let before = owners(&Ring::new(members(n)), &uids);
            let after = owners(&Ring::new(members(n + 1)), &uids);
            let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count() as f64;
            let allowed = 1.5 / (n + 1) as f64 * uids.len() as f64;
            assert!(
                moved <= allowed,
                "{n} -> {}: {moved} of {} moved",
                n + 1,
                uids.len()
            );
            // Only to the newcomer: nobody else trades CRs.
            let newcomer = &members(n + 1)[n];
            assert!(before.iter().zip(&after).all(|(b, a)| b == a || a == newcomer));
            // Leaving is the same move backwards.
            let back = owners(&Ring::new(members(n)), &uids);
            assert_eq!(back, before, "{} -> {n} gives the first split back", n + 1);
        }
    }

    fn range(start: u64, end: u128) -> HashRange {
        HashRange { start, end }
    }

    #[test]
    fn gained_is_what_the_new_ranges_add_to_the_old() {
        let cases: [(&[HashRange], &[HashRange], &[HashRange]); 7] = [
            (&[range(0, 10)], &[], &[range(0, 10)]),
            (&[range(0, 10)], &[range(0, 10)], &[]),
            (&[], &[range(0, 10)], &[]),
            (&[range(0, 10)], &[range(3, 5)], &[range(0, 3), range(5, 10)]),
            (
                &[range(0, 10), range(20, SPACE_END)],
                &[range(5, 25)],
                &[range(0, 5), range(25, SPACE_END)],
            ),
            (
                &[range(5, 10)],
                &[range(0, 6), range(8, 9), range(9, 20)],
                &[range(6, 8)],
            ),
            (
                &[range(0, 4), range(6, 8)],
                &[range(2, 7)],
                &[range(0, 2), range(7, 8)],
            ),
        ];
        for (new, old, want) in cases {
            assert_eq!(gained(new, old), want, "{new:?} - {old:?}");
        }
    }

    #[test]
    fn a_member_gains_exactly_the_uids_the_new_ring_gives_it_and_the_old_did_not() {
        let uids = uids();
        for (before, after) in [(3, 4), (4, 3), (2, 5)] {
            let (old_ring, new_ring) = (Ring::new(members(before)), Ring::new(members(after)));
            for member in members(before.max(after)) {
                let added = gained(&new_ring.ranges_of(&member), &old_ring.ranges_of(&member));
                for uid in &uids {
                    let hash = super::super::field_hash(uid);
                    let moved_here = new_ring.owner_of(uid) == Some(member.as_str())
                        && old_ring.owner_of(uid) != Some(member.as_str());
                    assert_eq!(
                        added.iter().any(|r| r.contains(hash)),
                        moved_here,
                        "{before} -> {after}, {member}, {uid}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_split_depends_on_the_member_set_only() {
        let mut shuffled = members(5);
        shuffled.reverse();
        shuffled.push(shuffled[0].clone());
        let ring = Ring::new(members(5));
        let again = Ring::new(shuffled);
        assert_eq!(ring, again);
        assert_eq!(ring.version(), again.version());
        assert_ne!(ring.version(), Ring::new(members(4)).version());
        for member in ring.members() {
            assert_eq!(ring.ranges_of(member), again.ranges_of(member));
        }
    }

    #[test]
    fn the_members_ranges_tile_the_space_and_agree_with_the_owner() {
        let ring = Ring::new(members(3));
        let mut all: Vec<(HashRange, &str)> = ring
            .members()
            .iter()
            .flat_map(|m| ring.ranges_of(m).into_iter().map(move |r| (r, m.as_str())))
            .collect();
        all.sort();
        assert_eq!(all.first().map(|(r, _)| r.start), Some(0));
        assert_eq!(all.last().map(|(r, _)| r.end), Some(SPACE_END));
        for pair in all.windows(2) {
            assert_eq!(pair[0].0.end, u128::from(pair[1].0.start), "no gap, no overlap");
        }
        for (range, member) in &all {
            for hash in [range.start, (range.end - 1) as u64] {
                assert_eq!(ring.owner_of_hash(hash), Some(*member));
            }
        }
        for uid in uids().iter().take(500) {
            let owner = ring.owner_of(uid).expect("a member");
            let hash = super::super::field_hash(uid);
            assert!(ring.ranges_of(owner).iter().any(|r| r.contains(hash)));
        }
    }

    #[test]
    fn one_member_owns_everything_and_none_owns_nothing() {
        let ring = Ring::new(["only"]);
        assert_eq!(
            ring.ranges_of("only"),
            vec![HashRange {
                start: 0,
                end: SPACE_END
            }]
        );
        assert_eq!(ring.owner_of("any"), Some("only"));
        assert!(ring.ranges_of("stranger").is_empty());
        let empty = Ring::new(Vec::<String>::new());
        assert_eq!(empty.owner_of("any"), None);
        assert!(empty.ranges_of("only").is_empty());
    }
}
