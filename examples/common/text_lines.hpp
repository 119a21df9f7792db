#pragma once
// Lines of the text files the tools read (prompt files, length files, JSONL data sets).
#include <string>
#include <string_view>

namespace zipage_cli {

// A line as std::getline gave it, without its end: "\r\n" (a file written on Windows) ends a line as "\n" does.
inline std::string_view without_cr(const std::string& line) {
  return !line.empty() && line.back() == '\r' ? std::string_view(line).substr(0, line.size() - 1) : line;
}

}  // namespace zipage_cli
