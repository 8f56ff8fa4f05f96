#!/usr/bin/env node
'use strict';
// Builds the addon, build/retryd.node, with CMake (CMakeLists.txt): what `npm install` runs
// (the package's "install" script) and `npm run build` (again, with --force). Needs cmake, a C
// compiler, Node.js's headers (node_api.h: nodesource's nodejs has them, Debian's are in
// libnode-dev) and libretryd's (libretryd-dev, or RETRYD_INCLUDE_DIR=<tree>/client/include).
// Without --force an addon already built is kept. The library itself is not needed to build:
// the addon opens it when the first Client is made.

const { spawnSync } = require('child_process');
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
const build = path.join(root, 'build');
const addon = path.join(build, 'retryd.node');

if (!process.argv.includes('--force') && fs.existsSync(addon)) {
  console.log(`retryd: ${addon} is built`);
  process.exit(0);
}

function run(args) {
  const r = spawnSync('cmake', args, { cwd: root, stdio: 'inherit' });
  if (r.error) {
    console.error(`retryd: cannot run cmake (${r.error.message}); install cmake and a C compiler ` +
                  '(Debian: apt-get install cmake gcc)');
    process.exit(1);
  }
  if (r.status !== 0) process.exit(r.status || 1);
}

const configure = ['-S', root, '-B', build, '-DCMAKE_BUILD_TYPE=Release'];
if (process.env.RETRYD_INCLUDE_DIR) {
  configure.push(`-DRETRYD_INCLUDE_DIR=${process.env.RETRYD_INCLUDE_DIR}`);
}
if (process.env.RETRYD_NODE_INCLUDE_DIR) {
  configure.push(`-DRETRYD_NODE_INCLUDE_DIR=${process.env.RETRYD_NODE_INCLUDE_DIR}`);
}
run(configure);
run(['--build', build]);
console.log(`retryd: built ${addon}`);
