// Postgres Changes resume with the official realtime-js, on both serializers: a channel
// whose `config.broadcast.resume` says `changes: true` is told its position in a `system`
// message after each batch of changes, keeps it in its join payload (sidecar/README.md, "Resume after a
// position"), and a rejoin from it gets every change committed since, checked as the
// subscriber may read it at the rejoin, then live ones, none twice.
// Absence is proven by order: a channel gets its changes in commit order, so once it has a
// later change, an earlier one it did not get will never come.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import WebSocket from 'ws';
import { RealtimeClient } from '@supabase/realtime-js';
import { anonClaims, close, database, jwt, startSidecar, subscribed, waitFor } from './harness.mjs';

const SECRET = 'test-secret-with-at-least-32-characters';
const apikey = jwt(SECRET, anonClaims());
const U1 = '33333333-aaaa-4aaa-8aaa-333333333333';
const userToken = (sub) => jwt(SECRET, { role: 'authenticated', sub, exp: Math.floor(Date.now() / 1000) + 3600 });

let sidecar;
let port;
let db;

before(async () => {
  db = await database();
  await db.query(fs.readFileSync(new URL('../../pgbench/supabase_auth.sql', import.meta.url), 'utf8'));
  await db.query(`
    DROP TABLE IF EXISTS pcr_tasks, pcr_notes, pcr_posts CASCADE;
    CREATE TABLE pcr_tasks (id bigint PRIMARY KEY, run text NOT NULL, title text);
    GRANT SELECT ON pcr_tasks TO anon, authenticated;
    CREATE TABLE pcr_notes (id bigint PRIMARY KEY, owner uuid NOT NULL, body text);
    ALTER TABLE pcr_notes ENABLE ROW LEVEL SECURITY;
    CREATE POLICY own ON pcr_notes FOR SELECT TO authenticated USING (owner = auth.uid());
    GRANT SELECT ON pcr_notes TO authenticated;
    CREATE TABLE pcr_posts (id bigint PRIMARY KEY, status text NOT NULL, body text);
    ALTER TABLE pcr_posts REPLICA IDENTITY FULL;
    ALTER TABLE pcr_posts ENABLE ROW LEVEL SECURITY;
    CREATE POLICY published ON pcr_posts FOR SELECT TO anon USING (status = 'published');
    GRANT SELECT ON pcr_posts TO anon;
    ALTER PUBLICATION supabase_realtime ADD TABLE pcr_tasks, pcr_notes, pcr_posts;`);
  ({ process: sidecar, port } = await startSidecar(SECRET, 'postgres_changes_resume_e2e'));
});

after(async () => {
  await db?.query('ALTER PUBLICATION supabase_realtime DROP TABLE pcr_tasks, pcr_notes, pcr_posts').catch(() => {});
  await db?.end();
  sidecar?.kill('SIGTERM');
});

/// A client whose sockets the test can drop (terminate: no close frame, as a network loss).
function client(vsn, sockets = []) {
  class Tracked extends WebSocket {
    constructor(...args) {
      super(...args);
      sockets.push(this);
    }
  }
  return new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: Tracked, params: { apikey }, vsn });
}

/// What sidecar/README.md tells apps to do: keep the position of each `system` message that
/// carries one in the join payload, so a rejoin (automatic or not) resumes there.
function remember(channel, systems) {
  channel.on('system', {}, (s) => {
    systems.push(s);
    if (s.seq === undefined || s.seq === null || s.epoch === undefined) return;
    const { config } = channel.joinPush.payload();
    channel.updateJoinPayload({ config: { ...config, broadcast: { ...config.broadcast, resume: { epoch: s.epoch, seq: s.seq, changes: true } } } });
  });
}

const position = (channel) => channel.joinPush.payload().config.broadcast.resume;

/// The queue's last position now, as a resume names it.
const stats = async () => (await db.query('SELECT last_seq::int8 AS seq, (extract(epoch FROM epoch) * 1000000)::int8::text AS epoch FROM realtime.stats()')).rows[0];

