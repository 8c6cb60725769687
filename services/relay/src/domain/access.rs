//! Who may use the relay, and whose word it takes (SPEC §10):
//!
//! * [`ApiKeys`] (`API_KEYS`, `API_KEYS_FILE`): when an operator sets them, a consumer needs
//!   one. Over HTTP and MCP the gateway checks it; on the gRPC port the relay checks it for a
//!   peer that reached it directly.
//! * [`GatewaySecrets`] (`GATEWAY_SECRET`, `GATEWAY_SECRET_FILE`): what a gateway sends
//!   (metadata entry [`GATEWAY_PROOF_METADATA`]) to prove itself. Only then does the relay
//!   believe the client address it names ([`CLIENT_ADDRESS_METADATA`](crate::limits::CLIENT_ADDRESS_METADATA)) and leave alone what
//!   the gateway already did (the client's key, its budgets of sessions and tool calls). A
//!   relay with no secret believes no named address.
//!
//! [`Gateways::caller`] turns what a gRPC request carries into its [`Caller`]. Keys and
//! secrets are kept as SHA-256 digests (a gateway also keeps the secret it sends), compared in
//! constant time, and never logged.

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use crate::caller::{Caller, CallerId};
use crate::code::hash_token;
use crate::config::{ENV_API_KEYS, ENV_API_KEYS_FILE, ENV_GATEWAY_SECRET, ENV_GATEWAY_SECRET_FILE};
use crate::metrics::{Metrics, Refusal};

/// gRPC metadata entry in which a gateway proves itself: one of the relay's gateway secrets.
pub const GATEWAY_PROOF_METADATA: &str = "x-toolrelay-gateway";
/// Shortest key or secret accepted: a secret, not a password to remember.
const MIN_SECRET_CHARS: usize = 16;

/// The accepted API keys, as hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeys {
    hashes: HashSet<String>,
}

impl ApiKeys {
    /// Keys from a list (`API_KEYS`) and a file of one key per line (`API_KEYS_FILE`, `#`
    /// comments and blank lines skipped); `None` when neither names a key. Errors name the
    /// variable to fix.
    pub fn load(list: &[String], file: Option<&Path>) -> Result<Option<Arc<Self>>, String> {
        let mut keys = named(list, ENV_API_KEYS);
        if let Some(path) = file {
            let text = read(path, ENV_API_KEYS_FILE)?;
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|line| !line.is_empty() && !line.starts_with('#'))
                    .map(|key| (key.to_owned(), ENV_API_KEYS_FILE)),
            );
        }
        if keys.is_empty() {
            return Ok(None);
        }
        check_secrets(&keys, "key")?;
        Ok(Some(Arc::new(Self {
            hashes: keys.iter().map(|(key, _)| hash_token(key)).collect(),
        })))
    }

    /// Whether `key` is one of them.
    pub fn accepts(&self, key: &str) -> bool {
        self.hashes.contains(&hash_token(key))
    }
}

/// The secrets a gateway proves itself with: several, so that one can replace another without
/// downtime (relays accept every one; a gateway sends the first).
#[derive(Clone)]
pub struct GatewaySecrets {
    /// The secret a gateway sends: the first of the list.
    current: String,
    /// Every accepted secret's SHA-256 digest.
    digests: Vec<[u8; 32]>,
}

impl GatewaySecrets {
    /// Secrets from a comma-separated list (`GATEWAY_SECRET`) and a file holding such a list
    /// (`GATEWAY_SECRET_FILE`, commas or new lines between secrets); `None` when neither names
    /// one. Errors name the variable to fix.
    pub fn load(list: &[String], file: Option<&Path>) -> Result<Option<Arc<Self>>, String> {
        let mut secrets = named(list, ENV_GATEWAY_SECRET);
        if let Some(path) = file {
            let text = read(path, ENV_GATEWAY_SECRET_FILE)?;
            secrets.extend(
                text.split([',', '\n'])
                    .map(str::trim)
                    .filter(|secret| !secret.is_empty())
                    .map(|secret| (secret.to_owned(), ENV_GATEWAY_SECRET_FILE)),
            );
        }
        let Some((current, _)) = secrets.first() else {
            return Ok(None);
        };
        check_secrets(&secrets, "secret")?;
        Ok(Some(Arc::new(Self {
            current: current.clone(),
            digests: secrets.iter().map(|(secret, _)| digest(secret)).collect(),
        })))
    }

