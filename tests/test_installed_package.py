"""The package as a user gets it: build the sdist and, from it, the wheel; check what they carry; install the wheel
(not editable) into a fresh virtual environment; then, from an empty folder far from the checkout, run the console
scripts: `--help` of each, `vaswani-train --max_steps 20 --output_dir out` on the default data, the filled model
card, and `echo HELLO | vaswani-generate out`.

Slow (minutes: torch and the other dependencies are installed into the new environment), so marked `slow`: the
default `bash scripts/run_tests.sh` leaves it out and `.ci/run` runs it once (`-m slow`). torch comes from the pinned
version (`pip install torch==2.13.0`, the CPU wheel here) before the wheel, so that pip never pulls a CUDA build.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from helpers import REPO, run_group

pytestmark = pytest.mark.slow

TORCH = os.environ.get("TORCH_VERSION", "2.13.0")
COMMANDS = ["vaswani-train", "vaswani-generate", "vaswani-finetune", "vaswani-train-tokenizer",
            "vaswani-convert-marian", "vaswani-average", "vaswani-release", "vaswani-plot-attention", "vaswani-export"]
SHIPPED = ["vaswani/data/cmudict-g2p/g014b2b.train.tsv", "vaswani/data/cmudict-g2p/SOURCE.md",
           "vaswani/data/model_card.md"]
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                     "outputs", "runs", "out", ".whl")


def _run(command, timeout, **kwargs) -> subprocess.CompletedProcess:
    result = run_group(command, timeout, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def _user_env(tmp_path: Path, venv: Path) -> dict:
    """A user's shell: the new environment first on PATH, nothing of the checkout or the test run's Python."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "WORLD_SIZE",
                                                            "RANK", "LOCAL_RANK")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"),
               TOKENIZERS_PARALLELISM="false", MPLCONFIGDIR=str(tmp_path / "mpl"))
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist, wheel): the sdist from a copy of the source tree, the wheel from the unpacked sdist (so the sdist
    must hold everything the wheel needs)."""
    root = tmp_path_factory.mktemp("build")
    source = shutil.copytree(REPO, root / "source", ignore=_NOT_SOURCE)
    build = "import sys, setuptools.build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"
    sdist = source / "dist" / _run([sys.executable, "-c", build, "build_sdist", str(source / "dist")], 300,
                                   cwd=source).stdout.split()[-1]
    with tarfile.open(sdist) as archive:
        archive.extractall(root / "unpacked", filter="data")
    unpacked = next((root / "unpacked").iterdir())
    wheel = root / _run([sys.executable, "-c", build, "build_wheel", str(root)], 300, cwd=unpacked).stdout.split()[-1]
    return sdist, wheel


def test_wheel_and_sdist_carry_the_data_the_template_and_the_commands(built):
    sdist, wheel = built
    names = sorted(zipfile.ZipFile(wheel).namelist())
    print(f"\n{wheel.name}:\n  " + "\n  ".join(names))
    for name in SHIPPED + ["vaswani/__init__.py", "vaswani/modeling_vaswani.py", "vaswani/data/__init__.py",
                           "vaswani/tokenizer/tokenization_vaswani.py", "vaswani/training/cli.py",
                           "vaswani/deploy/cli.py"]:
        assert name in names, name
    assert all(n.startswith(("vaswani/", "vaswani-")) for n in names), "only the vaswani package is installed"
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert all(f"{command} = " in entry_points for command in COMMANDS), entry_points
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"data/cmudict-g2p/g014b2b.train.tsv", "data/cmudict-g2p/SOURCE.md", "data/model_card.md",
            "CHANGELOG.md", "README.md"} <= in_sdist


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory):
    """A fresh virtual environment (no system site-packages) with torch==TORCH, then the wheel, not editable."""
    root = tmp_path_factory.mktemp("user")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], 300)
    env = _user_env(root, venv)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, f"torch=={TORCH}"], 900, env=env)
    _run([*pip, str(built[1])], 900, env=env)
    home = root / "home"  # the user's empty folder, far from the checkout
    home.mkdir()
    return venv, home, env


def test_installed_package_is_the_wheel_with_its_metadata_version(installed):
    venv, home, env = installed
    probe = ("import json, vaswani, vaswani.data, vaswani.training.data as d; "
             "print(json.dumps([vaswani.__version__, vaswani.__file__, str(d.default_g2p_file())]))")
    version, init, data = json.loads(_run([str(venv / "bin" / "python"), "-c", probe], 120, env=env, cwd=home)
                                     .stdout.strip().splitlines()[-1])
    assert version == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for path in (init, data):
        assert Path(path).resolve().is_relative_to(venv.resolve()), path  # site-packages, not the checkout


def test_every_command_answers_help_without_a_checkout(installed):
    venv, home, env = installed
    for command in COMMANDS:
        result = _run([str(venv / "bin" / command), "--help"], 120, env=env, cwd=home)
        assert result.stdout.startswith(f"usage: {command}"), (command, result.stdout[:300])


def test_train_on_the_default_data_then_generate(installed):
    venv, home, env = installed
    train = _run([str(venv / "bin" / "vaswani-train"), "--max_steps", "20", "--output_dir", "out"], 1500, env=env,
                 cwd=home)
    print(f"\n$ vaswani-train --max_steps 20 --output_dir out\n{train.stdout}")
    out = home / "out"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "g2p" and metrics["steps"] == 20 and 0 <= metrics["dev"]["wer"] <= 100
    assert "CMUdict g014b2b.train (shipped)" in train.stdout
    assert train.stdout.strip().splitlines()[-1].startswith("Done: 20 updates (stopped by max_steps), best step 20")

    card = (out / "README.md").read_text(encoding="utf-8")
    assert "{{" not in card and "{%" not in card  # the shipped template was found and filled
    assert "library_name: transformers" in card and "CMU Pronouncing Dictionary" in card
    assert "| d_model | 128 |" in card and f"{metrics['dev']['wer']:.2f}" in card

    assert shutil.which("vaswani-generate", path=env["PATH"]) == str(venv / "bin" / "vaswani-generate")
    generate = subprocess.run("echo HELLO | vaswani-generate out", shell=True, capture_output=True, text=True, env=env,
                              cwd=home, timeout=300, stdin=subprocess.DEVNULL)
    print(f"$ echo HELLO | vaswani-generate out\n{generate.stdout}")
    assert generate.returncode == 0, generate.stderr[-3000:]
    lines = generate.stdout.split("\n")
    assert len(lines) == 2 and lines[1] == "", generate.stdout  # one output line for the one input line
    assert all(phoneme.isupper() for phoneme in lines[0].split()), lines[0]  # ARPAbet symbols of the vocabulary
