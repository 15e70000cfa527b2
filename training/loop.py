"""The training loop: Accelerate, token-budget batches, the paper's schedule, periodic evaluation, exact resume.

`train` builds a `TrainingRun` (the run's state: model, optimizer, scheduler, weight average, counters, best
evaluation, logs) and calls its steps: `start`, `train_epoch` until a stop, then `finish`.

One code path for one CPU process, one GPU, and N processes (`accelerate launch`, `torchrun`;
on CPU pass `cpu=True` or set ACCELERATE_USE_CPU=1, else each process trains alone: see
`make_accelerator`). Per optimizer update ("step"):

    with accelerator.accumulate(model):       # grad_accum micro-batches per step
        loss = model(**batch).loss            # token-mean CE with config.label_smoothing
        (with teachers: (1 - alpha) * loss + alpha * the cross-entropy against their targets, `distillation`)
        accelerator.backward(loss)
        clip_grad_norm_ (when gradients sync), optimizer.step(), zero_grad()
    scheduler.step() once per real update     # Accelerator(step_scheduler_with_optimizer=False)

Batches: `TokenBudgetBatchSampler` shards the batch list itself (rank r takes batches r, r+N, ...),
so the loader goes through `prepare_sharded_loader`, never `accelerator.prepare`. `max_tokens` is
per process and per micro-batch; an update sees up to max_tokens * num_processes * grad_accum
tokens. Each micro-batch loss is its own token mean, and the update averages micro-batches (DDP
averages ranks, accumulation divides by grad_accum), so N processes with grad_accum=1 make the
same update as one process with grad_accum=N from the same batch list.

Exact resume (bit-for-bit on CPU; see notes/ecosystem-offline.md section 2):
- `set_seed(seed)` before the model is built, so a resumed run builds identical initial weights
  (then overwritten by the checkpoint anyway) and the same data;
- the batch order is a function of (seed, epoch) only; the checkpoint marker stores the epoch and
  the batches of it consumed (counted by the loop, not the sampler, which the loader prefetches);
- the DataLoader has its own generator, so creating iterators never draws from torch's global RNG,
  which drives dropout; `load_training_state` restores the Python, numpy and torch RNG states of
  every rank, the model, optimizer, scheduler and Accelerate's counters (`vaswani.training.train_state`:
  safetensors and JSON only, never pickle);
- evaluation draws no random numbers (dev loss without dropout, greedy/beam search).
Checkpoints are saved only at update boundaries, so no half-accumulated gradient is lost.

Weight averaging (`ema_decay` > 0, `vaswani.training.ema`): after every update an exponential moving average of
the weights is refreshed; it is what evaluations score, what `best` keeps and what the run exports, while training
continues on the raw weights. Checkpoints hold it as `ema.safetensors`, so resume stays exact.

Evaluation runs on the main process only while the others wait at a barrier: the dev set is a
few thousand short examples, generation is the cost, and one process keeps the metrics simple.
During training it uses a fixed subset of the dev set (`eval_subset`) and greedy search; the
best step by the task metric is kept in `<output_dir>/checkpoints/best`. A subset of a few hundred
sources cannot rank the last evaluations of a run whose learning rate ends at zero (docs/recipes.md), so at the
end, when the best step is not the last one, both are scored on the whole dev set with greedy search and the
better one is kept (a tie keeps the last: `confirm_best`). The kept weights are then evaluated on the whole dev
set with `num_beams` and become the end product. With
`average_last` K > 1 the end product is instead the mean of the weights of the last K checkpoints
(`vaswani.training.averaging`, the paper's checkpoint averaging), chosen before the run, not by the dev set.
Both go through `evaluation.final_evaluation`, as `vaswani-average` does.

Progress (main process): the bar's total is the step the run is expected to end at, whichever of `max_steps`,
`max_epochs` and the time budget comes first at the pace so far (evaluations included), so its ETA is the time
left; evaluation lines go through the bar's `write`, so they do not break it. Without the bar
(`progress_bar=False`) every `log_every` updates print one line: loss, learning rate, tokens/s and time left.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .batching import TEACHER_FIELDS, Seq2SeqCollator, TokenBudgetBatchSampler, prepare_sharded_loader
from .checkpoints import CHECKPOINT_DIR, latest_valid_checkpoint, refuse_older_run, save_checkpoint, write_best
from .distillation import attach_teacher_targets, distillation_loss, load_teachers
from .ema import WeightEMA
from .evaluation import describe_final, evaluate, final_evaluation, generate_texts, load_best, score
from .model_card import describe_optimizer
from .schedule import OPTIMIZERS, SCHEDULES, make_optimizer, make_scheduler, native_bf16
from .tasks import TaskData, encode_pairs
from .time_budget import Deadline, forecast_end, format_duration
from .train_state import load_training_state, save_training_state
from .warm_start import warm_start

logger = logging.getLogger(__name__)

# The first estimate of evaluation seconds per dev source, before an evaluation has measured it: the order of a
# trained G2P model on CPU. A pessimistic guess times a full dev set can exceed the whole budget at step 1.
FIRST_EVAL_SECONDS_PER_SOURCE = 0.005
MIXED_PRECISIONS = ("no", "fp16", "bf16", "auto")
# Kept free of the time budget besides the final evaluation: loading the best weights, writing the folder, and
# the interpreter's start and exit, which the budget's clock does not see.
FINAL_OVERHEAD_SECONDS = 30
# The file the caller's export writes last into output_dir (cli.export_run: the model folder's metrics.json): a run
# resumed after its stop that finds it has nothing left to do.
EXPORTED = "metrics.json"


@dataclass
class TrainingSettings:
    """How to train (not what: model hyperparameters live in the config). Stops at whichever comes first of
    `max_steps` updates, `max_epochs`, and `time_budget` (wall clock of this invocation, final evaluation included).
    These defaults are also the defaults of train.py's flags, except where `cli.TASK_DEFAULTS` sets one per task."""

    output_dir: str
    max_steps: int | None = None
    max_epochs: int | None = None
    time_budget: str | float | None = None
    max_tokens: int = 4096
    lr: float = 1e-3  # peak learning rate, reached after warmup_steps
    warmup_steps: int = 1000
    schedule: str = "inverse_sqrt"  # or "linear" / "cosine": to zero as max_steps or the time budget runs out
    weight_decay: float = 0.0
    optimizer: str = "adam"  # or "muon": Muon for the layers' weight matrices, Adam for the rest
    grad_accum: int = 1
    clip_norm: float = 1.0  # 0: no clipping
    eval_every: int = 500  # updates; 0: evaluate only at the end
    eval_subset: int = 500  # dev sources used by evaluations during training; 0: all
    eval_batch_size: int = 512
    num_beams: int = 1  # final evaluation and the saved generation config
    save_every: int = 500  # updates; 0: only at the end
    keep_last: int = 2
    log_every: int = 20
    seed: int = 0
    mixed_precision: str = "no"  # or "fp16", "bf16", "auto" (`resolve_mixed_precision`)
    cpu: bool = False
    resume: bool = False
    attn_implementation: str | None = None
    ema_decay: float = 0.0  # > 0: evaluate, keep and export an exponential moving average of the weights
    average_last: int = 1  # > 1: export the average of the last K checkpoints' weights instead of the best one
    confirm_best: bool = True  # the subset's best step against the last weights on the full dev set (greedy) at the end
    max_source_length: int = 256  # longer training examples are dropped (with a warning)
    init_from: str | None = None  # a saved model folder whose weights start the run (`warm_start`); None: at random
    teachers: tuple[str, ...] = ()  # saved model folders to distill from (`distillation`); empty: no distillation
    distill_alpha: float = 0.5  # the weight of the teachers' targets in the loss, (1 - alpha) the labels'
    distill_top_k: int = 8  # the teachers' most likely tokens kept per target position
    progress_bar: bool = True
    tensorboard: bool = True

    def validate(self, as_flags: bool = False) -> None:
        """Raise ValueError naming the first setting out of range: as `name=value`, or as vaswani-train's flag
        (`--name value`) with `as_flags`. The one place these rules live; vaswani-train calls it on its flags."""
        def shown(name: str) -> str:
            value = getattr(self, name)
            return f"--{name} {value}" if as_flags else f"{name}={value!r}"

        for name in ("max_tokens", "grad_accum", "log_every", "eval_batch_size", "num_beams", "keep_last",
                     "warmup_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{shown(name)} must be >= 1")
        for name in ("eval_every", "save_every", "eval_subset"):
            if getattr(self, name) < 0:
                raise ValueError(f"{shown(name)} must be >= 0")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"{shown('max_steps')} must be >= 1")
        if self.max_steps is None and self.max_epochs is None and self.time_budget is None:
            raise ValueError("nothing ends the run: give max_steps, max_epochs or time_budget")
        if not self.lr > 0:
            raise ValueError(f"{shown('lr')} must be > 0")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"{shown('schedule')}: choose one of {', '.join(SCHEDULES)}")
        if self.schedule != "inverse_sqrt" and self.max_steps is None and self.time_budget is None \
                and self.max_epochs is None:
            raise ValueError(f"{shown('schedule')} decays to zero over the run: give max_steps, max_epochs "
                             "or time_budget")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"{shown('optimizer')}: choose one of {', '.join(OPTIMIZERS)}")
        if self.clip_norm < 0:
            raise ValueError(f"{shown('clip_norm')} must be >= 0 (0 disables clipping)")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"{shown('ema_decay')} must be in [0, 1) (0 turns weight averaging off)")
        if self.average_last < 1:
            raise ValueError(f"{shown('average_last')} must be >= 1 (1: keep the best checkpoint)")
        if self.average_last > 1 and (self.keep_last < self.average_last or self.save_every < 1):
            raise ValueError(f"{shown('average_last')} averages the last {self.average_last} checkpoints: keep that "
                             f"many ({shown('keep_last')}) and save during the run ({shown('save_every')})")
        if self.mixed_precision not in MIXED_PRECISIONS:
            raise ValueError(f"{shown('mixed_precision')}: choose one of {', '.join(MIXED_PRECISIONS)}")
        if self.teachers and not 0 < self.distill_alpha <= 1:
            raise ValueError(f"{shown('distill_alpha')} must be in (0, 1] (the teachers' share of the loss)")
        if self.distill_top_k < 1:
            raise ValueError(f"{shown('distill_top_k')} must be >= 1")


