//! How long the stress tests run (included with `#[path]`).

use std::time::Duration;

/// `FPROBE_STRESS_MS` milliseconds when set (`.ci/run`'s release soak
/// sets it), else `default_ms`.
pub fn duration(default_ms: u64) -> Duration {
    let ms = std::env::var("FPROBE_STRESS_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_ms);
    Duration::from_millis(ms)
}
