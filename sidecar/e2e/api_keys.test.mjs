// Supabase's opaque API keys without its gateway: SUPABASE_PUBLISHABLE_KEY and
// SUPABASE_SECRET_KEY stand for the anon and service_role keys' claims; realtime-js uses the
// publishable key as supabase-js hands it over (the socket's apikey and, with no user
// signed in, every join's access_token), and Supabase's own two `sb_` token cases hold.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import WebSocket from 'ws';
import * as jose from 'jose';
import { RealtimeClient } from '@supabase/realtime-js';
import { close, database, jwt, startSidecar, stopAndDrop, subscribed, upgrade as upgradeOn, waitFor, withTimeout } from './harness.mjs';

const SECRET = 'a-legacy-secret-with-32-characters-or-more';
const PUBLISHABLE = 'sb_publishable_e2e-publishable-key-0123456789';
const SECRET_KEY = 'sb_secret_e2e-secret-key-0123456789abcdef';
const MEMBER = '88888888-8888-4888-8888-888888888888';

let ec; // the ES256 key pair user sessions are signed with
let sidecar;
let db;

const upgrade = (apikey, headers) => upgradeOn(sidecar.port, apikey, headers);
const exp = (s = 3600) => Math.floor(Date.now() / 1000) + s;

/// A raw 1.0.0 socket: send(obj), and next(pred) resolving with the first frame it matches.
async function raw(apikey) {
  const ws = new WebSocket(`ws://127.0.0.1:${sidecar.port}/realtime/v1/websocket?apikey=${encodeURIComponent(apikey)}&vsn=1.0.0`);
  const frames = [];
  ws.on('message', (m) => frames.push(JSON.parse(m.toString())));
  await withTimeout(new Promise((r, j) => { ws.once('open', r); ws.once('error', j); }), 10000, 'open');
  return {
    ws,
    send: (o) => ws.send(JSON.stringify(o)),
    next: async (pred, ms = 10000) => {
      await waitFor(() => frames.some(pred), ms, 'a frame');
      return frames.find(pred);
    },
  };
}

before(async () => {
  ec = await jose.generateKeyPair('ES256', { extractable: true });
  const jwks = JSON.stringify({ keys: [{ ...(await jose.exportJWK(ec.publicKey)), kid: 'ec-1', alg: 'ES256', use: 'sig' }] });
  sidecar = {
    ...(await startSidecar(SECRET, 'api_keys_e2e', { API_JWT_JWKS: jwks, SUPABASE_PUBLISHABLE_KEY: `sb_publishable_another-key-0123456789, ${PUBLISHABLE}`, SUPABASE_SECRET_KEY: SECRET_KEY })),
    consumer: 'api_keys_e2e',
  };
  db = await database();
  for (const f of ['../../pgbench/supabase_auth.sql', '../tests/private_policies.sql']) {
    await db.query(fs.readFileSync(new URL(f, import.meta.url), 'utf8'));
  }
  await db.query("DELETE FROM private_members WHERE room = 'room:sb-keys'");
  await db.query("INSERT INTO private_members VALUES ($1, 'room:sb-keys', false)", [MEMBER]);
});

after(async () => {
  await db?.end();
  if (sidecar) await stopAndDrop([sidecar]);
});

for (const vsn of ['1.0.0', '2.0.0']) {
  test(`realtime-js (${vsn}) with a publishable key: anonymous on a public channel, then signed in with an ES256 session on a private one`, async () => {
    const client = new RealtimeClient(`ws://127.0.0.1:${sidecar.port}/realtime/v1`, { transport: WebSocket, params: { apikey: PUBLISHABLE }, vsn });
    try {
      // As supabase-js with nobody signed in: the publishable key is the access token too.
      await client.setAuth(PUBLISHABLE);
      const open = client.channel(`sb-public-${vsn}`, { config: { private: false } });
      const got = new Promise((resolve) => open.on('broadcast', { event: 'hi' }, resolve));
      await subscribed(open);
      await db.query(`SELECT realtime.send('{"n": 1}', 'hi', $1, false)`, [`sb-public-${vsn}`]);
      assert.equal((await withTimeout(got, 10000, 'public broadcast')).payload.n, 1);
      const session = await new jose.SignJWT({ role: 'authenticated', sub: MEMBER, exp: exp() })
        .setProtectedHeader({ alg: 'ES256', kid: 'ec-1' })
        .sign(ec.privateKey);
      await client.setAuth(session);
      const closed = client.channel('room:sb-keys', { config: { private: true } });
      const secret = new Promise((resolve) => closed.on('broadcast', { event: 's' }, resolve));
      await subscribed(closed);
      await db.query(`SELECT realtime.send('{"n": 2}', 's', 'room:sb-keys')`);
      assert.equal((await withTimeout(secret, 10000, 'private broadcast')).payload.n, 2);
    } finally {
      await close(client);
    }
  });
}

