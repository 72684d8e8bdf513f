// The pattern filters of Postgres Changes end to end with realtime-js's filter builder:
// `match` and `imatch` (Postgres's ~ and ~*) deliver what they match, negated with not.;
// an invalid pattern, an over-long one and one on a non-text column fail the subscription
// with their reason; a costly pattern withholds only its own channel's changes, told by a
// system message, while another channel of the same table gets the same change.
// Absence is proven by order: a channel gets its changes in commit order, so once it has
// the last row of a statement, an earlier one it did not get will never come.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { RealtimeClient, postgresChangesFilter } from '@supabase/realtime-js';
import { anonClaims, close, database, jwt, startSidecar, subscribed, waitFor, withTimeout } from './harness.mjs';

const SECRET = 'test-secret-with-at-least-32-characters';
const apikey = jwt(SECRET, anonClaims());
// Small limits, so that the test shows them: a pattern's time budget and length.
const BUDGET_MS = 200;
const MAX_LENGTH = 64;
// Back references over a long value: seconds of work for Postgres's regex engine (measured
// about 1.6 s over 61 characters; this value has 201).
const COSTLY = '^(.*)(.*)(.*)(.*)(.*)\\5\\4\\3\\2\\1$';

let sidecar;
let port;
let db;

before(async () => {
  db = await database();
  await db.query(`
    DROP TABLE IF EXISTS fp_posts CASCADE;
    CREATE TABLE fp_posts (id bigint PRIMARY KEY, title text);
    GRANT SELECT ON fp_posts TO anon;
    ALTER PUBLICATION supabase_realtime ADD TABLE fp_posts;`);
  ({ process: sidecar, port } = await startSidecar(SECRET, 'filter_patterns_e2e', {
    FILTER_PATTERN_TIMEOUT_MS: String(BUDGET_MS),
    MAX_FILTER_PATTERN_LENGTH: String(MAX_LENGTH),
  }));
});

after(async () => {
  await db?.end();
  sidecar?.kill('SIGTERM');
});

async function connect() {
  const client = new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey } });
  await client.setAuth(apikey);
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

function listen(client, topic, filter, got, system) {
  const channel = client
    .channel(topic)
    .on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'fp_posts', filter }, (m) => got.push(m));
  if (system) channel.on('system', {}, (m) => system.push(m));
  return channel;
}

test('match and imatch deliver what Postgres ~ and ~* match, and not. negates them', async () => {
  const client = await connect();
  try {
    const [a, b, c] = [collector(), collector(), collector()];
    // The builder quotes patterns holding ( ) or a backslash; the server reads them back.
    await subscribed(listen(client, 'fp-match', postgresChangesFilter().match('title', '^post-(\\d+)$'), a));
    await subscribed(listen(client, 'fp-imatch', postgresChangesFilter().imatch('title', '^POST-\\d'), b));
    await subscribed(listen(client, 'fp-not', postgresChangesFilter().not('title', 'imatch', 'skip'), c));
    // The last row holds for every channel, so what each did not get never comes.
    await db.query(`INSERT INTO fp_posts VALUES (1, 'post-1'), (2, 'Post-2'), (3, 'post-x'),
      (4, 'SKIP post-4'), (5, 'post-5 skip'), (6, 'post-9')`);
    const ids = async (col, n, what) => (await col.until(n, what)).map((m) => m.new.id);
    assert.deepEqual(await ids(a, 2, 'match'), [1, 6]);
    assert.deepEqual(await ids(b, 4, 'imatch'), [1, 2, 5, 6]);
    assert.deepEqual(await ids(c, 4, 'not.imatch'), [1, 2, 3, 6]);
  } finally {
    await close(client);
  }
});

test('an invalid, an over-long and a misplaced pattern are not served: the channel joins and is told why', async () => {
  const client = await connect();
  const reason = async (filter, topic) => {
    const told = [];
    const channel = listen(client, topic, filter, { push() {} }).on('system', {}, (m) => {
      if (m.extension === 'postgres_changes' && m.status === 'error') told.push(m.message);
    });
    await subscribed(channel);
    await waitFor(() => told.length > 0, 10000, `${topic}'s system message`);
    await client.removeChannel(channel);
    return told[0];
  };
  try {
    // Quoted by the builder (it holds a parenthesis), compiled by the join's check.
    assert.match(await reason(postgresChangesFilter().match('title', '(open'), 'fp-bad'),
      /InvalidPostgresChanges: binding 1: invalid regular expression for match filter: invalid regular expression: parentheses \(\) not balanced/);
    assert.match(await reason('title=imatch.[z-a]', 'fp-range'),
      /InvalidPostgresChanges: binding 1: invalid regular expression for imatch filter: invalid regular expression: invalid character range/);
    assert.match(await reason(`title=imatch.${'a'.repeat(MAX_LENGTH + 1)}`, 'fp-long'),
      new RegExp(`InvalidPostgresChanges: binding 1: the imatch pattern is ${MAX_LENGTH + 1} characters long; MAX_FILTER_PATTERN_LENGTH allows ${MAX_LENGTH}`));
    assert.match(await reason('id=match.1', 'fp-int'),
      /InvalidPostgresChanges: binding 1: match applies to text; column id of public\.fp_posts is of type bigint/);
    // At the limit it is admitted.
    const ok = listen(client, 'fp-at-limit', `title=match.${'a'.repeat(MAX_LENGTH)}`, { push() {} });
    await subscribed(ok);
  } finally {
    await close(client);
  }
});

