// Supabase's "Allow public access" off (PRIVATE_ONLY), with the official realtime-js: a public
// channel is refused with Supabase's reason, a private one the policies allow joins.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import WebSocket from 'ws';
import { RealtimeClient } from '@supabase/realtime-js';
import { anonClaims, close, database, jwt, startSidecar, subscribed } from './harness.mjs';

const SECRET = 'test-secret-with-at-least-32-characters';
const apikey = jwt(SECRET, anonClaims());
const MEMBER = '66666666-6666-4666-8666-666666666666';

let db;
before(async () => {
  db = await database();
  for (const f of ['../../pgbench/supabase_auth.sql', '../tests/private_policies.sql']) {
    await db.query(fs.readFileSync(new URL(f, import.meta.url), 'utf8'));
  }
});
after(async () => {
  await db?.end();
});

test('PRIVATE_ONLY refuses a public channel with Supabase\'s reason and admits a private one', async () => {
  const { process: sidecar, port } = await startSidecar(SECRET, 'private_only', { PRIVATE_ONLY: 'true' });
  const topic = `private-only-${Date.now()}`;
  await db.query('INSERT INTO private_members VALUES ($1, $2, false)', [MEMBER, topic]);
  const c = new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  try {
    await c.setAuth(jwt(SECRET, { role: 'authenticated', sub: MEMBER, exp: Math.floor(Date.now() / 1000) + 3600 }));
    const open = c.channel(topic, { config: { private: false } });
    const err = await subscribed(open).then(() => null, (e) => e);
    assert.ok(err, 'the public channel was admitted');
    assert.match(err.message, /PrivateOnly: This project only allows private channels/);
    await c.removeChannel(open);
    await subscribed(c.channel(topic, { config: { private: true } }));
  } finally {
    await close(c);
    sidecar.kill('SIGTERM');
  }
});
