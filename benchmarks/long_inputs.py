"""The cost curves of vaswani's self-attention patterns on long inputs: full attention (under sdpa) against local,
block-sparse and linear attention (attention_patterns_vaswani.py).

    python benchmarks/long_inputs.py                    # writes benchmarks/long_inputs_results.{json,md}, long_inputs.png
    python benchmarks/long_inputs.py --lengths 1024 2048 4096 --rounds 5 --decode_lengths 256 512
    python benchmarks/long_inputs.py --pattern_attn eager  # local and block-sparse written out, not torch's sdpa
    python benchmarks/long_inputs.py --quick            # a tiny run that checks the bookkeeping (used by the tests)
    python benchmarks/benchmark.py --long_inputs --quick  # through the main benchmark (what follows goes here)

Measured, at the width of the G2P model (benchmark.py's "g2p" size) and batch 1:
- training: the time of one step (forward + backward + fused Adam step) against source length, target fixed and short,
  each contender setting both stacks' pattern (at a short target the decoder's pattern costs little: the curves are
  the encoder's); the contenders alternate round by round at each length, as in benchmark.py, and report medians
  with min-max and how many rounds each point got (fewer at the longest lengths, where a round costs most);
- memory: the bytes autograd saves for backward (benchmark.py's `activation_bytes`, exact), and the peak process
  memory of the step above its warmed-up baseline, each point in a new process (forked from one that has only
  imported the modules; one thread each, as many side by side as `--threads`): transient buffers that are not saved
  (an n x n score matrix) show only there;
- decoding: greedy `generate` with the cache to each target length from a short source, EOS suppressed; the time
  per token is the mean step time over the last `--decode_window` steps before each length, and the cache memory
  there is the bytes of the decoder's self-attention cache (every key: O(n); a rolling window: O(w); sums: O(1)).
  Every pattern runs transformers' decoding loop (full attention included: the caller's cache keeps vaswani's lean
  loop out), so that only the attention differs.
From these: growth exponents log(t(16k) / t(4k)) / log(4) (between `--exponent_from` and the longest length) for
time and memory, and the length where each pattern becomes faster than full attention (log-log interpolation
between the measured points).

This is not library code: nothing in the package imports it, and it is not installed with it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import math
import multiprocessing
import os
import resource
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measurement import SIZES, Stat, _alternate, _measure, activation_bytes, machine_description  # noqa: E402

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration  # noqa: E402
from vaswani.caches_vaswani import self_attention_cache  # noqa: E402

PATTERNS = ("full", "local", "block_sparse", "linear")
FULL_ATTN = "sdpa"  # full attention's backend: torch's fused kernel, no n x n buffer on the CPU
RERUN_FROM_ROUNDS = 4  # a point of this many rounds or more is measured again when noisy (`_measure`)


@dataclasses.dataclass
class Settings:
    """Everything one run measures with: what each memory process gets, and what results.json records."""

    size: str = "g2p"
    lengths: list[int] = dataclasses.field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384])
    target: int = 64
    rounds: list[int] = dataclasses.field(default_factory=lambda: [5, 5, 5, 3, 3])  # per length, the last repeated
    attention_window: int = 128
    sparse_block_size: int = 64
    sparse_global_tokens: int = 2
    pattern_attn: str = "sdpa"  # the backend of local and block-sparse attention (linear's formula has none)
    dropout: float = 0.1
    decode_lengths: list[int] = dataclasses.field(default_factory=lambda: [256, 512, 1024, 2048, 4096])
    decode_source: int = 64
    decode_window: int = 64
    decode_rounds: int = 3
    exponent_from: int = 4096
    threads: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)

    def rounds_at(self, length: int) -> int:
        index = sorted(self.lengths).index(length)
        return self.rounds[min(index, len(self.rounds) - 1)]


QUICK = dict(size="quick", lengths=[64, 256], target=8, rounds=[1], attention_window=16, sparse_block_size=16,
             decode_lengths=[48, 96], decode_source=16, decode_window=16, decode_rounds=1, exponent_from=64)


def backend(pattern: str, settings: Settings) -> str:
    return FULL_ATTN if pattern == "full" else settings.pattern_attn


def build_model(settings: Settings, pattern: str, dropout: float | None = None) -> VaswaniForConditionalGeneration:
    """A random model of the run's width with `pattern` in both stacks; the same weights for every pattern."""
    s = SIZES[settings.size]
    config = VaswaniConfig(
        vocab_size=s["vocab"], d_model=s["d_model"], encoder_layers=s["layers"], decoder_layers=s["layers"],
        encoder_attention_heads=s["heads"], decoder_attention_heads=s["heads"], encoder_ffn_dim=s["ffn"],
        decoder_ffn_dim=s["ffn"], dropout=settings.dropout if dropout is None else dropout,
        encoder_attention_pattern=pattern, decoder_attention_pattern=pattern,
        attention_window=settings.attention_window, sparse_block_size=settings.sparse_block_size,
        sparse_global_tokens=settings.sparse_global_tokens,
        max_position_embeddings=max(settings.lengths + settings.decode_lengths) + 1,  # generate warns past it
    )
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(config)
    model.set_attn_implementation(backend(pattern, settings))
    return model


