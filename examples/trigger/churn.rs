//! What `--bench churn` and `--bench churn-peers` share: the map interface
//! their writers churn, the two writers, fprobe's side of it, and one
//! measured phase (a reader with a writer idle or running).

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use fprobe::{AddrIndex, EntryId};

use crate::Config;
use crate::harness::{self, Samples};
use crate::impls::BATCH;

/// A map whose readers a churn benchmark measures and whose writer churns
/// it: `address → values`.
pub trait Churned: Sync {
    /// Looks up every address of `addrs`, returns the sum of their values.
    fn read(&self, addrs: &[u64]) -> u64;
    /// Adds value `v` to `a` (creating the address); returns what
    /// [`Churned::remove`] needs to remove exactly this value.
    fn insert(&self, a: u64, v: u64) -> u64;
    /// Removes the value `insert` returned `token` for; the address goes
    /// when its last value does.
    fn remove(&self, a: u64, token: u64);
}

/// What a writer loop needs: a shared [`Churned`] map, or a map the writer
/// owns or holds locked (the private control of `--bench churn`, the
/// `RwLock<hashbrown>` peer of `--bench churn-peers`).
pub trait Writes {
    fn insert(&mut self, a: u64, v: u64) -> u64;
    fn remove(&mut self, a: u64, token: u64);
}

impl<M: Churned + ?Sized> Writes for &M {
    fn insert(&mut self, a: u64, v: u64) -> u64 {
        Churned::insert(*self, a, v)
    }
    fn remove(&mut self, a: u64, token: u64) {
        Churned::remove(*self, a, token)
    }
}

impl Writes for hashbrown::HashMap<u64, Vec<u64>> {
    fn insert(&mut self, a: u64, v: u64) -> u64 {
        self.entry(a).or_default().push(v);
        v
    }
    fn remove(&mut self, a: u64, v: u64) {
        let vals = self.get_mut(&a).expect("inserted above");
        let i = vals.iter().rposition(|&x| x == v).expect("value present");
        vals.remove(i);
        if vals.is_empty() {
            self.remove(&a);
        }
    }
}

/// fprobe's index: `get` under one read guard per batch, `insert`,
/// `remove(addr, id)`.
pub struct Fprobe(pub AddrIndex<u64>);

impl Churned for Fprobe {
    fn read(&self, addrs: &[u64]) -> u64 {
        let guard = fprobe::rcu::read_lock();
        addrs
            .iter()
            .map(|&a| self.0.get(a, &guard).iter().sum::<u64>())
            .sum()
    }
    fn insert(&self, a: u64, v: u64) -> u64 {
        self.0.insert(a, v).expect("no limit").as_u64()
    }
    fn remove(&self, a: u64, token: u64) {
        self.0
            .remove(a, EntryId::from_u64(token))
            .expect("inserted above");
    }
}

/// Inserts fresh addresses above the read set (`top`) and removes the
/// oldest once 4,096 are in, at most `rate` operations per second; returns
/// the number of operations.
pub fn churn_disjoint(w: &mut impl Writes, top: u64, stop: &AtomicBool, rate: f64) -> u64 {
    let t0 = Instant::now();
    const WINDOW: usize = 4096;
    let mut live: VecDeque<(u64, u64)> = VecDeque::with_capacity(WINDOW + 1);
    let (mut next, mut ops) = ((top & !15) + 0x1000, 0u64);
    // Relaxed: a stop request, polled.
    while !stop.load(Ordering::Relaxed) {
        live.push_back((next, w.insert(next, next)));
        next += 16;
        ops += 1;
        if live.len() > WINDOW {
            let (a, token) = live.pop_front().expect("non-empty");
            w.remove(a, token);
            ops += 1;
        }
        pace(ops, rate, t0);
    }
    for (a, token) in live {
        w.remove(a, token);
    }
    ops
}

/// Adds a value to each hot address in turn and removes it again, at most
/// `rate` operations per second.
pub fn churn_hot(w: &mut impl Writes, hot: &[u64], stop: &AtomicBool, rate: f64) -> u64 {
    let t0 = Instant::now();
    let (mut ops, mut k) = (0u64, 0);
    // Relaxed: a stop request, polled.
    while !stop.load(Ordering::Relaxed) {
        let a = hot[k];
        let token = w.insert(a, 7);
        w.remove(a, token);
        ops += 2;
        k = (k + 1) % hot.len();
        pace(ops, rate, t0);
    }
    ops
}

/// Sleeps while `ops` is ahead of `rate` operations per second since `t0`.
fn pace(ops: u64, rate: f64, t0: Instant) {
    if rate.is_finite() {
        while ops as f64 > rate * t0.elapsed().as_secs_f64() {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

/// One phase: one reader, `read` over `stream` in batches of [`BATCH`],
/// measured by the sampler on the first CPU, while `writer` (if any) runs on
/// its own thread on the next CPU until the sampler is done. Returns the
/// reader's samples and the writer's operations per second.
pub fn phase(
    cfg: &Config,
    stream: &[u64],
    read: &(dyn Fn(&[u64]) -> u64 + Sync),
    writer: Option<&(dyn Fn(&AtomicBool) -> u64 + Sync)>,
) -> (Samples, f64) {
    let stop_writer = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    let t0 = Instant::now();
    let samples = std::thread::scope(|s| {
        if let Some(writer) = writer {
            let (stop_writer, ops) = (&stop_writer, &ops);
            let cpu = cfg.cpus.get(1 % cfg.cpus.len().max(1)).copied();
            s.spawn(move || {
                if let Some(cpu) = cpu {
                    harness::pin_to(cpu);
                }
                // Relaxed: read after the scope joins this thread.
                ops.store(writer(stop_writer), Ordering::Relaxed);
            });
        }
        let samples = harness::run_producers(1, 0, &cfg.cpus, cfg.timing, |_, counter, stop| {
            let mut pos = 0;
            let mut acc = 0u64;
            // Relaxed: polled once per batch.
            while !stop.load(Ordering::Relaxed) {
                acc = acc.wrapping_add(read(black_box(&stream[pos..pos + BATCH])));
                counter.add(BATCH as u64);
                pos = (pos + BATCH) % stream.len();
            }
            black_box(acc);
        });
        // Relaxed: the writer polls it; the scope joins it.
        stop_writer.store(true, Ordering::Relaxed);
        samples
    });
    (
        samples,
        ops.into_inner() as f64 / t0.elapsed().as_secs_f64(),
    )
}
