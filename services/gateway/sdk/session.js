// The pairing session: created on load, kept in localStorage under `<prefix><code>` (the CODAP
// plugin's prefix is `mcp-session-`) so a reload reconnects to it, and never taken over by a
// second tab of the same page (each tab marks the session it holds and refreshes that mark; a
// session marked by a live tab is left alone).
const MARK_EVERY_MS = 2000;
// A mark older than this belongs to a tab that is gone.
const MARK_STALE_MS = 6000;

/** A random id of 16 hex digits. */
export function randomId() {
  const bytes = new Uint8Array(8);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

const TAB = randomId();

function read(key) {
  try {
    return JSON.parse(localStorage.getItem(key));
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
    for (let i = 0; i < localStorage.length; i += 1) {
      const key = localStorage.key(i);
      if (!key || !key.startsWith(this.prefix)) continue;
      const stored = read(key);
      if (!stored || !stored.code || !stored.token || Date.parse(stored.expiresAt) <= now) {
        localStorage.removeItem(key);
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
      if (status && status.status === 404) localStorage.removeItem(this.key(stored.code));
    }
    return { session: await this.create(), restored: false };
  }

  async create() {
    const response = await fetch(`${this.base}/api/sessions`, { method: 'POST' });
    const body = await response.json();
    if (!response.ok) throw new Error(body.message || `The relay answered ${response.status}.`);
    this.hold({
      code: body.code,
      token: body.providerToken,
      expiresAt: body.expiresAt,
      maxExpiresAt: body.maxExpiresAt || null,
      connectorUrl: body.connectorUrl || null,
      createdAt: Date.now(),
    });
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
    localStorage.setItem(this.key(this.current.code), JSON.stringify({ ...this.current, tab: TAB, markedAt: Date.now() }));
  }

  /** Leaves the stored session for the next page (a reload) to pick up at once. */
  release() {
    if (!this.current || !this.remember) return;
    clearInterval(this.markTimer);
    localStorage.setItem(this.key(this.current.code), JSON.stringify({ ...this.current, tab: null, markedAt: 0 }));
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
    localStorage.removeItem(this.key(this.current.code));
    this.current = null;
  }
}
