// k6's view of one fan-out row, an independent check of the load generator: VUS
// subscribers join realtime:TOPIC on our sidecar (serializer 1.0.0) and time each broadcast
// from the database's send stamp (payload.t, microseconds) to its arrival (Date.now(), so
// millisecond resolution). The messages come from the load generator run with --clients 0.
// Env: URL, APIKEY, TOPIC, VUS, HOLD_MS, OUT (summary JSON path).
import ws from 'k6/ws';
import { Counter, Trend } from 'k6/metrics';

const latency = new Trend('commit_to_receive', true);
const deliveries = new Counter('deliveries');
const joined = new Counter('joined');
const gaps = new Counter('gaps');

export const options = {
  scenarios: {
    subscribers: { executor: 'per-vu-iterations', vus: Number(__ENV.VUS), iterations: 1, maxDuration: '10m' },
  },
  summaryTrendStats: ['med', 'p(95)', 'p(99)', 'max'],
};

export default function () {
  const url = `${__ENV.URL}/realtime/v1/websocket?apikey=${__ENV.APIKEY}&vsn=1.0.0`;
  ws.connect(url, {}, (socket) => {
    let last = 0;
    socket.on('open', () => {
      socket.send(JSON.stringify({
        topic: `realtime:${__ENV.TOPIC}`, event: 'phx_join', ref: 'j0', join_ref: 'j0',
        payload: { config: { broadcast: { self: false, ack: false }, private: false } },
      }));
      socket.setInterval(() => {
        socket.send(JSON.stringify({ topic: 'phoenix', event: 'heartbeat', payload: {}, ref: 'hb' }));
      }, 20000);
      socket.setTimeout(() => socket.close(), Number(__ENV.HOLD_MS));
    });
    socket.on('message', (data) => {
      const frame = JSON.parse(data);
      if (frame.event === 'broadcast') {
        const body = frame.payload.payload;
        latency.add(Date.now() - body.t / 1000);
        deliveries.add(1);
        if (body.n > last + 1) gaps.add(body.n - last - 1);
        last = Math.max(last, body.n);
      } else if (frame.event === 'phx_reply' && frame.ref === 'j0' && frame.payload.status === 'ok') {
        joined.add(1);
      }
    });
  });
}

export function handleSummary(data) {
  return { [__ENV.OUT]: JSON.stringify(data) };
}
