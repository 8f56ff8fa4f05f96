<?php
// pcntl_fork: the child of a process with an open client admits as a process of its own.
// The child takes the one bulkhead lease of unit_fork_bulkhead (the parent is then refused
// bulkhead_full: one host-wide count) and kills itself with SIGKILL without reporting; the
// parent sees the daemon free the dead child's lease within a polled wait (bulkhead_timeout
// is 24h: only the child's death frees it), while its own
// lease and registration are untouched.
declare(strict_types=1);
require __DIR__ . '/lib.php';

$client = client();
$bh = $client->dependency('unit_fork_bulkhead');
$bh->permit()->success();                    // the parent has admitted before forking
$other = $client->dependency('unit_fork_parent');
$mine = $other->permit();                    // a parent lease held across the child's life

$ready = tempnam(sys_get_temp_dir(), 'retryd-php-fork-');
unlink($ready);
$go = $ready . '.go';
$pid = pcntl_fork();
T::check($pid >= 0, 'pcntl_fork');
if ($pid === 0) {
    try {
        $held = $bh->permit();                // the child's own lease
        file_put_contents($ready, 'held ' . getmypid());
    } catch (Throwable $e) {
        file_put_contents($ready, 'error ' . get_class($e) . ': ' . $e->getMessage());
    }
    // Hold the lease until the parent has seen it (polled; a stuck parent cannot keep us).
    for ($end = microtime(true) + 120; !file_exists($go) && microtime(true) < $end; clearstatcache()) {
        usleep(20000);
    }
    posix_kill(getmypid(), SIGKILL);
    exit(3);                                   // not reached
}

function poll(string $what, callable $cond, float $timeout = 60.0) {
    $end = microtime(true) + $timeout;
    while (true) {
        $v = $cond();
        if ($v) {
            return $v;
        }
        if (microtime(true) > $end) {
            T::check(false, "timed out after {$timeout} s waiting for $what");
            return null;
        }
        usleep(20000);
    }
}

$said = poll('the child to take its lease', function () use ($ready) {
    clearstatcache();
    return is_file($ready) && filesize($ready) > 0 ? file_get_contents($ready) : null;
});
T::eq("held $pid", $said, 'the child admitted');
// While the child lives its lease is counted host-wide: the parent is refused.
$r = T::throws(Retryd\Rejected::class, fn() => $bh->permit(), 'the child holds the one lease');
if ($r instanceof Retryd\Rejected) {
    T::eq('bulkhead_full', $r->reason, 'reason while the child holds it');
}
touch($go);
$status = 0;
T::eq($pid, pcntl_waitpid($pid, $status), 'waitpid');
T::check(pcntl_wifsignaled($status) && pcntl_wtermsig($status) === SIGKILL, 'the child died of SIGKILL');
@unlink($ready);
@unlink($go);

// The dead child's lease is the child's, not the parent's: the daemon frees it.
$freed = poll('the daemon to free the dead child\'s lease', function () use ($bh) {
    try {
        return $bh->permit();
    } catch (Retryd\Rejected $e) {
        T::eq('bulkhead_full', $e->reason, 'refused while the child\'s lease is held');
        return null;
    }
});
if ($freed !== null) {
    T::eq(false, $freed->isDone(), 'the parent holds the freed lease');
    T::throws(Retryd\Rejected::class, fn() => $bh->permit(), 'the parent\'s lease counts too');
    $freed->success();
}
T::eq(false, $mine->isDone(), 'the parent\'s own lease survived the child');
$r = T::throws(Retryd\Rejected::class, fn() => $other->permit(), 'the parent\'s lease is still held');
if ($r instanceof Retryd\Rejected) {
    T::eq('bulkhead_full', $r->reason, 'the daemon did not free the parent\'s lease');
}
$mine->success();
T::eq(false, $client->isLocal(), 'the parent is still attached');
T::eq(5, $bh->admit(fn() => 5), 'the parent admits after the child died');
T::done('test_fork');
