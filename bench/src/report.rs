//! Tables (markdown), CSV and SVG output.

use std::fmt::Write as _;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use serde::Serialize;

use crate::config::Config;
use crate::row::Row;

/// Everything the run printed to stdout: the Markdown document that
/// `--markdown PATH` writes.
static DOC: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

thread_local! {
    /// Set while [`muted`] runs its closure on this thread.
    static MUTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Prints one line of the report to stdout and keeps it for `--markdown`;
/// drops it inside [`muted`].
pub fn emit(line: String) {
    if MUTED.with(std::cell::Cell::get) {
        return;
    }
    println!("{line}");
    let mut doc = DOC.lock().unwrap_or_else(|e| e.into_inner());
    doc.push_str(&line);
    doc.push('\n');
}

/// Runs `f` with the report lines this thread emits dropped: the summary
/// runs the benchmarks for their rows and prints its own tables.
pub fn muted<T>(f: impl FnOnce() -> T) -> T {
    struct Unmute(bool);
    impl Drop for Unmute {
        fn drop(&mut self) {
            MUTED.with(|m| m.set(self.0));
        }
    }
    let _unmute = Unmute(MUTED.with(|m| m.replace(true)));
    f()
}

/// Writes what [`emit`] printed so far to `path`.
pub fn write_markdown(path: &str) -> std::io::Result<()> {
    std::fs::write(path, &*DOC.lock().unwrap_or_else(|e| e.into_inner()))
}

/// `println!` for the report: the line also goes to the `--markdown` file.
macro_rules! md {
    () => {
        $crate::report::emit(String::new())
    };
    ($($t:tt)*) => {
        $crate::report::emit(format!($($t)*))
    };
}
pub(crate) use md;

/// The CPU model `/proc/cpuinfo` names, and how many CPUs it lists.
pub fn cpu_model() -> (String, usize) {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find(|l| l.starts_with("model name"))
        .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let listed = info.lines().filter(|l| l.starts_with("processor")).count();
    (model, listed)
}

/// The current UTC time as `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_date(secs)
}

/// `secs` after the Unix epoch as `YYYY-MM-DD HH:MM UTC` (proleptic
/// Gregorian calendar; H. Hinnant's `civil_from_days`).
pub fn utc_date(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

pub fn machine_line(cfg: &Config) -> String {
    let (model, _) = cpu_model();
    let n = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "machine: {model}, {n} CPUs available, producers pinned round-robin over CPUs {:?}; {}",
        cfg.cpus,
        loadavg()
    )
}

pub fn timing_line(cfg: &Config) -> String {
    let t = cfg.timing;
    let mut s = format!(
        "timing: {} ms samples, {} warm-up sample(s) discarded + {} kept per cell, {} interleaved round(s) pooled",
        t.sample.as_millis(),
        t.warmup_samples,
        t.samples,
        cfg.rounds
    );
    if t.sample.as_millis() < 1000 {
        s += "\nnote: shorter samples than the kernel's 1 s (to fit the default run in two minutes); \
              pass --sample-ms 1000 --duration-ms 5000 for the kernel's method";
    }
    s
}

pub fn print_table(title: &str, header: &[&str], body: &[Vec<String>]) {
    let mut s = format!("### {title}\n\n| {} |\n|", header.join(" | "));
    for (i, _) in header.iter().enumerate() {
        s += if i == 0 { "---|" } else { "---:|" };
    }
    s += "\n";
    for r in body {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    md!("{s}");
}

/// One line of the `--csv` file: a [`Row`] and its per-producer rate.
/// Rates are written with four decimals.
#[derive(Serialize)]
struct CsvRow<'a> {
    bench: &'a str,
    workload: &'a str,
    addrs: usize,
    #[serde(rename = "impl")]
    imp: &'a str,
    threads: usize,
    unit: &'a str,
    #[serde(serialize_with = "four_decimals")]
    mean: f64,
    #[serde(serialize_with = "four_decimals")]
    stddev: f64,
    #[serde(serialize_with = "four_decimals")]
    median: f64,
    #[serde(serialize_with = "four_decimals")]
    per_thread: f64,
    samples: usize,
}