    /// The secret a gateway sends.
    pub fn current(&self) -> &str {
        &self.current
    }

    /// Whether `proof` is one of the secrets, compared in constant time (the time taken does
    /// not depend on where `proof` differs from any secret).
    pub fn accepts(&self, proof: &str) -> bool {
        let presented = digest(proof);
        let found = self.digests.iter().fold(Choice::from(0), |found, secret| {
            found | secret.ct_eq(&presented)
        });
        found.into()
    }
}

impl std::fmt::Debug for GatewaySecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GatewaySecrets({} secrets)", self.digests.len())
    }
}

/// Whose word the relay takes on its gRPC port: a peer proving itself a gateway is believed
/// about its client; any other peer is the client itself.
#[derive(Debug)]
pub struct Gateways {
    secrets: Option<Arc<GatewaySecrets>>,
    /// Where refused claims are counted.
    metrics: Metrics,
    /// Whether a refused claim was logged at warning level yet (once is enough to tell the
    /// operator; the counter counts them all).
    warned: AtomicBool,
}

impl Gateways {
    /// Believing gateways that send one of `secrets` (none without secrets); refusals are
    /// counted in `metrics`.
    pub fn new(secrets: Option<Arc<GatewaySecrets>>, metrics: Metrics) -> Self {
        Self {
            secrets,
            metrics,
            warned: AtomicBool::new(false),
        }
    }

    /// Whether `proof` is one of the secrets (never without secrets).
    pub fn proven(&self, proof: Option<&str>) -> bool {
        match (&self.secrets, proof) {
            (Some(secrets), Some(proof)) => secrets.accepts(proof),
            _ => false,
        }
    }

    /// The caller of a request from `peer` that may name a client (`claimed`), prove itself a
    /// gateway (`proof`) and present a credential (`bearer`, an API key on consumer RPCs).
    /// With valid proof, the named client, admitted by the gateway; otherwise the peer itself,
    /// whose key and budgets the relay checks (a claim or proof that did not count is counted
    /// as a `gateway_proof` refusal).
    pub fn caller(
        &self,
        peer: IpAddr,
        claimed: Option<&str>,
        proof: Option<&str>,
        bearer: Option<String>,
    ) -> Caller {
        self.caller_named(peer, claimed, None, proof, bearer)
    }

    /// [`Gateways::caller`], where a gateway may also name the client's identity among the
    /// clients at its address (`identity`, believed with the address). A direct client is
    /// known by its address ([`crate::grpc`] names it by its API key once the key is checked).
    pub fn caller_named(
        &self,
        peer: IpAddr,
        claimed: Option<&str>,
        identity: Option<&str>,
        proof: Option<&str>,
        bearer: Option<String>,
    ) -> Caller {
        if self.proven(proof) {
            let client = claimed.and_then(|value| value.trim().parse::<IpAddr>().ok());
            return Caller::new(client.unwrap_or(peer))
                .with_identity(identity.and_then(CallerId::parse));
        }
        if claimed.is_some() || proof.is_some() {
            self.metrics.refused(Refusal::GatewayProof);
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(%peer, "a gRPC peer named a client address without valid gateway proof (GATEWAY_SECRET): its requests count against its own address (logged once; counted in toolrelay_refused_total{{reason=\"gateway_proof\"}})");
            }
        }
        Caller::direct(peer, bearer)
    }
}

/// The non-empty entries of a list, each with the variable it came from.
fn named(list: &[String], variable: &'static str) -> Vec<(String, &'static str)> {
    list.iter()
        .map(|entry| (entry.trim().to_owned(), variable))
        .filter(|(entry, _)| !entry.is_empty())
        .collect()
}

fn read(path: &Path, variable: &str) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map_err(|error| format!("{variable}: cannot read {}: {error}", path.display()))
}

/// Every secret long and printable; the error names the variable of the first that is not.
fn check_secrets(secrets: &[(String, &str)], what: &str) -> Result<(), String> {
    for (secret, variable) in secrets {
        let printable = secret.bytes().all(|b| b.is_ascii_graphic());
        if secret.chars().count() < MIN_SECRET_CHARS || !printable {
            return Err(format!(
                "{variable}: every {what} must be at least {MIN_SECRET_CHARS} printable characters without spaces (for example from `openssl rand -hex 24`)"
            ));
        }
    }
    Ok(())
}

