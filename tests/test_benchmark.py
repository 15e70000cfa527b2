"""The benchmark's bookkeeping (not speed): identical weights, identical outputs, the files it writes, the fast
paths section's settings."""

import json
import math
import sys
from unittest import mock

import pytest
import torch

from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/benchmark.py is not part of the package
import benchmark  # noqa: E402
import measurement  # noqa: E402


def test_pair_computes_the_same_function():
    marian, vaswani = benchmark.build_pair("quick", dropout=0.0)
    batch = benchmark.make_batch("quick", padded=True)
    marian.eval(), vaswani.eval()
    with torch.no_grad():
        expected, got = marian(**batch).logits, vaswani(**batch).logits
    real = batch["decoder_attention_mask"].bool()
    assert (got[real] - expected[real]).abs().max() <= 1e-5 * expected[real].abs().max()
    assert marian.final_logits_bias.abs().sum() > 0  # a zero bias would hide a conversion mistake


def test_alternate_runs_contenders_in_alternating_order():
    calls = []
    results = measurement._alternate({"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or 2.0}, 4)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert results == {"a": [1.0] * 4, "b": [2.0] * 4}


def _scripted(values):
    """A contender returning the given rates one call after another."""
    it = iter(values)
    return lambda: next(it)


def test_steady_rounds_are_not_repeated_and_per_round_ratios_pair_each_round():
    rates = measurement._measure({"marian": _scripted([100, 96, 104]), "vaswani": _scripted([120, 110, 130])}, 3)
    assert rates == {"marian": [100, 96, 104], "vaswani": [120, 110, 130]}  # spreads 8 % and 17 %: three rounds
    c = benchmark.Comparison.of("train quick sdpa unpadded", "tokens/s", rates)
    assert c.extra["rounds"] == 3
    assert c.round_ratios.median == pytest.approx(1.2) and c.round_ratios.low == pytest.approx(110 / 96)
    assert c.round_ratios.high == pytest.approx(1.25)
    assert c.ratio == pytest.approx(120 / 100)  # the ratio of the medians, as before


def test_noisy_rounds_are_measured_again_and_pooled():
    marian = [100, 60, 100, 100, 101, 99]  # a busy moment in round 2: spread 40 %
    vaswani = [120, 70, 121, 119, 120, 121]
    rates = measurement._measure({"marian": _scripted(marian), "vaswani": _scripted(vaswani)}, 3)
    assert rates == {"marian": marian, "vaswani": vaswani}  # three more rounds, pooled with the first three
    c = benchmark.Comparison.of("generate quick sdpa greedy", "tokens/s", rates, identical_outputs=True)
    assert c.extra == {"rounds": 6, "identical_outputs": True}
    assert c.marian.median == pytest.approx(100) and c.vaswani.median == pytest.approx(120)
    # once only: a machine that stays busy gives a row still marked noisy, not an endless benchmark
    calls = []
    busy = measurement._measure({"a": lambda: calls.append(1) or float(len(calls) % 2 + 1), "b": lambda: 1.0}, 2)
    assert len(busy["a"]) == 4 and len(calls) == 4


def test_activation_memory_grows_quadratically_with_eager_attention_only():
    rows = benchmark.compare_memory("quick", [128, 256, 512])
    assert benchmark.growth_exponent(rows, "eager", "vaswani_mib") > 1.3
    assert benchmark.growth_exponent(rows, "sdpa", "vaswani_mib") < 1.1
    assert benchmark.growth_exponent(rows[:1], "eager", "vaswani_mib") is None  # one length (--memory_lengths 512)
    # vaswani saves no more than Marian for backward (the fused projections keep no concatenated weight alive)
    assert all(row["vaswani_mib"] <= row["marian_mib"] for row in rows), rows


def test_quick_run_end_to_end(tmp_path):
    results = benchmark.main(["--quick", "--output_dir", str(tmp_path), "--threads", "1"])
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["comparisons"] == json.loads(json.dumps(results["comparisons"]))
    names = {c["name"] for c in written["comparisons"]}
    assert "generate quick sdpa greedy" in names and "train quick eager padded dropout 0.1" in names
    training = [c for c in written["comparisons"] if c["name"].startswith("train")]
    assert {c["name"] for c in training} == {f"train quick {attn} {padded} dropout {dropout}" for dropout in (
        "0", "0.1") for attn in ("eager", "sdpa") for padded in ("unpadded", "padded")}
    ideal = written["efficiency"]["quick"]["ideal_step_s_at_own_gemm_rates"]
    for c in training:  # each contender: its share of the ceiling (over the real tokens' step), its split three ways
        tokens = benchmark._step_tokens(benchmark.make_batch("quick", padded="padded" in c["name"].split()))
        for who in ("marian", "vaswani"):
            assert 0 < c["ceiling_share"][who] < math.inf
            assert c["ceiling_share"][who] == pytest.approx(ideal / (tokens / c[who]["median"]))
            split = c["split"][who]
            assert split["gemm"] > 0 and split["attention"] > 0 and split["other"] > 0
            assert split["gemm"] + split["attention"] + split["other"] == pytest.approx(1)
    assert all(c["identical_outputs"] for c in written["comparisons"] if c["name"].startswith("generate"))
    assert all(c["marian"]["median"] > 0 and c["vaswani"]["median"] > 0 for c in written["comparisons"])
    for c in written["comparisons"]:  # one round (--quick): the per-round ratio is the ratio itself
        assert c["rounds"] == 1 and c["round_ratio"]["median"] == pytest.approx(c["ratio"])
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| measurement |" in (tmp_path / "results.md").read_text()
    machine = written["machine"]  # the peak is measured at the start and the end; the higher one counts
    assert machine["matmul_peak_gflops"] == max(machine["matmul_peak_gflops_start_end"])
    quick = written["efficiency"]["quick"]
    assert 0 < quick["vaswani_mfu"]
    for key in ("generate_greedy", "generate_beam5"):  # Marian's time over its GEMMs' time alone, as written
        g = quick[key]
        assert g["ceiling_over_marian"] == pytest.approx(g["marian_s"] / g["ideal_s_at_own_gemm_rates"])
    assert quick["training_ceiling_over_marian"] == pytest.approx(
        quick["marian_step_s"] / quick["ideal_step_s_at_own_gemm_rates"])
    table = (tmp_path / "results.md").read_text()
    assert "| generate quick sdpa beam5 (call) |" in table and "ceiling: Marian / GEMMs alone" in table
    assert "| train quick sdpa padded dropout 0 | " in table and "vaswani split GEMM / attention / other" in table
    # the fast paths section (--quick runs it): each path, then all of them, on the three workloads
    from vaswani.fast_paths_vaswani import FAST_PATHS

    section = written["fast_paths"]
    assert section == json.loads(json.dumps(results["fast_paths"]))
    assert set(section["as_loaded"]) == set(FAST_PATHS)
    several = len(FAST_PATHS) > 1  # with one path, "all off" would be that path's row again
    assert [row["path"] for row in section["paths"]] == [*FAST_PATHS, *(["all fast paths"] if several else [])]
    assert [row["switched_off"] for row in section["paths"]] == [*([name] for name in FAST_PATHS),
                                                                  *([list(FAST_PATHS)] if several else [])]
    for row in section["paths"]:
        assert [w["name"] for w in row["workloads"]] == [
            "train quick sdpa padded", "generate quick sdpa greedy", "generate quick sdpa beam 5"]
        for w in row["workloads"]:
            assert w["off"]["median"] > 0 and w["on"]["median"] > 0 and w["rounds"] == 1
            assert w["gain"] == pytest.approx(w["on"]["median"] / w["off"]["median"])
            assert w["round_ratio"]["median"] == pytest.approx(w["gain"])
            assert w.get("identical_outputs", True)  # generate: the same tokens with and without the path
        table_row = next(line for line in table.splitlines() if line.startswith(f"| {row['path']} |"))
        assert table_row.count("|") == 5
    assert "| fast path | train quick sdpa padded | generate quick sdpa greedy | generate quick sdpa beam 5 |" in table


@pytest.mark.parametrize("mode", ["benchmark", "deploy", "long_inputs"])
def test_every_mode_makes_its_output_folder_before_measuring(tmp_path, monkeypatch, mode):
    """A folder not there yet is made, parents included, before the first measurement: a bad path fails at once,
    not after minutes of measuring."""
    import deploy
    import long_inputs

    folder = tmp_path / "results" / "new"
    seen = []

    def first_measurement(*args, **kwargs):
        seen.append(folder.is_dir())
        raise KeyboardInterrupt  # stops the run here

    module, measure, argv = {
        "benchmark": (benchmark, "matmul_peak_gflops", ["--quick", "--output_dir", str(folder)]),
        "deploy": (deploy, "run_deploy", ["--deploy", "outputs/g2p", "--output_dir", str(folder)]),
        "long_inputs": (long_inputs, "run_long_inputs", ["--long_inputs", "--quick", "--output_dir", str(folder)]),
    }[mode]
    monkeypatch.setattr(module, measure, first_measurement)
    with pytest.raises(KeyboardInterrupt):
        benchmark.main([*argv, "--threads", "1"])
    assert seen == [True]


def test_an_interrupted_benchmark_keeps_the_rows_it_measured(tmp_path, monkeypatch, capsys):
    """Each row is printed as it is measured, and results.json holds every size's rows once that size is done: a run
    stopped during the memory rows keeps its comparisons."""
    def measured(name):
        return benchmark.Comparison.of(name, "tokens/s", {"marian": [100.0], "vaswani": [125.0]})

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(benchmark, "matmul_peak_gflops", lambda n: 50.0)
    monkeypatch.setattr(benchmark, "compare_training", lambda size, attn, padded, *rest, dropout: measured(
        benchmark._training_name(size, attn, padded, dropout)))
    monkeypatch.setattr(benchmark, "ideal_step_seconds", lambda size: 0.01)
    monkeypatch.setattr(benchmark, "compare_generation", lambda size, attn, beams, rounds: measured(
        benchmark._generation_name(size, attn, beams)))
    monkeypatch.setattr(benchmark, "ideal_generation_seconds", lambda size, beams: 0.01)
    monkeypatch.setattr(benchmark, "compare_memory", interrupted)
    folder = tmp_path / "results" / "new"
    with pytest.raises(KeyboardInterrupt):
        benchmark.main(["--quick", "--output_dir", str(folder), "--threads", "1"])
    names = [f"train quick {attn} {padded} dropout {dropout}" for dropout in ("0", "0.1") for attn in ("eager", "sdpa")
             for padded in ("unpadded", "padded")]
    names += ["generate quick sdpa greedy", "generate quick sdpa beam 5"]
    written = json.loads((folder / "results.json").read_text())
    assert [c["name"] for c in written["comparisons"]] == names
    assert all(c["ratio"] == pytest.approx(1.25) for c in written["comparisons"])
    assert set(written["efficiency"]["quick"]) >= {"training_ceiling_over_marian", "generate_greedy", "generate_beam5"}
    printed = capsys.readouterr().out.splitlines()
    for name in names:
        assert any(line.startswith(name) and "x1.25" in line for line in printed), name
    assert [path.name for path in folder.iterdir()] == ["results.json"]  # no temporary file left


def test_an_interrupted_deploy_run_keeps_the_searches_it_finished(tmp_path, monkeypatch, capsys):
    """`--deploy` prints each search's table and writes both files as soon as that search is measured: a run
    stopped during beam 4 keeps greedy. The engines are stand-ins (no trained model here); the rest is the real run."""
    import deploy

    def engine(lines, beams):
        if beams > 1:
            raise KeyboardInterrupt  # stopped while beam 4 is measured
        return ["AH"] * len(lines)

    def contenders(model_dir, work_dir, threads, skipped):
        skipped[deploy.MARIAN] = "the model has no Marian equivalent (pre-LN)"
        return {"vaswani (torch fp32)": engine, "CTranslate2 int8": engine}

    monkeypatch.setattr(deploy, "build_contenders", contenders)
    folder = tmp_path / "results" / "new"
    with pytest.raises(KeyboardInterrupt):
        benchmark.run_deploy_section("outputs/g2p", words=20, rounds=1, threads=1, output_dir=str(folder))
    written = json.loads((folder / "deploy_results.json").read_text())
    assert written["words"] == 20 and list(written["searches"]) == ["greedy"]
    rows = written["searches"]["greedy"]
    assert list(rows) == ["vaswani (torch fp32)", "CTranslate2 int8"]
    assert written["skipped"] == {deploy.MARIAN: "the model has no Marian equivalent (pre-LN)"}
    assert rows["CTranslate2 int8"]["parity"] == 1.0 and rows["CTranslate2 int8"]["words_per_second"]["median"] > 0
    table = (folder / "deploy_results.md").read_text()
    printed = capsys.readouterr().out
    for text in (table, printed):
        assert "### greedy" in text and "### beam 4" not in text
        assert "| CTranslate2 int8 |" in text and "| 100.0 % |" in text
        assert "Not run: Marian (transformers fp32): the model has no Marian equivalent (pre-LN)." in text
    assert sorted(path.name for path in folder.iterdir()) == ["deploy_results.json", "deploy_results.md"]


@pytest.mark.parametrize("pre_ln", [False, True])
def test_the_deploy_marian_twin_or_why_not(pre_ln, tiny_config):
    """A post-LN model gets its Marian twin (the same greedy output); a pre-LN one, which Marian cannot hold, a
    reason instead of the crash that stopped `--deploy` on the main job's model."""
    import deploy
    from helpers import make_model, padded_batch

    tiny_config.normalize_before = pre_ln
    model = make_model(tiny_config)
    marian, why_not = deploy.marian_or_reason(model)
    if pre_ln:
        assert marian is None and "no Marian equivalent" in why_not and "pre-LN" in why_not
        return
    assert why_not is None
    batch = padded_batch()
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=6)
    torch.testing.assert_close(marian.generate(**kwargs), model.generate(**kwargs), rtol=0, atol=0)


def test_generation_mismatch_is_an_error(monkeypatch):
    original = benchmark.build_pair

    def perturbed(size, dropout=0.1, seed=0):
        marian, vaswani = original(size, dropout, seed)
        with torch.no_grad():
            vaswani.final_logits_bias[0, 5] += 100.0  # vaswani now prefers token 5
        return marian, vaswani

    monkeypatch.setattr(benchmark, "build_pair", perturbed)
    with pytest.raises(AssertionError, match="generation differs"):
        benchmark.compare_generation("quick", "sdpa", 1, rounds=1, sentences=4, new_tokens=3)


def test_rows_whose_rounds_disagree_are_marked_noisy(tmp_path):
    def row(name, marian, vaswani):
        stat = lambda low, median, high: dict(median=median, low=low, high=high)
        return dict(name=name, unit="tokens/s", ratio=vaswani[1] / marian[1], marian=stat(*marian),
                    vaswani=stat(*vaswani))

    steady = row("train quick sdpa unpadded", (95, 100, 105), (98, 101, 104))  # spreads 10 % and 6 %
    busy = row("train quick sdpa padded", (70, 100, 130), (99, 100, 101))  # Marian's rounds spread 60 %
    assert benchmark.spread(steady) == pytest.approx(0.10) and benchmark.spread(busy) == pytest.approx(0.60)
    results = dict(machine=dict(cpu="test", threads=1), comparisons=[steady, busy],
                   memory=[dict(attn=a, source_length=n, marian_mib=1.0, vaswani_mib=1.0)
                           for a in ("eager", "sdpa") for n in (8, 16)])
    benchmark.write_outputs(results, tmp_path)
    table = (tmp_path / "results.md").read_text().splitlines()
    assert table[0].endswith("| per round: median [min-max] of rounds | spread |")
    assert table[2].endswith("| - | 10% |") and "noisy" not in table[2]  # rows written without per-round ratios
    assert table[3].endswith("| 60% (noisy: rerun) |")


def _onednn_linear_flops(x_shape, *args, out_shape=None, **kwargs) -> int:
    """oneDNN's linear (vaswani's Linear layers where it applies, dense or packed weight, with or without a fused
    addition): 2 * rows * in * out, as PyTorch counts addmm."""
    return 2 * math.prod(out_shape) * x_shape[-1]


def _gemm_flops(run) -> int:
    """FLOPs of the matrix products (mm, addmm, oneDNN's linear: every Linear) that `run` executes, counted by
    PyTorch's flop formulas in a dispatch mode. Not `FlopCounterMode`: its module tracker registers global module
    hooks, for which the fast paths step aside (the module contract), so it would count another decoding loop."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry, register_flop_formula

    if hasattr(torch.ops.mkldnn, "_linear_pointwise") and torch.ops.mkldnn._linear_pointwise not in flop_registry:
        register_flop_formula(torch.ops.mkldnn._linear_pointwise)(_onednn_linear_flops)
    counted = [torch.ops.aten.mm, torch.ops.aten.addmm]
    if hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        counted.append(torch.ops.mkldnn._linear_pointwise)

    class Count(TorchDispatchMode):
        flops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func._overloadpacket not in counted:  # composite ops (linear) into the products they run
                with self:
                    out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            out = func(*args, **kwargs)
            if func._overloadpacket in counted:
                Count.flops += flop_registry[func._overloadpacket](*args, **kwargs, out_val=out)
            return out

    with Count():
        run()
    return Count.flops


def test_profiler_ops_are_sorted_into_gemm_attention_and_other():
    expected = {"aten::mm": "gemm", "aten::addmm": "gemm", "mkldnn::_linear_pointwise": "gemm",
                "aten::bmm": "attention", "aten::baddbmm": "attention", "aten::_softmax": "attention",
                "aten::_softmax_backward_data": "attention", "aten::softmax": "attention",
                "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
                "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "attention",
                "aten::masked_fill": "attention", "aten::add": "other", "aten::linear": "other",
                "aten::matmul": "other", "aten::native_layer_norm": "other", "aten::embedding": "other",
                "aten::log_softmax": "other", "aten::_log_softmax_backward_data": "other",  # the loss's
                "SoftmaxBackward0": "other", "autograd::engine::evaluate_function: BmmBackward0": "other"}
    assert {name: benchmark.op_category(name) for name in expected} == expected


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_the_onednn_paths_gemms_are_sorted_as_gemms(monkeypatch):
    """Every GEMM the oneDNN path runs, forward and backward, shows in the profile under a name sorted as "gemm"."""
    from torch.profiler import ProfilerActivity, profile

    from vaswani import onednn_vaswani

    monkeypatch.setattr(onednn_vaswani, "SMALLEST_GEMM", 0)
    x, weight, bias = (torch.randn(*shape, requires_grad=True) for shape in ((64, 32), (48, 32), (48,)))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        onednn_vaswani.onednn_linear(x, weight, bias).backward(torch.randn(64, 48))
    names = {event.key for event in prof.key_averages()}
    assert {name for name in names if benchmark.op_category(name) == "gemm"} == {
        "mkldnn::_linear_pointwise", "aten::mkldnn_linear_backward_weights"}


def test_step_time_split_sums_to_one():
    _, vaswani = benchmark.build_pair("quick", dropout=0.0)
    split = benchmark.step_time_split(vaswani, benchmark.make_batch("quick", padded=True))
    assert min(split["gemm"], split["attention"], split["other"]) > 0 and split["total_s"] > 0
    assert split["gemm"] + split["attention"] + split["other"] == pytest.approx(1)


def test_training_gemm_shapes_are_the_ones_the_model_runs():
    _, vaswani = benchmark.build_pair("quick", dropout=0.0)
    batch = benchmark.make_batch("quick", padded=False)
    with torch.no_grad():
        counted = _gemm_flops(lambda: vaswani(**batch))
    assert counted == sum(2 * m * k * n * c for m, k, n, c in benchmark._linear_shapes("quick"))


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generation_gemm_shapes_are_the_ones_generate_runs(num_beams):
    # the ceiling of a generate call is only right if its GEMMs are all counted, each at its real shape
    marian, vaswani = benchmark.build_pair("quick", dropout=0.0)
    sentences, new_tokens = 4, 5
    input_ids = torch.randint(3, 64, (sentences, benchmark.SIZES["quick"]["source"]))
    config = benchmark.GenerationConfig(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, num_beams=num_beams, do_sample=False,
        decoder_start_token_id=benchmark.START, pad_token_id=benchmark.PAD, eos_token_id=benchmark.EOS,
    )
    def flops(**kwargs):
        return sum(2 * m * k * n * c for m, k, n, c in
                   benchmark._generation_linear_shapes("quick", num_beams, sentences, new_tokens, **kwargs))

    # Marian's shapes make the ceiling; vaswani's lean beam search projects the cross-attention keys/values once per
    # sentence instead of once per beam, so with beams it does fewer FLOPs than Marian
    for model, expected in ((marian, flops()), (vaswani, flops(cross_per_source=True))):
        model.eval().set_attn_implementation("sdpa")
        with torch.inference_mode():
            assert _gemm_flops(lambda: model.generate(input_ids=input_ids, generation_config=config)) == expected
    assert (flops(cross_per_source=True) < flops()) == (num_beams > 1)


def test_ideal_generation_time_is_positive_and_grows_with_the_beams():
    greedy = benchmark.ideal_generation_seconds("quick", 1, sentences=8, new_tokens=4, repeats=1)
    assert 0 < greedy < benchmark.ideal_generation_seconds("quick", 4, sentences=32, new_tokens=4, repeats=1) * 10


def test_fast_path_rows_switch_one_path_off_each_then_all():
    from vaswani.fast_paths_vaswani import FAST_PATHS

    rows = benchmark.fast_path_rows()
    several = ["all fast paths"] if len(FAST_PATHS) > 1 else []  # with one path, "all off" is that row again
    assert [path for path, _, _ in rows] == [*FAST_PATHS, *several]
    for path, on, off in rows:
        assert on == dict.fromkeys(FAST_PATHS, True)
        assert [name for name in FAST_PATHS if not off[name]] == (list(FAST_PATHS) if path == "all fast paths"
                                                                 else [path])
    assert [path for path, _, _ in benchmark.fast_path_rows([FAST_PATHS[-1]])] == [FAST_PATHS[-1], *several]
    with mock.patch.object(benchmark, "fast_path_names", return_value=("a", "b")):
        assert [path for path, _, _ in benchmark.fast_path_rows()] == ["a", "b", "all fast paths"]
    with pytest.raises(ValueError, match="unknown fast path"):
        benchmark.fast_path_rows(["no_such_path"])


def test_fast_paths_section_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "vaswani.fast_paths_vaswani", None)  # an import of it now fails
    with pytest.raises(ImportError, match="fast_paths_vaswani"):
        benchmark.fast_path_rows()
    with pytest.raises(ImportError, match="--fast_paths"):  # before any comparison is measured
        benchmark.run_benchmark(["quick"], 1, 1, 1, [16, 32], "quick", fast_paths=[])


def test_fast_path_contenders_are_copies_each_with_its_own_setting():
    _, vaswani = benchmark.build_pair("quick", dropout=0.0)
    as_loaded = dict(vaswani.fast_paths)
    (path, on, off), *_ = benchmark.fast_path_rows()
    seen = {}

    def make_run(model, name):
        def run():
            seen.setdefault(name, []).append((id(model), dict(model.fast_paths)))
            return 1.0

        return run

    rates = benchmark.compare_fast_paths(vaswani, on, off, 2, make_run)
    assert rates == {"off": [1.0, 1.0], "on": [1.0, 1.0]}
    assert [setting for _, setting in seen["off"]] == [off, off] and [s for _, s in seen["on"]] == [on, on]
    assert len({model for runs in seen.values() for model, _ in runs} | {id(vaswani)}) == 3
    assert vaswani.fast_paths == as_loaded  # the model passed in is left as it was


def test_fast_path_table_marks_noisy_rows_and_differing_outputs():
    def entry(name, off, on, identical=True):
        stat = lambda low, median, high: dict(median=median, low=low, high=high)
        return dict(name=name, unit="tokens/s", gain=on[1] / off[1], off=stat(*off), on=stat(*on),
                    round_ratio=stat(1.0, on[1] / off[1], 1.2), rounds=3, identical_outputs=identical)

    section = dict(as_loaded={"a": True}, paths=[
        dict(path="a", switched_off=["a"], workloads=[entry("train", (95, 100, 105), (118, 120, 122)),
                                                      entry("generate", (70, 100, 130), (99, 100, 101), False)]),
        dict(path="all fast paths", switched_off=["a"], workloads=[entry("train", (95, 100, 105), (99, 100, 101))]),
    ])
    lines = benchmark.fast_path_table(section)
    assert "| fast path | train | generate |" in lines
    row = next(line for line in lines if line.startswith("| a |"))
    assert row == "| a | 1.20 (per round 1.20 [1.00-1.20]) | 1.00 (per round 1.00 [1.00-1.20]) noisy outputs differ |"
    assert next(line for line in lines if line.startswith("| all fast paths |")).endswith("| - |")


def test_deploy_section_marian_twin_and_table(trained_checkpoint):
    """The deployment section's Marian computes the vaswani model's function (on a post-LN model with interleaved
    sinusoids and a random logits bias: Marian cannot be pre-LN like the shared trained checkpoint), and its table
    reads the results it is given."""
    import deploy
    from helpers import held_out_words, make_tiny_checkpoint, write_g2p_sample

    from vaswani.training.generation import generate_lines, load_checkpoint

    folder = trained_checkpoint.parent / "post-ln"
    sample = write_g2p_sample(trained_checkpoint.parent / "sample.tsv")
    model, tokenizer = load_checkpoint(make_tiny_checkpoint(folder, sample, final_logits_bias=True), device="cpu")
    with torch.no_grad():
        model.final_logits_bias.normal_()
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(0.0, 0.2)
    marian = deploy._marian_twin(model)
    batch = tokenizer(["TRANSFORMER", "AB"], padding=True, return_tensors="pt")
    decoder_input_ids = torch.tensor([[2, 5, 7, 9]] * 2)
    with torch.no_grad():
        expected = model(**batch, decoder_input_ids=decoder_input_ids).logits
        got = marian(**batch, decoder_input_ids=decoder_input_ids).logits
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
    words = held_out_words(20)
    assert generate_lines(marian, tokenizer, words, num_beams=2) == generate_lines(model, tokenizer, words, num_beams=2)

    row = {"words_per_second": {"median": 100.0, "low": 90.0, "high": 120.0}, "wer": 0.25, "per": 0.05, "parity": 1.0}
    results = {"words": 20, "model": "m", "rounds": 1, "machine": {"processor": "cpu", "threads": 1, "torch": "t"},
               "searches": {"greedy": {"vaswani (torch fp32)": row, "other": {**row, "parity": 0.5}}}}
    table = "\n".join(deploy.format_tables(results))
    assert "| vaswani (torch fp32) | 100 (90-120) | 1.00 | 25.00 | 5.00 | 100.0 % |" in table
    assert "| other | 100 (90-120) | 1.00 | 25.00 | 5.00 | 50.0 % |" in table


def test_the_benchmark_scripts_import_no_circle():
    """benchmarks/*.py may import each other (lazy imports inside functions included) only without a circle."""
    import ast

    folder = REPO / "benchmarks"
    scripts = {path.stem: path for path in folder.glob("*.py")}
    imports = {}
    for name, path in scripts.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
        imports[name] = found & set(scripts) - {name}
    assert "measurement" in imports["long_inputs"] and "benchmark" not in imports["long_inputs"]

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in imports[start])

    circles = sorted(name for name in imports if reaches(name, name))
    assert not circles, f"import circle through {circles}"
