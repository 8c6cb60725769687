//! Session codes, provider tokens and random ids, all from the operating system's CSPRNG;
//! and ids that need only be unique (a call's, a request's correlation id), made without a
//! system call.

use std::fmt;

use data_encoding::{BASE32_NOPAD, BASE64URL_NOPAD, HEXLOWER};
use sha2::{Digest, Sha256};

use crate::error::RelayError;

/// A pairing code: 8 characters of RFC 4648 Base32 (`A–Z`, `2–7`), 40 random bits.
///
/// People see it as `ABCD-EFGH`; [`SessionCode::parse`] accepts what a person types — any
/// case, hyphens and spaces anywhere, and the digits Base32 leaves out read as the letters they
/// look like (`0`→`O`, `1`→`I`, `8`→`B`) — and normalises to the 8 characters.
///
/// Its characters are kept in place, not in a `String` of their own: a code is copied into
/// several of the store's indexes on every call, and a copy allocates nothing.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionCode([u8; CODE_LEN]);

/// The characters of a code.
const CODE_LEN: usize = 8;

impl SessionCode {
    /// A fresh random code.
    pub fn generate() -> Self {
        let mut code = [0; CODE_LEN];
        BASE32_NOPAD.encode_mut(&random_bytes::<5>(), &mut code);
        Self(code)
    }

    /// Normalises what a person or an LLM typed: drops hyphens and white space, upper-cases,
    /// and reads `0`, `1` and `8` (never in a code) as `O`, `I` and `B`.
    pub fn parse(input: &str) -> Result<Self, RelayError> {
        if input.len() > 64 {
            return Err(RelayError::InvalidCode);
        }
        let mut code = [0; CODE_LEN];
        let mut len = 0;
        for c in input.chars().filter(|c| *c != '-' && !c.is_whitespace()) {
            let c = match c.to_ascii_uppercase() {
                '0' => 'O',
                '1' => 'I',
                '8' => 'B',
                other => other,
            };
            let valid = c.is_ascii_uppercase() || ('2'..='7').contains(&c);
            if !valid || len == CODE_LEN {
                return Err(RelayError::InvalidCode);
            }
            // An ASCII letter or digit: one byte.
            code[len] = c as u8;
            len += 1;
        }
        if len == CODE_LEN {
            Ok(Self(code))
        } else {
            Err(RelayError::InvalidCode)
        }
    }

    /// The 8 normalised characters.
    pub fn as_str(&self) -> &str {
        // Made only of ASCII letters and digits ([`Self::parse`], [`Self::generate`]).
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// The form written in logs: the first four characters, `ABCD…`. A code is a live secret
    /// for its session's life; its prefix tells log lines apart without giving it away.
    pub fn redacted(&self) -> impl fmt::Display + '_ {
        // Four ASCII characters, written as they are: nothing is made for a line not written.
        Redacted(&self.as_str()[..4])
    }

    /// The form shown to people: `ABCD-EFGH`.
    pub fn display(&self) -> String {
        let code = self.as_str();
        format!("{}-{}", &code[..4], &code[4..])
    }
}

/// What a log line may say of a code as someone sent it (`ABCD…`): its first four
/// characters, whatever it is.
pub fn redacted(code: &str) -> String {
    let prefix: String = code
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(4)
        .collect();
    format!("{prefix}…")
}

/// A code's first four characters and an ellipsis, as a log line shows them.
struct Redacted<'a>(&'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}…", self.0)
    }
}

impl fmt::Display for SessionCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for SessionCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SessionCode").field(&self.as_str()).finish()
    }
}

/// A new provider token: 256 random bits, URL-safe (it travels in `?token=`).
pub fn generate_token() -> String {
    BASE64URL_NOPAD.encode(&random_bytes::<32>())
}

/// What the store keeps of a token: its SHA-256, so a store dump reveals no usable token.
pub fn hash_token(token: &str) -> String {
    HEXLOWER.encode(&Sha256::digest(token.as_bytes()))
}

