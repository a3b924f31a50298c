// Text read from outside the process (a trace, a stats record, a file name, a command line
// another process published) made safe to print on a terminal: a byte that is not printable
// ASCII or part of printable UTF-8 becomes "\xHH". Escape sequences therefore reach the terminal
// as visible text, never as commands (changing the title, clearing the screen, moving the cursor,
// rewriting what was printed before). Control characters, DEL, malformed UTF-8, the C1 controls
// (U+0080-U+009F, which some terminals obey as CSI and friends), line and paragraph separators
// and the bidirectional overrides (which reorder what is displayed) are escaped; everything else
// passes unchanged.
#pragma once
#include <string>
#include <string_view>

namespace cudapool {

std::string printable(std::string_view text);

}  // namespace cudapool
