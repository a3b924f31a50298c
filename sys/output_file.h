// Opening the files the library and the tools write at paths a user names (trace, log, summary,
// the tools' outputs). These paths are often in shared directories such as /tmp and the files
// may hold command lines, so every such file is opened the same careful way:
//  * a symbolic link at the last component of the path is refused (O_NOFOLLOW), never written
//    through: "refusing to write through a symbolic link";
//  * O_CLOEXEC: a program the writer starts never inherits the descriptor;
//  * O_NONBLOCK while opening, so that nothing at the path can block the open (a FIFO waits for
//    a reader, some devices for a carrier); anything but a regular file is then refused: "not a
//    regular file (a FIFO): give the path of a regular file";
//  * a file is created new (O_CREAT | O_EXCL) where none is; an existing file is opened without
//    truncating it, checked, and only then emptied (O_TRUNC) or appended to. One that another
//    user owns is never written, whatever its mode: "owned by uid N, ...: remove it or choose
//    another path" (in a shared directory another user may have made it, and could read it);
//  * a file created here has mode 0600 (owner only; the umask may only narrow it);
//  * a file replaced as a whole is written to a temporary file made with mkostemp (an
//    unpredictable name, created exclusively) in the same directory, then renamed over the path.
// All of it is plain open/write/rename/close: safe from an atexit handler.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace cudapool {

// The mode of every file created by open_output_file and write_file_atomically.
inline constexpr unsigned kOutputFileMode = 0600;

// Opens `path` for writing, as above: O_WRONLY | O_NOFOLLOW | O_CLOEXEC, created new or an
// existing regular file of this process's effective user, then `flags` applied (O_TRUNC: emptied;
// O_APPEND). The descriptor returned does blocking writes. Else -1 with *error set to "cannot open
// <what> 'PATH': WHY" (WHY is "refusing to write through a symbolic link" for a link at PATH,
// not_a_regular_file() for a FIFO, a device or a directory, foreign_owner() for another user's
// file).
int open_output_file(const std::string& path, int flags, std::string_view what, std::string* error);

// Writes `data` to `path` as a whole: a temporary file beside it, then rename, so a reader never
// sees half a file. What is at `path` is refused (left as it is) when it is a symbolic link, not a
// regular file, or another user's file: rename would replace it, taking over a name another user
// chose (or fail at the end in a sticky directory). Returns "" or why not.
std::string write_file_atomically(const std::string& path, std::string_view data, std::string_view what);

// "owned by uid 65534, not by this process's user (uid 1000): remove it or choose another path".
std::string foreign_owner(unsigned owner);

// write(2) until everything is written (retrying EINTR and short writes). false on an error
// (errno set).
bool write_all_fd(int fd, const char* data, std::size_t size);
// The same at `offset` with pwrite(2) (the descriptor's file offset does not move).
bool write_all_at(int fd, const void* data, std::size_t size, std::size_t offset);

}  // namespace cudapool
