//! README.md's "Bad input" table, row by row: one test per row about the
//! Rust API, named after its row, asserting the row's result and the state
//! it guarantees. The rows about the C ABI are tested in
//! `capi/tests/bad_input.rs`. [`ROWS`] maps every row of the table to the
//! test that covers it, and `readme_bad_input_rows_each_have_a_test` fails
//! when the table and [`ROWS`] differ (a row added to the README without a
//! test, or a test left behind by a removed row).

use std::any::Any;
use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use fprobe::objpool::{MAX_OBJECTS, MAX_THREAD_CACHE, ObjPoolError};
use fprobe::probe::{EntryAction, Fprobe, MAX_DATA_SIZE, ProbeHandle, ProbeStats, Registry};
use fprobe::{AddrIndex, EntryId, Error, HitCache, HitCacheConfig, ObjPool, rcu};

#[path = "common/signal_storm.rs"]
mod signal_storm;

/// Every row of the table, as the start of its first column, with the
/// test covering it (`file::function`, the file under the workspace root).
const ROWS: &[(&str, &str)] = &[
    (
        "`remove`/`take` with an unknown id",
        "tests/bad_input.rs::row_remove_or_take_unknown_stale_or_foreign_id_is_not_found",
    ),
    (
        "`insert` of a new address beyond `max_addresses`",
        "tests/bad_input.rs::row_insert_beyond_max_addresses_hands_the_value_back",
    ),
    (
        "`insert_many` that does not fit",
        "tests/bad_input.rs::row_insert_many_that_does_not_fit_hands_every_value_back_in_input_order",
    ),
    (
        "builder: `min_slots` not a power of two",
        "tests/bad_input.rs::row_index_builder_out_of_range_is_invalid_config",
    ),
    (
        "address 0 or `u64::MAX`",
        "tests/bad_input.rs::row_address_zero_and_max_are_ordinary_addresses",
    ),
    (
        "`rcu::synchronize`, `rcu::barrier`, `AddrIndex::take` inside a read-side section",
        "tests/bad_input.rs::row_waiting_inside_a_read_section_panics_and_changes_nothing",
    ),
    (
        "a retired object's destructor panics",
        "tests/bad_input.rs::row_retired_destructor_panic_is_caught_and_counted",
    ),
    (
        "a value's destructor panics while an `AddrIndex` is dropped",
        "tests/bad_input.rs::row_value_destructor_panic_during_index_drop_propagates_after_the_drop",
    ),
    (
        "`V::clone` panics during a copy-on-write",
        "tests/bad_input.rs::row_clone_panic_during_copy_on_write_leaves_the_index_unchanged",
    ),
    (
        "more than 16,383 nested read guards on one thread",
        "tests/bad_input.rs::row_more_than_16383_nested_read_guards_abort",
    ),
    (
        "probe `register` beyond `max_probes`",
        "tests/bad_input.rs::row_register_beyond_max_probes_or_data_size_registers_nothing",
    ),
    (
        "probe `register` with no address",
        "tests/bad_input.rs::row_register_with_no_address_or_no_handler_is_invalid_argument",
    ),
    (
        "`unregister`, `enable`, `disable`, `stats` with a stale handle",
        "tests/bad_input.rs::row_stale_probe_handle_is_not_found",
    ),
    (
        "`unregister`/`drain` from a handler",
        "tests/bad_input.rs::row_unregister_or_drain_that_would_wait_for_itself_panics",
    ),
    (
        "a probe handler panics",
        "tests/bad_input.rs::row_handler_panic_is_contained_and_counted",
    ),
    (
        "a handler uses per-call data its probe did not declare",
        "tests/bad_input.rs::row_undeclared_per_call_data_is_a_contained_panic_reported_once",
    ),
    (
        "thread's shadow stack full",
        "tests/bad_input.rs::row_full_shadow_stack_skips_deeper_exits_and_keeps_pairing",
    ),
    (
        "a handler calls a probed function",
        "tests/bad_input.rs::row_handler_calling_a_probed_function_is_counted_as_recursion",
    ),
    (
        "a signal handler dispatches in the middle of a dispatch",
        "tests/bad_input.rs::row_signal_handler_dispatch_mid_dispatch_runs_its_probes",
    ),
    (
        "hit-cache `entries` not a power of two",
        "tests/bad_input.rs::row_hit_cache_config_out_of_range_is_invalid_config",
    ),
    (
        "C ABI: a NULL pointer argument",
        "capi/tests/bad_input.rs::row_c_null_pointer_argument_is_e_null",
    ),
    (
        "C ABI: unknown, stale or foreign probe handle",
        "capi/tests/bad_input.rs::row_c_unknown_stale_or_foreign_handle_is_e_not_found",
    ),
    (
        "C ABI: any call on a destroyed registry",
        "capi/tests/bad_input.rs::row_c_call_on_a_destroyed_registry_is_e_destroyed",
    ),
    (
        "C ABI: probe with no handler, no address",
        "capi/tests/bad_input.rs::row_c_invalid_probe_or_config_is_e_invalid",
    ),
    (
        "C ABI: `fprobe_unregister`/`fprobe_registry_destroy`/`fprobe_barrier` from a handler",
        "capi/tests/bad_input.rs::row_c_call_that_would_wait_for_itself_is_e_busy",
    ),
    (
        "`ObjPool` builder",
        "tests/bad_input.rs::row_objpool_builder_out_of_range_is_an_error",
    ),
    (
        "probe registry builder",
        "tests/bad_input.rs::row_registry_builder_out_of_range_is_invalid_config",
    ),
    (
        "`on_exit` with no matching `on_entry`",
        "tests/bad_input.rs::row_on_exit_without_on_entry_is_ignored",
    ),
    (
        "calls nested deeper than the shadow stack holds",
        "tests/bad_input.rs::row_calls_deeper_than_the_shadow_stack_keep_pairing",
    ),
    (
        "C ABI: `fprobe_patch_functions(NULL, 0, &n)`",
        "capi/tests/bad_input.rs::row_c_patch_functions_sizing_call_writes_only_the_count",
    ),
];

const README: &str = include_str!("../README.md");
const THIS_FILE: &str = include_str!("bad_input.rs");
const CAPI_FILE: &str = include_str!("../capi/tests/bad_input.rs");

/// The rows of README.md's "Bad input" table (header and separator
/// excluded), as written.
fn readme_rows() -> Vec<&'static str> {
    let (_, section) = README
        .split_once("\n## Bad input\n")
        .expect("README.md has a \"## Bad input\" section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let table: Vec<&str> = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert!(
        table.len() >= 2 && table[1].starts_with("|---"),
        "the section's first table has a header and a separator: {table:?}"
    );
    table[2..].to_vec()
}

/// The table and [`ROWS`] agree row for row, and every test [`ROWS`]
/// names exists.
#[test]
fn readme_bad_input_rows_each_have_a_test() {
    let rows = readme_rows();
    for row in &rows {
        let covering: Vec<_> = ROWS
            .iter()
            .filter(|(prefix, _)| row.starts_with(&format!("| {prefix}")))
            .collect();
        assert_eq!(
            covering.len(),
            1,
            "README row {row:?} must be matched by exactly one entry of ROWS \
             (add a test for a new row, and its entry)"
        );
    }
    for (prefix, test) in ROWS {
        let matched = rows
            .iter()
            .filter(|row| row.starts_with(&format!("| {prefix}")))
            .count();
        assert_eq!(
            matched, 1,
            "ROWS entry {prefix:?} must match exactly one README row"
        );
        let (file, name) = test.split_once("::").expect("file::function");
        let source = match file {
            "tests/bad_input.rs" => THIS_FILE,
            "capi/tests/bad_input.rs" => CAPI_FILE,
            other => panic!("unexpected file {other}"),
        };
        assert!(
            source.contains(&format!("fn {name}()")),
            "{test} (covering {prefix:?}) does not exist"
        );
    }
    assert_eq!(
        rows.len(),
        ROWS.len(),
        "the README's Bad input table has {} rows, this file covers {}",
        rows.len(),
        ROWS.len()
    );
}

// ---------------------------------------------------------------- helpers

/// An index's content: every address with its ids and values (mapped by
/// `f`), in address order.
type Content<T> = Vec<(u64, Vec<(EntryId, T)>)>;

