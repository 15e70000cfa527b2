"""`python scripts/train.py ARGS` is `vaswani-train ARGS` (vaswani.training.cli.main), for a checkout:

    python scripts/train.py --time_budget 15m                       # one process (CPU or GPU)
    accelerate launch --multi_gpu --num_processes 4 scripts/train.py # data-parallel on 4 GPUs
    torchrun --nproc_per_node 2 scripts/train.py --cpu               # data-parallel on 2 CPU processes
"""

import sys

from vaswani.training.cli import main

if __name__ == "__main__":
    sys.exit(main())
