"""C++/Python agreement: for every case of python/agreement/corpus.txt, what
the C++ side prints (kvcheck_agree: expected view digests, per-slot views,
the view of the cache its reference builds, the C++ decoder's tokens and
errors, content hashes, spec parse errors) must be what this SDK computes.

The program is found through $KVCHECK_AGREE (ctest sets it) or under
build/default; without it the test fails, naming what to build. The
comparison is shown to fail on planted deviations of the SDK."""

import dataclasses
import os
import subprocess

import numpy as np
import pytest

from conftest import CORPUS, PYTHON_DIR
from kvcheck_adapter import cache as kv
from kvcheck_adapter import content as c
from kvcheck_adapter import decoder as d


def agree_binary():
    path = os.environ.get("KVCHECK_AGREE") or os.path.join(PYTHON_DIR, "..", "build", "default", "python", "kvcheck_agree")
    if not os.path.isfile(path):
        pytest.fail(f"kvcheck_agree not found at {path}: build it (cmake --build --preset default --target kvcheck_agree) or set KVCHECK_AGREE")
    return path


@pytest.fixture(scope="module")
def cxx_lines():
    result = subprocess.run([agree_binary(), CORPUS], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"kvcheck_agree failed: {result.stderr}"
    return result.stdout.splitlines()


def _shape_text(shape):
    return "[" + ",".join(str(size) for size in shape) + "]"


def hash_probe(count):
    """The C++ hash_probe: exact float32 values, a -0 every 7th from 3."""
    return [-0.0 if i % 7 == 3 else np.float32((i * 37) % 101) / np.float32(8.0) - np.float32(6.0) for i in range(count)]


def _expected_lines(number, content):
    view = c.expected_view(content)
    lines = [f"case {number} digest {c.view_digest(view)}"]
    for i, layer in enumerate(view.layers):
        for s, slot in enumerate(layer.slots):
            if slot.present:
                lines.append(f"case {number} slot {i} {s} 1 {slot.dtype} {_shape_text(slot.shape)} {slot.hash}")
            else:
                lines.append(f"case {number} slot {i} {s} 0 - - 0")
    return lines


def _generation_lines(number, prompts, max_new, cache, model):
    lines = []
    for p, prompt in enumerate(prompts):
        try:
            tokens = d.generate(model, prompt, kv.clone(cache), max_new)
            lines.append(f"case {number} tokens {p} {','.join(map(str, tokens))}")
        except ValueError as error:
            lines.append(f"case {number} error {p} {error}")
    return lines


def python_lines():
    """What the SDK computes for the corpus, in kvcheck_agree's format."""
    model = d.Decoder()
    lines, prompts, max_new, number = [], [], 0, 0
    with open(CORPUS) as corpus:
        numbered = list(enumerate(corpus, start=1))
    for line_number, line in numbered:
        line = line.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        kind, _, rest = line.partition(" ")
        if kind == "prompts":
            prompts = [[int(token) for token in word.split(",")] for word in rest.split()]
        elif kind == "max_new":
            max_new = int(rest)
        elif kind == "hashes":
            lines += [f"hash {count} {c.content_hash(hash_probe(count))}" for count in range(int(rest) + 1)]
        elif kind == "badspec":
            try:
                c.parse_cache_spec(rest)
                lines.append(f"badspec {line_number} accepted")
            except ValueError as error:
                lines.append(f"badspec {line_number} {error}")
        elif kind in ("spec", "merge"):
            parts = [c.expand(c.parse_cache_spec(text)) for text in rest.split(" + ")]
            if kind == "spec":
                content, cache = parts[0], kv.materialize(parts[0])
            else:
                content, cache = c.expected_concat(parts), kv.concat([kv.materialize(part) for part in parts])
            lines += _expected_lines(number, content)
            lines.append(f"case {number} view {c.view_digest(c.view_of(cache))}")
            lines += _generation_lines(number, prompts, max_new, cache, model)
            number += 1
        elif kind == "memory":
            layout, dtype, tokens = rest.split()
            memory = [int(token) for token in tokens.split(",")]
            cache = d.memory_cache(model, memory, layout, dtype)
            lines.append(f"case {number} view {c.view_digest(c.view_of(cache))}")
            lines += _generation_lines(number, prompts, max_new, cache, model)
            for p, prompt in enumerate(prompts):
                recomputed = d.generate_without_cache(model, memory + prompt, max_new)
                lines.append(f"case {number} recompute {p} {','.join(map(str, recomputed))}")
            number += 1
        elif kind == "extra":
            extra, tokens = rest.split()
            cache = kv.DynamicCache()
            next_token = model.forward([int(token) for token in tokens.split(",")], cache, extra)
            lines.append(f"case {number} view {c.view_digest(c.view_of(cache))}")
            lines.append(f"case {number} next {next_token}")
            number += 1
        elif kind == "window":
            window, tokens = rest.split()
            windowed = d.Decoder(d.DecoderConfig(window=int(window)))
            cache = kv.DynamicCache()
            next_token = windowed.forward([int(token) for token in tokens.split(",")], cache)
            lines.append(f"case {number} view {c.view_digest(c.view_of(cache))}")
            lines.append(f"case {number} next {next_token}")
            decoded = []
            for _ in range(max_new):
                decoded.append(next_token)
                next_token = windowed.forward([next_token], cache)
            lines.append(f"case {number} decoded {','.join(map(str, decoded))}")
            number += 1
        else:
            raise ValueError(f"{CORPUS}:{line_number}: unknown corpus line kind '{kind}'")
    return lines


def differences(cxx, python):
    """The lines that differ, as (C++, Python) pairs; a missing line is None."""
    return [(a, b) for a, b in zip(cxx + [None] * (len(python) - len(cxx)), python + [None] * (len(cxx) - len(python))) if a != b]


def test_the_corpus_covers_what_it_must(cxx_lines):
    kinds = {line.split(" ")[2] for line in cxx_lines if line.startswith("case ")}
    assert {"digest", "slot", "view", "tokens", "error", "recompute", "next", "decoded"} <= kinds
    assert sum(line.startswith("hash ") for line in cxx_lines) >= 41
    assert sum(line.startswith("badspec ") for line in cxx_lines) >= 20
    specs = [line for line in open(CORPUS) if line.startswith(("spec", "merge"))]
    for needle in ("legacy/", "modern/", "/f16/", "/bf16/", "/f32/", "~", "K", "V", "[]", "kv0", " + "):
        assert any(needle in line for line in specs), needle


def test_cxx_and_python_agree_on_every_case(cxx_lines):
    found = differences(cxx_lines, python_lines())
    assert not found, "\n".join(f"C++:    {a}\nPython: {b}" for a, b in found[:10])


_SEGMENT_VALUES = c._segment_values
_FINISH = c._finish
_HIDDEN = d._hidden


@pytest.mark.parametrize(
    "target, name, planted",
    [
        (c, "_segment_values", lambda segment, heads, head_dim: _SEGMENT_VALUES(dataclasses.replace(segment, seed=segment.seed + 1), heads, head_dim)),
        (c, "_round_to_bf16", lambda bits: bits & np.uint32(0xFFFF0000)),  # bfloat16 truncated, not rounded
        (c, "_round_to_f16", lambda bits: c.round_to_array("bf16", bits.view(np.float32)).view(np.uint32)),  # float16 as bfloat16
        (d, "_geometry_seed", lambda seed, heads, head_dim: seed),  # every geometry's weights from the one seed
        (d, "_extra_seed", lambda seed, heads, head_dim, extra: seed),  # every extra keys' row the same
        (d, "_hidden", lambda count, heads, total, window=0: _HIDDEN(count, heads, total, 0)),  # a prompt's window ignored
        (d, "_hidden", lambda count, heads, total, window=0: _HIDDEN(count, heads, total, window + 1 if window else 0)),  # off by one
        (c, "_NEGATIVE_ZERO_BITS", 0xFFFFFFFF),  # -0 hashed as its own bits
        (c, "_shifted_positions", lambda count: np.zeros(count, dtype=np.uint64)),  # positions left out of the words
        (c, "_finish", lambda total, count: _FINISH(total, 0)),  # the count left out of the final mix
        (d, "_sequential_sum", lambda products, axis: np.sum(products, axis=axis, dtype=np.float32)),  # numpy's pairwise sum
        (kv, "_append", lambda slot, piece: piece),  # update replaces instead of appending
    ],
)
def test_the_comparison_catches_planted_deviations(cxx_lines, monkeypatch, target, name, planted):
    monkeypatch.setattr(target, name, planted)
    assert differences(cxx_lines, python_lines())
