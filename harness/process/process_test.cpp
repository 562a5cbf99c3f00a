// The process adapter's own tests: the JSON it speaks, the protocol's
// messages, and adapter processes that start, answer, reset, die, lie about
// their version or write garbage. Adapters are Python scripts run by
// Debian's interpreter: the fault adapter (no torch: quick to start) and,
// for the engine itself, the example store.
#include "adapter_process.h"
#include "json.h"
#include "paged_wire.h"
#include "process_engine.h"
#include "wire.h"

#include "kvcheck/executor.h"
#include "kvcheck/threads.h"
#include "kvcheck/trace.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace kvcheck::process {
namespace {

// ---- JSON ----------------------------------------------------------------------

TEST(Json, ParsesEveryKindOfValue) {
    const Json value = Json::parse(R"( {"a": [1, -2, 18446744073709551615, 1.5e3, true, false, null],
                                        "s": "q\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00", "o": {}} )");
    const auto& a = value.at("a").as_array();
    ASSERT_EQ(a.size(), 7u);
    EXPECT_EQ(a[0].as_int(), 1);
    EXPECT_EQ(a[1].as_int(), -2);
    EXPECT_EQ(a[2].as_uint(), 18446744073709551615ull);
    EXPECT_EQ(a[3].type(), Json::Type::real);
    EXPECT_TRUE(a[4].as_bool());
    EXPECT_FALSE(a[5].as_bool());
    EXPECT_TRUE(a[6].is_null());
    EXPECT_EQ(value.at("s").as_string(), "q\"\\/\b\f\n\r\t\xC3\xA9\xF0\x9F\x98\x80");
    EXPECT_TRUE(value.at("o").as_object().empty());
    EXPECT_EQ(value.find("missing"), nullptr);
}

TEST(Json, NamesWhatIsWrongAndWhere) {
    const auto error_of = [](const std::string& text) {
        try {
            Json::parse(text);
        } catch (const JsonError& error) {
            return std::string(error.what());
        }
        return std::string("no error");
    };
    EXPECT_EQ(error_of("{\"a\" 1}"), "not valid JSON at byte 5: expected ':'");
    EXPECT_EQ(error_of("[1, 2] x"), "not valid JSON at byte 7: trailing text after the value");
    EXPECT_EQ(error_of("\"open"), "not valid JSON at byte 5: unterminated string");
    EXPECT_EQ(error_of("\"a\nb\""), "not valid JSON at byte 3: control character in a string");
    EXPECT_EQ(error_of("1-2"), "not valid JSON at byte 1: trailing text after the value");
    EXPECT_EQ(error_of("18446744073709551616"), "not valid JSON at byte 0: integer out of the 64-bit range");
    EXPECT_EQ(error_of(std::string(65, '[') + std::string(65, ']')), "no error");
    EXPECT_EQ(error_of(std::string(66, '[') + std::string(66, ']')), "not valid JSON at byte 65: nested deeper than 64 levels");
    EXPECT_EQ(error_of("Hello"), "not valid JSON at byte 0: unexpected character 'H'");
}

TEST(Json, RefusesAValueOfAnotherType) {
    const Json value = Json::parse(R"({"n": -1, "big": 9223372036854775808, "s": "x"})");
    EXPECT_THROW(value.at("n").as_uint(), JsonError);
    EXPECT_THROW(value.at("big").as_int(), JsonError);
    EXPECT_EQ(value.at("big").as_uint(), 9223372036854775808ull);
    try {
        value.at("s").as_array();
        FAIL() << "no error";
    } catch (const JsonError& error) {
        EXPECT_STREQ(error.what(), "expected an array, found a string");
    }
    EXPECT_THROW(value.at("nope"), JsonError);
}

TEST(Json, WritesWhatItReads) {
    std::string out = "[";
    json_append_string(out, std::string("tab\there \"quoted\" \\ \x01 \xC3\xA9", 24));
    out += ',';
    json_append_int(out, std::numeric_limits<std::int64_t>::min());
    out += ',';
    json_append_uint(out, std::numeric_limits<std::uint64_t>::max());
    out += ',';
    json_append_bool(out, true);
    out += ']';
    const Json back = Json::parse(out);
    EXPECT_EQ(back.as_array()[0].as_string(), std::string("tab\there \"quoted\" \\ \x01 \xC3\xA9", 24));
    EXPECT_EQ(back.as_array()[1].as_int(), std::numeric_limits<std::int64_t>::min());
    EXPECT_EQ(back.as_array()[2].as_uint(), std::numeric_limits<std::uint64_t>::max());
    EXPECT_TRUE(back.as_array()[3].as_bool());
}

TEST(Json, GarbageIsAnErrorNeverACrash) {
    // Seeded: mutations of a real reply (bytes flipped, cut, duplicated)
    // and plain random bytes. Every one parses or throws JsonError; under
    // the sanitizer builds, nothing reads out of bounds.
    const std::string reply =
        R"({"ok":true,"observed":{"handles":[{"handle":3,"exists":true,"owned":false,"view":{"layout":"modern",)"
        R"("layers":[{"initialized":true,"slots":[{"dtype":"f32","shape":[1,2,3,4],"hash":18446744073709551615},null,null,null]}]},)"
        R"("storage":[1,2]}],"stored_ids":["a","é
"]},"copies":[{"reason":"get_cache","bytes":-1}]})";
    std::uint64_t state = 20261202;
    const auto next = [&state] {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return state >> 33;
    };
    std::size_t parsed = 0;
    for (int round = 0; round < 20000; ++round) {
        std::string text = reply;
        if (round % 4 == 3) {
            text.assign(next() % 64, '\0');
            for (char& c : text) c = static_cast<char>(next());
        } else {
            for (int edits = 1 + static_cast<int>(next() % 4); edits > 0; --edits) {
                const std::size_t at = next() % text.size();
                switch (next() % 3) {
                    case 0: text[at] = static_cast<char>(next()); break;
                    case 1: text.resize(at); break;
                    default: text.insert(at, text.substr(at, next() % 16)); break;
                }
                if (text.empty()) text = "{";
            }
        }
        try {
            Json::parse(text);
            ++parsed;
        } catch (const JsonError&) {
        }
    }
    EXPECT_LT(parsed, 20000u);  // the mutations do break the text
}

