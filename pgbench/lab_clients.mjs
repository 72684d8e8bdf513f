// The lab's realtime-js clients and their publisher (pgbench/lab.py runs this on the edge
// host): what an app does, counted so that a fault's effect on each client can be judged.
//
// Each client is the official RealtimeClient, through the proxy, with `params.route` set to
// its topic (so HAProxy's `balance url_param route` puts a topic's clients on one sidecar),
// connecting from one of the edge's source addresses. It joins one public channel, keeps the
// position of the last message it saw in its join payload (sidecar/README.md, "Replay and
// resume": realtime-js's own rejoin then resumes there), and records every message, every
// `system` message and every status change, with the time.
//
// The publisher sends `--rate` messages a second round the topics with realtime.send, each
// {n: the topic's counter}, and counts a message as published only once its statement
// returned (an acknowledged commit). It connects to whichever of `--db-hosts` is the primary
// (pg_is_in_recovery() false), as target_session_attrs=read-write does, and tries again when
// its connection fails: a message whose statement failed is not counted, and is sent again
// with the same n.
//
// With `--presence`, each client also tracks itself under the key `c<i>` every time its
// channel is SUBSCRIBED (as apps do: realtime-js does not track again on a rejoin). With
// `--watch URL`, one watcher a topic joins it directly on that sidecar (not through the
// proxy) and records its view at every presence sync, with the time, and its final view, so a
// check can see a lost sidecar's members leave the others' views, come back, and whether
// any is left behind (a ghost: a key in the view that no connected client tracks, or a key
// with more than one meta).
//
// With the publisher runs a persisted sender: five times a second, realtime-js's
// `channel.httpSend(event, {k}, {persist: true})` request (POST .../api/broadcast/<topic>/
// events/p?private=true&persist=true) through the proxy to the private topic
// lab-persist-<prefix>, as an `authenticated` user; a message counts as persisted once
// answered 202. After a failover the new primary must have every one of them.
//
// stdin takes commands, one per line: `publish` starts the publisher, `stop` stops it and
// then, once every client has what was published or `--settle` seconds passed, prints the
// result as one JSON line and exits. stdout also gets `{"ready": ...}` once every client
// joined.
import { createRequire } from 'node:module';
import path from 'node:path';
import readline from 'node:readline';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';

// The packages the end-to-end tests install (sidecar/e2e/package.json, pinned there).
const require = createRequire(path.join(path.dirname(fileURLToPath(import.meta.url)), '../sidecar/e2e/package.json'));
const { RealtimeClient } = require('@supabase/realtime-js');
const WebSocket = require('ws');
const pg = require('pg');
const { SignJWT } = require('jose');

function options() {
  const string = { type: 'string' };
  const { values } = parseArgs({
    options: { url: string, secret: string, sources: string, 'db-hosts': string, clients: string, topics: string,
      rate: string, prefix: string, settle: string, presence: { type: 'boolean' }, watch: string },
  });
  return {
    url: values.url, secret: values.secret, prefix: values.prefix ?? 'lab',
    clients: Number(values.clients ?? 100), topics: Number(values.topics ?? 50), rate: Number(values.rate ?? 100),
    settle: Number(values.settle ?? 30), presence: values.presence ?? false, watch: values.watch ?? null,
    sources: values.sources ? values.sources.split(',') : [], dbHosts: values['db-hosts'].split(','),
  };
}

const o = options();
const now = () => Date.now();
// Resolves once written: stdout to a pipe is asynchronous, and exiting before would cut
// the result line.
const out = (obj) => new Promise((resolve) => process.stdout.write(`${JSON.stringify(obj)}\n`, resolve));

/// A WebSocket from source address `local`, which notes the server HAProxy chose (the
/// X-Served-By header of the upgrade's answer) on `record`.
function transportFrom(local, record) {
  return class extends WebSocket {
    constructor(url, protocols) {
      super(url, protocols, { localAddress: local });
      this.on('upgrade', (res) => {
        record.servers.push([now(), res.headers['x-served-by'] ?? null]);
      });
    }
  };
}

