// A request decider for the Node proxy of @anthropic-ai/sandbox-runtime (`srt-proxy`), for
// bench/workers.py: the proxy asks it about every request over an inherited socket, as it
// would ask its host. It allows a request to an allow-listed host:port with an allowed method
// and denies anything else (403), so the proxy pays a real per-request round trip and decision.
//
// Framing (from the package's decider-client.js): a 4-byte big-endian length, then one JSON
// object. The proxy says hello first; the answer carries the allowlist.
//
//   node srt_decider.mjs FD '["127.0.0.2:8443", ...]'
import { Socket } from 'node:net';

const fd = Number(process.argv[2]);
const allowed = JSON.parse(process.argv[3]);
const allowedSet = new Set(allowed);
const methods = new Set(['GET', 'HEAD', 'POST']);
const sock = new Socket({ fd, readable: true, writable: true });

function send(msg) {
  const body = Buffer.from(JSON.stringify(msg), 'utf8');
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length);
  sock.write(Buffer.concat([head, body]));
}

function verdict(m) {
  if (allowedSet.has(`${m.host}:${m.port}`) && methods.has(m.method)) {
    return { t: 'verdict', id: m.id, action: 'allow' };
  }
  return { t: 'verdict', id: m.id, action: 'deny', status: 403, reason: 'not allowed' };
}

let buf = Buffer.alloc(0);
sock.on('data', chunk => {
  buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
  while (buf.length >= 4) {
    const n = buf.readUInt32BE(0);
    if (buf.length < 4 + n) break;
    const m = JSON.parse(buf.subarray(4, 4 + n).toString('utf8'));
    buf = buf.subarray(4 + n);
    if (m.t === 'hello') {
      send({ t: 'hello', proto: 1, allowedDomains: allowed, deniedDomains: [] });
    } else if (m.t === 'req') {
      send(verdict(m));
    }
  }
});
sock.on('end', () => process.exit(0));
sock.on('error', () => process.exit(1));
