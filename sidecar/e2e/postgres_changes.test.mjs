// Postgres Changes end to end with the official @supabase/realtime-js client: a table added
// to publication supabase_realtime while the sidecar runs, changes of every type with
// realtime-js's type conversion, filters, `select`, and Supabase's authorization (RLS on
// INSERT and UPDATE, columns the role may not read left out, DELETE reduced to the key).
// Absence is proven by order, never by waiting: a channel gets its changes in commit
// order, so once it has a later row, an earlier one it did not get will never come.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import WebSocket from 'ws';
import { RealtimeClient, postgresChangesFilter } from '@supabase/realtime-js';
import { anonClaims, close, database, jwt, startSidecar, subscribed, waitFor, withTimeout } from './harness.mjs';

const SECRET = 'test-secret-with-at-least-32-characters';
const apikey = jwt(SECRET, anonClaims());
const U1 = '11111111-aaaa-4aaa-8aaa-111111111111';
const U2 = '22222222-aaaa-4aaa-8aaa-222222222222';
const userToken = (sub) => jwt(SECRET, { role: 'authenticated', sub, exp: Math.floor(Date.now() / 1000) + 3600 });

let sidecar;
let port;
let db;

before(async () => {
  db = await database();
  await db.query(fs.readFileSync(new URL('../../pgbench/supabase_auth.sql', import.meta.url), 'utf8'));
  await db.query(`
    DROP TABLE IF EXISTS pc_items, pc_notes, pc_hidden, pc_room_members, pc_room_msgs CASCADE;
    CREATE TABLE pc_room_members (user_id uuid, room int, PRIMARY KEY (user_id, room));
    CREATE TABLE pc_room_msgs (id bigserial PRIMARY KEY, room int NOT NULL, owner uuid, body text);
    ALTER TABLE pc_room_msgs ENABLE ROW LEVEL SECURITY;
    CREATE POLICY member_or_owner ON pc_room_msgs FOR SELECT TO authenticated
      USING (owner = auth.uid() OR EXISTS (SELECT 1 FROM pc_room_members m WHERE m.user_id = auth.uid() AND m.room = pc_room_msgs.room));
    GRANT SELECT ON pc_room_members, pc_room_msgs TO authenticated;
    CREATE TABLE pc_items (id bigint PRIMARY KEY, title text, done boolean, tags text[], meta jsonb,
                           at timestamptz, price numeric);
    GRANT SELECT ON pc_items TO anon, authenticated;
    CREATE TABLE pc_notes (id bigint PRIMARY KEY, owner uuid NOT NULL, body text, secret text);
    ALTER TABLE pc_notes ENABLE ROW LEVEL SECURITY;
    CREATE POLICY own ON pc_notes FOR SELECT TO authenticated USING (owner = auth.uid());
    GRANT SELECT (id, owner, body) ON pc_notes TO authenticated;
    CREATE TABLE pc_hidden (id bigint PRIMARY KEY);
    GRANT SELECT ON pc_hidden TO authenticated;`);
  // Published while no sidecar runs yet and, below, one table while it runs.
  await db.query('ALTER PUBLICATION supabase_realtime ADD TABLE pc_items');
  ({ process: sidecar, port } = await startSidecar(SECRET, 'postgres_changes_e2e'));
  await db.query('ALTER PUBLICATION supabase_realtime ADD TABLE pc_notes, pc_room_msgs');
});

after(async () => {
  await db?.end();
  sidecar?.kill('SIGTERM');
});

async function connect(token, vsn = '2.0.0') {
  const client = new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey }, vsn });
  await client.setAuth(token);
  return client;
}

/// Collects what a listener receives; `until(n)` resolves once n have arrived.
function collector() {
  const got = [];
  let waiting = [];
  return {
    got,
    push(m) {
      got.push(m);
      waiting = waiting.filter(([n, resolve]) => (got.length >= n ? (resolve(got), false) : true));
    },
    until(n, what) {
      return withTimeout(new Promise((resolve) => (got.length >= n ? resolve(got) : waiting.push([n, resolve]))), 10000, what);
    },
  };
}

