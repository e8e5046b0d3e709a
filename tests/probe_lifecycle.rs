//! Registries that die leave nothing behind: a thread that dispatched
//! through many registries, one after another, keeps neither their memory
//! nor a cost per dead registry on its dispatch path, and threads that
//! outlive a registry dispatch correctly through the next one.
//!
//! The long variant is `#[ignore]`d; run it in release (`FPROBE_REGISTRIES`
//! sets how many registries, 100,000 by default):
//!
//! ```sh
//! cargo test --release --test probe_lifecycle -- --ignored --nocapture
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

use fprobe::probe::{EntryAction, Fprobe, Registry};

const ADDRS: [u64; 3] = [0x1000, 0x2000, 0x3000];
/// Resident memory a run may add.
const RSS_SLACK: u64 = 64 << 20;
/// Registries the dispatch cost is measured on, early and at the end.
const TIMED: usize = 1000;
/// Entry/exit pairs per timing.
const PAIRS: u64 = 1000;

/// The process's resident memory in bytes (`/proc/self/statm`).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: `sysconf` has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page as u64
}

/// Fails as soon as resident memory has grown past [`RSS_SLACK`] since
/// `start`, before a leak can exhaust the machine's memory.
fn check_rss(start: u64, registries: usize) {
    let now = rss();
    assert!(
        now <= start + RSS_SLACK,
        "resident memory grew by {:.1} MiB over {registries} registries",
        mib(now.saturating_sub(start))
    );
}

#[derive(Default)]
struct Counts {
    entries: AtomicU64,
    good: AtomicU64,
    bad: AtomicU64,
}

/// A probe with entry, exit and 8 bytes of data: the entry stores the
/// return address, the exit checks it and the address.
fn probe(c: &Arc<Counts>) -> Fprobe<()> {
    let (ce, cx) = (c.clone(), c.clone());
    Fprobe::builder()
        .data_size(8)
        .entry(move |e| {
            ce.entries.fetch_add(1, Ordering::Relaxed);
            e.data.copy_from_slice(&e.ret_addr.to_ne_bytes());
            EntryAction::Continue
        })
        .exit(move |x| {
            let good =
                x.data == x.ret_addr.to_ne_bytes() && x.addr == ADDRS[(x.ret_addr % 3) as usize];
            let n = if good { &cx.good } else { &cx.bad };
            n.fetch_add(1, Ordering::Relaxed);
        })
        .build()
}

/// One entry/exit pair of call number `i`.
#[inline(always)]
fn call(reg: &Registry<()>, i: u64) {
    reg.on_entry(ADDRS[(i % 3) as usize], i, &());
    reg.on_exit(i, &());
}

/// Creates a registry, dispatches `calls` pairs through it (timing
/// [`PAIRS`] more if `timed`: returns ns per pair), checks its counts and
/// drops it.
fn one_registry(c: &Arc<Counts>, calls: u64, timed: bool) -> Option<f64> {
    let reg = Registry::<()>::builder().build().unwrap();
    let h = reg.register(probe(c), &ADDRS).unwrap();
    for i in 0..calls {
        call(&reg, i);
    }
    let mut total = calls;
    let ns = timed.then(|| {
        let t = Instant::now();
        for i in 0..PAIRS {
            call(&reg, std::hint::black_box(i));
        }
        let ns = t.elapsed().as_nanos() as f64 / PAIRS as f64;
        total += PAIRS;
        ns
    });
    let s = reg.stats(h).unwrap();
    assert_eq!((s.hits, s.exits), (total, total), "{s:?}");
    assert_eq!(s.missed, Default::default());
    ns
}

/// The benchmark harness's statistics: one median for the repository.
#[path = "../bench/src/stats.rs"]
#[allow(dead_code)] // this includer uses `median` only
mod stats;

struct Run {
    rss_start: u64,
    rss_1000: u64,
    rss_end: u64,
    early_ns: Option<f64>,
    end_ns: Option<f64>,
}

