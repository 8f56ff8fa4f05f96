<?php
// Run by state_change_test.py: exit() or a fatal error inside a state-change subscriber,
// in the ways a subscriber is called. SUBSCRIBER_CASE picks one; SUBSCRIBER_DEP names a dependency
// that opens after two failures, for 1 s. Prints "AFTER" if the script goes on after exit().
$c = new Retryd\Client(socket: getenv('RETRYD_SOCKET'), fallbackToLocal: false);
$d = $c->dependency(getenv('SUBSCRIBER_DEP'));
$case = getenv('SUBSCRIBER_CASE');
switch ($case) {
    case 'exit-at-completion':  // Permit::failure's completion opens the breaker
        $d->onStateChange(function () { echo "subscriber: exit(3)\n"; exit(3); });
        $d->permit()->failure();
        $d->permit()->failure();
        break;
    case 'exit-in-call':  // Dependency::call's observer sees the breaker open
        $d->onStateChange(function () { echo "subscriber: exit(3)\n"; exit(3); });
        try {
            $d->call(fn(int $n, ?float $t) => new Retryd\AttemptResult(status: 500),
                     new Retryd\Policy(maxAttempts: 3, base: 0.001, cap: 0.001));
        } catch (Throwable $e) {
        }
        break;
    case 'exit-in-attempt':  // not a subscriber: exit() inside an attempt of Dependency::call
        $d->call(function (int $n, ?float $t) { echo "attempt: exit(3)\n"; exit(3); });
        break;
    case 'fatal-in-call':
    case 'oom-in-call':
        // The probe's 408 is retryable and ignored by the breaker: the loop goes on after the
        // observer's subscriber dies of a fatal error. No attempt may run after it.
        $d->permit()->failure();
        $d->permit()->failure();
        usleep(1200000);
        $d->onStateChange(function ($n, $o, $new) use ($case) {
            echo "subscriber: $o -> $new: fatal\n";
            if ($case === 'fatal-in-call') {
                trigger_error('fatal in a subscriber', E_USER_ERROR);
            }
            $a = [];
            while (true) {
                $a[] = str_repeat('x', 1 << 20);
            }
        });
        $d->call(function (int $n, ?float $t) {
            echo "attempt $n\n";
            return new Retryd\AttemptResult(status: $n < 2 ? 408 : 200);
        }, new Retryd\Policy(maxAttempts: 3, base: 0.001, cap: 0.001));
        break;
}
echo "AFTER\n";
