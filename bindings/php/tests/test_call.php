<?php
// Dependency::call and Retryd\Policy: the library's retry loop driven from PHP, against a
// real daemon ($RETRYD_SOCKET).
declare(strict_types=1);
require __DIR__ . '/lib.php';

$client = client();
$dep = $client->dependency('unit_loop');
$fast = new Retryd\Policy(maxAttempts: 3, base: 0.001, cap: 0.002, retryAfterJitter: 0.001);

// 503, 503, then 200: three attempts, the last value returned.
$calls = [];
$v = $dep->call(function (int $n, ?float $timeout) use (&$calls) {
    $calls[] = [$n, $timeout];
    return $n < 2 ? new Retryd\AttemptResult(value: "fail$n", status: 503)
                  : new Retryd\AttemptResult(value: 'ok', status: 200);
}, $fast);
T::eq('ok', $v, 'value of the successful attempt');
T::eq([0, 1, 2], array_column($calls, 0), 'attempt numbers');
T::eq(null, $calls[0][1], 'no timeout without a deadline');

// A plain value is a success at once.
T::eq(['a' => 1], $dep->call(fn() => ['a' => 1]), 'plain value');

// Gives up: CallFailed with the last value.
$e = T::throws(Retryd\CallFailed::class, fn() => $dep->call(
    fn() => new Retryd\AttemptResult(value: 'down', status: 503), $fast), 'exhausted');
if ($e instanceof Retryd\CallFailed) {
    T::eq('attempts_exhausted', $e->stop, 'stop');
    T::eq(3, $e->attempts, 'attempts');
    T::eq(503, $e->lastStatus, 'last status');
    T::eq('down', $e->value, 'last value');
}

// A 4xx is terminal: one attempt.
$n = 0;
$e = T::throws(Retryd\CallFailed::class, function () use ($dep, $fast, &$n) {
    $dep->call(function () use (&$n) { $n++; return new Retryd\AttemptResult(status: 404); }, $fast);
}, 'terminal');
T::eq(1, $n, 'one attempt on a 404');
if ($e instanceof Retryd\CallFailed) {
    T::eq('terminal', $e->stop, 'stop terminal');
}

// A PSR-7-like response is classified by getStatusCode and its Retry-After header.
$resp = new class {
    public int $code = 503;
    public function getStatusCode(): int { return $this->code; }
    public function getHeaderLine(string $name): string { return $name === 'Retry-After' ? '0' : ''; }
};
$n = 0;
$v = $dep->call(function () use ($resp, &$n) { $n++; $r = clone $resp; $r->code = $n < 2 ? 503 : 200; return $r; }, $fast);
T::eq(200, $v->getStatusCode(), 'response object returned');
T::eq(2, $n, 'retried once');

// Deadline: each attempt is told the time left.
$dl = new Retryd\Policy(maxAttempts: 2, deadline: 5.0, base: 0.001);
$timeout = null;
$dep->call(function (int $n, ?float $t) use (&$timeout) { $timeout = $t; return 1; }, $dl);
T::check($timeout !== null && $timeout > 0 && $timeout <= 5.0, "timeout within the deadline ($timeout)");
T::eq('1500m', Retryd\deadline_header(1.5), 'grpc-timeout format');

// An unmapped exception ends the call at once and propagates.
$n = 0;
T::throws(LogicException::class, function () use ($dep, $fast, &$n) {
    $dep->call(function () use (&$n) { $n++; throw new LogicException('bug'); }, $fast);
}, 'exception propagates');
T::eq(1, $n, 'no retry of an unmapped exception');

// A mapped exception is retried as its error kind; a timeout on a POST fails closed.
$map = $fast->withClassifyException(fn(Throwable $e) => $e instanceof RuntimeException ? 'connect_refused' : null);
$n = 0;
$v = $dep->call(function () use (&$n) { if (++$n < 3) throw new RuntimeException('refused'); return 'up'; }, $map);
T::eq('up', $v, 'retried after mapped errors');
T::eq(3, $n, 'three attempts');
$post = new Retryd\Policy(maxAttempts: 3, base: 0.001, method: 'POST',
    classifyException: fn(Throwable $e) => 'timeout');
$n = 0;
$e = T::throws(Retryd\CallFailed::class, function () use ($dep, $post, &$n) {
    $dep->call(function () use (&$n) { $n++; throw new RuntimeException('timed out'); }, $post);
}, 'POST timeout');
T::eq(1, $n, 'a POST is not repeated after a timeout');
if ($e instanceof Retryd\CallFailed) {
    T::check($e->getPrevious() instanceof RuntimeException, 'the attempt exception is the previous');
}

// Policy validation and defaults.
T::throws(ValueError::class, fn() => new Retryd\Policy(jitter: 'wild'), 'bad jitter');
$a = (new Retryd\Policy())->toArray();
T::eq(3, $a['maxAttempts'], 'default attempts');
T::eq('full', $a['jitter'], 'default jitter');
T::eq(null, $a['deadline'], 'no deadline by default');

// Rejected from the loop: the breaker of unit_breaker was opened by test_admit or is here.
$br = $client->dependency('unit_loop_breaker');
for ($i = 0; $i < 2; $i++) {
    try { $br->permit()->failure(); } catch (Retryd\Rejected $e) {}
}
$r = T::throws(Retryd\Rejected::class, fn() => $br->call(fn() => 1), 'rejected call');
if ($r instanceof Retryd\Rejected) {
    T::eq('open', $r->reason, 'reason');
    T::eq(null, $r->value, 'no attempt made');
}
// A fatal error inside an attempt: the permit is completed before the script ends.
$ext = getenv('RETRYD_PHP_EXTENSION');
if ($ext) {
    $out = shell_exec(escapeshellarg(PHP_BINARY) . ' -n -d extension=' . escapeshellarg($ext)
        . ' ' . escapeshellarg(__DIR__ . '/fatal_child.php') . ' 2>&1');
    T::check(str_contains((string)$out, 'fatal inside an attempt'), "fatal error raised again: $out");
    T::check(str_contains((string)$out, 'lease free'), "lease given back: $out");
    T::check(!str_contains((string)$out, 'not reached'), "script ended: $out");
}
T::done('test_call');
