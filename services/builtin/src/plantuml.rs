//! `encodePlantUML` and `decodePlantUML`: PlantUML's text encoding, both ways.
//!
//! Encoding: the text as UTF-8 → raw DEFLATE at level 9 → PlantUML's 64-character alphabet
//! (`0-9A-Za-z-_`), every 3 bytes becoming 4 characters and the last group zero-filled, as
//! PlantUML's own encoder does → `{server}/plantuml/{format}/{encoded}`. Decoding accepts that
//! and what other encoders produce: `=` padding, a short last group, and the `~h` hex form.

use std::io::{Read, Write};

use async_trait::async_trait;
use data_encoding::{Encoding, HEXLOWER_PERMISSIVE, Specification};
use flate2::Compression;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use serde_json::{Value, json};

use toolrelay_relay::builtin::{Context, FailureKind, Tool, ToolCode, ToolFailure, ToolHints};

/// The public PlantUML server.
pub const DEFAULT_SERVER: &str = "https://www.plantuml.com";
/// Largest diagram text, in bytes of UTF-8.
pub const MAX_CODE_BYTES: usize = 50 * 1024;
/// Largest text a decoded diagram may inflate to (guards against decompression bombs).
const MAX_DECODED_BYTES: usize = 1024 * 1024;
/// PlantUML's alphabet for values 0 to 63.
const ALPHABET: &str = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_";
/// The output formats a PlantUML server renders.
const FORMATS: [&str; 3] = ["svg", "png", "txt"];

/// PlantUML's base64 variant, without padding; decoding ignores stray trailing bits.
fn alphabet() -> Encoding {
    let mut spec = Specification::new();
    spec.symbols.push_str(ALPHABET);
    spec.check_trailing_bits = false;
    // The specification is fixed and valid; building it cannot fail.
    spec.encoding()
        .unwrap_or_else(|_| data_encoding::BASE64URL_NOPAD.clone())
}

/// Encodes diagram text as PlantUML does.
pub fn encode(text: &str) -> Result<String, ToolFailure> {
    let mut deflater = DeflateEncoder::new(Vec::new(), Compression::best());
    let compressed = deflater
        .write_all(text.as_bytes())
        .and_then(|()| deflater.finish())
        .map_err(|error| {
            ToolFailure::new(
                FailureKind::Internal,
                ToolCode::EncodingFailed,
                format!("Compression failed: {error}."),
            )
        })?;
    let mut encoded = alphabet().encode(&compressed);
    // PlantUML emits whole 4-character groups, zero-filling the last one.
    while !encoded.len().is_multiple_of(4) {
        encoded.push('0');
    }
    Ok(encoded)
}

/// Decodes an encoded diagram (PlantUML's deflate form or `~h` hex) back to its text.
pub fn decode(encoded: &str) -> Result<String, ToolFailure> {
    let encoded = encoded.trim();
    if encoded.is_empty() {
        return Err(bad_encoding("it is empty"));
    }
    if let Some(hex) = encoded.strip_prefix("~h") {
        let bytes = HEXLOWER_PERMISSIVE
            .decode(hex.as_bytes())
            .map_err(|error| bad_encoding(&format!("the ~h hex form is malformed ({error})")))?;
        return text_of(bytes);
    }
    if encoded.starts_with('~') {
        return Err(bad_encoding(
            "only the plain deflate form and the ~h hex form are understood",
        ));
    }
    let data = encoded.trim_end_matches('=');
    let compressed = alphabet().decode(data.as_bytes()).map_err(|error| {
        bad_encoding(&format!(
            "it is not PlantUML's encoding ({error}); it uses only 0-9, A-Z, a-z, - and _"
        ))
    })?;
    let mut text = Vec::new();
    DeflateDecoder::new(compressed.as_slice())
        .take(MAX_DECODED_BYTES as u64 + 1)
        .read_to_end(&mut text)
        .map_err(|error| bad_encoding(&format!("the compressed data is damaged ({error})")))?;
    if text.len() > MAX_DECODED_BYTES {
        return Err(ToolFailure::new(
            FailureKind::TooLarge,
            ToolCode::CodeTooLarge,
            format!("The decoded diagram is over {MAX_DECODED_BYTES} bytes."),
        ));
    }
    text_of(text)
}

fn text_of(bytes: Vec<u8>) -> Result<String, ToolFailure> {
    String::from_utf8(bytes).map_err(|_| bad_encoding("the decoded bytes are not UTF-8 text"))
}

fn bad_encoding(why: &str) -> ToolFailure {
    ToolFailure::new(
        FailureKind::BadInput,
        ToolCode::InvalidEncoding,
        format!(
            "The encoded diagram cannot be decoded: {why}. Pass the part of a PlantUML URL after /svg/, /png/ or /txt/, or the whole URL as url."
        ),
    )
}

/// `encodePlantUML`.
pub struct EncodePlantUml {
    server: String,
}

