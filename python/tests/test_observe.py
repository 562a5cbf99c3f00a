"""observe.py: storage identities, aliasing, length and view of caches of
both layouts, ours and duck-typed ones. The aliasing check is run on a
planted storage_of that looks at tensor objects instead of storages."""

import numpy as np
import pytest
import torch

from kvcheck_adapter import cache as kv
from kvcheck_adapter import content as c
from kvcheck_adapter import copies
from kvcheck_adapter import observe


def materialized(text):
    return kv.materialize(c.expand(c.parse_cache_spec(text)))


def test_storage_of_a_modern_cache_lists_list_layers_and_storages_in_order():
    cache = materialized("modern/f32/1:[kv2 K3 -0 v~0]")
    layers = cache.layers
    expected = [id(layers)]
    expected += [id(layers[0]), observe.storage_identity(layers[0].keys), observe.storage_identity(layers[0].values)]
    expected += [id(layers[1]), observe.storage_identity(layers[1].key_cache)]
    expected += [id(layers[2])]
    expected += [id(layers[3])]  # its empty values hold no bytes: no identity
    assert observe.storage_of(cache) == expected


def test_storage_of_a_legacy_cache_lists_both_lists_then_keys_then_values():
    cache = materialized("legacy/bf16/1:[kv2 kv0 kv1]")
    ids = observe.storage_of(cache)
    assert ids[:2] == [id(cache.key_cache), id(cache.value_cache)]
    assert ids[2:] == [observe.storage_identity(t) for t in cache.key_cache + cache.value_cache if t.numel() > 0]
    assert len(ids) == 6


def check_aliasing(storage_of):
    """Views of a stored tensor, tensors over the same memory and shared
    layer objects or lists all alias; a clone does not."""
    def shares(a, b):
        return not set(storage_of(a)).isdisjoint(storage_of(b))

    source = materialized("modern/f32/1:[kv4 kv4]")
    viewer = kv.DynamicCache()
    layer = kv.DynamicLayer()
    layer.keys = source.layers[1].keys[:, :, 1:3]  # a view: same storage, another tensor
    viewer.layers.append(layer)
    assert shares(viewer, source), "a view of a stored tensor is not seen as aliasing"
    array = np.zeros((1, 2, 3, 4), dtype=np.float32)
    a, b = kv.DynamicCache(), kv.DynamicCache()
    a.update(*(torch.zeros(1, 2, 1, 4),) * 2, 0)
    b.update(*(torch.zeros(1, 2, 1, 4),) * 2, 0)
    a.layers[0].keys, b.layers[0].keys = torch.from_numpy(array), torch.from_numpy(array)
    assert shares(a, b), "two tensors over one memory are not seen as aliasing"
    sharing_layers = kv.DynamicCache()
    sharing_layers.layers = [source.layers[0]]
    assert shares(sharing_layers, source)
    assert not shares(kv.clone(source), source)


def test_aliasing_is_computed_from_storages():
    check_aliasing(observe.storage_of)
    assert observe.shares_storage(kv.to_legacy(materialized("modern/f32/1:[kv2]")), materialized("modern/f32/1:[kv2]")) is False


def test_aliasing_check_catches_identities_of_tensor_objects():
    def planted(cache):  # the tensors' Python objects instead of their storages
        ids = [id(cache.layers)]
        for layer in cache.layers:
            ids += [id(layer)] + [id(t) for t in (layer.keys, layer.values, layer.key_cache, layer.value_cache) if t is not None]
        return ids

    with pytest.raises(AssertionError):
        check_aliasing(planted)


def test_to_legacy_shares_storage_and_from_legacy_does_not():
    cache = materialized("modern/f16/1:[kv2 kv2]")
    legacy = kv.to_legacy(cache)
    assert observe.shares_storage(legacy, cache)
    assert not observe.shares_storage(kv.from_legacy(legacy), legacy)
    assert observe.shares_storage(cache, cache)