def training_batch(settings: Settings, length: int) -> dict:
    """Batch 1: `length` source tokens, `settings.target` label tokens, no padding."""
    vocab = SIZES[settings.size]["vocab"]
    g = torch.Generator().manual_seed(length)
    return dict(input_ids=torch.randint(4, vocab, (1, length), generator=g),
                labels=torch.randint(4, vocab, (1, settings.target), generator=g))


def _optimizer(model) -> torch.optim.Optimizer:
    # the fused Adam of benchmark.py's `_train_step_fn` (and of the training loop)
    return torch.optim.Adam(model.parameters(), lr=1e-5, betas=(0.9, 0.98), eps=1e-9, fused=True)


def _step_seconds_fn(model, batch: dict) -> Callable[[], float]:
    """A timed training step (seconds), warmed up once: one step a round, since a step at 16k tokens is long."""
    optimizer = _optimizer(model)
    model.train()

    def one_step():
        optimizer.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        optimizer.step()

    one_step()

    def run() -> float:
        start = time.perf_counter()
        one_step()
        return time.perf_counter() - start

    return run


def measure_training(settings: Settings, log: Callable = print) -> list[dict]:
    """Step time of every pattern at every source length, the patterns alternating round by round."""
    models = {pattern: build_model(settings, pattern) for pattern in PATTERNS}
    rows = []
    for length in sorted(settings.lengths):
        batch = training_batch(settings, length)
        contenders = {pattern: _step_seconds_fn(model, batch) for pattern, model in models.items()}
        rounds = settings.rounds_at(length)
        times = (_measure if rounds >= RERUN_FROM_ROUNDS else _alternate)(contenders, rounds)
        del contenders  # the optimizers' state and the gradients
        for pattern in PATTERNS:
            rows.append(dict(pattern=pattern, length=length, rounds=len(times[pattern]),
                             step_s=Stat.of(times[pattern]).__dict__))
        log(f"train {length:>6}: " + "  ".join(
            f"{p} {Stat.of(times[p]).median * 1e3:.0f} ms" for p in PATTERNS) + f"  ({len(times['full'])} rounds)")
    return rows


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _reset_peak_rss() -> bool:
    """Sets the process's peak memory back to its current memory (Linux: /proc/self/clear_refs), so that the peak of
    what follows is not hidden under an earlier one (the imports'); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def memory_point(settings: Settings, pattern: str, length: int) -> dict:
    """In a fresh process: the activation bytes of one training step at `length`, and its peak memory above the
    baseline of a model whose gradients and Adam state exist (a step at a short length made them). The optimizer
    step allocates nothing more once its state exists, so forward + backward hold the step's peak."""
    torch.set_num_threads(settings.threads)
    model = build_model(settings, pattern)
    optimizer = _optimizer(model)
    model.train()
    model(**training_batch(settings, min(length, settings.target))).loss.backward()
    optimizer.step()
    reset = _reset_peak_rss()
    baseline = _peak_rss_bytes()
    saved = activation_bytes(model, training_batch(settings, length))
    peak = _peak_rss_bytes()
    return dict(pattern=pattern, length=length, activation_mib=saved / 2**20, peak_mib=(peak - baseline) / 2**20,
                baseline_mib=baseline / 2**20, peak_reset=reset)


def _memory_task(settings: dict, pattern: str, length: int) -> dict:
    return memory_point(Settings(**settings), pattern, length)


