"""What the DVC stages share: the params schema, cell names, a cell's model, verification.

    params.py   params.yaml's schema: every problem in one pass, before any work
    cells.py    which cells params.yaml asks for, and their names
    build.py    a cell's model, initialized as its training stage starts it
    verify.py   ./run.sh verify: a re-run's bytes, or its conclusions, against the committed ones
"""
