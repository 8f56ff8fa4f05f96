<?php
// Run by the driver as user nobody against a daemon whose config has allow_users = ["root"]
// ($RETRYD_DENY_SOCKET): the refusal is an error (Retryd\Error, EPERM, a message naming it),
// not hidden by the fallback to per-process limits, which is allowed here.
declare(strict_types=1);
require __DIR__ . '/lib.php';

$sock = getenv('RETRYD_DENY_SOCKET');
T::check($sock !== false && $sock !== '', 'RETRYD_DENY_SOCKET is set');
T::check(posix_geteuid() !== 0, 'not running as root (uid ' . posix_geteuid() . ')');
foreach ([true, false] as $fallback) {
    $e = T::throws(Retryd\Error::class, fn() => new Retryd\Client(socket: $sock, fallbackToLocal: $fallback),
        'a refused process, fallbackToLocal ' . var_export($fallback, true));
    if ($e !== null) {
        T::eq(Retryd\EPERM, $e->getCode(), 'EPERM');
        $m = $e->getMessage();
        fwrite(STDERR, "refused: $m\n");
        T::check(str_contains($m, 'allow_users'), "the message names the setting: $m");
        T::check(str_contains($m, "uid " . posix_geteuid()), "the message names the uid: $m");
    }
}
T::done('test_permission');
