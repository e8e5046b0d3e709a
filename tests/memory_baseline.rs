//! Memory returns to its baseline: a counting global allocator measures the
//! bytes live in the whole process before and after rounds of heavy use of
//! an `AddrIndex` (growing, shrinking, concurrent readers) and a probe
//! `Registry` (register / dispatch / unregister), each round ended by
//! `clear()` (or unregistering everything) and `rcu::barrier()`.
//!
//! One test in its own file: the allocator counts every thread of the test
//! binary, so nothing else may run beside it. `#[ignore]`d (it takes a few
//! seconds in release); `.ci/run` runs it:
//!
//! ```sh
//! cargo test --release --test memory_baseline -- --ignored
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

use fprobe::probe::{EntryAction, Fprobe, Registry};
use fprobe::{AddrIndex, rcu};

/// The system allocator, counting live bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to `System` unchanged; the counter is only
// arithmetic on the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Bytes of the mappings advised onto huge pages (`hg` in `VmFlags`): the
/// index's tables of 8 MiB and more, which bypass the global allocator
/// (`huge_pages`, on by default). Nothing else in this process advises
/// memory so. `None` where `/proc/self/smaps` or transparent huge pages
/// are missing.
fn mapped_tables() -> Option<usize> {
    std::fs::metadata("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let (mut total, mut size) = (0, 0);
    for line in smaps.lines() {
        if let Some(kb) = line.strip_prefix("Size:") {
            size = kb.trim().trim_end_matches(" kB").parse::<usize>().ok()? << 10;
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            if flags.split_whitespace().any(|f| f == "hg") {
                total += size;
            }
        }
    }
    Some(total)
}

/// Slack for allocations outside the crate's control that may come and go
/// between two measurements (libtest's output capture, thread names).
const SLACK: isize = 16 << 10;

/// Addresses of [`index_round`]: enough for an 8 MiB table (524,288
/// slots), the size from which tables are mapped onto huge pages.
const ROUND_ADDRS: u64 = 150_000;

/// One round on the index: grow to 300k values over 150k addresses with
/// two readers running, remove half one by one (copy-on-write), then
/// `clear()`.
fn index_round(index: &Arc<AddrIndex<Vec<u8>>>) -> isize {
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (index, stop) = (index.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for a in (r..ROUND_ADDRS).step_by(97) {
                        n += index.lookup(a, |v| v.len() as u64).unwrap_or(0);
                    }
                }
                n
            })
        })
        .collect();
    let mut ids = index
        .insert_many((0..2 * ROUND_ADDRS).map(|i| (i % ROUND_ADDRS, vec![i as u8; 24])))
        .unwrap();
    let peak = live();
    if let Some(mapped) = mapped_tables() {
        assert!(
            mapped >= 8 << 20,
            "the 150k-address table is mapped: {mapped} B"
        );
    }
    for (i, id) in ids.drain(..).enumerate().step_by(2) {
        index.remove(i as u64 % ROUND_ADDRS, id).unwrap();
    }
    index.clear();
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    rcu::barrier();
    peak
}

/// One round on the registry: 32 probes on 4096 addresses, calls on two
/// threads, then every probe unregistered.
fn probe_round(reg: &Arc<Registry<()>>) -> isize {
    let handles: Vec<_> = (0..32u64)
        .map(|p| {
            let probe = Fprobe::builder()
                .data_size(16)
                .entry(|_| EntryAction::Continue)
                .exit(|_| {})
                .build();
            let addrs: Vec<u64> = (0..128).map(|i| 0x1000 + (p * 128 + i) * 16).collect();
            reg.register(probe, &addrs).unwrap()
        })
        .collect();
    // Both callers hold their per-thread state at once in every round (the
    // registry keeps one state per thread index, the lowest free index is
    // handed out first): the states the warm-up made are the ones reused.
    let both = Arc::new(std::sync::Barrier::new(2));
    let callers: Vec<_> = (0..2)
        .map(|_| {
            let (reg, both) = (reg.clone(), both.clone());
            std::thread::spawn(move || {
                reg.on_entry(0x1000, 0, &());
                reg.on_exit(0, &());
                both.wait();
                for i in 0..20_000u64 {
                    reg.on_entry(0x1000 + (i % 4096) * 16, 0, &());
                    reg.on_exit(0, &());
                }
            })
        })
        .collect();
    for c in callers {
        c.join().unwrap();
    }
    let peak = live();
    for h in handles {
        reg.unregister(h).unwrap();
    }
    rcu::barrier();
    peak
}