// ---- the protocol's messages ---------------------------------------------------------

TEST(Wire, ContentIsWrittenAsSegments) {
    const CacheContent content = expand(parse_cache_spec("modern/bf16/7:[kv3 k~2 -0]"));
    std::string out;
    append_content(out, content);
    const Json json = Json::parse(out);
    EXPECT_EQ(json.at("layout").as_string(), "modern");
    EXPECT_EQ(json.at("dtype").as_string(), "bf16");
    EXPECT_EQ(json.at("heads").as_int(), cache_heads);
    EXPECT_EQ(json.at("head_dim").as_int(), cache_head_dim);
    const auto& layers = json.at("layers").as_array();
    ASSERT_EQ(layers.size(), 3u);
    EXPECT_FALSE(layers[1].at("initialized").as_bool());
    const auto& keys = layers[0].at("slots").as_array()[0].as_array();
    ASSERT_EQ(keys.size(), 1u);
    EXPECT_EQ(keys[0].as_array()[0].as_uint(), content.layers[0].slots[0].segments[0].seed);
    EXPECT_EQ(keys[0].as_array()[1].as_int(), 3);
    EXPECT_TRUE(layers[1].at("slots").as_array()[1].is_null());
    EXPECT_TRUE(layers[2].at("slots").as_array()[0].is_null());
}

TEST(Wire, ARequestIsOneJsonObjectWithItsMembersInOrder) {
    const std::string text = Request("add")
                                 .field("id", "a\"b")
                                 .field("handle", std::int64_t{-3})
                                 .flag("stream", true)
                                 .field("ids", std::vector<std::string>{"x", "y"})
                                 .field("prompt", std::vector<std::int64_t>{1, 2})
                                 .field("metadata", Metadata{{"k", "v"}})
                                 .text();
    EXPECT_EQ(text, R"({"op":"add","id":"a\"b","handle":-3,"stream":true,"ids":["x","y"],"prompt":[1,2],"metadata":{"k":"v"}})");
    EXPECT_EQ(Json::parse(text).at("ids").as_array().size(), 2u);
    EXPECT_EQ(Request("stored_ids").text(), R"({"op":"stored_ids"})");
}

TEST(Wire, AViewGivesTheDigestKvcheckComputes) {
    const CacheContent content = expand(parse_cache_spec("legacy/f16/3:[kv2 kv0]"));
    const CacheView expected = expected_view(content);
    std::string out = R"({"view": {"layout": "legacy", "layers": [)";
    for (std::size_t i = 0; i < expected.layers.size(); ++i) {
        out += i ? "," : "";
        out += R"({"initialized": true, "slots": [)";
        for (std::size_t s = 0; s < slot_count; ++s) {
            const SlotView& slot = expected.layers[i].slots[s];
            out += s ? "," : "";
            if (!slot.present) {
                out += "null";
                continue;
            }
            out += R"({"dtype": ")" + std::string(dtype_name(slot.dtype)) + R"(", "shape": )";
            append_ints(out, slot.shape);
            out += R"(, "hash": )";
            json_append_uint(out, slot.hash);
            out += "}";
        }
        out += "]}";
    }
    out += "]}}";
    EXPECT_EQ(read_digest(Json::parse(out)), expected_digest(content));
    EXPECT_EQ(read_digest(Json::parse(R"({"digest": 42})")), 42u);
    EXPECT_EQ(read_digest(Json::parse(R"({})")), std::nullopt);
}

TEST(Wire, AMalformedViewIsAProtocolErrorNamingTheMember) {
    const auto error_of = [](const std::string& text) {
        try {
            read_view(Json::parse(text));
        } catch (const ProtocolError& error) {
            return std::string(error.what());
        }
        return std::string("no error");
    };
    EXPECT_EQ(error_of(R"({"layers": []})"), "missing member 'layout'");
    EXPECT_EQ(error_of(R"({"layout": "diagonal", "layers": []})"), "unknown layout 'diagonal' (expected modern or legacy)");
    EXPECT_EQ(error_of(R"({"layout": "modern", "layers": [{"initialized": true, "slots": [null]}]})"),
              "a layer's 'slots' holds 1 entries, expected 4 (keys, values, key_cache, value_cache)");
    EXPECT_EQ(error_of(R"({"layout": "modern", "layers": [{"initialized": true, "slots": [{"dtype": "f64", "shape": [0], "hash": 1}, null, null, null]}]})"),
              "slot keys: unknown dtype 'f64' (expected f32, f16 or bf16)");
    EXPECT_EQ(error_of(R"({"layout": "modern", "layers": [{"initialized": 1, "slots": []}]})"),
              "'initialized': expected a boolean, found an integer");
}

TEST(Wire, CapabilitiesKeepTheDefaultsAndRefuseUnknownFlags) {
    const Capabilities flags = read_capabilities(Json::parse(R"({"dump": false, "entry_versions": true})"));
    EXPECT_FALSE(flags.dump);
    EXPECT_TRUE(flags.entry_versions);
    EXPECT_TRUE(flags.legacy_layout);
    EXPECT_THROW(read_capabilities(Json::parse(R"({"dumb": false})")), ProtocolError);
    EXPECT_THROW(read_capabilities(Json::parse(R"({"dump": "no"})")), ProtocolError);
    EXPECT_TRUE(flags.modern_layout);
    EXPECT_FALSE(read_capabilities(Json::parse(R"({"modern_layout": false})")).modern_layout);
    // Protocol 4: claimed, or off.
    EXPECT_FALSE(flags.returned_caches);
    EXPECT_TRUE(read_capabilities(Json::parse(R"({"returned_caches": true})")).returned_caches);
    // A store window (docs/semantics.md#store-windows): a number, none by default.
    EXPECT_EQ(flags.window, 0);
    EXPECT_EQ(read_capabilities(Json::parse(R"({"window": 4})")).window, 4);
    EXPECT_THROW(read_capabilities(Json::parse(R"({"window": -1})")), ProtocolError);
    EXPECT_THROW(read_capabilities(Json::parse(R"({"window": true})")), ProtocolError);
    // A content tolerance (docs/semantics.md#content-tolerance): {abs, rel}, exact by default.
    EXPECT_FALSE(flags.content_tolerance.declared());
    const ContentTolerance tolerance =
        read_capabilities(Json::parse(R"({"content_tolerance": {"abs": 0.01, "rel": 6.25e-2}})")).content_tolerance;
    EXPECT_EQ(tolerance.abs, 0.01);
    EXPECT_EQ(tolerance.rel, 0.0625);
    EXPECT_EQ(read_capabilities(Json::parse(R"({"content_tolerance": {"rel": 1}})")).content_tolerance.abs, 0.0);
    EXPECT_THROW(read_capabilities(Json::parse(R"({"content_tolerance": {"rel": -1}})")), ProtocolError);
    EXPECT_THROW(read_capabilities(Json::parse(R"({"content_tolerance": {"step": 1}})")), ProtocolError);
    EXPECT_THROW(read_capabilities(Json::parse(R"({"content_tolerance": 0.1})")), ProtocolError);
}

