//! Tests of return instances: the shadow stack, misses by cause, and reuse
//! against a concurrent `expire` scanner.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fprobe::retinst::{ProbeRef, PushMiss, RetInstPool};

const N: usize = if cfg!(miri) { 50 } else { 300_000 };
/// Minimum running time of the scanner stress test (not under miri).
const STRESS_TIME: std::time::Duration =
    std::time::Duration::from_millis(if cfg!(miri) { 0 } else { 500 });

fn probe(id: u64) -> ProbeRef {
    ProbeRef {
        slot: id,
        generation: id * 10,
    }
}

#[test]
fn lifo_order_fields_and_data() {
    let pool = RetInstPool::builder()
        .instances(8)
        .data_size(8)
        .max_depth(4)
        .build()
        .unwrap();
    let mut stack = pool.register_thread();
    for i in 0..4u64 {
        stack
            .push(probe(i), 0x1000 + i, 8)
            .unwrap()
            .copy_from_slice(&i.to_le_bytes());
    }
    assert_eq!(stack.depth(), 4);
    for i in (0..4u64).rev() {
        let ri = stack.pop().unwrap();
        assert_eq!(ri.probe(), probe(i));
        assert_eq!(ri.addr(), 0x1000 + i);
        assert_eq!(ri.data(), i.to_le_bytes());
        assert!(!ri.is_expired());
    }
    assert!(stack.pop().is_none());
}

#[test]
fn misses_by_cause() {
    let pool = RetInstPool::builder()
        .instances(3)
        .max_depth(2)
        .build()
        .unwrap();
    let mut a = pool.register_thread();
    let mut b = pool.register_thread();
    a.push(probe(1), 0, 0).unwrap();
    a.push(probe(1), 0, 0).unwrap();
    assert_eq!(a.push(probe(1), 0, 0), Err(PushMiss::DepthOverflow));
    b.push(probe(2), 0, 0).unwrap();
    assert_eq!(b.push(probe(2), 0, 0), Err(PushMiss::PoolExhausted));
    let s = pool.stats();
    assert_eq!((s.missed_depth, s.missed_exhausted, s.threads), (1, 1, 2));
    assert!(!PushMiss::PoolExhausted.to_string().is_empty());
    // Dropping a stack with instances in flight gives them back.
    drop(a);
    assert_eq!(pool.stats().threads, 1);
    b.push(probe(2), 0, 0).unwrap();
    b.push(probe(2), 0, 0).unwrap_err(); // depth 2 reached
}

#[test]
fn finished_instances_are_reused_locally() {
    let pool = RetInstPool::builder().instances(1).build().unwrap();
    let mut stack = pool.register_thread();
    for i in 0..100 {
        stack.push(probe(i), i, 0).unwrap();
        assert_eq!(stack.pop().unwrap().addr(), i);
    }
    // The single instance sits on this thread's LIFO: another thread gets none.
    let other = pool.clone();
    std::thread::spawn(move || {
        let mut s = other.register_thread();
        assert_eq!(s.push(probe(1), 0, 0), Err(PushMiss::PoolExhausted));
    })
    .join()
    .unwrap();
    // Once this thread's stack is gone, the instance is back in the pool.
    drop(stack);
    let mut s = pool.register_thread();
    s.push(probe(1), 0, 0).unwrap();
}

#[test]
fn expire_marks_in_flight_instances_of_one_probe() {
    let pool = RetInstPool::builder().build().unwrap();
    let mut stack = pool.register_thread();
    stack.push(probe(1), 1, 0).unwrap();
    stack.push(probe(2), 2, 0).unwrap();
    stack.push(probe(1), 3, 0).unwrap();
    assert_eq!(pool.expire(1), 2);
    assert_eq!(pool.expire(3), 0);
    assert!(stack.pop().unwrap().is_expired());
    assert!(!stack.pop().unwrap().is_expired());
    assert!(stack.pop().unwrap().is_expired());
    // A reused instance starts unexpired.
    stack.push(probe(1), 4, 0).unwrap();
    assert!(!stack.pop().unwrap().is_expired());
    assert_eq!(pool.stats().scans, 2);
}

#[test]
#[should_panic(expected = "exceeds the pool's data_size")]
fn oversized_data_panics() {
    let pool = RetInstPool::builder().data_size(4).build().unwrap();
    let _ = pool.register_thread().push(probe(1), 0, 5);
}

