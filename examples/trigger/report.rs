//! Tables (markdown), CSV and SVG output.

use std::fmt::Write as _;

use plotters::prelude::*;

use crate::Config;

/// One measured cell.
#[derive(Clone, Debug)]
pub struct Row {
    pub bench: &'static str,
    /// Workload or variant (`uniform`, `hot`, `one-by-one`, `churn-disjoint`…).
    pub workload: String,
    pub addrs: usize,
    pub imp: String,
    pub threads: usize,
    /// `M/s` or `ns/addr`.
    pub unit: &'static str,
    pub mean: f64,
    pub stddev: f64,
    pub median: f64,
    pub samples: usize,
}

impl Row {
    /// A throughput row (M/s) from a cell's samples.
    pub fn rate(
        bench: &'static str,
        workload: String,
        addrs: usize,
        imp: String,
        threads: usize,
        s: &crate::harness::Samples,
    ) -> Row {
        Row {
            bench,
            workload,
            addrs,
            imp,
            threads,
            unit: "M/s",
            mean: s.mean() / 1e6,
            stddev: s.stddev() / 1e6,
            median: s.median() / 1e6,
            samples: s.rates.len(),
        }
    }

    /// Per producer (throughput rows only).
    pub fn per_thread(&self) -> f64 {
        self.mean / self.threads as f64
    }
}

pub fn machine_line(cfg: &Config) -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
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
    println!("{s}");
}

pub fn write_csv(path: &str, rows: &[Row]) -> std::io::Result<()> {
    let mut s = String::from(
        "bench,workload,addrs,impl,threads,unit,mean,stddev,median,per_thread,samples\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{:.4},{:.4},{:.4},{:.4},{}",
            r.bench,
            r.workload,
            r.addrs,
            r.imp,
            r.threads,
            r.unit,
            r.mean,
            r.stddev,
            r.median,
            r.per_thread(),
            r.samples
        );
    }
    std::fs::write(path, s)
}

/// Throughput vs threads, one panel per (lookup) workload, one line per
/// implementation, log-scale M/s.
pub fn write_svg(path: &str, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let rows: Vec<&Row> = rows.iter().filter(|r| r.bench == "lookup").collect();
    if rows.is_empty() {
        return Err("no lookup rows to plot".into());
    }
    let mut workloads: Vec<&str> = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for r in &rows {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
        if !names.contains(&r.imp.as_str()) {
            names.push(&r.imp);
        }
    }
    let max_t = rows.iter().map(|r| r.threads).max().unwrap_or(1);
    let lo = rows
        .iter()
        .map(|r| r.median)
        .fold(f64::INFINITY, f64::min)
        .max(0.01)
        * 0.7;
    let hi = rows.iter().map(|r| r.median).fold(0.0, f64::max) * 1.5;
    let root = SVGBackend::new(path, (1000, 480 * workloads.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let addrs = rows[0].addrs;
    for (area, w) in root
        .split_evenly((workloads.len(), 1))
        .iter()
        .zip(&workloads)
    {
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("lookup, {w}, {addrs} addresses: M lookups/s (median)"),
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.5f64..max_t as f64 + 0.5, (lo..hi).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("producer threads")
            .y_desc("M/s")
            .draw()?;
        for (i, name) in names.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let mut pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.workload == *w && r.imp == *name)
                .map(|r| (r.threads as f64, r.median))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
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
    }
    root.present()?;
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
