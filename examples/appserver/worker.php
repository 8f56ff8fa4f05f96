<?php
// The application of the php-fpm stampede (examples/appserver/run.sh): each user request makes
// one call to the downstream, with the retry loop of the scenario's strategy, every attempt
// admitted by the retryd binding (breaker, retry budget, half-open probe permit):
//
//   - at most MAX_RETRIES retries, each after a full-jitter wait, U[0, min(CAP, BASE * 2^n)];
//   - the user request's deadline, DEADLINE_MS from when the front read it (nginx's $msec:
//     time queued for a free child counts), propagated downstream as `grpc-timeout`; each
//     attempt gets what is left, at most TIMEOUT_MS, and a retry is taken only if its wait and
//     the slowest attempt so far still fit (the rule of retryd::RetryLoop, as retryd_fleet);
//   - a half-open probe carries `X-Retryd-Probe: 1`, so that the downstream counts probes, and
//     goes out only with TIMEOUT_MS left, or half the deadline if less (else given back unused);
//
// SCOPE=host: every child admits through one dependency, DEPENDENCY, on the host's segment.
// SCOPE=process: each child has a dependency of its own, DEPENDENCY.<pid>, which the daemon
// creates on the child's first call with the same policy ([defaults]): a breaker, a budget and
// a probe permit per child, shared with no other child, as a per-process library holds them.
//
// The answer (text/plain) says how the request ended and lists its attempts, for the load
// generator (load.cc): "u OK REJECTED EXPIRED", then "a START END OK PROBE" per attempt (unix
// seconds).
declare(strict_types=1);

$now = static fn(): float => microtime(true);
$arrived = (float)($_SERVER['REQUEST_START'] ?? 0) ?: $now();
$maxRetries = (int)getenv('MAX_RETRIES');
$base = (float)getenv('BASE_MS') / 1000;
$cap = (float)getenv('CAP_MS') / 1000;
$timeout = (float)getenv('TIMEOUT_MS') / 1000;
$deadline = (float)getenv('DEADLINE_MS') > 0 ? $arrived + (float)getenv('DEADLINE_MS') / 1000 : INF;
$name = getenv('DEPENDENCY');
if (getenv('SCOPE') === 'process') {
    $name .= '.' . getmypid();
}
// The segment is $RETRYD_SEGMENT's; without it, fail rather than run on the built-in policy.
$dep = (new Retryd\Client(fallbackToLocal: false))->dependency($name);  // once per child

if (($_SERVER['QUERY_STRING'] ?? '') === 'warm') {  // run.sh, before the run: attach, compile
    usleep(200000);  // so that concurrent warm-ups spread over every child
    header('Content-Type: text/plain');
    echo 'w ', getmypid(), "\n";
    return;
}

$curl = curl_init(getenv('DOWNSTREAM_URL'));  // one connection for the request's attempts
curl_setopt_array($curl, [CURLOPT_RETURNTRANSFER => true, CURLOPT_NOSIGNAL => true]);

$ok = false;
$rejected = false;
$expired = false;
$lines = [];
$slowest = 0.0;
for ($attempt = 0;; $attempt++) {
    $t = $now();
    $left = $deadline - $t;
    if ($left <= 0) {  // queued past its deadline: nothing is sent
        $expired = $attempt === 0;
        break;
    }
    try {
        $permit = $dep->permit($attempt);
    } catch (Retryd\Rejected $e) {  // breaker open, probe busy, or no retry budget
        $rejected = true;
        break;
    }
    $probe = $permit->isProbe();
    // A half-open lets a probe through for every child of the host at once (SCOPE=host): a probe
    // sent by a request that waited for a child most of its deadline fails for want of time
    // alone, and the breaker stays open for another period (php-fpm stopped for 1.98 s as the
    // half-open began: the oldest queued request probed with 15 ms left and reopened it). A
    // probe goes out only with the per-attempt timeout, or half the request's whole deadline if
    // that is less (so that with a deadline under the timeout a fresh request still probes);
    // a request with less time gives it back unused (ignored: its place goes to the next
    // caller, in the same half-open) and is refused.
    if ($probe && $left < min($timeout, ($deadline - $arrived) / 2)) {
        $permit->ignored();
        $rejected = true;
        break;
    }
    $attemptTimeout = min($timeout, $left);
    $headers = is_finite($deadline) ? ['grpc-timeout: ' . Retryd\deadline_header($attemptTimeout)] : [];
    if ($probe) {
        $headers[] = 'X-Retryd-Probe: 1';
    }
    $ms = max(1, (int)($attemptTimeout * 1000));
    curl_setopt_array($curl, [CURLOPT_HTTPHEADER => $headers, CURLOPT_TIMEOUT_MS => $ms,
                              CURLOPT_CONNECTTIMEOUT_MS => $ms]);
    $body = curl_exec($curl);
    $good = $body !== false && curl_getinfo($curl, CURLINFO_RESPONSE_CODE) === 200;
    $end = $now();
    $good ? $permit->success() : $permit->failure();
    $lines[] = sprintf("a %.6f %.6f %d %d", $t, $end, $good ? 1 : 0, $probe ? 1 : 0);
    $slowest = max($slowest, $end - $t);
    if ($good) {
        $ok = true;
        break;
    }
    if ($attempt >= $maxRetries) {
        break;
    }
    $ceiling = min($cap, $base * (2 ** $attempt));
    $wait = random_int(0, (int)($ceiling * 1e6)) / 1e6;   // full jitter
    if ($deadline - $now() < $wait + max($slowest, 1e-9)) {  // the retry could not finish in time
        break;
    }
    usleep((int)($wait * 1e6));
}
header('Content-Type: text/plain');
echo sprintf("u %d %d %d\n", $ok ? 1 : 0, $rejected ? 1 : 0, $expired ? 1 : 0), implode("\n", $lines), "\n";
