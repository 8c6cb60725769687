//! Claim checks in memory, compressed, within their budgets.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Write};
use std::sync::Arc;

use async_trait::async_trait;
use flate2::Compression;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use serde_json::Value;

use super::{MAX_TICKETS_PER_SCOPE, MemoryStore, TICKET_OVERHEAD, Tables};
use crate::clock::Timestamp;
use crate::error::StoreError;
use crate::store::TicketStore;

/// A claim check, kept as DEFLATE-compressed JSON: a model's JSON repeats its field names for
/// every variable and shrinks ~15 times, and what is kept is what is counted.
pub(super) struct Ticket {
    packed: Arc<[u8]>,
    /// Its size in the byte budget.
    cost: usize,
    expires_at: Timestamp,
}

impl Ticket {
    pub(super) fn pack(
        value: &Value,
        keys: usize,
        expires_at: Timestamp,
    ) -> Result<Self, StoreError> {
        let packed: Arc<[u8]> = pack_ticket(value)?.into();
        Ok(Self {
            cost: packed.len() + keys + TICKET_OVERHEAD,
            packed,
            expires_at,
        })
    }
}

/// Compresses a claim check's value, written straight into the compressor so that the JSON
/// text of a big model never exists whole (a fast level: a 7.5 MB model takes ~30 ms).
pub(in crate::store) fn pack_ticket(value: &Value) -> Result<Vec<u8>, StoreError> {
    let failed =
        |error: std::io::Error| StoreError(format!("a claim check cannot be kept: {error}"));
    let mut writer = BufWriter::with_capacity(
        64 * 1024,
        DeflateEncoder::new(Vec::new(), Compression::fast()),
    );
    serde_json::to_writer(&mut writer, value)
        .map_err(|error| StoreError(format!("a claim check is not JSON: {error}")))?;
    writer.flush().map_err(failed)?;
    let encoder = writer
        .into_inner()
        .map_err(|error| failed(error.into_error()))?;
    encoder.finish().map_err(failed)
}

/// A claim check's value back, decompressed as it is parsed.
pub(in crate::store) fn unpack_ticket(packed: &[u8]) -> Result<Value, StoreError> {
    serde_json::from_reader(BufReader::with_capacity(
        64 * 1024,
        DeflateDecoder::new(packed),
    ))
    .map_err(|error| StoreError(format!("a claim check is unreadable: {error}")))
}

impl Tables {
    /// Drops the ticket of `scope` expiring first; false when there is none.
    pub(super) fn evict_from(&mut self, scope: &str) -> bool {
        let Some(mine) = self.tickets.get(scope) else {
            return false;
        };
        let Some((expires_at, id)) = mine
            .iter()
            .min_by_key(|(_, ticket)| ticket.expires_at)
            .map(|(id, ticket)| (ticket.expires_at, id.clone()))
        else {
            return false;
        };
        self.remove_ticket(expires_at, scope, &id);
        true
    }

    /// Drops the ticket expiring first of any scope; false when there is none.
    pub(super) fn evict_any(&mut self) -> bool {
        match self.ticket_expiries.first().cloned() {
            Some((expires_at, scope, id)) => {
                self.remove_ticket(expires_at, &scope, &id);
                true
            }
            None => false,
        }
    }

    pub(super) fn remove_ticket(&mut self, expires_at: Timestamp, scope: &str, id: &str) {
        self.ticket_expiries
            .remove(&(expires_at, scope.to_owned(), id.to_owned()));
        let Some(mine) = self.tickets.get_mut(scope) else {
            return;
        };
        if let Some(ticket) = mine.remove(id) {
            self.ticket_bytes -= ticket.cost;
        }
        if mine.is_empty() {
            self.tickets.remove(scope);
        }
    }
}

#[async_trait]
impl TicketStore for MemoryStore {
    async fn put_ticket(
        &self,
        scope: &str,
        id: &str,
        value: Arc<Value>,
        expires_at: Timestamp,
    ) -> Result<(), StoreError> {
        // Compressed before the lock is taken: a large model must not hold up every session.
        let ticket = Ticket::pack(&value, scope.len() + id.len(), expires_at)?;
        drop(value);
        let mut tables = self.lock();
        if let Some(previous) = tables
            .tickets
            .get(scope)
            .and_then(|mine| mine.get(id))
            .map(|ticket| ticket.expires_at)
        {
            tables.remove_ticket(previous, scope, id);
        }
        // A scope keeps its newest tickets only, and all scopes share a byte budget.
        while tables.tickets.get(scope).map_or(0, HashMap::len) >= MAX_TICKETS_PER_SCOPE {
            tables.evict_from(scope);
        }
        while tables.ticket_bytes + ticket.cost > self.limits.ticket_budget && tables.evict_any() {}
        tables.ticket_bytes += ticket.cost;
        tables
            .ticket_expiries
            .insert((expires_at, scope.to_owned(), id.to_owned()));
        tables
            .tickets
            .entry(scope.to_owned())
            .or_default()
            .insert(id.to_owned(), ticket);
        Ok(())
    }

    async fn ticket(&self, scope: &str, id: &str) -> Result<Option<Arc<Value>>, StoreError> {
        let now = self.clock.now();
        let tables = self.lock();
        let Some(packed) = tables
            .tickets
            .get(scope)
            .and_then(|mine| mine.get(id))
            .filter(|ticket| ticket.expires_at > now)
            .map(|ticket| Arc::clone(&ticket.packed))
        else {
            return Ok(None);
        };
        drop(tables);
        // Read outside the lock: a large model must not hold up every session.
        unpack_ticket(&packed).map(|value| Some(Arc::new(value)))
    }
}
