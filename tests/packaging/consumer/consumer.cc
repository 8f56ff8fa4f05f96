// consumer.cc: a worker built against the installed libretryd-dev through the C++ API, as
// consumer.c is through the C ABI; same usage and output.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include <retryd/client.h>

int main(int argc, char** argv) {
  bool want_attached = argc > 1 && std::strcmp(argv[1], "--attached") == 0;
  retryd::ClientOptions options;
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
  int calls = 1;
  while (want_attached && client->local() && calls < 600) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    admitted = client->Admit(orders, 0, &permit);
    client->Complete(&permit, retryd::Outcome::kSuccess, std::chrono::milliseconds(1));
    ++calls;
  }
  std::printf("%s %s (%d calls)\n", client->local() ? "local" : "attached",
              admitted ? "admitted" : "rejected", calls);
  return want_attached && client->local() ? 1 : 0;
}
