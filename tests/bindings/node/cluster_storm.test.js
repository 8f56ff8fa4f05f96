'use strict';
// The node:cluster server under attack: cluster_main.js, 4 workers running app.js, attached
// through a real daemon's socket, against a downstream the test controls (server_harness.js's).
// A failing test here is a broken promise: its title says which.
//
//   - exactly one probe reaches a recovered downstream when 48 clients, looping, hammer every
//     worker across the end of the open period;
//   - exactly one probe reaches it when the clients whose requests carry the probe give up
//     (reset their connection) while the probe is out downstream;
//   - a worker SIGKILLed while it awaits its probe's answer gives the probe back, and the next
//     probe closes the breaker.

const test = require('node:test');
const assert = require('assert');
const { spawn } = require('child_process');
const fs = require('fs');
const net = require('net');
const path = require('path');
const harness = require('../../../bindings/node/test/harness');
const { Downstream, get, freePort, WORKERS } = require('./server_harness');

const { poll, depStatus, liveWorkers, startDaemon, tmpdir } = harness;

const OPEN_FOR_MS = 2000;
const DEPENDENCIES = {
  downstream: {
    window: '60s',
    min_calls: 8,
    failure_rate_threshold: 50,
    open_for: `${OPEN_FOR_MS}ms`,
    open_for_max: `${OPEN_FOR_MS}ms`,
    open_jitter: '0s',
    half_open_probes: 1,
    close_after: 1,
    probe_timeout: '30s',
  },
  budget: { min_calls: 100000 },
  slow: { min_calls: 100000 },
};

let dir;
let daemon;
let downstream;
let cluster;
let clusterExited = false;
let port;

async function workers(what = `${WORKERS} workers registered`) {
  return poll(async () => {
    if (clusterExited) throw new Error(`the cluster exited:\n${clusterLog()}`);
    const live = Object.keys(await liveWorkers(daemon)).map(Number);
    return live.length === WORKERS ? new Set(live) : null;
  }, what);
}

function clusterLog() {
  return fs.readFileSync(path.join(dir, 'cluster.log'), 'utf8');
}

/** /call on the app; a request the server drops (its worker killed) is {outcome: 'dropped'}. */
const call = () => get(port, '/call').catch((e) => ({ outcome: 'dropped', error: String(e) }));

/** Trips the breaker with the downstream failing, then waits for it to be open, no probe out. */
async function trip() {
  downstream.release(); // whatever an earlier test left held
  downstream.mode = 'down';
  await poll(async () => {
    const burst = await Promise.all(Array.from({ length: 8 }, call));
    return burst.some((a) => a.outcome === 'open');
  }, 'the workers to trip the breaker');
  return poll(async () => {
    const d = await depStatus(daemon, 'downstream');
    return d.breaker.state === 'open' && d.breaker.probes_in_flight === 0 ? d : null;
  }, 'the breaker open with no probe out');
}

/** Lets the held probe answer and waits for the breaker to close. */
async function recover() {
  downstream.release();
  return poll(async () => {
    const a = await call();
    return a.outcome === 200 && (await depStatus(daemon, 'downstream')).breaker.state === 'closed';
  }, 'the breaker to close');
}

test.before(async () => {
  dir = tmpdir('retryd-node-storm-');
  daemon = await startDaemon(dir, DEPENDENCIES, { socket: true });
  downstream = new Downstream();
  await downstream.start();
  port = await freePort();
  const log = fs.openSync(path.join(dir, 'cluster.log'), 'w');
  cluster = spawn(process.execPath, [path.join(__dirname, 'cluster_main.js')], {
    env: {
      ...process.env,
      WORKERS: String(WORKERS),
      PORT: String(port),
      DOWNSTREAM_URL: downstream.url,
      RETRYD_NODE_PACKAGE: path.resolve(__dirname, '../../../bindings/node'),
      RETRYD_SOCKET: daemon.socket,
      RETRYD_SEGMENT: '',
    },
    stdio: ['ignore', log, log],
  });
  fs.closeSync(log);
  cluster.once('exit', () => {
    clusterExited = true;
  });
  await workers();
  await poll(async () => {
    try {
      return await get(port, '/ping');
    } catch {
      return null; // not listening yet
    }
  }, 'the cluster to answer');
});

