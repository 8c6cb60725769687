//! The provider WebSocket on the gateway's port: `GET /api/sessions/{code}/ws?token=…`.
//!
//! The gateway completes the HTTP upgrade itself and hands the raw connection, with the
//! provider link it attached through [`RelayApi`](toolrelay_relay::front::RelayApi), to the relay's
//! WebSocket code ([`toolrelay_relay::front::serve::serve_upgraded`]). In one process the link is the
//! relay's own; in a split deployment it is a gRPC `Connect` stream. Either way the tab speaks
//! the same protocol on the same URL.

use poem::http::{StatusCode, header};
use poem::web::{Data, Path, Query};
use poem::{Request, Response, handler};
use serde::Deserialize;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use toolrelay_relay::front::serve::{SocketSettings, serve_upgraded, websocket_config};
use toolrelay_relay::front::{AnswerLimits, ErrorCode, Transport};

use crate::api::{Client, State};
use crate::error::error_response;

/// The query of the WebSocket URL.
#[derive(Debug, Deserialize)]
pub struct SocketQuery {
    token: Option<String>,
}

/// Upgrades to the provider WebSocket and serves it.
#[handler]
pub async fn provider_socket(
    request: &Request,
    Path(code): Path<String>,
    Query(query): Query<SocketQuery>,
    Data(state): Data<&State>,
    Client(caller): Client,
) -> Response {
    let headers = request.headers();
    let wants_websocket = headers
        .get(header::UPGRADE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.eq_ignore_ascii_case("websocket"));
    let version_13 = headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_some_and(|value| value == "13");
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|key| key.as_bytes().to_vec());
    let (true, true, Some(key)) = (wants_websocket, version_13, key) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            ErrorCode::WebsocketRequired,
            "This is the provider WebSocket: connect with a WebSocket client to /api/sessions/{code}/ws?token=<providerToken>.".into(),
        );
    };
    let upgrade = match request.take_upgrade() {
        Ok(upgrade) => upgrade,
        Err(error) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                ErrorCode::WebsocketRequired,
                error.to_string(),
            );
        }
    };

    let drain = state.drain.clone();
    let state = State::clone(state);
    drain.spawn_socket(async move {
        let Ok(connection) = upgrade.await else {
            return;
        };
        // A refused attach (an unknown code, a blocked address) is an error frame and a close:
        // a browser cannot read the status of a refused upgrade.
        let link = state
            .relay
            .attach(&caller, &code, query.token.as_deref(), Transport::WebSocket)
            .await;
        let settings = SocketSettings {
            config: websocket_config(state.config.max_provider_body),
            answers: AnswerLimits::depth_only(state.config.max_json_depth),
            drain: state.drain.clone(),
        };
        serve_upgraded(connection, &settings, link).await;
    });

    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, derive_accept_key(&key))
        .finish()
}