for (const vsn of ['1.0.0', '2.0.0']) {
  test(`realtime-js (${vsn}): a socket dropped under 500 changes/s loses no change and gets none twice`, async () => {
    const run = `drop-${vsn}-${Date.now()}`;
    const base = vsn === '1.0.0' ? 1_000_000 : 2_000_000;
    const sockets = [];
    const c = client(vsn, sockets);
    let writer;
    try {
      await c.setAuth(apikey);
      const channel = c.channel(`tasks-${run}`, { config: { broadcast: { resume: { changes: true } } } });
      const seen = [];
      const systems = [];
      channel.on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'pcr_tasks', filter: `run=eq.${run}` }, (p) => seen.push(Number(p.new.id) - base));
      remember(channel, systems);
      await subscribed(channel);
      // 500 changes a second for 4 seconds, committed whatever happens to the socket.
      const total = 2000;
      writer = (async () => {
        const w = await database();
        try {
          for (let n = 0; n < total; n += 5) {
            await w.query('INSERT INTO pcr_tasks SELECT $1::bigint + g, $2, $3 FROM generate_series($4::int, $5::int) g', [base, run, 'task', n, n + 4]);
            await new Promise((r) => setTimeout(r, 10));
          }
        } finally {
          await w.end();
        }
      })();
      await waitFor(() => seen.length >= 300, 20000, '300 changes');
      assert.ok(position(channel)?.seq > 0, 'a position arrived with the changes');
      // Dropped outside any callback: the frames already read are all handed to the app.
      await new Promise((r) => setTimeout(r, 0));
      sockets.at(-1).terminate();
      await writer;
      await waitFor(() => seen.length >= total, 40000, `all ${total} changes (have ${seen.length})`);
      assert.deepEqual(seen, [...Array(total).keys()], 'every change once, in commit order');
      assert.ok(sockets.length >= 2, 'realtime-js reconnected');
      const resumed = systems.filter((s) => 'recovered' in s);
      assert.ok(resumed.length >= 1, JSON.stringify(systems.slice(-5)));
      assert.ok(resumed.every((s) => s.recovered === true && s.changes >= 0), JSON.stringify(resumed));
      assert.match(resumed[0].message, /checked as the channel's role may read them now/);
    } finally {
      await writer?.catch(() => {});
      await close(c);
    }
  });

  test(`realtime-js (${vsn}): a resumed change is checked as the subscriber may read it at the rejoin`, async () => {
    const base = vsn === '1.0.0' ? 1000 : 2000;
    const topic = `notes-${vsn}-${Date.now()}`;
    const join = (c, resume, got, systems) => {
      const channel = c.channel(topic, { config: { broadcast: { resume } } });
      channel.on('postgres_changes', { event: '*', schema: 'public', table: 'pcr_notes' }, (p) =>
        got.push([p.eventType, Number((p.eventType === 'DELETE' ? p.old : p.new).id) - base]));
      remember(channel, systems);
      return channel;
    };
    // Subscribed, sees one change, and leaves with its position.
    const first = client(vsn);
    let at;
    try {
      await first.setAuth(userToken(U1));
      const got = [];
      const systems = [];
      const channel = join(first, { changes: true }, got, systems);
      await subscribed(channel);
      await db.query('INSERT INTO pcr_notes VALUES ($1, $2, $3)', [base + 1, U1, 'seen']);
      await waitFor(() => got.length >= 1 && position(channel)?.seq, 10000, 'the first change and its position');
      at = position(channel);
      assert.deepEqual(got, [['INSERT', 1]]);
    } finally {
      await close(first);
    }
    // While it is away: 2 and 4 stay readable; 3 is hidden by a policy changed since; 5 is
    // inserted and deleted (its INSERT is not resent, since the row is gone; its DELETE is).
    await db.query('INSERT INTO pcr_notes VALUES ($1, $2, $3), ($4, $2, $3), ($5, $2, $3), ($6, $2, $3)', [base + 2, U1, 'away', base + 3, base + 4, base + 5]);
    await db.query('DELETE FROM pcr_notes WHERE id = $1', [base + 5]);
    await db.query(`DROP POLICY own ON pcr_notes; CREATE POLICY own ON pcr_notes FOR SELECT TO authenticated USING (owner = auth.uid() AND id NOT IN (1003, 2003))`);
    const again = client(vsn);
    try {
      await again.setAuth(userToken(U1));
      const got = [];
      const systems = [];
      const channel = join(again, at, got, systems);
      await subscribed(channel);
      await waitFor(() => systems.some((s) => 'recovered' in s), 10000, 'the resume system message');
      await db.query('INSERT INTO pcr_notes VALUES ($1, $2, $3)', [base + 6, U1, 'live']);
      await waitFor(() => got.some(([, id]) => id === 6), 10000, 'the live change');
      assert.deepEqual(got, [['INSERT', 2], ['INSERT', 4], ['DELETE', 5], ['INSERT', 6]]);
      const resumed = systems.find((s) => 'recovered' in s);
      assert.equal(resumed.recovered, true, JSON.stringify(resumed));
      assert.equal(resumed.changes, 3, JSON.stringify(resumed));
      assert.ok(Number(resumed.seq) > Number(at.seq), JSON.stringify(resumed));
    } finally {
      await close(again);
      await db.query(`DROP POLICY own ON pcr_notes; CREATE POLICY own ON pcr_notes FOR SELECT TO authenticated USING (owner = auth.uid())`);
    }
  });

  // Regression (issue 39, H3): a resume checked each change against the row as it is at the
  // rejoin and sent the version the change recorded, so a post inserted as a hidden draft and
  // published while the subscriber was away was resent with the draft's text.
  test(`realtime-js (${vsn}): a draft published after the subscriber left is not resent with its draft text`, async () => {
    const base = vsn === '1.0.0' ? 100 : 200;
    const topic = `posts-${vsn}-${Date.now()}`;
    const join = (c, resume, got, systems) => {
      const channel = c.channel(topic, { config: { broadcast: { resume } } });
      channel.on('postgres_changes', { event: '*', schema: 'public', table: 'pcr_posts' }, (p) => got.push(p));
      remember(channel, systems);
      return channel;
    };
    const first = client(vsn);
    let at;
    try {
      await first.setAuth(apikey);
      const got = [];
      const channel = join(first, { changes: true }, got, []);
      await subscribed(channel);
      await db.query(`INSERT INTO pcr_posts VALUES ($1, 'published', 'hello')`, [base + 1]);
      await waitFor(() => got.length >= 1 && position(channel)?.seq, 10000, 'the first post and its position');
      at = position(channel);
    } finally {
      await close(first);
    }
    // While it is away: a draft no anonymous reader may see, rewritten and published; and a
    // published post edited twice (only its latest text is resent).
    await db.query(`INSERT INTO pcr_posts VALUES ($1, 'draft', 'acquisition of X at $40M')`, [base + 2]);
    await db.query(`UPDATE pcr_posts SET status = 'published', body = 'Press release' WHERE id = $1`, [base + 2]);
    await db.query(`UPDATE pcr_posts SET body = 'hello, edited' WHERE id = $1`, [base + 1]);
    await db.query(`UPDATE pcr_posts SET body = 'hello, edited twice' WHERE id = $1`, [base + 1]);
    const again = client(vsn);
    try {
      await again.setAuth(apikey);
      const got = [];
      const systems = [];
      const channel = join(again, at, got, systems);
      await subscribed(channel);
      await waitFor(() => systems.some((s) => 'recovered' in s), 10000, 'the resume system message');
      await db.query(`INSERT INTO pcr_posts VALUES ($1, 'published', 'live')`, [base + 3]);
      await waitFor(() => got.some((p) => Number(p.new?.id) === base + 3), 10000, 'the live post');
      assert.ok(!JSON.stringify(got).includes('$40M'), `the draft's text was resent: ${JSON.stringify(got)}`);
      assert.deepEqual(got.map((p) => [p.eventType, Number(p.new.id) - base, p.new.body, p.old]),
        [['UPDATE', 2, 'Press release', { id: base + 2 }],
         ['UPDATE', 1, 'hello, edited twice', { id: base + 1 }],
         ['INSERT', 3, 'live', {}]]);
      const resumed = systems.find((s) => 'recovered' in s);
      assert.equal(resumed.recovered, true, JSON.stringify(resumed));
      assert.equal(resumed.changes, 2, JSON.stringify(resumed));
      assert.match(resumed.message, /still holds what it wrote/);
    } finally {
      await close(again);
    }
  });

  test(`realtime-js (${vsn}): a resume past the ring's retention says recovered: false with the range`, async () => {
    const base = vsn === '1.0.0' ? 10_000 : 20_000;
    const run = `evicted-${vsn}-${Date.now()}`;
    const { rows } = await db.query('SELECT last_seq::text AS seq, (extract(epoch FROM epoch) * 1000000)::int8::text AS epoch FROM realtime.stats()');
    const at = { epoch: rows[0].epoch, seq: Number(rows[0].seq), changes: true };
    await db.query('INSERT INTO pcr_tasks VALUES ($1, $2, $3)', [base + 1, run, 'evicted']);
    // More than the whole ring (scripts/test.sh: realtime.queue_size = 32MB) on another topic.
    const { rows: cap } = await db.query('SELECT capacity_bytes FROM realtime.stats()');
    for (let i = 0; i < Number(cap[0].capacity_bytes) / 900_000 + 2; i++) {
      await db.query(`SELECT realtime.send(jsonb_build_object('pad', repeat('x', 900000)), 'pad', 'evict', false)`);
    }
    await db.query('INSERT INTO pcr_tasks VALUES ($1, $2, $3)', [base + 2, run, 'kept']);
    const c = client(vsn);
    try {
      await c.setAuth(apikey);
      const got = [];
      const systems = [];
      const channel = c.channel(`tasks-${run}`, { config: { broadcast: { resume: at } } });
      channel.on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'pcr_tasks', filter: `run=eq.${run}` }, (p) => got.push(Number(p.new.id) - base));
      remember(channel, systems);
      await subscribed(channel);
      await waitFor(() => systems.some((s) => 'recovered' in s), 10000, 'the resume system message');
      const resumed = systems.find((s) => 'recovered' in s);
      assert.equal(resumed.recovered, false, JSON.stringify(resumed));
      assert.equal(resumed.first_missing, at.seq + 1, JSON.stringify(resumed));
      assert.ok(resumed.last_missing > at.seq + 1, JSON.stringify(resumed));
      assert.deepEqual(got, [2], 'the change the ring still holds was sent');
    } finally {
      await close(c);
    }
  });
}

