"""The long-inputs benchmark's bookkeeping (not speed): exponents and crossovers from the numbers, the goal, the
decoding clock and cache bytes, every pattern and length in what a quick run writes."""

import json
import math
import sys
from unittest import mock

import pytest
import torch

from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/ is not part of the package
import benchmark  # noqa: E402
import long_inputs  # noqa: E402

LENGTHS = [1024, 2048, 4096, 8192, 16384]


def test_growth_exponent_from_the_start_length_to_the_longest():
    linear = {n: 3.0 * n for n in LENGTHS}
    quadratic = {n: 1e-6 * n * n for n in LENGTHS}
    assert long_inputs.growth_exponent(linear, 4096) == pytest.approx(1.0)
    assert long_inputs.growth_exponent(quadratic, 4096) == pytest.approx(2.0)
    bent = {1024: 1.0, 2048: 1.0, 4096: 2.0, 8192: 9.0, 16384: 8.0}  # only 4096 and 16384 count
    assert long_inputs.growth_exponent(bent, 4096) == pytest.approx(math.log(4) / math.log(4))
    assert long_inputs.growth_exponent(bent, 3000) == pytest.approx(1.0)  # the first length at or above the start
    assert long_inputs.growth_exponent(bent, 0) == pytest.approx(math.log(8) / math.log(16))
    assert long_inputs.growth_exponent(bent, 16384) is None  # one length: no exponent
    assert long_inputs.growth_exponent({4096: 0.0, 16384: 1.0}, 4096) is None  # a zero (memory) has no logarithm


def test_crossover_interpolates_where_a_pattern_becomes_faster_for_good():
    full = {n: 1.0 for n in LENGTHS}
    assert long_inputs.crossover({n: 0.5 for n in LENGTHS}, full) == dict(length=None, text="below 1024")
    assert long_inputs.crossover({n: 1.5 for n in LENGTHS}, full) == dict(length=None, text="not reached")
    equal_at_the_end = {**{n: 0.5 for n in LENGTHS}, 16384: 1.0}  # not faster at the longest: not reached
    assert long_inputs.crossover(equal_at_the_end, full)["text"] == "not reached"
    times = {1024: 2.0, 2048: 1.2, 4096: 0.8, 8192: 0.5, 16384: 0.3}
    point = long_inputs.crossover(times, full)
    expected = math.exp(math.log(2048) + math.log(1.2) / (math.log(1.2) - math.log(0.8)) * math.log(2))
    assert point["length"] == pytest.approx(expected) and 2048 < point["length"] < 4096
    assert point["text"] == f"{expected:.0f}"
    # faster, then slower, then faster: the crossover is the last one
    wobbly = {1024: 0.5, 2048: 1.1, 4096: 1.1, 8192: 1 / 1.1, 16384: 0.5}
    assert long_inputs.crossover(wobbly, full)["length"] == pytest.approx(math.sqrt(4096 * 8192))
    tie = {**times, 4096: 1.0}  # equal at 4096, faster after it: the crossover is 4096, not 2048-4096
    assert long_inputs.crossover(tie, full)["length"] == pytest.approx(4096)


def _made_up_results(step_seconds: dict[str, dict[int, float]]) -> dict:
    """Results with the given step times, memory linear in the length, and decoding cache memory of each kind."""
    settings = long_inputs.Settings(lengths=LENGTHS, decode_lengths=[256, 512, 1024])
    stat = (lambda v: dict(median=v, low=v, high=v))
    cache = {"full": 1e-3, "local": 0.0, "block_sparse": 1e-3, "linear": 0.0}
    return dict(
        settings=json.loads(json.dumps(settings.__dict__)),
        training=[dict(pattern=p, length=n, rounds=1, step_s=stat(t)) for p, ts in step_seconds.items()
                  for n, t in ts.items()],
        memory=[dict(pattern=p, length=n, activation_mib=0.01 * n, peak_mib=(0.02 if p == "full" else 0.01) * n)
                for p in long_inputs.PATTERNS for n in LENGTHS],
        decoding=[dict(pattern=p, length=n, rounds=1, token_s=stat(0.001), cache_mib=cache[p] * n + 0.75 * (p == "local"))
                  for p in long_inputs.PATTERNS for n in settings.decode_lengths],
    )


