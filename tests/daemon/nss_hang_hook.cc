// A library a test preloads into the daemon: looking up uid or gid 65534 (nobody, nogroup)
// through NSS waits 30 s, as it does with a directory service (LDAP, sssd) that does not
// answer. Every other lookup goes on to the C library.
#include <dlfcn.h>
#include <grp.h>
#include <pwd.h>
#include <unistd.h>

namespace {

constexpr unsigned kHangSeconds = 30;
constexpr unsigned kNobody = 65534;

template <typename Fn>
Fn Next(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

}  // namespace

// The build hides symbols by default; these must be seen to take the C library's place.
#define HOOK __attribute__((visibility("default")))

extern "C" {

HOOK passwd* getpwuid(uid_t uid) {
  if (uid == kNobody) sleep(kHangSeconds);
  static const auto next = Next<passwd* (*)(uid_t)>("getpwuid");
  return next(uid);
}

HOOK int getpwuid_r(uid_t uid, passwd* pw, char* buf, size_t len, passwd** result) {
  if (uid == kNobody) sleep(kHangSeconds);
  static const auto next = Next<int (*)(uid_t, passwd*, char*, size_t, passwd**)>("getpwuid_r");
  return next(uid, pw, buf, len, result);
}

HOOK group* getgrgid(gid_t gid) {
  if (gid == kNobody) sleep(kHangSeconds);
  static const auto next = Next<group* (*)(gid_t)>("getgrgid");
  return next(gid);
}

HOOK int getgrgid_r(gid_t gid, group* gr, char* buf, size_t len, group** result) {
  if (gid == kNobody) sleep(kHangSeconds);
  static const auto next = Next<int (*)(gid_t, group*, char*, size_t, group**)>("getgrgid_r");
  return next(gid, gr, buf, len, result);
}

}  // extern "C"