// A slot's values (an engine with a content tolerance) are read as float32
// and compared within the tolerance only when the hash differs.
TEST(Wire, AViewsValuesAreComparedWithinTheDeclaredTolerance) {
    const CacheContent content = expand(parse_cache_spec("modern/f32/7:[kv1]"));
    const CacheView expected = expected_view(content, true);
    ASSERT_EQ(expected.layers[0].slots[0].values.size(), 8u);
    const auto slot_json = [](const SlotView& slot, float scale) {
        std::string out = R"({"dtype": "f32", "shape": [1, 2, 1, 4], "hash": 7, "values": [)";
        for (std::size_t i = 0; i < slot.values.size(); ++i) {
            char number[32];
            std::snprintf(number, sizeof number, "%s%.9g", i == 0 ? "" : ", ", static_cast<double>(slot.values[i] * scale));
            out += number;
        }
        return out + "]}";
    };
    const auto view_json = [&](float scale) {
        const LayerView& layer = expected.layers[0];
        return R"({"layout": "modern", "layers": [{"initialized": true, "slots": [)" + slot_json(layer.slots[0], scale) + ", " +
               slot_json(layer.slots[1], scale) + ", null, null]}]}";
    };
    const CacheView near = read_view(Json::parse(view_json(1.001f)));
    const CacheView far = read_view(Json::parse(view_json(1.1f)));
    EXPECT_EQ(near.layers[0].slots[0].values.size(), 8u);
    const ContentTolerance tolerance{0, 0.01};
    EXPECT_EQ(view_difference(near, expected, tolerance), "");
    EXPECT_NE(view_difference(far, expected, tolerance).find("layer 0 keys content differs beyond the tolerance at element 0"),
              std::string::npos)
        << view_difference(far, expected, tolerance);
    // Without a tolerance the hash decides.
    EXPECT_EQ(view_difference(near, expected), "layer 0 keys content differs");
}

// A window's suffix of a segment (expected_window) is compared, never sent.
TEST(Wire, ASegmentCutByAWindowIsNeverSent) {
    const CacheContent windowed = expected_window(expand(parse_cache_spec("modern/f32/7:[kv3]")), 2);
    ASSERT_EQ(windowed.layers[0].slots[0].segments[0].first, 1);
    std::string out;
    EXPECT_THROW(append_content(out, windowed), std::logic_error);
}

