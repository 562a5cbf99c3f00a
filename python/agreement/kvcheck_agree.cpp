// What kvcheck's C++ side computes for each case of an agreement corpus
// (python/agreement/corpus.txt), printed for the Python SDK's test to
// compare with its own computation of the same facts:
//
//   case <n> digest <expected view digest>
//   case <n> slot <layer> <slot> <present 0|1> <dtype> <shape> <hash>
//   case <n> view <view digest of the cache the C++ reference builds>
//   case <n> tokens <prompt> <token,...>      (generate over a clone of it)
//   case <n> error <prompt> <message>         (generate refused the cache)
//   case <n> recompute <prompt> <token,...>   (memory cases: without a cache)
//   case <n> next <token>                      (extra and window cases: the forward's next token)
//   case <n> decoded <token,...>               (window cases: tokens decoded one forward each)
//   hash <count> <content_hash of hash_probe(count)>   (for "hashes <max>")
//   badspec <n> <parse_cache_spec's message>           (for "badspec <text>")
//
// Usage: kvcheck_agree <corpus file>. Exit 2 on a malformed corpus, naming
// the line.
#include "kv/generation.h"
#include "kv/models.h"
#include "kvcheck/content.h"
#include "reference/cache_views.h"
#include "reference/reference_engine.h"

#include <cstdint>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Tokens = std::vector<std::int64_t>;

struct Corpus {
    std::vector<Tokens> prompts;
    std::int64_t max_new = 0;
};

Tokens parse_tokens(const std::string& text) {
    Tokens tokens;
    std::stringstream in(text);
    std::string word;
    while (std::getline(in, word, ',')) tokens.push_back(std::stoll(word));
    if (tokens.empty()) throw std::invalid_argument("no tokens in '" + text + "'");
    return tokens;
}

std::string join(const Tokens& tokens) {
    std::string text;
    for (std::size_t i = 0; i < tokens.size(); ++i) text += (i ? "," : "") + std::to_string(tokens[i]);
    return text;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
    std::string text = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
    return text + "]";
}

at::ScalarType scalar_type(const std::string& dtype) {
    if (dtype == "f32") return at::kFloat;
    if (dtype == "f16") return at::kHalf;
    if (dtype == "bf16") return at::kBFloat16;
    throw std::invalid_argument("bad dtype '" + dtype + "'");
}

kv::Layout layout_of(const std::string& layout) {
    if (layout == "modern") return kv::Layout::modern;
    if (layout == "legacy") return kv::Layout::legacy;
    throw std::invalid_argument("bad layout '" + layout + "'");
}

// count values exact in float32, a -0 among them, and a +0: the probe of
// content_hash at every length from 0.
std::vector<float> hash_probe(std::size_t count) {
    std::vector<float> values(count);
    for (std::size_t i = 0; i < count; ++i) {
        values[i] = i % 7 == 3 ? -0.0f : static_cast<float>((i * 37) % 101) / 8.0f - 6.0f;
    }
    return values;
}

void print_expected(int number, const kvcheck::CacheContent& content) {
    const kvcheck::CacheView view = kvcheck::expected_view(content);
    std::cout << "case " << number << " digest " << kvcheck::view_digest(view) << "\n";
    for (std::size_t i = 0; i < view.layers.size(); ++i) {
        for (int s = 0; s < kvcheck::slot_count; ++s) {
            const kvcheck::SlotView& slot = view.layers[i].slots[s];
            std::cout << "case " << number << " slot " << i << " " << s << " " << slot.present << " "
                      << (slot.present ? kvcheck::dtype_name(slot.dtype) : "-") << " "
                      << (slot.present ? shape_text(slot.shape) : "-") << " " << (slot.present ? slot.hash : 0)
                      << "\n";
        }
    }
}

// Generation from each prompt over `cache` (cloned by the boundary unless
// owned, so `cache` serves every prompt unchanged).
void print_generations(int number, const Corpus& corpus, const kv::CachePtr& cache) {
    kv::models::Decoder decoder({});
    kv::Copier copier;
    for (std::size_t p = 0; p < corpus.prompts.size(); ++p) {
        const kv::CachePtr working = cache->owned() ? kv::clone(*cache) : cache;
        try {
            const Tokens tokens = kv::generate(decoder, copier, corpus.prompts[p], working, corpus.max_new);
            std::cout << "case " << number << " tokens " << p << " " << join(tokens) << "\n";
        } catch (const std::invalid_argument& error) {
            std::cout << "case " << number << " error " << p << " " << error.what() << "\n";
        }
    }
}

