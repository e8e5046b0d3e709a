//! The one `Op` definition and model checker for `AddrIndex`, shared by the
//! cargo-fuzz target (`fuzz/fuzz_targets/index_ops.rs`), the property test
//! (`tests/index.rs`) and the stable corpus replay (`tests/fuzz_replay.rs`).
//!
//! Every step is checked against a `HashMap<u64, Vec<(EntryId, u32)>>`
//! model; the whole index is compared with the model at the end.

use std::collections::HashMap;

use arbitrary::{Arbitrary, Unstructured};
use fprobe::{AddrIndex, EntryId, Error, rcu};

/// One operation. Addresses are drawn from a small space (so operations
/// collide) that includes 0 and `u64::MAX`.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    Insert {
        addr: u8,
        value: u32,
    },
    InsertMany(Vec<(u8, u32)>),
    Remove {
        addr: u8,
        nth: u8,
    },
    Take {
        addr: u8,
        nth: u8,
    },
    RemoveUnknown {
        addr: u8,
        id: u64,
    },
    RemoveAddr(u8),
    Get(u8),
    Clear,
    Iter,
    /// One value at these addresses (`insert_shared`).
    InsertShared {
        addrs: Vec<u8>,
        value: u32,
    },
    /// `remove_shared` of the `nth` shared id issued, at its addresses and
    /// `extra` ones.
    RemoveShared {
        nth: u8,
        extra: Vec<u8>,
    },
}

/// Maps a fuzzed byte to an address.
pub fn addr(a: u8) -> u64 {
    match a % 32 {
        0 => 0,
        1 => u64::MAX,
        2 => 1,
        n => 0x40_0000 + u64::from(n) * 4096,
    }
}

type Model = HashMap<u64, Vec<(EntryId, u32)>>;

/// Compares the whole index with the model.
pub fn check_all(index: &AddrIndex<u32>, model: &Model) {
    let g = rcu::read_lock();
    for (k, entries) in model {
        let (ids, vals) = index.get_with_ids(*k, &g);
        let want_ids: Vec<EntryId> = entries.iter().map(|e| e.0).collect();
        let want_vals: Vec<u32> = entries.iter().map(|e| e.1).collect();
        assert_eq!(ids, &want_ids[..], "ids of {k:#x}");
        assert_eq!(vals, &want_vals[..], "values of {k:#x}");
    }
    let mut seen: Vec<(u64, Vec<u32>)> = index.iter(&g).map(|(k, v)| (k, v.to_vec())).collect();
    seen.sort();
    let mut want: Vec<(u64, Vec<u32>)> = model
        .iter()
        .map(|(k, e)| (*k, e.iter().map(|x| x.1).collect()))
        .collect();
    want.sort();
    assert_eq!(seen, want, "iteration");
    assert_eq!(index.len_addrs(), model.len());
    assert_eq!(index.len(), model.values().map(Vec::len).sum::<usize>());
}

/// Runs `ops` on a fresh, tiny (resize-happy) index and checks every step.
pub fn run(ops: &[Op]) {
    let index: AddrIndex<u32> = AddrIndex::builder()
        .min_slots(8)
        .auto_shrink(true)
        .stripes(2)
        .build()
        .unwrap();
    let mut model: Model = HashMap::new();
    // Ids of shared inserts, with their addresses.
    let mut shared: Vec<(EntryId, Vec<u64>)> = Vec::new();
    for op in ops {
        match op {
            Op::Insert { addr: a, value } => {
                let k = addr(*a);
                let id = index.insert(k, *value).unwrap();
                model.entry(k).or_default().push((id, *value));
            }
            Op::InsertMany(items) => {
                let items: Vec<(u64, u32)> = items.iter().map(|&(a, v)| (addr(a), v)).collect();
                let ids = index.insert_many(items.clone()).unwrap();
                assert_eq!(ids.len(), items.len());
                for ((k, v), id) in items.into_iter().zip(ids) {
                    model.entry(k).or_default().push((id, v));
                }
            }
            Op::Remove { addr: a, nth } | Op::Take { addr: a, nth } => {
                let k = addr(*a);
                match model.get_mut(&k) {
                    Some(entries) => {
                        let (id, v) = entries.remove(usize::from(*nth) % entries.len());
                        if entries.is_empty() {
                            model.remove(&k);
                        }
                        if matches!(op, Op::Take { .. }) {
                            assert_eq!(index.take(k, id), Ok(v));
                        } else {
                            assert_eq!(index.remove(k, id), Ok(()));
                        }
                        assert_eq!(index.remove(k, id), Err(Error::NotFound), "removed twice");
                    }
                    None => {
                        assert_eq!(
                            index.remove(k, EntryId::from_u64(u64::from(*nth))),
                            Err(Error::NotFound)
                        );
                    }
                }
            }
            Op::RemoveUnknown { addr: a, id } => {
                let k = addr(*a);
                let known = model
                    .get(&k)
                    .is_some_and(|e| e.iter().any(|x| x.0.as_u64() == *id));
                if !known {
                    assert_eq!(
                        index.remove(k, EntryId::from_u64(*id)),
                        Err(Error::NotFound)
                    );
                }
            }
            Op::RemoveAddr(a) => {
                let k = addr(*a);
                let n = model.remove(&k).map_or(0, |e| e.len());
                assert_eq!(index.remove_addr(k), n);
            }
            Op::Get(a) => {
                let k = addr(*a);
                let want: Vec<u32> = model
                    .get(&k)
                    .map(|e| e.iter().map(|x| x.1).collect())
                    .unwrap_or_default();
                assert_eq!(index.lookup(k, |v| v.to_vec()).unwrap_or_default(), want);
            }
            Op::Clear => {
                index.clear();
                model.clear();
            }
            Op::Iter => check_all(&index, &model),
            Op::InsertShared { addrs, value } => {
                let mut keys: Vec<u64> = addrs.iter().map(|&a| addr(a)).collect();
                let id = index.insert_shared(&keys, *value).unwrap();
                keys.sort_unstable();
                keys.dedup();
                for &k in &keys {
                    model.entry(k).or_default().push((id, *value));
                }
                shared.push((id, keys));
            }
            Op::RemoveShared { nth, extra } => {
                if shared.is_empty() {
                    continue;
                }
                let (id, keys) = shared[usize::from(*nth) % shared.len()].clone();
                let mut all = keys;
                all.extend(extra.iter().map(|&a| addr(a)));
                all.sort_unstable();
                all.dedup();
                let mut want = 0;
                for k in &all {
                    if let Some(entries) = model.get_mut(k) {
                        let before = entries.len();
                        entries.retain(|e| e.0 != id);
                        want += before - entries.len();
                        if entries.is_empty() {
                            model.remove(k);
                        }
                    }
                }
                assert_eq!(index.remove_shared(&all, id), want, "remove_shared count");
            }
        }
    }
    check_all(&index, &model);
}

/// Decodes fuzzer bytes into ops and runs them.
pub fn run_bytes(data: &[u8]) {
    // One op after another until the bytes run out (denser than a
    // length-prefixed `Vec`).
    let mut u = Unstructured::new(data);
    let mut ops = Vec::new();
    while !u.is_empty() {
        match Op::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    run(&ops);
}
