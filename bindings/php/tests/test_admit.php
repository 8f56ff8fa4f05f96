<?php
// Client, Dependency, Permit and Rejected against a real daemon ($RETRYD_SOCKET, its config
// written by the test driver: unit_bulkhead has bulkhead_limit = 1, unit_breaker opens after
// 2 calls at 50 % failures and stays open for a minute).
declare(strict_types=1);
require __DIR__ . '/lib.php';

$client = client();
T::eq(false, $client->isLocal(), 'attached to the daemon');
$again = new Retryd\Client(socket: getenv('RETRYD_SOCKET'), fallbackToLocal: false);
T::eq(false, $again->isLocal(), 'a second Client shares the process handle');

$dep = $client->dependency('unit_admit');
T::eq('unit_admit', $dep->name(), 'name');
T::eq(42, $dep->admit(fn(Retryd\Permit $p) => 42), 'admit returns the value');
$seen = null;
$dep->admit(function (Retryd\Permit $p) use (&$seen) { $seen = $p->isDone(); });
T::eq(false, $seen, 'permit open inside admit');

$e = T::throws(DomainException::class, fn() => $dep->admit(function () { throw new DomainException('x'); }),
    'admit rethrows');

$p = $dep->permit();
T::eq(false, $p->isProbe(), 'not a probe on a closed breaker');
T::eq(0, $p->attempt(), 'attempt number');
$p->success();
T::eq(true, $p->isDone(), 'done after success');
$p->failure(); // a second report is a no-op
$p = $dep->permit(1);
$p->ignored();

T::throws(Retryd\Error::class, fn() => $client->dependency(''), 'empty name');
T::throws(Retryd\Error::class, fn() => $client->dependency('bad name!'), 'bad name');

// Bulkhead of one: a held permit makes the next admission fail with bulkhead_full.
$bh = $client->dependency('unit_bulkhead');
$held = $bh->permit();
$r = T::throws(Retryd\Rejected::class, fn() => $bh->permit(), 'bulkhead full');
if ($r instanceof Retryd\Rejected) {
    T::eq('bulkhead_full', $r->reason, 'reason');
    T::eq('unit_bulkhead', $r->dependency, 'dependency');
    T::eq(Retryd\REJECTED_BULKHEAD_FULL, $r->getCode(), 'code');
}
$held->success();
$bh->permit()->success();
// A permit dropped unreported gives its lease back (as a failure).
(function () use ($bh) { $bh->permit(); })();
$bh->permit()->success();

// Breaker: two failures open it; admissions are then rejected with "open".
$br = $client->dependency('unit_breaker');
$br->permit()->failure();
$br->permit()->failure();
$r = T::throws(Retryd\Rejected::class, fn() => $br->admit(fn() => 1), 'breaker open');
if ($r instanceof Retryd\Rejected) {
    T::eq('open', $r->reason, 'reason open');
}
// Dependencies and permits come from the client only.
T::throws(Error::class, fn() => new Retryd\Dependency(), 'no public Dependency constructor');
T::throws(Error::class, fn() => new Retryd\Permit(), 'no public Permit constructor');
T::done('test_admit');
