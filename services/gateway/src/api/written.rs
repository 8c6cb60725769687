//! [`Written`]: a JSON answer written straight from its value.

use poem::http::StatusCode;
use poem::{IntoResponse, Response};
use poem_openapi::payload::{Json, Payload};
use poem_openapi::registry::{MetaSchemaRef, Registry};
use poem_openapi::types::Type;
use serde::Serialize;

/// A JSON answer written straight from `T` with serde, described in the OpenAPI document as
/// poem-openapi's [`Json`] of `T` is. poem-openapi's own first builds a `serde_json::Value`
/// tree of the answer, copying every string and the tool's whole result, then writes that:
/// for the answers of calls, the hot path, this is the copy left out. `T`'s serde form must
/// be the form its `Object` derive describes (the types' tests compare the two).
pub struct Written<T>(pub T);

impl<T: Type> Payload for Written<T> {
    const CONTENT_TYPE: &'static str = <Json<T> as Payload>::CONTENT_TYPE;

    fn check_content_type(content_type: &str) -> bool {
        <Json<T> as Payload>::check_content_type(content_type)
    }

    fn schema_ref() -> MetaSchemaRef {
        T::schema_ref()
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
    }
}

impl<T: Type + Serialize + Send> IntoResponse for Written<T> {
    fn into_response(self) -> Response {
        // Sized, so the body shares the text rather than allocating again for it.
        match toolrelay::json::to_string_sized(&self.0) {
            // A header value made from the constant as it is (`content_type` copies it).
            Ok(body) => Response::builder()
                .header(
                    poem::http::header::CONTENT_TYPE,
                    poem::http::HeaderValue::from_static(Self::CONTENT_TYPE),
                )
                .body(body),
            // Only a map with keys that are not strings fails to be written: none of the
            // answers has one.
            Err(error) => Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .body(format!("the answer could not be written as JSON: {error}")),
        }
    }
}
