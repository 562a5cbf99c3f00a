"""The transformers these tests run against is the one asked for."""

import pytest

from conftest import IMPORT_ERROR, REQUIRED, WANTED_VERSION


def test_transformers_is_importable_when_required():
    if IMPORT_ERROR is not None and not REQUIRED:
        pytest.skip(f"transformers is not importable ({IMPORT_ERROR}) and KVCHECK_TRANSFORMERS_REQUIRED is not 1")
    assert IMPORT_ERROR is None, f"KVCHECK_TRANSFORMERS_REQUIRED=1 but transformers is not importable: {IMPORT_ERROR}"


def test_the_importable_version_is_the_one_asked_for():
    if WANTED_VERSION is None:
        pytest.skip("KVCHECK_TRANSFORMERS_VERSION is not set")
    assert IMPORT_ERROR is None, f"transformers {WANTED_VERSION} was asked for; none is importable: {IMPORT_ERROR}"
    import transformers

    assert transformers.__version__ == WANTED_VERSION, (
        f"transformers {transformers.__version__} is importable, {WANTED_VERSION} was asked for"
        f" (from {transformers.__file__})"
    )
