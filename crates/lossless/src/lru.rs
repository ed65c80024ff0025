//! A bounded map that lets the least recently used entries go first: a gateway past its bound
//! keeps its active sessions' state and reads the idle ones' from the store again, instead of
//! starting over at a cliff.

use std::collections::HashMap;
use std::hash::Hash;

/// A map of at most `capacity` entries; when full, the least recently used eighth leaves.
#[derive(Debug)]
pub(crate) struct Lru<K, V> {
    entries: HashMap<K, (u64, V)>,
    capacity: usize,
    clock: u64,
}

impl<K: Eq + Hash + Clone, V> Lru<K, V> {
    pub(crate) fn new(capacity: usize) -> Lru<K, V> {
        Lru {
            entries: HashMap::new(),
            capacity: capacity.max(1),
            clock: 0,
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The entry, marked as used.
    pub(crate) fn get(&mut self, key: &K) -> Option<&V> {
        let now = self.tick();
        let (used, value) = self.entries.get_mut(key)?;
        *used = now;
        Some(value)
    }

    /// Keeps `value` under `key` (marked as used); when the map is full, the least recently
    /// used eighth of it leaves first.
    pub(crate) fn insert(&mut self, key: K, value: V) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.evict(|_| true);
        }
        let now = self.tick();
        self.entries.insert(key, (now, value));
    }

    /// The entry (marked as used), made by `make` when there is none; when the map is full,
    /// the least recently used eighth of what `may_go` allows leaves first.
    pub(crate) fn get_or_insert_with(
        &mut self,
        key: K,
        may_go: impl Fn(&V) -> bool,
        make: impl FnOnce() -> V,
    ) -> &mut V {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.evict(may_go);
        }
        let now = self.tick();
        let (used, value) = self.entries.entry(key).or_insert_with(|| (now, make()));
        *used = now;
        value
    }

    /// Lets the least recently used eighth of the entries `may_go` allows leave (at least one).
    pub(crate) fn evict(&mut self, may_go: impl Fn(&V) -> bool) {
        let mut candidates: Vec<(u64, K)> = self
            .entries
            .iter()
            .filter(|(_, (_, value))| may_go(value))
            .map(|(key, (used, _))| (*used, key.clone()))
            .collect();
        let leaving = (self.capacity / 8).max(1).min(candidates.len());
        if leaving == 0 {
            return;
        }
        candidates.select_nth_unstable_by_key(leaving - 1, |(used, _)| *used);
        for (_, key) in candidates.into_iter().take(leaving) {
            self.entries.remove(&key);
        }
    }

    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        self.entries.remove(key).map(|(_, value)| value)
    }

    /// Every value, in no order (their use unchanged).
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.entries.values_mut().map(|(_, value)| value)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_leave_first_and_the_rest_stay() {
        let mut lru = Lru::new(16);
        for key in 0..16 {
            lru.insert(key, key * 10);
        }
        // 0 and 1 are used again: 2 and 3 are now the least recently used.
        assert_eq!(lru.get(&0), Some(&0));
        assert_eq!(lru.get(&1), Some(&10));
        lru.insert(16, 160);
        lru.insert(17, 170);
        assert_eq!(lru.len(), 16, "two left (an eighth of 16) to make room");
        assert!(lru.get(&2).is_none() && lru.get(&3).is_none());
        for key in [0, 1, 4, 15, 16, 17] {
            assert!(lru.get(&key).is_some(), "{key} stays");
        }
    }

    #[test]
    fn an_entry_made_on_first_use_is_kept_and_a_full_map_lets_only_what_may_go() {
        let mut lru = Lru::new(8);
        for key in 0..8 {
            *lru.get_or_insert_with(key, |_| true, || 0) += key;
        }
        assert_eq!(lru.get(&3), Some(&3), "made once, then changed in place");
        *lru.get_or_insert_with(3, |_| true, || 100) += 1;
        assert_eq!(lru.get(&3), Some(&4), "an existing entry is not made again");
        // Full: only odd entries may go; the oldest of them (1) leaves.
        lru.get_or_insert_with(8, |value| value % 2 == 1, || 8);
        assert_eq!(lru.len(), 8);
        assert!(lru.get(&1).is_none());
        assert!(lru.get(&0).is_some() && lru.get(&8).is_some());
    }

    #[test]
    fn an_eviction_passes_over_what_may_not_go() {
        let mut lru = Lru::new(8);
        for key in 0..8 {
            lru.insert(key, key % 2 == 0);
        }
        lru.evict(|busy| !*busy);
        assert_eq!(lru.len(), 7);
        assert!(lru.get(&1).is_none(), "the oldest idle entry left");
        assert!(lru.get(&0).is_some(), "a busy one stays, however old");
    }
}