def test_summary_exponents_crossovers_and_the_goal():
    full = {n: 1e-7 * n * n for n in LENGTHS}  # quadratic
    results = _made_up_results({
        "full": full,
        "local": {n: 1e-4 * n for n in LENGTHS},  # linear, faster than full from 1000 on
        "block_sparse": {n: 2e-4 * n for n in LENGTHS},
        "linear": {n: 4e-8 * n ** 1.5 for n in LENGTHS},  # exponent 1.5: misses the goal though faster
    })
    summary = long_inputs.summarize(results)
    assert summary["full"]["step_time_exponent"] == pytest.approx(2.0) and "crossover" not in summary["full"]
    assert summary["local"]["step_time_exponent"] == pytest.approx(1.0)
    assert summary["local"]["goal_met"] is True and summary["local"]["crossover"]["text"] == "below 1024"
    assert summary["block_sparse"]["crossover"]["length"] == pytest.approx(2000)  # 2e-4 n = 1e-7 n^2
    assert "goal_met" not in summary["block_sparse"]
    assert summary["linear"]["step_time_exponent"] == pytest.approx(1.5) and summary["linear"]["goal_met"] is False
    assert summary["linear"]["faster_than_full_from_start"] is True
    assert summary["full"]["activation_exponent"] == pytest.approx(1.0)
    assert summary["local"]["decode_cache_exponent"] == pytest.approx(0.0)
    assert summary["full"]["decode_cache_exponent"] == pytest.approx(1.0)
    slow_local = _made_up_results({**{p: full for p in long_inputs.PATTERNS}, "local": {n: 1.2 * t for n, t in full.items()}})
    assert long_inputs.summarize(slow_local)["local"]["goal_met"] is False  # exponent 2 and slower than full
    markdown = long_inputs.markdown({**results, "summary": summary, "command": "python x", "notes": [],
                                     "machine": dict(cpu="cpu", threads=2, torch="t", date="d")})
    assert "| local | 1.00 |" in markdown and "| block_sparse | 1.00 |" in markdown and "| no |" in markdown


def test_rounds_per_length_repeat_the_last_value():
    settings = long_inputs.Settings(lengths=[4096, 1024, 2048], rounds=[5, 2])
    assert [settings.rounds_at(n) for n in (1024, 2048, 4096)] == [5, 2, 2]


