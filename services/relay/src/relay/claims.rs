//! Claims: a session opened for a tab that is not there yet, and the one-time secret with which
//! that tab takes it over (an MCP App's CODAP: `open_codap` creates the session, the plugin the
//! app frames redeems the claim instead of showing a code).
//!
//! A claim is 128 random bits. The store keeps, under the claim's SHA-256, only the session's
//! code and when the claim expires (a claim-check ticket), and marks a redeemed claim with a
//! lock, so a claim works on every replica and only once. The provider token is derived from
//! the claim, so the store holds no usable secret: a dump shows neither the claim nor the
//! token. The ticket is kept one more claim lifetime after the claim expires, so an expired
//! claim is told apart from one never minted.

use std::sync::Arc;

use data_encoding::BASE64URL_NOPAD;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tonic::Status;
use toolrelay::convert::Malformed;
use toolrelay::proto::v1 as pb;

use super::{NewSession, Relay};
use crate::api::Outcome;
use crate::clock::Timestamp;
use crate::code::{self, SessionCode};
use crate::error::RelayError;
use crate::limits::Caller;
use crate::operation::{Credential, Credentials, Operation, Visitor};
use crate::pool::Retry;
use crate::remote::RemoteRelay;

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

/// The ticket scope of a claim: one of 256, by the first byte of its hash, so that as many
/// claims may be out at once as 256 scopes hold.
fn scope(hash: &str) -> String {
    format!("pairing-claims/{}", &hash[..2])
}

/// The provider token a claim stands for.
fn provider_token(claim: &str) -> String {
    let mut digest = Sha256::new();
    digest.update(b"toolrelay provider token\n");
    digest.update(claim.as_bytes());
    BASE64URL_NOPAD.encode(&digest.finalize())
}

impl Relay {
    /// Creates a session and mints the claim its tab will redeem.
    pub async fn create_claimed_session(&self) -> Result<ClaimedSession, RelayError> {
        let claim = code::random_id();
        let hash = code::hash_token(&claim);
        let lifetime = self.inner.config.claim_ttl;
        let claim_expires_at = self.now().plus(lifetime);
        self.within_ceiling(super::Ceiling::Claims, &hash, claim_expires_at)
            .await?;
        let session = self.create_session_with(provider_token(&claim)).await?;
        let record = json!({"code": session.code.as_str(), "expiresAt": claim_expires_at.0});
        self.inner
            .store
            .put_ticket(
                &scope(&hash),
                &hash,
                Arc::new(record),
                claim_expires_at.plus(lifetime),
            )
            .await?;
        Ok(ClaimedSession {
            session,
            claim,
            claim_expires_at,
        })
    }

    /// The session a claim opened, with its provider token, once: a claim redeemed before,
    /// past its expiry, or never minted is refused.
    pub async fn redeem_claim(&self, claim: &str) -> Result<NewSession, RelayError> {
        let hash = code::hash_token(claim);
        let ticket = self.inner.store.ticket(&scope(&hash), &hash).await?;
        let Some((code, claim_expires_at)) = ticket.as_deref().and_then(read_ticket) else {
            return Err(RelayError::UnknownClaim);
        };
        let lifetime = self.inner.config.claim_ttl;
        let expired = RelayError::ClaimExpired {
            minutes: lifetime.as_secs().div_ceil(60),
        };
        if self.now() >= claim_expires_at {
            return Err(expired);
        }
        let redeemer = code::random_id();
        let until = claim_expires_at.plus(lifetime);
        if !self
            .inner
            .store
            .lock(&format!("claim:{hash}"), &redeemer, until)
            .await?
        {
            return Err(RelayError::ClaimUsed);
        }
        let Ok((code, session)) = self.live_session(code.as_str()).await else {
            return Err(expired);
        };
        tracing::info!(code = %code.redacted(), "claim redeemed");
        Ok(NewSession {
            code,
            provider_token: provider_token(claim),
            ttl: self.inner.config.session_ttl,
            expires_at: session.expires_at,
            max_expires_at: session.max_expires_at,
            mcp_handle: session.mcp_handle,
        })
    }
}