/// Sets the flag when dropped, so that a panicking worker stops the scanner.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Threads push and pop nested instances of many probes while a scanner
/// expires probe `TARGET` over and over. If a finished instance were reused
/// while the scanner could still read it, the scanner would mark the reused
/// instance (now of another probe) expired; the exit side checks that an
/// expired instance always belongs to `TARGET`.
///
/// While a scan runs, finished instances cannot be reused, so with scans
/// back to back the pool may run dry: such pushes miss (and are not popped).
#[test]
fn reuse_is_safe_against_a_concurrent_scanner() {
    const TARGET: u64 = 1;
    let pool = RetInstPool::builder()
        .instances(256)
        .max_depth(8)
        .data_size(8)
        .build()
        .unwrap();
    let stop = AtomicBool::new(false);
    let expired_seen = AtomicU64::new(0);
    let exhausted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (pool, stop, seen, exhausted) = (&pool, &stop, &expired_seen, &exhausted);
            s.spawn(move || {
                let _stop = SetOnDrop(stop);
                let mut stack = pool.register_thread();
                let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let start = std::time::Instant::now();
                let mut i = 0u64;
                while i < N as u64 || start.elapsed() < STRESS_TIME {
                    i += 1;
                    // Alternate the target probe with others, at depth 1..=3.
                    let mut pushed = 0;
                    for d in 0..1 + i % 3 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let id = if x % 2 == 0 { TARGET } else { 2 + x % 5 };
                        match stack.push(probe(id), d, 8) {
                            Ok(data) => {
                                data.copy_from_slice(&id.to_le_bytes());
                                pushed += 1;
                            }
                            Err(PushMiss::PoolExhausted) => {
                                exhausted.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => panic!("unexpected miss {e}"),
                        }
                    }
                    for _ in 0..pushed {
                        let ri = stack.pop().unwrap();
                        let id = u64::from_le_bytes(ri.data().try_into().unwrap());
                        assert_eq!(ri.probe(), probe(id));
                        if ri.is_expired() {
                            assert_eq!(id, TARGET, "an instance of probe {id} was expired");
                            seen.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    assert!(stack.pop().is_none());
                }
            });
        }
        let (pool, stop) = (&pool, &stop);
        s.spawn(move || {
            let mut spins = 1u32;
            while !stop.load(Ordering::Relaxed) {
                pool.expire(TARGET);
                // Leave gaps of varying length between scans, so that
                // instances are also reused (fast path) in between.
                spins = spins.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                for _ in 0..spins % 4096 {
                    std::hint::spin_loop();
                }
            }
        });
    });
    let stats = pool.stats();
    assert_eq!(stats.missed_depth, 0);
    assert_eq!(stats.missed_exhausted, exhausted.load(Ordering::Relaxed));
    assert!(stats.scans > 0);
    eprintln!(
        "scans: {}, expired instances seen: {}, pushes missed (exhausted): {}",
        stats.scans,
        expired_seen.load(Ordering::Relaxed),
        stats.missed_exhausted
    );
}

/// Deterministic check of the reuse rule: an instance finished while a scan
/// runs is not reused until the scan ends. The scan is held open by an RCU
/// read-side section of a helper thread (its grace period cannot end), and
/// the instance is recognised by a marker left in its data area (white-box:
/// the data area is not cleared on reuse).
///
/// The section must not be this thread's own: an unlink nested in a section
/// that began before the scan's grace period is one the scan *waits for*,
/// and the protocol then rightly lets it reuse the instance.
#[test]
fn instance_finished_during_a_scan_is_not_reused() {
    let pool = RetInstPool::builder()
        .instances(2)
        .data_size(1)
        .build()
        .unwrap();
    let mut stack = pool.register_thread();
    stack.push(probe(1), 0, 1).unwrap()[0] = 0xAA;
    drop(stack.pop()); // on this thread's LIFO

    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let guard = fprobe::rcu::read_lock();
        ready_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        drop(guard);
    });
    ready_rx.recv().unwrap();
    let scanner = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.expire(7))
    };
    // Give the scanner time to start its scan; it then waits for the holder.
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(pool.stats().scans, 0, "the scan must still be running");

    // Finished before the scan began: reused at once.
    let data = stack.push(probe(2), 0, 1).unwrap();
    assert_eq!(data[0], 0xAA, "the LIFO instance is reused");
    data[0] = 0xBB;
    // Finished during the scan: must not be reused while it runs.
    drop(stack.pop());
    let data = stack.push(probe(3), 0, 1).unwrap();
    assert_ne!(
        data[0], 0xBB,
        "an instance finished during a scan was reused"
    );
    drop(stack.pop());

    go_tx.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(scanner.join().unwrap(), 0);
    assert_eq!(pool.stats().scans, 1);
    // The scan gave the orphan back: both instances are available again.
    stack.push(probe(4), 0, 1).unwrap();
    stack.push(probe(4), 0, 1).unwrap();
}
