"""Token-budget batches bucketed by length, sharded across processes, resumable mid-epoch.

`TokenBudgetBatchSampler` packs example indices so that every batch's padded size stays within
the budget for source and target both: max(source len) * n <= max_tokens and
max(target len) * n <= max_tokens (lengths in tokens, eos included).

How batches are made (fairseq's recipe):
- each epoch, indices are sorted by (source length, target length) with ties broken by a random
  permutation drawn from (seed, epoch); the sorted list is packed greedily into batches; the
  batch order is then shuffled by a second generator from (seed, epoch). The sorted lengths do
  not depend on the tie order, so the number of batches is the same every epoch (`__len__`),
  while batch contents (among equal lengths) and order change with the epoch.
- an example that alone exceeds the budget is an error at construction (its index and lengths
  are named): filter long examples out, or raise `max_tokens`.
- sharding: the shuffled batch list is dealt round-robin, rank r gets batches r, r+R, r+2R, ...
  When the count is not a multiple of R: `drop_uneven=False` (default) pads the tail with the
  first batches of the epoch, so a few examples are seen twice; `drop_uneven=True` drops the
  last (count mod R) batches, which differ each epoch. Either way every rank yields exactly
  `len(sampler)` batches (collectives never hang), and when the count is a multiple of R each
  example is used exactly once per epoch across all ranks.

Resume: `state_dict(batches_done)` / `load_state_dict(state)` carry (epoch, batches done in
that epoch); the next `__iter__` of that epoch starts right after them, later epochs start at 0.
The loop must count batches itself: a DataLoader iterates the batch sampler ahead of the
batches it has handed out (prefetch), so the sampler cannot know what was consumed.

Recommended use with Accelerate (1 or N processes) -- the sampler shards, Accelerate does not:

    sampler = TokenBudgetBatchSampler(src_lens, tgt_lens, max_tokens=4096, seed=seed,
                                      num_replicas=accelerator.num_processes,
                                      rank=accelerator.process_index)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=Seq2SeqCollator(pad_id),
                        generator=torch.Generator().manual_seed(seed))  # see below
    loader = prepare_sharded_loader(accelerator, loader)   # device placement, no re-sharding
    sampler.load_state_dict(saved)                         # when resuming (epoch, batches_done)
    for epoch in range(start_epoch, epochs):
        loader.set_epoch(epoch)                            # reaches sampler.set_epoch
        for batch in loader: ...

The loader's own `generator` matters for an exact resume: each DataLoader iterator draws a
seed from the global torch RNG otherwise, which shifts dropout after a restart. The sampler
itself never touches torch's RNG (numpy generators seeded by (seed, epoch)).

Do not pass this loader to `accelerator.prepare`: with N > 1 processes it wraps any batch
sampler in `BatchSamplerShard`, which deals batches round-robin a second time (each rank would
see 1/N^2 of the data). `prepare_sharded_loader` calls `accelerate.data_loader.prepare_data_loader`
with `num_processes=1`, which keeps what `prepare` gives a loop (batches moved to the device,
`end_of_dataloader` for `accumulate`) and leaves the batches as ours. If you prefer Accelerate's
sharding instead, build the sampler with num_replicas=1 and call `accelerator.prepare(loader)`;
it then pads the tail by repeating the first batches (`even_batches=True`). This class has no
`batch_size` attribute on purpose: `BatchSamplerShard` then treats batches as variable-sized.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

# Per-label fields a distillation run's examples carry (`vaswani.training.distillation`), padded by the collator.
TEACHER_FIELDS = ("teacher_ids", "teacher_probs")


class TokenBudgetBatchSampler:
    """Batches of indices within a padded token budget; see the module docstring.

    Args:
        source_lengths, target_lengths: token counts per example (same length, eos included).
        max_tokens: budget for max(len) * batch size, applied to source and target separately.
        max_sentences: optional cap on examples per batch.
        seed: base of the per-epoch generator; batches are a function of (seed, epoch) only.
        num_replicas, rank: sharding across processes.
        drop_uneven: drop (True) or pad (False) the batches that do not divide by num_replicas.
    """

    def __init__(
        self,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int],
        max_tokens: int,
        max_sentences: int | None = None,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        drop_uneven: bool = False,
    ):
        self.source_lengths = np.asarray(source_lengths, dtype=np.int64)
        self.target_lengths = np.asarray(target_lengths, dtype=np.int64)
        if self.source_lengths.shape != self.target_lengths.shape or self.source_lengths.ndim != 1:
            raise ValueError(
                f"source_lengths ({self.source_lengths.shape}) and target_lengths ({self.target_lengths.shape}) "
                "must be 1-D and of the same length"
            )
        if len(self.source_lengths) == 0:
            raise ValueError("no examples to batch: source_lengths is empty")
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(f"max_sentences={max_sentences} must be >= 1 or None")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank={rank} must be in [0, num_replicas={num_replicas})")
        too_long = np.flatnonzero(np.maximum(self.source_lengths, self.target_lengths) > max_tokens)
        if len(too_long):
            i = int(too_long[0])
            raise ValueError(
                f"{len(too_long)} example(s) exceed max_tokens={max_tokens} on their own (first: index {i}, "
                f"source {self.source_lengths[i]} / target {self.target_lengths[i]} tokens); "
                "filter out long examples or raise max_tokens"
            )
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_uneven = drop_uneven
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, batches already done in it)

        self.num_global_batches = len(self._global_batches(0))
        if drop_uneven:
            self._per_rank = self.num_global_batches // num_replicas
        else:
            self._per_rank = -(-self.num_global_batches // num_replicas)
        if self._per_rank == 0:
            raise ValueError(
                f"{self.num_global_batches} batch(es) cannot be shared by {num_replicas} processes with "
                "drop_uneven=True; use drop_uneven=False or a smaller max_tokens"
            )

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose batches the next `__iter__` yields (DataLoaderShard calls this)."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Batches this rank yields in a full epoch (the same for every rank and epoch)."""
        return self._per_rank

    def __iter__(self):
        batches = self.epoch_batches(self.epoch)
        start = 0
        if self._resume is not None:
            if self._resume[0] != self.epoch:
                raise RuntimeError(
                    f"a resume position for epoch {self._resume[0]} is pending but epoch {self.epoch} is being "
                    f"iterated; call loader.set_epoch({self._resume[0]}) (or sampler.set_epoch) before iterating"
                )
            start = self._resume[1]
        self._resume = None
        yield from batches[start:]

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All batches this rank yields in `epoch`, in order."""
        batches = self._global_batches(epoch)
        order = self._generator(epoch, stream=1).permutation(len(batches))
        batches = [batches[i] for i in order]
        total = self._per_rank * self.num_replicas
        if total > len(batches):  # pad with the epoch's first batches
            batches = batches + batches[: total - len(batches)]
        return batches[self.rank : total : self.num_replicas]

    def state_dict(self, batches_done: int) -> dict:
        """The position to resume from: `batches_done` = batches of `self.epoch` the loop consumed."""
        return {"epoch": self.epoch, "batches_done": int(batches_done), "seed": self.seed,
                "num_replicas": self.num_replicas, "max_tokens": self.max_tokens}

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration of `state["epoch"]` skips its first `batches_done` batches."""
        for key in ("seed", "num_replicas", "max_tokens"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume: the saved position was made with {key}={state[key]}, this sampler has "
                    f"{key}={getattr(self, key)}; batches would differ. Resume with the same settings"
                )
        epoch, done = int(state["epoch"]), int(state["batches_done"])
        if not 0 <= done <= len(self):
            raise ValueError(f"batches_done={done} is outside [0, {len(self)}] batches per epoch")
        self.epoch = epoch
        self._resume = (epoch, done)

    def _generator(self, epoch: int, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch, stream])  # independent of torch/global RNG state

    def _global_batches(self, epoch: int) -> list[list[int]]:
        tie_break = self._generator(epoch, stream=0).permutation(len(self.source_lengths))
        src, tgt = self.source_lengths[tie_break], self.target_lengths[tie_break]
        order = tie_break[np.lexsort((tgt, src))]  # by source length, then target length
        batches: list[list[int]] = []
        batch: list[int] = []
        max_src = max_tgt = 0
        cap = self.max_sentences or len(order)
        for i in order.tolist():
            s, t = int(self.source_lengths[i]), int(self.target_lengths[i])
            new_src, new_tgt = max(max_src, s), max(max_tgt, t)
            n = len(batch) + 1
            if batch and (n > cap or new_src * n > self.max_tokens or new_tgt * n > self.max_tokens):
                batches.append(batch)
                batch, new_src, new_tgt = [], s, t
            batch.append(i)
            max_src, max_tgt = new_src, new_tgt
        batches.append(batch)
        return batches


