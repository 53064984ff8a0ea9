"""One training step of every stacked model, read top to bottom: `train_step`.

    objective = Objective(stack, cfg, device, dtype)     # forward, loss, backward (eager or compiled)
    gradients, how = plan_gradients(cfg.cpu_chunks, stack, device, batch, objective, micro_batch=None)
    with gradients:                                     # the CPU's chunks: one torch thread per chunk
        out = train_step(stack, opt, gradients, x, y, lr=..., max_norm=..., ctx=ctx)

A step is: (1) each model's forward and label-smoothed loss on its batch, (2) the backward, its
gradients set as the parameters' .grad (averaged over processes under torchrun), (3) each
model's gradients clipped to its own norm, (4) one AdamW step over the stack. What varies is
how (1)-(2) run, and each variant is an argument:
- `Objective`: (1)-(2) on one piece of the batch, eager or compiled by torch.compile (with the
  guard that falls back to eager where compiling fails);
- `WholeBatchGradients`: the batch in one pass, or in micro-batches one after another (a batch
  too big for the device's memory);
- `ChunkedGradients` (CPU): the batch as single-threaded chunks on threads, gradients summed.

- `StepGraph` (CUDA): the whole of (1)-(4) captured once as one CUDA graph and replayed each
  step, where the host, not the GPU, sets a small stacked model's pace.

Why chunks: on a CPU, PyTorch's intra-op threads fork and join inside every op, and a small
ViT's ops (64 tokens, width 48) are short. Splitting each batch into one chunk per core, each
forward/backward single-threaded on its own Python thread (torch ops release the GIL), keeps
every core busy with no fork/join inside each op. The chunks split the batch dimension of every
stacked model at once; on CUDA there is nothing to gain (one device, already asynchronous).

Same optimizer step: each piece's loss is weighted by its share of the batch, so the sum of the
pieces' gradients is the full batch's mean-loss gradient, for every model. Pieces are summed
in a fixed order, so a run is deterministic; only the float summation order differs from the
unsplit step (as it already does between thread counts). That holds only for models whose
forward treats samples independently and deterministically (why_not_splittable): `auto` falls
back to one chunk, and an explicit count or micro-batches are refused, for BatchNorm (batch
statistics) and active dropout / drop-path (one shared RNG drawn from several threads).
"""
from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, NamedTuple

import torch

from structinit.training.common import autocast
from structinit.training.config import TrainConfig
from structinit.training.stacked import StackedModels, mean_cross_entropy, set_grads

if TYPE_CHECKING:
    from structinit.distributed import DistributedContext


class StepResult(NamedTuple):
    loss_sum: torch.Tensor      # (N,) each model's summed per-image loss over its batch
    correct: torch.Tensor       # (N,) each model's correct predictions
    nonfinite: torch.Tensor     # (N,) bool: the model's loss or gradient norm was NaN or inf
    meanwhile: object           # what the caller's `meanwhile()` returned


def train_step(stack: StackedModels, opt: torch.optim.Optimizer, gradients: "WholeBatchGradients | ChunkedGradients",
               x: torch.Tensor, y: torch.Tensor, *, lr: float | None, max_norm: float, ctx: DistributedContext,
               meanwhile: Callable[[], object] | None = None) -> StepResult:
    """One step of every stacked model on its batch: x (N, B, ...), y (N, B). Nothing reads
    back to the host: the results stay on the device. meanwhile(): the caller's work while the
    gradients compute (the next batch), run between submitting the pieces and collecting them,
    which on the CPU's chunks overlaps them. lr None: the optimizer's as it stands (StepGraph
    fills the device tensor it holds)."""
    if lr is not None:
        for group in opt.param_groups:
            group["lr"] = lr
    # (1)-(2) forward, loss and backward of every piece of the batch
    pending = gradients.submit(x, y)
    upcoming = meanwhile() if meanwhile is not None else None
    loss_sum, correct = gradients.collect(pending)                     # sets each parameter's .grad
    if ctx.enabled:                               # what DDP does: the global batch's mean gradient,
        ctx.average_gradients(list(stack.trainable().values()))        # in a few bucketed collectives
    # (3) each model's gradients clipped to its own total norm (inf: not clipped)
    norms = stack.clip_grad_norms(max_norm)                            # (N,)
    nonfinite = ~torch.isfinite(loss_sum) | ~torch.isfinite(norms)
    # (4) the update
    opt.step()
    return StepResult(loss_sum, correct, nonfinite, upcoming)


# ---- (1)-(2) on one piece: the objective, eager or compiled ----------------------------------

