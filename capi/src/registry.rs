//! Creating registries: their settings ([`fprobe_config`]),
//! [`fprobe_registry_new`], and the opaque [`fprobe_registry`] handles it
//! returns, cut from blocks that are never freed (a destroyed registry's
//! handle stays a tombstone: see the crate docs).

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicU64};

use fprobe::probe::Registry;

#[cfg(doc)]
use crate::codes::FPROBE_E_INVALID;
use crate::codes::{FPROBE_E_NULL, code, ffi};

/// An opaque registry: the address index, the probe slots and each
/// thread's shadow stack. Create with [`fprobe_registry_new`].
pub struct fprobe_registry {
    pub(crate) magic: AtomicU64,
    /// `Arc::into_raw` of the registry; null once destroyed.
    pub(crate) inner: AtomicPtr<Reg>,
}

pub(crate) const LIVE: u64 = 0x6670_726f_6265_5247;
pub(crate) const DEAD: u64 = 0x6670_726f_6265_4444;

/// The engine's context pointer, passed through to handlers untouched.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct EngineCtx(pub(crate) *mut c_void);

// SAFETY: the pointer is only carried, never dereferenced, by this crate;
// it is handed to the handlers of the thread that passed it.
unsafe impl Send for EngineCtx {}
// SAFETY: as above.
unsafe impl Sync for EngineCtx {}

pub(crate) type Reg = Registry<EngineCtx>;

/// Registry settings. Zero in any field means its default.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fprobe_config {
    /// Most probes registered at once (default 256, at most 65536).
    pub max_probes: usize,
    /// Largest per-call data a probe may ask for, bytes (default 64).
    pub data_size: usize,
    /// Nesting depth each thread's shadow stack holds: calls with a return
    /// probe of the full `data_size` (default 64; deeper calls skip their
    /// exit handlers and count `missed_depth`).
    pub max_depth: usize,
    /// Addresses to presize the index for (default 0: grows on demand).
    pub capacity: usize,
    /// Entries of the recent-hit cache in front of the index (a power of
    /// two in 16..=65536, 4-way); 0: no cache (the default, and usually
    /// faster: see BENCHMARKS.md).
    pub hit_cache_entries: usize,
    /// Non-zero: one hit cache per CPU instead of per thread.
    pub hit_cache_per_cpu: c_int,
}

/// Creates a registry. `config` may be NULL (all defaults).
///
/// Returns [`FPROBE_E_NULL`] if `out` is NULL, [`FPROBE_E_INVALID`] for an
/// out-of-range setting. Thread-safe.
///
/// # Safety
///
/// `config` is NULL or points to a valid `fprobe_config`; `out` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_registry_new(
    config: *const fprobe_config,
    out: *mut *mut fprobe_registry,
) -> c_int {
    ffi(|| {
        if out.is_null() {
            return Err(FPROBE_E_NULL);
        }
        // SAFETY: NULL or valid, by the contract.
        let c = unsafe { config.as_ref() }.copied().unwrap_or_default();
        let mut b = Registry::<EngineCtx>::builder();
        if c.max_probes != 0 {
            b = b.max_probes(c.max_probes);
        }
        if c.data_size != 0 {
            b = b.data_size(c.data_size);
        }
        if c.max_depth != 0 {
            b = b.max_depth(c.max_depth);
        }
        if c.capacity != 0 {
            b = b.capacity(c.capacity);
        }
        if c.hit_cache_entries != 0 {
            b = b.hit_cache(
                fprobe::HitCacheConfig::default()
                    .entries(c.hit_cache_entries)
                    .per_cpu(c.hit_cache_per_cpu != 0),
            );
        }
        let reg = b.build().map_err(code)?;
        let handle = new_handle(fprobe_registry {
            magic: AtomicU64::new(LIVE),
            inner: AtomicPtr::new(Arc::into_raw(Arc::new(reg)).cast_mut()),
        });
        // SAFETY: checked non-null; writable by the contract.
        unsafe { *out = handle };
        Ok(())
    })
}

/// Handles per block of [`new_handle`].
const HANDLES_PER_BLOCK: usize = 1024;

/// The block handles are cut from, and how many of it are used.
struct HandleBlock {
    next: *mut fprobe_registry,
    left: usize,
}

// SAFETY: the pointer is only a cursor into leaked memory, used under the
// mutex below.
unsafe impl Send for HandleBlock {}

static HANDLES: std::sync::Mutex<HandleBlock> = std::sync::Mutex::new(HandleBlock {
    next: std::ptr::null_mut(),
    left: 0,
});

/// A handle that is never freed (a tombstone once its registry is
/// destroyed, see the crate docs). Handles are cut from blocks of their
/// own, so that the tombstones of many registries do not pin the pages
/// their registries' memory was on.
fn new_handle(h: fprobe_registry) -> *mut fprobe_registry {
    let mut b = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    if b.left == 0 {
        let block: Box<[std::mem::MaybeUninit<fprobe_registry>]> =
            Box::new_uninit_slice(HANDLES_PER_BLOCK);
        b.next = Box::leak(block).as_mut_ptr().cast();
        b.left = HANDLES_PER_BLOCK;
    }
    let p = b.next;
    // SAFETY: `p` is an unused element of a leaked block (`left > 0`).
    unsafe {
        p.write(h);
        b.next = p.add(1);
    }
    b.left -= 1;
    p
}
