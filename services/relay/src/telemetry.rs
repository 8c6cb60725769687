//! Logging set-up shared by the binaries: `RUST_LOG` filters (default `info`), `LOG_FORMAT`
//! picks human-readable text or one JSON object per line.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. Call once, at start.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if let Err(error) = installed {
        eprintln!("logging was already set up: {error}");
    }
}
