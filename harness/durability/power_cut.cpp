#include "durability/power_cut.h"

#include <algorithm>
#include <optional>
#include <set>

namespace kvcheck::durability {
namespace {

using InodeId = std::size_t;
constexpr InodeId root_inode = 0;

// A file or directory the dump directory holds or held.
struct Inode {
    bool directory = false;
    std::string durable;                // what a power cut keeps of a file's bytes
    std::optional<std::string> at_end;  // its bytes at the crash (read after it, or as its last name went)
};

enum class ChangeKind { create, mkdir, rename, exchange, unlink, rmdir };

// A change of names, durable once every directory it changed is fsynced.
struct Change {
    ChangeKind kind = ChangeKind::create;
    std::string path;
    std::string path2;
    InodeId inode = 0;
    std::set<InodeId> unsynced;  // the directories still to be fsynced
    std::string text;
    bool durable() const { return unsynced.empty(); }
};

// Names, by path relative to the dump directory ("" is the directory itself).
using Names = std::map<std::string, InodeId>;

bool under(const std::string& path, const std::string& dir) {
    return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/';
}

std::string parent_of(const std::string& path) {
    const std::size_t slash = path.rfind('/');
    return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

// Takes `path` and every name under it out of `names`, renamed to start with `to`.
Names take_tree(Names& names, const std::string& path, const std::string& to) {
    Names taken;
    for (auto it = names.begin(); it != names.end();) {
        if (it->first == path || under(it->first, path)) {
            taken[to + it->first.substr(path.size())] = it->second;
            it = names.erase(it);
        } else {
            ++it;
        }
    }
    return taken;
}

void erase_tree(Names& names, const std::string& path) { take_tree(names, path, path); }

void move_tree(Names& names, const std::string& from, const std::string& to) {
    erase_tree(names, to);
    Names moved = take_tree(names, from, to);
    names.insert(moved.begin(), moved.end());
}

void swap_trees(Names& names, const std::string& a, const std::string& b) {
    Names from_a = take_tree(names, a, b);
    Names from_b = take_tree(names, b, a);
    names.insert(from_a.begin(), from_a.end());
    names.insert(from_b.begin(), from_b.end());
}

std::string quoted(const std::string& path) { return "\"" + path + "\""; }

void apply_change(Names& names, const Change& change) {
    switch (change.kind) {
        case ChangeKind::create:
        case ChangeKind::mkdir:
            if (names.count(parent_of(change.path)) != 0) names[change.path] = change.inode;
            return;
        case ChangeKind::rename:
            if (names.count(change.path) != 0) move_tree(names, change.path, change.path2);
            return;
        case ChangeKind::exchange:
            if (names.count(change.path) != 0 && names.count(change.path2) != 0) swap_trees(names, change.path, change.path2);
            return;
        case ChangeKind::unlink:
        case ChangeKind::rmdir:
            erase_tree(names, change.path);
            return;
    }
}

enum class Data { kept, lost, size_only };

std::string content_of(const Inode& inode, Data data) {
    const std::string& at_end = inode.at_end ? *inode.at_end : inode.durable;
    switch (data) {
        case Data::kept: return at_end;
        case Data::lost: return inode.durable;
        case Data::size_only: {
            std::string bytes = inode.durable;
            bytes.resize(at_end.size(), '\0');
            return bytes;
        }
    }
    return inode.durable;
}

const char* data_text(Data data) {
    switch (data) {
        case Data::kept: return "unflushed file data kept";
        case Data::lost: return "unflushed file data lost";
        case Data::size_only: return "unflushed file data lost but file sizes kept (zeros)";
    }
    return "";
}

// The record replayed over the directory as it was before the dump.
class Replay {
  public:
    explicit Replay(const DirImage& before) {
        inodes_.push_back(Inode{true, {}, {}});
        names_[""] = root_inode;
        for (const auto& [name, content] : before.entries) names_[name] = new_inode(!content, content.value_or(""));
        initial_ = names_;
    }

    void apply(const ShimEvent& event) {
        if (event.kind == Call::unmodelled) {
            if (event.ok()) note("the dump made " + describe(event) + ", which the model does not follow");
            return;
        }
        if (!event.ok()) return;  // a failed call changed no name, and bytes are read at flushes and at the end
        switch (event.kind) {
            case Call::open: open(event); return;
            case Call::fsync: flush(event); return;
            case Call::rename: rename(event, ChangeKind::rename); return;
            case Call::exchange: rename(event, ChangeKind::exchange); return;
            case Call::unlink: remove(event, ChangeKind::unlink); return;
            case Call::rmdir: remove(event, ChangeKind::rmdir); return;
            case Call::mkdir: create(event, true); return;
            case Call::close: fds_.erase(event.fd); return;
            case Call::dup: dup(event); return;
            case Call::sync_file: sync_file(event); return;
            case Call::sync_all:
                for (Change& change : changes_) change.unsynced.clear();
                return;
            case Call::write:
            case Call::truncate:
            case Call::kill:
            case Call::unmodelled: return;
        }
    }

    // The directory after the dump: what each remaining name holds at the
    // crash, and a check that the replay explains every name.
    void finish(const DirImage& after) {
        for (const auto& [name, content] : after.entries) {
            const auto found = names_.find(name);
            if (found == names_.end()) {
                note("after the dump, " + quoted(name) + " exists, but no recorded call made it");
                continue;
            }
            Inode& inode = inodes_[found->second];
            if (inode.directory != !content) {
                note("after the dump, " + quoted(name) + " is not the kind of file the record made");
                continue;
            }
            if (content) inode.at_end = *content;
        }
        for (const auto& [name, inode] : names_) {
            if (!name.empty() && after.entries.count(name) == 0) {
                note("the record leaves " + quoted(name) + " in place, but it is not there after the dump");
            }
        }
    }

    PowerCutModel states(const DirImage& after, const PowerCutOptions& options) const {
        PowerCutModel model;
        model.created = created_;
        model.unfollowed = unfollowed_;
        std::vector<std::size_t> pending;
        for (std::size_t i = 0; i < changes_.size(); ++i) {
            if (!changes_[i].durable()) pending.push_back(i);
        }
        model.pending = pending.size();
        for (const std::size_t kept : prefixes(pending.size(), options.prefixes_max)) {
            const Names names = names_with(kept);
            for (const Data data : {Data::kept, Data::lost, Data::size_only}) {
                CrashState state{names_text(pending, kept) + "; " + data_text(data), image_of(names, data)};
                const bool seen = std::any_of(model.states.begin(), model.states.end(),
                                              [&](const CrashState& other) { return other.image == state.image; });
                if (!seen) model.states.push_back(std::move(state));
            }
        }
        // Every change kept, every byte kept: the directory as the dump left it.
        if (model.unfollowed.empty() && image_of(names_with(pending.size()), Data::kept) != after) {
            model.unfollowed = "the model's replay of the record does not give the directory the dump left: " + describe(after);
        }
        return model;
    }

  private:
    InodeId new_inode(bool directory, std::string durable) {
        inodes_.push_back(Inode{directory, std::move(durable), {}});
        return inodes_.size() - 1;
    }

    void note(std::string why) {
        if (unfollowed_.empty()) unfollowed_ = std::move(why);
    }

    std::optional<InodeId> lookup(const std::string& path) const {
        const auto found = names_.find(path);
        if (found == names_.end()) return std::nullopt;
        return found->second;
    }

    // The directory holding `path`, which must be one the model knows.
    std::optional<InodeId> directory_of(const std::string& path) {
        const std::optional<InodeId> dir = lookup(parent_of(path));
        if (!dir || !inodes_[*dir].directory) {
            note("the dump made " + quoted(path) + " in a directory the model does not know");
            return std::nullopt;
        }
        return dir;
    }

    void create(const ShimEvent& event, bool directory) {
        if (event.path.empty()) return note("the dump made its own directory again");
        const std::optional<InodeId> dir = directory_of(event.path);
        if (!dir) return;
        const InodeId inode = new_inode(directory, "");
        names_[event.path] = inode;
        created_.push_back(event.path);
        changes_.push_back({directory ? ChangeKind::mkdir : ChangeKind::create, event.path, "", inode, {*dir}, describe(event)});
        if (!directory) fds_[event.fd] = inode;
    }

    void open(const ShimEvent& event) {
        if (event.has(KVCHECK_SHIM_CREATED)) return create(event, false);
        const std::optional<InodeId> inode = lookup(event.path);
        if (!inode) {
            return note("the dump opened " + quoted(event.path) + ", which was not there before it and no recorded call made");
        }
        fds_[event.fd] = *inode;
    }

    // The file or directory a descriptor event is about: the one its
    // descriptor was opened on, or, for a descriptor the shim found open
    // already, the one its path names now.
    std::optional<InodeId> target_of(const ShimEvent& event) {
        const auto found = fds_.find(event.fd);
        if (found != fds_.end()) return found->second;
        const std::optional<InodeId> inode = lookup(event.path);
        if (!inode) note("the dump flushed " + quoted(event.path) + ", which the model does not know");
        return inode;
    }

    void flush(const ShimEvent& event) {
        const std::optional<InodeId> inode = target_of(event);
        if (!inode) return;
        if (inodes_[*inode].directory) {
            for (Change& change : changes_) change.unsynced.erase(*inode);
            return;
        }
        if (event.has(KVCHECK_SHIM_NO_CONTENT)) return note("the shim could not read " + quoted(event.path) + " at its flush");
        inodes_[*inode].durable = event.data;
    }

    void sync_file(const ShimEvent& event) {
        const std::optional<InodeId> inode = lookup(event.path);
        if (!inode) return note("a sync found " + quoted(event.path) + ", which the model does not know");
        if (event.has(KVCHECK_SHIM_NO_CONTENT)) return note("the shim could not read " + quoted(event.path) + " at a sync");
        inodes_[*inode].durable = event.data;
    }

    void rename(const ShimEvent& event, ChangeKind kind) {
        const std::optional<InodeId> inode = lookup(event.path);
        if (event.path.empty() || event.path2.empty() || !inode) {
            return note("the dump renamed " + quoted(event.path) + ", which the model does not know");
        }
        const std::optional<InodeId> from = directory_of(event.path);
        const std::optional<InodeId> to = directory_of(event.path2);
        if (!from || !to) return;
        if (kind == ChangeKind::exchange) {
            if (!lookup(event.path2)) return note("the dump exchanged " + quoted(event.path2) + ", which the model does not know");
            swap_trees(names_, event.path, event.path2);
        } else {
            const std::optional<InodeId> victim = lookup(event.path2);
            if (victim && event.has(KVCHECK_SHIM_VICTIM)) inodes_[*victim].at_end = event.data;
            move_tree(names_, event.path, event.path2);
        }
        changes_.push_back({kind, event.path, event.path2, *inode, {*from, *to}, describe(event)});
    }

    void remove(const ShimEvent& event, ChangeKind kind) {
        const std::optional<InodeId> inode = lookup(event.path);
        if (event.path.empty() || !inode) return note("the dump removed " + quoted(event.path) + ", which the model does not know");
        const std::optional<InodeId> dir = directory_of(event.path);
        if (!dir) return;
        if (event.has(KVCHECK_SHIM_VICTIM)) inodes_[*inode].at_end = event.data;
        erase_tree(names_, event.path);
        changes_.push_back({kind, event.path, "", *inode, {*dir}, describe(event)});
    }

    void dup(const ShimEvent& event) {
        const auto from = fds_.find(static_cast<int>(event.offset));
        if (from == fds_.end()) {
            fds_.erase(event.fd);
            return;
        }
        fds_[event.fd] = from->second;
    }

    // The names with the durable changes and the first `kept` pending ones.
    Names names_with(std::size_t kept) const {
        Names names = initial_;
        std::size_t rank = 0;
        for (const Change& change : changes_) {
            const bool apply = change.durable() || rank++ < kept;
            if (apply) apply_change(names, change);
        }
        return names;
    }

    DirImage image_of(const Names& names, Data data) const {
        DirImage image;
        for (const auto& [name, inode] : names) {
            if (name.empty()) continue;
            const Inode& node = inodes_[inode];
            image.entries[name] = node.directory ? std::nullopt : std::optional<std::string>(content_of(node, data));
        }
        return image;
    }

    std::string names_text(const std::vector<std::size_t>& pending, std::size_t kept) const {
        if (pending.empty()) return "every name change durable";
        std::string text = std::to_string(kept) + " of " + std::to_string(pending.size()) + " name changes not yet durable kept";
        if (kept == pending.size()) return text;
        text += " (lost: " + changes_[pending[kept]].text;
        if (pending.size() - kept > 1) text += ", ...";
        return text + ")";
    }

    // Prefix lengths of `pending` changes: all of them, or at most `most`
    // evenly spaced, none and all included.
    static std::vector<std::size_t> prefixes(std::size_t pending, std::size_t most) {
        std::vector<std::size_t> lengths;
        if (pending + 1 <= most || most < 2) {
            for (std::size_t kept = 0; kept <= pending; ++kept) lengths.push_back(kept);
            return lengths;
        }
        for (std::size_t i = 0; i < most; ++i) {
            const std::size_t kept = (i * pending + (most - 1) / 2) / (most - 1);
            if (lengths.empty() || lengths.back() != kept) lengths.push_back(kept);
        }
        return lengths;
    }

    std::vector<Inode> inodes_;
    Names names_;    // as the process sees them
    Names initial_;  // before the dump
    std::map<int, InodeId> fds_;
    std::vector<Change> changes_;
    std::vector<std::string> created_;
    std::string unfollowed_;
};

}  // namespace

PowerCutModel power_cut_states(const DirImage& before, const std::vector<ShimEvent>& events, const DirImage& after,
                               const PowerCutOptions& options) {
    Replay replay(before);
    for (const ShimEvent& event : events) replay.apply(event);
    replay.finish(after);
    return replay.states(after, options);
}

}  // namespace kvcheck::durability
