// A message the database could not send, as an app meets it with the official realtime-js:
// the app's write commits (Supabase's realtime.send warns instead of failing), and the
// channel is told in the message's place, live and on a resume (sidecar/README.md,
// "Messages the database could not send").
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
  await db.query(`
    CREATE TABLE IF NOT EXISTS dropped_posts (id bigint PRIMARY KEY, room text, body text);
    CREATE OR REPLACE FUNCTION dropped_posts_broadcast() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM realtime.send(jsonb_build_object('body', NEW.body), 'post', NEW.room, false);
        RETURN NEW;
    END
    $$;
    DROP TRIGGER IF EXISTS dropped_posts_broadcast ON dropped_posts;
    CREATE TRIGGER dropped_posts_broadcast AFTER INSERT ON dropped_posts
        FOR EACH ROW EXECUTE FUNCTION dropped_posts_broadcast();`);
  ({ process: sidecar, port } = await startSidecar(SECRET, 'dropped_messages'));
});
after(async () => {
  sidecar?.kill('SIGTERM');
  await db?.query('DROP TABLE IF EXISTS dropped_posts; DROP FUNCTION IF EXISTS dropped_posts_broadcast()');
  await db?.end();
});

const client = (vsn) => new RealtimeClient(`ws://127.0.0.1:${port}/realtime/v1`, { transport: WebSocket, params: { apikey }, vsn });

/// Inserts posts in one statement, with realtime.max_message_size at 1kB for it: a body of
/// 2,000 characters makes a message too large. Returns the WARNINGs the session got.
async function insert(rows) {
  const warnings = [];
  const onNotice = (n) => warnings.push(n.message);
  db.on('notice', onNotice);
  try {
    await db.query("SET realtime.max_message_size = '1kB'");
    const values = rows.map((_, i) => `($${3 * i + 1}::bigint, $${3 * i + 2}, $${3 * i + 3})`).join(', ');
    await db.query(`INSERT INTO dropped_posts VALUES ${values}`, rows.flat());
  } finally {
    await db.query('RESET realtime.max_message_size');
    db.off('notice', onNotice);
  }
  return warnings;
}

for (const vsn of ['1.0.0', '2.0.0']) {
  test(`realtime-js (${vsn}): a trigger's message too large leaves the INSERT committed and the channel told in its place`, async () => {
    const room = `dropped-${vsn}-${Date.now()}`;
    const c = client(vsn);
    try {
      const channel = c.channel(room, { config: { private: false } });
      const got = [];
      channel.on('broadcast', { event: 'post' }, (m) => got.push(['post', m.payload.body]));
      channel.on('system', {}, (m) => {
        if (m.dropped) got.push(['dropped', m]);
      });
      await subscribed(channel);
      const base = Date.now() * 10;
      const warnings = await insert([[base, room, 'before'], [base + 1, room, 'x'.repeat(2000)], [base + 2, room, 'after']]);
      assert.equal(warnings.length, 1, JSON.stringify(warnings));
      assert.match(warnings[0], /^WarnSendingBroadcastMessage: realtime message of \d+ bytes exceeds realtime.max_message_size \(1024 bytes\)$/);
      const { rows } = await db.query('SELECT count(*)::int AS n FROM dropped_posts WHERE room = $1', [room]);
      assert.equal(rows[0].n, 3, 'the app write committed, all three rows');
      await waitFor(() => got.length >= 3, 10000, 'the messages and the notice');
      assert.deepEqual(got.map((g) => g[0]), ['post', 'dropped', 'post'], 'the notice in the message\'s place');
      assert.deepEqual([got[0][1], got[2][1]], ['before', 'after']);
      const notice = got[1][1];
      assert.equal(notice.status, 'error');
      assert.equal(notice.extension, 'broadcast');
      assert.equal(notice.dropped.event, 'post');
      assert.equal(notice.dropped.reason, 'too_large');
      assert.ok(notice.dropped.size > 2000, JSON.stringify(notice));
      assert.match(notice.message, /^A message of \d+ bytes \(event "post"\) was not sent to this channel: it exceeds realtime.max_message_size$/);
      assert.ok(notice.meta.seq > 0 && typeof notice.meta.epoch === 'string', JSON.stringify(notice.meta));
    } finally {
      await close(c);
    }
  });
}

test('realtime-js: a resume over a dropped message sends its notice and answers recovered: false naming its position', async () => {
  const room = `dropped-resume-${Date.now()}`;
  const c = client('2.0.0');
  try {
    const first = c.channel(room, { config: { private: false } });
    let last;
    first.on('broadcast', { event: 'post' }, (m) => {
      last = m.meta;
    });
    await subscribed(first);
    const base = Date.now() * 10;
    await insert([[base, room, 'seen']]);
    await waitFor(() => last !== undefined, 10000, 'the first message');
    await c.removeChannel(first);
    // Away: a message dropped, then one sent.
    await insert([[base + 1, room, 'y'.repeat(2000)], [base + 2, room, 'missed']]);
    const again = c.channel(room, { config: { private: false, broadcast: { resume: { epoch: last.epoch, seq: last.seq } } } });
    const got = [];
    again.on('broadcast', { event: 'post' }, (m) => got.push(['post', m.payload.body]));
    again.on('system', {}, (m) => got.push(['recovered' in m ? 'resume' : 'dropped', m]));
    await subscribed(again);
    await waitFor(() => got.some((g) => g[0] === 'resume'), 10000, 'the resume\'s system message');
    assert.deepEqual(got.map((g) => g[0]), ['dropped', 'post', 'resume']);
    const [, dropped] = got[0];
    const [, resume] = got[2];
    assert.equal(resume.recovered, false, JSON.stringify(resume));
    assert.equal(resume.dropped_messages, 1);
    assert.equal(resume.first_missing, dropped.meta.seq);
    assert.equal(resume.last_missing, dropped.meta.seq);
    assert.equal(resume.resent, 1, 'the one message after it');
    assert.equal(resume.message, `1 message was dropped when sent, after position ${last.seq} (a system message in each one's place says why); the 1 other message after it was sent`);
  } finally {
    await close(c);
  }
});