@dataclass
class TrainingResult:
    step: int
    epoch: int
    best_step: int | None
    dev: dict  # final evaluation of the best weights on the full dev set (main process; {} elsewhere)
    history: list = field(default_factory=list)  # evaluations during training
    train_seconds: float = 0.0
    target_tokens_per_second: float = 0.0
    stopped_by: str = ""
    model: object = None  # the unwrapped exported model (main process): the best, or the average
    averaged_steps: list | None = None  # average_last > 1: the steps of the checkpoints averaged
    already_finished: bool = False  # resumed after its stop: nothing trained, nothing evaluated (the export stands)
    optimizer: str = ""  # the optimizer the run built, in the model card's words (`model_card.describe_optimizer`)
    confirmation: dict | None = None  # `confirm_best`: the two steps' full-dev figures and the one kept (main process)

    @classmethod
    def from_metrics(cls, metrics: dict, dev: dict, model, averaged_steps: list | None = None) -> TrainingResult:
        """A finished run's result as its metrics.json tells it, with other weights and their dev figures
        (`vaswani-average`, `vaswani-release`)."""
        return cls(step=metrics["steps"], epoch=metrics["epochs_completed"], best_step=metrics["best_step"], dev=dev,
                   history=metrics["history"], train_seconds=metrics["train_seconds"],
                   target_tokens_per_second=metrics["target_tokens_per_second"], stopped_by=metrics["stopped_by"],
                   model=model, averaged_steps=averaged_steps,
                   confirmation=None if averaged_steps else metrics.get("confirm_best"))


