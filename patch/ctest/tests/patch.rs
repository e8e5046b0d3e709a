//! The patching runtime on real code: C functions compiled with
//! `-fpatchable-function-entry=7,5`, attached and detached while called.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use fprobe::probe::{EntryAction, Fprobe};
use fprobe_patch::{
    Error, Layout, RegisterSave, Regs, attach, detach, detach_draining, register_save,
};
use fprobe_patch_ctest::*;

/// The runtime is process-wide: tests attach one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|p| p.into_inner())
}

/// The seven bytes from five before `f`.
fn bytes(f: u64) -> [u8; 7] {
    // SAFETY: a function of this binary, with its 5 + 2 nops around it.
    unsafe { ((f - 5) as *const [u8; 7]).read() }
}

fn counting(n: &Arc<AtomicU64>) -> Fprobe<Regs> {
    let n = n.clone();
    Fprobe::<Regs>::builder()
        .entry(move |_| {
            n.fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .build()
}

#[test]
fn sites_lists_the_c_functions_with_their_layouts() {
    let sites = fprobe_patch::sites().unwrap();
    for name in ["pt_add", "pt_fib", "pt_va", "pt_deep"] {
        let s = sites
            .iter()
            .find(|s| s.function == addr(name))
            .unwrap_or_else(|| panic!("{name} not listed"));
        assert_eq!(s.name.as_deref(), Some(name));
        assert_eq!(s.layout, Layout::HotPatch, "{name}");
        assert_eq!(s.site, s.function - 5);
    }
    let other = sites
        .iter()
        .find(|s| s.function == addr("pt_other_layout"))
        .expect("listed");
    assert_eq!(other.layout, Layout::Other { before: 1, at: 2 });
}

#[test]
fn an_entry_probe_sees_every_call_and_its_arguments_until_detached() {
    let _s = serial();
    let f = addr("pt_sum6");
    let original = bytes(f);
    assert_eq!(original, [0x90; 7]);
    let calls = Arc::new(AtomicU64::new(0));
    let wrong = Arc::new(AtomicU64::new(0));
    let (c, w) = (calls.clone(), wrong.clone());
    let probe = Fprobe::<Regs>::builder()
        .entry(move |e| {
            let a: Vec<u64> = (0..6).map(|i| e.ctx.arg(i)).collect();
            let i = a[0];
            if a != [i, i + 1, i + 2, i + 3, i + 4, i + 5] || e.addr != addr("pt_sum6") {
                w.fetch_add(1, Ordering::Relaxed);
            }
            c.fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .build();
    let sum = |i: i64| unsafe { pt_sum6(i, i + 1, i + 2, i + 3, i + 4, i + 5) };
    let expect = |i: i64| i + 2 * (i + 1) + 3 * (i + 2) + 4 * (i + 3) + 5 * (i + 4) + 6 * (i + 5);
    let a = attach(probe, &[f]).unwrap();
    assert_eq!(
        &bytes(f)[5..],
        &[0xeb, 0xf9],
        "entry jumps back to the prefix"
    );
    assert_eq!(bytes(f)[0], 0xe9, "prefix jumps to the stub");
    for i in 0..1000 {
        assert_eq!(sum(black_box(i)), expect(i));
    }
    assert_eq!(calls.load(Ordering::Relaxed), 1000);
    assert_eq!(wrong.load(Ordering::Relaxed), 0);
    assert_eq!(a.stats().hits, 1000);
    detach(a).unwrap();
    assert_eq!(&bytes(f)[5..], &[0x90, 0x90], "entry nops restored");
    for i in 0..100 {
        assert_eq!(sum(black_box(i)), expect(i));
    }
    assert_eq!(calls.load(Ordering::Relaxed), 1000);
}

#[test]
fn exit_probes_see_return_values_and_the_entry_data() {
    let _s = serial();
    let seen = Arc::new(Mutex::new(Vec::<(u64, u64, u64, f64)>::new()));
    let bad_data = Arc::new(AtomicU64::new(0));
    let (s, b) = (seen.clone(), bad_data.clone());
    let probe = Fprobe::<Regs>::builder()
        .data_size(8)
        .entry(|e| {
            e.data.copy_from_slice(&e.ctx.arg(0).to_ne_bytes());
            EntryAction::Continue
        })
        .exit(move |x| {
            s.lock()
                .unwrap()
                .push((x.addr, x.ctx.ret(), x.ctx.ret2(), x.ctx.float_ret()));
            if x.data.len() != 8 {
                b.fetch_add(1, Ordering::Relaxed);
            }
        })
        .build();
    let fs = [
        addr("pt_add"),
        addr("pt_fadd"),
        addr("pt_pair"),
        addr("pt_mix"),
    ];
    let a = attach(probe, &fs).unwrap();
    let r_add = unsafe { pt_add(black_box(40), 2) };
    let r_fadd = unsafe { pt_fadd(black_box(1.5), 2.25) };
    let r_pair = unsafe { pt_pair(black_box(10)) };
    let r_mix = unsafe { pt_mix(black_box(2), 0.5, 3, 0.25) };
    detach(a).unwrap();
    assert_eq!(r_add, 42);
    assert_eq!(r_fadd, 3.75);
    assert_eq!(r_pair, Pair { lo: 11, hi: 20 });
    assert_eq!(r_mix, 1.75);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4);
    assert_eq!((seen[0].0, seen[0].1 as u32), (addr("pt_add"), 42));
    assert_eq!((seen[1].0, seen[1].3), (addr("pt_fadd"), 3.75));
    assert_eq!((seen[2].0, seen[2].1, seen[2].2), (addr("pt_pair"), 11, 20));
    assert_eq!((seen[3].0, seen[3].3), (addr("pt_mix"), 1.75));
    assert_eq!(bad_data.load(Ordering::Relaxed), 0);
}

#[test]
fn recursive_and_variadic_functions_keep_their_results_and_pairing() {
    let _s = serial();
    let probe = Fprobe::<Regs>::builder()
        .data_size(8)
        .entry(|e| {
            e.data.copy_from_slice(&e.ctx.arg(0).to_ne_bytes());
            EntryAction::Continue
        })
        .exit(|x| {
            // fib(n) for small n, checked against the argument kept.
            let n = u64::from_ne_bytes(x.data.try_into().unwrap());
            if x.addr == addr("pt_fib") && n == 10 {
                assert_eq!(x.ctx.ret(), 55);
            }
        })
        .build();
    let a = attach(probe, &[addr("pt_fib"), addr("pt_va")]).unwrap();
    // SAFETY: tests run serially; C reads and writes it on this thread only.
    let calls_before = unsafe { pt_fib_calls };
    assert_eq!(unsafe { pt_fib(black_box(20)) }, 6765);
    let calls = unsafe { pt_fib_calls } - calls_before;
    assert_eq!(unsafe { pt_va(black_box(3), 1.0f64, 2.5f64, 4.0f64) }, 7.5);
    let st = a.stats();
    assert!(calls > 1000, "{calls}");
    assert_eq!(st.hits, calls as u64 + 1);
    assert_eq!(st.exits, st.hits);
    assert_eq!(st.panics, 0);
    detach(a).unwrap();
}

#[test]
fn longjmp_over_hooked_frames_recovers_the_pairing() {
    let _s = serial();
    let exits = Arc::new(AtomicU64::new(0));
    let e2 = exits.clone();
    let probe = Fprobe::<Regs>::builder()
        .exit(move |_| {
            e2.fetch_add(1, Ordering::Relaxed);
        })
        .build();
    let a = attach(probe, &[addr("pt_deep"), addr("pt_jumper")]).unwrap();
    for _ in 0..100 {
        // pt_jumper → pt_deep ×11 → longjmp back into pt_jumper, which
        // returns: its exit ends the 11 skipped calls as unwound (their
        // exit handlers do not run), then runs its own.
        assert_eq!(unsafe { pt_jumper(black_box(10)) }, 7);
    }
    let st = a.stats();
    assert_eq!(st.hits, 100 * 12);
    assert_eq!(st.exits, 100);
    assert_eq!(st.missed.unwound, 1100);
    assert_eq!(st.in_flight, 0);
    assert_eq!(exits.load(Ordering::Relaxed), 100);
    detach(a).unwrap();
}

#[test]
fn bad_targets_are_refused_and_change_nothing() {
    let _s = serial();
    let n = Arc::new(AtomicU64::new(0));
    let before = bytes(addr("pt_add"));
    let main_fn = main_like as *const () as u64;
    assert!(matches!(
        attach(counting(&n), &[addr("pt_add"), main_fn]),
        Err(Error::NotASite(f)) if f == main_fn
    ));
    assert!(matches!(
        attach(counting(&n), &[addr("pt_add"), addr("pt_other_layout")]),
        Err(Error::UnsupportedLayout { .. })
    ));
    assert_eq!(bytes(addr("pt_add")), before);
    assert_eq!(fprobe_patch::registry().addresses(), 0);
    assert_eq!(unsafe { pt_other_layout(3) }, 15);
    // Preparing checks the same, and patches nothing either way.
    assert!(matches!(
        fprobe_patch::prepare(&[addr("pt_add"), main_fn]),
        Err(Error::NotASite(f)) if f == main_fn
    ));
    fprobe_patch::prepare(&[addr("pt_add"), addr("pt_fadd")]).unwrap();
    assert_eq!(bytes(addr("pt_add")), before);
    assert_eq!(fprobe_patch::registry().addresses(), 0);
    let a = attach(counting(&n), &[addr("pt_add")]).unwrap();
    assert_eq!(unsafe { pt_add(2, 3) }, 5);
    detach(a).unwrap();
    assert_eq!(n.load(Ordering::Relaxed), 1);
}

#[inline(never)]
fn main_like() -> u64 {
    black_box(1)
}

#[test]
fn two_probes_share_a_site_and_it_stays_patched_until_both_detach() {
    let _s = serial();
    let f = addr("pt_add");
    let (n1, n2) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let a1 = attach(counting(&n1), &[f]).unwrap();
    let a2 = attach(counting(&n2), &[f]).unwrap();
    unsafe { pt_add(1, 2) };
    detach(a1).unwrap();
    assert_eq!(&bytes(f)[5..], &[0xeb, 0xf9]);
    unsafe { pt_add(1, 2) };
    detach(a2).unwrap();
    assert_eq!(&bytes(f)[5..], &[0x90, 0x90]);
    assert_eq!(
        (n1.load(Ordering::Relaxed), n2.load(Ordering::Relaxed)),
        (1, 2)
    );
}

#[test]
fn attach_and_detach_while_two_threads_call_flat_out() {
    let _s = serial();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut rounds = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Σ (i + 1) for i < 1000.
                    assert_eq!(unsafe { pt_loop(black_box(1000)) }, 500_500);
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    let fs = [addr("pt_loop"), addr("pt_add")];
    let windows = if cfg!(debug_assertions) { 50 } else { 300 };
    // A failed check stops the workers first, so that they do not go on
    // calling into the next tests' probes.
    let check = |ok: bool, what: String| {
        if !ok {
            stop.store(true, Ordering::Relaxed);
            panic!("{what}");
        }
    };
    for w in 0..windows {
        let (entries, exits) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (e2, x2) = (entries.clone(), exits.clone());
        let probe = Fprobe::<Regs>::builder()
            .data_size(8)
            .entry(move |e| {
                e.data.copy_from_slice(&e.addr.to_ne_bytes());
                e2.fetch_add(1, Ordering::Relaxed);
                EntryAction::Continue
            })
            .exit(move |x| {
                if x.data == x.addr.to_ne_bytes() {
                    x2.fetch_add(1, Ordering::Relaxed);
                }
            })
            .build();
        let a = attach(probe, &fs).unwrap();
        std::thread::sleep(std::time::Duration::from_micros(200));
        // Every other window drains: then every entry has its exit.
        let drain = w % 2 == 1;
        if drain {
            let left = detach_draining(a, std::time::Duration::from_secs(60)).unwrap();
            check(
                left == 0,
                format!("window {w}: {left} calls left in flight"),
            );
        } else {
            detach(a).unwrap();
        }
        // No handler runs after detach: the counts are final.
        let (e, x) = (
            entries.load(Ordering::Relaxed),
            exits.load(Ordering::Relaxed),
        );
        // Without a drain, the calls in flight at the detach have no exit:
        // at most one per worker per function.
        let open = if drain { 0 } else { 2 * 2 };
        check(
            x <= e && e - x <= open,
            format!("window {w}: {e} entries, {x} exits with their data, drained: {drain}"),
        );
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        assert!(w.join().unwrap() > 0);
    }
    for f in fs {
        assert_eq!(&bytes(f)[5..], &[0x90, 0x90]);
    }
}

/// Calls `pt_add(a, b)` with the stack 8 bytes off the ABI's alignment, as
/// GCC calls static functions that need no alignment
/// (`-fipa-stack-alignment`).
fn pt_add_misaligned(a: i32, b: i32) -> i32 {
    let r: i32;
    // SAFETY: skips the red zone, keeps rsp in r12 (callee-saved) and
    // restores it; the call clobbers what the C ABI lets it clobber.
    unsafe {
        std::arch::asm!(
            "sub rsp, 128",
            "push r12",
            "mov r12, rsp",
            "and rsp, -16",
            "sub rsp, 8",
            "call {f}",
            "mov rsp, r12",
            "pop r12",
            "add rsp, 128",
            f = in(reg) addr("pt_add"),
            in("edi") a,
            in("esi") b,
            lateout("eax") r,
            clobber_abi("C"),
        );
    }
    r
}

#[test]
fn a_function_entered_with_the_stack_misaligned_is_probed_and_returns() {
    let _s = serial();
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    let probe = Fprobe::<Regs>::builder()
        .data_size(8)
        .entry(|e| {
            e.data.copy_from_slice(&e.ctx.arg(1).to_ne_bytes());
            EntryAction::Continue
        })
        .exit(move |x| {
            s.fetch_add(x.ctx.ret() & 0xffff_ffff, Ordering::Relaxed);
        })
        .build();
    let a = attach(probe, &[addr("pt_add")]).unwrap();
    assert_eq!(pt_add_misaligned(30, 12), 42);
    assert_eq!(unsafe { pt_add(1, 1) }, 2);
    detach(a).unwrap();
    assert_eq!(seen.load(Ordering::Relaxed), 44);
}

#[test]
fn threads_started_after_attach_are_probed() {
    let _s = serial();
    let n = Arc::new(AtomicU64::new(0));
    let a = attach(counting(&n), &[addr("pt_add")]).unwrap();
    let ts: Vec<_> = (0..3)
        .map(|_| std::thread::spawn(|| (0..100).map(|i| unsafe { pt_add(i, 1) }).sum::<i32>()))
        .collect();
    for t in ts {
        assert_eq!(t.join().unwrap(), 5050);
    }
    detach(a).unwrap();
    assert_eq!(n.load(Ordering::Relaxed), 300);
}

#[test]
fn a_forked_child_runs_the_attached_probes() {
    let _s = serial();
    let n = Arc::new(AtomicU64::new(0));
    let exits = Arc::new(AtomicU64::new(0));
    let (n2, e2) = (n.clone(), exits.clone());
    let probe = Fprobe::<Regs>::builder()
        .entry(move |_| {
            n2.fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .exit(move |_| {
            e2.fetch_add(1, Ordering::Relaxed);
        })
        .build();
    fprobe_patch::prepare_thread();
    let a = attach(probe, &[addr("pt_add"), addr("pt_fib")]).unwrap();
    // SAFETY: the child only calls the C functions, whose probes touch
    // atomics, and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let ok = unsafe { pt_add(2, 3) } == 5
            && unsafe { pt_fib(10) } == 55
            && n.load(Ordering::Relaxed) == 1 + 177
            && exits.load(Ordering::Relaxed) == 1 + 177;
        // SAFETY: leaves the child without running the parent's atexit.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child: {status:#x}"
    );
    // The parent's counts are its own.
    assert_eq!(n.load(Ordering::Relaxed), 0);
    assert_eq!(unsafe { pt_add(2, 3) }, 5);
    detach(a).unwrap();
    assert_eq!(
        (n.load(Ordering::Relaxed), exits.load(Ordering::Relaxed)),
        (1, 1)
    );
}

/// `dlopen`s `libpt_dl.so`; returns the handle and `pt_dl_mul`.
fn load_dl() -> (*mut libc::c_void, unsafe extern "C" fn(i32, i32) -> i32) {
    load_dl_from(env!("PT_DL_SO"))
}

fn load_dl_from(path: &str) -> (*mut libc::c_void, unsafe extern "C" fn(i32, i32) -> i32) {
    let path = std::ffi::CString::new(path).unwrap();
    // SAFETY: a C string; the object has no constructors.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a C string after a failed dlopen.
        let e = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
        panic!("dlopen {path:?}: {}", e.to_string_lossy());
    }
    // SAFETY: a live handle and a C string.
    let f = unsafe { libc::dlsym(h, c"pt_dl_mul".as_ptr()) };
    assert!(!f.is_null());
    // SAFETY: `pt_dl_mul` has this signature (c/dl.c).
    (h, unsafe {
        std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn(i32, i32) -> i32>(f)
    })
}

#[test]
fn a_library_loaded_after_start_is_patched_and_detach_after_dlclose_is_safe() {
    let _s = serial();
    // Each round loads the object (often at the address it had before),
    // attaches, calls, then detaches and unloads in one order or the other.
    for detach_first in [false, true, false] {
        let n = Arc::new(AtomicU64::new(0));
        let (h, mul) = load_dl();
        let a = attach(counting(&n), &[mul as *const () as u64]).unwrap();
        assert_eq!(unsafe { mul(6, 7) }, 42);
        assert_eq!(unsafe { mul(2, 3) }, 6);
        assert_eq!(n.load(Ordering::Relaxed), 2, "both calls probed");
        if detach_first {
            detach(a).unwrap();
            // SAFETY: nothing of the object is in use.
            assert_eq!(unsafe { libc::dlclose(h) }, 0);
        } else {
            // SAFETY: nothing of the object runs; the runtime keeps only
            // its addresses.
            assert_eq!(unsafe { libc::dlclose(h) }, 0);
            // Its code is gone: detach unregisters and writes nothing there.
            detach(a).unwrap();
        }
    }
}

#[test]
fn a_caller_keeping_values_in_caller_saved_registers_gets_them_back() {
    let _s = serial();
    let want = unsafe { pt_ipa_caller(black_box(3), 5, 7) };
    assert_eq!(want, 10 + 15 + 35 + 21);
    let n = Arc::new(AtomicU64::new(0));
    let n2 = n.clone();
    let probe = Fprobe::<Regs>::builder()
        .entry(|_| EntryAction::Continue)
        .exit(move |x| {
            // Clobbers vector registers the caller may be keeping.
            let v: Vec<f64> = (0..64).map(|i| i as f64 * x.ctx.ret() as f64).collect();
            n2.fetch_add(black_box(v).len() as u64 / 64, Ordering::Relaxed);
        })
        .build();
    let a = attach(probe, &[addr("pt_ipa_leaf")]).unwrap();
    for _ in 0..100 {
        assert_eq!(unsafe { pt_ipa_caller(black_box(3), 5, 7) }, want);
    }
    detach(a).unwrap();
    assert_eq!(n.load(Ordering::Relaxed), 100);
}

#[test]
fn a_library_unloaded_while_attached_and_loaded_again_is_a_new_copy() {
    let _s = serial();
    let (n1, n2) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (h, mul) = load_dl();
    let old_f = mul as *const () as u64;
    let old = attach(counting(&n1), &[old_f]).unwrap();
    assert_eq!(unsafe { mul(2, 2) }, 4);
    // SAFETY: nothing of the object runs.
    assert_eq!(unsafe { libc::dlclose(h) }, 0);
    // Loaded again (usually at the same place), with its nops back: the
    // old attachment's count must not block nor be taken for the new copy.
    let (h, mul) = load_dl();
    let f = mul as *const () as u64;
    let new = attach(counting(&n2), &[f]).unwrap();
    assert_eq!(unsafe { mul(3, 3) }, 9);
    detach(old).unwrap();
    assert_eq!(unsafe { mul(4, 4) }, 16);
    assert_eq!(&bytes(f)[5..], &[0xeb, 0xf9], "the new copy stays patched");
    detach(new).unwrap();
    assert_eq!(&bytes(f)[5..], &[0x90, 0x90]);
    // Probes are keyed by address: until detached, the old probe also
    // sees the new copy's calls (mul(3, 3) here) when the copy was loaded
    // at the same place (usual, but not under every allocator: not always
    // under AddressSanitizer).
    let old_saw = if f == old_f { 2 } else { 1 };
    assert_eq!(
        (n1.load(Ordering::Relaxed), n2.load(Ordering::Relaxed)),
        (old_saw, 2)
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::dlclose(h) }, 0);
}

#[test]
fn a_stripped_object_lists_each_function_once_and_never_misplaces_a_site() {
    let _s = serial();
    let (h, mul) = load_dl_from(env!("PT_DL_STRIPPED_SO"));
    let f = mul as *const () as u64;
    let sites: Vec<_> = fprobe_patch::sites()
        .unwrap()
        .into_iter()
        .filter(|s| s.module.ends_with("libpt_dl_stripped.so"))
        .collect();
    // pt_dl_mul, pt_dl_twice (exported: in .dynsym) and the static `twice`
    // (no symbol left: listed by its site, unpatchable).
    assert_eq!(sites.len(), 3, "{sites:?}");
    let mut fs: Vec<u64> = sites.iter().map(|s| s.function).collect();
    fs.dedup();
    assert_eq!(fs.len(), 3, "one entry per function");
    let s = sites
        .iter()
        .find(|s| s.function == f)
        .expect("pt_dl_mul listed");
    assert_eq!(
        (s.layout, s.name.as_deref()),
        (Layout::HotPatch, Some("pt_dl_mul"))
    );
    let unknown: Vec<_> = sites
        .iter()
        .filter(|s| s.layout == Layout::Unknown)
        .collect();
    assert_eq!(unknown.len(), 1, "{sites:?}");
    assert!(matches!(
        attach(
            counting(&Arc::new(AtomicU64::new(0))),
            &[unknown[0].function]
        ),
        Err(Error::UnsupportedLayout { .. })
    ));
    let n = Arc::new(AtomicU64::new(0));
    let a = attach(counting(&n), &[f]).unwrap();
    assert_eq!(unsafe { mul(5, 6) }, 30);
    detach(a).unwrap();
    assert_eq!(n.load(Ordering::Relaxed), 1);
    // SAFETY: nothing of the object runs.
    assert_eq!(unsafe { libc::dlclose(h) }, 0);
}

/// A detach that drains waits for a call in flight to return and runs its
/// exit; on a timeout it says how many calls were left, and their exits
/// are skipped.
#[test]
fn detach_draining_runs_the_exits_of_calls_in_flight() {
    use std::sync::Barrier;
    use std::time::Duration;
    let _s = serial();
    static ENTERED: Barrier = Barrier::new(2);
    static RELEASE: Barrier = Barrier::new(2);
    extern "C" fn parked(x: std::ffi::c_long) -> std::ffi::c_long {
        ENTERED.wait();
        RELEASE.wait();
        std::thread::sleep(Duration::from_millis(20));
        x * 2
    }
    for wait in [Duration::from_secs(60), Duration::from_millis(20)] {
        let (entries, exits) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (e2, x2) = (entries.clone(), exits.clone());
        let probe = Fprobe::<Regs>::builder()
            .entry(move |_| {
                e2.fetch_add(1, Ordering::Relaxed);
                EntryAction::Continue
            })
            .exit(move |x| {
                assert_eq!(x.ctx.ret(), 43, "the exit sees the return value");
                x2.fetch_add(1, Ordering::Relaxed);
            })
            .build();
        let a = attach(probe, &[addr("pt_call")]).unwrap();
        let worker = std::thread::spawn(|| unsafe { pt_call(parked, 21) });
        ENTERED.wait();
        let left = if wait > Duration::from_secs(1) {
            RELEASE.wait();
            detach_draining(a, wait).unwrap()
        } else {
            let left = detach_draining(a, wait).unwrap();
            RELEASE.wait();
            left
        };
        assert_eq!(worker.join().unwrap(), 43, "the call returns to its caller");
        let ran = exits.load(Ordering::Relaxed);
        if wait > Duration::from_secs(1) {
            assert_eq!((left, entries.load(Ordering::Relaxed), ran), (0, 1, 1));
        } else {
            assert_eq!((left, entries.load(Ordering::Relaxed), ran), (1, 1, 0));
        }
        assert_eq!(&bytes(addr("pt_call"))[5..], &[0x90, 0x90]);
    }
}

/// Unless allowed (`tests/lean.rs`), every function keeps the full save,
/// the ones that call out included.
#[test]
fn by_default_every_function_saves_every_register() {
    let _s = serial();
    let n = Arc::new(AtomicU64::new(0));
    let fs = [addr("pt_call"), addr("pt_jumper"), addr("pt_add")];
    let a = attach(counting(&n), &fs).unwrap();
    for f in fs {
        assert_eq!(register_save(f), Some(RegisterSave::All));
    }
    detach(a).unwrap();
}
