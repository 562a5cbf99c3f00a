#include "durability/dir_image.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <system_error>

namespace kvcheck::durability {

namespace fs = std::filesystem;

std::vector<std::string> DirImage::names() const {
    std::vector<std::string> names;
    for (const auto& [name, content] : entries) names.push_back(name);
    return names;
}

namespace {

std::string read_bytes(const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + file.string());
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void read_into(const fs::path& root, const fs::path& dir, DirImage& image) {
    std::error_code error;
    for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
        const fs::path& path = it->path();
        const std::string name = path.lexically_relative(root).generic_string();
        const fs::file_status status = fs::symlink_status(path);
        if (fs::is_directory(status)) {
            image.entries[name] = std::nullopt;
            read_into(root, path, image);
        } else if (fs::is_regular_file(status)) {
            image.entries[name] = read_bytes(path);
        } else {
            throw std::runtime_error(path.string() + " is neither a regular file nor a directory");
        }
    }
    if (error) throw std::runtime_error("cannot list " + dir.string() + ": " + error.message());
}

}  // namespace

DirImage read_image(const std::string& dir) {
    DirImage image;
    if (!fs::is_directory(dir)) return image;
    read_into(dir, dir, image);
    return image;
}

void write_image(const std::string& dir, const DirImage& image) {
    remove_tree(dir);
    fs::create_directories(dir);
    for (const auto& [name, content] : image.entries) {
        const fs::path path = fs::path(dir) / name;
        if (!content) {
            fs::create_directories(path);
            continue;
        }
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(content->data(), static_cast<std::streamsize>(content->size()));
        if (!out) throw std::runtime_error("cannot write " + path.string());
    }
}

void remove_tree(const std::string& dir) {
    std::error_code error;
    fs::remove_all(dir, error);
    if (error) throw std::runtime_error("cannot remove " + dir + ": " + error.message());
}

std::string describe(const DirImage& image) {
    if (image.entries.empty()) return "nothing";
    std::string text;
    for (const auto& [name, content] : image.entries) {
        if (!text.empty()) text += ", ";
        text += "\"" + name + (content ? "\" (" + std::to_string(content->size()) + " bytes)" : "/\"");
    }
    return text;
}

}  // namespace kvcheck::durability
