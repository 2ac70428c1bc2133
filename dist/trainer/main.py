"""The main job (scripts/train.py): train a GPT, or a Llama (--model llama), over MPI ranks
(tensor x pipeline x data parallel).

    mpiexec -n 4 python -m mpi4py scripts/train.py          # defaults: tp=2, pp=2, stdlib corpus
    mpiexec -n 8 python -m mpi4py scripts/train.py --tp 2 --pp 2 --dp 2 --steps 500
    python scripts/train.py --data notes.txt --n-layer 4     # one process

Layout: world rank = ((dp_i * pp + pp_i) * cp + cp_i) * tp + tp_i (tensor-parallel ranks
adjacent, then context-parallel). --cp C (default 1; context parallelism: each of C ranks
holds chunks i and 2C-1-i of every sequence, attention is ring attention) is taken first,
and N below is the rank count over C. With no --tp/--pp/--dp the layout is derived from N:
tp = 2 when N is even, then pp = 2 when N / tp is even, dp = the rest (N=4 -> tp 2 x pp 2;
N=8 -> 2 x 2 x 2). Given some of them, the missing ones fill the rest (dp first, then pp,
then tp).

Data (see dist.trainer.data): --data names a token folder (train.bin + val.bin of flat ids,
nanoGPT's or llm.c's layout, memory-mapped; scripts/prepare_data.py writes one from text,
byte-level or with a tokenizer.json) or a text file or folder read as bytes (vocabulary
256, last 10% held out); by default the Python standard library's own sources (no
download). The global batch of step s is drawn from a generator keyed by (seed, s) and
split over the data-parallel ranks (autograd.data.DataLoader), so the loss curve does not
depend on the layout and a resumed run sees exactly the batches an uninterrupted one would.

Rank 0 prints a line per evaluation (step, loss, validation loss, tokens/s, step time,
MFU on a GPU, memory, ETA) and, on a terminal, a tqdm progress bar; it appends each
evaluation's record to OUT/metrics.jsonl at once (fsynced: a killed run keeps its history),
and at the end writes OUT/metrics.json, OUT/loss.png (matplotlib) and a text sample. At
every evaluation it commits OUT/checkpoint/step_NNNNNN/ (one shard per rank: model,
optimizer, RNG, step; a manifest with each shard's SHA-256; see dist.checkpoint) and moves
OUT/checkpoint/latest to it, keeping the --keep newest, for --resume [PATH] and scripts/generate.py.

Weights (see dist.reshard): --resume of a checkpoint written by another tp x pp x dp layout
reshards the model and the AdamW state, continuing the same loss curve; --init-from PATH
starts from a .safetensors file (scripts/export.py), a Hugging Face GPT-2 folder (with
--activation gelu_tanh) or a checkpoint of any layout. A model option that differs from the
saved one is one error line (exit 2).

A non-finite loss or gradient norm (checked every step, on every rank alike) stops the run
with exit 1 and no checkpoint after the last finite step (--on-nonfinite stop), or drops
that optimizer step (--on-nonfinite skip) until --max-skips consecutive ones.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from . import data as data_mod
from . import graph_step
from . import progress as progress_mod
from .options import OptionError, parse_args, validate


def global_batch(dataset, ns: argparse.Namespace, key: list[int], dp_rank: int):
    """This data-parallel rank's rows of the global batch drawn from generator `key`
    (= [seed, step]; see autograd.data.DataLoader)."""
    from autograd.data import DataLoader

    loader = DataLoader(dataset, ns.batch_size, seed=key[0], rank=dp_rank, world_size=ns.dp)
    return loader.batch(key[1])


def main(argv: list[str] | None = None) -> int:
    """Run the job; every return is a decision all ranks took together (usage error 2,
    stopped run 1), so MPI is finalized here: `python -m mpi4py` would otherwise turn the
    exit status into MPI_Abort, whose lines follow the one error line on every rank.
    Real faults (exceptions) still abort."""
    code = run_job(argv)
    if code:
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()
    return code


def run_job(argv: list[str] | None = None) -> int:
    import dist

    try:
        ns = parse_args(argv)
    except OptionError as exc:
        ns = exc
    # mpi4py warns (several lines) of a foreign launcher's variables; dist.runtime.launcher_mismatch
    # below says it in train.py's one error line, and only when ranks would really split.
    warnings.filterwarnings("ignore", "suspicious MPI execution environment", RuntimeWarning)
    world = dist.init(timeout=getattr(ns, "timeout", None))  # None when the options failed
    from gpuplan import launcher

    mismatch = dist.runtime.launcher_mismatch(world.size)  # N copies that each think they are alone
    if mismatch:
        if launcher.env_rank() == 0:  # every copy is MPI rank 0: the launcher's rank decides
            print(f"train.py: error: {mismatch}", file=sys.stderr, flush=True)
        return 2
    try:
        if isinstance(ns, OptionError):
            raise ns
        shape_note = adopt_init_from_shape(ns)
        validate(ns, world.size)
        if world.rank == 0 and shape_note:
            print(shape_note, flush=True)
        if ns.cuda_graph and graph_step.refusal(ns, world.size):
            raise ValueError(graph_step.refusal(ns, world.size))
        corpus = data_mod.load_corpus(ns.data, ns.block_size, vocab_size=ns.vocab_size,
                                      token_dtype=ns.token_dtype, max_bytes=ns.max_bytes)
        ns.codec = corpus.codec.spec  # kept in the checkpoint's args for scripts/generate.py
        check_model_fits(ns, corpus.vocab_size)
    except (ValueError, OSError) as exc:
        if world.rank == 0:
            print(f"train.py: error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        return Trainer(ns, world, corpus).run()
    except data_mod.DataError as exc:  # an id outside the vocabulary in a drawn batch: every
        if world.rank == 0:            # rank checks the whole global batch, so all stop here
            print(f"train.py: error: --data: {exc}", file=sys.stderr, flush=True)
        return 2


#: train.py options a Hugging Face GPT-2 folder's config.json sets when --init-from names it
#: and they are not given (--block-size is not among them: --init-from crops positions).
_GPT2_SHAPE = {"vocab_size": "vocab_size", "n_layer": "n_layer", "n_head": "n_head",
               "n_embd": "n_embd", "activation": "activation"}


def adopt_init_from_shape(ns: argparse.Namespace) -> str | None:
    """With --init-from a Hugging Face GPT-2 folder (--model gpt), the model options not
    given take the folder's values, so one launch fits the weights (before: one mismatch per
    launch); returns the note that says so, or None."""
    path = Path(ns.init_from) if getattr(ns, "init_from", None) else None
    if path is None or getattr(ns, "model", "gpt") != "gpt" or \
            not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        return None
    from autograd.nn import gpt2_io

    where = str(path / gpt2_io.CONFIG_FILE)
    cfg = gpt2_io.config_from_gpt2(gpt2_io.read_gpt2_config(path), where)
    given = set(getattr(ns, "given", ()))
    taken = []
    for option, field in _GPT2_SHAPE.items():
        if option not in given and getattr(ns, option) != getattr(cfg, field):
            setattr(ns, option, getattr(cfg, field))
            taken.append(f"--{option.replace('_', '-')} {getattr(cfg, field)}")
    if not taken:
        return None
    return f"note: --init-from {path}: the model options not given follow its config.json: " \
           f"{' '.join(taken)}"


def model_config(ns: argparse.Namespace, vocab_size: int):
    """The GPTConfig, or with --model llama the LlamaConfig, the options describe."""
    from autograd import nn

    if getattr(ns, "model", "gpt") == "llama":  # its one dropout is the attention's
        return nn.LlamaConfig(
            vocab_size=vocab_size, block_size=ns.block_size, n_layer=ns.n_layer,
            n_head=ns.n_head, n_embd=ns.n_embd, n_kv_head=ns.n_kv_head,
            ffn_hidden=ns.ffn_hidden,
            rope_theta=10000.0 if ns.rope_theta is None else ns.rope_theta,
            dropout=ns.dropout if ns.attn_dropout is None else ns.attn_dropout,
            dtype=np.float32, seed=ns.seed)
    return nn.GPTConfig(vocab_size=vocab_size, block_size=ns.block_size, n_layer=ns.n_layer,
                        n_head=ns.n_head, n_embd=ns.n_embd, dropout=ns.dropout,
                        attn_dropout=ns.attn_dropout, dtype=np.float32, seed=ns.seed,
                        activation=ns.activation)


#: Bytes per parameter a rank holds: f32 weight, gradient and AdamW's two moments.
_BYTES_PER_PARAM = 16


def check_model_fits(ns: argparse.Namespace, vocab_size: int) -> None:
    """ValueError (one line naming the options) when the options give no valid model, or
    when a rank's share of its parameters, gradients and AdamW moments alone exceeds the
    memory of this rank (its GPU's, or the host's over the ranks sharing it)."""
    try:
        cfg = model_config(ns, vocab_size)
    except ValueError as exc:
        raise ValueError(f"the model options (--n-layer, --n-head, --n-embd, --block-size, "
                         f"vocabulary {vocab_size}) give no model: {exc}") from None
    from dist.models.configs import num_parameters

    n_params = num_parameters(cfg)
    per_rank = n_params / (ns.tp * ns.pp)
    need = per_rank * _BYTES_PER_PARAM
    have, where = _rank_memory(ns)
    if have and need > have:
        raise ValueError(f"the model does not fit: {n_params:.3g} parameters "
                         f"(--n-layer {ns.n_layer}, --n-embd {ns.n_embd}, vocabulary "
                         f"{vocab_size}, --block-size {ns.block_size}) need at least "
                         f"{need / 2**30:.3g} GiB per rank for weights, gradients and AdamW "
                         f"moments over --tp {ns.tp} x --pp {ns.pp}, before activations; "
                         f"{where} {have / 2**30:.3g} GiB")
    acts = activation_bytes_lower_bound(ns, vocab_size)
    if have and need + acts > have:
        raise ValueError(f"the activations do not fit: --batch-size {ns.batch_size} x "
                         f"--block-size {ns.block_size} over --dp {ns.dp} and "
                         f"--micro-batches {ns.micro_batches} keep at least "
                         f"{acts / 2**30:.3g} GiB per rank for backward (--recompute "
                         f"{getattr(ns, 'recompute', 'none')}), besides {need / 2**30:.3g} GiB "
                         f"of weights, gradients and AdamW moments; {where} "
                         f"{have / 2**30:.3g} GiB (fewer or shorter sequences, more "
                         f"--micro-batches, or --recompute block)")


def activation_bytes_lower_bound(ns: argparse.Namespace, vocab_size: int) -> float:
    """A lower bound on the bytes a rank keeps for backward: per token of the micro-batches
    in flight, 4 float32 values per channel and layer of this stage (one with --recompute
    block; 21 were counted at 8 layers, benchmarks' 'Memory per rank'), over tp, plus the
    logits' vocabulary block twice. Meant to refuse what cannot fit, never what can."""
    tokens = (ns.batch_size // max(1, ns.dp) // max(1, ns.micro_batches) * ns.block_size
              // max(1, getattr(ns, "cp", 1)))  # a cp rank runs 1/cp of each sequence
    in_flight = ns.micro_batches if ns.pp > 1 and ns.schedule == "gpipe" else \
        min(ns.pp, ns.micro_batches)
    per_layer = 1 if getattr(ns, "recompute", "none") == "block" else 4
    layers = ns.n_layer / ns.pp
    per_token = 4.0 * (per_layer * ns.n_embd * layers / ns.tp + 2 * vocab_size / ns.tp)
    return tokens * in_flight * per_token


def _rank_memory(ns: argparse.Namespace) -> tuple[float | None, str]:
    """(bytes one rank may use, what they are), or (None, "") when unknown."""
    if ns.device == "cuda" or (ns.device == "auto" and _cuda_usable()):
        import gpuplan as gp

        total = gp.backend.cupy_module().cuda.Device().mem_info[1]
        return float(total), "a GPU here has"
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None, ""
    from gpuplan.launcher import local_ranks

    ranks = local_ranks()
    return total / ranks, f"this host's memory over its {ranks} rank(s) is"


def _cuda_usable() -> bool:
    import gpuplan as gp

    return gp.backend.default_device() == "cuda"


class Trainer:
    def __init__(self, ns: argparse.Namespace, world, corpus) -> None:
        import dist
        import gpuplan as gp
        from autograd import optim
        from dist.models import ParallelGPT, ParallelLlama
        from dist.models.sharding import dense_shapes

        self.ns, self.world, self.corpus = ns, world, corpus
        self.mesh = dist.ProcessMesh(dp=ns.dp, pp=ns.pp, tp=ns.tp, world=world,
                                     cp=getattr(ns, "cp", 1))
        self.device = gp.backend.default_device() if ns.device == "auto" else \
            gp.backend.resolve_device(ns.device)
        dist.model_parallel_seed(ns.seed, tp_rank=self.mesh.tp_rank, pp_rank=self.mesh.pp_rank)
        self.cfg = model_config(ns, corpus.vocab_size)
        self.model_name = getattr(ns, "model", "gpt")
        model_class = ParallelLlama if self.model_name == "llama" else ParallelGPT
        self.model = model_class(self.cfg, self.mesh, num_micro_batches=ns.micro_batches,
                                 schedule=ns.schedule, device=self.device,
                                 dtype=gp.bfloat16 if ns.dtype == "bf16" else None,
                                 sequence_parallel=getattr(ns, "sequence_parallel", False),
                                 overlap_grad_reduce=getattr(ns, "overlap", True))
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": ns.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        if getattr(ns, "zero", 0):
            from dist.zero import ZeroRedundancyOptimizer

            self.opt = self.opt_state = ZeroRedundancyOptimizer(
                groups, optimizer_class=optim.AdamW, comm=self.mesh.dp, lr=ns.lr)
            # The gradients are reduce-scattered into the optimizer's slices (after the
            # model's replica sums) instead of all-reduced; checkpoints hold each dp rank's
            # slice of the state, which resumes with or without --zero, in any layout.
            self.model.reduce_data_parallel = False
            if self.model.overlap_grad_reduce:  # the reduce-scatter starts in backward
                self.opt.overlap_with(self.model)
        else:
            self.opt = self.opt_state = optim.AdamW(groups, lr=ns.lr)
        if getattr(ns, "recompute", "none") != "none":
            self.model.set_recompute(ns.recompute)
        self.sched = optim.CosineWithWarmup(self.opt, ns.warmup, ns.steps, min_lr=ns.min_lr)
        self.out = Path(ns.out)
        self.ckpt = self.out / "checkpoint"
        self.schedule_note: str | None = None  # set by resume() when --steps moves the end
        self.history: list[dict] = []
        self.skipped: list[int] = []
        self.start, self.consecutive_skips = 0, 0
        self.last_saved: Path | None = None
        self.n_params = sum(int(np.prod(shape)) for shape in dense_shapes(self.cfg).values())
        self.flops_token = progress_mod.flops_per_token(self.cfg, self.n_params, ns.block_size)
        name = progress_mod.device_name(self.device)
        peak = progress_mod.peak_tflops(name, ns.dtype) if self.device == "cuda" else None
        if peak is not None:  # per GPU: ranks that share one count once
            gpus = progress_mod.gpus_in_job(
                world.mpi_comm, gp.backend.cupy_module().cuda.runtime.getDevice())
            peak *= gpus
        self.peak = None if peak is None else peak * 1e12
        self.device_label = name
        self.graphed = graph_step.GraphedStep(self) if ns.cuda_graph else None

    def earlier_run(self) -> str | None:
        """What of an earlier run OUT/checkpoint holds (its latest committed step), or None
        when it holds no committed checkpoint."""
        from dist.checkpoint_files import list_checkpoints

        committed = list_checkpoints(self.ckpt)
        if not committed:
            return None
        return f"{len(committed)} committed, the latest {committed[-1]}"

    def out_refusal(self) -> str | None:
        """Why OUT cannot be written: one of the files or folders this run writes there is a
        link leading out of OUT (its writes never follow one); None when all stay inside."""
        from gpuplan.confined_write import LinkOutsideError, check_inside

        targets = [self.out / n for n in ("metrics.json", "metrics.jsonl", "loss.png")]
        try:
            for target in [*targets, self.ckpt, self.ckpt / "latest"]:
                check_inside(target, self.out)
        except LinkOutsideError as exc:
            return str(exc)
        return None

    def resume(self) -> None:
        """Load the checkpoint --resume names (OUT/checkpoint's latest by default); every
        rank checks its shard (see dist.checkpoint) and raises the same error. A checkpoint
        of another layout is resharded (dist.reshard: model and optimizer state)."""
        import dist

        where = self.ckpt if self.ns.resume == "latest" else Path(self.ns.resume)
        if self.ns.init_from:  # (validate() refuses both; kept for API callers)
            raise ValueError("--init-from and --resume exclude each other")
        meta = dist.load_checkpoint(where, self.model, comm=self.world,
                                    optimizer=self.opt_state, reshard=True)
        check_run_metadata(meta, dist.checkpoint.resolve(where) / "manifest.json")
        sched = dict(meta["scheduler"])
        if sched["total_steps"] != self.ns.steps:  # the schedule follows the new --steps
            self.schedule_note = (f"note: --steps {self.ns.steps} sets the schedule's end (the "
                                  f"checkpoint's run planned {sched['total_steps']}): from step "
                                  f"{int(meta['step'])} on, the learning rate follows the "
                                  f"cosine to step {self.ns.steps}")
            sched["total_steps"] = max(self.ns.steps, sched["warmup_steps"])
        self.sched.load_state_dict(sched)
        self.start, self.history = int(meta["step"]), list(meta["history"])
        self.skipped = list(meta.get("skipped", []))
        self.last_saved = dist.checkpoint.resolve(where)

    def init_from(self) -> None:
        """Start from the weights --init-from names (a .safetensors file, a GPT-2 folder or
        a checkpoint of any layout), cut for this rank (dist.reshard.init_from)."""
        from dist.reshard import init_from

        self.initialized_from = init_from(self.ns.init_from, self.model)

    def save(self, step: int) -> bool:
        """Commit step `step`'s checkpoint, unless a parameter is not finite (False)."""
        import dist
        import gpuplan as gp

        finite = all(bool(np.isfinite(gp.to_host(p.data)).all())
                     for p in self.model.parameters())
        if not self.everywhere(finite):
            return False
        specs = {n: s.to_json() for n, s in self.model.shard_specs().items()}
        with dist.trace.span("checkpoint", step=step):
            self.last_saved = self._save_checkpoint(step, specs)
        return True

    def _save_checkpoint(self, step: int, specs: dict) -> Path:
        import dist
        from dist.models.configs import config_json

        return dist.save_checkpoint(
            self.ckpt, self.model, comm=self.world, optimizer=self.opt_state, step=step,
            keep=self.ns.keep,
            metadata={"step": step, "scheduler": self.sched.state_dict(),
                      "history": self.history, "skipped": self.skipped, "args": vars(self.ns),
                      "layout": [self.ns.dp, self.ns.pp, self.ns.tp],
                      "config": config_json(self.cfg), "specs": specs})

    def everywhere(self, ok: bool) -> bool:
        """True when `ok` holds on every rank (one all-reduce: every rank decides alike)."""
        bad = self.world.all_reduce(np.array([0.0 if ok else 1.0]), "max")
        return float(bad[0]) == 0.0

    def nonfinite(self, step: int, loss: float, gnorm: float) -> str | None:
        """None to step the optimizer, "skip" to drop this step, or the error that stops."""
        if self.everywhere(math.isfinite(loss) and math.isfinite(gnorm)):
            self.consecutive_skips = 0
            return None
        bad = [f"{name} {value:.4g}" for name, value in (("loss", loss), ("gradient norm", gnorm))
               if not math.isfinite(value)] or ["loss or gradient norm on another rank"]
        what = f"step {step}: non-finite {' and '.join(bad)}"
        last = f"the last checkpoint is {self.last_saved or 'none'}"
        if self.ns.on_nonfinite == "stop":
            return f"{what}; stopped (--on-nonfinite stop), {last}"
        self.skipped.append(step)
        self.consecutive_skips += 1
        if self.consecutive_skips >= self.ns.max_skips:
            return (f"{what}; {self.consecutive_skips} consecutive steps skipped (--max-skips "
                    f"{self.ns.max_skips}), stopped, {last}")
        return "skip"

    def evaluate(self) -> float:
        import dist

        losses = [dist.evaluate(self.model, *global_batch(self.corpus.val, self.ns,
                                                          [self.ns.seed, 10**9 + i],
                                                          self.mesh.dp_rank))
                  for i in range(self.ns.eval_batches)]
        return float(np.mean(losses))

    def activation_bytes(self, stop: int) -> int:
        """The activations a rank keeps for backward at their peak (dist.memory: one
        micro-batch's forward of step 1's batch, the random state put back); 0 when no
        step runs."""
        from dist import memory

        if self.start >= stop:
            return 0
        x, y = global_batch(self.corpus.train, self.ns, [self.ns.seed, self.start],
                            self.mesh.dp_rank)
        return memory.activation_bytes(self.model, x, y)

    def fail(self, message: str) -> int:
        if getattr(self, "prog", None) is not None:
            self.prog.close()
        if self.world.rank == 0:
            print(f"train.py: error: {message}", file=sys.stderr, flush=True)
        return 1

    def run(self) -> int:
        import dist
        from autograd import optim
        from dist import memory

        ns, rank = self.ns, self.world.rank
        np.seterr(over="ignore", invalid="ignore")  # non-finite values: see nonfinite()
        refusal, taken = self.world.bcast_object(
            (self.out_refusal(), None if ns.resume else self.earlier_run()) if rank == 0
            else None, root=0)
        if refusal:  # every write in OUT stays inside it: one line, nothing written
            if rank == 0:
                print(f"train.py: error: --out: {refusal}", file=sys.stderr, flush=True)
            return 2
        if taken:  # a new run never takes over another run's --out (its checkpoints, metrics)
            if rank == 0:
                print(f"train.py: error: --out {ns.out} holds the checkpoints of an earlier run "
                      f"({taken}); continue it with --resume, or give this run a new --out",
                      file=sys.stderr, flush=True)
            return 2
        if ns.resume or ns.init_from:
            error = None
            try:
                self.resume() if ns.resume else self.init_from()
            except (ValueError, KeyError, OSError) as exc:
                error = str(exc).strip("'\"").splitlines()[0]
                fallback = getattr(exc, "fallback", None)
                if isinstance(exc, dist.CheckpointError):
                    error += (f"; the newest older checkpoint that verifies is {fallback} "
                              f"(--resume {fallback})" if fallback else
                              "; no older checkpoint verifies")
            errors = [e for e in self.world.all_gather_object(error) if e]
            if errors:  # on any rank: every rank stops, rank 0 says why
                if rank == 0:
                    option = "--resume" if ns.resume else "--init-from"
                    print(f"train.py: error: {option}: {errors[0]}", file=sys.stderr,
                          flush=True)
                return 2
            if ns.resume and self.start >= ns.steps:  # a finished run: say so, change nothing
                if rank == 0:
                    print(f"train.py: nothing to do: the checkpoint is at step {self.start}, "
                          f"--steps {ns.steps} (a larger --steps continues it)", flush=True)
                return 0
            if rank == 0 and self.schedule_note:
                print(self.schedule_note, flush=True)
        if rank == 0:
            c = self.corpus
            heads = f"{ns.n_head} heads" + (
                f" ({self.cfg.kv_heads} K/V)" if self.model_name == "llama" else "")
            print(f"{self.model_name}: {self.n_params / 1e6:.2f}M params, {ns.n_layer} layers "
                  f"x {ns.n_embd} wide, {heads}, context {ns.block_size} | data: {c.source} "
                  f"({len(c.train.tokens):,} train / {len(c.val.tokens):,} val {c.unit}) | "
                  f"mesh: dp={ns.dp} "
                  f"pp={ns.pp} " + (f"cp={ns.cp} " if getattr(ns, "cp", 1) > 1 else "")
                  + f"tp={ns.tp}"
                  + (" sequence-parallel" if self.model.sequence_parallel else "")
                  + f", {ns.micro_batches} micro-batches ({ns.schedule}) | "
                  f"device: {self.device_label}, {ns.dtype}"
                  + (f" | resumed at step {self.start}" if ns.resume else "")
                  + (f" | weights from {ns.init_from}" if ns.init_from else ""), flush=True)
            from gpuplan.launcher import oversubscription_note

            if oversubscription_note():
                print(oversubscription_note(), flush=True)
        # metrics.jsonl: a resumed run keeps the records up to its step, a new run starts anew.
        log = (progress_mod.MetricsLog(self.out / "metrics.jsonl",
                                       self.start if ns.resume else None, root=self.out)
               if rank == 0 else None)
        prog = self.prog = progress_mod.Progress(ns.steps, self.start,
                                                 progress_mod.show_bar(ns.progress, rank))
        stop = ns.steps if ns.stop_after is None else min(ns.steps, ns.stop_after)
        tokens = ns.batch_size * ns.block_size
        t_mark, steps_since = time.perf_counter(), 0
        if rank == 0 and self.start < stop:  # within seconds: the first step is the slow one
            prog.line(f"step {self.start + 1}: compiling and warming up (kernels compile on "
                      f"first use; the ETA starts after this step)")
        acts = self.activation_bytes(stop)
        if getattr(ns, "trace", None):
            dist.trace.start(self.world)
        for step in range(self.start, stop):
            t0 = time.perf_counter()
            t_trace = dist.trace.now()
            x, y = global_batch(self.corpus.train, ns, [ns.seed, step], self.mesh.dp_rank)
            # --cuda-graph: this run's first step is eager (the warm-up), then graphs
            graphed = self.graphed if self.graphed is not None and step > self.start else None
            if graphed is not None:
                loss, gnorm = graphed.forward_backward(x, y)
            else:
                loss = self.model.train_step(x, y)
                zero = getattr(ns, "zero", 0)
                if zero:  # the average over dp: a reduce-scatter into the slices
                    self.opt.reduce_gradients()
                gnorm = self.opt.grad_norm(self.model) if zero else dist.grad_norm(self.model)
            lr = self.sched.get_last_lr()[0]
            verdict = self.nonfinite(step + 1, loss, gnorm)
            if verdict not in (None, "skip"):
                return self.fail(verdict)
            if verdict is None and graphed is not None:
                graphed.optimizer_step()  # (clipped in the graph; gradients stay static)
            elif verdict is None:
                if ns.clip > 0 and getattr(ns, "zero", 0):
                    self.opt.clip_grads_with_norm_(ns.clip, gnorm)
                elif ns.clip > 0:
                    optim.clip_grads_with_norm_(self.model.parameters(), ns.clip, gnorm)
                with dist.trace.span("optimizer"):
                    self.opt.step()
            logged = (step + 1) % ns.eval_interval == 0 or step + 1 == stop or step == 0
            grads = memory.gradient_bytes(self.model.parameters()) if logged else 0
            if graphed is None:
                self.opt.zero_grad()
            self.sched.step()
            steps_since += 1
            prog.step(step + 1, loss, tokens / (time.perf_counter() - t0))
            dist.trace.record("step", t_trace, step=step + 1)
            if logged:
                with dist.trace.span("evaluate"):
                    val = self.evaluate()
                mem = memory.MemoryReport.measure(self.model, self.opt, grads, acts,
                                                  self.device).most_over(self.world)
                dt = (time.perf_counter() - t_mark) / steps_since
                rec = {"step": step + 1, "train_loss": loss, "val_loss": val, "lr": lr,
                       "grad_norm": gnorm, "step_time_s": dt, "tokens_per_s": tokens / dt,
                       "mfu": (None if self.peak is None
                               else self.flops_token * tokens / dt / self.peak),
                       "memory_mib": float(self.world.all_reduce(
                           np.array([progress_mod.memory_mib(self.device)]), "max")[0]),
                       **mem.metrics()}
                self.history.append(rec)
                if rank == 0:
                    log.append(rec)
                    if step == self.start:  # this run's first record: the memory at start
                        prog.line(mem.line())
                    prog.line(progress_mod.format_record(rec, ns.steps, prog.eta(step + 1)))
                if not self.save(step + 1):
                    return self.fail(f"step {step + 1}: a parameter is not finite; no "
                                     f"checkpoint written, the last is {self.last_saved}")
                t_mark, steps_since = time.perf_counter(), 0
        prog.close()
        if getattr(ns, "trace", None):
            m = self.mesh
            where = dist.trace.write(ns.trace, self.world, root=Path(ns.trace).parent,
                                     label=f"rank {rank} (dp {m.dp_rank}, pp {m.pp_rank}, "
                                           f"tp {m.tp_rank})")
            dist.trace.stop()
            if where is not None:
                print(f"trace: {where} (open in ui.perfetto.dev or chrome://tracing)",
                      flush=True)
        if stop < ns.steps:
            if rank == 0:
                print(f"stopped after step {stop} (--stop-after); continue with --resume",
                      flush=True)
            return 0
        dense = dist.gather_dense_state_dict(self.model, self.world)
        if rank == 0:
            self.finish(dense)
        return 0

    def finish(self, dense_state: dict) -> None:
        from gpuplan.confined_write import atomic_write

        from . import plotting

        metrics = {"args": vars(self.ns), "params": self.n_params, "device": self.device_label,
                   "history": self.history, "skipped_steps": self.skipped}
        atomic_write(self.out / "metrics.json", json.dumps(metrics, indent=1).encode(),
                     self.out)
        steps = [h["step"] for h in self.history]
        plot = str(self.out / "loss.png")
        try:
            plotting.write_loss_plot(
                self.out / "loss.png",
                {"train": (steps, [h["train_loss"] for h in self.history]),
                 "validation": (steps, [h["val_loss"] for h in self.history])},
                title=f"{'byte-level ' if self.corpus.unit == 'bytes' else ''}"
                      f"{'Llama' if self.model_name == 'llama' else 'GPT'}, "
                      f"{self.n_params / 1e6:.2f}M params",
                ylabel=f"cross-entropy (nats/{self.corpus.unit[:-1]})")
        except ImportError as exc:  # a --no-deps install (the GPU check's) may lack matplotlib
            plot = (f"no loss.png ({exc.name} is not installed; python -m "
                    f"dist.trainer.plotting {self.out / 'metrics.jsonl'} draws it)")
        text = final_sample(self.cfg, dense_state, self.ns.sample_tokens, self.ns.seed,
                            self.device, self.corpus)
        print(f"sample (temperature 0.8, top-k 40):\n{text}\n", flush=True)
        print(f"wrote {self.out / 'metrics.json'}, {self.out / 'metrics.jsonl'}, "
              f"{plot} and {self.ckpt}/ (scripts/generate.py --checkpoint "
              f"{self.ckpt})", flush=True)


def check_run_metadata(meta: dict, where: Path) -> None:
    """ValueError (one line naming the file and field) unless the run metadata a resume
    uses (step, scheduler, history, skipped) has the types train.py writes."""

    def fail(field: str, expected: str, given) -> ValueError:
        text = repr(given)
        text = text if len(text) <= 60 else text[:57] + "..."
        return ValueError(f"{where}: metadata {field} must be {expected}, given {text}")

    def count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    def real(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    if not isinstance(meta, dict):
        raise fail("", "a JSON object", meta)
    if not count(meta.get("step")):
        raise fail("'step'", "an integer >= 0", meta.get("step"))
    sched = meta.get("scheduler")
    if not isinstance(sched, dict):
        raise fail("'scheduler'", "an object", sched)
    for key in ("last_step", "warmup_steps", "total_steps"):
        if not count(sched.get(key)):
            raise fail(f"'scheduler.{key}'", "an integer >= 0", sched.get(key))
    for key in ("min_lr",):
        if not real(sched.get(key)) or not math.isfinite(sched[key]):
            raise fail(f"'scheduler.{key}'", "a finite number", sched.get(key))
    lrs = sched.get("base_lrs")
    if not isinstance(lrs, list) or not all(real(v) and math.isfinite(v) for v in lrs):
        raise fail("'scheduler.base_lrs'", "a list of finite numbers", lrs)
    history = meta.get("history")
    if not isinstance(history, list) or not all(
            isinstance(h, dict) and count(h.get("step"))
            and all(real(h.get(k)) for k in ("train_loss", "val_loss"))
            for h in history):
        raise fail("'history'", "a list of records with an integer step and numeric losses",
                   history)
    skipped = meta.get("skipped", [])
    if not isinstance(skipped, list) or not all(count(s) for s in skipped):
        raise fail("'skipped'", "a list of step numbers", skipped)


def final_sample(cfg, dense_state: dict, n_tokens: int, seed: int, device: str,
                 corpus) -> str:
    """The end-of-run sample in the data's codec; as token ids (with a note) when that codec
    cannot encode or decode (a tokenizer or meta.pkl gone or unusable): the end of a
    finished run never fails it."""
    prompt = corpus.prompt()
    try:
        return sample_text(cfg, dense_state, n_tokens, seed, device, prompt,
                           codec=corpus.codec)
    except (ValueError, KeyError, ImportError, OSError) as exc:
        text = sample_text(cfg, dense_state, n_tokens, seed, device, prompt,
                           codec=data_mod.Codec("ids"))
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"{text}\n(token ids: the data's {corpus.codec.describe()} cannot decode them: " \
               f"{why})"


def sample_text(cfg, dense_state: dict, n_tokens: int, seed: int, device: str,
                prompt: str | np.ndarray = "def ", temperature: float = 0.8, top_k: int = 40,
                codec=None) -> str:
    """Text sampled from the dense model assembled from the shards (one process); `prompt`
    is text or ids, `codec` a data.Codec (default: bytes)."""
    codec = codec or data_mod.Codec()
    from dist.models.sharding import dense_model_class

    model = dense_model_class(cfg)(cfg)
    model.load_state_dict(dense_state)
    model.to(device=device)
    idx = (codec.encode(prompt) if isinstance(prompt, str) else prompt)[None].astype(np.int64)
    import gpuplan as gp

    out = model.generate(gp.to_device(idx, device), n_tokens, temperature=temperature,
                         top_k=top_k, seed=seed)
    return codec.decode(gp.to_host(out)[0])


if __name__ == "__main__":
    sys.exit(main())
