// Where results go, checked before a run starts: a run of an hour must not
// end in "cannot write" and lose what it found.
//
//   OutputFile report(options.get("out", ""));  // throws UsageError now, not after the run
//   TraceDir traces("kvcheck-traces");          // the same for the trace directory
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

// The directory failing traces go to: created if need be and checked, by
// writing a file in it, when constructed (UsageError naming the directory
// and the reason otherwise); removed again at the end if this made it and
// nothing was written in it, so a run that finds nothing leaves nothing.
class TraceDir {
  public:
    explicit TraceDir(std::string dir);
    ~TraceDir();
    TraceDir(const TraceDir&) = delete;
    TraceDir& operator=(const TraceDir&) = delete;

  private:
    std::string dir_;
    std::string made_;  // the outermost directory this made, if any
};

}  // namespace kvcheck::cli
