#pragma once
// Lines of the text files the tools read (prompt files, length files, JSONL data sets).
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

#include "zipage/core/error.hpp"

namespace zipage_cli {

// A line as std::getline gave it, without its end: "\r\n" (a file written on Windows) ends a line as "\n" does.
inline std::string_view without_cr(const std::string& line) {
  return !line.empty() && line.back() == '\r' ? std::string_view(line).substr(0, line.size() - 1) : line;
}

// A text file opened for reading, or an error naming it (`what`: "prompts file", ...). A directory opens as an
// ifstream on Linux and reads as no lines, which the callers would report as an empty file. A UTF-8 byte order
// mark (Notepad writes one) is skipped: it would be the first prompt's first three bytes, or an invisible
// character that made a number "not a positive integer".
inline std::ifstream open_lines(const std::string& path, std::string_view what) {
  std::error_code ec;
  zipage::check(!std::filesystem::is_directory(path, ec), "cannot read ", what, " '", path, "': it is a directory");
  std::ifstream in(path, std::ios::binary);
  zipage::check(in.good(), "cannot read ", what, " '", path, "'");
  char bom[3] = {};
  in.read(bom, 3);
  if (in.gcount() != 3 || std::string_view(bom, 3) != "\xEF\xBB\xBF") {
    in.clear();
    in.seekg(0);
  }
  return in;
}

}  // namespace zipage_cli
