<?php
// The page in_root.sh serves with php-fpm, the extension loaded by the php-retryd package's
// retryd.ini (no extension= of its own): each request admits one call of the dependency
// clean-root-fpm through the daemon, and answers with the child's pid, its parent's (the FPM
// master) and whether the client is attached to the daemon.
declare(strict_types=1);

$client = new Retryd\Client(fallbackToLocal: false);
$out = $client->dependency('clean-root-fpm')->admit(function (Retryd\Permit $p) use ($client) {
    usleep(200000);  // busy a moment, so that concurrent requests go to every child
    return ['pid' => getmypid(), 'ppid' => posix_getppid(), 'attached' => !$client->isLocal(),
            'extension' => phpversion('retryd')];
});
header('Content-Type: application/json');
echo json_encode($out), "\n";
