//! The dispatchers the probe benchmarks compare: `fprobe::probe::Registry`
//! and what an engine writes without this crate, a locked
//! `HashMap<address, Vec<Arc<handler>>>` looked up on every entry plus a
//! thread-local shadow stack pairing exits with entries (the Rust twin of
//! `capi/sqlite-profiler/src/baseline.rs`), and that engine made as fast
//! as it goes at one thread (`mutex-hashbrown`).
//!
//! Every dispatcher runs the same handlers: the entry handler counts the
//! call in the producer's [`Hits`] and, for probes with an exit handler,
//! writes the address into the call's 8 bytes of data; the exit handler
//! counts the return only if the data came back intact. The producers
//! check both counts against the calls they made.

use std::cell::{RefCell, UnsafeCell};
use std::hint::black_box;
use std::sync::{Arc, Mutex, RwLock};

use fprobe::probe::{EntryAction, Fprobe, Registry};
use hashbrown::{DefaultHashBuilder, HashMap};

use crate::harness::PaddedCounter;

/// Per-call data bytes of the probes with exit handlers.
pub const DATA: usize = 8;

/// The engine context every dispatch passes: the calling producer's
/// handler counts, on its own lines.
#[derive(Default)]
pub struct Hits {
    pub entries: PaddedCounter,
    pub exits: PaddedCounter,
}

/// A dispatcher as the producers drive it: `on_entry` when a probed
/// function is entered, `on_exit` when it returns, in LIFO pairs.
pub trait Dispatch: Sync {
    fn on_entry(&self, addr: u64, ret_addr: u64, hits: &Hits);
    fn on_exit(&self, ret_addr: u64, hits: &Hits);

    /// One call of each address of `addrs`: entry, then exit (a leaf
    /// function). One dynamic dispatch per batch; the loop is monomorphic.
    #[inline(never)]
    fn calls(&self, addrs: &[u64], hits: &Hits) {
        for &a in addrs {
            self.on_entry(a, RET_ADDR, hits);
            self.on_exit(RET_ADDR, hits);
        }
    }
}

/// The caller address every call passes.
const RET_ADDR: u64 = 0x7f00_0000_1234;

/// Every dispatcher name, fprobe's first, with what it is.
pub const NAMES: &[(&str, &str)] = &[
    (
        "fprobe",
        "fprobe::probe::Registry::on_entry/on_exit (RCU index, per-thread return instances)",
    ),
    (
        "rwlock-hashmap",
        "std RwLock<HashMap<u64, Vec<Arc<handler>>>> read per entry; thread-local shadow stack",
    ),
    (
        "mutex-hashmap",
        "std Mutex<HashMap<u64, Vec<Arc<handler>>>> per entry; thread-local shadow stack",
    ),
    (
        "mutex-hashbrown",
        "one parking_lot Mutex<hashbrown::HashMap<u64, Vec<handler>>> lock per entry; lock-free exit \
         from a thread-local stack of raw handler pointers + data",
    ),
    (
        "mutex-hashbrown-shared",
        "mutex-hashbrown with one Arc<[handler]> for all the addresses of the probe (a handler list \
         interned, as fprobe's records are)",
    ),
];