async function client(i, apikey) {
  const topic = `${o.prefix}-${i % o.topics}`;
  const record = { topic, servers: [], statuses: [], systems: [], received: [], tracks: [], joinedAt: null };
  const c = new RealtimeClient(`${o.url}/realtime/v1`, {
    transport: transportFrom(o.sources.length ? o.sources[i % o.sources.length] : undefined, record),
    params: { apikey, route: topic },
  });
  await c.setAuth(apikey);
  const channel = c.channel(topic, { config: { private: false, ...(o.presence ? { presence: { key: `c${i}` } } : {}) } });
  channel.on('broadcast', { event: 'n' }, (m) => {
    record.received.push([m.payload.n, m.meta?.replayed === true ? 1 : 0]);
    const { config } = channel.joinPush.payload();
    channel.updateJoinPayload({
      config: { ...config, broadcast: { ...config.broadcast, resume: { epoch: m.meta.epoch, seq: m.meta.seq } } },
    });
  });
  channel.on('system', {}, (m) => record.systems.push([now(), m]));
  await new Promise((resolve) => {
    channel.subscribe((status, err) => {
      record.statuses.push([now(), status, err ? String(err.message ?? err) : null]);
      if (status === 'SUBSCRIBED' && o.presence) {
        channel.track({ i }).then((r) => record.tracks.push([now(), r]), (e) => record.tracks.push([now(), String(e)]));
      }
      if (status === 'SUBSCRIBED' && record.joinedAt === null) {
        record.joinedAt = now();
        resolve();
      }
    });
  });
  return { c, record };
}

/// A watcher of topic `t`'s presence, straight to the sidecar at `--watch`: at each sync,
/// [time, its view], a view being {key: the refs of its metas, sorted}.
async function watcher(t, apikey) {
  const topic = `${o.prefix}-${t}`;
  const record = { topic, syncs: [], statuses: [], servers: [] };
  const c = new RealtimeClient(`${o.watch}/realtime/v1`, {
    transport: transportFrom(o.sources.length ? o.sources[t % o.sources.length] : undefined, record),
    params: { apikey },
  });
  await c.setAuth(apikey);
  const channel = c.channel(topic, { config: { private: false, presence: { key: '' } } });
  const view = () => Object.fromEntries(Object.entries(channel.presenceState())
    .map(([k, metas]) => [k, metas.map((m) => m.presence_ref).sort()]));
  channel.on('presence', { event: 'sync' }, () => record.syncs.push([now(), view()]));
  await new Promise((resolve) => {
    channel.subscribe((status) => {
      record.statuses.push([now(), status]);
      if (status === 'SUBSCRIBED') resolve();
    });
  });
  return { c, record, view };
}

/// The publisher: per topic a counter; the next n of a topic is sent until acknowledged.
function publisher() {
  // primaries: [host, when a message was first committed there, the topics' counters
  // before it], one per connection that wrote, so that a message can be placed before or
  // after a failover or a restart.
  const state = { published: new Array(o.topics).fill(0), errors: 0, reconnects: 0, running: true, done: null,
    primaries: [] };
  const primary = async () => {
    for (;;) {
      for (const host of o.dbHosts) {
        const db = new pg.Client({ host, port: 5432, user: 'postgres', database: 'postgres',
          connectionTimeoutMillis: 2000, keepAlive: true, query_timeout: 10000 });
        db.on('error', () => {});
        try {
          await db.connect();
          const { rows } = await db.query('select pg_is_in_recovery() as r');
          if (!rows[0].r) {
            db.host = host;
            db.fresh = true;
            return db;
          }
        } catch { /* next host */ }
        await db.end().catch(() => {});
      }
      if (!state.running) return null;
      await new Promise((r) => setTimeout(r, 250));
    }
  };
  state.done = (async () => {
    let db = await primary();
    const every = 1000 / o.rate;
    let next = now();
    let k = 0;
    while (state.running && db) {
      const t = k % o.topics;
      const counters = [...state.published];
      try {
        // The audit row commits with the message: a message received whose row the primary
        // of the end lacks was committed on a primary that failed over without it.
        await db.query(`with audit as (insert into lab_audit (topic, n) values ($2, $1) returning 1)
          select realtime.send(jsonb_build_object('n', $1::int), 'n', $2, false) from audit`,
        [state.published[t], `${o.prefix}-${t}`]);
        if (db.fresh) {
          state.primaries.push([db.host, now(), counters]);
          db.fresh = false;
        }
        state.published[t] += 1;
        k += 1;
      } catch {
        state.errors += 1;
        await db.end().catch(() => {});
        state.reconnects += 1;
        db = await primary();
        continue;
      }
      next += every;
      const wait = next - now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      else if (wait < -1000) next = now();
    }
    await db?.end().catch(() => {});
  })();
  return state;
}

