//! The memory of a table's slot array: the global allocator, or, for a
//! large table on Linux, an anonymous mapping backed by transparent huge
//! pages.
//!
//! # Why huge pages
//!
//! A table is one array that every lookup indexes at random. At 4 KiB per
//! page a table of 32 MiB (a million addresses) spans 8,192 pages, more
//! than a core's second-level TLB holds (1,536 to 3,072 entries on recent
//! x86-64 cores: 6 to 12 MiB of reach), so a cold lookup can pay a page
//! walk on top of its cache misses. On 2 MiB pages it needs 16 entries.
//!
//! Smaller tables fit that reach in small pages, and there huge pages have
//! little to save against their costs: every rebuild maps fresh memory and
//! unmaps the old table (a TLB shootdown on the process's other CPUs)
//! where the allocator would reuse its memory, and a single insert can
//! stall while the kernel compacts memory to produce a huge page. So only
//! arrays of [`HUGE_FROM`] bytes and more are mapped.
//!
//! Growth pays for the pages too. Every table a growth attaches is fresh
//! memory from the kernel, faulted in page by page as the migration
//! reaches it (`Table::prefault`); 2 MiB faulted in as one huge page takes
//! one fault where small pages take 512.
//!
//! # What is mapped
//!
//! Arrays of at least [`HUGE_FROM`] bytes, when the index's `huge_pages`
//! setting is on (the default): `mmap` of the array rounded up to a page,
//! placed at a 2 MiB boundary (a mapping 2 MiB larger, trimmed at both
//! ends), and `madvise(MADV_HUGEPAGE)` on its whole 2 MiB blocks only: the
//! tail that does not fill a block stays on small pages, so no table holds
//! more than it uses (an 8 MiB + 16 B array takes four huge pages and one
//! small one, not five huge ones). The kernel zero-fills the pages, as
//! `alloc_zeroed` guarantees for the heap path.
//!
//! Whether the kernel then uses huge pages is its choice:
//! `/sys/kernel/mm/transparent_hugepage/enabled` must be `always` or
//! `madvise`, and a fault that finds no free 2 MiB block may compact memory
//! first (`defrag`), or fall back to 4 KiB pages. Everything here is
//! correct either way. A failed `madvise` is ignored; a failed `mmap` falls
//! back to the global allocator.
//!
//! Costs, written down: the first write to each 2 MiB block zeroes the
//! whole block, on whichever insert's migration step
//! (or presizing build) reaches it first: bounded by the page size, not
//! the table's, as long as the kernel finds a free 2 MiB block (with
//! `defrag` at `madvise`, the default, a fault that finds none compacts
//! memory first, which takes as long as it takes); and a mapping is
//! returned with `munmap` when the table is freed (after a grace period,
//! on the RCU's reclaimer), as glibc does for any allocation above its
//! mmap threshold. And a table is fresh memory
//! every time: where a process builds and drops indexes over and over, a
//! warm heap can hand back pages that are already resident, and the
//! mapping does not. An index built with
//! `huge_pages(false)` keeps every table on the global allocator.
//!
//! Under miri and loom, and on other systems, every array comes from the
//! global allocator (loom: from model atomics).

use std::ops::Deref;
#[cfg(not(loom))]
use std::ptr::NonNull;

use super::record::Header;
use crate::sync::{AtomicPtr, AtomicU64};

/// One slot of a table: a key and its record pointer (the states a slot
/// goes through are in `table.rs`). All-zero is the empty slot, so an
/// array of slots comes from zeroed memory.
pub(crate) struct Slot {
    pub(crate) key: AtomicU64,
    pub(crate) rec: AtomicPtr<Header>,
}

