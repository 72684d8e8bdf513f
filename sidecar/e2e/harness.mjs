// What the end-to-end tests share: tokens signed like Supabase's, a sidecar process on a
// free port, and a Postgres client for the test database (PG_REALTIME_TEST_DSN).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import net from 'node:net';
import pg from 'pg';

/// An HS256 JWT for `claims`, signed with `secret`.
export function jwt(secret, claims) {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const body = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64(claims)}`;
  return `${body}.${crypto.createHmac('sha256', secret).update(body).digest('base64url')}`;
}

export const anonClaims = () => ({ role: 'anon', exp: Math.floor(Date.now() / 1000) + 3600 });

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/// Starts the sidecar (SIDECAR_BIN) and waits until it is healthy; returns { process, port }.
/// With `port`, on that port (a sidecar started again where a killed one was).
export async function startSidecar(secret, consumer, env = {}, port = undefined) {
  // Sidecars connect as the least-privilege login (scripts/sidecar_login.sql), not the superuser.
  const dsn = process.env.PG_REALTIME_SIDECAR_DSN;
  assert.ok(dsn && process.env.SIDECAR_BIN, 'SIDECAR_BIN and PG_REALTIME_SIDECAR_DSN must be set');
  port ??= await freePort();
  const child = spawn(process.env.SIDECAR_BIN, [], {
    env: { ...process.env, PORT: String(port), API_JWT_SECRET: secret, DATABASE_URL: dsn, CONSUMER_NAME: consumer, LOG_LEVEL: 'warn', ...env },
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
