//! The patching runtime through the C ABI (`fprobe_patch_*`), with C
//! handlers reading the saved registers.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use fprobe_capi::patch::*;
use fprobe_capi::*;
use fprobe_patch_ctest::*;

static ENTRY_SUM: AtomicU64 = AtomicU64::new(0);
static EXIT_SUM: AtomicU64 = AtomicU64::new(0);
static RELEASED: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn on_entry(user: *mut c_void, ctx: *mut fprobe_entry_ctx) -> i32 {
    assert_eq!(user as usize, 0x5eed);
    // SAFETY: valid for the call; engine_ctx is the call's saved registers.
    let (ctx, regs) = unsafe { (&mut *ctx, &*(*ctx).engine_ctx.cast::<fprobe_patch_regs>()) };
    // pt_add(a, b): rdi + rsi, and the cookie.
    ENTRY_SUM.fetch_add(regs.gp[0] + regs.gp[1] + ctx.cookie, Ordering::Relaxed);
    0
}

unsafe extern "C" fn on_exit(_user: *mut c_void, ctx: *const fprobe_exit_ctx) {
    // SAFETY: as above; at exit gp[6] is rax.
    let regs = unsafe { &*(*ctx).engine_ctx.cast::<fprobe_patch_regs>() };
    EXIT_SUM.fetch_add(regs.gp[6] & 0xffff_ffff, Ordering::Relaxed);
}