def measure_memory(settings: Settings, log: Callable = print) -> list[dict]:
    """`memory_point` at every (pattern, length), each in a new process forked from a server process that has
    imported the modules and run nothing else (multiprocessing's forkserver): no allocation of one point stays to
    hide the next one's. One thread each (memory does not depend on it), `settings.threads` processes at a time."""
    points = [(pattern, length) for length in sorted(settings.lengths) for pattern in PATTERNS]
    child = dataclasses.asdict(dataclasses.replace(settings, threads=1))
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "vaswani", __name__])
    with concurrent.futures.ProcessPoolExecutor(settings.threads, mp_context=context, max_tasks_per_child=1) as pool:
        rows = list(pool.map(_memory_task, *zip(*[(child, pattern, length) for pattern, length in points])))
    for length in sorted(settings.lengths):
        log(f"memory {length:>6}: " + "  ".join(f"{r['pattern']} {r['activation_mib']:.0f} saved / "
                                                f"{r['peak_mib']:.0f} peak MiB" for r in rows if r["length"] == length))
    return rows


def cache_bytes(cache) -> int:
    """Bytes of the distinct storages of the decoder's self-attention cache (keys and values, or running sums)."""
    storages = {}
    for layer in cache.self_attention_cache.layers:
        for name in ("keys", "values", "sums", "normalizer"):
            tensor = getattr(layer, name, None)
            if torch.is_tensor(tensor):
                storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(storages.values())


class DecodeClock(StoppingCriteria):
    """Stops nothing: records the time after each new token, and the cache's bytes at the given target lengths."""

    def __init__(self, cache, lengths: list[int]):
        self.cache, self.lengths = cache, set(lengths)
        self.times: list[float] = []
        self.memory: dict[int, int] = {}

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        self.times.append(time.perf_counter())
        generated = input_ids.shape[1] - 1  # after the decoder's start token
        if generated in self.lengths:
            self.memory[generated] = cache_bytes(self.cache)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def per_token_seconds(self, length: int, window: int) -> float:
        """Mean step time over the `window` steps that end at the `length`-th new token."""
        return (self.times[length - 1] - self.times[length - 1 - window]) / window


def _decode_fn(model, settings: Settings, cache_memory: dict) -> Callable[[], list[float]]:
    """A greedy `generate` to the longest target length (warmed up on a short one); each call returns the seconds per
    token at each of `settings.decode_lengths` and leaves the cache's bytes at each in `cache_memory`."""
    vocab = SIZES[settings.size]["vocab"]
    source = torch.randint(4, vocab, (1, settings.decode_source), generator=torch.Generator().manual_seed(1))
    model.eval()

    def generate(new_tokens: int) -> DecodeClock:
        cache = EncoderDecoderCache(self_attention_cache(model.config), DynamicCache(config=model.config))
        clock = DecodeClock(cache, settings.decode_lengths)
        config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1,
                                  decoder_start_token_id=model.config.decoder_start_token_id,
                                  pad_token_id=model.config.pad_token_id, eos_token_id=model.config.eos_token_id)
        with torch.inference_mode():
            model.generate(input_ids=source, generation_config=config, cache=cache,
                           stopping_criteria=StoppingCriteriaList([clock]))
        return clock

    generate(2 * settings.decode_window)

    def run() -> list[float]:
        clock = generate(max(settings.decode_lengths))
        cache_memory.update(clock.memory)
        return [clock.per_token_seconds(length, settings.decode_window) for length in settings.decode_lengths]

    return run


def measure_decoding(settings: Settings, log: Callable = print) -> list[dict]:
    """Time per token and cache memory of each pattern's decoder against target length, alternating patterns."""
    lengths = settings.decode_lengths
    if min(lengths) <= settings.decode_window:
        raise ValueError(f"every decode length must exceed --decode_window={settings.decode_window}: {lengths}")
    memory = {pattern: {} for pattern in PATTERNS}
    contenders = {pattern: _decode_fn(build_model(settings, pattern, dropout=0.0), settings, memory[pattern])
                  for pattern in PATTERNS}
    per_round = _alternate(contenders, settings.decode_rounds)
    rows = []
    for pattern in PATTERNS:
        for i, length in enumerate(lengths):
            seconds = [values[i] for values in per_round[pattern]]
            rows.append(dict(pattern=pattern, length=length, rounds=len(seconds), token_s=Stat.of(seconds).__dict__,
                             cache_mib=memory[pattern][length] / 2**20))
        log(f"decode {pattern:<12}: " + "  ".join(
            f"{r['length']}: {r['token_s']['median'] * 1e3:.2f} ms/token, cache {r['cache_mib']:.2f} MiB"
            for r in rows[-len(lengths):]))
    return rows


