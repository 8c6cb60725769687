//! The toolrelay gateway: the documented REST API, SSE and polling fallbacks, the OpenAPI spec,
//! MCP and the CODAP plugin's files.
//!
//! Until the gateway lands, this crate only hosts the one-process `toolrelay` binary, which
//! runs the relay's gRPC service and its browser WebSocket on the public port.
