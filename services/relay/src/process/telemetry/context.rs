//! The request a task is answering, as its log lines name it.
//!
//! Each HTTP request and each gRPC call is answered inside a task-local [`RequestContext`]: its
//! correlation id, method and path. The log formatters ([`super::lines`]) write it on every line
//! logged while it is answered, where tracing would write a span, in the same form: text lines
//! begin `request{correlation_id=… method=… path=…}:`, JSON lines carry it as `span` and first
//! in `spans`, with `"name":"request"` (`"rpc"` for a gRPC call).
//!
//! It was a tracing span. A span costs every request a registry slot, its fields formatted as
//! text when it begins, an enter and an exit at each poll and a close, and it is seldom printed:
//! a request that succeeds logs nothing in it. That was 8 % of a call's CPU (BENCHMARKS.md,
//! issue 44); the task-local costs the correlation id the request keeps anyway.

use std::fmt::{self, Display};

use hyper::http::{Method, Uri};

use super::redacted_path;

/// Longest correlation id taken from a client.
const MAX_CORRELATION_ID: usize = 128;

tokio::task_local! {
    static CURRENT: RequestContext;
}

/// What the lines logged while a request is answered say about it ([`RequestContext::scope`]).
#[derive(Debug)]
pub struct RequestContext {
    correlation_id: String,
    kind: Kind,
    /// A clone of the request's URI shares its bytes.
    uri: Uri,
}

#[derive(Debug)]
enum Kind {
    /// An HTTP request: its lines show `request{correlation_id method path}`, the path without
    /// secrets ([`redacted_path`]).
    Http(Method),
    /// A gRPC call: its lines show `rpc{correlation_id method}`, the method its path.
    Rpc,
}

impl RequestContext {
    /// An HTTP request's context.
    pub fn http(correlation_id: String, method: Method, uri: Uri) -> Self {
        Self {
            correlation_id,
            kind: Kind::Http(method),
            uri,
        }
    }

    /// A gRPC call's context.
    pub fn rpc(correlation_id: String, uri: Uri) -> Self {
        Self {
            correlation_id,
            kind: Kind::Rpc,
            uri,
        }
    }

    /// The correlation id a client sent (its `x-request-id`), if it is fit for the logs (1 to 128
    /// printable ASCII characters), or a new one.
    pub fn correlation_id_from(sent: Option<&str>) -> String {
        sent.filter(|id| {
            !id.is_empty()
                && id.len() <= MAX_CORRELATION_ID
                && id.bytes().all(|b| b.is_ascii_graphic())
        })
        .map_or_else(crate::code::unique_id, str::to_owned)
    }

    /// This request's correlation id.
    pub fn correlation_id(&self) -> &str {
        &self.correlation_id
    }

    /// `answering`, run with this as the current request's context. (Not an `async fn`: one
    /// would hold `answering` twice over, as its argument and inside the scope.)
    pub fn scope<F: Future>(self, answering: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(self, answering)
    }

    /// Gives `read` the context of the request the current task is answering, if it is one.
    pub fn with_current<R>(read: impl FnOnce(&Self) -> R) -> Option<R> {
        CURRENT.try_with(read).ok()
    }

    /// The name its lines give it, as a span's.
    pub(super) fn name(&self) -> &'static str {
        match self.kind {
            Kind::Http(_) => "request",
            Kind::Rpc => "rpc",
        }
    }

    /// Gives `field` each of its fields in order, as a span's: name and value.
    pub(super) fn fields(
        &self,
        mut field: impl FnMut(&'static str, &dyn Display) -> fmt::Result,
    ) -> fmt::Result {
        field("correlation_id", &self.correlation_id)?;
        match &self.kind {
            Kind::Http(method) => {
                field("method", method)?;
                field("path", &redacted_path(self.uri.path()))
            }
            Kind::Rpc => field("method", &self.uri.path()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(context: &RequestContext) -> Vec<(&'static str, String)> {
        let mut fields = Vec::new();
        context
            .fields(|name, value| {
                fields.push((name, value.to_string()));
                Ok(())
            })
            .unwrap();
        fields
    }

    #[tokio::test]
    async fn a_task_answering_a_request_reads_its_context_and_others_do_not() {
        assert!(RequestContext::with_current(|_| ()).is_none());
        let context = RequestContext::http(
            "corr-1".to_owned(),
            Method::POST,
            Uri::from_static("/mcp/s/0123abcd/x?token=secret"),
        );
        let read = context
            .scope(async {
                tokio::task::yield_now().await;
                let elsewhere =
                    tokio::spawn(async { RequestContext::with_current(|_| ()).is_none() });
                assert!(elsewhere.await.unwrap(), "a task spawned has no context");
                RequestContext::with_current(|context| (context.name(), fields(context)))
            })
            .await;
        let (name, read) = read.expect("the request's context");
        assert_eq!(name, "request");
        assert_eq!(
            read,
            [
                ("correlation_id", "corr-1".to_owned()),
                ("method", "POST".to_owned()),
                ("path", "/mcp/s/…/x".to_owned()),
            ]
        );
        let rpc = RequestContext::rpc("c".to_owned(), Uri::from_static("/toolrelay.v1.Relay/Call"));
        assert_eq!(rpc.name(), "rpc");
        assert_eq!(
            fields(&rpc),
            [
                ("correlation_id", "c".to_owned()),
                ("method", "/toolrelay.v1.Relay/Call".to_owned()),
            ]
        );
    }

    #[test]
    fn a_correlation_id_unfit_for_the_logs_is_replaced() {
        assert_eq!(RequestContext::correlation_id_from(Some("abc-1")), "abc-1");
        for unfit in [None, Some(""), Some("has space"), Some("new\nline")] {
            let made = RequestContext::correlation_id_from(unfit);
            assert!(
                !made.is_empty() && Some(made.as_str()) != unfit,
                "{unfit:?}"
            );
        }
        let long = "x".repeat(129);
        assert_ne!(RequestContext::correlation_id_from(Some(&long)), long);
        let longest = "x".repeat(128);
        assert_eq!(RequestContext::correlation_id_from(Some(&longest)), longest);
    }
}