# Compiling and capturing happen over the first calls (dynamo traces on the first; a CUDA graph
# tree warms up on the first and records on the second or third): a failure in any of them,
# forward or backward, falls back to eager. Past them a failure is a real error and is raised.
# Calls, not steps: a step split in pieces (micro-batches, the CPU's chunks) calls once a piece,
# and each call of the compiled function is what compiles, warms up or records.
GUARDED_CALLS = 3
# torch.compile functions that failed in this process: later cells (a cell's seeds trained one
# after another, each a call of train_models) do not try again and warn again. Keyed by the
# function itself, so a test that swaps in a broken torch.compile leaves the real one untried.
_FAILED_COMPILERS: "weakref.WeakSet" = weakref.WeakSet()


class Objective:
    """objective(replica, x, y) -> (gradients {trainable name: (N, ...)}, each model's mean
    label-smoothed loss (N,), logits (N, B, classes)): StackedModels.loss_and_grads with the
    recipe's loss, in autocast of the run's dtype, on a replica of the stack (a chunk's thread
    has its own).

    Compiled by torch.compile where cfg.compile says (auto: on CUDA; off on the CPU, where the
    committed bytes are eager's; never the vmap way, which does not trace), else eager; `how`
    says which, for the log. A host-bound stack on CUDA is compiled in reduce-overhead mode
    (its forward and backward replayed as CUDA graphs). A machine where compiling or capturing
    fails, in the forward or the backward, gets a one-line warning and the eager step (the
    failed call re-run eager, nothing lost; the compiled graphs dropped). An error that leaves
    the CUDA context unusable (an illegal memory access) fails the eager re-run as well: that
    one is raised. Inductor keeps what it compiled on disk (its FX graph cache), so a second
    process of the same recipe pays far less."""

    def __init__(self, stack: StackedModels, cfg: TrainConfig, device: torch.device, dtype: str,
                 graphed: bool = False):
        """graphed: the step around this objective is captured whole (StepGraph): compiled in
        default mode, whose kernels the step's graph holds (reduce-overhead's own graphs cannot
        nest in it), and with autocast's cast cache off, as PyTorch's CUDA-graph notes ask of
        autocast inside a capture."""
        self.loss = functools.partial(mean_cross_entropy, label_smoothing=cfg.label_smoothing)
        self.context = functools.partial(autocast, device, dtype, cache=not graphed)
        self.device = device
        self.compiled, self.how, self.host_bound = None, "", False
        self._calls, self._failed, self._trusted = 0, False, False   # trusted: the guarded calls all succeeded
        # the CPU's chunks call from threads: the guarded calls run one at a time (the first
        # compiles while the others wait), so one failure warns once and the rest run eager
        self._guard = threading.Lock()
        on = cfg.compile == "on" or (cfg.compile == "auto" and device.type == "cuda")
        if not on or stack.way == "by vmap":
            return
        if torch.compile in _FAILED_COMPILERS:
            self.how = "eager (torch.compile failed earlier in this process)"
            return
        self.host_bound = device.type == "cuda" and stack.way != "plain" and not graphed
        mode = "reduce-overhead" if self.host_bound else None
        self._compiler = torch.compile
        self.compiled = self._compiler(stack.forward_and_loss, mode=mode)
        self.how = f"compiled ({mode or 'default'} mode)"

    def eager(self, replica: StackedModels, x: torch.Tensor, y: torch.Tensor):
        return replica.loss_and_grads(x, y, self.loss, self.context)

    def __call__(self, replica: StackedModels, x: torch.Tensor, y: torch.Tensor):
        if self.compiled is None or self._failed:
            return self.eager(replica, x, y)
        if self._trusted:
            if self.host_bound:
                torch.compiler.cudagraph_mark_step_begin()     # the last step's graph outputs are done with
            return replica.loss_and_grads(x, y, self.loss, self.context, self.compiled)
        with self._guard:
            if self._failed or self._trusted:
                return self(replica, x, y)
            self._calls += 1
            try:
                if self.host_bound:
                    torch.compiler.cudagraph_mark_step_begin()
                out = replica.loss_and_grads(x, y, self.loss, self.context, self.compiled)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)        # a failed kernel surfaces here, not steps later
                self._trusted = self._calls >= GUARDED_CALLS
                return out
            except Exception as e:                         # noqa: BLE001 (any compiler failure: run eager)
                first = str(e).splitlines()[0][:200] if str(e) else ""
                print(f"warning: torch.compile failed ({type(e).__name__}: {first}); training eager "
                      "(compile: off in the recipe skips the attempt)")
                self._failed = True
                _FAILED_COMPILERS.add(self._compiler)
                torch.compiler.reset()                     # the graphs and any CUDA-graph memory pool
                return self.eager(replica, x, y)