def test_decode_clock_times_the_steps_before_each_length_and_sizes_the_cache():
    clock = long_inputs.DecodeClock(cache=None, lengths=[])
    clock.times = [0.0, 1.0, 3.0, 6.0, 10.0, 15.0]  # after new tokens 1 to 6
    assert clock.per_token_seconds(6, 2) == pytest.approx((15.0 - 6.0) / 2)
    assert clock.per_token_seconds(3, 2) == pytest.approx((3.0 - 0.0) / 2)
    settings = long_inputs.Settings(**{**long_inputs.QUICK, "decode_lengths": [20, 40], "decode_window": 4})
    memory = {}
    for pattern in long_inputs.PATTERNS:
        model = long_inputs.build_model(settings, pattern, dropout=0.0)
        seconds = long_inputs._decode_fn(model, settings, memory.setdefault(pattern, {}))()
        assert len(seconds) == 2 and all(s > 0 for s in seconds)
    d, heads, layers = (benchmark.SIZES["quick"][k] for k in ("d_model", "heads", "layers"))
    key_bytes = d * 4 * layers * 2  # keys and values, float32, every layer, per position
    assert memory["full"] == {20: 20 * key_bytes, 40: 40 * key_bytes}
    # block-sparse keeps the globals and the keys from the start of the previous block: what the next step sees
    block, globals_ = settings.sparse_block_size, settings.sparse_global_tokens
    kept = {n: n if n < block * 2 else globals_ + n - (n // block - 1) * block for n in (20, 40)}
    assert memory["block_sparse"] == {n: kept[n] * key_bytes for n in (20, 40)} and kept[40] < 40
    window = settings.attention_window  # w - 1 positions kept, in the storage of w that their last update made
    assert memory["local"] == {20: window * key_bytes, 40: window * key_bytes}
    head_dim = d // heads
    assert memory["linear"] == dict.fromkeys((20, 40), layers * heads * (head_dim * head_dim + head_dim) * 4)


def test_memory_point_measures_saved_bytes_and_a_peak():
    settings = long_inputs.Settings(**long_inputs.QUICK, threads=1)
    point = long_inputs.memory_point(settings, "local", 128)
    assert point["pattern"] == "local" and point["length"] == 128
    assert point["activation_mib"] > 0 and point["peak_mib"] >= 0


def test_benchmark_forwards_long_inputs_arguments():
    with mock.patch.object(long_inputs, "main", return_value={"ok": 1}) as main:
        assert benchmark.main(["--long_inputs", "--quick", "--lengths", "64", "128"]) == {"ok": 1}
    main.assert_called_once_with(["--quick", "--lengths", "64", "128"])


def test_quick_run_end_to_end(tmp_path):
    threads = torch.get_num_threads()
    try:  # main sets the process's thread count: the suite's other tests compare numerics at one thread
        results = long_inputs.main(["--quick", "--threads", "2", "--output_dir", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    written = json.loads((tmp_path / "long_inputs_results.json").read_text())
    settings = written["settings"]
    assert written["training"] == json.loads(json.dumps(results["training"]))
    for section, lengths in (("training", settings["lengths"]), ("memory", settings["lengths"]),
                             ("decoding", settings["decode_lengths"])):
        assert sorted((r["pattern"], r["length"]) for r in written[section]) == sorted(
            (p, n) for p in long_inputs.PATTERNS for n in lengths), section
    assert all(r["rounds"] == 1 for r in written["training"] + written["decoding"])
    assert [(r["length"], r["pattern"]) for r in written["memory"]] == [
        (n, p) for n in sorted(settings["lengths"]) for p in long_inputs.PATTERNS]  # the pool keeps the order
    assert all(r["activation_mib"] > 0 for r in written["memory"])
    assert all(r["cache_mib"] > 0 and r["token_s"]["median"] > 0 for r in written["decoding"])
    first, last = min(settings["lengths"]), max(settings["lengths"])
    for pattern, entry in written["summary"].items():
        times = {r["length"]: r["step_s"]["median"] for r in written["training"] if r["pattern"] == pattern}
        assert entry["step_time_exponent"] == pytest.approx(math.log(times[last] / times[first]) / math.log(last / first))
    assert written["summary"]["local"]["decode_cache_exponent"] == pytest.approx(0.0)
    assert written["summary"]["full"]["decode_cache_exponent"] == pytest.approx(1.0)
    markdown = (tmp_path / "long_inputs_results.md").read_text()
    assert "python benchmarks/long_inputs.py --quick" in markdown and all(p in markdown for p in long_inputs.PATTERNS)
    assert (tmp_path / "long_inputs.png").stat().st_size > 10_000


def test_paragraph_lengths_bookkeeping(checkpoint, tmp_path):
    """benchmarks/paragraph_lengths.py on a tiny checkpoint: every length scored,
    the limit of 1.2 new tokens per source token kept, the JSON written."""
    import paragraph_lengths

    threads = torch.get_num_threads()
    try:
        results = paragraph_lengths.main([str(checkpoint), str(checkpoint), "--words", "2", "3", "--lines", "2",
                                          "--output", str(tmp_path / "lengths.json"), "--word_model",
                                          str(checkpoint), "--plot", str(tmp_path / "lengths.png")])
    finally:
        torch.set_num_threads(threads)
    written = json.loads((tmp_path / "lengths.json").read_text())
    assert written["models"] == [str(checkpoint)] * 2 and sorted(written["results"]) == ["2", "3"]
    for words, row in results.items():
        r = row[str(checkpoint)]
        assert r["new_tokens"] <= int(1.2 * r["source_tokens"]) + 1 and r["seconds_per_line"] > 0
        assert r["wer"] >= 0 and r["ms_per_token"] > 0 and r["lines"] == 2
        # a line counts as stopped when its last token is the end token and the limit was not what ended it
        assert r["stop_rate"] in (0, 50, 100)
        assert set(row) == {str(checkpoint), "word model"} and row["word model"]["wer"] >= 0
    assert (tmp_path / "lengths.png").stat().st_size > 10_000


def test_paragraph_lengths_word_model_and_task_lines(loaded):
    """The word model's row pronounces each word alone (the word task's outputs, joined), and --task_dev's lines are
    the g2p-paragraph task's own dev lines."""
    import paragraph_lengths

    from vaswani.training.evaluation import generate_texts
    from vaswani.training.tasks import load_task_data

    model, tokenizer = loaded
    chosen = paragraph_lengths.lines_for(3, 2)
    words = [source.split(" | ") for source, _ in chosen]
    expected = [" | ".join(generate_texts(model, tokenizer, line)) for line in words]
    assert paragraph_lengths.word_by_word(model, tokenizer, chosen) == expected
    task = load_task_data("g2p-paragraph", None, None, None, None, 5, paragraph_lines=(3, 50))
    assert [source for source, _ in paragraph_lengths.lines_for(paragraph_lengths.TASK_DEV, 0)] == task.dev_sources
