<?php
// State-change subscriptions (Dependency::onStateChange, Client::onStateChange) against a real
// daemon: every change this process sees, in order, through permit, admit and call; none after
// unsubscribe; a subscriber that throws is a warning and the call goes on. The dependencies are
// written by the test driver: unit_state and unit_state_call open after two failures, for 1 s,
// and one probe success closes them.
declare(strict_types=1);
require __DIR__ . '/lib.php';

$client = client();
$dep = $client->dependency('unit_state');
T::eq('closed', $dep->state(), 'a new breaker is closed');

// The example of the README: log and count each change.
$changes = [];
$counts = [];
$sub = $dep->onStateChange(function (string $name, string $old, string $new) use (&$changes, &$counts) {
    $changes[] = "$name: $old -> $new";
    $counts[$new] = ($counts[$new] ?? 0) + 1;
});
T::check($sub instanceof Retryd\Subscription && $sub->isActive(), 'a subscription');

$dep->permit()->failure();
T::eq([], $changes, 'one failure: still closed');
$dep->permit()->failure();
T::eq(['unit_state: closed -> open'], $changes, 'the second failure opens it, seen at completion');
T::eq('open', $dep->state(), 'state() reads open');
T::throws(Retryd\Rejected::class, fn() => $dep->permit(), 'open: refused');
T::eq(1, count($changes), 'a refusal while open changes nothing');

// After the open period, the next admission is the probe: half-open, then closed.
$probe = null;
for ($i = 0; $i < 400 && $probe === null; $i++) {
    usleep(10000);
    try {
        $probe = $dep->permit();
    } catch (Retryd\Rejected $e) {
    }
}
T::check($probe !== null && $probe->isProbe(), 'the probe is admitted');
T::eq('unit_state: open -> half_open', $changes[1] ?? null, 'half-open seen at the admission');
$probe->success();
T::eq('unit_state: half_open -> closed', $changes[2] ?? null, 'closed seen at the completion');
T::eq(['open' => 1, 'half_open' => 1, 'closed' => 1], $counts, 'counted');

// Unsubscribed: no more calls.
$sub->unsubscribe();
$sub->unsubscribe();
T::eq(false, $sub->isActive(), 'inactive after unsubscribe');
$dep->permit()->failure();
$dep->permit()->failure();
T::eq('open', $dep->state(), 'opened again');
T::eq(3, count($changes), 'nothing after unsubscribe');

// Client-wide, for a dependency resolved after the subscription, through Dependency::call;
// a subscriber that throws is reported as a warning and neither stops the call nor the others.
$seen = [];
$warnings = [];
set_error_handler(function (int $no, string $msg) use (&$warnings) {
    $warnings[] = $msg;
    return true;
}, E_WARNING);
$client->onStateChange(function () {
    throw new RuntimeException('subscriber bug');
});
$client->onStateChange(function (string $name, string $old, string $new) use (&$seen) {
    $seen[] = "$name: $old -> $new";
});
$loop = $client->dependency('unit_state_call');
$e = T::throws(Retryd\CallFailed::class,
    fn() => $loop->call(fn(int $n, ?float $t) => new Retryd\AttemptResult(status: 500),
                        new Retryd\Policy(maxAttempts: 2, base: 0.001, cap: 0.001)),
    'the loop gives up');
T::eq(['unit_state_call: closed -> open'], $seen, 'the client-wide subscriber sees the call open it');
T::eq(1, count($warnings), 'the throwing subscriber is one warning');
T::check(str_contains($warnings[0] ?? '', 'subscriber bug'), 'the warning names the exception');
restore_error_handler();

T::throws(TypeError::class, fn() => $dep->onStateChange('no such function'), 'not a callable');
T::throws(Error::class, fn() => new Retryd\Subscription(), 'no public Subscription constructor');
T::done('test_state_change');
