// Presence with the official @supabase/realtime-js: clients on two sidecar processes see one
// view (sync, join and leave as Phoenix.Presence sends them), a killed sidecar's members
// leave the other's view within the stated bound, private presence follows the RLS
// policies, and the limits close a channel with Supabase's texts.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import WebSocket from 'ws';
import { RealtimeClient } from '@supabase/realtime-js';
import { anonClaims, close, database, jwt, startSidecar, subscribed, waitFor, withTimeout } from './harness.mjs';

const SECRET = 'test-secret-with-at-least-32-characters';
const apikey = jwt(SECRET, anonClaims());
/// How soon a killed sidecar's members leave the others' views (sidecar/README.md, "Presence").
const DEAD_SIDECAR_BOUND_MS = 5000;

let one;
let two;
let db;

before(async () => {
  [one, two] = await Promise.all([startSidecar(SECRET, 'presence_js_1'), startSidecar(SECRET, 'presence_js_2')]);
  db = await database();
});

after(async () => {
  await db?.end();
  one?.process.kill('SIGTERM');
  two?.process.kill('SIGTERM');
});

/// A realtime-js client on `port` with a presence channel of `topic` under `key`, recording
/// its presence events.
function member(port, topic, key, { vsn = '2.0.0', token = apikey, isPrivate = false } = {}) {
  const client = new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey }, vsn });
  client.setAuth(token);
  const channel = client.channel(topic, { config: { private: isPrivate, presence: { key } } });
  const events = [];
  channel.on('presence', { event: 'sync' }, () => events.push({ event: 'sync' }));
  channel.on('presence', { event: 'join' }, ({ key, newPresences }) => events.push({ event: 'join', key, refs: newPresences.map((p) => p.presence_ref) }));
  channel.on('presence', { event: 'leave' }, ({ key, leftPresences }) => events.push({ event: 'leave', key, refs: leftPresences.map((p) => p.presence_ref) }));
  const systems = [];
  channel.on('system', {}, (m) => systems.push(m));
  /// The view as {key: [meta without presence_ref]}, keys sorted.
  const view = () =>
    Object.fromEntries(
      Object.entries(channel.presenceState())
        .sort(([a], [b]) => a.localeCompare(b))
        .map(([k, metas]) => [k, metas.map(({ presence_ref, ...meta }) => meta)]),
    );
  const refs = () => Object.fromEntries(Object.entries(channel.presenceState()).map(([k, metas]) => [k, metas.map((m) => m.presence_ref).sort()]));
  return { client, channel, events, systems, view, refs };
}

const sameView = (members, want) => members.every((m) => JSON.stringify(m.view()) === JSON.stringify(want));

