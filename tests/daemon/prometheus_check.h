// tests/daemon/prometheus_check.h: a strict reader of Prometheus text exposition format, for
// checking what RenderPrometheus and the daemon's textfile produce.
#pragma once

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

// ParsePrometheus checks `text` line by line: every family has # HELP then # TYPE (gauge or
// counter) once, before its samples; samples belong to the family declared last; counters end
// in _total; no sample (name and labels) repeats; values are finite numbers. Returns "" and
// fills *samples ("name{labels}" -> value) when well-formed, else the first problem found.
inline std::string ParsePrometheus(const std::string& text, std::map<std::string, double>* samples) {
  if (text.empty() || text.back() != '\n') return "text does not end with a newline";
  std::istringstream in(text);
  std::string line, help_name, family;
  std::set<std::string> families;
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
      if (type != " gauge" && type != " counter") return at + "type is not gauge or counter";
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
      if (name != family) return at + "sample outside its family (declared: " + family + ")";
      if (samples->count(key)) return at + "duplicate sample";
      (*samples)[key] = v;
    }
  }
  return "";
}

}  // namespace retryd::daemon::testing
