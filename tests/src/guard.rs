//! The brute-force guard as its suites set it up: a small budget of unknown codes, and codes
//! that name no session.

use std::num::NonZeroU32;

use toolrelay_relay::RelayConfig;
use toolrelay_relay::limits::RateLimits;

/// Default relay settings, but for `per_minute` unknown codes a minute per client address.
pub fn lookups(per_minute: u32) -> RelayConfig {
    RelayConfig {
        limits: RateLimits {
            lookups_per_ip: NonZeroU32::new(per_minute).unwrap(),
            ..RateLimits::default()
        },
        ..RelayConfig::default()
    }
}

/// Unknown codes, one per probe, so no answer is cached anywhere.
pub fn unknown(n: usize) -> String {
    format!(
        "ZZZZ{}",
        ["A", "B", "C", "D", "E", "F", "G", "H", "J", "K"][n].repeat(4)
    )
}
