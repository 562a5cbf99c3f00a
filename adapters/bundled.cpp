#include "bundled.h"

#include "mutants/mutants.h"
#include "reference/paged_reference.h"
#include "reference/reference_engine.h"

namespace kvcheck::adapters {

const std::vector<Adapter>& bundled() {
    static const std::vector<Adapter> adapters = [] {
        std::vector<Adapter> all = {{"reference", "the reference implementation", "bundled", {},
                                     [] { return std::shared_ptr<Engine>(std::make_shared<ReferenceEngine>()); }}};
        all.push_back({"reference-leases",
                       "the reference with read leases of 4 ms on kvcheck's virtual clock, in a store of 3 entries (lru) that never evicts a leased one (docs/semantics.md#leases)",
                       "bundled", {}, [] {
                           auto engine = std::make_shared<ReferenceEngine>();
                           engine->enable_bundled_leases();
                           engine->rename("reference-leases");
                           return std::shared_ptr<Engine>(std::move(engine));
                       }});
        all.push_back({"reference-window",
                       "the reference over a model of attention window 4: it stores and hands out the last 4 tokens of every cache",
                       "bundled", {}, [] {
                           auto engine = std::make_shared<ReferenceEngine>();
                           engine->rename("reference-window");
                           engine->set_window(reference_window);
                           return std::shared_ptr<Engine>(std::move(engine));
                       }});
        all.push_back({"reference-quantized",
                       "the reference as a quantized store: every cache it builds holds its values on the bfloat16 grid, and it declares that rounding's content tolerance (docs/semantics.md#content-tolerance)",
                       "bundled", {}, [] {
                           auto engine = std::make_shared<ReferenceEngine>();
                           engine->rename("reference-quantized");
                           engine->quantize();
                           return std::shared_ptr<Engine>(std::move(engine));
                       }});
        for (Adapter& mutant : mutant_adapters()) all.push_back(std::move(mutant));
        all.push_back({"paged-reference", "the paged reference: a block pool with a prefix index (and the reference store)",
                       "bundled", {}, [] {
                           auto engine = std::make_shared<PagedReference>();
                           engine->rename("paged-reference");
                           return std::shared_ptr<Engine>(std::move(engine));
                       }});
        all.push_back({"paged-reference-window",
                       "the paged reference over a model of attention window 3: blocks behind every window are freed",
                       "bundled", {}, [] {
                           auto engine = std::make_shared<PagedReference>(nullptr, PagedReference::window_config());
                           engine->rename("paged-reference-window");
                           return std::shared_ptr<Engine>(std::move(engine));
                       }});
        for (Adapter& mutant : paged_mutant_adapters()) all.push_back(std::move(mutant));
        for (Adapter& mutant : lane_mutant_adapters()) all.push_back(std::move(mutant));
        return all;
    }();
    return adapters;
}

const Adapter* find_bundled(const std::string& name) {
    for (const Adapter& adapter : bundled()) {
        if (adapter.name == name) return &adapter;
    }
    return nullptr;
}

}  // namespace kvcheck::adapters
