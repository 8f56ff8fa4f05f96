'use strict';
// Every constant the package copies from the C headers (lib/constants.js) has the headers'
// value, and so has every one the addon was compiled with: a value changed in retryd.h,
// retryd_policy.h or retryd_call.h and not here, or an addon built against other headers,
// would silently mean something else.

const test = require('node:test');
const assert = require('assert');
const fs = require('fs');
const path = require('path');
const { ROOT } = require('./harness');
const constants = require('../lib/constants');
const native = require('../lib/native');

const HEADERS = path.join(ROOT, 'client', 'include', 'retryd');
const DEFINE = /^#define RETRYD_([A-Z0-9_]+)\s+\(?(-?\d+)\)?/gm;

function headerValues() {
  const values = {};
  for (const name of ['retryd.h', 'retryd_policy.h', 'retryd_call.h']) {
    for (const [, key, value] of fs
      .readFileSync(path.join(HEADERS, name), 'utf8')
      .matchAll(DEFINE)) {
      values[key] = Number(value);
    }
  }
  return values;
}

test('every constant in lib/constants.js matches its header', () => {
  const values = headerValues();
  const keys = Object.keys(constants);
  assert.ok(keys.length > 40, 'lib/constants.js holds the constants');
  for (const key of keys) {
    assert.ok(key in values, `constants.${key} has no RETRYD_${key} in the headers`);
    assert.strictEqual(
      constants[key],
      values[key],
      `constants.${key} = ${constants[key]}, RETRYD_${key} = ${values[key]}`,
    );
  }
});

test('every constant the addon was compiled with matches its header and lib/constants.js', () => {
  const values = headerValues();
  const compiled = native.constants;
  assert.deepStrictEqual(Object.keys(compiled).sort(), Object.keys(constants).sort());
  for (const [key, value] of Object.entries(compiled)) {
    assert.strictEqual(
      value,
      values[key],
      `the addon's ${key} = ${value}, RETRYD_${key} = ${values[key]}`,
    );
  }
});

test('the names of the decisions, states, stops, kinds, classes and outcomes cover every value', () => {
  const { REASONS, STATES, STOPS } = require('../lib/client');
  const P = require('../lib/policy');
  const values = headerValues();
  const ofPrefix = (prefix, skip = []) =>
    Object.keys(values)
      .filter((k) => k.startsWith(prefix) && !skip.includes(k))
      .map((k) => values[k])
      .sort();
  const keys = (table) => Object.keys(table).map(Number).sort();
  assert.deepStrictEqual(
    keys(REASONS),
    [...new Set([...ofPrefix('ADMITTED'), ...ofPrefix('REJECTED_')])].sort(),
  );
  assert.deepStrictEqual(keys(STATES), ofPrefix('STATE_'));
  assert.deepStrictEqual(keys(STOPS), ofPrefix('STOP_'));
  assert.deepStrictEqual(keys(P.ERROR_NAMES), ofPrefix('ERROR_'));
  assert.deepStrictEqual(keys(P.CLASS_NAMES), ofPrefix('ATTEMPT_'));
  assert.deepStrictEqual(keys(P.OUTCOME_NAMES), ofPrefix('BREAKER_OUTCOME_'));
  assert.deepStrictEqual(Object.values(P.JITTERS).sort(), ofPrefix('JITTER_'));
});

test('RETRYD_NO_TIMEOUT is INT64_MAX, which the addon passes as null', () => {
  const text = fs.readFileSync(path.join(HEADERS, 'retryd_call.h'), 'utf8');
  assert.match(text, /#define RETRYD_NO_TIMEOUT INT64_MAX/);
  assert.match(
    fs.readFileSync(path.join(__dirname, '..', 'src', 'retryd_node.c'), 'utf8'),
    /step->remaining_ms == RETRYD_NO_TIMEOUT \? -1/,
  );
});
