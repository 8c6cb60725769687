//! Time for the domain: wall-clock timestamps that follow tokio's clock.
//!
//! [`Clock::now`] is the wall time at start plus the time tokio has seen pass since, so tests
//! under `tokio::time::pause()` move expiry, heartbeats and timeouts with `advance`, while a real
//! server reads ordinary wall time. A [`Clock::manual`] clock moves only when told to: store
//! tests that talk to a real Redis (real I/O, so no paused tokio clock) set the time explicitly.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// This time plus `duration`.
    pub fn plus(self, duration: Duration) -> Self {
        Self(self.0.saturating_add(millis(duration)))
    }

    /// Time from `earlier` to this one; zero when `earlier` is later.
    pub fn since(self, earlier: Self) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }

    /// As a `SystemTime`.
    pub fn system_time(self) -> SystemTime {
        match u64::try_from(self.0) {
            Ok(ms) => UNIX_EPOCH + Duration::from_millis(ms),
            Err(_) => UNIX_EPOCH,
        }
    }

    /// RFC 3339 in UTC with milliseconds, e.g. `2026-11-22T10:00:00.000Z`.
    pub fn rfc3339(self) -> String {
        humantime::format_rfc3339_millis(self.system_time()).to_string()
    }

    /// Whole seconds and the nanoseconds past them, as protobuf's `Timestamp` wants.
    pub fn seconds_and_nanos(self) -> (i64, i32) {
        let nanos = i32::try_from(self.0.rem_euclid(1000) * 1_000_000).unwrap_or(0);
        (self.0.div_euclid(1000), nanos)
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The domain's clock. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Clock {
    wall_at_start: Timestamp,
    start: tokio::time::Instant,
    /// Set for a manual clock: the time it reads.
    manual: Option<std::sync::Arc<std::sync::atomic::AtomicI64>>,
}

/// Moves a [`Clock::manual`] clock.
#[derive(Debug, Clone)]
pub struct ClockHand(std::sync::Arc<std::sync::atomic::AtomicI64>);

impl ClockHand {
    /// Moves the clock forward by `duration`.
    pub fn advance(&self, duration: Duration) {
        self.0
            .fetch_add(millis(duration), std::sync::atomic::Ordering::SeqCst);
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// A clock reading the current wall time.
    pub fn new() -> Self {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Self {
            wall_at_start: Timestamp(millis(since_epoch)),
            start: tokio::time::Instant::now(),
            manual: None,
        }
    }

    /// A clock that reads `start` until its hand moves it.
    pub fn manual(start: Timestamp) -> (Self, ClockHand) {
        let time = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(start.0));
        let clock = Self {
            wall_at_start: start,
            start: tokio::time::Instant::now(),
            manual: Some(std::sync::Arc::clone(&time)),
        };
        (clock, ClockHand(time))
    }

    /// The current time.
    pub fn now(&self) -> Timestamp {
        match &self.manual {
            Some(time) => Timestamp(time.load(std::sync::atomic::Ordering::SeqCst)),
            None => self.wall_at_start.plus(self.start.elapsed()),
        }
    }

    /// The tokio instant at which `at` is reached (now, when it is already past).
    pub fn instant(&self, at: Timestamp) -> tokio::time::Instant {
        tokio::time::Instant::now() + at.since(self.now())
    }

    /// Sleeps until `at`.
    pub async fn sleep_until(&self, at: Timestamp) {
        tokio::time::sleep_until(self.instant(at)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339_with_milliseconds() {
        assert_eq!(
            Timestamp(1_700_000_000_123).rfc3339(),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(
            Timestamp(1_700_000_000_123).seconds_and_nanos(),
            (1_700_000_000, 123_000_000)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn follows_tokio_time() {
        let clock = Clock::new();
        let before = clock.now();
        tokio::time::advance(Duration::from_secs(90)).await;
        assert_eq!(clock.now().since(before), Duration::from_secs(90));
    }
}
