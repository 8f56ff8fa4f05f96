<?php
// No daemon: a segment nobody created ($RETRYD_TEST_ABSENT, set by the driver). The client
// falls back to per-process limits: isLocal(), admissions go through, a breaker opens on this
// process's own failures. The library logs the fallback once (the driver counts the lines on
// this script's stderr that name the segment: exactly one, however many admits follow).
declare(strict_types=1);
require __DIR__ . '/lib.php';

$name = getenv('RETRYD_TEST_ABSENT');
T::check($name !== false && $name !== '', 'RETRYD_TEST_ABSENT is set');

$client = new Retryd\Client(segment: $name);
T::eq(true, $client->isLocal(), 'no daemon: per-process limits');
T::eq(true, (new Retryd\Client(segment: $name))->isLocal(), 'a second Client: the same local handle');

$dep = $client->dependency('local_ok');
$ok = 0;
for ($i = 0; $i < 200; $i++) {
    if ($dep->admit(fn(Retryd\Permit $p) => 1) === 1) {
        $ok++;
    }
}
T::eq(200, $ok, 'every admission goes through locally');
$dep->permit()->success();
$dep->permit(1)->ignored();

// The breaker is this process's: failures open it, then admissions are refused "open".
$br = $client->dependency('local_breaker');
$opened = null;
for ($i = 0; $i < 1000 && $opened === null; $i++) {
    try {
        $br->permit()->failure();
    } catch (Retryd\Rejected $e) {
        $opened = $e;
    }
}
T::check($opened !== null, 'a local breaker opens after failures');
if ($opened !== null) {
    T::eq('open', $opened->reason, 'refused by the open local breaker');
    T::eq('local_breaker', $opened->dependency, 'dependency of the rejection');
    T::throws(Retryd\Rejected::class, fn() => $br->admit(fn() => 1), "still open");
}
// Other clients of other names are unaffected.
T::eq(7, $dep->admit(fn() => 7), 'another dependency still admits');

// Without the fallback, the missing segment is an error naming it.
$e = T::throws(Retryd\Error::class, fn() => new Retryd\Client(segment: $name, fallbackToLocal: false),
    'fallbackToLocal: false');
if ($e !== null) {
    T::eq(Retryd\ENOENT, $e->getCode(), 'ENOENT');
    T::check(str_contains($e->getMessage(), $name), 'the error names the segment: ' . $e->getMessage());
}
echo "admits done\n";
T::done('test_local');
