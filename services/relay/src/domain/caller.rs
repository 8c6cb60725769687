//! Who makes a request ([`Caller`]): the address it came from, and — since many people share
//! an address (every user of a hosted assistant comes from its vendor's few egress addresses;
//! a school from one NAT) — who it is among the clients at that address ([`CallerId`]).
//!
//! What identifies a caller, per path (SPEC §10; the README's "Who a caller is"):
//! * MCP: its client session (`Mcp-Session-Id`); a sessionless client of `/mcp/s/{handle}`,
//!   the handle;
//! * a gRPC client that reached the relay itself, or any LLM-facing route where `API_KEYS` is
//!   set: its API key;
//! * a tab's routes: its provider token;
//! * plain REST from an address in `SHARED_EGRESS_RANGES`: the assistant's per-user header
//!   ([`ASSISTANT_USER_HEADERS`]);
//! * anything else: the address alone (its identity is `None`).
//!
//! Budgets count against the identity first, and against the address as a flood ceiling
//! ([`crate::limits`]). An identity is a digest, never the secret it was made from, so it can
//! sit in store keys, gRPC metadata and logs.

use std::net::IpAddr;

use data_encoding::HEXLOWER;
use sha2::{Digest, Sha256};

/// gRPC metadata entry in which a gateway names the client's identity ([`CallerId`]).
pub const CLIENT_IDENTITY_METADATA: &str = "x-toolrelay-caller";

/// gRPC metadata entry in which a gateway passes what the client says it is
/// ([`Caller::label`], in ASCII): shown to the person asked to allow it, never trusted.
pub const CLIENT_LABEL_METADATA: &str = "x-toolrelay-caller-label";

/// Headers that name one user of a hosted assistant calling from its vendor's addresses,
/// believed only from an address in `SHARED_EGRESS_RANGES`: ChatGPT's GPT Actions send
/// `openai-ephemeral-user-id` (not in OpenAI's documents; seen on GPT Action requests, and
/// reset by OpenAI from time to time) and `openai-conversation-id`. The first found wins.
pub const ASSISTANT_USER_HEADERS: [&str; 2] =
    ["openai-ephemeral-user-id", "openai-conversation-id"];

/// Hex digits of a [`CallerId`]'s digest: 96 bits, so two callers never share one by chance.
const DIGEST_HEX: usize = 24;

/// What a [`CallerId`] was made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityKind {
    /// An MCP client session (`Mcp-Session-Id`).
    McpSession,
    /// A connector handle (`/mcp/s/{handle}` without a client session).
    Handle,
    /// An API key (`API_KEYS`).
    ApiKey,
    /// A session's provider token (a tab).
    ProviderToken,
    /// An assistant's per-user header, from a shared egress range.
    AssistantUser,
}

impl IdentityKind {
    fn prefix(self) -> &'static str {
        match self {
            Self::McpSession => "mcp",
            Self::Handle => "handle",
            Self::ApiKey => "key",
            Self::ProviderToken => "tab",
            Self::AssistantUser => "user",
        }
    }

    const ALL: [Self; 5] = [
        Self::McpSession,
        Self::Handle,
        Self::ApiKey,
        Self::ProviderToken,
        Self::AssistantUser,
    ];
}

/// Who a caller is among the clients at its address: `kind:digest`, 96 bits of SHA-256 of
/// what identified it. Not a secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallerId(String);

impl CallerId {
    /// The identity `secret` (a session id, handle, key, token or header) gives a caller.
    pub fn of(kind: IdentityKind, secret: &str) -> Self {
        let digest = Sha256::new()
            .chain_update(kind.prefix().as_bytes())
            .chain_update([0])
            .chain_update(secret.as_bytes())
            .finalize();
        let mut hex = HEXLOWER.encode(&digest);
        hex.truncate(DIGEST_HEX);
        Self(format!("{}:{hex}", kind.prefix()))
    }

    /// An identity as written by [`CallerId::as_str`] (a gateway's gRPC metadata), if it is one.
    pub fn parse(text: &str) -> Option<Self> {
        let (prefix, hex) = text.split_once(':')?;
        let known = IdentityKind::ALL.iter().any(|kind| kind.prefix() == prefix);
        let digest = hex.len() == DIGEST_HEX
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (known && digest).then(|| Self(text.to_owned()))
    }

