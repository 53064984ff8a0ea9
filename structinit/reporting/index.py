"""reports/README.md: the index of every table and figure the pipeline wrote, with one line on
how to read each, ordered by the questions they answer. build_index fails naming any file it
would link to that does not exist, so the index never points at nothing.
"""
from __future__ import annotations

from pathlib import Path

from structinit.io import MissingFileError

QUESTIONS = """\
## Three questions, and where to look

**1. Does attention stay local after training?** `attention.md`, *Mean attention distance*.
In the figure, lower = more local: solid lines (trained) below the dotted line (uniform
attention) mean attention stays local; a solid line below its dashed twin (at init) means
training made it more local. The generated conclusions say which differences the seeds
support. Whether the structured init's impulses survive real images at all: the *Mass on each
head's impulse offset* table (pseudo-input vs test images), and the two attention-map
figures, which share one colour scale.

{distance}

{maps}

**2. Do the initializers lead to different representations?** `attention.md`, *CKA*. First
figure: a model's blocks at init (rows) vs trained (columns): near 1 = the block barely moved.
Second: every pair of trained models with different initializers; low values = different
representations (the diagonal compares the same block).

{cka}

**3. Is the gain a small-data effect?** `data_size.md`: the study's initializers
(`studies.data_size.inits`) trained on fractions of the training set with the optimizer's
step count held to the full-data run's. A gap between lines that widens to the left means the
initialization matters more with less data; the report tests each gap's change.

{data_size}
"""

TABLES = [
    ("headline.md", "the main table and the primary contrast, the block the top-level README quotes"),
    ("main_table.md", "rows = initializers, columns = datasets: final-epoch test accuracy (%), mean ± std "
                      "over seeds, (difference to Trunc Normal), 95 % CI, n, the paper's number; "
                      "then the planned contrasts, paired by seed (primary alone, Holm over the secondary)"),
    ("kernel_table.md", "the structured init per kernel size: accuracy, and its mass on the target "
                        "offset beside the official solver's (close = same softness as the paper)"),
    ("preopt_table.md", "one row per Q/K solve: fit (MSE), target mass, and the official solver's on "
                        "the same shape and seed (the paper publishes no solver numbers)"),
    ("attention.md", "per dataset: impulse mass on the pseudo-input vs real images, mean attention "
                     "distance per block (at init → trained, lower = more local), CKA; figures inline"),
    ("data_size.md", "accuracy per initializer and training-set size at equal optimizer steps; each "
                     "difference and each change of the gap to Trunc Normal, with its interval"),
    ("convmixer_filters.md", "ConvMixer with learned vs frozen spatial filters: is a frozen impulse "
                             "as good as learned (the structured init's premise)?"),
    ("pseudo_input.md", "the structured init's pseudo-input (first → later blocks, shared or "
                        "per-layer solve): which input to solve Q/K on"),
    ("heads_width.md", "more heads, wider models: does the structured init's advantage hold?"),
    ("summary.json", "headline numbers, for `dvc metrics show` / `dvc metrics diff`"),
    ("conclusions/", "each report's verdicts as data (<report>.json: every tested statement, means, n, "
                     "p, Holm p, verdict, fragile); what `./run.sh verify` compares"),
    ("cells.csv", "one row per trained run of the main grid (final and best test accuracy)"),
    ("curves.csv", "accuracy and loss per epoch, one row per dataset, initializer, seed and epoch"),
]

FIGURES = [
    ("figures/main/{ds}.png", "the main result: each seed's accuracy per initializer (lines join one seed), "
     "and accuracy against the epoch budget"),
    ("figures/curves/{ds}.png", "train/test accuracy and loss per epoch: line = mean over seeds, "
     "band = ±1 std; lines apart beyond their bands = initializers that train differently"),
    ("figures/attention/attention_pseudo_{ds}.png", "each head's attention by offset from the query on "
     "the pseudo-input (rows: initializer at init / trained; columns: first, middle, last block × "
     "heads); a structured-init head is a bright pixel at its outlined offset"),
    ("figures/attention/attention_images_{ds}.png", "the same on real test images, same colour scale: "
     "how much of the impulse survives real tokens"),
    ("figures/attention/impulse_kernels_{ds}.png", "each structured-init head's k×k window as numbers: "
     "target, pseudo-input, test images at init and trained"),
    ("figures/attention/mean_distance_{ds}.png", "mean attention distance per block, at init (dashed) "
     "and trained (solid); lower = more local"),
    ("figures/attention/cka_init_vs_trained_{ds}.png", "CKA of each model's blocks at init vs trained: "
     "near 1 = unchanged by training"),
    ("figures/attention/cka_between_inits_{ds}.png", "CKA between the blocks of trained models with "
     "different initializers: low = different representations"),
]
# The studies' reports (params.yaml studies.<study>; structinit/reporting/study_reports.py)
STUDY_REPORTS = {"convmixer": ("convmixer_filters.md", "ConvMixer: learned vs frozen spatial filters"),
                 "pseudo_input": ("pseudo_input.md", "the structured init's pseudo-input"),
                 "heads_width": ("heads_width.md", "heads and width"),
                 "data_size": ("data_size.md", "accuracy against training-set size (beyond the paper)")}