/// Whether `text` could be a connector handle ([`random_id`]'s form: 32 hex characters).
pub fn is_handle(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A random id of 128 bits, as 32 hex characters.
pub fn random_id() -> String {
    HEXLOWER.encode(&random_bytes::<16>())
}

/// A call's id (or a correlation id), 32 hex characters: 128 bits from a CSPRNG (ChaCha12)
/// seeded once per thread from the operating system, so an id can be neither guessed nor
/// predicted from others (a caller cannot name another caller's call), yet drawing one makes
/// no system call: two per call on the hot path, unlike [`random_id`].
pub fn unique_id() -> String {
    use rand::{Rng, SeedableRng};
    thread_local! {
        static IDS: std::cell::RefCell<rand::rngs::StdRng> =
            std::cell::RefCell::new(rand::rngs::StdRng::from_seed(random_bytes::<32>()));
    }
    let mut bytes = [0u8; 16];
    IDS.with(|ids| ids.borrow_mut().fill_bytes(&mut bytes));
    HEXLOWER.encode(&bytes)
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_ids_are_distinct_128_bit_hex_with_nothing_shared() {
        let ids: Vec<String> = (0..10_000).map(|_| unique_id()).collect();
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        assert!(
            ids.iter()
                .all(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        );
        // No part is fixed per process (as a prefix would be) and none counts up: 10,000 ids
        // share no 16-digit half.
        let halves: std::collections::HashSet<&str> =
            ids.iter().flat_map(|id| [&id[..16], &id[16..]]).collect();
        assert_eq!(halves.len(), 2 * ids.len());
        // Another thread draws from a generator of its own.
        let other = std::thread::spawn(unique_id).join().unwrap();
        assert!(!ids.contains(&other));
    }

    #[test]
    fn generated_codes_are_eight_base32_characters() {
        for _ in 0..100 {
            let code = SessionCode::generate();
            assert_eq!(SessionCode::parse(code.as_str()).unwrap(), code);
        }
    }

    #[test]
    fn parsing_accepts_what_people_type() {
        let expected = SessionCode(*b"ABCD2345");
        for input in [
            "ABCD2345",
            "abcd2345",
            "ABCD-2345",
            " abcd-2345 ",
            "AbCd-2345",
            "ABCD 2345",
            "AB-CD-23-45",
            "ab cd\t23 45",
        ] {
            assert_eq!(SessionCode::parse(input).unwrap(), expected, "{input:?}");
        }
        assert_eq!(expected.display(), "ABCD-2345");
        // Digits a person types for the letters they look like.
        assert_eq!(SessionCode::parse("0715XB3V").unwrap().as_str(), "O7I5XB3V");
        assert_eq!(
            SessionCode::parse("o7i5-x83v").unwrap().as_str(),
            "O7I5XB3V"
        );
    }

    #[test]
    fn a_code_in_a_log_line_is_its_prefix_as_for_a_code_as_sent() {
        let code = SessionCode::parse("abcd-2345").unwrap();
        assert_eq!(code.redacted().to_string(), "ABCD…");
        assert_eq!(code.redacted().to_string(), redacted(code.as_str()));
        assert_eq!(format!("{code:?}"), r#"SessionCode("ABCD2345")"#);
    }

    #[test]
    fn parsing_refuses_what_is_not_a_code() {
        for input in [
            "",
            "ABCD234",
            "ABCD23456",
            "ABCD2349",
            "ABCD.2345",
            "ÄBCD2345",
            "ABCD_2345",
        ] {
            assert!(SessionCode::parse(input).is_err(), "{input:?}");
        }
    }

    #[test]
    fn tokens_are_long_and_hashed() {
        let token = generate_token();
        assert_eq!(token.len(), 43);
        assert_ne!(generate_token(), token);
        assert_eq!(hash_token(&token), hash_token(&token));
        assert_ne!(hash_token(&token), token);
    }
}
