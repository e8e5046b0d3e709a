//! Return-instance pools under the kretprobe pattern (pop at entry, push at
//! return) and the uretprobe-nop pattern, with the baselines an objpool
//! replaces or competes with: what the `objpool` and `uretprobe-nop`
//! benchmarks (`bench_pools.rs`) run.

use std::cell::UnsafeCell;
use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_queue::ArrayQueue;
use fprobe::ObjPool;
use fprobe::retinst::{ProbeRef, RetInstPool, ReturnStack};

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

/// One way to get and give back a return instance, per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// kretprobe: `fprobe::ObjPool` pop at entry, push (drop) at return.
    ObjPool,
    /// kretprobe: the tagged Treiber freelist (pre-2023 kretprobe).
    Treiber,
    /// kretprobe: crossbeam `ArrayQueue` of boxes.
    ArrayQueue,
    /// kretprobe: `Mutex<Vec>` of boxes.
    MutexVec,
    /// kretprobe: a fresh `Box` per call (glibc malloc + free).
    Malloc,
    /// uretprobe-nop: `fprobe::retinst` per-thread return-instance reuse.
    RetInst,
    /// uretprobe-nop: a `Box`ed return instance allocated per call.
    RetInstBox,
}

/// The kretprobe-pattern pools, fprobe's first: (pattern, short name, what it is).
pub const KRETPROBE: &[(Pattern, &str, &str)] = &[
    (
        Pattern::ObjPool,
        "fprobe::ObjPool",
        "per-thread magazines, lock-free depot, steal when empty",
    ),
    (
        Pattern::Treiber,
        "treiber-freelist",
        "tagged Treiber-stack freelist (pre-2023 kretprobe)",
    ),
    (
        Pattern::ArrayQueue,
        "crossbeam-arrayqueue",
        "crossbeam_queue::ArrayQueue<Box<Obj>>",
    ),
    (Pattern::MutexVec, "mutex-vec", "Mutex<Vec<Box<Obj>>>"),
    (
        Pattern::Malloc,
        "box-malloc",
        "Box::new + drop per call (glibc malloc/free, its tcache a per-thread pool)",
    ),
];

/// The uretprobe-nop contenders, fprobe's first.
pub const URETPROBE: &[(Pattern, &str, &str)] = &[
    (
        Pattern::RetInst,
        "fprobe::retinst",
        "ReturnStack push + pop: per-thread LIFO reuse, seqcount-guarded",
    ),
    (
        Pattern::RetInstBox,
        "box-per-call",
        "a Box<return instance> (probe, address, 64 data bytes) per call",
    ),
];

/// What a return instance holds, allocated per call by [`Pattern::RetInstBox`].
struct BoxedRi {
    probe: ProbeRef,
    addr: u64,
    data: [u8; 64],
}

const PROBE: ProbeRef = ProbeRef {
    slot: 1,
    generation: 1,
};
const ADDR: u64 = 0x40_1000;

/// Every pool, `nr_objs` objects each.
pub struct Pools {
    objpool: ObjPool<Obj>,
    treiber: TreiberFreelist,
    mutex: MutexPool,
    queue: ArrayQueue<Box<Obj>>,
    retinst: RetInstPool,
}

/// A producer thread's own state: its return stack for [`Pattern::RetInst`].
pub type ThreadState = Option<ReturnStack>;

#[inline(always)]
fn touch(o: &mut Obj) {
    o[0] = o[0].wrapping_add(1);
    black_box(o);
}

impl Pools {
    pub fn new(nr_objs: usize) -> Self {
        let queue = ArrayQueue::new(nr_objs);
        for _ in 0..nr_objs {
            queue.push(Box::new([0u64; 8])).expect("sized for nr_objs");
        }
        Self {
            objpool: ObjPool::new(nr_objs, |_| [0u64; 8]),
            treiber: TreiberFreelist::new(nr_objs),
            mutex: MutexPool::new(nr_objs),
            queue,
            retinst: RetInstPool::builder()
                .instances(nr_objs)
                .data_size(64)
                .build()
                .expect("valid configuration"),
        }
    }

    /// The state a producer of `p` needs, made on the producer's thread.
    pub fn thread_state(&self, p: Pattern) -> ThreadState {
        (p == Pattern::RetInst).then(|| self.retinst.register_thread())
    }

    /// `n` calls' worth of `p` (get an instance, touch it, give it back);
    /// one dispatch on `p` per batch, so the loops are monomorphic. Returns
    /// the calls that got an instance: fprobe's pools can miss while
    /// objects sit behind a pusher preempted between reserving and
    /// publishing a ring position (see [`Pools::nmissed`]); the baselines
    /// never miss here.
    #[inline(never)]
    pub fn pairs(&self, p: Pattern, state: &mut ThreadState, n: u64) -> u64 {
        let mut done = n;
        match p {
            Pattern::ObjPool => {
                for _ in 0..n {
                    match self.objpool.pop() {
                        Some(mut o) => touch(&mut o),
                        None => done -= 1,
                    }
                }
            }
            Pattern::Treiber => {
                for _ in 0..n {
                    let i = self.treiber.pop().expect("one in flight per thread");
                    // SAFETY: index `i` is ours until pushed back.
                    touch(unsafe { &mut *self.treiber.obj(i) });
                    self.treiber.push(i);
                }
            }
            Pattern::ArrayQueue => {
                for _ in 0..n {
                    let mut b = self.queue.pop().expect("one in flight per thread");
                    touch(&mut b);
                    self.queue.push(b).expect("we took one");
                }
            }
            Pattern::MutexVec => {
                for _ in 0..n {
                    let mut b = self.mutex.0.lock().unwrap().pop().expect("one in flight");
                    touch(&mut b);
                    self.mutex.0.lock().unwrap().push(b);
                }
            }
            Pattern::Malloc => {
                for _ in 0..n {
                    // `black_box` on the value: `Box::new([0; 8])` would become
                    // `calloc`, which bypasses glibc's tcache (3x slower here).
                    let mut b = black_box(Box::new(black_box([0u64; 8])));
                    touch(&mut b);
                    drop(black_box(b));
                }
            }
            Pattern::RetInst => {
                let s = state.as_mut().expect("thread_state(RetInst)");
                for _ in 0..n {
                    let Ok(data) = s.push(PROBE, ADDR, 16) else {
                        done -= 1;
                        continue;
                    };
                    data[0] = data[0].wrapping_add(1);
                    let ri = s.pop().expect("just pushed");
                    black_box(ri.data()[0]);
                }
            }
            Pattern::RetInstBox => {
                for _ in 0..n {
                    let mut ri = black_box(Box::new(black_box(BoxedRi {
                        probe: PROBE,
                        addr: ADDR,
                        data: [0; 64],
                    })));
                    ri.data[0] = ri.data[0].wrapping_add(1);
                    black_box((ri.probe, ri.addr, ri.data[0]));
                    drop(black_box(ri));
                }
            }
        }
        done
    }

    /// Pops that found no instance so far: `(ObjPool, retinst)`.
    pub fn nmissed(&self) -> (u64, u64) {
        let r = self.retinst.stats();
        (self.objpool.nmissed(), r.missed_exhausted + r.missed_depth)
    }
}
