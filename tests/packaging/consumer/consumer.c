/* consumer.c: a worker built against the installed libretryd-dev through the C ABI. It opens
 * a client, admits and completes one attempt, and prints "attached" or "local".
 * Usage: consumer [--attached]   (--attached: fail unless a daemon answers. Opening waits at
 * most 20 ms for the daemon, and a client it did not answer in time attaches on a later call:
 * until it is attached, or for 30 s, one more attempt every 50 ms.) */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <retryd/retryd.h>

int main(int argc, char** argv) {
  int want_attached = argc > 1 && strcmp(argv[1], "--attached") == 0;
  retryd_options_t options = {NULL, 1};
  retryd_client_t* client;
  int rc = retryd_open(&options, &client);
  if (rc != RETRYD_OK) {
    fprintf(stderr, "consumer: retryd_open: %s: %s\n", retryd_strerror(rc), retryd_last_error());
    return 1;
  }
  retryd_dependency_t orders;
  rc = retryd_resolve(client, "orders", &orders);
  if (rc != RETRYD_OK) {
    fprintf(stderr, "consumer: retryd_resolve: %s\n", retryd_last_error());
    return 1;
  }
  retryd_permit_t permit;
  int decision = retryd_admit(client, orders, 0, &permit);
  retryd_complete(client, &permit, RETRYD_SUCCESS, 1000000);
  int calls = 1;
  const struct timespec pause = {0, 50 * 1000 * 1000};
  while (want_attached && retryd_is_local(client) && calls < 600) {
    nanosleep(&pause, NULL);
    decision = retryd_admit(client, orders, 0, &permit);
    retryd_complete(client, &permit, RETRYD_SUCCESS, 1000000);
    ++calls;
  }
  int local = retryd_is_local(client);
  printf("%s %s (%d calls)\n", local ? "local" : "attached", retryd_decision_name(decision),
         calls);
  retryd_close(client);
  return want_attached && local ? 1 : 0;
}
