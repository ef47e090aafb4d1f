"""Arm copy: _linear_tiles reads ~/tiles.json (width bucket, N, K) first; argv[2] sets LINEAR_ROWS."""

import sys

lib = sys.argv[1]
p = f"{lib}/grpo_knobs/rollout/kernels.py"
s = open(p).read()
old = "def _linear_tiles(M: int, N: int, K: int, device: torch.device) -> dict:\n"
assert old in s
s = s.replace(
    old,
    """import json as _json, os as _os
_TABLE = _json.load(open(_os.path.expanduser("~/tiles.json")))
def _linear_tiles(M: int, N: int, K: int, device: torch.device) -> dict:
    _key = f"{1 << (M - 1).bit_length()}:{N}:{K}"
    if _key in _TABLE:
        return dict(_TABLE[_key])
""",
)
open(p, "w").write(s)
p = f"{lib}/grpo_knobs/rollout/hf.py"
s = open(p).read()
assert "LINEAR_ROWS = 64" in s
open(p, "w").write(s.replace("LINEAR_ROWS = 64", f"LINEAR_ROWS = {sys.argv[2]}"))