/// `n` registries one after another on this thread, each dispatched
/// through and dropped; dispatch timed on registries `100..1100` and on
/// the last 1000 when `timing` (and `n` allows).
fn churn(n: usize, timing: bool) -> Run {
    let c = Arc::new(Counts::default());
    // The thread's first dispatch anywhere (thread-locals, RCU
    // registration) happens before the baseline.
    one_registry(&c, 10, false);
    let rss_start = rss();
    let mut rss_1000 = rss_start;
    let timing = timing && n >= 100 + 2 * TIMED;
    let (mut early, mut end) = (Vec::new(), Vec::new());
    let mut expected = 10;
    for i in 0..n {
        let in_early = timing && (100..100 + TIMED).contains(&i);
        let in_end = timing && i >= n - TIMED;
        let ns = one_registry(&c, 10, in_early || in_end);
        expected += 10;
        if let Some(ns) = ns {
            expected += PAIRS;
            if in_early { &mut early } else { &mut end }.push(ns);
        }
        if i + 1 == 1000 {
            rss_1000 = rss();
        }
        if i % 100 == 99 {
            check_rss(rss_start, i + 1);
        }
    }
    assert_eq!(c.entries.load(Ordering::Relaxed), expected);
    assert_eq!(c.bad.load(Ordering::Relaxed), 0, "exits with wrong data");
    assert_eq!(c.good.load(Ordering::Relaxed), expected);
    Run {
        rss_start,
        rss_1000,
        rss_end: rss(),
        early_ns: (!early.is_empty()).then(|| stats::median(&early)),
        end_ns: (!end.is_empty()).then(|| stats::median(&end)),
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

#[test]
#[ignore = "long: 100,000 registries; run in release with --ignored"]
fn many_registries_leave_no_memory_and_no_dispatch_cost() {
    let n = std::env::var("FPROBE_REGISTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let t = Instant::now();
    let run = churn(n, true);
    eprintln!(
        "{n} registries in {:?}: RSS {:.1} MiB at start, {:.1} MiB after 1000, {:.1} MiB at \
         the end; one entry+exit pair {:?} ns early, {:?} ns at the end",
        t.elapsed(),
        mib(run.rss_start),
        mib(run.rss_1000),
        mib(run.rss_end),
        run.early_ns,
        run.end_ns
    );
    assert!(
        run.rss_end <= run.rss_start + RSS_SLACK,
        "resident memory grew by {:.1} MiB over {n} registries",
        mib(run.rss_end.saturating_sub(run.rss_start))
    );
    if let (Some(early), Some(end)) = (run.early_ns, run.end_ns) {
        assert!(
            end <= 1.2 * early + 20.0,
            "dispatch cost grew with dead registries: {early:.1} ns early, {end:.1} ns at the end"
        );
    }
}

#[test]
#[cfg_attr(miri, ignore)] // thousands of registries
fn two_thousand_registries_dispatch_and_leave_little_memory() {
    let run = churn(2000, false);
    eprintln!(
        "2000 registries: RSS {:.1} MiB at start, {:.1} MiB after 1000, {:.1} MiB at the end",
        mib(run.rss_start),
        mib(run.rss_1000),
        mib(run.rss_end)
    );
    assert!(
        run.rss_end <= run.rss_start + RSS_SLACK,
        "resident memory grew by {:.1} MiB over 2000 registries",
        mib(run.rss_end.saturating_sub(run.rss_start))
    );
}

/// Threads dispatch through a registry, the registry is dropped while they
/// are alive (parked), and they dispatch through the next one: every
/// round's counts are exact.
#[test]
fn threads_outliving_registries_dispatch_through_the_next() {
    let threads = if cfg!(miri) { 2 } else { 4 };
    let rounds = if cfg!(miri) { 2 } else { 20 };
    let calls: u64 = if cfg!(miri) { 5 } else { 500 };
    let current: Arc<Mutex<Option<Arc<Registry<()>>>>> = Arc::new(Mutex::new(None));
    // Main and the threads meet twice a round: the registry is ready, and
    // the threads are done with it.
    let meet = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads as u64)
        .map(|t| {
            let (current, meet) = (current.clone(), meet.clone());
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    meet.wait();
                    let reg = current.lock().unwrap().clone().unwrap();
                    for i in 0..calls {
                        call(&reg, t * 1_000_000 + i);
                    }
                    drop(reg);
                    meet.wait();
                }
            })
        })
        .collect();
    for round in 0..rounds {
        let c = Arc::new(Counts::default());
        let reg = Arc::new(Registry::<()>::builder().build().unwrap());
        let h = reg.register(probe(&c), &ADDRS).unwrap();
        *current.lock().unwrap() = Some(reg.clone());
        meet.wait();
        meet.wait();
        let total = threads as u64 * calls;
        let s = reg.stats(h).unwrap();
        assert_eq!((s.hits, s.exits), (total, total), "round {round}: {s:?}");
        assert_eq!(s.missed, Default::default(), "round {round}");
        assert_eq!(c.entries.load(Ordering::Relaxed), total, "round {round}");
        assert_eq!(c.bad.load(Ordering::Relaxed), 0, "round {round}");
        assert_eq!(c.good.load(Ordering::Relaxed), total, "round {round}");
        // The last reference: dropped while every thread is alive.
        *current.lock().unwrap() = None;
        assert_eq!(Arc::strong_count(&reg), 1);
        drop(reg);
    }
    for w in workers {
        w.join().unwrap();
    }
}
