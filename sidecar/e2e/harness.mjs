// What the end-to-end tests share: tokens signed like Supabase's, a sidecar process on a
// free port, and a Postgres client for the test database (PG_REALTIME_TEST_DSN).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import net from 'node:net';
import pg from 'pg';
import WebSocket from 'ws';
import { chromium } from 'playwright-core';

/// An HS256 JWT for `claims`, signed with `secret`.
export function jwt(secret, claims) {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const body = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64(claims)}`;
  return `${body}.${crypto.createHmac('sha256', secret).update(body).digest('base64url')}`;
}

export const anonClaims = () => ({ role: 'anon', exp: Math.floor(Date.now() / 1000) + 3600 });

/// A free port: one the system picks, or the first free one of E2E_PORTS (LOW-HIGH) when set
/// (a developer sharing the machine keeps to a range of their own).
export async function freePort() {
  const tryPort = (p) =>
    new Promise((resolve) => {
      const s = net.createServer();
      s.once('error', () => resolve(null));
      s.listen(p, '127.0.0.1', () => {
        const { port } = s.address();
        s.close(() => resolve(port));
      });
    });
  const [low, high] = (process.env.E2E_PORTS ?? '0-0').split('-').map(Number);
  for (let p = low; p <= high; p++) {
    const port = await tryPort(p);
    if (port) return port;
  }
  throw new Error(`no free port in E2E_PORTS=${process.env.E2E_PORTS}`);
}

/// Starts the sidecar (SIDECAR_BIN) and waits until it is healthy; returns { process, port }.
/// With `port`, on that port (a sidecar started again where a killed one was); `secret` null
/// for none.
export async function startSidecar(secret, consumer, env = {}, port = undefined) {
  // Sidecars connect as the least-privilege login (scripts/sidecar_login.sql), not the superuser.
  const dsn = process.env.PG_REALTIME_SIDECAR_DSN;
  assert.ok(dsn && process.env.SIDECAR_BIN, 'SIDECAR_BIN and PG_REALTIME_SIDECAR_DSN must be set');
  port ??= await freePort();
  const vars = { ...process.env, PORT: String(port), API_JWT_SECRET: secret, DATABASE_URL: dsn, CONSUMER_NAME: consumer, LOG_LEVEL: 'warn', ...env };
  // No secret: a sidecar that verifies with API_JWT_JWKS alone.
  if (secret == null) delete vars.API_JWT_SECRET;
  const child = spawn(process.env.SIDECAR_BIN, [], {
    env: vars,
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  const deadline = Date.now() + 15000;
  for (;;) {
    try {
      if ((await fetch(`http://127.0.0.1:${port}/healthz`)).status === 200) return { process: child, port };
    } catch {}
    assert.ok(Date.now() < deadline, 'sidecar did not become healthy');
    await new Promise((r) => setTimeout(r, 50));
  }
}

/// The answer to a WebSocket upgrade with `apikey` in the query (undefined: none) and
/// `headers`: { status, reason } (101 when it opened; a refusal's reason from Supabase's
/// JSON `{"error": reason}`).
export function upgrade(port, apikey, headers = {}) {
  const query = apikey === undefined ? '' : `apikey=${encodeURIComponent(apikey)}&`;
  const ws = new WebSocket(`ws://127.0.0.1:${port}/realtime/v1/websocket?${query}vsn=1.0.0`, { headers });
  return withTimeout(
    new Promise((resolve, reject) => {
      ws.on('open', () => {
        ws.close();
        resolve({ status: 101 });
      });
      ws.on('unexpected-response', (_req, res) => {
        let body = '';
        res.on('data', (c) => (body += c));
        res.on('end', () => resolve({ status: res.statusCode, reason: JSON.parse(body).error }));
      });
      ws.on('error', (e) => (e.message.includes('Unexpected server response') ? null : reject(e)));
    }),
    10000,
    'upgrade',
  );
}

/// Headless Chromium (Debian's package), as the browser tests drive it.
export function launchChromium() {
  return chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
}

/// Stops sidecars ({ process, consumer }) with SIGTERM, waits for them to exit and frees
/// their consumer slots: slots outlive their sidecars, and the suite's cluster has a
/// bounded number of them.
export async function stopAndDrop(sidecars) {
  for (const { process: p } of sidecars) p.kill('SIGTERM');
  await Promise.all(sidecars.map(({ process: p }) =>
    p.exitCode !== null || p.signalCode !== null ? null : new Promise((resolve) => p.once('exit', resolve))));
  const db = await database();
  try {
    for (const { consumer } of sidecars) await db.query('SELECT realtime.drop_consumer($1)', [consumer]);
  } finally {
    await db.end();
  }
}

/// A connected client for the test database.
export async function database() {
  const kv = Object.fromEntries(process.env.PG_REALTIME_TEST_DSN.split(/\s+/).filter(Boolean).map((p) => p.split('=')));
  const db = new pg.Client({ host: kv.host, port: Number(kv.port ?? 5432), user: kv.user, database: kv.dbname });
  await db.connect();
  return db;
}

export const withTimeout = (p, ms, what) =>
  Promise.race([p, new Promise((_, reject) => setTimeout(() => reject(new Error(`timed out: ${what}`)), ms))]);

/// Resolves once `cond()` holds (checked every 20 ms); rejects with `what` after `ms`.
export async function waitFor(cond, ms, what) {
  await withTimeout(
    (async () => {
      while (!cond()) await new Promise((r) => setTimeout(r, 20));
    })(),
    ms,
    what,
  );
}

/// Subscribes; resolves on SUBSCRIBED, rejects with the server's reason on CHANNEL_ERROR or
/// TIMED_OUT.
export function subscribed(channel) {
  return withTimeout(
    new Promise((resolve, reject) =>
      channel.subscribe((status, err) => {
        if (status === 'SUBSCRIBED') resolve();
        else if (status === 'CHANNEL_ERROR' || status === 'TIMED_OUT') reject(err ?? new Error(status));
      }),
    ),
    10000,
    'subscribe',
  );
}

/// Leaves every channel of a realtime-js client and closes its socket.
export async function close(client) {
  await client.removeAllChannels();
  client.disconnect();
}
