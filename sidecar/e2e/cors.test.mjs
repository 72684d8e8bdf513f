// CORS on the REST broadcast routes, as a browser enforces it: headless Chromium loads a page
// from one port and realtime-js in the page calls `channel.httpSend()` (and `channel.send()`
// before joining, the batch route) against the sidecar on another port. Both carry `apikey`,
// `Authorization` and a JSON content type, so the browser sends a preflight first and posts
// only if the sidecar's answer names the page's origin. A subscriber here sees what arrived.
// Needs SIDECAR_BIN, PG_REALTIME_TEST_DSN and the built web bundle (sidecar/web/dist).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import WebSocket from 'ws';
import { RealtimeClient } from '@supabase/realtime-js';
import { anonClaims, close, freePort, jwt, launchChromium, startSidecar, stopAndDrop, subscribed, waitFor } from './harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const SECRET = 'cors-test-secret-with-enough-length-for-hs256';
const apikey = jwt(SECRET, anonClaims());
const bundle = fs.readFileSync(path.join(here, '../web/dist/realtime_client.bundle.js'));

let browser;
const sidecars = [];
const pageServers = [];

/// A page server on a port of its own: an empty page and realtime-js as one module.
async function pageOrigin() {
  const server = http.createServer((req, res) => {
    if (req.url === '/realtime_client.bundle.js') {
      res.writeHead(200, { 'content-type': 'text/javascript' }).end(bundle);
    } else {
      res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><title>another origin</title>');
    }
  });
  const port = await freePort();
  await new Promise((resolve) => server.listen(port, '127.0.0.1', resolve));
  pageServers.push(server);
  return `http://127.0.0.1:${port}`;
}

async function sidecar(consumer, env = {}) {
  const s = await startSidecar(SECRET, consumer, env);
  sidecars.push({ process: s.process, consumer });
  return s.port;
}

/// Opens `origin` in a new page and runs realtime-js there: `httpSend` on `topic`, then a
/// `send` on an unjoined channel (the REST batch route). Returns what each call gave the app.
async function sendFromPage(origin, sidecarPort, topic, n) {
  const page = await browser.newPage();
  try {
    await page.goto(`${origin}/`);
    return await page.evaluate(
      async ({ url, apikey, topic, n }) => {
        const { RealtimeClient } = await import('/realtime_client.bundle.js');
        const client = new RealtimeClient(url, { params: { apikey } });
        const channel = client.channel(topic);
        const outcome = (p) => p.then((v) => JSON.stringify(v), (e) => `rejected: ${e.message}`);
        const single = await outcome(channel.httpSend('from-page', { n, route: 'single' }));
        const batch = await outcome(channel.send({ type: 'broadcast', event: 'from-page', payload: { n, route: 'batch' } }));
        return { single, batch };
      },
      { url: `ws://127.0.0.1:${sidecarPort}/realtime/v1`, apikey, topic, n },
    );
  } finally {
    await page.close();
  }
}

/// A realtime-js subscriber (in Node) collecting the topic's `from-page` broadcasts.
async function subscriber(port, topic) {
  const client = new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  await client.setAuth(apikey);
  const got = [];
  const channel = client.channel(topic).on('broadcast', { event: 'from-page' }, (m) => got.push(m.payload));
  await subscribed(channel);
  return { client, got };
}

before(async () => {
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  for (const s of pageServers) s.close();
  await stopAndDrop(sidecars);
});

test('by default (any origin, as Supabase) a page on another port sends with httpSend and the batch route', async () => {
  const port = await sidecar('cors_any_e2e');
  const origin = await pageOrigin();
  const topic = `cors-any-${Date.now()}`;
  const { client, got } = await subscriber(port, topic);
  try {
    const outcome = await sendFromPage(origin, port, topic, 1);
    assert.deepEqual(outcome, { single: '{"success":true}', batch: '"ok"' });
    await waitFor(() => got.length === 2, 10000, 'both messages from the page');
    assert.deepEqual(got.map((p) => p.route).sort(), ['batch', 'single']);
  } finally {
    await close(client);
  }
});

test('with CORS_ALLOWED_ORIGINS, a listed origin sends and an unlisted one is stopped by the browser', async () => {
  const allowed = await pageOrigin();
  const other = await pageOrigin();
  const port = await sidecar('cors_list_e2e', { CORS_ALLOWED_ORIGINS: `https://app.example.com,${allowed}` });
  const topic = `cors-list-${Date.now()}`;
  const { client, got } = await subscriber(port, topic);
  try {
    // The browser's preflight gets no allow header, so it never posts: httpSend rejects with
    // the browser's network error, and the batch send reports an error.
    const refused = await sendFromPage(other, port, topic, 1);
    assert.match(refused.single, /^rejected: Failed to fetch$/, refused.single);
    assert.notEqual(refused.batch, '"ok"', refused.batch);
    const sent = await sendFromPage(allowed, port, topic, 2);
    assert.deepEqual(sent, { single: '{"success":true}', batch: '"ok"' });
    await waitFor(() => got.length === 2, 10000, "both messages from the listed origin's page");
    // One topic, one order: had the refused page's messages been posted, they would have
    // arrived before these.
    assert.deepEqual(got.map((p) => p.n), [2, 2]);
  } finally {
    await close(client);
  }
});

test('the preflight and the answer carry the headers a browser reads, under both prefixes', async () => {
  const origin = 'http://127.0.0.1:1';
  const port = await sidecar('cors_headers_e2e', { CORS_ALLOWED_ORIGINS: origin });
  const ask = { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'apikey,authorization,content-type' };
  for (const p of ['/api/broadcast', '/realtime/v1/api/broadcast', '/realtime/v1/api/broadcast/room%201/events/e']) {
    const pre = await fetch(`http://127.0.0.1:${port}${p}`, { method: 'OPTIONS', headers: ask });
    assert.equal(pre.status, 204, p);
    assert.equal(pre.headers.get('access-control-allow-origin'), origin, p);
    assert.equal(pre.headers.get('access-control-allow-headers'), 'apikey,authorization,content-type', p);
    assert.match(pre.headers.get('access-control-allow-methods'), /POST/, p);
    assert.equal(pre.headers.get('vary'), 'Origin', p);
    const denied = await fetch(`http://127.0.0.1:${port}${p}`, { method: 'OPTIONS', headers: { ...ask, origin: 'http://127.0.0.1:2' } });
    assert.equal(denied.headers.get('access-control-allow-origin'), null, p);
    assert.equal(denied.headers.get('access-control-allow-methods'), null, p);
  }
  // An error answer carries the allow header too, so the page can read why.
  const unauthorized = await fetch(`http://127.0.0.1:${port}/api/broadcast`, { method: 'POST', headers: { origin }, body: '{}' });
  assert.equal(unauthorized.status, 401);
  assert.equal(unauthorized.headers.get('access-control-allow-origin'), origin);
  // Other paths are not REST broadcast routes and get no CORS headers.
  const health = await fetch(`http://127.0.0.1:${port}/healthz`, { headers: { origin } });
  assert.equal(health.headers.get('access-control-allow-origin'), null);
});
