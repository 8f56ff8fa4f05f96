<?php
// The cost of one admission and its completion from PHP, next to an empty PHP function call,
// measured side by side in one run: each round times N empty calls, then N admit+complete on
// a closed breaker, then N Dependency::admit(callable) calls; the figure kept for each is the
// median of its rounds, so a busy neighbour moving the numbers shows as spread, not bias.
//
//   php -d extension=modules/retryd.so bench/admit_bench.php [N] [ROUNDS]
//
// Attaches like any worker ($RETRYD_SOCKET, /run/retryd/retryd.sock, else $RETRYD_SEGMENT or
// "retryd"); with no daemon it runs on per-process state, which costs the same atomics.
declare(strict_types=1);

$n = (int)($argv[1] ?? 1000000);
$rounds = (int)($argv[2] ?? 5);

function empty_call(): void
{
}

$client = new Retryd\Client();
$dep = $client->dependency('bench_php');

$loop = static function (int $n): float {
    $t = hrtime(true);
    for ($i = 0; $i < $n; $i++) {
    }
    return (hrtime(true) - $t) / $n;
};
$empty = static function (int $n): float {
    $t = hrtime(true);
    for ($i = 0; $i < $n; $i++) {
        empty_call();
    }
    return (hrtime(true) - $t) / $n;
};
$permit = static function (int $n) use ($dep): float {
    $t = hrtime(true);
    for ($i = 0; $i < $n; $i++) {
        $dep->permit()->success();
    }
    return (hrtime(true) - $t) / $n;
};
$fn = static function (): int {
    return 1;
};
$admit = static function (int $n) use ($dep, $fn): float {
    $t = hrtime(true);
    for ($i = 0; $i < $n; $i++) {
        $dep->admit($fn);
    }
    return (hrtime(true) - $t) / $n;
};

$cases = ['empty loop iteration' => $loop, 'empty PHP function call' => $empty,
          '$dep->permit()->success()' => $permit, '$dep->admit($fn)' => $admit];
$times = array_fill_keys(array_keys($cases), []);
foreach ($cases as $f) {
    $f(intdiv($n, 10));  // warm up
}
for ($r = 0; $r < $rounds; $r++) {
    foreach ($cases as $name => $f) {
        $times[$name][] = $f($n);
    }
}
$median = static function (array $v): float {
    sort($v);
    return $v[intdiv(count($v), 2)];
};
printf("retryd PHP admit bench: PHP %s, %s, %d iterations x %d rounds, segment %s\n",
       PHP_VERSION, ini_get('opcache.enable_cli') ? 'opcache' : 'no opcache', $n, $rounds,
       $client->isLocal() ? 'per-process (no daemon)' : 'host (daemon)');
printf("%-28s %12s %12s %12s\n", 'case', 'median ns', 'min ns', 'max ns');
foreach ($times as $name => $v) {
    printf("%-28s %12.1f %12.1f %12.1f\n", $name, $median($v), min($v), max($v));
}
$e = $median($times['empty PHP function call']);
printf("admit+complete (permit) = %.1fx an empty PHP function call; admit(callable) = %.1fx\n",
       $median($times['$dep->permit()->success()']) / $e, $median($times['$dep->admit($fn)']) / $e);
