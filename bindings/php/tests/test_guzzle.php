<?php
// Retryd\Guzzle\Middleware with Guzzle's MockHandler: the retry loop around a request, the
// last response when it gives up, Rejected when the host refuses, and breaker(); and with
// Guzzle's curl handler against a real server: a retry the empty budget refuses.
declare(strict_types=1);
require __DIR__ . '/lib.php';
require getenv('GUZZLE_AUTOLOAD') ?: '/usr/share/php/GuzzleHttp/autoload.php';
require dirname(__DIR__) . '/src/autoload.php';

use GuzzleHttp\Client;
use GuzzleHttp\Exception\ConnectException;
use GuzzleHttp\Exception\ServerException;
use GuzzleHttp\Handler\MockHandler;
use GuzzleHttp\HandlerStack;
use GuzzleHttp\Psr7\Request;
use GuzzleHttp\Psr7\Response;
use Retryd\Guzzle\Middleware;

$rd = client();
$fast = new Retryd\Policy(maxAttempts: 3, base: 0.001, cap: 0.002, retryAfterJitter: 0.001, deadline: 10.0);

function http(callable $middleware, array $queue, array &$seen = null): Client
{
    $mock = new MockHandler($queue);
    $stack = HandlerStack::create($mock);
    $stack->push($middleware);
    $stack->push(function (callable $h) use (&$seen) {
        return function ($req, $opts) use ($h, &$seen) { $seen[] = $opts['timeout'] ?? null; return $h($req, $opts); };
    });
    return new Client(['handler' => $stack]);
}

$dep = $rd->dependency('unit_guzzle');
$seen = [];
$c = http(Middleware::retry($dep, $fast), [new Response(503), new Response(503, ['Retry-After' => '0']), new Response(200, [], 'ok')], $seen);
$r = $c->get('http://downstream/');
T::eq(200, $r->getStatusCode(), 'retried to success');
T::eq('ok', (string)$r->getBody(), 'body');
T::eq(3, count($seen), 'three attempts sent');
T::check(is_float($seen[0]) && $seen[0] > 0 && $seen[0] <= 10.0, 'timeout from the deadline');

// Gives up: the last response, which http_errors turns into a ServerException.
$seen = [];
$c = http(Middleware::retry($dep, $fast), [new Response(502), new Response(502), new Response(503)], $seen);
T::throws(ServerException::class, fn() => $c->get('http://downstream/'), 'last 5xx raised by http_errors');
T::eq(3, count($seen), 'max attempts');
$seen = [];
$c = http(Middleware::retry($dep, $fast), [new Response(503), new Response(503), new Response(503)], $seen);
T::eq(503, $c->get('http://downstream/', ['http_errors' => false])->getStatusCode(), 'last response');

// A 404 is not retried.
$seen = [];
$c = http(Middleware::retry($dep, $fast), [new Response(404), new Response(200)], $seen);
T::eq(404, $c->get('http://downstream/', ['http_errors' => false])->getStatusCode(), '404 returned');
T::eq(1, count($seen), 'no retry of a 404');

// A refused connection is retried.
$seen = [];
$req = new Request('GET', 'http://downstream/');
$c = http(Middleware::retry($dep, $fast), [
    new ConnectException('Connection refused', $req, null, ['errno' => 7]),
    new Response(200)], $seen);
T::eq(200, $c->get('http://downstream/')->getStatusCode(), 'retried after a refusal');
T::eq(2, count($seen), 'two attempts');
T::eq('connect_refused', Middleware::classifyException(new ConnectException('x', $req, null, ['errno' => 7])), 'errno 7');
T::eq('timeout', Middleware::classifyException(new ConnectException('x', $req, null, ['errno' => 28])), 'errno 28');
T::eq('dns', Middleware::classifyException(new ConnectException('x', $req, null, ['errno' => 6])), 'errno 6');
T::eq(null, Middleware::classifyException(new LogicException('bug')), 'not a transfer error');

// All attempts refused: the last error.
$c = http(Middleware::retry($dep, $fast), array_fill(0, 3, new ConnectException('Connection refused', $req, null, ['errno' => 7])));
T::throws(ConnectException::class, fn() => $c->get('http://downstream/'), 'last transport error');

// The host refuses: Retryd\Rejected, nothing sent.
$open = $rd->dependency('unit_guzzle_open');
for ($i = 0; $i < 2; $i++) {
    try { $open->permit()->failure(); } catch (Retryd\Rejected $e) {}
}
$seen = [];
$c = http(Middleware::retry($open, $fast), [new Response(200)], $seen);
$e = T::throws(Retryd\Rejected::class, fn() => $c->get('http://downstream/'), 'rejected');
T::eq(0, count($seen ?? []), 'nothing sent');
if ($e instanceof Retryd\Rejected) {
    T::eq('open', $e->reason, 'reason');
}
$c = http(Middleware::breaker($open), [new Response(200)]);
T::throws(Retryd\Rejected::class, fn() => $c->get('http://downstream/'), 'breaker() rejects too');

// breaker(): one admission, asynchronous.
$b = $rd->dependency('unit_guzzle_breaker');
$c = http(Middleware::breaker($b), [new Response(200), new Response(500)]);
T::eq(200, $c->getAsync('http://downstream/')->wait()->getStatusCode(), 'async ok');
T::throws(ServerException::class, fn() => $c->get('http://downstream/'), '500 passes through');

// The same scenario in every binding's adapters: the first attempt gets a 503, the host
// refuses the retry (budget empty), and the client's call returns that 503.
$scarce = $rd->dependency('unit_guzzle_budget');
$scarce->permit(1)->success();  // a retry: takes the budget's one token, none comes back
$e = T::throws(Retryd\Rejected::class, fn() => $scarce->permit(1), 'budget spent');
if ($e instanceof Retryd\Rejected) {
    T::eq('budget_empty', $e->reason, 'budget spent: reason');
}
function real_http(callable $middleware): Client
{
    $stack = HandlerStack::create();  // Guzzle's own handler: curl
    $stack->push($middleware);
    return new Client(['handler' => $stack, 'timeout' => 30]);
}
// test_retry_refused_by_budget_returns_the_503
$server = new ScriptedServer([503, 503, 200]);
try {
    $c = real_http(Middleware::retry($scarce, $fast));
    $r = $c->get($server->base . '/orders', ['http_errors' => false]);
    T::eq(503, $r->getStatusCode(), 'retry refused by budget: the 503');
    T::eq(1, $server->requests(), 'retry refused by budget: one request');
    // With http_errors on, Guzzle raises for that 503 as it would without retries.
    $e = T::throws(ServerException::class, fn() => $c->get($server->base . '/orders'),
        'retry refused by budget: http_errors raises for the 503');
    if ($e instanceof ServerException) {
        T::eq(503, $e->getResponse()->getStatusCode(), 'retry refused by budget: ServerException for the 503');
    }
    T::eq(2, $server->requests(), 'retry refused by budget: one request each');
} finally {
    $server->close();
}
// test_retry_refused_by_budget_raises_the_clients_error: the first attempt's connection is
// refused, the host refuses the retry: Guzzle's own exception.
$c = real_http(Middleware::retry($scarce, $fast));
$e = T::throws(ConnectException::class, fn() => $c->get('http://127.0.0.1:' . free_port() . '/orders'),
    'retry refused by budget: the ConnectException');
if ($e instanceof ConnectException) {
    T::eq(7, $e->getHandlerContext()['errno'] ?? null, 'retry refused by budget: connection refused');
}
T::done('test_guzzle');