impl EncodePlantUml {
    /// The encoder, with URLs on `server`.
    pub fn new(server: &str) -> Self {
        Self {
            server: server_base(server),
        }
    }
}

/// A server URL without a trailing slash or `/plantuml` (which the URL adds).
fn server_base(server: &str) -> String {
    let trimmed = server.trim().trim_end_matches('/');
    trimmed
        .strip_suffix("/plantuml")
        .unwrap_or(trimmed)
        .to_owned()
}

#[async_trait]
impl Tool for EncodePlantUml {
    fn name(&self) -> &'static str {
        "encodePlantUML"
    }

    fn description(&self) -> &'static str {
        "Turns PlantUML diagram code into a URL that renders the diagram (svg by default, png or txt). \
         Give the user the url; to change the diagram, edit the code and encode it again."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "plantumlCode": {
                    "type": "string",
                    "description": "The diagram, usually from @startuml to @enduml (at most 50 KB)."
                },
                "format": {
                    "type": "string",
                    "enum": FORMATS,
                    "default": "svg",
                    "description": "What the URL renders: svg (default), png or txt (ASCII art)."
                },
                "serverUrl": {
                    "type": "string",
                    "description": "A PlantUML server other than the default, e.g. https://plantuml.example.org."
                }
            },
            "required": ["plantumlCode"],
            "additionalProperties": false
        })
    }

    fn output_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "The URL that renders the diagram."},
                "encoded": {"type": "string", "description": "The encoded diagram (PlantUML's alphabet)."},
                "format": {"type": "string", "enum": FORMATS}
            },
            "required": ["url", "encoded", "format"]
        })
    }

    fn hints(&self) -> ToolHints {
        read_only("Encode PlantUML diagram")
    }

    async fn call(&self, args: Value, _context: &Context) -> Result<Value, ToolFailure> {
        let code = args["plantumlCode"].as_str().unwrap_or_default();
        if code.trim().is_empty() {
            return Err(ToolFailure::new(
                FailureKind::BadInput,
                ToolCode::EmptyCode,
                "plantumlCode is required and cannot be empty.",
            ));
        }
        if code.len() > MAX_CODE_BYTES {
            return Err(ToolFailure::new(
                FailureKind::TooLarge,
                ToolCode::CodeTooLarge,
                format!(
                    "plantumlCode is {} bytes; the limit is {MAX_CODE_BYTES} (50 KB). Split the diagram or simplify it.",
                    code.len()
                ),
            ));
        }
        let format = args["format"].as_str().unwrap_or("svg");
        let server = match args["serverUrl"].as_str() {
            Some(url) => {
                let base = server_base(url);
                if !(base.starts_with("https://") || base.starts_with("http://"))
                    || base.contains(char::is_whitespace)
                {
                    return Err(ToolFailure::new(
                        FailureKind::BadInput,
                        ToolCode::InvalidServerUrl,
                        "serverUrl must be an http:// or https:// URL, e.g. https://www.plantuml.com.",
                    ));
                }
                base
            }
            None => self.server.clone(),
        };
        let encoded = encode(code)?;
        // The promise is a lossless URL: check it before handing it out.
        if decode(&encoded).ok().as_deref() != Some(code) {
            return Err(ToolFailure::new(
                FailureKind::Internal,
                ToolCode::EncodingFailed,
                "The diagram could not be encoded without loss. Please report this diagram.",
            ));
        }
        Ok(json!({
            "url": format!("{server}/plantuml/{format}/{encoded}"),
            "encoded": encoded,
            "format": format,
        }))
    }
}

/// `decodePlantUML`.
pub struct DecodePlantUml;

#[async_trait]
impl Tool for DecodePlantUml {
    fn name(&self) -> &'static str {
        "decodePlantUML"
    }

    fn description(&self) -> &'static str {
        "Turns an encoded PlantUML diagram, or a PlantUML URL, back into its diagram code."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "encoded": {"type": "string", "description": "The encoded diagram (the part of the URL after /svg/ or /png/)."},
                "url": {"type": "string", "description": "A whole PlantUML URL, e.g. https://www.plantuml.com/plantuml/svg/SoWk..."}
            },
            "additionalProperties": false
        })
    }

    fn output_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"plantumlCode": {"type": "string", "description": "The diagram code."}},
            "required": ["plantumlCode"]
        })
    }

    fn hints(&self) -> ToolHints {
        read_only("Decode PlantUML diagram")
    }

    async fn call(&self, args: Value, _context: &Context) -> Result<Value, ToolFailure> {
        let encoded = match (args["encoded"].as_str(), args["url"].as_str()) {
            (Some(encoded), _) => encoded.to_owned(),
            (None, Some(url)) => encoded_part(url)?,
            (None, None) => {
                return Err(ToolFailure::new(
                    FailureKind::BadInput,
                    ToolCode::EmptyCode,
                    "Give encoded (the encoded diagram) or url (a PlantUML URL).",
                ));
            }
        };
        Ok(json!({"plantumlCode": decode(&encoded)?}))
    }
}