// Regression: when a resume's history was sent, the live changes its gate had held went out
// behind every change of the channel whose check was still running, so a change held by the
// gate came after a later change. Here the history's check of a change made while away takes
// 2 s (a policy that sleeps); meanwhile a fast table's change (held by the gate) and then a
// slow table's change (its check running 4 s) are committed: the fast one must come first.
test('realtime-js: a change the gate held is not let out after a later change whose check was still running', async () => {
  const { process: slow, port: slowPort } = await startSidecar(SECRET, 'postgres_changes_resume_merge', { CHANGES_CHECK_TIMEOUT_MS: '15000' });
  const run = `merge-${Date.now()}`;
  const c = new RealtimeClient(`ws://127.0.0.1:${slowPort}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  try {
    await db.query(`
      DROP TABLE IF EXISTS pcr_slow, pcr_fast CASCADE;
      CREATE OR REPLACE FUNCTION pcr_pause(s float8) RETURNS boolean LANGUAGE plpgsql AS
        'BEGIN PERFORM pg_sleep(s); RETURN true; END';
      CREATE TABLE pcr_slow (id bigint PRIMARY KEY, run text NOT NULL, pause float8 NOT NULL);
      ALTER TABLE pcr_slow ENABLE ROW LEVEL SECURITY;
      CREATE POLICY pause ON pcr_slow FOR SELECT TO anon USING (pcr_pause(pause));
      CREATE TABLE pcr_fast (id bigint PRIMARY KEY, run text NOT NULL);
      GRANT SELECT ON pcr_slow, pcr_fast TO anon;
      ALTER PUBLICATION supabase_realtime ADD TABLE pcr_slow, pcr_fast;`);
    const { rows } = await db.query('SELECT last_seq::text AS seq, (extract(epoch FROM epoch) * 1000000)::int8::text AS epoch FROM realtime.stats()');
    const at = { epoch: rows[0].epoch, seq: Number(rows[0].seq), changes: true };
    // Made while away: the history's check of 1 sleeps 2 s.
    await db.query('INSERT INTO pcr_slow VALUES (1, $1, 2)', [run]);
    await db.query('INSERT INTO pcr_fast VALUES (2, $1)', [run]);
    await c.setAuth(apikey);
    const log = [];
    const channel = c.channel(`merge-${run}`, { config: { broadcast: { resume: at } } });
    for (const table of ['pcr_slow', 'pcr_fast']) {
      channel.on('postgres_changes', { event: 'INSERT', schema: 'public', table, filter: `run=eq.${run}` }, (p) => log.push(Number(p.new.id)));
    }
    channel.on('system', {}, (s) => 'recovered' in s && log.push(`recovered: ${s.recovered}`));
    await subscribed(channel);
    // The history is being checked (its connection sleeps in the policy): what commits now
    // is live, held by the gate until the history is sent.
    const sleeping = async () => Number((await db.query(`SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event = 'PgSleep'`)).rows[0].n);
    const deadline = Date.now() + 10_000;
    while ((await sleeping()) < 1) {
      assert.ok(Date.now() < deadline, 'the history check of change 1 never began');
      await new Promise((r) => setTimeout(r, 20));
    }
    // 3 on the fast table, then 4, whose check sleeps 4 s: tables are checked on connections of
    // their own, so 3 is decided at once (and held), and 4 is pending when the 2 s are over.
    await db.query('INSERT INTO pcr_fast VALUES (3, $1)', [run]);
    await db.query('INSERT INTO pcr_slow VALUES (4, $1, 4)', [run]);
    await waitFor(() => log.includes(4), 30_000, `change 4 (have ${JSON.stringify(log)})`);
    assert.deepEqual(log, [1, 2, 'recovered: true', 3, 4], 'history, the resume message, then live changes in commit order');
  } finally {
    await close(c);
    slow.kill('SIGTERM');
    await db.query('ALTER PUBLICATION supabase_realtime DROP TABLE pcr_slow, pcr_fast').catch(() => {});
  }
});

test('realtime-js: resent changes count against MAX_RESUME_MESSAGES with the broadcasts; beyond it the newest are sent and the range that was not', async () => {
  const { process: limited, port: limitedPort } = await startSidecar(SECRET, 'postgres_changes_resume_limit', { MAX_RESUME_MESSAGES: '5' });
  const run = `limit-${Date.now()}`;
  const topic = `tasks-${run}`;
  const c = new RealtimeClient(`ws://127.0.0.1:${limitedPort}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  try {
    const start = await stats();
    const at = { epoch: start.epoch, seq: Number(start.seq), changes: true };
    // Four changes and four broadcasts on the channel's topic, alternating, each at a
    // position read back: eight after the position, three more than the limit.
    const positions = [];
    for (let i = 1; i <= 4; i++) {
      await db.query('INSERT INTO pcr_tasks VALUES ($1, $2, $3)', [30_000 + i, run, 'over']);
      positions.push(['change', i, Number((await stats()).seq)]);
      await db.query(`SELECT realtime.send(jsonb_build_object('n', $2::int), 'n', $1, false)`, [topic, i]);
      positions.push(['broadcast', i, Number((await stats()).seq)]);
    }
    await c.setAuth(apikey);
    const got = [];
    const systems = [];
    const channel = c.channel(topic, { config: { broadcast: { resume: at } } });
    channel.on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'pcr_tasks', filter: `run=eq.${run}` }, (p) => got.push(['change', Number(p.new.id) - 30_000]));
    channel.on('broadcast', { event: 'n' }, (m) => got.push(['broadcast', m.payload.n]));
    remember(channel, systems);
    await subscribed(channel);
    await waitFor(() => systems.some((s) => 'recovered' in s), 10000, 'the resume system message');
    const resumed = systems.find((s) => 'recovered' in s);
    // The newest five, in commit order, whichever kind.
    assert.deepEqual(got, positions.slice(3).map(([kind, n]) => [kind, n]));
    assert.equal(resumed.recovered, false, JSON.stringify(resumed));
    assert.equal(resumed.first_missing, at.seq + 1, JSON.stringify(resumed));
    assert.equal(resumed.last_missing, positions[3][2] - 1, JSON.stringify(resumed));
    assert.match(resumed.message, /MAX_RESUME_MESSAGES \(5\)/);
    assert.equal(resumed.resent, 5);
    assert.equal(resumed.changes, 2);
  } finally {
    await close(c);
    limited.kill('SIGTERM');
  }
});

