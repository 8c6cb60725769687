//! A driver's retries after a store error.

use std::time::Duration;

/// The first wait before a driver retries a claim that failed on a store error; it doubles
/// up to [`RETRY_MAX`] while the store stays unavailable.
const RETRY_START: Duration = Duration::from_millis(250);
/// The longest wait between a driver's retries.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// How a delivery went.
pub(super) enum Delivery {
    /// Every claimable call was sent.
    All,
    /// The store failed: try again soon.
    Failed,
}

/// A driver's retries after a store error. A failed operation may still have run in the
/// store (a claim whose reply timed out), so the delivery after one is a redelivering one;
/// it is due after a wait that doubles from [`RETRY_START`] to [`RETRY_MAX`] while the
/// store keeps failing, and nothing is owed once a redelivering delivery goes through.
pub(super) struct Retry {
    /// Made at the first failure, boxed: an idle tab's task keeps it.
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    wait: Duration,
    /// A redelivering delivery is owed.
    pub(super) owed: bool,
    /// The sleep runs.
    armed: bool,
}

impl Retry {
    pub(super) fn new() -> Self {
        Self {
            sleep: None,
            wait: RETRY_START,
            owed: false,
            armed: false,
        }
    }

    /// A store operation failed: a redelivering delivery is owed, at the next wait.
    pub(super) fn failed(&mut self) {
        self.owed = true;
        if !self.armed {
            let due = tokio::time::Instant::now() + self.wait;
            match &mut self.sleep {
                Some(sleep) => sleep.as_mut().reset(due),
                None => self.sleep = Some(Box::pin(tokio::time::sleep_until(due))),
            }
            self.wait = (self.wait * 2).min(RETRY_MAX);
            self.armed = true;
        }
    }

    /// What a delivery (redelivering or not) came to.
    pub(super) fn after(&mut self, redelivered: bool, delivered: Delivery) {
        match delivered {
            Delivery::Failed => self.failed(),
            Delivery::All if redelivered => {
                self.owed = false;
                self.armed = false;
                self.wait = RETRY_START;
            }
            Delivery::All => {}
        }
    }

    /// Completes when an armed retry is due (and disarms it); never while unarmed.
    pub(super) async fn due(&mut self) {
        match &mut self.sleep {
            Some(sleep) if self.armed => sleep.as_mut().await,
            _ => return std::future::pending().await,
        }
        self.armed = false;
    }
}
