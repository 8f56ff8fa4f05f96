dnl config.m4: the retryd PHP extension, linked against libretryd (the C ABI in retryd/retryd.h).
dnl
dnl Where the headers and the library are found, first match wins:
dnl   --with-retryd-include=DIR --with-retryd-lib=DIR|FILE   a build tree: DIR holding retryd/retryd.h
dnl                            (client/include) and the directory of libretryd.so (or the file)
dnl   --with-retryd=DIR        an install prefix: DIR/include/retryd/retryd.h, DIR/lib/libretryd.so
dnl                            (or DIR/lib/<multiarch>/)
dnl   --with-retryd            pkg-config retryd (the libretryd-dev package), else /usr/local, /usr

PHP_ARG_WITH([retryd],
  [for retryd support],
  [AS_HELP_STRING([[--with-retryd[=DIR]]],
    [retryd: install prefix DIR (DIR/include, DIR/lib); default pkg-config, /usr/local, /usr])],
  [yes])

dnl The two below only say whether their option was given ("no" when not): where the headers
dnl and the library were found is the "checking for retryd/retryd_call.h" line further down.
PHP_ARG_WITH([retryd-include],
  [whether --with-retryd-include names the headers' directory],
  [AS_HELP_STRING([--with-retryd-include=DIR], [retryd: directory holding retryd/retryd.h])],
  [no], [no])

PHP_ARG_WITH([retryd-lib],
  [whether --with-retryd-lib names libretryd],
  [AS_HELP_STRING([--with-retryd-lib=DIR|FILE], [retryd: directory of libretryd.so, or the file])],
  [no], [no])

if test "$PHP_RETRYD" != "no"; then
  RETRYD_INC=""
  RETRYD_LIBDIR=""

  if test "$PHP_RETRYD_INCLUDE" != "no"; then
    RETRYD_INC="$PHP_RETRYD_INCLUDE"
  fi
  if test "$PHP_RETRYD_LIB" != "no"; then
    if test -f "$PHP_RETRYD_LIB"; then
      RETRYD_LIBDIR=`dirname "$PHP_RETRYD_LIB"`
    else
      RETRYD_LIBDIR="$PHP_RETRYD_LIB"
    fi
  fi

  if test "$PHP_RETRYD" != "yes"; then
    test -z "$RETRYD_INC" && RETRYD_INC="$PHP_RETRYD/include"
    if test -z "$RETRYD_LIBDIR"; then
      for d in "$PHP_RETRYD/lib" "$PHP_RETRYD/lib/`$CC -print-multiarch 2>/dev/null`" "$PHP_RETRYD/lib64"; do
        if test -f "$d/libretryd.so"; then RETRYD_LIBDIR="$d"; break; fi
      done
    fi
  elif test -z "$RETRYD_INC" || test -z "$RETRYD_LIBDIR"; then
    if pkg-config --exists retryd 2>/dev/null; then
      test -z "$RETRYD_INC" && RETRYD_INC=`pkg-config --variable=includedir retryd`
      test -z "$RETRYD_LIBDIR" && RETRYD_LIBDIR=`pkg-config --variable=libdir retryd`
    else
      for p in /usr/local /usr; do
        if test -z "$RETRYD_INC" && test -f "$p/include/retryd/retryd.h"; then RETRYD_INC="$p/include"; fi
        if test -z "$RETRYD_LIBDIR"; then
          for d in "$p/lib" "$p/lib/`$CC -print-multiarch 2>/dev/null`"; do
            if test -f "$d/libretryd.so"; then RETRYD_LIBDIR="$d"; break; fi
          done
        fi
      done
    fi
  fi

  AC_MSG_CHECKING([for retryd/retryd_call.h])
  if test -n "$RETRYD_INC" && test -f "$RETRYD_INC/retryd/retryd_call.h"; then
    AC_MSG_RESULT([$RETRYD_INC])
  else
    AC_MSG_ERROR([retryd/retryd_call.h not found: pass --with-retryd=PREFIX or --with-retryd-include=DIR])
  fi
  AC_MSG_CHECKING([for libretryd.so])
  if test -n "$RETRYD_LIBDIR" && test -f "$RETRYD_LIBDIR/libretryd.so"; then
    AC_MSG_RESULT([$RETRYD_LIBDIR])
  else
    AC_MSG_ERROR([libretryd.so not found: pass --with-retryd=PREFIX or --with-retryd-lib=DIR])
  fi

  PHP_ADD_INCLUDE($RETRYD_INC)
  PHP_CHECK_LIBRARY(retryd, retryd_call,
    [PHP_ADD_LIBRARY_WITH_PATH(retryd, $RETRYD_LIBDIR, RETRYD_SHARED_LIBADD)],
    [AC_MSG_ERROR([libretryd in $RETRYD_LIBDIR has no retryd_call: too old?])],
    [-L$RETRYD_LIBDIR])
  PHP_SUBST(RETRYD_SHARED_LIBADD)
  PHP_NEW_EXTENSION(retryd, retryd.c, $ext_shared)
fi
