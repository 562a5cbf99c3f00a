// The plugin entry point: what `kvcheck run --adapter vector-engine.so`
// loads. The same sources build two plugins; VECTOR_ENGINE_SHALLOW selects
// the one with the planted ownership bug (see Depth in cache.h).
#include "adapter.h"

#include <kvcheck/plugin.h>

#ifdef VECTOR_ENGINE_SHALLOW
namespace {
class ShallowVectorEngine final : public vector_engine::VectorEngine {
  public:
    ShallowVectorEngine() : VectorEngine(vector_engine::Depth::shallow) {}
};
}  // namespace

KVCHECK_PLUGIN(ShallowVectorEngine, "vector-engine-shallow",
               "vector engine whose copies share their source's K/V buffers, and whose model appends into them in place")
#else
KVCHECK_PLUGIN(vector_engine::VectorEngine, "vector-engine",
               "a torch-free engine keeping K/V in std::vector<float>, both layouts, its own dump format")
#endif
