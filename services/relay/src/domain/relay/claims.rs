//! Claims: a session opened for a tab that is not there yet, and the one-time secret with which
//! that tab takes it over (an MCP App's CODAP: `open_codap` creates the session, the plugin the
//! app frames redeems the claim instead of showing a code).
//!
//! A claim is 128 random bits. The store keeps, under the claim's SHA-256, only the session's
//! code and when the claim expires (a claim-check ticket), and marks a redeemed claim with a
//! lock, so a claim works on every replica and only once. Until it is redeemed the session's
//! provider token is one nobody was given; redeeming it mints a fresh random token and the
//! store keeps its hash, as for a created session. So a spent claim opens nothing — no value
//! derived from it is a credential — and a dump of the store shows neither a claim nor a
//! token. The ticket is kept one more claim lifetime after the claim expires, so an expired
//! claim is told apart from one never minted.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{NewSession, Relay};
use crate::clock::Timestamp;
use crate::code::{self, SessionCode};
use crate::error::RelayError;

/// A session created for a tab to come, with the claim that tab redeems.
#[derive(Debug, Clone)]
pub struct ClaimedSession {
    /// The session, as its creation returns it.
    pub session: NewSession,
    /// The one-time secret the tab redeems for the session (`POST /api/sessions/claim`).
    pub claim: String,
    /// When the claim can no longer be redeemed.
    pub claim_expires_at: Timestamp,
}

/// What a claim is, told without spending it ([`DescribeClaim`](crate::ops::DescribeClaim)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimDescription {
    /// What the MCP client that opened it says it is, if it said.
    pub label: Option<String>,
    /// When it can no longer be redeemed.
    pub claim_expires_at: Timestamp,
}

/// A claim's ticket: the session it opens, when it expires, who opened it, and whether it was
/// redeemed.
struct Ticket {
    code: SessionCode,
    expires_at: Timestamp,
    label: Option<String>,
    redeemed: bool,
}

impl Ticket {
    fn read(ticket: &Value) -> Option<Self> {
        Some(Self {
            code: SessionCode::parse(ticket.get("code")?.as_str()?).ok()?,
            expires_at: Timestamp(ticket.get("expiresAt")?.as_i64()?),
            label: ticket
                .get("label")
                .and_then(Value::as_str)
                .map(str::to_owned),
            redeemed: ticket.get("redeemed").and_then(Value::as_bool) == Some(true),
        })
    }

    fn to_value(&self) -> Value {
        json!({
            "code": self.code.as_str(),
            "expiresAt": self.expires_at.0,
            "label": self.label,
            "redeemed": self.redeemed,
        })
    }
}

/// The ticket scope of a claim: one of 256, by the first byte of its hash, so that as many
/// claims may be out at once as 256 scopes hold.
fn scope(hash: &str) -> String {
    format!("pairing-claims/{}", &hash[..2])
}

impl Relay {
    /// Creates a session and mints the claim its tab will redeem, opened by a caller that says
    /// it is `label`.
    pub(crate) async fn create_claimed_session(
        &self,
        label: Option<&str>,
    ) -> Result<ClaimedSession, RelayError> {
        let claim = code::random_id();
        let hash = code::hash_token(&claim);
        let lifetime = self.inner.config.claim_ttl;
        let claim_expires_at = self.now().plus(lifetime);
        self.within_ceiling(super::Ceiling::Claims, &hash, claim_expires_at)
            .await?;
        // Its token is nobody's until the claim is redeemed: no tab attaches before then.
        let mut session = self.create_session_with(code::generate_token()).await?;
        session.provider_token.clear();
        let ticket = Ticket {
            code: session.code.clone(),
            expires_at: claim_expires_at,
            label: label.map(str::to_owned),
            redeemed: false,
        };
        self.inner
            .store
            .put_ticket(
                &scope(&hash),
                &hash,
                Arc::new(ticket.to_value()),
                claim_expires_at.plus(lifetime),
            )
            .await?;
        Ok(ClaimedSession {
            session,
            claim,
            claim_expires_at,
        })
    }

    /// A claim's ticket while it can be redeemed: an unknown, redeemed or expired claim is
    /// refused as such.
    async fn open_ticket(&self, hash: &str) -> Result<Ticket, RelayError> {
        let ticket = self.inner.store.ticket(&scope(hash), hash).await?;
        let Some(ticket) = ticket.as_deref().and_then(Ticket::read) else {
            return Err(RelayError::UnknownClaim);
        };
        if ticket.redeemed {
            return Err(RelayError::ClaimUsed);
        }
        if self.now() >= ticket.expires_at {
            return Err(self.claim_expired());
        }
        Ok(ticket)
    }

    fn claim_expired(&self) -> RelayError {
        RelayError::ClaimExpired {
            minutes: self.inner.config.claim_ttl.as_secs().div_ceil(60),
        }
    }

    /// What a claim is, without spending it: who opened it and until when it can be
    /// redeemed. Refused as [`Relay::redeem_claim`] refuses.
    pub(crate) async fn describe_claim(&self, claim: &str) -> Result<ClaimDescription, RelayError> {
        let ticket = self.open_ticket(&code::hash_token(claim)).await?;
        Ok(ClaimDescription {
            label: ticket.label,
            claim_expires_at: ticket.expires_at,
        })
    }

    /// The session a claim opened, with its provider token, once: a claim redeemed before,
    /// past its expiry, or never minted is refused.
    pub(crate) async fn redeem_claim(&self, claim: &str) -> Result<NewSession, RelayError> {
        let hash = code::hash_token(claim);
        let mut ticket = self.open_ticket(&hash).await?;
        let expired = self.claim_expired();
        let lifetime = self.inner.config.claim_ttl;
        let redeemer = code::random_id();
        let until = ticket.expires_at.plus(lifetime);
        if !self
            .inner
            .store
            .lock(&format!("claim:{hash}"), &redeemer, until)
            .await?
        {
            return Err(RelayError::ClaimUsed);
        }
        let Ok((code, session)) = self.live_session(ticket.code.as_str()).await else {
            return Err(expired);
        };
        // The tab's own token, known to it alone from now on.
        let provider_token = code::generate_token();
        let token_hash = code::hash_token(&provider_token);
        if !self.inner.store.set_token(&code, &token_hash).await? {
            return Err(expired);
        }
        // Told apart from an open claim from now on, without taking the lock (a description
        // of the claim says it was used).
        ticket.redeemed = true;
        self.inner
            .store
            .put_ticket(&scope(&hash), &hash, Arc::new(ticket.to_value()), until)
            .await?;
        tracing::info!(code = %code.redacted(), "claim redeemed");
        Ok(NewSession {
            code,
            provider_token,
            ttl: self.inner.config.session_ttl,
            expires_at: session.expires_at,
            max_expires_at: session.max_expires_at,
            mcp_handle: session.mcp_handle,
        })
    }
}
