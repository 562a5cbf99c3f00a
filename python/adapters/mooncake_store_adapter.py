"""kvcheck's adapter for Mooncake's distributed store (mooncake-transfer-engine-
non-cuda 0.3.13.post1): `MooncakeDistributedStore` (put, get, upsert, remove
of tensors over its transfer engine, TCP on 127.0.0.1) against a
`mooncake_master` of the same wheel, which this adapter starts on free ports
of 127.0.0.1 (RPC and metrics; nothing listens beyond the loopback): one
master and one client per adapter process, made at the first operation,
after kvcheck's fork server has copied the process (the client runs
threads, which a fork would not copy).

    PYTHONPATH=.venv/engines/mooncake-0.3.13.post1 kvcheck run --python .venv/bin/python \\
        --adapter python/adapters/mooncake_store_adapter.py
    PYTHONPATH=.venv/engines/mooncake-0.3.13.post1 kvcheck run --python .venv/bin/python \\
        --adapter 'python/adapters/mooncake_store_adapter.py --write from'
    PYTHONPATH=.venv/engines/mooncake-0.3.13.post1 kvcheck run --python .venv/bin/python \\
        --adapter 'python/adapters/mooncake_store_adapter.py --replicas 2'

Installed by scripts/bootstrap from python/requirements/mooncake-0.3.13.post1.txt.

| kvcheck | Mooncake 0.3.13.post1 |
|---|---|
| add(id, cache) | `upsert_tensor(key(id), kv)`: the K/V as one tensor [2, layers, tokens, heads x head_dim] (the store copies it into its segment); `--write from`: the K/V written into one registered staging buffer the adapter reuses for every add, `upsert_from(key, ptr, size)`, then the buffer is overwritten at once (the zero-copy write of Mooncake's docs: the buffer is the caller's again when the call returns) |
| add, `--replicas 2` | `upsert(key, bytes, ReplicateConfig(replica_num=2))` through the first client: one replica in each client's segment (checked with `get_replica_desc` after every write) |
| get(id) | `get_tensor(key(id))`: a copy, handed out as the stored item (read-only: not owned); `--write from` and `--replicas 2`: `get(key)` (bytes), with `--replicas 2` through the second client (Mooncake reads its own, local replica first) |
| get_cache(ids) | `get_tensor` of each, in request order; several: their merge |
| delete(ids), delete_all | `remove(key, force=True)` of each |
| listing | the ids stored, in insertion order, that `batch_is_exist` (of the reading client) still finds (Mooncake lists nothing) |
| generate | the SDK's decoder on a copy (or on a get_cache copy itself) |

The master and its end: it is this process's child, killed by the kernel
when this process dies however it dies (PR_SET_PDEATHSIG, checked against a
parent that died before it was set), and killed and reaped at a normal exit;
its log goes to an unlinked temporary file, quoted in the error when it
does not start. A port taken between the probe and the master's bind is
retried on new ports (the master exits with status 1 and says nothing
then). Every status Mooncake returns is checked: an error
names the call, the code and its name (`ErrorCode`, mooncake-store/include/
types.h). At a normal exit the client is closed first, then the master
killed (a client torn down after its master waits out RPC retries, about
15 s). Mooncake's client logs its set-up (glog, INFO) on the adapter's
output.

Declared, not papered over (docs/semantics.md, "Real engines: declared
contract differences"): every read is a copy out of Mooncake's segment, so
there are no storage identities, owned marker or copy log (single-copy,
owned-marker and clone-independent are skipped). Leases are the master's
wall clock: a get or an existence check (`is_exist`, `batch_is_exist`, so
this adapter's listing too) leases an object for `default_kv_lease_ttl`,
10 s; a write leases nothing. Within a lease a remove is refused with
OBJECT_HAS_LEASE, but an upsert is not: it replaces the value (in place
when the size is the same; `MasterService::UpsertStart` refuses only while
a read is in flight, OBJECT_REPLICA_BUSY). kvcheck's leases are on its
virtual clock and hold off a replacement as well, so none of this is
mapped: delete is a forced remove (`remove(key, force=True)`, which skips
the lease). No capacity is declared: a write that finds the segment full
is refused (NO_AVAILABLE_HANDLE) and the master evicts later, in a thread
that wakes every 10 ms, a fraction (`eviction_ratio`, 5 %, or the excess
over the 90 % watermark) of the objects whose lease expired, soft-pinned
ones last; while every object is leased it evicts none and every write
is refused (measured: python/engine_tests/test_mooncake_store.py). kvcheck's
bounded store makes room within the add instead, so Mooncake's eviction
is time, not an operation; the segment (32 MiB) is far above any trace (at
most about 130 entries of at most 64 KiB, and a finished engine's keys are
removed), so nothing is evicted. `put` is not used: a put of a key that
exists returns 0 and keeps the old value (insert-if-absent, measured; known
upstream as kvcache-ai/Mooncake#346), so add, which overwrites, is an upsert.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import weakref

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the SDK, when run from the source tree

import torch  # noqa: E402

torch.set_num_threads(1)  # one thread until the client starts (the SDK's fork server)

from kvcheck_adapter import cache as kv  # noqa: E402
from kvcheck_adapter import decoder as models  # noqa: E402
from kvcheck_adapter.adapter import Adapter, serve  # noqa: E402
from kvcheck_adapter.protocol import _die_with_parent  # noqa: E402

from _decoder_calls import DecoderCalls  # noqa: E402

VERSION = "0.3.13.post1"
LAYERS, HEADS, HEAD_DIM = 2, 2, 4  # the SDK decoder's geometry
# The global segment this client mounts: more than three times what any
# trace stores (at most about 130 entries of at most 64 KiB), below the
# master's eviction watermark (90 %) by far.
SEGMENT_BYTES = 32 * 1024 * 1024
BUFFER_BYTES = 8 * 1024 * 1024  # its local buffer: a get's staging (an entry of at most 256 KiB)
STAGING_BYTES = 1024 * 1024  # --write from: above any entry (64 KiB) and a merge of 4 stored back
# Found, not imported: importing the package (its buffer pool loads the
# store's library) starts 5 threads, and the SDK's fork server then refuses
# every warm start (each property's adapter would import torch cold).
_PACKAGE = importlib.util.find_spec("mooncake")
if _PACKAGE is None:
    raise ModuleNotFoundError("No module named 'mooncake' (scripts/bootstrap installs it in "
                              ".venv/engines/mooncake-0.3.13.post1: put that on PYTHONPATH)", name="mooncake")
MASTER = os.path.join(os.path.dirname(_PACKAGE.origin), "mooncake_master")
MASTER_START_SECONDS = 120  # its start is about 1 s; a loaded machine is slower, not hung
PORT_TRIES = 3

# mooncake-store/include/types.h, ErrorCode: the codes the store calls return.
ERROR_NAMES = {
    -1: "INTERNAL_ERROR", -10: "BUFFER_OVERFLOW", -101: "SEGMENT_NOT_FOUND", -103: "CLIENT_NOT_FOUND",
    -200: "NO_AVAILABLE_HANDLE", -400: "INVALID_KEY", -500: "WRITE_FAIL", -600: "INVALID_PARAMS",
    -700: "INVALID_WRITE", -701: "INVALID_READ", -703: "REPLICA_IS_NOT_READY", -704: "OBJECT_NOT_FOUND",
    -705: "OBJECT_ALREADY_EXISTS", -706: "OBJECT_HAS_LEASE", -707: "LEASE_EXPIRED", -714: "OBJECT_REPLICA_BUSY",
    -800: "TRANSFER_FAIL", -801: "CHECKSUM_MISMATCH", -900: "RPC_FAIL", -901: "RPC_TIMEOUT",
}


class MooncakeError(RuntimeError):
    pass


def checked(status: int, call: str) -> int:
    """`status` when it is not an error; else a MooncakeError naming the call and the code."""
    if status < 0:
        raise MooncakeError(f"{call} returned {status} ({ERROR_NAMES.get(status, 'see ErrorCode')})")
    return status


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def listening_ports(pid: int) -> set:
    """The TCP ports process `pid` listens on (Linux: its sockets' inodes in /proc/net/tcp)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:  # it exited meanwhile
        return set()
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return {int(row[1].split(":")[1], 16) for row in rows if row[3] == "0A" and row[9] in inodes}


class Master:
    """A mooncake_master of this process on 127.0.0.1, dying with it;
    `options`: more of its flags (the test of the declared differences sets
    its lease)."""

    def __init__(self, options=()):
        self.owner = os.getpid()
        self.log = tempfile.TemporaryFile(prefix="kvcheck-mooncake-master-")  # unlinked: nothing left behind
        self.process = None
        for attempt in range(1, PORT_TRIES + 1):
            self.port = free_port()
            self.process = subprocess.Popen(
                [MASTER, "-rpc_address", "127.0.0.1", "-rpc_port", str(self.port), "-metrics_host", "127.0.0.1",
                 "-metrics_port", str(free_port()), "-enable_metric_reporting=false", "-rpc_thread_num", "2",
                 "-logtostderr", "-minloglevel", "1", *options],
                stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                preexec_fn=functools.partial(_die_with_parent, self.owner))
            if self.listening():
                return
            # mooncake_master exits with status 1, saying nothing, when its
            # RPC port is taken: a port another process bound since the probe.
            if attempt == PORT_TRIES:
                taken = "" if port_is_free(self.port) else f" (127.0.0.1:{self.port} is in use)"
                raise MooncakeError(f"mooncake_master ({MASTER}) exited with status {self.process.returncode} "
                                    f"before listening on 127.0.0.1:{self.port}{taken}, {PORT_TRIES} times "
                                    f"on new ports: {self.tail()}")

    def listening(self) -> bool:
        """True once the master itself listens on its port (another process
        on that port answers a connect as well); False when it exited first."""
        deadline = time.monotonic() + MASTER_START_SECONDS
        while self.process.poll() is None:
            if self.port in listening_ports(self.process.pid):
                return True
            if time.monotonic() > deadline:
                self.stop()
                raise MooncakeError(f"mooncake_master did not listen on 127.0.0.1:{self.port} in "
                                    f"{MASTER_START_SECONDS} s: {self.tail()}")
            time.sleep(0.02)
        return False

    def tail(self) -> str:
        self.log.seek(0)
        lines = self.log.read().decode("utf-8", "replace").strip().splitlines()
        return " | ".join(lines[-5:]) or "(it printed nothing)"

    def stop(self) -> None:
        if os.getpid() == self.owner and self.process is not None and self.process.poll() is None:  # a fork copy's is its parent's
            self.process.kill()
            self.process.wait()


class _Cluster:
    """This process's master and client, made on first use (a fork copy makes
    its own); with `reader()`, a second client of the same master."""

    store = None
    second = None
    master = None
    owner = None

    @classmethod
    def setup(cls):
        from mooncake.store import MooncakeDistributedStore

        store = MooncakeDistributedStore()
        status = store.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT_BYTES, BUFFER_BYTES, "tcp", "",
                             f"127.0.0.1:{cls.master.port}")
        if status != 0:
            if cls.store is None:  # the first client: nothing uses the master
                cls.master.stop()
            checked(status, "MooncakeDistributedStore.setup")
        return store

    @classmethod
    def reader(cls):
        """A second client, its own segment: a write of two replicas puts one in each."""
        cls.client()
        if cls.second is None:
            cls.second = cls.setup()
        return cls.second

    @classmethod
    def client(cls):
        if cls.store is None or cls.owner != os.getpid():
            cls.owner, cls.store, cls.second = os.getpid(), None, None
            cls.master = Master()
            atexit.register(cls.end)
            cls.store = cls.setup()
        return cls.store

    @classmethod
    def end(cls):
        """At a normal exit: the client closed while its master still
        answers (its teardown against a dead master waits out RPC retries,
        about 15 s), then the master killed and reaped."""
        if cls.owner == os.getpid():
            for client in (cls.second, cls.store):
                if client is not None:
                    client.close()
            cls.store = cls.second = None
            cls.master.stop()


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