// The paged family's state (docs/protocol.md section 11): read whole, a
// fault naming the member; the capabilities that say which family.
TEST(Wire, APagedStateIsReadWholeOrRefusedNamingTheMember) {
    const PagedState state = read_paged_state(Json::parse(R"({"block_tokens": 2,
        "blocks": [{"count": 0, "tokens": [], "written": 0, "digest": 0},
                   {"count": 2, "key": {"parent": 18446744073709551615, "tokens": [5, 9], "extra": "salt-1"},
                    "tokens": [5, 9], "written": 2, "digest": 77},
                   {"count": 1, "key": null, "tokens": [2], "written": 0, "digest": 5}],
        "free_queue": [], "index": [{"key": {"parent": 18446744073709551615, "tokens": [5, 9], "extra": "salt-1"}, "blocks": [1]}],
        "tables": [{"seq": 3, "blocks": [1, 2], "tokens": [5, 9, 2]}, {"seq": 4, "blocks": [1], "tokens": [-1, -1]}],
        "copies": [{"source": 1, "destination": 2}]})"));
    EXPECT_EQ(state.block_tokens, 2);
    ASSERT_EQ(state.blocks.size(), 3u);
    EXPECT_TRUE(state.blocks[1].keyed);
    EXPECT_EQ(state.blocks[1].key, (PagedKey{18446744073709551615ull, {5, 9}, "salt-1"}));
    EXPECT_EQ(state.blocks[1].digest, 77u);
    EXPECT_FALSE(state.blocks[2].keyed);
    EXPECT_EQ(state.index.size(), 1u);
    EXPECT_EQ(state.index[0].blocks, (std::vector<std::int64_t>{1}));
    EXPECT_EQ(state.tables.at(3), (std::vector<std::int64_t>{1, 2}));
    EXPECT_EQ(state.tokens.at(4), (PagedTokens{-1, -1}));
    EXPECT_EQ(state.copies, (std::vector<PagedCopy>{{1, 2}}));
    const auto error_of = [](const std::string& text) {
        try {
            read_paged_state(Json::parse(text));
        } catch (const ProtocolError& error) {
            return std::string(error.what());
        }
        return std::string("no error");
    };
    const std::string tail = R"("free_queue": [], "index": [], "tables": [], "copies": []})";
    EXPECT_NE(error_of(R"({"block_tokens": 2, "blocks": [{"count": 0, "tokens": [], "written": "x"}], )" + tail).find("'blocks[0]'"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"block_tokens": 2, "blocks": [{"count": 1, "key": {"tokens": []}, "tokens": [], "written": 0}], )" + tail)
                  .find("'parent'"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"block_tokens": 0, "blocks": [], )" + tail).find("block_tokens"), std::string::npos);
    // The window: absent is full attention (0); a negative one is refused.
    EXPECT_EQ(state.window, 0);
    EXPECT_EQ(read_paged_state(Json::parse(R"({"block_tokens": 2, "window": 3, "blocks": [], )" + tail)).window, 3);
    EXPECT_NE(error_of(R"({"block_tokens": 2, "window": -1, "blocks": [], )" + tail).find("'window'"), std::string::npos);
    EXPECT_NE(error_of(R"({"block_tokens": 2, "blocks": [], "free_queue": [], "index": [], "copies": []})").find("tables"),
              std::string::npos);
    const Capabilities paged_only = read_capabilities(Json::parse(R"({"paged": true, "store": false})"));
    EXPECT_TRUE(paged_only.paged);
    EXPECT_FALSE(paged_only.store);
    EXPECT_FALSE(read_capabilities(Json::parse("{}")).paged);
    EXPECT_TRUE(read_capabilities(Json::parse("{}")).store);
}

// The handshake's "model" (docs/protocol.md): every key required, each
// fault naming its key.
TEST(Wire, AModelIsReadWholeOrRefusedByKey) {
    const ModelDomain model = read_model(Json::parse(
        R"({"layers": 2, "heads": 4, "head_dim": 8, "dtypes": ["bf16", "f32"], "layouts": ["legacy"], "odd_layers": true})"));
    EXPECT_TRUE(model.declared);
    EXPECT_EQ(model.layers, 2);
    EXPECT_EQ(model.heads, 4);
    EXPECT_EQ(model.head_dim, 8);
    EXPECT_EQ(model.dtypes, (std::vector<Dtype>{Dtype::bf16, Dtype::f32}));
    EXPECT_EQ(model.layouts, (std::vector<Layout>{Layout::legacy}));
    EXPECT_TRUE(model.odd_layers);
    const auto error_of = [](const std::string& text) {
        try {
            read_model(Json::parse(text));
        } catch (const ProtocolError& error) {
            return std::string(error.what());
        }
        return std::string("no error");
    };
    const std::string rest = R"("heads": 2, "head_dim": 8, "layouts": ["modern"], "odd_layers": false)";
    EXPECT_EQ(error_of(R"({"dtypes": ["f32"], )" + rest + "}"), "'model': missing member 'layers'");
    EXPECT_EQ(error_of(R"({"layers": "2", "dtypes": ["f32"], )" + rest + "}"), "'model': 'layers': expected an integer, found a string");
    EXPECT_EQ(error_of(R"({"layers": 2, "dtypes": ["f8"], )" + rest + "}"),
              "'model': 'dtypes': unknown dtype 'f8' (expected f32, f16 or bf16)");
    EXPECT_EQ(error_of(R"({"layers": 2, "dtypes": "f32", )" + rest + "}"), "'model': 'dtypes': expected an array, found a string");
    EXPECT_EQ(error_of(R"({"layers": 2, "dtypes": ["f32"], "vocab": 5, )" + rest + "}"),
              "'model': unknown key 'vocab' (known: layers, heads, head_dim, dtypes, layouts, odd_layers)");
    EXPECT_EQ(error_of("[]"), "'model': expected an object, found an array");
}

// ---- processes ---------------------------------------------------------------------

class ProcessTest : public ::testing::Test {
  protected:
    void SetUp() override {
        char pattern[] = "/tmp/kvcheck-process-test-XXXXXX";
        ASSERT_NE(::mkdtemp(pattern), nullptr);
        dir_ = pattern;
    }
    void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

    std::string output() const { return dir_ + "/output"; }

    static ProcessCommand fault_adapter(const std::string& fault) {
        return {{KVCHECK_TEST_PYTHON, KVCHECK_TEST_FAULT_ADAPTER, "--fault", fault}, "fault_adapter.py --fault " + fault, {}};
    }
    static ProcessCommand shell(const std::string& script) { return {{"/bin/sh", "-c", script}, script, {}}; }

    ProcessFault fault_of(const ProcessCommand& command, double handshake_seconds = 120) const {
        try {
            AdapterProcess process(command, output(), handshake_seconds);
        } catch (const ProcessError& error) {
            return error.fault();
        }
        return {"none", ""};
    }

    std::string dir_;
};

TEST_F(ProcessTest, HandshakeNamesTheAdapter) {
    AdapterProcess process(fault_adapter("none"), output(), 120);
    EXPECT_EQ(process.hello().protocol, protocol_version);
    EXPECT_EQ(process.hello().name, "fault-none");
    EXPECT_FALSE(process.hello().copies_in_replies);
    const Json reply = process.call(R"({"op":"stored_ids"})");
    EXPECT_FALSE(reply.at("ok").as_bool());
    EXPECT_EQ(reply.at("error").as_string(), "RuntimeError: stored_ids is not supported");
    process.shut_down();
    EXPECT_FALSE(process.alive());
}

TEST_F(ProcessTest, AnotherVersionIsRefusedNamingBoth) {
    const ProcessFault fault = fault_of(fault_adapter("version"));
    EXPECT_EQ(fault.kind, "version");
    EXPECT_NE(fault.detail.find("speaks protocol version 99; this kvcheck speaks version " + std::to_string(protocol_version)), std::string::npos) << fault.detail;
}

TEST_F(ProcessTest, AProcessThatDiesBeforeTheHandshakeShowsItsOutput) {
    const ProcessFault fault = fault_of(shell("echo 'Traceback: no module' >&2; exit 7"));
    EXPECT_EQ(fault.kind, "start");
    EXPECT_NE(fault.detail.find("exited with status 7 before answering the handshake"), std::string::npos) << fault.detail;
    EXPECT_NE(fault.detail.find("the adapter's output ends with:\nTraceback: no module"), std::string::npos) << fault.detail;
}

TEST_F(ProcessTest, GarbageOnTheReplyPipeIsAProtocolFault) {
    const ProcessFault fault = fault_of(shell("printf 'garbage!!' >&4; sleep 600"));
    EXPECT_EQ(fault.kind, "protocol");
    EXPECT_NE(fault.detail.find("'garbage!!'"), std::string::npos) << fault.detail;
}

TEST_F(ProcessTest, ACommandThatCannotRunIsAStartFault) {
    const ProcessFault fault = fault_of({{"/nonexistent/adapter"}, "/nonexistent/adapter", {}});
    EXPECT_EQ(fault.kind, "start");
    EXPECT_EQ(fault.detail, "cannot run the adapter command '/nonexistent/adapter': /nonexistent/adapter: No such file or directory");
}

TEST_F(ProcessTest, SilenceAtTheHandshakeIsAStartFaultAfterTheLimit) {
    // The process never answers: the limit only decides how soon that is said.
    const ProcessFault fault = fault_of(shell("sleep 600"), 0.5);
    EXPECT_EQ(fault.kind, "start");
    EXPECT_NE(fault.detail.find("did not answer the handshake within 0.5 s"), std::string::npos) << fault.detail;
}

TEST_F(ProcessTest, DeathAfterTheHandshakeIsNamedAndTheHandlerRunsFirst) {
    ProcessFault seen;
    AdapterProcess process(fault_adapter("crash"), output(), 120, [&seen](const ProcessFault& fault) { seen = fault; });
    try {
        process.call(R"({"op":"stored_ids"})");
        FAIL() << "no fault";
    } catch (const ProcessError& error) {
        EXPECT_EQ(error.fault().kind, "crash");
        EXPECT_NE(error.fault().detail.find("was killed by SIGSEGV before answering a request"), std::string::npos);
    }
    EXPECT_EQ(seen.kind, "crash");
    EXPECT_FALSE(process.alive());
}

TEST_F(ProcessTest, TheOutputIsKeptAndClearedAtReset) {
    AdapterProcess process(shell("echo started; exec " KVCHECK_TEST_PYTHON " " KVCHECK_TEST_FAULT_ADAPTER " --fault none"),
                           output(), 120);
    EXPECT_EQ(process.output_tail(), "started");
    process.clear_output();
    EXPECT_EQ(process.output_tail(), "");
}

// The dump shim is preloaded into every adapter process (docs/durability.md),
// and ASan's link-order check is turned off for it, so that an adapter built
// with a dynamic ASan runtime (g++ -fsanitize=address) still starts; the
// caller's own ASAN_OPTIONS follow, so they win.
TEST_F(ProcessTest, TheDumpShimIsPreloadedWithoutStoppingAnAsanAdapter) {
    const char* outer = std::getenv("ASAN_OPTIONS");
    AdapterProcess process(shell("echo \"$LD_PRELOAD|$ASAN_OPTIONS\"; exec " KVCHECK_TEST_PYTHON " " KVCHECK_TEST_FAULT_ADAPTER
                                 " --fault none"),
                           output(), 120);
    const std::string seen = process.output_tail();
    const std::string preload = seen.substr(0, seen.find('|'));
    EXPECT_NE(preload.find("libkvcheck_dumpshim.so"), std::string::npos) << seen;
    const std::string asan = seen.substr(seen.find('|') + 1);
    EXPECT_EQ(asan, std::string("verify_asan_link_order=0") + (outer != nullptr && *outer != 0 ? std::string(":") + outer : ""))
        << seen;
}

// What /proc/<pid>/stat says after the command's name (state, parent, ...);
// empty when the process is gone.
std::string stat_after_name(pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const std::size_t name_end = text.rfind(')');
    return name_end == std::string::npos || name_end + 2 > text.size() ? std::string() : text.substr(name_end + 2);
}

// Whether `pid` ends (is gone, or a zombie not yet reaped) within a minute.
bool ends_within_a_minute(pid_t pid) {
    for (int i = 0; i < 600; ++i) {
        const std::string rest = stat_after_name(pid);
        if (rest.empty() || rest[0] == 'Z') return true;
        ::usleep(100000);
    }
    return false;
}

// The parent process id of `pid`; -1 when gone.
pid_t parent_of(pid_t pid) {
    std::istringstream rest(stat_after_name(pid));
    std::string state;
    pid_t parent = -1;
    rest >> state >> parent;
    return parent;
}

TEST_F(ProcessTest, TheProcessDiesWithTheProcessThatStartedIt) {
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        AdapterProcess process(fault_adapter("hang"), output(), 120);
        const pid_t adapter = process.pid();
        ssize_t written = ::write(pipe_fds[1], &adapter, sizeof adapter);
        (void)written;
        ::_exit(0);  // no destructor: only PR_SET_PDEATHSIG can stop the adapter
    }
    pid_t adapter = -1;
    ASSERT_EQ(::read(pipe_fds[0], &adapter, sizeof adapter), static_cast<ssize_t>(sizeof adapter));
    ::waitpid(child, nullptr, 0);
    EXPECT_TRUE(ends_within_a_minute(adapter)) << "adapter process " << adapter << " outlived the process that started it";
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
}