impl Default for Slot {
    fn default() -> Self {
        Self {
            key: AtomicU64::new(0),
            rec: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

/// The huge page size the mapping is aligned to and advised in blocks of:
/// 2 MiB (x86-64's and most Linux targets' huge page size; where it is
/// larger, `madvise` covers no whole block and the mapping keeps small
/// pages).
#[cfg(all(target_os = "linux", not(miri), not(loom)))]
const HUGE: usize = 2 << 20;

/// Smallest array placed on huge pages: 8 MiB (524,288 slots, the table
/// of an index of more than 131,072 addresses), about the second-level
/// TLB's reach in 4 KiB pages (module docs).
#[cfg(all(target_os = "linux", not(miri), not(loom)))]
const HUGE_FROM: usize = 8 << 20;

/// A table's slots, zeroed (empty) when made.
#[cfg(not(loom))]
pub(crate) struct SlotArray {
    ptr: NonNull<Slot>,
    len: usize,
    /// The mapping's length in bytes when the array is mapped (freed with
    /// `munmap`), or 0 when it came from the global allocator.
    #[cfg(all(target_os = "linux", not(miri)))]
    mapped: usize,
}

/// Under loom: model slots, owned.
#[cfg(loom)]
pub(crate) struct SlotArray {
    model: Box<[Slot]>,
}

// The impls below hold because a slot is atomics only; this fails to
// compile if that ever changes.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<Slot>()
};

// SAFETY: the array owns its slots, which are `Send + Sync` (checked
// above); the pointer is never shared outside `&self` borrows.
#[cfg(not(loom))]
unsafe impl Send for SlotArray {}
// SAFETY: as above: `&SlotArray` gives out `&[Slot]`, and slots are `Sync`.
#[cfg(not(loom))]
unsafe impl Sync for SlotArray {}

impl SlotArray {
    /// `n > 0` empty slots, on huge pages when `huge` and the array is
    /// large enough (module docs).
    #[cfg(not(loom))]
    pub(crate) fn zeroed(n: usize, huge: bool) -> Self {
        assert!(n > 0);
        let layout = std::alloc::Layout::array::<Slot>(n).expect("table size overflow");
        #[cfg(all(target_os = "linux", not(miri)))]
        if huge && layout.size() >= HUGE_FROM {
            if let Some((ptr, mapped)) = map_huge(layout.size()) {
                return Self {
                    ptr: ptr.cast(),
                    len: n,
                    mapped,
                };
            }
        }
        let _ = huge;
        // SAFETY: `n > 0`, so the layout is non-zero-sized.
        let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<Slot>();
        let Some(ptr) = NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout);
        };
        Self {
            ptr,
            len: n,
            #[cfg(all(target_os = "linux", not(miri)))]
            mapped: 0,
        }
    }

    /// `n > 0` empty model slots.
    #[cfg(loom)]
    pub(crate) fn zeroed(n: usize, _huge: bool) -> Self {
        assert!(n > 0);
        Self {
            model: (0..n).map(|_| Slot::default()).collect(),
        }
    }

    /// Whether the array is an anonymous mapping advised onto huge pages
    /// (not whether the kernel granted them).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn is_mapped(&self) -> bool {
        #[cfg(all(target_os = "linux", not(miri)))]
        {
            self.mapped != 0
        }
        #[cfg(not(all(target_os = "linux", not(miri))))]
        {
            false
        }
    }
}

impl Deref for SlotArray {
    type Target = [Slot];

