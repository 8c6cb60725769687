// The pairing session: created on load, kept in localStorage (in memory where the browser
// denies it) under `<prefix><code>` (the CODAP
// plugin's prefix is `mcp-session-`) so a reload reconnects to it, and never taken over by a
// second tab of the same page (each tab marks the session it holds and refreshes that mark; a
// session marked by a live tab is left alone).
// A session can also come from a claim an assistant minted (`POST /api/sessions/claim`): it is
// kept the same way, and `toolrelay-claim:<digest of the claim>` → code remembers which claim
// it came from, so a page loaded again with the same claim (a conversation re-rendering its
// app) reconnects to that session instead of redeeming a claim already spent.

import { ErrorCode } from './errors.js';

const MARK_EVERY_MS = 2000;
// A mark older than this belongs to a tab that is gone.
const MARK_STALE_MS = 6000;

/** A random id of 16 hex digits. */
export function randomId() {
  const bytes = new Uint8Array(8);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

/**
 * Where sessions are kept: localStorage, or, where the browser denies it (a frame of another
 * site while third-party storage is blocked, as in private windows), this page's memory:
 * pairing works, but nothing outlives the page.
 */
function pageStorage() {
  try {
    const storage = globalThis.localStorage;
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

const { store, persistent } = pageStorage();
const TAB = randomId();
const CLAIM_PREFIX = 'toolrelay-claim:';

/** The relay refused a claim (used, expired, unknown, or too many tries): `code` says which. */
export class ClaimRefused extends Error {
  constructor(code, message) {
    super(message);
    this.name = 'ClaimRefused';
    this.code = code;
  }
}

/**
 * What localStorage keeps of a claim: its SHA-256 in hex where the page may hash (a secure
 * context), else the claim itself (spent once redeemed, so it opens nothing).
 */
async function claimKey(claim) {
  if (!globalThis.crypto?.subtle) return `${CLAIM_PREFIX}${claim}`;
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(claim));
  return `${CLAIM_PREFIX}${Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('')}`;
}

/** Drops the records of claims whose session has outlived its maximum lifetime. */
function forgetSpentClaims() {
  const now = Date.now();
  for (let i = store.length - 1; i >= 0; i -= 1) {
    const key = store.key(i);
    if (key?.startsWith(CLAIM_PREFIX) && !(Date.parse(read(key)?.expiresAt) > now)) store.removeItem(key);
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

function read(key) {
  try {
    return JSON.parse(store.getItem(key));
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
    this.markTimer = null;
    addEventListener('pagehide', () => this.release());
  }

  key(code) {
    return `${this.prefix}${code}`;
  }

  /** A stored session no live tab holds, still known to the relay; else a new one. */
  async open() {
    if (!this.remember) return { session: await this.create(), restored: false };
    const now = Date.now();
    const candidates = [];
    for (let i = 0; i < store.length; i += 1) {
      const key = store.key(i);
      if (!key || !key.startsWith(this.prefix)) continue;
      const stored = read(key);
      if (!stored || !stored.code || !stored.token || Date.parse(stored.expiresAt) <= now) {
        store.removeItem(key);
        continue;
      }
      const heldElsewhere = stored.tab && stored.tab !== TAB && now - (stored.markedAt || 0) < MARK_STALE_MS;
      if (!heldElsewhere) candidates.push(stored);
    }
    candidates.sort((a, b) => (b.createdAt || 0) - (a.createdAt || 0));
    for (const stored of candidates) {
      // With its provider token: no API key is needed, and the brute-force guard never
      // refuses the session's own tab.
      const status = await fetch(`${this.base}/api/sessions/${stored.code}`, {
        headers: { Authorization: `Bearer ${stored.token}` },
      }).catch(() => null);
      if (status && status.ok) {
        const info = await status.json();
        this.hold({ ...stored, expiresAt: info.expiresAt, maxExpiresAt: info.maxExpiresAt ?? stored.maxExpiresAt });
        return { session: this.current, restored: true };
      }
      if (status && status.status === 404) store.removeItem(this.key(stored.code));
    }
    return { session: await this.create(), restored: false };
  }

  /**
   * The session `claim` names: the one this browser already redeemed it for (still known to
   * the relay), else redeemed now. Throws ClaimRefused when the relay refuses the claim, or
   * when the session it once opened has ended.
   */
  async openClaim(claim) {
    forgetSpentClaims();
    const key = await claimKey(claim);
    const record = read(key);
    if (record?.code) {
      const stored = read(this.key(record.code));
      if (stored?.token) {
        const status = await fetch(`${this.base}/api/sessions/${stored.code}`, {
          headers: { Authorization: `Bearer ${stored.token}` },
        });
        if (status.ok) {
          const info = await status.json();
          // The claim names this session: a render of the app still holding it gives way.
          this.hold({ ...stored, expiresAt: info.expiresAt, maxExpiresAt: info.maxExpiresAt ?? stored.maxExpiresAt });
          return { session: this.current, restored: true };
        }
        if (status.status !== 404) throw new Error((await refusal(status)).message);
        store.removeItem(this.key(stored.code));
      }
      store.removeItem(key);
      throw new ClaimRefused(ErrorCode.SESSION_NOT_FOUND, 'The session your assistant opened for this page has ended. Ask your assistant to open it again.');
    }
    const response = await fetch(`${this.base}/api/sessions/claim`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ claim }),
    });
    if (!response.ok) {
      const { code, message } = await refusal(response);
      // Without storage a page loaded again cannot know the session its claim opened.
      if (!persistent && code === ErrorCode.CLAIM_USED) {
        throw new ClaimRefused(code, 'This browser keeps no storage for pages embedded in another site, so this page could not remember the session your assistant opened for it. Ask your assistant to open it again.');
      }
      throw new ClaimRefused(code, message);
    }
    this.hold({ ...this.created(await response.json()), claimed: true });
    if (this.remember) {
      const until = this.current.maxExpiresAt || new Date(Date.now() + 86400000).toISOString();
      store.setItem(key, JSON.stringify({ code: this.current.code, expiresAt: until }));
    }
    return { session: this.current, restored: false };
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

  /** Holds a session: stores it with this tab's mark, refreshed while the tab lives. */
  hold(session) {
    this.current = session;
    this.mark();
    clearInterval(this.markTimer);
    this.markTimer = setInterval(() => this.mark(), MARK_EVERY_MS);
  }

  mark() {
    if (!this.current || !this.remember) return;
    store.setItem(this.key(this.current.code), JSON.stringify({ ...this.current, tab: TAB, markedAt: Date.now() }));
  }

  /** Leaves the stored session for the next page (a reload) to pick up at once. */
  release() {
    if (!this.current || !this.remember) return;
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
    store.removeItem(this.key(this.current.code));
    this.current = null;
  }
}
