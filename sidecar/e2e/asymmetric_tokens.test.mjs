// Tokens as today's Supabase signs them: asymmetric keys in a static JWKS (API_JWT_JWKS),
// chosen by the key type the token's `alg` requires and its `kid`. Every key and token here
// is made by npm `jose`, not by the sidecar's verifier; realtime-js connects and joins with
// them as an app on Supabase's JWT signing keys does.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import WebSocket from 'ws';
import * as jose from 'jose';
import { RealtimeClient } from '@supabase/realtime-js';
import { close, database, startSidecar, stopAndDrop, subscribed, upgrade, withTimeout } from './harness.mjs';

const SECRET = 'a-legacy-secret-with-32-characters-or-more';
const OCT = 'an-oct-key-of-the-jwks-with-32-bytes-or-more';
const MEMBER = '77777777-7777-4777-8777-777777777777';

let keys; // { ec, rsa, ed }: key pairs
let both; // a sidecar with API_JWT_SECRET and API_JWT_JWKS
let jwksOnly; // a sidecar with API_JWT_JWKS alone
let db;

const exp = () => Math.floor(Date.now() / 1000) + 3600;
const anon = () => ({ role: 'anon', iss: 'supabase', exp: exp() });

/// A token of `claims` signed by `key` with `alg` and `kid` (jose's own encoding: ES256
/// signatures in JOSE's raw r‖s form).
function sign(claims, alg, key, kid) {
  const header = kid === undefined ? { alg, typ: 'JWT' } : { alg, kid, typ: 'JWT' };
  return new jose.SignJWT(claims).setProtectedHeader(header).sign(key);
}
const hmac = (text) => new TextEncoder().encode(text);

/// An HS256 token signed with an empty key, which jose refuses to make: by hand, with Node's
/// HMAC.
function signedWithNothing(claims, kid) {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const body = `${b64(kid === undefined ? { alg: 'HS256' } : { alg: 'HS256', kid })}.${b64(claims)}`;
  return `${body}.${crypto.createHmac('sha256', '').update(body).digest('base64url')}`;
}

before(async () => {
  keys = {
    ec: await jose.generateKeyPair('ES256', { extractable: true }),
    rsa: await jose.generateKeyPair('RS256', { extractable: true }),
    ed: await jose.generateKeyPair('EdDSA', { crv: 'Ed25519', extractable: true }),
  };
  const jwk = async (pair, kid, alg) => ({ ...(await jose.exportJWK(pair.publicKey)), kid, alg, use: 'sig' });
  const jwks = JSON.stringify({
    keys: [
      await jwk(keys.ec, 'ec-1', 'ES256'),
      await jwk(keys.rsa, 'rsa-1', 'RS256'),
      await jwk(keys.ed, 'ed-1', 'EdDSA'),
      { kty: 'oct', kid: 'oct-1', k: Buffer.from(OCT).toString('base64url') },
    ],
  });
  both = { ...(await startSidecar(SECRET, 'asymmetric_e2e', { API_JWT_JWKS: jwks })), consumer: 'asymmetric_e2e' };
  jwksOnly = { ...(await startSidecar(null, 'asymmetric_only_e2e', { API_JWT_JWKS: jwks })), consumer: 'asymmetric_only_e2e' };
  db = await database();
  for (const f of ['../../pgbench/supabase_auth.sql', '../tests/private_policies.sql']) {
    await db.query(fs.readFileSync(new URL(f, import.meta.url), 'utf8'));
  }
  await db.query("DELETE FROM private_members WHERE room = 'room:es256'");
  await db.query("INSERT INTO private_members VALUES ($1, 'room:es256', false)", [MEMBER]);
});

after(async () => {
  await db?.end();
  await stopAndDrop([both, jwksOnly].filter(Boolean));
});

for (const vsn of ['1.0.0', '2.0.0']) {
  test(`realtime-js (${vsn}) connects with an ES256 anon key and joins a private channel with an ES256 session`, async () => {
    const apikey = await sign(anon(), 'ES256', keys.ec.privateKey, 'ec-1');
    const session = await sign({ role: 'authenticated', sub: MEMBER, aud: 'authenticated', exp: exp() }, 'ES256', keys.ec.privateKey, 'ec-1');
    const client = new RealtimeClient(`ws://127.0.0.1:${both.port}/realtime/v1`, { transport: WebSocket, params: { apikey }, vsn });
    try {
      await client.setAuth(session);
      const channel = client.channel('room:es256', { config: { private: true } });
      const got = new Promise((resolve) => channel.on('broadcast', { event: 'hi' }, resolve));
      await subscribed(channel);
      await db.query(`SELECT realtime.send('{"n": 1}', 'hi', 'room:es256')`);
      assert.equal((await withTimeout(got, 10000, 'private broadcast')).payload.n, 1);
    } finally {
      await close(client);
    }
  });
}

