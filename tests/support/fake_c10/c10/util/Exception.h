// A stand-in for PyTorch's c10/util/Exception.h, just what python/cudapool/_torch_glue.cpp uses
// (c10::OutOfMemoryError and C10_THROW_ERROR, with PyTorch's names and argument shapes), so the
// glue is compiled and its exception checked without PyTorch (tests/fakecuda/torch_app.cpp,
// tests/python/module_test.py). Header-only: nothing to link.
#pragma once
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

namespace c10 {
struct SourceLocation {
  const char* function;
  const char* file;
  std::uint32_t line;
};
class Error : public std::exception {
 public:
  Error(SourceLocation, std::string msg) : msg_(std::move(msg)) {}
  const char* what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};
class OutOfMemoryError : public Error {
  using Error::Error;
};
}  // namespace c10

#define C10_THROW_ERROR(err_type, msg) \
  throw ::c10::err_type({__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)}, msg)
