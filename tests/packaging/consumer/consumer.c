/* consumer.c: a worker built against the installed libretryd-dev through the C ABI. It opens
 * a client, admits and completes one attempt, and prints "attached" or "local".
 * Usage: consumer [--attached]   (--attached: fail unless a daemon answered) */
#include <stdio.h>
#include <string.h>

#include <retryd/retryd.h>

int main(int argc, char** argv) {
  int want_attached = argc > 1 && strcmp(argv[1], "--attached") == 0;
  retryd_options_t options = {NULL, !want_attached};
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
  int local = retryd_is_local(client);
  printf("%s %s\n", local ? "local" : "attached", retryd_decision_name(decision));
  retryd_close(client);
  return want_attached && local ? 1 : 0;
}
