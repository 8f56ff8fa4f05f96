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