    /// As written in store keys, metadata and logs.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for CallerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who makes a request: the address and identity limits are keyed on, what the relay still has
/// to check before letting it in, and the correlation id its log lines carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The client's address.
    pub address: IpAddr,
    /// Who the client is among those at its address, when the request says; `None`: the
    /// address alone.
    pub identity: Option<CallerId>,
    /// Whether a front end let the client in, or the relay has to.
    pub admission: Admission,
    /// The request's correlation id (`x-request-id`), passed on to a relay in another process.
    pub correlation_id: Option<String>,
    /// What the client says it is (an MCP client's name, a `User-Agent`), for the person who
    /// is asked to allow it: not proof of anything.
    pub label: Option<String>,
}

/// Who let a caller in.
#[derive(Clone, PartialEq, Eq)]
pub enum Admission {
    /// A front end did — the gateway, in this process or proven over gRPC: it checked the
    /// client's API key and spent its budgets of sessions and tool calls.
    Gateway,
    /// Nobody yet: the client reached the relay's gRPC port itself. The relay checks the
    /// credential it presented (`authorization: Bearer`, an API key on consumer RPCs) and
    /// spends its budgets.
    Direct {
        /// The bearer credential the request carried.
        bearer: Option<String>,
    },
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The credential is a secret: never in a log line.
        match self {
            Self::Gateway => f.write_str("Gateway"),
            Self::Direct { bearer } => f
                .debug_struct("Direct")
                .field("bearer", &bearer.as_ref().map(|_| "…"))
                .finish(),
        }
    }
}

impl Caller {
    /// A client at `address` that a front end let in (see [`Admission::Gateway`]).
    pub fn new(address: IpAddr) -> Self {
        Self {
            address,
            identity: None,
            admission: Admission::Gateway,
            correlation_id: None,
            label: None,
        }
    }

    /// A client at `address` that reached the relay itself, presenting `bearer`.
    pub fn direct(address: IpAddr, bearer: Option<String>) -> Self {
        Self {
            admission: Admission::Direct { bearer },
            ..Self::new(address)
        }
    }

    /// The same client, for the request with this correlation id.
    #[must_use]
    pub fn with_correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }

    /// The same client, saying it is `label` (cut to 80 characters).
    #[must_use]
    pub fn with_label(mut self, label: Option<&str>) -> Self {
        self.label = label
            .map(|label| {
                label
                    .chars()
                    .filter(|c| !c.is_control())
                    .take(80)
                    .collect::<String>()
            })
            .filter(|label| !label.trim().is_empty());
        self
    }

    /// The same client, known as `identity` among those at its address.
    #[must_use]
    pub fn with_identity(mut self, identity: Option<CallerId>) -> Self {
        self.identity = identity;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_is_a_digest_of_its_kind_and_secret_never_the_secret() {
        let secret = "4f1c0b5e9d7a4c6b8e2f1a3d5c7b9e0f";
        let id = CallerId::of(IdentityKind::McpSession, secret);
        assert!(id.as_str().starts_with("mcp:"), "{id}");
        assert_eq!(id.as_str().len(), 4 + DIGEST_HEX);
        assert!(!id.as_str().contains(&secret[..8]));
        assert_eq!(id, CallerId::of(IdentityKind::McpSession, secret));
        // The same secret as another kind is another caller.
        assert_ne!(id, CallerId::of(IdentityKind::Handle, secret));
        assert_eq!(CallerId::parse(id.as_str()), Some(id));
    }

    #[test]
    fn only_well_formed_identities_are_read_back() {
        for bad in [
            "",
            "mcp",
            "mcp:",
            "mcp:abc",
            "root:0123456789abcdef01234567",
            "mcp:0123456789ABCDEF01234567",
            "mcp:0123456789abcdef012345678",
        ] {
            assert_eq!(CallerId::parse(bad), None, "{bad:?}");
        }
        assert!(CallerId::parse("user:0123456789abcdef01234567").is_some());
    }
}
