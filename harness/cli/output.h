// Where results go, checked before a run starts: a run of an hour must not
// end in "cannot write" and lose what it found. And the files kvcheck reads
// (trace files, dumps), refused unless they are regular files.
//
//   OutputFile report(options.get("out", ""));  // throws UsageError now, not after the run
//   TraceDir traces("kvcheck-traces");          // the same for the trace directory
//   ... the run ...
//   report.write(text);                          // standard output when no path was given
//   if (!standard_output_written()) return 2;    // a full disk said so, not exit 0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvcheck::cli {

class OutputFile {
  public:
    // Checks now that `path` can be written (nothing is created yet), or
    // standard output when `path` is empty. Throws UsageError naming the
    // path and the reason when it cannot be written. A regular file (or a
    // path where none is yet) is written whole to a temporary file beside
    // it, then renamed over it: a kvcheck killed before write() leaves the
    // path as it was. A device or a pipe is written in place. `option`
    // names the option the path came from in the errors.
    explicit OutputFile(std::string path, const std::string& option = "--out");
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
    std::string target_;     // the file replaced (a symbolic link's target)
    int fd_ = -1;            // a device or a pipe, written in place
};

// The directory failing traces go to: created if need be and checked, by
// writing a file in it, when constructed (UsageError naming the directory
// and the reason otherwise); removed again at the end if this made it and
// nothing was written in it, so a run that finds nothing leaves nothing.
//
// Runs sharing the directory at the same time (two terminals, pytest
// workers) never write one another's trace files: the first holds the
// directory locked (flock) until it ends, and one that finds it locked
// puts name_suffix() (".run-<pid>") before ".trace" in each of its names.
class TraceDir {
  public:
    explicit TraceDir(std::string dir);
    ~TraceDir();
    TraceDir(const TraceDir&) = delete;
    TraceDir& operator=(const TraceDir&) = delete;

    const std::string& name_suffix() const { return suffix_; }

  private:
    std::string dir_;
    std::string made_;  // the outermost directory this made, if any
    int lock_fd_ = -1;   // the directory, locked while this run uses it
    std::string suffix_;  // "" when this run holds the lock
};

// Replaces `path` with a file holding `text`, whole or not at all: written
// to a temporary file beside it (".<name>.kvcheck-<pid>.tmp"), synced,
// then renamed over it; the temporary file is removed on failure. Returns
// 0, or the errno of what failed (a full disk leaves no empty file).
int replace_file(const std::string& path, const std::string& text);

// A file to read, opened only if it is a regular file: opened with
// O_NONBLOCK (a FIFO with no writer blocks a plain open() for reading
// forever), then examined with fstat on the descriptor, so what is read is
// what was examined. Anything else (a FIFO, a directory, a device, a
// socket) is closed again and refused, with the reason in problem().
//
//   const InputFile file(path);
//   if (file.fd() < 0) throw UsageError(path + " " + file.problem());  // "... is a FIFO, not a regular file"
class InputFile {
  public:
    explicit InputFile(const std::string& path);
    ~InputFile();
    InputFile(const InputFile&) = delete;
    InputFile& operator=(const InputFile&) = delete;

    int fd() const { return fd_; }  // -1 when refused
    std::uint64_t bytes() const { return bytes_; }
    // Why it was refused, as a predicate of its path: "cannot be opened:
    // No such file or directory", "is a FIFO, not a regular file".
    const std::string& problem() const { return problem_; }
    // Up to bytes_max + 1 bytes from the current offset (one more than
    // the bound tells a file over it); false on a read error (errno).
    bool read(std::size_t bytes_max, std::string* text) const;
    bool read(std::size_t bytes_max, std::vector<char>* bytes) const;

  private:
    int fd_ = -1;
    std::uint64_t bytes_ = 0;
    std::string problem_;
};

// Flushes standard output and says whether all that was written to it
// went through; when not (a full disk, a closed pipe), says so on stderr.
// kvcheck's commands end with it: a report that was lost is no exit 0.
bool standard_output_written();

}  // namespace kvcheck::cli