void run_case(int number, const std::string& kind, const std::string& rest, const Corpus& corpus) {
    if (kind == "spec") {
        const kvcheck::CacheContent content = kvcheck::expand(kvcheck::parse_cache_spec(rest));
        print_expected(number, content);
        const kv::CachePtr cache = kvcheck::adapters::materialize(content);
        std::cout << "case " << number << " view " << kvcheck::view_digest(kvcheck::adapters::view_of(*cache)) << "\n";
        print_generations(number, corpus, cache);
    } else if (kind == "merge") {
        std::vector<kvcheck::CacheContent> contents;
        std::vector<kv::ConstCachePtr> parts;
        // The parts are separated by " + " (a spec holds spaces).
        for (std::size_t from = 0; from <= rest.size();) {
            std::size_t plus = rest.find(" + ", from);
            if (plus == std::string::npos) plus = rest.size();
            contents.push_back(kvcheck::expand(kvcheck::parse_cache_spec(rest.substr(from, plus - from))));
            parts.push_back(kvcheck::adapters::materialize(contents.back()));
            from = plus + 3;
        }
        print_expected(number, kvcheck::expected_concat(contents));
        const kv::CachePtr merged = kv::concat(parts);
        std::cout << "case " << number << " view " << kvcheck::view_digest(kvcheck::adapters::view_of(*merged)) << "\n";
        print_generations(number, corpus, merged);
    } else if (kind == "memory") {
        std::stringstream in(rest);
        std::string layout, dtype, tokens;
        if (!(in >> layout >> dtype >> tokens)) throw std::invalid_argument("expected <layout> <dtype> <tokens>");
        kv::models::Decoder decoder({});
        const Tokens memory = parse_tokens(tokens);
        const kv::CachePtr cache = kv::models::memory_cache(decoder, memory, layout_of(layout), scalar_type(dtype));
        std::cout << "case " << number << " view " << kvcheck::view_digest(kvcheck::adapters::view_of(*cache)) << "\n";
        print_generations(number, corpus, cache);
        for (std::size_t p = 0; p < corpus.prompts.size(); ++p) {
            Tokens sequence = memory;
            sequence.insert(sequence.end(), corpus.prompts[p].begin(), corpus.prompts[p].end());
            const Tokens tokens = kv::models::generate_without_cache(decoder, sequence, corpus.max_new);
            std::cout << "case " << number << " recompute " << p << " " << join(tokens) << "\n";
        }
    } else if (kind == "extra") {
        std::stringstream in(rest);
        std::string extra, tokens;
        if (!(in >> extra >> tokens)) throw std::invalid_argument("expected <extra keys> <tokens>");
        kv::models::Decoder decoder({});
        const kv::CachePtr cache = kv::Cache::make(kv::Layout::modern);
        const std::int64_t next = decoder.forward_extra(parse_tokens(tokens), *cache, extra);
        std::cout << "case " << number << " view " << kvcheck::view_digest(kvcheck::adapters::view_of(*cache)) << "\n";
        std::cout << "case " << number << " next " << next << "\n";
    } else if (kind == "window") {
        std::stringstream in(rest);
        std::int64_t window = 0;
        std::string tokens;
        if (!(in >> window >> tokens)) throw std::invalid_argument("expected <window> <tokens>");
        kv::models::DecoderConfig config;
        config.window = window;
        kv::models::Decoder decoder(config);
        const kv::CachePtr cache = kv::Cache::make(kv::Layout::modern);
        std::int64_t next = decoder.forward_extra(parse_tokens(tokens), *cache, "");
        std::cout << "case " << number << " view " << kvcheck::view_digest(kvcheck::adapters::view_of(*cache)) << "\n";
        std::cout << "case " << number << " next " << next << "\n";
        Tokens decoded;
        for (std::int64_t i = 0; i < corpus.max_new; ++i) {
            decoded.push_back(next);
            next = decoder.forward_extra({next}, *cache, "");
        }
        std::cout << "case " << number << " decoded " << join(decoded) << "\n";
    } else {
        throw std::invalid_argument("unknown case kind '" + kind + "'");
    }
}

int run(const char* path) {
    std::ifstream file(path);
    if (!file) {
        std::cerr << "kvcheck_agree: cannot read " << path << "\n";
        return 2;
    }
    Corpus corpus;
    std::string line;
    int line_number = 0;
    int case_number = 0;
    while (std::getline(file, line)) {
        ++line_number;
        if (line.empty() || line[0] == '#') continue;
        const std::size_t space = line.find(' ');
        const std::string kind = line.substr(0, space);
        const std::string rest = space == std::string::npos ? "" : line.substr(space + 1);
        try {
            if (kind == "prompts") {
                std::stringstream in(rest);
                std::string word;
                while (in >> word) corpus.prompts.push_back(parse_tokens(word));
            } else if (kind == "max_new") {
                corpus.max_new = std::stoll(rest);
            } else if (kind == "badspec") {
                try {
                    kvcheck::parse_cache_spec(rest);
                    std::cout << "badspec " << line_number << " accepted\n";
                } catch (const std::invalid_argument& error) {
                    std::cout << "badspec " << line_number << " " << error.what() << "\n";
                }
            } else if (kind == "hashes") {
                for (std::size_t count = 0; count <= std::stoul(rest); ++count) {
                    const std::vector<float> values = hash_probe(count);
                    std::cout << "hash " << count << " " << kvcheck::content_hash(values.data(), values.size()) << "\n";
                }
            } else {
                run_case(case_number++, kind, rest, corpus);
            }
        } catch (const std::exception& error) {
            std::cerr << "kvcheck_agree: " << path << ":" << line_number << ": " << error.what() << "\n";
            return 2;
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: kvcheck_agree <corpus file>\n";
        return 2;
    }
    return run(argv[1]);
}
