//! A patched program from start to end: C functions compiled with
//! `-fpatchable-function-entry=7,5` (`c/targets.c`, built by this crate's
//! `build.rs` with the `cc` crate, as any Rust program links C code), a
//! probe attached to one of them while the program runs, called, then
//! detached.
//!
//! `cargo run --release -p fprobe-patch-ctest --example quickstart`

use fprobe::probe::{EntryAction, Fprobe};
use fprobe_patch_ctest::{addr, pt_add};

fn main() -> Result<(), fprobe_patch::Error> {
    // The patchable functions of the process (the executable and its
    // shared objects); `pt_add` is one of them.
    let sites = fprobe_patch::sites()?;
    let add = addr("pt_add");
    assert!(
        sites.iter().any(|s| s.function == add),
        "pt_add is patchable"
    );
    println!("{} patchable functions; attaching to pt_add", sites.len());

    let probe = Fprobe::<fprobe_patch::Regs>::builder()
        .data_size(8)
        .entry(|e| {
            // The first argument, kept for the exit handler.
            e.data.copy_from_slice(&e.ctx.arg(0).to_ne_bytes());
            EntryAction::Continue
        })
        .exit(|x| {
            let a = u64::from_ne_bytes(x.data.try_into().unwrap());
            println!("  pt_add({a}, ...) returned {}", x.ctx.ret());
        })
        .build();
    let attached = fprobe_patch::attach(probe, &[add])?;
    let mut sum = 0;
    for i in 0..3 {
        // SAFETY: a plain C function of this crate.
        sum += unsafe { pt_add(i, 10) };
    }
    let stats = attached.stats();
    println!(
        "sum {sum}; probe: {} hits, {} exits",
        stats.hits, stats.exits
    );
    assert_eq!((stats.hits, stats.exits), (3, 3));
    fprobe_patch::detach(attached)?;
    // Detached: the function runs its two nops again, and no probe.
    // SAFETY: as above.
    assert_eq!(unsafe { pt_add(1, 2) }, 3);
    println!("detached");
    Ok(())
}
