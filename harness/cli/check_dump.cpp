// kvcheck check-dump: a dump file validated with the reference's strict
// loader (kv::decode_dump: which records torch will read, decided as torch
// decides, an ambiguous archive refused (kv/archive.h); the CRCs; the
// structure of the pickle torch will unpickle; every field), and what it
// holds.
// Exit codes: 0 valid, 1 invalid (the first fault named), 2 unreadable (or
// a usage error); of several files, each checked in turn, the worst.
#include "adapters.h"
#include "commands.h"
#include "output.h"
#include "text.h"

#include "kv/store.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>

namespace kvcheck::cli {
namespace {

namespace fs = std::filesystem;

// What check-dump says of one item.
struct ItemSummary {
    std::string id;
    std::string layout;
    std::set<std::string> dtypes;
    std::int64_t layers = 0;
    std::vector<std::int64_t> tokens;  // per layer: what a model sees (0 for an uninitialized or empty layer)
    std::int64_t uninitialized = 0;
    kv::Metadata metadata;
};

std::string dtype_name(const at::Tensor& t) {
    switch (t.scalar_type()) {
        case at::kFloat: return "float32";
        case at::kHalf: return "float16";
        case at::kBFloat16: return "bfloat16";
        default: return c10::toString(t.scalar_type());
    }
}

ItemSummary summarize(const kv::Item& item) {
    ItemSummary summary;
    const kv::Cache& cache = *item.cache;
    summary.id = item.id;
    summary.layout = kv::layout_name(cache.layout());
    summary.layers = cache.layer_count();
    summary.metadata = item.metadata;
    const auto note_dtype = [&summary](const at::Tensor& t) {
        if (t.defined()) summary.dtypes.insert(dtype_name(t));
    };
    if (cache.layout() == kv::Layout::legacy) {
        for (const at::Tensor& t : *cache.key_cache()) note_dtype(t);
        for (const at::Tensor& t : *cache.value_cache()) note_dtype(t);
    } else {
        for (const kv::LayerPtr& layer : *cache.layers()) {
            for (const at::Tensor* t : {&layer->keys, &layer->values, &layer->key_cache, &layer->value_cache}) note_dtype(*t);
            summary.uninitialized += layer->is_initialized ? 0 : 1;
        }
    }
    for (std::int64_t i = 0; i < summary.layers; ++i) {
        const at::Tensor keys = kv::logical_keys(cache, i);
        summary.tokens.push_back(keys.defined() && keys.numel() > 0 ? keys.size(-2) : 0);
    }
    return summary;
}

std::string joined(const std::vector<std::int64_t>& numbers) {
    std::string out;
    for (const std::int64_t n : numbers) out += (out.empty() ? "" : ",") + std::to_string(n);
    return out.empty() ? "-" : out;
}

std::string joined(const std::set<std::string>& names) {
    std::string out;
    for (const std::string& name : names) out += (out.empty() ? "" : ",") + name;
    return out.empty() ? "-" : out;
}

std::string pad(std::string text, std::size_t width) {
    if (text.size() < width) text.append(width - text.size(), ' ');
    return text;
}

void print_table(const std::string& file, std::uint64_t bytes, const std::vector<ItemSummary>& items) {
    std::cout << printable(file, 400) << ": a valid kvcheck dump (format version " << kv::dump_format_version << "), "
              << items.size() << " item" << (items.size() == 1 ? "" : "s") << ", " << bytes << " bytes\n";
    if (items.empty()) return;
    // One row of cells per item, under a header; each column as wide as
    // its widest cell.
    std::vector<std::vector<std::string>> rows = {{"id", "layout", "dtypes", "layers", "tokens per layer", "metadata"}};
    for (const ItemSummary& item : items) {
        std::string metadata;
        for (const auto& [key, value] : item.metadata) {
            metadata += (metadata.empty() ? "" : " ") + printable(key, 60) + "=" + printable(value, 60);
        }
        std::string tokens = joined(item.tokens);
        if (item.uninitialized > 0) tokens += " (" + std::to_string(item.uninitialized) + " uninitialized)";
        rows.push_back({printable(item.id, 60), item.layout, joined(item.dtypes), std::to_string(item.layers), tokens, metadata});
    }
    std::vector<std::size_t> widths(rows.front().size(), 0);
    for (const auto& row : rows) {
        for (std::size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
    }
    std::cout << "\n";
    for (const auto& row : rows) {
        std::string line;
        for (std::size_t i = 0; i < row.size(); ++i) line += i + 1 < row.size() ? pad(row[i], widths[i] + 2) : row[i];
        std::cout << line.substr(0, line.find_last_not_of(' ') + 1) << "\n";
    }
}

void print_json(const std::string& file, std::uint64_t bytes, const std::vector<ItemSummary>& items) {
    std::ostringstream out;
    out << "{\"file\": " << json_string(file) << ", \"valid\": true, \"format_version\": " << kv::dump_format_version
        << ", \"bytes\": " << bytes << ", \"items\": [";
    for (std::size_t i = 0; i < items.size(); ++i) {
        const ItemSummary& item = items[i];
        std::string dtypes;
        for (const std::string& dtype : item.dtypes) dtypes += (dtypes.empty() ? "" : ", ") + json_string(dtype);
        std::string metadata;
        for (const auto& [key, value] : item.metadata) {
            metadata += (metadata.empty() ? "" : ", ") + json_string(key) + ": " + json_string(value);
        }
        std::string tokens;
        for (const std::int64_t n : item.tokens) tokens += (tokens.empty() ? "" : ", ") + std::to_string(n);
        out << (i ? "," : "") << "\n  {\"id\": " << json_string(item.id) << ", \"layout\": " << json_string(item.layout)
            << ", \"dtypes\": [" << dtypes << "], \"layers\": " << item.layers << ", \"tokens\": [" << tokens
            << "], \"uninitialized_layers\": " << item.uninitialized << ", \"metadata\": {" << metadata << "}}";
    }
    out << (items.empty() ? "" : "\n") << "]}\n";
    std::cout << out.str();
}

// A file that is not a valid dump (exit 1) or cannot be read (exit 2).
int report_problem(const std::string& file, bool json, bool unreadable, const std::string& problem) {
    if (json) {
        std::cout << "{\"file\": " << json_string(file) << ", \"valid\": " << (unreadable ? "null" : "false")
                  << ", \"error\": " << json_string(problem) << "}\n";
    } else {
        std::cout << printable(file, 400) << ": " << (unreadable ? "UNREADABLE: " : "INVALID: ") << printable(problem, 2000)
                  << "\n";
    }
    return unreadable ? 2 : 1;
}

// Temporary files of dumps that died before their rename, next to the dump.
void note_temporaries(const std::string& dir) {
    std::error_code error;
    const std::string prefix = std::string(kv::dump_file_name) + ".tmp-";
    for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
        const std::string name = it->path().filename().string();
        if (name.rfind(prefix, 0) != 0) continue;
        std::error_code ignored;
        std::cerr << "note: " << printable(it->path().string(), 400) << " (" << fs::file_size(it->path(), ignored)
                  << " bytes) is the temporary file of a dump that did not finish; the next dump or load in this "
                     "directory removes it if its process no longer runs\n";
    }
}

// Checks one dump file or directory; its exit code.
int check_one(std::string file, bool json) {
    std::error_code error;
    if (fs::is_directory(file, error)) {
        note_temporaries(file);
        file = (fs::path(file) / kv::dump_file_name).string();
    }
    const kv::LoadLimits limits;
    // A regular file only (InputFile): a FIFO would block check-dump forever.
    const InputFile input(file);
    if (input.fd() < 0) return report_problem(file, json, true, "the file " + input.problem());
    if (input.bytes() > static_cast<std::uint64_t>(limits.file_bytes_max)) {
        return report_problem(file, json, false, "the file holds " + std::to_string(input.bytes()) +
                                                     " bytes, over the load limit of " + std::to_string(limits.file_bytes_max));
    }
    std::vector<char> bytes;
    if (!input.read(static_cast<std::size_t>(limits.file_bytes_max), &bytes)) {
        return report_problem(file, json, true, std::string("cannot read: ") + std::strerror(errno));
    }
    if (bytes.size() > static_cast<std::size_t>(limits.file_bytes_max)) {
        return report_problem(file, json, false, "the file grew past the load limit of " +
                                                     std::to_string(limits.file_bytes_max) + " bytes while it was read");
    }
    std::vector<kv::Item> items;
    try {
        items = kv::decode_dump(bytes, file, limits);
    } catch (const kv::DumpError& problem) {
        return report_problem(file, json, false, problem.what());
    } catch (const std::exception& problem) {
        // decode_dump throws DumpError for every fault it knows; anything
        // else is a fault it does not know yet, and still not a valid dump.
        return report_problem(file, json, false, std::string("the loader failed: ") + problem.what());
    }
    std::vector<ItemSummary> summaries;
    for (const kv::Item& item : items) summaries.push_back(summarize(item));
    if (json) {
        print_json(file, bytes.size(), summaries);
    } else {
        print_table(file, bytes.size(), summaries);
    }
    return 0;
}

}  // namespace

int command_check_dump(const Args& args) {
    bool json = false;
    std::vector<std::string> paths;
    for (const std::string& arg : args) {
        if (arg == "--help" || arg == "-h") {
            std::cout << "usage: kvcheck check-dump FILE|DIR ... [--json]\n\n"
                         "Validates a kvcheck dump with the same strict loader the reference uses (the records torch\n"
                         "will read, decided as torch does, an archive other readers could read otherwise refused; the\n"
                         "CRCs; the pickle's structure before torch reads it; every field; the load limits) and says\n"
                         "what it holds: ids, layouts, dtypes, layers, tokens per layer, metadata. DIR: the dump in it\n"
                         "(" + std::string(kv::dump_file_name) + "). Nothing in the file is executed. Several: each in turn.\n\n"
                         "exit codes: 0 valid, 1 invalid (the first fault is named), 2 unreadable or a usage error;\n"
                         "of several, the worst.\n\n"
                         "options:\n"
                         "  --json                   a machine-readable summary on standard output (of one dump)\n"
                         "  --help                   this text\n";
            return 0;
        }
        if (arg == "--json") {
            json = true;
        } else if (arg.rfind("--", 0) == 0) {
            throw UsageError("unknown option " + printable(arg, 60) + " for 'check-dump' (see kvcheck check-dump --help)");
        } else {
            paths.push_back(arg);
        }
    }
    if (paths.empty()) throw UsageError("check-dump takes a dump file or directory (see kvcheck check-dump --help)");
    if (json && paths.size() > 1) {
        throw UsageError("check-dump --json takes one dump file or directory (its report is one JSON object)");
    }
    // Each in turn; the exit code is the worst: 2 when one was unreadable,
    // else 1 when one was invalid.
    int status = 0;
    for (std::size_t i = 0; i < paths.size(); ++i) {
        if (i > 0) std::cout << "\n";
        status = std::max(status, check_one(paths[i], json));
    }
    return status;
}

}  // namespace kvcheck::cli
