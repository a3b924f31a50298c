#include "tools/table.h"

#include <algorithm>

#include "tools/json_text.h"

namespace cudapool::tools {

namespace {

// Display width: count UTF-8 code points, not bytes ("–" and "×" are one column each).
std::size_t width(const std::string& s) {
  std::size_t w = 0;
  for (const char c : s) w += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return w;
}

const std::string& cell(const std::vector<std::string>& row, std::size_t i) {
  static const std::string empty;
  return i < row.size() ? row[i] : empty;
}

}  // namespace

std::string Table::to_text() const {
  std::vector<std::size_t> w(header.size(), 0);
  for (std::size_t i = 0; i < header.size(); ++i) w[i] = width(header[i]);
  for (const auto& r : rows)
    for (std::size_t i = 0; i < header.size(); ++i) w[i] = std::max(w[i], width(cell(r, i)));
  auto line = [&](const std::vector<std::string>& r) {
    std::string out;
    for (std::size_t i = 0; i < header.size(); ++i) {
      const std::string& c = cell(r, i);
      std::string pad(w[i] - width(c), ' ');
      if (i) out += "  ";
      out += i == 0 ? c + pad : pad + c;
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(header);
  std::size_t total = 0;
  for (auto x : w) total += x;
  out += std::string(total + 2 * (w.empty() ? 0 : w.size() - 1), '-') + "\n";
  for (const auto& r : rows) out += line(r);
  return out;
}

std::string Table::to_markdown() const {
  auto escape = [](const std::string& s) {
    std::string o;
    for (char c : s) {
      if (c == '|') o += '\\';
      o += c;
    }
    return o;
  };
  std::string out = "|";
  for (const auto& h : header) out += " " + escape(h) + " |";
  out += "\n|";
  for (std::size_t i = 0; i < header.size(); ++i) out += i == 0 ? " :--- |" : " ---: |";
  out += "\n";
  for (const auto& r : rows) {
    out += "|";
    for (std::size_t i = 0; i < header.size(); ++i) out += " " + escape(cell(r, i)) + " |";
    out += "\n";
  }
  return out;
}

std::string Table::to_json() const {
  auto list = [](const std::vector<std::string>& row, std::size_t n) {
    std::string o = "[";
    for (std::size_t i = 0; i < n; ++i) o += (i ? ", " : "") + json_string(cell(row, i));
    return o + "]";
  };
  std::string o = "{\n  \"header\": " + list(header, header.size()) + ",\n  \"rows\": [";
  for (std::size_t i = 0; i < rows.size(); ++i)
    o += std::string(i ? ",\n    " : "\n    ") + list(rows[i], header.size());
  return o + "\n  ]\n}\n";
}

}  // namespace cudapool::tools
