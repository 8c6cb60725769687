//! Manifests kept by content: one copy of each distinct manifest JSON, however many sessions
//! registered it (every tab of one plugin registers the same), shared by its sessions.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// The distinct manifests, by the SHA-256 of their JSON. Each entry lives as long as a
/// session holds it: the map's own `Arc` is the one reference left when the last session lets
/// go (every other one sits in a session, behind the store's lock, so the count is exact).
#[derive(Default)]
pub(super) struct Manifests {
    by_hash: HashMap<[u8; 32], Arc<str>>,
}

impl Manifests {
    /// The kept copy of `json`, kept now if it is new.
    pub(super) fn share(&mut self, json: String) -> Arc<str> {
        let hash: [u8; 32] = Sha256::digest(json.as_bytes()).into();
        Arc::clone(self.by_hash.entry(hash).or_insert_with(|| Arc::from(json)))
    }

    /// A session lets go of `manifest`: forgotten when no other session holds it.
    pub(super) fn release(&mut self, manifest: Arc<str>) {
        // This one and the map's: nobody else holds it.
        if Arc::strong_count(&manifest) == 2 {
            let hash: [u8; 32] = Sha256::digest(manifest.as_bytes()).into();
            self.by_hash.remove(&hash);
        }
    }

    /// How many distinct manifests are kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_hash.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_copy_per_distinct_manifest_for_as_long_as_a_session_holds_it() {
        let mut manifests = Manifests::default();
        let codap = r#"[{"name":"codap","functions":[]}]"#;
        let held: Vec<Arc<str>> = (0..1_000)
            .map(|_| manifests.share(codap.to_owned()))
            .collect();
        assert_eq!(manifests.len(), 1);
        assert!(held.iter().all(|manifest| Arc::ptr_eq(manifest, &held[0])));
        let other = manifests.share("[]".to_owned());
        assert_eq!(manifests.len(), 2);
        manifests.release(other);
        assert_eq!(manifests.len(), 1, "the last holder let go");
        for manifest in held {
            manifests.release(manifest);
        }
        assert_eq!(manifests.len(), 0);
    }
}