for (const vsn of ['1.0.0', '2.0.0']) {
  test(`three realtime-js clients (${vsn}) on two sidecars share one view: join, update, unchanged re-track, untrack, a closed socket`, async () => {
    const topic = `presence-${vsn}-${Date.now()}`;
    const ann = member(one.port, topic, 'ann', { vsn });
    const bob = member(two.port, topic, 'bob', { vsn });
    const cy = member(one.port, topic, 'cy', { vsn });
    const all = [ann, bob, cy];
    try {
      await Promise.all(all.map((m) => subscribed(m.channel)));
      assert.equal(await ann.channel.track({ status: 'online' }), 'ok');
      assert.equal(await bob.channel.track({ status: 'online' }), 'ok');
      assert.equal(await cy.channel.track({ status: 'online' }), 'ok');
      const everyone = { ann: [{ status: 'online' }], bob: [{ status: 'online' }], cy: [{ status: 'online' }] };
      await waitFor(() => sameView(all, everyone), 10000, 'all three see all three');
      // A member's ref is made by the database: the same on both sidecars.
      assert.deepEqual(ann.refs(), bob.refs());
      assert.deepEqual(bob.refs(), cy.refs());
      const bobRef = ann.refs().bob[0];

      // An update: one join of bob's new meta and one leave of the old ref, everywhere.
      for (const m of all) m.events.length = 0;
      assert.equal(await bob.channel.track({ status: 'typing' }), 'ok');
      const typing = { ...everyone, bob: [{ status: 'typing' }] };
      await waitFor(() => sameView(all, typing), 10000, 'the update everywhere');
      for (const m of [ann, cy]) {
        const changes = m.events.filter((e) => e.event !== 'sync');
        assert.deepEqual(changes.map((e) => [e.event, e.key]), [['join', 'bob'], ['leave', 'bob']], JSON.stringify(m.events));
        assert.deepEqual(changes[1].refs, [bobRef]);
        assert.notEqual(changes[0].refs[0], bobRef);
      }

      // An unchanged re-track sends nothing: the next change (cy's) is the first event anyone sees.
      for (const m of all) m.events.length = 0;
      assert.equal(await bob.channel.track({ status: 'typing' }), 'ok');
      assert.equal(await cy.channel.track({ status: 'away' }), 'ok');
      const away = { ...typing, cy: [{ status: 'away' }] };
      await waitFor(() => sameView(all, away), 10000, "cy's change everywhere");
      for (const m of [ann, bob]) {
        const keys = m.events.filter((e) => e.event !== 'sync').map((e) => e.key);
        assert.deepEqual(keys, ['cy', 'cy'], JSON.stringify(m.events));
      }

      // Untrack: ann leaves everyone's view, her channel stays joined.
      assert.equal(await ann.channel.untrack(), 'ok');
      const { ann: _gone, ...withoutAnn } = away;
      await waitFor(() => sameView(all, withoutAnn), 10000, 'ann untracked');

      // A socket that closes: its member leaves at once.
      cy.client.disconnect();
      const { cy: _left, ...onlyBob } = withoutAnn;
      await waitFor(() => sameView([ann, bob], onlyBob), 10000, "cy's socket closed");
    } finally {
      await Promise.all(all.map((m) => close(m.client)));
    }
  });
}

test('a member who joins late gets the whole state once, with no diff of what it holds', async () => {
  const topic = `presence-late-${Date.now()}`;
  const early = Array.from({ length: 20 }, (_, i) => member(i % 2 ? one.port : two.port, topic, `u${i}`));
  let late;
  try {
    await Promise.all(early.map((m) => subscribed(m.channel)));
    await Promise.all(early.map((m, i) => m.channel.track({ n: i })));
    late = member(two.port, topic, 'late');
    await subscribed(late.channel);
    await waitFor(() => Object.keys(late.view()).length === 20, 10000, 'the late member sees the 20');
    assert.equal(late.events.filter((e) => e.event === 'join').length, 20, 'each member joins once');
    await late.channel.track({ n: 'late' });
    await waitFor(() => early.every((m) => Object.keys(m.view()).length === 21), 10000, 'everyone sees the late one');
    assert.equal(late.events.filter((e) => e.event === 'join').length, 21);
  } finally {
    await Promise.all([...early, late].filter(Boolean).map((m) => close(m.client)));
  }
});

test(`a sidecar killed with SIGKILL: its members leave the other sidecar's view within ${DEAD_SIDECAR_BOUND_MS} ms`, async () => {
  const doomed = await startSidecar(SECRET, 'presence_js_doomed');
  const topic = `presence-kill-${Date.now()}`;
  const watcher = member(one.port, topic, 'watcher');
  const victims = [member(doomed.port, topic, 'v1'), member(doomed.port, topic, 'v2')];
  try {
    await Promise.all([watcher, ...victims].map((m) => subscribed(m.channel)));
    await Promise.all([watcher, ...victims].map((m) => m.channel.track({ here: true })));
    await waitFor(() => Object.keys(watcher.view()).length === 3, 10000, 'the watcher sees all three');
    const killedAt = Date.now();
    doomed.process.kill('SIGKILL');
    await waitFor(() => Object.keys(watcher.view()).length === 1, DEAD_SIDECAR_BOUND_MS, 'the dead sidecar\'s members leave');
    const took = Date.now() - killedAt;
    console.log(`# killed sidecar's members left the other's view in ${took} ms`);
    const leaves = watcher.events.filter((e) => e.event === 'leave').map((e) => e.key).sort();
    assert.deepEqual(leaves, ['v1', 'v2']);
  } finally {
    doomed.process.kill('SIGKILL');
    for (const m of [watcher, ...victims]) m.client.disconnect();
  }
});

