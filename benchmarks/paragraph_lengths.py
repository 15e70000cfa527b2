"""How far paragraph-level G2P models go in length: trained models (full and local attention, `vaswani-train --task
g2p-paragraph`) decode dev lines longer than any they were trained on, and each is timed and scored there.

    python benchmarks/paragraph_lengths.py outputs/paragraph-full outputs/paragraph-local --words 128 256 512
    python benchmarks/paragraph_lengths.py MODEL ... --lines 8 --output benchmarks/paragraph_lengths.json

For each number of words: `--lines` dev lines of exactly that many words (dev words only, every pronunciation kept,
drawn as the task's dev lines are), decoded greedily one line at a time by each model in turn (models alternate
line by line, so that a busy machine slows them alike), at most 1.2 new tokens per source token (a line's phonemes
and boundaries are fewer than its letters and boundaries); the word-level WER of the lines
(metrics.paragraph_scores), the median seconds per line and per new token, and the peak memory of the process so
far. The models run without vaswani's fast paths (the lean decoding loop serves full attention only), so that the
attention is what differs.

This is not library code: nothing in the package imports it, and it is not installed with it.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import torch

from vaswani.training.data import load_g2p
from vaswani.training.generation import load_checkpoint
from vaswani.training.metrics import paragraph_scores
from vaswani.training.paragraphs import DEV_SEED, build_lines


def decode(model, tokenizer, source: str) -> tuple[str, float, int]:
    """Greedy decoding of one line: (text, seconds, new tokens)."""
    batch = tokenizer([source], return_tensors="pt")
    limit = int(1.2 * batch["input_ids"].shape[1])
    start = time.perf_counter()
    with torch.inference_mode():
        ids = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=limit, max_length=None)
    seconds = time.perf_counter() - start
    return tokenizer.decode(ids[0], skip_special_tokens=True), seconds, ids.shape[1] - 1


def measure(models: dict, tokenizer, words: int, lines: int) -> dict:
    dev = load_g2p().dev
    chosen = build_lines(dev, lines, (words, words), seed=DEV_SEED + words, all_references=True)
    rows = {name: dict(predictions=[], seconds=[], new_tokens=[]) for name in models}
    for source, _ in chosen:
        for name, model in models.items():
            text, seconds, new_tokens = decode(model, tokenizer[name], source)
            rows[name]["predictions"].append(text)
            rows[name]["seconds"].append(seconds)
            rows[name]["new_tokens"].append(new_tokens)
    references = [refs for _, refs in chosen]
    source_tokens = statistics.median(len(next(iter(tokenizer.values()))(s)["input_ids"]) for s, _ in chosen)
    result = {}
    for name, row in rows.items():
        scores = paragraph_scores(row["predictions"], references)
        result[name] = dict(wer=100 * scores.wer, per=100 * scores.per, seconds_per_line=statistics.median(
            row["seconds"]), new_tokens=statistics.median(row["new_tokens"]), source_tokens=source_tokens,
            ms_per_token=1000 * sum(row["seconds"]) / sum(row["new_tokens"]),
            peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="paragraph model folders (the --output_dir of vaswani-train runs)")
    parser.add_argument("--words", type=int, nargs="+", default=[128, 256, 512], help="words per line")
    parser.add_argument("--lines", type=int, default=8, help="dev lines per length")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", help="write the results as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    models, tokenizers = {}, {}
    for folder in args.models:
        models[folder], tokenizers[folder] = load_checkpoint(folder, device="cpu")
        models[folder].eval().set_fast_paths(False)
    results = {}
    for words in args.words:
        results[words] = measure(models, tokenizers, words, args.lines)
        for name, r in results[words].items():
            print(f"{words:>5} words ({r['source_tokens']:.0f} source tokens): {name}: WER {r['wer']:.2f} % PER "
                  f"{r['per']:.2f} %, {r['seconds_per_line']:.1f} s a line ({r['new_tokens']:.0f} tokens, "
                  f"{r['ms_per_token']:.1f} ms each), "
                  f"peak {r['peak_rss_mib']:.0f} MiB", flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(dict(models=args.models, lines=args.lines, threads=args.threads, results=results), f, indent=1)
    return results


if __name__ == "__main__":
    main()