fn digest(secret: &str) -> [u8; 32] {
    let mut out = [0; 32];
    out.copy_from_slice(&Sha256::digest(secret.as_bytes()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caller::IdentityKind;

    const SECRET: &str = "0123456789abcdef0123";
    const NEXT: &str = "fedcba9876543210fedc";

    #[test]
    fn keys_come_from_the_list_and_the_file_and_must_be_long() {
        assert_eq!(ApiKeys::load(&[], None).unwrap(), None);
        let file = std::env::temp_dir().join(format!("toolrelay-keys-{}", std::process::id()));
        std::fs::write(&file, "# staff\n0123456789abcdef0123\n\n").unwrap();
        let keys = ApiKeys::load(&["fedcba9876543210fedc".into()], Some(&file))
            .unwrap()
            .unwrap();
        std::fs::remove_file(&file).unwrap();
        assert!(keys.accepts("0123456789abcdef0123"));
        assert!(keys.accepts("fedcba9876543210fedc"));
        assert!(!keys.accepts("0123456789abcdef012"));
        let short = ApiKeys::load(&["short".into()], None).unwrap_err();
        assert!(
            short.contains("API_KEYS") && short.contains("16"),
            "{short}"
        );
    }

    #[test]
    fn every_secret_of_the_list_is_accepted_and_the_first_is_sent() {
        let secrets = GatewaySecrets::load(&[NEXT.into(), SECRET.into()], None)
            .unwrap()
            .unwrap();
        assert_eq!(secrets.current(), NEXT);
        assert!(secrets.accepts(SECRET) && secrets.accepts(NEXT));
        assert!(!secrets.accepts("0123456789abcdef012") && !secrets.accepts(""));
        assert!(!format!("{secrets:?}").contains(SECRET));
        let file = std::env::temp_dir().join(format!("toolrelay-secret-{}", std::process::id()));
        std::fs::write(&file, format!("{SECRET},{NEXT}\n")).unwrap();
        let from_file = GatewaySecrets::load(&[], Some(&file)).unwrap().unwrap();
        std::fs::remove_file(&file).unwrap();
        assert_eq!(from_file.current(), SECRET);
        assert!(from_file.accepts(NEXT));
        assert!(GatewaySecrets::load(&[], None).unwrap().is_none());
        let short = GatewaySecrets::load(&["short".into()], None).unwrap_err();
        assert!(short.contains("GATEWAY_SECRET"), "{short}");
    }

    #[test]
    fn a_named_client_is_believed_only_with_proof() {
        let secrets = GatewaySecrets::load(&[SECRET.into()], None).unwrap();
        let metrics = Metrics::default();
        let gateways = Gateways::new(secrets, metrics.clone());
        let gateway: IpAddr = "10.1.2.3".parse().unwrap();
        let client: IpAddr = "198.51.100.7".parse().unwrap();
        let proven = gateways.caller(gateway, Some("198.51.100.7"), Some(SECRET), None);
        assert_eq!(proven, Caller::new(client));
        let wrong = gateways.caller(gateway, Some("198.51.100.7"), Some(NEXT), None);
        assert_eq!(wrong, Caller::direct(gateway, None));
        let none = gateways.caller(gateway, Some("198.51.100.7"), None, Some("k".into()));
        assert_eq!(none, Caller::direct(gateway, Some("k".into())));
        // The identity a gateway names is believed with the address, and only when well formed.
        let person = CallerId::of(IdentityKind::McpSession, "session");
        let named = gateways.caller_named(
            gateway,
            Some("198.51.100.7"),
            Some(person.as_str()),
            Some(SECRET),
            None,
        );
        assert_eq!(
            named,
            Caller::new(client).with_identity(Some(person.clone()))
        );
        let unproven =
            gateways.caller_named(gateway, None, Some(person.as_str()), Some(NEXT), None);
        assert_eq!(unproven.identity, None);
        let garbled = gateways.caller_named(gateway, None, Some("mcp:x"), Some(SECRET), None);
        assert_eq!(garbled.identity, None);
        let unsure = Gateways::new(None, metrics);
        let trusting_nobody = unsure.caller(gateway, Some("198.51.100.7"), Some(SECRET), None);
        assert_eq!(trusting_nobody, Caller::direct(gateway, None));
    }
}
