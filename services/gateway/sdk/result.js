// What a tool answers besides a plain JSON value: MCP content (text, images the assistant can
// look at, audio, links to resources, embedded resources) with structured content beside it.
// A tool returns a ToolResult; the SDK sends it as the answer frame's `content`,
// `structuredContent` and `result` (the relay checks each item again and refuses a bad one,
// naming it). Anything else a tool returns is its `result`, as before.
//
//   execute: async ({ graph }) => ToolResult.image(dataUri).and(ToolResult.text('Scatter plot of height against age'))
//   execute: () => ToolResult.of({ content: [ToolResult.text('3 rows')], structuredContent: { rows: 3 } })

import { ToolErrorCode } from './errors.js';

// The image types the relay passes on (no SVG: a script in an image is no image to look at).
export const IMAGE_TYPES = Object.freeze(['image/png', 'image/jpeg', 'image/webp', 'image/gif']);

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/** `bytes` (Uint8Array or ArrayBuffer) as base64. */
export function toBase64(bytes) {
  const view = bytes instanceof ArrayBuffer ? new Uint8Array(bytes) : bytes;
  let binary = '';
  for (let at = 0; at < view.length; at += 0x8000) binary += String.fromCharCode(...view.subarray(at, at + 0x8000));
  return btoa(binary);
}

/**
 * A `data:<type>;base64,<data>` URI as `{mimeType, data}`, or null when `value` is no such URI.
 * Throws for a data URI that is not base64 (percent-encoded text): it has no bytes to send.
 */
export function splitDataUri(value) {
  if (typeof value !== 'string' || !value.startsWith('data:')) return null;
  const comma = value.indexOf(',');
  if (comma < 0) throw new TypeError('A data: URI needs a comma before its data.');
  const head = value.slice(5, comma).split(';');
  if (!head.includes('base64')) throw new TypeError('Only base64 data: URIs can be sent (…;base64,…).');
  return { mimeType: head[0].toLowerCase() || 'text/plain', data: value.slice(comma + 1) };
}

/** Base64 data and its type from a data: URI, bytes or a base64 string (`what` names it in errors). */
function binary(what, data, mimeType) {
  let out;
  const uri = splitDataUri(data);
  if (uri) out = { data: uri.data, mimeType: mimeType ?? uri.mimeType };
  else if (data instanceof Uint8Array || data instanceof ArrayBuffer) out = { data: toBase64(data), mimeType };
  else if (typeof data === 'string') out = { data: data.replace(/\s+/g, ''), mimeType };
  else throw new TypeError(`${what} data is a base64 string, a data: URI or bytes, not ${typeof data}.`);
  if (typeof out.mimeType !== 'string' || !out.mimeType) throw new TypeError(`${what} needs a mimeType.`);
  if (out.data.length % 4 !== 0 || !BASE64.test(out.data)) throw new TypeError(`${what} data is not base64.`);
  return out;
}

/** The optional fields of an item, left out when not given. */
function given(fields) {
  return Object.fromEntries(Object.entries(fields).filter(([, value]) => value !== undefined));
}

export class ToolResult {
  /**
   * @param {object} parts
   * @param {Array<object|ToolResult>} [parts.content]  MCP content items (ToolResults are
   *   flattened into their items)
   * @param {object} [parts.structuredContent]  a JSON object beside the content
   * @param {*} [parts.result]  a JSON value as well (MCP clients get it as one more text item)
   * @param {boolean} [parts.isError]  the tool failed: a failed answer with this content
   */
  constructor({ content = [], structuredContent, result, isError = false } = {}) {
    if (!Array.isArray(content)) throw new TypeError('content is an array of content items.');
    this.content = content.flatMap((item) => (item instanceof ToolResult ? item.content : [item]));
    for (const item of this.content) {
      if (!item || typeof item !== 'object' || typeof item.type !== 'string') {
        throw new TypeError(`A content item is an object with a type, not ${JSON.stringify(item)}.`);
      }
    }
    if (structuredContent !== undefined && (structuredContent === null || typeof structuredContent !== 'object' || Array.isArray(structuredContent))) {
      throw new TypeError('structuredContent is a JSON object.');
    }
    this.structuredContent = structuredContent;
    this.result = result;
    this.isError = Boolean(isError);
  }

  /** A result of these parts (see the constructor). */
  static of(parts) {
    return new ToolResult(parts);
  }

  /** A text item. */
  static text(text) {
    return new ToolResult({ content: [{ type: 'text', text: String(text) }] });
  }

