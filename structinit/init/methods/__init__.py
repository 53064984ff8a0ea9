"""One file per initializer: `<name>.py` registers the initializer `<name>`.

The pipeline's cells of initializer X depend on `methods/X.py` and on the shared init code
(registry.py, baselines.py, ...), never on another method's file, so adding an initializer or
editing one retrains its own cells and nothing else (dvc.yaml: `methods/${item.init}.py`).
That is also why nothing here is imported with the package: `registry.get_initializer(name)`
imports `methods/<name>.py` on first use. A method file imports shared code only, never
another method file (tests/test_dvc_deps.py checks it): what two initializers share lives
outside this folder (e.g. mimetic_qk and mimetic both call init/mimetic.py).
"""
