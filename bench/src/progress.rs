//! Progress on stderr, kept apart from the report on stdout.
//!
//! * [`Progress::Cells`] (the `--bench` runs): one line per measured cell
//!   and round, with its median, as the harness has always printed.
//! * [`Progress::Meter`] (the summary, the run without `--bench`): one line
//!   rewritten in place on a terminal (`\r`); when stderr is not a terminal,
//!   one line per part and one at the end.
//! * [`Progress::Off`] (`--quiet`): nothing.
//!
//! Warnings (a dispatcher that missed exits, a file not written) are not
//! progress and go to stderr whatever the mode.

use std::fmt;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::harness::Samples;

/// How a run reports what it is doing.
#[derive(Clone, Debug)]
pub enum Progress {
    /// `--quiet`.
    Off,
    /// One line per cell and round.
    Cells,
    /// One line for the whole run.
    Meter(Arc<Meter>),
}

/// Which cell is measured: what [`Progress`] names in its lines.
pub struct Cell<'a> {
    pub bench: &'a str,
    pub workload: &'a str,
    pub threads: usize,
    /// 0-based.
    pub round: usize,
    pub rounds: usize,
    pub imp: &'a str,
}

impl Progress {
    /// A free-form progress line (building the implementations, a churn
    /// phase's figures): printed in [`Progress::Cells`] mode only.
    pub fn line(&self, args: fmt::Arguments<'_>) {
        if let Progress::Cells = self {
            eprintln!("{args}");
        }
    }

    /// `cell` is about to be measured.
    pub fn start_cell(&self, cell: &Cell<'_>) {
        if let Progress::Meter(m) = self {
            m.start_cell(cell);
        }
    }

    /// `cell` was measured: `s` is what it gave.
    pub fn end_cell(&self, cell: &Cell<'_>, s: &Samples) {
        match self {
            Progress::Off => {}
            Progress::Cells => eprintln!(
                "  {} {:<7} {:>2}T round {}/{}  {:<24} {:>8.2} M/s{}",
                cell.bench,
                cell.workload,
                cell.threads,
                cell.round + 1,
                cell.rounds,
                cell.imp,
                s.median() / 1e6,
                if s.unpinned > 0 {
                    format!("  ({} producer(s) unpinned)", s.unpinned)
                } else {
                    String::new()
                }
            ),
            Progress::Meter(m) => m.end_cell(),
        }
    }
}

/// The summary's progress line: parts, cells done of cells planned, time
/// spent and left.
#[derive(Debug)]
pub struct Meter {
    /// Rewrite one line in place (stderr is a terminal), else print a line
    /// per part.
    tty: bool,
    state: Mutex<MeterState>,
}

#[derive(Debug)]
struct MeterState {
    started: Instant,
    /// (name, cell rounds) of every part, in run order.
    parts: Vec<(String, usize)>,
    /// Index into `parts` of the part running.
    part: usize,
    done: usize,
    /// The in-place line is on the terminal ([`Meter::finish`] clears it).
    shown: bool,
}

impl Meter {
    /// A meter on stderr: in place if stderr is a terminal.
    pub fn new() -> Meter {
        Meter {
            tty: std::io::stderr().is_terminal(),
            state: Mutex::new(MeterState {
                started: Instant::now(),
                parts: Vec::new(),
                part: 0,
                done: 0,
                shown: false,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MeterState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run's parts, each with the cell rounds it will measure; the
    /// clock starts now.
    pub fn plan(&self, parts: Vec<(String, usize)>) {
        let mut s = self.state();
        s.parts = parts;
        s.started = Instant::now();
    }

    /// Part `k` of the plan begins.
    pub fn part(&self, k: usize) {
        let mut s = self.state();
        s.part = k;
        if !self.tty {
            let (name, cells) = s.parts.get(k).cloned().unwrap_or_default();
            let mut err = std::io::stderr().lock();
            let _ = writeln!(
                err,
                "trigger: part {}/{} {name}: {cells} cell rounds ({} of {} done, {:.0} s so far)",
                k + 1,
                s.parts.len(),
                s.done,
                s.total(),
                s.started.elapsed().as_secs_f64()
            );
        }
    }

    fn start_cell(&self, cell: &Cell<'_>) {
        if !self.tty {
            return;
        }
        let mut s = self.state();
        let elapsed = s.started.elapsed().as_secs_f64();
        let left = if s.done > 0 {
            format!(
                ", ~{:.0} s left",
                elapsed / s.done as f64 * (s.total() - s.done) as f64
            )
        } else {
            String::new()
        };
        let (name, _) = s.parts.get(s.part).cloned().unwrap_or_default();
        let line = format!(
            "[{}/{} {name}] {}/{} cells, {:.0} s{left}: {} {} {}T {} r{}/{}",
            s.part + 1,
            s.parts.len(),
            s.done,
            s.total(),
            elapsed,
            cell.bench,
            cell.workload,
            cell.threads,
            cell.imp,
            cell.round + 1,
            cell.rounds
        );
        // A line wider than the terminal wraps, and `\r` would rewrite only
        // its last row.
        let line: String = line.chars().take(terminal_width() - 1).collect();
        // \r to the line's start, \x1b[K to clear what a longer line left.
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[K{line}");
        let _ = err.flush();
        s.shown = true;
    }

    fn end_cell(&self) {
        self.state().done += 1;
    }

    /// The measuring is over: the in-place line gives way to one final
    /// line (before the report's tables reach the terminal).
    pub fn finish(&self) {
        let s = self.state();
        let mut err = std::io::stderr().lock();
        if self.tty && s.shown {
            let _ = write!(err, "\r\x1b[K");
        }
        let _ = writeln!(
            err,
            "trigger: measured {} cell rounds in {:.1} s",
            s.done,
            s.started.elapsed().as_secs_f64()
        );
    }
}

/// Columns of the terminal on stderr (80 if it cannot be asked).
fn terminal_width() -> usize {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which
    // points to one that lives across the call.
    let ok = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    if ok && ws.ws_col >= 20 {
        usize::from(ws.ws_col)
    } else {
        80
    }
}

impl Default for Meter {
    fn default() -> Self {
        Meter::new()
    }
}

impl MeterState {
    fn total(&self) -> usize {
        self.parts.iter().map(|p| p.1).sum::<usize>().max(self.done)
    }
}
