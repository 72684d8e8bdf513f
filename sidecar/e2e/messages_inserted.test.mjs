// Rows an app inserts into realtime.messages (an integration, a cron job, an older example),
// as an app meets them with the official realtime-js: delivered at commit like realtime.send's,
// with the row's id as meta.id, and resent by a resume like any message (sidecar/README.md,
// "Rows inserted into realtime.messages").
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { RealtimeClient } from '@supabase/realtime-js';
import { anonClaims, close, database, jwt, startSidecar, subscribed, waitFor } from './harness.mjs';

const SECRET = 'test-secret-with-at-least-32-characters';
const apikey = jwt(SECRET, anonClaims());

let db;
let sidecar;
let port;
before(async () => {
  db = await database();
  ({ process: sidecar, port } = await startSidecar(SECRET, 'messages_inserted'));
});
after(async () => {
  sidecar?.kill('SIGTERM');
  await db?.query("DELETE FROM realtime.messages WHERE topic LIKE 'inserted-%'");
  await db?.end();
});

const client = (vsn) => new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey }, vsn });

/// Inserts rows as an app does, in one transaction; returns their ids.
async function insert(topic, events) {
  const { rows } = await db.query(
    `INSERT INTO realtime.messages (topic, extension, event, payload, private)
     SELECT $1, 'broadcast', e, jsonb_build_object('n', i), false FROM unnest($2::text[]) WITH ORDINALITY AS u(e, i)
     RETURNING id::text`,
    [topic, events]);
  return rows.map((r) => r.id);
}

for (const vsn of ['1.0.0', '2.0.0']) {
  test(`realtime-js (${vsn}): a row inserted into realtime.messages is delivered with its id as meta.id`, async () => {
    const topic = `inserted-${vsn}-${Date.now()}`;
    const c = client(vsn);
    try {
      const channel = c.channel(topic, { config: { private: false } });
      const got = [];
      channel.on('broadcast', { event: '*' }, (m) => got.push(m));
      await subscribed(channel);
      // A probe-like row (no event) is not a message; the two rows after it are.
      await db.query("INSERT INTO realtime.messages (topic, extension) VALUES ($1, 'broadcast')", [topic]);
      const ids = await insert(topic, ['first', 'second']);
      await waitFor(() => got.length >= 2, 10000, 'the two inserted rows');
      assert.deepEqual(got.map((m) => [m.event, m.payload]), [['first', { n: 1 }], ['second', { n: 2 }]]);
      assert.deepEqual(got.map((m) => m.meta.id), ids, 'meta.id is the row\'s id');
    } finally {
      await close(c);
    }
  });
}

test('realtime-js: a resume resends the rows inserted while the channel was away', async () => {
  const topic = `inserted-resume-${Date.now()}`;
  const c = client('2.0.0');
  try {
    const first = c.channel(topic, { config: { private: false } });
    let last;
    first.on('broadcast', { event: 'seen' }, (m) => {
      last = m.meta;
    });
    await subscribed(first);
    await insert(topic, ['seen']);
    await waitFor(() => last !== undefined, 10000, 'the first row');
    await c.removeChannel(first);
    const missed = await insert(topic, ['missed']);
    const again = c.channel(topic, { config: { private: false, broadcast: { resume: { epoch: last.epoch, seq: last.seq } } } });
    const got = [];
    again.on('broadcast', { event: 'missed' }, (m) => got.push(m));
    again.on('system', {}, (m) => {
      if ('recovered' in m) got.push(m);
    });
    await subscribed(again);
    await waitFor(() => got.length >= 2, 10000, 'the missed row and the resume\'s answer');
    assert.equal(got[0].event, 'missed');
    assert.equal(got[0].meta.id, missed[0]);
    assert.equal(got[1].recovered, true, JSON.stringify(got[1]));
  } finally {
    await close(c);
  }
});
