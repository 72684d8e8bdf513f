// Supabase's REST broadcast as realtime-js uses it: `channel.send` before the channel is
// joined (the batch endpoint) and `channel.httpSend` (one message per request, JSON or
// binary), both posted under the socket URL's path (`/realtime/v1/api/broadcast...`).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import WebSocket from 'ws';
import { RealtimeClient } from '@supabase/realtime-js';
import { anonClaims, close, database, jwt, startSidecar, subscribed, waitFor, withTimeout } from './harness.mjs';

const SECRET = 'rest-broadcast-secret-with-enough-length';
const apikey = jwt(SECRET, anonClaims());
const MEMBER = '77777777-7777-4777-8777-777777777777';

let sidecar;
let port;
let db;

before(async () => {
  ({ process: sidecar, port } = await startSidecar(SECRET, 'rest_broadcast_e2e'));
  db = await database();
  for (const f of ['../../pgbench/supabase_auth.sql', '../tests/private_policies.sql']) {
    await db.query(fs.readFileSync(new URL(f, import.meta.url), 'utf8'));
  }
  await db.query("DELETE FROM private_members WHERE room = 'room:rest'");
  await db.query("INSERT INTO private_members VALUES ($1, 'room:rest', false)", [MEMBER]);
});

after(async () => {
  await db?.end();
  sidecar?.kill('SIGTERM');
});

async function connect(token = apikey) {
  const client = new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  await client.setAuth(token);
  return client;
}

// Regression: only `/api/broadcast` was served, so realtime-js's REST send (to
// `/realtime/v1/api/broadcast`) got a 404 and returned 'error'.
test('realtime-js sends over REST before joining, under the /realtime/v1 prefix', async () => {
  const listener = await connect();
  const sender = await connect();
  try {
    const channel = listener.channel('rest-batch');
    const got = new Promise((resolve) => channel.on('broadcast', { event: 'hi' }, resolve));
    await subscribed(channel);
    const status = await sender.channel('rest-batch').send({ type: 'broadcast', event: 'hi', payload: { n: 1 } });
    assert.equal(status, 'ok');
    const msg = await withTimeout(got, 10000, 'the REST broadcast');
    assert.deepEqual(msg.payload, { n: 1 });
  } finally {
    await close(listener);
    await close(sender);
  }
});

test('realtime-js httpSend delivers JSON and binary payloads', async () => {
  const listener = await connect();
  const sender = await connect();
  try {
    const json = [];
    const bin = [];
    const channel = listener
      .channel('rest single/room+1')
      .on('broadcast', { event: 'json ev' }, (m) => json.push(m.payload))
      .on('broadcast', { event: 'bin' }, (m) => bin.push(m.payload));
    await subscribed(channel);
    const out = sender.channel('rest single/room+1');
    assert.deepEqual(await out.httpSend('json ev', { a: [1, 2] }), { success: true });
    assert.deepEqual(await out.httpSend('bin', new Uint8Array([0, 1, 255]).buffer), { success: true });
    await withTimeout(
      (async () => {
        while (json.length < 1 || bin.length < 1) await new Promise((r) => setTimeout(r, 20));
      })(),
      10000,
      'both messages',
    );
    assert.deepEqual(json, [{ a: [1, 2] }]);
    assert.deepEqual([...new Uint8Array(bin[0])], [0, 1, 255]);
  } finally {
    await close(listener);
    await close(sender);
  }
});

test('realtime-js httpSend on a private channel needs the write policy, with or without persist', async () => {
  const sender = await connect(jwt(SECRET, { role: 'authenticated', sub: MEMBER, exp: Math.floor(Date.now() / 1000) + 3600 }));
  try {
    const channel = sender.channel('room:rest', { config: { private: true } });
    await assert.rejects(channel.httpSend('e', { x: 1 }), /Unauthorized: You do not have permissions to write to this Channel topic: room:rest/);
    await assert.rejects(channel.httpSend('e', { x: 1 }, { persist: true }), /Unauthorized: You do not have permissions to write/);
  } finally {
    await close(sender);
  }
});

