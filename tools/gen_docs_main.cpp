// cudapool-gen-docs ROOT: writes the policy-key tables made from the key table (config/keys.def)
// into ROOT/README.md (the short table) and ROOT/docs/policy.md (every key, every column), between
// their <!-- keys:begin --> and <!-- keys:end --> lines. `make docs` runs it; the test
// Docs.KeyTablesMatchTheCode fails while either file differs from what it would write.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "config/keys.h"
#include "sys/output_file.h"

namespace {

// 0 = written or already current, 1 = unreadable, unwritable or without the markers.
int update(const std::string& path, const std::string& table) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cudapool-gen-docs: cannot read %s\n", path.c_str());
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const auto next = cudapool::config::with_key_table(doc, table);
  if (!next) {
    std::fprintf(stderr,
                 "cudapool-gen-docs: %s needs one '<!-- keys:begin -->' line and a later "
                 "'<!-- keys:end -->'\n",
                 path.c_str());
    return 1;
  }
  if (*next == doc) {
    std::printf("%s: current\n", path.c_str());
    return 0;
  }
  std::string why;
  const int fd = cudapool::open_output_file(path, O_TRUNC, "document", &why);
  if (fd < 0) {
    std::fprintf(stderr, "cudapool-gen-docs: %s\n", why.c_str());
    return 1;
  }
  const bool wrote = cudapool::write_all_fd(fd, next->data(), next->size());
  if (::close(fd) != 0 || !wrote) {
    std::fprintf(stderr, "cudapool-gen-docs: cannot write %s\n", path.c_str());
    return 1;
  }
  std::printf("%s: key table updated\n", path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: cudapool-gen-docs REPOSITORY_ROOT\n");
    return 2;
  }
  const std::string root = argv[1];
  int rc = update(root + "/README.md", cudapool::config::key_table_markdown_brief());
  rc |= update(root + "/docs/policy.md", cudapool::config::key_table_markdown());
  return rc;
}
