// Running the kvcheck binary as a user does, for the command-line tests.
// Every run gets TMPDIR = kvcheck_tmp(), a directory of this test binary's
// own: the fixture `Cli` checks after each test that kvcheck left nothing
// in it (no job directories, no dumps, no temporary files). Scratch files
// live under one directory, removed when the test binary exits.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvtest::cli {

struct Outcome {
    int status = -1;          // the exit status; 128 + N when killed by signal N
    std::string out;          // standard output and standard error, in that order
    std::string stdout_text;  // standard output alone
    std::string stderr_text;  // standard error alone
};

// `arguments` is a shell fragment after the binary's path. Standard output
// goes to `stdout_path` when one is given (then stdout_text is empty).
Outcome kvcheck(const std::string& arguments, const std::string& stdout_path = "");

// A path under this test binary's scratch directory.
std::string scratch(const std::string& name);
// The TMPDIR every kvcheck run gets.
std::string kvcheck_tmp();

bool contains(const std::string& text, const std::string& part);
// The first line of `text` that starts with `start` (without its newline);
// "" when none does.
std::string line_starting(const std::string& text, const std::string& start);
std::string read_file(const std::string& path);
// The decimal number that ends just before `marker` in `text`; 0 when the
// marker is missing or has no number before it. (No <regex>: g++ 12 warns
// inside it under -O1 with sanitizers, and warnings are errors.)
unsigned long number_before(const std::string& text, const std::string& marker);
void write_file(const std::string& path, const std::string& text);
std::vector<std::string> entries(const std::string& dir);
// A trace of `count` adds, of ids a<first> on.
std::string adds(std::size_t count, std::size_t first = 0);
// Is `program` on the PATH (or an executable path)?
bool have(const std::string& program);
// The --adapter option of the torch-free fault adapter of
// python/adapter_tests (fault_adapter.py), doing `fault` (and any options
// after it).
std::string fault_adapter(const std::string& fault);

// The fixture of the command-line tests: kvcheck_tmp() is empty after each.
class Cli : public ::testing::Test {
  protected:
    void SetUp() override;
    void TearDown() override;
};

}  // namespace kvtest::cli