test('a sidecar killed and started again: its clients rejoin and track again, every view shows each member once', async () => {
  let restarted = await startSidecar(SECRET, 'presence_js_restart');
  const topic = `presence-restart-${Date.now()}`;
  const far = member(one.port, topic, 'far');
  // On the restarted sidecar: they track again on every SUBSCRIBED, as apps do after a reconnect.
  const near = ['n1', 'n2', 'nw'].map((k) => member(restarted.port, topic, k));
  try {
    await subscribed(far.channel);
    await far.channel.track({ at: 'far' });
    for (const m of near) {
      m.channel.subscribe((status) => status === 'SUBSCRIBED' && m.channel.track({ at: 'near' }));
    }
    const four = (m) => JSON.stringify(Object.keys(m.view())) === JSON.stringify(['far', 'n1', 'n2', 'nw']);
    await waitFor(() => four(far) && near.every(four), 10000, 'all four everywhere');
    const before = far.refs();
    restarted.process.kill('SIGKILL');
    restarted = await startSidecar(SECRET, 'presence_js_restart', {}, restarted.port);
    // realtime-js reconnects and rejoins by itself; the restarted sidecar builds its view
    // from the database again.
    const settled = (m) =>
      four(m) &&
      Object.values(m.refs()).every((refs) => refs.length === 1) &&
      ['n1', 'n2', 'nw'].every((k) => m.refs()[k][0] !== before[k][0]);
    await waitFor(() => settled(far) && near.every(settled), 20000, 'one new meta per member everywhere');
    for (const m of near) assert.deepEqual(m.refs(), far.refs(), 'the rebuilt view is the same');
    assert.deepEqual(far.refs().far, before.far, 'the member of the other sidecar is untouched');
  } finally {
    restarted.process.kill('SIGKILL');
    for (const m of [far, ...near]) m.client.disconnect();
  }
});

test(`a hung sidecar (SIGSTOP): its members leave within ${DEAD_SIDECAR_BOUND_MS} ms (the lease), and come back when it resumes`, async () => {
  const hung = await startSidecar(SECRET, 'presence_js_hung', { PRESENCE_LEASE_SECS: '2' });
  const topic = `presence-hang-${Date.now()}`;
  const watcher = member(one.port, topic, 'watcher');
  const sleeper = member(hung.port, topic, 'sleeper');
  try {
    await Promise.all([watcher, sleeper].map((m) => subscribed(m.channel)));
    await Promise.all([watcher, sleeper].map((m) => m.channel.track({ here: true })));
    await waitFor(() => Object.keys(watcher.view()).length === 2, 10000, 'the watcher sees the sleeper');
    const before = watcher.refs().sleeper[0];
    const stoppedAt = Date.now();
    hung.process.kill('SIGSTOP');
    // Its backend is alive and its socket open: only the lease can tell.
    await waitFor(() => !watcher.view().sleeper, DEAD_SIDECAR_BOUND_MS, "the hung sidecar's member leaves");
    console.log(`# hung sidecar's member left the other's view in ${Date.now() - stoppedAt} ms`);
    hung.process.kill('SIGCONT');
    // Resumed, it finds its lease lost and tracks its members again, under new refs.
    await waitFor(() => !!watcher.view().sleeper, 10000, 'the sleeper is back');
    assert.notEqual(watcher.refs().sleeper[0], before);
    assert.equal(Object.keys(watcher.view()).length, 2, 'once');
  } finally {
    hung.process.kill('SIGCONT');
    hung.process.kill('SIGKILL');
    for (const m of [watcher, sleeper]) m.client.disconnect();
  }
});

