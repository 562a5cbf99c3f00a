// kvcheck run --report html: one self-contained page (inline style and SVG,
// no script, nothing fetched): the property x adapter table (a colour per
// verdict, the traces run and the seconds each took), each failure as a
// step-by-step picture of its shrunk trace (picture.h: one column per step,
// the stored entries and live handles as boxes, storage shared between two
// boxes drawn as a link, the failing step and the boxes its check names
// highlighted, the check's message beside them, the replay command to
// copy), and the coverage of --stats as a bar chart.
//
// The page's structure is part of its contract (a browser test reads it):
// the failing column is `.step.failing`, a box is `.box` with `data-name`,
// the boxes its check names are `.culprit`, a link is `path.link` with
// `data-from` and `data-to`, the replay command is `pre.replay`.
#pragma once

#include "conformance.h"
#include "picture.h"

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace kvcheck::cli {

// (adapter, property, failure): indices into ConformanceRun::adapters,
// AdapterResult::properties and PropertyResult::failures.
using PictureKey = std::tuple<std::size_t, std::size_t, std::size_t>;
using Pictures = std::map<PictureKey, FailurePicture>;

// The pictures of every failure of the run that has one (a property's
// failure with a shrunk trace; not a fault nor an engine-error group), at
// most `per_property_max` per property.
Pictures picture_failures(const std::vector<AdapterResult>& results, const ConformanceOptions& options,
                          std::size_t per_property_max = 3);

std::string render_html(const std::vector<AdapterResult>& results, std::uint64_t seed, int interrupted_by,
                        const Pictures& pictures);

}  // namespace kvcheck::cli
