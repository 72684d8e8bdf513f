// History at a join with the official realtime-js: Supabase's replay on a private channel,
// and resume after a position, which an app adds to its join payload with
// `updateJoinPayload` so that realtime-js's automatic rejoin carries it (sidecar/README.md, "Replay and resume").
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import WebSocket from 'ws';
import { RealtimeClient } from '@supabase/realtime-js';
import { anonClaims, close, database, jwt, startSidecar, subscribed, withTimeout, waitFor } from './harness.mjs';

const SECRET = 'test-secret-with-at-least-32-characters';
const apikey = jwt(SECRET, anonClaims());
const MEMBER = '77777777-7777-4777-8777-777777777777';

let db;
before(async () => {
  db = await database();
});
after(async () => {
  await db?.end();
});

const client = (port) => new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey } });

/// What sidecar/README.md tells apps to do: after each message, move the join payload's
/// `config.broadcast.resume` to its position, so a rejoin (automatic or not) resumes there.
function remember(channel, meta) {
  const { config } = channel.joinPush.payload();
  channel.updateJoinPayload({ config: { ...config, broadcast: { ...config.broadcast, resume: { epoch: meta.epoch, seq: meta.seq } } } });
}


test('realtime-js resumes after the sidecar is killed (SIGKILL) and started again: nothing lost, nothing twice', async () => {
  let { process: sidecar, port } = await startSidecar(SECRET, 'history_js_kill');
  const topic = `resume-js-${Date.now()}`;
  const c = client(port);
  let publisher;
  try {
    await c.setAuth(apikey);
    const channel = c.channel(topic, { config: { private: false } });
    const seen = [];
    const systems = [];
    channel.on('broadcast', { event: 'n' }, (m) => {
      seen.push(m.payload.n);
      remember(channel, m.meta);
    });
    channel.on('system', {}, (m) => systems.push(m));
    await subscribed(channel);
    // 500 messages a second for 5 seconds, committed whatever happens to the sidecar.
    const total = 2500;
    publisher = (async () => {
      const pub = await database();
      try {
        for (let n = 0; n < total; n += 5) {
          await pub.query(`SELECT realtime.send(jsonb_build_object('n', g), 'n', $1, false) FROM generate_series($2::int, $3::int) g`, [topic, n, n + 4]);
          await new Promise((r) => setTimeout(r, 10));
        }
      } finally {
        await pub.end();
      }
    })();
    await waitFor(() => seen.length >= 500, 20000, '500 messages');
    sidecar.kill('SIGKILL');
    await new Promise((r) => setTimeout(r, 1000));
    ({ process: sidecar } = await startSidecar(SECRET, 'history_js_kill', {}, port));
    // realtime-js reconnects and rejoins by itself, with the payload the app moved.
    await publisher;
    await waitFor(() => seen.length >= total, 40000, `all ${total} messages (have ${seen.length})`);
    assert.deepEqual(seen, [...Array(total).keys()], 'every message once, in order');
    // One system message per rejoin (realtime-js may send the join twice on a reconnect;
    // the second resumes after what the first was sent), each saying nothing was lost.
    const resumed = systems.filter((s) => s.extension === 'broadcast' && 'recovered' in s);
    assert.ok(resumed.length >= 1, JSON.stringify(systems));
    assert.ok(resumed.every((s) => s.recovered === true), JSON.stringify(resumed));
    assert.ok(resumed[0].resent > 0, JSON.stringify(resumed[0]));
  } finally {
    await publisher?.catch(() => {});
    await close(c);
    sidecar.kill('SIGTERM');
  }
});

