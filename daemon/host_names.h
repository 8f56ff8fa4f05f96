// daemon/host_names.h: the name the host's own files give a user or group id.
//
// NameInHostFile reads a file of `name:password:id:...` lines (/etc/passwd, /etc/group) itself,
// without NSS: the daemon names a refused peer on its loop thread, which a directory service
// behind NSS (LDAP, sssd) that does not answer must not hold. One pass over the file, lines of
// any length; leading blanks skipped, as glibc does; comments and NIS compat lines (`+`, `-`)
// name nothing.
//
// Thread safety: thread-safe (reads the file anew each call).
#pragma once

#include <cstdint>
#include <string>

namespace retryd::daemon {

// NameInHostFile returns the name of the first line whose id is `id`, or "" (none, or the file
// cannot be read).
std::string NameInHostFile(const std::string& path, uint32_t id);

}  // namespace retryd::daemon
