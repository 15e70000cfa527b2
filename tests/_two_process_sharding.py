"""Run by tests/test_training_batching.py under torchrun with 2 CPU processes: each rank builds
the sampler for its own shard, wraps the loader with prepare_sharded_loader, and rank 0 writes
what every rank saw (gathered) to the JSON file named in argv[1]."""

import json
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from torch.utils.data import DataLoader

from vaswani.training.batching import Seq2SeqCollator, TokenBudgetBatchSampler, prepare_sharded_loader

accelerator = Accelerator(cpu=True)
lengths = [(i % 13) + 1 for i in range(101)]
sampler = TokenBudgetBatchSampler(lengths, lengths, max_tokens=40, seed=5,
                                  num_replicas=accelerator.num_processes, rank=accelerator.process_index)
data = [{"input_ids": [1] * n, "labels": [i] * n} for i, n in enumerate(lengths)]
loader = prepare_sharded_loader(accelerator, DataLoader(data, batch_sampler=sampler, collate_fn=Seq2SeqCollator(0)))
seen = {}
for epoch in (0, 1):
    loader.set_epoch(epoch)
    seen[epoch] = [batch["labels"][:, 0].tolist() for batch in loader]
report = gather_object([{"rank": accelerator.process_index, "num_processes": accelerator.num_processes,
                         "distributed_type": str(accelerator.distributed_type), "batches": len(loader),
                         "global_batches": sampler.num_global_batches, "seen": seen}])
if accelerator.is_main_process:
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)
accelerator.wait_for_everyone()
accelerator.end_training()