/// A claim's ticket: the session code and when the claim expires.
fn read_ticket(ticket: &Value) -> Option<(SessionCode, Timestamp)> {
    let code = SessionCode::parse(ticket.get("code")?.as_str()?).ok()?;
    let expires_at = Timestamp(ticket.get("expiresAt")?.as_i64()?);
    Some((code, expires_at))
}

/// Creates a session for a tab to come, with the claim that tab redeems; spends the caller's
/// session-creation budget like [`CreateSession`](super::sessions::CreateSession).
#[derive(Debug, Clone, Default)]
pub struct CreateClaimedSession;

impl Operation for CreateClaimedSession {
    const PATH: &'static str = "/toolrelay.v1.Relay/CreateClaimedSession";
    // Asking again at worst leaves a session and a claim nobody uses, which expire.
    const RETRY: Retry = Retry::Safe;
    type Message = pb::CreateSessionRequest;
    type Reply = pb::ClaimedSession;
    type Output = ClaimedSession;

    async fn run(self, relay: &Relay, caller: &Caller) -> Result<ClaimedSession, RelayError> {
        relay.limits().admit(caller)?;
        relay.limits().admit_session(caller).await?;
        let claimed = relay.create_claimed_session().await?;
        // The tab is opened for this caller: the person is not asked about it.
        let key = relay.limits().caller_key(caller);
        let applicant = super::approvals::Applicant::of(caller, &key);
        relay
            .allow_without_asking(&claimed.session.code, &applicant)
            .await?;
        Ok(claimed)
    }

    fn into_message(self) -> (Self::Message, Credential) {
        (pb::CreateSessionRequest {}, Credential::None)
    }

    fn from_message(_: Self::Message, _: Credentials) -> Result<Self, Status> {
        Ok(Self)
    }

    fn reply(output: ClaimedSession) -> Self::Reply {
        pb::ClaimedSession {
            session: Some(output.session.into()),
            claim: output.claim,
            claim_expires_at: Some(output.claim_expires_at.into()),
        }
    }

    fn output(reply: Self::Reply) -> Result<ClaimedSession, Malformed> {
        let session = reply
            .session
            .ok_or(Malformed("a claimed session without its session"))?;
        Ok(ClaimedSession {
            session: session.try_into()?,
            claim: reply.claim,
            claim_expires_at: reply.claim_expires_at.into(),
        })
    }

    async fn send(self, remote: &RemoteRelay, caller: &Caller) -> Outcome<ClaimedSession> {
        remote.accepting()?;
        remote.unary(caller, self).await
    }
}

/// Redeems a claim: the session it opened, with the provider token, once. An unknown claim
/// counts against the caller's brute-force guard, like an unknown code.
#[derive(Debug, Clone)]
pub struct RedeemClaim {
    /// The claim.
    pub claim: String,
}

impl Operation for RedeemClaim {
    const PATH: &'static str = "/toolrelay.v1.Relay/RedeemClaim";
    // Not asked again once sent: a second redemption would say the claim was used.
    const RETRY: Retry = Retry::IfNotSent;
    type Message = pb::RedeemClaimRequest;
    type Reply = pb::CreateSessionResponse;
    type Output = NewSession;

    async fn run(self, relay: &Relay, caller: &Caller) -> Result<NewSession, RelayError> {
        relay
            .guarded(caller, &self.claim, relay.redeem_claim(&self.claim))
            .await
    }

    fn into_message(self) -> (Self::Message, Credential) {
        (
            pb::RedeemClaimRequest { claim: self.claim },
            Credential::None,
        )
    }

    fn from_message(message: Self::Message, _: Credentials) -> Result<Self, Status> {
        Ok(Self {
            claim: message.claim,
        })
    }

    fn reply(output: NewSession) -> Self::Reply {
        output.into()
    }

    fn output(reply: Self::Reply) -> Result<NewSession, Malformed> {
        reply.try_into()
    }
}

/// This family's operations, for the gRPC server's routes ([`crate::operation::each`]).
pub(super) fn operations(visitor: &mut impl Visitor) {
    visitor.visit::<CreateClaimedSession>();
    visitor.visit::<RedeemClaim>();
}
