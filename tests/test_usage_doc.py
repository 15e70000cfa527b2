"""docs/usage.md, the user manual: it names every command and every option each command takes."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {  # console script -> the module whose build_parser() it runs
    "vaswani-train": "vaswani.training.cli",
    "vaswani-average": "vaswani.training.average",
    "vaswani-release": "vaswani.training.release",
    "vaswani-pseudo-label": "vaswani.training.pseudo_labels",
    "vaswani-generate": "vaswani.training.generation",
    "vaswani-finetune": "vaswani.training.finetune",
    "vaswani-train-tokenizer": "vaswani.tokenizer.train_vaswani_tokenizer",
    "vaswani-convert-marian": "vaswani.training.convert_marian",
    "vaswani-plot-attention": "vaswani.training.attention_plots",
    "vaswani-export": "vaswani.deploy.cli",
}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    names = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names |= _options(sub)
        else:
            names |= {s for s in action.option_strings if s not in ("-h", "--help")}
    return names


def test_the_manual_covers_every_console_script():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert set(scripts) == set(COMMANDS)
    assert all(scripts[name].split(":")[0] == module for name, module in COMMANDS.items())


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_manual_names_every_option_of(command):
    manual = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    assert f"## {command}" in manual
    section = manual.split(f"## {command}\n", 1)[1].split("\n## ", 1)[0]
    options = _options(importlib.import_module(COMMANDS[command]).build_parser())
    missing = sorted(o for o in options if f"`{o}" not in section and f", {o}" not in section)
    assert not missing, f"docs/usage.md's {command} section does not name {missing}"
