"""Errors whose message is the whole story: a stage prints it as one line, no traceback
(stages/common.run_stage). Everything else is a bug and keeps its traceback.

The library raises these and never exits the process: exiting is for the command-line entry
points (stages/*.py, `python -m structinit.pipeline.verify`), so a caller of a library function
can catch an error, as the classes below let it do by kind (ValueError, FileNotFoundError...).
The file errors are in structinit/io.py (CorruptFileError, MissingFileError)."""


class StructinitError(Exception):
    """A user-facing error: bad input, a damaged file, a diverged run."""


class ConfigError(StructinitError, ValueError):
    """A setting asks for something that cannot be: a value of params.yaml, an environment
    variable, more processes than the machine has GPUs. The message names the bad value and
    what would be valid."""


class DownloadError(StructinitError, OSError):
    """A built-in dataset's file could not be fetched (no network, server down) or arrived
    damaged. The message names each file to place by hand, the folder, and its checksum and URL
    (Fashion-MNIST: its three routes, structinit/data/fashion_mnist.py)."""
