"""tools/byte_check.py tells a change that moves trained bytes from one that does not: a planted
change to one initializer's file moves that initializer's cell alone, and the cut and resumed
cell equals the uncut one (about 1.5 minutes)."""
from structinit.pipeline import scratch
from tools import byte_check


def test_a_change_to_one_initializer_moves_its_cell_alone(tmp_path, capsys):
    copy = scratch.copy_working_tree(tmp_path / "changed")
    method = copy / "structinit/init/methods/trunc_normal.py"
    method.write_text(method.read_text().replace("    trunc_normal(model)\n", "    trunc_normal(model)\n"
                                                 "    model.head.bias.data.add_(1e-3)   # planted\n"))
    assert "planted" in method.read_text()
    scratch.commit(copy)
    assert byte_check.check("HEAD", root=copy) == 1
    said = {line.split(maxsplit=1)[1]: line.split()[0] for line in capsys.readouterr().out.splitlines()
            if line.startswith("  ")}
    assert said.pop("models/digits-trunc_normal") == said.pop("results/train/digits-trunc_normal") == "DIFFERENT"
    assert set(said.values()) == {"same"} and len(said) == len(byte_check.OUTPUTS) - 1, said
    assert "results/train/digits-impulse3, cut and resumed" in said
