// End to end with the official @supabase/realtime-js client (pinned in package.json), run
// under Node with the `ws` transport, against a real sidecar and a real Postgres.
// Needs SIDECAR_BIN and PG_REALTIME_TEST_DSN (scripts/test.sh sets both).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import WebSocket from 'ws';
import { RealtimeClient } from '@supabase/realtime-js';
import { anonClaims, close, database, jwt, startSidecar, subscribed, withTimeout } from './harness.mjs';

const SECRET = 'test-secret-with-at-least-32-characters';
const apikey = jwt(SECRET, anonClaims());

let sidecar;
let port;
let db;

before(async () => {
  ({ process: sidecar, port } = await startSidecar(SECRET, 'realtime_js_e2e'));
  db = await database();
  await db.query(`CREATE TABLE IF NOT EXISTS js_rooms (id serial PRIMARY KEY, room text NOT NULL, body text);
                  DROP TRIGGER IF EXISTS js_rooms_bc ON js_rooms;
                  CREATE TRIGGER js_rooms_bc AFTER INSERT OR UPDATE OR DELETE ON js_rooms
                    FOR EACH ROW EXECUTE FUNCTION realtime.broadcast_trigger('room:{room}', '', 'false')`);
});

after(async () => {
  await db?.end();
  sidecar?.kill('SIGTERM');
});

async function subscribe(vsn, topic) {
  const client = new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey }, vsn });
  await client.setAuth(apikey);
  const channel = client.channel(topic, { config: { private: false } });
  return { client, channel };
}

/// Supabase's auth helpers and the private-channel policies the Rust tests use too.
async function loadPolicies() {
  for (const f of ['../../pgbench/supabase_auth.sql', '../tests/private_policies.sql']) {
    await db.query(fs.readFileSync(new URL(f, import.meta.url), 'utf8'));
  }
}

for (const vsn of ['1.0.0', '2.0.0']) {
  test(`realtime-js (${vsn}) receives a trigger's broadcast`, async () => {
    const room = `js-${vsn}-${Date.now()}`;
    const { client, channel } = await subscribe(vsn, `room:${room}`);
    try {
      const got = new Promise((resolve) => channel.on('broadcast', { event: 'INSERT' }, resolve));
      await subscribed(channel);
      const { rows } = await db.query('INSERT INTO js_rooms (room, body) VALUES ($1, $2) RETURNING id', [room, 'hello']);
      const msg = await withTimeout(got, 10000, 'broadcast');
      assert.equal(msg.type, 'broadcast');
      assert.equal(msg.event, 'INSERT');
      assert.deepEqual(msg.payload.record, { id: rows[0].id, room, body: 'hello' });
      assert.equal(msg.payload.operation, 'INSERT');
      assert.equal(msg.payload.table, 'js_rooms');
      assert.equal(msg.payload.old_record, null);
      assert.equal(msg.meta.id, msg.payload.id);
    } finally {
      await close(client);
    }
  });

  test(`realtime-js (${vsn}) receives realtime.send messages in order`, async () => {
    const topic = `ordered-${vsn}-${Date.now()}`;
    const { client, channel } = await subscribe(vsn, topic);
    try {
      const seen = [];
      const done = new Promise((resolve) =>
        channel.on('broadcast', { event: 'n' }, (m) => {
          seen.push(m.payload.n);
          if (seen.length === 20) resolve();
        }),
      );
      await subscribed(channel);
      await db.query(`SELECT realtime.send(jsonb_build_object('n', i), 'n', $1, false) FROM generate_series(1, 20) i`, [topic]);
      await withTimeout(done, 10000, '20 messages');
      assert.deepEqual(seen, Array.from({ length: 20 }, (_, i) => i + 1));
    } finally {
      await close(client);
    }
  });
}

for (const vsn of ['1.0.0', '2.0.0']) {
  test(`realtime-js (${vsn}) sends a broadcast with ack and receives it with self`, async () => {
    const client = new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey }, vsn });
    try {
      await client.setAuth(apikey);
      const channel = client.channel(`chat-${vsn}-${Date.now()}`, { config: { private: false, broadcast: { ack: true, self: true } } });
      const echoed = new Promise((resolve) => channel.on('broadcast', { event: 'ping' }, resolve));
      await subscribed(channel);
      const status = await channel.send({ type: 'broadcast', event: 'ping', payload: { n: 1 } });
      assert.equal(status, 'ok');
      const msg = await withTimeout(echoed, 10000, 'own broadcast');
      assert.deepEqual({ type: msg.type, event: msg.event, payload: msg.payload }, { type: 'broadcast', event: 'ping', payload: { n: 1 } });
    } finally {
      await close(client);
    }
  });
}

test('realtime-js joins a private channel its policies allow, and cannot write without the write policy', async () => {
  const member = '44444444-4444-4444-8444-444444444444';
  await loadPolicies();
  await db.query("DELETE FROM private_members WHERE room = 'room:js'");
  await db.query("INSERT INTO private_members VALUES ($1, 'room:js', false)", [member]);
  const token = jwt(SECRET, { role: 'authenticated', sub: member, exp: Math.floor(Date.now() / 1000) + 3600 });
  const client = new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  try {
    await client.setAuth(token);
    const channel = client.channel('room:js', { config: { private: true, broadcast: { ack: true } } });
    const got = new Promise((resolve) => channel.on('broadcast', { event: 'secret' }, resolve));
    await subscribed(channel);
    await db.query(`SELECT realtime.send('{"s": 1}', 'secret', 'room:js')`);
    const msg = await withTimeout(got, 10000, 'private broadcast');
    assert.equal(msg.payload.s, 1);
    assert.equal(await channel.send({ type: 'broadcast', event: 'x', payload: {} }), 'error');
  } finally {
    await close(client);
  }
});

test('realtime-js: a token refresh that loses permission closes the private channel', async () => {
  const member = '55555555-5555-4555-8555-555555555555';
  const stranger = '66666666-6666-4666-8666-666666666666';
  await loadPolicies();
  await db.query("DELETE FROM private_members WHERE room = 'room:js-refresh'");
  await db.query("INSERT INTO private_members VALUES ($1, 'room:js-refresh', false)", [member]);
  const token = (sub) => jwt(SECRET, { role: 'authenticated', sub, exp: Math.floor(Date.now() / 1000) + 3600 });
  const client = new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  try {
    await client.setAuth(token(member));
    const channel = client.channel('room:js-refresh', { config: { private: true } });
    const lost = new Promise((resolve) => channel.on('system', {}, (m) => m.status === 'error' && resolve(m)));
    await subscribed(channel);
    await client.setAuth(token(stranger));
    const system = await withTimeout(lost, 10000, 'system message');
    assert.equal(system.message, 'You no longer have permission to read from this Channel topic: room:js-refresh');
    await withTimeout(
      (async () => {
        while (channel.state !== 'closed') await new Promise((r) => setTimeout(r, 20));
      })(),
      10000,
      'channel closed',
    );
  } finally {
    await close(client);
  }
});

test('realtime-js gets the Unauthorized reason for a private channel', async () => {
  const client = new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  await client.setAuth(apikey);
  try {
    const channel = client.channel('secret-room', { config: { private: true } });
    const err = await withTimeout(
      new Promise((resolve) => channel.subscribe((status, e) => status === 'CHANNEL_ERROR' && resolve(e))),
      10000,
      'channel error',
    );
    assert.match(String(err?.message ?? err), /Unauthorized: You do not have permissions to read from this Channel topic: secret-room/);
  } finally {
    await close(client);
  }
});
