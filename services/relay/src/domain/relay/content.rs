//! MCP content in a tab's answer: the items a model can see (text, images, audio) or follow
//! (resource links, embedded resources), checked where the answer enters the relay. What passes
//! is kept as the tab sent it; what does not fails the call with an error naming the item.

use data_encoding::BASE64;
use serde_json::Value;

/// The image types an answer may carry, each with how its data starts. SVG is not one: it is
/// a document that can carry scripts and links, not pixels.
const IMAGE_TYPES: [(&str, &[&[u8]]); 4] = [
    ("image/png", &[b"\x89PNG\r\n\x1a\n"]),
    ("image/jpeg", &[b"\xff\xd8\xff"]),
    ("image/gif", &[b"GIF87a", b"GIF89a"]),
    ("image/webp", &[b"RIFF"]),
];

/// The kinds of item there are, for the messages.
const KINDS: &str = "text, image, audio, resource_link, resource";

/// Why an answer's content was refused: which item, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadContent {
    /// The item's place in `content`, from 0.
    pub index: usize,
    /// What is wrong, and what to send instead.
    pub reason: String,
}

impl BadContent {
    fn at(index: usize, reason: impl Into<String>) -> Self {
        Self {
            index,
            reason: reason.into(),
        }
    }

    /// The message for the tab and the caller.
    pub fn message(&self) -> String {
        format!("content[{}] was refused: {}", self.index, self.reason)
    }
}

/// Checks an answer's `content` items and its `structuredContent`; on success, the bytes of
/// binary data they carry (decoded images, audio and blobs).
pub fn check_content(
    items: Option<&[Value]>,
    structured: Option<&Value>,
) -> Result<usize, BadContent> {
    if let Some(structured) = structured
        && !structured.is_object()
    {
        return Err(BadContent::at(
            0,
            "structuredContent must be a JSON object; put other values in `result`",
        ));
    }
    let mut bytes = 0;
    for (index, item) in items.unwrap_or_default().iter().enumerate() {
        bytes += check_item(item).map_err(|reason| BadContent::at(index, reason))?;
    }
    Ok(bytes)
}

/// One item: its binary bytes, or what is wrong with it.
fn check_item(item: &Value) -> Result<usize, String> {
    let Some(kind) = item.get("type").and_then(Value::as_str) else {
        return Err(format!(
            "an item needs a \"type\" ({KINDS}), as MCP content has"
        ));
    };
    match kind {
        "text" => string_field(item, "text").map(|_| 0),
        "image" => {
            let mime = string_field(item, "mimeType")?;
            let Some((_, signatures)) = IMAGE_TYPES.iter().find(|(known, _)| *known == mime) else {
                return Err(image_type_refused(mime));
            };
            let data = decoded(item, "data")?;
            if !signatures.iter().any(|start| data.starts_with(start))
                || (mime == "image/webp" && data.get(8..12) != Some(b"WEBP"))
            {
                return Err(format!(
                    "its data is not a {mime} image (the bytes do not start as one); send the image's own bytes, base64-encoded"
                ));
            }
            Ok(data.len())
        }
        "audio" => {
            let mime = string_field(item, "mimeType")?;
            if !mime.starts_with("audio/") {
                return Err(format!(
                    "mimeType {mime:?} is not audio; say audio/wav, audio/mpeg, audio/ogg, …"
                ));
            }
            decoded(item, "data").map(|data| data.len())
        }
        "resource_link" => {
            string_field(item, "uri")?;
            string_field(item, "name").map(|_| 0)
        }
        "resource" => {
            let Some(resource) = item.get("resource").filter(|r| r.is_object()) else {
                return Err(
                    "an embedded resource needs \"resource\": {uri, mimeType, text or blob}".into(),
                );
            };
            string_field(resource, "uri")?;
            if let Some(mime) = resource.get("mimeType").and_then(Value::as_str)
                && is_svg(mime)
            {
                return Err(image_type_refused(mime));
            }
            if resource.get("text").is_some() {
                return string_field(resource, "text").map(|_| 0);
            }
            decoded(resource, "blob").map(|blob| blob.len())
        }
        other => Err(format!(
            "its type {other:?} is not one the relay carries ({KINDS})"
        )),
    }
}

fn is_svg(mime: &str) -> bool {
    mime.to_ascii_lowercase().starts_with("image/svg")
}