  /**
   * An image the assistant can look at: a `data:image/…;base64,` URI (its type is taken from
   * it), or base64 or bytes with `mimeType`. PNG, JPEG, WebP or GIF.
   */
  static image(data, mimeType) {
    const image = binary('An image', data, mimeType);
    const type = image.mimeType.toLowerCase();
    if (!IMAGE_TYPES.includes(type)) {
      throw new TypeError(`An image is ${IMAGE_TYPES.join(', ')}, not ${image.mimeType}${type === 'image/svg+xml' ? ': draw the SVG on a canvas and send the PNG' : ''}.`);
    }
    return new ToolResult({ content: [{ type: 'image', data: image.data, mimeType: type }] });
  }

  /** A sound: a `data:audio/…;base64,` URI, or base64 or bytes with `mimeType` (audio/…). */
  static audio(data, mimeType) {
    const audio = binary('A sound', data, mimeType);
    if (!audio.mimeType.toLowerCase().startsWith('audio/')) throw new TypeError(`A sound is audio/…, not ${audio.mimeType}.`);
    return new ToolResult({ content: [{ type: 'audio', data: audio.data, mimeType: audio.mimeType.toLowerCase() }] });
  }

  /** A link to a resource the client may read: `{uri, name, mimeType?, description?, title?, size?}`. */
  static resourceLink({ uri, name, mimeType, description, title, size } = {}) {
    if (typeof uri !== 'string' || !uri) throw new TypeError('A resource link needs a uri.');
    if (typeof name !== 'string' || !name) throw new TypeError('A resource link needs a name.');
    return new ToolResult({ content: [{ type: 'resource_link', uri, name, ...given({ mimeType, description, title, size }) }] });
  }

  /**
   * A resource carried in the answer: `{uri, mimeType?, text}`, or `{uri, mimeType?, blob}`
   * (blob: base64, bytes or a data: URI).
   */
  static resource({ uri, mimeType, text, blob } = {}) {
    if (typeof uri !== 'string' || !uri) throw new TypeError('A resource needs a uri.');
    if ((text === undefined) === (blob === undefined)) throw new TypeError('A resource has either text or blob.');
    if (text !== undefined) {
      return new ToolResult({ content: [{ type: 'resource', resource: { uri, ...given({ mimeType }), text: String(text) } }] });
    }
    const data = binary('A resource blob', blob, mimeType ?? 'application/octet-stream');
    return new ToolResult({ content: [{ type: 'resource', resource: { uri, mimeType: data.mimeType, blob: data.data } }] });
  }

  /** A failed answer that still shows content (its first text is the error's message). */
  static error(message, more = {}) {
    return new ToolResult({ ...more, content: [{ type: 'text', text: String(message) }, ...(more.content ?? [])], isError: true });
  }

  /** This result with the content of `others` (ToolResults or items) after its own. */
  and(...others) {
    return new ToolResult({ ...this, content: [...this.content, ...others] });
  }

  /** This result with `structuredContent` (and `result`, when given) set. */
  with({ structuredContent = this.structuredContent, result = this.result } = {}) {
    return new ToolResult({ ...this, structuredContent, result });
  }
}

/** `value` as JSON and back: what cannot travel as JSON (a cycle, a BigInt) throws here. */
function asJson(value) {
  return JSON.parse(JSON.stringify(value === undefined ? null : value));
}

/**
 * The answer to call `requestId` whose tool returned `value`: a ToolResult becomes `content`
 * (with `structuredContent` and `result` when it has them; `isError` a failed answer whose
 * message is its first text), anything else the `result`. Without `type`: the transport adds
 * it where the frame needs one.
 */
export function answerOf(requestId, value) {
  if (!(value instanceof ToolResult)) return { requestId, success: true, result: asJson(value) };
  const answer = { requestId, success: !value.isError, content: asJson(value.content) };
  if (value.structuredContent !== undefined) answer.structuredContent = asJson(value.structuredContent);
  if (value.result !== undefined) answer.result = asJson(value.result);
  if (value.isError) {
    const text = value.content.find((item) => item.type === 'text' && item.text)?.text;
    answer.error = { code: ToolErrorCode.TOOL_ERROR, message: text || 'The tool failed.' };
  }
  return answer;
}

/**
 * An MCP tool result (`{content: [...], structuredContent?, isError?}`, as WebMCP tools
 * return) as a ToolResult; null when `value` is not one.
 */
export function fromMcpResult(value) {
  if (!value || typeof value !== 'object' || Array.isArray(value) || !Array.isArray(value.content)) return null;
  return new ToolResult({ content: value.content, structuredContent: value.structuredContent ?? undefined, isError: Boolean(value.isError) });
}
