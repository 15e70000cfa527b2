"""Filters two harmless import-time notes out of the logs: torchao's, which transformers triggers by importing torchao
where it is installed (the `vaswani[export]` extra). One is torchao's CUDA kernel libraries failing to load on a CPU
build of torch, the other torch's deprecation of torchao's enum registration. Left alone, they would precede every
command's output and its one-line errors. Nothing else logged by torchao or torch is touched."""

import logging


def _is_known_noise(record: logging.LogRecord) -> bool:
    message = str(record.msg)
    return (message.startswith("Failed to load") and ".so" in message) or "is an Enum subclass" in message


for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).addFilter(lambda record: not _is_known_noise(record))
