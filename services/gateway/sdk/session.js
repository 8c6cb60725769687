// The pairing session: created on load, kept in localStorage (in memory where the browser
// denies it) under `<prefix><code>` (the CODAP plugin's prefix is `mcp-session-`) so a reload
// reconnects to it, and never taken over by a second tab of the same page (each tab marks the
// session it holds and refreshes that mark; a session marked by a live tab is left alone).
//
// A session can also come from a claim an assistant minted (`POST /api/sessions/claim`). Such a
// session is the assistant's, not the person's, and whoever sent the link chose it: it is kept
// apart from the page's own sessions — in sessionStorage (this tab only, gone with it) under
// `toolrelay-claim:<SHA-256 of the claim>`, never under `<prefix><code>` and never in
// localStorage. So a later load without that claim never rejoins it (it makes or resumes a
// session of the page's own), while the same tab loaded again with the same claim (a reload, an
// app rendered again in the same conversation) reconnects to it instead of redeeming a claim
// already spent. Records of claimed sessions that earlier versions kept in localStorage are
// dropped unused.
//
// A claim is 32 hex digits (`isClaim`); anything else is no claim. `describeClaim` tells who
// opened a claim without spending it (`POST /api/sessions/claim/about`), for a page that asks
// the person first.

import { ErrorCode } from './errors.js';

const MARK_EVERY_MS = 2000;
// A mark older than this belongs to a tab that is gone.
const MARK_STALE_MS = 6000;
const CLAIM_PREFIX = 'toolrelay-claim:';
const CLAIM_SHAPE = /^[0-9a-fA-F]{32}$/;

/** A random id of 16 hex digits. */
export function randomId() {
  const bytes = new Uint8Array(8);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

/** Whether `text` has a claim's shape (32 hex digits): anything else is no claim. */
export function isClaim(text) {
  return typeof text === 'string' && CLAIM_SHAPE.test(text);
}

/**
 * A Web Storage of the page (`localStorage` or `sessionStorage`), or, where the browser denies
 * it (a frame of another site while third-party storage is blocked, as in private windows),
 * this page's memory: pairing works, but nothing outlives the page.
 */
function pageStorage(name) {
  try {
    const storage = globalThis[name];
    storage.getItem('toolrelay-probe');
    return { store: storage, persistent: true };
  } catch {
    const items = new Map();
    const memory = {
      get length() {
        return items.size;
      },
      key: (index) => [...items.keys()][index] ?? null,
      getItem: (key) => (items.has(key) ? items.get(key) : null),
      setItem: (key, value) => void items.set(key, String(value)),
      removeItem: (key) => void items.delete(key),
    };
    return { store: memory, persistent: false };
  }
}

// The page's own sessions, kept across loads and tabs.
const { store } = pageStorage('localStorage');
// Sessions from claims: this tab's alone.
const { store: tabStore, persistent: tabPersistent } = pageStorage('sessionStorage');
const TAB = randomId();

/** The relay refused a claim (used, expired, unknown, or too many tries): `code` says which. */
export class ClaimRefused extends Error {
  constructor(code, message) {
    super(message);
    this.name = 'ClaimRefused';
    this.code = code;
  }
}

// What a person is told about a claim the relay refused (its own messages are for assistants).
const ASK_AGAIN = 'Ask your assistant to open it again.';
const CLAIM_REFUSALS = {
  [ErrorCode.UNKNOWN_CLAIM]: `This link is not one this relay made (it may have been copied incompletely). ${ASK_AGAIN}`,
  [ErrorCode.CLAIM_USED]: `This link was used already: a link from an assistant connects one page, once. ${ASK_AGAIN}`,
  [ErrorCode.CLAIM_EXPIRED]: `This link has expired (a link from an assistant works for a few minutes), or the assistant's session has ended. ${ASK_AGAIN}`,
};

/**
 * Where a claim's session is kept in sessionStorage: under its SHA-256 in hex where the page
 * may hash (a secure context), else under the claim itself (spent once redeemed, so it opens
 * nothing).
 */
async function claimKey(claim) {
  if (!globalThis.crypto?.subtle) return `${CLAIM_PREFIX}${claim}`;
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(claim));
  return `${CLAIM_PREFIX}${Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('')}`;
}