def resolve_mixed_precision(value: str, cpu: bool = False) -> str:
    """The precision a run trains in: "auto" is "bf16" where the device (the CPU if `cpu`) multiplies it in hardware
    (`native_bf16`), "no" (float32) elsewhere; any other value as given. bf16 autocasts the forward (weights,
    optimizer and evaluation stay float32)."""
    if value != "auto":
        return value
    return "bf16" if native_bf16("cuda" if torch.cuda.is_available() and not cpu else "cpu") else "no"


def make_accelerator(settings: TrainingSettings):
    """An Accelerator for the run; on a machine without CUDA under a multi-process launcher, CPU (gloo) mode.

    Accelerate only goes multi-process on CPU with cpu=True (or ACCELERATE_USE_CPU=1); otherwise every process
    would silently train alone. The world size the launcher announced is checked against what we got.
    """
    from accelerate import Accelerator

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cpu = settings.cpu or (world_size > 1 and not torch.cuda.is_available())
    accelerator = Accelerator(cpu=cpu, mixed_precision=resolve_mixed_precision(settings.mixed_precision, cpu),
                              gradient_accumulation_steps=settings.grad_accum, step_scheduler_with_optimizer=False)
    if accelerator.num_processes != world_size:
        raise RuntimeError(
            f"the launcher started {world_size} processes but Accelerate runs {accelerator.num_processes} "
            f"({accelerator.distributed_type}); on CPU use `torchrun --nproc_per_node N` or `accelerate launch` with "
            "--cpu / ACCELERATE_USE_CPU=1"
        )
    return accelerator


def _subset(n: int, size: int) -> list[int]:
    """`size` indices spread evenly over range(n) (all when size is 0 or >= n)."""
    if size == 0 or size >= n:
        return list(range(n))
    return sorted({int(i * n / size) for i in range(size)})


def generation_max_length(target_lengths: list[int]) -> int:
    """Decoder length limit for generation: the longest training target (eos included) plus a margin, plus the start token."""
    return int(math.ceil(1.2 * max(target_lengths))) + 2