for (const vsn of ['1.0.0', '2.0.0']) {
  test(`realtime-js (${vsn}) receives INSERT, UPDATE and DELETE with its types converted, and filters apply`, async () => {
    const base = vsn === '1.0.0' ? 1000 : 2000;
    const client = await connect(apikey, vsn);
    try {
      const all = collector();
      const one = collector();
      const some = collector();
      const system = collector();
      const channel = client
        .channel(`items-${vsn}`, { config: { broadcast: { replication_ready: true } } })
        .on('postgres_changes', { event: '*', schema: 'public', table: 'pc_items' }, (m) => all.push(m))
        .on('postgres_changes', { event: 'UPDATE', schema: 'public', table: 'pc_items', filter: `id=eq.${base + 1}` }, (m) => one.push(m))
        .on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'pc_items', filter: `id=in.(${base + 2},${base + 3})` }, (m) => some.push(m))
        .on('system', {}, (m) => system.push(m));
      await subscribed(channel);
      await db.query(
        `INSERT INTO pc_items VALUES ($1, 'first', false, '{a,b}', '{"k": [1, 2]}', '2026-01-02 03:04:05.678+02', 1.50)`,
        [base + 1],
      );
      await db.query('UPDATE pc_items SET title = $2, done = true WHERE id = $1', [base + 1, 'second']);
      await db.query('DELETE FROM pc_items WHERE id = $1', [base + 1]);
      await db.query(`INSERT INTO pc_items (id) SELECT g FROM generate_series($1::int8, $2::int8) g`, [base + 2, base + 4]);
      const [ins, upd, del] = await all.until(6, 'six changes');
      assert.equal(ins.eventType, 'INSERT');
      assert.equal(ins.schema, 'public');
      assert.equal(ins.table, 'pc_items');
      assert.match(ins.commit_timestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      assert.deepEqual(ins.new, {
        id: base + 1, title: 'first', done: false, tags: ['a', 'b'], meta: { k: [1, 2] },
        at: '2026-01-02T01:04:05.678+00:00', price: 1.5,
      });
      assert.deepEqual(ins.old, {});
      assert.equal(upd.eventType, 'UPDATE');
      assert.equal(upd.new.title, 'second');
      assert.equal(upd.new.done, true);
      assert.deepEqual(upd.old, { id: base + 1 }, 'REPLICA IDENTITY DEFAULT: the key');
      assert.equal(del.eventType, 'DELETE');
      assert.deepEqual(del.old, { id: base + 1 });
      assert.deepEqual(all.got.slice(3).map((m) => m.new.id), [base + 2, base + 3, base + 4]);
      // The filters: the UPDATE of base+1 only, the INSERTs of base+2 and base+3 only, each
      // delivered once (one frame listing every binding it matched).
      assert.deepEqual(one.got.map((m) => [m.eventType, m.new.id]), [['UPDATE', base + 1]]);
      assert.deepEqual(some.got.map((m) => m.new.id), [base + 2, base + 3]);
      const messages = system.got.map((m) => m.message);
      assert.ok(messages.includes('Subscribed to PostgreSQL'), messages);
      assert.ok(messages.includes('Replication connection established'), messages);
    } finally {
      await close(client);
    }
  });
}

test('realtime-js gets only the rows RLS lets it see, without the columns its role may not read', async () => {
  const c1 = await connect(userToken(U1));
  const c2 = await connect(userToken(U2));
  try {
    const seen1 = collector();
    const seen2 = collector();
    const ch1 = c1.channel('notes-1').on('postgres_changes', { event: '*', schema: 'public', table: 'pc_notes' }, (m) => seen1.push(m));
    const ch2 = c2.channel('notes-2').on('postgres_changes', { event: '*', schema: 'public', table: 'pc_notes' }, (m) => seen2.push(m));
    await subscribed(ch1);
    await subscribed(ch2);
    // A row is checked as it is when its change is delivered, as Supabase checks it, so
    // each step waits for the last: a row deleted before its INSERT was delivered would
    // (rightly) not be shown to anyone.
    await db.query(`INSERT INTO pc_notes VALUES (1, $1, 'mine', 's1'), (2, $2, 'theirs', 's2')`, [U1, U2]);
    await seen1.until(1, 'u1: own insert');
    await seen2.until(1, 'u2: own insert');
    await db.query(`UPDATE pc_notes SET body = 'mine too' WHERE id = 1`);
    await db.query(`UPDATE pc_notes SET body = 'theirs too' WHERE id = 2`);
    await seen1.until(2, 'u1: own update');
    await seen2.until(2, 'u2: own update');
    await db.query(`DELETE FROM pc_notes WHERE id = 1`);
    await seen1.until(3, 'u1: the delete');
    await seen2.until(3, 'u2: the delete');
    // Each saw its own row only (the other's came first in commit order and never arrived),
    // never `secret`, and the DELETE (not RLS-checked, as in Supabase) with the key alone.
    assert.deepEqual(seen1.got.map((m) => [m.eventType, m.new.id ?? m.old.id]), [['INSERT', 1], ['UPDATE', 1], ['DELETE', 1]]);
    assert.deepEqual(seen2.got.map((m) => [m.eventType, m.new.id ?? m.old.id]), [['INSERT', 2], ['UPDATE', 2], ['DELETE', 1]]);
    assert.deepEqual(seen1.got[0].new, { id: 1, owner: U1, body: 'mine' });
    assert.deepEqual(seen2.got[2].old, { id: 1 });
    // A new token for another user: from then on the rows are checked for that user.
    await c1.setAuth(userToken(U2));
    await db.query(`INSERT INTO pc_notes VALUES (3, $1, 'now u2', 's3')`, [U2]);
    await seen1.until(4, 'the row of the new identity');
    assert.equal(seen1.got[3].new.id, 3);
  } finally {
    await close(c1);
    await close(c2);
  }
});

