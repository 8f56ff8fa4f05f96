<?php
// The page the php-fpm server test serves: one GET to the downstream through Guzzle with the
// retryd retry middleware, answered as JSON with this child's pid, how many attempts it sent
// and how the call ended. The client and dependency are per process (the extension's), so
// each FPM child attaches once, on its first request.
declare(strict_types=1);
require '/usr/share/php/GuzzleHttp/autoload.php';
require getenv('RETRYD_PHP_SRC') . '/autoload.php';

$sent = 0;
$count = static function (callable $h) use (&$sent): callable {
    return static function ($req, array $opts) use ($h, &$sent) {
        $sent++;
        return $h($req, $opts);
    };
};
$orders = (new Retryd\Client())->dependency('downstream');
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
// Keeps the child busy a moment so that concurrent requests spread over the pool.
usleep(50000);
header('Content-Type: application/json');
echo json_encode($out), "\n";
