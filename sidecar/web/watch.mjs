// The demo's terminal twin of the page: subscribes like the page does (realtime-js over the
// `ws` transport: the rooms' broadcasts and the task list's Postgres Changes) and prints each
// row with its commit-to-receive latency, for SECONDS seconds. Like the page, it resumes after
// its last position when its socket drops (the demo restarts the sidecar halfway), and it is
// one of the watchers the page lists (Presence), saying who joins and leaves.
// Usage: node watch.mjs URL APIKEY SECONDS ROOM...
import WebSocket from 'ws';
import { RealtimeClient } from '@supabase/realtime-js';

const [url, apikey, seconds, ...rooms] = process.argv.slice(2);
const client = new RealtimeClient(`${url}/realtime/v1`, { transport: WebSocket, params: { apikey } });
await client.setAuth(apikey);
const latencies = [];
for (const room of rooms) {
  const channel = client.channel(`room:${room}`, { config: { private: false } });
  channel.on('broadcast', { event: '*' }, (msg) => {
    const { config } = channel.joinPush.payload();
    const resume = { epoch: msg.meta.epoch, seq: msg.meta.seq };
    channel.updateJoinPayload({ config: { ...config, broadcast: { ...config.broadcast, resume } } });
    const row = msg.payload.record ?? msg.payload.old_record ?? {};
    const latency = Date.now() - Date.parse(row.updated_at);
    latencies.push(latency);
    console.log(`  room:${room.padEnd(7)} ${msg.event.padEnd(6)} #${String(row.id).padEnd(5)} ${row.body}  (${latency} ms)`);
  });
  channel.on('system', {}, (s) => {
    if ('recovered' in s) console.log(`  room:${room} resumed: recovered ${s.recovered}, ${s.resent} sent again; ${s.message}`);
  });
  channel.subscribe((status) => console.log(`  room:${room} ${status}`));
}
client
  .channel('tasks')
  .on('postgres_changes', { event: '*', schema: 'public', table: 'demo_tasks' }, (c) => {
    const row = c.eventType === 'DELETE' ? c.old : c.new;
    const latency = Date.now() - Date.parse(c.commit_timestamp);
    console.log(`  demo_tasks   ${c.eventType.padEnd(6)} #${String(row.id).padEnd(5)} ${row.title ?? ''}${row.done ? ' ✓' : ''}  (${latency} ms)`);
  })
  .subscribe((status) => console.log(`  demo_tasks (postgres_changes) ${status}`));
const watchers = client.channel('watchers', { config: { presence: { key: 'terminal' } } });
watchers.on('presence', { event: 'join' }, ({ key }) => key !== 'terminal' && console.log(`  watchers: ${key} joined`));
watchers.on('presence', { event: 'leave' }, ({ key }) => key !== 'terminal' && console.log(`  watchers: ${key} left`));
watchers.subscribe((status) => {
  if (status === 'SUBSCRIBED') watchers.track({ kind: 'terminal', since: Date.now() });
});
setTimeout(() => {
  const s = [...latencies].sort((a, b) => a - b);
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))];
  console.log(`  ${s.length} rows received; commit-to-receive p50 ${q(0.5)} ms, p99 ${q(0.99)} ms`);
  client.disconnect();
  process.exit(0);
}, Number(seconds) * 1000);
