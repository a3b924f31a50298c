// Opening the files the library and the tools read at paths a user names (the policy file, traces,
// summaries, warm-start plans). A path may name anything, and some things block a plain open(2)
// for ever: a FIFO waits for a writer, some devices for a carrier. So every such file is opened
// the same way:
//  * O_NONBLOCK, so that the open itself returns at once whatever the path names;
//  * then fstat of the descriptor (not of the path, which may have changed since), and anything
//    but a regular file is refused: "not a regular file (a FIFO): give the path of a regular file";
//  * then O_NONBLOCK is cleared: reads of the regular file block as usual;
//  * O_CLOEXEC: a program the reader starts never inherits the descriptor.
// A symbolic link is followed: reading through one writes nothing.
// The writers' side is sys/output_file.h, which refuses the same things.
#pragma once
#include <cstddef>
#include <streambuf>
#include <string>

namespace cudapool {

// What a file of mode `mode` (st_mode) is, for messages: "a FIFO", "a directory", "a character
// device", "a block device", "a socket", "a symbolic link", "a regular file", "an unknown kind of
// file".
const char* file_kind(unsigned mode);

// "not a regular file (a FIFO): give the path of a regular file", for a file of mode `mode`.
std::string not_a_regular_file(unsigned mode);

// Opens `path` for reading as above. Returns the descriptor, or -1 with errno set and, when `why`
// is not null, *why set to what is wrong (without the path): errno is open(2)'s and *why its
// strerror, or for a file that is not a regular file errno is EISDIR (a directory) or EINVAL
// (anything else) and *why is not_a_regular_file().
int open_input_file(const std::string& path, std::string* why);

// A std::streambuf over a descriptor open for reading (from its current offset), for the readers
// that parse a std::istream. Closes the descriptor when destroyed. A read error ends the input;
// failed() then says so.
class InputFileBuf final : public std::streambuf {
 public:
  explicit InputFileBuf(int fd) : fd_(fd) {}
  ~InputFileBuf() override;
  InputFileBuf(const InputFileBuf&) = delete;
  InputFileBuf& operator=(const InputFileBuf&) = delete;
  bool failed() const { return error_ != 0; }
  int error() const { return error_; }  // errno of the failed read

 protected:
  int_type underflow() override;

 private:
  int fd_;
  int error_ = 0;
  char buf_[64 * 1024];
};

}  // namespace cudapool
