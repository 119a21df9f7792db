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
// ifstream on Linux and reads as no lines, which the callers would report as an empty file.
inline std::ifstream open_lines(const std::string& path, std::string_view what) {
  std::error_code ec;
  zipage::check(!std::filesystem::is_directory(path, ec), "cannot read ", what, " '", path, "': it is a directory");
  std::ifstream in(path);
  zipage::check(in.good(), "cannot read ", what, " '", path, "'");
  return in;
}

}  // namespace zipage_cli