/// The [`Content`] of `index`.
fn content<V: Clone + Send + Sync + 'static, T>(
    index: &AddrIndex<V>,
    f: impl Fn(&V) -> T,
) -> Content<T> {
    let guard = rcu::read_lock();
    let mut addrs: Vec<u64> = index.iter(&guard).map(|(a, _)| a).collect();
    addrs.sort_unstable();
    addrs.dedup();
    addrs
        .into_iter()
        .map(|a| {
            let (ids, values) = index.get_with_ids(a, &guard);
            (a, ids.iter().copied().zip(values.iter().map(&f)).collect())
        })
        .collect()
}

/// The message of a caught panic.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        String::from("<non-string panic>")
    }
}

/// Whether `f` panics with a message containing `needle`.
fn panics_with(needle: &str, f: impl FnOnce()) -> bool {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(()) => false,
        Err(p) => {
            let msg = panic_message(&*p);
            assert!(msg.contains(needle), "panic {msg:?} lacks {needle:?}");
            true
        }
    }
}

/// The address-to-stripe function of the index
/// (`src/index/raw/mod.rs`, `stripe_of`), for an index of two stripes:
/// lets a test order a bulk insert's stripe runs.
fn stripe_of_two(key: u64) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize & 1
}

fn counter() -> Arc<AtomicU64> {
    Arc::new(AtomicU64::new(0))
}

/// A probe counting its entries and exits, with the exit checking the data
/// its entry wrote (the call's return address): a mismatch panics, which
/// dispatch contains, and the exit goes uncounted.
fn counting_probe(entries: &Arc<AtomicU64>, exits: &Arc<AtomicU64>) -> Fprobe<()> {
    let (e, x) = (entries.clone(), exits.clone());
    Fprobe::builder()
        .data_size(8)
        .entry(move |c| {
            e.fetch_add(1, Ordering::Relaxed);
            c.data.copy_from_slice(&c.ret_addr.to_ne_bytes());
            EntryAction::Continue
        })
        .exit(move |c| {
            assert_eq!(c.data, c.ret_addr.to_ne_bytes(), "entry's data intact");
            x.fetch_add(1, Ordering::Relaxed);
        })
        .build()
}

// ------------------------------------------------------------- index rows

/// Row: "`remove`/`take` with an unknown id, an id already removed, or an
/// id of another address" → `Err(Error::NotFound)`, nothing changes.
#[test]
fn row_remove_or_take_unknown_stale_or_foreign_id_is_not_found() {
    let index = AddrIndex::builder().min_slots(8).build().unwrap();
    let a = index.insert(1, 10u64).unwrap();
    let b = index.insert(2, 20).unwrap();
    index.insert(2, 21).unwrap();
    let removed = index.insert(1, 11).unwrap();
    index.remove(1, removed).unwrap();
    let taken = index.insert(3, 30).unwrap();
    assert_eq!(index.take(3, taken), Ok(30));
    let before = content(&index, |v| *v);
    let (len, len_addrs) = (index.len(), index.len_addrs());
    let unknown = EntryId::from_u64(u64::MAX);
    let cases = [
        (1, unknown),
        (1, removed),
        (3, taken),
        (2, a),       // an id of another address
        (1, b),       // likewise
        (0x999, a),   // an address with no values
        (3, removed), // emptied address, id of another one
    ];
    for (addr, id) in cases {
        assert_eq!(
            index.remove(addr, id),
            Err(Error::NotFound),
            "{addr} {id:?}"
        );
        assert_eq!(index.take(addr, id), Err(Error::NotFound), "{addr} {id:?}");
        assert_eq!(content(&index, |v| *v), before, "nothing changes");
        assert_eq!((index.len(), index.len_addrs()), (len, len_addrs));
    }
    // The ids still work at their own addresses.
    assert_eq!(index.take(1, a), Ok(10));
    index.remove(2, b).unwrap();
}

/// Row: "`insert` of a new address beyond `max_addresses`" →
/// `Err(InsertError { error: CapacityExceeded, value })`, nothing changes,
/// value returned.
#[test]
fn row_insert_beyond_max_addresses_hands_the_value_back() {
    let index = AddrIndex::builder().max_addresses(2).build().unwrap();
    index.insert(1, String::from("one")).unwrap();
    index.insert(2, String::from("two")).unwrap();
    let before = content(&index, String::clone);
    let refused = String::from("refused");
    let at = refused.as_ptr();
    let err = index.insert(3, refused).unwrap_err();
    assert_eq!(err.error, Error::CapacityExceeded { max_addresses: 2 });
    let back = err.into_value();
    assert_eq!(back, "refused");
    assert_eq!(back.as_ptr(), at, "the value itself comes back, not a copy");
    assert_eq!(content(&index, String::clone), before, "nothing changes");
    assert!(!index.contains(3));
    assert_eq!((index.len(), index.len_addrs()), (2, 2));
    // A further value of an address already in is not a new address.
    index.insert(1, String::from("one again")).unwrap();
    let shared = index.insert_shared(&[2, 4], String::from("shared"));
    assert_eq!(
        shared.unwrap_err().error,
        Error::CapacityExceeded { max_addresses: 2 }
    );
    assert!(!index.contains(4));
    assert_eq!(index.len(), 3);
}

/// A value that knows how many clones it is from its original, counts the
/// live values of its kind, and runs the hook in [`CLONE_HOOK`] (once) when
/// cloned.
#[derive(Debug)]
struct Hooked {
    id: u64,
    /// 0 for an original, its source's plus 1 for a clone.
    generation: u32,
    live: Arc<AtomicUsize>,
}

/// Run by the next [`Hooked::clone`].
static CLONE_HOOK: Mutex<Option<Box<dyn FnOnce() + Send>>> = Mutex::new(None);

impl Hooked {
    fn new(id: u64, live: &Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, Ordering::Relaxed);
        Hooked {
            id,
            generation: 0,
            live: live.clone(),
        }
    }
}

impl Clone for Hooked {
    fn clone(&self) -> Self {
        let hook = CLONE_HOOK.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(hook) = hook {
            hook();
        }
        self.live.fetch_add(1, Ordering::Relaxed);
        Hooked {
            id: self.id,
            generation: self.generation + 1,
            live: self.live.clone(),
        }
    }
}

