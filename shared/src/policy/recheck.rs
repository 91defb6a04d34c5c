//! When an author's access is asked again with nothing changed (`--author-recheck-interval`): a
//! grant revoked while no source, copy or CR changes must still end the copies it allowed. Each
//! question of each author is asked at one moment of every round, the same for every CR that
//! shares it, so the authorizer is asked once per author and question per round however many CRs
//! share them; the moments are spread over the round by a hash of the author and the question, so
//! ten thousand questions do not all go at once.

use crate::api::reason::Reason;
use std::time::Duration;

/// Where in each round of length `interval` the author recorded as `record` is asked `question`
/// (its description): the 64-bit FNV-1a hash of both, modulo the round, in milliseconds. The same
/// author and question always land at the same moment, so the gap between two rechecks is one round.
pub fn recheck_offset(record: &str, question: &str, interval: Duration) -> Duration {
    let round = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    if round == 0 {
        return Duration::ZERO;
    }
    let key = format!("{record}\n{question}");
    Duration::from_millis(fnv1a(key.as_bytes()) % round)
}

/// Whether a recheck that found the author `denied` must wake a full pass of a CR whose `Ready`
/// condition has `ready_reason`: only a CR that still shows what the author was allowed; one that
/// already reports the author's denial is retried with backoff anyway, and a grant given back is
/// found by those retries.
pub fn wakes_pass(denied: bool, ready_reason: Option<&str>) -> bool {
    denied && ready_reason != Some(Reason::SourceForbidden.as_str())
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn a_question_keeps_its_moment_and_questions_spread_over_the_round() {
        let round = Duration::from_secs(600);
        let alice = r#"{"username":"alice","groups":["system:authenticated"]}"#;
        let read = "get configmaps team-a/settings";
        assert_eq!(
            recheck_offset(alice, read, round),
            recheck_offset(alice, read, round)
        );
        assert!(recheck_offset(alice, read, round) < round);
        // One author's 1 000 sources, and 1 000 authors of one source, over ten slices of the
        // round: none empty, none with more than twice its share.
        for key in [
            |i: u32| {
                (
                    r#"{"username":"alice","groups":[]}"#.to_owned(),
                    format!("get configmaps a/s-{i}"),
                )
            },
            |i: u32| {
                (
                    format!(r#"{{"username":"user-{i}","groups":[]}}"#),
                    "get configmaps a/s".to_owned(),
                )
            },
        ] {
            let mut slices = [0u32; 10];
            for i in 0..1000 {
                let (record, question) = key(i);
                let at = recheck_offset(&record, &question, round);
                slices[usize::try_from(at.as_secs() / 60).unwrap()] += 1;
            }
            assert!(slices.iter().all(|n| (1..=200).contains(n)), "{slices:?}");
        }
    }

    #[test]
    fn a_zero_round_asks_at_once() {
        assert_eq!(recheck_offset("x", "y", Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn only_a_denial_not_yet_reported_wakes_a_pass() {
        assert!(wakes_pass(true, Some("Projected")));
        assert!(wakes_pass(true, None));
        assert!(wakes_pass(true, Some("SourceNotFound")));
        assert!(!wakes_pass(true, Some("SourceForbidden")));
        assert!(!wakes_pass(false, Some("Projected")));
        assert!(!wakes_pass(false, Some("SourceForbidden")));
    }
}
