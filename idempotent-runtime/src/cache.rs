//! The optional in-process cache of COMPLETED responses: a duplicate answered from it costs no round trip.
//!
//! Only COMPLETED records are cached — they cannot change until they expire — and only until their
//! replay window ends, so the cache never answers differently from the store. PENDING and FAILED records
//! are never cached.
//!
//! It keeps the response as stored (compressed when large) and decodes it on each hit, through the same
//! bound as a replay from the store (the handle's `max_response_bytes`); a response is cached only once
//! it decoded, so a record that inflates past the bound is never kept.

use std::sync::Arc;

/// A COMPLETED response, as stored.
#[derive(Debug, Clone)]
pub(crate) struct Cached {
    pub(crate) response: Arc<[u8]>,
    pub(crate) fingerprint: Option<Arc<str>>,
    /// Replayable up to and including this epoch second.
    pub(crate) replay_until_s: u64,
}

/// Keys → COMPLETED responses, bounded by entry count (least recently used evicted first).
#[derive(Debug)]
pub(crate) struct ResponseCache {
    entries: quick_cache::sync::Cache<String, Cached>,
}

impl ResponseCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            entries: quick_cache::sync::Cache::new(capacity.max(1)),
        }
    }

    /// The cached response for `key`, if it is still replayable at `now_ms`.
    pub(crate) fn get(&self, key: &str, now_ms: u64) -> Option<Cached> {
        let hit = self.entries.get(key)?;
        if hit.replay_until_s < now_ms / 1000 {
            self.entries.remove(key);
            return None;
        }
        Some(hit)
    }

    pub(crate) fn insert(&self, key: &str, entry: Cached) {
        self.entries.insert(key.to_owned(), entry);
    }
}