def training_examples(tokenizer, data: TaskData, max_source_length: int) -> list[dict]:
    """The encoded training pairs, without those longer than `max_source_length` tokens on either side."""
    examples = encode_pairs(tokenizer, data.train_pairs)
    keep = [e for e in examples if len(e["input_ids"]) <= max_source_length and len(e["labels"]) <= max_source_length]
    if len(keep) < len(examples):
        logger.warning("dropped %d training examples longer than max_source_length=%d tokens",
                       len(examples) - len(keep), max_source_length)
    if not keep:
        raise ValueError("no training examples left")
    return keep


def train(config, tokenizer, data: TaskData, settings: TrainingSettings, accelerator=None,
          deadline: Deadline | None = None) -> TrainingResult:
    """Train a VaswaniForConditionalGeneration from `config` on `data`; see the module docstring.

    Writes `<output_dir>/checkpoints/checkpoint-<step>` (Accelerate state), `checkpoints/best` (the best
    weights so far), `train_log.jsonl` and TensorBoard logs in `runs/`. Returns the final evaluation of the best
    weights (full dev set) and the unwrapped best model on the main process; the caller exports it.
    `deadline`: the time budget's clock when it started earlier (the script starts it before data and tokenizer).
    """
    settings.validate()
    accelerator = accelerator or make_accelerator(settings)
    if deadline is None and settings.time_budget is not None:
        deadline = Deadline(settings.time_budget)
    run = TrainingRun(config, tokenizer, data, settings, accelerator, deadline)
    stopped_by = run.finished_before()
    if stopped_by and (run.output_dir / EXPORTED).is_file():
        accelerator.print(f"already finished at step {run.step} ({stopped_by}); nothing to train")
        return TrainingResult(step=run.step, epoch=run.epoch, best_step=run.best["step"] if run.best else None, dev={},
                              history=run.history, stopped_by=stopped_by, already_finished=True)
    run.start()
    while not stopped_by:
        if settings.max_epochs is not None and run.epoch >= settings.max_epochs:
            stopped_by = "max_epochs"
        else:
            stopped_by = run.train_epoch()
    return run.finish(stopped_by)