/** Drops what earlier versions kept of claims in localStorage (which claim opened which code). */
function forgetKeptClaims() {
  for (let i = store.length - 1; i >= 0; i -= 1) {
    const key = store.key(i);
    if (key?.startsWith(CLAIM_PREFIX)) store.removeItem(key);
  }
}

/** The error's name and message in the relay's error body `{error: "<name>", message, …}`. */
async function refusal(response) {
  const body = await response.json().catch(() => ({}));
  return {
    code: typeof body?.error === 'string' ? body.error : null,
    message: typeof body?.message === 'string' && body.message ? body.message : `The relay answered ${response.status}.`,
  };
}

/** A claim refused, with words for the person where the relay's are for assistants. */
async function claimRefused(response) {
  const { code, message } = await refusal(response);
  return new ClaimRefused(code, CLAIM_REFUSALS[code] ?? message);
}

function read(from, key) {
  try {
    return JSON.parse(from.getItem(key));
  } catch {
    return null;
  }
}

export class Sessions {
  /**
   * @param {string} base  the relay's origin
   * @param {{prefix?: string, remember?: boolean}} options  the localStorage key prefix (pages
   *   that share an origin need their own); `remember: false` keeps nothing (a new code per load)
   */
  constructor(base, { prefix = 'mcp-session-', remember = true } = {}) {
    this.base = base;
    this.prefix = prefix;
    this.remember = remember;
    this.current = null;
    // The sessionStorage key of the current session when it came from a claim, else null.
    this.claimed = null;
    this.markTimer = null;
    forgetKeptClaims();
    addEventListener('pagehide', () => this.release());
  }

  key(code) {
    return `${this.prefix}${code}`;
  }

  /**
   * A stored session of the page's own that no live tab holds, still known to the relay; else a
   * new one. Never a session from a claim.
   */
  async open() {
    if (!this.remember) return { session: await this.create(), restored: false };
    const now = Date.now();
    const candidates = [];
    for (let i = store.length - 1; i >= 0; i -= 1) {
      const key = store.key(i);
      if (!key || !key.startsWith(this.prefix)) continue;
      const stored = read(store, key);
      // A claimed session an earlier version kept here is the assistant's: never resumed.
      if (!stored || !stored.code || !stored.token || stored.claimed || Date.parse(stored.expiresAt) <= now) {
        store.removeItem(key);
        continue;
      }
      const heldElsewhere = stored.tab && stored.tab !== TAB && now - (stored.markedAt || 0) < MARK_STALE_MS;
      if (!heldElsewhere) candidates.push(stored);
    }
    candidates.sort((a, b) => (b.createdAt || 0) - (a.createdAt || 0));
    for (const stored of candidates) {
      const info = await this.stillKnown(stored);
      if (info) {
        this.hold({ ...stored, expiresAt: info.expiresAt, maxExpiresAt: info.maxExpiresAt ?? stored.maxExpiresAt });
        return { session: this.current, restored: true };
      }
      if (info === null) store.removeItem(this.key(stored.code));
    }
    return { session: await this.create(), restored: false };
  }

  /**
   * The relay's status of a kept session (asked with its provider token: no API key is needed,
   * and the brute-force guard never refuses the session's own tab): its body, null when the
   * relay no longer knows it, undefined when the relay could not say.
   */
  async stillKnown(stored) {
    const status = await fetch(`${this.base}/api/sessions/${stored.code}`, {
      headers: { Authorization: `Bearer ${stored.token}` },
    }).catch(() => null);
    if (status?.ok) return status.json();
    if (status?.status === 404) return null;
    return undefined;
  }

  /**
   * The session this tab already redeemed `claim` for, still known to the relay, or null when
   * this tab never did. Throws ClaimRefused when that session has ended.
   */
  async resumeClaim(claim) {
    const key = await claimKey(claim);
    const stored = read(tabStore, key);
    if (!stored?.code || !stored.token) {
      tabStore.removeItem(key);
      return null;
    }
    const info = await this.stillKnown(stored);
    if (info === undefined) throw new Error('The relay did not say whether the session your assistant opened still exists.');
    if (info === null) {
      tabStore.removeItem(key);
      throw new ClaimRefused(ErrorCode.SESSION_NOT_FOUND, 'The session your assistant opened for this page has ended. Ask your assistant to open it again.');
    }
    // The claim names this session: a render of the app still holding it gives way.
    this.hold({ ...stored, expiresAt: info.expiresAt, maxExpiresAt: info.maxExpiresAt ?? stored.maxExpiresAt, claimed: true }, key);
    return { session: this.current, restored: true };
  }

