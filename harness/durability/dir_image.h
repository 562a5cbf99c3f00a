// A directory tree held in memory: the bytes of every regular file and
// every subdirectory, by path relative to the root ("a", "sub/b"). The
// durability checks read one before and after a dump, construct others
// (the states a power cut may leave) and write them out to be loaded.
//
//   DirImage before = read_image(dir);
//   write_image(scratch, before);   // scratch now holds exactly what dir held
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kvcheck::durability {

struct DirImage {
    // nullopt: a directory; otherwise a regular file's bytes. Parents come
    // before their children (map order), and every parent is listed.
    std::map<std::string, std::optional<std::string>> entries;

    bool operator==(const DirImage& other) const { return entries == other.entries; }
    bool operator!=(const DirImage& other) const { return !(*this == other); }
    std::vector<std::string> names() const;  // every path, in order
};

// An empty image for a missing directory. Throws std::runtime_error for
// what an image cannot hold (a symbolic link, a device, a socket) and for
// a file it cannot read.
DirImage read_image(const std::string& dir);

// Makes `dir` hold exactly `image`: what it held before is removed first.
// Nothing is flushed: these are the harness's scratch copies.
void write_image(const std::string& dir, const DirImage& image);

// Removes `dir` and everything in it; a missing one is fine.
void remove_tree(const std::string& dir);

// "a" (3 bytes), "sub/" ...: one line for a report.
std::string describe(const DirImage& image);

}  // namespace kvcheck::durability