fn four_decimals<S: serde::Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{x:.4}"))
}

/// Writes one line per row, under a header line of the field names.
pub fn write_csv(path: &str, rows: &[Row]) -> Result<(), csv::Error> {
    let mut w = csv::Writer::from_path(path)?;
    if rows.is_empty() {
        // `serialize` writes the header with the first row; without rows,
        // the file still gets it.
        w.write_record([
            "bench",
            "workload",
            "addrs",
            "impl",
            "threads",
            "unit",
            "mean",
            "stddev",
            "median",
            "per_thread",
            "samples",
        ])?;
    }
    for r in rows {
        w.serialize(CsvRow {
            bench: r.bench,
            workload: &r.workload,
            addrs: r.addrs,
            imp: &r.imp,
            threads: r.threads,
            unit: r.unit,
            mean: r.mean,
            stddev: r.stddev,
            median: r.median,
            per_thread: r.per_thread(),
            samples: r.samples,
        })?;
    }
    w.flush()?;
    Ok(())
}

/// Medians spanning more than this factor get a log-scale y axis.
const LOG_SPAN: f64 = 30.0;

/// Throughput vs threads, one panel per (lookup) workload, one line per
/// implementation: M/s (median) against the producer count, on integer
/// thread ticks. The y axis is logarithmic when the medians span more than
/// a factor of [`LOG_SPAN`], linear from 0 otherwise.
pub fn write_svg(path: &str, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let rows: Vec<&Row> = rows
        .iter()
        .filter(|r| r.bench == "lookup" && r.median.is_finite() && r.median > 0.0)
        .collect();
    if rows.is_empty() {
        return Err("no lookup rows to plot".into());
    }
    let mut workloads: Vec<&str> = Vec::new();
    for r in &rows {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    let lo = rows.iter().map(|r| r.median).fold(f64::INFINITY, f64::min);
    let hi = rows.iter().map(|r| r.median).fold(0.0, f64::max);
    let root = SVGBackend::new(path, (1000, 480 * workloads.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, w) in root
        .split_evenly((workloads.len(), 1))
        .iter()
        .zip(&workloads)
    {
        let panel: Vec<&Row> = rows.iter().copied().filter(|r| r.workload == *w).collect();
        if hi / lo > LOG_SPAN {
            draw_panel(area, &panel, (lo * 0.7..hi * 1.5).log_scale())?;
        } else {
            draw_panel(area, &panel, 0.0..hi * 1.1)?;
        }
    }
    root.present()?;
    Ok(())
}

/// One workload's panel of [`write_svg`], over the y axis `y`.
fn draw_panel<Y>(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    rows: &[&Row],
    y: Y,
) -> Result<(), Box<dyn std::error::Error>>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let (workload, addrs) = (&rows[0].workload, rows[0].addrs);
    let min_t = rows.iter().map(|r| r.threads).min().unwrap_or(1) as u32;
    let max_t = rows.iter().map(|r| r.threads).max().unwrap_or(1) as u32;
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.imp.as_str()) {
            names.push(&r.imp);
        }
    }
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("lookup, {workload}, {addrs} addresses: M lookups/s (median)"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(min_t.saturating_sub(1)..max_t + 1, y)?;
    // Integer ticks only; none outside the measured thread counts.
    let tick = |t: &u32| {
        if (min_t..=max_t).contains(t) {
            t.to_string()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_labels(((max_t - min_t + 3) as usize).min(24))
        .x_label_formatter(&tick)
        .x_desc("producer threads")
        .y_desc("M/s")
        .draw()?;
    for (i, name) in names.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mut pts: Vec<(u32, f64)> = rows
            .iter()
            .filter(|r| r.imp == *name)
            .map(|r| (r.threads as u32, r.median))
            .collect();
        pts.sort_by_key(|p| p.0);
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// `/proc/loadavg`'s 1-minute figure: other work competing for the CPUs.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .map(|l| format!("load average {l}"))
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::utc_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(super::utc_date(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(super::utc_date(1_709_210_096), "2024-02-29 12:34 UTC");
        assert_eq!(super::utc_date(1_735_689_599), "2024-12-31 23:59 UTC");
    }
}
