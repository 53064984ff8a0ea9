"""The README answers a newcomer on its first screen (issue 45), and every number left in it is
generated into it or checked here against the file it comes from.

- At most 8 KB; its first 40 lines hold the two commands, the CPU time, a GPU figure with its
  card, the plain sentence (generated: docs/includes/readme_answer.md, quoted in an include block)
  and its table.
- "ours" means nothing in the README: the paper's method is "Imp.-3 (the structured init)", this
  rebuild's column "this rebuild" (the generated reports/headline.md, which says "ours", is
  quoted in docs/reports.md, where its labels are explained).
- The generated answer is what its sources make it (python -m tools.readme_answer --write),
  and so are the include blocks of the docs pages structinit/reporting/readme.py does not cover.
- Every number in the README outside its include blocks is either a checked phrase below (the
  phrase is in the README and agrees with its file) or a name or parameter (ALLOWED). The
  default's time on a GPU is one: benchmarks/fresh_repro.py's readme_gpu_default, built from the GPU
  fresh-clone files (benchmarks/fresh_repro-<card>-<commit>.md), or saying none exists.
- A licence and a citation file exist and cite the paper.
"""
import re
from pathlib import Path

import pytest
import yaml

from tools import quick, readme_answer
from benchmarks.fresh_repro import readme_gpu_default
from tools.gpu_hours import PRICED, read_probe
from structinit.reporting import readme

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
FIRST_SCREEN = "\n".join(README.splitlines()[:40])


def text(path: str) -> str:
    return (REPO / path).read_text()


def fresh_repro_minutes() -> float:
    return float(re.search(r"\*\*([\d.]+) min\*\*", text("benchmarks/fresh_repro.md"))[1])


# The GPU figures the README states come from the priced probe file (tools/gpu_hours.py's PRICED)
# and from the table gpu_hours writes from it (docs/includes/gpu_hours.md, which
# tests/test_gpu_hours.py holds to the file): each phrase below is built from them, none typed.
PROBE = read_probe(PRICED)
PROBE_PATH = PRICED.relative_to(REPO).as_posix()
CARD = PROBE["card"].removeprefix("NVIDIA ").split()[0]          # "NVIDIA H200" -> "H200"


def gpu_hours_figure(pattern: str) -> str:
    """The first group of `pattern` in docs/includes/gpu_hours.md ("?" where it is not there)."""
    m = re.search(pattern, text("docs/includes/gpu_hours.md"))
    return m[1] if m else "?"


GRID_HOURS = gpu_hours_figure(r"GPU-hours in all: \*\*(\d+)\*\* on ")


def committed_curve_start(init: str) -> float:
    import pandas as pd

    t = pd.read_csv(REPO / "reports/curves.csv").dropna(subset=["test_acc"])
    first = t.epoch.min()
    return t[(t.init == init) & (t.epoch == first)].test_acc.mean()


