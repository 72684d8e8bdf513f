// Messages as large as Supabase takes them, with realtime-js on both serializers: 3,000 KB
// broadcasts (Supabase's max_payload_size_in_kb) from the socket, from REST and from SQL,
// and frames up to 5 MB (Supabase's frame limit); past realtime.max_message_size a socket's
// broadcast is refused with the database's reason and a database's message is dropped with
// the subscribers told.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { RealtimeClient } from '@supabase/realtime-js';
import { anonClaims, close, database, jwt, startSidecar, subscribed, withTimeout } from './harness.mjs';

const SECRET = 'large-messages-secret-with-enough-length';
const apikey = jwt(SECRET, anonClaims());
// 3,000 KB as realtime.max_message_size counts it (topic, event and payload): a payload just
// under it, and one over it.
const LIMIT = 3000 * 1024;
const NEAR = LIMIT - 1000;

let sidecar;
let port;
let db;

before(async () => {
  ({ process: sidecar, port } = await startSidecar(SECRET, 'large_messages_e2e'));
  db = await database();
});

after(async () => {
  await db?.end();
  sidecar?.kill('SIGTERM');
});

async function connect(vsn) {
  const client = new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, {
    transport: WebSocket,
    params: { apikey },
    vsn,
  });
  await client.setAuth(apikey);
  return client;
}

for (const vsn of ['1.0.0', '2.0.0']) {
  test(`realtime-js ${vsn}: a 3,000 KB broadcast goes from the socket, REST and SQL`, async () => {
    const listener = await connect(vsn);
    const sender = await connect(vsn);
    const topic = `large-${vsn}`;
    try {
      const channel = listener.channel(topic);
      const got = [];
      channel.on('broadcast', { event: 'big' }, (m) => got.push(m.payload));
      await subscribed(channel);
      const out = sender.channel(topic, { config: { broadcast: { ack: true } } });
      await subscribed(out);
      const pad = 'x'.repeat(NEAR - 64);
      assert.equal(await out.send({ type: 'broadcast', event: 'big', payload: { from: 'socket', pad } }), 'ok');
      assert.deepEqual(await out.httpSend('big', { from: 'rest', pad }), { success: true });
      await db.query("SELECT realtime.send(jsonb_build_object('from', 'sql', 'pad', $1::text), 'big', $2, false)", [pad, topic]);
      const deadline = Date.now() + 20000;
      while (got.length < 3 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      assert.deepEqual(got.map((p) => [p.from, p.pad.length]), [['socket', pad.length], ['rest', pad.length], ['sql', pad.length]]);
    } finally {
      await close(listener);
      await close(sender);
    }
  });
}

test('realtime-js: past realtime.max_message_size a socket broadcast is refused and a database message is reported dropped', async () => {
  const listener = await connect('1.0.0');
  const sender = await connect('1.0.0');
  const topic = 'large-over';
  try {
    const channel = listener.channel(topic);
    const system = [];
    channel.on('system', {}, (m) => system.push(m));
    await subscribed(channel);
    const out = sender.channel(topic, { config: { broadcast: { ack: true } } });
    await subscribed(out);
    // A frame of about 3.1 MB: read (under MAX_FRAME_SIZE), then refused by the database.
    const over = 'x'.repeat(LIMIT + 10_000);
    const status = await withTimeout(out.send({ type: 'broadcast', event: 'big', payload: { over } }), 20000, 'the reply');
    assert.equal(status, 'error');
    // From SQL, a WARNING in the sender's session; the subscribers are told in its place.
    await db.query("SELECT realtime.send(jsonb_build_object('over', $1::text), 'big', $2, false)", [over, topic]);
    const deadline = Date.now() + 20000;
    while (system.length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    const told = system.find((m) => m.extension === 'broadcast');
    assert.ok(told, JSON.stringify(system));
    assert.match(told.message, /max_message_size/);
  } finally {
    await close(listener);
    await close(sender);
  }
});
