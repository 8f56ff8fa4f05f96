// retryd_http_worker: a worker that calls an HTTP downstream through libcurl, every call
// wrapped in the retry loop (retryd/call.h).
//
//   retryd_http_worker [--segment=NAME] [--dependency=NAME] [--method=GET] [--data=BODY]
//                      [--idempotency-key=KEY] [--deadline-ms=2000] [--timeout-ms=800]
//                      [--attempts=3] URL...
//
// For each URL: one logical call, at most --attempts attempts within --deadline-ms. Each
// attempt is admitted by the host's segment, gets the time left as its curl timeout and as a
// `grpc-timeout` request header, and is classified from the status or the curl error; 429 and
// 503 responses' Retry-After is honoured. A refusal (breaker open, budget empty, ...) serves a
// fallback at once instead of calling. One line per attempt goes to stderr, the outcome of each
// call to stdout. Exit status: 0 if every call succeeded.
//
// Thread safety: single-threaded; a real worker would keep one Client per process and one
// CURL handle per thread.
#include <curl/curl.h>
#include <strings.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "retryd/call.h"
#include "retryd/client.h"

namespace {

struct Flags {
  std::string segment;
  std::string dependency = "http";
  std::string method = "GET";
  std::string data;
  std::string idempotency_key;
  long deadline_ms = 2000;
  long timeout_ms = 800;
  unsigned attempts = 3;
  std::vector<std::string> urls;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&](std::string_view name, std::string* out) {
      if (a.substr(0, name.size()) != name) return false;
      *out = std::string(a.substr(name.size()));
      return true;
    };
    std::string v;
    if (value("--segment=", &f->segment) || value("--dependency=", &f->dependency) ||
        value("--method=", &f->method) || value("--data=", &f->data) ||
        value("--idempotency-key=", &f->idempotency_key)) {
      continue;
    } else if (value("--deadline-ms=", &v)) {
      f->deadline_ms = std::strtol(v.c_str(), nullptr, 10);
    } else if (value("--timeout-ms=", &v)) {
      f->timeout_ms = std::strtol(v.c_str(), nullptr, 10);
    } else if (value("--attempts=", &v)) {
      f->attempts = unsigned(std::strtoul(v.c_str(), nullptr, 10));
    } else if (a.substr(0, 2) == "--") {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return false;
    } else {
      f->urls.emplace_back(a);
    }
  }
  return !f->urls.empty();
}

// The transport error kinds of the classification table, from curl's result codes.
retryd::ErrorKind ErrorKindOf(CURLcode rc) {
  switch (rc) {
    case CURLE_OK: return retryd::ErrorKind::kNone;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY: return retryd::ErrorKind::kDns;
    case CURLE_COULDNT_CONNECT: return retryd::ErrorKind::kConnectRefused;
    // Curl does not say whether a timeout hit before or after the request was sent: an
    // ambiguous timeout, which fails closed for a call that is not safe to repeat.
    case CURLE_OPERATION_TIMEDOUT: return retryd::ErrorKind::kTimeout;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER: return retryd::ErrorKind::kTls;
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE: return retryd::ErrorKind::kConnectionReset;
    default: return retryd::ErrorKind::kOther;
  }
}

struct Response {
  std::string body;
  std::string retry_after;
  std::string date;
};

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  static_cast<Response*>(user)->body.append(data, size * n);
  return size * n;
}

// Keeps the two headers the loop needs. Header names are case-insensitive.
size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* r = static_cast<Response*>(user);
  std::string_view line(data, size * n);
  const size_t colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string_view name = line.substr(0, colon);
    std::string_view value = line.substr(colon + 1);
    const size_t first = value.find_first_not_of(" \t");
    const size_t last = value.find_last_not_of(" \t\r\n");
    value = first == std::string_view::npos ? std::string_view()
                                            : value.substr(first, last - first + 1);
    if (strncasecmp(name.data(), "Retry-After", name.size()) == 0 && name.size() == 11) {
      r->retry_after = std::string(value);
    } else if (strncasecmp(name.data(), "Date", name.size()) == 0 && name.size() == 4) {
      r->date = std::string(value);
    }
  }
  return size * n;
}

