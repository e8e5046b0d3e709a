//! Baselines for `benches/objpool.rs`: the designs an objpool replaces or
//! competes with. Bench-only code, never part of the library.

use std::cell::UnsafeCell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A 64-byte object, the size of a small return instance.
pub type Obj = [u64; 8];

/// A Treiber-stack freelist of object indices: the kernel's pre-2023
/// kretprobe design. ABA protection: `head` packs a 32-bit tag that every
/// successful CAS increments with the index + 1 (0 = empty).
pub struct TreiberFreelist {
    head: AtomicU64,
    next: Box<[AtomicU32]>,
    objs: Box<[UnsafeCell<Obj>]>,
}

// SAFETY: each object index is owned by one thread between its pop and its
// push (the CAS hands it over with Acquire/Release), so objects are never
// accessed by two threads at once.
unsafe impl Sync for TreiberFreelist {}

impl TreiberFreelist {
    pub fn new(n: usize) -> Self {
        let s = Self {
            head: AtomicU64::new(0),
            next: (0..n).map(|_| AtomicU32::new(0)).collect(),
            objs: (0..n).map(|_| UnsafeCell::new([0; 8])).collect(),
        };
        for i in 0..n as u32 {
            s.push(i);
        }
        s
    }

    #[inline]
    pub fn pop(&self) -> Option<u32> {
        // Acquire: pairs with the Release CAS in `push`; `next` and the
        // object are visible.
        let mut h = self.head.load(Ordering::Acquire);
        loop {
            let top = h as u32;
            if top == 0 {
                return None;
            }
            let next = self.next[top as usize - 1].load(Ordering::Relaxed);
            let new = ((h >> 32).wrapping_add(1) << 32) | u64::from(next);
            match self
                .head
                .compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(top - 1),
                Err(now) => h = now,
            }
        }
    }

    #[inline]
    pub fn push(&self, i: u32) {
        let mut h = self.head.load(Ordering::Relaxed);
        loop {
            self.next[i as usize].store(h as u32, Ordering::Relaxed);
            let new = ((h >> 32).wrapping_add(1) << 32) | u64::from(i + 1);
            // Release: publishes `next` and the object to the next popper.
            match self
                .head
                .compare_exchange_weak(h, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => h = now,
            }
        }
    }

    /// Object `i`; the caller must own it (popped, not yet pushed).
    #[inline]
    pub fn obj(&self, i: u32) -> *mut Obj {
        self.objs[i as usize].get()
    }
}

/// `Mutex<Vec<Box<Obj>>>`: the lock-based pool. It holds pointers, as the
/// other pools hand out objects by reference rather than by copy.
#[allow(clippy::vec_box)]
pub struct MutexPool(pub Mutex<Vec<Box<Obj>>>);

impl MutexPool {
    pub fn new(n: usize) -> Self {
        Self(Mutex::new((0..n).map(|_| Box::new([0; 8])).collect()))
    }
}