fn image_type_refused(mime: &str) -> String {
    let known: Vec<&str> = IMAGE_TYPES.iter().map(|(known, _)| *known).collect();
    if is_svg(mime) {
        format!(
            "SVG images are not accepted (an SVG is a document that can carry scripts); send it drawn as a PNG ({})",
            known.join(", ")
        )
    } else {
        format!(
            "mimeType {mime:?} is not an image type the relay carries; send one of {}",
            known.join(", ")
        )
    }
}

fn string_field<'a>(item: &'a Value, name: &str) -> Result<&'a str, String> {
    item.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("\"{name}\" must be a string"))
}

/// A base64 field, decoded.
fn decoded(item: &Value, name: &str) -> Result<Vec<u8>, String> {
    let data = string_field(item, name)?;
    if data.starts_with("data:") {
        return Err(format!(
            "\"{name}\" is a data: URI; send only the base64 after the comma, and the type as mimeType"
        ));
    }
    BASE64
        .decode(data.as_bytes())
        .map_err(|error| format!("\"{name}\" is not base64 (standard alphabet, padded): {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    fn image(mime: &str, bytes: &[u8]) -> Value {
        json!({"type": "image", "mimeType": mime, "data": BASE64.encode(bytes)})
    }

    fn refused(items: &[Value]) -> String {
        check_content(Some(items), None).unwrap_err().message()
    }

    #[test]
    fn every_kind_of_item_passes_and_counts_its_binary_bytes() {
        let items = [
            json!({"type": "text", "text": "a graph", "annotations": {"audience": ["user"]}}),
            image("image/png", PNG),
            image("image/jpeg", b"\xff\xd8\xff\xe0"),
            image("image/gif", b"GIF89a.."),
            image("image/webp", b"RIFF\0\0\0\0WEBPVP8 "),
            json!({"type": "audio", "mimeType": "audio/wav", "data": BASE64.encode(b"RIFF....WAVE")}),
            json!({"type": "resource_link", "uri": "https://example.org/a", "name": "a"}),
            json!({"type": "resource", "resource": {"uri": "test://t", "text": "hello"}}),
            json!({"type": "resource", "resource": {"uri": "test://b", "mimeType": "application/octet-stream", "blob": BASE64.encode(b"xyz")}}),
        ];
        let bytes = check_content(Some(&items), Some(&json!({"points": 3}))).unwrap();
        assert_eq!(bytes, PNG.len() + 4 + 8 + 16 + 12 + 3);
        assert_eq!(check_content(None, None), Ok(0));
    }

    #[test]
    fn a_bad_item_is_refused_by_its_place_and_what_is_wrong() {
        let svg =
            json!({"type": "image", "mimeType": "image/svg+xml", "data": BASE64.encode(b"<svg/>")});
        let message = refused(&[json!({"type": "text", "text": "ok"}), svg]);
        assert!(
            message.starts_with("content[1] was refused: SVG images are not accepted"),
            "{message}"
        );
        let message = refused(&[json!({"type": "video", "data": ""})]);
        assert!(
            message.contains("\"video\" is not one the relay carries"),
            "{message}"
        );
        let message =
            refused(&[json!({"type": "image", "mimeType": "image/png", "data": "not base64!"})]);
        assert!(message.contains("\"data\" is not base64"), "{message}");
        let message = refused(&[image("image/png", b"<svg xmlns=...")]);
        assert!(message.contains("is not a image/png image"), "{message}");
        let message = refused(&[
            json!({"type": "image", "mimeType": "image/png", "data": "data:image/png;base64,AAAA"}),
        ]);
        assert!(message.contains("data: URI"), "{message}");
        let message = refused(&[json!({"type": "image", "mimeType": "image/bmp", "data": "AAAA"})]);
        assert!(message.contains("image/png, image/jpeg"), "{message}");
        let message = refused(&[json!({"text": "no type"})]);
        assert!(message.contains("needs a \"type\""), "{message}");
        for svg in [
            json!({"blob": "AAAA"}),
            json!({"text": "<svg onload='x()'/>"}),
        ] {
            let mut resource = json!({"uri": "x", "mimeType": "image/svg+xml"});
            let extra = svg.as_object().unwrap().clone();
            resource.as_object_mut().unwrap().extend(extra);
            let message = refused(&[json!({"type": "resource", "resource": resource})]);
            assert!(message.contains("SVG"), "{message}");
        }
        let wrong = check_content(None, Some(&json!([1, 2]))).unwrap_err();
        assert!(
            wrong
                .message()
                .contains("structuredContent must be a JSON object")
        );
    }
}
