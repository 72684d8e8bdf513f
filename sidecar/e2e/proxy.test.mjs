// Behind a TLS-terminating reverse proxy: Debian's nginx in front of the sidecar with a
// self-signed certificate made here, `/realtime/v1/` passed through (as Supabase's gateway
// maps it) and a proxy idle timeout of 2 s. realtime-js connects with `wss://`, trusting the
// certificate; its heartbeats (every 500 ms) keep a quiet socket open across several
// timeouts, while a socket that stays silent is cut by the proxy; REST works through it.
// Needs SIDECAR_BIN, PG_REALTIME_TEST_DSN and nginx and openssl (scripts/install-deps.sh).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import WebSocket from 'ws';
import { RealtimeClient } from '@supabase/realtime-js';
import { anonClaims, close, database, freePort, jwt, startSidecar, stopAndDrop, subscribed, waitFor, withTimeout } from './harness.mjs';

const SECRET = 'proxy-test-secret-with-enough-length-for-hs256';
const apikey = jwt(SECRET, anonClaims());
const PROXY_TIMEOUT_S = 2;
const PER_ADDRESS = 5;

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg_realtime_proxy.'));
let sidecar;
let nginx;
let proxyPort;
let directPort;
let ca;
let db;

/// The nginx configuration an operator needs (sidecar/README.md, "Behind a proxy"), with this test's
/// ports, files and short timeout.
function nginxConf(listen, upstream) {
  return `
daemon off;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  map $http_upgrade $connection_upgrade { default upgrade; '' close; }
  upstream realtime { server ${upstream}; }
  server {
    listen 127.0.0.1:${listen} ssl;
    ssl_certificate ${dir}/cert.pem;
    ssl_certificate_key ${dir}/key.pem;
    location /realtime/v1/ {
      proxy_pass http://realtime;
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_read_timeout ${PROXY_TIMEOUT_S}s;
      proxy_send_timeout ${PROXY_TIMEOUT_S}s;
    }
  }
}
`;
}

/// A WebSocket transport for realtime-js that trusts the test's certificate, counting the
/// sockets it opens (a reconnect opens another).
let opened = 0;
class TrustingWebSocket extends WebSocket {
  constructor(url, protocols) {
    super(url, protocols, { ca });
    opened++;
  }
}

/// `fetch` for realtime-js's REST calls over https, trusting the test's certificate (Node's
/// own fetch reads extra CAs only at startup, from NODE_EXTRA_CA_CERTS).
function trustingFetch(url, init = {}) {
  return new Promise((resolve, reject) => {
    const req = https.request(String(url), { method: init.method ?? 'GET', headers: init.headers, ca }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        // A 204 (the preflight's answer) may have no body, not even an empty one.
        const body = res.statusCode === 204 ? null : Buffer.concat(chunks);
        resolve(new Response(body, { status: res.statusCode, headers: res.headers }));
      });
    });
    req.setTimeout(10000, () => req.destroy(new Error(`no answer from ${url}`)));
    req.on('error', reject);
    req.end(init.body);
  });
}

before(async () => {
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=127.0.0.1',
    '-addext', 'subjectAltName=IP:127.0.0.1', '-keyout', `${dir}/key.pem`, '-out', `${dir}/cert.pem`], { stdio: 'ignore' });
  ca = fs.readFileSync(`${dir}/cert.pem`);
  let sidecarPort;
  // The operator names the proxy, so the per-address limits see each client through it.
  ({ process: sidecar, port: sidecarPort } = await startSidecar(SECRET, 'proxy_e2e', {
    TRUSTED_PROXIES: '127.0.0.1',
    MAX_REST_EVENTS_PER_SECOND_PER_ADDRESS: String(PER_ADDRESS),
  }));
  directPort = sidecarPort;
  proxyPort = await freePort();
  fs.writeFileSync(`${dir}/nginx.conf`, nginxConf(proxyPort, `127.0.0.1:${sidecarPort}`));
  execFileSync('/usr/sbin/nginx', ['-t', '-q', '-e', `${dir}/error.log`, '-c', `${dir}/nginx.conf`, '-p', dir]);
  nginx = spawn('/usr/sbin/nginx', ['-e', `${dir}/error.log`, '-c', `${dir}/nginx.conf`, '-p', dir], { stdio: 'inherit' });
  const deadline = Date.now() + 10000;
  for (;;) {
    const status = await trustingFetch(`https://127.0.0.1:${proxyPort}/realtime/v1/api/broadcast`, { method: 'OPTIONS' })
      .then((r) => r.status, () => 0);
    if (status === 204) break;
    assert.ok(Date.now() < deadline, `nginx did not pass requests through (last status ${status})`);
    await new Promise((r) => setTimeout(r, 50));
  }
  db = await database();
});

after(async () => {
  await db?.end();
  nginx?.kill('SIGTERM');
  if (nginx) await new Promise((resolve) => (nginx.exitCode !== null ? resolve() : nginx.once('exit', resolve)));
  if (sidecar) await stopAndDrop([{ process: sidecar, consumer: 'proxy_e2e' }]);
  fs.rmSync(dir, { recursive: true, force: true });
});

const proxied = () => `wss://127.0.0.1:${proxyPort}/realtime/v1`;