test.after(async () => {
  try {
    if (downstream) downstream.release();
    if (cluster && !clusterExited) {
      cluster.kill('SIGTERM');
      await poll(() => clusterExited, 'the cluster to stop');
    }
  } finally {
    if (downstream) await downstream.close();
    if (daemon) await daemon.stop();
    if (dir && !process.env.RETRYD_KEEP_TEST_DIR) fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('promise 4: one probe reaches the recovered downstream under 48 looping clients', async (t) => {
  await workers();
  await trip();
  downstream.hold(); // answers again, holding the first request that reaches it
  let stop = false;
  const answers = [];
  let afterProbe = 0;
  let probeSeen = false;
  downstream.probeArrived.then(() => {
    probeSeen = true;
  });
  const hammer = async () => {
    while (!stop) {
      const a = await call();
      answers.push(a);
      if (probeSeen) afterProbe++;
    }
  };
  const clients = Array.from({ length: 48 }, hammer);
  // From inside the open period, across its end, until the workers have refused many more
  // requests while the probe is out.
  await poll(() => probeSeen && afterProbe >= 150, 'the probe to go out and 150 answers after it');
  stop = true;
  // Read while the probe is still held: the client that carries it waits for its answer.
  const sinceHeld = downstream.sinceHeld;
  const inFlight = (await depStatus(daemon, 'downstream')).breaker.probes_in_flight;
  downstream.release();
  await Promise.all(clients);
  const outcomes = {};
  for (const a of answers) outcomes[a.outcome] = (outcomes[a.outcome] || 0) + 1;
  const busyPids = new Set(answers.filter((a) => a.outcome === 'half_open_busy').map((a) => a.pid));
  t.diagnostic(`${answers.length} answers ${JSON.stringify(outcomes)} (half_open_busy from ` +
               `${busyPids.size} workers); ${sinceHeld} request(s) reached the recovered ` +
               'downstream while the probe was out');
  assert.strictEqual(sinceHeld, 1, 'one request reached the recovered downstream');
  assert.strictEqual(inFlight, 1);
  assert.strictEqual(busyPids.size, WORKERS, 'every worker refused while the probe was out');
  for (const outcome of Object.keys(outcomes)) {
    assert.ok(['open', 'half_open_busy', '200'].includes(outcome), JSON.stringify(outcomes));
  }
  await recover();
});

test("promise 4: one probe when the probe's clients give up (reset) while it is out", async (t) => {
  await workers();
  await trip();
  downstream.hold();
  const before = (await depStatus(daemon, 'downstream')).counters.probes_granted;
  // Each client sends /call, waits until its request is answered or the probe has reached the
  // downstream, then resets its connection (a proxy's timeout): the handler of the probe's
  // request is not awaited by anyone any more.
  let gaveUp = 0;
  await poll(async () => {
    const socket = net.connect(port, '127.0.0.1');
    await new Promise((resolve) => socket.once('connect', resolve));
    socket.write('GET /call HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n');
    const answered = new Promise((resolve) => socket.once('data', () => resolve('answered')));
    const why = await Promise.race([answered, downstream.probeArrived.then(() => 'probe')]);
    if (why === 'probe') gaveUp++;
    socket.resetAndDestroy();
    return why === 'probe';
  }, 'the probe to reach the downstream');
  // Clients keep coming and giving up while the probe is out.
  for (let i = 0; i < 40; i++) {
    const socket = net.connect(port, '127.0.0.1');
    await new Promise((resolve) => socket.once('connect', resolve));
    socket.write('GET /call HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n');
    await Promise.race([
      new Promise((resolve) => socket.once('data', resolve)),
      harness.sleep(50), // not a check: how long an impatient client waits
    ]);
    socket.resetAndDestroy();
  }
  const answers = await Promise.all(Array.from({ length: 16 }, call));
  const d = await depStatus(daemon, 'downstream');
  t.diagnostic(`${gaveUp} probe client gave up; ${downstream.sinceHeld} request(s) reached the ` +
               `recovered downstream; probes granted ${d.counters.probes_granted - before}; ` +
               `then ${JSON.stringify(answers.map((a) => a.outcome))}`);
  assert.strictEqual(downstream.sinceHeld, 1, 'one request reached the recovered downstream');
  assert.strictEqual(d.counters.probes_granted - before, 1);
  assert.ok(answers.every((a) => a.outcome === 'half_open_busy'), JSON.stringify(answers));
  await recover();
});

test('promise 4: a worker SIGKILLed while it awaits its probe gives the probe back', async (t) => {
  const pids = await workers();
  await trip();
  downstream.hold();
  const probeRequest = poll(async () => {
    const a = await call();
    return a.outcome === 'dropped' ? a : null; // its worker is killed below
  }, 'the probe request');
  await downstream.probeArrived;
  const holder = downstream.heldPid;
  assert.ok(pids.has(holder));
  const d = await depStatus(daemon, 'downstream');
  assert.strictEqual(d.breaker.probes_in_flight, 1);
  assert.strictEqual((await liveWorkers(daemon))[holder].probe_leases, 1);
  const reclaimed = d.counters.leases_reclaimed_dead;
  process.kill(holder, 'SIGKILL');
  await probeRequest;
  const after = await poll(async () => {
    const s = await depStatus(daemon, 'downstream');
    return s.breaker.probes_in_flight === 0 ? s : null;
  }, "the daemon to take the dead worker's probe back");
  assert.strictEqual(after.counters.leases_reclaimed_dead, reclaimed + 1);
  // The downstream has recovered: the next probe, from any worker, closes the breaker.
  downstream.heldResponse = null;
  downstream.mode = 'up';
  const now = await poll(async () => {
    const live = await workers('a replacement worker');
    return live.has(holder) ? null : live;
  }, 'the replacement worker to register');
  const closed = await poll(async () => {
    const a = await call();
    if (a.outcome !== 200) return null;
    const s = await depStatus(daemon, 'downstream');
    return s.breaker.state === 'closed' ? s : null;
  }, 'the next probe to close the breaker');
  t.diagnostic(`worker ${holder} killed holding the probe; reclaimed; workers now ` +
               `${[...now].join(', ')}; breaker ${closed.breaker.state}`);
});