test('realtime-js: a membership revoked while rows stream in stops them at once', async () => {
  await db.query('INSERT INTO pc_room_members VALUES ($1, 1)', [U1]);
  const client = await connect(userToken(U1));
  try {
    const got = collector();
    const channel = client
      .channel('room-1')
      .on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'pc_room_msgs' }, (m) => got.push(m));
    await subscribed(channel);
    // 150 rows while a member, the revocation, 150 rows after it, then a row of U1's own:
    // once that arrives, every row before it has been checked.
    let boundary = 0;
    for (let i = 0; i < 300; i++) {
      if (i === 150) {
        await db.query('DELETE FROM pc_room_members WHERE user_id = $1', [U1]);
      }
      const { rows } = await db.query(`INSERT INTO pc_room_msgs (room, body) VALUES (1, 'm' || $1) RETURNING id`, [i]);
      if (i === 149) boundary = Number(rows[0].id);
    }
    const { rows } = await db.query(`INSERT INTO pc_room_msgs (room, owner, body) VALUES (2, $1, 'mine') RETURNING id`, [U1]);
    const marker = Number(rows[0].id);
    await withTimeout(
      new Promise((resolve) => {
        const check = () => (got.got.some((m) => m.new.id === marker) ? resolve() : setTimeout(check, 20));
        check();
      }),
      10000,
      'the own row after the revocation',
    );
    const ids = got.got.map((m) => m.new.id);
    const after = ids.filter((id) => id > boundary && id !== marker);
    assert.deepEqual(after, [], 'rows committed after the revocation were delivered');
    // Rows committed before it reach the member unless the check ran after the revocation
    // (the row is checked as it is at delivery): never more than the 150, in order.
    assert.ok(ids.length <= 151, `${ids.length}`);
    assert.deepEqual(ids, [...ids].sort((a, b) => a - b));
  } finally {
    await close(client);
  }
});

test("realtime-js's filter builder: several conditions, not., like, is and in hold together", async () => {
  const client = await connect(apikey);
  try {
    const got = collector();
    const filter = postgresChangesFilter()
      .gte('id', 5000)
      .like('title', 'keep%')
      .not('title', 'like', '%skip%')
      .is('done', false)
      .in('price', [1, 2.5]);
    const channel = client
      .channel('items-builder')
      .on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'pc_items', filter }, (m) => got.push(m));
    await subscribed(channel);
    // Only 5001 holds every condition; 5006, last, holds them too and proves the others
    // (committed before it) were not delivered.
    await db.query(`INSERT INTO pc_items (id, title, done, price) VALUES
      (4999, 'keep', false, 1), (5001, 'keep me', false, 1), (5002, 'keep, skip', false, 1),
      (5003, 'Keep', false, 1), (5004, 'keep', true, 1), (5005, 'keep', false, 3), (5006, 'keeper', false, 2.5)`);
    await got.until(2, 'the two rows that hold');
    assert.deepEqual(got.got.map((m) => m.new.id), [5001, 5006]);
  } finally {
    await close(client);
  }
});

