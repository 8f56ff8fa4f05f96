mod obj-${DEB_HOST_GNU_TYPE}/php-retryd/modules/retryd.so
mod debian/retryd.ini