// One attempt: a request with the time left as its timeout, passed downstream as well.
retryd::AttemptResult Attempt(CURL* curl, const Flags& f, const std::string& url,
                              const retryd::AttemptContext& ctx, Response* response) {
  *response = Response{};
  curl_easy_reset(curl);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, f.method.c_str());
  if (!f.data.empty()) curl_easy_setopt(curl, CURLOPT_POSTFIELDS, f.data.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, response);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, response);
  curl_slist* headers = nullptr;
  if (ctx.bounded()) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(ctx.remaining);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, long(std::max<int64_t>(1, ms.count())));
    headers = curl_slist_append(headers, ("grpc-timeout: " + ctx.deadline_header()).c_str());
  }
  if (!f.idempotency_key.empty()) {
    headers = curl_slist_append(headers, ("Idempotency-Key: " + f.idempotency_key).c_str());
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);

  retryd::AttemptResult result;
  result.error = ErrorKindOf(rc);
  if (rc == CURLE_OK) {
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    result.status = int(status);
    result.retry_after_header = response->retry_after;
    result.date_header = response->date;
  }
  return result;
}

void LogAttempt(const retryd::AttemptRecord& r) {
  std::fprintf(stderr,
               "attempt=%u admission=%s class=%s breaker=%s status=%d error=%s latency_ms=%lld "
               "retry_after_ms=%lld wait_ms=%lld next=%s\n",
               r.attempt, retryd::DecisionName(r.admission),
               retryd::AttemptClassName(r.attempt_class), retryd::BreakerOutcomeName(r.breaker),
               r.status, retryd::ErrorKindName(r.error),
               static_cast<long long>(r.latency.count() / 1'000'000),
               static_cast<long long>(r.retry_after ? r.retry_after->count() / 1'000'000 : -1),
               static_cast<long long>(r.wait.count() / 1'000'000),
               retryd::StopReasonName(r.next));
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: %s [--segment=NAME] [--dependency=NAME] [--method=GET] [--data=BODY] "
                 "[--idempotency-key=KEY] [--deadline-ms=2000] [--timeout-ms=800] "
                 "[--attempts=3] URL...\n",
                 argv[0]);
    return 2;
  }
  std::unique_ptr<retryd::Client> client;
  retryd::ClientOptions options;
  options.segment = flags.segment;
  if (retryd::Status s = retryd::Client::Open(options, &client); !s.ok()) {
    std::fprintf(stderr, "retryd: %s\n", s.ToString().c_str());
    return 1;
  }
  retryd::Dependency dep;
  if (retryd::Status s = client->Resolve(flags.dependency, &dep); !s.ok()) {
    std::fprintf(stderr, "retryd: %s\n", s.ToString().c_str());
    return 1;
  }

  retryd::RetryPolicy policy;
  policy.max_attempts = flags.attempts;
  policy.deadline = std::chrono::milliseconds(flags.deadline_ms);
  if (flags.timeout_ms > 0) policy.attempt_timeout = std::chrono::milliseconds(flags.timeout_ms);
  const retryd::RetryLoop loop(*client, dep, policy, LogAttempt);
  retryd::CallOptions call;
  call.method = flags.method;
  call.has_idempotency_key = !flags.idempotency_key.empty();

  curl_global_init(CURL_GLOBAL_DEFAULT);
  CURL* curl = curl_easy_init();
  int failures = 0;
  for (const std::string& url : flags.urls) {
    Response response;
    const retryd::CallResult r = loop.Run(
        [&](const retryd::AttemptContext& ctx) {
          return Attempt(curl, flags, url, ctx, &response);
        },
        call);
    if (r.ok()) {
      std::printf("%s ok status=%d attempts=%u elapsed_ms=%lld bytes=%zu\n", url.c_str(),
                  r.last_status, r.attempts,
                  static_cast<long long>(r.elapsed.count() / 1'000'000), response.body.size());
    } else if (r.rejected()) {
      // The host says the downstream is not to be called now: answer from a fallback.
      std::printf("%s fallback reason=%s attempts=%u\n", url.c_str(),
                  retryd::DecisionName(r.rejection), r.attempts);
      ++failures;
    } else {
      std::printf("%s failed stop=%s status=%d error=%s attempts=%u elapsed_ms=%lld\n",
                  url.c_str(), retryd::StopReasonName(r.stop), r.last_status,
                  retryd::ErrorKindName(r.last_error), r.attempts,
                  static_cast<long long>(r.elapsed.count() / 1'000'000));
      ++failures;
    }
  }
  curl_easy_cleanup(curl);
  curl_global_cleanup();
  return failures == 0 ? 0 : 1;
}
