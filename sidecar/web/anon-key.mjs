// Prints an anon JWT (HS256, role anon, valid for a day) signed with the given secret, like
// a Supabase project's anon key. Usage: node anon-key.mjs SECRET
import crypto from 'node:crypto';

const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
const body = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64({ role: 'anon', iss: 'pg_realtime-demo', exp: Math.floor(Date.now() / 1000) + 86400 })}`;
const sig = crypto.createHmac('sha256', process.argv[2]).update(body).digest('base64url');
console.log(`${body}.${sig}`);
