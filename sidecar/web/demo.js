// The demo page: subscribes to the demo rooms (Broadcast) and to the task list's table
// (Postgres Changes) with the official realtime-js client and shows each row as it arrives,
// with the time from the row's commit to its arrival here; and shows who is watching
// (Presence: every open page and the terminal feed track themselves).
import { RealtimeClient } from '@supabase/realtime-js';

const MAX_ROWS = 50;
const config = await (await fetch('config.json')).json();
const url = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/realtime/v1`;
const client = new RealtimeClient(url, { params: { apikey: config.apikey } });
await client.setAuth(config.apikey);

const statusEl = document.getElementById('status');
const rowsEl = document.getElementById('rows');
const changesEl = document.getElementById('changes');
const summaryEl = document.getElementById('summary');
const latencies = [];
const badges = {};

function setStatus(room, status) {
  badges[room] ??= statusEl.appendChild(document.createElement('span'));
  badges[room].className = status;
  badges[room].textContent = `${room}: ${status}`;
}

function cell(tr, text, cls) {
  const td = tr.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
}

function summarize() {
  const sorted = [...latencies].sort((a, b) => a - b);
  const q = (p) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
  summaryEl.textContent = `${latencies.length} row${latencies.length === 1 ? '' : 's'} received; commit → page p50 ${q(0.5)} ms, p99 ${q(0.99)} ms`;
}

function show(room, msg) {
  const row = msg.payload.record ?? msg.payload.old_record ?? {};
  // updated_at is clock_timestamp() at the write: in a one-statement transaction, its commit.
  const latency = Date.now() - Date.parse(row.updated_at);
  latencies.push(latency);
  const tr = rowsEl.insertRow(0);
  tr.className = 'new';
  tr.dataset.id = row.id;
  cell(tr, room);
  cell(tr, msg.event);
  cell(tr, row.id);
  cell(tr, row.author);
  cell(tr, row.body);
  cell(tr, `${latency} ms`, 'latency');
  while (rowsEl.rows.length > MAX_ROWS) rowsEl.deleteRow(-1);
  summarize();
}

// A Postgres Changes event as realtime-js hands it over: eventType, new and old (converted
// by the column types), commit_timestamp. A DELETE carries the old row's key only.
function showChange(change) {
  const row = change.eventType === 'DELETE' ? change.old : change.new;
  const latency = Date.now() - Date.parse(change.commit_timestamp);
  if (change.eventType !== 'DELETE') latencies.push(latency);
  const tr = changesEl.insertRow(0);
  tr.className = 'new';
  tr.dataset.id = row.id;
  tr.dataset.op = change.eventType;
  cell(tr, change.eventType);
  cell(tr, row.id);
  cell(tr, row.title ?? '');
  cell(tr, row.done === undefined ? '' : row.done ? '✓' : '·');
  cell(tr, `${latency} ms`, 'latency');
  while (changesEl.rows.length > MAX_ROWS) changesEl.deleteRow(-1);
  summarize();
}

// Resume: after each message, the channel's join payload names its position (meta.epoch,
// meta.seq), so that when the socket drops (a sidecar restart, a network blip) realtime-js's
// automatic rejoin gets everything committed meanwhile, and a system message says whether
// anything was lost.
function remember(channel, meta) {
  if (meta?.seq === undefined) return;
  const { config: c } = channel.joinPush.payload();
  channel.updateJoinPayload({ config: { ...c, broadcast: { ...c.broadcast, resume: { epoch: meta.epoch, seq: meta.seq } } } });
}

function showResume(room, s) {
  resumeEl.className = s.recovered ? 'recovered' : 'lost';
  resumeEl.textContent = s.recovered
    ? `${room}: reconnected, ${s.resent} row${s.resent === 1 ? '' : 's'} recovered, none missing`
    : `${room}: reconnected, messages lost: ${s.message}`;
}

const resumeEl = document.getElementById('resume');
for (const room of config.rooms) {
  const channel = client.channel(`room:${room}`, { config: { private: false } });
  channel.on('broadcast', { event: '*' }, (msg) => {
    show(room, msg);
    remember(channel, msg.meta);
  });
  channel.on('system', {}, (s) => 'recovered' in s && showResume(room, s));
  channel.subscribe((status) => setStatus(room, status));
}

// The task list's position covers its changes (`resume: {changes: true}`): the sidecar tells
// it after each batch of changes in a system message, which the page keeps in its join
// payload as it keeps the rooms' positions, so the rejoin after a dropped socket resends
// every change committed meanwhile.
const tasksResumeEl = document.getElementById('tasks-resume');
const tasks = client.channel('tasks', { config: { broadcast: { resume: { changes: true } } } });
tasks.on('postgres_changes', { event: '*', schema: 'public', table: 'demo_tasks' }, showChange);
tasks.on('system', {}, (s) => {
  if (s.seq !== undefined && s.seq !== null && s.epoch !== undefined) {
    const { config: c } = tasks.joinPush.payload();
    tasks.updateJoinPayload({ config: { ...c, broadcast: { ...c.broadcast, resume: { epoch: s.epoch, seq: s.seq, changes: true } } } });
  }
  if (!('recovered' in s)) return;
  tasksResumeEl.className = s.recovered ? 'recovered' : 'lost';
  tasksResumeEl.textContent = s.recovered
    ? `demo_tasks: reconnected, ${s.changes} change${s.changes === 1 ? '' : 's'} recovered, none missing`
    : `demo_tasks: reconnected, changes lost: ${s.message}`;
});
tasks.subscribe((status) => setStatus('demo_tasks', status));

// Presence: this page is one of the watchers. It tracks itself once subscribed, and again
// after every rejoin (realtime-js rejoins by itself when the socket comes back; a member
// lives as long as its channel, so a new channel tracks again, as Supabase apps do).
const watchersEl = document.getElementById('watchers');
const me = `page-${Math.random().toString(36).slice(2, 7)}`;
const watchers = client.channel('watchers', { config: { presence: { key: me } } });
watchers.on('presence', { event: 'sync' }, () => {
  const state = watchers.presenceState();
  const names = Object.keys(state).sort();
  watchersEl.replaceChildren(
    ...names.map((name) => {
      const li = document.createElement('li');
      const [meta] = state[name];
      li.dataset.key = name;
      li.textContent = `${name} (${meta.kind}${name === me ? ', this page' : ''}) since ${new Date(meta.since).toLocaleTimeString()}`;
      return li;
    }),
  );
  document.getElementById('watching').textContent = `${names.length} watching`;
});
watchers.subscribe((status) => {
  setStatus('watchers', status);
  if (status === 'SUBSCRIBED') watchers.track({ kind: 'page', since: Date.now() });
});