TEST_F(ProcessTest, AWarmCopyDiesWithTheProcessThatAskedForIt) {
    // The copy is the fork server's child, not the asker's: PR_SET_PDEATHSIG
    // cannot stop it; the server kills it when the asker's life pipe closes.
    ProcessCommand command = fault_adapter("hang");
    command.argv.push_back("--warm");
    command.extra_env.push_back("PYTHONPATH=" KVCHECK_TEST_SDK_DIR);
    ProcessLauncher launcher(command, {});
    launcher.probe();
    ASSERT_TRUE(launcher.warm());
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        const std::shared_ptr<Engine> engine = launcher.make();
        const pid_t adapter = launcher.process_id();
        ssize_t written = ::write(pipe_fds[1], &adapter, sizeof adapter);
        (void)written;
        // The copy hangs on this request; SIGALRM kills this process while
        // it waits (no destructor runs), as the sandbox kills a hung child.
        ::alarm(1);
        engine->stored_ids();
        ::_exit(0);
    }
    pid_t adapter = -1;
    ASSERT_EQ(::read(pipe_fds[0], &adapter, sizeof adapter), static_cast<ssize_t>(sizeof adapter));
    ::waitpid(child, nullptr, 0);
    ASSERT_GT(adapter, 0);
    EXPECT_TRUE(ends_within_a_minute(adapter)) << "warm adapter copy " << adapter << " outlived the process that asked for it";
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
}

// ---- the engine over the example store ------------------------------------------------