test('realtime-js: select narrows the columns delivered', async () => {
  const client = await connect(userToken(U1));
  try {
    const got = collector();
    const channel = client
      .channel('notes-select')
      .on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'pc_notes', select: ['id'] }, (m) => got.push(m));
    await subscribed(channel);
    await db.query(`INSERT INTO pc_notes VALUES (10, $1, 'x', 'y')`, [U1]);
    const [m] = await got.until(1, 'the insert');
    assert.deepEqual(m.new, { id: 10 });
  } finally {
    await close(client);
  }
});

// Supabase's max_record_bytes: a change larger than MAX_RECORD_BYTES keeps only its values of
// at most 64 bytes and says "Error 413: Payload Too Large". The sidecar sets it as its
// sessions' realtime.max_record_bytes, so the row is trimmed where it is decoded (issue 39,
// H4), and realtime-js gets Supabase's shape.
test('realtime-js: a change past MAX_RECORD_BYTES keeps its small values and says 413', async () => {
  const { process: small, port: smallPort } = await startSidecar(SECRET, 'postgres_changes_record_bytes', { MAX_RECORD_BYTES: '2000' });
  const client = new RealtimeClient(`ws://127.0.0.1:${smallPort}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  try {
    await client.setAuth(apikey);
    const got = collector();
    const channel = client
      .channel('items-413')
      .on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'pc_items' }, (m) => got.push(m));
    await subscribed(channel);
    await db.query(`INSERT INTO pc_items (id, title, done) VALUES (413, repeat('t', 5000), true), (414, 'small', false)`);
    const [large, small_] = await got.until(2, 'both inserts');
    assert.deepEqual(large.errors, ['Error 413: Payload Too Large']);
    assert.equal(large.new.id, 413);
    assert.equal(large.new.done, true);
    assert.ok(!('title' in large.new), JSON.stringify(large.new));
    assert.equal(small_.new.title, 'small');
    assert.ok(!small_.errors, JSON.stringify(small_.errors));
  } finally {
    await close(client);
    small.kill('SIGTERM');
  }
});

test('realtime-js: bindings the database cannot serve are not served; the channel joins and is told why', async () => {
  const client = await connect(userToken(U1));
  const reason = async (binding, topic) => {
    const told = [];
    const channel = client.channel(topic).on('postgres_changes', binding, () => {}).on('system', {}, (m) => {
      if (m.extension === 'postgres_changes' && m.status === 'error') told.push(m.message);
    });
    await subscribed(channel);
    await waitFor(() => told.length > 0, 10000, `${topic}'s system message`);
    await client.removeChannel(channel);
    return told[0];
  };
  try {
    assert.match(await reason({ event: '*', schema: 'public', table: 'pc_hidden' }, 'e1'),
      /InvalidPostgresChanges: binding 1: table public\.pc_hidden is not in publication supabase_realtime/);
    assert.match(await reason({ event: '*', schema: 'public', table: 'pc_nope' }, 'e2'),
      /table public\.pc_nope does not exist/);
    assert.match(await reason({ event: '*', schema: 'public', table: 'pc_notes', filter: 'nope=eq.1' }, 'e3'),
      /column nope does not exist in public\.pc_notes/);
    assert.match(await reason({ event: '*', schema: 'public', table: 'pc_notes', filter: 'id=eq.abc' }, 'e4'),
      /filter value 'abc' is not a valid bigint/);
    // A filter on a column the role may not read would leak it one question at a time.
    assert.match(await reason({ event: '*', schema: 'public', table: 'pc_notes', filter: 'secret=eq.s1' }, 'e5'),
      /role authenticated may not select column secret of public\.pc_notes/);
    assert.match(await reason({ event: '*', schema: 'public', table: 'pc_notes', filter: 'body=regex.^a' }, 'e6'),
      /PostgresChangesFilterNotSupported: binding 1: operator "regex" is not supported/);
    assert.match(await reason({ event: '*', schema: 'public', table: 'pc_notes', filter: 'id=like.1%' }, 'e7'),
      /like applies to text; column id of public\.pc_notes is of type bigint/);
  } finally {
    await close(client);
  }
});

