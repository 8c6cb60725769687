//! Claims' operations: a session opened for a tab that is not there yet, with its claim; the
//! claim redeemed by that tab, or described to it before.

use tonic::Status;
use toolrelay::convert::Malformed;
use toolrelay::proto::v1 as pb;

use crate::api::Outcome;
use crate::error::RelayError;
use crate::limits::Caller;
use crate::operation::{
    Admit, Checks, Credential, Credentials, Guard, Guarded, Operation, Visitor,
};
use crate::pool::Retry;
use crate::relay::approvals::Applicant;
use crate::relay::{ClaimDescription, ClaimedSession, NewSession, Relay};
use crate::remote::RemoteRelay;

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

    const CHECKS: Checks = Checks {
        admit: Admit::RequestAndSession,
        guard: Guard::Nothing,
    };

    async fn step(self, relay: &Relay, caller: &Caller) -> Result<ClaimedSession, RelayError> {
        let claimed = relay
            .create_claimed_session(caller.label.as_deref())
            .await?;
        // The tab is opened for this caller: the person is not asked about it, and sees it
        // among the callers it allowed, with Disconnect.
        let key = relay.limits().caller_key(caller);
        let mut applicant = Applicant::of(caller, &key);
        applicant.label = format!("Opened from your conversation in {}", applicant.label);
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

    const CHECKS: Checks = Checks {
        admit: Admit::Nothing,
        guard: Guard::Named,
    };

    fn guarded(&self) -> Guarded {
        Guarded {
            session: self.claim.clone(),
            ..Guarded::default()
        }
    }

    async fn step(self, relay: &Relay, _: &Caller) -> Result<NewSession, RelayError> {
        relay.redeem_claim(&self.claim).await
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

/// What a claim is, without spending it (the page asks the person before redeeming a claim
/// it was not framed for). An unknown claim counts against the brute-force guard.
#[derive(Debug, Clone)]
pub struct DescribeClaim {
    /// The claim.
    pub claim: String,
}

impl Operation for DescribeClaim {
    const PATH: &'static str = "/toolrelay.v1.Relay/DescribeClaim";
    const RETRY: Retry = Retry::Safe;
    type Message = pb::RedeemClaimRequest;
    type Reply = pb::ClaimDescription;
    type Output = ClaimDescription;

    const CHECKS: Checks = Checks {
        admit: Admit::Nothing,
        guard: Guard::Named,
    };

    fn guarded(&self) -> Guarded {
        Guarded {
            session: self.claim.clone(),
            ..Guarded::default()
        }
    }

    async fn step(self, relay: &Relay, _: &Caller) -> Result<ClaimDescription, RelayError> {
        relay.describe_claim(&self.claim).await
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

    fn reply(output: ClaimDescription) -> Self::Reply {
        pb::ClaimDescription {
            label: output.label.unwrap_or_default(),
            claim_expires_at: Some(output.claim_expires_at.into()),
        }
    }

    fn output(reply: Self::Reply) -> Result<ClaimDescription, Malformed> {
        Ok(ClaimDescription {
            label: Some(reply.label).filter(|label| !label.is_empty()),
            claim_expires_at: reply.claim_expires_at.into(),
        })
    }
}

/// This family's operations, for the gRPC server's routes ([`crate::operation::each`]).
pub(super) fn operations(visitor: &mut impl Visitor) {
    visitor.visit::<CreateClaimedSession>();
    visitor.visit::<RedeemClaim>();
    visitor.visit::<DescribeClaim>();
}
