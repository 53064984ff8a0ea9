"""What a user or maintainer runs to make or check the project's artifacts: `python -m tools.<name>`.

    quick          ./run.sh quick: the real pipeline on a reduced budget, in a scratch copy
    readme_answer  the README's answer (docs/includes/readme_answer.md) and every page's include blocks
    byte_check     whether a change moved a trained byte: short cells of a revision and of this tree
    output_diff    which pipeline outputs a change altered, against a git revision
    fashion_mnist  Fashion-MNIST on a GPU: its budget at B and 2B, and its grid through DVC
    gpu_hours      the paper's grid priced in GPU-hours from the priced probe file (docs/includes/gpu_hours.md)

The measurements themselves (times, rates, a fresh clone's run) are benchmarks/; a benchmark may
import a tool, a tool never imports a benchmark (tests/test_import_graph.py checks it, and that
no import cycle exists).
"""
