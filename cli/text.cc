#include "cli/text.h"

#include <algorithm>

namespace retryd::cli {
namespace {

// EscapeLength: the length of the ANSI escape sequence `s` begins with, 0 if none.
size_t EscapeLength(std::string_view s) {
  if (s.size() < 2 || s[0] != '\033' || s[1] != '[') return 0;
  size_t i = 2;
  while (i < s.size() && !(s[i] >= 0x40 && s[i] <= 0x7e)) ++i;
  return std::min(i + 1, s.size());
}

bool IsContinuationByte(char c) {
  return (static_cast<unsigned char>(c) & 0xc0) == 0x80;
}

// PrefixBytes: how many bytes of `s` make up its first `columns` columns, with the escape
// sequences that follow them.
size_t PrefixBytes(std::string_view s, size_t columns) {
  size_t i = 0;
  for (size_t w = 0; i < s.size();) {
    if (const size_t e = EscapeLength(s.substr(i)); e > 0) {
      i += e;
      continue;
    }
    if (w == columns) break;
    ++w;
    ++i;
    while (i < s.size() && IsContinuationByte(s[i])) ++i;
  }
  return i;
}

}  // namespace

size_t DisplayWidth(std::string_view text) {
  size_t w = 0;
  for (size_t i = 0; i < text.size();) {
    if (const size_t e = EscapeLength(text.substr(i)); e > 0) {
      i += e;
      continue;
    }
    if (!IsContinuationByte(text[i])) ++w;
    ++i;
  }
  return w;
}

std::string TruncateToWidth(std::string_view text, size_t width, bool utf8) {
  if (DisplayWidth(text) <= width) return std::string(text);
  const std::string_view ellipsis = utf8 ? "\xe2\x80\xa6" : "...";  // U+2026 in UTF-8
  const size_t ellipsis_width = utf8 ? 1 : 3;
  if (width < ellipsis_width) return std::string(text.substr(0, PrefixBytes(text, width)));
  return std::string(text.substr(0, PrefixBytes(text, width - ellipsis_width))) +
         std::string(ellipsis);
}

std::string WrapToWidth(std::string_view text, size_t width, size_t indent) {
  if (width == 0 || DisplayWidth(text) <= width) return std::string(text) + "\n";
  if (indent >= width) indent = 0;  // every line must have room for a word
  size_t lead = 0;
  while (lead < text.size() && text[lead] == ' ') ++lead;
  lead = std::min(lead, width - 1);
  std::string out;
  std::string line(lead, ' ');
  size_t line_width = lead;
  bool has_word = false;
  auto next_line = [&] {
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
    line.assign(indent, ' ');
    line_width = indent;
    has_word = false;
  };
  std::string_view rest = text;
  rest.remove_prefix(std::min(rest.find_first_not_of(' '), rest.size()));
  for (;;) {
    const size_t space = rest.find(' ');
    std::string_view word = rest.substr(0, space);
    size_t word_width = DisplayWidth(word);
    if (has_word && line_width + 1 + word_width > width) next_line();
    // A run of spaces where a line breaks is dropped; within a line it stays as it was.
    if (has_word || !word.empty()) {
      if (has_word) {
        line += ' ';
        ++line_width;
      }
      while (line_width + word_width > width) {  // a word longer than a line
        const size_t cut = PrefixBytes(word, width - line_width);
        line += word.substr(0, cut);
        next_line();
        word = word.substr(cut);
        word_width = DisplayWidth(word);
      }
      line += word;
      line_width += word_width;
      has_word = true;
    }
    if (space == std::string_view::npos) break;
    rest = rest.substr(space + 1);
  }
  if (has_word || out.empty()) next_line();
  return out;
}

std::string PackFields(const std::vector<std::string>& fields, size_t width, std::string_view gap) {
  const size_t gap_width = DisplayWidth(gap);
  std::string out;
  std::string line;
  size_t line_width = 0;
  bool first = true;
  for (const std::string& field : fields) {
    const size_t field_width = DisplayWidth(field);
    if (!first && width > 0 && line_width + gap_width + field_width > width) {
      out += line + "\n";
      line.clear();
      line_width = 0;
      first = true;
    }
    if (!first) {
      line += gap;
      line_width += gap_width;
    }
    line += field;
    line_width += field_width;
    first = false;
  }
  return out + line + "\n";
}

}  // namespace retryd::cli
