"""Reads a kvcheck dump with Python's torch.load and prints a canonical
summary, which dump_test.cpp compares with the store it dumped.

weights_only=True: a dump is tensors, tuples, strings, integers and bools,
which torch's restricted unpickler reads; the default unpickler would run
whatever code a crafted file names (dump_test.cpp checks that one is
refused)."""
import sys

import torch


def describe(where, t):
    if t is None:
        print(f"{where} None")
        return
    dtype = str(t.dtype).replace("torch.", "")
    shape = "".join(f"{s}," for s in t.shape)
    sum8 = round(t.double().sum().item() * 8)
    print(f"{where} {dtype} [{shape}] {sum8}")


def main(path):
    magic, version, items = torch.load(path, weights_only=True)
    assert magic == "kvcheck.store" and version == 1, (magic, version)
    for item_id, metadata, cache in items:
        print(f"item {item_id} {cache[0]}")
        for key, value in sorted(metadata):
            print(f"meta {key}={value}")
        if cache[0] == "legacy":
            for i, (k, v) in enumerate(zip(cache[1], cache[2])):
                describe(f"  {i} key_cache", k)
                describe(f"  {i} value_cache", v)
            continue
        for i, (initialized, keys, values, key_cache, value_cache) in enumerate(cache[1]):
            print(f"  {i} initialized {initialized}")
            describe(f"  {i} keys", keys)
            describe(f"  {i} values", values)
            describe(f"  {i} key_cache", key_cache)
            describe(f"  {i} value_cache", value_cache)


if __name__ == "__main__":
    main(sys.argv[1])
