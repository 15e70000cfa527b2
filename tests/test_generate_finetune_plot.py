"""scripts/generate.py, scripts/finetune.py, scripts/plot_attention.py and the library code under them
(training/generation.py, training/finetune.py, training/attention_plots.py), on a tiny checkpoint.

Most cases call a script's main(argv) in-process (imports cost seconds per subprocess); one runs
generate.py as a real subprocess reading stdin.
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from _tiny_checkpoint import REPO, make_tiny_checkpoint, write_g2p_sample

WORDS = ["TRANSFORMER", "AB", "ATTENTION", "A", "", "AACHEN", "ZYX", "ABBREVIATE", "AB"]


def _load_script(name):
    spec = importlib.util.spec_from_file_location(f"{name}_script", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def g2p_sample(tmp_path_factory):
    return write_g2p_sample(tmp_path_factory.mktemp("g2p") / "sample.tsv", lines=300)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, g2p_sample):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), g2p_sample)


@pytest.fixture(scope="module")
def loaded(checkpoint):
    from vaswani.training.generation import load_checkpoint

    return load_checkpoint(checkpoint, device="cpu")


def _one_by_one(model, tokenizer, lines, max_new_tokens=None, num_beams=1):
    """model.generate on each line alone (no padding), greedy or beam."""
    outputs = []
    for line in lines:
        if not line.strip():
            outputs.append("")
            continue
        batch = tokenizer([line], return_tensors="pt")
        limit = max_new_tokens or 2 * batch["input_ids"].shape[1] + 10
        with torch.inference_mode():
            ids = model.generate(**batch, max_new_tokens=limit, num_beams=num_beams, do_sample=False)
        outputs.append(tokenizer.decode(ids[0], skip_special_tokens=True).strip())
    return outputs


# --- generate ---------------------------------------------------------------------------------------


def test_generate_stdin_subprocess(checkpoint, loaded):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "generate.py"), str(checkpoint), "--batch_size", "4", "--threads", "1"],
        input="\n".join(WORDS) + "\n", capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    printed = result.stdout.split("\n")
    assert printed[-1] == "" and len(printed) - 1 == len(WORDS)
    # default limits are per line, so batching (sorted by length, batches of 4) changes nothing
    assert printed[:-1] == _one_by_one(*loaded, WORDS)


def test_generate_file_input_order_and_beam(checkpoint, loaded, tmp_path, capsys):
    generate = _load_script("generate")
    words = WORDS * 3  # 27 lines, batches of 5 mix lengths from across the file
    path = tmp_path / "words.txt"
    path.write_text("\n".join(words) + "\n", encoding="utf-8")
    common = [str(checkpoint), "--input", str(path), "--batch_size", "5", "--threads", "1", "--max_new_tokens", "8"]

    generate.main(common)
    greedy = capsys.readouterr().out.splitlines()
    assert len(greedy) == len(words)
    assert greedy == _one_by_one(*loaded, words, max_new_tokens=8)
    assert greedy[4] == "" and greedy[1] == greedy[8]  # blank line stays blank; equal inputs, equal outputs

    generate.main(common + ["--num_beams", "3"])
    beam = capsys.readouterr().out.splitlines()
    assert len(beam) == len(words)
    assert beam == _one_by_one(*loaded, words, max_new_tokens=8, num_beams=3)


def test_generate_missing_checkpoint_is_one_line(tmp_path):
    generate = _load_script("generate")
    with pytest.raises(SystemExit) as error:
        generate.main([str(tmp_path / "no-such-run"), "--input", os.devnull, "--threads", "1"])
    message = str(error.value.code)
    assert message.startswith("error: checkpoint folder") and "does not exist" in message and "\n" not in message
    with pytest.raises(SystemExit, match="has no config.json"):
        generate.main([str(tmp_path), "--input", os.devnull, "--threads", "1"])


# --- finetune: collation, gradient accumulation, the script ------------------------------------------


def test_collator_pads_labels_with_minus_100(loaded):
    from transformers import DataCollatorForSeq2Seq

    from vaswani.training.finetune import tokenize_pairs

    model, tokenizer = loaded
    dataset = tokenize_pairs(tokenizer, ["AACHEN", "AB"], ["AA K AH N", "EY B IY"])
    assert dataset[1]["labels"][-1] == tokenizer.eos_token_id  # unpadded: padding is the collator's job
    batch = DataCollatorForSeq2Seq(tokenizer, model=model)([dataset[0], dataset[1]])
    lengths = [len(dataset[i]["labels"]) for i in range(2)]
    assert lengths[1] < lengths[0]
    assert batch["labels"][1, lengths[1]:].tolist() == [-100] * (lengths[0] - lengths[1])
    assert (batch["labels"] != tokenizer.pad_token_id).all()  # pad id 0 never becomes a target
    # decoder inputs: decoder start, then the labels shifted right, -100 turned into pad
    expected = torch.full_like(batch["labels"], tokenizer.pad_token_id)
    expected[:, 0] = model.config.decoder_start_token_id
    expected[:, 1:] = batch["labels"][:, :-1].clamp(min=0)
    assert torch.equal(batch["decoder_input_ids"], expected)


def _one_step(model_state, config, tokenizer, dataset, tmp_path, batch_size, accumulation, smoothing=0.0,
              honour_num_items=True):
    """One SGD step of Seq2SeqTrainer on all of `dataset`; returns the new weights and the trainer."""
    from transformers import Seq2SeqTrainingArguments

    import vaswani
    from vaswani.training.finetune import build_trainer

    model = vaswani.VaswaniForConditionalGeneration(config)
    model.load_state_dict(model_state)
    if not honour_num_items:
        model.accepts_loss_kwargs = False  # Trainer then averages per micro-batch means
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / f"run-{batch_size}x{accumulation}"), max_steps=1, optim="sgd", learning_rate=0.5,
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0,  # no clipping: it would hide a scale error
        per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
        label_smoothing_factor=smoothing, save_strategy="no", report_to="none", use_cpu=True, seed=0,
        disable_tqdm=True,
    )
    trainer = build_trainer(model, tokenizer, args, dataset)
    trainer.train()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, trainer


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_trainer_gradient_accumulation_equals_full_batch(loaded, tmp_path, smoothing):
    from vaswani.training.finetune import tokenize_pairs

    model, tokenizer = loaded
    # very different target lengths: a mean of micro-batch means would weigh tokens unequally
    sources = ["A", "AB", "ABBREVIATE", "AACHEN", "ZYX", "ATTENTION", "AB", "TRANSFORMER"]
    targets = ["AH", "EY B IY", "AH B R IY V IY EY T", "AA K AH N", "Z", "AH T EH N SH AH N", "AE B",
               "T R AE N S F AO R M ER"]
    dataset = tokenize_pairs(tokenizer, sources, targets)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    full, trainer = _one_step(state, model.config, tokenizer, dataset, tmp_path, 8, 1, smoothing)
    accumulated, trainer = _one_step(state, model.config, tokenizer, dataset, tmp_path, 4, 2, smoothing)
    assert trainer.model_accepts_loss_kwargs  # Trainer passes num_items_in_batch to our forward
    moved = max((full[k] - state[k]).abs().max().item() for k in state)
    assert moved > 1e-3
    difference = max((full[k] - accumulated[k]).abs().max().item() for k in state)
    assert difference < 1e-6, difference
    # the check can fail: without the token count, 4 x 2 is not the batch of 8
    naive, _ = _one_step(state, model.config, tokenizer, dataset, tmp_path, 4, 2, smoothing, honour_num_items=False)
    assert max((full[k] - naive[k]).abs().max().item() for k in state) > 1e-5


def test_finetune_script_end_to_end(checkpoint, g2p_sample, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    finetune = _load_script("finetune")
    output_dir = tmp_path / "ft"
    trainer = finetune.main([
        "--model", str(checkpoint), "--output_dir", str(output_dir), "--g2p_file", str(g2p_sample),
        "--dev_percent", "20", "--max_train_samples", "200", "--max_eval_samples", "16", "--max_steps", "16",
        "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "2", "--learning_rate", "3e-3",
        "--label_smoothing_factor", "0.1", "--logging_steps", "1", "--disable_tqdm",
    ])
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 16
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.2, losses
    results = json.loads((output_dir / "eval_results.json").read_text())
    assert {"eval_loss", "eval_wer", "eval_per"} <= set(results)
    assert 0 <= results["eval_wer"] <= 100 and results["eval_per"] >= 0

    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    original = AutoModelForSeq2SeqLM.from_pretrained(checkpoint)
    assert type(model).__name__ == "VaswaniForConditionalGeneration"
    assert not torch.equal(model.lm_head.weight, original.lm_head.weight)
    assert model.config.label_smoothing == original.config.label_smoothing  # the flag was for this run only
    assert tokenizer("AACHEN")["input_ids"] == AutoTokenizer.from_pretrained(checkpoint)("AACHEN")["input_ids"]


def test_g2p_compute_metrics_uses_all_references(loaded):
    from transformers import EvalPrediction

    from vaswani.training.finetune import make_compute_metrics

    _, tokenizer = loaded
    references = [["AA K AH N", "AA K EH N"], ["EY B IY"]]
    predicted = [tokenizer(text_target="AA K EH N")["input_ids"], tokenizer(text_target="EY B")["input_ids"]]
    width = max(map(len, predicted))
    ids = np.array([[2] + p + [-100] * (width - len(p)) for p in predicted])  # Trainer pads with -100
    metrics = make_compute_metrics(tokenizer, references, "g2p")(EvalPrediction(predictions=ids, label_ids=ids))
    assert metrics == pytest.approx({"wer": 50.0, "per": 100 * 1 / 7})


# --- plot_attention ------------------------------------------------------------------------------------


def test_plot_attention_writes_three_pngs(checkpoint, tmp_path, capsys):
    plot_attention = _load_script("plot_attention")
    maps, paths = plot_attention.main([str(checkpoint), "TRANSFORMER", "--output_dir", str(tmp_path),
                                       "--max_new_tokens", "6"])
    printed = capsys.readouterr().out.split()
    assert printed == [str(p) for p in paths]
    assert sorted(p.name for p in paths) == ["cross_attention.png", "decoder_self_attention.png",
                                             "encoder_self_attention.png"]
    for path in paths:
        data = path.read_bytes()
        assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"

    layers, heads = 2, 4
    source, decoder = len(maps.source_tokens), len(maps.decoder_tokens)
    assert maps.source_tokens[:3] == ["T", "R", "A"] and maps.source_tokens[-1] == "</s>"
    assert maps.decoder_tokens[0] == "<s>" and maps.decoder_tokens[1:] == maps.output_tokens[:-1]
    assert len(maps.output_tokens) == decoder <= 6
    for kind, shape in [("encoder_self_attention", (source, source)), ("decoder_self_attention", (decoder, decoder)),
                        ("cross_attention", (decoder, source))]:
        weights = getattr(maps, kind)
        assert weights.shape == (layers, heads, *shape)
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
        rows, columns = maps.axes(kind)
        assert (len(rows), len(columns)) == shape
    # decoder self-attention is causal: nothing above the diagonal
    assert np.abs(np.triu(maps.decoder_self_attention, k=1)).max() == 0.0


def test_plot_attention_per_layer(loaded, tmp_path):
    from vaswani.training.attention_plots import attention_maps, save_attention_plots

    model, tokenizer = loaded
    maps = attention_maps(model, tokenizer, "AB", max_new_tokens=3)
    paths = save_attention_plots(maps, tmp_path, per_layer=True, prefix="ab_")
    assert [p.name for p in paths] == [f"ab_{kind}_layer{i}.png" for kind in
                                       ("encoder_self_attention", "decoder_self_attention", "cross_attention")
                                       for i in range(2)]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_finetune_script_on_parallel_text_reports_bleu_chrf(checkpoint, g2p_sample, tmp_path):
    finetune = _load_script("finetune")
    rows = [line.split("\t") for line in g2p_sample.read_text(encoding="utf-8").splitlines()]
    for name, part in (("train.tsv", rows[:64]), ("dev.tsv", rows[64:72])):
        (tmp_path / name).write_text("word\tphonemes\n" + "".join(f"{w}\t{p}\n" for w, p in part), encoding="utf-8")
    finetune.main([
        "--model", str(checkpoint), "--output_dir", str(tmp_path / "ft"), "--train_file", str(tmp_path / "train.tsv"),
        "--validation_file", str(tmp_path / "dev.tsv"), "--source_column", "word", "--target_column", "phonemes",
        "--max_steps", "2", "--per_device_train_batch_size", "16", "--disable_tqdm",
    ])
    results = json.loads((tmp_path / "ft" / "eval_results.json").read_text())
    assert {"eval_bleu", "eval_chrf"} <= set(results) and "eval_wer" not in results


def test_finetune_data_is_the_training_scripts_data(tmp_path):
    """finetune.py sees what train.py sees: the same crc32 dev rule and every reference of a source grouped."""
    from vaswani.training.data import is_dev_word
    from vaswani.training.finetune import finetune_data
    from vaswani.training.tasks import load_task_data

    rows = [(f"source {i}", f"target {i}") for i in range(300)]
    dev_source = next(s for s, _ in rows if is_dev_word(s))
    rows.append((dev_source, "another target"))
    path = tmp_path / "pairs.tsv"
    path.write_text("source\ttarget\n" + "".join(f"{s}\t{t}\n" for s, t in rows), encoding="utf-8")
    data = finetune_data(load_task_data("translation", str(path)))
    expected_dev = list(dict.fromkeys(s for s, _ in rows if is_dev_word(s)))
    assert data.eval_sources == expected_dev and 0 < len(expected_dev) < 300
    assert data.eval_references[expected_dev.index(dev_source)] == [rows[int(dev_source.split()[1])][1], "another target"]
    assert sorted(zip(data.train_sources, data.train_targets)) == sorted(p for p in rows if not is_dev_word(p[0]))
