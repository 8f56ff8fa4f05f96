'use strict';
// The TypeScript declarations (index.d.ts) type-check a program that uses the API
// (types.check.ts), with tsc --strict (Debian's node-typescript), the package resolved as a
// project that installed it resolves it: by its package.json's "types".

const test = require('node:test');
const assert = require('assert');
const { execFileSync } = require('child_process');
const fs = require('fs');
const path = require('path');
const { tmpdir } = require('./harness');

test('the TypeScript declarations type-check a program that uses the API', () => {
  const dir = tmpdir('retryd-node-types-');
  try {
    const modules = path.join(dir, 'node_modules');
    fs.mkdirSync(modules);
    fs.symlinkSync(path.resolve(__dirname, '..'), path.join(modules, 'retryd'));
    fs.copyFileSync(path.join(__dirname, 'types.check.ts'), path.join(dir, 'app.ts'));
    fs.writeFileSync(
      path.join(dir, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          noEmit: true,
          strict: true,
          target: 'es2022',
          lib: ['es2022', 'dom'],
          module: 'commonjs',
          moduleResolution: 'node',
          types: [],
          preserveSymlinks: true,
        },
        files: ['app.ts'],
      }),
    );
    try {
      execFileSync(process.env.RETRYD_TSC || 'tsc', ['-p', dir], {
        cwd: dir,
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'pipe'],
      });
    } catch (e) {
      assert.fail(`tsc: ${e.stdout}${e.stderr}`);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
