//! One record per address: every value of the address, contiguous.
//!
//! Layout of one allocation (`#[repr(C)]`-style, computed with `Layout`):
//!
//! ```text
//! [ Header { len } | V; len | u64 id; len ]
//! ```
//!
//! A lookup touches the header and the values, usually one cache line, so a
//! cold lookup costs two dependent misses: the table slot and the record.
//! Records are immutable once published; a change to an address's values
//! builds a new record (copy-on-write, cloning the values that stay) and
//! retires the old one after a grace period.
//!
//! Ownership: every value in a *published* record is owned by that record.
//! When a copy-on-write replaces record `R` by `R'`, the values that stay are
//! cloned into `R'`; `R` keeps its own copies, which are dropped with `R`
//! after the grace period (or moved out of `R` by `take`).
//!
//! # Shared records
//!
//! A record may be published in the slots of several addresses at once
//! (`insert_shared`: one value attached to many addresses, as one probe on
//! thousands of functions). Then a lookup of any of them finds the same
//! record, which stays in cache, and costs one miss (the slot's line)
//! instead of two. The header's `refs` counts the live slots that hold
//! the record, plus any writer holding it across lock releases
//! ([`RecordPtr::acquire`]); the writer whose [`RecordPtr::release`]
//! takes it to zero retires (or frees) it. Only writers touch `refs`;
//! readers never do, and rely on the grace period as for any record.
//! A record with `refs > 1` holds only ids of shared inserts (a private
//! record is never published twice), so its ids mean the same at every
//! address that holds it.

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::sync::Ordering;
// Writer-side only, and outside the protocols the loom models check (the
// readers' side of a record is its publication and grace period).
use crate::sync::unmodelled::AtomicUsize;

/// The fixed part of a record.
#[repr(C)]
pub(crate) struct Header {
    /// Number of values. Invariant: ≥ 1 (an address without values has no
    /// record: its slot holds null).
    len: usize,
    /// Live slots holding the record, plus writers holding it (see the
    /// module docs, "Shared records"): 1 when built. [`SHARED_KIND`] is
    /// set in records built for sharing.
    refs: AtomicUsize,
}

/// Bit of `Header::refs` set in a record built by a shared insert or
/// removal: its bytes are counted once for the index, not per address.
const SHARED_KIND: usize = 1 << (usize::BITS - 1);

/// Byte offsets of the two arrays in a record of `len` values.
struct Shape {
    layout: Layout,
    values: usize,
    ids: usize,
}

fn shape<V>(len: usize) -> Shape {
    let header = Layout::new::<Header>();
    let values = Layout::array::<V>(len).expect("record size overflow");
    let ids = Layout::array::<u64>(len).expect("record size overflow");
    let (l, values_off) = header.extend(values).expect("record size overflow");
    let (l, ids_off) = l.extend(ids).expect("record size overflow");
    debug_assert_eq!(values_off, values_offset::<V>());
    Shape {
        layout: l.pad_to_align(),
        values: values_off,
        ids: ids_off,
    }
}

/// Offset of the values array: the header rounded up to `V`'s alignment
/// (independent of the length, so the hot path computes it at compile time).
#[inline(always)]
const fn values_offset<V>() -> usize {
    let a = std::mem::align_of::<V>();
    (std::mem::size_of::<Header>() + a - 1) & !(a - 1)
}

/// A record's memory and its first `written` values, dropped and freed
/// when this is dropped: a record being built (freed if building unwinds),
/// or one being freed (freed even if a value's destructor panics).
struct RecordMem<V> {
    base: *mut u8,
    layout: Layout,
    values: *mut V,
    written: usize,
}

