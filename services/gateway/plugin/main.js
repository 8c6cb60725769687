// The plugin page: CODAP's tools (tools.js, codap.js) served through the browser SDK
// (/sdk/: pairing, transport, dispatch) and shown by its <toolrelay-pairing> element.
// Loaded with `?claim=<32 hex digits>` (the MCP app of `open_codap` frames CODAP so), it is
// paired with the assistant's session and shows no code: at once where CODAP is itself framed
// under one of the relay's known app hosts (its discovery's `appHosts`), else only once the
// person answers Connect to "A conversation sent you this link. Connect this CODAP to that
// assistant?" (Not me leaves the claim unspent and pairs with a code of its own). That session
// is kept for this tab alone: a reload with the claim reconnects to it, a load without the claim
// never does (and a load with one never resumes the plugin's own kept session). The claim
// leaves the URL once redeemed, declined or refused; an empty or malformed claim is no claim.
// It approves callers: a caller's first use of the code waits until the person allows it here.

import { Connection, Dispatcher, isClaim } from '../sdk/toolrelay.js';
import '../sdk/pairing.js';
import { CodapLink } from './codap.js';
import { codapTools, describeCall } from './tools.js';

const VERSION = '1.1.0';
// The plugin talks to the relay that served it.
const BASE = location.origin;

const pairing = document.querySelector('toolrelay-pairing');
const outside = document.getElementById('outside');

const codap = new CodapLink();
const dispatcher = new Dispatcher();
for (const tool of codapTools(codap)) dispatcher.register(tool.id, tool.description, tool.functions);
window.mcpDispatcher = dispatcher;

// A claim is 32 hex digits; anything else (empty, cut short) is no claim.
const given = new URL(location.href).searchParams.get('claim');
const claim = isClaim(given) ? given : null;
// Whether the person approves each new caller here: yes by default; `?approve=auto` turns it
// off (a page the person set up for one assistant only, the tests that predate approvals).
const APPROVE = new URL(location.href).searchParams.get('approve') === 'auto' ? 'auto' : 'ask';

// The session is kept under mcp-session-<code> (SPEC §9). The person allows each new caller
// in the plugin before its first call runs (the pairing element asks, at the top of the frame).
// An app frames CODAP, which frames the plugin: a claim pairs without asking only two frames
// below an app host's page.
const connection = new Connection({ relay: BASE, dispatcher, storageKey: 'mcp-session-', claim, claimFrameDepth: 2, approve: APPROVE });
const dropClaim = () => {
  const url = new URL(location.href);
  url.searchParams.delete('claim');
  history.replaceState(history.state, '', url);
};
if (claim) {
  // Once redeemed, declined (a code of the plugin's own comes instead) or refused, the claim
  // is done with here: it does not stay in the address.
  connection.addEventListener('code', dropClaim, { once: true });
  connection.addEventListener('status', (event) => event.detail.state === 'refused' && dropClaim());
} else if (given !== null) {
  dropClaim();
}
pairing.connection = connection;
pairing.describeCall = describeCall;
// The page's state, for its styles and its tests.
pairing.addEventListener('pairing-state', (event) => {
  document.body.dataset.state = event.detail.state;
  document.body.dataset.link = event.detail.link;
});

function outsideNotice() {
  const plugin = `${pairing.publicBase}/codap/`;
  const codapUrl = `https://codap.concord.org/app/?di=${encodeURIComponent(plugin)}`;
  outside.replaceChildren(
    'Not running inside CODAP. ',
    Object.assign(document.createElement('a'), { href: codapUrl, target: '_blank', rel: 'noopener', textContent: 'Open CODAP with this plugin' }),
    ' to let the assistant work on a CODAP document. You can still pair and try the relay here; CODAP tools will say that CODAP is not connected.',
  );
  outside.hidden = false;
}

// ---- CODAP ----

codap.addEventListener('connected', async () => {
  outside.hidden = true;
  try {
    await codap.request({
      action: 'update',
      resource: 'interactiveFrame',
      values: { name: 'toolrelay', title: 'AI assistant', version: VERSION, dimensions: { width: 360, height: 500 } },
    });
  } catch {
    // The frame keeps its defaults.
  }
});
codap.addEventListener('absent', outsideNotice);
codap.start();

// For tests and curious developers.
window.toolrelay = {
  get session() {
    return connection.session;
  },
  get transport() {
    return connection.transportKind;
  },
  get codapConnected() {
    return codap.connected;
  },
  get ready() {
    return connection.ready;
  },
  /** How often the connection to the relay failed or dropped, or an answer could not go. */
  get interruptions() {
    return connection.interruptions;
  },
  prompt: () => pairing.prompt(),
  /** The open questions about new callers, oldest first. */
  get pendingApprovals() {
    return connection.pendingApprovals;
  },
  /** The question about a claim link while it is open ({label, expiresAt}), or null. */
  get pendingClaim() {
    return connection.pendingClaim;
  },
  /** The callers the person allowed, and whether the code refuses new ones. */
  get callers() {
    return connection.callers;
  },
  connection,
};

// Assistants are given the relay's public address (PUBLIC_BASE_URL, from its discovery
// document), which differs behind a proxy: learn it before showing a code.
pairing.discovered.then(() => {
  // The notice (if CODAP was found absent meanwhile) links the public address too.
  if (!outside.hidden) outsideNotice();
  connection.start();
});
