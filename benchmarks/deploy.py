"""The deployment section of the benchmark: a trained G2P checkpoint decoding the CMUdict dev words with each engine.

    python benchmarks/benchmark.py --deploy outputs/g2p               # writes benchmarks/deploy_results.{json,md}
    python benchmarks/benchmark.py --deploy outputs/g2p --words 500 --rounds 3

Contenders, all on the CPU with the same thread count, one process, alternating round by round (each round times
every contender once, in order, so a busy machine slows all alike), medians with min-max over rounds:
- vaswani: torch float32, as loaded (its default fast paths);
- vaswani int8: the same model after `vaswani.deploy.quantization.quantize_int8` (torchao);
- CTranslate2 float32 and int8 (`vaswani-export ctranslate2`, `Ctranslate2Generator`);
- ONNX Runtime (`vaswani-export onnx`, `OnnxGenerator`);
- transformers' Marian at the same size with the same weights (its position table replaced by vaswani's, so that it
  computes vaswani's function whatever the sinusoid layout), where Marian can hold the model: not for a pre-LN one
  (the main job's since 2 Dec); the results then name the contender skipped and why.

Each decodes the first `words` dev words (batches of 32, sorted by length, vaswani's `generate_lines` limits), greedy
and beam 4. Reported: words/s, WER and PER against the dev references, and parity: the share of the words whose
output equals vaswani float32's. `benchmark.py --deploy` prints and writes each search's table as soon as it is
measured, so an interrupted run keeps the searches it finished.

This is not library code: nothing in the package imports it.
"""

from __future__ import annotations

import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

SEARCHES = {"greedy": 1, "beam 4": 4}


