// A plain table rendered as aligned text (terminal) or GitHub Markdown. Used by ab, replay, tune.
#pragma once
#include <string>
#include <vector>

namespace cudapool::tools {

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;  // each row as wide as the header (padded if not)

  void add(std::vector<std::string> row) { rows.push_back(std::move(row)); }
  // First column left-aligned, the others right-aligned (they hold numbers).
  std::string to_text() const;
  std::string to_markdown() const;
  // {"header": [...], "rows": [[...], ...]}: the same cells as the text, for scripts.
  std::string to_json() const;
};

}  // namespace cudapool::tools