unsafe extern "C" fn release(user: *mut c_void) {
    assert_eq!(user as usize, 0x5eed);
    RELEASED.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn c_handlers_attached_at_run_time_see_arguments_and_return_values() {
    let mut n = 0usize;
    // SAFETY: cap 0 with a NULL array; a writable count.
    let rc = unsafe { fprobe_patch_functions(std::ptr::null_mut(), 0, &mut n) };
    assert_eq!(rc, FPROBE_OK, "a sizing call succeeds");
    assert!(n > 0);
    let mut short = vec![0u64; n - 1];
    let mut m = 0usize;
    // SAFETY: `n - 1` writable slots.
    let rc = unsafe { fprobe_patch_functions(short.as_mut_ptr(), n - 1, &mut m) };
    assert_eq!((rc, m), (FPROBE_E_CAPACITY, n), "an array too short");
    let mut fs = vec![0u64; n];
    // SAFETY: `n` writable slots.
    assert_eq!(
        unsafe { fprobe_patch_functions(fs.as_mut_ptr(), n, &mut n) },
        FPROBE_OK
    );
    assert!(fs.contains(&addr("pt_add")));
    assert!(
        !fs.contains(&addr("pt_other_layout")),
        "other layouts are not listed"
    );

    let probe = fprobe_probe {
        entry: Some(on_entry),
        exit: Some(on_exit),
        release: Some(release),
        user: 0x5eed as *mut c_void,
        data_size: 0,
    };
    let (f, cookie) = (addr("pt_add"), 1000u64);
    let mut h = 0;
    // SAFETY: one function and cookie; a writable handle.
    assert_eq!(
        unsafe { fprobe_patch_attach(&probe, &f, &cookie, 1, &mut h) },
        FPROBE_OK
    );
    let total: i32 = (0..10).map(|i| unsafe { pt_add(i, 2 * i) }).sum();
    assert_eq!(total, 135);
    assert_eq!(ENTRY_SUM.load(Ordering::Relaxed), 135 + 10 * 1000);
    assert_eq!(EXIT_SUM.load(Ordering::Relaxed), 135);
    let mut st = fprobe_stats::default();
    // SAFETY: a writable out.
    assert_eq!(unsafe { fprobe_patch_stats(h, &mut st) }, FPROBE_OK);
    assert_eq!((st.hits, st.exits), (10, 10));
    assert_eq!(RELEASED.load(Ordering::Relaxed), 0);
    assert_eq!(fprobe_patch_detach(h), FPROBE_OK);
    assert_eq!(RELEASED.load(Ordering::Relaxed), 1, "released after detach");
    assert_eq!(fprobe_patch_detach(h), FPROBE_E_NOT_FOUND);
    unsafe { pt_add(1, 1) };
    assert_eq!(EXIT_SUM.load(Ordering::Relaxed), 135);

    // Preparing: done once, refused like an attach.
    let fs = [addr("pt_add"), addr("pt_fadd")];
    // SAFETY: two readable values; NULL with none.
    unsafe {
        assert_eq!(fprobe_patch_prepare(fs.as_ptr(), 2), FPROBE_OK);
        assert_eq!(fprobe_patch_prepare(std::ptr::null(), 0), FPROBE_OK);
        assert_eq!(fprobe_patch_prepare(std::ptr::null(), 1), FPROBE_E_NULL);
    }

    // Refusals change nothing and keep `user` with the caller.
    let other = addr("pt_other_layout");
    // SAFETY: one readable value.
    assert_eq!(
        unsafe { fprobe_patch_prepare(&other, 1) },
        FPROBE_E_NOT_PATCHABLE
    );
    // SAFETY: as above.
    let rc = unsafe { fprobe_patch_attach(&probe, &other, std::ptr::null(), 1, &mut h) };
    assert_eq!(rc, FPROBE_E_NOT_PATCHABLE);
    let not_code = &RELEASED as *const AtomicU64 as u64;
    // SAFETY: as above.
    let rc = unsafe { fprobe_patch_attach(&probe, &not_code, std::ptr::null(), 1, &mut h) };
    assert_eq!(rc, FPROBE_E_NOT_PATCHABLE);
    assert_eq!(RELEASED.load(Ordering::Relaxed), 1);
    // SAFETY: a static string.
    let why = unsafe { std::ffi::CStr::from_ptr(fprobe_strerror(FPROBE_E_NOT_PATCHABLE)) };
    assert!(why.to_str().unwrap().contains("patchable"));
}

static D_EXITS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn count_exit(_user: *mut c_void, _ctx: *const fprobe_exit_ctx) {
    D_EXITS.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn detach_draining_through_the_c_abi() {
    let probe = fprobe_probe {
        entry: None,
        exit: Some(count_exit),
        release: None,
        user: std::ptr::null_mut(),
        data_size: 0,
    };
    let f = addr("pt_fadd");
    let mut h = 0;
    // SAFETY: one function, no cookies; a writable handle.
    assert_eq!(
        unsafe { fprobe_patch_attach(&probe, &f, std::ptr::null(), 1, &mut h) },
        FPROBE_OK
    );
    // SAFETY: a plain C function.
    assert_eq!(unsafe { pt_fadd(1.5, 2.0) }, 3.5);
    let mut left = 9;
    // SAFETY: a writable out.
    assert_eq!(
        unsafe { fprobe_patch_detach_draining(h, 1000, &mut left) },
        FPROBE_OK
    );
    assert_eq!((left, D_EXITS.load(Ordering::Relaxed)), (0, 1));
    // SAFETY: NULL is allowed.
    let rc = unsafe { fprobe_patch_detach_draining(h, 0, std::ptr::null_mut()) };
    assert_eq!(rc, FPROBE_E_NOT_FOUND);
    // SAFETY: as above.
    assert_eq!(unsafe { pt_fadd(1.0, 1.0) }, 2.0);
    assert_eq!(D_EXITS.load(Ordering::Relaxed), 1, "detached");
}

static BUSY_HANDLE: AtomicU64 = AtomicU64::new(0);
static BUSY_RC: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1);

unsafe extern "C" fn detaching_entry(_user: *mut c_void, _ctx: *mut fprobe_entry_ctx) -> i32 {
    let h = BUSY_HANDLE.load(Ordering::Relaxed);
    // SAFETY: NULL is allowed for the count.
    let rc = unsafe { fprobe_patch_detach_draining(h, 0, std::ptr::null_mut()) };
    BUSY_RC.store(rc, Ordering::Relaxed);
    0
}

#[test]
fn detaching_from_a_handler_is_refused_and_changes_nothing() {
    let probe = fprobe_probe {
        entry: Some(detaching_entry),
        exit: None,
        release: None,
        user: std::ptr::null_mut(),
        data_size: 0,
    };
    let f = addr("pt_sum6");
    let mut h = 0;
    // SAFETY: one function, no cookies; a writable handle.
    assert_eq!(
        unsafe { fprobe_patch_attach(&probe, &f, std::ptr::null(), 1, &mut h) },
        FPROBE_OK
    );
    BUSY_HANDLE.store(h, Ordering::Relaxed);
    // SAFETY: a plain C function.
    assert_eq!(unsafe { pt_sum6(1, 1, 1, 1, 1, 1) }, 21);
    assert_eq!(BUSY_RC.load(Ordering::Relaxed), FPROBE_E_BUSY);
    let mut st = fprobe_stats::default();
    // SAFETY: a writable out.
    assert_eq!(
        unsafe { fprobe_patch_stats(h, &mut st) },
        FPROBE_OK,
        "still attached"
    );
    assert_eq!(st.hits, 1);
    assert_eq!(fprobe_patch_detach(h), FPROBE_OK);
}