class TrainingRun:
    """One training run: the state `train` carries from update to update, and the steps that change it.

    The constructor sets the seed before it builds the model (a resumed run builds the same initial weights and
    data) and restores the checkpoint (with `settings.resume`) after everything the checkpoint overwrites.
    Only the main process evaluates, keeps the best weights and writes logs; every process trains and saves.
    """

    def __init__(self, config, tokenizer, data: TaskData, settings: TrainingSettings, accelerator,
                 deadline: Deadline | None = None):
        self.settings, self.data, self.tokenizer = settings, data, tokenizer
        self.accelerator, self.deadline = accelerator, deadline
        self.main = accelerator.is_main_process
        self.output_dir = Path(settings.output_dir)
        self.checkpoint_dir = self.output_dir / CHECKPOINT_DIR
        if self.main:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        # every rank encodes the same training examples (cheap and deterministic); dev on the main process
        examples = training_examples(tokenizer, data, settings.max_source_length)
        if settings.teachers:
            self._attach_teacher_targets(examples)
        self.max_length = generation_max_length([len(e["labels"]) for e in examples])
        self._build_model(config)
        self._build_loader(examples)
        self.unwrapped = accelerator.unwrap_model(self.model)
        self.ema = WeightEMA(self.unwrapped, settings.ema_decay) if settings.ema_decay else None
        self.evaluated = self.ema.module if self.ema is not None else self.unwrapped  # evaluated, kept, exported

        self.step, self.epoch, self.batches_done = 0, 0, 0
        self.stopped_by, self.resumed_stop = "", {}  # why this run stopped; how the resumed checkpoint's run ended
        self.best: dict | None = None  # {"step", "value", "metric"} of the best evaluation so far
        self.history: list[dict] = []  # the evaluations during training
        self._resume()

        dev_index = _subset(len(data.dev_sources), settings.eval_subset)
        self.dev_sources = [data.dev_sources[i] for i in dev_index]
        self.dev_references = [data.dev_references[i] for i in dev_index]
        self.dev_examples = encode_pairs(tokenizer, [(s, r) for s, refs in zip(self.dev_sources, self.dev_references)
                                                     for r in refs]) if self.main else []
        self.writer = None
        if self.main and settings.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.output_dir / "runs"), purge_step=self.step or None)
        self.log_path = self.output_dir / "train_log.jsonl"
        self.eval_seconds_per_source = FIRST_EVAL_SECONDS_PER_SOURCE  # refined by each evaluation
        self.last_eval_step: int | None = None

    def _build_model(self, config) -> None:
        from accelerate.utils import set_seed

        from vaswani import VaswaniForConditionalGeneration

        settings = self.settings
        set_seed(settings.seed)
        model = VaswaniForConditionalGeneration(config)
        if settings.init_from is not None:
            started = warm_start(model, self.tokenizer, settings.init_from)
            self.accelerator.print(f"warm start from {settings.init_from}: {started['copied']} of "
                                   f"{len(self.tokenizer)} token rows copied by piece, new pieces {started['new']}")
        if settings.attn_implementation:
            model.set_attn_implementation(settings.attn_implementation)
        model.generation_config.max_length = self.max_length
        model.generation_config.num_beams = settings.num_beams
        model.train()
        optimizer = make_optimizer(model, lr=settings.lr, weight_decay=settings.weight_decay, kind=settings.optimizer)
        scheduler = make_scheduler(optimizer, warmup_steps=settings.warmup_steps, schedule=settings.schedule,
                                   progress=self.progress)
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(model, optimizer, scheduler)

    def _attach_teacher_targets(self, examples: list[dict]) -> None:
        """`--teachers`: every example gets its teachers' top-k targets (`distillation`), in the run's precision."""
        settings, accelerator = self.settings, self.accelerator
        teachers = load_teachers(settings.teachers, self.tokenizer, accelerator.device, settings.attn_implementation)
        attach_teacher_targets(teachers, examples, self.tokenizer.pad_token_id, settings.distill_top_k,
                               autocast=accelerator.autocast, log=accelerator.print)

    def _build_loader(self, examples: list[dict]) -> None:
        settings, accelerator = self.settings, self.accelerator
        self.sampler = TokenBudgetBatchSampler(
            [len(e["input_ids"]) for e in examples], [len(e["labels"]) for e in examples],
            max_tokens=settings.max_tokens, seed=settings.seed, num_replicas=accelerator.num_processes,
            rank=accelerator.process_index)
        loader = torch.utils.data.DataLoader(examples, batch_sampler=self.sampler,
                                             collate_fn=Seq2SeqCollator(self.tokenizer.pad_token_id),
                                             generator=torch.Generator().manual_seed(settings.seed))
        self.loader = prepare_sharded_loader(accelerator, loader)

    def _resume(self) -> None:
        """With `settings.resume`, restore the newest valid checkpoint; without, refuse to mix with an older run."""
        accelerator = self.accelerator
        if not self.settings.resume:
            if self.main:
                refuse_older_run(self.checkpoint_dir, resume=False)
            return
        info = latest_valid_checkpoint(self.checkpoint_dir)
        if info is None:
            accelerator.print(f"--resume: no valid checkpoint in {self.checkpoint_dir}; starting from scratch")
            return
        load_training_state(info.path, accelerator, self.model, self.optimizer, self.scheduler)
        if self.ema is not None:
            self.ema.load(info.path)
        self.step, self.epoch, self.batches_done = info.step, info.epoch, info.batches_done
        self.best, self.history = info.extra.get("best"), info.extra.get("history", [])
        self.resumed_stop = {k: info.extra.get(k) for k in ("stopped_by", "time_budget_seconds")}
        if self.deadline is not None:
            self.deadline.credit(info.extra.get("elapsed_seconds", 0.0))
        self.sampler.load_state_dict({**info.extra["sampler"], "epoch": self.epoch, "batches_done": self.batches_done})
        accelerator.print(f"resumed from {info.path} (step {self.step}, epoch {self.epoch}, batch {self.batches_done})")

    def start(self) -> None:
        """Start the clocks, the progress bar and the throughput window; put the model in training mode."""
        from accelerate.utils import tqdm

        self.start_time, self.start_step = time.perf_counter(), self.step
        self.bar = tqdm(total=self.expected_end()[0], initial=self.step, desc="train", dynamic_ncols=True,
                        disable=not (self.main and self.settings.progress_bar))
        self.window = torch.zeros(3, dtype=torch.float64)  # loss sum over micro-batches, micro-batches, target tokens
        self.window_start = time.perf_counter()
        self.total_tokens = 0.0
        self.model.train()

    def train_epoch(self) -> str:
        """Train on the rest of the current epoch; returns why the run stops, or "" when the epoch ended first."""
        self.loader.set_epoch(self.epoch)
        for batch in self.loader:
            self.micro_step(batch)
            if not self.accelerator.sync_gradients:
                continue
            stopped_by = self.after_update()
            if stopped_by:
                return stopped_by
        self.epoch += 1
        self.batches_done = 0
        return ""

    def micro_step(self, batch: dict) -> None:
        """Forward and backward of one micro-batch; the optimizer steps when the gradients sync."""
        accelerator, model = self.accelerator, self.model
        with accelerator.accumulate(model):
            teacher = {name: batch.pop(name) for name in TEACHER_FIELDS if name in batch}
            output = model(**batch)
            loss = output.loss
            if teacher:
                alpha = self.settings.distill_alpha
                loss = (1 - alpha) * loss + alpha * distillation_loss(output.logits, batch["labels"], **teacher)
            accelerator.backward(loss)
            if accelerator.sync_gradients and self.settings.clip_norm > 0:
                accelerator.clip_grad_norm_(model.parameters(), self.settings.clip_norm)
            self.optimizer.step()
            self.optimizer.zero_grad()
        self.batches_done += 1
        self.window += torch.tensor([loss.item(), 1.0, float((batch["labels"] != -100).sum())], dtype=torch.float64)

    def after_update(self) -> str:
        """The bookkeeping of one optimizer update: schedule, weight average, log, stop, evaluate, save.

        Returns why the run stops ("max_steps", "time_budget") or ""; a stop evaluates and saves at once."""
        settings = self.settings
        self.scheduler.step()
        self.step += 1
        if self.ema is not None:
            self.ema.update(self.unwrapped)
        self.bar.total = self.expected_end()[0]
        self.bar.update(1)
        if self.step % settings.log_every == 0:
            self.log_training()
        stopped_by = self.stopped_by = self.stop_reason()
        if (settings.eval_every and self.step % settings.eval_every == 0) or stopped_by:
            self.evaluate()
        if (settings.save_every and self.step % settings.save_every == 0) or stopped_by:
            self.save()
        return stopped_by

    def log_training(self) -> None:
        """Loss, learning rate and throughput since the last log (summed over processes)."""
        accelerator = self.accelerator
        totals = accelerator.reduce(self.window.to(accelerator.device), "sum").cpu() \
            if accelerator.num_processes > 1 else self.window
        now = time.perf_counter()
        record = {"step": self.step, "epoch": self.epoch, "loss": totals[0].item() / totals[1].item(),
                  "lr": self.scheduler.get_last_lr()[0],
                  "target_tokens_per_second": totals[2].item() / (now - self.window_start),
                  "elapsed": now - self.start_time}
        if self.deadline is not None:
            record["run_clock"] = self.deadline.elapsed()  # the time budget's clock: earlier invocations included
        self.total_tokens += totals[2].item()
        self._log(record)
        if self.writer:
            for k in ("loss", "lr", "target_tokens_per_second"):
                self.writer.add_scalar(f"train/{k}", record[k], self.step)
        self.bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}",
                             tok_s=f"{record['target_tokens_per_second']:.0f}", refresh=False)
        if self.main and not self.settings.progress_bar:
            end, left = self.expected_end()
            print(f"step {self.step}{f'/{end}' if end else ''}: loss {record['loss']:.4f}, lr {record['lr']:.2e}, "
                  f"{record['target_tokens_per_second']:.0f} target tokens/s, "
                  f"{format_duration(left) + ' left' if left is not None else 'time left unknown'}", flush=True)
        self.window.zero_()
        self.window_start = time.perf_counter()

    def expected_end(self) -> tuple[int | None, float | None]:
        """(the step the run should end at, seconds of training left): the first to run out of `max_steps`,
        `max_epochs` and the time budget (less the end's reserve), at this invocation's pace so far, evaluations
        and saves included. (None, None) while nothing says it."""
        settings = self.settings
        ends = [settings.max_steps] if settings.max_steps is not None else []
        if settings.max_epochs is not None:
            ends.append(settings.max_epochs * math.ceil(len(self.loader) / settings.grad_accum))
        seconds_left = self.deadline.remaining() - self.final_reserve() if self.deadline is not None else None
        return forecast_end(self.step, self.step - self.start_step, time.perf_counter() - self.start_time, ends,
                            seconds_left)

    def progress(self, updates_done: int) -> float:
        """The fraction of the run's budget used before update `updates_done` + 1: the furthest of updates over
        `max_steps` (and over `max_epochs`' updates) and the run's clock over its time budget less the end's
        reserve (the budget schedules decay by it; at 1 the run stops). 0 before the first update (the scheduler
        asks once while the run is being built)."""
        settings, fractions = self.settings, [0.0]
        if updates_done == 0:
            return 0.0
        if settings.max_steps is not None:
            fractions.append(updates_done / settings.max_steps)
        if settings.max_epochs is not None:
            fractions.append(updates_done / (settings.max_epochs * math.ceil(len(self.loader) / settings.grad_accum)))
        if self.deadline is not None:
            available = self.deadline.seconds - self.final_reserve()
            fractions.append(self.deadline.elapsed() / available if available > 0 else 1.0)
        return min(1.0, max(fractions))

    def finished_before(self) -> str:
        """Why a resumed run has nothing left to train ("max_steps", "max_epochs", "time_budget"), or "": the stop rule
        checked before the first update of an invocation. A run that stopped on its time budget stays finished
        unless resumed with a larger one; a larger max_steps or max_epochs continues it."""
        settings = self.settings
        if settings.max_steps is not None and self.step >= settings.max_steps:
            return "max_steps"
        if settings.max_epochs is not None and self.epoch >= settings.max_epochs:
            return "max_epochs"
        budget = self.resumed_stop.get("time_budget_seconds")
        if self.resumed_stop.get("stopped_by") == "time_budget" and self.deadline is not None and budget is not None \
                and self.deadline.seconds <= budget:
            return "time_budget"
        return ""

    def stop_reason(self) -> str:
        """"max_steps", "time_budget" (every rank stops at the same step) or ""."""
        if self.settings.max_steps is not None and self.step >= self.settings.max_steps:
            return "max_steps"
        if self.deadline is None:
            return ""
        accelerator = self.accelerator
        out_of_time = torch.tensor(float(self.deadline.remaining() < self.final_reserve()), device=accelerator.device)
        if accelerator.num_processes > 1:
            out_of_time = accelerator.reduce(out_of_time, "max")
        return "time_budget" if out_of_time.item() > 0 else ""

    def final_reserve(self) -> float:
        """Seconds of the time budget kept free for the end: the last subset evaluation and the final one."""
        sources = len(self.dev_sources) + len(self.data.dev_sources) * max(1.0, 0.6 * self.settings.num_beams)
        if self._confirms():
            sources += 2 * len(self.data.dev_sources)  # the best and the last weights, greedy
        return FINAL_OVERHEAD_SECONDS + self.eval_seconds_per_source * sources

    def _confirms(self) -> bool:
        """Whether the end of the run compares the subset's best step with the last weights on the full dev set: a
        subset smaller than the dev set, and the best step kept (not an average of checkpoints)."""
        subset = self.settings.eval_subset
        return self.settings.confirm_best and self.settings.average_last == 1 \
            and 0 < subset < len(self.data.dev_sources)

    def evaluate(self) -> dict:
        """Score the evaluated weights on the dev subset (main process, greedy), keep them if they are the best so
        far, and log the result; the other processes wait. Returns the scores ({} off the main process)."""
        result = {}
        if self.main:
            result = evaluate(self.evaluated, self.tokenizer, self.data.task, self.dev_sources, self.dev_references,
                              self.dev_examples, num_beams=1, max_length=self.max_length,
                              batch_size=self.settings.eval_batch_size)
            result.pop("predictions")
            self._keep_if_best(result[self.data.metric])
            self._log_evaluation(result)
        self.accelerator.wait_for_everyone()
        self.last_eval_step = self.step
        if result:
            self.eval_seconds_per_source = result["generate_seconds"] / max(1, len(self.dev_sources))
            self.window_start += result["seconds"]  # evaluation time is not training throughput
        return result

    def _keep_if_best(self, value: float) -> None:
        best = self.best
        if best is not None and not (value > best["value"] if self.data.greater_is_better else value < best["value"]):
            return
        self.best = {"step": self.step, "value": value, "metric": self.data.metric}
        write_best(self.evaluated, self.checkpoint_dir)

    def _log_evaluation(self, result: dict) -> None:
        metric = self.data.metric
        point = {"step": self.step, "epoch": self.epoch, **{k: result[k] for k in ("loss", metric)},
                 **{k: v for k, v in result.items() if k in ("per", "chrf")}}
        self.history.append(point)
        self._log({"eval": point, "seconds": result["seconds"], "best_step": self.best["step"]})
        if self.writer:
            for k in ("loss", "wer", "per", "bleu", "chrf"):
                if k in result:
                    self.writer.add_scalar(f"dev/{k}", result[k], self.step)
        self.say(
            f"step {self.step}: dev loss {result['loss']:.4f} "
            + " ".join(f"{k} {result[k]:.2f}" for k in ("wer", "per", "bleu", "chrf") if k in result)
            + f" ({len(self.dev_sources)} dev, {result['seconds']:.1f}s; best step {self.best['step']})")

    def say(self, line: str) -> None:
        """Print a line on the main process without breaking the progress bar."""
        if self.main:
            self.bar.write(line)

    def _log(self, record: dict) -> None:
        if self.main:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def save(self) -> None:
        """A checkpoint of this update (every process writes its part); an epoch consumed entirely is saved as the
        start of the next one."""
        done = self.batches_done >= len(self.loader)
        epoch, batches_done = (self.epoch + 1, 0) if done else (self.epoch, self.batches_done)
        extra = {"sampler": self.sampler.state_dict(batches_done), "best": self.best, "history": self.history}
        if self.deadline is not None:
            extra.update(elapsed_seconds=self.deadline.elapsed(), time_budget_seconds=self.deadline.seconds)
        if self.stopped_by:
            extra["stopped_by"] = self.stopped_by
        save_checkpoint(self.checkpoint_dir, self.step, self._save_state, epoch=epoch, batches_done=batches_done,
                        keep_last=self.settings.keep_last, extra=extra, is_main_process=self.main,
                        wait_for_everyone=self.accelerator.wait_for_everyone)

    def _save_state(self, folder: Path) -> None:
        save_training_state(folder, self.accelerator, self.model, self.optimizer, self.scheduler)
        if self.ema is not None and self.main:
            self.ema.save(folder)

    def finish(self, stopped_by: str) -> TrainingResult:
        """Close the training part, evaluate the last weights if not yet done, then the final evaluation of the
        weights to export (main process: `final_evaluation`, logged); returns the run's result."""
        self.bar.close()
        train_seconds = time.perf_counter() - self.start_time
        if self.last_eval_step != self.step:
            self.evaluate()
        confirmation = None
        if self.main and self._confirms() and self.best is not None and self.best["step"] != self.step:
            confirmation = self.confirm_best()
        if self.writer:
            self.writer.flush()
        model, dev = None, {}
        if self.main:
            settings = self.settings
            model, dev = final_evaluation(
                self.checkpoint_dir, self.tokenizer, self.data, num_beams=settings.num_beams,
                batch_size=settings.eval_batch_size, best_step=self.best["step"],
                average_last=settings.average_last if settings.average_last > 1 else None,
                attn_implementation=settings.attn_implementation, max_length=self.max_length)
            self._log_final(dev)
        self.accelerator.wait_for_everyone()
        return TrainingResult(step=self.step, epoch=self.epoch, best_step=self.best["step"] if self.best else None,
                              dev=dev, history=self.history, train_seconds=train_seconds,
                              target_tokens_per_second=self.total_tokens / train_seconds if train_seconds else 0.0,
                              stopped_by=stopped_by, model=model, averaged_steps=dev.get("averaged_steps"),
                              optimizer=describe_optimizer(self.optimizer), confirmation=confirmation)

    def confirm_best(self) -> dict:
        """The subset's best step against the last weights, both scored on the whole dev set with greedy search
        (main process); the better one stays in `checkpoints/best` (a tie keeps the last). Logged; returns
        {"best_step", "last_step", metric: {step: value}, "kept"}."""
        data, metric = self.data, self.data.metric

        def full_dev(model) -> float:  # the metric alone: the dev loss decides nothing here
            predictions = generate_texts(model, self.tokenizer, data.dev_sources, max_length=self.max_length,
                                         batch_size=self.settings.eval_batch_size)
            return score(data.task, predictions, data.dev_references)[metric]

        best_step, last_step = self.best["step"], self.step
        earlier = load_best(self.checkpoint_dir, self.settings.attn_implementation).to(self.accelerator.device)
        best_value, last_value = full_dev(earlier), full_dev(self.evaluated)
        last_wins = last_value >= best_value if data.greater_is_better else last_value <= best_value
        kept = last_step if last_wins else best_step
        if last_wins:
            write_best(self.evaluated, self.checkpoint_dir)
            last_subset = next((h[metric] for h in reversed(self.history) if h["step"] == last_step), last_value)
            self.best = {"step": last_step, "value": last_subset, "metric": metric}
        confirmation = {"best_step": best_step, "last_step": last_step,
                        metric: {str(best_step): best_value, str(last_step): last_value}, "kept": kept}
        self._log({"confirm_best": confirmation})
        self.say(f"the subset's best step {best_step} against the last step {last_step} on the full dev set "
                 f"({len(data.dev_sources)} sources, greedy): {metric} {best_value:.2f} against {last_value:.2f}; "
                 f"step {kept} kept")
        return confirmation

    def _log_final(self, dev: dict) -> None:
        self.accelerator.print(describe_final(dev, len(self.data.dev_sources)))
        if self.writer:
            for k in ("wer", "per", "bleu", "chrf"):
                if k in dev:
                    self.writer.add_scalar(f"final/{k}", dev[k], self.step)
            self.writer.close()
        self._log({"final": {k: v for k, v in dev.items() if k != "predictions"}})


def settings_dict(settings: TrainingSettings) -> dict:
    return asdict(settings)
