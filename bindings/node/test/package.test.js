'use strict';
// The package as npm makes it: `npm pack` of bindings/node holds what it should and nothing
// else, `npm install` of the tarball into a project of its own builds the addon (its install
// script, CMake) with no network, the installed package works from that project, and its
// TypeScript declarations type-check a program that uses the API (tsc, Debian's
// node-typescript).

const test = require('node:test');
const assert = require('assert');
const { execFileSync } = require('child_process');
const fs = require('fs');
const path = require('path');
const { ROOT, tmpdir } = require('./helpers');

const PACKAGE = path.resolve(__dirname, '..');
const npm = (args, cwd, env = {}) => execFileSync('npm', args, {
  cwd, env: { ...process.env, ...env, npm_config_update_notifier: 'false' }, encoding: 'utf8',
  stdio: ['ignore', 'pipe', 'pipe'], timeout: 240000,
});

let dir;
let tarball;
let project;
test.before(() => {
  dir = tmpdir('retryd-node-pack-');
  const [packed] = JSON.parse(npm(['pack', '--json', '--pack-destination', dir], PACKAGE));
  tarball = path.join(dir, packed.filename);
  test.packed = packed;
});
test.after(() => fs.rmSync(dir, { recursive: true, force: true }));

test('npm pack holds the JavaScript, the declarations, the addon\'s sources and build, and the README', () => {
  const files = test.packed.files.map((f) => f.path).sort();
  const expected = ['CMakeLists.txt', 'README.md', 'index.d.ts', 'package.json', 'scripts/build.js',
                    'src/retryd_node.c', ...fs.readdirSync(path.join(PACKAGE, 'lib')).map((f) => `lib/${f}`)];
  assert.deepStrictEqual(files, expected.sort());
  const pkg = JSON.parse(fs.readFileSync(path.join(PACKAGE, 'package.json'), 'utf8'));
  assert.strictEqual(pkg.license, 'Apache-2.0');
  assert.strictEqual(test.packed.name, 'retryd');
});

test('npm install of the tarball builds the addon, and the package works where it is installed', () => {
  project = path.join(dir, 'project');
  fs.mkdirSync(project);
  fs.writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'app', private: true }));
  // The headers of this tree (no libretryd-dev here), and no addon or library path of the
  // tests: the installed package must find its own addon.
  const env = { RETRYD_INCLUDE_DIR: path.join(ROOT, 'client', 'include'), RETRYD_NODE_ADDON: '' };
  npm(['install', '--offline', '--no-audit', '--no-fund', '--foreground-scripts', tarball], project, env);
  const addon = path.join(project, 'node_modules', 'retryd', 'build', 'retryd.node');
  assert.ok(fs.existsSync(addon), 'the install script built build/retryd.node');
  const script = `
    const retryd = require('retryd');
    const client = new retryd.Client({ segment: 'retryd-nodetest-absent-${process.pid}' });
    client.dependency('orders').admit().complete();
    client.dependency('orders').call(async (a) => a.number + 42).then((v) => {
      console.log(JSON.stringify({ local: client.local, value: v,
                                   addon: require.resolve('retryd/build/retryd.node') }));
    });`;
  const childEnv = { ...process.env };
  delete childEnv.RETRYD_NODE_ADDON;
  delete childEnv.NODE_PATH;
  const out = JSON.parse(execFileSync(process.execPath, ['-e', script],
                                      { cwd: project, env: childEnv, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }));
  assert.deepStrictEqual(out, { local: true, value: 42, addon });
});

test('the TypeScript declarations type-check a program that uses the API', () => {
  assert.ok(project, 'the package is installed');
  const tsc = process.env.RETRYD_TSC || 'tsc';
  fs.writeFileSync(path.join(project, 'app.ts'), `
import * as retryd from 'retryd';

export async function main(): Promise<number> {
  const client = new retryd.Client({ socket: '/run/retryd/retryd.sock', fallbackToLocal: true });
  const orders: retryd.Dependency = client.dependency('orders');
  const state: retryd.BreakerState = orders.state;
  try {
    const permit = orders.admit(0);
    const probe: boolean = permit.probe;
    permit.complete(probe ? 'success' : 'ignored', 12.5);
    // @ts-expect-error: not an outcome
    permit.complete('fine');
  } catch (e) {
    if (e instanceof retryd.RejectedError) {
      const reason: retryd.RejectionReason = e.reason;
      void reason;
    }
  }
  const n: number = await orders.call(async (a: retryd.Attempt) => a.number + (a.timeoutMs ?? 0), {
    maxAttempts: 3, jitter: 'full', deadlineMs: 2000, attemptTimeoutMs: 800,
    observer: (i: retryd.AttemptInfo) => { const w: number = i.waitMs; void w; },
    classifyError: (e: unknown) => (e instanceof Error ? 'other' : null),
  }, { signal: new AbortController().signal });
  // @ts-expect-error: not a policy key
  await orders.call(() => 1, { retries: 3 });
  const get = retryd.adapters.fetch(orders, { deadlineMs: 2000 });
  const response: Response = await get('http://orders.internal/v1/orders/42');
  const result = new retryd.AttemptResult({ status: 503, retryAfter: '1' });
  const classifier = new retryd.Classifier().setStatus(404, 'retryable', 'failure');
  void state; void response; void result; void classifier;
  client.close();
  return n;
}
`);
  fs.writeFileSync(path.join(project, 'tsconfig.json'), JSON.stringify({
    compilerOptions: { noEmit: true, strict: true, target: 'es2022', lib: ['es2022', 'dom'],
                       module: 'commonjs', moduleResolution: 'node', types: [] },
    files: ['app.ts'],
  }));
  try {
    execFileSync(tsc, ['-p', project], { cwd: project, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (e) {
    assert.fail(`tsc: ${e.stdout}${e.stderr}`);
  }
});
