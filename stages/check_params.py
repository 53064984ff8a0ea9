"""check_params: params.yaml against its schema (structinit/params.py), on every change to it.

Every stage checks the file before its own work; this stage depends on the whole file, so a
change that no other stage reads (a misspelt key, say) is refused too instead of being
silently ignored.
"""
from stages.common import load_params, run_stage


def main():
    load_params()
    print("params.yaml: valid")


if __name__ == "__main__":
    run_stage(main)
