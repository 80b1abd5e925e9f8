//! Values kept by id within a budget of bytes, the least recently used let go first to make
//! room: what the Responses API's kept responses ([`super::store`]) and the Conversations
//! API's conversations ([`super::conversation_store`]) are held in.

use lru::LruCache;

/// Values by id, each counted as the bytes it was put with.
#[derive(Debug)]
pub struct Budgeted<V> {
    budget: usize,
    by_id: LruCache<String, (V, usize)>,
    bytes: usize,
}

impl<V> Budgeted<V> {
    /// At most `budget` bytes (0: nothing is kept).
    pub fn new(budget: usize) -> Budgeted<V> {
        Budgeted {
            budget,
            by_id: LruCache::unbounded(),
            bytes: 0,
        }
    }

    /// Keeps `value` as `id` (in place of the one of that id), counted as `size` bytes, letting
    /// the least recently used others go to make room; a value larger than the whole budget is
    /// not kept (false), and the one it would replace stays.
    pub fn put(&mut self, id: String, value: V, size: usize) -> bool {
        if size > self.budget {
            return false;
        }
        self.remove(&id);
        while self.bytes + size > self.budget {
            match self.by_id.pop_lru() {
                Some((_, (_, old))) => self.bytes -= old,
                None => break,
            }
        }
        self.bytes += size;
        self.by_id.put(id, (value, size));
        true
    }

    /// The value of `id`, marked as used.
    pub fn get(&mut self, id: &str) -> Option<&V> {
        self.by_id.get(id).map(|(value, _)| value)
    }

    /// Removes the value of `id`.
    pub fn remove(&mut self, id: &str) -> Option<V> {
        let (value, size) = self.by_id.pop(id)?;
        self.bytes -= size;
        Some(value)
    }

    /// The bytes kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_go_first_and_none_is_larger_than_the_budget() {
        let mut kept = Budgeted::new(10);
        assert!(kept.put("a".into(), 1, 4));
        assert!(kept.put("b".into(), 2, 4));
        assert_eq!(kept.get("a"), Some(&1));
        // `a` used last: `b` goes when `c` comes.
        assert!(kept.put("c".into(), 3, 4));
        assert_eq!(kept.get("b"), None);
        assert_eq!(kept.get("a"), Some(&1));
        assert_eq!(kept.get("c"), Some(&3));
        assert_eq!(kept.bytes(), 8);
        // One put again replaces itself, counted anew.
        assert!(kept.put("a".into(), 4, 2));
        assert_eq!(kept.get("a"), Some(&4));
        assert_eq!(kept.bytes(), 6);
        // Too large for the whole budget: refused, and what was there stays.
        assert!(!kept.put("a".into(), 5, 11));
        assert_eq!(kept.get("a"), Some(&4));
        assert_eq!(kept.remove("a"), Some(4));
        assert_eq!((kept.remove("a"), kept.bytes()), (None, 4));
        let mut none = Budgeted::new(0);
        assert!(!none.put("x".into(), (), 1));
    }
}