// A batch message's `id` reaches subscribers as `meta.id`, as Supabase delivers it: live on
// both serializers, and again when a resume resends it; a message without one has none. An
// id must be a UUID (Supabase takes any string; pg_realtime carries ids as uuid): anything
// else is refused with a 422 naming it, and nothing of the batch is sent.
function post(messages) {
  return fetch(`http://127.0.0.1:${port}/realtime/v1/api/broadcast`, {
    method: 'POST',
    headers: { apikey, 'content-type': 'application/json' },
    body: JSON.stringify({ messages }),
  });
}

for (const vsn of ['1.0.0', '2.0.0']) {
  test(`realtime-js (${vsn}): a REST message's id arrives as meta.id`, async () => {
    const topic = `rest-id-${vsn}-${Date.now()}`;
    const listener = new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey }, vsn });
    try {
      const got = [];
      const channel = listener.channel(topic).on('broadcast', { event: 'named' }, (m) => got.push(m));
      await subscribed(channel);
      const id = crypto.randomUUID();
      const res = await post([
        { topic, event: 'named', payload: { n: 1 }, id },
        { topic, event: 'named', payload: { n: 2 } },
      ]);
      assert.equal(res.status, 202);
      await waitFor(() => got.length >= 2, 10000, 'both messages');
      assert.equal(got[0].meta.id, id);
      assert.deepEqual(got[0].payload, { n: 1 });
      assert.equal(got[1].meta.id, undefined, 'a message without an id shows none');
    } finally {
      await close(listener);
    }
  });
}

test('realtime-js: a resume resends a REST message with the id its sender named', async () => {
  const topic = `rest-id-resume-${Date.now()}`;
  const c = await connect();
  try {
    const first = c.channel(topic);
    let last;
    first.on('broadcast', { event: 'seen' }, (m) => {
      last = m.meta;
    });
    await subscribed(first);
    assert.equal((await post([{ topic, event: 'seen', payload: {} }])).status, 202);
    await waitFor(() => last !== undefined, 10000, 'the first message');
    await c.removeChannel(first);
    const id = crypto.randomUUID();
    assert.equal((await post([{ topic, event: 'missed', payload: {}, id }])).status, 202);
    const again = c.channel(topic, { config: { broadcast: { resume: { epoch: last.epoch, seq: last.seq } } } });
    const got = [];
    again.on('broadcast', { event: 'missed' }, (m) => got.push(m));
    again.on('system', {}, (m) => {
      if ('recovered' in m) got.push(m);
    });
    await subscribed(again);
    await waitFor(() => got.length >= 2, 10000, 'the missed message and the resume\'s answer');
    assert.equal(got[0].meta.id, id);
    assert.equal(got[1].recovered, true, JSON.stringify(got[1]));
  } finally {
    await close(c);
  }
});

test('a REST message whose id is no UUID is refused with 422 naming the id', async () => {
  const topic = `rest-id-bad-${Date.now()}`;
  const listener = await connect();
  try {
    const got = [];
    const channel = listener.channel(topic).on('broadcast', { event: '*' }, (m) => got.push(m));
    await subscribed(channel);
    const res = await post([
      { topic, event: 'fine', payload: {} },
      { topic, event: 'named', payload: {}, id: 'msg-123' },
    ]);
    assert.equal(res.status, 422);
    const body = await res.json();
    assert.match(body.errors.messages['1'].id[0], /must be a UUID/);
    // What a later message delivers, the refused batch did not.
    assert.equal((await post([{ topic, event: 'after', payload: {} }])).status, 202);
    await waitFor(() => got.length >= 1, 10000, 'the later message');
    assert.deepEqual(got.map((m) => m.event), ['after']);
  } finally {
    await close(listener);
  }
});
