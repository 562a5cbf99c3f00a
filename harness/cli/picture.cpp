#include "picture.h"

#include "kvcheck/executor.h"
#include "outcomes.h"
#include "sandbox.h"
#include "search_job.h"
#include "text.h"

#include <boost/pfr.hpp>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <type_traits>

namespace kvcheck::cli {
namespace {

// Every handle a trace names (never h0), in name order.
std::vector<Handle> handles_named(const Trace& trace) {
    std::vector<Handle> handles;
    for (const Op& operation : trace) {
        std::visit(
            [&handles](const auto& o) {
                boost::pfr::for_each_field(o, [&handles](const auto& field) {
                    using F = std::decay_t<decltype(field)>;
                    if constexpr (std::is_same_v<F, HandleName>) {
                        if (field.value != 0) handles.push_back(field.value);
                    } else if constexpr (std::is_same_v<F, HandleNames>) {
                        for (const HandleName& handle : field) {
                            if (handle.value != 0) handles.push_back(handle.value);
                        }
                    }
                });
            },
            operation);
    }
    std::sort(handles.begin(), handles.end());
    handles.erase(std::unique(handles.begin(), handles.end()), handles.end());
    return handles;
}

void describe_view(const CacheView& view, BoxPicture& box) {
    box.layers = view.layers.size();
    box.layout = layout_name(view.layout);
    std::vector<std::int64_t> tokens;
    for (const LayerView& layer : view.layers) {
        std::int64_t most = 0;
        for (const SlotView& slot : layer.slots) {
            if (!slot.present || slot.shape.size() != 4) continue;
            most = std::max(most, slot.shape[2]);
            if (box.dtype.empty() && slot.shape[2] > 0) box.dtype = dtype_name(slot.dtype);
        }
        tokens.push_back(most);
    }
    const bool same = std::all_of(tokens.begin(), tokens.end(), [&](std::int64_t t) { return t == tokens.front(); });
    if (tokens.empty()) {
        box.tokens = "0";
    } else if (same) {
        box.tokens = std::to_string(tokens.front());
    } else {
        for (const std::int64_t t : tokens) box.tokens += (box.tokens.empty() ? "" : " ") + std::to_string(t);
    }
}

// What the engine holds: its stored entries, then the live handles.
std::vector<BoxPicture> read_boxes(Engine& engine, const std::vector<Handle>& handles, bool storage) {
    std::vector<BoxPicture> boxes;
    for (const std::string& id : engine.stored_ids()) {
        BoxPicture box;
        box.name = id;
        try {
            describe_view(engine.view_entry(id), box);
            box.owned = engine.entry_owned(id);
            if (storage) box.storage = engine.storage_of_entry(id);
        } catch (const std::exception& error) {
            box.error = error.what();
        }
        boxes.push_back(box);
    }
    for (const Handle handle : handles) {
        BoxPicture box;
        box.entry = false;
        box.name = "h" + std::to_string(handle);
        try {
            const HandleFacts facts = engine.handle_facts(handle);
            if (!facts.exists) continue;
            box.owned = facts.owned;
            describe_view(engine.view_handle(handle), box);
            if (storage) box.storage = engine.storage_of_handle(handle);
        } catch (const std::exception& error) {
            box.error = error.what();
        }
        boxes.push_back(box);
    }
    return boxes;
}

// A whole number of a step's message, which this process wrote.
std::uint64_t field_number(const std::string& field) {
    if (field.empty() || field.find_first_not_of("0123456789") != std::string::npos || field.size() > 19) {
        throw std::runtime_error("a step's picture holds " + printable(field, 40) + " where a number belongs");
    }
    return std::stoull(field);
}

// A step as a message: the op's line, then a line per box of tab-separated
// fields, each escaped by escape_lines: an engine's ids and error text may
// hold any byte (a stored id "a\tb" split its box's line into the wrong
// fields; "a\nb" made a box of its own).
std::string encode_step(const Op& op, const std::vector<BoxPicture>& boxes) {
    std::ostringstream out;
    out << escape_lines(format_op(op)) << "\n";
    for (const BoxPicture& box : boxes) {
        out << (box.entry ? "entry" : "handle") << "\t" << escape_lines(box.name) << "\t" << box.layers << "\t"
            << escape_lines(box.tokens) << "\t" << escape_lines(box.dtype) << "\t" << escape_lines(box.layout) << "\t"
            << (box.owned ? 1 : 0) << "\t";
        for (std::size_t i = 0; i < box.storage.size(); ++i) out << (i ? "," : "") << box.storage[i];
        out << "\t" << escape_lines(one_line(box.error)) << "\n";
    }
    return out.str();
}

StepPicture decode_step(const std::string& payload) {
    std::istringstream in(payload);
    StepPicture step;
    std::getline(in, step.op);
    step.op = unescape_lines(step.op);
    for (std::string line; std::getline(in, line);) {
        std::vector<std::string> fields;
        std::istringstream row(line);
        for (std::string field; std::getline(row, field, '\t');) fields.push_back(field);
        fields.resize(9);
        BoxPicture box;
        box.entry = fields[0] == "entry";
        box.name = unescape_lines(fields[1]);
        box.layers = static_cast<std::size_t>(field_number(fields[2]));
        box.tokens = unescape_lines(fields[3]);
        box.dtype = unescape_lines(fields[4]);
        box.layout = unescape_lines(fields[5]);
        box.owned = fields[6] == "1";
        std::istringstream ids(fields[7]);
        for (std::string id; std::getline(ids, id, ',');) box.storage.push_back(field_number(id));
        box.error = unescape_lines(fields[8]);
        step.boxes.push_back(box);
    }
    return step;
}

}  // namespace

bool BoxPicture::shares_storage_with(const BoxPicture& other) const {
    for (const std::uint64_t id : storage) {
        if (std::find(other.storage.begin(), other.storage.end(), id) != other.storage.end()) return true;
    }
    return false;
}

std::optional<FailurePicture> picture_failure(const Adapter& adapter, const std::string& property,
                                              const FailureReport& failure, const ConformanceOptions& options) {
    const std::optional<Property> checked = parse_property(property);
    if (!checked || failure.trace.empty() || !failure.fault.empty()) return std::nullopt;
    const Trace trace = parse_trace(failure.trace);
    auto body = [&](Channel& out) {
        RunOptions run_options;
        run_options.properties = PropertySet::only(*checked);
        run_options.every_entry_every_step = true;
        run_options.fresh_engine = adapter.make;
        if (!out.work_dir().empty()) run_options.work_dir = out.work_dir() + "/picture";
        for (std::size_t length = 1; length <= trace.size(); ++length) {
            const Trace prefix(trace.begin(), trace.begin() + static_cast<std::ptrdiff_t>(length));
            std::error_code ignored;
            if (!run_options.work_dir.empty()) std::filesystem::remove_all(run_options.work_dir, ignored);
            const std::shared_ptr<Engine> engine = adapter.make();
            const RunResult run = execute(prefix, *engine, run_options);
            const bool storage = engine->capabilities().storage_identity;
            out.send("step", encode_step(prefix.back(), read_boxes(*engine, handles_named(prefix), storage)));
            if (run.failure) {
                out.send("failed", std::to_string(run.failure->step) + "\n" + run.failure->message);
                return;
            }
        }
    };
    Sandbox sandbox(options.limits);
    const std::shared_ptr<Job> job = options.isolate ? sandbox.run(body) : run_in_process(body);
    FailurePicture picture;
    // A picture that cannot be read costs that picture, never the report.
    try {
        for (const Message& message : job->messages) {
            if (message.kind == "step") {
                picture.steps.push_back(decode_step(message.payload));
            } else if (message.kind == "failed") {
                const std::size_t end = message.payload.find('\n');
                picture.failing_step = static_cast<std::size_t>(field_number(message.payload.substr(0, end)));
                picture.message = end == std::string::npos ? "" : message.payload.substr(end + 1);
            } else if (message.kind == "error") {
                picture.error = one_line(message.payload);
            }
        }
    } catch (const std::exception& error) {
        picture.error = std::string("the picture could not be read: ") + error.what();
    }
    if (job->fault) picture.error = job->fault->kind + ": " + job->fault->detail;
    if (!picture.failing_step && picture.error.empty()) {
        picture.error = "the trace did not fail again when replayed one step at a time";
    }
    return picture;
}

}  // namespace kvcheck::cli
