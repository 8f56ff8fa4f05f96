// tests/daemon/prometheus_check.h: a strict reader of Prometheus text exposition format, for
// checking what RenderPrometheus and the daemon's textfile produce.
#pragma once

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace retryd::daemon::testing {

namespace internal {

inline bool NameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':'; }
inline bool NameChar(char c) { return NameStart(c) || (c >= '0' && c <= '9'); }

// ReadName consumes a metric (or, with `label`, a label) name at s[*i].
inline bool ReadName(const std::string& s, size_t* i, bool label, std::string* out) {
  const size_t start = *i;
  if (*i >= s.size() || !NameStart(s[*i]) || (label && s[*i] == ':')) return false;
  while (*i < s.size() && NameChar(s[*i]) && !(label && s[*i] == ':')) ++*i;
  *out = s.substr(start, *i - start);
  return true;
}

// ReadLabels consumes {name="value",...} at s[*i] (which is '{').
inline bool ReadLabels(const std::string& s, size_t* i) {
  ++*i;
  for (;;) {
    std::string name;
    if (!ReadName(s, i, true, &name)) return false;
    if (s.compare(*i, 2, "=\"") != 0) return false;
    *i += 2;
    for (;; ++*i) {
      if (*i >= s.size() || s[*i] == '\n') return false;
      if (s[*i] == '\\') {
        if (++*i >= s.size() || (s[*i] != '\\' && s[*i] != '"' && s[*i] != 'n')) return false;
      } else if (s[*i] == '"') {
        break;
      }
    }
    ++*i;
    if (*i < s.size() && s[*i] == ',') {
      ++*i;
      continue;
    }
    if (*i < s.size() && s[*i] == '}') {
      ++*i;
      return true;
    }
    return false;
  }
}

}  // namespace internal

// ParsePrometheus checks `text` line by line: every family has # HELP then # TYPE (gauge,
// counter or histogram) once, before its samples; samples belong to the family declared last;
// counters end in _total; no sample (name and labels) repeats; values are finite numbers. A
// histogram F's samples are F_bucket, F_sum and F_count; each series' buckets come in rising
// `le` order, their counts never fall, the last is le="+Inf", and F_count equals it. Returns ""
// and fills *samples ("name{labels}" -> value) when well-formed, else the first problem found.
inline std::string ParsePrometheus(const std::string& text, std::map<std::string, double>* samples) {
  if (text.empty() || text.back() != '\n') return "text does not end with a newline";
  std::istringstream in(text);
  std::string line, help_name, family;
  std::set<std::string> families;
  bool histogram = false;
  // A histogram's series (its labels but `le`) -> the last bucket's le and count read.
  std::map<std::string, std::pair<double, double>> buckets;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const std::string at = "line " + std::to_string(n) + " \"" + line + "\": ";
    size_t i = 0;
    std::string name;
    if (line.rfind("# HELP ", 0) == 0) {
      i = 7;
      if (!internal::ReadName(line, &i, false, &name) || i + 1 >= line.size() || line[i] != ' ') {
        return at + "bad HELP";
      }
      if (!families.insert(name).second) return at + "family declared twice";
      help_name = name;
      family.clear();
    } else if (line.rfind("# TYPE ", 0) == 0) {
      i = 7;
      if (!internal::ReadName(line, &i, false, &name)) return at + "bad TYPE";
      const std::string type = line.substr(i);
      if (type != " gauge" && type != " counter" && type != " histogram") {
        return at + "type is not gauge, counter or histogram";
      }
      histogram = type == " histogram";
      if (name != help_name) return at + "TYPE without its HELP";
      if (type == " counter" &&
          (name.size() < 6 || name.compare(name.size() - 6, 6, "_total") != 0)) {
        return at + "counter not ending in _total";
      }
      family = name;
    } else {
      if (!internal::ReadName(line, &i, false, &name)) return at + "not HELP, TYPE or a sample";
      if (i < line.size() && line[i] == '{' && !internal::ReadLabels(line, &i)) {
        return at + "bad labels";
      }
      if (i >= line.size() || line[i] != ' ') return at + "no value";
      const std::string key = line.substr(0, i);
      const std::string value = line.substr(i + 1);
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || v != v) return at + "bad value";
      if (histogram) {
        const std::string suffix =
            name.size() > family.size() && name.compare(0, family.size(), family) == 0
                ? name.substr(family.size())
                : "";
        const std::string labels = key.substr(name.size());
        if (suffix == "_bucket") {
          const size_t le = labels.find("le=\"");
          if (le == std::string::npos) return at + "a bucket without le";
          const size_t le_end = labels.find('"', le + 4);
          const std::string bound = labels.substr(le + 4, le_end - le - 4);
          const double b = bound == "+Inf" ? HUGE_VAL : std::strtod(bound.c_str(), &end);
          if (bound != "+Inf" && (bound.empty() || *end != '\0')) return at + "bad le";
          // The series: the labels without le (and the comma before it), as F_count has them.
          std::string series = labels;
          const size_t from = le > 0 && series[le - 1] == ',' ? le - 1 : le;
          series.erase(from, le_end + 1 - from);
          if (series == "{}") series.clear();
          auto [it, first] = buckets.try_emplace(series, b, v);
          if (!first) {
            if (it->second.first == HUGE_VAL) return at + "a bucket after le=\"+Inf\"";
            if (b <= it->second.first) return at + "le not rising";
            if (v < it->second.second) return at + "a bucket's count below the one before";
            it->second = {b, v};
          }
        } else if (suffix == "_count") {
          auto it = buckets.find(labels);
          if (it == buckets.end() || it->second.first != HUGE_VAL) {
            return at + "a count without its buckets up to le=\"+Inf\"";
          }
          if (it->second.second != v) return at + "count differs from the +Inf bucket";
        } else if (suffix != "_sum") {
          return at + "sample outside its histogram (declared: " + family + ")";
        }
      } else if (name != family) {
        return at + "sample outside its family (declared: " + family + ")";
      }
      if (samples->count(key)) return at + "duplicate sample";
      (*samples)[key] = v;
    }
  }
  return "";
}

}  // namespace retryd::daemon::testing