def growth_exponent(values: dict[int, float], start: int) -> float | None:
    """log(v(end) / v(begin)) / log(end / begin), from the shortest length >= `start` to the longest (1.0 = linear,
    2.0 = quadratic); None with fewer than two such lengths, or a value that is not positive."""
    lengths = sorted(length for length in values if length >= start)
    if len(lengths) < 2 or values[lengths[0]] <= 0 or values[lengths[-1]] <= 0:
        return None
    begin, end = lengths[0], lengths[-1]
    return math.log(values[end] / values[begin]) / math.log(end / begin)


def crossover(times: dict[int, float], full: dict[int, float]) -> dict:
    """Where a pattern becomes faster than full attention and stays so over the measured lengths: the length
    interpolated on log-log between the last point where it is not faster and the next; "below" the shortest
    length when it is faster everywhere, "not reached" when it is not faster at the longest."""
    lengths = sorted(times)
    ratios = [times[n] / full[n] for n in lengths]
    slower = [i for i, ratio in enumerate(ratios) if ratio >= 1]
    if not slower:
        return dict(length=None, text=f"below {lengths[0]}")
    last = slower[-1]
    if last == len(lengths) - 1:
        return dict(length=None, text="not reached")
    (n1, r1), (n2, r2) = (lengths[last], ratios[last]), (lengths[last + 1], ratios[last + 1])
    fraction = math.log(r1) / (math.log(r1) - math.log(r2))  # where log(ratio) crosses 0
    length = math.exp(math.log(n1) + fraction * (math.log(n2) - math.log(n1)))
    return dict(length=length, text=f"{length:.0f}")


def _medians(rows: list[dict], pattern: str, key: str) -> dict[int, float]:
    return {r["length"]: (r[key]["median"] if isinstance(r[key], dict) else r[key]) for r in rows
            if r["pattern"] == pattern}


GOAL_PATTERNS, GOAL_EXPONENT = ("local", "linear"), 1.2  # the goal


def summarize(results: dict) -> dict:
    """Per pattern: the growth exponents, the crossover with full attention, and whether the issue's goal holds
    (step time exponent <= 1.2 from `exponent_from` on, and faster than full attention at every length from there)."""
    start = results["settings"]["exponent_from"]
    train, memory, decode = results["training"], results["memory"], results["decoding"]
    full = _medians(train, "full", "step_s")
    summary = {}
    for pattern in PATTERNS:
        times = _medians(train, pattern, "step_s")
        entry = dict(
            step_time_exponent=growth_exponent(times, start),
            activation_exponent=growth_exponent(_medians(memory, pattern, "activation_mib"), start),
            peak_memory_exponent=growth_exponent(_medians(memory, pattern, "peak_mib"), start),
            decode_token_exponent=growth_exponent(_medians(decode, pattern, "token_s"), 0),
            decode_cache_exponent=growth_exponent(_medians(decode, pattern, "cache_mib"), 0),
        )
        if pattern != "full":
            entry["crossover"] = crossover(times, full)
            entry["faster_than_full_from_start"] = all(
                times[n] < full[n] for n in times if n >= start) and any(n >= start for n in times)
        if pattern in GOAL_PATTERNS:
            exponent = entry["step_time_exponent"]
            entry["goal_met"] = (exponent is not None and exponent <= GOAL_EXPONENT
                                 and entry["faster_than_full_from_start"])
        summary[pattern] = entry
    return summary


NOTES = [
    "Each contender sets both stacks' pattern; at the short target the decoder's self-attention costs little, so the "
    "training curves are the encoder's. Cross-attention is full in every contender.",
    "Full attention runs under sdpa; local and block-sparse under the backend in the settings (`pattern_attn`), "
    "which also runs their (full) cross-attention; linear attention computes the same formula under either.",
    "Peak memory: the process's peak during the step's forward and backward above its baseline (model, gradients "
    "and Adam state in place), in a fresh process per point; saved: the bytes autograd keeps for backward.",
    "Decoding: every pattern in transformers' loop with its own cache (full attention's lean loop is not used).",
]


