// The paged family over the adapter protocol (docs/protocol.md, "Paged
// requests"): how a PagedState and an export are read from replies. Kept
// apart from wire.h (the contiguous family's messages). Reading throws
// ProtocolError naming the member at fault.
//
//   PagedState state = read_paged_state(member(reply, "state"));
#pragma once

#include "json.h"
#include "kvcheck/paged.h"

namespace kvcheck::process {

// {"block_tokens", "blocks": [{count, key?, tokens, written, digest|view}],
//  "free_queue", "index": [{key, blocks}], "tables": [{seq, blocks, tokens}],
//  "copies": [{source, destination}]}
PagedState read_paged_state(const Json& state);
PagedKey read_paged_key(const Json& key);

}  // namespace kvcheck::process