test('RS256 and EdDSA keys verify their tokens; a wrong or unknown kid is refused with Supabase\'s signer text', async () => {
  const ok = [
    await sign(anon(), 'RS256', keys.rsa.privateKey, 'rsa-1'),
    await sign(anon(), 'EdDSA', keys.ed.privateKey, 'ed-1'),
    await sign(anon(), 'ES256', keys.ec.privateKey, 'ec-1'),
  ];
  for (const apikey of ok) assert.equal((await upgrade(both.port, apikey)).status, 101, apikey);
  const refused = [
    // An ES256 token naming the RSA key: no EC key has that kid.
    [await sign(anon(), 'ES256', keys.ec.privateKey, 'rsa-1'), 'rsa-1'],
    [await sign(anon(), 'RS256', keys.rsa.privateKey, 'nobody'), 'nobody'],
    // The right key type and kid, signed by another key.
    [await sign(anon(), 'EdDSA', (await jose.generateKeyPair('EdDSA', { crv: 'Ed25519' })).privateKey, 'ed-1'), null],
  ];
  for (const [apikey, kid] of refused) {
    const { status, reason } = await upgrade(both.port, apikey);
    assert.equal(status, 401);
    if (kid) {
      assert.match(reason, new RegExp(`JwtSignerError: Failed to generate JWT signer for key ID \\(kid\\) "${kid}", check your JWT secret or JWKS configuration`));
    } else {
      assert.match(reason, /JwtSignatureError: Failed to validate JWT signature/);
    }
  }
});

test('HS256 takes the oct key its kid names, else the secret; RS256 never takes the oct key', async () => {
  const accepted = [
    await sign(anon(), 'HS256', hmac(OCT), 'oct-1'),
    // Supabase Auth's legacy tokens carry a kid the set has no oct key for.
    await sign(anon(), 'HS256', hmac(SECRET), 'ec-1'),
    await sign(anon(), 'HS256', hmac(SECRET)),
    // A decimal exp, as the JWT spec allows.
    await sign({ role: 'anon', exp: exp() + 0.5 }, 'HS256', hmac(SECRET)),
  ];
  for (const apikey of accepted) assert.equal((await upgrade(both.port, apikey)).status, 101, apikey);
  const rsOct = await sign(anon(), 'RS256', keys.rsa.privateKey, 'oct-1');
  const { status, reason } = await upgrade(both.port, rsOct);
  assert.equal(status, 401);
  assert.match(reason, /JwtSignerError: .*"oct-1"/);
  assert.equal((await upgrade(both.port, await sign(anon(), 'HS256', hmac(SECRET), 'oct-1'))).status, 401);
});

test('without API_JWT_SECRET an HS256 token is verified only by an oct key its kid names', async () => {
  for (const apikey of [signedWithNothing(anon()), signedWithNothing(anon(), 'ec-1'), await sign(anon(), 'HS256', hmac(SECRET))]) {
    const { status, reason } = await upgrade(jwksOnly.port, apikey);
    assert.equal(status, 401, apikey);
    assert.match(reason, /JwtSignerError/);
  }
  assert.equal((await upgrade(jwksOnly.port, await sign(anon(), 'HS256', hmac(OCT), 'oct-1'))).status, 101);
  assert.equal((await upgrade(jwksOnly.port, await sign(anon(), 'ES256', keys.ec.privateKey, 'ec-1'))).status, 101);
});

test('a Kong-style x-api-key is read before the apikey query parameter', async () => {
  const translated = await sign({ role: 'anon', iss: 'supabase', exp: exp() }, 'ES256', keys.ec.privateKey, 'ec-1');
  // Kong puts the ES256 key in x-api-key; the query may still hold what the app sent.
  const { status } = await upgrade(both.port, 'sb_publishable_not-a-jwt', { 'x-api-key': translated });
  assert.equal(status, 101);
  const { status: wrong } = await upgrade(both.port, translated, { 'x-api-key': 'garbage' });
  assert.equal(wrong, 401, 'x-api-key wins over the query parameter');
});

test('REST takes an ES256 token as apikey and as Bearer', async () => {
  const service = await sign({ role: 'service_role', iss: 'supabase', exp: exp() }, 'ES256', keys.ec.privateKey, 'ec-1');
  const body = JSON.stringify({ messages: [{ topic: 'rest-es256', event: 'e', payload: { n: 1 } }] });
  const post = (headers) =>
    fetch(`http://127.0.0.1:${both.port}/realtime/v1/api/broadcast`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  assert.equal((await post({ apikey: service })).status, 202);
  assert.equal((await post({ authorization: `Bearer ${service}` })).status, 202);
  const other = await sign({ role: 'service_role', exp: exp() }, 'ES256', (await jose.generateKeyPair('ES256')).privateKey, 'ec-1');
  assert.equal((await post({ apikey: other })).status, 401);
});