/// A tool that only computes: read-only (so idempotent), titled `title`.
pub(crate) fn read_only(title: &str) -> ToolHints {
    ToolHints {
        title: Some(title.to_owned()),
        read_only: Some(true),
        destructive: Some(false),
        idempotent: Some(true),
        untrusted_content: None,
    }
}

/// The encoded diagram of a PlantUML URL: its last path segment, without query or fragment.
fn encoded_part(url: &str) -> Result<String, ToolFailure> {
    let without_query = url.trim().split(['?', '#']).next().unwrap_or_default();
    let last = without_query
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default();
    if last.is_empty() || last.contains(':') || FORMATS.contains(&last) || last == "plantuml" {
        return Err(bad_encoding(
            "the URL has no encoded diagram after its format",
        ));
    }
    Ok(last.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_keep_the_exact_text() {
        let texts = [
            "@startuml\nBob -> Alice : hello\n@enduml",
            "@startuml\nA -> B : 🎉 emoji, 漢字 and ünïcödé\n@enduml\n",
            "  \n\n@startuml\n\n  indented\t\n\n@enduml\n\n  ",
            "x",
            "ab",
            "abc",
        ];
        for text in texts {
            let encoded = encode(text).unwrap();
            assert_eq!(encoded.len() % 4, 0, "whole 4-character groups");
            assert!(encoded.chars().all(|c| ALPHABET.contains(c)));
            assert_eq!(decode(&encoded).unwrap(), text, "{text:?}");
            assert_eq!(encode(text).unwrap(), encoded, "deterministic");
        }
    }

    #[test]
    fn decodes_plantumls_published_encodings() {
        // From plantuml.com/text-encoding.
        assert_eq!(
            decode("Syp9J4vLqBLJSCfFib9mB2t9ICqhoKnEBCdCprC8IYqiJIqkuGBAAUW2rO0LOr5LN92VLvpA1G00")
                .unwrap(),
            "Alice -> Bob: Authentication Request\nBob --> Alice: Authentication Response\n"
        );
        // PlantUML's "Bob -> Alice : hello" example, as its server links it. Our encoding of the
        // same text differs only where two DEFLATE implementations choose different matches
        // (same prefix), and decodes to the same text.
        let hello = "@startuml\nBob -> Alice : hello\n@enduml";
        let published = "SoWkIImgAStDuNBAJrBGjLDmpCbCJbMmKiX8pSd9vt98pKi1IW80";
        assert_eq!(decode(published).unwrap(), hello);
        let ours = encode(hello).unwrap();
        assert_eq!(decode(&ours).unwrap(), hello);
        assert_eq!(ours[..40], published[..40]);
        // The hex form.
        assert_eq!(
            decode("~h407374617274756d6c0a416c6963652d3e426f62203a204920616d207573696e67206865780a40656e64756d6c").unwrap(),
            "@startuml\nAlice->Bob : I am using hex\n@enduml"
        );
    }

    #[test]
    fn decodes_what_other_encoders_produce() {
        let text = "@startuml\nBob -> Alice : hello\n@enduml";
        let mut deflater = DeflateEncoder::new(Vec::new(), Compression::default());
        deflater.write_all(text.as_bytes()).unwrap();
        let compressed = deflater.finish().unwrap();
        // Encoders on unpadded base64 end with a short group.
        let short = alphabet().encode(&compressed);
        assert_eq!(decode(&short).unwrap(), text);
        // Encoders translating standard base64 (Python's plantuml package) keep '=' padding.
        const STANDARD: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let translated: String = data_encoding::BASE64
            .encode(&compressed)
            .chars()
            .map(|c| {
                STANDARD
                    .find(c)
                    .map_or(c, |at| ALPHABET.as_bytes()[at] as char)
            })
            .collect();
        assert!(translated.ends_with('=') || compressed.len() % 3 == 0);
        assert_eq!(decode(&translated).unwrap(), text);
    }

    #[test]
    fn refuses_what_is_not_an_encoding() {
        for bad in ["", "not valid!", "~zzz", "~hZZ", "AAAA"] {
            let failure = decode(bad).unwrap_err();
            assert_eq!(failure.code, ToolCode::InvalidEncoding, "{bad:?}");
        }
    }

    #[test]
    fn finds_the_encoded_part_of_urls() {
        assert_eq!(
            encoded_part("https://www.plantuml.com/plantuml/svg/SoWkIImgAStDuNBAJrBGjLDmpCbCJbMmKiX8pSd9vt98pKi1IW80?x=1").unwrap(),
            "SoWkIImgAStDuNBAJrBGjLDmpCbCJbMmKiX8pSd9vt98pKi1IW80"
        );
        assert!(encoded_part("https://www.plantuml.com/plantuml/svg/").is_err());
    }
}
