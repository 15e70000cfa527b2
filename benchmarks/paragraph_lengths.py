"""How far paragraph-level G2P models go in length: trained models (full and local attention, `vaswani-train --task
g2p-paragraph`) decode dev lines longer than any they were trained on, and each is timed and scored there.

    python benchmarks/paragraph_lengths.py outputs/paragraph-full outputs/paragraph-local --words 128 256 512
    python benchmarks/paragraph_lengths.py MODEL ... --lines 8 --output benchmarks/paragraph_lengths.json \
        --word_model outputs/g2p --task_dev --plot benchmarks/paragraph_lengths.png

For each number of words: `--lines` dev lines of exactly that many words (dev words only, every pronunciation kept,
drawn as the task's dev lines are), decoded greedily one line at a time by each model in turn (models alternate
line by line, so that a busy machine slows them alike), at most 1.2 new tokens per source token (a line's phonemes
and boundaries are fewer than its letters and boundaries); the word-level WER of the lines
(metrics.paragraph_scores), the share of lines that ended with the end token before that limit (the stop rate), the
median seconds per line and per new token, and the peak memory of the process so far. The models run without
vaswani's fast paths (the lean decoding loop serves full attention only), so that the attention is what differs.

`--task_dev` adds the g2p-paragraph task's own dev lines (the 50 lines of 32-128 words that training scores). With
`--word_model`, a word-level G2P model pronounces the same words one by one (greedy, batched), joined into lines and
scored the same way: the reference a paragraph model is measured against. `--plot` draws WER against words per line.

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
from vaswani.training.paragraphs import DEV_LINES, DEV_SEED, PARAGRAPH_WORDS, build_lines, join_words, split_words

TASK_DEV = "dev"  # the task's dev lines, in --words' place


def decode(model, tokenizer, source: str) -> tuple[str, float, int, bool]:
    """Greedy decoding of one line: (text, seconds, new tokens, whether it ended with the end token)."""
    batch = tokenizer([source], return_tensors="pt")
    limit = int(1.2 * batch["input_ids"].shape[1])
    start = time.perf_counter()
    with torch.inference_mode():
        ids = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=limit, max_length=None)
    seconds = time.perf_counter() - start
    stopped = ids[0, -1].item() == model.generation_config.eos_token_id
    return tokenizer.decode(ids[0], skip_special_tokens=True), seconds, ids.shape[1] - 1, stopped


def lines_for(words, count: int) -> list[tuple[str, list[str]]]:
    """`count` dev lines of exactly `words` words, or the task's dev lines for TASK_DEV."""
    dev = load_g2p().dev
    if words == TASK_DEV:
        return build_lines(dev, DEV_LINES, PARAGRAPH_WORDS, DEV_SEED, all_references=True)
    return build_lines(dev, count, (words, words), seed=DEV_SEED + words, all_references=True)


def word_by_word(word_model, tokenizer, chosen) -> list[str]:
    """The word model's pronunciations of each line's words, one word at a time, joined into lines."""
    from vaswani.training.evaluation import generate_texts

    words = [split_words(source) for source, _ in chosen]
    flat = [word for line in words for word in line]
    said = iter(generate_texts(word_model, tokenizer, flat, num_beams=1))
    return [join_words([next(said) for _ in line]) for line in words]


