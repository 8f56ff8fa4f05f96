<?php
// Autoloader of the PHP half of the binding (Retryd\Guzzle\...): require it, or map the
// namespace Retryd\ to this directory in composer.json ("autoload": {"psr-4": ...}).
// The classes Retryd\Client, Dependency, Permit, Policy, ... come from the extension.
spl_autoload_register(static function (string $class): void {
    if (strncmp($class, 'Retryd\\', 7) !== 0) {
        return;
    }
    $file = __DIR__ . '/' . str_replace('\\', '/', substr($class, 7)) . '.php';
    if (is_file($file)) {
        require $file;
    }
});