impl Drop for Hooked {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Row: "`insert_many` that does not fit (checked up front, or failing
/// mid-way under a concurrent writer)" → `Err(InsertManyError { error,
/// values })`, every value of the batch removed again and returned in
/// input order (called inside a read-side section, a batch failing mid-way
/// returns clones; the originals are dropped after a grace period).
///
/// The mid-way failure is made deterministic: with two stripes, the batch
/// runs stripe 0 first; its copy-on-write of an address there clones that
/// address's value, and the clone's hook has another thread take the last
/// place under `max_addresses` (at an address of stripe 1, whose lock is
/// free), after the batch's up-front check passed. (Also raced for real by
/// tests/index.rs: `insert_many_rollback_after_concurrent_fill`.)
#[test]
fn row_insert_many_that_does_not_fit_hands_every_value_back_in_input_order() {
    // Up front: nothing is inserted at all.
    let index = AddrIndex::builder().max_addresses(3).build().unwrap();
    index.insert(1, 100u64).unwrap();
    index.insert(2, 200).unwrap();
    let before = content(&index, |v| *v);
    let batch = vec![(5, 5u64), (1, 1), (6, 6), (5, 55), (2, 2)];
    let err = index.insert_many(batch.clone()).unwrap_err();
    assert_eq!(err.error, Error::CapacityExceeded { max_addresses: 3 });
    assert_eq!(err.values, batch, "every value back, in input order");
    assert_eq!(content(&index, |v| *v), before);

    // Mid-way, outside and inside a read-side section.
    for in_read_section in [false, true] {
        let live = Arc::new(AtomicUsize::new(0));
        let index = Arc::new(
            AddrIndex::builder()
                .stripes(2)
                .min_slots(64) // no resize during the batch
                .max_addresses(4)
                .build()
                .unwrap(),
        );
        let in_stripe = |s: usize| (1u64..).filter(move |&k| stripe_of_two(k) == s);
        let s0: Vec<u64> = in_stripe(0).take(2).collect();
        let s1: Vec<u64> = in_stripe(1).take(3).collect();
        let (old, filler) = (s0[0], s1[2]);
        index.insert(old, Hooked::new(0, &live)).unwrap();
        // 1 address + 3 new ones = 4: the up-front check passes.
        let keys = [s1[0], old, s0[1], s1[1]];
        let batch: Vec<(u64, Hooked)> = keys
            .iter()
            .zip(1..)
            .map(|(&k, id)| (k, Hooked::new(id, &live)))
            .collect();
        let (i2, l2) = (index.clone(), live.clone());
        *CLONE_HOOK.lock().unwrap() = Some(Box::new(move || {
            let (tx, rx) = std::sync::mpsc::channel();
            let writer = std::thread::spawn(move || {
                let _ = tx.send(i2.insert(filler, Hooked::new(99, &l2)).is_ok());
            });
            // It waits on no lock the batch holds, unless the index's
            // stripe function has changed (see `stripe_of_two`).
            let took = rx.recv_timeout(Duration::from_secs(10));
            assert_eq!(took, Ok(true), "the other writer took the last place");
            // Its clone of the index is gone before the test drops its own
            // and counts the values left.
            writer.join().unwrap();
        }));
        let guard = in_read_section.then(rcu::read_lock);
        let err = index.insert_many(batch).unwrap_err();
        assert!(
            CLONE_HOOK.lock().unwrap().is_none(),
            "the batch cloned the old value"
        );
        assert_eq!(err.error, Error::CapacityExceeded { max_addresses: 4 });
        let back: Vec<(u64, u64)> = err.values.iter().map(|(k, v)| (*k, v.id)).collect();
        assert_eq!(
            back,
            keys.iter().copied().zip(1..).collect::<Vec<_>>(),
            "every value back, in input order (in read section: {in_read_section})"
        );
        // The last value was never inserted; the others were, and come
        // back as themselves, or as clones inside a read-side section.
        let generations: Vec<u32> = err.values.iter().map(|(_, v)| v.generation).collect();
        match in_read_section {
            false => assert_eq!(generations, [0, 0, 0, 0]),
            true => assert_eq!(generations, [1, 1, 1, 0]),
        }
        let mut expected = vec![(old, vec![0]), (filler, vec![99])];
        expected.sort_unstable();
        let mut now: Vec<(u64, Vec<u64>)> = content(&index, |v| v.id)
            .into_iter()
            .map(|(a, vs)| (a, vs.into_iter().map(|(_, v)| v).collect()))
            .collect();
        now.sort_unstable();
        assert_eq!(now, expected, "the batch's inserts removed again");
        if in_read_section {
            // The originals cannot have been dropped: this section holds
            // their grace period back.
            assert!(live.load(Ordering::Relaxed) > 6);
        }
        drop(guard);
        rcu::barrier();
        // 4 handed back + 2 in the index: the originals were dropped.
        assert_eq!(live.load(Ordering::Relaxed), 6);
        drop(err);
        drop(index);
        rcu::barrier();
        assert_eq!(live.load(Ordering::Relaxed), 0);
    }
}

/// Row: "builder: `min_slots` not a power of two ≥ 8, `stripes` not a
/// power of two ≤ 65536, `max_addresses` 0, `capacity` > `max_addresses`
/// or absurd" → `Err(Error::InvalidConfig(reason))`, nothing built.
#[test]
fn row_index_builder_out_of_range_is_invalid_config() {
    let b = AddrIndex::<u8>::builder;
    let bad = [
        ("min_slots 0", b().min_slots(0)),
        ("min_slots 4", b().min_slots(4)),
        ("min_slots 100", b().min_slots(100)),
        ("min_slots absurd", b().min_slots(1 << 50)),
        ("stripes 0", b().stripes(0)),
        ("stripes 3", b().stripes(3)),
        ("stripes 131072", b().stripes(1 << 17)),
        ("max_addresses 0", b().max_addresses(0)),
        ("capacity > max", b().capacity(10).max_addresses(9)),
        ("capacity absurd", b().capacity(usize::MAX)),
        ("capacity 2^41", b().capacity(1 << 41)),
    ];
    for (what, builder) in bad {
        match builder.build() {
            Err(Error::InvalidConfig(reason)) => assert!(!reason.is_empty(), "{what}"),
            other => panic!("{what}: {other:?}"),
        }
    }
    // The limits themselves are accepted.
    let mut good = vec![
        b().min_slots(8),
        b().stripes(1),
        b().max_addresses(1),
        b().capacity(10).max_addresses(10),
    ];
    if !cfg!(miri) {
        good.push(b().stripes(1 << 16));
    }
    for builder in good {
        let index = builder.build().unwrap();
        index.insert(7, 7).unwrap();
        assert_eq!(index.lookup(7, |v| v.to_vec()), Some(vec![7]));
    }
}

/// Row: "address 0 or `u64::MAX`" → accepted like any other address.
#[test]
fn row_address_zero_and_max_are_ordinary_addresses() {
    let cached = AddrIndex::builder()
        .hit_cache(HitCacheConfig::default())
        .build()
        .unwrap();
    for index in [AddrIndex::new(), cached] {
        let ids: Vec<EntryId> = [0, u64::MAX, 1]
            .iter()
            .map(|&a| index.insert(a, a).unwrap())
            .collect();
        for a in [0, u64::MAX, 1] {
            assert!(index.contains(a));
            assert_eq!(index.lookup(a, |v| v.to_vec()), Some(vec![a]));
        }
        let shared = index.insert_shared(&[0, u64::MAX], 7).unwrap();
        let bulk = index.insert_many([(0, 8), (u64::MAX, 9)]).unwrap();
        assert_eq!(index.lookup(0, |v| v.to_vec()), Some(vec![0, 7, 8]));
        assert_eq!(
            index.lookup(u64::MAX, |v| v.to_vec()),
            Some(vec![u64::MAX, 7, 9])
        );
        assert_eq!(index.len_addrs(), 3);
        assert_eq!(index.remove_shared(&[0, u64::MAX], shared), 2);
        assert_eq!(index.take(0, ids[0]), Ok(0));
        index.remove(u64::MAX, ids[1]).unwrap();
        index.remove(0, bulk[0]).unwrap();
        assert_eq!(index.remove_addr(u64::MAX), 1);
        assert!(!index.contains(0) && !index.contains(u64::MAX));
        assert_eq!(index.len(), 1);
    }
    // The probe layer too.
    let reg = Registry::<()>::builder().build().unwrap();
    let (entries, exits) = (counter(), counter());
    let h = reg
        .register(counting_probe(&entries, &exits), &[0, u64::MAX])
        .unwrap();
    assert_eq!(reg.addresses(), 2);
    for a in [0, u64::MAX, 1] {
        reg.on_entry(a, a ^ 5, &());
        reg.on_exit(a ^ 5, &());
    }
    let s = reg.stats(h).unwrap();
    assert_eq!((s.hits, s.exits), (2, 2));
    assert_eq!(exits.load(Ordering::Relaxed), 2);
    reg.unregister(h).unwrap();
}

/// Row: "`rcu::synchronize`, `rcu::barrier`, `AddrIndex::take` inside a
/// read-side section" → panic (documented under `# Panics`): it would wait
/// for itself; nothing changed.
#[test]
fn row_waiting_inside_a_read_section_panics_and_changes_nothing() {
    let index = AddrIndex::new();
    let id = index.insert(1, String::from("kept")).unwrap();
    let before = content(&index, String::clone);
    assert!(panics_with("read-side", || {
        let _g = rcu::read_lock();
        rcu::synchronize();
    }));
    assert!(panics_with("read-side", || {
        let _g = rcu::read_lock();
        let _nested = rcu::read_lock();
        rcu::barrier();
    }));
    assert!(panics_with("read-side", || {
        let _g = rcu::read_lock();
        let _ = index.take(1, id);
    }));
    assert!(!rcu::in_read_section(), "the guards unwound");
    assert_eq!(content(&index, String::clone), before, "nothing changed");
    // The same calls work outside the section.
    rcu::synchronize();
    rcu::barrier();
    assert_eq!(index.take(1, id).unwrap(), "kept");
}

/// A value whose destructor panics when `boom` is set and `armed` is.
#[derive(Clone, Debug)]
struct Bomb {
    id: u64,
    boom: bool,
    armed: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
}

impl Drop for Bomb {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        if self.boom && self.armed.load(Ordering::Relaxed) {
            panic!("destructor of value {} (expected by the test)", self.id);
        }
    }
}