/// The persisted sender: k = 0, 1, ... each until answered 202; `acked` lists them.
function persister(token) {
  const topic = `lab-persist-${o.prefix}`;
  const url = `${o.url.replace(/^ws/, 'http')}/realtime/v1/api/broadcast/${topic}/events/p?private=true&persist=true`;
  const state = { topic, acked: [], errors: 0, running: true, done: null };
  state.done = (async () => {
    let k = 0;
    while (state.running) {
      try {
        const res = await fetch(url, {
          method: 'POST',
          headers: { apikey: token, authorization: `Bearer ${token}`, 'content-type': 'application/json' },
          body: JSON.stringify({ k }),
          signal: AbortSignal.timeout(5000),
        });
        if (res.status === 202) {
          state.acked.push(k);
          k += 1;
        } else {
          state.errors += 1;
        }
        await res.arrayBuffer().catch(() => {});
      } catch {
        state.errors += 1;
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  })();
  return state;
}

async function main() {
  const key = new TextEncoder().encode(o.secret);
  const apikey = await new SignJWT({ role: 'anon' }).setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
    .setExpirationTime('2h').sign(key);
  // A user of its own a run, so each run's persisted messages count against their own quota.
  const user = await new SignJWT({ role: 'authenticated', sub: crypto.randomUUID() })
    .setProtectedHeader({ alg: 'HS256', typ: 'JWT' }).setExpirationTime('2h').sign(key);
  const clients = [];
  for (let start = 0; start < o.clients; start += 50) {
    const batch = [];
    for (let i = start; i < Math.min(start + 50, o.clients); i += 1) batch.push(client(i, apikey));
    clients.push(...(await Promise.all(batch)));
  }
  const watchers = [];
  if (o.watch) {
    for (let start = 0; start < o.topics; start += 50) {
      const batch = [];
      for (let t = start; t < Math.min(start + 50, o.topics); t += 1) batch.push(watcher(t, apikey));
      watchers.push(...(await Promise.all(batch)));
    }
  }
  // Each topic's expected view: every client of it tracked once.
  const expected = (t) => clients.filter(({ record }) => record.topic === `${o.prefix}-${t}`).length;
  const whole = ({ view }, t) => {
    const v = view();
    return Object.keys(v).length === expected(t) && Object.values(v).every((refs) => refs.length === 1);
  };
  out({ ready: now(), clients: clients.length, watchers: watchers.length });
  let pub = null;
  let persisted = null;
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (line === 'publish') {
      pub = publisher();
      persisted = persister(user);
      out({ publishing: now() });
    } else if (line === 'stop') {
      pub.running = false;
      persisted.running = false;
      await Promise.all([pub.done, persisted.done]);
      const stopped = now();
      const want = (r) => pub.published[Number(r.topic.slice(o.prefix.length + 1))];
      const complete = (r) => new Set(r.received.map(([n]) => n)).size >= want(r);
      const settled = () => clients.every(({ record }) => complete(record)) && watchers.every((w, t) => whole(w, t));
      while (now() - stopped < o.settle * 1000 && !settled()) {
        await new Promise((r) => setTimeout(r, 200));
      }
      await out({ stopped, settled: now(), published: pub.published, publish_errors: pub.errors,
        publisher_reconnects: pub.reconnects, primaries: pub.primaries,
        persisted: { topic: persisted.topic, acked: persisted.acked, errors: persisted.errors }, clients: clients.map(({ record }) => record),
        watchers: watchers.map(({ record, view }) => ({ ...record, view: view() })) });
      break;
    }
  }
  for (const { c } of [...clients, ...watchers]) c.disconnect();
  process.exit(0);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
