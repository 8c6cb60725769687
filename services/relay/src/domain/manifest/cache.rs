//! The cache: this replica's compiled manifests, by session and revision, with the sessions
//! that register the same tools sharing one copy.

use std::sync::Arc;

use super::Manifest;

/// Compiled manifests of this replica, by session and revision: a store holds only the JSON,
/// and compiling schemas for every call would cost more than the call.
///
/// Sessions that register the same tools (every tab of one plugin does) share one compiled
/// manifest: a replica keeps one copy of each distinct manifest however many sessions use it,
/// and compiles it once.
#[derive(Debug, Default)]
pub struct ManifestCache {
    /// A std mutex: held for one map operation, never across an `.await`.
    entries:
        std::sync::Mutex<std::collections::HashMap<crate::code::SessionCode, (u64, Arc<Manifest>)>>,
    /// Compiled manifests in use, by their JSON ([`Manifest::to_json`]); an entry whose
    /// manifest no session uses any more is pruned as the map grows.
    shared: std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<Manifest>>>,
}

/// Sessions whose compiled manifests a replica keeps at most.
const CACHED_MANIFESTS: usize = 10_000;
/// Distinct manifests past which the shared ones no session uses are pruned (again at every
/// doubling, so pruning costs a constant per manifest added).
const SHARED_PRUNE_AT: usize = 64;

impl ManifestCache {
    /// The compiled manifest of `code` at `revision`, if this replica has it.
    pub fn get(&self, code: &crate::code::SessionCode, revision: u64) -> Option<Arc<Manifest>> {
        let entries = self.lock();
        entries
            .get(code)
            .filter(|(cached, _)| *cached == revision)
            .map(|(_, manifest)| Arc::clone(manifest))
    }

    /// The newest compiled manifest of `code` this replica has, with its revision.
    pub fn latest(&self, code: &crate::code::SessionCode) -> Option<(u64, Arc<Manifest>)> {
        let entries = self.lock();
        entries
            .get(code)
            .map(|(revision, manifest)| (*revision, Arc::clone(manifest)))
    }

    /// The compiled manifest whose JSON is `json`: the one sessions use already, or the one
    /// `compile` makes (kept for the next session that registers the same tools).
    pub fn shared<E>(
        &self,
        json: &str,
        compile: impl FnOnce() -> Result<Manifest, E>,
    ) -> Result<Arc<Manifest>, E> {
        if let Some(manifest) = self
            .lock_shared()
            .get(json)
            .and_then(std::sync::Weak::upgrade)
        {
            return Ok(manifest);
        }
        // Compiled without the lock: schemas take a while, and two sessions compiling the
        // same tools at once only waste a little work.
        let manifest = Arc::new(compile()?);
        let mut shared = self.lock_shared();
        if let Some(existing) = shared.get(json).and_then(std::sync::Weak::upgrade) {
            return Ok(existing);
        }
        if shared.len() >= SHARED_PRUNE_AT && shared.len().is_power_of_two() {
            shared.retain(|_, manifest| manifest.strong_count() > 0);
        }
        shared.insert(json.to_owned(), Arc::downgrade(&manifest));
        Ok(manifest)
    }

    /// Keeps `manifest` as the one of `code` at `revision` (a newer revision replaces it).
    pub fn put(&self, code: &crate::code::SessionCode, revision: u64, manifest: Arc<Manifest>) {
        let mut entries = self.lock();
        if entries.len() >= CACHED_MANIFESTS && !entries.contains_key(code) {
            // Full: drop one (any; an evicted manifest is compiled again on its next call).
            if let Some(victim) = entries.keys().next().cloned() {
                entries.remove(&victim);
            }
        }
        match entries.get(code) {
            Some((cached, _)) if *cached > revision => {}
            _ => {
                entries.insert(code.clone(), (revision, manifest));
            }
        }
    }

    fn lock_shared(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, std::sync::Weak<Manifest>>>
    {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::HashMap<crate::code::SessionCode, (u64, Arc<Manifest>)>,
    > {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
