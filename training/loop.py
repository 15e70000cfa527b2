"""The training loop: Accelerate, token-budget batches, the paper's schedule, periodic evaluation, exact resume.

One code path for one CPU process, one GPU, and N processes (`accelerate launch`, `torchrun`;
on CPU pass `cpu=True` or set ACCELERATE_USE_CPU=1, else each process trains alone: see
`make_accelerator`). Per optimizer update ("step"):

    with accelerator.accumulate(model):       # grad_accum micro-batches per step
        loss = model(**batch).loss            # token-mean CE with config.label_smoothing
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
best step by the task metric is kept in `<output_dir>/checkpoints/best`; at the end the best
weights are evaluated on the whole dev set with `num_beams` and become the end product. With
`average_last` K > 1 the end product is instead the mean of the weights of the last K checkpoints
(`vaswani.training.averaging`, the paper's checkpoint averaging), chosen before the run, not by the dev set.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .averaging import average_checkpoints
from .batching import Seq2SeqCollator, TokenBudgetBatchSampler, prepare_sharded_loader
from .checkpoints import latest_valid_checkpoint, save_checkpoint
from .ema import WeightEMA
from .evaluation import evaluate
from .schedule import make_optimizer, make_scheduler
from .tasks import TaskData, encode_pairs
from .time_budget import Deadline
from .train_state import load_training_state, load_weights, save_training_state

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
BEST_DIR = "best"


@dataclass
class TrainingSettings:
    """How to train (not what: model hyperparameters live in the config). Stops at whichever comes first of
    `max_steps` updates, `max_epochs`, and `time_budget` (wall clock of this invocation, final evaluation included)."""

    output_dir: str
    max_steps: int | None = None
    max_epochs: int | None = None
    time_budget: str | float | None = None
    max_tokens: int = 4096
    lr: float = 1e-3  # peak learning rate, reached after warmup_steps
    warmup_steps: int = 1000
    weight_decay: float = 0.0
    grad_accum: int = 1
    clip_norm: float = 1.0  # 0: no clipping
    eval_every: int = 500  # updates; 0: evaluate only at the end
    eval_subset: int = 1000  # dev sources used by evaluations during training; 0: all
    eval_batch_size: int = 512
    num_beams: int = 1  # final evaluation and the saved generation config
    save_every: int = 500  # updates; 0: only at the end
    keep_last: int = 2
    log_every: int = 20
    seed: int = 0
    mixed_precision: str = "no"
    cpu: bool = False
    resume: bool = False
    attn_implementation: str | None = None
    ema_decay: float = 0.0  # > 0: evaluate, keep and export an exponential moving average of the weights
    average_last: int = 1  # > 1: export the average of the last K checkpoints' weights instead of the best one
    max_source_length: int = 256  # longer training examples are dropped (with a warning)
    progress_bar: bool = True
    tensorboard: bool = True

    def validate(self) -> None:
        for name in ("max_tokens", "grad_accum", "log_every", "eval_batch_size", "num_beams", "keep_last",
                     "warmup_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("eval_every", "save_every", "eval_subset"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps} must be >= 1")
        if self.max_steps is None and self.max_epochs is None and self.time_budget is None:
            raise ValueError("nothing ends the run: give max_steps, max_epochs or time_budget")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be > 0")
        if self.clip_norm < 0:
            raise ValueError(f"clip_norm={self.clip_norm} must be >= 0 (0 disables clipping)")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay={self.ema_decay} must be in [0, 1) (0 turns weight averaging off)")
        if self.average_last < 1:
            raise ValueError(f"average_last={self.average_last} must be >= 1 (1: keep the best checkpoint)")
        if self.average_last > 1 and (self.keep_last < self.average_last or self.save_every < 1):
            raise ValueError(f"average_last={self.average_last} averages the last {self.average_last} checkpoints: "
                             f"keep that many (keep_last={self.keep_last}) and save during the run "
                             f"(save_every={self.save_every})")
        if self.mixed_precision not in ("no", "fp16", "bf16"):
            raise ValueError(f"mixed_precision={self.mixed_precision!r}: choose no, fp16 or bf16")


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


def make_accelerator(settings: TrainingSettings):
    """An Accelerator for the run; on a machine without CUDA under a multi-process launcher, CPU (gloo) mode.

    Accelerate only goes multi-process on CPU with cpu=True (or ACCELERATE_USE_CPU=1); otherwise every process
    would silently train alone. The world size the launcher announced is checked against what we got.
    """
    from accelerate import Accelerator

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cpu = settings.cpu or (world_size > 1 and not torch.cuda.is_available())
    accelerator = Accelerator(cpu=cpu, mixed_precision=settings.mixed_precision,
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


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def train(config, tokenizer, data: TaskData, settings: TrainingSettings, accelerator=None,
          deadline: Deadline | None = None) -> TrainingResult:
    """Train a VaswaniForConditionalGeneration from `config` on `data`; see the module docstring.

    Writes `<output_dir>/checkpoints/checkpoint-<step>` (Accelerate state), `checkpoints/best` (the best
    weights so far), `train_log.jsonl` and TensorBoard logs in `runs/`. Returns the final evaluation of the best
    weights (full dev set) and the unwrapped best model on the main process; the caller exports it.
    `deadline`: the time budget's clock when it started earlier (the script starts it before data and tokenizer).
    """
    from accelerate.utils import set_seed, tqdm

    from vaswani import VaswaniForConditionalGeneration

    settings.validate()
    accelerator = accelerator or make_accelerator(settings)
    if deadline is None and settings.time_budget is not None:
        deadline = Deadline(settings.time_budget)
    main = accelerator.is_main_process
    output_dir = Path(settings.output_dir)
    checkpoint_dir = output_dir / CHECKPOINT_DIR
    if main:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)

    # Data: every rank encodes the same training examples (cheap and deterministic); dev on the main process.
    examples = encode_pairs(tokenizer, data.train_pairs)
    keep = [e for e in examples if len(e["input_ids"]) <= settings.max_source_length
            and len(e["labels"]) <= settings.max_source_length]
    if len(keep) < len(examples):
        logger.warning("dropped %d training examples longer than max_source_length=%d tokens",
                       len(examples) - len(keep), settings.max_source_length)
    examples = keep
    if not examples:
        raise ValueError("no training examples left")
    max_length = generation_max_length([len(e["labels"]) for e in examples])

    set_seed(settings.seed)
    model = VaswaniForConditionalGeneration(config)
    if settings.attn_implementation:
        model.set_attn_implementation(settings.attn_implementation)
    model.generation_config.max_length = max_length
    model.generation_config.num_beams = settings.num_beams
    model.train()
    optimizer = make_optimizer(model, lr=settings.lr, weight_decay=settings.weight_decay)
    scheduler = make_scheduler(optimizer, warmup_steps=settings.warmup_steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    sampler = TokenBudgetBatchSampler([len(e["input_ids"]) for e in examples], [len(e["labels"]) for e in examples],
                                      max_tokens=settings.max_tokens, seed=settings.seed,
                                      num_replicas=accelerator.num_processes, rank=accelerator.process_index)
    loader = torch.utils.data.DataLoader(examples, batch_sampler=sampler, collate_fn=Seq2SeqCollator(tokenizer.pad_token_id),
                                         generator=torch.Generator().manual_seed(settings.seed))
    loader = prepare_sharded_loader(accelerator, loader)
    unwrapped = accelerator.unwrap_model(model)
    ema = WeightEMA(unwrapped, settings.ema_decay) if settings.ema_decay else None

    step, epoch, batches_done = 0, 0, 0
    best: dict | None = None  # {"step", "value"} of the best evaluation so far
    history: list[dict] = []
    if settings.resume:
        info = latest_valid_checkpoint(checkpoint_dir)
        if info is None:
            accelerator.print(f"--resume: no valid checkpoint in {checkpoint_dir}; starting from scratch")
        else:
            load_training_state(info.path, accelerator, model, optimizer, scheduler)
            if ema is not None:
                ema.load(info.path)
            step, epoch, batches_done = info.step, info.epoch, info.batches_done
            best, history = info.extra.get("best"), info.extra.get("history", [])
            sampler.load_state_dict({**info.extra["sampler"], "epoch": epoch, "batches_done": batches_done})
            accelerator.print(f"resumed from {info.path} (step {step}, epoch {epoch}, batch {batches_done})")
    elif main and any(checkpoint_dir.glob("checkpoint-*")):
        raise ValueError(f"{checkpoint_dir} already holds checkpoints; pass --resume to continue that run, or choose "
                         "another --output_dir")

    dev_index = _subset(len(data.dev_sources), settings.eval_subset)
    dev_sources = [data.dev_sources[i] for i in dev_index]
    dev_references = [data.dev_references[i] for i in dev_index]
    dev_examples = encode_pairs(tokenizer, [(s, r) for s, refs in zip(dev_sources, dev_references) for r in refs]) if main else []

    writer = None
    if main and settings.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(output_dir / "runs"), purge_step=step or None)
    log_path = output_dir / "train_log.jsonl"
    evaluated = ema.module if ema is not None else unwrapped  # the weights that are evaluated, kept and exported

    def log(record: dict) -> None:
        if main:
            with open(log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def run_eval() -> dict:
        nonlocal best
        result = {}
        if main:
            result = evaluate(evaluated, tokenizer, data.task, dev_sources, dev_references, dev_examples,
                              num_beams=1, max_length=max_length, batch_size=settings.eval_batch_size)
            result.pop("predictions")
            value = result[data.metric]
            better = best is None or (value > best["value"] if data.greater_is_better else value < best["value"])
            if better:
                best = {"step": step, "value": value, "metric": data.metric}
                tmp = checkpoint_dir / f".tmp-{BEST_DIR}"
                shutil.rmtree(tmp, ignore_errors=True)
                evaluated.save_pretrained(tmp)
                shutil.rmtree(checkpoint_dir / BEST_DIR, ignore_errors=True)
                os.replace(tmp, checkpoint_dir / BEST_DIR)
            point = {"step": step, "epoch": epoch, **{k: result[k] for k in ("loss", data.metric)},
                     **{k: v for k, v in result.items() if k in ("per", "chrf")}}
            history.append(point)
            log({"eval": point, "seconds": result["seconds"], "best_step": best["step"]})
            if writer:
                for k in ("loss", "wer", "per", "bleu", "chrf"):
                    if k in result:
                        writer.add_scalar(f"dev/{k}", result[k], step)
            accelerator.print(f"step {step}: dev loss {result['loss']:.4f} "
                              + " ".join(f"{k} {result[k]:.2f}" for k in ("wer", "per", "bleu", "chrf") if k in result)
                              + f" ({len(dev_sources)} dev, {result['seconds']:.1f}s; best step {best['step']})")
        accelerator.wait_for_everyone()
        return result

    def save() -> None:
        # an epoch consumed entirely is saved as the start of the next one
        e, b = (epoch + 1, 0) if batches_done >= len(loader) else (epoch, batches_done)
        def save_fn(tmp: Path) -> None:
            save_training_state(tmp, accelerator, model, optimizer, scheduler)
            if ema is not None and main:
                ema.save(tmp)

        extra = {"sampler": sampler.state_dict(b), "best": best, "history": history}
        save_checkpoint(checkpoint_dir, step, save_fn, epoch=e, batches_done=b, keep_last=settings.keep_last, extra=extra,
                        is_main_process=main, wait_for_everyone=accelerator.wait_for_everyone)

    # An estimate of the final evaluation's cost, refined by each evaluation, is kept free within the time budget.
    # Start from a measured figure (a trained G2P model: ~0.001 s per word greedy, ~0.003 with beam 4, on 2 CPU
    # cores), not a pessimistic one: a large guess times a full dev set can exceed the whole budget at step 1.
    eval_seconds_per_source = 0.005
    def final_reserve() -> float:
        # 30 s: loading the best weights, the folder, and the interpreter's start and exit outside the budget's clock
        return 30 + eval_seconds_per_source * (len(dev_sources) + len(data.dev_sources) * max(1.0, 0.6 * settings.num_beams))

    bar = tqdm(total=settings.max_steps, initial=step, desc="train", disable=not (main and settings.progress_bar),
               dynamic_ncols=True)
    start_time = time.perf_counter()
    window = torch.zeros(3, dtype=torch.float64)  # loss sum over micro-batches, micro-batches, target tokens
    window_start, total_tokens, last_eval_step, stopped_by = time.perf_counter(), 0.0, None, ""
    model.train()
    while not stopped_by:
        if settings.max_epochs is not None and epoch >= settings.max_epochs:
            stopped_by = "max_epochs"
            break
        loader.set_epoch(epoch)
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients and settings.clip_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), settings.clip_norm)
                optimizer.step()
                optimizer.zero_grad()
            batches_done += 1
            window += torch.tensor([loss.item(), 1.0, float((batch["labels"] != -100).sum())], dtype=torch.float64)
            if not accelerator.sync_gradients:
                continue
            scheduler.step()
            step += 1
            if ema is not None:
                ema.update(unwrapped)
            bar.update(1)

            if step % settings.log_every == 0:
                totals = accelerator.reduce(window.to(accelerator.device), "sum").cpu() \
                    if accelerator.num_processes > 1 else window
                now = time.perf_counter()
                record = {"step": step, "epoch": epoch, "loss": totals[0].item() / totals[1].item(),
                          "lr": scheduler.get_last_lr()[0], "target_tokens_per_second": totals[2].item() / (now - window_start),
                          "elapsed": now - start_time}
                total_tokens += totals[2].item()
                log(record)
                if writer:
                    for k in ("loss", "lr", "target_tokens_per_second"):
                        writer.add_scalar(f"train/{k}", record[k], step)
                bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}",
                                tok_s=f"{record['target_tokens_per_second']:.0f}", refresh=False)
                window.zero_()
                window_start = time.perf_counter()

            if settings.max_steps is not None and step >= settings.max_steps:
                stopped_by = "max_steps"
            elif deadline is not None:
                out_of_time = torch.tensor(float(deadline.remaining() < final_reserve()), device=accelerator.device)
                if accelerator.num_processes > 1:
                    out_of_time = accelerator.reduce(out_of_time, "max")  # every rank stops at the same step
                if out_of_time.item() > 0:
                    stopped_by = "time_budget"

            if (settings.eval_every and step % settings.eval_every == 0) or stopped_by:
                result = run_eval()
                last_eval_step = step
                if main and result:
                    eval_seconds_per_source = result["generate_seconds"] / max(1, len(dev_sources))
                    window_start += result["seconds"]  # evaluation time is not training throughput
            if (settings.save_every and step % settings.save_every == 0) or stopped_by:
                save()
            if stopped_by:
                break
        else:
            epoch += 1
            batches_done = 0
    bar.close()
    train_seconds = time.perf_counter() - start_time
    if last_eval_step != step:
        run_eval()
    if writer:
        writer.flush()

    dev: dict = {}
    best_model, averaged_steps = None, None
    if main:
        best_model = VaswaniForConditionalGeneration.from_pretrained(checkpoint_dir / BEST_DIR)
        if settings.average_last > 1:  # the same model, config and generation settings; the averaged weights
            tensors, averaged_steps = average_checkpoints(checkpoint_dir, settings.average_last)
            load_weights(best_model, tensors, f"the average of checkpoints {averaged_steps}")
        if settings.attn_implementation:
            best_model.set_attn_implementation(settings.attn_implementation)
        best_model.generation_config.max_length = max_length
        best_model.generation_config.num_beams = settings.num_beams
        dev_all = encode_pairs(tokenizer, data.dev_pairs)
        dev = evaluate(best_model, tokenizer, data.task, data.dev_sources, data.dev_references, dev_all,
                       num_beams=settings.num_beams, max_length=max_length, batch_size=settings.eval_batch_size)
        dev["step"] = averaged_steps[-1] if averaged_steps else best["step"]
        if averaged_steps:
            dev["averaged_steps"] = averaged_steps
        accelerator.print((f"the average of steps {averaged_steps}" if averaged_steps else f"best step {best['step']}")
                          + f" on the full dev set ({len(data.dev_sources)} sources, "
                          f"beam {settings.num_beams}): loss {dev['loss']:.4f} "
                          + " ".join(f"{k} {dev[k]:.2f}" for k in ("wer", "per", "bleu", "chrf") if k in dev))
        if writer:
            for k in ("wer", "per", "bleu", "chrf"):
                if k in dev:
                    writer.add_scalar(f"final/{k}", dev[k], step)
            writer.close()
        log({"final": {k: v for k, v in dev.items() if k != "predictions"}})
    accelerator.wait_for_everyone()
    return TrainingResult(step=step, epoch=epoch, best_step=best["step"] if best else None, dev=dev, history=history,
                          train_seconds=train_seconds,
                          target_tokens_per_second=total_tokens / train_seconds if train_seconds else 0.0,
                          stopped_by=stopped_by, model=best_model, averaged_steps=averaged_steps)


def settings_dict(settings: TrainingSettings) -> dict:
    return asdict(settings)
