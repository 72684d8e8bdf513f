// A database Supabase made, switched to pg_realtime (scripts/supabase-cluster.sh: the
// fixture of regress/fixtures/supabase, then CREATE EXTENSION pg_realtime and the sidecar's
// login), served to the official @supabase/realtime-js client with nothing of the app
// changed: private channels authorized by the policies the app wrote on realtime.messages,
// the broadcasts of the app's trigger (realtime.broadcast_changes), Postgres Changes of its
// published table with its RLS, presence on a private channel, rows the app inserts into
// realtime.messages, replay of a persisted broadcast. scripts/pg_upgrade.sh runs it against
// the same database upgraded from PostgreSQL 15 to 17.
// PG_REALTIME_SUPABASE_DSN: that database as supabase_admin; PG_REALTIME_SUPABASE_SIDECAR_DSN:
// as the sidecar's login.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import pg from 'pg';
import { RealtimeClient } from '@supabase/realtime-js';
import { anonClaims, close, jwt, startSidecar, subscribed, waitFor, withTimeout } from './harness.mjs';

const SECRET = 'test-secret-with-at-least-32-characters';
const apikey = jwt(SECRET, anonClaims());
// The fixture's users: MEMBER belongs to room:lobby; OUTSIDER (here) to room:other only.
const MEMBER = '11111111-1111-4111-8111-111111111111';
const OUTSIDER = '22222222-2222-4222-8222-222222222222';
const userToken = (sub) => jwt(SECRET, { role: 'authenticated', sub, exp: Math.floor(Date.now() / 1000) + 3600 });

let sidecar;
let db;

function client(dsn) {
  const kv = Object.fromEntries(dsn.split(/\s+/).filter(Boolean).map((p) => p.split('=')));
  return new pg.Client({ host: kv.host, port: Number(kv.port ?? 5432), user: kv.user, database: kv.dbname });
}

before(async () => {
  const admin = process.env.PG_REALTIME_SUPABASE_DSN;
  const login = process.env.PG_REALTIME_SUPABASE_SIDECAR_DSN;
  assert.ok(admin && login, 'PG_REALTIME_SUPABASE_DSN and PG_REALTIME_SUPABASE_SIDECAR_DSN must be set (scripts/supabase-cluster.sh)');
  db = client(admin);
  await db.connect();
  // The tutorial app has one room with one member; a second room for the outsider.
  await db.query(`INSERT INTO public.rooms (topic, name) VALUES ('room:other', 'Other') ON CONFLICT DO NOTHING;
                  INSERT INTO public.rooms_users (user_id, room_topic) VALUES ('${OUTSIDER}', 'room:other') ON CONFLICT DO NOTHING`);
  sidecar = await startSidecar(SECRET, 'supabase_db_e2e', { DATABASE_URL: login });
});

after(async () => {
  if (sidecar) {
    sidecar.process.kill('SIGTERM');
    await new Promise((resolve) => (sidecar.process.exitCode !== null ? resolve() : sidecar.process.once('exit', resolve)));
    await db?.query("SELECT realtime.drop_consumer('supabase_db_e2e')");
  }
  await db?.end();
});