TEST(ProcessEngine, RunsATraceResetsBetweenEnginesAndRefusesAStaleOne) {
    ProcessCommand command{{KVCHECK_TEST_PYTHON, KVCHECK_TEST_EXAMPLE}, "activation_memory_adapter.py",
                           {"PYTHONPATH=" KVCHECK_TEST_SDK_DIR}};
    ProcessLauncher launcher(command, {});
    const Hello hello = launcher.probe();
    EXPECT_EQ(hello.name, "activation-memory");
    EXPECT_TRUE(hello.copies_in_replies);
    const Trace trace = parse_trace(
        "add a modern/f32/3:[kv2 kv2]\n"
        "add b legacy/bf16/4:[kv1]\n"
        "h1 = get_cache a b\n"
        "generate h1 prompt=5,7 max=3\n"
        "h2 = get a\n"
        "generate h2 prompt=1 max=2\n"
        "dump slot=0\n"
        "delete_all\n"
        "load slot=0\n");
    const std::shared_ptr<Engine> first = launcher.make();
    const RunResult result = execute(trace, *first);
    EXPECT_FALSE(result.failure) << result.failure->property << ": " << result.failure->message;
    EXPECT_EQ(first->stored_ids(), (std::vector<std::string>{"a", "b"}));
    const int pid = launcher.process_id();
    ASSERT_TRUE(launcher.warm());  // the example offers warm starts:
    EXPECT_NE(parent_of(pid), ::getpid());  // the process is a copy of the fork server, not a child of this one
    const std::shared_ptr<Engine> second = launcher.make();
    EXPECT_EQ(launcher.process_id(), pid);  // the same process, reset
    EXPECT_TRUE(second->stored_ids().empty());
    EXPECT_THROW(first->stored_ids(), std::logic_error);
    second->make(expand(parse_cache_spec("modern/f32/1:[kv1]")), 3);
    EXPECT_TRUE(second->handle_facts(3).exists);
    EXPECT_FALSE(second->handle_facts(4).exists);
    try {
        second->view_handle(4);
        FAIL() << "no error";
    } catch (const std::runtime_error& error) {
        EXPECT_NE(std::string(error.what()).find("the adapter raised ValueError: handle 4 holds no cache"), std::string::npos)
            << error.what();
    }
}

// A thread-safe adapter (docs/protocol.md section 11a): several threads call
// the example store at once, each request in flight tagged with its id, and
// every thread gets the reply to its own call: its own id back from
// get_by_ids, whatever order the SDK's scheduler answered them in.
TEST(ProcessEngine, AThreadSafeAdapterAnswersEachCallOfSeveralInFlight) {
    ProcessCommand command{{KVCHECK_TEST_PYTHON, KVCHECK_TEST_EXAMPLE}, "activation_memory_adapter.py",
                           {"PYTHONPATH=" KVCHECK_TEST_SDK_DIR}};
    ProcessLauncher launcher(command, {});
    ASSERT_TRUE(launcher.probe().capabilities.thread_safe);
    const std::shared_ptr<Engine> engine = launcher.make();
    engine->remove_all();  // the reset goes out alone, before the threads' requests
    constexpr int threads_count = 4;
    constexpr int calls_per_thread = 12;
    const CacheContent content = expand(parse_cache_spec("modern/f32/1:[kv1]"));
    std::vector<std::string> mismatches[threads_count];
    std::vector<std::thread> threads;
    for (int t = 0; t < threads_count; ++t) {
        threads.emplace_back([&, t] {
            // A reply matched to another call reads as that call's answer,
            // or as a reply lacking this call's members (a protocol fault).
            try {
                for (int k = 0; k < calls_per_thread; ++k) {
                    const std::string id = "t" + std::to_string(t) + "-" + std::to_string(k);
                    engine->add(id, content, {});
                    const std::vector<std::optional<std::string>> got = engine->get_by_ids({id, "absent-" + id});
                    if (got.size() != 2 || got[0] != id || got[1].has_value()) {
                        mismatches[t].push_back(id + " got " + (got.empty() || !got[0] ? "none" : *got[0]));
                    }
                }
            } catch (const std::exception& error) {
                mismatches[t].push_back(error.what());
            }
        });
    }
    for (std::thread& thread : threads) thread.join();
    for (int t = 0; t < threads_count; ++t) EXPECT_TRUE(mismatches[t].empty()) << "thread " << t << ": " << mismatches[t][0];
    EXPECT_EQ(engine->stored_ids().size(), std::size_t{threads_count * calls_per_thread});
}

// A paged block manager behind the process boundary (docs/protocol.md
// section 11): the example manager through the SDK's BlockManagerAdapter
// runs a paged trace with every property checked, and reports itself paged
// only; its state comes with each operation's reply.
TEST(ProcessEngine, APagedAdapterRunsAPagedTrace) {
    ProcessCommand command{{KVCHECK_TEST_PYTHON, KVCHECK_TEST_BLOCK_MANAGER}, "block_manager_adapter.py",
                           {"PYTHONPATH=" KVCHECK_TEST_SDK_DIR}};
    ProcessLauncher launcher(command, {});
    const Hello hello = launcher.probe();
    EXPECT_EQ(hello.name, "block-manager");
    EXPECT_TRUE(hello.capabilities.paged);
    EXPECT_FALSE(hello.capabilities.store);
    const Trace trace = parse_trace(
        "paged_alloc seq=1 tokens=5,9,2 salt=0\n"
        "paged_step\n"
        "paged_alloc seq=2 tokens=5,9,7 salt=0\n"
        "paged_fork parent=2 child=3\n"
        "paged_append seq=3 count=2\n"
        "paged_lookup tokens=5,9,1 salt=1\n"
        "paged_import seq=4 modern/f32/7:[kv3 kv3]\n"
        "paged_export seq=4\n"
        "paged_export seq=3\n"
        "paged_step\n"
        "paged_free seq=1\n"
        "paged_free seq=2\n"
        "paged_free seq=3\n"
        "paged_free seq=4\n"
        "paged_evict\n"
        "paged_step\n"
        "paged_reset\n");
    const std::shared_ptr<Engine> engine = launcher.make();
    ASSERT_NE(engine->paged(), nullptr);
    const RunResult result = execute(trace, *engine);
    EXPECT_FALSE(result.failure) << result.failure->property << ": " << result.failure->message;
    const PagedState state = engine->paged()->paged_state();
    EXPECT_TRUE(state.tables.empty());
    EXPECT_EQ(state.free_queue.size(), 7u);
    EXPECT_TRUE(state.index.empty());
    // A refusal is the step's error, and the pool is as it was.
    EXPECT_THROW(engine->paged()->paged_alloc(5, PagedTokens(20, 1), 0), std::runtime_error);
    EXPECT_EQ(engine->paged()->paged_state(), state);
}