/// Builds the dispatchers whose names pass `keep`, in [`NAMES`] order: one
/// probe attached to every address of `addrs`, with an exit handler if
/// `exit`.
pub fn build(
    addrs: &[u64],
    exit: bool,
    keep: &dyn Fn(&str) -> bool,
) -> Vec<(&'static str, Box<dyn Dispatch>)> {
    let mut out: Vec<(&'static str, Box<dyn Dispatch>)> = Vec::new();
    for &(name, _) in NAMES {
        if !keep(name) {
            continue;
        }
        let d: Box<dyn Dispatch> = match name {
            "fprobe" => Box::new(fprobe_registry(addrs, exit)),
            "rwlock-hashmap" => Box::new(Locked(RwLock::new(handler_map(addrs, exit)))),
            "mutex-hashmap" => Box::new(Locked(Mutex::new(handler_map(addrs, exit)))),
            "mutex-hashbrown" => Box::new(Fast(parking_lot::Mutex::new(
                addrs.iter().map(|&a| (a, vec![handler(exit)])).collect(),
            ))),
            "mutex-hashbrown-shared" => {
                let list: Arc<[Handler]> = Arc::new([handler(exit)]);
                Box::new(Fast(parking_lot::Mutex::new(
                    addrs.iter().map(|&a| (a, list.clone())).collect(),
                )))
            }
            _ => unreachable!("NAMES and build disagree on {name}"),
        };
        out.push((name, d));
    }
    out
}

fn fprobe_registry(addrs: &[u64], exit: bool) -> Registry<Hits> {
    let reg = Registry::<Hits>::builder()
        .capacity(addrs.len())
        .build()
        .expect("valid configuration");
    let probe = Fprobe::<Hits>::builder().entry(|e| {
        e.ctx.entries.add(1);
        if let Some(d) = e.data.get_mut(..DATA) {
            d.copy_from_slice(&e.addr.to_ne_bytes());
        }
        EntryAction::Continue
    });
    let probe = if exit {
        probe.data_size(DATA).exit(|x| {
            x.ctx.exits.add(u64::from(x.data == x.addr.to_ne_bytes()));
        })
    } else {
        probe
    };
    reg.register(probe.build(), addrs)
        .expect("registry sized for the set");
    reg
}

impl Dispatch for Registry<Hits> {
    #[inline]
    fn on_entry(&self, addr: u64, ret_addr: u64, hits: &Hits) {
        Registry::on_entry(self, addr, ret_addr, hits);
    }

    #[inline]
    fn on_exit(&self, ret_addr: u64, hits: &Hits) {
        Registry::on_exit(self, ret_addr, hits);
    }
}

type EntryFn = Box<dyn Fn(u64, &Hits, &mut [u8; DATA]) + Send + Sync>;
type ExitFn = Box<dyn Fn(u64, &Hits, &[u8; DATA]) + Send + Sync>;

/// A probe of the baseline: its handlers (boxed closures, as fprobe's).
pub struct Handler {
    entry: EntryFn,
    exit: Option<ExitFn>,
}

type Map = HashMap<u64, Vec<Arc<Handler>>, DefaultHashBuilder>;

/// The benchmark's probe: the entry handler counts the call and writes the
/// address into the data, the exit handler (if `exit`) counts intact data.
fn handler(exit: bool) -> Handler {
    Handler {
        entry: Box::new(|addr, hits, data| {
            hits.entries.add(1);
            *data = addr.to_ne_bytes();
        }),
        exit: exit.then(|| -> ExitFn {
            Box::new(|addr, hits, data| hits.exits.add(u64::from(*data == addr.to_ne_bytes())))
        }),
    }
}

/// One probe (one shared `Handler`) on every address, as `register` does.
fn handler_map(addrs: &[u64], exit: bool) -> Map {
    let h = Arc::new(handler(exit));
    addrs.iter().map(|&a| (a, vec![h.clone()])).collect()
}

/// Read access to the baseline's table through some lock.
pub trait TableLock: Send + Sync {
    fn with<R>(&self, f: impl FnOnce(&Map) -> R) -> R;
}

impl TableLock for RwLock<Map> {
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&Map) -> R) -> R {
        f(&self.read().unwrap_or_else(|e| e.into_inner()))
    }
}

