#include "text.h"

#include <cstdio>

namespace kvcheck::cli {
namespace {

std::string hex_byte(unsigned char byte) {
    char text[8];
    std::snprintf(text, sizeof text, "\\x%02x", byte);
    return text;
}

unsigned char byte_at(const std::string& text, std::size_t at) { return static_cast<unsigned char>(text[at]); }

// The code point of the valid sequence of `length` bytes at `at`.
unsigned code_point(const std::string& text, std::size_t at, std::size_t length) {
    if (length == 1) return byte_at(text, at);
    unsigned value = byte_at(text, at) & (0x7fu >> length);
    for (std::size_t i = 1; i < length; ++i) value = (value << 6) | (byte_at(text, at + i) & 0x3fu);
    return value;
}

// Characters a terminal acts on though they are valid UTF-8: the C1
// controls (U+009B is a CSI, as ESC [ is) and the bidirectional controls,
// which reorder the text around them (an adapter named "x\u202e..." would
// make the table lie about what follows), and the characters that show as
// nothing at all (a byte-order mark opening a file, U+FEFF, and the
// zero-width spaces and joiners: a message quoting them would look as if
// they were not there).
bool terminal_control(unsigned point) {
    return (point >= 0x80 && point <= 0x9f) || point == 0x061c || (point >= 0x200b && point <= 0x200f) ||
           (point >= 0x202a && point <= 0x202e) || point == 0x2060 || (point >= 0x2066 && point <= 0x2069) ||
           point == 0xfeff;
}

std::string code_point_escape(unsigned point) {
    char text[16];
    std::snprintf(text, sizeof text, "\\u{%04x}", point);
    return text;
}

}  // namespace

std::size_t utf8_sequence_length(const std::string& text, std::size_t at) {
    const unsigned char lead = byte_at(text, at);
    if (lead < 0x80) return 1;
    std::size_t length = 0;
    unsigned low = 0x80;  // the least code point of that length: below it is an overlong form
    if ((lead & 0xe0) == 0xc0) {
        length = 2;
        low = 0x80;
    } else if ((lead & 0xf0) == 0xe0) {
        length = 3;
        low = 0x800;
    } else if ((lead & 0xf8) == 0xf0) {
        length = 4;
        low = 0x10000;
    } else {
        return 0;  // a continuation byte, or 0xf8..0xff
    }
    if (text.size() - at < length) return 0;
    for (std::size_t i = 1; i < length; ++i) {
        if ((byte_at(text, at + i) & 0xc0) != 0x80) return 0;
    }
    const unsigned value = code_point(text, at, length);
    if (value < low || value > 0x10ffff || (value >= 0xd800 && value <= 0xdfff)) return 0;
    return length;
}

std::string printable(const std::string& text, std::size_t bytes_max, bool keep_newlines) {
    std::string out;
    std::size_t at = 0;
    while (at < text.size() && at < bytes_max) {
        const unsigned char c = byte_at(text, at);
        if (c == '\n' && keep_newlines) {
            out += '\n';
            ++at;
            continue;
        }
        if (c < 0x20 || c == 0x7f) {
            out += hex_byte(c);
            ++at;
            continue;
        }
        const std::size_t length = utf8_sequence_length(text, at);
        if (length == 0) {
            out += hex_byte(c);
            ++at;
            continue;
        }
        if (const unsigned point = code_point(text, at, length); terminal_control(point)) {
            out += code_point_escape(point);
            at += length;
            continue;
        }
        out.append(text, at, length);
        at += length;
    }
    if (at < text.size()) out += " ... (" + std::to_string(text.size() - at) + " more bytes)";
    return out;
}

std::string json_string(const std::string& text) {
    std::string out = "\"";
    std::size_t at = 0;
    while (at < text.size()) {
        const unsigned char c = byte_at(text, at);
        switch (c) {
            case '"': out += "\\\""; ++at; continue;
            case '\\': out += "\\\\"; ++at; continue;
            case '\n': out += "\\n"; ++at; continue;
            case '\t': out += "\\t"; ++at; continue;
            case '\r': out += "\\r"; ++at; continue;
            default: break;
        }
        if (c < 0x20 || c == 0x7f) {
            char escaped[8];
            std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
            out += escaped;
            ++at;
            continue;
        }
        const std::size_t length = utf8_sequence_length(text, at);
        if (length == 0) {
            out += "\\\\x" + hex_byte(c).substr(2);  // the text \xNN: JSON has no way to carry the byte
            ++at;
            continue;
        }
        out.append(text, at, length);
        at += length;
    }
    return out + "\"";
}

std::string xml_text(const std::string& text, bool attribute) {
    std::string out;
    std::size_t at = 0;
    while (at < text.size()) {
        const unsigned char c = byte_at(text, at);
        switch (c) {
            case '<': out += "&lt;"; ++at; continue;
            case '>': out += "&gt;"; ++at; continue;
            case '&': out += "&amp;"; ++at; continue;
            case '"': out += "&quot;"; ++at; continue;
            case '\'': out += "&apos;"; ++at; continue;
            case '\n': out += attribute ? "&#10;" : "\n"; ++at; continue;
            case '\t': out += attribute ? "&#9;" : "\t"; ++at; continue;
            default: break;
        }
        if (c < 0x20 || c == 0x7f) {  // not even as a character reference in XML 1.0 (DEL: legal, but unreadable)
            out += hex_byte(c);
            ++at;
            continue;
        }
        const std::size_t length = utf8_sequence_length(text, at);
        const unsigned value = length == 0 ? 0 : code_point(text, at, length);
        if (length == 0 || value == 0xfffe || value == 0xffff) {
            out += hex_byte(c);
            ++at;
            continue;
        }
        out.append(text, at, length);
        at += length;
    }
    return out;
}

std::string last_lines(const std::string& text, std::size_t lines_max, std::size_t bytes_max) {
    std::size_t start = text.size();
    std::size_t lines = 0;
    // A final newline ends the last line; it does not start another.
    std::size_t at = !text.empty() && text.back() == '\n' ? text.size() - 1 : text.size();
    while (at > 0 && lines < lines_max) {
        const std::size_t newline = text.rfind('\n', at - 1);
        start = newline == std::string::npos ? 0 : newline + 1;
        ++lines;
        if (newline == std::string::npos) break;
        at = newline;
    }
    if (text.size() - start > bytes_max) start = text.size() - bytes_max;
    return printable(text.substr(start), bytes_max, true);
}

std::string shell_word(const std::string& word) {
    const auto plain = [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '/' || c == '.' ||
               c == '_' || c == '-' || c == '+' || c == ':' || c == ',' || c == '=' || c == '@' || c == '%';
    };
    bool quote = word.empty();
    for (const char c : word) quote = quote || !plain(c);
    if (!quote) return word;
    std::string out = "'";
    for (const char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

std::string file_name_part(const std::string& name) {
    std::string out;
    for (const char c : name) {
        const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                          c == '_' || c == '-' || c == '+';
        out += keep ? c : '_';
    }
    if (out.empty()) return "_";
    if (out[0] == '.') out[0] = '_';
    return out;
}

std::string seconds_text(double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", seconds);
    return text;
}

std::string escape_lines(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (const char c : text) {
        if (c == '\\') {
            out += "\\\\";
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\t') {
            out += "\\t";
        } else {
            out += c;
        }
    }
    return out;
}

std::string unescape_lines(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '\\' || i + 1 == text.size()) {
            out += text[i];
            continue;
        }
        const char next = text[++i];
        out += next == 'n' ? '\n' : next == 't' ? '\t' : next;
    }
    return out;
}

}  // namespace kvcheck::cli