def run_long_inputs(settings: Settings, log: Callable = print, command: str = "") -> dict:
    torch.set_num_threads(settings.threads)
    log(f"long inputs: {settings.size} width, batch 1, lengths {settings.lengths}, target {settings.target}, "
        f"{settings.threads} threads; local/block-sparse under {settings.pattern_attn}")
    results = dict(
        machine={**{k: v for k, v in machine_description(0.0).items() if k != "matmul_peak_gflops"},
                 "date": datetime.datetime.now().isoformat(timespec="seconds")},
        command=command, settings=dataclasses.asdict(settings), notes=NOTES,
        training=measure_training(settings, log),
        memory=measure_memory(settings, log),
        decoding=measure_decoding(settings, log),
    )
    results["summary"] = summarize(results)
    for pattern, entry in results["summary"].items():
        log(f"{pattern:<12} " + ", ".join(f"{key} {_fmt(value)}" for key, value in entry.items()))
    return results


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return value["text"]
    if isinstance(value, float):
        return f"{value:.2f}"
    return "-" if value is None else str(value)


def _stat_cell(stat: dict, scale: float, digits: int) -> str:
    return f"{stat['median'] * scale:.{digits}f} [{stat['low'] * scale:.{digits}f}-{stat['high'] * scale:.{digits}f}]"


def _grid(rows: list[dict], cell: Callable[[dict], str], first: str) -> list[str]:
    """A markdown table with one row per length and one column per pattern."""
    by_key = {(r["length"], r["pattern"]): r for r in rows}
    lengths = sorted({r["length"] for r in rows})
    lines = [f"| {first} | " + " | ".join(PATTERNS) + " |", "|---" * (len(PATTERNS) + 1) + "|"]
    for length in lengths:
        lines.append(f"| {length} | " + " | ".join(cell(by_key[length, p]) for p in PATTERNS) + " |")
    return lines


