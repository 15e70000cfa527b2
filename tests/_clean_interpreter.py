"""The preamble of scripts that must run where `vaswani` is NOT importable: the package is installed in the test
environment (editable or not), so every `vaswani` import is refused rather than merely left off the path, and the
script checks that the refusal works before it proves anything."""

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
