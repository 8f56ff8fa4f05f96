// cli/text.h: measuring text as a terminal shows it, and fitting it to a terminal's width.
//
// A width counts terminal columns: one per UTF-8 code point, none for an ANSI escape sequence
// (ESC '[' ... final byte). Wide (East Asian) characters and combining marks are not told
// apart: the tables retryctl fits hold ASCII (dependency names are [A-Za-z0-9_.:-]) and the
// ellipsis.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace retryd::cli {

// DisplayWidth: the columns `text` (one line) takes on a terminal.
size_t DisplayWidth(std::string_view text);

// TruncateToWidth: `text` if it fits in `width` columns; else as much of its head as fits
// before an ellipsis ("…" when `utf8`, else "..."), `width` columns in all. `text` must hold
// no escape sequence (truncate a cell before painting it).
std::string TruncateToWidth(std::string_view text, size_t width, bool utf8);

// WrapToWidth: `text` (one line, no '\n') broken at spaces into lines of at most `width`
// columns, each ending in '\n'. The first line keeps the text's leading spaces; the others
// begin with `indent` spaces. A word longer than a line is cut where the line ends. `width` 0:
// the text as it is, on one line.
std::string WrapToWidth(std::string_view text, size_t width, size_t indent);

// PackFields: `fields` joined by `gap`, on as few lines as keep within `width` columns, each
// ending in '\n'; a field is never split (one wider than a line stands alone on its line).
// `width` 0: one line.
std::string PackFields(const std::vector<std::string>& fields, size_t width, std::string_view gap);

}  // namespace retryd::cli
