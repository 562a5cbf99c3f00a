// Zip archives built record by record, and the hostile dump archives of
// issue 28: files whose records torch reads are not the ones a check
// reading the zip naively would look at (a name differing only in case, a
// ZIP64 end record naming another directory, two records of one name, a
// local header naming another record). Torch-free: the seed tool writes
// them into corpus/dump_archive/, and the unit and command-line tests
// build them to check that the loader and check-dump refuse each one.
//
//   const auto records = kvcheck::fuzz::read_zip_records(dump_file_bytes);
//   for (const auto& hostile : kvcheck::fuzz::hostile_archives(records)) write(hostile.name, hostile.bytes);
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kvcheck::fuzz {

// One stored record: the name in the directory, and the name in its local
// header (the same unless a test makes them differ).
struct ZipRecord {
    std::string name;
    std::string bytes;
    std::string local_name;  // empty: `name`
};

// An archive: the records one after another from byte 0, a classic
// directory listing `directory` (indexes into `records`; all, in order,
// when empty), and when `zip64` a ZIP64 end record and locator naming
// `zip64_directory` (written after the classic one; the classic directory
// itself when empty).
struct ZipLayout {
    std::vector<ZipRecord> records;
    std::vector<std::size_t> directory;
    bool zip64 = false;
    std::vector<std::size_t> zip64_directory;
};

std::string write_zip(const ZipLayout& layout);

// The records of an archive as its classic directory lists them, with no
// checks at all: for taking a real dump apart to build test files.
std::vector<ZipRecord> read_zip_records(const std::string& archive);

// Pickles torch must never unpickle: 200,000 nested one-element tuples
// (overflows the stack when freed) and a call of a global no dump names.
std::string deep_tuple_pickle();
std::string unknown_global_pickle();

struct HostileArchive {
    std::string name;   // a file name: "case-variant-deep-tuple.pt"
    std::string bytes;
    std::string fault;  // a part of the refusal that names the fault
};

// Each hostile shape, built around the records of a real dump (`dump`,
// with an "archive/data.pkl" record): the real pickle is what a naive
// check reads, the hostile pickle what torch reads.
std::vector<HostileArchive> hostile_archives(const std::vector<ZipRecord>& dump);

}  // namespace kvcheck::fuzz