  /**
   * Who opened `claim` and until when it can be redeemed, without spending it: `{label?,
   * expiresAt}` (`label` is what the assistant's MCP client says it is: not proof). Throws
   * ClaimRefused as a redemption would.
   */
  async describeClaim(claim) {
    const response = await fetch(`${this.base}/api/sessions/claim/about`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ claim }),
    });
    if (!response.ok) throw await claimRefused(response);
    const body = await response.json();
    return {
      label: typeof body?.label === 'string' && body.label.trim() ? body.label : null,
      expiresAt: body?.expiresAt ?? null,
    };
  }

  /** Redeems `claim` for its session, kept for this tab alone. Throws ClaimRefused. */
  async redeemClaim(claim) {
    const response = await fetch(`${this.base}/api/sessions/claim`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ claim }),
    });
    if (!response.ok) {
      const refused = await claimRefused(response);
      // Without storage a page loaded again cannot know the session its claim opened.
      if (!tabPersistent && refused.code === ErrorCode.CLAIM_USED) {
        throw new ClaimRefused(refused.code, 'This browser keeps no storage for pages embedded in another site, so this page could not remember the session your assistant opened for it. Ask your assistant to open it again.');
      }
      throw refused;
    }
    const session = { ...this.created(await response.json()), claimed: true };
    this.hold(session, this.remember ? await claimKey(claim) : null);
    return { session: this.current, restored: false };
  }

  /**
   * The session `claim` names: the one this tab already redeemed it for (still known to the
   * relay), else redeemed now. Throws ClaimRefused when the relay refuses the claim, or when
   * the session it once opened has ended.
   */
  async openClaim(claim) {
    return (await this.resumeClaim(claim)) ?? this.redeemClaim(claim);
  }

  /** What is kept of a session the relay answered with (creation and claims alike). */
  created(body) {
    return {
      code: body.code,
      token: body.providerToken,
      expiresAt: body.expiresAt,
      maxExpiresAt: body.maxExpiresAt || null,
      connectorUrl: body.connectorUrl || null,
      createdAt: Date.now(),
    };
  }

  async create() {
    const response = await fetch(`${this.base}/api/sessions`, { method: 'POST' });
    if (!response.ok) throw new Error((await refusal(response)).message);
    this.hold(this.created(await response.json()));
    return this.current;
  }

  /**
   * Holds a session: stores it (with this tab's mark, refreshed while the tab lives), under
   * `claimed` in sessionStorage when it came from a claim.
   */
  hold(session, claimed = null) {
    clearInterval(this.markTimer);
    this.current = session;
    this.claimed = session.claimed ? claimed : null;
    this.mark();
    if (!session.claimed) this.markTimer = setInterval(() => this.mark(), MARK_EVERY_MS);
  }

  mark() {
    if (!this.current || !this.remember) return;
    if (this.current.claimed) {
      if (this.claimed) tabStore.setItem(this.claimed, JSON.stringify(this.current));
      return;
    }
    store.setItem(this.key(this.current.code), JSON.stringify({ ...this.current, tab: TAB, markedAt: Date.now() }));
  }

  /** Leaves the stored session for the next page (a reload) to pick up at once. */
  release() {
    if (!this.current || !this.remember || this.current.claimed) return;
    clearInterval(this.markTimer);
    store.setItem(this.key(this.current.code), JSON.stringify({ ...this.current, tab: null, markedAt: 0 }));
  }

  setExpiry(expiresAt) {
    if (this.current && expiresAt) {
      this.current.expiresAt = expiresAt;
      this.mark();
    }
  }

  /** Ends the current session at the relay and forgets it. */
  async end() {
    const session = this.current;
    if (!session) return;
    this.forget();
    await fetch(`${this.base}/api/sessions/${session.code}`, {
      method: 'DELETE',
      headers: { authorization: `Bearer ${session.token}` },
    }).catch(() => null);
  }

  forget() {
    if (!this.current) return;
    clearInterval(this.markTimer);
    if (this.current.claimed) {
      if (this.claimed) tabStore.removeItem(this.claimed);
    } else {
      store.removeItem(this.key(this.current.code));
    }
    this.current = null;
    this.claimed = null;
  }
}