DATA_SIZE_FIGURE = ("figures/data_size/{ds}.png", "test accuracy against training-set size per "
                    "initializer, 95 % intervals, same optimizer steps at every size")


def studies_section(studies: dict[str, list[str]]) -> str:
    """What this configuration ran of the studies (studies: study -> its datasets; [] = off)."""
    on = [s for s in STUDY_REPORTS if studies.get(s)]
    lead = ("Every study runs in this configuration, as in the embedded default" if len(on) == len(STUDY_REPORTS)
            else f"{len(on)} of the {len(STUDY_REPORTS)} studies run in this configuration (the embedded "
                 "default runs every one)")
    lines = ["## The studies", "",
             lead + ": each at the main grid's epoch budget (the data-size study holds its optimizer steps; "
             "each report's \"What ran\" says whether that budget is converged), on seeds of the main grid, "
             "whose cells a study reuses where it can. On at least 5 seeds a report "
             "tests the contrasts params.yaml plans for it (`studies.<study>.contrasts`, Holm within each "
             "family), states the smallest difference its design detects (80 % power), and the ConvMixer "
             "report tests the paper's \"frozen impulse ≈ learned\" for equivalence (TOST, margin in "
             "params.yaml); on fewer (the embedded default's 3) it gives each pair's estimate and interval, "
             "no verdict, and says why. The paper's numbers for these studies are secondary quotes, not "
             "checked against the paper, and labelled so.", ""]
    for study, (name, what) in STUDY_REPORTS.items():
        where = (f"ran on {', '.join(studies[study])}" if studies.get(study) else
                 f"off in this configuration (`studies.{study}.datasets: []`; the report says how to bring it back)")
        lines.append(f"- `{name}`: {what}: {where}")
    return "\n".join(lines) + "\n"


def build_index(reports: Path, datasets: list[str], studies: dict[str, list[str]]) -> str:
    """studies: study -> the datasets it ran on (params.yaml studies.<study>.datasets)."""
    data_size_datasets = studies.get("data_size") or []
    missing = []

    def link(path: str, image: bool = False) -> str:
        if not (reports / path).exists():
            missing.append(str(reports / path))
        return f"![{path}]({path})" if image else f"[`{path}`]({path})"

    blocks = {key: "\n\n".join(link(pattern.format(ds=ds), image=True) for ds in dss)
              for key, pattern, dss in (
                  ("distance", "figures/attention/mean_distance_{ds}.png", datasets),
                  ("maps", "figures/attention/attention_pseudo_{ds}.png", datasets),
                  ("cka", "figures/attention/cka_between_inits_{ds}.png", datasets),
                  ("data_size", DATA_SIZE_FIGURE[0], data_size_datasets))}
    main = "\n\n".join(link(f"figures/main/{ds}.png", image=True) for ds in datasets)
    lines = ["# Reports", "",
             "Every file here is written by `dvc repro` (its stages: docs/pipeline.md); this index "
             "by the stage `reports_index`. Numbers are final-epoch test accuracy (%) unless said "
             "otherwise, mean ± std over seeds; every report of results ends with the paper's own "
             "numbers, labelled as the paper's (side by side where the dataset is the paper's).", "",
             "## The main result", "",
             "Each seed's final test accuracy per initializer, a grey line joining one seed's arms "
             "(the comparison is paired by seed: parallel lines = a consistent difference), the mean "
             "as a bar, the paper's number as a cross; beside it, accuracy against the epoch budget "
             "(stage epoch_budget, while its evidence is fresh): what a shorter run would have shown. The tests: "
             f"{link('main_table.md')}, *Conclusions*.", "", main, "",
             QUESTIONS.format(**blocks), studies_section(studies), "## Tables", ""]
    lines += [f"- {link(name)}: {what}" for name, what in TABLES]
    lines += ["", "## Figures", ""]
    for ds in datasets:
        lines += [f"- {link(p.format(ds=ds))}: {what}" for p, what in FIGURES]
    for ds in data_size_datasets:
        lines.append(f"- {link(DATA_SIZE_FIGURE[0].format(ds=ds))}: {DATA_SIZE_FIGURE[1]}")
    if missing:
        raise MissingFileError(f"reports_index: {len(missing)} file(s) to index do not exist: {missing}")
    return "\n".join(lines) + "\n"
