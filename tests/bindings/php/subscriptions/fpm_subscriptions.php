<?php
// Served by state_change_test.py from a php-fpm pool of one child: each request does one
// step (?step=...) and answers JSON: its pid and what the state-change subscribers saw.
$c = new Retryd\Client(socket: getenv('RETRYD_SOCKET'), fallbackToLocal: false);
$dep = $c->dependency(getenv('SUBSCRIBER_DEP_PREFIX') . '_' . ($_GET['dep'] ?? 'a'));
$bh = $c->dependency(getenv('SUBSCRIBER_DEP_PREFIX') . '_bh');
$seen = [];
$out = ['pid' => getmypid()];
switch ($_GET['step'] ?? '') {
    case 'subscribe':
        // Subscribes, trips the breaker (seen here), keeps a permit of the bulkhead of one
        // unfinished (freed at the request's end), and subscribes again from inside a callback.
        $GLOBALS['held'] = $bh->permit();
        $dep->onStateChange(function ($n, $o, $new) use (&$seen, $dep, $c) {
            $seen[] = "$o->$new";
            file_put_contents(getenv('SUBSCRIBER_DIR') . '/fired', "request 1's subscriber: $o->$new\n", FILE_APPEND);
            $c->onStateChange(function ($n, $o, $new) {
                file_put_contents(getenv('SUBSCRIBER_DIR') . '/fired', "request 1's inner subscriber: $o->$new\n", FILE_APPEND);
            });
        });
        $dep->permit()->failure();
        $dep->permit()->failure();
        break;
    case 'next':
        // No subscription of its own: drives the breaker through half-open to closed.
        for ($i = 0; $i < 300; $i++) {
            try {
                $p = $dep->permit();
                $p->success();
                break;
            } catch (Retryd\Rejected $e) {
                usleep(10000);
            }
        }
        $out['state'] = $dep->state();
        try {
            $bh->permit()->success();
            $out['lease'] = 'free';
        } catch (Retryd\Rejected $e) {
            $out['lease'] = $e->reason;
        }
        break;
    case 'exit':
        $dep->onStateChange(function () { exit(0); });
        $dep->permit()->failure();
        $dep->permit()->failure();
        break;
}
$out['seen'] = $seen;
header('Content-Type: application/json');
echo json_encode($out);