class Seq2SeqCollator:
    """Pads a list of `{"input_ids": [...], "labels": [...]}` into a batch of tensors.

    Returns `input_ids` (B, S) padded with `pad_token_id`, `attention_mask` (B, S; 1 = real
    token) and `labels` (B, T) padded with -100 (ignored by the loss). Labels are the target ids
    with eos; the model derives decoder inputs by shifting them right. Examples that carry a
    distillation run's teacher targets (`teacher_ids`, `teacher_probs`: one (k,) row per label)
    give them as (B, T, k), padded rows at id 0 with probability 0.
    """

    def __init__(self, pad_token_id: int, label_pad_id: int = -100):
        self.pad_token_id = pad_token_id
        self.label_pad_id = label_pad_id

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        sources = [_as_list(f["input_ids"]) for f in features]  # lists padded in Python, then one tensor each
        targets = [_as_list(f["labels"]) for f in features]
        src_len, tgt_len = max(map(len, sources)), max(map(len, targets))
        mask = [[1] * len(s) + [0] * (src_len - len(s)) for s in sources]
        input_ids = [s + [self.pad_token_id] * (src_len - len(s)) for s in sources]
        labels = [t + [self.label_pad_id] * (tgt_len - len(t)) for t in targets]
        batch = {"input_ids": torch.tensor(input_ids, dtype=torch.long),
                 "attention_mask": torch.tensor(mask, dtype=torch.long),
                 "labels": torch.tensor(labels, dtype=torch.long)}
        for name in TEACHER_FIELDS:
            if name in features[0]:
                rows = [f[name] for f in features]
                batch[name] = torch.stack([torch.nn.functional.pad(r, (0, 0, 0, tgt_len - len(r))) for r in rows])
        return batch


def _as_list(ids) -> list[int]:
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)  # a tensor or an array, or a list already


def prepare_sharded_loader(accelerator, dataloader, non_blocking: bool = False):
    """Wrap a DataLoader whose `TokenBudgetBatchSampler` already shards, without sharding again.

    Checks that the sampler was built for this process (num_replicas/rank), then lets
    Accelerate place batches on the device and track the end of the loader.
    """
    from accelerate.data_loader import prepare_data_loader

    sampler = dataloader.batch_sampler
    if isinstance(sampler, TokenBudgetBatchSampler) and (
        sampler.num_replicas != accelerator.num_processes or sampler.rank != accelerator.process_index
    ):
        raise ValueError(
            f"the batch sampler shards for num_replicas={sampler.num_replicas}, rank={sampler.rank} but this is "
            f"process {accelerator.process_index} of {accelerator.num_processes}; build it with "
            "num_replicas=accelerator.num_processes, rank=accelerator.process_index"
        )
    return prepare_data_loader(
        dataloader,
        device=accelerator.device,
        num_processes=1,
        process_index=0,
        put_on_device=True,
        dispatch_batches=False,
        non_blocking=non_blocking,
    )