// Issue 39, H2: a resume was bounded by its number of messages only, and a message may be a
// megabyte. Now by its bytes too: the newest that fit MAX_RESUME_BYTES are sent, changes
// and broadcasts together in commit order, and the client is told the range that was not.
test('realtime-js: a resume was bounded in messages, not bytes; beyond MAX_RESUME_BYTES the newest are sent and the range that was not', async () => {
  const { process: limited, port: limitedPort } = await startSidecar(SECRET, 'postgres_changes_resume_bytes', { MAX_RESUME_BYTES: '20000' });
  const run = `bytes-${Date.now()}`;
  const topic = `tasks-${run}`;
  const c = new RealtimeClient(`ws://127.0.0.1:${limitedPort}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  try {
    const start = await stats();
    const at = { epoch: start.epoch, seq: Number(start.seq), changes: true };
    // Eight changes and eight broadcasts of about 3 KB each, alternating: about 50 KB.
    const positions = [];
    for (let i = 1; i <= 8; i++) {
      await db.query('INSERT INTO pcr_tasks VALUES ($1, $2, $3)', [40_000 + i, run, 'x'.repeat(3000)]);
      positions.push(['change', i, Number((await stats()).seq)]);
      await db.query(`SELECT realtime.send(jsonb_build_object('n', $2::int, 'pad', repeat('y', 3000)), 'n', $1, false)`, [topic, i]);
      positions.push(['broadcast', i, Number((await stats()).seq)]);
    }
    await c.setAuth(apikey);
    const got = [];
    const systems = [];
    const channel = c.channel(topic, { config: { broadcast: { resume: at } } });
    channel.on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'pcr_tasks', filter: `run=eq.${run}` }, (p) => got.push(['change', Number(p.new.id) - 40_000]));
    channel.on('broadcast', { event: 'n' }, (m) => got.push(['broadcast', m.payload.n]));
    remember(channel, systems);
    await subscribed(channel);
    await waitFor(() => systems.some((s) => 'recovered' in s), 10000, 'the resume system message');
    const resumed = systems.find((s) => 'recovered' in s);
    // The newest that fit 20,000 bytes (some, not all), in commit order, whichever kind.
    assert.ok(got.length > 0 && got.length < 16, `sent ${got.length} of 16`);
    const kept = positions.slice(positions.length - got.length);
    assert.deepEqual(got, kept.map(([kind, n]) => [kind, n]));
    assert.equal(resumed.recovered, false, JSON.stringify(resumed));
    assert.equal(resumed.first_missing, at.seq + 1, JSON.stringify(resumed));
    assert.equal(resumed.last_missing, kept[0][2] - 1, JSON.stringify(resumed));
    assert.match(resumed.message, /^The messages after position \d+ take more than MAX_RESUME_BYTES \(20000 bytes\): messages \d+ to \d+ were not sent/);
    assert.equal(resumed.resent, got.length);
  } finally {
    await close(c);
    limited.kill('SIGTERM');
  }
});

// Issue 39, H2: each chunk of POLL_MAX_CHANGES resumed changes was checked under a
// CHANGES_CHECK_TIMEOUT_MS of its own, so one resume held the single history worker for
// up to 100 of them. Now all the checks of one resume share RESUME_CHECK_TIMEOUT_MS: what
// is not checked by then is withheld, in order, and the client is told.
test('realtime-js: one resume held the history worker for a check budget per chunk; now one budget for all its chunks', async () => {
  const { process: limited, port: limitedPort } = await startSidecar(SECRET, 'postgres_changes_resume_budget', { RESUME_CHECK_TIMEOUT_MS: '300' });
  const c = new RealtimeClient(`ws://127.0.0.1:${limitedPort}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  try {
    await db.query(`
      DROP TABLE IF EXISTS pcr_slow CASCADE;
      CREATE OR REPLACE FUNCTION pcr_slow_ok() RETURNS boolean LANGUAGE sql VOLATILE AS $$ SELECT pg_sleep(0.001) IS NOT NULL $$;
      CREATE TABLE pcr_slow (id bigint PRIMARY KEY, body text);
      ALTER TABLE pcr_slow ENABLE ROW LEVEL SECURITY;
      CREATE POLICY slow ON pcr_slow FOR SELECT TO anon USING (pcr_slow_ok());
      GRANT SELECT ON pcr_slow TO anon;
      ALTER PUBLICATION supabase_realtime ADD TABLE pcr_slow;`);
    const start = await stats();
    const at = { epoch: start.epoch, seq: Number(start.seq), changes: true };
    // 400 changes: four chunks of 100, each 0.1 to 0.4 s of policy (1 ms a row read: the
    // lookup reads its 100 rows by key or all 400), well within its own
    // CHANGES_CHECK_TIMEOUT_MS (2 s), together past 300 ms.
    await db.query(`INSERT INTO pcr_slow SELECT g, 'b' FROM generate_series(1, 400) g`);
    await c.setAuth(apikey);
    const got = [];
    const systems = [];
    const channel = c.channel(`slow-${Date.now()}`, { config: { broadcast: { resume: at } } });
    channel.on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'pcr_slow' }, (p) => got.push(Number(p.new.id)));
    remember(channel, systems);
    await subscribed(channel);
    await waitFor(() => systems.some((s) => 'recovered' in s), 20000, 'the resume system message');
    const resumed = systems.find((s) => 'recovered' in s);
    // What was checked in time came, in order from the first; the rest was withheld.
    assert.ok(got.length < 400, `all ${got.length} were checked`);
    assert.deepEqual(got, Array.from({ length: got.length }, (_, i) => i + 1));
    assert.equal(resumed.recovered, false, JSON.stringify(resumed));
    assert.ok(resumed.withheld >= 1, JSON.stringify(resumed));
    assert.equal(resumed.changes, got.length, JSON.stringify(resumed));
    assert.match(resumed.message, /could not be checked in time and were withheld/);
    assert.ok(systems.some((s) => /^Changes to public\.pcr_slow could not be authorized/.test(s.message ?? '')),
      JSON.stringify(systems.map((s) => s.message)));
  } finally {
    await close(c);
    limited.kill('SIGTERM');
    await db.query('ALTER PUBLICATION supabase_realtime DROP TABLE pcr_slow').catch(() => {});
  }
});

