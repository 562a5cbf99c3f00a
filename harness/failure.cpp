// A failure in the one format used everywhere, and the names of the shapes
// a run counts (kvcheck/executor.h).
#include "kvcheck/executor.h"
#include "kvcheck/lanes.h"
#include "kvcheck/limits.h"

#include <algorithm>
#include <sstream>

namespace kvcheck {

namespace {

struct ShapeInfo {
    const char* id;
    const char* summary;
};

constexpr ShapeInfo shape_table[] = {
#define KVCHECK_SHAPE_INFO(name, text) {#name, text},
    KVCHECK_SHAPE_LIST(KVCHECK_SHAPE_INFO)
#undef KVCHECK_SHAPE_INFO
};

}  // namespace

std::string cut_text(const std::string& text, std::size_t bytes_max) {
    if (text.size() <= bytes_max) return text;
    std::size_t end = bytes_max;
    // Back to the start of a UTF-8 sequence (a continuation byte is 10xxxxxx).
    for (int back = 0; back < 3 && end > 0 && (static_cast<unsigned char>(text[end]) & 0xc0) == 0x80; ++back) --end;
    return text.substr(0, end) + " ... (" + std::to_string(text.size() - end) + " more bytes cut: kvcheck keeps at most " +
           std::to_string(bytes_max) + " bytes of such text)";
}

const char* shape_id(Shape shape) { return shape_table[static_cast<std::size_t>(shape)].id; }
const char* shape_summary(Shape shape) { return shape_table[static_cast<std::size_t>(shape)].summary; }

bool shape_claimed(Shape shape, const Capabilities& capabilities) {
    const auto any = [&capabilities](auto... kinds) { return (engine_supports(capabilities, op_needs(kinds)) || ...); };
    switch (shape) {
    case Shape::re_add_after_delete: return any(op_kind<op::Delete>(), op_kind<op::DeleteAll>());
    case Shape::same_content_twice:
    case Shape::metadata_item:
    case Shape::slot_64_tokens:
    case Shape::slot_256_tokens:
    case Shape::other_geometry: return any(op_kind<op::Add>(), op_kind<op::Make>(), op_kind<op::Fill>());
    case Shape::store_64_items: return any(op_kind<op::Add>(), op_kind<op::Fill>());
    case Shape::release_borrowed:
    case Shape::release_owned: return any(op_kind<op::Release>());
    case Shape::copy_of_uninitialized: return any(op_kind<op::Clone>(), op_kind<op::GetCache>(), op_kind<op::Concat>());
    case Shape::conversion_of_owned: return any(op_kind<op::ToLegacy>(), op_kind<op::FromLegacy>());
    case Shape::generation_from_owned:
        return any(op_kind<op::Generate>(), op_kind<op::GenerateStream>(), op_kind<op::Turn>());
    case Shape::merge:
    case Shape::mixed_merge: return any(op_kind<op::GetCache>(), op_kind<op::Concat>());
    case Shape::interrupted_dump: return any(op_kind<op::DumpCrash>(), op_kind<op::DumpKill>());
    case Shape::corrupted_dump: return any(op_kind<op::Corrupt>());
    case Shape::failed_load: return any(op_kind<op::Load>());
    case Shape::returned_cache_reused: return any(op_kind<op::Turn>());
    case Shape::extracted_memory: return any(op_kind<op::Extract>());
    }
    return true;
}

void Coverage::add(const Coverage& other) {
    for (std::size_t i = 0; i < ops_run.size(); ++i) ops_run[i] += other.ops_run[i];
    for (std::size_t i = 0; i < merges_run.size(); ++i) merges_run[i] += other.merges_run[i];
    for (std::size_t i = 0; i < shapes.size(); ++i) shapes[i] += other.shapes[i];
    for (std::size_t i = 0; i < claimed.size(); ++i) claimed[i] += other.claimed[i];
    ops_skipped += other.ops_skipped;
    modern_caches += other.modern_caches;
    legacy_caches += other.legacy_caches;
    generations_owned += other.generations_owned;
    merges += other.merges;
    mixed_merges += other.mixed_merges;
    refused_merges += other.refused_merges;
    store_size_max = std::max(store_size_max, other.store_size_max);
}

std::string format_failure(const Failure& failure, const Trace& trace, const std::string& reproduce) {
    std::ostringstream out;
    const std::string op = failure.step < trace.size() ? op_name(trace[failure.step]) : "?";
    out << "ERROR: " << failure.property << ": " << failure.message << " at step " << failure.step + 1 << " (" << op << ")\n";
    for (const std::string& other : failure.also) out << "also: " << other << "\n";
    for (std::size_t i = 0; i < trace.size(); ++i) {
        out << format_op(trace[i]) << (i == failure.step ? "  # <- " + failure.property : std::string()) << "\n";
    }
    out << swimlanes(trace, failure.step, failure.property);
    out << "SUMMARY: kvcheck: " << failure.property << " violated after " << failure.step + 1 << " operation"
        << (failure.step == 0 ? "" : "s") << "\n";
    out << "reproduce: " << reproduce << "\n";
    return out.str();
}

}  // namespace kvcheck
