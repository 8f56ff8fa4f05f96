<?php
// A few assertions for the binding's test scripts: each check() that fails is reported with
// its line, and the script exits non-zero at the end if any did.
declare(strict_types=1);

final class T
{
    public static int $passed = 0;
    public static int $failed = 0;

    public static function check(bool $ok, string $what): void
    {
        if ($ok) {
            self::$passed++;
            return;
        }
        self::$failed++;
        $at = debug_backtrace(DEBUG_BACKTRACE_IGNORE_ARGS, 2)[0];
        fwrite(STDERR, "FAIL: $what (" . basename($at['file']) . ":" . $at['line'] . ")\n");
    }

    public static function eq($expected, $actual, string $what): void
    {
        self::check($expected === $actual, $what . ': expected ' . var_export($expected, true)
            . ', got ' . var_export($actual, true));
    }

    /** Runs $fn, which must throw a $class; returns the exception. */
    public static function throws(string $class, callable $fn, string $what): ?Throwable
    {
        try {
            $fn();
        } catch (Throwable $e) {
            self::check($e instanceof $class, "$what: expected $class, got " . get_class($e) . ': ' . $e->getMessage());
            return $e;
        }
        self::check(false, "$what: expected $class, nothing thrown");
        return null;
    }

    public static function done(string $name): void
    {
        echo "$name: " . self::$passed . " passed, " . self::$failed . " failed\n";
        exit(self::$failed === 0 && self::$passed > 0 ? 0 : 1);
    }
}

function client(): Retryd\Client
{
    $socket = getenv('RETRYD_SOCKET');
    T::check($socket !== false && $socket !== '', 'RETRYD_SOCKET is set');
    return new Retryd\Client(socket: $socket, fallbackToLocal: false);
}

/** A free TCP port on 127.0.0.1, picked by binding to port 0. */
function free_port(): int
{
    $s = stream_socket_server('tcp://127.0.0.1:0');
    $port = (int)substr(strrchr(stream_socket_get_name($s, false), ':'), 1);
    fclose($s);
    return $port;
}

/**
 * A real HTTP server on 127.0.0.1 (`php -S` with scripted_server.php): answers the Nth request
 * with the Nth of $statuses (the last one repeats); requests() counts what reached it.
 */
final class ScriptedServer
{
    public int $port;
    public string $base;
    private $proc;
    private string $seen;

    public function __construct(array $statuses)
    {
        $this->port = free_port();
        $this->base = "http://127.0.0.1:{$this->port}";
        $this->seen = tempnam(sys_get_temp_dir(), 'retryd-php-seen-');
        $env = getenv();
        $env['RETRYD_TEST_SEEN'] = $this->seen;
        $env['RETRYD_TEST_STATUSES'] = implode(',', $statuses);
        $null = ['file', '/dev/null', 'w'];
        $this->proc = proc_open([PHP_BINARY, '-n', '-S', "127.0.0.1:{$this->port}", __DIR__ . '/scripted_server.php'],
            [0 => ['file', '/dev/null', 'r'], 1 => $null, 2 => $null], $pipes, null, $env);
        $end = microtime(true) + 30;
        while (($s = @fsockopen('127.0.0.1', $this->port, $errno, $errstr, 0.2)) === false) {
            if (microtime(true) > $end) {
                throw new RuntimeException("php -S did not start on port {$this->port}");
            }
            usleep(20000);
        }
        fclose($s);
    }

    public function requests(): int
    {
        return count(file($this->seen));
    }

    public function close(): void
    {
        proc_terminate($this->proc);
        proc_close($this->proc);
        @unlink($this->seen);
    }
}
