<?php
// Every constant the extension exposes (Retryd\NAME) has the value of RETRYD_NAME in the C
// headers, and every integer constant of the headers' admission, outcome, error, jitter,
// class and stop families is exposed: the extension compiles against the headers, but a
// constant added to a header and not here, or renamed, would go unnoticed.
declare(strict_types=1);
require __DIR__ . '/lib.php';

$dir = getenv('RETRYD_INCLUDE') ?: dirname(__DIR__, 3) . '/client/include';
$values = [];
foreach (['retryd.h', 'retryd_policy.h', 'retryd_call.h'] as $h) {
    $text = file_get_contents("$dir/retryd/$h");
    T::check($text !== false, "read $h");
    preg_match_all('/^#define RETRYD_([A-Z0-9_]+)\s+\(?(-?\d+)\)?/m', (string)$text, $m, PREG_SET_ORDER);
    foreach ($m as [, $name, $value]) {
        $values[$name] = (int)$value;
    }
}
T::check(count($values) > 40, 'headers parsed (' . count($values) . ' integer constants)');

$exposed = get_defined_constants(true)['retryd'] ?? [];
T::check(count($exposed) > 30, 'extension exposes constants (' . count($exposed) . ')');
foreach ($exposed as $full => $value) {
    $name = substr($full, strlen('Retryd\\'));
    T::check(str_starts_with($full, 'Retryd\\'), "$full is namespaced");
    T::check(array_key_exists($name, $values), "$full has RETRYD_$name in the headers");
    if (array_key_exists($name, $values)) {
        T::eq($values[$name], $value, "$full");
    }
}
// Families whose every member a PHP caller may see: all must be exposed.
$families = '/^(OK|E[A-Z]+|ADMITTED.*|REJECTED_.*|SUCCESS|FAILURE|IGNORED|JITTER_.*|ERROR_.*|ATTEMPT_.*|STOP_.*)$/';
foreach ($values as $name => $value) {
    if (preg_match($families, $name)) {
        T::check(array_key_exists("Retryd\\$name", $exposed), "RETRYD_$name is exposed as Retryd\\$name");
    }
}
// Names the extension writes in Rejected::$reason and CallFailed::$stop follow the codes.
T::eq(0, Retryd\SUCCESS, 'SUCCESS');
T::done('test_constants');
