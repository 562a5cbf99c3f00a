// Text that came from outside kvcheck (an engine's messages and output, a
// file's lines, an adapter's name), made safe for where it goes: a
// terminal, a JSON or XML report, a shell command line, a file name.
//
// Engines may say anything: control bytes, ANSI escapes, bytes that are not
// UTF-8. Each function here keeps every byte visible (a byte that cannot go
// through as it is becomes the four characters \xNN) and never produces
// text its destination rejects.
//
//   std::cerr << printable(error_text, 300);   // one line, at most ~300 bytes
//   out << "\"message\": " << json_string(message);
#pragma once

#include <cstddef>
#include <string>

namespace kvcheck::cli {

// The length of the valid UTF-8 sequence starting at `at` (1 to 4), or 0
// when the bytes there are not one (a stray continuation byte, an overlong
// form, a surrogate, a code point past U+10FFFF, a sequence cut short).
std::size_t utf8_sequence_length(const std::string& text, std::size_t at);

// For a terminal: control bytes (all of them, newlines and tabs too, unless
// `keep_newlines`), DEL and bytes that are not UTF-8 as \xNN; the C1
// controls and the bidirectional controls (U+202E, which would reorder what
// follows it on the line) as \u{NNNN}. Longer than
// `bytes_max` input bytes: cut there, with a note of how much was left out.
std::string printable(const std::string& text, std::size_t bytes_max = 400, bool keep_newlines = false);

// A JSON string literal, quotes included: valid UTF-8 and valid JSON for any
// input (control characters as \u00NN, bytes that are not UTF-8 as the text
// \xNN).
std::string json_string(const std::string& text);

// XML 1.0 character data, good in element content and in double-quoted
// attributes: markup characters as entities; the characters XML 1.0 cannot
// carry at all (control bytes other than tab and newline, U+FFFE, U+FFFF)
// and bytes that are not UTF-8 as the text \xNN. In an attribute, newlines
// and tabs become character references so that they survive.
std::string xml_text(const std::string& text, bool attribute = false);

// The last `lines_max` lines of `text` (all of it when it has fewer), made
// printable with their newlines, at most `bytes_max` bytes of them.
std::string last_lines(const std::string& text, std::size_t lines_max, std::size_t bytes_max = 2000);

// `word` as one word of a POSIX shell command line: unchanged when it holds
// only characters no shell treats specially, else single-quoted.
std::string shell_word(const std::string& word);

// A name made fit to be part of a file name: characters other than
// [A-Za-z0-9._+-] become '_', and a leading '.' too (no "..", no hidden
// files); never empty. "../../x" gives "_._.._x".
std::string file_name_part(const std::string& name);

// Text on one line of a message between processes and back: backslash,
// newline and tab as \\, \n and \t (an engine's error may span lines; an
// engine's id may hold a tab, where a message splits its fields).
std::string escape_lines(const std::string& text);
std::string unescape_lines(const std::string& text);

// Seconds as the user gave them, shortest form: "30", "0.5", "1e+03".
std::string seconds_text(double seconds);

}  // namespace kvcheck::cli
