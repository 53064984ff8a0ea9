"""tools/output_diff.py: what a refactor changed in the pipeline's outputs."""
import json

from tools.output_diff import only_renamed, output_hashes


def test_output_diff_tells_renamed_keys_from_changed_values():
    old = json.dumps({"loss": 0.5, "options": {"offsets": "random"}, "offsets": [[0, 1]]})
    renamed = {"fit_mse": "loss", "offset_order": "offsets"}
    assert only_renamed(old, json.dumps({"fit_mse": 0.5, "options": {"offset_order": "random"},
                                         "offsets": [[0, 1]]}), renamed)
    assert not only_renamed(old, json.dumps({"fit_mse": 0.6, "options": {"offset_order": "random"},
                                             "offsets": [[0, 1]]}), renamed)
    assert not only_renamed(old, "# a report, not JSON", renamed)
    lock = "schema: '2.0'\nstages:\n  a:\n    outs:\n    - path: m\n      md5: x.dir\n"
    assert output_hashes(lock) == {"m": "x.dir"}