test('realtime-js: a token naming a superuser role is not served Postgres Changes', async () => {
  const client = await connect(jwt(SECRET, { role: 'postgres', exp: Math.floor(Date.now() / 1000) + 3600 }));
  try {
    const told = [];
    const channel = client.channel('elevated').on('postgres_changes', { event: '*', schema: 'public', table: 'pc_items' }, () => {}).on('system', {}, (m) => {
      if (m.extension === 'postgres_changes' && m.status === 'error') told.push(m.message);
    });
    await subscribed(channel);
    await waitFor(() => told.length > 0, 10000, 'the system message');
    assert.match(told[0], /role "postgres" is a superuser/);
  } finally {
    await close(client);
  }
});

test('realtime-js: a bad binding beside a good one: the channel joins, the good one is served and the bad one told', async () => {
  const client = await connect(userToken(U1));
  try {
    const bad = collector();
    const good = collector();
    const told = [];
    const channel = client
      .channel('bad-beside-good')
      .on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'pc_nope' }, (m) => bad.push(m))
      .on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'pc_items', filter: 'id=eq.7001' }, (m) => good.push(m))
      .on('system', {}, (m) => {
        if (m.extension === 'postgres_changes') told.push(m);
      });
    await subscribed(channel);
    await waitFor(() => told.length >= 2, 10000, 'the system messages');
    const error = told.find((m) => m.status === 'error');
    assert.match(error.message, /^Unable to subscribe to changes with given parameters\. Please check Realtime is enabled for the given connect parameters: \[event: INSERT, schema: public, table: pc_nope\]\. InvalidPostgresChanges: binding 1: table public\.pc_nope does not exist$/);
    assert.ok(told.some((m) => m.status === 'ok' && m.message === 'Subscribed to PostgreSQL'), JSON.stringify(told));
    await db.query("INSERT INTO pc_items (id, title) VALUES (7001, 'served')");
    const [m] = await good.until(1, 'the good binding\'s change');
    assert.equal(m.new.title, 'served');
    assert.equal(bad.got.length, 0);
  } finally {
    await close(client);
  }
});

// Supabase matches a DELETE's filters against the whole old row under REPLICA IDENTITY FULL,
// without an RLS check: a user who may read none of the rows learns, binding by binding,
// what the deleted rows held. Here a DELETE on a table with RLS carries only its key and
// only key filters can match it (sidecar/README.md, Postgres Changes).
test('realtime-js: a user who owns no row, holding 20 salary=lt.N DELETE bindings on an RLS table, matches nothing', async () => {
  await db.query(`
    DROP TABLE IF EXISTS pc_salaries;
    CREATE TABLE pc_salaries (id bigint PRIMARY KEY, owner uuid NOT NULL, salary int NOT NULL);
    ALTER TABLE pc_salaries REPLICA IDENTITY FULL;
    ALTER TABLE pc_salaries ENABLE ROW LEVEL SECURITY;
    CREATE POLICY own ON pc_salaries FOR SELECT TO authenticated USING (owner = auth.uid());
    GRANT SELECT ON pc_salaries TO authenticated;
    ALTER PUBLICATION supabase_realtime ADD TABLE pc_salaries;`);
  const client = await connect(userToken(U2));
  try {
    const probes = [];
    let channel = client.channel('salaries');
    for (let k = 1; k <= 20; k++) {
      const c = collector();
      probes.push(c);
      channel = channel.on('postgres_changes', { event: 'DELETE', schema: 'public', table: 'pc_salaries', filter: `salary=lt.${k * 1000}` }, (m) => c.push(m));
    }
    const control = collector();
    channel = channel.on('postgres_changes', { event: 'DELETE', schema: 'public', table: 'pc_salaries', filter: 'id=eq.99' }, (m) => control.push(m));
    await subscribed(channel);
    await db.query(`INSERT INTO pc_salaries SELECT g, $1, g * 900 FROM generate_series(1, 20) g`, [U1]);
    await db.query(`INSERT INTO pc_salaries VALUES (99, $1, 500)`, [U1]);
    await db.query('DELETE FROM pc_salaries WHERE id <> 99');
    await db.query('DELETE FROM pc_salaries WHERE id = 99');
    // The control DELETE commits last: every earlier one has been judged when it arrives.
    const [m] = await control.until(1, 'the control DELETE');
    assert.deepEqual(m.old, { id: 99 }, 'the key only');
    assert.deepEqual(probes.map((p) => p.got.length), Array(20).fill(0));
  } finally {
    await close(client);
    await db.query('ALTER PUBLICATION supabase_realtime DROP TABLE pc_salaries; DROP TABLE pc_salaries');
  }
});
