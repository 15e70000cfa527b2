"""vaswani.training.distillation (`vaswani-train --teachers`): the loss against a dense float64 cross-entropy, the
teachers' targets against each example's own unbatched forward, the collator's padding of them, the refusal of a
teacher with another tokenizer, and a run whose student moves toward its teacher (and one without, which does not)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from helpers import QUIET, make_tiny_checkpoint, run_train, write_g2p_sample

from vaswani.training.batching import Seq2SeqCollator
from vaswani.training.distillation import attach_teacher_targets, distillation_loss, load_teachers


def test_the_loss_is_the_dense_cross_entropy_against_the_teachers_distribution_over_the_labelled_positions():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g)
    teacher = torch.softmax(torch.randn(3, 5, 11, generator=g) * 2, -1)
    labels = torch.randint(0, 11, (3, 5), generator=g)
    labels[1, 3:] = -100
    labels[2, 1:] = -100
    probs, ids = teacher.topk(11, dim=-1)  # every token kept: the dense distribution, reordered
    mask = labels != -100
    expected = -(teacher.double() * torch.log_softmax(logits.double(), -1)).sum(-1)[mask].mean()
    assert torch.allclose(distillation_loss(logits, labels, ids, probs).double(), expected, atol=1e-6)
    # a teacher sure of the labels gives the plain cross-entropy (the model's loss without label smoothing)
    one_hot = torch.ones(3, 5, 1)
    plain = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert torch.allclose(distillation_loss(logits, labels, labels.clamp(min=0)[..., None], one_hot), plain, atol=1e-6)


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    """Two tiny random teachers with one tokenizer, and a few encoded training examples of different lengths."""
    from vaswani.training.tasks import encode_pairs, load_task_data

    root = tmp_path_factory.mktemp("distill")
    sample = write_g2p_sample(root / "g2p.tsv", lines=200)
    folders = [make_tiny_checkpoint(root / f"teacher{seed}", sample, seed=seed) for seed in (1, 2)]
    from vaswani import VaswaniTokenizer

    tokenizer = VaswaniTokenizer.from_pretrained(folders[0])
    examples = encode_pairs(tokenizer, load_task_data("g2p", str(sample), dev_percent=0).train_pairs[:40])
    return folders, tokenizer, examples


def test_each_examples_targets_are_the_mean_of_its_teachers_distributions_as_if_decoded_alone(teachers):
    folders, tokenizer, examples = teachers
    models = load_teachers(folders, tokenizer)
    vocab = models[0].config.vocab_size
    dense = [dict(e) for e in examples]
    attach_teacher_targets(models, dense, tokenizer.pad_token_id, top_k=vocab, max_tokens=64, log=lambda _: None)
    top = [dict(e) for e in examples]
    attach_teacher_targets(models, top, tokenizer.pad_token_id, top_k=3, max_tokens=64, log=lambda _: None)
    lengths = {len(e["labels"]) for e in examples}
    assert len(lengths) > 2  # batches of several lengths, padded
    for example, with_all, with_top in zip(examples, dense, top):
        one = Seq2SeqCollator(tokenizer.pad_token_id)([example])  # alone: no padding
        with torch.no_grad():
            mean = sum(torch.softmax(m(**one).logits[0].double(), -1) for m in models) / len(models)
        assert with_all["teacher_ids"].shape == (len(example["labels"]), vocab)
        rebuilt = torch.zeros_like(mean).scatter_(-1, with_all["teacher_ids"], with_all["teacher_probs"].double())
        assert torch.allclose(rebuilt, mean, atol=1e-5)
        # top 3: the three most likely tokens, renormalized over them
        assert with_top["teacher_ids"].shape == (len(example["labels"]), 3)
        assert torch.equal(with_top["teacher_ids"], with_all["teacher_ids"][:, :3])
        expected = with_all["teacher_probs"][:, :3] / with_all["teacher_probs"][:, :3].sum(-1, keepdim=True)
        assert torch.allclose(with_top["teacher_probs"], expected, atol=1e-6)


def test_the_collator_pads_the_teachers_targets_with_zero_probability(teachers):
    _, tokenizer, examples = teachers
    features = [{**e, "teacher_ids": torch.full((len(e["labels"]), 2), 7),
                 "teacher_probs": torch.full((len(e["labels"]), 2), 0.5)} for e in examples[:6]]
    batch = Seq2SeqCollator(tokenizer.pad_token_id)(features)
    assert batch["teacher_ids"].shape == batch["teacher_probs"].shape == (*batch["labels"].shape, 2)
    real = batch["labels"] != -100
    assert (~real).any()
    assert (batch["teacher_probs"][real] == 0.5).all() and (batch["teacher_probs"][~real] == 0).all()
    assert (batch["teacher_ids"][real] == 7).all() and (batch["teacher_ids"][~real] == 0).all()


def test_a_teacher_with_another_tokenizer_is_refused_with_the_fix(teachers, tmp_path):
    folders, tokenizer, _ = teachers
    other = make_tiny_checkpoint(tmp_path / "other", write_g2p_sample(tmp_path / "few.tsv", lines=12))
    with pytest.raises(ValueError, match=r"another tokenizer.*--tokenizer "):
        load_teachers([folders[0], other], tokenizer)
    with pytest.raises(ValueError, match="is not a saved model folder"):
        load_teachers([tmp_path / "missing"], tokenizer)


def test_a_distilled_student_moves_toward_its_teacher_and_a_plain_one_does_not(trained_run, train_workspace,
                                                                                 tmp_path):
    """Students of the same seed, data and steps, one with `--teachers` (alpha 1: the teacher's targets alone): its
    cross-entropy against the teacher's distribution on the training words ends well below the plain student's."""
    from vaswani.training.generation import load_checkpoint
    from vaswani.training.tasks import encode_pairs, load_task_data

    teacher_folder, _ = trained_run
    common = ["--train_file", str(train_workspace / "g2p.tsv"), "--tokenizer", str(teacher_folder), *QUIET,
              "--max_steps", "60", "--eval_every", "0", "--save_every", "0", "--num_beams", "1", "--show", "--lr",
              "3e-3", "--warmup_steps", "10", "--seed", "5"]
    runs = {}
    for name, extra in (("plain", []), ("distilled", ["--teachers", str(teacher_folder), "--distill_alpha", "1"])):
        result = run_train([*common, *extra, "--output_dir", str(tmp_path / name)], tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = result
    assert "distillation: 1 teacher(s), top 8 of their mean distribution" in runs["distilled"].stdout
    assert "distillation" not in runs["plain"].stdout
    saved = json.loads((tmp_path / "distilled" / "training_args.json").read_text())
    assert saved["teachers"] == [str(teacher_folder)] and saved["distill_alpha"] == 1.0
    card = (tmp_path / "distilled" / "README.md").read_text()
    assert (f"| distillation | token-level, from the mean distribution of 1 teacher(s) ({teacher_folder.name}), "
            "top 8, weight 1.0 against the labels' |") in card
    assert "| distillation |" not in (tmp_path / "plain" / "README.md").read_text()

    teacher, tokenizer = load_checkpoint(teacher_folder, device="cpu")
    data = load_task_data("g2p", str(train_workspace / "g2p.tsv"), dev_percent=10)
    batch = Seq2SeqCollator(tokenizer.pad_token_id)(encode_pairs(tokenizer, data.train_pairs[:64]))
    with torch.no_grad():
        target = torch.softmax(teacher(**batch).logits, -1)
        probs, ids = target.topk(target.shape[-1], dim=-1)
        losses = {name: distillation_loss(load_checkpoint(tmp_path / name, device="cpu")[0](**batch).logits,
                                          batch["labels"], ids, probs).item() for name in runs}
    assert losses["distilled"] < losses["plain"] - 0.05, losses


def test_a_distilled_run_resumed_from_a_checkpoint_ends_bit_for_bit_as_the_run_left_alone(trained_run,
                                                                                         train_workspace, tmp_path):
    """The teachers' targets are computed again on resume, from the same teachers and examples: the run from step
    20's checkpoint ends with the weights of the run that went on."""
    import shutil

    from helpers import tensors

    teacher_folder, _ = trained_run
    common = ["--train_file", str(train_workspace / "g2p.tsv"), "--tokenizer", str(teacher_folder), *QUIET,
              "--max_steps", "40", "--eval_every", "0", "--save_every", "20", "--keep_last", "3", "--num_beams", "1",
              "--show", "--teachers", str(teacher_folder), str(teacher_folder), "--distill_top_k", "4"]
    straight = tmp_path / "straight"
    result = run_train([*common, "--output_dir", str(straight)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = tmp_path / "resumed"
    shutil.copytree(straight / "checkpoints" / "checkpoint-20", resumed / "checkpoints" / "checkpoint-20")
    again = run_train([*common, "--output_dir", str(resumed), "--resume"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(step 20, epoch" in again.stdout and "distillation: 2 teacher(s), top 4" in again.stdout
    a = tensors(straight / "checkpoints" / "checkpoint-40" / "model.safetensors")
    b = tensors(resumed / "checkpoints" / "checkpoint-40" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = tensors(straight / "checkpoints" / "checkpoint-20" / "model.safetensors")
    assert not all(torch.equal(a[k], start[k]) for k in a)  # it trained on from step 20


def test_vaswani_train_refuses_a_teacher_with_another_tokenizer_in_one_line(teachers, train_workspace, tmp_path):
    folders, _, _ = teachers
    result = run_train(["--train_file", str(train_workspace / "g2p.tsv"), "--tokenizer",
                        str(train_workspace / "tokenizer"), *QUIET, "--max_steps", "5", "--teachers", str(folders[0]),
                        "--output_dir", str(tmp_path / "out")], tmp_path)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("vaswani-train: error: --teachers: ") and "another tokenizer" in last, last
    assert "Traceback" not in result.stderr
