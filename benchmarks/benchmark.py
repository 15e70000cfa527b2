"""vaswani against transformers' MarianMTModel, side by side in one process, on identical weights; and the gain of
each of vaswani's fast paths.

    python benchmarks/benchmark.py                   # g2p and base sizes; writes benchmarks/results.{json,md,png}
    python benchmarks/benchmark.py --sizes g2p --rounds 7
    python benchmarks/benchmark.py --fast_paths      # also each fast path on against off (names after the flag: those)
    python benchmarks/benchmark.py --quick           # a tiny run that checks the bookkeeping (used by the tests)
    python benchmarks/benchmark.py --long_inputs     # the attention patterns' cost curves (benchmarks/long_inputs.py)

Each comparison alternates the two contenders round by round (A, B, A, B, ...) so that a noisy, shared machine slows
both alike, and reports medians with min-max, and the median (min-max) of the per-round ratios: each round's two
measurements are taken seconds apart, so their ratio cancels what slows both alike. A comparison whose rounds spread
more than `NOISY_SPREAD` (the machine was busy during some) is measured again with as many rounds, and its
statistics are taken over all of them. Sizes (from the performance issue):
- "g2p": d_model 256, 3+3 layers, 4 heads, FFN 1024, vocab 128, batch 256, source 12 / target 10 tokens;
- "base": the paper's base model with vocab 8000, batch 16, source 64 / target 64 tokens.

Measured: training tokens/s (forward + backward + fused Adam step; padded and unpadded; eager and sdpa; dropout 0
and 0.1), generation tokens/s (64 sentences, 32 new tokens, greedy and beam 5; outputs asserted identical),
activation memory of forward + backward against source length (batch 1), the fp32 matmul peak of this machine and
the model's achieved FLOP/s as a fraction of it (MFU), and the ideal time of a training step and of each generate
call if every GEMM in it ran at its own measured rate (on the faster of MKL and oneDNN for that shape) and nothing
else took any time: Marian's measured time over that ideal is the most any implementation doing the same FLOPs
could gain over Marian on this machine (the "ceiling"). Each training row also gives each contender's share of the
ceiling (the ideal step over its measured step) and the split of its step's self CPU time: GEMM / attention /
other (torch.profiler).

Marian is built with random weights (and a non-zero final logits bias) and converted with `convert_marian`, so
both models compute the same function; vaswani runs as a user gets it by default (`VaswaniForConditionalGeneration`
as loaded, with its default fast paths, no option set), and both train with the same optimizer, torch's fused Adam
(what `Trainer`'s default `adamw_torch_fused` and our training loop use).

The fast paths section (`--fast_paths`) times vaswani against vaswani, alternating in the same way: for each name
in `vaswani.fast_paths_vaswani.FAST_PATHS`, all fast paths on against all on except that one, and all on against
all off; on a training step (sdpa, padded) and greedy and beam-5 generate at each size. Its gain is the time without
over the time with.

This is not library code: nothing in the package imports it, and it is not installed with it.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import GenerationConfig, MarianConfig, MarianMTModel

from vaswani import VaswaniForConditionalGeneration
from vaswani.training.convert_marian import marian_config_to_vaswani, marian_state_dict_to_vaswani

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measurement import (  # noqa: E402  (the measuring shared with long_inputs.py)
    NOISY_SPREAD,
    SIZES,
    Stat,
    _measure,
    _paired,
    activation_bytes,
    machine_description,
    spread,
)

PAD, EOS, START = 0, 2, 0
SENTENCES, NEW_TOKENS = 64, 32  # generation: sentences per call, new tokens per sentence
GENERATION_TOKENS = SENTENCES * NEW_TOKENS


def log_line(line: str) -> None:
    """Prints one measured row at once, also when the output goes to a pipe or a file (block-buffered there)."""
    print(line, flush=True)


def write_atomically(path: Path, text: str) -> None:
    """Writes `text` to `path` through a temporary file in the same folder: an interrupted write leaves the old file
    or the new one, never a part of one."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(temporary, 0o644)  # mkstemp makes it private; the results are for anyone to read, like write_text's
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's linear (the kernel the ceilings also time, besides MKL)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@dataclass
class Comparison:
    """One measurement of both contenders: values are rates (higher is better) unless `unit` says seconds."""

    name: str
    unit: str
    marian: Stat
    vaswani: Stat
    round_ratios: Stat  # vaswani / Marian within each round
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(cls, name: str, unit: str, rates: dict[str, list[float]], **extra) -> "Comparison":
        *stats, rounds = _paired(rates["marian"], rates["vaswani"])
        return cls(name, unit, *stats, {"rounds": rounds, **extra})

    @property
    def ratio(self) -> float:
        return self.vaswani.median / self.marian.median


