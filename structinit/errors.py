"""Errors whose message is the whole story: a stage prints it as one line, no traceback
(stages/common.run_stage). Everything else is a bug and keeps its traceback."""


class StructinitError(Exception):
    """A user-facing error: bad input, a damaged file, a diverged run."""