/// Row: "a retired object's destructor panics" → caught on the reclaimer
/// thread, counted in `rcu::stats().destructor_panics`; reclamation
/// continues; an index record holding the value is freed all the same.
#[test]
fn row_retired_destructor_panic_is_caught_and_counted() {
    let armed = Arc::new(AtomicBool::new(true));
    let dropped = Arc::new(AtomicUsize::new(0));
    let bomb = |id, boom| Bomb {
        id,
        boom,
        armed: armed.clone(),
        dropped: dropped.clone(),
    };
    let panics_before = rcu::stats().destructor_panics;
    rcu::retire(Box::new(bomb(1, true)));
    rcu::retire(Box::new(bomb(2, false)));
    rcu::call_rcu({
        let b = bomb(3, false);
        move || drop(b)
    });
    rcu::barrier();
    assert_eq!(dropped.load(Ordering::Relaxed), 3, "reclamation continued");
    assert!(rcu::stats().destructor_panics > panics_before);

    // A record of the index: its other values are dropped all the same.
    armed.store(false, Ordering::Relaxed);
    let index = AddrIndex::builder().min_slots(8).build().unwrap();
    index.insert(7, bomb(10, false)).unwrap();
    index.insert(7, bomb(11, true)).unwrap();
    index.insert(7, bomb(12, false)).unwrap();
    rcu::barrier(); // the copies-on-write's old records, unarmed
    dropped.store(0, Ordering::Relaxed);
    armed.store(true, Ordering::Relaxed);
    let panics_before = rcu::stats().destructor_panics;
    assert_eq!(index.remove_addr(7), 3);
    rcu::barrier();
    assert_eq!(
        dropped.load(Ordering::Relaxed),
        3,
        "every value of the record dropped"
    );
    assert!(rcu::stats().destructor_panics > panics_before);
    // Reclamation goes on.
    index.insert(8, bomb(13, false)).unwrap();
    index.clear();
    rcu::barrier();
    assert_eq!(dropped.load(Ordering::Relaxed), 4);
    armed.store(false, Ordering::Relaxed);
}

/// Row: "a value's destructor panics while an `AddrIndex` is dropped" →
/// the first such panic propagates after the drop; every other value
/// dropped, every record and table freed. (That the memory comes back is
/// measured by tests/memory_baseline.rs, `panicking_destructors_round`,
/// under a counting allocator.)
#[test]
fn row_value_destructor_panic_during_index_drop_propagates_after_the_drop() {
    let armed = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicUsize::new(0));
    let index = AddrIndex::builder().min_slots(8).build().unwrap();
    let n = 40u64;
    for a in 0..n {
        let b = Bomb {
            id: a,
            boom: a == 7 || a == 30,
            armed: armed.clone(),
            dropped: dropped.clone(),
        };
        index.insert(a % 20, b).unwrap(); // two values per address
    }
    rcu::barrier(); // old records of the copies-on-write, unarmed
    dropped.store(0, Ordering::Relaxed);
    armed.store(true, Ordering::Relaxed);
    let r = catch_unwind(AssertUnwindSafe(|| drop(index)));
    armed.store(false, Ordering::Relaxed);
    let payload = r.expect_err("the destructor's panic reaches the caller");
    let msg = panic_message(&*payload);
    assert!(
        msg == "destructor of value 7 (expected by the test)"
            || msg == "destructor of value 30 (expected by the test)",
        "{msg}"
    );
    assert_eq!(
        dropped.load(Ordering::Relaxed),
        n as usize,
        "every value dropped"
    );
}

/// A value whose `clone` panics while `fragile` is set.
#[derive(Debug)]
struct Fragile {
    id: u64,
    fragile: Arc<AtomicBool>,
    live: Arc<AtomicUsize>,
}

impl Clone for Fragile {
    fn clone(&self) -> Self {
        if self.fragile.load(Ordering::Relaxed) {
            panic!("clone of value {} refused (expected by the test)", self.id);
        }
        self.live.fetch_add(1, Ordering::Relaxed);
        Fragile {
            id: self.id,
            fragile: self.fragile.clone(),
            live: self.live.clone(),
        }
    }
}

