"""vaswani-finetune (training/finetune.py), on a tiny checkpoint: collation, gradient accumulation with
Seq2SeqTrainer, the metrics, the data, and the script end to end (main(argv) in-process)."""

import json

import numpy as np
import pytest
import torch


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

    from vaswani.training import finetune

    output_dir = tmp_path / "ft"
    trainer = finetune.run_finetune(finetune.build_parser().parse_args([
        "--model", str(checkpoint), "--output_dir", str(output_dir), "--g2p_file", str(g2p_sample),
        "--dev_percent", "20", "--max_train_samples", "200", "--max_eval_samples", "16", "--max_steps", "16",
        "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "2", "--learning_rate", "3e-3",
        "--label_smoothing_factor", "0.1", "--logging_steps", "1", "--disable_tqdm",
    ]))
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


def test_finetune_script_on_parallel_text_reports_bleu_chrf(checkpoint, g2p_sample, tmp_path):
    from vaswani.training import finetune

    rows = [line.split("\t") for line in g2p_sample.read_text(encoding="utf-8").splitlines()]
    for name, part in (("train.tsv", rows[:64]), ("dev.tsv", rows[64:72])):
        (tmp_path / name).write_text("word\tphonemes\n" + "".join(f"{w}\t{p}\n" for w, p in part), encoding="utf-8")
    finetune.main([
        "--model", str(checkpoint), "--output_dir", str(tmp_path / "ft"), "--train_file", str(tmp_path / "train.tsv"),
        "--validation_file", str(tmp_path / "dev.tsv"), "--source_column", "word", "--target_column", "phonemes",
        "--max_steps", "2", "--per_device_train_batch_size", "16", "--disable_tqdm",
    ]) == 0
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
