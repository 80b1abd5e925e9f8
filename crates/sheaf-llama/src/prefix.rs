//! Kept prompt prefixes: finished prompts whose KV cells stay in the cache under their own
//! sequence id, so that a new prompt starting with the same tokens skips their prefill. Kept in
//! least-recently-used order, within a number of slots, and dropped first when cells run short.

use llama_cpp_2::token::LlamaToken;

/// Shorter common prefixes are not worth a copy.
const MIN_PREFIX: usize = 4;

struct Entry {
    id: i32,
    tokens: Vec<LlamaToken>,
    used: u64,
}

/// The kept prefixes of one engine.
pub struct PrefixCache {
    slots: usize,
    entries: Vec<Entry>,
    clock: u64,
}

impl PrefixCache {
    pub fn new(slots: usize) -> PrefixCache {
        PrefixCache {
            slots,
            entries: Vec::new(),
            clock: 0,
        }
    }

    /// Cells the kept prefixes hold.
    pub fn cells(&self) -> usize {
        self.entries.iter().map(|e| e.tokens.len()).sum()
    }

    /// Whether sequence id `id` holds a kept prefix.
    pub fn holds(&self, id: i32) -> bool {
        self.entries.iter().any(|e| e.id == id)
    }

    /// The kept prefix sharing the longest start with `tokens`: its sequence id and how many
    /// tokens they share.
    pub fn lookup(&mut self, tokens: &[LlamaToken]) -> Option<(i32, usize)> {
        self.clock += 1;
        let clock = self.clock;
        let (entry, common) = self
            .entries
            .iter_mut()
            .map(|e| {
                let common = e
                    .tokens
                    .iter()
                    .zip(tokens)
                    .take_while(|(a, b)| a == b)
                    .count();
                (e, common)
            })
            .max_by_key(|(_, c)| *c)?;
        if common < MIN_PREFIX {
            return None;
        }
        entry.used = clock;
        Some((entry.id, common))
    }

    /// Keeps `tokens`, whose cells sequence `id` holds. Returns the sequence ids whose cells
    /// must now be removed: a duplicate, a prefix the new one extends, the least recently used
    /// beyond the slots.
    pub fn insert(&mut self, id: i32, tokens: Vec<LlamaToken>) -> Vec<i32> {
        self.clock += 1;
        let mut drop = Vec::new();
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.tokens.starts_with(&tokens))
        {
            // Already kept, as it is or within a longer prefix.
            e.used = self.clock;
            return vec![id];
        }
        self.entries.retain(|e| {
            let extended = tokens.starts_with(&e.tokens);
            if extended {
                drop.push(e.id);
            }
            !extended
        });
        self.entries.push(Entry {
            id,
            tokens,
            used: self.clock,
        });
        while self.entries.len() > self.slots {
            drop.extend(self.evict_oldest());
        }
        drop
    }

    /// Forgets the least recently used prefix; returns its sequence id.
    pub fn evict_oldest(&mut self) -> Option<i32> {
        let i = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.used)
            .map(|(i, _)| i)?;
        Some(self.entries.swap_remove(i).id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ids: &[i32]) -> Vec<LlamaToken> {
        ids.iter().map(|&i| LlamaToken(i)).collect()
    }

    #[test]
    fn the_longest_shared_start_wins_and_lru_goes_first() {
        let mut c = PrefixCache::new(2);
        assert!(c.insert(0, t(&[1, 2, 3, 4, 5, 6])).is_empty());
        assert!(c.insert(1, t(&[1, 2, 3, 9, 9, 9])).is_empty());
        assert_eq!(c.lookup(&t(&[1, 2, 3, 4, 5, 7])), Some((0, 5)));
        assert_eq!(c.lookup(&t(&[1, 2, 3])), None, "too short to share");
        // A duplicate is dropped; slot 1 is now the least recently used and makes room.
        assert_eq!(c.insert(2, t(&[1, 2, 3, 4, 5, 6])), [2]);
        assert_eq!(c.insert(3, t(&[7, 7, 7, 7, 7])), [1]);
        assert!(c.holds(0) && c.holds(3) && !c.holds(1));
        assert_eq!(c.cells(), 11);
        // A longer prompt replaces the prefix it extends.
        assert_eq!(c.insert(4, t(&[7, 7, 7, 7, 7, 8])), [3]);
        assert_eq!(c.evict_oldest(), Some(0));
    }
}
