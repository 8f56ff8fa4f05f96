<?php
// The page the php-fpm server test serves: one GET to the downstream through Guzzle with the
// retryd retry middleware, answered as JSON with this child's pid, how many attempts it sent
// (and how many of them on per-process limits) and how the call ended. The client and dependency are per process (the extension's), so
// each FPM child attaches once, on its first request.
declare(strict_types=1);
require '/usr/share/php/GuzzleHttp/autoload.php';
require getenv('RETRYD_PHP_SRC') . '/autoload.php';

// Each attempt is counted, and those made on per-process limits apart (a child whose daemon
// did not answer its attach within 20 ms on a loaded machine decides alone until it does: the
// host's counters never see those).
$client = new Retryd\Client();
$sent = 0;
$sentLocal = 0;
$firstLocal = false;
$count = static function (callable $h) use (&$sent, &$sentLocal, &$firstLocal, $client): callable {
    return static function ($req, array $opts) use ($h, &$sent, &$sentLocal, &$firstLocal, $client) {
        $local = $client->isLocal();
        if ($sent === 0) {
            $firstLocal = $local;
        }
        $sent++;
        $sentLocal += $local ? 1 : 0;
        return $h($req, $opts);
    };
};
$orders = $client->dependency('downstream');
$stack = GuzzleHttp\HandlerStack::create();
$stack->push(Retryd\Guzzle\Middleware::retry($orders,
    new Retryd\Policy(maxAttempts: 2, base: 0.01, cap: 0.05, deadline: 30.0, attemptTimeout: 15.0)));
$stack->push($count);  // inner: sees each attempt the loop sends
$http = new GuzzleHttp\Client(['handler' => $stack, 'http_errors' => false]);

$out = ['pid' => getmypid(), 'status' => 0, 'rejected' => null, 'error' => null];
try {
    $out['status'] = $http->get(getenv('DOWNSTREAM_URL'))->getStatusCode();
} catch (Retryd\Rejected $e) {
    $out['rejected'] = $e->reason;
} catch (Throwable $e) {
    $out['error'] = get_class($e) . ': ' . $e->getMessage();
}
$out['sent'] = $sent;
$out['sent_local'] = $sentLocal;
$out['first_local'] = $firstLocal;
$out['local'] = $client->isLocal();
// Keeps the child busy a moment so that concurrent requests spread over the pool.
usleep(50000);
header('Content-Type: application/json');
echo json_encode($out), "\n";