test('realtime-js replays the newest messages of a private channel (Supabase replay), each once', async () => {
  const { process: sidecar, port } = await startSidecar(SECRET, 'history_js_replay');
  const topic = `replay-js-${Date.now()}`;
  for (const f of ['../../pgbench/supabase_auth.sql', '../tests/private_policies.sql']) {
    await db.query(fs.readFileSync(new URL(f, import.meta.url), 'utf8'));
  }
  await db.query('INSERT INTO private_members VALUES ($1, $2, false)', [MEMBER, topic]);
  const since = Date.now() - 1000;
  await db.query(`SELECT realtime.send(jsonb_build_object('n', g), 'n', $1, true) FROM generate_series(0, 9) g`, [topic]);
  const c = client(port);
  try {
    await c.setAuth(jwt(SECRET, { role: 'authenticated', sub: MEMBER, exp: Math.floor(Date.now() / 1000) + 3600 }));
    const channel = c.channel(topic, { config: { private: true, broadcast: { replay: { since, limit: 4 } } } });
    const got = [];
    channel.on('broadcast', { event: 'n' }, (m) => got.push(m));
    await subscribed(channel);
    await waitFor(() => got.length >= 4, 10000, 'replayed messages');
    await db.query(`SELECT realtime.send('{"n": 10}', 'n', $1, true)`, [topic]);
    await waitFor(() => got.length >= 5, 10000, 'a live message');
    assert.deepEqual(got.map((m) => m.payload.n), [6, 7, 8, 9, 10]);
    assert.deepEqual(got.map((m) => m.meta.replayed === true), [true, true, true, true, false]);
    for (const m of got) assert.equal(m.meta.id, m.payload.id);
    // realtime-js itself refuses replay on a public channel, before the server would.
    assert.throws(() => c.channel(`${topic}-public`, { config: { broadcast: { replay: { since } } } }).subscribe(), /replay on public channel/);
  } finally {
    await close(c);
    sidecar.kill('SIGTERM');
  }
});

test('realtime-js persisted broadcasts (send with persist, httpSend with persist) are replayed to a later joiner; the others are not', async () => {
  const { process: sidecar, port } = await startSidecar(SECRET, 'history_js_persist');
  const topic = `persist-js-${Date.now()}`;
  for (const f of ['../../pgbench/supabase_auth.sql', '../tests/private_policies.sql']) {
    await db.query(fs.readFileSync(new URL(f, import.meta.url), 'utf8'));
  }
  await db.query('INSERT INTO private_members VALUES ($1, $2, true)', [MEMBER, topic]);
  const token = jwt(SECRET, { role: 'authenticated', sub: MEMBER, exp: Math.floor(Date.now() / 1000) + 3600 });
  const since = Date.now() - 1000;
  const writer = client(port);
  const reader = client(port);
  try {
    await writer.setAuth(token);
    const out = writer.channel(topic, { config: { private: true, broadcast: { ack: true } } });
    await subscribed(out);
    assert.equal(await out.send({ type: 'broadcast', event: 'kept', payload: { n: 1 }, persist: true }), 'ok');
    assert.equal(await out.send({ type: 'broadcast', event: 'fleeting', payload: { n: 2 } }), 'ok');
    assert.deepEqual(await out.httpSend('kept', { n: 3 }, { persist: { ttl: 60 } }), { success: true });
    assert.deepEqual(await out.httpSend('kept-bin', new Uint8Array([7, 8, 9]).buffer, { persist: true }), { success: true });
    const { rows } = await db.query(
      "SELECT event, round(extract(epoch FROM expires_at - sent_at)) AS ttl FROM realtime.persisted_messages WHERE topic = $1 ORDER BY sent_at",
      [topic],
    );
    assert.deepEqual(rows.map((r) => [r.event, Number(r.ttl)]), [['kept', 259200], ['kept', 60], ['kept-bin', 259200]]);

    await reader.setAuth(token);
    const got = [];
    const replayed = reader.channel(topic, { config: { private: true, broadcast: { replay: { since } } } });
    replayed.on('broadcast', { event: '*' }, (m) => got.push(m));
    await subscribed(replayed);
    // A live message once the replay arrived (the history was read before any of it was
    // sent, so this one is live): nothing else was replayed in between.
    await waitFor(() => got.length >= 3, 10000, 'the persisted messages');
    await db.query(`SELECT realtime.send('{"n": 4}', 'live', $1, true)`, [topic]);
    await waitFor(() => got.some((m) => m.event === 'live'), 10000, 'the live message');
    const seen = (m) => (m.payload instanceof ArrayBuffer ? [...new Uint8Array(m.payload)] : m.payload.n);
    assert.deepEqual(got.map((m) => [m.event, seen(m), m.meta.replayed === true]), [
      ['kept', 1, true],
      ['kept', 3, true],
      ['kept-bin', [7, 8, 9], true],
      ['live', 4, false],
    ]);
    for (const m of got.slice(0, 3)) assert.match(m.meta.id, /^[0-9a-f-]{36}$/);
  } finally {
    await close(writer);
    await close(reader);
    sidecar.kill('SIGTERM');
  }
});