# phrase in the README -> the check against its source (each phrase must be in the README)
CHECKED = {
    # the README states the committed run's minutes, whatever they are: the phrase is built from its file
    f"{round(fresh_repro_minutes())} minutes": lambda: True,
    # the default on a GPU: the newest complete benchmarks/fresh_repro-<card>-<commit>.md's minutes,
    # card and file, or, until a GPU has run benchmarks.fresh_repro, a sentence saying it was not timed
    readme_gpu_default(): lambda: True,
    "2 CPU cores": lambda: "2 CPU cores" in text("benchmarks/fresh_repro.md"),
    # fresh_repro.md names the CPU by its family and model: AMD family 25 model 17 is Zen 4
    "2-core AMD EPYC (Zen 4, bf16)": lambda: all(s in text("benchmarks/fresh_repro.md") for s in (
        "AMD EPYC (cpu family 25, model 17), 2 CPU cores", "native bf16 yes")),
    # the card, its rate, the commit and torch, and the file they are read from: the priced probe's
    f"one {PROBE['card']} trained": lambda: f"on one {PROBE['card']}, priced from `{PROBE_PATH}`"
    in text("docs/includes/gpu_hours.md") and text(PROBE_PATH).startswith(f"# GPU probe: {PROBE['card']}, "),
    f"{PROBE['rate']:,.0f} img/s": lambda: f"**{PROBE['rate']:,.0f} img/s**" in text("docs/includes/gpu_hours.md"),
    f"`python -m benchmarks.gpu_probe` at {PROBE['commit']}, torch {PROBE['torch']}": lambda:
    f"project at {PROBE['commit']}, torch {PROBE['torch']}; measured by `python -m benchmarks.gpu_probe`"
    in text("docs/includes/gpu_hours.md"),
    f"`{PROBE_PATH}`": lambda: f"priced from `{PROBE_PATH}`" in text("docs/includes/gpu_hours.md"),
    # the paper's grid (its five initializers)
    f"{GRID_HOURS} {CARD}-hours": lambda: all(s in text("docs/includes/gpu_hours.md") for s in (
        "main table: 5 initializers (the paper's",
        f"GPU-hours in all: **{GRID_HOURS}** on {PROBE['card']}s (the paper's grid)")),
    "30 epochs": lambda: quick.EPOCHS == 30,
    "2 seeds": lambda: len(quick.SEEDS) == 2,
    "seeds 0 and 1": lambda: quick.SEEDS == [0, 1],
    "160 epochs": lambda: yaml.safe_load(text("params.yaml"))["recipes"]["digits"]["train"]["epochs"] == 160,
    "instead of 160": lambda: yaml.safe_load(text("params.yaml"))["recipes"]["digits"]["train"]["epochs"] == 160,
    "0.08–0.12": lambda: all(8 <= committed_curve_start(i) <= 12 for i in ("impulse3", "trunc_normal")),
    "compute capability 8.0": lambda: ">= (8, 0)" in text("structinit/training/stacked.py"),
    "under 1 TFLOP": lambda: "FILLS_A_GPU_FLOPS = 1e12" in text("structinit/memory.py"),
    "1.00–1.25×": lambda: "peak <= estimate" in text("tests/test_memory.py")
    and "estimate <= 1.25 * peak" in text("tests/test_memory.py"),
    "Python ≥ 3.11": lambda: "Python >= 3.11" in text("run.sh"),
    "arXiv 2404.01139": lambda: '"arXiv:2404.01139"' in text("CITATION.cff"),
}
# names and parameters, not measurements (a command's parameters are checked by
# tests/test_readme_commands.py and tests/test_docs_commands_plan.py)
ALLOWED = {
    "8x8", "ViT-T/2", "bf16", "fp32", "MD5", "ImageNet-1K", "Apache-2.0",
    "STRUCTINIT_NPROC=2", "init.kernel=5", "grid.seeds=[0,1,2,3,4,5", "grid.datasets=[digits,cifar10,cifar100,svhn",
    "si.create_vit(img_size=32", "patch_size=2", "embed_dim=192", "depth=12", "num_heads=3", "num_classes=10",
    "kernel=3", "seed=0",
}


def unchecked_numbers(page: str) -> list[str]:
    """Tokens with a digit, outside include blocks, that no checked phrase holds and ALLOWED lacks."""
    rest = readme.BLOCK.sub("", page)
    for phrase in CHECKED:
        rest = rest.replace(phrase, " ")
    tokens = (t.strip("()[],.:;`'\"") for t in re.findall(r"\S*\d\S*", rest))
    return [t for t in tokens if t and t not in ALLOWED]


def test_the_readme_is_at_most_8_kb():
    assert len(README.encode()) <= 8 * 1024


def test_the_docs_are_at_most_70_kb_in_all():
    """A researcher reads them: docs/ with its includes, at most 70 KB (issue 64)."""
    assert sum(p.stat().st_size for p in (REPO / "docs").rglob("*.md")) <= 70 * 1024


def test_the_first_screen_holds_the_commands_the_times_a_gpu_figure_and_the_answer():
    assert "./run.sh repro" in FIRST_SCREEN and "./run.sh test" in FIRST_SCREEN
    assert f"{round(fresh_repro_minutes())} minutes on 2 CPU cores" in FIRST_SCREEN
    assert f"{PROBE['rate']:,.0f} img/s" in FIRST_SCREEN and PROBE["card"] in FIRST_SCREEN
    assert "measured" in FIRST_SCREEN and PROBE_PATH in FIRST_SCREEN
    answer = text(readme_answer.OUT)
    sentence = next(line for line in answer.splitlines() if line.startswith("On "))
    assert sentence in FIRST_SCREEN
    assert "| Method" in FIRST_SCREEN and "this rebuild" in FIRST_SCREEN    # then the table
    assert "docs/includes/readme_answer.md" in [p for p, _ in readme.includes(README)]


def test_the_answer_claims_what_the_evidence_shows():
    """A null reads as "not detected" with what the design detects; the rank is among every arm;
    the speed endpoint's verdict comes from the seeds that test it; the pooled look is post hoc
    and names its CPUs; the look at double the budget stays in the headline."""
    answer = text(readme_answer.OUT)
    paragraphs = answer.split("\n\n")
    assert "no difference in final test accuracy was detected" in paragraphs[1]
    assert "The design detects" in paragraphs[1]
    assert "does not change" not in answer
    assert "Among every arm" in answer and " of 6 here" in answer
    assert "tested on new seeds only: on seeds 5–9" in answer and "replication.md" in answer
    assert "Post hoc, over all 10 seeds" in answer and "AMD EPYC" in answer and "Xeon" in answer
    assert "At double the budget" not in answer
    assert "on its edge" in answer and "still gains on every seed" in answer


