//! Where the RCU reclaimer runs: on the CPU of the thread that retired the
//! batch's last object, back on the process's CPUs when following is off,
//! and sent back there by a waiter when it stalls (`src/rcu/reclaim/mod.rs`,
//! module docs: placement).
//!
//! One test in its own binary: every retirement in the process steers the
//! reclaimer, so no other test may retire concurrently.

#![cfg(all(target_os = "linux", not(miri)))]

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use fprobe::rcu;

/// The CPUs the calling thread may run on.
fn own_cpus() -> Vec<usize> {
    core_affinity::get_core_ids()
        .expect("sched_getaffinity")
        .into_iter()
        .map(|c| c.id)
        .collect()
}

/// Confines the calling thread to `cpu`; whether the kernel allowed it.
fn pin_to(cpu: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
}

/// [`reclaimer_cpus_after_retiring_on`] until it reports `want`, at most
/// three times: a grace period that happened to take over 100 ms (a loaded
/// machine) suspends following for a second, so a miss waits that out.
fn reclaimer_reaches(cpu: usize, want: &[usize]) -> Vec<usize> {
    let mut got = Vec::new();
    for _ in 0..3 {
        got = reclaimer_cpus_after_retiring_on(cpu, Duration::ZERO);
        if got == want {
            break;
        }
        thread::sleep(Duration::from_millis(1100));
    }
    got
}

/// From a thread pinned to `cpu`: retires a callback that reports the CPUs
/// the reclaimer may run on while it runs the callback (after `delay`),
/// then waits for it with `barrier`.
fn reclaimer_cpus_after_retiring_on(cpu: usize, delay: Duration) -> Vec<usize> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        assert!(pin_to(cpu), "pinning to CPU {cpu}");
        rcu::call_rcu(move || {
            thread::sleep(delay);
            tx.send(own_cpus()).expect("receiver alive");
        });
        rcu::barrier();
    })
    .join()
    .expect("retiring thread");
    rx.recv().expect("the callback ran")
}

#[test]
fn reclaimer_follows_the_retiring_cpu() {
    let cpus = own_cpus();
    let second = cpus.get(1).copied();
    if second.is_none_or(|c| !thread::spawn(move || pin_to(c)).join().unwrap()) {
        eprintln!("skipped: needs two CPUs this process may pin threads to");
        return;
    }
    // Start the reclaimer from this (unpinned) thread: its home is `cpus`.
    rcu::retire(Box::new(0u8));
    rcu::barrier();

    for &c in cpus.iter().take(4).chain(cpus.iter().take(1)) {
        assert_eq!(
            reclaimer_reaches(c, &[c]),
            [c],
            "the reclaimer follows a retirer on CPU {c}"
        );
    }

    rcu::set_reclaimer_follows_retirer(false);
    assert_eq!(
        reclaimer_cpus_after_retiring_on(cpus[1], Duration::ZERO),
        cpus,
        "following off: the reclaimer goes back to every CPU it started with"
    );
    rcu::set_reclaimer_follows_retirer(true);
    assert_eq!(
        reclaimer_reaches(cpus[1], &[cpus[1]]),
        [cpus[1]],
        "following on again"
    );

    // The same stall with nobody waiting: a retirer that finds the queue's
    // oldest object 100 ms old sends the reclaimer home. The slow callback
    // reports where it may run 1.5 s in (the retirer's release comes at
    // about 0.3 s; the margin is for a loaded machine), before anyone calls
    // `barrier`.
    assert_eq!(reclaimer_reaches(cpus[0], &[cpus[0]]), [cpus[0]]);
    let (tx, rx) = mpsc::channel();
    let c = cpus[0];
    let seen = thread::spawn(move || {
        assert!(pin_to(c));
        rcu::call_rcu(move || {
            thread::sleep(Duration::from_millis(1500));
            tx.send(own_cpus()).expect("receiver alive");
        });
        // Wait until the reclaimer has taken that batch.
        let mut taken = false;
        for _ in 0..10_000 {
            if rcu::stats().pending == 0 {
                taken = true;
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
        assert!(taken, "the reclaimer took the slow callback's batch");
        rcu::retire(Box::new(1u8)); // the new queue's oldest object
        thread::sleep(Duration::from_millis(300));
        rcu::retire(Box::new(2u8)); // length 2: checks its age
        let seen = rx.recv().expect("the callback ran");
        rcu::barrier();
        seen
    })
    .join()
    .expect("retiring thread");
    assert_eq!(
        seen, cpus,
        "a retirer sends a stalled reclaimer back to every CPU it started with"
    );
    thread::sleep(Duration::from_millis(1100)); // the pause that release began

    // A batch that takes a second (a slow destructor, or a reclaimer
    // starved on the retirer's CPU): the waiting `barrier` sees no progress
    // for 100 ms and sends the reclaimer home while it is still in the
    // batch (a second leaves room for a throttled, loaded machine).
    assert_eq!(reclaimer_reaches(cpus[0], &[cpus[0]]), [cpus[0]]);
    assert_eq!(
        reclaimer_cpus_after_retiring_on(cpus[0], Duration::from_secs(1)),
        cpus,
        "a stalled reclaimer is sent back to every CPU it started with"
    );
}