    #[cfg(not(loom))]
    #[inline(always)]
    fn deref(&self) -> &[Slot] {
        // SAFETY: `ptr` points to `len` initialised slots (zeroed: a valid
        // empty `Slot`), owned by `self` and freed only in `drop`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    #[cfg(loom)]
    fn deref(&self) -> &[Slot] {
        &self.model
    }
}

#[cfg(not(loom))]
impl Drop for SlotArray {
    fn drop(&mut self) {
        #[cfg(all(target_os = "linux", not(miri)))]
        if self.mapped != 0 {
            // SAFETY: `ptr..ptr + mapped` is the mapping `map_huge` made
            // and nothing else unmapped; no reference into it outlives
            // `self` (slots are borrowed from `&self`).
            let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
            // It can fail only with ENOMEM: unmapping splits a mapping the
            // kernel had merged with a neighbour, at the process's
            // `vm.max_map_count`. The table then stays mapped (a leak, not
            // a fault: nothing refers to it); debug builds say so.
            debug_assert_eq!(rc, 0, "munmap of a table");
            return;
        }
        let layout = std::alloc::Layout::array::<Slot>(self.len).expect("allocated above");
        // SAFETY: allocated in `zeroed` by the global allocator with this
        // layout; slots need no drop.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), layout) };
    }
}

/// Maps `bytes` of zeroed memory at a [`HUGE`] boundary and advises its
/// whole huge blocks onto huge pages. Returns the start and the mapping's
/// length (`bytes` rounded up to the page size), or `None` when `mmap`
/// fails or the page size is not a power of two dividing [`HUGE`] (then
/// the caller uses the global allocator).
#[cfg(all(target_os = "linux", not(miri), not(loom)))]
fn map_huge(bytes: usize) -> Option<(NonNull<u8>, usize)> {
    // The real page size (4 KiB on x86-64; 16 or 64 KiB on some arm64
    // kernels): `munmap` needs page-aligned starts, so the trimmed ends and
    // the length kept for `Drop` are multiples of it.
    let page = crate::sys::page_size()?;
    if !page.is_power_of_two() || page > HUGE {
        return None;
    }
    let len = bytes.checked_next_multiple_of(page)?;
    let span = len.checked_add(HUGE)?;
    // SAFETY: an anonymous private mapping at an address the kernel picks:
    // no existing memory is affected.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let raw = raw.cast::<u8>();
    // `head < HUGE` and `head + len + tail == span`: the block boundary
    // after `raw` leaves `len` bytes before the mapping ends.
    let head = (raw as usize).next_multiple_of(HUGE) - raw as usize;
    let tail = span - head - len;
    // SAFETY: `head < span`: inside the mapping.
    let start = unsafe { raw.add(head) };
    // SAFETY: both ranges lie inside the mapping just made (page-aligned:
    // `raw` is, and `head` and `len` are multiples of the page size) and
    // are not used. Failure would leave address space mapped, not unsound.
    unsafe {
        if head > 0 {
            libc::munmap(raw.cast(), head);
        }
        if tail > 0 {
            libc::munmap(start.add(len).cast(), tail);
        }
    }
    let advised = bytes / HUGE * HUGE;
    // SAFETY: `start..start + advised` lies in the mapping. `madvise` only
    // changes how the kernel backs it; failure (no THP support) is harmless.
    unsafe { libc::madvise(start.cast(), advised, libc::MADV_HUGEPAGE) };
    NonNull::new(start).map(|p| (p, len))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::Ordering;

    const SLOT: usize = std::mem::size_of::<Slot>();

    /// Every slot reads empty, and the first and last take writes.
    fn check_zeroed_and_writable(a: &SlotArray, n: usize) {
        assert_eq!(a.len(), n);
        assert!(a.iter().all(|s| s.key.load(Ordering::Relaxed) == 0));
        for i in [0, n / 2, n - 1] {
            a[i].key.store(i as u64 + 1, Ordering::Relaxed);
            assert_eq!(a[i].key.load(Ordering::Relaxed), i as u64 + 1);
        }
    }

    /// Arrays of `HUGE_FROM` bytes and more are mapped at a 2 MiB
    /// boundary, tail included; smaller ones, and any with the setting
    /// off, come from the global allocator.
    #[test]
    #[cfg_attr(miri, ignore = "an 8 MiB array is slow under miri")]
    fn large_arrays_are_mapped_at_huge_page_boundaries() {
        let n = (8 << 20) / SLOT + 1; // four huge blocks and a 16-byte tail
        let a = SlotArray::zeroed(n, true);
        check_zeroed_and_writable(&a, n);
        if cfg!(all(target_os = "linux", not(miri))) {
            assert!(a.is_mapped());
            assert_eq!(a.as_ptr() as usize % (2 << 20), 0);
        }
        let small = [
            (n, false),
            ((8 << 20) / SLOT - 1, true),
            ((2 << 20) / SLOT + 1, true),
            (9, true),
        ];
        for (n, huge) in small {
            let a = SlotArray::zeroed(n, huge);
            assert!(!a.is_mapped(), "{n} slots, huge {huge}");
            check_zeroed_and_writable(&a, n);
        }
    }

    /// A mapped table's huge blocks carry the `MADV_HUGEPAGE` advice
    /// (`hg` in its `VmFlags`) wherever the kernel has transparent huge
    /// pages. Whether they are then backed by huge pages is reported, not
    /// asserted: a kernel that finds no free 2 MiB block falls back to small
    /// pages, which is correct too.
    #[cfg(all(target_os = "linux", not(miri)))]
    #[test]
    fn mapped_arrays_are_advised_onto_huge_pages() {
        let n = (8 << 20) / SLOT + 1;
        let a = SlotArray::zeroed(n, true);
        for i in (0..n).step_by(4096 / SLOT) {
            a[i].key.store(1, Ordering::Relaxed);
        }
        let start = a.as_ptr() as usize;
        let table = advice_and_huge_kb(start);
        // Calibration: the same advice on a mapping of the test's own, so
        // that a kernel (or an emulator) that accepts `madvise` without
        // recording it skips the check instead of failing it.
        // Its own `mmap` and `madvise`, not `map_huge`'s: a `map_huge` that
        // lost its advice must fail here, not skip.
        let len = 4 << 20;
        // SAFETY: a fresh anonymous mapping, advised, inspected, unmapped;
        // nothing else refers to it.
        let calibration = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED, "mmap of 4 MiB");
            libc::madvise(p, len, libc::MADV_HUGEPAGE);
            let c = advice_and_huge_kb(p as usize);
            libc::munmap(p, len);
            c
        };
        println!("table: advised, huge kB = {table:?}; calibration mapping: {calibration:?}");
        if calibration.0 == Some(true) {
            assert_eq!(
                table.0,
                Some(true),
                "the table's mapping carries MADV_HUGEPAGE"
            );
        }
    }

    /// Whether the mapping holding `addr` carries `MADV_HUGEPAGE` (`hg` in
    /// its `VmFlags`), and its `AnonHugePages`, from `/proc/self/smaps`.
    #[cfg(all(target_os = "linux", not(miri)))]
    fn advice_and_huge_kb(addr: usize) -> (Option<bool>, Option<usize>) {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
        let mut in_range = false;
        let (mut huge_kb, mut flags) = (None, None);
        for line in smaps.lines() {
            // A mapping's first line: `lo-hi perms offset dev inode path`.
            let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
            if let Some((Ok(lo), Ok(hi))) =
                range.map(|(lo, hi)| (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)))
            {
                in_range = (lo..hi).contains(&addr);
                continue;
            }
            if in_range {
                if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                    huge_kb = kb.trim().trim_end_matches(" kB").parse::<usize>().ok();
                }
                if let Some(f) = line.strip_prefix("VmFlags:") {
                    flags = Some(f.split_whitespace().any(|f| f == "hg"));
                }
            }
        }
        (flags, huge_kb)
    }
}