impl Drop for Fragile {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Row: "`V::clone` panics during a copy-on-write" → the panic propagates
/// to the writer; nothing was published, the index is unchanged
/// (`insert_many`: the batch's earlier inserts are undone first).
#[test]
fn row_clone_panic_during_copy_on_write_leaves_the_index_unchanged() {
    let fragile = Arc::new(AtomicBool::new(false));
    let live = Arc::new(AtomicUsize::new(0));
    let mk = |id| {
        live.fetch_add(1, Ordering::Relaxed);
        Fragile {
            id,
            fragile: fragile.clone(),
            live: live.clone(),
        }
    };
    // One stripe: a batch runs in input order, so the new addresses go in
    // before the old one's copy-on-write panics.
    let index = AddrIndex::builder()
        .stripes(1)
        .min_slots(8)
        .build()
        .unwrap();
    let x = index.insert(1, mk(1)).unwrap();
    index.insert(1, mk(2)).unwrap();
    index.insert(2, mk(3)).unwrap();
    let before = content(&index, |v| v.id);
    let check = |what: &str, write: &dyn Fn()| {
        fragile.store(true, Ordering::Relaxed);
        let r = catch_unwind(AssertUnwindSafe(write));
        fragile.store(false, Ordering::Relaxed);
        let payload = r.expect_err(what);
        assert!(
            panic_message(&*payload).starts_with("clone of value"),
            "{what}: the clone's panic propagates"
        );
        assert_eq!(content(&index, |v| v.id), before, "{what}: unchanged");
        assert_eq!((index.len(), index.len_addrs()), (3, 2), "{what}");
    };
    check("insert", &|| drop(index.insert(1, mk(10))));
    check("remove", &|| {
        let _ = index.remove(1, x);
    });
    check("insert_many", &|| {
        drop(index.insert_many((100..120).map(|a| (a, mk(a))).chain([(2, mk(11))])))
    });
    check("insert_shared", &|| {
        drop(index.insert_shared(&[50, 51, 2], mk(12)))
    });
    drop(index);
    rcu::barrier();
    assert_eq!(live.load(Ordering::Relaxed), 0, "no value leaked");
}

// -------------------------------------------------------------- rcu rows

/// Set in the child process that the abort row's test runs.
const CHILD_ENV: &str = "FPROBE_BAD_INPUT_CHILD";

/// Runs this test binary's test `name` in a child process with
/// [`CHILD_ENV`] set; returns its exit status and standard error.
fn run_child(name: &str) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("child {name} still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    (status, reader.join().unwrap())
}

/// Row: "more than 16,383 nested read guards on one thread" → process
/// abort (a leak of guards; reachable from signal handlers, so no
/// unwinding). Run in a child process: 16,383 nested guards are fine, the
/// next aborts.
#[test]
#[cfg_attr(miri, ignore)] // spawns a process
fn row_more_than_16383_nested_read_guards_abort() {
    if std::env::var_os("FPROBE_TEST_QEMU_USER").is_some() {
        // qemu-user runs this binary, but a process it spawns is executed
        // by the kernel, which cannot run it without binfmt_misc (exit 127).
        eprintln!(
            "row_more_than_16383_nested_read_guards_abort: left out under qemu-user (it cannot spawn the test binary)"
        );
        return;
    }
    if std::env::var_os(CHILD_ENV).is_some() {
        let guards: Vec<rcu::ReadGuard> = (0..16_383).map(|_| rcu::read_lock()).collect();
        eprintln!("holding {} nested guards", guards.len());
        let one_more = rcu::read_lock();
        eprintln!("survived the 16,384th guard");
        drop(one_more);
        drop(guards);
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    let (status, stderr) = run_child("row_more_than_16383_nested_read_guards_abort");
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status:?}: {stderr}");
    assert!(stderr.contains("holding 16383 nested guards"), "{stderr}");
    assert!(stderr.contains("nesting overflow"), "{stderr}");
    assert!(!stderr.contains("survived"), "{stderr}");
}

// ------------------------------------------------------------ probe rows

/// Row: "probe `register` beyond `max_probes`, or with `data_size` above
/// the registry's" → `Err(TooManyProbes { max_probes })` /
/// `Err(InvalidConfig)`, nothing registered.
#[test]
fn row_register_beyond_max_probes_or_data_size_registers_nothing() {
    let reg = Registry::<()>::builder()
        .max_probes(2)
        .data_size(16)
        .build()
        .unwrap();
    let (entries, exits) = (counter(), counter());
    let h1 = reg
        .register(counting_probe(&entries, &exits), &[1])
        .unwrap();
    reg.register(counting_probe(&entries, &exits), &[2])
        .unwrap();
    let (refused_entries, refused_exits) = (counter(), counter());
    assert_eq!(
        reg.register(counting_probe(&refused_entries, &refused_exits), &[3, 1]),
        Err(Error::TooManyProbes { max_probes: 2 })
    );
    let big = Fprobe::builder()
        .data_size(17)
        .exit(|_| panic!("never registered"))
        .build();
    assert!(matches!(
        Registry::<()>::builder()
            .data_size(16)
            .build()
            .unwrap()
            .register(big, &[4]),
        Err(Error::InvalidConfig(_))
    ));
    reg.unregister(h1).unwrap();
    let big = Fprobe::builder()
        .data_size(17)
        .exit(|_| panic!("never registered"))
        .build();
    assert!(matches!(
        reg.register(big, &[4]),
        Err(Error::InvalidConfig(_))
    ));
    // Nothing of the refused probes is registered.
    assert_eq!(reg.addresses(), 1);
    for a in [1, 3, 4] {
        reg.on_entry(a, 9, &());
        reg.on_exit(9, &());
    }
    assert_eq!(refused_entries.load(Ordering::Relaxed), 0);
    assert_eq!(entries.load(Ordering::Relaxed), 0);
    // The freed slot is still free for a probe that fits.
    let fits = Fprobe::builder().data_size(16).exit(|_| {}).build();
    reg.register(fits, &[4]).unwrap();
}

/// Row: "probe `register` with no address (`&[]`), or of a probe with
/// neither an entry nor an exit handler" → `Err(Error::InvalidArgument(reason))`,
/// nothing registered, no probe slot used.
#[test]
fn row_register_with_no_address_or_no_handler_is_invalid_argument() {
    let reg = Registry::<()>::builder().max_probes(1).build().unwrap();
    let (entries, exits) = (counter(), counter());
    let invalid = |r: Result<ProbeHandle, Error>| match r {
        Err(Error::InvalidArgument(reason)) => assert!(!reason.is_empty()),
        other => panic!("{other:?}"),
    };
    invalid(reg.register(counting_probe(&entries, &exits), &[]));
    invalid(reg.register_with_cookies(counting_probe(&entries, &exits), std::iter::empty()));
    invalid(reg.register(Fprobe::<()>::builder().build(), &[0x1000]));
    invalid(reg.register(
        Fprobe::<()>::builder().data_size(8).build(),
        &[0x1000, 0x2000],
    ));
    invalid(reg.register_with_cookies(Fprobe::<()>::builder().build(), [(0x1000, 5)]));
    assert_eq!(reg.addresses(), 0, "nothing registered");
    reg.on_entry(0x1000, 1, &());
    reg.on_exit(1, &());
    assert_eq!(entries.load(Ordering::Relaxed), 0);
    // The one slot is still free.
    let h = reg
        .register(counting_probe(&entries, &exits), &[0x1000])
        .unwrap();
    assert_eq!(
        reg.register(counting_probe(&entries, &exits), &[0x2000]),
        Err(Error::TooManyProbes { max_probes: 1 })
    );
    reg.unregister(h).unwrap();
}

/// Row: "`unregister`, `enable`, `disable`, `stats` with a stale handle
/// (unregistered twice, other registry)" → `Err(Error::NotFound)`, nothing
/// changes.
///
/// The other registry's handle here names a slot this registry has no
/// probe in: a handle carries no registry, so one that matches a live
/// probe's slot and generation here names that probe (see
/// `foreign_handle_of_the_same_slot_is_not_found`).
#[test]
fn row_stale_probe_handle_is_not_found() {
    let reg = Registry::<()>::builder().build().unwrap();
    let (entries, exits) = (counter(), counter());
    let live = reg
        .register(counting_probe(&entries, &exits), &[1])
        .unwrap();
    let dead = reg
        .register(counting_probe(&entries, &exits), &[2])
        .unwrap();
    reg.unregister(dead).unwrap();
    let other = Registry::<()>::builder().build().unwrap();
    let mut others = Vec::new();
    for a in 0..3 {
        let p = Fprobe::builder().entry(|_| EntryAction::Continue).build();
        others.push(other.register(p, &[a]).unwrap());
    }
    let foreign = others[2];
    let stale = [
        dead,
        foreign,
        ProbeHandle::from_bits(0),
        ProbeHandle::from_bits(u64::MAX),
        ProbeHandle::from_bits(live.to_bits() + (2 << 16)), // a later generation
    ];
    reg.on_entry(1, 3, &());
    reg.on_exit(3, &());
    let stats_before = reg.stats(live).unwrap();
    for h in stale {
        assert_eq!(reg.unregister(h), Err(Error::NotFound), "{h:?}");
        assert_eq!(reg.enable(h), Err(Error::NotFound), "{h:?}");
        assert_eq!(reg.disable(h), Err(Error::NotFound), "{h:?}");
        assert_eq!(reg.stats(h), Err(Error::NotFound), "{h:?}");
        assert_eq!(reg.drain(h, Duration::ZERO), Err(Error::NotFound), "{h:?}");
        assert_eq!(reg.first_panic(h), Err(Error::NotFound), "{h:?}");
    }
    // Nothing changed: the live probe is registered, enabled, and counts
    // as before; the other registry's probe is untouched.
    assert_eq!(reg.stats(live), Ok(stats_before));
    assert_eq!(reg.addresses(), 1);
    reg.on_entry(1, 3, &());
    reg.on_exit(3, &());
    let s = reg.stats(live).unwrap();
    assert_eq!((s.hits, s.exits, s.missed.disabled), (2, 2, 0));
    assert_eq!(other.stats(foreign).unwrap().hits, 0);
    assert_eq!(other.addresses(), 3);
    reg.unregister(live).unwrap();
    assert_eq!(reg.unregister(live), Err(Error::NotFound), "twice");
}

/// The stale-handle row for a handle of another registry in the same
/// slot (the first probe of two fresh registries): each registry's
/// generations start in a range of their own, so the handles differ and
/// the foreign one is not found.
#[test]
fn foreign_handle_of_the_same_slot_is_not_found() {
    let a = Registry::<()>::builder().build().unwrap();
    let b = Registry::<()>::builder().build().unwrap();
    let p = || Fprobe::builder().entry(|_| EntryAction::Continue).build();
    let ha = a.register(p(), &[1]).unwrap();
    let hb = b.register(p(), &[1]).unwrap();
    assert_ne!(
        ha.to_bits(),
        hb.to_bits(),
        "handles of two registries differ"
    );
    assert_eq!(b.disable(ha), Err(Error::NotFound), "b's probe untouched");
    assert_eq!(a.disable(hb), Err(Error::NotFound), "a's probe untouched");
    assert_eq!(b.stats(hb).unwrap().missed.disabled, 0);
}

/// The registry of the tests whose handlers call back into it.
fn static_registry(cell: &'static OnceLock<Registry<()>>) -> &'static Registry<()> {
    cell.get_or_init(|| Registry::builder().build().unwrap())
}

/// Row: "`unregister`/`drain` from a handler, inside a read-side section,
/// or inside a dispatch of the same registry (`probe::in_handler()`
/// tells)" → panic (documented under `# Panics`): it would wait for itself;
/// nothing changed. A handler's panic is then contained at the dispatch
/// boundary (the next row).
#[test]
fn row_unregister_or_drain_that_would_wait_for_itself_panics() {
    static REG: OnceLock<Registry<()>> = OnceLock::new();
    static HANDLE: OnceLock<ProbeHandle> = OnceLock::new();
    /// 1: the entry handler unregisters, 2: the exit handler drains.
    static MODE: AtomicU64 = AtomicU64::new(0);
    static SEEN: AtomicU64 = AtomicU64::new(0);
    let reg = static_registry(&REG);
    let probe = Fprobe::builder()
        .entry(|_| {
            assert!(fprobe::probe::in_handler());
            if MODE.load(Ordering::Relaxed) == 1 {
                let _ = REG.get().unwrap().unregister(*HANDLE.get().unwrap());
            }
            EntryAction::Continue
        })
        .exit(|_| {
            SEEN.fetch_add(1, Ordering::Relaxed);
            if MODE.load(Ordering::Relaxed) == 2 {
                let _ = REG
                    .get()
                    .unwrap()
                    .drain(*HANDLE.get().unwrap(), Duration::ZERO);
            }
        })
        .build();
    let h = reg.register(probe, &[0x10]).unwrap();
    HANDLE.set(h).unwrap();
    let call = || {
        reg.on_entry(0x10, 1, &());
        reg.on_exit(1, &());
    };
    MODE.store(1, Ordering::Relaxed);
    call();
    let s = reg.stats(h).unwrap();
    assert_eq!((s.hits, s.panics, s.exits), (1, 1, 0), "{s:?}");
    let first = reg.first_panic(h).unwrap().unwrap();
    assert!(
        first.contains("Registry::unregister called inside"),
        "{first}"
    );
    MODE.store(2, Ordering::Relaxed);
    call();
    let s = reg.stats(h).unwrap();
    // A panicked exit handler did not return: not counted in `exits`.
    assert_eq!((s.hits, s.panics, s.exits), (2, 2, 0), "{s:?}");
    MODE.store(0, Ordering::Relaxed);
    // Inside a read-side section, and inside one a dispatch nests in.
    assert!(panics_with("inside an RCU read-side section", || {
        let _g = rcu::read_lock();
        let _ = reg.unregister(h);
    }));
    assert!(panics_with("inside an RCU read-side section", || {
        let _g = rcu::read_lock();
        let _ = reg.drain(h, Duration::ZERO);
    }));
    // Nothing changed: registered, enabled, dispatching.
    assert_eq!(reg.addresses(), 1);
    call();
    let s = reg.stats(h).unwrap();
    assert_eq!((s.hits, s.exits, s.missed.disabled, s.panics), (3, 1, 0, 2));
    assert_eq!(SEEN.load(Ordering::Relaxed), 2);
    reg.unregister(h).unwrap();
}

/// Row: "a handler uses per-call data its probe did not declare
/// (`data_size` 0: `data` is empty)" → a panic (index out of bounds),
/// contained and counted on every call, its first message kept.
#[test]
fn row_undeclared_per_call_data_is_a_contained_panic_reported_once() {
    let reg = Registry::<()>::builder().build().unwrap();
    let exits = counter();
    let ex = exits.clone();
    let h = reg
        .register(
            Fprobe::builder()
                // No `.data_size(8)`: `e.data` is empty.
                .entry(|e| {
                    e.data[..8].copy_from_slice(&e.addr.to_ne_bytes());
                    EntryAction::Continue
                })
                .exit(move |_| {
                    ex.fetch_add(1, Ordering::Relaxed);
                })
                .build(),
            &[0x10],
        )
        .unwrap();
    for _ in 0..5 {
        reg.on_entry(0x10, 0, &());
        reg.on_exit(0, &());
    }
    let s = reg.stats(h).unwrap();
    assert_eq!((s.hits, s.panics, s.exits, s.in_flight), (5, 5, 0, 0));
    assert_eq!(exits.load(Ordering::Relaxed), 0, "each call's exit skipped");
    let first = reg
        .first_panic(h)
        .unwrap()
        .expect("the first panic is kept");
    assert!(first.contains("out of range"), "{first}");
    reg.unregister(h).unwrap();
}

/// Row: "a probe handler panics" → caught at the dispatch boundary,
/// counted in `ProbeStats::panics`; other probes keep running; the exit
/// handler of that call is skipped.
#[test]
fn row_handler_panic_is_contained_and_counted() {
    let reg = Registry::<()>::builder().build().unwrap();
    let bad_exits = counter();
    let be = bad_exits.clone();
    let bad = reg
        .register(
            Fprobe::builder()
                .entry(|e| {
                    if e.ret_addr == 1 {
                        panic!("entry handler panic (expected by the test)");
                    }
                    EntryAction::Continue
                })
                .exit(move |x| {
                    be.fetch_add(1, Ordering::Relaxed);
                    if x.ret_addr == 2 {
                        panic!("exit handler panic (expected by the test)");
                    }
                })
                .build(),
            &[0x10],
        )
        .unwrap();
    let (entries, exits) = (counter(), counter());
    let good = reg
        .register(counting_probe(&entries, &exits), &[0x10])
        .unwrap();
    // The entry panics: its exit is skipped, the other probe runs.
    reg.on_entry(0x10, 1, &());
    reg.on_exit(1, &());
    assert_eq!(
        bad_exits.load(Ordering::Relaxed),
        0,
        "that call's exit skipped"
    );
    assert_eq!(
        (
            entries.load(Ordering::Relaxed),
            exits.load(Ordering::Relaxed)
        ),
        (1, 1)
    );
    // The exit panics: counted too.
    reg.on_entry(0x10, 2, &());
    reg.on_exit(2, &());
    // And a call with no panic runs both handlers.
    reg.on_entry(0x10, 3, &());
    reg.on_exit(3, &());
    assert_eq!(bad_exits.load(Ordering::Relaxed), 2);
    let s = reg.stats(bad).unwrap();
    // `exits` counts the exit handlers that returned.
    assert_eq!(
        (s.hits, s.exits, s.panics, s.in_flight),
        (3, 1, 2, 0),
        "{s:?}"
    );
    let g = reg.stats(good).unwrap();
    assert_eq!((g.hits, g.exits, g.panics), (3, 3, 0), "{g:?}");
    let first = reg.first_panic(bad).unwrap().unwrap();
    assert!(first.starts_with("entry handler panic"), "{first}");
    assert_eq!(reg.first_panic(good), Ok(None));
}

/// A probe whose entry fills its data with the call's return address and
/// whose exit checks it (a mismatch panics, contained by dispatch, and
/// goes unlogged) and logs the return address.
fn logging_probe(data_size: usize, log: &Arc<Mutex<Vec<u64>>>) -> Fprobe<()> {
    let log = log.clone();
    Fprobe::builder()
        .data_size(data_size)
        .entry(|e| {
            if !e.data.is_empty() {
                e.data.fill(e.ret_addr as u8);
            }
            EntryAction::Continue
        })
        .exit(move |x| {
            assert!(
                x.data.iter().all(|&b| b == x.ret_addr as u8),
                "exit {} got another call's data",
                x.ret_addr
            );
            log.lock().unwrap().push(x.ret_addr);
        })
        .build()
}

/// Row: "thread's shadow stack full (`max_depth`)" → entry handlers run;
/// exit handlers of the deeper calls skipped, counted in `Missed::depth`;
/// entry/exit pairing preserved.
#[test]
fn row_full_shadow_stack_skips_deeper_exits_and_keeps_pairing() {
    let max_depth = 3;
    let reg = Registry::<()>::builder()
        .data_size(64)
        .max_depth(max_depth)
        .build()
        .unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let entries = counter();
    let e2 = entries.clone();
    let counting = Fprobe::builder()
        .entry(move |_| {
            e2.fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .build();
    let h = reg.register(logging_probe(64, &log), &[1]).unwrap();
    reg.register(counting, &[1]).unwrap();
    let calls = 20u64;
    for depth in 1..=calls {
        reg.on_entry(1, depth, &());
    }
    for depth in (1..=calls).rev() {
        reg.on_exit(depth, &());
    }
    let s = reg.stats(h).unwrap();
    assert_eq!(entries.load(Ordering::Relaxed), calls, "every entry ran");
    let ran = log.lock().unwrap().clone();
    let kept = ran.len() as u64;
    assert!(kept >= max_depth as u64 && kept < calls, "{kept} exits");
    assert_eq!(
        (s.hits, s.exits, s.missed.depth),
        (calls, kept, calls - kept)
    );
    // The outermost calls kept their exits, each with its own data.
    assert_eq!(ran, (1..=kept).rev().collect::<Vec<_>>());
    assert_eq!(s.in_flight, 0);
    // Pairing survived: a fresh call pairs normally.
    reg.on_entry(1, 77, &());
    reg.on_exit(77, &());
    assert_eq!(log.lock().unwrap().last(), Some(&77));
}

/// Row: "calls nested deeper than the shadow stack holds" → entry handlers
/// run, exits of those calls skipped and counted in `Missed::depth` (calls
/// with no exit to run take no room at any depth); entry/exit pairing
/// preserved.
#[test]
fn row_calls_deeper_than_the_shadow_stack_keep_pairing() {
    let reg = Registry::<()>::builder()
        .data_size(8)
        .max_depth(2)
        .build()
        .unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let entry_only = counter();
    let e2 = entry_only.clone();
    reg.register(
        Fprobe::builder()
            .entry(move |_| {
                e2.fetch_add(1, Ordering::Relaxed);
                EntryAction::Continue
            })
            .build(),
        &[0x10],
    )
    .unwrap();
    let with_exit = reg.register(logging_probe(8, &log), &[0x20]).unwrap();
    // Calls with no exit to run (an entry-only probe, no probe at all),
    // far deeper than the stack holds, then calls with an exit.
    let shallow = if cfg!(miri) { 200 } else { 10_000u64 };
    for i in 0..shallow {
        let addr = if i % 2 == 0 { 0x10 } else { 0x30 };
        reg.on_entry(addr, 1000 + i, &());
    }
    let deep = 6u64;
    for d in 0..deep {
        reg.on_entry(0x20, d, &());
    }
    for d in (0..deep).rev() {
        reg.on_exit(d, &());
    }
    for i in (0..shallow).rev() {
        reg.on_exit(1000 + i, &());
    }
    assert_eq!(entry_only.load(Ordering::Relaxed), shallow / 2);
    let ran = log.lock().unwrap().clone();
    let kept = ran.len() as u64;
    assert!(
        kept >= 2 && kept < deep,
        "the first calls with an exit fit: {kept}"
    );
    assert_eq!(ran, (0..kept).rev().collect::<Vec<_>>(), "outermost kept");
    let s = reg.stats(with_exit).unwrap();
    assert_eq!((s.hits, s.exits, s.missed.depth), (deep, kept, deep - kept));
    // Pairing preserved.
    reg.on_entry(0x20, 99, &());
    reg.on_exit(99, &());
    assert_eq!(log.lock().unwrap().last(), Some(&99));
}

/// Row: "a handler calls a probed function" → probes not run for the
/// nested call, counted in `Missed::recursion`.
#[test]
fn row_handler_calling_a_probed_function_is_counted_as_recursion() {
    static REG: OnceLock<Registry<()>> = OnceLock::new();
    let reg = static_registry(&REG);
    let outer = reg
        .register(
            Fprobe::builder()
                .data_size(8)
                .entry(|e| {
                    e.data.copy_from_slice(&e.ret_addr.to_ne_bytes());
                    let reg = REG.get().unwrap();
                    reg.on_entry(0x20, 50, &());
                    reg.on_exit(50, &());
                    EntryAction::Continue
                })
                .exit(|x| {
                    assert_eq!(x.data, x.ret_addr.to_ne_bytes());
                    let reg = REG.get().unwrap();
                    reg.on_entry(0x20, 51, &());
                    reg.on_exit(51, &());
                })
                .build(),
            &[0x10],
        )
        .unwrap();
    let (entries, exits) = (counter(), counter());
    let inner = reg
        .register(counting_probe(&entries, &exits), &[0x20])
        .unwrap();
    reg.on_entry(0x10, 7, &());
    reg.on_exit(7, &());
    assert_eq!(
        entries.load(Ordering::Relaxed),
        0,
        "not run for nested calls"
    );
    let s = reg.stats(inner).unwrap();
    assert_eq!((s.hits, s.missed.recursion), (0, 2), "{s:?}");
    let o = reg.stats(outer).unwrap();
    assert_eq!((o.hits, o.exits, o.panics), (1, 1, 0), "{o:?}");
    // Outside a handler the inner probe runs.
    reg.on_entry(0x20, 8, &());
    reg.on_exit(8, &());
    assert_eq!(reg.stats(inner).unwrap().exits, 1);
    reg.unregister(outer).unwrap();
    reg.unregister(inner).unwrap();
}

/// The registry the signal handler of the signal row dispatches through.
static SIG_REG: OnceLock<Registry<()>> = OnceLock::new();
/// The thread's probed function, and the signal handler's.
const T_FN: u64 = 0x5000;
const S_FN: u64 = 0x6000;
/// Set: the thread's entry handler raises the signal.
static RAISE: AtomicBool = AtomicBool::new(false);
/// Set: the signal handler's entry handler calls the thread's probed
/// function (a handler of its own context runs: recursion).
static S_CALLS_T: AtomicBool = AtomicBool::new(false);
static S_RUNS: AtomicU64 = AtomicU64::new(0);
static S_GOOD_EXITS: AtomicU64 = AtomicU64::new(0);
static T_GOOD_EXITS: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_signal(_: c_int) {
    signal_storm::keeping_errno(|| {
        if let Some(reg) = SIG_REG.get() {
            reg.on_entry(S_FN, 0x5151, &());
            reg.on_exit(0x5151, &());
        }
    });
}

/// Row: "a signal handler dispatches in the middle of a dispatch on its
/// thread" → its probes run (a new context) unless a handler of its own
/// context runs; the interrupted call's pairing and data intact. A signal
/// raised from inside an entry handler, so that it lands mid-dispatch
/// every time; the storm at any instruction is tests/probe_signals.rs
/// (`signal_storm_keeps_pairing_and_data_on_both_sides`).
#[test]
#[cfg_attr(miri, ignore)] // signals
fn row_signal_handler_dispatch_mid_dispatch_runs_its_probes() {
    let reg = SIG_REG.get_or_init(|| Registry::builder().build().unwrap());
    let t = reg
        .register(
            Fprobe::builder()
                .data_size(8)
                .entry(|e| {
                    e.data.copy_from_slice(&e.ret_addr.to_ne_bytes());
                    if RAISE.load(Ordering::Relaxed) {
                        // SAFETY: signals the calling thread, whose handler
                        // runs before `raise` returns; it is installed.
                        unsafe { libc::raise(libc::SIGUSR1) };
                    }
                    EntryAction::Continue
                })
                .exit(|x| {
                    if x.data == x.ret_addr.to_ne_bytes() {
                        T_GOOD_EXITS.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .build(),
            &[T_FN],
        )
        .unwrap();
    let s = reg
        .register(
            Fprobe::builder()
                .data_size(8)
                .entry(|e| {
                    S_RUNS.fetch_add(1, Ordering::Relaxed);
                    e.data.copy_from_slice(&(!e.ret_addr).to_ne_bytes());
                    if S_CALLS_T.load(Ordering::Relaxed) {
                        let reg = SIG_REG.get().unwrap();
                        reg.on_entry(T_FN, 0x7777, &());
                        reg.on_exit(0x7777, &());
                    }
                    EntryAction::Continue
                })
                .exit(|x| {
                    if x.data == (!x.ret_addr).to_ne_bytes() {
                        S_GOOD_EXITS.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .build(),
            &[S_FN],
        )
        .unwrap();
    reg.prepare_thread();
    signal_storm::install(on_signal);

    // The signal lands in the thread's entry handler: its probe runs.
    RAISE.store(true, Ordering::Relaxed);
    reg.on_entry(T_FN, 0x100, &());
    reg.on_exit(0x100, &());
    assert_eq!(S_RUNS.load(Ordering::Relaxed), 1, "the signal's probe ran");
    assert_eq!(S_GOOD_EXITS.load(Ordering::Relaxed), 1);
    assert_eq!(
        T_GOOD_EXITS.load(Ordering::Relaxed),
        1,
        "pairing and data intact"
    );
    assert_eq!(reg.stats(s).unwrap().missed.recursion, 0);

    // Its handler calls the thread's function: refused, a handler of its
    // own context runs.
    S_CALLS_T.store(true, Ordering::Relaxed);
    reg.on_entry(T_FN, 0x200, &());
    reg.on_exit(0x200, &());
    RAISE.store(false, Ordering::Relaxed);
    S_CALLS_T.store(false, Ordering::Relaxed);
    assert_eq!(S_RUNS.load(Ordering::Relaxed), 2);
    assert_eq!(S_GOOD_EXITS.load(Ordering::Relaxed), 2);
    assert_eq!(T_GOOD_EXITS.load(Ordering::Relaxed), 2);
    let ts = reg.stats(t).unwrap();
    assert_eq!(
        (ts.hits, ts.exits, ts.missed.recursion),
        (2, 2, 1),
        "{ts:?}"
    );
    let ss = reg.stats(s).unwrap();
    assert_eq!(
        (ss.hits, ss.exits, ss.missed.recursion),
        (2, 2, 0),
        "{ss:?}"
    );
    reg.unregister(t).unwrap();
    reg.unregister(s).unwrap();
}

/// Row: "hit-cache `entries` not a power of two in 16..=65536, `ways` not
/// 1/2/4/8" → `Err(Error::InvalidConfig)`, nothing built.
#[test]
fn row_hit_cache_config_out_of_range_is_invalid_config() {
    let c = HitCacheConfig::default;
    let bad = [
        c().entries(0),
        c().entries(8),
        c().entries(15),
        c().entries(100),
        c().entries(1 << 17),
        c().ways(0),
        c().ways(3),
        c().ways(16),
    ];
    for config in bad {
        let what = format!("{config:?}");
        assert!(
            matches!(
                HitCache::<*const u8>::new(config),
                Err(Error::InvalidConfig(_))
            ),
            "{what}"
        );
        assert!(
            matches!(
                AddrIndex::<u8>::builder().hit_cache(config).build(),
                Err(Error::InvalidConfig(_))
            ),
            "{what}"
        );
        assert!(
            matches!(
                Registry::<()>::builder().hit_cache(config).build(),
                Err(Error::InvalidConfig(_))
            ),
            "{what}"
        );
    }
    // The limits are accepted.
    for config in [
        c().entries(16).ways(1),
        c().entries(65536).ways(2),
        c().ways(4),
        c().ways(8),
    ] {
        assert!(HitCache::<*const u8>::new(config).is_ok(), "{config:?}");
    }
}

/// Row: "`ObjPool` builder: 0 objects, more than 2^31, a thread cache above
/// 64" → `Err(ObjPoolError::…)` (`ObjPool::new` panics, documented),
/// nothing built.
#[test]
fn row_objpool_builder_out_of_range_is_an_error() {
    assert_eq!(MAX_OBJECTS, 1 << 31);
    assert_eq!(MAX_THREAD_CACHE, 64);
    let made = AtomicUsize::new(0);
    let init = |i: usize| {
        made.fetch_add(1, Ordering::Relaxed);
        i
    };
    let err = |r: Result<ObjPool<usize>, ObjPoolError>| r.err();
    assert_eq!(
        err(ObjPool::builder().build(0, init)),
        Some(ObjPoolError::NoObjects)
    );
    assert_eq!(
        err(ObjPool::builder().build(MAX_OBJECTS + 1, init)),
        Some(ObjPoolError::TooManyObjects)
    );
    assert_eq!(
        err(ObjPool::builder().build(usize::MAX, init)),
        Some(ObjPoolError::TooManyObjects)
    );
    assert_eq!(
        err(ObjPool::builder().thread_cache(65).build(4, init)),
        Some(ObjPoolError::ThreadCacheTooLarge)
    );
    assert!(panics_with("ObjPool::new", || drop(ObjPool::new(0, init))));
    assert!(panics_with("ObjPool::new", || drop(ObjPool::new(
        MAX_OBJECTS + 1,
        init
    ))));
    assert_eq!(made.load(Ordering::Relaxed), 0, "nothing built");
    // The limits are accepted.
    let pool = ObjPool::builder().thread_cache(64).build(1, init).unwrap();
    assert_eq!((pool.capacity(), pool.thread_cache()), (1, 64));
    assert_eq!(made.load(Ordering::Relaxed), 1);
}

/// Row: "probe registry builder: `max_probes` outside 1..=65536,
/// `data_size` over 4096, `max_depth` 0, a shadow stack over 128 MiB (C
/// ABI: 0 in a config field means its default)" → `Err(Error::InvalidConfig)`,
/// nothing built. (The C ABI's defaults: capi/tests/bad_input.rs,
/// `row_c_invalid_probe_or_config_is_e_invalid`.)
#[test]
fn row_registry_builder_out_of_range_is_invalid_config() {
    assert_eq!(MAX_DATA_SIZE, 4096);
    let b = Registry::<()>::builder;
    // 4096 bytes take 512 + 8 words per level: 32,264 levels pass 2^24
    // words (128 MiB).
    let bad = [
        ("max_probes 0", b().max_probes(0)),
        ("max_probes 65537", b().max_probes(65537)),
        ("data_size 4097", b().data_size(4097)),
        ("data_size max", b().data_size(usize::MAX)),
        ("max_depth 0", b().max_depth(0)),
        ("stack over 128 MiB", b().data_size(4096).max_depth(32_202)),
        ("stack overflowing usize", b().max_depth(usize::MAX)),
        ("index capacity absurd", b().capacity(usize::MAX)),
    ];
    for (what, builder) in bad {
        match builder.build() {
            Err(Error::InvalidConfig(reason)) => assert!(!reason.is_empty(), "{what}"),
            Err(e) => panic!("{what}: {e:?}"),
            Ok(_) => panic!("{what}: built"),
        }
    }
    // The limits are accepted (the largest shadow stack only built: a
    // dispatch would allocate its 128 MiB).
    b().data_size(4096).max_depth(32_201).build().unwrap();
    let mut good = vec![b().max_probes(1), b().data_size(4096), b().max_depth(1)];
    if !cfg!(miri) {
        good.push(b().max_probes(65536));
    }
    for builder in good {
        let reg = builder.build().unwrap();
        let h = reg
            .register(Fprobe::builder().exit(|_| {}).build(), &[1])
            .unwrap();
        reg.on_entry(1, 2, &());
        reg.on_exit(2, &());
        assert_eq!(reg.stats(h).unwrap().exits, 1);
    }
}

/// Row: "`on_exit` with no matching `on_entry`" → ignored, nothing changes.
///
/// "No matching entry" means no call in flight on the thread: exits pair
/// with entries in LIFO order, not by return address, so an extra
/// `on_exit` while a call is open ends that call.
#[test]
fn row_on_exit_without_on_entry_is_ignored() {
    let reg = Registry::<()>::builder().build().unwrap();
    let (entries, exits) = (counter(), counter());
    let h = reg
        .register(counting_probe(&entries, &exits), &[1])
        .unwrap();
    let unchanged = |want: (u64, u64)| {
        let s: ProbeStats = reg.stats(h).unwrap();
        assert_eq!((s.hits, s.exits, s.in_flight), (want.0, want.1, 0), "{s:?}");
        assert_eq!(
            (
                entries.load(Ordering::Relaxed),
                exits.load(Ordering::Relaxed)
            ),
            want
        );
    };
    // Before any dispatch on the thread, and on a thread that never
    // dispatched through this registry.
    reg.on_exit(5, &());
    std::thread::scope(|s| {
        s.spawn(|| {
            reg.on_exit(5, &());
            reg.on_exit(6, &());
        });
    });
    unchanged((0, 0));
    // After the calls it had have all returned.
    reg.on_entry(1, 7, &());
    reg.on_exit(7, &());
    reg.on_exit(7, &());
    reg.on_exit(8, &());
    unchanged((1, 1));
    // Pairing is intact afterwards.
    reg.on_entry(1, 9, &());
    reg.on_entry(1, 10, &());
    reg.on_exit(10, &());
    reg.on_exit(9, &());
    unchanged((3, 3));
}

// ------------------------------------------------------------- C ABI rows
//
// Tested in capi/tests/bad_input.rs (this crate cannot call the C ABI),
// each against the C functions as C calls them:
// * "C ABI: a NULL pointer argument": row_c_null_pointer_argument_is_e_null
// * "C ABI: unknown, stale or foreign probe handle; unregister twice":
//   row_c_unknown_stale_or_foreign_handle_is_e_not_found
// * "C ABI: any call on a destroyed registry":
//   row_c_call_on_a_destroyed_registry_is_e_destroyed
// * "C ABI: probe with no handler, no address (`n` 0), `data_size` too
//   large, config out of range": row_c_invalid_probe_or_config_is_e_invalid
// * "C ABI: `fprobe_unregister`/`fprobe_registry_destroy`/`fprobe_barrier`
//   from a handler; `fprobe_cyg_attach` while attached":
//   row_c_call_that_would_wait_for_itself_is_e_busy
// * "C ABI: `fprobe_patch_functions(NULL, 0, &n)` (sizing)":
//   row_c_patch_functions_sizing_call_writes_only_the_count
