// The escaping of text.h: whatever bytes an engine says, each format gets
// text it accepts, with every byte still visible.
#include "text.h"

#include <gtest/gtest.h>

namespace {

using namespace kvcheck::cli;

// Quotes, markup, control bytes, DEL, an ANSI escape, and bytes that are not
// UTF-8: a stray continuation byte, 0xff, an overlong '/', an encoded
// surrogate, a sequence cut short at the end.
const char hostile_bytes[] = "\"q\" <a b='c'> & \\ \x01\t\n\x1b[31m\x7f \x80\xff \xc0\xaf \xed\xa0\x80 caf\xc3\xa9 \xe2\x82";
const std::string hostile(hostile_bytes, sizeof hostile_bytes - 1);

TEST(Text, Utf8SequencesAreValidatedStrictly) {
    EXPECT_EQ(utf8_sequence_length("a", 0), 1u);
    EXPECT_EQ(utf8_sequence_length("\xc3\xa9", 0), 2u);              // é
    EXPECT_EQ(utf8_sequence_length("\xe2\x82\xac", 0), 3u);          // €
    EXPECT_EQ(utf8_sequence_length("\xf0\x9f\x98\x80", 0), 4u);      // U+1F600
    EXPECT_EQ(utf8_sequence_length("\x80", 0), 0u);                  // continuation byte
    EXPECT_EQ(utf8_sequence_length("\xc0\xaf", 0), 0u);              // overlong '/'
    EXPECT_EQ(utf8_sequence_length("\xe0\x80\xaf", 0), 0u);          // overlong '/'
    EXPECT_EQ(utf8_sequence_length("\xed\xa0\x80", 0), 0u);          // surrogate U+D800
    EXPECT_EQ(utf8_sequence_length("\xf4\x90\x80\x80", 0), 0u);      // past U+10FFFF
    EXPECT_EQ(utf8_sequence_length("\xe2\x82", 0), 0u);              // cut short
    EXPECT_EQ(utf8_sequence_length("\xff", 0), 0u);
}

TEST(Text, PrintableShowsEveryByteAndCutsLongText) {
    EXPECT_EQ(printable(hostile),
              "\"q\" <a b='c'> & \\ \\x01\\x09\\x0a\\x1b[31m\\x7f \\x80\\xff \\xc0\\xaf \\xed\\xa0\\x80 caf\xc3\xa9 \\xe2\\x82");
    EXPECT_EQ(printable("a\nb", 400, true), "a\nb");
    EXPECT_EQ(printable(std::string(1000, 'x'), 10), "xxxxxxxxxx ... (990 more bytes)");
}

// Issue 28: valid UTF-8 a terminal still acts on. A name holding U+202E
// (right-to-left override) would reorder the rest of its table row; U+009B
// is a CSI, as ESC [ is. Other characters (here U+00E9, U+2028) pass.
TEST(Text, PrintableEscapesBidiAndC1Controls) {
    EXPECT_EQ(printable("evil\xe2\x80\xaetxt.exe"), "evil\\u{202e}txt.exe");
    EXPECT_EQ(printable("\xe2\x81\xa6x\xe2\x81\xa9 \xe2\x80\x8f \xd8\x9c"), "\\u{2066}x\\u{2069} \\u{200f} \\u{061c}");
    EXPECT_EQ(printable("\xc2\x9b" "2J"), "\\u{009b}2J");
    EXPECT_EQ(printable("caf\xc3\xa9 \xe2\x80\xa8"), "caf\xc3\xa9 \xe2\x80\xa8");
    EXPECT_EQ(last_lines("x\xe2\x80\xae\ny\n", 1), "y\n");
    EXPECT_EQ(last_lines("x\xe2\x80\xae\n", 1), "x\\u{202e}\n");
}

TEST(Text, JsonStringsAreValidJsonAndValidUtf8) {
    EXPECT_EQ(json_string(hostile),
              "\"\\\"q\\\" <a b='c'> & \\\\ \\u0001\\t\\n\\u001b[31m\\u007f \\\\x80\\\\xff \\\\xc0\\\\xaf \\\\xed\\\\xa0\\\\x80 "
              "caf\xc3\xa9 \\\\xe2\\\\x82\"");
    EXPECT_EQ(json_string(""), "\"\"");
}

TEST(Text, XmlTextHoldsOnlyWhatXml10Allows) {
    EXPECT_EQ(xml_text(hostile), "&quot;q&quot; &lt;a b=&apos;c&apos;&gt; &amp; \\ \\x01\t\n\\x1b[31m\\x7f \\x80\\xff "
                                 "\\xc0\\xaf \\xed\\xa0\\x80 caf\xc3\xa9 \\xe2\\x82");
    EXPECT_EQ(xml_text("a\tb\nc", true), "a&#9;b&#10;c");
    EXPECT_EQ(xml_text("\xef\xbf\xbe"), "\\xef\\xbf\\xbe");  // U+FFFE: UTF-8, but no XML character
}

TEST(Text, ShellWordsAndFileNamesAreSafe) {
    EXPECT_EQ(shell_word("kvcheck-traces/M3-single-copy.trace"), "kvcheck-traces/M3-single-copy.trace");
    EXPECT_EQ(shell_word("my traces/it's.trace"), "'my traces/it'\\''s.trace'");
    EXPECT_EQ(shell_word(""), "''");
    EXPECT_EQ(shell_word("$(rm -rf x)"), "'$(rm -rf x)'");
    EXPECT_EQ(file_name_part("../../x"), "_._.._x");
    EXPECT_EQ(file_name_part("engine v2/€"), "engine_v2____");
    EXPECT_EQ(file_name_part(""), "_");
    EXPECT_EQ(file_name_part(".hidden"), "_hidden");
    EXPECT_EQ(file_name_part("reference"), "reference");
}

TEST(Text, LastLinesKeepsTheEnd) {
    EXPECT_EQ(last_lines("a\nb\nc\nd\n", 2), "c\nd\n");
    EXPECT_EQ(last_lines("a\nb", 5), "a\nb");
    EXPECT_EQ(last_lines("", 3), "");
    EXPECT_EQ(last_lines(std::string(5000, 'x'), 3, 10), "xxxxxxxxxx");
}

}  // namespace
