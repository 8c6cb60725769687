// Every error name the relay and gateway send (HTTP error bodies, WebSocket and SSE `error`
// frames): the relay's ErrorCode (src/errors.rs in the repository). A test checks that the
// two lists agree, so compare error names through these, never through string literals.
export const ErrorCode = Object.freeze({
  INVALID_CODE: 'invalid_code',
  SESSION_NOT_FOUND: 'session_not_found',
  TOKEN_REQUIRED: 'token_required',
  INVALID_TOKEN: 'invalid_token',
  UNKNOWN_HANDLE: 'unknown_handle',
  UNKNOWN_CLAIM: 'unknown_claim',
  CLAIM_USED: 'claim_used',
  CLAIM_EXPIRED: 'claim_expired',
  UNKNOWN_FUNCTION: 'unknown_function',
  NOT_READ_ONLY: 'not_read_only',
  INVALID_ARGUMENTS: 'invalid_arguments',
  INVALID_REQUEST_ID: 'invalid_request_id',
  REQUEST_ID_CONFLICT: 'request_id_conflict',
  REQUEST_NOT_FOUND: 'request_not_found',
  QUEUE_FULL: 'queue_full',
  TOOL_BUSY: 'tool_busy',
  INVALID_MANIFEST: 'invalid_manifest',
  MANIFEST_TOO_LARGE: 'manifest_too_large',
  INVALID_RESPONSE: 'invalid_response',
  STORE_UNAVAILABLE: 'store_unavailable',
  STORE_FULL: 'store_full',
  AT_CAPACITY: 'at_capacity',
  SHUTTING_DOWN: 'shutting_down',
  RATE_LIMITED: 'rate_limited',
  NESTED_TOO_DEEPLY: 'nested_too_deeply',
  RESPONSE_TOO_LARGE: 'response_too_large',
  RESPONSE_EVICTED: 'response_evicted',
  RELAY_UNAVAILABLE: 'relay_unavailable',
  REPLACED: 'replaced',
  INVALID_FRAME: 'invalid_frame',
  WEBSOCKET_REQUIRED: 'websocket_required',
  NOT_FOUND: 'not_found',
  METHOD_NOT_ALLOWED: 'method_not_allowed',
  ORIGIN_NOT_ALLOWED: 'origin_not_allowed',
  BODY_TOO_LARGE: 'body_too_large',
  INVALID_REQUEST: 'invalid_request',
  API_KEY_REQUIRED: 'api_key_required',
  INVALID_API_KEY: 'invalid_api_key',
  INTERNAL_ERROR: 'internal_error',
  CROSS_SITE_REQUEST: 'cross_site_request',
  HOST_NOT_ALLOWED: 'host_not_allowed',
  TOOL_ERROR: 'tool_error',
  CANCELLED: 'cancelled',
  APPROVAL_DECLINED: 'approval_declined',
  APPROVAL_TIMEOUT: 'approval_timeout',
  APPROVAL_REFUSED: 'approval_refused',
  CALLER_DISCONNECTED: 'caller_disconnected',
  APPROVAL_NOT_PENDING: 'approval_not_pending',
  TAB_NOT_CONNECTED: 'tab_not_connected',
});

/**
 * The codes of a tool's own failures made in the browser (an answer's `error.code`; the relay
 * passes them on), each named by its code in capitals as ErrorCode's are. A page's own tools
 * may add codes of their own (the CODAP plugin's are in plugin/codap.js).
 */
export const ToolErrorCode = Object.freeze({
  // The tool failed without a code of its own.
  TOOL_ERROR: 'tool_error',
  // The person, asked before a change, said no.
  DECLINED_BY_USER: 'declined_by_user',
});