# ---- (1)-(2) over the batch: whole, in micro-batches, or in the CPU's chunks ------------------

MIN_CHUNK = 16          # below this, per-chunk Python overhead eats the gain


def why_not_splittable(model: torch.nn.Module) -> str | None:
    """Why a batch of this model cannot be split into pieces whose summed gradients are the
    whole batch's (None: it can)."""
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            return f"{name or 'model'} is {type(m).__name__} (batch statistics)"
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            p = m.p
        else:
            p = getattr(m, "drop_prob", 0.0)      # timm's DropPath
        if p:
            return f"{name} is {type(m).__name__}(p={p}) (random masks from a shared RNG)"
    return None


def plan_gradients(setting: str | int, stack: StackedModels, device: torch.device, batch_size: int,
                   objective: Callable, *, micro_batch: int | None = None
                   ) -> tuple["WholeBatchGradients | ChunkedGradients", str]:
    """How a step computes its gradients, and why (for the log): ChunkedGradients where
    plan_cpu_chunks splits the batch, WholeBatchGradients otherwise. objective(replica, x, y):
    an Objective. micro_batch (images per model per pass, smaller than the batch): the
    whole-batch way in pieces, one after another, on any device; it replaces the CPU's chunks
    (a memory limit comes first) and is refused where splitting a batch changes the step."""
    if micro_batch is not None and micro_batch < batch_size:
        if micro_batch < 1:
            raise ValueError(f"micro_batch={micro_batch}: give a positive number of images, or None")
        why = why_not_splittable(stack.base)
        if why:
            raise ValueError(f"micro-batches of {micro_batch} images are not the same step for this model: "
                             f"{why}; unset STRUCTINIT_MICRO_BATCH (or give it >= the batch, {batch_size})")
        pieces = -(-batch_size // micro_batch)
        return (WholeBatchGradients(stack, objective, micro_batch),
                f"{pieces} micro-batches of <= {micro_batch} images per model, one after another")
    chunks, how = plan_cpu_chunks(setting, stack.base, device, batch_size)
    gradients = ChunkedGradients(stack, chunks, objective) if chunks > 1 else WholeBatchGradients(stack, objective)
    return gradients, how


def plan_cpu_chunks(setting: str | int, model: torch.nn.Module, device: torch.device,
                    batch_size: int) -> tuple[int, str]:
    """How many chunks a step runs as, and why. setting: "auto" (one per intra-op thread: more
    chunks than threads only queue on them) or a positive int (1 = off), as validated by
    TrainConfig."""
    explicit = setting != "auto"
    wanted = setting if explicit else min(torch.get_num_threads(), batch_size // MIN_CHUNK)
    if wanted <= 1:
        return 1, "one chunk"
    if device.type != "cpu":                      # the same params.yaml runs on CPU and GPU
        return 1, f"one chunk (cpu_chunks applies to CPU only, this is {device.type})"
    why = (f"more chunks than the batch has images ({batch_size})" if wanted > batch_size
           else why_not_splittable(model))
    if why is None:
        return wanted, f"{wanted} chunks of ~{batch_size // wanted} images per model, one thread each"
    if explicit:
        raise ValueError(f"cpu_chunks={setting} is not possible here: {why}; use cpu_chunks=1")
    return 1, f"one chunk ({why})"


def _sums(losses: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each model's (sum of per-image losses, n correct) from its mean loss (N,), logits
    (N, B, classes) and labels (N, B)."""
    return losses * y.shape[1], (logits.argmax(-1) == y).sum(1)


class WholeBatchGradients:
    """The batch's gradients with the process's intra-op threads: in one pass, or in pieces of
    `micro_batch` images per model, one after another, each piece's gradients weighted by its
    share of the batch and summed in order (the one-pass step's, to float noise).
    submit(x, y) computes; collect(pending) sets .grad and returns (loss_sum, correct)."""

    def __init__(self, stack: StackedModels, objective: Callable, micro_batch: int | None = None):
        self.stack, self.objective, self.micro_batch = stack, objective, micro_batch

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def all_threads(self):
        return contextlib.nullcontext()

    def submit(self, x: torch.Tensor, y: torch.Tensor) -> tuple:
        n = y.shape[1]
        if not self.micro_batch or self.micro_batch >= n:
            grads, losses, logits = self.objective(self.stack, x, y)
            return grads, _sums(losses, logits, y)
        total, loss_sum, correct = None, 0, 0
        for xc, yc in zip(x.split(self.micro_batch, 1), y.split(self.micro_batch, 1)):
            grads, losses, logits = self.objective(self.stack, xc, yc)   # (N, b, ...) pieces
            weight = yc.shape[1] / n
            total = ({k: g * weight for k, g in grads.items()} if total is None
                     else {k: total[k] + g * weight for k, g in grads.items()})
            s_loss, s_correct = _sums(losses, logits, yc)
            loss_sum, correct = loss_sum + s_loss, correct + s_correct
        return total, (loss_sum, correct)

    def collect(self, pending: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        grads, sums = pending
        set_grads(self.stack.trainable(), grads)
        return sums


class ChunkedGradients:
    """A stacked batch's gradients as `chunks` single-threaded pieces in parallel.

    Inside `with`, torch runs one intra-op thread per Python thread (process-wide:
    torch.set_num_threads), restored on exit; all_threads() gives them back meanwhile (the
    evaluation).
    """

    def __init__(self, stack: StackedModels, chunks: int, objective: Callable):
        """objective runs on each chunk's thread (so whatever it enters, e.g. autocast, which
        is per thread, applies there) with that thread's replica."""
        self.chunks, self.objective = chunks, objective
        # functional_call swaps tensors into its module while it runs: one module per thread.
        self.replicas = [stack] + [stack.replica() for _ in range(chunks - 1)]
        self.params = stack.trainable()
        self._pool: ThreadPoolExecutor | None = None
        self._threads = None

    def __enter__(self):
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        # One worker per intra-op thread there was; more chunks than that queue up on them.
        self._pool = ThreadPoolExecutor(min(self.chunks, self._threads), thread_name_prefix="structinit-chunk")
        return self

    def __exit__(self, *exc):
        self._pool.shutdown()
        torch.set_num_threads(self._threads)

    @contextlib.contextmanager
    def all_threads(self):
        """Give the main thread its intra-op threads back, e.g. for evaluation."""
        torch.set_num_threads(self._threads)
        try:
            yield
        finally:
            torch.set_num_threads(1)

    def _one_chunk(self, replica, x, y, weight):
        grads, losses, logits = self.objective(replica, x, y)
        return {k: g * weight for k, g in grads.items()}, _sums(losses, logits, y)

    def submit(self, x: torch.Tensor, y: torch.Tensor) -> list:
        """Start the chunks (slices of B) on the pool; the caller may work meanwhile."""
        n = y.shape[1]
        return [self._pool.submit(self._one_chunk, replica, xc, yc, yc.shape[1] / n)
                for replica, xc, yc in zip(self.replicas, x.tensor_split(self.chunks, 1),
                                           y.tensor_split(self.chunks, 1))]

    def collect(self, pending: list) -> tuple[torch.Tensor, torch.Tensor]:
        results = [f.result() for f in pending]   # fixed order: deterministic sums
        set_grads(self.params, {k: functools.reduce(torch.add, [g[k] for g, _ in results])
                                for k in self.params})
        return sum(s[0] for _, s in results), sum(s[1] for _, s in results)


# ---- (1)-(4) as one CUDA graph ----------------------------------------------------------------

# Eager steps before the capture: the objective's guarded calls (a compile, its checks, which
# synchronize and so cannot run while capturing), AdamW's state (made at its first step), and
# cuBLAS's workspace on the capturing stream. They are real steps of the run.
WARMUP_STEPS = GUARDED_CALLS
# A capture failed in this process: later cells (a cell's seeds one after another) do not try
# again and warn again.
_FAILED_CAPTURE = False


def plan_step_graph(setting: str, way: str, device: torch.device, processes: int,
                    micro_batch: int | None, batch: int) -> tuple[bool, str]:
    """Whether the step is captured as one CUDA graph (StepGraph), and why (for the log).
    setting: TrainConfig.cuda_graph; way: the stack's (StackedModels.way); processes: how many
    share each step (torchrun); micro_batch, batch: images per model per pass and per step in
    this process (plan_gradients's). auto: on CUDA, for a stack of models (the small models a
    host sets the pace of; one plain model fills the card with its own work)."""
    if setting == "off":
        return False, "cuda_graph: off"
    if _FAILED_CAPTURE:
        return False, "capturing failed earlier in this process"
    if device.type != "cuda":
        return False, f"no CUDA graph on {device.type}"
    if way == "plain":
        return False, "one model: its kernels, not the host, set its pace"
    if way == "by vmap":
        return False, "the vmap way does not capture"
    if processes > 1:
        return False, "several processes: the gradients' collectives stay outside a graph"
    if micro_batch is not None and micro_batch < batch:
        return False, "micro-batches: the step is several passes"
    return True, "the whole step as one CUDA graph"


class StepGraph:
    """train_step, captured once as one CUDA graph and replayed for every later step: a step
    is then the batch and lr copied into the graph's input tensors and one launch, where eager
    it is hundreds of kernel launches (forward, backward, clipping, AdamW), each costing the
    host more time than a small stacked model's kernel costs the GPU.

        step = StepGraph(stack, opt, gradients, max_norm=3.0, ctx=ctx, capture=True)
        out = step(x, y, lr=lr, meanwhile=next_batch)        # a StepResult, as train_step's

    The first WARMUP_STEPS steps run eager on the stream the capture then uses; the next one
    is captured and replayed, and every later one replays. Each step's inputs and results are
    the graph's own tensors (the results are overwritten by the next step: read or add them
    before it). The lr lives in a device tensor the optimizer reads (AdamW with capturable on)
    and is filled each step, so the schedule moves inside the graph.

    capture=False: the same function runs eagerly every step, on the same tensors (the CPU,
    the tests): the numbers the graph replays. A capture that fails warns once and the run
    goes on eager with the step that failed re-run (a capture computes nothing), so no step is
    lost. The optimizer must stay this one's (its lr is a tensor from here on)."""

    def __init__(self, stack: StackedModels, opt: torch.optim.Optimizer, gradients: "WholeBatchGradients",
                 *, max_norm: float, ctx: DistributedContext, capture: bool):
        self.step = functools.partial(train_step, stack, opt, gradients, lr=None, max_norm=max_norm, ctx=ctx)
        device = next(iter(stack.trainable().values())).device
        # One lr tensor that every group reads, on the parameters' device (fused AdamW reads a
        # host tensor's value on the host: a capture would bake it in); float32, as the kernel takes it.
        self.lr = torch.tensor(float(opt.param_groups[0]["lr"]), dtype=torch.float32, device=device)
        for group in opt.param_groups:
            group["lr"], group["capturable"] = self.lr, True
        # AdamW warns once that a capturable optimizer stepping uncaptured is slower: the
        # warm-up steps are, on purpose
        opt._warned_capturable_if_run_uncaptured = True
        self.capture, self.device = capture, device
        self.x = self.y = self.out = self.graph = self.stream = None
        self.steps, self.failed = 0, False

    def _inputs(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> None:
        if self.x is None:
            self.x, self.y = torch.empty_like(x), torch.empty_like(y)
        elif x.shape != self.x.shape or y.shape != self.y.shape:
            raise ValueError(f"a captured step takes one shape: batch {tuple(x.shape)}, {tuple(y.shape)} where it "
                             f"was captured with {tuple(self.x.shape)}, {tuple(self.y.shape)}")
        self.x.copy_(x)
        self.y.copy_(y)
        self.lr.fill_(lr)

    def _eager(self) -> tuple:
        out = self.step(self.x, self.y)
        return out.loss_sum, out.correct, out.nonfinite

    def __call__(self, x: torch.Tensor, y: torch.Tensor, *, lr: float,
                 meanwhile: Callable[[], object] | None = None) -> StepResult:
        self._inputs(x, y, lr)
        if self.graph is not None:
            self.graph.replay()
            out = self.out
        elif not self.capture or self.failed:
            out = self._eager()
        elif self.steps < WARMUP_STEPS:
            out = self._on_capture_stream(self._eager)
        else:
            out = self._capture()
        self.steps += 1
        return StepResult(*out, meanwhile() if meanwhile is not None else None)

    def _on_capture_stream(self, fn: Callable[[], tuple]) -> tuple:
        """fn() on the stream the capture uses, ordered after the work queued before it and
        before the work queued after it (the caller's sums, the next batch)."""
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            out = fn()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return out

    def _capture(self) -> tuple:
        graph = torch.cuda.CUDAGraph()
        try:
            def capture():
                with torch.cuda.graph(graph, stream=self.stream):
                    return self._eager()
            out = self._on_capture_stream(capture)
            graph.replay()                           # the captured step: capturing ran nothing
            torch.cuda.synchronize(self.device)      # a failed replay surfaces here, not steps later
        except Exception as e:                       # noqa: BLE001 (any capture failure: go on eager)
            first = str(e).splitlines()[0][:200] if str(e) else ""
            print(f"warning: capturing the step as a CUDA graph failed ({type(e).__name__}: {first}); "
                  "training eager (cuda_graph: off in the recipe skips the attempt)")
            global _FAILED_CAPTURE
            self.failed = _FAILED_CAPTURE = True
            return self._eager()
        self.graph, self.out = graph, out
        return out