test("a costly pattern withholds only its own channel's changes, and says so", async () => {
  const costly = await connect();
  const other = await connect();
  try {
    const [slow, slowSystem, cheap] = [collector(), collector(), collector()];
    await subscribed(listen(costly, 'fp-costly', postgresChangesFilter().match('title', COSTLY), slow, slowSystem));
    await subscribed(listen(other, 'fp-cheap', postgresChangesFilter().match('title', '^a+b$'), cheap));
    const systemBefore = slowSystem.got.length;
    await db.query(`INSERT INTO fp_posts VALUES (100, repeat('a', 200) || 'b')`);
    // The other channel of the same table gets the change: the drain was not held by the
    // costly pattern (its full cost over this value is far beyond the test's deadline).
    const [m] = await cheap.until(1, "the cheap channel's change");
    assert.equal(m.new.id, 100);
    // The costly one is told its filter could not be evaluated, and gets no change.
    const told = await slowSystem.until(systemBefore + 1, 'the system message');
    const notice = told[told.length - 1];
    assert.equal(notice.status, 'error');
    assert.equal(notice.message,
      `Changes to public.fp_posts were not delivered to this channel: its filter could not be evaluated: the pattern took longer than its ${BUDGET_MS} ms to evaluate`);
    // The costly channel stays joined: a row its pattern judges quickly (ab|ba reversed)
    // is delivered to it, and row 100, committed before, never will be.
    await db.query(`INSERT INTO fp_posts VALUES (101, 'abba')`);
    const [later] = await slow.until(1, 'a cheap row on the costly channel');
    assert.equal(later.new.id, 101);
    assert.equal(slow.got.length, 1, 'row 100 was withheld from the costly channel');
  } finally {
    await close(costly);
    await close(other);
  }
});

// Issue 39, H1: one client's many costly patterns were asked in one call with everyone
// else's, under the table's one budget: the call's statement_timeout ended it, and every
// pattern channel of the table was withheld, the bystander's cheap one too. Now a
// connection's patterns are asked after those of connections with fewer, in calls no
// pattern's budget can push past their statement_timeout: the costly client's channels are
// withheld and told, the bystander's pattern and plain channels get the row.
test("many costly patterns of one client spent every other subscriber's pattern check", async () => {
  const costly = await connect();
  const other = await connect();
  try {
    const told = collector();
    // Two joins of sixteen distinct costly patterns (MAX_PATTERNS_PER_JOIN), each a
    // budget's worth: 32 × 200 ms, more than the table's CHANGES_CHECK_TIMEOUT_MS (2 s).
    for (const j of [0, 1]) {
      const channel = costly.channel(`fp-flood-${j}`);
      for (let i = 0; i < 16; i++) {
        const pattern = `${COSTLY.slice(0, -1)}${String.fromCharCode(97 + i)}{0}${j}{0}$`;
        channel.on('postgres_changes', { event: 'INSERT', schema: 'public', table: 'fp_posts',
          filter: postgresChangesFilter().match('title', pattern) }, () => {});
      }
      channel.on('system', {}, (m) => told.push(m));
      await subscribed(channel);
    }
    const [cheap, plain] = [collector(), collector()];
    await subscribed(listen(other, 'fp-bystander', postgresChangesFilter().match('title', '^a+b$'), cheap));
    await subscribed(listen(other, 'fp-plain', undefined, plain));
    const before = told.got.filter((m) => m.status === 'error').length;
    await db.query(`INSERT INTO fp_posts VALUES (200, repeat('a', 200) || 'b')`);
    const [m] = await cheap.until(1, "the bystander's pattern channel's change");
    assert.equal(m.new.id, 200);
    const [p] = await plain.until(1, "the bystander's plain channel's change");
    assert.equal(p.new.id, 200);
    // Both of the costly client's channels are told.
    await withTimeout((async () => {
      while (told.got.filter((x) => x.status === 'error').length < before + 2) {
        await new Promise((r) => setTimeout(r, 20));
      }
    })(), 10000, "the costly client's notices");
    for (const n of told.got.filter((x) => x.status === 'error')) {
      assert.match(n.message, /^Changes to public\.fp_posts were not delivered to this channel: its filter could not be evaluated: /);
    }
  } finally {
    await close(costly);
    await close(other);
  }
});
