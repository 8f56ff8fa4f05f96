<?php
// Run by test_call.php: a fatal error inside an attempt of Dependency::call. The loop must
// still complete the attempt's permit (its bulkhead lease of one is free again in the
// shutdown function) before the fatal error ends the script.
$bh = (new Retryd\Client(socket: getenv('RETRYD_SOCKET'), fallbackToLocal: false))->dependency('unit_bulkhead');
register_shutdown_function(function () use ($bh) {
    try {
        $bh->permit()->success();
        echo "lease free\n";
    } catch (Retryd\Rejected $e) {
        echo "lease held: {$e->reason}\n";
    }
});
$bh->call(function () {
    trigger_error('fatal inside an attempt', E_USER_ERROR);
});
echo "not reached\n";
