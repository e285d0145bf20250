// A gRPC Node (grpc-js with grpc-js-xds) xDS client for xds/traffic_nongo_test.go.
//
// Usage: GRPC_XDS_BOOTSTRAP=bootstrap.json node client.js <listener>
//
// It dials xds:///<listener> once, then reads one JSON request a line from
// stdin and answers each with one JSON line on stdout:
//
//   in:  {"calls": 100, "method": "Check" | "Watch", "metadata": {"x-user": "u1"}, "deadline_ms": 0}
//   out: {"backends": {"a": 80, "b": 20}, "errors": {"UNAVAILABLE": 3}, "details": {"UNAVAILABLE": "..."}, "min_ms": 0.4, "max_ms": 3.1}
//
// Calls are made one after another. A call's backend is the x-backend
// response header (internal/xdstest's backends name themselves in it);
// a failed call counts under its status code's name, and the first
// failure of each code gives its details. Check is
// grpc.health.v1.Health/Check (unary); Watch is Health/Watch (server
// streaming): its backend is read from the response headers, then the call
// is cancelled. deadline_ms 0 gives each call 10 s, so a call never hangs.
// The messages are empty HealthCheckRequests: no .proto is needed.
'use strict';

const grpc = require('@grpc/grpc-js');
const xds = require('@grpc/grpc-js-xds');
const readline = require('readline');

xds.register();

const target = process.argv[2];
if (!target) {
  process.stderr.write('usage: node client.js <listener>\n');
  process.exit(2);
}
const client = new grpc.Client('xds:///' + target, grpc.credentials.createInsecure());

const codeName = {};
for (const [name, code] of Object.entries(grpc.status)) codeName[code] = name;

const identity = (b) => b;
const empty = Buffer.alloc(0);

function metadataOf(obj) {
  const md = new grpc.Metadata();
  for (const [k, v] of Object.entries(obj || {})) md.set(k, String(v));
  return md;
}

function backendOf(md) {
  const v = md && md.get('x-backend');
  return v && v.length > 0 ? String(v[0]) : '';
}

// one makes one call and resolves to {backend} or {code, message}.
function one(method, md, deadlineMs) {
  const deadline = new Date(Date.now() + (deadlineMs > 0 ? deadlineMs : 10000));
  return new Promise((resolve) => {
    let backend = '';
    if (method === 'Watch') {
      let done = false;
      const call = client.makeServerStreamRequest('/grpc.health.v1.Health/Watch', identity, identity, empty, md, { deadline });
      const finish = (r) => { if (!done) { done = true; resolve(r); } };
      call.on('metadata', (h) => {
        backend = backendOf(h);
        finish({ backend });
        call.cancel();
      });
      call.on('data', () => {});
      call.on('error', (err) => finish({ code: codeName[err.code] || String(err.code), message: err.details || err.message }));
      call.on('status', (s) => finish(s.code === grpc.status.OK ? { backend } : { code: codeName[s.code], message: s.details }));
      return;
    }
    const call = client.makeUnaryRequest('/grpc.health.v1.Health/Check', identity, identity, empty, md, { deadline }, (err) => {
      if (err) resolve({ code: codeName[err.code] || String(err.code), message: err.details || err.message });
      else resolve({ backend });
    });
    call.on('metadata', (h) => { backend = backendOf(h); });
  });
}

async function batch(req) {
  const out = { backends: {}, errors: {}, details: {}, min_ms: 0, max_ms: 0 };
  const md = metadataOf(req.metadata);
  for (let i = 0; i < (req.calls || 1); i++) {
    const start = process.hrtime.bigint();
    const r = await one(req.method || 'Check', md.clone(), req.deadline_ms || 0);
    const ms = Number(process.hrtime.bigint() - start) / 1e6;
    out.min_ms = i === 0 ? ms : Math.min(out.min_ms, ms);
    out.max_ms = Math.max(out.max_ms, ms);
    if (r.code) {
      if (!(r.code in out.errors)) out.details[r.code] = r.message;
      out.errors[r.code] = (out.errors[r.code] || 0) + 1;
    } else {
      out.backends[r.backend] = (out.backends[r.backend] || 0) + 1;
    }
  }
  return out;
}

// Requests are answered in order, one at a time.
const rl = readline.createInterface({ input: process.stdin });
let queue = Promise.resolve();
rl.on('line', (line) => {
  if (!line.trim()) return;
  queue = queue.then(async () => {
    let out;
    try {
      out = await batch(JSON.parse(line));
    } catch (e) {
      out = { fatal: String(e && e.stack || e) };
    }
    process.stdout.write(JSON.stringify(out) + '\n');
  });
});
rl.on('close', () => queue.then(() => { client.close(); process.exit(0); }));