def remove_keys(keys) -> None:
    """A finished engine's keys, removed (forced) from this process's store."""
    if _Cluster.store is not None and _Cluster.owner == os.getpid():
        for key in keys:
            _Cluster.store.remove(key, True)


class MooncakeStoreAdapter(DecoderCalls, Adapter):
    description = f"Mooncake {VERSION}'s MooncakeDistributedStore (python/adapters/mooncake_store_adapter.py)"
    model = {"layers": LAYERS, "heads": HEADS, "head_dim": HEAD_DIM, "dtypes": ["f32"], "layouts": ["modern"],
             "odd_layers": False}
    capabilities = {
        "legacy_layout": False, "modern_layout": True, "conversions": False, "half_dtypes": False,
        "one_sided_layers": False, "legacy_slot_names": False, "uninitialized_layers": False,
        "generate_stream": False, "storage_identity": False, "copy_log": False, "owned_marker": False,
    }
    # Each cache carries its marker (cache_of sets it): a read handed out by get
    # is the stored item (not owned), a get_cache copy is owned. ("derived"
    # would read every stored entry for every cache observed.)
    owned = None

    def __init__(self, model, write="tensor", replicas=1):
        self.model_ = model
        self.write = "bytes" if replicas > 1 and write == "tensor" else write
        self.replicas = replicas
        self.name = (f"mooncake-{VERSION}" + ("-write-from" if write == "from" else "")
                     + (f"-replicas{replicas}" if replicas > 1 else ""))
        self.ids = []  # insertion order
        self.prefix = f"kvcheck-{os.getpid()}-{time.monotonic_ns()}/"
        self.reads = {}  # id -> (the K/V last read, its cache): stored_cache
        self.keys = set()  # every key this engine stored: removed when it is dropped
        # Not at exit: the master is gone by then, with every key.
        weakref.finalize(self, remove_keys, self.keys).atexit = False
        self.staging = None  # --write from: the registered buffer every add writes from
        self.shapes = {}  # --write from: id -> the K/V tensor's shape (the bytes carry none)

    @property
    def store(self):
        if self.replicas > 1:
            _Cluster.reader()  # its segment mounted before the first write: the second replica's place
        return _Cluster.client()

    @property
    def reading(self):
        """The client reads go through: with replicas, the second one (its own replica preferred)."""
        return _Cluster.reader() if self.replicas > 1 else _Cluster.client()

    def config(self):
        from mooncake.store import ReplicateConfig

        config = ReplicateConfig()
        config.replica_num = self.replicas
        return config

    def key(self, id):
        return self.prefix + id

    def write_from(self, key, tensor):
        """upsert_from of `tensor`'s bytes through the one registered staging
        buffer, which is overwritten as soon as the call returns."""
        if self.staging is None:
            self.staging = torch.zeros(STAGING_BYTES, dtype=torch.uint8)
            checked(self.store.register_buffer(self.staging.data_ptr(), STAGING_BYTES), "register_buffer")
            weakref.finalize(self.staging, self.store.unregister_buffer, self.staging.data_ptr()).atexit = False
        data = tensor.reshape(-1).view(torch.uint8)
        if data.numel() > STAGING_BYTES:
            raise ValueError(f"an entry of {data.numel()} bytes is larger than the staging buffer ({STAGING_BYTES})")
        self.staging[:data.numel()].copy_(data)
        status = self.store.upsert_from(key, self.staging.data_ptr(), data.numel(), self.config())
        self.staging.fill_(0xA5)  # the caller's buffer again: the next add writes over it
        checked(status, f"upsert_from({key!r})")
        return tensor.shape

    # ---- the store ----

    def add(self, id, cache, metadata):
        key = self.key(id)
        tensor = kv_tensor(cache)
        if self.write == "from":
            self.write_from(key, tensor)
            self.shapes[id] = tensor.shape
        elif self.write == "bytes":
            checked(self.store.upsert(key, tensor.numpy().tobytes(), self.config()), f"upsert({id!r})")
            self.shapes[id] = tensor.shape
            replicas = len(self.store.get_replica_desc(key))
            if replicas != self.replicas:
                raise MooncakeError(f"upsert({id!r}) of {self.replicas} replicas made {replicas}")
        else:
            checked(self.store.upsert_tensor(key, tensor), f"upsert_tensor({id!r})")
        # The store took the caller's object (kvcheck's add): no longer a copy
        # the caller may write into, though Mooncake stored a copy of it.
        kv.set_owned(cache, False)
        self.keys.add(key)
        self.reads.pop(id, None)  # a new entry: a new object
        if id not in self.ids:
            self.ids.append(id)

    def read(self, id):
        """The K/V stored under `id` (a copy out of the segment), or None
        when Mooncake holds nothing under its key: one call (is_exist only
        tells a missing key from an error)."""
        key = self.key(id)
        if id not in self.ids:
            return None
        if self.write != "tensor":
            data = self.reading.get(key)  # bytes; empty when missing or failed
            if len(data) == 0:
                return self.missing(id)
            return torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(self.shapes[id])
        tensor = self.store.get_tensor(key)
        return self.missing(id) if tensor is None else tensor

    def missing(self, id):
        """None when `id`'s key is not in Mooncake; an error when it is, but could not be read."""
        if checked(self.reading.is_exist(self.key(id)), f"is_exist({id!r})") == 1:
            raise MooncakeError(f"reading {id!r} returned nothing, but is_exist finds it (Mooncake's log says why)")
        return None

    def get(self, id):
        tensor = self.read(id)
        return None if tensor is None else cache_of(tensor, owned=False)

    def get_by_ids(self, ids):
        present = set(self.get_all_ids())
        return [id if id in present else None for id in ids]

    def get_all_ids(self):
        if not self.ids:
            return []
        found = self.reading.batch_is_exist([self.key(id) for id in self.ids])
        for id, exists in zip(self.ids, found):
            checked(exists, f"batch_is_exist of {id!r}")
        return [id for id, exists in zip(self.ids, found) if exists == 1]

    def get_cache(self, ids):
        parts = [cache_of(tensor, owned=True) for tensor in map(self.read, ids) if tensor is not None]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else kv.concat(parts)

    def delete(self, ids):
        for id in ids:
            if id in self.ids:
                # force: past the read lease (wall-clock)
                checked(self.store.remove(self.key(id), True), f"remove({id!r}, force=True)")
                self.ids.remove(id)
                self.keys.discard(self.key(id))
                self.reads.pop(id, None)

    def delete_all(self):
        self.delete(list(self.ids))

    def stored_cache(self, id):
        """Read from Mooncake at every call; the same object while the K/V
        read are the same (the SDK keys what it has read of a cache by the
        object, and a new object a read could take a freed one's identity)."""
        tensor = self.read(id)
        if tensor is None:
            raise KeyError(id)
        held = self.reads.get(id)
        if held is None or not torch.equal(held[0], tensor):
            held = self.reads[id] = (tensor, cache_of(tensor, owned=False))
        return held[1]

    def storage(self, cache):
        return []


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", choices=("tensor", "from"), default="tensor",
                        help="add by upsert_tensor (tensor), or by upsert_from out of one registered staging "
                             "buffer that is overwritten as soon as each call returns (from)")
    parser.add_argument("--replicas", type=int, choices=(1, 2), default=1,
                        help="memory replicas of every write (2: a second client of the master mounts a second "
                             "segment, and every read goes through it: its own replica preferred)")
    arguments = parser.parse_args(argv)
    model = models.Decoder()
    serve(lambda: MooncakeStoreAdapter(model, arguments.write, arguments.replicas))


if __name__ == "__main__":
    main()
