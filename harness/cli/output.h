// Where results go, checked before a run starts: a run of an hour must not
// end in "cannot write" and lose what it found.
//
//   OutputFile report(options.get("out", ""));  // throws UsageError now, not after the run
//   prepare_trace_dir("kvcheck-traces");        // the same for the trace directory
//   ... the run ...
//   report.write(text);                          // standard output when no path was given
#pragma once

#include <string>

namespace kvcheck::cli {

class OutputFile {
  public:
    // Opens `path` for writing now (created if missing, not yet truncated),
    // or standard output when `path` is empty. Throws UsageError naming the
    // path and the reason when it cannot be written.
    explicit OutputFile(std::string path);
    ~OutputFile();
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;

    // Replaces the file's content with `text` (or prints it). When the file
    // cannot take it after all (a full disk), the text goes to standard
    // output with a note on stderr, and write returns false: the results are
    // never lost.
    bool write(const std::string& text);
    const std::string& path() const { return path_; }

  private:
    std::string path_;
    int fd_ = -1;
};

// Creates `dir` if need be and checks that a file can be written in it;
// throws UsageError naming the directory and the reason otherwise.
void prepare_trace_dir(const std::string& dir);

}  // namespace kvcheck::cli
