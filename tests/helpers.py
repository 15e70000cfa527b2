"""What several test files share: the repository's path, a script of scripts/ loaded as a module, a tiny G2P
checkpoint like the training loop writes, a subprocess runner that leaves nothing behind, vaswani-train run as a
subprocess on a slice of CMUdict, and the preamble of scripts that must run without `vaswani`."""

import importlib.util
import os
import signal
import shutil
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def load_script(name: str):
    """scripts/<name>.py as a module, so that a test calls its main(argv) in-process (nothing imports scripts/)."""
    spec = importlib.util.spec_from_file_location(f"{name}_script", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A checkpoint folder like the training loop writes (model.save_pretrained + tokenizer.save_pretrained), from a tiny
# random model and a G2P tokenizer trained on the first lines of the shipped CMUdict split.

def write_g2p_sample(path: Path, lines: int = 300) -> Path:
    """The first `lines` lines of the CMUdict split, as a WORD<TAB>PHONEMES file."""
    from vaswani.training.data import default_g2p_file

    with default_g2p_file().open(encoding="utf-8") as f:
        path.write_text("".join(next(f) for _ in range(lines)), encoding="utf-8")
    return path


def make_tiny_checkpoint(folder: Path, sample: Path, seed: int = 0, **config_overrides) -> Path:
    """Tokenizer (one piece per letter and phoneme of `sample`) + tiny model, saved into `folder`."""
    import vaswani
    from vaswani.tokenizer import train_tokenizer

    symbols = set()
    for line in sample.read_text(encoding="utf-8").splitlines():
        word, phonemes = line.split("\t")
        symbols |= set(word) | set(phonemes.split())
    tokenizer = train_tokenizer([sample], folder, len(symbols) + 4, "word", columns=[0, 1], spell_source=True)
    config = vaswani.VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer), **{"dropout": 0.0, **config_overrides})
    torch.manual_seed(seed)
    model = vaswani.VaswaniForConditionalGeneration(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# Run a command in its own process group and leave nothing behind: on a timeout, and after a normal exit (a torchrun
# rank can hang at exit after its work is done), the whole group is killed.

def run_group(command, timeout, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    if kwargs.pop("capture_output", False):
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    process = subprocess.Popen(command, start_new_session=True, **kwargs)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        stdout, stderr = process.communicate()
        raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr) from None
    finally:
        _kill_group(process.pid)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass



# vaswani-train (scripts/train.py) as a subprocess, for the tests of the loop, the command, the export, the model card,
# the tasks and vaswani-average: a few hundred CMUdict lines, the tiny preset, one thread per process, offline.

TRAIN = REPO / "scripts" / "train.py"


def script_workspace(root: Path, scripts, stand_in: str) -> Path:
    """`root` laid out like the repository for a shell pipeline of scripts/: copies of `scripts`, a setup_env.sh that
    does nothing, and `stand_in` as .venv/bin/python (each script's test records what it is asked to run)."""
    (root / "scripts").mkdir()
    for script in scripts:
        shutil.copy(REPO / "scripts" / script, root / "scripts")
    (root / "scripts" / "setup_env.sh").write_text("exit 0\n")
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(stand_in)
    python.chmod(0o755)
    return root
# float32 on every machine (the g2p default, --mixed_precision auto, is bf16 where the CPU multiplies it natively)
TINY = ["--preset", "tiny", "--task", "g2p", "--dev_percent", "10", "--max_tokens", "150", "--no_progress_bar",
        "--eval_subset", "0", "--eval_batch_size", "64", "--mixed_precision", "no"]
QUIET = [*TINY, "--no_tensorboard"]


def train_env(tmp_path, **extra) -> dict:
    """The environment of a training subprocess: one thread, offline, its own HF_HOME, no inherited ranks."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"),
               TOKENIZERS_PARALLELISM="false", **extra)
    return env


def run_train(args, tmp_path, launcher=(), timeout=240, **env) -> subprocess.CompletedProcess:
    """scripts/train.py ARGS in `tmp_path` (under `launcher`, e.g. torchrun's module, when given)."""
    command = [sys.executable, *launcher, str(TRAIN), *args] if launcher else [sys.executable, str(TRAIN), *args]
    return run_group(command, timeout, env=train_env(tmp_path, **env), capture_output=True, text=True, cwd=tmp_path)


def write_train_workspace(root: Path) -> Path:
    """A slice of CMUdict (every 400th line: ~280 lines, ~25 dev words) as `root`/g2p.tsv and a tokenizer trained on
    it once, `root`/tokenizer."""
    from vaswani.training.data import default_g2p_file
    from vaswani.training.tasks import build_tokenizer, load_task_data

    lines = default_g2p_file().read_text(encoding="utf-8").splitlines()[::400]
    data = root / "g2p.tsv"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    build_tokenizer(load_task_data("g2p", str(data), dev_percent=10), root / "tokenizer")
    return root


def tensors(path) -> dict:
    """The tensors of a safetensors file."""
    from safetensors.torch import load_file

    return load_file(str(path))


def mean_weights(files, name) -> torch.Tensor:
    """The mean of tensor `name` over safetensors `files`, summed in float64."""
    return (sum(tensors(f)[name].double() for f in files) / len(files)).float()

# The preamble of scripts that must run where `vaswani` is NOT importable: the package is installed in the test
# environment (editable or not), so every `vaswani` import is refused rather than merely left off the path, and the
# script checks that the refusal works before it proves anything.
REFUSE_VASWANI = '''
import sys

class RefuseVaswani:
    def find_spec(self, name, path=None, target=None):
        if name == "vaswani" or name.startswith("vaswani."):
            raise ModuleNotFoundError(f"No module named {name!r} (refused by the test)")

sys.meta_path.insert(0, RefuseVaswani())
try:
    import vaswani  # noqa: F401
    raise SystemExit("vaswani is importable: the test would prove nothing")
except ModuleNotFoundError:
    pass
'''


# The model tests' shared tiny models and batches.
VOCAB = 100


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def make_model(config, attn="sdpa", seed=0):
    """A tiny model whose biases and layer-norm weights are random too: initialisation zeroes the biases and sets
    the norms to one, which would hide every misplaced bias or norm parameter from the tests that use it."""
    from vaswani import VaswaniForConditionalGeneration

    torch.manual_seed(seed)
    config._attn_implementation = attn
    model = VaswaniForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(0.0, 0.2)
            elif "norm" in name and name.endswith(".weight"):
                parameter.normal_(1.0, 0.2)
    return model


def padded_batch(seed=0, batch=4, src_len=9, tgt_len=7):
    """Random ids with random right padding in source and target (every row keeps at least one token)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, VOCAB, (batch, src_len), generator=g)
    labels = torch.randint(4, VOCAB, (batch, tgt_len), generator=g)
    src_lens = torch.randint(1, src_len + 1, (batch,), generator=g)
    tgt_lens = torch.randint(1, tgt_len + 1, (batch,), generator=g)
    src_lens[0], tgt_lens[0] = src_len, tgt_len  # one full row, so the padded length is reached
    attention_mask = (torch.arange(src_len) < src_lens[:, None]).long()
    decoder_attention_mask = (torch.arange(tgt_len) < tgt_lens[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    labels = labels.masked_fill(decoder_attention_mask == 0, -100)
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        labels=labels,
        decoder_attention_mask=decoder_attention_mask,
    )


def train_tiny(folder: Path, steps: int = 300, seed: int = 0) -> Path:
    """Trains the checkpoint in `folder` (see make_tiny_checkpoint) on the G2P sample it was made from, in place:
    a plain Adam loop on batches of 32 words, so that its outputs are pronunciations, not noise. A final logits bias
    is set at random first."""
    from vaswani.training.data import default_g2p_file
    from vaswani.training.generation import load_checkpoint

    model, tokenizer = load_checkpoint(folder, device="cpu")
    with default_g2p_file().open(encoding="utf-8") as f:
        pairs = [line.rstrip("\n").split("\t") for _, line in zip(range(300), f)]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    if model.final_logits_bias is not None:  # a fixed buffer (zeros at init): a random one, which training works around
        model.final_logits_bias.normal_(0.0, 0.5, generator=generator)
    model.train()
    for _ in range(steps):
        rows = torch.randint(len(pairs), (32,), generator=generator).tolist()
        batch = tokenizer([pairs[i][0] for i in rows], text_target=[pairs[i][1] for i in rows], padding=True,
                          return_tensors="pt")
        batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(folder)
    return folder


def held_out_words(count: int = 100, sample_lines: int = 300) -> list[str]:
    """`count` words of the shipped CMUdict split beyond its first `sample_lines` lines (the sample the tiny
    checkpoints train on), spread over the alphabet."""
    from vaswani.training.data import default_g2p_file

    with default_g2p_file().open(encoding="utf-8") as f:
        lines = f.read().splitlines()
    seen = {line.split("\t")[0] for line in lines[:sample_lines]}
    words = [w for w in dict.fromkeys(line.split("\t")[0] for line in lines[sample_lines:]) if w not in seen]
    stride = max(1, len(words) // count)
    return words[::stride][:count]
