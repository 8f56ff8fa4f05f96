<?php
// The router of a `php -S` server started by lib.php's ScriptedServer: answers the Nth request
// with the Nth status of $RETRYD_TEST_STATUSES (comma-separated; the last one repeats) and
// appends a line per request to the file $RETRYD_TEST_SEEN.
declare(strict_types=1);

$seen = getenv('RETRYD_TEST_SEEN');
$statuses = explode(',', getenv('RETRYD_TEST_STATUSES') ?: '200');
$fh = fopen($seen, 'c+');
flock($fh, LOCK_EX);
$n = count(file($seen));
fseek($fh, 0, SEEK_END);
fwrite($fh, $_SERVER['REQUEST_METHOD'] . ' ' . $_SERVER['REQUEST_URI'] . "\n");
flock($fh, LOCK_UN);
fclose($fh);
http_response_code((int)$statuses[min($n, count($statuses) - 1)]);
header('Content-Type: text/plain');
echo "status $n\n";
