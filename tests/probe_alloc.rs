//! Probe dispatch (entry, and entry + exit) allocates nothing on the hit
//! path in the steady state: checked with a counting global allocator (its
//! own test binary, so no other test allocates concurrently).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use fprobe::probe::{EntryAction, Fprobe, Registry};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);

std::thread_local! {
    /// Only the dispatching thread's allocations count (the RCU reclaimer
    /// thread may start at any time and allocates while it does).
    static THIS_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn counting() -> bool {
    COUNTING.load(Ordering::Relaxed) && THIS_THREAD.try_with(|t| t.get()).unwrap_or(false)
}
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counting() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if counting() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn dispatch_does_not_allocate() {
    const CALLS: u64 = if cfg!(miri) { 50 } else { 100_000 };
    let reg = Registry::<u64>::builder()
        .capacity(if cfg!(miri) { 100 } else { 50_000 })
        .build()
        .unwrap();
    let exits = Arc::new(AtomicU64::new(0));
    let e2 = exits.clone();
    // An empty probe on 50,000 addresses plus a counting entry+exit probe
    // on the hot one (kretprobe-multi-all).
    let addrs: Vec<u64> = (0..if cfg!(miri) { 100 } else { 50_000u64 })
        .map(|i| 0x40_0000 + i * 32)
        .collect();
    reg.register(
        Fprobe::builder().entry(|_| EntryAction::Continue).build(),
        &addrs,
    )
    .unwrap();
    reg.register(
        Fprobe::builder()
            .data_size(8)
            .entry(|e| {
                e.data.copy_from_slice(&e.addr.to_ne_bytes());
                EntryAction::Continue
            })
            .exit(move |x| {
                assert_eq!(x.data, x.addr.to_ne_bytes());
                e2.fetch_add(1, Ordering::Relaxed);
            })
            .build(),
        &[addrs[7]],
    )
    .unwrap();
    let hot = addrs[7];
    // Warm up: thread registration (RCU record, dispatch state, return
    // stack) allocates once per thread.
    for _ in 0..100 {
        reg.on_entry(hot, 0, &1);
        reg.on_exit(0, &1);
        reg.on_entry(addrs[9], 0, &1);
        reg.on_exit(0, &1);
    }
    let mut expected = 100;
    THIS_THREAD.with(|t| t.set(true));
    COUNTING.store(true, Ordering::SeqCst);
    for i in 0..CALLS {
        let other = addrs[(i as usize * 7919) % addrs.len()];
        expected += 1 + u64::from(other == hot);
        reg.on_entry(hot, i, &i);
        reg.on_entry(other, 0, &i);
        reg.on_exit(0, &i);
        reg.on_exit(i, &i);
    }
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(
        ALLOCS.load(Ordering::SeqCst),
        0,
        "allocations on the hit path"
    );
    assert_eq!(exits.load(Ordering::Relaxed), expected);
}
