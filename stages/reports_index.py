"""reports_index: reports/README.md, the index of every table and figure the pipeline wrote,
with one line on how to read each, ordered by the questions they answer.

It runs after every report stage (it depends on their outputs) and fails naming any file it
would link to that does not exist, so the index never points at nothing.
"""
import argparse
from pathlib import Path

from stages.common import load_params, run_stage, write_text

QUESTIONS = """\
## Three questions, and where to look

**1. Does attention stay local after training?** `attention.md`, *Mean attention distance*.
In the figure, solid lines (trained) below the dotted line (uniform attention) mean attention
stays local; a solid line below its dashed twin (at init) means training made it more local.
The generated conclusions say which differences the seeds support.

{distance}

**2. Do the initializers lead to different representations?** `attention.md`, *CKA*. Top row:
a model's blocks at init (rows) vs trained (columns): near 1 = the block barely moved. Bottom
row: the same block of two trained models; low off-diagonal values = different representations.

{cka}

**3. Is the gain a small-data effect?** `data_size.md`: every initializer trained on fractions of
the training set with the optimizer's step count held to the full-data run's. A gap between
lines that widens to the left means the initialization matters more with less data.

{data_size}
"""

TABLES = [
    ("main_table.md", "the main table: final-epoch test accuracy (%) per initializer and dataset, "
                      "mean ± std over seeds, 95 % CI, n, the paper's numbers; generated conclusions"),
    ("kernel_table.md", "the structured init by kernel size, with its softness beside the official solver's"),
    ("preopt_table.md", "each Q/K solve: fit, mass on the target, and the official solver's on the same solve"),
    ("attention.md", "attention mass on the impulse offsets (pseudo-input vs real images), mean "
                     "attention distance per block, CKA; figures inline"),
    ("data_size.md", "accuracy against training-set size per initializer, steps held; conclusions"),
    ("convmixer_filters.md", "ConvMixer with learned vs frozen (random, impulse, box) spatial filters"),
    ("pseudo_input.md", "the structured init's pseudo-input variants, shared or per-layer solve"),
    ("heads_width.md", "more heads, wider models: structured init vs baselines"),
    ("summary.json", "headline numbers for `dvc metrics show` / `dvc metrics diff`"),
    ("conclusions.json", "every tested pair of the main table: means, n, p, Holm p, verdict"),
    ("cells.csv", "one row per trained run of the main grid"),
    ("curves.csv", "accuracy and loss per epoch, one row per dataset, initializer, seed and epoch"),
]

FIGURES = [
    ("figures/curves/{ds}.png", "train/test accuracy and loss per epoch: mean over seeds, band ±1 std"),
    ("figures/attention/attention_pseudo_{ds}.png", "attention by offset from the query on the pseudo-input "
     "(rows: initializer at init / trained; columns: first, middle, last block × heads)"),
    ("figures/attention/attention_images_{ds}.png", "the same, averaged over real test images"),
    ("figures/attention/impulse_kernels_{ds}.png", "each structured-init head's k×k window: target, "
     "pseudo-input, test images at init and trained"),
    ("figures/attention/mean_distance_{ds}.png", "mean attention distance per block, at init and trained"),
    ("figures/attention/cka_{ds}.png", "CKA heat maps: init vs trained, and between initializers"),
]
DATA_SIZE_FIGURE = ("figures/data_size/{ds}.png", "test accuracy against training-set size per initializer")


def build_index(reports: Path, datasets: list[str], data_size_datasets: list[str]) -> str:
    missing = []

    def link(path: str, image: bool = False) -> str:
        if not (reports / path).exists():
            missing.append(str(reports / path))
        return f"![{path}]({path})" if image else f"[`{path}`]({path})"

    blocks = {key: "\n\n".join(link(pattern.format(ds=ds), image=True) for ds in dss)
              for key, pattern, dss in (
                  ("distance", "figures/attention/mean_distance_{ds}.png", datasets),
                  ("cka", "figures/attention/cka_{ds}.png", datasets),
                  ("data_size", DATA_SIZE_FIGURE[0], data_size_datasets))}
    lines = ["# Reports", "",
             "Every file here is written by `dvc repro` (stage names in the main README); this index "
             "by the stage `reports_index`. Numbers are final-epoch test accuracy (%) unless said "
             "otherwise, mean ± std over seeds; every report ends with the paper's own numbers, "
             "labelled as the paper's.", "", QUESTIONS.format(**blocks), "## Tables", ""]
    lines += [f"- {link(name)}: {what}" for name, what in TABLES]
    lines += ["", "## Figures", ""]
    for ds in datasets:
        lines += [f"- {link(p.format(ds=ds))}: {what}" for p, what in FIGURES]
    for ds in data_size_datasets:
        lines.append(f"- {link(DATA_SIZE_FIGURE[0].format(ds=ds))}: {DATA_SIZE_FIGURE[1]}")
    if missing:
        raise SystemExit(f"reports_index: {len(missing)} file(s) to index do not exist: {missing}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reports", default="reports")
    a = ap.parse_args()
    params = load_params()
    text = build_index(Path(a.reports), params["grid"]["datasets"],
                       params["studies"]["data_size"]["datasets"])
    write_text(Path(a.reports) / "README.md", text)


if __name__ == "__main__":
    run_stage(main)
