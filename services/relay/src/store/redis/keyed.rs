//! The Redis store's parts outside sessions: MCP client sessions, rate budgets and locks, and
//! claim checks (each group of keys in one slot of its own, see `super`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::AsyncCommands;
use serde_json::Value;

use super::{RedisStore, store_error};
use crate::clock::Timestamp;
use crate::error::StoreError;
use crate::store::memory::{MAX_TICKETS_PER_SCOPE, TICKET_OVERHEAD, pack_ticket, unpack_ticket};
use crate::store::{
    BudgetStore, McpSessionCaps, McpSessionStore, McpSessionsFull, RateBudget, TicketStore,
};

#[async_trait]
impl McpSessionStore for RedisStore {
    async fn open_mcp_session(
        &self,
        slot: &str,
        address: &str,
        caps: McpSessionCaps,
        expires_at: Timestamp,
    ) -> Result<Result<(), McpSessionsFull>, StoreError> {
        let full: i64 = self
            .mcp_script(&self.scripts.open_mcp)
            .arg(slot)
            .arg(address)
            .arg(expires_at.0)
            .arg(caps.per_address)
            .arg(caps.total)
            .invoke_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        Ok(match full {
            1 => Err(McpSessionsFull::PerAddress),
            2 => Err(McpSessionsFull::Total),
            _ => Ok(()),
        })
    }

    async fn put_mcp_session(
        &self,
        id: &str,
        slot: &str,
        address: &str,
        state: String,
        expires_at: Timestamp,
    ) -> Result<(), StoreError> {
        self.mcp_script(&self.scripts.put_mcp)
            .arg(id)
            .arg(slot)
            .arg(address)
            .arg(expires_at.0)
            .arg(state)
            .invoke_async::<()>(&mut self.connection())
            .await
            .map_err(store_error)
    }

    async fn touch_mcp_session(&self, id: &str, expires_at: Timestamp) -> Result<bool, StoreError> {
        let kept: i64 = self
            .mcp_script(&self.scripts.touch_mcp)
            .arg(id)
            .arg(expires_at.0)
            .invoke_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        Ok(kept == 1)
    }

    async fn mcp_session(&self, id: &str) -> Result<Option<String>, StoreError> {
        let kept: Option<String> = self
            .connection()
            .get(format!("{}{{mcp}}:s:{id}", self.prefix))
            .await
            .map_err(store_error)?;
        Ok(kept.and_then(|kept| {
            let (expires_at, rest) = kept.split_once('\n')?;
            let (_address, state) = rest.split_once('\n')?;
            (expires_at.parse::<i64>().ok()? > self.clock.now().0).then(|| state.to_owned())
        }))
    }

    async fn delete_mcp_session(&self, id: &str) -> Result<(), StoreError> {
        self.mcp_script(&self.scripts.delete_mcp)
            .arg(id)
            .invoke_async::<()>(&mut self.connection())
            .await
            .map_err(store_error)
    }
}

impl RedisStore {
    /// A place for `member` in the set of live things at `key` (`lua/place.lua`), its
    /// expired members dropped first when `prune`: whether it has one.
    pub(super) async fn place(
        &self,
        key: String,
        member: &str,
        cap: usize,
        now: Timestamp,
        expires_at: Timestamp,
        prune: bool,
    ) -> Result<bool, StoreError> {
        let placed: i64 = self
            .scripts
            .place
            .key(key)
            .arg(now.0)
            .arg(cap)
            .arg(member)
            .arg(expires_at.0)
            .arg(if prune { "1" } else { "0" })
            .invoke_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        Ok(placed == 1)
    }
}

#[async_trait]
impl BudgetStore for RedisStore {
    async fn lock(&self, key: &str, holder: &str, until: Timestamp) -> Result<bool, StoreError> {
        // Redis drops the key at `until` by its own clock: the replicas' milliseconds of
        // disagreement move a lock of seconds by as much.
        let taken: i64 = self
            .scripts
            .lock
            .key(self.key(&format!("lock:{key}")))
            .arg(holder)
            .arg(until.0)
            .invoke_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        Ok(taken == 1)
    }

    async fn unlock(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        let _: i64 = self
            .scripts
            .unlock
            .key(self.key(&format!("lock:{key}")))
            .arg(holder)
            .invoke_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn take_place(
        &self,
        set: &str,
        member: &str,
        cap: usize,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<bool, StoreError> {
        let key = self.key(&format!("places:{set}"));
        self.place(key, member, cap, now, expires_at, true).await
    }

    async fn spend(
        &self,
        key: &str,
        budget: RateBudget,
        now: Timestamp,
    ) -> Result<Option<Duration>, StoreError> {
        let over: i64 = self
            .scripts
            .spend
            .key(self.rate_key(key))
            .arg(now.0.saturating_mul(1000))
            .arg(budget.interval_micros())
            .arg(budget.tolerance_micros())
            .invoke_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        Ok((over > 0).then(|| Duration::from_micros(over.unsigned_abs())))
    }
}

#[async_trait]
impl TicketStore for RedisStore {
    async fn put_ticket(
        &self,
        scope: &str,
        id: &str,
        value: Arc<Value>,
        expires_at: Timestamp,
    ) -> Result<(), StoreError> {
        let packed = pack_ticket(&value)?;
        drop(value);
        let cost = packed.len() + scope.len() + id.len() + TICKET_OVERHEAD;
        let member = format!("{id}\n{cost}\n{scope}");
        let ticket_prefix = self.key("{tickets}:t:");
        let scope_prefix = self.key("{tickets}:ts:");
        let mut invocation = self
            .scripts
            .put_ticket
            .key(format!("{ticket_prefix}{scope}\n{id}"));
        invocation
            .key(format!("{scope_prefix}{scope}"))
            .key(self.key("{tickets}:all"))
            .key(self.key("{tickets}:bytes"))
            .arg(self.clock.now().0)
            .arg(packed.as_slice())
            .arg(expires_at.0)
            .arg(cost)
            .arg(member)
            .arg(scope)
            .arg(MAX_TICKETS_PER_SCOPE)
            .arg(self.limits.ticket_budget)
            .arg(ticket_prefix)
            .arg(scope_prefix);
        let _: i64 = invocation
            .invoke_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn ticket(&self, scope: &str, id: &str) -> Result<Option<Arc<Value>>, StoreError> {
        let key = self.key(&format!("{{tickets}}:t:{scope}\n{id}"));
        let (packed, expires_at): (Option<Vec<u8>>, Option<i64>) = redis::cmd("HMGET")
            .arg(&key)
            .arg("v")
            .arg("expires_at")
            .query_async(&mut self.connection())
            .await
            .map_err(store_error)?;
        match (packed, expires_at) {
            (Some(packed), Some(expires_at)) if expires_at > self.clock.now().0 => {
                unpack_ticket(&packed).map(|value| Some(Arc::new(value)))
            }
            _ => Ok(None),
        }
    }
}
