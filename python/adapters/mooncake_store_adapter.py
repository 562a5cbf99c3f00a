"""kvcheck's adapter for Mooncake's distributed store (mooncake-transfer-engine-
non-cuda 0.3.13.post1): `MooncakeDistributedStore` (put, get, upsert, remove
of tensors over its transfer engine, TCP on 127.0.0.1) against a
`mooncake_master` of the same wheel, started by this adapter on a free port
of 127.0.0.1, one master and one client per adapter process (made at the
first operation, after kvcheck's fork server has copied the process: the
client runs threads, which a fork would not copy).

    .venv/bin/python -m pip install --no-deps --target \\
        .venv/engines/mooncake-transfer-engine-non-cuda-0.3.13.post1 mooncake-transfer-engine-non-cuda==0.3.13.post1
    PYTHONPATH=.venv/engines/mooncake-transfer-engine-non-cuda-0.3.13.post1 kvcheck run \\
        --python .venv/bin/python --adapter python/adapters/mooncake_store_adapter.py

STATUS: a prototype, not in CI, not pinned in python/requirements (so
scripts/bootstrap does not install its 46 MB wheel). At 20 traces a property
(seed 20261202, --jobs 2, load about 10) stored-immutable, layout-roundtrip,
merge-correct, generation-equivalent and store-contract pass, engine-error
passes; single-copy, owned-marker, clone-independent and dump-safe are
skipped (declared). Two adapter faults were fixed on the way: a new object
per read of a stored entry let the SDK's digest of a freed object's
identity stand for another entry's ("entry_digest disagrees with its
view_entry", flaky; stored_cache now keeps one object while the K/V read are
the same), and a listing of one is_exist call an id made a 64-item fill
time out (batch_is_exist now).

| kvcheck | Mooncake 0.3.13.post1 |
|---|---|
| add(id, cache) | `upsert_tensor(key(id), kv)`: the K/V as one tensor [2, layers, tokens, heads x head_dim] (the store copies it into its segment) |
| get(id) | `get_tensor(key(id))`: a copy, handed out as the stored item (read-only: not owned) |
| get_cache(ids) | `get_tensor` of each, in request order; several: their merge |
| delete(ids), delete_all | `remove(key, force=True)` of each |
| listing | the ids stored, in insertion order, that `is_exist` still finds (Mooncake lists nothing) |
| generate | the SDK's decoder on a copy (or on a get_cache copy itself) |

Declared, not papered over (docs/semantics.md, "Real engines: declared
contract differences"): every read is a copy out of Mooncake's segment, so
there are no storage identities, owned marker or copy log (single-copy,
owned-marker and clone-independent are skipped); leases are wall-clock (a
get leases an object for `default_kv_lease_ttl`, 10 s, and a remove in that
time is refused), which kvcheck's traces do not model: delete is a forced
remove (`remove(key, force=True)`, which skips the lease). (A lease of 0 ms
fails every get: LEASE_EXPIRED before the transfer ends.) No capacity is declared: the segments are far larger than
any trace stores.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import socket
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the SDK, when run from the source tree

import torch  # noqa: E402

torch.set_num_threads(1)  # one thread until the client starts (the SDK's fork server)

import mooncake  # noqa: E402

from kvcheck_adapter import cache as kv  # noqa: E402
from kvcheck_adapter import decoder as models  # noqa: E402
from kvcheck_adapter.adapter import Adapter, serve  # noqa: E402

from _decoder_calls import DecoderCalls  # noqa: E402

VERSION = "0.3.13.post1"
LAYERS, HEADS, HEAD_DIM = 2, 2, 4  # the SDK decoder's geometry
SEGMENT_BYTES = 256 * 1024 * 1024
BUFFER_BYTES = 64 * 1024 * 1024
MASTER = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def die_with_parent() -> None:
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


class _Cluster:
    """This process's master and client, made on first use."""

    store = None
    master = None
    owner = None  # the process that made them: a fork copy makes its own

    @classmethod
    def client(cls):
        if cls.store is None or cls.owner != os.getpid():
            cls.owner = os.getpid()
            port = free_port()
            cls.master = subprocess.Popen(
                [MASTER, "-rpc_address", "127.0.0.1", "-rpc_port", str(port), "-metrics_port", str(free_port())],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
            atexit.register(cls.master.kill)
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or cls.master.poll() is not None:
                        raise RuntimeError(f"mooncake_master did not listen on 127.0.0.1:{port}")
                    time.sleep(0.05)
            from mooncake.store import MooncakeDistributedStore

            store = MooncakeDistributedStore()
            status = store.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT_BYTES, BUFFER_BYTES, "tcp", "",
                                 f"127.0.0.1:{port}")
            if status != 0:
                raise RuntimeError(f"MooncakeDistributedStore.setup returned {status}")
            cls.store = store
        return cls.store