// The thread level over a process adapter (docs/semantics.md#the-thread-level):
// a lane waiting for its reply hands kvcheck's turn on (kvcheck::yield
// "reply"), so several requests are in flight to the example manager,
// served side by side under the SDK's scheduler, seeded by the run's seed
// ($KVCHECK_THREAD_SEED). The correct manager passes; its thread bug
// (unlocked_free: a release's read and store of a count with another
// client between them) is found, shrunk and replayed (flaky replays are
// reported with their rate: when a request reaches the adapter is not
// kvcheck's to choose); one client and the operation level (each call
// atomic) over the same requests never find it.
constexpr std::uint64_t thread_seed = 1;
constexpr std::size_t thread_traces = 60;

ProcessCommand block_manager_command(const std::string& bug) {
    ProcessCommand command{{KVCHECK_TEST_PYTHON, KVCHECK_TEST_BLOCK_MANAGER}, "block_manager_adapter.py",
                           {"PYTHONPATH=" KVCHECK_TEST_SDK_DIR, "KVCHECK_THREAD_SEED=" + std::to_string(thread_seed)}};
    if (!bug.empty()) command.argv.insert(command.argv.end(), {"--bug", bug});
    return command;
}

WorkloadOptions thread_options(const Hello& hello, std::int64_t lanes) {
    WorkloadOptions options;
    options.capabilities = hello.capabilities;
    options.lanes = lanes;
    options.threads = true;
    return options;
}

TEST(ProcessEngine, TheThreadLevelSendsSeveralRequestsAtOnceAndTheCorrectManagerPasses) {
    ProcessLauncher launcher(block_manager_command(""), {});
    const Hello hello = launcher.probe();
    ASSERT_TRUE(hello.capabilities.thread_safe);
    const EngineFactory make = [&] { return launcher.make(); };
    std::size_t waited = 0;  // runs where a client sent its request while another waited for its reply
    for (std::uint64_t seed = thread_seed; seed < thread_seed + 10; ++seed) {
        const ThreadRunResult run = run_threads(*make(), thread_plan(seed, thread_options(hello, 4)), {seed, std::nullopt});
        EXPECT_FALSE(run.failure) << run.failure->message;
        const auto handed_on = [](const std::string& line) { return line.find("paused at reply") != std::string::npos; };
        if (std::any_of(run.history.begin(), run.history.end(), handed_on)) ++waited;
    }
    EXPECT_GE(waited, 5u);
    const std::optional<ThreadFinding> found = search_threads(make, thread_options(hello, 4), thread_seed, thread_traces);
    EXPECT_FALSE(found) << format_thread_finding(*found);
}

TEST(ProcessEngine, TheThreadLevelFindsTheManagersUnlockedFreeAndOneClientDoesNot) {
    ProcessLauncher launcher(block_manager_command("unlocked_free"), {});
    const Hello hello = launcher.probe();
    const EngineFactory make = [&] { return launcher.make(); };
    const std::optional<ThreadFinding> found = search_threads(make, thread_options(hello, 4), thread_seed, thread_traces);
    ASSERT_TRUE(found) << "unlocked_free survived " << thread_traces << " thread-level traces";
    const std::string& property = found->result.failure->property;
    EXPECT_TRUE(property == "refcount-exact" || property == "free-iff-unreferenced") << format_thread_finding(*found);
    EXPECT_LE(found->plan.lanes.size() - 1, 3u) << format_thread_finding(*found);
    EXPECT_EQ(found->replays, 3u);
    std::cout << "[ threads  ] unlocked_free: found after " << found->traces << " traces\n" << format_thread_finding(*found);

    for (const std::int64_t lanes : {4, 1}) {
        for (std::uint64_t seed = thread_seed; seed < thread_seed + thread_traces; ++seed) {
            const RunResult run = execute(trace_for_seed(seed, thread_options(hello, lanes)), *make());
            ASSERT_FALSE(run.failure) << "found with --lanes " << lanes << " without threads, seed " << seed << ": "
                                      << run.failure->property << ": " << run.failure->message;
        }
    }
}

TEST(ProcessEngine, ColdStartsRunTheCommandAndCheckTheSame) {
    ProcessCommand command{{KVCHECK_TEST_PYTHON, KVCHECK_TEST_EXAMPLE}, "activation_memory_adapter.py",
                           {"PYTHONPATH=" KVCHECK_TEST_SDK_DIR}};
    LaunchOptions cold;
    cold.warm_starts = false;
    ProcessLauncher launcher(command, cold);
    launcher.probe();
    EXPECT_FALSE(launcher.warm());
    const Trace trace = parse_trace("add a modern/f32/3:[kv2 kv2]\nh1 = get a\ngenerate h1 prompt=5 max=2\n");
    const RunResult result = execute(trace, *launcher.make());
    EXPECT_FALSE(result.failure) << result.failure->property << ": " << result.failure->message;
    EXPECT_EQ(parent_of(launcher.process_id()), ::getpid());
}

