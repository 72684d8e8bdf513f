// realtime-js as one ES module for pages other than the demo: the end-to-end tests load it
// into a page served from another origin than the sidecar's (sidecar/e2e/cors.test.mjs).
export { RealtimeClient } from '@supabase/realtime-js';
