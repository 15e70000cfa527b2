import json
import os
import random
from helpers import run_group
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from vaswani.training.batching import Seq2SeqCollator, TokenBudgetBatchSampler, prepare_sharded_loader

N = 500
_rng = random.Random(0)
SRC = [_rng.randint(1, 30) for _ in range(N)]
TGT = [_rng.randint(1, 40) for _ in range(N)]
BUDGET = 120


def sampler(**kw):
    args = dict(source_lengths=SRC, target_lengths=TGT, max_tokens=BUDGET, seed=1)
    args.update(kw)
    return TokenBudgetBatchSampler(**args)


def test_no_batch_over_budget_and_batches_are_bucketed():
    s = sampler(max_sentences=8)
    batches = s.epoch_batches(0)
    for b in batches:
        assert max(SRC[i] for i in b) * len(b) <= BUDGET
        assert max(TGT[i] for i in b) * len(b) <= BUDGET
        assert len(b) <= 8
    # bucketing: padding waste far below that of random batches of the same sizes
    real = sum(SRC[i] for b in batches for i in b)
    padded = sum(max(SRC[i] for i in b) * len(b) for b in batches)
    assert padded < 1.15 * real


def test_every_example_once_per_epoch():
    s = sampler()
    for epoch in range(3):
        s.set_epoch(epoch)
        seen = [i for b in s for i in b]
        assert sorted(seen) == list(range(N))
        assert len(list(s)) == len(s)


def test_same_seed_and_epoch_same_batches_other_epoch_other_order():
    a, b = sampler(), sampler()
    assert a.epoch_batches(3) == b.epoch_batches(3)
    assert a.epoch_batches(0) != a.epoch_batches(1)
    assert sampler(seed=2).epoch_batches(0) != a.epoch_batches(0)
    assert len(a.epoch_batches(0)) == len(a.epoch_batches(1)) == len(a)  # count fixed across epochs


def _two_shards(**kw):
    return [sampler(num_replicas=2, rank=r, **kw) for r in range(2)]


def test_two_shards_pad_tail():
    budget = next(b for b in range(100, 200) if len(sampler(max_tokens=b)) % 2 == 1)
    shards = _two_shards(max_tokens=budget)
    assert len(shards[0]) == len(shards[1]) == len(sampler(max_tokens=budget)) // 2 + 1
    batches = [s.epoch_batches(4) for s in shards]
    per_rank = [[i for b in rank_batches for i in b] for rank_batches in batches]
    assert set(per_rank[0]) | set(per_rank[1]) == set(range(N))
    # exactly one padded batch: rank 1's last is a copy of the epoch's first (rank 0's first)
    assert batches[1][-1] == batches[0][0]
    assert sorted(set(per_rank[0]) & set(per_rank[1])) == sorted(batches[0][0])
    assert len(per_rank[0]) + len(per_rank[1]) == N + len(batches[0][0])


def test_two_shards_exactly_once_when_divisible():
    # pick a budget whose batch count is even, then check a disjoint, complete cover
    budget = next(b for b in range(100, 200) if len(sampler(max_tokens=b)) % 2 == 0)
    shards = _two_shards(max_tokens=budget)
    per_rank = [[i for b in s.epoch_batches(2) for i in b] for s in shards]
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == list(range(N))


def test_two_shards_drop_uneven():
    budget = next(b for b in range(100, 200) if len(sampler(max_tokens=b)) % 2 == 1)
    shards = _two_shards(max_tokens=budget, drop_uneven=True)
    assert len(shards[0]) == len(shards[1]) == len(sampler(max_tokens=budget)) // 2
    per_rank = [[i for b in s.epoch_batches(0) for i in b] for s in shards]
    assert not set(per_rank[0]) & set(per_rank[1])
    assert len(set(per_rank[0]) | set(per_rank[1])) < N


def test_resume_skips_exactly_the_consumed_batches():
    s = sampler()
    s.set_epoch(2)
    it = iter(s)
    consumed = [next(it) for _ in range(7)]
    state = s.state_dict(batches_done=len(consumed))
    rest_expected = list(it)

    resumed = sampler()
    resumed.load_state_dict(state)
    assert list(resumed) == rest_expected
    resumed.set_epoch(2)  # the pending skip applied once; the next pass is whole
    assert list(resumed) == consumed + rest_expected


def test_resume_guards():
    s = sampler()
    s.load_state_dict({"epoch": 3, "batches_done": 2})
    s.set_epoch(0)
    with pytest.raises(RuntimeError, match="set_epoch\\(3\\)"):
        list(s)
    with pytest.raises(ValueError, match="max_tokens"):
        sampler().load_state_dict({"epoch": 0, "batches_done": 1, "max_tokens": 99})


def test_example_over_budget_is_an_error():
    with pytest.raises(ValueError, match="index 1.*raise max_tokens"):
        TokenBudgetBatchSampler([3, 50, 2], [3, 4, 2], max_tokens=40)