// Protocol 4 (docs/protocol.md section 7a): turns, extracts and the fed
// views that check them cross the boundary; a turn that hands back a cache
// short of its last token (M30 in Python) fails the trace that holds a turn.
TEST(ProcessEngine, CachesTheModelMakesCrossTheBoundary) {
    const Trace trace = parse_trace(
        "add a modern/f32/3:[kv2 kv2]\n"
        "h1 = get a\n"
        "h2 = turn h1 prompt=5,7 max=3\n"
        "h3 = turn h2 prompt=4 max=2\n"
        "add_handle b h3\n"
        "generate h3 prompt=9 max=2\n"
        "extract c prompt=3,4,5\n"
        "generate h0 prompt=2 max=2\n"
        "h4 = turn h0 prompt=6 max=3\n"
        "add_handle d h4\n"
        "h5 = get d\n"
        "h6 = turn h5 prompt=1 max=2\n");
    LaunchOptions cold;
    cold.warm_starts = false;
    for (const char* bug : {"", "turn_drops_last_token"}) {
        ProcessCommand command{{KVCHECK_TEST_PYTHON, KVCHECK_TEST_EXAMPLE}, "activation_memory_adapter.py",
                               {"PYTHONPATH=" KVCHECK_TEST_SDK_DIR, std::string("KVCHECK_EXAMPLE_BUGS=") + bug}};
        ProcessLauncher launcher(command, cold);
        EXPECT_TRUE(launcher.probe().capabilities.returned_caches);
        const std::shared_ptr<Engine> engine = launcher.make();
        const RunResult result = execute(trace, *engine);
        if (*bug == '\0') {
            EXPECT_FALSE(result.failure) << result.failure->property << ": " << result.failure->message;
            EXPECT_EQ(engine->stored_ids(), (std::vector<std::string>{"a", "b", "c", "d"}));
        } else {
            ASSERT_TRUE(result.failure);
            EXPECT_EQ(result.failure->property, "generation-equivalent") << result.failure->message;
            EXPECT_EQ(result.failure->step, 2u) << result.failure->message;
        }
    }
}

TEST_F(ProcessTest, AResetThatFailsIsAStartFaultOfTheNextEnginesFirstRequest) {
    ProcessFault seen;
    LaunchOptions options;
    options.on_fault = [&seen](const ProcessFault& fault) { seen = fault; };
    ProcessLauncher launcher(fault_adapter("reset"), options);
    const std::shared_ptr<Engine> first = launcher.make();
    EXPECT_THROW(first->stored_ids(), std::runtime_error);  // the engine's error: no reset went with it
    EXPECT_EQ(seen.kind, "");
    const std::shared_ptr<Engine> second = launcher.make();
    try {
        second->stored_ids();
        FAIL() << "no fault";
    } catch (const ProcessError& error) {
        EXPECT_EQ(error.fault().kind, "start");
        EXPECT_EQ(error.fault().detail, "the adapter could not make a fresh engine: the adapter raised RuntimeError: the store is locked");
    }
    EXPECT_EQ(seen.kind, "start");
    EXPECT_EQ(launcher.process_id(), -1);
}

// The example store behind bare_adapter.py, which logs the requests it
// receives; `bare`: its replies carry no fact a request did not ask for.
struct LoggedRun {
    RunResult result;
    std::map<std::string, int> requests;  // by op; "reset" for each reset, alone or with a request
};

LoggedRun run_logged(const Trace& trace, bool bare, const std::string& log, const std::string& bug = "") {
    std::vector<std::string> argv{KVCHECK_TEST_PYTHON, KVCHECK_TEST_BARE_ADAPTER, "--log", log};
    if (bare) argv.push_back("--bare");
    if (!bug.empty()) argv.insert(argv.end(), {"--bug", bug});
    ProcessLauncher launcher({argv, "bare_adapter.py", {"PYTHONPATH=" KVCHECK_TEST_SDK_DIR}}, {});
    LoggedRun run;
    // Two engines: the second's trace starts with a reset.
    for (int engine = 0; engine < 2; ++engine) {
        const std::shared_ptr<Engine> made = launcher.make();
        run.result = execute(trace, *made);
        if (run.result.failure) break;
    }
    std::ifstream in(log);
    for (std::string op; std::getline(in, op);) ++run.requests[op];
    return run;
}

TEST_F(ProcessTest, FactsInRepliesSpareRequestsAndABareAdapterIsCheckedTheSame) {
    const Trace trace = parse_trace(
        "add a modern/f32/3:[kv2 kv2] meta=7\n"
        "add b legacy/bf16/4:[kv1]\n"
        "h1 = get a\n"
        "generate h1 prompt=5,7 max=2\n"
        "h2 = get_cache a b\n"
        "dump slot=0\n"
        "delete_all\n"
        "load slot=0\n"
        "h3 = get b\n");
    const LoggedRun full = run_logged(trace, false, dir_ + "/full.log");
    const LoggedRun bare = run_logged(trace, true, dir_ + "/bare.log");
    ASSERT_FALSE(full.result.failure) << full.result.failure->property << ": " << full.result.failure->message;
    ASSERT_FALSE(bare.result.failure) << bare.result.failure->property << ": " << bare.result.failure->message;
    EXPECT_EQ(full.result.steps_run, bare.result.steps_run);
    // What the full adapter's replies carried, the bare one was asked for.
    for (const char* op : {"entry_metadata", "handle_metadata", "read_entries", "stored_ids"}) {
        EXPECT_EQ(full.requests.count(op), 0u) << op << " asked of the adapter that reports it";
        EXPECT_GT(bare.requests.count(op), 0u) << op << " never asked of the bare adapter";
    }
    // One reset, sent with the second engine's first request.
    EXPECT_EQ(full.requests.at("reset"), 1);
    EXPECT_EQ(bare.requests.at("reset"), 1);
}

TEST_F(ProcessTest, ABareAdaptersBugIsCaughtAsAFullOnesIs) {
    // A planted bug: a stored cache handed to the model (stored-immutable).
    const Trace trace = parse_trace(
        "add a modern/f32/3:[kv2 kv2]\n"
        "h1 = get_cache a\n"
        "generate h1 prompt=5 max=2\n"
        "h2 = get a\n"
        "generate h2 prompt=1 max=2\n");
    for (const bool bare : {false, true}) {
        const LoggedRun run = run_logged(trace, bare, dir_ + (bare ? "/bare.log" : "/full.log"), "stored_to_generation");
        ASSERT_TRUE(run.result.failure) << (bare ? "bare" : "full");
        EXPECT_EQ(run.result.failure->property, "stored-immutable") << run.result.failure->message;
    }
}

}  // namespace
}  // namespace kvcheck::process
