//! MCP client sessions in memory: places, states, and a count per client address.

use std::collections::HashMap;

use async_trait::async_trait;

use super::{MemoryStore, locked};
use crate::clock::Timestamp;
use crate::error::StoreError;
use crate::store::{McpSessionCaps, McpSessionStore, McpSessionsFull};

/// MCP client sessions (and places opened for them), with a count per client address.
#[derive(Default)]
pub(super) struct McpSessions {
    entries: HashMap<String, McpEntry>,
    per_address: HashMap<String, u32>,
}

struct McpEntry {
    address: String,
    /// None while the place awaits its session.
    state: Option<String>,
    expires_at: Timestamp,
}

impl McpSessions {
    fn remove(&mut self, id: &str) {
        if let Some(entry) = self.entries.remove(id) {
            self.uncount(&entry.address);
        }
    }

    fn uncount(&mut self, address: &str) {
        if let Some(count) = self.per_address.get_mut(address) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.per_address.remove(address);
            }
        }
    }

    fn insert(&mut self, id: String, entry: McpEntry) {
        self.remove(&id);
        *self.per_address.entry(entry.address.clone()).or_default() += 1;
        self.entries.insert(id, entry);
    }

    /// Forgets every expired entry (O(n): only when a cap looks reached).
    fn sweep(&mut self, now: Timestamp) {
        self.entries.retain(|_, entry| entry.expires_at > now);
        self.per_address.clear();
        for entry in self.entries.values() {
            *self.per_address.entry(entry.address.clone()).or_default() += 1;
        }
    }

    fn full(&self, address: &str, caps: McpSessionCaps) -> Option<McpSessionsFull> {
        if self.per_address.get(address).copied().unwrap_or(0) >= caps.per_address {
            Some(McpSessionsFull::PerAddress)
        } else if self.entries.len() >= caps.total as usize {
            Some(McpSessionsFull::Total)
        } else {
            None
        }
    }
}

#[async_trait]
impl McpSessionStore for MemoryStore {
    async fn open_mcp_session(
        &self,
        slot: &str,
        address: &str,
        caps: McpSessionCaps,
        expires_at: Timestamp,
    ) -> Result<Result<(), McpSessionsFull>, StoreError> {
        let mut sessions = locked(&self.mcp_sessions);
        if sessions.full(address, caps).is_some() {
            sessions.sweep(self.clock.now());
            if let Some(full) = sessions.full(address, caps) {
                return Ok(Err(full));
            }
        }
        sessions.insert(
            slot.to_owned(),
            McpEntry {
                address: address.to_owned(),
                state: None,
                expires_at,
            },
        );
        Ok(Ok(()))
    }

    async fn put_mcp_session(
        &self,
        id: &str,
        slot: &str,
        address: &str,
        state: String,
        expires_at: Timestamp,
    ) -> Result<(), StoreError> {
        let mut sessions = locked(&self.mcp_sessions);
        sessions.remove(slot);
        sessions.insert(
            id.to_owned(),
            McpEntry {
                address: address.to_owned(),
                state: Some(state),
                expires_at,
            },
        );
        Ok(())
    }

    async fn touch_mcp_session(&self, id: &str, expires_at: Timestamp) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut sessions = locked(&self.mcp_sessions);
        match sessions.entries.get_mut(id) {
            Some(entry) if entry.expires_at > now && entry.state.is_some() => {
                entry.expires_at = expires_at;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn mcp_session(&self, id: &str) -> Result<Option<String>, StoreError> {
        let now = self.clock.now();
        Ok(locked(&self.mcp_sessions)
            .entries
            .get(id)
            .filter(|entry| entry.expires_at > now)
            .and_then(|entry| entry.state.clone()))
    }

    async fn delete_mcp_session(&self, id: &str) -> Result<(), StoreError> {
        locked(&self.mcp_sessions).remove(id);
        Ok(())
    }
}