def test_ours_means_nothing_in_the_readme():
    assert not re.search(r"\bours\b", README, re.I)
    assert "Imp.-3 (the structured init)" in text(readme_answer.OUT)


def test_the_generated_answer_and_the_other_pages_blocks_are_fresh():
    stale = readme_answer.stale(REPO)
    assert not stale, f"run: python -m tools.readme_answer --write ({stale})"


@pytest.mark.parametrize("phrase", CHECKED)
def test_each_checked_number_is_in_the_readme_and_agrees_with_its_file(phrase):
    assert phrase in README, f"{phrase!r}: no longer in the README (drop it from CHECKED)"
    assert CHECKED[phrase](), f"{phrase!r}: the README disagrees with its source"


def test_every_number_in_the_readme_is_generated_or_checked():
    assert unchecked_numbers(README) == []


def test_an_unchecked_number_is_caught():
    assert unchecked_numbers("It took 45 minutes.\n") == ["45"]
    assert unchecked_numbers("<!-- include: x.md -->\nIt took 45 minutes.\n<!-- end include -->\n") == []
    assert unchecked_numbers(f"{round(fresh_repro_minutes())} minutes on 2 CPU cores") == []


@pytest.mark.parametrize("verdict, words", [
    ("~", "no difference in final test accuracy was detected between the structured init (Imp.-3) and Trunc Normal"),
    (">", "the structured init (Imp.-3) ends higher than Trunc Normal"),
    ("<", "the structured init (Imp.-3) ends lower than Trunc Normal"),
])
def test_the_primary_sentence_follows_the_verdict(verdict, words):
    final = {"a": "impulse3", "b": "trunc_normal", "verdict": verdict, "family": "digits", "n": 5, "p": 0.3,
             "mean_a": 96.0, "mean_b": 95.0, "diff": 1.0, "ci_low": -2.0, "ci_high": 4.0}
    s = readme_answer.primary_sentence("digits", final, 160, "impulse3", "1.26")
    assert s.startswith("On 8×8 digits (5 seeds, paired; 160 epochs), ") and words in s
    assert "at epoch 160" in s and "95 % CI -2.00 to +4.00" in s and "detects 1.26 points" in s


def test_a_rank_reads_in_words_that_survive_a_place():
    assert [readme_answer.band(r, 6) for r in range(1, 7)] == ["among the highest"] * 2 + ["in the middle"] * 2 \
        + ["among the lowest"] * 2


def test_the_speed_endpoint_is_tested_only_by_a_replication_of_these_very_numbers():
    speed = {"a": "impulse3", "b": "trunc_normal", "family": "digits, epoch 20", "diff": 34.6, "ci_low": 7.9,
             "ci_high": 61.3}
    again = {"primary": [{"dataset": "digits, epoch 20", "a": "impulse3", "b": "trunc_normal",
                          "stated": {"diff": 34.6}, "replication": {"seeds": [5, 6, 7, 8, 9], "diff": 36.7,
                                                                    "ci_low": 15.7, "ci_high": 57.7, "p": 0.008,
                                                                    "verdict": ">"}}],
             "computed_on": "bf16 on Some CPU"}
    tested = readme_answer.speed_sentence(speed, again, "impulse3")
    assert "on seeds 5–9, the structured init (Imp.-3) is ahead of Trunc Normal, +36.7 points" in tested
    assert "Some CPU" in tested
    again["primary"][0]["stated"]["diff"] = 30.0            # another run's numbers: says nothing of these
    assert "not yet tested on new seeds" in readme_answer.speed_sentence(speed, again, "impulse3")


def test_a_licence_and_a_citation_that_cites_the_paper():
    assert "Apache License" in text("LICENSE") and "Version 2.0" in text("LICENSE")
    cff = yaml.safe_load(text("CITATION.cff"))
    paper = cff["preferred-citation"]
    assert paper["title"] == "Structured Initialization for Attention in Vision Transformers"
    assert [a["family-names"] for a in paper["authors"]] == ["Zheng", "Li", "Lucey"] and paper["year"] == 2024
    assert cff["type"] == "software" and cff["license"] == "Apache-2.0" and cff["references"][0] == paper


def test_the_readme_installs_the_library_by_its_distribution_name():
    assert 'pip install "git+' in README and "structinit-vit" in README
