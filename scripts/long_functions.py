#!/usr/bin/env python3
"""Lists the C++ function bodies longer than a limit.

A function's length is the number of lines from the line holding the opening brace of its body to
the line holding the closing brace, both included. Every .cpp and .h file under the folders given
is read; functions, member functions (in the class or out of it), constructors and lambdas
assigned at namespace or class scope count, a lambda inside a function counts as part of that
function. Braces in comments, string and character literals (raw strings too) and preprocessor
lines are not counted.

  python3 scripts/long_functions.py                      # allocator config telemetry shim tools
  python3 scripts/long_functions.py tools --max-lines 80

Prints `path:line name length` for each one longer, `line` being the opening brace's; exits 1
when any is found, 0 when none, 2 on a bad argument.
"""

import argparse
import os
import re
import sys

DEFAULT_FOLDERS = ["allocator", "config", "telemetry", "shim", "tools"]
RAW_PREFIXES = ("R", "u8R", "uR", "UR", "LR")


def _skip_quoted(text, i, quote):
    """Index just past the literal that opens with `quote` at i (backslash escapes honoured)."""
    i += 1
    while i < len(text) and text[i] != quote and text[i] != "\n":
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _literal_prefix(text, i):
    """The identifier or number that ends right before i ('' when none)."""
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] in "_'."):
        j -= 1
    return text[j:i]


def _directive_end(text, i):
    """Index of the newline ending the preprocessor line at i (continuations followed)."""
    while True:
        nl = text.find("\n", i)
        if nl < 0:
            return len(text)
        if text[nl - 1] != "\\":
            return nl
        i = nl + 1


def blank_non_code(text):
    """The text with comments, literals' contents and preprocessor lines turned to spaces.

    Newlines are kept, so offsets and line numbers stay those of the original; quotes stay, so
    `extern "C"` still reads as `extern ""`."""
    out = list(text)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    i, n, line_start = 0, len(text), True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            end = _directive_end(text, i)
            blank(i, end)
            i = end
            continue
        if c == "\n":
            line_start = True
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            blank(i, end)
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            blank(i, end)
            i = end
        elif c == '"' and _literal_prefix(text, i) in RAW_PREFIXES:
            open_paren = text.find("(", i)
            delimiter = ")" + text[i + 1 : open_paren] + '"'
            end = text.find(delimiter, open_paren)
            end = n if end < 0 else end + len(delimiter)
            blank(i + 1, end - 1)
            i = end
        elif c == '"':
            end = _skip_quoted(text, i, '"')
            blank(i + 1, end - 1)
            i = end
        elif c == "'" and not _literal_prefix(text, i)[:1].isdigit():  # 1'000 is a number
            end = _skip_quoted(text, i, "'")
            blank(i + 1, end - 1)
            i = end
        else:
            i += 1
    return "".join(out)


def matching(text, i, open_char, close_char):
    """Index of the bracket closing the one at i."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_char:
            depth += 1
        elif text[j] == close_char:
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


def collapse(statement):
    """The statement with each top-level (...) made () and each {...} made {}."""
    out, i = [], 0
    while i < len(statement):
        c = statement[i]
        if c in "({":
            close = ")" if c == "(" else "}"
            i = matching(statement, i, c, close)
            out.append(c + close)
        else:
            out.append(c)
        i += 1
    return re.sub(r"\s+", " ", "".join(out)).strip()


NOT_NAMES = {"alignas", "alignof", "decltype", "noexcept", "requires", "sizeof", "static_assert",
             "__attribute__", "__declspec", "explicit", "operator"}
# What may follow a function's parameter list before its body.
TRAILER = re.compile(r"(\s*(const|volatile|noexcept|override|final|mutable|&&?|try|\(\)|"
                     r"->[^;{}=]*|requires\b[^;{}]*))*\s*")
# A constructor's parameter list, then `: member(...), member{...}`.
INIT_LIST = re.compile(r"\(\)\s*((noexcept|try)\s*(\(\))?\s*)*(?<!:):(?!:)[^;]*(\(\)|\{\})\s*$")
# `name = [captures](parameters) specifiers` (a lambda held in a variable).
LAMBDA = re.compile(r"(~?\w+)\s*=\s*\[[^\[\]]*\]\s*(\(\))?[^;{}()=]*$")
NAME = re.compile(r"((?:\w+\s*(?:<[^<>]*>)?\s*::\s*)*)"
                  r"(operator\s*(?:\(\)|\[\]|[^\s\w(]+|\s+[\w:]+[\s*&]*)|~?[A-Za-z_]\w*)\s*\(\)")


def function_name(statement):
    """The name of the function whose body the statement opens, or None when it opens none."""
    lambda_var = LAMBDA.search(statement)
    if lambda_var:
        return lambda_var.group(1)
    if "()" not in statement:
        return None
    tail = statement[statement.rfind(")") + 1 :]
    if not TRAILER.fullmatch(tail) and not INIT_LIST.search(statement):
        return None
    for m in NAME.finditer(statement):
        name = re.sub(r"\s+", "", m.group(1)) + re.sub(r"\s+(?=\W)|(?<=\W)\s+", "", m.group(2))
        if m.group(2) not in NOT_NAMES:
            return name
    return None


def opens_scope(statement):
    """True when the statement opens a namespace, a linkage block or a class/struct/union/enum."""
    return bool(re.match(r"((inline\s+)?namespace\b|extern\s*\"\s*\"\s*$)", statement)
                or re.search(r"\b(class|struct|union|enum)\b", statement))


def long_functions(text, max_lines):
    """(line, name, length) of each function body in the text longer than max_lines."""
    code = blank_non_code(text)
    found, i, start = [], 0, 0
    while i < len(code):
        c = code[i]
        if c in ";}":
            start = i + 1
        elif c == "(":
            i = matching(code, i, "(", ")")
        elif c == "{":
            statement = re.sub(r"^((public|private|protected)\s*:(?!:)\s*)+", "", collapse(code[start:i]))
            name = function_name(statement)
            if name is None and opens_scope(statement):
                start = i + 1
            else:
                end = matching(code, i, "{", "}")
                if name is not None:
                    first, last = code.count("\n", 0, i) + 1, code.count("\n", 0, end) + 1
                    if last - first + 1 > max_lines:
                        found.append((first, name, last - first + 1))
                    start = end + 1
                i = end
        i += 1
    return found


def source_files(folders):
    for folder in folders:
        if os.path.isfile(folder):
            yield folder
            continue
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            for f in sorted(files):
                if f.endswith((".cpp", ".h")):
                    yield os.path.join(root, f)


def main(argv):
    parser = argparse.ArgumentParser(description="List C++ function bodies longer than a limit.")
    parser.add_argument("folders", nargs="*", default=DEFAULT_FOLDERS,
                        help="folders (or files) to read; default: " + " ".join(DEFAULT_FOLDERS))
    parser.add_argument("-n", "--max-lines", type=int, default=60,
                        help="longest body allowed, in lines (default 60)")
    args = parser.parse_args(argv)
    missing = [f for f in args.folders if not os.path.exists(f)]
    if missing:
        parser.error("no such folder: " + ", ".join(missing))
    any_found = False
    for path in source_files(args.folders):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for line, name, length in long_functions(text, args.max_lines):
            print(f"{path}:{line} {name} {length}")
            any_found = True
    return 1 if any_found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