test('private presence: members read it, only writers track, others are refused at join', async () => {
  for (const f of ['../../pgbench/supabase_auth.sql', '../tests/private_policies.sql']) {
    await db.query(fs.readFileSync(new URL(f, import.meta.url), 'utf8'));
  }
  const room = `presence-private-${Date.now()}`;
  const [writer, reader, stranger] = ['11111111-1111-4111-8111-', '22222222-2222-4222-8222-', '33333333-3333-4333-8333-'].map(
    (p) => p + String(Date.now()).padStart(12, '0').slice(-12),
  );
  await db.query('INSERT INTO private_members VALUES ($1, $2, true), ($3, $2, false)', [writer, room, reader]);
  const token = (sub) => jwt(SECRET, { role: 'authenticated', sub, exp: Math.floor(Date.now() / 1000) + 3600 });
  const w = member(one.port, room, 'writer', { token: token(writer), isPrivate: true });
  const r = member(two.port, room, 'reader', { token: token(reader), isPrivate: true });
  const s = member(one.port, room, 'stranger', { token: token(stranger), isPrivate: true });
  try {
    await subscribed(w.channel);
    await subscribed(r.channel);
    await assert.rejects(subscribed(s.channel), /Unauthorized: You do not have permissions to read from this Channel topic/);
    assert.equal(await w.channel.track({ role: 'writer' }), 'ok');
    // The reader may read presence but not write it: its track is refused, its view is right.
    assert.equal(await r.channel.track({ role: 'reader' }), 'error');
    // Each view learns of the writer on its own sidecar's drain, in either order: wait for both.
    const onlyWriter = JSON.stringify({ writer: [{ role: 'writer' }] });
    await waitFor(() => JSON.stringify(r.view()) === onlyWriter, 10000, 'the reader sees the writer');
    await waitFor(() => JSON.stringify(w.view()) === onlyWriter, 10000, 'the writer sees itself, and the refused track is nowhere');
    // A public channel of the same name is another topic: nothing private leaks into it.
    const pub = member(two.port, room, 'public');
    await subscribed(pub.channel);
    await pub.channel.track({ role: 'public' });
    await waitFor(() => Object.keys(pub.view()).length === 1, 10000, 'the public view');
    assert.deepEqual(pub.view(), { public: [{ role: 'public' }] });
    assert.deepEqual(w.view(), { writer: [{ role: 'writer' }] });
    await close(pub.client);
  } finally {
    await Promise.all([w, r, s].map((m) => close(m.client)));
  }
});

test('a private channel whose policies allow broadcast but not presence: no presence state, no track', async () => {
  await db.query(`DROP POLICY IF EXISTS broadcast_only_read ON realtime.messages;
                  CREATE POLICY broadcast_only_read ON realtime.messages FOR SELECT TO authenticated
                    USING ((SELECT realtime.topic()) = 'broadcast-only' AND realtime.messages.extension = 'broadcast')`);
  const token = jwt(SECRET, { role: 'authenticated', sub: '44444444-4444-4444-8444-444444444444', exp: Math.floor(Date.now() / 1000) + 3600 });
  const m = member(one.port, 'broadcast-only', 'eve', { token, isPrivate: true });
  const got = [];
  m.channel.on('broadcast', { event: 'marker' }, (b) => got.push(b));
  try {
    await subscribed(m.channel);
    assert.equal(await m.channel.track({ x: 1 }), 'error', 'no presence write');
    // A broadcast after the join: it arrives, and no presence event came before it.
    await db.query("SELECT realtime.send('{}', 'marker', 'broadcast-only', true)");
    await waitFor(() => got.length === 1, 10000, 'the marker');
    assert.deepEqual(m.events, [], 'no presence state or diff');
  } finally {
    await close(m.client);
    await db.query('DROP POLICY IF EXISTS broadcast_only_read ON realtime.messages');
  }
});

test("presence limits close the channel with Supabase's texts", async () => {
  const limited = await startSidecar(SECRET, 'presence_js_limits', { MAX_CLIENT_PRESENCE_EVENTS_PER_SECOND: '3', MAX_PRESENCE_META_BYTES: '100' });
  try {
    const topic = `presence-limits-${Date.now()}`;
    const big = member(limited.port, topic, 'big');
    await subscribed(big.channel);
    big.channel.track({ blob: 'x'.repeat(200) });
    await waitFor(() => big.systems.length > 0, 10000, 'the size refusal');
    assert.equal(big.systems[0].message, 'Track message size exceeded');
    await close(big.client);

    const fast = member(limited.port, `${topic}-rate`, 'fast');
    await subscribed(fast.channel);
    for (let i = 0; i < 5; i++) fast.channel.track({ i });
    await waitFor(() => fast.systems.length > 0, 10000, 'the rate refusal');
    assert.equal(fast.systems[0].message, 'Client presence rate limit exceeded');
    await close(fast.client);
  } finally {
    limited.process.kill('SIGTERM');
  }
});
