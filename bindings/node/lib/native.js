'use strict';
// Loads the addon (retryd.node, built from src/retryd_node.c), first found of:
//   1. the path in $RETRYD_NODE_ADDON;
//   2. build/retryd.node in this package (what `npm install` builds: scripts/build.js);
//   3. build/Release/retryd.node (a node-gyp layout, for those who build it that way).
// The addon opens libretryd itself, on first use ($RETRYD_LIBRARY, else libretryd.so.0), so
// loading this module never fails for want of the library: the first Client says what is
// missing.

const fs = require('fs');
const path = require('path');

function candidates() {
  if (process.env.RETRYD_NODE_ADDON) return [path.resolve(process.env.RETRYD_NODE_ADDON)];
  const root = path.resolve(__dirname, '..');
  return [path.join(root, 'build', 'retryd.node'),
          path.join(root, 'build', 'Release', 'retryd.node')];
}

function load() {
  const tried = candidates();
  for (const file of tried) {
    if (fs.existsSync(file)) return require(file);
  }
  const err = new Error('retryd: the addon retryd.node is not built ' +
                        `(looked for ${tried.join(', ')}); ` +
                        'run `npm run build` in the package, or set RETRYD_NODE_ADDON to its path');
  err.code = 'RETRYD_ADDON_NOT_FOUND';
  throw err;
}

module.exports = load();