impl TableLock for Mutex<Map> {
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&Map) -> R) -> R {
        f(&self.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The baseline dispatcher. Entry handlers run under the lock; each probe
/// with an exit handler leaves an `Arc` clone of it (so unregistering
/// cannot free it under a pending return) and its data on the thread's
/// shadow stack. No re-entrancy guard, no miss counters.
pub struct Locked<L>(L);

/// A pending exit: what the shadow stack holds per probe per call.
struct Pending {
    handler: Arc<Handler>,
    addr: u64,
    data: [u8; DATA],
}

#[derive(Default)]
struct Shadow {
    pending: Vec<Pending>,
    /// Pending exits pushed by each call, one entry per call.
    frames: Vec<u16>,
}

std::thread_local! {
    static SHADOW: RefCell<Shadow> = RefCell::new(Shadow::default());
}

impl<L: TableLock> Dispatch for Locked<L> {
    #[inline]
    fn on_entry(&self, addr: u64, _ret_addr: u64, hits: &Hits) {
        SHADOW.with_borrow_mut(|s| {
            let mut n = 0u16;
            self.0.with(|m| {
                for h in m.get(&addr).map_or(&[][..], Vec::as_slice) {
                    let mut data = [0u8; DATA];
                    (h.entry)(addr, hits, &mut data);
                    if h.exit.is_some() {
                        s.pending.push(Pending {
                            handler: h.clone(),
                            addr,
                            data,
                        });
                        n += 1;
                    }
                }
            });
            s.frames.push(n);
        });
    }

    #[inline]
    fn on_exit(&self, _ret_addr: u64, hits: &Hits) {
        SHADOW.with_borrow_mut(|s| {
            for _ in 0..s.frames.pop().unwrap_or(0) {
                let p = s.pending.pop().expect("pushed at entry");
                if let Some(exit) = &p.handler.exit {
                    exit(p.addr, hits, &p.data);
                }
                black_box(p);
            }
        });
    }
}

/// `mutex-hashbrown`: the strongest simple engine, the baseline stripped
/// of everything one thread pays for and does not need. One uncontended
/// lock per entry (a compare-and-swap and a release; held while the entry
/// handlers run, so the table cannot change under them; parking_lot's, as
/// fast as std's at one thread here and faster at two), handlers stored
/// in the table (no `Arc`, no refcount traffic), and an exit that never
/// touches the table or the lock: it pops the call's frame from a
/// thread-local stack, reached without a `RefCell` borrow flag, and calls
/// the exit handlers through raw pointers. What it gives up: unregistering
/// (a pointer on some thread's stack would dangle) and re-entrancy (a
/// handler calling back in would alias the stack).
///
/// `L`: the table's handler list per address, its own (`Vec`) or one
/// shared by every address of the probe (`Arc<[Handler]>`).
pub struct Fast<L>(parking_lot::Mutex<HashMap<u64, L, DefaultHashBuilder>>);

/// A pending exit: the probe's handler and its call's data.
struct FastPending {
    /// Points into a handler list of the table, which the benchmark
    /// never changes after building it (no probe is removed, no address
    /// added), so the pointer stays valid as long as the dispatcher.
    handler: *const Handler,
    data: [u8; DATA],
}

/// The thread's shadow stack: per call one frame, `(address, pending exits
/// it pushed)`, and the pending exits of every open call.
struct FastShadow {
    frames: Vec<(u64, u32)>,
    pending: Vec<FastPending>,
}

std::thread_local! {
    // `const`: no lazy-initialisation check per access.
    static FAST_SHADOW: UnsafeCell<FastShadow> = const {
        UnsafeCell::new(FastShadow { frames: Vec::new(), pending: Vec::new() })
    };
}

/// The calling thread's shadow stack.
///
/// # Safety
///
/// The caller holds no other reference from this function: the handlers
/// never dispatch, so entry and exit never nest on one thread.
#[inline(always)]
unsafe fn fast_shadow() -> &'static mut FastShadow {
    // SAFETY: thread-local, so only this thread reaches it; the caller
    // keeps the one live reference. `'static` is a lie limited to the
    // caller's scope, which never outlives the thread.
    FAST_SHADOW.with(|s| unsafe { &mut *s.get() })
}

impl<L: AsRef<[Handler]> + Send> Dispatch for Fast<L> {
    #[inline]
    fn on_entry(&self, addr: u64, _ret_addr: u64, hits: &Hits) {
        // SAFETY: the one reference on this thread (see `fast_shadow`).
        let s = unsafe { fast_shadow() };
        let mut n = 0u32;
        let map = self.0.lock();
        for h in map.get(&addr).map_or(&[][..], AsRef::as_ref) {
            let mut data = [0u8; DATA];
            (h.entry)(addr, hits, &mut data);
            if h.exit.is_some() {
                s.pending.push(FastPending { handler: h, data });
                n += 1;
            }
        }
        drop(map);
        s.frames.push((addr, n));
    }

    #[inline]
    fn on_exit(&self, _ret_addr: u64, hits: &Hits) {
        // SAFETY: the one reference on this thread (see `fast_shadow`).
        let s = unsafe { fast_shadow() };
        let Some((addr, n)) = s.frames.pop() else {
            return;
        };
        for p in s.pending.drain(s.pending.len() - n as usize..).rev() {
            // SAFETY: valid for the dispatcher's life (see `FastPending`).
            let h = unsafe { &*p.handler };
            if let Some(exit) = &h.exit {
                exit(addr, hits, &p.data);
            }
        }
    }
}
