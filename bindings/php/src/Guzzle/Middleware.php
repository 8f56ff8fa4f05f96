<?php
// Guzzle middleware: every request through a Guzzle client admitted by the host's retryd.
//
//   $orders = (new Retryd\Client())->dependency('orders');
//   $stack = GuzzleHttp\HandlerStack::create();
//   $stack->push(Retryd\Guzzle\Middleware::retry($orders, new Retryd\Policy(deadline: 2.0)));
//   $http = new GuzzleHttp\Client(['handler' => $stack]);
//
// retry() runs the library's retry loop (admission, classification, backoff with jitter,
// Retry-After, deadline) around each request; breaker() admits each request once and reports
// its outcome, without retrying, and stays asynchronous.
namespace Retryd\Guzzle;

use GuzzleHttp\Exception\ConnectException;
use GuzzleHttp\Exception\RequestException;
use GuzzleHttp\Promise\Create;
use GuzzleHttp\Promise\PromiseInterface;
use Psr\Http\Message\RequestInterface;
use Psr\Http\Message\ResponseInterface;
use Retryd\AttemptResult;
use Retryd\CallFailed;
use Retryd\Dependency;
use Retryd\Policy;
use Retryd\Rejected;

final class Middleware
{
    /**
     * The retry loop around each request. Each attempt is admitted by the host, sent with
     * the time it has left as its timeout, and classified by its status (5xx, 429: retried;
     * 4xx: terminal and ignored by the breaker) or its transport error (curl's errno: refused,
     * DNS, reset, TLS, timeout), with the server's Retry-After honoured.
     *
     * Resolves with the response of the successful attempt, or, when the loop gives up, the
     * last response (the http_errors middleware then raises for it as without retries) or
     * the last transport error. A first attempt the host refuses rejects with
     * Retryd\Rejected (serve a fallback); a retry the host refuses (budget spent, breaker
     * opened meanwhile) resolves with the previous attempt's response or error, as if the
     * request had not been retried.
     *
     * The loop waits between attempts, so the request is synchronous even when sent with
     * sendAsync(); use breaker() for concurrent requests.
     */
    public static function retry(Dependency $dependency, ?Policy $policy = null): callable
    {
        $policy = ($policy ?? new Policy())->withClassifyException([self::class, 'classifyException']);
        return static function (callable $handler) use ($dependency, $policy): callable {
            return static function (RequestInterface $request, array $options) use ($handler, $dependency, $policy): PromiseInterface {
                $send = static function (int $attempt, ?float $timeout) use ($handler, $request, $options) {
                    if ($timeout !== null) {
                        $options['timeout'] = isset($options['timeout']) && $options['timeout'] > 0
                            ? min((float)$options['timeout'], $timeout) : $timeout;
                    }
                    return $handler($request, $options)->wait();
                };
                try {
                    return Create::promiseFor($dependency->call($send, $policy));
                } catch (CallFailed $e) {
                    return self::last($e->value, $e->getPrevious(), $e);
                } catch (Rejected $e) {
                    if ($e->value === null && $e->getPrevious() === null) {
                        return Create::rejectionFor($e);
                    }
                    return self::last($e->value, $e->getPrevious(), $e);
                } catch (\Throwable $e) {
                    return Create::rejectionFor($e);
                }
            };
        };
    }

    /**
     * One admission per request, no retry: a refused request rejects with Retryd\Rejected at
     * once; a 5xx or a transport error counts as a failure, a 4xx is ignored, anything else
     * is a success. Asynchronous: the permit is completed when the promise settles.
     */
    public static function breaker(Dependency $dependency): callable
    {
        return static function (callable $handler) use ($dependency): callable {
            return static function (RequestInterface $request, array $options) use ($handler, $dependency): PromiseInterface {
                try {
                    $permit = $dependency->permit();
                } catch (Rejected $e) {
                    return Create::rejectionFor($e);
                }
                return $handler($request, $options)->then(
                    static function (ResponseInterface $response) use ($permit) {
                        $status = $response->getStatusCode();
                        if ($status >= 500) {
                            $permit->failure();
                        } elseif ($status >= 400 && $status !== 429) {
                            $permit->ignored();
                        } else {
                            $permit->success();
                        }
                        return $response;
                    },
                    static function ($reason) use ($permit) {
                        if ($reason instanceof RequestException && $reason->hasResponse()
                            && $reason->getResponse()->getStatusCode() < 500) {
                            $permit->ignored();
                        } else {
                            $permit->failure();
                        }
                        return Create::rejectionFor($reason);
                    }
                );
            };
        };
    }

    /**
     * Maps an exception raised by Guzzle's handler to the transport error kind the retry
     * loop classifies: by curl's errno when the curl handler raised it, else by the message
     * (the stream handler). A RequestException with a response is that response. Anything
     * else (not a transfer error) ends the call and propagates.
     */
    public static function classifyException(\Throwable $e)
    {
        if ($e instanceof RequestException && $e->hasResponse()) {
            $r = $e->getResponse();
            return new AttemptResult(value: $e, status: $r->getStatusCode(),
                retryAfter: $r->getHeaderLine('Retry-After') ?: null,
                date: $r->getHeaderLine('Date') ?: null);
        }
        if (!($e instanceof ConnectException) && !($e instanceof RequestException)) {
            return null;
        }
        $errno = $e->getHandlerContext()['errno'] ?? null;
        switch ($errno) {
            case 6:   // CURLE_COULDNT_RESOLVE_HOST
            case 5:   // CURLE_COULDNT_RESOLVE_PROXY
                return 'dns';
            case 7:   // CURLE_COULDNT_CONNECT
                return 'connect_refused';
            case 28:  // CURLE_OPERATION_TIMEDOUT
                return 'timeout';
            case 35:  // CURLE_SSL_CONNECT_ERROR
            case 60:  // CURLE_PEER_FAILED_VERIFICATION
                return 'tls';
            case 52:  // CURLE_GOT_NOTHING
            case 55:  // CURLE_SEND_ERROR
            case 56:  // CURLE_RECV_ERROR
                return 'connection_reset';
        }
        $m = strtolower($e->getMessage());
        if (str_contains($m, 'connection refused')) {
            return 'connect_refused';
        }
        if (str_contains($m, 'timed out') || str_contains($m, 'timeout')) {
            return 'timeout';
        }
        if (str_contains($m, 'could not resolve') || str_contains($m, 'getaddrinfo')) {
            return 'dns';
        }
        if (str_contains($m, 'reset by peer') || str_contains($m, 'broken pipe')) {
            return 'connection_reset';
        }
        return 'other';
    }

    /** The outcome of a loop that gave up: its last response, else its last error. */
    private static function last($value, ?\Throwable $previous, \Throwable $fallback): PromiseInterface
    {
        if ($value instanceof ResponseInterface) {
            return Create::promiseFor($value);
        }
        if ($value instanceof RequestException) {
            return Create::rejectionFor($value);
        }
        return Create::rejectionFor($previous ?? $fallback);
    }
}
