// retryd/export.h: symbol visibility. The library is built with -fvisibility=hidden; only what
// is marked RETRYD_EXPORT is part of its ABI.
#pragma once

#if defined(RETRYD_BUILDING_LIBRARY)
#define RETRYD_EXPORT __attribute__((visibility("default")))
#else
#define RETRYD_EXPORT
#endif
