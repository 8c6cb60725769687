//! Latency summaries: what a callers process reports for a batch of calls.

use std::time::Duration;

use serde_json::{Value, json};

/// The summary of a batch as the JSON line a callers process prints: calls answered, errors,
/// wall time, calls per second, and the latency quantiles in µs.
pub fn summary(mut latencies: Vec<Duration>, errors: usize, elapsed: Duration) -> Value {
    latencies.sort_unstable();
    let at = |q: f64| -> u128 {
        if latencies.is_empty() {
            return 0;
        }
        let index = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len());
        latencies[index - 1].as_micros()
    };
    json!({
        "calls": latencies.len(),
        "errors": errors,
        "seconds": elapsed.as_secs_f64(),
        "perSecond": latencies.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        "p50": at(0.5) as u64,
        "p90": at(0.9) as u64,
        "p99": at(0.99) as u64,
        "p999": at(0.999) as u64,
        "max": at(1.0) as u64,
    })
}

/// A number of a summary, 0 when absent.
pub fn number(summary: &Value, name: &str) -> f64 {
    summary[name].as_f64().unwrap_or(0.0)
}

/// `a ÷ b` as a table cell (`–` when there is no floor to divide by).
pub fn ratio(a: f64, b: Option<f64>) -> String {
    match b {
        Some(b) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "–".to_owned(),
    }
}

/// A count with thousands separators, as the tables in BENCHMARKS.md write them.
pub fn grouped(value: f64) -> String {
    let digits = format!("{:.0}", value.round());
    let (sign, digits) = digits
        .strip_prefix('-')
        .map_or(("", digits.as_str()), |rest| ("-", rest));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{sign}{out}")
}