test('realtime-js over wss:// through nginx: heartbeats keep a quiet socket open across several proxy timeouts', async () => {
  const beats = [];
  const client = new RealtimeClient(proxied(), {
    transport: TrustingWebSocket, params: { apikey }, heartbeatIntervalMs: 500, fetch: trustingFetch,
    heartbeatCallback: (status) => beats.push(status),
  });
  const before = opened;
  try {
    await client.setAuth(apikey);
    const topic = `proxied-${Date.now()}`;
    const got = [];
    const channel = client.channel(topic).on('broadcast', { event: 'late' }, (m) => got.push(m.payload));
    await subscribed(channel);
    assert.equal(opened - before, 1, 'one socket');
    // Quiet: nothing but heartbeats for more than three of the proxy's idle timeouts.
    const quietUntil = Date.now() + (3 * PROXY_TIMEOUT_S + 1) * 1000;
    await waitFor(() => Date.now() > quietUntil || opened - before > 1 || channel.state !== 'joined', 15000,
      'the quiet period');
    assert.equal(opened - before, 1, 'no reconnect: the socket stayed open');
    assert.equal(channel.state, 'joined');
    assert.ok(beats.filter((s) => s === 'ok').length >= 3 * PROXY_TIMEOUT_S, `heartbeats answered through the proxy: ${beats}`);
    assert.ok(!beats.includes('timeout'), `no heartbeat timed out: ${beats}`);
    // The same socket still delivers.
    await db.query(`SELECT realtime.send('{"n": 1}', 'late', $1, false)`, [topic]);
    await waitFor(() => got.length === 1, 10000, 'a message after the quiet period');
    assert.equal(got[0].n, 1);
    assert.equal(opened - before, 1);
  } finally {
    await close(client);
  }
});

test('the control: a socket that sends nothing is closed by the proxy after its idle timeout', async () => {
  const ws = new WebSocket(`${proxied()}/websocket?apikey=${apikey}&vsn=1.0.0`, { ca });
  await withTimeout(new Promise((resolve, reject) => ws.once('open', resolve).once('error', reject)), 10000, 'open');
  const opened = Date.now();
  await withTimeout(new Promise((resolve) => ws.once('close', resolve)), (PROXY_TIMEOUT_S + 5) * 1000, 'the proxy closing');
  const lived = Date.now() - opened;
  assert.ok(lived >= PROXY_TIMEOUT_S * 1000 - 200, `closed after ${lived} ms, before the proxy's timeout`);
});

test('REST through nginx: httpSend and the batch route over https reach a subscriber', async () => {
  const listener = new RealtimeClient(proxied(), { transport: TrustingWebSocket, params: { apikey }, heartbeatIntervalMs: 500 });
  const sender = new RealtimeClient(proxied(), { transport: TrustingWebSocket, params: { apikey }, fetch: trustingFetch });
  try {
    await listener.setAuth(apikey);
    await sender.setAuth(apikey);
    const topic = `proxied-rest-${Date.now()}`;
    const got = [];
    const channel = listener.channel(topic).on('broadcast', { event: 'rest' }, (m) => got.push(m.payload.route));
    await subscribed(channel);
    const out = sender.channel(topic);
    assert.deepEqual(await out.httpSend('rest', { route: 'single' }), { success: true });
    assert.equal(await out.send({ type: 'broadcast', event: 'rest', payload: { route: 'batch' } }), 'ok');
    await waitFor(() => got.length === 2, 10000, 'both REST messages');
    assert.deepEqual(got, ['single', 'batch']);
  } finally {
    await close(listener);
    await close(sender);
  }
});

/// POSTs `n` messages to the batch route from the loopback address `from`, through nginx
/// (https) or straight at the sidecar (http), with extra headers; resolves to the status.
function postFrom(from, { direct = false, n = 1, headers = {} } = {}) {
  const body = JSON.stringify({ messages: Array.from({ length: n }, (_, i) => ({ topic: 'addr', event: 'e', payload: { i } })) });
  const url = direct ? `http://127.0.0.1:${directPort}/api/broadcast` : `https://127.0.0.1:${proxyPort}/realtime/v1/api/broadcast`;
  const options = {
    method: 'POST', localAddress: from, ca,
    headers: { authorization: `Bearer ${apikey}`, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...headers },
  };
  return new Promise((resolve, reject) => {
    const req = (direct ? http : https).request(url, options, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode));
    });
    req.setTimeout(10000, () => req.destroy(new Error(`no answer from ${url}`)));
    req.on('error', reject);
    req.end(body);
  });
}

test('per-address limits see each client through the named proxy, and never a forged address', async () => {
  // Through nginx, 127.0.0.2 spends its own budget...
  assert.equal(await postFrom('127.0.0.2', { n: PER_ADDRESS }), 202);
  assert.equal(await postFrom('127.0.0.2'), 429);
  // ...and claiming another address in X-Forwarded-For does not help: nginx appends the
  // address it saw, and only that is believed.
  assert.equal(await postFrom('127.0.0.2', { headers: { 'x-forwarded-for': '198.51.100.1' } }), 429);
  // Another client behind the same proxy has a budget of its own.
  assert.equal(await postFrom('127.0.0.3', { n: PER_ADDRESS }), 202);
  // A client connecting straight to the sidecar cannot pass for another one with the header.
  assert.equal(await postFrom('127.0.0.4', { direct: true, n: PER_ADDRESS, headers: { 'x-forwarded-for': '198.51.100.2' } }), 202);
  assert.equal(await postFrom('127.0.0.4', { direct: true, headers: { 'x-forwarded-for': '198.51.100.3' } }), 429);
});