impl<V> Drop for RecordMem<V> {
    fn drop(&mut self) {
        /// Frees the memory when dropped: after the values, or while a
        /// panic from one of their destructors unwinds out of this `drop`.
        struct Dealloc(*mut u8, Layout);
        impl Drop for Dealloc {
            fn drop(&mut self) {
                // SAFETY: allocated with this layout (`RecordMem`'s
                // constructors' contract), freed once, here.
                unsafe { dealloc(self.0, self.1) }
            }
        }
        let _mem = Dealloc(self.base, self.layout);
        // SAFETY: exactly `written` values are initialised and owned here
        // (constructors' contract). A slice's remaining elements are still
        // dropped when one of them panics.
        unsafe {
            std::ptr::slice_from_raw_parts_mut(self.values, self.written).drop_in_place();
        }
    }
}

/// A pointer to a published (or about to be published) record of `V`s.
pub(crate) struct RecordPtr<V> {
    ptr: NonNull<Header>,
    _values: PhantomData<V>,
}

impl<V> Clone for RecordPtr<V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<V> Copy for RecordPtr<V> {}

impl<V> RecordPtr<V> {
    /// Wraps a raw pointer loaded from a slot.
    ///
    /// # Safety
    ///
    /// `p` was produced by [`RecordPtr::into_raw`] of a record of `V`s that
    /// has not been freed.
    #[inline(always)]
    pub(crate) unsafe fn from_raw(p: *mut Header) -> Self {
        Self {
            // SAFETY: records are never null (caller contract).
            ptr: unsafe { NonNull::new_unchecked(p) },
            _values: PhantomData,
        }
    }

    pub(crate) fn into_raw(self) -> *mut Header {
        self.ptr.as_ptr()
    }

    /// Builds a record holding `items` (id, value) in order.
    ///
    /// If cloning or the iterator panics, the values written so far are
    /// dropped and the memory freed.
    ///
    /// # Panics
    ///
    /// When `items` is empty (records always hold at least one value).
    pub(crate) fn build(len: usize, items: impl IntoIterator<Item = (u64, V)>) -> Self {
        Self::build_kind(len, items, 0)
    }

    /// [`RecordPtr::build`] of a record meant to be published at several
    /// addresses (see the module docs, "Shared records").
    pub(crate) fn build_shared(len: usize, items: impl IntoIterator<Item = (u64, V)>) -> Self {
        Self::build_kind(len, items, SHARED_KIND)
    }

    fn build_kind(len: usize, items: impl IntoIterator<Item = (u64, V)>, kind: usize) -> Self {
        assert!(len > 0, "a record holds at least one value");
        let sh = shape::<V>(len);
        // SAFETY: the layout has non-zero size (the header is non-empty).
        let base = unsafe { alloc(sh.layout) };
        if base.is_null() {
            handle_alloc_error(sh.layout);
        }
        // SAFETY: the offsets come from `shape`, inside the allocation.
        let (values, ids) = unsafe {
            (
                base.add(sh.values).cast::<V>(),
                base.add(sh.ids).cast::<u64>(),
            )
        };
        // Frees the partly built record on unwind.
        let mut partial = RecordMem {
            base,
            layout: sh.layout,
            values,
            written: 0,
        };
        for (id, v) in items.into_iter().take(len) {
            // SAFETY: `written < len`: both arrays have room, and the slots
            // are uninitialised (written once each).
            unsafe {
                values.add(partial.written).write(v);
                ids.add(partial.written).write(id);
            }
            partial.written += 1;
        }
        assert_eq!(partial.written, len, "record builder got too few items");
        std::mem::forget(partial);
        // SAFETY: the header is at offset 0 of the allocation.
        unsafe {
            base.cast::<Header>().write(Header {
                len,
                refs: AtomicUsize::new(kind | 1),
            })
        };
        Self {
            // SAFETY: `base` is non-null (checked above).
            ptr: unsafe { NonNull::new_unchecked(base.cast()) },
            _values: PhantomData,
        }
    }

    /// Number of values.
    ///
    /// # Safety
    ///
    /// The record is live: not yet freed (the caller holds a read guard,
    /// owns the record, or holds the stripe lock of its slot). A
    /// `RecordPtr` is `Copy`, so a copy can outlive the record it names.
    #[inline(always)]
    pub(crate) unsafe fn len(self) -> usize {
        // SAFETY: the record is live (caller contract), and its header is
        // written before it is published and never changed.
        unsafe { (*self.ptr.as_ptr()).len }
    }

