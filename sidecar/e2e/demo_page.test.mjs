// The demo page, as a person would see it: headless Chromium (Debian's package) loads the
// page from the sidecar, realtime-js in the page subscribes, a row inserted here appears.
// Needs SIDECAR_BIN, PG_REALTIME_TEST_DSN and the built page (sidecar/web/dist).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { anonClaims, database, jwt, launchChromium, startSidecar } from './harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const SECRET = 'demo-page-test-secret-with-enough-length';
const apikey = jwt(SECRET, anonClaims());

let sidecar;
let browser;
let db;
let port;
const webRoot = fs.mkdtempSync(path.join(os.tmpdir(), 'pg_realtime_web.'));

before(async () => {
  const dist = path.join(here, '../web/dist');
  for (const f of fs.readdirSync(dist)) fs.copyFileSync(path.join(dist, f), path.join(webRoot, f));
  fs.writeFileSync(path.join(webRoot, 'config.json'), JSON.stringify({ apikey, rooms: ['lobby', 'den'] }));
  ({ process: sidecar, port } = await startSidecar(SECRET, 'demo_page_e2e', { WEB_ROOT: webRoot }));
  db = await database();
  await db.query(fs.readFileSync(path.join(here, '../../scripts/demo.sql'), 'utf8'));
  browser = await launchChromium();
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
  // Two rooms and the task list.
  await page.waitForSelector('#status span.SUBSCRIBED >> nth=2', { timeout: 15000 });
  const { rows } = await db.query(
    "INSERT INTO chat_messages (room_id, author, body) VALUES ('den', 'test', 'seen in a browser') RETURNING id",
  );
  const row = page.locator(`#rows tr[data-id="${rows[0].id}"]`);
  await row.waitFor({ timeout: 15000 });
  const cells = await row.locator('td').allTextContents();
  assert.deepEqual(cells.slice(0, 5), ['den', 'INSERT', String(rows[0].id), 'test', 'seen in a browser']);
  assert.match(cells[5], /^\d+ ms$/);
  assert.match(await page.locator('#summary').textContent(), /^1 row received; commit → page p50 \d+ ms/);
  // A task inserted, then updated: both arrive as Postgres Changes, newest first.
  const task = await db.query("INSERT INTO demo_tasks (title) VALUES ('water the garden') RETURNING id");
  const id = String(task.rows[0].id);
  await db.query('UPDATE demo_tasks SET done = true WHERE id = $1', [id]);
  const updated = page.locator(`#changes tr[data-id="${id}"][data-op="UPDATE"]`);
  await updated.waitFor({ timeout: 15000 });
  const changes = await page.locator('#changes tr').evaluateAll((trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent)));
  assert.deepEqual(changes.map((c) => c.slice(0, 4)), [['UPDATE', id, 'water the garden', '✓'], ['INSERT', id, 'water the garden', '·']]);
  assert.match(changes[0][4], /^\d+ ms$/);
  const shot = process.env.DEMO_SCREENSHOT;
  if (shot) await page.screenshot({ path: shot });
  assert.deepEqual(errors, []);
});

test('the demo page shows who is watching: a second page joins the list, and leaves it when closed', async () => {
  const watching = async (page) => page.locator('#watchers li').evaluateAll((lis) => lis.map((li) => li.dataset.key));
  const a = await browser.newPage();
  const errors = [];
  a.on('pageerror', (e) => errors.push(String(e)));
  await a.goto(`http://127.0.0.1:${port}/`);
  await a.locator('#watchers li', { hasText: 'this page' }).waitFor({ timeout: 15000 });
  const before = await watching(a);
  const b = await browser.newPage();
  await b.goto(`http://127.0.0.1:${port}/`);
  await b.locator('#watchers li', { hasText: 'this page' }).waitFor({ timeout: 15000 });
  const bKey = await b.locator('#watchers li', { hasText: 'this page' }).getAttribute('data-key');
  assert.ok(!before.includes(bKey));
  await a.locator(`#watchers li[data-key="${bKey}"]`).waitFor({ timeout: 15000 });
  assert.deepEqual((await watching(b)).sort(), [...before, bKey].sort(), 'both pages see the same list');
  assert.match(await a.locator('#watching').textContent(), new RegExp(`^${before.length + 1} watching$`));
  await b.close();
  await a.locator(`#watchers li[data-key="${bKey}"]`).waitFor({ state: 'detached', timeout: 15000 });
  assert.deepEqual(await watching(a), before);
  assert.deepEqual(errors, []);
  await a.close();
});

test('the demo page survives a sidecar killed and started again, with no missing row or task change, and says so', async () => {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`http://127.0.0.1:${port}/`);
  await page.waitForSelector('#status span.SUBSCRIBED >> nth=2', { timeout: 15000 });
  const insert = async (body) =>
    (await db.query("INSERT INTO chat_messages (room_id, author, body) VALUES ('den', 'test', $1) RETURNING id", [body])).rows[0].id;
  const task = async (title) => (await db.query('INSERT INTO demo_tasks (title) VALUES ($1) RETURNING id', [title])).rows[0].id;
  const before = await insert('before the restart');
  await page.locator(`#rows tr[data-id="${before}"]`).waitFor({ timeout: 15000 });
  const taskBefore = await task('before the restart');
  await page.locator(`#changes tr[data-id="${taskBefore}"]`).waitFor({ timeout: 15000 });
  sidecar.kill('SIGKILL');
  // Committed while no sidecar runs: rows, and task changes (an insert, an edit, a removal).
  const during = [];
  for (let i = 0; i < 3; i++) during.push(await insert(`while away ${i}`));
  const taskDuring = await task('while away');
  await db.query('UPDATE demo_tasks SET done = true WHERE id = $1', [taskDuring]);
  await db.query('DELETE FROM demo_tasks WHERE id = $1', [taskBefore]);
  ({ process: sidecar } = await startSidecar(SECRET, 'demo_page_e2e', { WEB_ROOT: webRoot }, port));
  for (const id of during) await page.locator(`#rows tr[data-id="${id}"]`).waitFor({ timeout: 30000 });
  await page.locator('#resume.recovered').waitFor({ timeout: 15000 });
  assert.match(await page.locator('#resume').textContent(), /^den: reconnected, [1-9]\d* rows? recovered, none missing$/);
  const ids = await page.locator('#rows tr').evaluateAll((trs) => trs.map((tr) => tr.dataset.id));
  assert.equal(new Set(ids).size, ids.length, 'no row shown twice');
  await page.locator('#tasks-resume.recovered').waitFor({ timeout: 15000 });
  assert.match(await page.locator('#tasks-resume').textContent(), /^demo_tasks: reconnected, [1-9]\d* changes? recovered, none missing$/);
  // The task list's changes since the kill, each once, in commit order (the newest first);
  // the inserted task's INSERT is resent with the row as it is now readable (the row exists),
  // the removed one's DELETE too.
  const changes = await page.locator('#changes tr').evaluateAll((trs) => trs.map((tr) => [tr.dataset.op, tr.dataset.id]));
  const since = changes.slice(0, changes.findIndex(([op, id]) => op === 'INSERT' && id === String(taskBefore)));
  assert.deepEqual(since, [['DELETE', String(taskBefore)], ['UPDATE', String(taskDuring)], ['INSERT', String(taskDuring)]]);
  // The killed sidecar's member left; the page rejoined and tracked itself again.
  await page.locator('#watchers li', { hasText: 'this page' }).waitFor({ timeout: 15000 });
  assert.deepEqual(errors, []);
});
