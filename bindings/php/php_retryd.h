/* php_retryd.h: the retryd PHP extension (Retryd\Client, Dependency, Permit, Policy, ...). */
#ifndef PHP_RETRYD_H
#define PHP_RETRYD_H

extern zend_module_entry retryd_module_entry;
#define phpext_retryd_ptr &retryd_module_entry

#define PHP_RETRYD_VERSION "0.1.0"

#endif /* PHP_RETRYD_H */