def measure(models: dict, tokenizer, words, lines: int, word_model=None) -> dict:
    chosen = lines_for(words, lines)
    rows = {name: dict(predictions=[], seconds=[], new_tokens=[], stopped=[]) for name in models}
    for source, _ in chosen:
        for name, model in models.items():
            text, seconds, new_tokens, stopped = decode(model, tokenizer[name], source)
            for key, value in zip(("predictions", "seconds", "new_tokens", "stopped"),
                                  (text, seconds, new_tokens, stopped)):
                rows[name][key].append(value)
    references = [refs for _, refs in chosen]
    source_tokens = statistics.median(len(next(iter(tokenizer.values()))(s)["input_ids"]) for s, _ in chosen)
    result = {}
    for name, row in rows.items():
        scores = paragraph_scores(row["predictions"], references)
        result[name] = dict(wer=100 * scores.wer, per=100 * scores.per, stop_rate=100 * statistics.mean(
            row["stopped"]), lines=len(chosen), seconds_per_line=statistics.median(row["seconds"]),
            new_tokens=statistics.median(row["new_tokens"]), source_tokens=source_tokens,
            ms_per_token=1000 * sum(row["seconds"]) / sum(row["new_tokens"]),
            peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if word_model is not None:
        scores = paragraph_scores(word_by_word(*word_model, chosen), references)
        result["word model"] = dict(wer=100 * scores.wer, per=100 * scores.per, lines=len(chosen),
                                    source_tokens=source_tokens)
    return result


def plot(results: dict, path: str) -> None:
    """WER against words per line, one curve per model (the task's dev lines left out: they mix lengths)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted(w for w in results if w != TASK_DEV)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in results[lengths[0]]:
        style = dict(linestyle="--", color="gray") if name == "word model" else dict(marker="o")
        ax.plot(lengths, [results[w][name]["wer"] for w in lengths], label=name, **style)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(w) for w in lengths])
    ax.set_xlabel("words per line")
    ax.set_ylabel("word error rate (%)")
    ax.set_title("Paragraph G2P: WER against line length (greedy)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="paragraph model folders (the --output_dir of vaswani-train runs)")
    parser.add_argument("--words", type=int, nargs="+", default=[128, 256, 512], help="words per line")
    parser.add_argument("--lines", type=int, nargs="+", default=[8],
                        help="dev lines per length: one number, or one per --words (e.g. 8 2 1: words alike)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--task_dev", action="store_true", help="also the task's 50 dev lines of 32-128 words")
    parser.add_argument("--word_model", help="a word-level G2P model folder, scored on the same words")
    parser.add_argument("--output", help="write the results as JSON here")
    parser.add_argument("--plot", help="draw WER against words per line into this PNG")
    args = parser.parse_args(argv)
    if len(args.lines) not in (1, len(args.words)):
        parser.error(f"--lines takes one number or one per --words ({len(args.words)}), not {len(args.lines)}")
    lines = dict(zip(args.words, args.lines * len(args.words) if len(args.lines) == 1 else args.lines))
    torch.set_num_threads(args.threads)
    models, tokenizers = {}, {}
    for folder in args.models:
        models[folder], tokenizers[folder] = load_checkpoint(folder, device="cpu")
        models[folder].eval().set_fast_paths(False)
    word_model = load_checkpoint(args.word_model, device="cpu") if args.word_model else None
    results = {}
    for words in ([TASK_DEV] if args.task_dev else []) + args.words:
        results[words] = measure(models, tokenizers, words, lines.get(words, 0), word_model)
        for name, r in results[words].items():
            where = "the task's dev lines" if words == TASK_DEV else f"{words:>5} words"
            timing = (f", stopped {r['stop_rate']:.0f} % of {r['lines']}, {r['seconds_per_line']:.1f} s a line "
                      f"({r['new_tokens']:.0f} tokens, {r['ms_per_token']:.1f} ms each), peak "
                      f"{r['peak_rss_mib']:.0f} MiB" if "stop_rate" in r else f" ({r['lines']} lines, word by word)")
            print(f"{where} ({r['source_tokens']:.0f} source tokens): {name}: WER {r['wer']:.2f} % PER "
                  f"{r['per']:.2f} %{timing}", flush=True)
        if args.output:  # after each length, so that a stopped run keeps what it measured
            with open(args.output, "w") as f:
                json.dump(dict(models=args.models, word_model=args.word_model, lines=args.lines,
                               threads=args.threads, results=results), f, indent=1)
    if args.plot and any(w != TASK_DEV for w in results):
        plot(results, args.plot)
    return results


if __name__ == "__main__":
    main()