test('a join whose access_token is an sb_ key uses the socket\'s token (Supabase: "valid api-header but ignorable access_token payload")', async () => {
  const s = await raw(jwt(SECRET, { role: 'authenticated', sub: MEMBER, exp: exp() }));
  try {
    s.send({ topic: 'realtime:room:sb-keys', event: 'phx_join', ref: '1', join_ref: '1',
      payload: { config: { private: true }, access_token: 'sb_publishable_whatever' } });
    const reply = await s.next((f) => f.event === 'phx_reply' && f.ref === '1');
    assert.equal(reply.payload.status, 'ok', JSON.stringify(reply));
  } finally {
    s.ws.close();
  }
});

test('an sb_ access_token push is ignored and the channel still closes when the socket\'s token expires (Supabase: "respects JWT expiry time")', async () => {
  const s = await raw(jwt(SECRET, { role: 'anon', exp: exp(3) }));
  try {
    s.send({ topic: 'realtime:sb-expiry', event: 'phx_join', ref: '1', join_ref: '1', payload: { config: {} } });
    assert.equal((await s.next((f) => f.ref === '1')).payload.status, 'ok');
    s.send({ topic: 'realtime:sb-expiry', event: 'access_token', ref: '2', join_ref: '1', payload: { access_token: 'sb_publishable_whatever' } });
    const system = await s.next((f) => f.event === 'system' && f.payload.status === 'error', 15000);
    assert.match(system.payload.message, /Token has expired/);
    await s.next((f) => f.event === 'phx_close', 5000);
  } finally {
    s.ws.close();
  }
});

test('a secret key is the service_role\'s, refused from a browser; an unknown sb_ key is refused', async () => {
  assert.equal((await upgrade(SECRET_KEY)).status, 101);
  const browser = await upgrade(SECRET_KEY, { origin: 'https://app.example' });
  assert.equal(browser.status, 401);
  assert.match(browser.reason, /^InvalidAPIKey: A secret API key \(sb_secret_\) cannot be used from a browser/);
  assert.equal((await upgrade(PUBLISHABLE, { origin: 'https://app.example' })).status, 101);
  const unknown = await upgrade('sb_publishable_not-one-of-this-project');
  assert.equal(unknown.status, 401);
  assert.equal(unknown.reason, 'InvalidAPIKey: The API key provided is not a key of this project');
  assert.ok(!unknown.reason.includes('not-one-of'), 'a key is never echoed');
  // The secret key's role joins a private channel no policy lets anon read.
  const s = await raw(SECRET_KEY);
  try {
    s.send({ topic: 'realtime:room:sb-keys', event: 'phx_join', ref: '1', join_ref: '1', payload: { config: { private: true } } });
    assert.equal((await s.next((f) => f.ref === '1')).payload.status, 'ok');
  } finally {
    s.ws.close();
  }
  const anon = await raw(PUBLISHABLE);
  try {
    anon.send({ topic: 'realtime:room:sb-keys', event: 'phx_join', ref: '1', join_ref: '1', payload: { config: { private: true } } });
    assert.equal((await anon.next((f) => f.ref === '1')).payload.status, 'error');
  } finally {
    anon.ws.close();
  }
});

test('REST takes sb_ keys as apikey and Bearer', async () => {
  const body = JSON.stringify({ messages: [{ topic: 'sb-rest', event: 'e', payload: { n: 1 } }] });
  const post = (headers) =>
    fetch(`http://127.0.0.1:${sidecar.port}/realtime/v1/api/broadcast`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  assert.equal((await post({ apikey: PUBLISHABLE })).status, 202);
  assert.equal((await post({ authorization: `Bearer ${SECRET_KEY}` })).status, 202);
  assert.equal((await post({ apikey: 'sb_secret_not-one-of-this-project-at-all' })).status, 401);
  assert.equal((await post({ authorization: `Bearer ${SECRET_KEY}`, origin: 'https://app.example' })).status, 401);
});
