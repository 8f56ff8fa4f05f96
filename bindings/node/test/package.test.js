'use strict';
// The package as npm makes it: `npm pack` of bindings/node holds what it should and nothing
// else, `npm install` of the tarball into a project of its own builds the addon (its install
// script, CMake) with no network, and the installed package works from that project.

const test = require('node:test');
const assert = require('assert');
const { execFileSync } = require('child_process');
const fs = require('fs');
const path = require('path');
const { ROOT, tmpdir } = require('./harness');

const PACKAGE = path.resolve(__dirname, '..');
const npm = (args, cwd, env = {}) =>
  execFileSync('npm', args, {
    cwd,
    env: { ...process.env, ...env, npm_config_update_notifier: 'false' },
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: 240000,
  });

let dir;
let tarball;
test.before(() => {
  dir = tmpdir('retryd-node-pack-');
  const [packed] = JSON.parse(npm(['pack', '--json', '--pack-destination', dir], PACKAGE));
  tarball = path.join(dir, packed.filename);
  test.packed = packed;
});
test.after(() => fs.rmSync(dir, { recursive: true, force: true }));

test("npm pack holds the JavaScript, the declarations, the addon's sources and build, and the README", () => {
  const files = test.packed.files.map((f) => f.path).sort();
  const expected = [
    'CMakeLists.txt',
    'README.md',
    'index.d.ts',
    'package.json',
    'scripts/build.js',
    'src/retryd_node.c',
    ...fs.readdirSync(path.join(PACKAGE, 'lib')).map((f) => `lib/${f}`),
  ];
  assert.deepStrictEqual(files, expected.sort());
  const pkg = JSON.parse(fs.readFileSync(path.join(PACKAGE, 'package.json'), 'utf8'));
  assert.strictEqual(pkg.license, 'Apache-2.0');
  assert.strictEqual(test.packed.name, 'retryd');
});

test('npm install of the tarball builds the addon, and the package works where it is installed', () => {
  const project = path.join(dir, 'project');
  fs.mkdirSync(project);
  fs.writeFileSync(
    path.join(project, 'package.json'),
    JSON.stringify({ name: 'app', private: true }),
  );
  // The headers of this tree (no libretryd-dev here), and no addon or library path of the
  // tests: the installed package must find its own addon.
  const env = { RETRYD_INCLUDE_DIR: path.join(ROOT, 'client', 'include'), RETRYD_NODE_ADDON: '' };
  npm(
    ['install', '--offline', '--no-audit', '--no-fund', '--foreground-scripts', tarball],
    project,
    env,
  );
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
  const out = JSON.parse(
    execFileSync(process.execPath, ['-e', script], {
      cwd: project,
      env: childEnv,
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }),
  );
  assert.deepStrictEqual(out, { local: true, value: 42, addon });
});
