//! The producer/sampler machinery of the kernel's `bench_trigger`, in
//! userspace: N producer threads pinned round-robin over the CPUs this
//! process may run on, each bumping its own 128-byte-padded counter once per
//! batch; a sampler that reads the counters every sample period; warm-up
//! samples discarded; mean ± stddev of the rest.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::stats;

/// One producer's counter, alone on its (pair of adjacent) cache lines so
/// producers never share a line (the kernel pads its per-CPU counters to
/// 128 bytes for the adjacent-line prefetcher).
#[repr(align(128))]
#[derive(Default)]
pub struct PaddedCounter(AtomicU64);

impl PaddedCounter {
    /// Adds `n`. Single writer (the owning producer), so a load + store: no
    /// read-modify-write on the hot path, as the kernel's `this_cpu_add`.
    #[inline(always)]
    pub fn add(&self, n: u64) {
        // Relaxed: a statistic; the sampler only needs an eventually fresh value.
        self.0
            .store(self.0.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        // Relaxed: see `add`.
        self.0.load(Ordering::Relaxed)
    }
}

/// CPUs this process may run on (its affinity mask), in order; empty if the
/// mask cannot be read.
pub fn allowed_cpus() -> Vec<usize> {
    core_affinity::get_core_ids()
        .map(|ids| ids.into_iter().map(|c| c.id).collect())
        .unwrap_or_default()
}

/// Pins the calling thread to `cpu` (one of [`allowed_cpus`]); false if the
/// kernel refuses.
pub fn pin_to(cpu: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
}

/// How long one cell runs.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub sample: Duration,
    pub warmup_samples: usize,
    pub samples: usize,
}

/// What one cell measured: the rate of each kept sample, in ops/s (all
/// producers together).
#[derive(Clone, Debug, Default)]
pub struct Samples {
    pub rates: Vec<f64>,
    /// Producers that could not be pinned.
    pub unpinned: usize,
}

impl Samples {
    /// Mean rate; NaN without samples.
    pub fn mean(&self) -> f64 {
        stats::mean(&self.rates)
    }

    /// Sample standard deviation (n − 1) of the rates.
    pub fn stddev(&self) -> f64 {
        stats::stddev(&self.rates)
    }

    /// Median rate; NaN without samples.
    pub fn median(&self) -> f64 {
        stats::median(&self.rates)
    }

    pub fn extend(&mut self, other: Samples) {
        self.rates.extend(other.rates);
        self.unpinned = self.unpinned.max(other.unpinned);
    }
}

/// Runs `threads` producers, producer `i` calling `producer(i, &counter,
/// &stop)` once; it must loop until `stop` is set, adding to `counter` as it
/// goes. Producer `i` is pinned to `cpus[(first_cpu + i) % cpus.len()]`.
/// Samples every `timing.sample`, discards the warm-up samples.
pub fn run_producers<F>(
    threads: usize,
    first_cpu: usize,
    cpus: &[usize],
    timing: Timing,
    producer: F,
) -> Samples
where
    F: Fn(usize, &PaddedCounter, &AtomicBool) + Sync,
{
    let counters: Vec<PaddedCounter> = (0..threads).map(|_| PaddedCounter::default()).collect();
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads + 1);
    let unpinned = AtomicU64::new(0);
    let mut out = Samples::default();
    thread::scope(|s| {
        for (i, counter) in counters.iter().enumerate() {
            let (stop, start, unpinned, producer) = (&stop, &start, &unpinned, &producer);
            s.spawn(move || {
                if cpus.is_empty() || !pin_to(cpus[(first_cpu + i) % cpus.len()]) {
                    unpinned.fetch_add(1, Ordering::Relaxed);
                }
                start.wait();
                producer(i, counter, stop);
            });
        }
        start.wait();
        let total = || counters.iter().map(PaddedCounter::get).sum::<u64>();
        let mut last = total();
        let mut t_last = Instant::now();
        for k in 0..timing.warmup_samples + timing.samples {
            thread::sleep(timing.sample);
            let now = total();
            let t = Instant::now();
            if k >= timing.warmup_samples {
                out.rates
                    .push((now - last) as f64 / (t - t_last).as_secs_f64());
            }
            last = now;
            t_last = t;
        }
        // Relaxed: producers poll it once per batch; `scope` joins them.
        stop.store(true, Ordering::Relaxed);
    });
    out.unpinned = unpinned.into_inner() as usize;
    out
}
