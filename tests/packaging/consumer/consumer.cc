// consumer.cc: a worker built against the installed libretryd-dev through the C++ API, as
// consumer.c is through the C ABI; same usage and output.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

#include <retryd/client.h>

int main(int argc, char** argv) {
  bool want_attached = argc > 1 && std::strcmp(argv[1], "--attached") == 0;
  retryd::ClientOptions options;
  options.fallback_to_local = !want_attached;
  std::unique_ptr<retryd::Client> client;
  if (retryd::Status st = retryd::Client::Open(options, &client); !st.ok()) {
    std::fprintf(stderr, "consumer: Open: %s\n", st.message().c_str());
    return 1;
  }
  retryd::Dependency orders;
  if (retryd::Status st = client->Resolve("orders", &orders); !st.ok()) {
    std::fprintf(stderr, "consumer: Resolve: %s\n", st.message().c_str());
    return 1;
  }
  retryd::Permit permit;
  bool admitted = client->Admit(orders, 0, &permit);
  client->Complete(&permit, retryd::Outcome::kSuccess, std::chrono::milliseconds(1));
  std::printf("%s %s\n", client->local() ? "local" : "attached",
              admitted ? "admitted" : "rejected");
  return want_attached && client->local() ? 1 : 0;
}