def test_seq_length_asks_the_cache_or_reads_it():
    cache = materialized("modern/f32/1:[kv~3 kv2]")
    assert observe.seq_length(cache) == 0 and observe.seq_length(cache, 1) == 2

    class Bare:  # no get_seq_length: read through the layers
        def __init__(self, layers):
            self.layers = layers

    assert observe.seq_length(Bare(cache.layers), 1) == 2
    assert observe.seq_length(Bare(cache.layers), 0) == 0
    assert observe.seq_length(Bare(cache.layers), 5) == 0


def test_view_of_reads_legacy_named_slots_and_flags():
    view = observe.view_of(materialized("modern/bf16/2:[KV3 v~1]"))
    assert [slot.present for slot in view.layers[0].slots] == [False, False, True, True]
    assert view.layers[0].slots[2].shape == (1, 2, 3, 4) and view.layers[0].slots[2].dtype == "bf16"
    assert view.layers[1].initialized is False
    legacy_view = observe.view_of(materialized("legacy/f32/2:[kv3]"))
    assert legacy_view.layout == "legacy" and legacy_view.layers[0].initialized


def test_untyped_storage_is_the_tensors_storage():
    t = torch.arange(12.0).reshape(3, 4)
    assert observe.untyped_storage(t[1:]).data_ptr() == observe.untyped_storage(t).data_ptr()
    assert observe.storage_identity(torch.zeros(0)) is None
    assert observe.storage_identity(None) is None


class _Overriding(torch.Tensor):
    """A tensor subclass with a __torch_function__ of its own."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("untyped_storage", [observe.untyped_storage, copies._untyped_storage])
def test_the_fast_storage_is_the_one_storage_wraps(untyped_storage):
    """On torch 1.13 the SDK reads a tensor's storage without building the
    TypedStorage .storage() returns: the same storage object (its _cdata),
    for a tensor, a view of it and a subclass with a __torch_function__."""
    t = torch.arange(12.0).reshape(3, 4)
    overriding = torch.arange(6.0).as_subclass(_Overriding)
    for tensor in (t, t[1:], t.t(), overriding, overriding[2:]):
        expected = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()._storage
        assert untyped_storage(tensor)._cdata == expected._cdata
    assert untyped_storage(t)._cdata != untyped_storage(t.clone())._cdata


def check_fingerprint_sees_changes(fingerprint_of):
    cache = materialized("modern/f32/1:[kv2 kv2]")
    legacy = materialized("legacy/f32/1:[kv2]")
    changes = [
        lambda: cache.update(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4), 0),  # a rebinding
        lambda: cache.layers[1].keys.add_(1.0),  # in place
        lambda: cache.layers[1].values[:, :, :1].mul_(2.0),  # in place, through a view
        lambda: setattr(cache.layers[0], "is_initialized", False),
        lambda: setattr(cache.layers[0], "key_cache", torch.zeros(1, 2, 1, 4)),
        lambda: cache.layers.append(kv.DynamicLayer()),
        lambda: setattr(cache, "layers", list(cache.layers)),
        lambda: legacy.key_cache[0].zero_(),
        lambda: legacy.value_cache.append(torch.zeros(0)),
    ]
    for n, change in enumerate(changes):
        before = (fingerprint_of(cache), fingerprint_of(legacy))
        change()
        assert (fingerprint_of(cache), fingerprint_of(legacy)) != before, f"change {n} not seen"
    assert fingerprint_of(cache) == fingerprint_of(cache)


def test_fingerprint_changes_with_anything_observable():
    check_fingerprint_sees_changes(observe.fingerprint)


def test_fingerprint_check_catches_a_fingerprint_without_versions(monkeypatch):
    real = observe._slot_fingerprint
    monkeypatch.setattr(observe, "_slot_fingerprint", lambda t: None if t is None else real(t)[:1] + real(t)[2:])
    with pytest.raises(AssertionError, match="not seen"):
        check_fingerprint_sees_changes(observe.fingerprint)
