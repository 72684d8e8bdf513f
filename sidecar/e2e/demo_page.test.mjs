// The demo page, as a person would see it: headless Chromium (Debian's package) loads the
// page from the sidecar, realtime-js in the page subscribes, a row inserted here appears.
// Needs SIDECAR_BIN, PG_REALTIME_TEST_DSN and the built page (sidecar/web/dist).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const SECRET = 'demo-page-test-secret-with-enough-length';
const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
const body = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64({ role: 'anon', exp: Math.floor(Date.now() / 1000) + 3600 })}`;
const apikey = `${body}.${crypto.createHmac('sha256', SECRET).update(body).digest('base64url')}`;

let sidecar;
let browser;
let db;
let port;
const webRoot = fs.mkdtempSync(path.join(os.tmpdir(), 'pg_realtime_web.'));

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

before(async () => {
  const dsn = process.env.PG_REALTIME_TEST_DSN;
  assert.ok(dsn && process.env.SIDECAR_BIN, 'SIDECAR_BIN and PG_REALTIME_TEST_DSN must be set');
  const dist = path.join(here, '../web/dist');
  for (const f of fs.readdirSync(dist)) fs.copyFileSync(path.join(dist, f), path.join(webRoot, f));
  fs.writeFileSync(path.join(webRoot, 'config.json'), JSON.stringify({ apikey, rooms: ['lobby', 'den'] }));
  port = await freePort();
  sidecar = spawn(process.env.SIDECAR_BIN, [], {
    env: { ...process.env, PORT: String(port), API_JWT_SECRET: SECRET, DATABASE_URL: dsn, CONSUMER_NAME: 'demo_page_e2e', WEB_ROOT: webRoot, LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  const deadline = Date.now() + 15000;
  for (;;) {
    try {
      if ((await fetch(`http://127.0.0.1:${port}/healthz`)).status === 200) break;
    } catch {}
    assert.ok(Date.now() < deadline, 'sidecar did not become healthy');
    await new Promise((r) => setTimeout(r, 50));
  }
  const kv = Object.fromEntries(dsn.split(/\s+/).filter(Boolean).map((p) => p.split('=')));
  db = new pg.Client({ host: kv.host, port: Number(kv.port), user: kv.user, database: kv.dbname });
  await db.connect();
  await db.query(fs.readFileSync(path.join(here, '../../scripts/demo.sql'), 'utf8'));
  browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
});

after(async () => {
  await browser?.close();
  await db?.end();
  sidecar?.kill('SIGTERM');
});

test('the demo page subscribes and shows a row inserted in the database', async () => {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`http://127.0.0.1:${port}/`);
  await page.waitForSelector('#status span.SUBSCRIBED >> nth=1', { timeout: 15000 });
  const { rows } = await db.query(
    "INSERT INTO chat_messages (room_id, author, body) VALUES ('den', 'test', 'seen in a browser') RETURNING id",
  );
  const row = page.locator(`#rows tr[data-id="${rows[0].id}"]`);
  await row.waitFor({ timeout: 15000 });
  const cells = await row.locator('td').allTextContents();
  assert.deepEqual(cells.slice(0, 5), ['den', 'INSERT', String(rows[0].id), 'test', 'seen in a browser']);
  assert.match(cells[5], /^\d+ ms$/);
  assert.match(await page.locator('#summary').textContent(), /^1 row received; commit → page p50 \d+ ms/);
  const shot = process.env.DEMO_SCREENSHOT;
  if (shot) await page.screenshot({ path: shot });
  assert.deepEqual(errors, []);
});
