"""benchmarks/gpu_probe.py: the --tiny run (toy sizes, on the CPU) writes every part of the probe
file with numbers in it (the profile part (g) as CPU ops: its CUDA summary is tested on made-up
kernel events), and every committed probe file (benchmarks/gpu_probe-<card>-<commit>.md,
one per GPU run; tools/probe_file.py's PRICED, the H200's, is the one tools/gpu_hours.py prices
the grid from) parses as gpu_hours reads it (tools/probe_file.py) and names its card, torch and
commit."""
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tools.probe_file import (COMPILED_ROW, EAGER_ROW, FM_ALONE_ROW, FM_DEEPEST_ROW, FM_DEPTHS_HEADING, FM_GRID_ROW,
                              FM_RATE_ROW, LAUNCHES_ROW,
                              NOT_MEASURED, PRICED,
                              PROFILE_HEADINGS, PROFILE_TOP, RATE_ROW, REQUIRED_SECTIONS, SECTIONS, SHARE_COLUMN,
                              STACK_ROW, TINY_LABEL, TRAINER_ROW, ProbeFileError, number, parse_tables, probe_files,
                              probe_name, read_probe)

REPO = Path(__file__).resolve().parents[1]


def bodies(text: str) -> dict[str, str]:
    """{section title: its text up to the next one}."""
    parts = re.split(r"^(## .*)$", text, flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("probe") / "probe.md"
    # no GPU even where there is one (the tiny run is the CPU's), and PYTHONPATH extended, never
    # replaced: a GPU image may keep the project's packages in a folder named there
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_probe", "--tiny", "--out", str(out)], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=900)   # a hang guard, not a speed gate
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out.read_text()


def test_the_tiny_run_writes_every_part_with_numbers(tiny):
    assert tiny.startswith(f"# GPU probe: {TINY_LABEL}\n")
    parts = bodies(tiny)
    for title in SECTIONS.values():
        body = parts[title]                       # KeyError: a part the file lacks
        # a part that failed or ran out of budget writes one line instead of its table
        assert not re.match(r"\s*(error|skipped|not run yet)", body), f"{title}: {body.strip()[:300]}"
        assert "| error:" not in body and "| skipped:" not in body, body
        assert re.search(r"\d", body), title
    tables = parse_tables(tiny)
    counts = tables[SECTIONS["a"]][0]
    assert sum(int(counts[k]) for k in ("passed", "failed", "errors", "skipped")) >= 1
    steps = {row["step"]: row for row in tables[SECTIONS["b"]] if "step" in row}
    assert set(steps) == {EAGER_ROW, COMPILED_ROW, TRAINER_ROW, f"{STACK_ROW} 5"}
    for row in steps.values():
        assert number(row["ms per step, min"]) > 0 and number(row["TFLOP/s (at the min)"]) > 0, row
    e2e = {row["what"]: row["value"] for row in tables[SECTIONS["c"]]}
    assert number(e2e[RATE_ROW]) > 0
    assert "backend gloo, device cpu" in parts[SECTIONS["e"]]
    digits = {row["what"]: row["value"] for row in tables[SECTIONS["d"]]}
    # the same cell with the step's CUDA graph off: both timed (on the CPU neither captures)
    assert re.fullmatch(r"\d+\.\d\dx", digits["the whole-step graph's gain per epoch (median off / median on)"])
    assert "| the same bytes | yes |" in parts[SECTIONS["f"]]
    fm = {row["what"]: row["value"] for row in tables[SECTIONS["h"]] if "what" in row}
    assert number(fm[FM_RATE_ROW]) > 0 and number(fm[FM_GRID_ROW]) > 0
    assert "6 cells x 20 epochs x 60,000 images" in fm["the grid"]       # params.yaml's grid and recipe
    assert number(fm[FM_ALONE_ROW]) > 0                                   # one model alone, for the plan
    way = fm["the faster way to train a cell's seeds (model-images/s)"]
    assert way.startswith(("stacked (", "one model alone (")), way           # the CPU stacks: both measured


def test_the_tiny_run_prices_the_fashion_mnist_grid_at_other_depths(tiny):
    """(h) with --fm-depths (TINY's: 2, beside its toy recipe's 1): a row per depth, measured, the
    grid as DVC runs it adding every stage's own cost to the cells', and the deepest that fits."""
    from benchmarks.gpu_probe import FM_STAGE_SECONDS, FM_TARGET_MINUTES

    body = bodies(tiny)[SECTIONS["h"]]
    assert FM_DEPTHS_HEADING in body
    rows = [row for row in parse_tables(tiny)[SECTIONS["h"]] if "depth" in row]
    assert [row["depth"] for row in rows] == ["1", "2"]
    for row in rows:
        assert number(row["cell images/s"]) > 0, row
        cells, dvc = number(row["the grid's cells, min"]), number(row["the grid as DVC runs it, min"])
        # 6 stages' own cost at least (the tiny cells' epochs are a fraction of a second)
        assert dvc >= cells - 0.1 and dvc >= 6 * FM_STAGE_SECONDS / 60 - 0.1, row
        assert row[f"<= {FM_TARGET_MINUTES:g} min"] == ("yes" if dvc <= FM_TARGET_MINUTES else "no")
    fitting = [int(row["depth"]) for row in rows if row[f"<= {FM_TARGET_MINUTES:g} min"] == "yes"]
    assert f"{FM_DEEPEST_ROW}: {max(fitting) if fitting else 'none of these'}\n" in body


def test_the_deepest_fitting_depth_is_the_largest_within_the_target_in_any_order():
    from benchmarks.gpu_probe import deepest_fitting

    # the rows come recipe first, then --fm-depths as given (4 3 2): the deepest, not the last
    assert deepest_fitting({6: 19.0, 4: 9.5, 3: 8.0, 2: 6.1}) == 4
    assert deepest_fitting({6: 10.0, 2: 3.0}) == 6                   # the target itself fits
    assert deepest_fitting({6: 10.01, 3: 10.5}) is None
    assert deepest_fitting({2: 6.0, 5: 9.0, 3: 12.0}, target=8.0) == 2


def test_the_grid_time_as_dvc_runs_it_adds_the_stages_and_one_cold_compile():
    from benchmarks.gpu_probe import FM_CACHED_FIRST_SECONDS, FM_STAGE_SECONDS, fm_grid_seconds

    # 60,000 images at 6,000/s: 10 s an epoch; the test set's 10,000 measured as 1 s on 2,000
    cell = {"rate": 6000.0, "evaluate": 1.0, "first_extra": 33.0}
    epoch = 10 + 5
    assert fm_grid_seconds(cell, 6, 20, 2000, as_dvc_runs_it=False) == pytest.approx(6 * (20 * epoch + 33))
    assert fm_grid_seconds(cell, 6, 20, 2000, as_dvc_runs_it=True) == pytest.approx(
        6 * (20 * epoch + FM_STAGE_SECONDS) + 33 + 5 * FM_CACHED_FIRST_SECONDS)
    # a first epoch that costs less than a cached one is charged as measured
    cheap = dict(cell, first_extra=1.0)
    assert fm_grid_seconds(cheap, 6, 20, 2000, as_dvc_runs_it=True) == pytest.approx(
        6 * (20 * epoch + FM_STAGE_SECONDS) + 1 + 5 * 1)


@pytest.mark.parametrize("args, said", [(["--fm-depths", "0", "3"], "--fm-depths 0 3: depths are positive"),
                                         (["--fm-depths", "3", "--skip", "h"], "do not skip h")])
def test_fm_depths_refuses_what_cannot_run(args, said):
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_probe", "--tiny", *args, "--out", os.devnull], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and said in r.stderr, r.stderr[-500:]


def test_gpu_hours_refuses_a_tiny_file(tiny, tmp_path):
    path = tmp_path / "probe.md"
    path.write_text(tiny)
    with pytest.raises(ProbeFileError, match="tiny"):
        read_probe(path)


@pytest.mark.parametrize("path", probe_files(), ids=lambda p: p.name)
def test_each_committed_probe_file_parses_and_names_its_card_torch_and_commit(path):
    """A GPU's own run of the probe, unedited: the probe's layout, its title naming the card,
    torch and the commit it ran at (the file's name says card and commit too), a rate, FLOPs and
    a peak."""
    text = path.read_text()
    assert TINY_LABEL not in text.splitlines()[0]
    assert all(SECTIONS[key] in bodies(text) for key in REQUIRED_SECTIONS)     # (g) came later
    probe = read_probe(path)
    assert probe["mode"] == "full" and re.fullmatch(r"[0-9a-f]{7,40}", probe["commit"]), probe
    assert text.startswith(f"# GPU probe: {probe['card']}, torch {probe['torch']}, project at {probe['commit']}\n")
    assert "`python -m benchmarks.gpu_probe" in text.split("\n\n")[1]          # written by the probe itself
    assert path.name == probe_name(probe["card"], probe["commit"])
    assert probe["rate"] > 0 and probe["gflop"] > 0 and probe["peak_gib"] > 0, probe


def test_the_priced_file_is_a_committed_one():
    """tools/gpu_hours.py prices from PRICED, one of the files side by side in benchmarks/ (the
    H200's run at 02d9857 until a later run's file is named there)."""
    assert PRICED in probe_files()
    assert probe_name("NVIDIA H200", "02d9857") == "gpu_probe-h200-02d9857.md"
    assert probe_name("NVIDIA H100 80GB HBM3", "4380d9d") == "gpu_probe-h100-80gb-hbm3-4380d9d.md"


def test_a_probe_file_without_the_rate_is_refused(tmp_path):
    text = PRICED.read_text()
    path = tmp_path / "probe.md"
    path.write_text(re.sub(rf"\| {re.escape(RATE_ROW)} \| [^|]+\|", f"| {RATE_ROW} | {NOT_MEASURED} |", text))
    with pytest.raises(ProbeFileError, match="has no ViT-T/2 rate"):
        read_probe(path)
    with pytest.raises(ProbeFileError, match="no such probe file"):
        read_probe(tmp_path / "missing.md")


def headed(body: str) -> dict[str, str]:
    """{### heading: its text up to the next one} of a section's body."""
    parts = re.split(r"^(### .*)$", body, flags=re.M)
    return {title.strip(): text for title, text in zip(parts[1::2], parts[2::2])}


def test_the_tiny_profile_part_lists_at_most_15_cpu_ops_per_step_with_shares_and_launches(tiny):
    """(g) on the CPU: both profiles (ViT-T/2's step and the digits stack's), each a table of
    its figures and one of at most 15 ops, labelled CPU ops (no GPU: not kernels), with shares
    summing to at most 100 % and launches (here: aten op calls) per step above 0."""
    profiles = headed(bodies(tiny)[SECTIONS["g"]])
    assert "CPU ops, not kernels" in bodies(tiny)[SECTIONS["g"]]
    for heading in PROFILE_HEADINGS.values():
        body = next((text for title, text in profiles.items() if title.startswith(heading)), None)
        assert body is not None, f"{heading}: missing from (g): {list(profiles)}"
        assert "error:" not in body, body
        tables = [t for t in re.split(r"\n\s*\n", body) if t.lstrip().startswith("|")]
        figures, top = (parse_tables("## x\n" + t)["## x"] for t in tables)
        what = {row["what"]: row["value"] for row in figures}
        assert number(what[LAUNCHES_ROW]) > 0, what
        assert number(what["wall per step, ms (profiled)"]) > 0 and number(what["steps recorded"]) >= 1, what
        assert 1 <= len(top) <= PROFILE_TOP
        op = next(h for h in top[0] if h.startswith("CPU op"))
        assert "not kernels" in op
        share = next(h for h in top[0] if h.startswith(SHARE_COLUMN))
        shares = [number(row[share]) for row in top]
        assert all(0 <= x <= 100 for x in shares) and sum(shares) <= 100 + 0.05 * len(shares), shares
        assert shares == sorted(shares, reverse=True)
        assert all(row[op].strip("`").startswith("aten::") for row in top), top


def test_the_cuda_summary_counts_kernels_launches_and_shares_per_step():
    """profile_summary's GPU path on made-up profiler events: device events grouped by their short
    name, time and share per step, kernels (not copies) and host launch calls per step."""
    from torch.autograd import DeviceType

    from benchmarks.gpu_probe import profile_summary

    def event(name, us=0.0, device=DeviceType.CUDA):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(elapsed_us=lambda: us))

    add = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, " \
          "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
    events = ([event(gemm, 30.0)] * 4 + [event(add, 5.0)] * 8 + [event("Memcpy HtoD (Pageable -> Device)", 10.0)] * 2
              + [event(f"triton_poi_fused_{i}", 1.0) for i in range(20)]
              + [event("cudaLaunchKernel", device=DeviceType.CPU)] * 30
              + [event("cudaGraphLaunch", device=DeviceType.CPU)] * 2 + [event("aten::mm", device=DeviceType.CPU)] * 4)
    prof = SimpleNamespace(events=lambda: events)
    s = profile_summary(prof, steps=2, cuda=True)
    assert s["total_us"] == pytest.approx((120 + 40 + 20 + 20) / 2)
    assert s["count"] == (4 + 8 + 20) / 2                  # kernels: the copies are not
    assert s["launches"] == 15 and s["graphs"] == 1
    assert len(s["top"]) == PROFILE_TOP
    name, us, share, calls, variants = s["top"][0]
    assert name.startswith("sm90_xmma_gemm") and us == 60 and share == pytest.approx(0.6) and calls == 2
    assert s["top"][1][0] == "vectorized_elementwise_kernel[CUDAFunctor_add]"
    assert sum(row[2] for row in s["top"]) <= 1


def test_kernel_names_are_shortened_for_the_table():
    from benchmarks.gpu_probe import short_kernel_name

    assert short_kernel_name("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, int)") \
        == "cunn_SoftMaxForward"
    assert short_kernel_name("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
                             "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}>(int)") \
        == "elementwise_kernel[direct_copy_kernel_cuda]"
    assert short_kernel_name("triton_per_fused_native_layer_norm_0") == "triton_per_fused_native_layer_norm_0"
    assert len(short_kernel_name("k" * 200)) == 72 and "|" not in short_kernel_name("a|b")
