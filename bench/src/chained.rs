//! The kernel's chained hash table, the baseline both of fprobe's old
//! address table (`fprobe_ip_table`: 256 buckets, the harness's
//! `fixed256`) and of the kprobe table (`kprobe_table`: 4,096 buckets, in
//! front of which `benches/hit_cache.rs` puts the hit cache): `1 << BITS`
//! buckets of singly linked lists, new nodes at the head, the bucket
//! chosen by `hash_64(addr, BITS)` (multiply by `GOLDEN_RATIO_64`, keep the
//! top `BITS` bits; `hash_ptr` on 64 bits). Nodes are allocated one by one
//! in the order the entries are given, so a chain walk follows pointers
//! wherever the allocator put them.
//!
//! This file is also included with `#[path]` by `benches/hit_cache.rs` in
//! the root crate, so it depends on nothing but `std`.

/// `1 << BITS` buckets of singly linked `(address, value)` nodes.
pub struct Chained<V, const BITS: u32> {
    heads: Vec<Option<Box<Node<V>>>>,
}

struct Node<V> {
    addr: u64,
    value: V,
    next: Option<Box<Node<V>>>,
}

impl<V, const BITS: u32> Chained<V, BITS> {
    /// The bucket of `addr`: the kernel's `hash_64(addr, BITS)`.
    pub fn bucket(addr: u64) -> usize {
        (addr.wrapping_mul(0x61C8_8646_80B5_83EB) >> (64 - BITS)) as usize
    }

    /// A table of `entries`, each pushed at the head of its bucket's chain
    /// in the order given (an address may come more than once).
    pub fn new(entries: impl IntoIterator<Item = (u64, V)>) -> Self {
        let mut heads: Vec<Option<Box<Node<V>>>> = (0..1usize << BITS).map(|_| None).collect();
        for (addr, value) in entries {
            let head = &mut heads[Self::bucket(addr)];
            *head = Some(Box::new(Node {
                addr,
                value,
                next: head.take(),
            }));
        }
        Self { heads }
    }

    /// The value of the first node for `addr` in its chain (the one given
    /// last), the walk stopping there; `None` when there is none.
    #[inline]
    pub fn first(&self, addr: u64) -> Option<&V> {
        let mut cur = self.heads[Self::bucket(addr)].as_deref();
        while let Some(n) = cur {
            if n.addr == addr {
                return Some(&n.value);
            }
            cur = n.next.as_deref();
        }
        None
    }

    /// Calls `f` with the value of every node for `addr`: the whole chain
    /// is walked, since one address's nodes may be anywhere in it.
    #[inline]
    pub fn for_each(&self, addr: u64, mut f: impl FnMut(&V)) {
        let mut cur = self.heads[Self::bucket(addr)].as_deref();
        while let Some(n) = cur {
            if n.addr == addr {
                f(&n.value);
            }
            cur = n.next.as_deref();
        }
    }
}

impl<V, const BITS: u32> Drop for Chained<V, BITS> {
    fn drop(&mut self) {
        // Iteratively: chains of thousands would recurse that deep.
        for head in &mut self.heads {
            let mut cur = head.take();
            while let Some(mut n) = cur {
                cur = n.next.take();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// An address given twice, one given once, and one in no entry, in 4
    /// buckets (so chains hold more than one address).
    #[test]
    fn first_and_every_value() {
        let t: super::Chained<u64, 2> =
            super::Chained::new([(0x1000, 1), (0x1010, 2), (0x1000, 3)]);
        assert_eq!(t.first(0x1000), Some(&3));
        assert_eq!(t.first(0x1010), Some(&2));
        assert_eq!(t.first(0x1020), None);
        let mut seen = Vec::new();
        t.for_each(0x1000, |&v| seen.push(v));
        assert_eq!(seen, [3, 1]);
        t.for_each(0x1020, |_| panic!("no value at 0x1020"));
        assert!((0..1 << 20).all(|a| super::Chained::<u64, 2>::bucket(a) < 4));
    }
}
