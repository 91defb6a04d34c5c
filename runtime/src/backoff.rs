//! The one backoff of both services: doubling delays from a first delay up to a cap, for as long as
//! the caller keeps failing, forgotten on success. Every retry loop paces itself with it (or, for a
//! bounded retry of one call, with `backon`'s own builders).

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use std::time::Duration;

/// Doubling delays: `first`, `2 × first`, `4 × first`, ... up to `cap`, without end.
#[derive(Debug)]
pub struct Backoff {
    policy: ExponentialBuilder,
    cap: Duration,
    delays: ExponentialBackoff,
}

impl Backoff {
    /// A backoff whose first delay is `first` (or `cap` if smaller).
    pub fn doubling(first: Duration, cap: Duration) -> Self {
        let policy = ExponentialBuilder::new()
            .with_min_delay(first)
            .with_factor(2.0)
            .with_max_delay(cap)
            .without_max_times();
        Self {
            policy,
            cap,
            delays: policy.build(),
        }
    }

    /// The delay before the next attempt, after one more failure.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.delays.next().unwrap_or(self.cap).min(self.cap);
        // backon multiplies in f32: whole milliseconds keep the delays (and the logs) exact.
        Duration::from_millis(delay.as_millis().try_into().unwrap_or(u64::MAX))
    }

    /// Starts over from the first delay (after a success).
    pub fn reset(&mut self) {
        self.delays = self.policy.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn next(backoff: &mut Backoff, n: usize) -> Vec<Duration> {
        (0..n).map(|_| backoff.next_delay()).collect()
    }

    #[test]
    fn doubles_up_to_the_cap_and_starts_over_on_reset() {
        let mut b = Backoff::doubling(Duration::from_millis(500), Duration::from_secs(3));
        assert_eq!(
            next(&mut b, 5),
            [500, 1000, 2000, 3000, 3000].map(Duration::from_millis)
        );
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(500));
    }

    #[test]
    fn delays_are_whole_milliseconds_and_never_end() {
        let mut b = Backoff::doubling(Duration::from_millis(200), Duration::from_secs(10));
        assert_eq!(
            next(&mut b, 7),
            [200, 400, 800, 1600, 3200, 6400, 10_000].map(Duration::from_millis)
        );
        assert!(next(&mut b, 1000).iter().all(|d| *d == Duration::from_secs(10)));
    }

    #[test]
    fn a_cap_below_the_first_delay_wins() {
        let mut b = Backoff::doubling(Duration::from_secs(1), Duration::from_millis(300));
        assert_eq!(next(&mut b, 2), [300, 300].map(Duration::from_millis));
    }
}