/// The message of [`panicking_destructors_round`]'s panics.
const BOMB: &str = "a value's destructor panics";

/// Values whose destructors panic (on the reclaimer, which catches and
/// reports it): the records that held them are freed all the same, whether
/// retired one by one (`remove`) or with their table (`clear`). Returns the
/// bytes still live above what the empty index held.
fn panicking_destructors_round() -> isize {
    #[derive(Clone)]
    struct Bomb(#[allow(dead_code)] Vec<u8>);
    impl Drop for Bomb {
        fn drop(&mut self) {
            std::panic::panic_any(BOMB);
        }
    }
    let index: AddrIndex<Bomb> = AddrIndex::builder().huge_pages(false).build().unwrap();
    let before = live();
    let ids: Vec<_> = (0..8_000u64)
        .map(|a| index.insert(a, Bomb(vec![1; 16])).ok().unwrap())
        .collect();
    for (a, id) in ids.into_iter().enumerate().step_by(2) {
        index.remove(a as u64, id).unwrap();
    }
    index.clear();
    rcu::barrier();
    let left = live() - before;
    // The index is empty: dropping it runs no value destructor.
    drop(index);
    left
}

#[test]
#[ignore = "counting allocator; run by .ci/run in release"]
fn memory_returns_to_baseline_after_clear_and_barrier() {
    let index: Arc<AddrIndex<Vec<u8>>> = Arc::new(AddrIndex::builder().build().unwrap());
    let reg = Arc::new(Registry::<()>::builder().build().unwrap());
    // Warm-up round: the RCU's reclaimer thread, this thread's records and
    // the registry's per-thread state are allocated once and kept.
    index_round(&index);
    probe_round(&reg);
    let baseline = live();
    let mapped_baseline = mapped_tables();
    for round in 0..3 {
        let peak = index_round(&index);
        let after = live();
        println!("index round {round}: baseline {baseline} B, peak {peak} B, after {after} B");
        assert_eq!(
            mapped_tables(),
            mapped_baseline,
            "index: mapped tables still live after clear() + rcu::barrier()"
        );
        assert!(
            peak > baseline + (1 << 20),
            "the round allocated little: {peak}"
        );
        assert!(
            after <= baseline + SLACK,
            "index: {} bytes still live after clear() + rcu::barrier()",
            after - baseline
        );
        let peak = probe_round(&reg);
        let after = live();
        println!("probe round {round}: baseline {baseline} B, peak {peak} B, after {after} B");
        assert!(
            after <= baseline + SLACK,
            "registry: {} bytes still live after unregister + rcu::barrier()",
            after - baseline
        );
    }
    drop(index);
    drop(reg);
    rcu::barrier();
    println!("after dropping both: {} B live", live());

    // Panicking destructors leak no record (run twice: the first panic's
    // report may allocate once). Their 16,000 panic messages are kept off
    // the output.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<&str>() != Some(&BOMB) {
            default_hook(info);
        }
    }));
    panicking_destructors_round();
    let left = panicking_destructors_round();
    println!("panicking destructors: {left} B left above the empty index");
    assert!(
        left <= SLACK,
        "records of values whose destructor panicked were not freed: {left} B"
    );

    // Mapped tables give back all of their address space, trimmed ends
    // included: 128 indexes presized for 150,000 addresses (an 8 MiB table
    // each, its own mapping with one small page of tail) built and dropped.
    // A table that kept one page mapped would add 512 KiB here; one whose
    // over-mapping was not trimmed, 256 MiB.
    if let Some(vm0) = vm_size() {
        for a in 0..128u64 {
            let index = AddrIndex::<u64>::with_capacity(ROUND_ADDRS as usize);
            index.insert(a, a).unwrap();
        }
        rcu::barrier();
        let vm1 = vm_size().expect("read before");
        println!("VmSize before {vm0} B, after 128 mapped tables {vm1} B");
        assert!(
            vm1 <= vm0 + (256 << 10),
            "address space grew by {} B over 128 dropped tables",
            vm1 - vm0
        );
    }
}

/// The process's virtual size (`VmSize` in `/proc/self/status`), bytes.
fn vm_size() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmSize:"))?;
    Some(kb.trim().trim_end_matches(" kB").parse::<usize>().ok()? << 10)
}