def test_collator_pads_and_masks():
    batch = Seq2SeqCollator(pad_token_id=0)(
        [{"input_ids": [5, 6, 2], "labels": [7, 2]}, {"input_ids": [9, 2], "labels": [8, 8, 8, 2]}]
    )
    assert batch["input_ids"].tolist() == [[5, 6, 2], [9, 2, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[7, 2, -100, -100], [8, 8, 8, 2]]
    assert {t.dtype for t in batch.values()} == {torch.long}
    as_tensors = Seq2SeqCollator(pad_token_id=0)(  # features as tensors (a datasets.Dataset with format "torch")
        [{"input_ids": torch.tensor([5, 6, 2]), "labels": torch.tensor([7, 2])},
         {"input_ids": torch.tensor([9, 2]), "labels": torch.tensor([8, 8, 8, 2])}]
    )
    assert all(torch.equal(as_tensors[k], batch[k]) for k in batch)


def _dataset():
    return [{"input_ids": [3] * SRC[i], "labels": [i] * TGT[i]} for i in range(N)]


def test_dataloader_and_accelerate_without_second_sharding():
    from accelerate import Accelerator

    s = sampler()
    loader = DataLoader(_dataset(), batch_sampler=s, collate_fn=Seq2SeqCollator(0))
    prepared = prepare_sharded_loader(Accelerator(cpu=True), loader)
    assert len(prepared) == len(s)
    for epoch in (0, 1):
        prepared.set_epoch(epoch)
        got = [b["labels"][:, 0].tolist() for b in prepared]
        assert got == s.epoch_batches(epoch)  # labels[:, 0] is the example index
    # resume through the prepared loader
    s.load_state_dict({"epoch": 1, "batches_done": 5})
    prepared.set_epoch(1)
    assert [b["labels"][:, 0].tolist() for b in prepared] == s.epoch_batches(1)[5:]
    with pytest.raises(ValueError, match="num_replicas"):
        prepare_sharded_loader(Accelerator(cpu=True), DataLoader(_dataset(), batch_sampler=sampler(num_replicas=2)))


def test_accelerate_sharding_of_a_global_sampler_covers_everything():
    """The alternative: num_replicas=1 and Accelerate shards (2 processes simulated)."""
    from accelerate.data_loader import prepare_data_loader

    s = sampler()
    seen = []
    for rank in range(2):
        loader = DataLoader(_dataset(), batch_sampler=s, collate_fn=Seq2SeqCollator(0))
        shard = prepare_data_loader(loader, num_processes=2, process_index=rank)
        batches = [b["labels"][:, 0].tolist() for b in shard]
        assert len(batches) == -(-len(s) // 2)
        seen += [i for b in batches for i in b]
    assert set(seen) == set(range(N))


def test_prepare_sharded_loader_keeps_each_ranks_shard():
    """Two ranks, simulated: each prepared loader yields exactly its own shard, not a shard of it."""
    from types import SimpleNamespace

    seen = []
    for rank in range(2):
        s = sampler(num_replicas=2, rank=rank)
        fake = SimpleNamespace(num_processes=2, process_index=rank, device=torch.device("cpu"))
        prepared = prepare_sharded_loader(fake, DataLoader(_dataset(), batch_sampler=s, collate_fn=Seq2SeqCollator(0)))
        prepared.set_epoch(1)
        batches = [b["labels"][:, 0].tolist() for b in prepared]
        assert batches == s.epoch_batches(1)
        seen += [i for b in batches for i in b]
    assert set(seen) == set(range(N))


def test_two_real_processes(tmp_path):
    script = Path(__file__).with_name("_two_process_sharding.py")
    out = tmp_path / "report.json"
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1")
    torchrun = Path(sys.executable).with_name("torchrun")
    for _ in range(2):  # a rank can abort at exit after finishing (seen with gloo); judge by the report
        run_group([str(torchrun), "--standalone", "--nproc_per_node", "2", str(script), str(out)],
                  timeout=120, env=env, capture_output=True)
        if out.exists():
            break
    report = json.loads(out.read_text())
    assert [r["num_processes"] for r in report] == [2, 2]
    assert all(r["distributed_type"].endswith("MULTI_CPU") for r in report)
    assert report[0]["batches"] == report[1]["batches"] == -(-report[0]["global_batches"] // 2)
    for epoch in ("0", "1"):
        ranks = [[i for b in r["seen"][epoch] for i in b] for r in report]
        assert len(r0 := ranks[0]) == len(set(r0)) and set(ranks[0]) | set(ranks[1]) == set(range(101))
        if report[0]["global_batches"] % 2 == 0:
            assert not set(ranks[0]) & set(ranks[1])
    assert report[0]["seen"]["0"] != report[0]["seen"]["1"]
