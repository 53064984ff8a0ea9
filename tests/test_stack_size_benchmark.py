"""benchmarks/stack_size.py stays runnable, and what it compares is each seed's own weights."""
import re

from benchmarks import stack_size


def test_the_same_stack_twice_is_bitwise_equal_and_each_shared_seed_gets_a_row(digits, tmp_path, capsys):
    path = tmp_path / "digits.pt"
    digits.save(path)
    r = stack_size.main(["--stacks", "2", "2", "--epochs", "1", "--train-size", "128", "--data", str(path)])
    out = capsys.readouterr().out
    assert r == {"equal": 2, "shared": 2}                          # a run is deterministic on one CPU
    assert re.search(r"^seed 0: bitwise equal in stacks of 2, 2$", out, re.M)
    assert out.strip().splitlines()[-1] == "bitwise equal: 2 of 2 shared seeds"


def test_stacks_of_other_sizes_are_compared_on_the_seeds_they_share(digits, tmp_path, capsys):
    path = tmp_path / "digits.pt"
    digits.save(path)
    r = stack_size.main(["--stacks", "1", "2", "--epochs", "1", "--train-size", "128", "--data", str(path)])
    assert r["shared"] == 1 and r["equal"] in (0, 1)
    assert re.search(r"^seed 0: (bitwise equal|differs, largest weight difference \S+) in stacks of 1, 2$",
                     capsys.readouterr().out, re.M)
