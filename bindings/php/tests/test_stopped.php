<?php
// Run by the driver against a daemon it has stopped (SIGSTOP) at $RETRYD_STOPPED_SOCKET: a new
// Retryd\Client neither fails nor waits (it runs on per-process limits), and no admit waits.
// The script then says "local" on stdout and waits for a line on stdin: the driver resumes the
// daemon and writes it. Later calls move the client to the host's segment.
declare(strict_types=1);
require __DIR__ . '/lib.php';

$sock = getenv('RETRYD_STOPPED_SOCKET');
T::check($sock !== false && $sock !== '', 'RETRYD_STOPPED_SOCKET is set');

$start = hrtime(true);
$client = new Retryd\Client(socket: $sock);
$opened = (hrtime(true) - $start) / 1e9;
T::check($opened < 0.2, sprintf('the client waited %.3f s for the stopped daemon', $opened));
T::eq(true, $client->isLocal(), 'a stopped daemon: per-process limits');
$orders = $client->dependency('orders');
$slowest = 0.0;
for ($i = 0; $i < 20; $i++) {
    $t = hrtime(true);
    $orders->admit(fn() => 1);
    $slowest = max($slowest, (hrtime(true) - $t) / 1e9);
    usleep(10000);
}
T::check($slowest < 0.2, sprintf('an admit waited %.3f s for the stopped daemon', $slowest));
fwrite(STDERR, sprintf("stopped daemon: construction %.1f ms, slowest admit %.1f ms\n",
    $opened * 1e3, $slowest * 1e3));

echo "local\n";
fflush(STDOUT);
fgets(STDIN);  // the daemon runs again

$deadline = hrtime(true) + 60e9;
while ($client->isLocal() && hrtime(true) < $deadline) {
    $orders->admit(fn() => 1);
    usleep(2000);
}
T::eq(false, $client->isLocal(), 'attached once the daemon answers');
T::done('test_stopped');
