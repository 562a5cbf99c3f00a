"""Shared set-up of the SDK's tests: the import paths, a scratch directory
that is removed afterwards, and the corpus of cache specs the C++ tests and
the agreement test share."""

import os
import shutil
import sys
import tempfile

import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (PYTHON_DIR, os.path.join(PYTHON_DIR, "examples")):
    if path not in sys.path:
        sys.path.insert(0, path)

CORPUS = os.path.join(PYTHON_DIR, "agreement", "corpus.txt")


def corpus_lines(kind):
    """The arguments of every corpus line of `kind` ("spec", "merge", ...)."""
    found = []
    with open(CORPUS) as corpus:
        for line in corpus:
            line = line.rstrip("\n")
            if line and not line.startswith("#"):
                word, _, rest = line.partition(" ")
                if word == kind:
                    found.append(rest)
    return found


@pytest.fixture
def scratch_dir():
    """A temporary directory, removed with everything in it after the test
    (pytest's tmp_path keeps the last runs' directories around)."""
    directory = tempfile.mkdtemp(prefix="kvcheck-sdk-test-")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
