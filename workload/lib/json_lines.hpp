// JSON Lines, read one way for traces and event streams: every line that is
// not blank is parsed and handed on with its "FILE:LINE"; a line that is not
// JSON is ValidationError(code, "FILE:LINE: json: expected one JSON value per
// line, got a malformed line (parser's message)").
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <kvsim/validation/errors.hpp>

namespace kvsim::workload {

template <typename OnLine>
void for_each_json_line(std::string_view text, const std::string& source, ErrorCode code, OnLine&& on_line) {
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank lines carry nothing
    const std::string where = source + ":" + std::to_string(line_no);
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      const std::string msg = e.what();
      const size_t cut = msg.find("parse error");
      fail(code, where + ": json: expected one JSON value per line, got a malformed line (" +
                     (cut == std::string::npos ? msg : msg.substr(cut)) + ")");
    }
    on_line(value, where, line_no);
  }
}

}  // namespace kvsim::workload
