// The compiled parts of spdlog and fmt, built once here. Every other translation unit includes
// their headers as declarations only (SPDLOG_COMPILED_LIB, no FMT_HEADER_ONLY: see the Makefile),
// instead of compiling both libraries again in each file that logs.
//
// Debian ships spdlog and fmt as shared libraries only; libcudapool.so must carry its C++
// dependencies inside it, hidden (it is preloaded into programs that may bring their own fmt or
// spdlog of another version), so the shim cannot link those. This file gives it, and the
// programs, the same code from the same Debian headers; the telemetry archive carries it and
// --exclude-libs hides it in the shim.
#ifndef SPDLOG_COMPILED_LIB
#error "build with -DSPDLOG_COMPILED_LIB (the Makefile's CPPFLAGS)"
#endif
#ifdef FMT_HEADER_ONLY
#error "build without -DFMT_HEADER_ONLY (the Makefile's CPPFLAGS)"
#endif

// fmt: the non-template functions and the explicit instantiations its headers declare extern.
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {
template FMT_API auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;
#ifndef FMT_STATIC_THOUSANDS_SEPARATOR
template FMT_API locale_ref::locale_ref(const std::locale& loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;
#endif
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API void buffer<char>::append(const char*, const char*);
template FMT_API void vformat_to(buffer<char>&, string_view, basic_format_args<FMT_BUFFER_CONTEXT(char)>, locale_ref);
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;
template FMT_API void buffer<wchar_t>::append(const wchar_t*, const wchar_t*);
}  // namespace detail
FMT_END_NAMESPACE

// spdlog: the core (its registry brings the periodic flusher and the colour console sink of the
// default logger), and base_sink under telemetry/logging.cpp's own sink.
#include <spdlog/common-inl.h>
#include <spdlog/details/backtracer-inl.h>
#include <spdlog/details/log_msg-inl.h>
#include <spdlog/details/log_msg_buffer-inl.h>
#include <spdlog/details/os-inl.h>
#include <spdlog/details/periodic_worker-inl.h>
#include <spdlog/details/registry-inl.h>
#include <spdlog/logger-inl.h>
#include <spdlog/pattern_formatter-inl.h>
#include <spdlog/sinks/ansicolor_sink-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/sink-inl.h>
#include <spdlog/sinks/stdout_sinks-inl.h>
#include <spdlog/spdlog-inl.h>

#include <spdlog/details/console_globals.h>
#include <spdlog/details/null_mutex.h>

#include <mutex>

template class spdlog::sinks::base_sink<std::mutex>;
template class spdlog::sinks::base_sink<std::timed_mutex>;  // telemetry/logging.cpp's sink
template class spdlog::sinks::base_sink<spdlog::details::null_mutex>;
template class spdlog::sinks::stdout_sink_base<spdlog::details::console_mutex>;
template class spdlog::sinks::stderr_sink<spdlog::details::console_mutex>;
template class spdlog::sinks::ansicolor_sink<spdlog::details::console_mutex>;
template class spdlog::sinks::ansicolor_stdout_sink<spdlog::details::console_mutex>;
template class spdlog::sinks::ansicolor_stderr_sink<spdlog::details::console_mutex>;