async function connect(sub) {
  const c = new RealtimeClient(`ws://127.0.0.1:${sidecar.port}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  await c.setAuth(userToken(sub));
  return c;
}

/// Writes a chat message as its author, as the app does (RLS and auth.uid() of the author).
async function writeMessage(sub, room, content) {
  await db.query('BEGIN');
  try {
    await db.query('SET LOCAL ROLE authenticated');
    await db.query(`SELECT set_config('request.jwt.claims', $1, true)`, [JSON.stringify({ sub, role: 'authenticated' })]);
    await db.query('INSERT INTO public.messages (room_topic, content) VALUES ($1, $2)', [room, content]);
    await db.query('COMMIT');
  } catch (e) {
    await db.query('ROLLBACK');
    throw e;
  }
}

test("a private channel is authorized by the app's own policies on realtime.messages", async () => {
  const member = await connect(MEMBER);
  const outsider = await connect(OUTSIDER);
  try {
    await subscribed(member.channel('room:lobby', { config: { private: true } }));
    const refused = outsider.channel('room:lobby', { config: { private: true } });
    const err = await withTimeout(
      new Promise((resolve) => refused.subscribe((status, e) => status === 'CHANNEL_ERROR' && resolve(e))),
      10000,
      'channel error',
    );
    assert.match(String(err?.message ?? err), /Unauthorized: You do not have permissions to read from this Channel topic: room:lobby/);
  } finally {
    await close(member);
    await close(outsider);
  }
});

test("the app's trigger broadcasts each chat message to its room's private channel (realtime.broadcast_changes)", async () => {
  const member = await connect(MEMBER);
  try {
    const got = [];
    const channel = member.channel('room:lobby', { config: { private: true } }).on('broadcast', { event: 'INSERT' }, (m) => got.push(m));
    await subscribed(channel);
    const content = `via the trigger ${Date.now()}`;
    await writeMessage(MEMBER, 'room:lobby', content);
    await waitFor(() => got.length > 0, 10000, 'the broadcast');
    const { payload } = got[0];
    assert.equal(payload.operation, 'INSERT');
    assert.equal(payload.schema, 'public');
    assert.equal(payload.table, 'messages');
    assert.equal(payload.record.content, content);
    assert.equal(payload.record.user_id, MEMBER);
  } finally {
    await close(member);
  }
});

test("Postgres Changes of the published chat table, filtered by the app's RLS", async () => {
  const member = await connect(MEMBER);
  const outsider = await connect(OUTSIDER);
  const seenByMember = [];
  const seenByOutsider = [];
  try {
    await subscribed(member.channel('changes-member')
      .on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'messages' }, (m) => seenByMember.push(m.new.content)));
    await subscribed(outsider.channel('changes-outsider')
      .on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'messages' }, (m) => seenByOutsider.push(m.new.content)));
    const stamp = Date.now();
    await writeMessage(MEMBER, 'room:lobby', `lobby ${stamp}`);
    await writeMessage(OUTSIDER, 'room:other', `other ${stamp}`);
    await writeMessage(MEMBER, 'room:lobby', `lobby again ${stamp}`);
    // Changes arrive in commit order: once a channel has a later row, an earlier one it did
    // not get (of a room its user is not in) will never come.
    await waitFor(() => seenByOutsider.length > 0 && seenByMember.length > 1, 10000, 'the changes');
    assert.deepEqual(seenByOutsider, [`other ${stamp}`]);
    assert.deepEqual(seenByMember, [`lobby ${stamp}`, `lobby again ${stamp}`]);
  } finally {
    await close(member);
    await close(outsider);
  }
});

test("presence on a private channel, allowed by the app's policy for the presence extension", async () => {
  const a = await connect(MEMBER);
  const b = await connect(MEMBER);
  try {
    const ca = a.channel('room:lobby', { config: { private: true, presence: { key: 'tab-a' } } });
    const cb = b.channel('room:lobby', { config: { private: true, presence: { key: 'tab-b' } } });
    await subscribed(ca);
    await subscribed(cb);
    assert.equal(await ca.track({ status: 'online' }), 'ok');
    assert.equal(await cb.track({ status: 'away' }), 'ok');
    const keys = (c) => Object.keys(c.presenceState()).sort().join(',');
    await waitFor(() => keys(ca) === 'tab-a,tab-b' && keys(cb) === 'tab-a,tab-b', 10000, 'both tabs in both views');
    assert.equal(cb.presenceState()['tab-a'][0].status, 'online');
  } finally {
    await close(a);
    await close(b);
  }
});

test('a row the app inserts into realtime.messages (its DEFAULT partition) reaches the room\'s members', async () => {
  const member = await connect(MEMBER);
  try {
    const channel = member.channel('room:lobby', { config: { private: true } });
    const got = [];
    channel.on('broadcast', { event: 'from_a_job' }, (m) => got.push(m));
    await subscribed(channel);
    const { rows } = await db.query(
      `INSERT INTO realtime.messages (topic, extension, event, payload, private)
       VALUES ('room:lobby', 'broadcast', 'from_a_job', '{"text": "written by an integration"}', true) RETURNING id::text`);
    await waitFor(() => got.length > 0, 10000, 'the inserted row');
    assert.equal(got[0].payload.text, 'written by an integration');
    assert.equal(got[0].meta.id, rows[0].id);
  } finally {
    await close(member);
  }
});

// The row a persisted client broadcast leaves; scripts/pg_upgrade.sh writes the same one on
// PostgreSQL 15 before it upgrades, so there the replay reads it across pg_upgrade.
const KEPT = '66666666-6666-4666-8666-666666666666';

test('a persisted broadcast is replayed to a member of its private channel', async () => {
  await db.query(
    `INSERT INTO realtime.persisted_messages (id, topic, private, event, payload, expires_at)
     VALUES ($1, 'room:lobby', true, 'kept', '{"text": "kept across pg_upgrade"}', now() + interval '3 days')
     ON CONFLICT (id) DO NOTHING`,
    [KEPT]);
  const member = await connect(MEMBER);
  try {
    const since = Date.now() - 24 * 3600 * 1000;
    const channel = member.channel('room:lobby', { config: { private: true, broadcast: { replay: { since, limit: 25 } } } });
    const got = [];
    channel.on('broadcast', { event: 'kept' }, (m) => got.push(m));
    await subscribed(channel);
    await waitFor(() => got.length > 0, 10000, 'the replayed broadcast');
    assert.equal(got[0].payload.text, 'kept across pg_upgrade');
    assert.equal(got[0].meta.id, KEPT);
    assert.equal(got[0].meta.replayed, true);
  } finally {
    await close(member);
  }
});