// Issue 39, L2: a resume counted the changes its bindings matched before they were checked,
// so changes the subscriber may not see counted against MAX_RESUME_MESSAGES, and the range
// a cut resume reported told their positions. Now only what it may see is counted.
test('realtime-js: changes hidden from the subscriber counted against MAX_RESUME_MESSAGES and told their positions', async () => {
  const { process: limited, port: limitedPort } = await startSidecar(SECRET, 'postgres_changes_resume_counted', { MAX_RESUME_MESSAGES: '3' });
  const OTHER = '44444444-aaaa-4aaa-8aaa-444444444444';
  const base = 60_000 + (Date.now() % 100_000) * 10;
  const topic = `notes-counted-${base}`;
  const c = new RealtimeClient(`ws://127.0.0.1:${limitedPort}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  try {
    const start = await stats();
    const at = { epoch: start.epoch, seq: Number(start.seq), changes: true };
    // Two rows of another user (hidden from U1 by the policy), two broadcasts on the
    // channel's topic, one row of U1's own: five after the position, three it may see.
    await db.query('INSERT INTO pcr_notes VALUES ($1, $2, $3), ($4, $2, $3)', [base + 1, OTHER, 'hidden', base + 2]);
    await db.query(`SELECT realtime.send(jsonb_build_object('n', g), 'n', $1, false) FROM generate_series(1, 2) g`, [topic]);
    await db.query('INSERT INTO pcr_notes VALUES ($1, $2, $3)', [base + 3, U1, 'mine']);
    await c.setAuth(userToken(U1));
    const got = [];
    const systems = [];
    const channel = c.channel(topic, { config: { broadcast: { resume: at } } });
    channel.on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'pcr_notes' }, (p) => got.push(['change', Number(p.new.id) - base]));
    channel.on('broadcast', { event: 'n' }, (m) => got.push(['broadcast', m.payload.n]));
    remember(channel, systems);
    await subscribed(channel);
    await waitFor(() => systems.some((s) => 'recovered' in s), 10000, 'the resume system message');
    const resumed = systems.find((s) => 'recovered' in s);
    assert.deepEqual(got, [['broadcast', 1], ['broadcast', 2], ['change', 3]]);
    assert.equal(resumed.recovered, true, JSON.stringify(resumed));
    assert.equal(resumed.resent, 3, JSON.stringify(resumed));
    assert.equal(resumed.changes, 1, JSON.stringify(resumed));
  } finally {
    await close(c);
    limited.kill('SIGTERM');
  }
});

// Issue 39, H4: realtime.history decoded every change a resume asked for in one call, so
// a table's newest 10,001 changes of a row that decodes to 100 kB were a gigabyte in one
// backend and more in the sidecar. Now each table gets a share of the call's
// realtime.drain_max_decoded_size: its newest changes that fit are resent, and the client
// is told the range left out. (The bound is a superuser's setting: this sidecar logs in as
// a role of its own, with the sidecar's rights and 1 MB set on it.)
test('realtime-js: a resume decoded every change of a large row at once; now its newest that fit are resent and the range that was not', async () => {
  await db.query(`
    DO $$ BEGIN
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pcr_small_decode') THEN
        CREATE ROLE pcr_small_decode LOGIN;
      END IF;
    END $$;
    GRANT realtime_sidecar TO pcr_small_decode;
    ALTER ROLE pcr_small_decode SET realtime.drain_max_decoded_size = '1MB';
    DROP TABLE IF EXISTS pcr_large;
    CREATE TABLE pcr_large (id bigint PRIMARY KEY, n int NOT NULL, body text);
    GRANT SELECT ON pcr_large TO anon;
    ALTER PUBLICATION supabase_realtime ADD TABLE pcr_large;`);
  const dsn = `${process.env.PG_REALTIME_SIDECAR_DSN} user=pcr_small_decode`;
  const { process: small, port: smallPort } = await startSidecar(SECRET, 'postgres_changes_resume_decoded', { DATABASE_URL: dsn });
  const c = new RealtimeClient(`ws://127.0.0.1:${smallPort}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  try {
    const start = await stats();
    const at = { epoch: start.epoch, seq: Number(start.seq), changes: true };
    // 30 changes of about 100 kB each once decoded (the value compresses to a few kB).
    const positions = [];
    await db.query(`INSERT INTO pcr_large VALUES (1, 0, repeat('a', 100000))`);
    positions.push(Number((await stats()).seq));
    for (let n = 1; n < 30; n++) {
      await db.query('UPDATE pcr_large SET n = $1', [n]);
      positions.push(Number((await stats()).seq));
    }
    await c.setAuth(apikey);
    const got = [];
    const systems = [];
    const channel = c.channel(`large-${Date.now()}`, { config: { broadcast: { resume: at } } });
    channel.on('postgres_changes', { event: '*', schema: 'public', table: 'pcr_large' }, (p) => got.push(p.new.n));
    remember(channel, systems);
    await subscribed(channel);
    await waitFor(() => systems.some((s) => 'recovered' in s), 10000, 'the resume system message');
    const resumed = systems.find((s) => 'recovered' in s);
    // The newest that fit 1 MB (some, not all), in order.
    assert.ok(got.length > 0 && got.length < 30, `resent ${got.length} of 30`);
    assert.deepEqual(got, Array.from({ length: got.length }, (_, i) => 30 - got.length + i));
    assert.equal(resumed.recovered, false, JSON.stringify(resumed));
    assert.equal(resumed.first_missing, at.seq + 1, JSON.stringify(resumed));
    assert.equal(resumed.last_missing, positions[30 - got.length] - 1, JSON.stringify(resumed));
    assert.match(resumed.message, /^The changes after position \d+ decode to more than one history call returns \(realtime\.drain_max_decoded_size/);
  } finally {
    await close(c);
    small.kill('SIGTERM');
    await db.query('ALTER PUBLICATION supabase_realtime DROP TABLE pcr_large').catch(() => {});
  }
});