def kv_tensor(cache) -> torch.Tensor:
    keys = [kv.logical_keys(cache, i) for i in range(kv.layer_count(cache))]
    values = [kv.logical_values(cache, i) for i in range(kv.layer_count(cache))]
    tokens = keys[0].shape[2]
    flat = [torch.stack([t[0].permute(1, 0, 2).reshape(tokens, HEADS * HEAD_DIM) for t in side]) for side in (keys, values)]
    return torch.stack(flat).contiguous()


def cache_of(tensor: torch.Tensor, owned: bool) -> kv.DynamicCache:
    tokens = tensor.shape[2]
    cache = kv.DynamicCache()
    for layer in range(LAYERS):
        piece = kv.DynamicLayer()
        piece.keys, piece.values = (tensor[side, layer].reshape(tokens, HEADS, HEAD_DIM).permute(1, 0, 2).unsqueeze(0).contiguous()
                                    for side in (0, 1))
        piece.is_initialized = True
        cache.layers.append(piece)
    kv.set_owned(cache, owned)
    return cache


class MooncakeStoreAdapter(DecoderCalls, Adapter):
    name = f"mooncake-{VERSION}"
    description = f"Mooncake {VERSION}'s MooncakeDistributedStore (python/adapters/mooncake_store_adapter.py)"
    model = {"layers": LAYERS, "heads": HEADS, "head_dim": HEAD_DIM, "dtypes": ["f32"], "layouts": ["modern"],
             "odd_layers": False}
    capabilities = {
        "legacy_layout": False, "modern_layout": True, "conversions": False, "half_dtypes": False,
        "one_sided_layers": False, "legacy_slot_names": False, "uninitialized_layers": False,
        "generate_stream": False, "storage_identity": False, "copy_log": False, "owned_marker": False,
    }
    owned = "derived"

    def __init__(self, model):
        self.model_ = model
        self.ids = []  # insertion order
        self.prefix = f"kvcheck-{os.getpid()}-{time.monotonic_ns()}/"
        self.cleared = False
        self.reads = {}  # id -> (the K/V last read, its cache): stored_cache

    @property
    def store(self):
        store = _Cluster.client()
        self.cleared = True  # a fresh engine has a key prefix of its own: nothing of an earlier trace
        return store

    def key(self, id):
        return self.prefix + id

    def fetch(self, id, owned):
        tensor = self.store.get_tensor(self.key(id))
        if tensor is None:
            raise KeyError(id)
        return cache_of(tensor, owned)

    # ---- the store ----

    def add(self, id, cache, metadata):
        status = self.store.upsert_tensor(self.key(id), kv_tensor(cache))
        if status != 0:
            raise RuntimeError(f"upsert_tensor({id!r}) returned {status}")
        self.reads.pop(id, None)  # a new entry: a new object
        if id not in self.ids:
            self.ids.append(id)

    def present(self, id) -> bool:
        return id in self.ids and self.store.is_exist(self.key(id)) == 1

    def get(self, id):
        return self.fetch(id, owned=False) if self.present(id) else None

    def get_by_ids(self, ids):
        present = set(self.get_all_ids())
        return [id if id in present else None for id in ids]

    def get_all_ids(self):
        if not self.ids:
            return []
        found = self.store.batch_is_exist([self.key(id) for id in self.ids])
        return [id for id, exists in zip(self.ids, found) if exists == 1]

    def get_cache(self, ids):
        present = set(self.get_all_ids())
        parts = [self.fetch(id, owned=True) for id in ids if id in present]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else kv.concat(parts)

    def delete(self, ids):
        for id in ids:
            if id in self.ids:
                status = self.store.remove(self.key(id), True)  # force: past the read lease (wall-clock)
                if status != 0:
                    raise RuntimeError(f"remove({id!r}) returned {status}")
                self.ids.remove(id)
                self.reads.pop(id, None)

    def delete_all(self):
        self.delete(list(self.ids))

    def stored_cache(self, id):
        """Read from Mooncake at every call; the same object while the K/V
        read are the same (the SDK keys what it has read of a cache by the
        object, and a new object a read could take a freed one's identity)."""
        tensor = self.store.get_tensor(self.key(id))
        if tensor is None:
            raise KeyError(id)
        held = self.reads.get(id)
        if held is None or not torch.equal(held[0], tensor):
            held = self.reads[id] = (tensor, cache_of(tensor, owned=False))
        return held[1]

    def storage(self, cache):
        return []


def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    model = models.Decoder()
    serve(lambda: MooncakeStoreAdapter(model))


if __name__ == "__main__":
    main()