def build_pair(size: str, dropout: float = 0.1, seed: int = 0) -> tuple[MarianMTModel, VaswaniForConditionalGeneration]:
    """A random MarianMTModel and the vaswani model converted from it (same weights, same function)."""
    s = SIZES[size]
    torch.manual_seed(seed)
    marian_config = MarianConfig(
        vocab_size=s["vocab"], decoder_vocab_size=s["vocab"], d_model=s["d_model"],
        encoder_layers=s["layers"], decoder_layers=s["layers"],
        encoder_attention_heads=s["heads"], decoder_attention_heads=s["heads"],
        encoder_ffn_dim=s["ffn"], decoder_ffn_dim=s["ffn"], activation_function="relu",
        dropout=dropout, attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True,
        max_position_embeddings=4096 + 64, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=START,
        forced_eos_token_id=None, bos_token_id=None,
    )
    marian = MarianMTModel(marian_config)
    with torch.no_grad():
        marian.final_logits_bias.normal_(0, 0.5)
    vaswani = VaswaniForConditionalGeneration(marian_config_to_vaswani(marian_config))
    vaswani.load_state_dict(marian_state_dict_to_vaswani(marian.state_dict(), marian_config), strict=True)
    return marian, vaswani


def make_batch(size: str, padded: bool, seed: int = 0) -> dict:
    s = SIZES[size]
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, s["vocab"], (s["batch"], s["source"]), generator=g)
    labels = torch.randint(3, s["vocab"], (s["batch"], s["target"]), generator=g)
    attention_mask = torch.ones_like(input_ids)
    decoder_attention_mask = torch.ones_like(labels)
    if padded:  # lengths from half to full, independently on both sides
        for row in range(1, s["batch"]):
            attention_mask[row, int(torch.randint(s["source"] // 2, s["source"] + 1, (), generator=g)):] = 0
            decoder_attention_mask[row, int(torch.randint(s["target"] // 2, s["target"] + 1, (), generator=g)):] = 0
    return dict(
        input_ids=input_ids.masked_fill(attention_mask == 0, PAD),
        attention_mask=attention_mask,
        labels=labels.masked_fill(decoder_attention_mask == 0, -100),
        decoder_attention_mask=decoder_attention_mask,
    )


def _step_tokens(batch: dict) -> int:
    """The real (unpadded) source and target tokens of a batch: what the training rates count."""
    return int(batch["attention_mask"].sum() + batch["decoder_attention_mask"].sum())


def _train_step_fn(model, batch: dict, steps: int) -> Callable[[], float]:
    # torch's fused Adam, for both: what Trainer (`adamw_torch_fused`, its default since torch 2.8) and our training
    # loop (`make_optimizer`) use, where torch's plain default is a Python loop over the parameters
    fused = True if next(model.parameters()).device.type in ("cpu", "cuda") else None
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5, betas=(0.9, 0.98), eps=1e-9, fused=fused)
    model.train()
    tokens = _step_tokens(batch)

    def one_step():
        optimizer.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        optimizer.step()

    one_step()  # warm-up (allocations, lazy inits, compilation)
    one_step()

    def run() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            one_step()
        return tokens * steps / (time.perf_counter() - start)

    return run


def _training_name(size: str, attn: str, padded: bool, dropout: float) -> str:
    return f"train {size} {attn} {'padded' if padded else 'unpadded'} dropout {dropout:g}"


# oneDNN's: the inner product (the `onednn_linear` path's forward and input gradient) and its backward-weights
# primitive (the path's weight gradient, with the bias's column sums in the same pass)
GEMM_OPS = {"aten::mm", "aten::addmm", "mkldnn::_linear_pointwise", "aten::mkldnn_linear_backward_weights"}
ATTENTION_OPS = {"aten::bmm", "aten::baddbmm", "aten::softmax", "aten::_softmax", "aten::_softmax_backward_data",
                 "aten::masked_fill", "aten::masked_fill_"}


def op_category(name: str) -> str:
    """"gemm", "attention" or "other" for a profiler op name. Self times: aten::linear and aten::matmul count
    through the mm/addmm/bmm they call; log_softmax is the loss's, not attention's; autograd's node names
    (`SoftmaxBackward0`) hold only their own overhead, which is "other"."""
    if name in GEMM_OPS:
        return "gemm"
    if name in ATTENTION_OPS or name.startswith(("aten::_scaled_dot_product", "aten::scaled_dot_product")) or (
            name.startswith("aten::") and "flash_attention" in name):
        return "attention"
    return "other"


def step_time_split(model, batch: dict, steps: int = 2) -> dict:
    """Fractions of a training step's self CPU time (forward, backward, optimizer step, as `_train_step_fn` runs
    them) spent in GEMMs, in attention and in everything else (`op_category`), from torch.profiler over `steps`
    steps after one unprofiled; they sum to 1. `total_s` is the profiled self CPU time per step."""
    from torch.profiler import ProfilerActivity, profile

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5, betas=(0.9, 0.98), eps=1e-9,
                                 fused=True if next(model.parameters()).device.type in ("cpu", "cuda") else None)
    model.train()

    def one_step():
        optimizer.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        optimizer.step()

    one_step()  # unprofiled: the new optimizer allocates its state here
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            one_step()
    times = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for event in prof.key_averages():
        times[op_category(event.key)] += event.self_cpu_time_total
    total = sum(times.values())
    return {**{key: value / total for key, value in times.items()}, "total_s": total / 1e6 / steps}


def compare_training(size: str, attn: str, padded: bool, rounds: int, steps: int,
                     prepare_vaswani: Callable | None = None, dropout: float = 0.1) -> Comparison:
    """Training tokens/s of both contenders, then the time split of each one's step (`step_time_split`)."""
    marian, vaswani = build_pair(size, dropout=dropout)
    for model in (marian, vaswani):
        model.set_attn_implementation(attn)
    if prepare_vaswani is not None:
        vaswani = prepare_vaswani(vaswani)
    batch = make_batch(size, padded)
    rates = _measure(
        {"marian": _train_step_fn(marian, batch, steps), "vaswani": _train_step_fn(vaswani, batch, steps)}, rounds
    )
    # after the timing, so that the profiler does not disturb it
    split = {"marian": step_time_split(marian, batch), "vaswani": step_time_split(vaswani, batch)}
    return Comparison.of(_training_name(size, attn, padded, dropout), "tokens/s", rates, split=split)


def _generation_inputs(size: str, sentences: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Source ids and mask for one `generate` call: lengths from half to full."""
    s = SIZES[size]
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, s["vocab"], (sentences, s["source"]), generator=g)
    attention_mask = torch.ones_like(input_ids)
    for row in range(1, sentences):
        attention_mask[row, int(torch.randint(s["source"] // 2, s["source"] + 1, (), generator=g)):] = 0
    return input_ids.masked_fill(attention_mask == 0, PAD), attention_mask


def _generate_fn(model, attn: str, num_beams: int, size: str, sentences: int, new_tokens: int,
                 outputs: dict, name: str) -> Callable[[], float]:
    """A timed `generate` call (tokens/s) that stores its output in `outputs[name]`, warmed up once."""
    input_ids, attention_mask = _generation_inputs(size, sentences)
    config = GenerationConfig(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, num_beams=num_beams, do_sample=False,
        decoder_start_token_id=START, pad_token_id=PAD, eos_token_id=EOS,
    )
    model.eval().set_attn_implementation(attn)

    def run() -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            outputs[name] = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
        return sentences * new_tokens / (time.perf_counter() - start)

    run()  # warm-up
    return run


def _generation_name(size: str, attn: str, num_beams: int) -> str:
    return f"generate {size} {attn} {'greedy' if num_beams == 1 else f'beam {num_beams}'}"


def compare_generation(size: str, attn: str, num_beams: int, rounds: int, sentences: int = SENTENCES,
                       new_tokens: int = NEW_TOKENS) -> Comparison:
    marian, vaswani = build_pair(size, dropout=0.0)
    outputs = {}
    rates = _measure({name: _generate_fn(model, attn, num_beams, size, sentences, new_tokens, outputs, name)
                      for name, model in (("marian", marian), ("vaswani", vaswani))}, rounds)
    same = torch.equal(outputs["marian"], outputs["vaswani"])
    if not same:
        raise AssertionError(f"generation differs between Marian and vaswani ({size}, {attn}, beams {num_beams})")
    return Comparison.of(_generation_name(size, attn, num_beams), "tokens/s", rates, identical_outputs=same)


def compare_memory(size: str, lengths: list[int]) -> list[dict]:
    """Activation memory (MiB) of forward + backward, batch 1, source of each length, target 32 tokens."""
    marian, vaswani = build_pair(size, dropout=0.0)
    vocab = SIZES[size]["vocab"]
    rows = []
    for attn in ("eager", "sdpa"):
        for model in (marian, vaswani):
            model.set_attn_implementation(attn)
        for length in lengths:
            batch = dict(input_ids=torch.randint(3, vocab, (1, length)), labels=torch.randint(3, vocab, (1, 32)))
            rows.append(dict(attn=attn, source_length=length,
                             marian_mib=activation_bytes(marian, batch) / 2**20,
                             vaswani_mib=activation_bytes(vaswani, batch) / 2**20))
    return rows


def growth_exponent(rows: list[dict], attn: str, key: str) -> float | None:
    """log2 of the memory ratio over the last doubling of source length (1.0 = linear, 2.0 = quadratic); None with
    fewer than two lengths (`--memory_lengths 512`)."""
    picked = sorted((r["source_length"], r[key]) for r in rows if r["attn"] == attn)
    if len(picked) < 2:
        return None
    (n1, m1), (n2, m2) = picked[-2], picked[-1]
    return math.log(m2 / m1) / math.log(n2 / n1)


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """The best fp32 rate of an n x n x n product on MKL (`a @ b`) or oneDNN, whichever is faster here."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    kernels = [lambda: a @ b]
    if onednn_available():
        kernels.append(lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""))
    best = 0.0
    for kernel in kernels:
        kernel()
        for _ in range(repeats):
            best = max(best, 2 * n**3 / _timed(kernel) / 1e9)
    return best


def _linear_shapes(size: str) -> list[tuple[int, int, int, int]]:
    """(rows, in, out, count) of every Linear of one training step's forward (unpadded batch)."""
    s = SIZES[size]
    src, tgt, d, f = s["batch"] * s["source"], s["batch"] * s["target"], s["d_model"], s["ffn"]
    return [
        (src, d, d, 4 * s["layers"]),  # encoder q, k, v, o
        (src, d, f, s["layers"]), (src, f, d, s["layers"]),  # encoder FFN
        (tgt, d, d, 4 * s["layers"]),  # decoder self q, k, v, o
        (tgt, d, d, 2 * s["layers"]), (src, d, d, 2 * s["layers"]),  # cross q, o (target) and k, v (source)
        (tgt, d, f, s["layers"]), (tgt, f, d, s["layers"]),  # decoder FFN
        (tgt, d, s["vocab"], 1),  # output projection
    ]


def step_flops(size: str) -> float:
    """FLOPs of one training step: 3x the forward's GEMMs (forward, and two for backward) plus attention."""
    s = SIZES[size]
    gemm = sum(2 * m * k * n * c for m, k, n, c in _linear_shapes(size))
    d, b, S, T, L = s["d_model"], s["batch"], s["source"], s["target"], s["layers"]
    attention = 2 * 2 * b * d * L * (S * S + T * T + T * S)  # scores and weighted sum, per stack
    return 3 * (gemm + attention)


def ideal_step_seconds(size: str, repeats: int = 3) -> float:
    """The step's GEMMs (forward, input-gradient and weight-gradient shapes) each timed at its own rate, on the faster
    of MKL (`a @ b`) and oneDNN (the kernel vaswani's linear layers use where it applies)."""
    total = 0.0
    for m, k, n, count in _linear_shapes(size):
        for shape in ((m, k, n), (m, n, k), (k, m, n)):  # y = x W^T; dx = dy W; dW = dy^T x
            a, b = torch.randn(shape[0], shape[1]), torch.randn(shape[1], shape[2])
            kernels = [lambda: a @ b]
            if onednn_available():
                kernels.append(lambda: torch.ops.mkldnn._linear_pointwise(a, b.t(), None, "none", [], ""))
            for kernel in kernels:
                kernel()
            best = min(_timed(kernel) for kernel in kernels for _ in range(repeats))
            total += best * count
    return total


def _generation_linear_shapes(size: str, num_beams: int, sentences: int = SENTENCES, new_tokens: int = NEW_TOKENS,
                              cross_per_source: bool = False) -> list[tuple[int, int, int, int]]:
    """(rows, in, out, count) of every Linear of one `generate` call as `compare_generation` makes it: the encoder
    once over the sentences, the cross-attention keys and values once over the beams' copies of the encoder output
    (Marian; `cross_per_source`: once over the sentences, as vaswani's lean beam search does), then each decoding
    step's layers and output projection at one row per hypothesis. The ceiling is computed with Marian's shapes."""
    s = SIZES[size]
    d, f, layers = s["d_model"], s["ffn"], s["layers"]
    source_rows, hypotheses = sentences * s["source"], sentences * num_beams
    return [
        (source_rows, d, d, 4 * layers),  # encoder q, k, v, o
        (source_rows, d, f, layers), (source_rows, f, d, layers),  # encoder FFN
        (source_rows * (1 if cross_per_source else num_beams), d, d, 2 * layers),  # cross k, v (once, then cached)
        (hypotheses, d, d, 6 * layers * new_tokens),  # per step: self q, k, v, o and cross q, o
        (hypotheses, d, f, layers * new_tokens), (hypotheses, f, d, layers * new_tokens),  # per step: FFN
        (hypotheses, d, s["vocab"], new_tokens),  # per step: output projection
    ]


def ideal_generation_seconds(size: str, num_beams: int, sentences: int = SENTENCES, new_tokens: int = NEW_TOKENS,
                             repeats: int = 3) -> float:
    """A `generate` call's GEMMs alone, each shape timed at its own rate on the faster of MKL (`F.linear`) and oneDNN
    with a pre-packed weight (what vaswani's decoding loops use where it applies): the time no implementation doing
    the same FLOPs could beat on this machine. Attention over the cache, norms, the search's bookkeeping and Python
    all come on top."""
    total = 0.0
    for m, k, n, count in _generation_linear_shapes(size, num_beams, sentences, new_tokens):
        x, weight, bias = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
        inner = max(1, int(5e7 // (2 * m * k * n)))  # small GEMMs timed in loops of a few milliseconds
        kernels = [lambda: torch.nn.functional.linear(x, weight, bias)]
        if onednn_available():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, m)
            kernels.append(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], ""))
        seconds = []
        for kernel in kernels:
            def loop():
                for _ in range(inner):
                    kernel()

            loop()
            seconds += [_timed(loop) for _ in range(repeats)]
        total += min(seconds) / inner * count
    return total


def _timed(fn: Callable) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# The fast paths: vaswani against vaswani, all fast paths on against one (or all) of them off.

ALL_FAST_PATHS = "all fast paths"  # the last row: all on against all off
FAST_PATH_TRAINING_ATTN = "sdpa"  # the attention a user gets by default, on padded batches as the loop makes them
FAST_PATH_CONTENDERS = ("off", "on")


def fast_path_names() -> tuple[str, ...]:
    """The names `model.set_fast_paths` switches (`vaswani.fast_paths_vaswani.FAST_PATHS`)."""
    try:
        from vaswani.fast_paths_vaswani import FAST_PATHS
    except ImportError as error:
        raise ImportError("the fast paths section needs `vaswani.fast_paths_vaswani.FAST_PATHS` "
                          "(modeling/fast_paths_vaswani.py), which this vaswani lacks: run without --fast_paths"
                          ) from error
    return tuple(FAST_PATHS)


def fast_path_rows(names: list[str] | None = None) -> list[tuple[str, dict[str, bool], dict[str, bool]]]:
    """(row, setting on, setting off) for each of `names` (all of `FAST_PATHS` when empty or None): all on against
    all on but that one; then, where there are several, all on against all off."""
    every = fast_path_names()
    unknown = [name for name in names or () if name not in every]
    if unknown:
        raise ValueError(f"unknown fast path(s) {unknown}; the fast paths are {list(every)}")
    on = dict.fromkeys(every, True)
    rows = [(name, on, {**on, name: False}) for name in names or every]
    if len(every) == 1:  # all off is the one path off: the same row again
        return rows
    return rows + [(ALL_FAST_PATHS, on, dict.fromkeys(every, False))]


@dataclass
class Gain:
    """One workload timed with the fast paths of `on` and of `off`; rates in tokens/s."""

    path: str
    workload: str
    off: Stat
    on: Stat
    round_ratios: Stat  # on / off within each round
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(cls, path: str, workload: str, rates: dict[str, list[float]], **extra) -> "Gain":
        *stats, rounds = _paired(rates["off"], rates["on"])
        return cls(path, workload, *stats, {"rounds": rounds, **extra})

    @property
    def gain(self) -> float:
        """Time without over time with (the ratio of the rates' medians)."""
        return self.on.median / self.off.median

    def as_dict(self) -> dict:
        return dict(name=self.workload, unit="tokens/s", gain=self.gain, off=self.off.__dict__, on=self.on.__dict__,
                    round_ratio=self.round_ratios.__dict__, **self.extra)


def _switched(model, setting: dict[str, bool], make_run: Callable, name: str) -> Callable[[], float]:
    """`make_run(model, name)` (which warms up) with `setting` switched on `model`; each call checks that it held."""
    model.set_fast_paths(setting)
    run = make_run(model, name)

    def checked() -> float:
        if model.fast_paths != setting:
            raise RuntimeError(f"the fast paths changed during the benchmark: {model.fast_paths} instead of {setting}")
        return run()

    return checked


def compare_fast_paths(model, on: dict[str, bool], off: dict[str, bool], rounds: int,
                       make_run: Callable) -> dict[str, list[float]]:
    """Alternating rounds of two copies of `model`, "off" with the setting `off` and "on" with `on`, each timing
    `make_run(copy, its name)`."""
    return _measure({name: _switched(copy.deepcopy(model), setting, make_run, name)
                     for name, setting in (("off", off), ("on", on))}, rounds)


def run_fast_paths(sizes: list[str], names: list[str] | None, rounds: int, steps: int, generation_rounds: int,
                   log: Callable = log_line) -> dict:
    """The gain of each fast path (and of all of them) on a training step and on greedy and beam-5 generate."""
    rows = fast_path_rows(names)
    gains: list[Gain] = []
    as_loaded = None
    for size in sizes:
        trained, generating = build_pair(size)[1], build_pair(size, dropout=0.0)[1]
        as_loaded = dict(trained.fast_paths)
        trained.set_attn_implementation(FAST_PATH_TRAINING_ATTN)
        batch = make_batch(size, padded=True)
        workload = f"train {size} {FAST_PATH_TRAINING_ATTN} padded"
        for path, on, off in rows:
            rates = compare_fast_paths(trained, on, off, rounds, lambda model, _: _train_step_fn(model, batch, steps))
            gains.append(Gain.of(path, workload, rates))
            log(format_gain(gains[-1]))
        for beams in (1, 5):
            workload = _generation_name(size, "sdpa", beams)
            for path, on, off in rows:
                outputs = {}
                rates = compare_fast_paths(generating, on, off, generation_rounds, lambda model, name: _generate_fn(
                    model, "sdpa", beams, size, SENTENCES, NEW_TOKENS, outputs, name))
                gains.append(Gain.of(path, workload, rates,
                                     identical_outputs=torch.equal(outputs["off"], outputs["on"])))
                log(format_gain(gains[-1]))
    return {
        "as_loaded": as_loaded,
        "paths": [dict(path=path, switched_off=[name for name, value in off.items() if not value],
                       workloads=[g.as_dict() for g in gains if g.path == path])
                  for path, _, off in rows],
    }


def _comparison_dict(c: Comparison) -> dict:
    return dict(name=c.name, unit=c.unit, ratio=c.ratio, marian=c.marian.__dict__, vaswani=c.vaswani.__dict__,
                round_ratio=c.round_ratios.__dict__, **c.extra)


def generation_row(size: str, beams: int, rounds: int, efficiency: dict, log: Callable = log_line) -> Comparison:
    """Greedy (beams 1) or beam search against Marian, logged; its ceiling goes into `efficiency` (the size's)."""
    c = compare_generation(size, "sdpa", beams, rounds)
    log(format_row(c))
    seconds = GENERATION_TOKENS / c.marian.median, GENERATION_TOKENS / c.vaswani.median
    ideal = ideal_generation_seconds(size, beams)
    key = "greedy" if beams == 1 else f"beam{beams}"
    efficiency[f"generate_{key}"] = {"ideal_s_at_own_gemm_rates": ideal, "marian_s": seconds[0],
                                     "vaswani_s": seconds[1], "ceiling_over_marian": seconds[0] / ideal}
    log(f"{size} generate {key}: GEMMs alone at their own rates {ideal:.3f} s, Marian {seconds[0]:.3f} s: "
        f"a same-FLOP implementation could be at most x{seconds[0] / ideal:.2f} Marian")
    return c


def run_benchmark(sizes: list[str], rounds: int, steps: int, generation_rounds: int, memory_lengths: list[int],
                  memory_size: str, prepare_vaswani: Callable | None = None, log: Callable = log_line,
                  fast_paths: list[str] | None = None, output_dir: str | Path | None = None) -> dict:
    """The comparisons with Marian, the ceilings, the memory rows; and with `fast_paths` (a list of names, empty for
    all), the fast paths section. With `output_dir` (created first), results.json there holds what is measured so
    far after each size and after the memory rows, so that an interrupted run keeps them."""
    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)  # a bad path fails now, not after the measuring
    if fast_paths is not None:
        fast_path_rows(fast_paths)  # a missing module or an unknown name fails now, not after the comparisons
    peak_size = 512 if "quick" in sizes else 2048
    peaks = [matmul_peak_gflops(peak_size)]  # measured again at the end: a busy moment must not set the peak
    log(f"fp32 matmul peak: {peaks[0]:.1f} GFLOP/s on {torch.get_num_threads()} threads")
    comparisons: list[Comparison] = []
    efficiency = {}

    def save_so_far(**sections) -> None:
        if output_dir is not None:
            so_far = {"machine": {**machine_description(max(peaks)), "matmul_peak_gflops_start_end": peaks},
                      "comparisons": [_comparison_dict(c) for c in comparisons], "efficiency": efficiency, **sections}
            write_atomically(Path(output_dir) / "results.json", json.dumps(so_far, indent=2) + "\n")

    for size in sizes:
        flops = step_flops(size)
        tokens = SIZES[size]["batch"] * (SIZES[size]["source"] + SIZES[size]["target"])
        # the unpadded shapes; a padded row computes on the same padded tensors, so the same GEMMs are its ceiling
        ideal = ideal_step_seconds(size)
        for dropout in (0.0, 0.1):
            for attn in ("eager", "sdpa"):
                for padded in (False, True):
                    c = compare_training(size, attn, padded, rounds, steps, prepare_vaswani, dropout=dropout)
                    counted = _step_tokens(make_batch(size, padded))  # the tokens the rates count: real ones only
                    c.extra["ceiling_share"] = {  # the step's GEMMs alone over the step: 1 is the ceiling
                        who: ideal / (counted / getattr(c, who).median) for who in ("marian", "vaswani")}
                    comparisons.append(c)
                    log(format_row(c))
        unpadded_sdpa = next(c for c in comparisons if c.name == _training_name(size, "sdpa", False, 0.1))
        marian_step, vaswani_step = tokens / unpadded_sdpa.marian.median, tokens / unpadded_sdpa.vaswani.median
        efficiency[size] = {
            "step_gflop": flops / 1e9,
            "ideal_step_s_at_own_gemm_rates": ideal,
            "marian_step_s": marian_step,
            "vaswani_step_s": vaswani_step,
            "training_ceiling_over_marian": marian_step / ideal,
        }
        log(f"{size}: ideal step at own GEMM rates {ideal * 1e3:.0f} ms, Marian {marian_step * 1e3:.0f} ms: "
            f"a same-FLOP implementation could be at most x{marian_step / ideal:.2f} Marian")
        for beams in (1, 5):
            comparisons.append(generation_row(size, beams, generation_rounds, efficiency[size], log))
        save_so_far()
    peaks.append(matmul_peak_gflops(peak_size))
    peak = max(peaks)
    log(f"fp32 matmul peak: {peaks[1]:.1f} GFLOP/s at the end; the higher, {peak:.1f}, is the peak")
    for size, e in efficiency.items():
        for who in ("marian", "vaswani"):
            e[f"{who}_mfu"] = e["step_gflop"] / e[f"{who}_step_s"] / peak  # GFLOP/s over GFLOP/s
        log(f"{size}: MFU (sdpa, unpadded) Marian {e['marian_mfu']:.0%}, vaswani {e['vaswani_mfu']:.0%}")
    memory = compare_memory(memory_size, memory_lengths)
    for attn in ("eager", "sdpa"):
        log(f"memory {memory_size} {attn}: " + ", ".join(
            f"{r['source_length']}: Marian {r['marian_mib']:.0f} / vaswani {r['vaswani_mib']:.0f} MiB"
            for r in memory if r["attn"] == attn))
    save_so_far(memory=memory)
    results = {
        "machine": {**machine_description(peak), "matmul_peak_gflops_start_end": peaks},
        "comparisons": [_comparison_dict(c) for c in comparisons],
        "efficiency": efficiency,
        "memory": memory,
        "memory_growth_exponent": {
            f"{attn}_{who}": growth_exponent(memory, attn, f"{who}_mib")
            for attn in ("eager", "sdpa") for who in ("marian", "vaswani")
        },
    }
    if fast_paths is not None:
        results["fast_paths"] = run_fast_paths(sizes, fast_paths, rounds, steps, generation_rounds, log)
    return results


def _spread_note(comparison: dict, contenders: tuple[str, str] = ("marian", "vaswani")) -> str:
    s = spread(comparison, contenders)
    return f"{s:.0%}" + (" (noisy: rerun)" if s > NOISY_SPREAD else "")


def _round_ratio_note(comparison: dict) -> str:
    r = comparison.get("round_ratio")
    return "-" if r is None else f"{r['median']:.2f} [{r['low']:.2f}-{r['high']:.2f}] of {comparison['rounds']}"


def format_row(c: Comparison) -> str:
    as_dict = dict(marian=c.marian.__dict__, vaswani=c.vaswani.__dict__, round_ratio=c.round_ratios.__dict__,
                   rounds=c.extra["rounds"])
    return (f"{c.name:<40} Marian {c.marian.median:>9.0f} [{c.marian.low:.0f}-{c.marian.high:.0f}]  "
            f"vaswani {c.vaswani.median:>9.0f} [{c.vaswani.low:.0f}-{c.vaswani.high:.0f}] {c.unit}  "
            f"x{c.ratio:.2f}  per round x{_round_ratio_note(as_dict)}  spread {_spread_note(as_dict)}"
            + "".join(f"\n    {note}" for note in (_ceiling_note(c.extra), _split_note(c.extra)) if note))


def _ceiling_note(extra: dict) -> str:
    share = extra.get("ceiling_share")
    return "" if share is None else f"ceiling share: marian {share['marian']:.0%}, vaswani {share['vaswani']:.0%}"


def _split_note(extra: dict) -> str:
    split = extra.get("split")
    if split is None:
        return ""
    return "; ".join(f"{who} split GEMM {s['gemm']:.0%} / attention {s['attention']:.0%} / other {s['other']:.0%}"
                     for who, s in split.items())


def format_gain(g: Gain) -> str:
    entry = g.as_dict()
    return (f"{g.path:<24} {g.workload:<28} off {g.off.median:>9.0f} [{g.off.low:.0f}-{g.off.high:.0f}]  "
            f"on {g.on.median:>9.0f} [{g.on.low:.0f}-{g.on.high:.0f}] tokens/s  gain x{g.gain:.2f}  "
            f"per round x{_round_ratio_note(entry)}  spread {_spread_note(entry, FAST_PATH_CONTENDERS)}")


def _gain_cell(entry: dict) -> str:
    """Gain (per round: median [min-max]), marked when the rounds spread too much or the outputs differ."""
    r = entry["round_ratio"]
    cell = f"{entry['gain']:.2f} (per round {r['median']:.2f} [{r['low']:.2f}-{r['high']:.2f}])"
    if spread(entry, FAST_PATH_CONTENDERS) > NOISY_SPREAD:
        cell += " noisy"
    if entry.get("identical_outputs") is False:
        cell += " outputs differ"
    return cell


def fast_path_table(section: dict) -> list[str]:
    """The fast paths section as markdown: one row per path, one column per workload."""
    workloads = list(dict.fromkeys(w["name"] for row in section["paths"] for w in row["workloads"]))
    lines = ["Fast paths: gain = time without / time with, from the medians of the rounds (per round: median [min-max] "
             "of each round's ratio); each row is all fast paths on against all on but that one, the last all on "
             f"against all off; noisy: rounds spread more than {NOISY_SPREAD:.0%}, rerun.", "",
             "| fast path | " + " | ".join(workloads) + " |", "|---" * (len(workloads) + 1) + "|"]
    for row in section["paths"]:
        cells = {w["name"]: _gain_cell(w) for w in row["workloads"]}
        lines.append(f"| {row['path']} | " + " | ".join(cells.get(name, "-") for name in workloads) + " |")
    return lines


def write_outputs(results: dict, output_dir: str | Path) -> list[Path]:
    """results.json, a markdown table and a PNG plot (ratios, and memory against source length)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "results.json", json.dumps(results, indent=2) + "\n")
    lines = ["| measurement | Marian | vaswani | vaswani / Marian | per round: median [min-max] of rounds | spread |",
             "|---|---|---|---|---|---|"]
    for c in results["comparisons"]:
        m, v = c["marian"], c["vaswani"]
        lines.append(f"| {c['name']} ({c['unit']}) | {m['median']:.0f} [{m['low']:.0f}-{m['high']:.0f}] | "
                     f"{v['median']:.0f} [{v['low']:.0f}-{v['high']:.0f}] | {c['ratio']:.2f} | "
                     f"{_round_ratio_note(c)} | {_spread_note(c)} |")
    ceilings = [(f"train {size} sdpa unpadded dropout 0.1 (step)", e["ideal_step_s_at_own_gemm_rates"],
                 e["marian_step_s"], e["vaswani_step_s"]) for size, e in results.get("efficiency", {}).items()]
    ceilings += [(f"generate {size} sdpa {key} (call)", g["ideal_s_at_own_gemm_rates"], g["marian_s"], g["vaswani_s"])
                 for size, e in results.get("efficiency", {}).items()
                 for key, g in ((k[len("generate_"):], v) for k, v in e.items() if k.startswith("generate_"))]
    if ceilings:
        lines += ["", "| workload | its GEMMs alone at their own rates (s) | Marian (s) | vaswani (s) | "
                  "ceiling: Marian / GEMMs alone |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {ideal:.3f} | {marian:.3f} | {mine:.3f} | {marian / ideal:.2f} |"
                  for name, ideal, marian, mine in ceilings]
    training = [c for c in results["comparisons"] if "ceiling_share" in c or "split" in c]
    if training:
        lines += ["", "Training steps against their ceiling (the step's GEMMs alone at the fastest library's rate: "
                  "1 is the ceiling) and the split of each step's self CPU time (torch.profiler):", "",
                  "| training row | Marian: share of ceiling | vaswani: share of ceiling | "
                  "Marian split GEMM / attention / other | vaswani split GEMM / attention / other |",
                  "|---|---|---|---|---|"]
        for c in training:
            share, split = c.get("ceiling_share", {}), c.get("split", {})
            cells = [f"{share[who]:.0%}" if who in share else "-" for who in ("marian", "vaswani")]
            cells += [" / ".join(f"{split[who][k]:.0%}" for k in ("gemm", "attention", "other")) if who in split
                      else "-" for who in ("marian", "vaswani")]
            lines.append(f"| {c['name']} | " + " | ".join(cells) + " |")
    if "fast_paths" in results:
        lines += ["", *fast_path_table(results["fast_paths"])]
    write_atomically(out / "results.md", "\n".join(lines) + "\n")

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    names = [c["name"] for c in results["comparisons"]]
    left.barh(names, [c["ratio"] for c in results["comparisons"]], color="tab:blue")
    left.axvline(1.0, color="black", linewidth=1)
    left.set_xlabel("vaswani / Marian (median, higher is better)")
    left.invert_yaxis()
    for attn, style in (("eager", "--"), ("sdpa", "-")):
        rows = [r for r in results["memory"] if r["attn"] == attn]
        lengths = [r["source_length"] for r in rows]
        right.plot(lengths, [r["marian_mib"] for r in rows], style, marker="o", label=f"Marian {attn}")
        right.plot(lengths, [r["vaswani_mib"] for r in rows], style, marker="s", label=f"vaswani {attn}")
    right.set_xscale("log", base=2)
    right.set_yscale("log", base=2)
    right.set_xlabel("source length (batch 1)")
    right.set_ylabel("activation memory, forward + backward (MiB)")
    right.legend()
    fig.suptitle(f"{results['machine']['cpu']}, {results['machine']['threads']} threads")
    fig.tight_layout()
    fig.savefig(out / "results.png", dpi=110)
    plt.close(fig)
    return [out / "results.json", out / "results.md", out / "results.png"]


def run_deploy_section(checkpoint: str, words: int, rounds: int, threads: int, output_dir: str) -> dict:
    """benchmarks/deploy.py's run, written to deploy_results.json and deploy_results.md in `output_dir` (created
    first). Each search's table is printed, and both files rewritten, as soon as that search is measured, so that an
    interrupted run keeps the searches it finished."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from deploy import format_tables, run_deploy

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)  # a bad path fails now, not after the measuring
    processor = machine_description(float("nan"))["cpu"]

    def write(results: dict) -> None:  # after each search: its table, then both files with every search so far
        results["machine"]["processor"] = processor
        newest = list(results["searches"])[-1]
        print("\n".join(format_tables({**results, "searches": {newest: results["searches"][newest]}})), flush=True)
        write_atomically(output_dir / "deploy_results.json", json.dumps(results, indent=1))
        write_atomically(output_dir / "deploy_results.md", "\n".join(format_tables(results)) + "\n")

    results = run_deploy(checkpoint, words=words, rounds=rounds, threads=threads, on_progress=write)
    for name in ("deploy_results.json", "deploy_results.md"):
        print(f"wrote {output_dir / name}")
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["g2p", "base"], choices=["g2p", "base"])
    parser.add_argument("--rounds", type=int, default=5, help="alternating A/B rounds per measurement")
    parser.add_argument("--steps", type=int, default=3, help="training steps per round")
    parser.add_argument("--generation_rounds", type=int, default=5)
    parser.add_argument("--memory_lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--memory_size", default="g2p", choices=["g2p", "base"])
    parser.add_argument("--fast_paths", nargs="*", metavar="NAME",
                        help="also time each fast path on against off: the ones named, or all when none is")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--output_dir", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--quick", action="store_true", help="tiny sizes and one round, fast paths included: "
                        "checks, not speed")
    parser.add_argument("--deploy", metavar="CHECKPOINT", help="only the deployment section (benchmarks/deploy.py): "
                        "decode the dev words with a trained G2P checkpoint in each engine")
    parser.add_argument("--words", type=int, default=1000, help="--deploy: dev words decoded per round")
    parser.add_argument("--long_inputs", nargs=argparse.REMAINDER, metavar="ARGS", help="only the long-inputs "
                        "section (benchmarks/long_inputs.py), with the arguments that follow")
    args = parser.parse_args(argv)
    if args.long_inputs is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from long_inputs import main as long_inputs_main

        return long_inputs_main(args.long_inputs)
    torch.set_num_threads(args.threads)
    if args.deploy:
        return run_deploy_section(args.deploy, args.words, args.rounds, args.threads, args.output_dir)
    if args.quick:
        args.sizes, args.rounds, args.steps, args.generation_rounds = ["quick"], 1, 1, 1
        args.memory_lengths, args.memory_size = [16, 32], "quick"
        args.fast_paths = args.fast_paths or []
    results = run_benchmark(args.sizes, args.rounds, args.steps, args.generation_rounds, args.memory_lengths,
                            args.memory_size, fast_paths=args.fast_paths, output_dir=args.output_dir)
    for path in write_outputs(results, args.output_dir):
        print(f"wrote {path}")
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
