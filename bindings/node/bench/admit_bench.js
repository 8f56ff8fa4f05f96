'use strict';
// The cost of one admit + complete from Node.js, next to an empty call into an addon function
// (the addon's own `empty`, through the same Node-API as admit and complete), and the two
// addon calls alone (no Permit object; the latency measured as complete() measures it),
// measured side by side in one run:
//
//   RETRYD_LIBRARY=build/client/libretryd.so \
//   RETRYD_NODE_ADDON=build/tests/bindings/node/addon/retryd.node \
//   node bindings/node/bench/admit_bench.js [N]
//
// Each loop runs N times (default 1,000,000); the loops take turns, 5 rounds, and each keeps its
// best round, so a busy machine slows them alike. The client runs on per-process limits (no
// daemon: the same atomic instructions on process memory) unless BENCH_SEGMENT=NAME or
// BENCH_SOCKET=PATH names a running daemon's segment or socket.

const retryd = require('..');
const native = require('../lib/native');

const N = Number(process.argv[2] || 1000000);
const ROUNDS = 5;

function main() {
  let options = { segment: `retryd-bench-absent-${process.pid}` };
  if (process.env.BENCH_SOCKET) options = { socket: process.env.BENCH_SOCKET };
  else if (process.env.BENCH_SEGMENT) options = { segment: process.env.BENCH_SEGMENT };
  const client = new retryd.Client(options);
  const dep = client.dependency('bench');

  const loops = {
    'empty addon function call': () => {
      for (let i = 0; i < N; i++) native.empty();
    },
    'dep.admit().complete()': () => {
      for (let i = 0; i < N; i++) dep.admit().complete();
    },
    // The two addon calls alone, with no Permit object: what the JavaScript layer adds.
    'two raw addon calls': () => {
      const handle = client._handle;
      const id = dep._id;
      for (let i = 0; i < N; i++) {
        native.admit(handle, id, 0);
        native.complete(handle, 0, -1);
      }
    },
  };
  const best = {};
  for (const name of Object.keys(loops)) best[name] = Infinity;
  for (let round = 0; round < ROUNDS; round++) {
    for (const [name, loop] of Object.entries(loops)) {
      const start = process.hrtime.bigint();
      loop();
      best[name] = Math.min(best[name], Number(process.hrtime.bigint() - start) / N);
    }
  }
  const base = best['empty addon function call'];
  console.log(`${client.local ? 'local' : 'attached'}, Node.js ${process.version}, ` +
              `best of ${ROUNDS} rounds of ${N.toLocaleString('en')}:`);
  for (const [name, ns] of Object.entries(best)) {
    const ratio = (ns / base).toFixed(1).padStart(5);
    console.log(`  ${name.padEnd(30)} ${ns.toFixed(1).padStart(8)} ns  (${ratio}x)`);
  }
  client.close();
}

main();
