"""One thin CLI per DVC stage (dvc.yaml): parse arguments and params, call structinit, write outputs.

Run by DVC (which sets DVC_STAGE), a stage checks the whole params.yaml against its schema as
its very first step, here, before the stage module imports torch: a bad value anywhere in the
file fails in about a second with one line per problem, before any download, solve or training.
"""
import os

if os.environ.get("DVC_STAGE"):
    from structinit.params import ParamsError, load_params

    try:
        load_params()
    except ParamsError as e:
        raise SystemExit(f"error: {e}") from None
