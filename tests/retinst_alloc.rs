//! Entry + return with instance reuse allocates nothing in the steady
//! state: checked with a counting global allocator (its own test binary, so
//! no other test allocates concurrently).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use fprobe::retinst::{ProbeRef, RetInstPool};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
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
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn entry_and_return_with_reuse_do_not_allocate() {
    const CALLS: usize = if cfg!(miri) { 100 } else { 100_000 };
    let pool = RetInstPool::builder()
        .instances(64)
        .data_size(32)
        .max_depth(16)
        .build()
        .unwrap();
    let mut stack = pool.register_thread();
    let probe = ProbeRef {
        slot: 3,
        generation: 1,
    };
    let one_round = |stack: &mut fprobe::retinst::ReturnStack, i: usize| {
        // A call tree of depth 3, as recursion would make.
        for d in 0..3u64 {
            stack.push(probe, d, 32).unwrap()[0] = i as u8;
        }
        for _ in 0..3 {
            let ri = stack.pop().unwrap();
            assert_eq!(ri.data()[0], i as u8);
        }
    };
    // Warm-up: registers with the RCU, fills this thread's LIFO.
    one_round(&mut stack, 0);

    COUNTING.store(true, Ordering::SeqCst);
    for i in 0..CALLS {
        one_round(&mut stack, i);
    }
    COUNTING.store(false, Ordering::SeqCst);

    assert_eq!(
        ALLOCS.load(Ordering::SeqCst),
        0,
        "allocations in the steady state"
    );
}