def markdown(results: dict) -> str:
    s, m = results["settings"], results["machine"]
    full = {r["length"]: r["step_s"]["median"] for r in results["training"] if r["pattern"] == "full"}

    def train_cell(r):
        ratio = "" if r["pattern"] == "full" else f", x{r['step_s']['median'] / full[r['length']]:.2f} of full"
        return f"{_stat_cell(r['step_s'], 1e3, 0)}{ratio} ({r['rounds']} r)"

    lines = [f"# Long inputs: the cost of each attention pattern", "",
             f"{m['cpu']}, {m['threads']} threads, torch {m['torch']}, {m['date']}.", "",
             f"Command: `{results['command']}`", "",
             f"{s['size']} width, batch 1; local window {s['attention_window']}, block-sparse blocks of "
             f"{s['sparse_block_size']} with {s['sparse_global_tokens']} global tokens; full attention under sdpa, "
             f"local and block-sparse under {s['pattern_attn']}.", "", *[f"- {note}" for note in results["notes"]],
             "", f"Training step (ms, median [min-max], rounds), source length x pattern, target {s['target']} "
             "tokens:", "", *_grid(results["training"], train_cell, "source"),
             "", "Memory of a training step (MiB): saved for backward / peak above baseline:", "",
             *_grid(results["memory"], lambda r: f"{r['activation_mib']:.0f} / {r['peak_mib']:.0f}", "source"),
             "", f"Decoding (greedy, source {s['decode_source']} tokens): ms per token over the last "
             f"{s['decode_window']} steps before each target length [min-max of {s['decode_rounds']} rounds]; "
             "self-attention cache MiB:", "",
             *_grid(results["decoding"], lambda r: f"{_stat_cell(r['token_s'], 1e3, 2)}; {r['cache_mib']:.2f} MiB",
                    "target"),
             "", f"Growth exponents from {s['exponent_from']} to {max(s['lengths'])} tokens (1 = linear, "
             f"2 = quadratic; decoding: over the target lengths), and where each pattern becomes faster than full "
             f"attention (goal for {', '.join(GOAL_PATTERNS)}: step time exponent <= {GOAL_EXPONENT} and faster than "
             f"full from {s['exponent_from']} on):", "",
             "| pattern | step time | saved | peak | decode per token | cache | faster than full from | goal met |",
             "|---|---|---|---|---|---|---|---|"]
    for pattern, e in results["summary"].items():
        lines.append(f"| {pattern} | {_fmt(e['step_time_exponent'])} | {_fmt(e['activation_exponent'])} | "
                     f"{_fmt(e['peak_memory_exponent'])} | {_fmt(e['decode_token_exponent'])} | "
                     f"{_fmt(e['decode_cache_exponent'])} | {_fmt(e.get('crossover'))} | "
                     f"{_fmt(e.get('goal_met'))} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Log-log: step time, memory, decoding time per token and cache memory, one line per pattern."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    panels = [
        (axes[0, 0], "training", [("step_s", "-", "", 1.0)], "source length", "training step (s)"),
        (axes[0, 1], "memory", [("activation_mib", "-", " saved", 1.0), ("peak_mib", "--", " peak", 1.0)],
         "source length", "memory of a training step (MiB)"),
        (axes[1, 0], "decoding", [("token_s", "-", "", 1e3)], "target length", "decoding (ms per token)"),
        (axes[1, 1], "decoding", [("cache_mib", "-", "", 1.0)], "target length", "self-attention cache (MiB)"),
    ]
    for axis, section, series, xlabel, ylabel in panels:
        for color, pattern in zip(("black", "tab:blue", "tab:orange", "tab:green"), PATTERNS):
            for key, style, suffix, scale in series:
                points = sorted(_medians(results[section], pattern, key).items())
                positive = [(n, v * scale) for n, v in points if v > 0]  # a log axis has no zero
                if positive:
                    axis.plot(*zip(*positive), style, marker="o", color=color, label=pattern + suffix)
        axis.set_xscale("log", base=2)
        lengths = sorted({r["length"] for r in results[section]})
        axis.set_xticks(lengths, [str(n) for n in lengths])
        axis.minorticks_off()
        axis.set_yscale("log")
        axis.set_xlabel(xlabel)
        axis.set_ylabel(ylabel)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    m = results["machine"]
    fig.suptitle(f"Attention patterns on long inputs, {results['settings']['size']} width, batch 1 "
                 f"({m['cpu']}, {m['threads']} threads)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(results: dict, output_dir: str | Path) -> list[Path]:
    """long_inputs_results.json, long_inputs_results.md and long_inputs.png in `output_dir`."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "long_inputs_results.json", out / "long_inputs_results.md", out / "long_inputs.png"]
    paths[0].write_text(json.dumps(results, indent=2) + "\n")
    paths[1].write_text(markdown(results))
    plot(results, paths[2])
    return paths


def parse_settings(argv=None) -> tuple[Settings, argparse.Namespace]:
    default = Settings()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=default.lengths, help="source lengths")
    parser.add_argument("--target", type=int, default=default.target, help="target tokens of the training batch")
    parser.add_argument("--rounds", type=int, nargs="+", default=default.rounds,
                        help="rounds at each length, shortest first (the last value serves the longer ones)")
    parser.add_argument("--attention_window", type=int, default=default.attention_window)
    parser.add_argument("--sparse_block_size", type=int, default=default.sparse_block_size)
    parser.add_argument("--sparse_global_tokens", type=int, default=default.sparse_global_tokens)
    parser.add_argument("--pattern_attn", choices=["eager", "sdpa"], default=default.pattern_attn,
                        help="the attention implementation of the local and block-sparse contenders (sdpa: the "
                        "faster of the two in the quick measurements made when choosing)")
    parser.add_argument("--decode_lengths", type=int, nargs="+", default=default.decode_lengths)
    parser.add_argument("--decode_source", type=int, default=default.decode_source)
    parser.add_argument("--decode_window", type=int, default=default.decode_window,
                        help="steps averaged for the time per token at each target length")
    parser.add_argument("--decode_rounds", type=int, default=default.decode_rounds)
    parser.add_argument("--exponent_from", type=int, default=default.exponent_from,
                        help="growth exponents from this length to the longest")
    parser.add_argument("--threads", type=int, default=default.threads)
    parser.add_argument("--output_dir", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--quick", action="store_true", help="tiny sizes and lengths, one round: checks, not speed")
    args = parser.parse_args(argv)
    fields = {f.name for f in dataclasses.fields(Settings)}
    settings = Settings(**{k: v for k, v in vars(args).items() if k in fields and k != "size"})
    if args.quick:
        settings = dataclasses.replace(settings, **QUICK)
    return settings, args


def main(argv=None):
    settings, args = parse_settings(argv)
    command = shlex.join(["python", "benchmarks/long_inputs.py", *(sys.argv[1:] if argv is None else argv)])
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)  # a bad path fails now, not after the measuring
    results = run_long_inputs(settings, command=command)
    for path in write_outputs(results, args.output_dir):
        print(f"wrote {path}")
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
