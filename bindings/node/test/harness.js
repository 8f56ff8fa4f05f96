'use strict';
// What the Node.js binding's tests share: real named segments (made by retryd_test_segment),
// a real daemon on a private socket or segment, retryctl's JSON, and polling. Every wait polls
// its condition with a generous timeout: the machine may be loaded.
//
// The built programs come from the environment ctest sets (RETRYD_LIBRARY, RETRYD_NODE_ADDON,
// RETRYD_TEST_SEGMENT, RETRYD_DAEMON, RETRYD_RETRYCTL), else from the source tree's build
// directories (build*/).

const assert = require('assert');
const { execFile, spawn } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const readline = require('readline');

const ROOT = path.resolve(__dirname, '..', '..', '..');
const TIMEOUT_MS = 60000;

function built(envName, relative) {
  if (process.env[envName]) return process.env[envName];
  for (const dir of fs
    .readdirSync(ROOT)
    .filter((d) => d.startsWith('build'))
    .sort()) {
    const file = path.join(ROOT, dir, relative);
    if (fs.existsSync(file)) return file;
  }
  throw new Error(`${relative} not built (and ${envName} not set)`);
}

if (!process.env.RETRYD_LIBRARY)
  process.env.RETRYD_LIBRARY = built('RETRYD_LIBRARY', 'client/libretryd.so');
if (!process.env.RETRYD_NODE_ADDON) {
  const local = path.join(ROOT, 'bindings', 'node', 'build', 'retryd.node');
  process.env.RETRYD_NODE_ADDON = fs.existsSync(local)
    ? local
    : built('RETRYD_NODE_ADDON', 'tests/bindings/node/addon/retryd.node');
}

const retryd = require('..');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Resolves to cond()'s first truthy value, polling until `timeoutMs`; fails naming `what`. */
async function poll(cond, what, timeoutMs = TIMEOUT_MS, intervalMs = 20) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > end)
      throw new Error(`timed out after ${timeoutMs / 1000} s waiting for ${what}`);
    await sleep(intervalMs);
  }
}

function tmpdir(prefix) {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

let ids = 0;

/** A named segment holding `deps` ({name: {key: value}}: config keys and TOML values), held by
 * a retryd_test_segment process; close() removes it. */
async function makeSegment(deps) {
  const maker = built('RETRYD_TEST_SEGMENT', 'tests/client/retryd_test_segment');
  const name = `retryd-nodetest-${process.pid}-${ids++}`;
  const specs = Object.entries(deps).map(([dep, settings]) => {
    const pairs = Object.entries(settings)
      .map(([k, v]) => `${k}=${JSON.stringify(v)}`)
      .join(',');
    return pairs ? `${dep}:${pairs}` : dep;
  });
  const proc = spawn(maker, [name, ...specs], { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines = readline.createInterface({ input: proc.stdout })[Symbol.asyncIterator]();
  const next = async () => (await lines.next()).value;
  const ready = await next();
  if (ready !== 'READY') {
    proc.kill();
    throw new Error(`retryd_test_segment did not start: ${ready}`);
  }
  const ask = async (line) => {
    proc.stdin.write(line + '\n');
    return next();
  };
  return {
    name,
    state: (dep) => ask(`state ${dep}`),
    reset: (dep) => ask(`reset ${dep}`),
    close: () =>
      new Promise((resolve) => {
        if (proc.exitCode !== null) return resolve();
        proc.once('exit', resolve);
        proc.stdin.end();
      }),
  };
}

/** Runs retryctl with `args` (after --socket or --segment) and --json; resolves to its JSON. */
function retryctl(where, ...args) {
  const bin = built('RETRYD_RETRYCTL', 'cli/retryctl');
  const target = where.socket ? ['--socket', where.socket] : ['--segment', where.segment];
  return new Promise((resolve, reject) => {
    execFile(bin, [...target, ...args, '--json'], { timeout: 30000 }, (err, stdout, stderr) => {
      // Exit 1: a breaker is open; 3: no daemon (a segment of retryd_test_segment's). The JSON is there all
      // the same.
      if (err && err.code !== 1 && err.code !== 3)
        return reject(new Error(`retryctl ${args.join(' ')}: ${stderr || err.message}`));
      try {
        resolve(JSON.parse(stdout));
      } catch (e) {
        reject(new Error(`retryctl ${args.join(' ')}: not JSON: ${stdout} ${stderr}`));
      }
    });
  });
}

/** A dependency's entry in `retryctl status`. */
async function depStatus(where, name) {
  const status = await retryctl(where, 'status');
  const dep = status.dependencies.find((d) => d.name === name);
  assert.ok(dep, `retryctl status lists no ${name}`);
  return dep;
}

/** {pid: entry} of the live processes `retryctl workers` lists. */
async function liveWorkers(where) {
  const out = {};
  for (const w of (await retryctl(where, 'workers')).workers) {
    if (w.state === 'live') out[w.pid] = w;
  }
  return out;
}

function toml(value) {
  return JSON.stringify(value); // strings, numbers, booleans and arrays read alike
}

/** A real retryd on a config of its own in `dir`: through a socket (socket: true, the packaged
 * way) or by segment name. Resolves once retryctl sees it up. */
async function startDaemon(dir, deps, { socket = true } = {}) {
  const bin = built('RETRYD_DAEMON', 'daemon/retryd');
  const where = socket
    ? { socket: path.join(dir, 'retryd.sock') }
    : { segment: `retryd-nodetest-${process.pid}-${ids++}` };
  let text = '[daemon]\n';
  text += socket
    ? `socket = ${toml(where.socket)}\n`
    : `segment = ${toml(where.segment)}\nsocket = ""\nmode = "0600"\n`;
  text += 'tick = "10ms"\n';
  for (const [name, settings] of Object.entries(deps)) {
    text += `\n[dependency.${name}]\n`;
    for (const [k, v] of Object.entries(settings)) text += `${k} = ${toml(v)}\n`;
  }
  const config = path.join(dir, 'retryd.toml');
  fs.writeFileSync(config, text);
  const logPath = path.join(dir, 'retryd.log');
  const log = fs.openSync(logPath, 'w');
  const proc = spawn(bin, [`--config=${config}`], { stdio: ['ignore', log, log] });
  fs.closeSync(log);
  let exited = false;
  proc.once('exit', () => {
    exited = true;
  });
  await poll(async () => {
    if (exited) throw new Error('retryd exited: ' + fs.readFileSync(logPath, 'utf8'));
    try {
      return (await retryctl(where, 'status')).daemon.state === 'up';
    } catch {
      return false; // no socket or segment yet
    }
  }, 'the daemon to come up');
  return {
    ...where,
    log: () => fs.readFileSync(logPath, 'utf8'),
    stop: async () => {
      if (!exited) {
        proc.kill('SIGTERM');
        await poll(() => exited, 'the daemon to stop');
      }
      // A daemon stopped by SIGTERM leaves a named segment for the next one: this one is ours.
      if (where.segment) fs.rmSync(`/dev/shm/${where.segment}`, { force: true });
    },
  };
}

module.exports = {
  ROOT,
  TIMEOUT_MS,
  retryd,
  built,
  poll,
  sleep,
  tmpdir,
  makeSegment,
  retryctl,
  depStatus,
  liveWorkers,
  startDaemon,
};
