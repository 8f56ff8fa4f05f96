// retryctl status at a terminal's width: the real binary, its stdout a pseudo-terminal of a
// chosen size (or a file), against a real segment.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "shm/layout.h"
#include "tests/cli/cli_test_util.h"

namespace retryd::cli_test {
namespace {

using shm::Outcome;
using ::testing::HasSubstr;
using ::testing::Not;

// Every column's name, in the order the whole table shows them (no fleet here).
const std::vector<std::string> kColumns = {"DEPENDENCY",  "MODE",     "BREAKER",      "SINCE",
                                           "LAST PROBE",  "WINDOW",   "RETRY TOKENS", "RETRIES",
                                           "RETRY RATIO", "BULKHEAD", "REJECTED"};

// A segment whose status is wider than 120 columns: an open breaker with rejections, retries
// granted and denied, a full bulkhead, and a name as long as a segment takes.
class WideSegment {
 public:
  WideSegment() {
    const uint64_t now = NowNs();
    const uint32_t orders = seg_.AddDependency("orders", TestPolicy(4, 60'000));
    seg_.Trip(orders, 4, now);
    for (int k = 0; k < 3; ++k) seg_.Call(orders, 0, Outcome::kSuccess, now);
    shm::Policy budget = TestPolicy(/*min_calls=*/100);
    budget.retry_burst = 5;
    budget.retry_ratio_milli = 0;
    budget.min_retries_per_sec = 0;
    const uint32_t payments = seg_.AddDependency("payments", budget);
    for (int k = 0; k < 10; ++k) seg_.Call(payments, 0, Outcome::kSuccess, now);
    for (int k = 0; k < 7; ++k) seg_.Call(payments, 1, Outcome::kSuccess, now);
    shm::Policy bulkhead = TestPolicy();
    bulkhead.bulkhead_limit = 2;
    const uint32_t search = seg_.AddDependency("search", bulkhead);
    for (int k = 0; k < 2; ++k) seg_.Hold(search, 0, now);
    seg_.Call(search, 0, Outcome::kSuccess, now);
    seg_.AddDependency(kLongName, TestPolicy());
  }
  const std::string& name() const { return seg_.name(); }

  static inline const std::string kLongName = "reservations.inventory.eu-west-1a.internal:8443";

 private:
  TestSegment seg_;
};
static_assert(sizeof("reservations.inventory.eu-west-1a.internal:8443") - 1 == shm::kMaxNameLen);

// Joined: `lines` joined by single spaces, runs of spaces made one (a wrapped line's words).
std::string Joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) {
    for (const char c : " " + line) {
      if (c != ' ' || (!out.empty() && out.back() != ' ')) out += c;
    }
  }
  return out;
}

std::string HeaderRow(const std::vector<std::string>& lines) {
  for (const std::string& line : lines) {
    if (line.rfind("DEPENDENCY", 0) == 0) return line;
  }
  return "";
}

std::string RowOf(const std::vector<std::string>& lines, const std::string& start) {
  for (const std::string& line : lines) {
    if (line.rfind(start, 0) == 0) return line;
  }
  return "";
}

// LeftOut: the columns the footer names as not shown at `width`, "" when it names none.
std::string LeftOut(const std::vector<std::string>& lines, uint32_t width) {
  const std::string all = Joined(lines);
  const std::string head = "Not shown at " + std::to_string(width) + " columns: ";
  const size_t at = all.find(head);
  if (at == std::string::npos) return "";
  const std::string rest = all.substr(at + head.size());
  return rest.substr(0, std::min(rest.find(';'), rest.find(" (retryctl")));
}

// Each column is in the header row or named in the footer, never both, never neither.
void ExpectEveryColumnShownOrNamed(const std::vector<std::string>& lines, uint32_t width) {
  const std::string header = HeaderRow(lines) + " ";
  const std::string left_out = ", " + LeftOut(lines, width) + ",";
  for (const std::string& column : kColumns) {
    const bool shown = header.find(column + " ") != std::string::npos;
    const bool named = left_out.find(", " + column + ",") != std::string::npos;
    EXPECT_NE(shown, named) << column << " at " << width << ":\n" << Joined(lines);
  }
}

TEST(RetryctlWidth, StatusFitsTerminalsOf80And120Columns) {
  WideSegment seg;
  size_t shown_at_80 = 0;
  for (const uint16_t width : {80, 120}) {
    const RunResult r =
        RetryctlInTerminal({"status", "--segment", seg.name(), kUpForAnHour}, width);
    EXPECT_EQ(r.exit_code, 1) << "orders is open\n" << r.out << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_THAT(r.out, HasSubstr("\033[")) << "a terminal gets colour, which takes no column";
    const std::vector<std::string> lines = DisplayLines(r.out);
    for (const std::string& line : lines) {
      EXPECT_LE(ColumnsOf(line), width) << "at " << width << ": " << line << "\n" << r.out;
    }
    EXPECT_THAT(HeaderRow(lines), HasSubstr("BREAKER"));
    EXPECT_NE(LeftOut(lines, width), "") << r.out;
    ExpectEveryColumnShownOrNamed(lines, width);
    EXPECT_THAT(Joined(lines), HasSubstr("(retryctl status --wide shows all)."));
    const std::string header = HeaderRow(lines);
    const size_t shown =
        size_t(std::count_if(kColumns.begin(), kColumns.end(), [&](const std::string& c) {
          return (header + " ").find(c + " ") != std::string::npos;
        }));
    if (width == 80) {
      shown_at_80 = shown;
      EXPECT_THAT(header, HasSubstr("WINDOW FAIL% OF CALLS")) << "the failure rate fits 80";
    } else {
      EXPECT_GT(shown, shown_at_80) << r.out;
    }
    // The longest name is cut, with an ellipsis: U+2026 under a UTF-8 locale.
    EXPECT_THAT(r.out, Not(HasSubstr(WideSegment::kLongName)));
    EXPECT_NE(RowOf(lines, WideSegment::kLongName.substr(0, 15)).find("\xe2\x80\xa6  "),
              std::string::npos)
        << r.out;
    EXPECT_THAT(Joined(lines), HasSubstr("; dependency names cut to "));
  }
}

// `status NAME` follows the table with the named dependency's latency histogram: its count and
// quantiles, then a line per bucket from the first that holds a call to the last, with bars
// that keep within the terminal's width.
TEST(RetryctlWidth, TheLatencyOfANamedDependencyFitsTheTerminal) {
  TestSegment seg;
  const std::string name = WideSegment::kLongName;
  const uint32_t index = seg.AddDependency(name, TestPolicy(/*min_calls=*/1000));
  const uint64_t now = NowNs();
  // 70 calls of 0.3 ms, 25 of 3 ms, 4 of 300 ms and one of 20 s (over the last bound).
  for (int k = 0; k < 70; ++k) seg.Call(index, 0, Outcome::kSuccess, now, 300'000);
  for (int k = 0; k < 25; ++k) seg.Call(index, 0, Outcome::kFailure, now, 3'000'000);
  for (int k = 0; k < 4; ++k) seg.Call(index, 0, Outcome::kSuccess, now, 300'000'000);
  seg.Call(index, 0, Outcome::kIgnored, now, 20'000'000'000);
  for (const uint16_t width : {80, 120}) {
    const RunResult r = RetryctlInTerminal(
        {"status", "--segment", seg.name(), kUpForAnHour, name}, width);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    const std::vector<std::string> lines = DisplayLines(r.out);
    for (const std::string& line : lines) {
      EXPECT_LE(ColumnsOf(line), width) << "at " << width << ": " << line << "\n" << r.out;
    }
    const std::string all = Joined(lines);
    EXPECT_THAT(all, HasSubstr(name + ": latency of 100 calls since it was created: p50 <= "
                                      "0.5ms, p90 <= 4ms, p99 <= 512ms, mean"))
        << r.out;
    EXPECT_THAT(r.out, HasSubstr("<= 0.5ms"));
    EXPECT_THAT(r.out, HasSubstr("<= 4ms"));
    EXPECT_THAT(r.out, HasSubstr("<= 512ms"));
    EXPECT_THAT(r.out, HasSubstr("> 8.192s"));
    // A line per bucket from the first with a call to the last with one, the empty between.
    const size_t buckets = size_t(std::count_if(lines.begin(), lines.end(), [](const auto& l) {
      return l.rfind("  <= ", 0) == 0 || l.rfind("  > ", 0) == 0;
    }));
    EXPECT_EQ(buckets, 16u) << r.out;
    // The longest bar is the bucket of 0.3 ms: as wide as the terminal leaves room for, at most
    // 40 columns.
    const std::string first = RowOf(lines, "  <= 0.5ms");
    ASSERT_NE(first, "") << r.out;
    const size_t bar = size_t(std::count(first.begin(), first.end(), '#'));
    EXPECT_GE(bar, 20u) << first;
    EXPECT_LE(bar, 40u) << first;
  }
  // One bucket with calls: its line alone.
  const uint32_t other = seg.AddDependency("search", TestPolicy(/*min_calls=*/1000));
  for (int k = 0; k < 3; ++k) seg.Call(other, 0, Outcome::kSuccess, now, 40'000'000);
  const RunResult one =
      RetryctlInTerminal({"status", "--segment", seg.name(), kUpForAnHour, "search"}, 80);
  EXPECT_THAT(Joined(DisplayLines(one.out)),
              HasSubstr("search: latency of 3 calls since it was created: p50 <= 64ms"))
      << one.out;
  EXPECT_THAT(one.out, HasSubstr("\n  <= 64ms   3 #"));
  EXPECT_THAT(one.out, Not(HasSubstr("<= 32ms")));
  EXPECT_THAT(one.out, Not(HasSubstr("<= 128ms")));
  // Without a name, no histogram: the table alone.
  const RunResult all = RetryctlInTerminal({"status", "--segment", seg.name(), kUpForAnHour}, 80);
  EXPECT_THAT(all.out, Not(HasSubstr("latency of")));
}

// --wide shows every column and whole names on a terminal of any width.
TEST(RetryctlWidth, WideShowsEveryColumnAndWholeNames) {
  WideSegment seg;
  const RunResult r =
      RetryctlInTerminal({"status", "--wide", "--segment", seg.name(), kUpForAnHour}, 80);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const std::vector<std::string> lines = DisplayLines(r.out);
  const std::string header = HeaderRow(lines);
  size_t at = 0;
  for (const std::string& column : kColumns) {
    const size_t found = header.find(column, at);
    EXPECT_NE(found, std::string::npos) << column << " in order in: " << header;
    at = found == std::string::npos ? at : found;
  }
  EXPECT_NE(RowOf(lines, WideSegment::kLongName + "  "), "") << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("Not shown")));
  EXPECT_THAT(r.out, Not(HasSubstr("names cut")));
}

// Piped or redirected, status prints the whole table as it always has, $COLUMNS or not: what
// scripts parse does not depend on the terminal they run from.
TEST(RetryctlWidth, NotATerminalKeepsTheWholeTable) {
  WideSegment seg;
  for (const char* columns : {"", "40"}) {
    RunOptions o;
    if (columns[0] != '\0') o.set_env = {{"COLUMNS", columns}};
    const RunResult r = Retryctl({"status", "--segment", seg.name(), kUpForAnHour}, o);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_THAT(r.out, Not(HasSubstr("\033[")));
    const std::vector<std::string> lines = DisplayLines(r.out);
    EXPECT_EQ(HeaderRow(lines).substr(0, 16), "DEPENDENCY      ");
    for (const std::string& column : kColumns) EXPECT_THAT(HeaderRow(lines), HasSubstr(column));
    EXPECT_THAT(HeaderRow(lines), HasSubstr("RETRIES OK/DENIED TOTAL  RETRY RATIO TOTAL"));
    EXPECT_NE(RowOf(lines, WideSegment::kLongName + "  enforce  closed"), "") << r.out;
    EXPECT_THAT(RowOf(lines, "payments "), HasSubstr("5/2"));
    EXPECT_THAT(r.out, Not(HasSubstr("Not shown")));
    EXPECT_THAT(r.out, HasSubstr("\nRETRY RATIO = retries granted / first attempts; WINDOW is "
                                 "approximate at bucket edges.\n"));
    EXPECT_GT(ColumnsOf(HeaderRow(lines)), 120u) << "the whole table is wide";
  }
}

// A terminal that does not say its size: $COLUMNS if it is a number, else 80. One that does:
// its size, whatever $COLUMNS says.
TEST(RetryctlWidth, TheTerminalsSizeThenColumnsThenEighty) {
  WideSegment seg;
  const std::vector<std::string> args = {"status", "--segment", seg.name(), kUpForAnHour};
  struct Case {
    uint16_t terminal;
    const char* columns;  // nullptr: unset
    uint32_t width;
  };
  for (const Case& c :
       {Case{0, "100", 100}, Case{0, nullptr, 80}, Case{0, "wide", 80}, Case{120, "60", 120}}) {
    RunOptions o;
    if (c.columns != nullptr) o.set_env = {{"COLUMNS", c.columns}};
    const RunResult r = RetryctlInTerminal(args, c.terminal, o);
    const std::vector<std::string> lines = DisplayLines(r.out);
    for (const std::string& line : lines) {
      EXPECT_LE(ColumnsOf(line), c.width) << line << "\n" << r.out;
    }
    EXPECT_NE(LeftOut(lines, c.width), "")
        << "terminal " << c.terminal << ", COLUMNS " << (c.columns ? c.columns : "unset") << ":\n"
        << r.out;
  }
}

// A cut name keeps the columns aligned: each row's mode and breaker begin under their headers.
TEST(RetryctlWidth, ACutNameKeepsTheColumnsAligned) {
  WideSegment seg;
  const RunResult r =
      RetryctlInTerminal({"status", "--color=never", "--segment", seg.name(), kUpForAnHour}, 80);
  const std::vector<std::string> lines = DisplayLines(r.out);
  auto column_of = [](const std::string& line, const std::string& what) {
    const size_t at = line.find(what);
    return at == std::string::npos ? std::string::npos : ColumnsOf(line.substr(0, at));
  };
  const std::string header = HeaderRow(lines);
  const size_t mode = column_of(header, "MODE"), breaker = column_of(header, "BREAKER");
  ASSERT_NE(mode, std::string::npos) << r.out;
  for (const std::string& start : {std::string("orders "), std::string("payments "),
                                   std::string("search "), WideSegment::kLongName.substr(0, 12)}) {
    const std::string row = RowOf(lines, start);
    ASSERT_NE(row, "") << start << "\n" << r.out;
    EXPECT_EQ(column_of(row, "enforce"), mode) << row;
    EXPECT_TRUE(column_of(row, "closed") == breaker || column_of(row, "OPEN") == breaker) << row;
  }
}

size_t Frames(const std::string& out) {
  size_t n = 0;
  for (size_t at = out.find("\033[2J"); at != std::string::npos; at = out.find("\033[2J", at + 1)) {
    ++n;
  }
  return n;
}

// FrameText: the text of frame `k` (from 0), complete when another frame follows it.
std::string FrameText(const std::string& out, size_t k) {
  size_t at = out.find("\033[2J");
  for (size_t i = 0; i < k && at != std::string::npos; ++i) at = out.find("\033[2J", at + 1);
  if (at == std::string::npos) return "";
  const size_t end = out.find("\033[H", at + 1);
  return out.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

bool FrameFits(const std::string& frame, size_t width) {
  const std::vector<std::string> lines = DisplayLines(frame);
  return std::all_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return ColumnsOf(l) <= width; });
}

// --watch on a terminal fits every frame to the terminal's size then: resized narrower, the
// frames that follow fit the new width.
TEST(RetryctlWidth, WatchFitsEveryFrameAndFollowsAResize) {
  WideSegment seg;
  TerminalProcess p({"status", "--watch=0.2", "--segment", seg.name(), kUpForAnHour}, 120);
  ASSERT_TRUE(p.ReadUntil([](const std::string& out) { return Frames(out) >= 3; }, 30'000))
      << p.output();
  const size_t before = Frames(p.output());
  for (size_t k = 0; k + 1 < before; ++k) {
    const std::string frame = FrameText(p.output(), k);
    EXPECT_TRUE(FrameFits(frame, 120)) << frame;
    EXPECT_THAT(frame, HasSubstr("Every 0.2s: retryctl status"));
    EXPECT_THAT(Joined(DisplayLines(frame)), HasSubstr("Not shown at 120 columns: "));
  }
  p.Resize(70);
  // A complete frame drawn after the resize fits 70 columns.
  size_t first_fitted = 0;
  ASSERT_TRUE(p.ReadUntil(
      [&](const std::string& out) {
        for (size_t k = before; k + 1 < Frames(out); ++k) {
          if (FrameFits(FrameText(out, k), 70)) {
            first_fitted = k;
            return true;
          }
        }
        return false;
      },
      30'000))
      << p.output();
  const RunResult r = p.Finish(/*interrupt=*/true);
  EXPECT_EQ(r.exit_code, 0) << "Ctrl-C ends a watch normally\n" << r.err;
  const size_t frames = Frames(r.out);
  for (size_t k = first_fitted; k + 1 < frames; ++k) {
    const std::string frame = FrameText(r.out, k);
    EXPECT_TRUE(FrameFits(frame, 70)) << frame;
    EXPECT_THAT(Joined(DisplayLines(frame)), HasSubstr("Not shown at 70 columns: "));
  }
}

TEST(RetryctlWidth, HelpDocumentsWide) {
  RunResult r = Retryctl({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("--wide"));
  EXPECT_THAT(r.out, HasSubstr("piped or redirected, it always"));
  r = Retryctl({"status", "--help"});
  EXPECT_THAT(r.out, HasSubstr("Usage: retryctl status [--json] [--wide]"));
  EXPECT_THAT(r.out, HasSubstr("--wide shows every column and whole names"));
}

}  // namespace
}  // namespace retryd::cli_test