    /// The values.
    ///
    /// # Safety
    ///
    /// The record must stay live for `'a` (the caller holds a read guard, or
    /// owns the record).
    #[inline(always)]
    pub(crate) unsafe fn values<'a>(self) -> &'a [V] {
        // SAFETY: live for `'a` (caller contract).
        let len = unsafe { self.len() };
        let off = values_offset::<V>();
        // SAFETY: `len` initialised values start at `off` (built by `build`),
        // live for `'a` by the caller's contract.
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr().cast::<u8>().add(off).cast::<V>(), len)
        }
    }

    /// The entry ids, parallel to [`RecordPtr::values`].
    ///
    /// # Safety
    ///
    /// As for [`RecordPtr::values`].
    #[inline]
    pub(crate) unsafe fn ids<'a>(self) -> &'a [u64] {
        // SAFETY: live for `'a` (caller contract).
        let len = unsafe { self.len() };
        let off = shape::<V>(len).ids;
        // SAFETY: as in `values`.
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr().cast::<u8>().add(off).cast::<u64>(), len)
        }
    }

    /// Raw pointer to the values array (no reference is created, so the
    /// owner may drop or move values through it).
    fn values_ptr(self) -> *mut V {
        // SAFETY: the offset lies inside the record's allocation.
        unsafe {
            self.ptr
                .as_ptr()
                .cast::<u8>()
                .add(values_offset::<V>())
                .cast::<V>()
        }
    }

    /// Takes one more reference: the record is about to be published in
    /// one more slot, or a writer keeps it across lock releases.
    ///
    /// # Safety
    ///
    /// The caller holds a reference already (the record is in a slot whose
    /// stripe lock the caller holds, or the caller acquired it before), so
    /// it cannot reach zero meanwhile.
    pub(crate) unsafe fn acquire(self) {
        // SAFETY: live (caller contract).
        let h = unsafe { &*self.ptr.as_ptr() };
        // Relaxed: the caller's own reference keeps the count above zero,
        // and a new reference needs no ordering with others (as `Arc`'s
        // clone).
        h.refs.fetch_add(1, Ordering::Relaxed);
    }

    /// Gives back one reference (an unlinked slot's, or a writer's);
    /// `true` when it was the last: the caller then owns the record and
    /// retires or frees it.
    ///
    /// # Safety
    ///
    /// The caller holds the reference it gives back, and gives it back
    /// once.
    #[must_use]
    pub(crate) unsafe fn release(self) -> bool {
        // SAFETY: live until the count reaches zero (caller contract).
        let h = unsafe { &*self.ptr.as_ptr() };
        // AcqRel: the Release half orders every writer's reads of the
        // record (ids and values cloned under its locks) before its
        // decrement; the last decrement's Acquire half pairs with each
        // earlier one, so those reads happen before the record is retired
        // (`Arc`'s drop, with the fence folded into the RMW, which
        // ThreadSanitizer also sees).
        h.refs.fetch_sub(1, Ordering::AcqRel) & !SHARED_KIND == 1
    }

    /// Whether another slot or writer holds the record too (a hint unless
    /// the caller holds every lock that could change it).
    ///
    /// # Safety
    ///
    /// As for [`RecordPtr::len`].
    pub(crate) unsafe fn shared(self) -> bool {
        // SAFETY: live (caller contract).
        let h = unsafe { &*self.ptr.as_ptr() };
        // Relaxed: a count; the caller's own reference keeps it live.
        h.refs.load(Ordering::Relaxed) & !SHARED_KIND > 1
    }

    /// Whether the record was built for sharing ([`RecordPtr::build_shared`]).
    ///
    /// # Safety
    ///
    /// As for [`RecordPtr::len`].
    pub(crate) unsafe fn shared_kind(self) -> bool {
        // SAFETY: live (caller contract).
        let h = unsafe { &*self.ptr.as_ptr() };
        // Relaxed: the bit is set before the record is published and never
        // changes.
        h.refs.load(Ordering::Relaxed) & SHARED_KIND != 0
    }

    /// The bytes a stripe counts for the record: all of a private
    /// record's, none of a shared one's (counted once for the index).
    ///
    /// # Safety
    ///
    /// As for [`RecordPtr::len`].
    pub(crate) unsafe fn private_bytes(self) -> isize {
        // SAFETY: caller contract.
        unsafe {
            match self.shared_kind() {
                true => 0,
                false => self.bytes() as isize,
            }
        }
    }

    /// The bytes the index's shared count holds for the record: all of a
    /// shared record's, none of a private one's.
    ///
    /// # Safety
    ///
    /// As for [`RecordPtr::len`].
    pub(crate) unsafe fn shared_bytes(self) -> usize {
        // SAFETY: caller contract.
        unsafe {
            match self.shared_kind() {
                true => self.bytes(),
                false => 0,
            }
        }
    }

    /// Bytes the record occupies (allocation size).
    ///
    /// # Safety
    ///
    /// As for [`RecordPtr::len`].
    pub(crate) unsafe fn bytes(self) -> usize {
        // SAFETY: the record is live (caller contract).
        shape::<V>(unsafe { self.len() }).layout.size()
    }

    /// The record's memory as a [`RecordMem`] owning its first `owned`
    /// values: dropping it drops those and frees the record.
    ///
    /// # Safety
    ///
    /// The caller owns the record and those values (as for
    /// [`RecordPtr::free`]) and lets the result drop once.
    unsafe fn memory(self, owned: usize) -> RecordMem<V> {
        RecordMem {
            base: self.ptr.as_ptr().cast(),
            // SAFETY: we own the record, so it is live (caller contract).
            layout: shape::<V>(unsafe { self.len() }).layout,
            values: self.values_ptr(),
            written: owned,
        }
    }

    /// Drops every value and frees the record.
    ///
    /// # Safety
    ///
    /// The caller owns the record (no reader can reach it any more, and no
    /// one else frees it).
    pub(crate) unsafe fn free(self) {
        // SAFETY: caller contract: we own the record and its `len`
        // initialised values; dropping this drops them once and frees the
        // memory, the memory even if a destructor panics.
        drop(unsafe { self.memory(self.len()) });
    }

    /// Moves out the values whose ids satisfy `keep_out`, drops the others,
    /// and frees the record.
    ///
    /// # Safety
    ///
    /// As for [`RecordPtr::free`].
    pub(crate) unsafe fn free_extracting(
        self,
        mut keep_out: impl FnMut(u64) -> bool,
        out: &mut Vec<(u64, V)>,
    ) {
        // Frees the memory at the end, or if a destructor panics (the
        // values not reached yet are then leaked, never dropped twice).
        // Owns no values: each is moved out or dropped below.
        // SAFETY: caller contract: we own the record.
        let _mem = unsafe { self.memory(0) };
        // SAFETY: caller contract: we own the record; each value is read or
        // dropped exactly once, and the ids are read before `_mem` frees
        // the memory.
        unsafe {
            let values = self.values_ptr();
            let ids = self.ids::<'_>();
            for (i, &id) in ids.iter().enumerate() {
                let v = values.add(i);
                if keep_out(id) {
                    out.push((id, v.read()));
                } else {
                    v.drop_in_place();
                }
            }
        }
    }
}

/// Type-erased destructor for deferred reclamation of a record of `V`s.
///
/// # Safety
///
/// `p` is an owned record of `V`s, unreachable by any reader.
pub(crate) unsafe fn drop_record<V>(p: *mut ()) {
    // SAFETY: caller contract.
    unsafe { RecordPtr::<V>::from_raw(p.cast()).free() }
}