def _marian_twin(model):
    """transformers' MarianMTModel with `model`'s weights and vaswani's own position table."""
    from transformers import MarianMTModel

    from vaswani.training.convert_marian import vaswani_config_to_marian, vaswani_state_dict_to_marian

    config = model.config
    layout_free = config.__class__(**{**config.to_diff_dict(), "position_encoding": "sinusoidal_split"})
    marian_config = vaswani_config_to_marian(layout_free)
    marian_config.max_position_embeddings = max(512, config.max_position_embeddings)
    marian = MarianMTModel(marian_config).eval()
    result = marian.load_state_dict(vaswani_state_dict_to_marian(model.state_dict(), config), strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    table = model.get_encoder().embed_positions(torch.arange(marian_config.max_position_embeddings), torch.float32)
    with torch.no_grad():
        for stack in (marian.model.encoder, marian.model.decoder):
            stack.embed_positions.weight.copy_(table)
    marian.generation_config = model.generation_config
    return marian


MARIAN = "Marian (transformers fp32)"


def marian_or_reason(model):
    """(transformers' Marian twin of `model`, None), or (None, why it cannot be made)."""
    from vaswani.training.convert_marian import ConversionError

    try:
        return _marian_twin(model), None
    except ConversionError as error:
        return None, f"the model has no Marian equivalent ({error})"


def build_contenders(model_dir: str, work_dir: Path, threads: int, skipped: dict | None = None) -> dict:
    """name -> callable(lines, num_beams) -> outputs, every engine loaded and warm; a contender that cannot run this
    model goes into `skipped` (name -> why) instead."""
    from vaswani.deploy.ctranslate2_export import Ctranslate2Generator, export_ctranslate2
    from vaswani.deploy.onnx_export import export_onnx
    from vaswani.deploy.onnx_generation import OnnxGenerator
    from vaswani.deploy.quantization import quantize_int8
    from vaswani.training.generation import generate_lines, load_checkpoint

    model, tokenizer = load_checkpoint(model_dir, device="cpu")
    quantized, _ = load_checkpoint(model_dir, device="cpu")
    quantize_int8(quantized)
    marian, why_not = marian_or_reason(model)
    if why_not and skipped is not None:
        skipped[MARIAN] = why_not
    ct2 = {q: export_ctranslate2(model_dir, work_dir / f"ct2-{q}", quantization=q) for q in ("float32", "int8")}
    onnx = export_onnx(model_dir, work_dir / "onnx")

    def torch_model(m):
        return lambda lines, beams: generate_lines(m, tokenizer, lines, num_beams=beams)

    def engine(generator):
        return lambda lines, beams: generator.generate_lines(lines, num_beams=beams)

    contenders = {
        "vaswani (torch fp32)": torch_model(model),
        "vaswani int8 (torchao)": torch_model(quantized),
        "CTranslate2 float32": engine(Ctranslate2Generator(ct2["float32"], intra_threads=threads)),
        "CTranslate2 int8": engine(Ctranslate2Generator(ct2["int8"], intra_threads=threads)),
        "ONNX Runtime fp32": engine(OnnxGenerator(onnx, threads=threads)),
    }
    if marian is not None:
        contenders[MARIAN] = torch_model(marian)
    return contenders


def _median(values: list[float]) -> dict:
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


def run_deploy(model_dir: str, words: int = 1000, rounds: int = 3, threads: int = 1,
               on_progress: Callable[[dict], None] | None = None) -> dict:
    """Times every contender on the dev words, greedy and beam 4; returns the results as a dict. `on_progress` is
    called with the results so far after each search, so that a caller can show and keep them as they come."""
    from vaswani.training.data import load_g2p
    from vaswani.training.metrics import g2p_scores

    torch.set_num_threads(threads)
    dev = load_g2p().dev
    lines = list(dev)[:words]
    references = [dev[w] for w in lines]
    with tempfile.TemporaryDirectory() as work:
        started = time.perf_counter()
        skipped = {}
        contenders = build_contenders(model_dir, Path(work), threads, skipped=skipped)
        setup_seconds = time.perf_counter() - started
        results = {"machine": {"processor": platform.processor() or platform.machine(), "threads": threads,
                               "torch": torch.__version__},
                   "model": str(model_dir), "words": len(lines), "rounds": rounds,
                   "setup_seconds": setup_seconds, "skipped": skipped, "searches": {}}
        for search, beams in SEARCHES.items():
            seconds = {name: [] for name in contenders}
            outputs = {}
            for _ in range(rounds):
                for name, run in contenders.items():
                    start = time.perf_counter()
                    outputs[name] = run(lines, beams)
                    seconds[name].append(time.perf_counter() - start)
            reference = outputs["vaswani (torch fp32)"]
            rows = {}
            for name in contenders:
                scores = g2p_scores(outputs[name], references)
                same = sum(a == b for a, b in zip(outputs[name], reference))
                rows[name] = {"words_per_second": _median([len(lines) / s for s in seconds[name]]),
                              "wer": scores.wer, "per": scores.per, "parity": same / len(lines)}
            results["searches"][search] = rows
            if on_progress is not None:
                on_progress(results)
    return results


def format_tables(results: dict) -> list[str]:
    lines = [f"Decoding {results['words']} CMUdict dev words with {results['model']} ({results['machine']['processor']}, "
             f"{results['machine']['threads']} threads, torch {results['machine']['torch']}); median (min-max) of "
             f"{results['rounds']} alternating rounds.", ""]
    lines += [f"Not run: {name}: {why}." for name, why in results.get("skipped", {}).items()]
    lines += [""] if results.get("skipped") else []
    for search, rows in results["searches"].items():
        base = rows["vaswani (torch fp32)"]["words_per_second"]["median"]
        lines += [f"### {search}", "", "| engine | words/s | x vaswani | WER % | PER % | same output as vaswani |",
                  "|---|---|---|---|---|---|"]
        for name, row in rows.items():
            rate = row["words_per_second"]
            lines.append(f"| {name} | {rate['median']:.0f} ({rate['low']:.0f}-{rate['high']:.0f}) | "
                         f"{rate['median'] / base:.2f} | {100 * row['wer']:.2f} | {100 * row['per']:.2f} | "
                         f"{100 * row['parity']:.1f} % |")
        lines.append("")
    return lines
