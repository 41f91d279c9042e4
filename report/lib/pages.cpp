// The HTML pages (report.hpp): the template of assets/page.html with the CSS,
// the JavaScript and the scenario's JSON put in.
#include <cstdio>
#include <string_view>

#include "kvsim/report/report.hpp"

namespace kvsim::report {
namespace assets {
extern const std::string_view page_html;
extern const std::string_view report_css;
extern const std::string_view report_js;
}  // namespace assets

namespace {

void replace_once(std::string& s, std::string_view marker, std::string_view with) {
  const size_t at = s.find(marker);
  if (at != std::string::npos) s.replace(at, marker.size(), with);
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// JSON inside <script>: "</" would end the element; "<\/" is the same JSON string.
std::string script_safe(std::string json) {
  for (size_t at = json.find("</"); at != std::string::npos; at = json.find("</", at + 3)) json.replace(at, 2, "<\\/");
  return json;
}

}  // namespace

std::string scenario_page(const nlohmann::json& document) {
  std::string page(assets::page_html);
  // The data goes in last, so a marker inside it is never taken for one of the template's.
  replace_once(page, "@TITLE@", html_escape("kvsim report: " + document.at("scenario").at("name").get<std::string>()));
  replace_once(page, "@CSS@", assets::report_css);
  replace_once(page, "@JS@", assets::report_js);
  replace_once(page, "@DATA@", script_safe(document.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  return page;
}

std::string index_page(const std::string& title, const nlohmann::json& entries) {
  std::string rows;
  bool all_ok = true;
  for (const nlohmann::json& e : entries) {
    const bool ok = e.at("ok").get<bool>();
    all_ok = all_ok && ok;
    rows += "<tr class=\"scenario\" data-ok=\"" + std::string(ok ? "true" : "false") + "\"><td><a href=\"" +
            html_escape(e.at("file").get<std::string>()) + "\">" + html_escape(e.at("name").get<std::string>()) +
            "</a></td><td class=\"" + (ok ? "ok" : "notok") + "\">" + (ok ? "ok" : "NOT OK") + "</td><td>" +
            std::to_string(e.at("steps").get<int64_t>()) + "</td><td>" + html_escape(e.at("summary").get<std::string>()) +
            "</td></tr>\n";
  }
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + html_escape(title) +
         "</title><style>" + std::string(assets::report_css) +
         " table.index{border-collapse:collapse} table.index td,table.index th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
         "</style></head><body><h1>" +
         html_escape(title) + "</h1><p class=\"" + (all_ok ? "ok" : "notok") + "\">" +
         (all_ok ? "every scenario ok" : "some scenarios NOT OK") + ", " + std::to_string(entries.size()) +
         " scenarios</p><table class=\"index\"><thead><tr><th>scenario</th><th>outcome</th><th>steps</th><th>invariants</th></tr></thead><tbody>\n" +
         rows + "</tbody></table></body></html>\n";
}

ReportFolder::ReportFolder(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) fail(ErrorCode::bad_argument, "--report = '': empty value: expected a folder to write the pages into");
  write_report_file(dir_, ".kvsim-report-probe", "");  // fails here, naming the folder, if it cannot be written
  std::remove((dir_ + "/.kvsim-report-probe").c_str());
}

void ReportFolder::add(const sim::Scenario& s, const sim::ScenarioReport& r, const ReplayRecorder& rec,
                       const std::string& summary, const std::vector<DrawnPath>& extra_paths) {
  const std::string file = s.name + ".html";
  write_report_file(dir_, file, scenario_page(scenario_document(s, r, rec, extra_paths)));
  entries_.push_back({{"name", s.name}, {"ok", r.ok}, {"steps", r.counters.steps}, {"summary", summary}, {"file", file}});
}

void ReportFolder::write_index(const std::string& title) const {
  write_report_file(dir_, "index.html", index_page(title, entries_));
}

}  // namespace kvsim::report
