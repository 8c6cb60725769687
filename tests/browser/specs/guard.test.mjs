// A web page on another site cannot spend its visitors' budget of unknown codes (and so block
// them, and everyone behind their NAT, from their own sessions): a page served from
// http://localhost:P makes the visitor's Chromium load images of random codes from the relay
// on http://127.0.0.1:Q, fetch them with no-cors and frame them. The relay refuses each before
// any look-up (Fetch Metadata: Sec-Fetch-Site cross-site, mode no-cors / navigate), counts
// them, and the visitor's own code still answers.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { eventually, launchBrowser, startPageHost, startRelay } from '../harness.mjs';

// Far fewer than the page's requests: any of them counted would block the address.
const LOOKUPS_PER_MINUTE = 5;
const IMAGES = 40;
const FETCHES = 20;
const FRAMES = 5;

const ATTACK = `<!doctype html><title>A page on another site</title><body><script>
const relay = new URLSearchParams(location.search).get('relay');
const code = (n) => 'ZZ' + String(n).split('').map((d) => 'ABCDEFGHJK'[Number(d)]).join('').padStart(6, 'Q');
const done = [];
for (let n = 0; n < ${IMAGES}; n += 1) {
  const image = new Image();
  done.push(new Promise((resolve) => { image.onload = image.onerror = resolve; }));
  image.src = relay + '/api/sessions/' + code(n) + '/metadata';
  document.body.append(image);
}
for (let n = 0; n < ${FETCHES}; n += 1) {
  done.push(fetch(relay + '/metadata?code=' + code(100 + n), { mode: 'no-cors' }).catch(() => null));
}
for (let n = 0; n < ${FRAMES}; n += 1) {
  const frame = document.createElement('iframe');
  done.push(new Promise((resolve) => { frame.onload = frame.onerror = resolve; }));
  frame.src = relay + '/api/sessions/' + code(200 + n);
  document.body.append(frame);
}
window.attacked = Promise.all(done).then(() => true);
</script></body>`;

let relay;
let pages;
let browser;

before(async () => {
  relay = await startRelay({ RATE_LIMIT_LOOKUP_PER_IP: String(LOOKUPS_PER_MINUTE) });
  pages = await startPageHost({ '/attack.html': ATTACK });
  browser = await launchBrowser();
});
after(async () => {
  await browser?.close();
  await pages?.stop();
  await relay?.stop();
});

/** The relay's count of requests refused by the Fetch Metadata policy. */
async function refusedCrossSite() {
  const page = await (await fetch(`${relay.base}/metrics`)).text();
  const line = page.split('\n').find((l) => l.startsWith('toolrelay_refused_total{reason="fetch_metadata"}'));
  return Number(line?.split(' ').pop() ?? 0);
}

test("a cross-site page's images, no-cors fetches and frames of random codes spend nothing; the visitor's code still works", async () => {
  const created = await fetch(`${relay.base}/api/sessions`, { method: 'POST' });
  assert.equal(created.status, 201);
  const { code } = await created.json();
  const before = await refusedCrossSite();

  // The relay is on 127.0.0.1, the page on localhost: another site to the browser.
  const port = new URL(pages.origin).port;
  const page = await browser.newPage();
  await page.goto(`http://localhost:${port}/attack.html?relay=${encodeURIComponent(relay.base)}`);
  await page.evaluate(() => window.attacked);
  const refused = await eventually(
    async () => {
      const now = (await refusedCrossSite()) - before;
      return now >= IMAGES + FETCHES + FRAMES && now;
    },
    'every cross-site request to be refused',
  );
  assert.equal(refused, IMAGES + FETCHES + FRAMES);
  await page.close();

  // Nothing was counted against the visitor's address: their own code answers, no 429.
  for (const path of [`/api/sessions/${code}/metadata`, `/metadata?code=${code}`, `/api/sessions/${code}`]) {
    const response = await fetch(`${relay.base}${path}`);
    assert.equal(response.status, 200, `${path}: ${await response.text()}`);
  }
  // And an unknown code is still a plain 404 (the budget is whole), not a 429.
  const unknown = await fetch(`${relay.base}/api/sessions/ZZZZ-QQQQ/metadata`);
  assert.equal(unknown.status, 404);
});
