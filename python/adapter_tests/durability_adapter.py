"""The example store (python/examples/activation_memory.py) with a dump that
is not durable, for the tests of dump_fork (test_dump_fork.py): kvcheck
must kill and power-cut the dumps of a Python engine that uses the SDK,
which changes nothing on its side.

    --dump no_fsync       the temporary file is never fsynced (as M25)
    --dump no_dir_fsync   the directory is not fsynced after the rename (as M26)
    --dump stop           each dump_fork copy stops itself (SIGSTOP) before
                          it dumps (issue 43, D22)
    --clear-preload       the process runs itself again without LD_PRELOAD
                          (as a wrapper that clears the environment does):
                          the dump shim is then not in it

Only the store's calls are changed, by swapping what its module calls:
its `os.fsync` of a regular file, or its `_fsync_directory`.
"""

import argparse
import os
import signal
import stat
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
sys.path.insert(0, EXAMPLES)
sys.path.insert(1, os.path.dirname(HERE))  # the SDK, from the source tree

import activation_memory  # noqa: E402
import activation_memory_adapter  # noqa: E402
from kvcheck_adapter import decoder as models  # noqa: E402
from kvcheck_adapter.adapter import serve  # noqa: E402


def without_file_fsync() -> types.SimpleNamespace:
    """`os` as the store sees it, but fsync of a regular file does nothing
    (a directory's is still made)."""
    patched = types.SimpleNamespace(**vars(os))

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.fsync(fd)

    patched.fsync = fsync
    return patched


def stop_dump_fork_copies() -> None:
    """Each dump_fork copy stops itself (SIGSTOP) before it dumps; the
    adapter process's own dumps are as they were."""
    from kvcheck_adapter import protocol

    dump_fork = protocol.dump_fork

    def stopping(dump, directory, log_path, kill_at):
        def stop_then_dump(where):
            os.kill(os.getpid(), signal.SIGSTOP)
            dump(where)

        return dump_fork(stop_then_dump, directory, log_path, kill_at)

    protocol.dump_fork = stopping


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump", choices=("durable", "no_fsync", "no_dir_fsync", "stop"), default="durable")
    parser.add_argument("--clear-preload", action="store_true")
    arguments = parser.parse_args()
    if arguments.clear_preload and "LD_PRELOAD" in os.environ:
        environment = {name: value for name, value in os.environ.items() if name != "LD_PRELOAD"}
        os.execve(sys.executable, [sys.executable] + sys.argv, environment)
    if arguments.dump == "no_fsync":
        activation_memory.os = without_file_fsync()
    elif arguments.dump == "stop":
        stop_dump_fork_copies()
    elif arguments.dump == "no_dir_fsync":
        activation_memory._fsync_directory = lambda directory: None
    model = models.Decoder()
    serve(lambda: activation_memory_adapter.ActivationMemoryAdapter((), model))


if __name__ == "__main__":
    main()
